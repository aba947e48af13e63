"""lanner.protocols.thrift against an independent implementation: the `thrift` package (reference §3).

Requests are built with thrift's TBinaryProtocol over TFramedTransport(TMemoryBuffer) and fed to
ThriftParser; replies from the encoders are compared byte for byte with what thrift writes for the
same message, and decoded with thrift's reader.  The last section runs tests/protocols/
thrift_client.py against a small in-process server built on the codec.
"""
from __future__ import annotations

import socket
import struct
import threading
from functools import partial

import pytest
from hypothesis import given, settings, strategies as st
from thrift.protocol import TBinaryProtocol
from thrift.Thrift import TApplicationException, TMessageType, TType
from thrift.transport import TTransport

from lanner.protocols import thrift as th
from lanner.protocols.thrift import BadCall, Call, Item, ProtocolError, QueueInfo, ThriftParser, Upgrade
from lanner.protocols.thrift_replies import (
    encode_exception, encode_reply, encode_upgrade_reply, internal_error,
)
from lanner.perf.thrift_client import (
    KestrelThrift, ThriftAppError, TItem, TQueueInfo, field, write_collection,
)

CALL, REPLY, EXCEPTION, ONEWAY = (TMessageType.CALL, TMessageType.REPLY, TMessageType.EXCEPTION,
                                  TMessageType.ONEWAY)
UPGRADE = "__can__finagle__trace__v3__"


# ----------------------------------------------------------------------------- thrift-side helpers

def framed(write, strict: bool = True) -> bytes:
    """Whatever `write(protocol)` writes, as one frame of thrift's own TFramedTransport."""
    buf = TTransport.TMemoryBuffer()
    tr = TTransport.TFramedTransport(buf)
    write(TBinaryProtocol.TBinaryProtocol(tr, strictRead=False, strictWrite=strict))
    tr.flush()
    return buf.getvalue()


f_str, f_i32, f_i64 = (partial(field, ttype) for ttype in (TType.STRING, TType.I32, TType.I64))


def f_bin_list(fid, items):
    return lambda p: write_collection(p, TType.LIST, fid, TType.STRING, items)


def f_i64_set(fid, ids):
    return lambda p: write_collection(p, TType.SET, fid, TType.I64, ids)


def f_struct(fid, *fields):
    def w(p):
        p.writeFieldBegin("", TType.STRUCT, fid)
        struct_of(*fields)(p)
        p.writeFieldEnd()
    return w


def struct_of(*fields):
    def w(p):
        p.writeStructBegin("")
        for f in fields:
            f(p)
        p.writeFieldStop()
        p.writeStructEnd()
    return w


def request_header(client_id: str | None = None, extra=()):
    """A TTwitter RequestHeader as finagle writes it (ids 1, 2, optional 3, 5, 6, 7)."""
    fields = [f_i64(1, 0x1234567890), f_i64(2, -5)]
    fields += list(extra)
    if client_id is not None:
        fields.append(f_struct(6, f_str(1, client_id)))
    return struct_of(*fields)


def call(name, *fields, seqid=1, strict=True, header=None, mtype=CALL) -> bytes:
    def w(p):
        if header is not None:
            header(p)
        p.writeMessageBegin(name, mtype, seqid)
        struct_of(*fields)(p)
        p.writeMessageEnd()
    return framed(w, strict)


def parse(data: bytes, parser: ThriftParser | None = None) -> list:
    p = parser or ThriftParser()
    p.feed(data)
    out = []
    while (o := p.next()) is not None:
        out.append(o)
    return out


def parse_one(data: bytes, parser: ThriftParser | None = None):
    (out,) = parse(data, parser)
    return out


# scalar type -> thrift's reader method for it
SCALAR_READERS = {TType.BOOL: "readBool", TType.BYTE: "readByte", TType.I16: "readI16", TType.I32: "readI32",
                  TType.I64: "readI64", TType.DOUBLE: "readDouble", TType.STRING: "readBinary"}


def read_value(p, t):
    if t in SCALAR_READERS:
        return getattr(p, SCALAR_READERS[t])()
    if t == TType.STRUCT:
        return read_struct(p)
    if t in (TType.LIST, TType.SET):
        etype, n = p.readListBegin() if t == TType.LIST else p.readSetBegin()
        return (etype, [read_value(p, etype) for _ in range(n)])
    if t == TType.MAP:
        kt, vt, n = p.readMapBegin()
        return (kt, vt, [(read_value(p, kt), read_value(p, vt)) for _ in range(n)])
    raise AssertionError(f"type {t}")


