"""The hand-written thrift codec, byte for byte against the IDL (reference §3.1-3.2)."""
from __future__ import annotations

import io
import struct

import pytest
from thrift.transport import TTransport

from perf.thrift_client import KestrelThrift, ThriftCallError

CALL, REPLY, EXCEPTION = 1, 2, 3
STOP, I32, I64, STRING, STRUCT, SET, LIST = 0, 8, 10, 11, 12, 14, 15


class Pipe(TTransport.TTransportBase):
    """Records what the client writes and feeds it canned server bytes."""

    def __init__(self, reply: bytes):
        self.sent = bytearray()
        self.reply = io.BytesIO(reply)

    def isOpen(self):
        return True

    def write(self, buf):
        self.sent += buf

    def flush(self):
        pass

    def read(self, n):
        return self.reply.read(n)


def frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def header(kind: int, name: str, seqid: int) -> bytes:
    return (struct.pack(">I", 0x80010000 | kind) + struct.pack(">i", len(name)) + name.encode()
            + struct.pack(">i", seqid))


def field(ttype: int, fid: int) -> bytes:
    return struct.pack(">bh", ttype, fid)


def string(b: bytes) -> bytes:
    return struct.pack(">i", len(b)) + b


def client(reply_body: bytes) -> tuple[KestrelThrift, Pipe]:
    pipe = Pipe(frame(reply_body))
    return KestrelThrift(TTransport.TFramedTransport(pipe)), pipe


def test_put_call_and_reply_bytes():
    c, pipe = client(header(REPLY, "put", 1) + field(I32, 0) + struct.pack(">i", 2) + b"\x00")
    assert c.put("q", [b"ab", b""], 250) == 2
    body = (header(CALL, "put", 1) + field(STRING, 1) + string(b"q")
            + field(LIST, 2) + struct.pack(">bi", STRING, 2) + string(b"ab") + string(b"")
            + field(I32, 3) + struct.pack(">i", 250) + b"\x00")
    assert bytes(pipe.sent) == frame(body)


def test_get_sends_all_four_arguments_and_parses_items():
    items = (field(LIST, 0) + struct.pack(">bi", STRUCT, 2)
             + field(STRING, 1) + string(b"one") + field(I64, 2) + struct.pack(">q", 7) + b"\x00"
             + field(I32, 9) + struct.pack(">i", 5) + field(STRING, 1) + string(b"two") + b"\x00")
    c, pipe = client(header(REPLY, "get", 1) + items + b"\x00")
    assert c.get("q", 2, 100, 5000) == [(b"one", 7), (b"two", 0)]
    body = (header(CALL, "get", 1) + field(STRING, 1) + string(b"q") + field(I32, 2) + struct.pack(">i", 2)
            + field(I32, 3) + struct.pack(">i", 100) + field(I32, 4) + struct.pack(">i", 5000) + b"\x00")
    assert bytes(pipe.sent) == frame(body)


def test_confirm_sends_a_set_of_i64():
    c, pipe = client(header(REPLY, "confirm", 1) + field(I32, 0) + struct.pack(">i", 1) + b"\x00")
    assert c.confirm("q", {9, 3}) == 1
    body = (header(CALL, "confirm", 1) + field(STRING, 1) + string(b"q") + field(SET, 2)
            + struct.pack(">bi", I64, 2) + struct.pack(">qq", 3, 9) + b"\x00")
    assert bytes(pipe.sent) == frame(body)


def test_void_call_and_version():
    c, _ = client(header(REPLY, "flush_queue", 1) + b"\x00")
    assert c.flush_queue("q") is None
    c, _ = client(header(REPLY, "get_version", 1) + field(STRING, 0) + string(b"lanner 0.1") + b"\x00")
    assert c.get_version() == "lanner 0.1"


def test_application_exception_is_raised_with_its_message():
    exc = field(STRING, 1) + string(b"Invalid method name: 'put'") + field(I32, 2) + struct.pack(">i", 1) + b"\x00"
    c, _ = client(header(EXCEPTION, "put", 1) + exc)
    with pytest.raises(ThriftCallError, match="type 1: Invalid method name"):
        c.put("q", [b"x"])


def test_reply_to_another_call_is_refused():
    c, _ = client(header(REPLY, "put", 5) + field(I32, 0) + struct.pack(">i", 1) + b"\x00")
    with pytest.raises(ThriftCallError, match="seqid 5"):
        c.put("q", [b"x"])
