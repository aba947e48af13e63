"""A small blocking Kestrel thrift client (the perf suite's leaky-reader and the tests), on the `thrift` package only.

It is deliberately independent of `protocols/thrift.py`: calls are written field by field with
thrift's own TBinaryProtocol (strict headers) over TFramedTransport(TSocket), and replies are read
back with thrift's reader, so a test using it checks Lanner's codec against another
implementation.  There is no generated code; the IDL lives in the writers below (reference §3.2).

`upgrade=True` behaves like a finagle client: it first sends `__can__finagle__trace__v3__`; on
the upgrade REPLY every later call carries a TTwitter `RequestHeader` (with `client_id` when
given) and every reply is read past its `ResponseHeader`.  A server answering the upgrade with
UNKNOWN_METHOD leaves the client in plain mode, as finagle falls back; `upgraded` tells which.

A TApplicationException reply raises `ThriftAppError`, whose `type` and `message` are the
exception's fields; the connection stays usable, as it does with Kestrel.
"""
from __future__ import annotations

from typing import NamedTuple

from thrift.protocol import TBinaryProtocol
from thrift.Thrift import TApplicationException, TMessageType, TType
from thrift.transport import TSocket, TTransport

UPGRADE_METHOD = "__can__finagle__trace__v3__"
NOT_CONFIGURED, QUIESCENT, READ_ONLY, UP = 0, 1, 2, 3


class ThriftAppError(Exception):
    """The server answered with a TApplicationException (type 1, 6 or 7 from Kestrel)."""

    def __init__(self, method: str, type: int, message: str):
        super().__init__(f"{method}: TApplicationException type {type}: {message}")
        self.method = method
        self.type = type
        self.message = message


class ThriftReplyError(Exception):
    """The reply does not match the call (name, seqid or result type): a codec bug."""


class TItem(NamedTuple):
    data: bytes
    id: int


class TQueueInfo(NamedTuple):
    head_item: bytes | None
    items: int
    bytes: int
    journal_bytes: int
    age: int
    waiters: int
    open_transactions: int