def read_struct(p) -> dict:
    """{field id: (ttype, value)}, read with thrift's own protocol."""
    p.readStructBegin()
    out = {}
    while True:
        _, t, fid = p.readFieldBegin()
        if t == TType.STOP:
            break
        out[fid] = (t, read_value(p, t))
        p.readFieldEnd()
    p.readStructEnd()
    return out


def read_reply(data: bytes, upgraded: bool = False):
    """(header, name, type, seqid, body) of one framed reply, checking the frame is used exactly."""
    (n,) = struct.unpack(">i", data[:4])
    assert n == len(data) - 4
    buf = TTransport.TMemoryBuffer(data[4:])
    p = TBinaryProtocol.TBinaryProtocol(buf, strictRead=True)
    header = read_struct(p) if upgraded else None
    name, mtype, seqid = p.readMessageBegin()
    if mtype == EXCEPTION:
        body = TApplicationException()
        body.read(p)
    else:
        body = read_struct(p)
    p.readMessageEnd()
    assert buf.read(1) == b"", "bytes left over in the reply frame"
    return header, name, mtype, seqid, body


def thrift_reply(name, seqid, *fields, upgraded=False, mtype=REPLY) -> bytes:
    """The reply bytes thrift itself writes (strict), with finagle's empty ResponseHeader."""
    def w(p):
        if upgraded:
            struct_of()(p)
        p.writeMessageBegin(name, mtype, seqid)
        struct_of(*fields)(p)
        p.writeMessageEnd()
    return framed(w)


def frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


# ----------------------------------------------------------------------------- requests

CASES = [
    ("put", [f_str(1, "jobs"), f_bin_list(2, [b"a", b"", b"\x00\xff" * 300]), f_i32(3, -5)],
     {"queue_name": "jobs", "items": [b"a", b"", b"\x00\xff" * 300], "expiration_msec": -5}),
    ("get", [f_str(1, "jobs"), f_i32(2, 10), f_i32(3, 250), f_i32(4, 30000)],
     {"queue_name": "jobs", "max_items": 10, "timeout_msec": 250, "auto_abort_msec": 30000}),
    ("confirm", [f_str(1, "jobs"), f_i64_set(2, [1, 2, 1 << 40])],
     {"queue_name": "jobs", "ids": {1, 2, 1 << 40}}),
    ("abort", [f_str(1, "jobs"), f_i64_set(2, [-1, 7])], {"queue_name": "jobs", "ids": {-1, 7}}),
    ("peek", [f_str(1, "jobs")], {"queue_name": "jobs"}),
    ("flush_queue", [f_str(1, "jobs")], {"queue_name": "jobs"}),
    ("flush_all_queues", [], {}),
    ("delete_queue", [f_str(1, "jobs+fan")], {"queue_name": "jobs+fan"}),
    ("current_status", [], {}),
    ("set_status", [f_i32(1, th.STATUS_READ_ONLY)], {"status": 2}),
    ("get_version", [], {}),
]

DEFAULTS = {
    "put": {"queue_name": "", "items": [], "expiration_msec": 0},
    "get": {"queue_name": "", "max_items": 0, "timeout_msec": 0, "auto_abort_msec": 0},
    "confirm": {"queue_name": "", "ids": set()},
    "abort": {"queue_name": "", "ids": set()},
    "peek": {"queue_name": ""},
    "flush_queue": {"queue_name": ""},
    "flush_all_queues": {},
    "delete_queue": {"queue_name": ""},
    "current_status": {},
    "set_status": {"status": 0},
    "get_version": {},
}


def test_every_method_is_covered():
    assert {c[0] for c in CASES} == set(th.METHODS) == set(DEFAULTS)


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "non-strict"])
@pytest.mark.parametrize("method, fields, args", CASES, ids=[c[0] for c in CASES])
def test_calls_built_by_thrift_decode(method, fields, args, strict):
    out = parse_one(call(method, *fields, seqid=4242, strict=strict))
    assert out == Call(method, 4242, args, None)


@pytest.mark.parametrize("method", list(DEFAULTS))
def test_missing_fields_take_the_idl_defaults(method):
    assert parse_one(call(method, seqid=-3)) == Call(method, -3, DEFAULTS[method], None)


def test_defaults_are_fresh_objects_per_call():
    a = parse_one(call("put"))
    a.args["items"].append(b"x")
    assert parse_one(call("put")).args["items"] == []


def test_oneway_and_reply_typed_messages_dispatch_by_name_alone():
    assert parse_one(call("get_version", mtype=ONEWAY, seqid=9)) == Call("get_version", 9, {}, None)
    assert parse_one(call("peek", f_str(1, "q"), mtype=REPLY)).args == {"queue_name": "q"}


