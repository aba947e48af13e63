"""Writes the thrift case files next to this script (run it with the test venv): requests are
written by the `thrift` package, the expected outcome is recorded from ThriftParser and was
checked by eye against reference §3.  Re-run it only to add cases, then review the diff."""
import os
import struct
from functools import partial

from thrift.protocol import TBinaryProtocol
from thrift.Thrift import TMessageType, TType
from thrift.transport import TTransport
from lanner.perf.thrift_client import field, write_collection
from lanner.protocols.thrift import ThriftParser, Call, BadCall, ProtocolError, Upgrade

ROOT = os.path.dirname(os.path.abspath(__file__))
CALL = TMessageType.CALL

def framed(write, strict=True):
    buf = TTransport.TMemoryBuffer()
    tr = TTransport.TFramedTransport(buf)
    write(TBinaryProtocol.TBinaryProtocol(tr, strictRead=False, strictWrite=strict))
    tr.flush()
    return buf.getvalue()

def msg(name, seqid, fields=(), mtype=CALL, strict=True, header=None):
    def w(p):
        if header: header(p)
        p.writeMessageBegin(name, mtype, seqid)
        p.writeStructBegin("args")
        for f in fields: f(p)
        p.writeFieldStop()
        p.writeStructEnd()
        p.writeMessageEnd()
    return framed(w, strict)

f_str, f_i32, f_i64 = (partial(field, ttype) for ttype in (TType.STRING, TType.I32, TType.I64))
def f_list(fid, items, etype=TType.STRING):
    return lambda p: write_collection(p, TType.LIST, fid, etype, items)
def f_set(fid, items, etype=TType.I64):
    return lambda p: write_collection(p, TType.SET, fid, etype, items)
def f_struct(fid, fields):
    def w(p):
        p.writeFieldBegin("", TType.STRUCT, fid); p.writeStructBegin("s")
        for f in fields: f(p)
        p.writeFieldStop(); p.writeStructEnd(); p.writeFieldEnd()
    return w

def request_header(client=None):
    def w(p):
        p.writeStructBegin("RequestHeader")
        f_i64(1, 11)(p); f_i64(2, 22)(p)
        if client: f_struct(6, [f_str(1, client)])(p)
        p.writeFieldStop(); p.writeStructEnd()
    return w

def esc(data: bytes) -> str:
    return "".join(chr(b) if 0x20 <= b < 0x7f and b not in (0x5c,) else "\\x%02x" % b for b in data)

def show(cmd):
    if isinstance(cmd, ProtocolError):
        return "Stop()"
    if isinstance(cmd, BadCall) and cmd.exc_type == 7:
        return f"Bad({cmd.method!r}, {cmd.seqid}, 7)"
    return repr(cmd)

def case(kind, n, title, data):
    p = ThriftParser()
    p.feed(data)
    outs = []
    while (c := p.next()) is not None:
        outs.append(show(c))
    lines = [f"# {title}"]
    for i in range(0, len(data), 40):
        lines.append("in: " + esc(data[i:i + 40]))
    lines += ["out: " + o for o in outs]
    with open(os.path.join(ROOT, kind, "%03d.txt" % n), "w", encoding="latin-1") as f:
        f.write("\n".join(lines) + "\n")
    print(kind, n, title, outs)