class KestrelThrift:
    def __init__(self, host: str, port: int, upgrade: bool = False, client_id: str | None = None,
                 timeout: float = 30.0):
        sock = TSocket.TSocket(host, port)
        sock.setTimeout(timeout * 1000.0)
        self.transport = TTransport.TFramedTransport(sock)
        self.transport.open()
        self.proto = TBinaryProtocol.TBinaryProtocol(self.transport, strictRead=False, strictWrite=True)
        self.client_id = client_id
        self.seqid = 0
        self.upgraded = False
        self.last_reply_seqid: int | None = None
        if upgrade:
            self._upgrade()

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> "KestrelThrift":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- service Kestrel ---------------------------------------------------------------------

    def put(self, queue_name: str, items: list[bytes], expiration_msec: int = 0) -> int:
        def args(p):
            _string(p, 1, queue_name)
            write_collection(p, TType.LIST, 2, TType.STRING, items)
            _i32(p, 3, expiration_msec)
        return self._call("put", args, TType.I32, _read_i32)

    def get(self, queue_name: str, max_items: int, timeout_msec: int = 0,
            auto_abort_msec: int = 0) -> list[TItem]:
        """Items as (data, id); id is 0 unless auto_abort_msec made the read transactional."""
        def args(p):
            _string(p, 1, queue_name)
            _i32(p, 2, max_items)
            _i32(p, 3, timeout_msec)
            _i32(p, 4, auto_abort_msec)
        return self._call("get", args, TType.LIST, _read_items)

    def confirm(self, queue_name: str, ids) -> int:
        return self._call("confirm", lambda p: _ids(p, queue_name, ids), TType.I32, _read_i32)

    def abort(self, queue_name: str, ids) -> int:
        return self._call("abort", lambda p: _ids(p, queue_name, ids), TType.I32, _read_i32)

    def peek(self, queue_name: str) -> TQueueInfo:
        return self._call("peek", lambda p: _string(p, 1, queue_name), TType.STRUCT, _read_queue_info)

    def flush_queue(self, queue_name: str) -> None:
        self._call("flush_queue", lambda p: _string(p, 1, queue_name), None, None)

    def flush_all_queues(self) -> None:
        self._call("flush_all_queues", _no_args, None, None)

    def delete_queue(self, queue_name: str) -> None:
        self._call("delete_queue", lambda p: _string(p, 1, queue_name), None, None)

    def current_status(self) -> int:
        return self._call("current_status", _no_args, TType.I32, _read_i32)

    def set_status(self, status: int) -> None:
        self._call("set_status", lambda p: _i32(p, 1, status), None, None)

    def get_version(self) -> str:
        return self._call("get_version", _no_args, TType.STRING, lambda p: p.readString())

    # -- one exchange --------------------------------------------------------------------------

    def _upgrade(self) -> None:
        p = self.proto
        self.seqid += 1
        p.writeMessageBegin(UPGRADE_METHOD, TMessageType.CALL, self.seqid)
        _empty_struct(p)
        p.writeMessageEnd()
        self.transport.flush()
        name, mtype, _seqid, x = self._reply_head()
        if x is not None:
            if x.type != TApplicationException.UNKNOWN_METHOD:
                raise ThriftAppError(UPGRADE_METHOD, x.type, x.message or "")
            return
        if mtype != TMessageType.REPLY or name != UPGRADE_METHOD:
            raise ThriftReplyError(f"upgrade answered by {name!r} message type {mtype}")
        _skip_struct(p)
        p.readMessageEnd()
        self.upgraded = True

    def _call(self, name: str, write_args, success_type: int | None, read_success):
        p = self.proto
        self.seqid += 1
        if self.upgraded:
            self._write_request_header()
        p.writeMessageBegin(name, TMessageType.CALL, self.seqid)
        p.writeStructBegin(f"{name}_args")
        write_args(p)
        p.writeFieldStop()
        p.writeStructEnd()
        p.writeMessageEnd()
        self.transport.flush()
        if self.upgraded:
            _skip_struct(p)   # ResponseHeader
        rname, mtype, rseqid, x = self._reply_head()
        if x is not None:
            raise ThriftAppError(rname, x.type, x.message or "")
        if mtype != TMessageType.REPLY or rname != name or rseqid != self.seqid:
            raise ThriftReplyError(f"{name} seqid {self.seqid}: got {rname!r} type {mtype} seqid {rseqid}")
        result = None
        p.readStructBegin()
        while True:
            _, ftype, fid = p.readFieldBegin()
            if ftype == TType.STOP:
                break
            if fid == 0 and success_type is not None:
                if ftype != success_type:
                    raise ThriftReplyError(f"{name}: success has thrift type {ftype}, expected {success_type}")
                result = read_success(p)
            else:
                p.skip(ftype)
            p.readFieldEnd()
        p.readStructEnd()
        p.readMessageEnd()
        if success_type is not None and result is None:
            raise ThriftReplyError(f"{name}: reply has no success field")
        return result

    def _reply_head(self) -> tuple[str, int, int, TApplicationException | None]:
        """A reply's message header, and for an EXCEPTION reply the exception, read whole so the
        connection stays usable whatever the caller does with it."""
        p = self.proto
        name, mtype, seqid = p.readMessageBegin()
        self.last_reply_seqid = seqid
        if mtype != TMessageType.EXCEPTION:
            return name, mtype, seqid, None
        x = TApplicationException()
        x.read(p)
        p.readMessageEnd()
        return name, mtype, seqid, x

    def _write_request_header(self) -> None:
        p = self.proto
        p.writeStructBegin("RequestHeader")
        _i64(p, 1, self.seqid)            # trace_id
        _i64(p, 2, self.seqid)            # span_id
        if self.client_id is not None:
            p.writeFieldBegin("client_id", TType.STRUCT, 6)
            p.writeStructBegin("ClientId")
            _string(p, 1, self.client_id)
            p.writeFieldStop()
            p.writeStructEnd()
            p.writeFieldEnd()
        p.writeFieldStop()
        p.writeStructEnd()