def test_queue_name_is_latin1_of_its_bytes():
    out = parse_one(call("peek", f_str(1, "caf\u00e9")))          # thrift writes UTF-8
    assert out.args["queue_name"] == "caf\u00e9".encode("utf-8").decode("latin-1")
    out = parse_one(call("peek", f_str(1, b"\xff\x00q")))
    assert out.args["queue_name"] == "\xff\x00q"


def _unknown_fields():
    """One field of every TType, nested containers included, under ids the IDL doesn't use."""
    def f(fid, t, body):
        def w(p):
            p.writeFieldBegin("", t, fid)
            body(p)
            p.writeFieldEnd()
        return w

    def nested_map(p):
        p.writeMapBegin(TType.STRING, TType.LIST, 2)
        for k in ("a", "b"):
            p.writeString(k)
            p.writeListBegin(TType.SET, 2)
            for _ in range(2):
                p.writeSetBegin(TType.I64, 3)
                for i in range(3):
                    p.writeI64(i)
                p.writeSetEnd()
            p.writeListEnd()
        p.writeMapEnd()

    def struct_list(p):
        p.writeListBegin(TType.STRUCT, 2)
        struct_of(f_i32(1, 5), f_struct(2, f_str(1, "deep"), f_bin_list(3, [b"x"])))(p)
        struct_of()(p)
        p.writeListEnd()

    def map_of_doubles(p):
        p.writeMapBegin(TType.I16, TType.DOUBLE, 2)
        for i in range(2):
            p.writeI16(i)
            p.writeDouble(1.5)
        p.writeMapEnd()

    def empty_list_of_bools(p):
        p.writeListBegin(TType.BOOL, 0)
        p.writeListEnd()

    return [
        f(20, TType.BOOL, lambda p: p.writeBool(True)),
        f(21, TType.BYTE, lambda p: p.writeByte(-1)),
        f(22, TType.I16, lambda p: p.writeI16(300)),
        f(23, TType.DOUBLE, lambda p: p.writeDouble(2.5)),
        f(24, TType.I64, lambda p: p.writeI64(1)),
        f(25, TType.STRING, lambda p: p.writeString("ignored")),
        f(26, TType.MAP, nested_map),
        f(27, TType.LIST, struct_list),
        f(28, TType.MAP, map_of_doubles),
        f(29, TType.STRUCT, struct_of(f_struct(1, f_struct(1, f_i32(1, 1))))),
        f(30, TType.LIST, empty_list_of_bools),
        f(-1, TType.SET, lambda p: (p.writeSetBegin(TType.STRING, 1), p.writeString("s"), p.writeSetEnd())),
        f(0, TType.I32, lambda p: p.writeI32(99)),
    ]


@pytest.mark.parametrize("strict", [True, False])
def test_unknown_fields_of_every_type_are_skipped(strict):
    u = _unknown_fields()
    fields = u[:5] + [f_str(1, "jobs")] + u[5:9] + [f_bin_list(2, [b"one", b"two"])] + u[9:] + [f_i32(3, 60)]
    out = parse_one(call("put", *fields, seqid=2, strict=strict))
    assert out == Call("put", 2, {"queue_name": "jobs", "items": [b"one", b"two"], "expiration_msec": 60})


def test_known_ids_with_unexpected_types_are_skipped_and_keep_defaults():
    out = parse_one(call("get", f_i32(1, 5), f_str(2, "ten"), f_i64(3, 9), f_i32(4, 7)))
    assert out.args == {"queue_name": "", "max_items": 0, "timeout_msec": 0, "auto_abort_msec": 7}


def test_repeated_field_last_one_wins():
    assert parse_one(call("get", f_i32(2, 1), f_i32(2, 3))).args["max_items"] == 3


def test_empty_containers_with_any_element_type_decode_empty():
    def empty(fid, t, etype):
        def w(p):
            p.writeFieldBegin("", t, fid)
            p.writeListBegin(etype, 0)
            p.writeFieldEnd()
        return w
    assert parse_one(call("put", empty(2, TType.LIST, TType.I32))).args["items"] == []
    assert parse_one(call("confirm", empty(2, TType.SET, TType.STRING))).args["ids"] == set()


def test_trailing_bytes_after_the_args_struct_are_ignored():
    data = call("peek", f_str(1, "q"))
    data = frame(data[4:] + b"\x01\x02\x03")
    assert parse_one(data) == Call("peek", 1, {"queue_name": "q"}, None)


# ----------------------------------------------------------------------------- errors in a frame

def test_unknown_method_is_type_1_and_the_stream_continues():
    data = call("enqueue", f_str(1, "q"), seqid=77) + call("get_version", seqid=78)
    bad, good = parse(data)
    assert bad == BadCall("enqueue", 77, 1, "Invalid method name: 'enqueue'")
    assert good == Call("get_version", 78, {}, None)


