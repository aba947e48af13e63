"""Client side of Kestrel's thrift service (reference §3.2), written by hand over thrift's runtime.

Transport and encoding are what Kestrel's finagle server speaks: TFramedTransport (4-byte
big-endian frame length) around TBinaryProtocol with strict headers.  No generated code: each
call writes its argument struct field by field and reads field 0 (`success`) of the result,
skipping unknown fields, so the codec is small enough to check byte for byte in tests.
"""
from __future__ import annotations

from thrift.protocol import TBinaryProtocol
from thrift.Thrift import TApplicationException, TMessageType, TType
from thrift.transport import TSocket, TTransport


class ThriftCallError(RuntimeError):
    """The server answered a call with an exception, or with a reply to a different call."""


class KestrelThrift:
    def __init__(self, transport: TTransport.TTransportBase):
        self.transport = transport
        self.proto = TBinaryProtocol.TBinaryProtocol(transport, strictRead=False, strictWrite=True)
        self.seqid = 0

    @classmethod
    def connect(cls, host: str, port: int, timeout: float = 10.0) -> "KestrelThrift":
        """Raises thrift's TTransportException when nothing answers on host:port."""
        sock = TSocket.TSocket(host, port)
        sock.setTimeout(timeout * 1000.0)
        transport = TTransport.TFramedTransport(sock)
        transport.open()
        return cls(transport)

    def close(self) -> None:
        self.transport.close()

    # -- service Kestrel ---------------------------------------------------------------------

    def put(self, queue: str, items: list[bytes], expiration_msec: int = 0) -> int:
        def args(p):
            _string(p, 1, queue)
            p.writeFieldBegin("items", TType.LIST, 2)
            p.writeListBegin(TType.STRING, len(items))
            for item in items:
                p.writeBinary(item)
            p.writeListEnd()
            p.writeFieldEnd()
            _i32(p, 3, expiration_msec)
        return self._call("put", args, _read_i32)

    def get(self, queue: str, max_items: int, timeout_msec: int = 0,
            auto_abort_msec: int = 0) -> list[tuple[bytes, int]]:
        """Items as (data, id) pairs; id is 0 unless auto_abort_msec made the read transactional."""
        def args(p):
            _string(p, 1, queue)
            _i32(p, 2, max_items)
            _i32(p, 3, timeout_msec)
            _i32(p, 4, auto_abort_msec)
        return self._call("get", args, _read_items) or []

    def confirm(self, queue: str, ids: set[int]) -> int:
        return self._call("confirm", lambda p: _ids(p, queue, ids), _read_i32)

    def abort(self, queue: str, ids: set[int]) -> int:
        return self._call("abort", lambda p: _ids(p, queue, ids), _read_i32)

    def flush_queue(self, queue: str) -> None:
        self._call("flush_queue", lambda p: _string(p, 1, queue), None)

    def delete_queue(self, queue: str) -> None:
        self._call("delete_queue", lambda p: _string(p, 1, queue), None)

    def get_version(self) -> str:
        return self._call("get_version", lambda p: None, lambda p, t: p.readString())

    # -- framing of one call -----------------------------------------------------------------

    def _call(self, name: str, write_args, read_success):
        p = self.proto
        self.seqid += 1
        p.writeMessageBegin(name, TMessageType.CALL, self.seqid)
        p.writeStructBegin(f"{name}_args")
        write_args(p)
        p.writeFieldStop()
        p.writeStructEnd()
        p.writeMessageEnd()
        self.transport.flush()
        rname, mtype, rseqid = p.readMessageBegin()
        if mtype == TMessageType.EXCEPTION:
            x = TApplicationException()
            x.read(p)
            p.readMessageEnd()
            raise ThriftCallError(f"{name}: server raised TApplicationException type {x.type}: {x.message}")
        if rname != name or rseqid != self.seqid:
            raise ThriftCallError(f"{name} (seqid {self.seqid}): got a reply to {rname!r} seqid {rseqid}")
        result = None
        p.readStructBegin()
        while True:
            _, ftype, fid = p.readFieldBegin()
            if ftype == TType.STOP:
                break
            if fid == 0 and read_success is not None:
                result = read_success(p, ftype)
            else:
                p.skip(ftype)
            p.readFieldEnd()
        p.readStructEnd()
        p.readMessageEnd()
        return result


def _string(p, fid: int, value: str) -> None:
    p.writeFieldBegin("", TType.STRING, fid)
    p.writeString(value)
    p.writeFieldEnd()


def _i32(p, fid: int, value: int) -> None:
    p.writeFieldBegin("", TType.I32, fid)
    p.writeI32(value)
    p.writeFieldEnd()


def _ids(p, queue: str, ids: set[int]) -> None:
    _string(p, 1, queue)
    p.writeFieldBegin("ids", TType.SET, 2)
    p.writeSetBegin(TType.I64, len(ids))
    for i in sorted(ids):
        p.writeI64(i)
    p.writeSetEnd()
    p.writeFieldEnd()


def _read_i32(p, ftype: int) -> int:
    if ftype != TType.I32:
        raise ThriftCallError(f"expected an i32 result, got thrift type {ftype}")
    return p.readI32()


def _read_items(p, ftype: int) -> list[tuple[bytes, int]]:
    if ftype != TType.LIST:
        raise ThriftCallError(f"expected list<Item>, got thrift type {ftype}")
    _, n = p.readListBegin()
    items = []
    for _ in range(n):
        data, xid = b"", 0
        p.readStructBegin()
        while True:
            _, t, fid = p.readFieldBegin()
            if t == TType.STOP:
                break
            if fid == 1 and t == TType.STRING:
                data = p.readBinary()
            elif fid == 2 and t == TType.I64:
                xid = p.readI64()
            else:
                p.skip(t)
            p.readFieldEnd()
        p.readStructEnd()
        items.append((data, xid))
    p.readListEnd()
    return items