def _no_args(p) -> None:
    pass


def _empty_struct(p) -> None:
    p.writeStructBegin("")
    p.writeFieldStop()
    p.writeStructEnd()


def _skip_struct(p) -> None:
    p.skip(TType.STRUCT)


def write_field(p, ttype: int, fid: int, value) -> None:
    """One scalar field (STRING, I32 or I64); the tests build their requests with it too, so
    there is one writer of thrift fields outside the codec under test."""
    p.writeFieldBegin("", ttype, fid)
    _write_value(p, ttype, value)
    p.writeFieldEnd()


def field(ttype: int, fid: int, value):
    """`write_field` deferred: a writer `w(p)`, so a test can build a request from a list of
    fields (`partial(field, TType.I32)` is an i32 field maker)."""
    return lambda p: write_field(p, ttype, fid, value)


def write_collection(p, ctype: int, fid: int, etype: int, values) -> None:
    """A LIST or SET field (`ctype`) of `etype` values, written in the order given."""
    p.writeFieldBegin("", ctype, fid)
    if ctype == TType.SET:
        p.writeSetBegin(etype, len(values))
    else:
        p.writeListBegin(etype, len(values))
    for v in values:
        _write_value(p, etype, v)
    if ctype == TType.SET:
        p.writeSetEnd()
    else:
        p.writeListEnd()
    p.writeFieldEnd()


def _write_value(p, ttype: int, value) -> None:
    """STRING takes str (UTF-8) or bytes, so a test can write bytes that are not UTF-8."""
    if ttype == TType.STRING:
        p.writeString(value) if isinstance(value, str) else p.writeBinary(value)
    elif ttype == TType.I32:
        p.writeI32(value)
    elif ttype == TType.I64:
        p.writeI64(value)
    else:
        raise ValueError(f"no writer for thrift type {ttype}")


def _string(p, fid: int, value: str) -> None:
    write_field(p, TType.STRING, fid, value)


def _i32(p, fid: int, value: int) -> None:
    write_field(p, TType.I32, fid, value)


def _i64(p, fid: int, value: int) -> None:
    write_field(p, TType.I64, fid, value)


def _ids(p, queue_name: str, ids) -> None:
    _string(p, 1, queue_name)
    write_collection(p, TType.SET, 2, TType.I64, sorted(set(ids)))


def _read_i32(p) -> int:
    return p.readI32()


def _read_items(p) -> list[TItem]:
    etype, n = p.readListBegin()
    if n and etype != TType.STRUCT:
        raise ThriftReplyError(f"get: list element type {etype}, expected struct Item")
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
        items.append(TItem(data, xid))
    p.readListEnd()
    return items


_INFO_FIELDS = {1: (TType.STRING, "head_item"), 2: (TType.I64, "items"), 3: (TType.I64, "bytes"),
                4: (TType.I64, "journal_bytes"), 5: (TType.I64, "age"), 6: (TType.I32, "waiters"),
                7: (TType.I32, "open_transactions")}


def _read_queue_info(p) -> TQueueInfo:
    values = {"head_item": None, "items": 0, "bytes": 0, "journal_bytes": 0, "age": 0,
              "waiters": 0, "open_transactions": 0}
    p.readStructBegin()
    while True:
        _, t, fid = p.readFieldBegin()
        if t == TType.STOP:
            break
        spec = _INFO_FIELDS.get(fid)
        if spec is None or spec[0] != t:
            p.skip(t)
        elif t == TType.STRING:
            values[spec[1]] = p.readBinary()
        elif t == TType.I64:
            values[spec[1]] = p.readI64()
        else:
            values[spec[1]] = p.readI32()
        p.readFieldEnd()
    p.readStructEnd()
    return TQueueInfo(**values)