@pytest.mark.parametrize("name, body, needle", [
    ("negative string length", b"\x0b\x00\x01\xff\xff\xff\xff", "Negative length: -1"),
    ("string past the frame", b"\x0b\x00\x01\x00\x00\x10\x00abc", "truncated"),
    ("struct without STOP", b"\x0b\x00\x01\x00\x00\x00\x01q", "STOP"),
    ("half a field header", b"\x0b\x00", "field header"),
    ("i32 cut short", b"\x08\x00\x03\x00\x00", "expiration_msec): frame truncated"),
    ("list of i32 for items", b"\x0f\x00\x02\x08\x00\x00\x00\x01\x00\x00\x00\x05\x00", "list<i32>"),
    ("negative list size", b"\x0f\x00\x02\x0b\xff\xff\xff\xfe\x00", "Negative container size: -2"),
    ("huge list count, tiny frame", b"\x0f\x00\x02\x0b\x7f\xff\xff\xff\x00", "truncated"),
    ("unknown type in unknown field", b"\x11\x00\x09\x00", "unknown thrift type 17"),
    ("void element type", b"\x0f\x00\x09\x01\x00\x00\x00\x03\x00", "unknown thrift element type 1"),
    ("huge skipped bool list", b"\x0f\x00\x09\x02\x7f\xff\xff\xff\x00", "truncated"),
    ("negative map size", b"\x0d\x00\x09\x0b\x0b\xff\xff\xff\xff\x00", "Negative container size: -1"),
    ("map past the frame", b"\x0d\x00\x09\x0b\x08\x00\x00\x00\x02\x00\x00\x00\x01k\x00", "truncated"),
    ("nesting too deep", b"\x0c\x00\x09" + b"\x0c\x00\x01" * 80 + b"\x00" * 82, "nesting deeper than 64"),
])
def test_undecodable_args_are_type_7_and_the_stream_continues(name, body, needle):
    msg = struct.pack(">Ii", 0x80010001, 3) + b"put" + struct.pack(">i", 5)
    out = parse(frame(msg + body) + call("get_version", seqid=6))
    assert len(out) == 2
    bad, good = out
    assert isinstance(bad, BadCall) and (bad.method, bad.seqid, bad.exc_type) == ("put", 5, 7)
    assert needle in bad.message and bad.message.startswith("put_args")
    assert good == Call("get_version", 6, {}, None)


def test_ids_of_the_wrong_element_type_are_type_7():
    def strings(p):
        p.writeFieldBegin("", TType.SET, 2)
        p.writeSetBegin(TType.STRING, 1)
        p.writeString("1")
        p.writeSetEnd()
        p.writeFieldEnd()
    bad = parse_one(call("abort", f_str(1, "q"), strings, seqid=4))
    assert bad == BadCall("abort", 4, 7, "abort_args field 2 (ids): set<string> where set<i64> was expected")


def test_set_count_beyond_the_frame_is_type_7():
    msg = struct.pack(">Ii", 0x80010001, 7) + b"confirm" + struct.pack(">i", 1)
    body = b"\x0e\x00\x02\x0a\x00\x01\x00\x00" + b"\x00" * 16 + b"\x00"
    bad = parse_one(frame(msg + body))
    assert bad.exc_type == 7 and "ids" in bad.message and "truncated" in bad.message


# ----------------------------------------------------------------------------- framing

def test_pipelined_frames_in_one_feed_come_out_in_order():
    frames = [call(m, *f, seqid=i) for i, (m, f, _) in enumerate(CASES)]
    out = parse(b"".join(frames))
    assert [(o.method, o.seqid, o.args) for o in out] == [(m, i, a) for i, (m, _, a) in enumerate(CASES)]


def test_byte_by_byte_feeding_gives_the_same_outcomes():
    data = b"".join(call(m, *f, seqid=i, strict=i % 2 == 0) for i, (m, f, _) in enumerate(CASES))
    data += call("nope", seqid=99)
    whole = parse(data)
    p = ThriftParser()
    pieces = []
    for i in range(len(data)):
        p.feed(data[i:i + 1])
        while (o := p.next()) is not None:
            pieces.append(o)
    assert pieces == whole and len(whole) == len(CASES) + 1


def test_incomplete_frame_yields_nothing_until_complete():
    data = call("peek", f_str(1, "q"))
    p = ThriftParser()
    p.feed(data[:-1])
    assert p.next() is None and p.next() is None
    p.feed(data[-1:])
    assert p.next() == Call("peek", 1, {"queue_name": "q"}, None)
    assert p.next() is None