V = [
    ("put, two items, strict header", msg("put", 1, [f_str(1, b"q"), f_list(2, [b"a", b"bc"]), f_i32(3, 0)])),
    ("put, old non-strict header", msg("put", 2, [f_str(1, b"q"), f_list(2, [b"x"])], strict=False)),
    ("put with an expiration", msg("put", 3, [f_str(1, b"jobs"), f_list(2, [b"\x00\xff"]), f_i32(3, 5000)])),
    ("put, fields in reverse order", msg("put", 4, [f_i32(3, 7), f_list(2, [b"y"]), f_str(1, b"q")])),
    ("get with every argument", msg("get", 5, [f_str(1, b"q"), f_i32(2, 10), f_i32(3, 250), f_i32(4, 1000)])),
    ("get, missing arguments keep their defaults", msg("get", 6, [f_str(1, b"q")])),
    ("confirm a set of ids", msg("confirm", 7, [f_str(1, b"q"), f_set(2, [3, 1, 2])])),
    ("abort a set of ids", msg("abort", 8, [f_str(1, b"q"), f_set(2, [9])])),
    ("peek", msg("peek", 9, [f_str(1, b"q")])),
    ("flush_queue", msg("flush_queue", 10, [f_str(1, b"q")])),
    ("flush_all_queues", msg("flush_all_queues", 11)),
    ("delete_queue", msg("delete_queue", 12, [f_str(1, b"q")])),
    ("current_status", msg("current_status", 13)),
    ("set_status", msg("set_status", 14, [f_i32(1, 2)])),
    ("get_version", msg("get_version", 15)),
    ("unknown field ids are skipped", msg("put", 16, [f_str(1, b"q"), f_str(9, b"junk"), f_list(2, [b"z"]),
                                                       f_struct(10, [f_i64(1, 5)])])),
    ("a known id with the wrong type is skipped: the default stays", msg("peek", 17, [f_i32(1, 42)])),
    ("queue names are latin-1 bytes", msg("peek", 18, [f_str(1, b"caf\xe9")])),
    ("two calls pipelined", msg("get_version", 19) + msg("current_status", 20)),
    ("a ONEWAY message type is dispatched on its name", msg("get_version", 21, mtype=TMessageType.ONEWAY)),
    ("the TTwitter upgrade", msg("__can__finagle__trace__v3__", 22)),
    ("upgrade, then a call with a RequestHeader carrying a client id",
     msg("__can__finagle__trace__v3__", 23) + msg("peek", 24, [f_str(1, b"q")], header=request_header(b"svc"))),
    ("upgrade, then a call with a RequestHeader without a client id",
     msg("__can__finagle__trace__v3__", 25) + msg("get_version", 26, header=request_header())),
    ("an empty item list", msg("put", 27, [f_str(1, b"q"), f_list(2, [])])),
    ("bytes after the args struct's STOP are ignored", None),
]
I = [
    ("unknown method: an exception, the connection stays", msg("nope", 1)),
    ("unknown method, then a good call", msg("nope", 2) + msg("get_version", 3)),
    ("args struct without its STOP", None),
    ("a list of i32 where items are strings", msg("put", 5, [f_str(1, b"q"), f_list(2, [1, 2], TType.I32)])),
    ("negative frame length closes", struct.pack(">i", -1) + b"junk"),
    ("frame longer than the maximum (64 MiB) closes at its length", struct.pack(">i", (64 << 20) + 1)),
    ("unreadable message header closes", struct.pack(">i", 3) + b"\x80\x01\x00"),
    ("a good call, then an unframeable frame", msg("get_version", 8) + struct.pack(">i", -5)),
    ("upgraded, a frame without a readable RequestHeader closes",
     msg("__can__finagle__trace__v3__", 9) + struct.pack(">i", 2) + b"\x0c\x00"),
    ("nothing after a closing error is parsed", struct.pack(">i", -1) + msg("get_version", 10)),
    ("ids as a set of strings", None),
]
def reframe(frame: bytes, extra: bytes) -> bytes:
    body = frame[4:] + extra
    return struct.pack(">i", len(body)) + body
V[24] = (V[24][0], reframe(msg("peek", 28, [f_str(1, b"q")]), b"trailing junk"))
I[10] = (I[10][0], msg("confirm", 11, [f_str(1, b"q"), f_set(2, [b"1"], TType.STRING)]))
for n, (title, data) in enumerate(V, 1):
    case("valid", n, title, data)
# 003: cut the args struct's STOP out of a frame, fixing the frame length
good = msg("peek", 4, [f_str(1, b"q")])
body = good[4:-1]
I[2] = (I[2][0], struct.pack(">i", len(body)) + body)
for n, (title, data) in enumerate(I, 1):
    case("invalid", n, title, data)