def test_oversize_frame_is_refused_on_its_length_alone_and_stops_the_parser():
    p = ThriftParser(max_frame=100)
    p.feed(struct.pack(">i", 101))
    out = p.next()
    assert isinstance(out, ProtocolError) and "101" in out.reason
    p.feed(call("get_version"))
    assert p.next() is None


def test_frame_of_exactly_max_frame_is_accepted():
    data = call("put", f_str(1, "q"), f_bin_list(2, [b"x" * 50]))
    p = ThriftParser(max_frame=len(data) - 4)
    assert parse_one(data, p).args["items"] == [b"x" * 50]


@pytest.mark.parametrize("data", [
    struct.pack(">i", -1),
    b"get foo\r\n",                                # memcache on the thrift port: 1.7 GB "frame"
])
def test_unframeable_bytes_are_a_protocol_error(data):
    out = parse(data)
    assert len(out) == 1 and isinstance(out[0], ProtocolError)


@pytest.mark.parametrize("body, needle", [
    (b"", "truncated"),
    (struct.pack(">Ii", 0x80020001, 3) + b"put" + b"\x00\x00\x00\x01\x00", "Bad version"),
    (struct.pack(">Ii", 0x80010001, 300) + b"put", "truncated"),
    (struct.pack(">i", 3) + b"put\x01\x00", "truncated"),     # non-strict, seqid cut short
    (struct.pack(">i", -5), "Bad version"),
])
def test_unreadable_message_header_is_a_protocol_error(body, needle):
    p = ThriftParser()
    out = parse(frame(body) + call("get_version"), p)
    assert len(out) == 1 and isinstance(out[0], ProtocolError) and needle in out[0].reason


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=200), st.lists(st.integers(1, 40), max_size=20))
def test_arbitrary_frame_bodies_never_raise_and_chunking_does_not_matter(body, cuts):
    data = frame(body) + call("get_version", seqid=1)
    whole = parse(data)
    assert all(isinstance(o, (Call, Upgrade, BadCall, ProtocolError)) for o in whole)
    p, got, pos = ThriftParser(), [], 0
    for c in cuts + [len(data)]:
        p.feed(data[pos:pos + c])
        pos += c
        while (o := p.next()) is not None:
            got.append(o)
    assert got == whole


@settings(max_examples=100, deadline=None)
@given(queue=st.text(max_size=20), items=st.lists(st.binary(max_size=40), max_size=8),
       exp=st.integers(-(1 << 31), (1 << 31) - 1), ids=st.sets(st.integers(-(1 << 63), (1 << 63) - 1), max_size=8),
       strict=st.booleans(), seqid=st.integers(-(1 << 31), (1 << 31) - 1))
def test_random_put_and_confirm_round_trip(queue, items, exp, ids, strict, seqid):
    data = call("put", f_i32(3, exp), f_bin_list(2, items), f_str(1, queue), seqid=seqid, strict=strict)
    data += call("confirm", f_i64_set(2, sorted(ids)), f_str(1, queue), seqid=seqid, strict=strict)
    name = queue.encode("utf-8").decode("latin-1")
    assert parse(data) == [
        Call("put", seqid, {"queue_name": name, "items": items, "expiration_msec": exp}, None),
        Call("confirm", seqid, {"queue_name": name, "ids": ids}, None),
    ]


# ----------------------------------------------------------------------------- replies

def _list_of_items(items):
    def w(p):
        p.writeFieldBegin("success", TType.LIST, 0)
        p.writeListBegin(TType.STRUCT, len(items))
        for data, xid in items:
            struct_of(f_str(1, data), f_i64(2, xid))(p)
        p.writeListEnd()
        p.writeFieldEnd()
    return w


INFO = QueueInfo(b"head\x00", 3, 1 << 33, 4096, 12, 2, 1)
NO_HEAD = QueueInfo(None, 0, 0, 0, 0, 0, 0)

REPLIES = [
    ("put", 3, [f_i32(0, 3)]),
    ("put", 0, [f_i32(0, 0)]),
    ("get", [Item(b"one", 0), Item(b"", 0)], [_list_of_items([(b"one", 0), (b"", 0)])]),
    ("get", [Item(b"\xff" * 1000, 1 << 40)], [_list_of_items([(b"\xff" * 1000, 1 << 40)])]),
    ("get", [], [_list_of_items([])]),
    ("confirm", 2, [f_i32(0, 2)]),
    ("abort", 0, [f_i32(0, 0)]),
    ("peek", INFO, [f_struct(0, f_str(1, b"head\x00"), f_i64(2, 3), f_i64(3, 1 << 33), f_i64(4, 4096),
                             f_i64(5, 12), f_i32(6, 2), f_i32(7, 1))]),
    ("peek", NO_HEAD, [f_struct(0, f_i64(2, 0), f_i64(3, 0), f_i64(4, 0), f_i64(5, 0), f_i32(6, 0),
                                f_i32(7, 0))]),
    ("flush_queue", None, []),
    ("flush_all_queues", None, []),
    ("delete_queue", None, []),
    ("set_status", None, []),
    ("current_status", th.STATUS_UP, [f_i32(0, 3)]),
    ("current_status", th.STATUS_NOT_CONFIGURED, [f_i32(0, 0)]),
    ("get_version", "2.4.8-lanner", [f_str(0, "2.4.8-lanner")]),
]


def test_every_method_has_a_reply_case():
    assert {r[0] for r in REPLIES} == set(th.METHODS)


@pytest.mark.parametrize("upgraded", [False, True], ids=["plain", "upgraded"])
@pytest.mark.parametrize("method, value, fields", REPLIES, ids=[f"{r[0]}-{i}" for i, r in enumerate(REPLIES)])
def test_replies_match_thrift_byte_for_byte(method, value, fields, upgraded):
    got = encode_reply(Call(method, 31337, {}, None), value, upgraded)
    assert got == thrift_reply(method, 31337, *fields, upgraded=upgraded)
    header, name, mtype, seqid, _ = read_reply(got, upgraded)
    assert (header, name, mtype, seqid) == ({} if upgraded else None, method, REPLY, 31337)


def test_reply_values_read_back_with_thrift():
    _, _, _, _, body = read_reply(encode_reply(Call("get", 1, {}), [Item(b"a", 5), Item(b"bb", 0)], False))
    assert body == {0: (TType.LIST, (TType.STRUCT, [{1: (TType.STRING, b"a"), 2: (TType.I64, 5)},
                                                    {1: (TType.STRING, b"bb"), 2: (TType.I64, 0)}]))}
    _, _, _, _, body = read_reply(encode_reply(Call("peek", 1, {}), NO_HEAD, True), upgraded=True)
    assert 1 not in body[0][1] and body[0][1][6] == (TType.I32, 0)
    _, _, _, _, body = read_reply(encode_reply(Call("flush_queue", 1, {}), None, False))
    assert body == {}


def test_reply_seqid_echoes_the_call_including_negative():
    c = parse_one(call("current_status", seqid=-7))
    assert read_reply(encode_reply(c, 3, False))[3] == -7


@pytest.mark.parametrize("upgraded", [False, True])
@pytest.mark.parametrize("exc_type, message", [
    (1, "Invalid method name: 'enqueue'"),
    (7, "put_args field 1 (queue_name): Negative length: -1"),
    (6, internal_error("put", "net.lag.kestrel.AvailabilityException: Server not available for operation setItem")),
])
def test_exceptions_match_thrift_tapplicationexception(exc_type, message, upgraded):
    got = encode_exception("put", 12, exc_type, message, upgraded)
    def w(p):
        if upgraded:
            struct_of()(p)
        p.writeMessageBegin("put", EXCEPTION, 12)
        TApplicationException(exc_type, message).write(p)
        p.writeMessageEnd()
    assert got == framed(w)
    _, name, mtype, seqid, x = read_reply(got, upgraded)
    assert (name, mtype, seqid, x.type, x.message) == ("put", EXCEPTION, 12, exc_type, message)


def test_internal_error_message_is_scrooges():
    assert internal_error("set_status", "net.lag.kestrel.UnknownStatusException: Unknown status.") == \
        "Internal error processing set_status: 'net.lag.kestrel.UnknownStatusException: Unknown status.'"


def test_bad_call_round_trip_through_encode_exception():
    bad = parse_one(call("enqueue", seqid=41))
    x = read_reply(encode_exception(bad.method, bad.seqid, bad.exc_type, bad.message, False))[4]
    assert (x.type, x.message) == (TApplicationException.UNKNOWN_METHOD, "Invalid method name: 'enqueue'")


# ----------------------------------------------------------------------------- TTwitter upgrade

def test_finagle_style_upgrade_handshake():
    p = ThriftParser()
    assert not p.upgraded
    up = parse_one(call(UPGRADE, seqid=5), p)
    assert up == Upgrade(5) and p.upgraded
    reply = encode_upgrade_reply(up.seqid)
    assert reply == thrift_reply(UPGRADE, 0)                  # seqid 0, empty struct
    assert read_reply(reply)[1:] == (UPGRADE, REPLY, 0, {})
    c = parse_one(call("put", f_str(1, "q"), f_bin_list(2, [b"x"]), seqid=6,
                       header=request_header("worker-7")), p)
    assert c == Call("put", 6, {"queue_name": "q", "items": [b"x"], "expiration_msec": 0}, "worker-7")
    header, name, mtype, seqid, body = read_reply(encode_reply(c, 1, p.upgraded), upgraded=True)
    assert (header, name, mtype, seqid, body) == ({}, "put", REPLY, 6, {0: (TType.I32, 1)})


def test_pipelined_upgrade_then_header_calls_in_one_feed():
    data = (call(UPGRADE, seqid=1) + call("get_version", seqid=2, header=request_header("a"))
            + call("get_version", seqid=3, header=request_header()))
    assert parse(data) == [Upgrade(1), Call("get_version", 2, {}, "a"), Call("get_version", 3, {}, None)]


def test_request_header_optional_and_unknown_fields_are_skipped():
    extra = [f_i64(3, 9), lambda p: (p.writeFieldBegin("", TType.BOOL, 5), p.writeBool(True)),
             f_i64(7, 1), f_struct(6, f_i32(2, 1), f_str(1, "svc.prod"), f_i64(3, 3)),
             lambda p: (p.writeFieldBegin("", TType.LIST, 9), p.writeListBegin(TType.STRUCT, 1),
                        struct_of(f_str(1, "k"), f_str(2, "v"))(p))]
    p = ThriftParser()
    parse(call(UPGRADE), p)
    c = parse_one(call("peek", f_str(1, "q"), header=struct_of(f_i64(1, 1), f_i64(2, 2), *extra)), p)
    assert c == Call("peek", 1, {"queue_name": "q"}, "svc.prod")


def test_client_id_without_a_name_is_none():
    p = ThriftParser()
    parse(call(UPGRADE), p)
    assert parse_one(call("get_version", header=struct_of(f_struct(6))), p).client_id is None


def test_upgrade_is_only_a_call_and_only_once():
    assert parse_one(call(UPGRADE, mtype=ONEWAY, seqid=3)) == \
        BadCall(UPGRADE, 3, 1, f"Invalid method name: '{UPGRADE}'")
    p = ThriftParser()
    parse(call(UPGRADE), p)
    again = parse_one(call(UPGRADE, seqid=8, header=request_header()), p)
    assert again == BadCall(UPGRADE, 8, 1, f"Invalid method name: '{UPGRADE}'") and p.upgraded


def test_without_a_request_header_an_upgraded_connection_is_unreadable():
    p = ThriftParser()
    parse(call(UPGRADE), p)
    out = parse_one(call("get_version"), p)     # plain frame: its version word is read as a header
    assert isinstance(out, ProtocolError)


def test_front_may_decline_the_upgrade_by_clearing_the_flag():
    p = ThriftParser()
    assert parse_one(call(UPGRADE), p) == Upgrade(1)
    p.upgraded = False
    assert parse_one(call("get_version", seqid=2), p) == Call("get_version", 2, {}, None)


def test_unreadable_upgrade_arguments_close():
    msg = struct.pack(">Ii", 0x80010001, len(UPGRADE)) + UPGRADE.encode() + struct.pack(">i", 1)
    out = parse_one(frame(msg + b"\x0b\x00\x01"))
    assert isinstance(out, ProtocolError) and UPGRADE in out.reason


# ----------------------------------------------------------------------------- the test client

class FakeKestrel:
    """One-connection server on the codec with an in-memory queue model, for the client tests."""

    def __init__(self, accept_upgrade: bool = True):
        self.accept_upgrade = accept_upgrade
        self.queues: dict[str, list[bytes]] = {}
        self.pending: dict[int, tuple[str, bytes]] = {}
        self.next_id = 1
        self.status = th.STATUS_UP
        self.client_ids: list[str | None] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        conn, _ = self.listener.accept()
        parser = ThriftParser()
        with conn:
            while data := conn.recv(65536):
                parser.feed(data)
                while (o := parser.next()) is not None:
                    if isinstance(o, ProtocolError):
                        return
                    conn.sendall(self._answer(o, parser))

    def _answer(self, o, parser) -> bytes:
        if isinstance(o, Upgrade):
            if self.accept_upgrade:
                return encode_upgrade_reply(o.seqid)
            parser.upgraded = False
            return encode_exception(UPGRADE, o.seqid, 1, f"Invalid method name: '{UPGRADE}'", False)
        if isinstance(o, BadCall):
            return encode_exception(o.method, o.seqid, o.exc_type, o.message, parser.upgraded)
        self.client_ids.append(o.client_id)
        try:
            value = getattr(self, "do_" + o.method)(**o.args)
        except ValueError as e:
            return encode_exception(o.method, o.seqid, 6, internal_error(o.method, str(e)), parser.upgraded)
        return encode_reply(o, value, parser.upgraded)

    def do_put(self, queue_name, items, expiration_msec):
        self.queues.setdefault(queue_name, []).extend(items)
        return len(items)

    def do_get(self, queue_name, max_items, timeout_msec, auto_abort_msec):
        q = self.queues.setdefault(queue_name, [])
        taken, q[:max_items] = q[:max_items], []
        out = []
        for data in taken:
            xid = 0
            if auto_abort_msec > 0:
                xid, self.next_id = self.next_id, self.next_id + 1
                self.pending[xid] = (queue_name, data)
            out.append(Item(data, xid))
        return out

    def do_confirm(self, queue_name, ids):
        return sum(self.pending.pop(i, None) is not None for i in ids)

    def do_abort(self, queue_name, ids):
        n = 0
        for i in ids:
            if (hit := self.pending.pop(i, None)) is not None:
                self.queues[hit[0]].insert(0, hit[1])
                n += 1
        return n

    def do_peek(self, queue_name):
        q = self.queues.setdefault(queue_name, [])
        return QueueInfo(q[0] if q else None, len(q), sum(map(len, q)), 0, 0, 0,
                         sum(1 for name, _ in self.pending.values() if name == queue_name))

    def do_flush_queue(self, queue_name):
        self.queues[queue_name] = []

    def do_flush_all_queues(self):
        for q in self.queues.values():
            q.clear()

    def do_delete_queue(self, queue_name):
        self.queues.pop(queue_name, None)

    def do_current_status(self):
        return self.status

    def do_set_status(self, status):
        if status == th.STATUS_NOT_CONFIGURED:
            raise ValueError("net.lag.kestrel.UnknownStatusException: Unknown status.")
        self.status = status

    def do_get_version(self):
        return "2.4.8-lanner"

    def close(self):
        self.thread.join(5)
        self.listener.close()
        assert not self.thread.is_alive()


@pytest.fixture
def server(request):
    s = FakeKestrel(**getattr(request, "param", {}))
    yield s
    s.close()


@pytest.mark.parametrize("upgrade", [False, True], ids=["plain", "upgraded"])
def test_client_speaks_every_method(server, upgrade):
    with KestrelThrift("127.0.0.1", server.port, upgrade=upgrade, client_id="cli-1") as c:
        assert c.upgraded is upgrade
        assert c.get_version() == "2.4.8-lanner"
        assert c.put("jobs", [b"a", b"b", b"c"]) == 3
        assert c.peek("jobs") == TQueueInfo(b"a", 3, 3, 0, 0, 0, 0)
        assert c.get("jobs", 1) == [TItem(b"a", 0)] == [(b"a", 0)]
        got = c.get("jobs", 5, auto_abort_msec=1000)
        assert got == [(b"b", 1), (b"c", 2)]
        assert c.peek("jobs").open_transactions == 2
        assert c.abort("jobs", {2, 99}) == 1
        assert c.confirm("jobs", [1]) == 1
        assert c.get("jobs", 5) == [(b"c", 0)]
        assert c.peek("jobs").head_item is None
        c.put("a", [b"1"])
        c.flush_queue("a")
        assert c.get("a", 1) == []
        c.put("b", [b"1"])
        c.flush_all_queues()
        assert c.get("b", 1) == []
        c.delete_queue("b")
        assert "b" not in server.queues
        assert c.current_status() == 3
        c.set_status(th.STATUS_READ_ONLY)
        assert c.current_status() == th.STATUS_READ_ONLY
        with pytest.raises(ThriftAppError) as e:
            c.set_status(th.STATUS_NOT_CONFIGURED)
        assert (e.value.type, e.value.message) == (
            6, "Internal error processing set_status: 'net.lag.kestrel.UnknownStatusException: Unknown status.'")
        assert c.get_version() == "2.4.8-lanner"           # still usable after the exception
    assert set(server.client_ids) == ({"cli-1"} if upgrade else {None})


@pytest.mark.parametrize("server", [{"accept_upgrade": False}], indirect=True)
def test_client_falls_back_when_the_upgrade_is_refused(server):
    with KestrelThrift("127.0.0.1", server.port, upgrade=True, client_id="x") as c:
        assert not c.upgraded
        assert c.put("q", [b"z"]) == 1
        assert c.get("q", 1) == [(b"z", 0)]
    assert server.client_ids == [None, None]


def test_client_sees_upgrade_reply_seqid_zero(server):
    with KestrelThrift("127.0.0.1", server.port, upgrade=True) as c:
        assert c.upgraded and c.last_reply_seqid == 0
        c.get_version()
        assert c.last_reply_seqid == c.seqid == 2
