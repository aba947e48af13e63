"""A put frame decoded as it arrives (protocols/thrift_put.py) against the whole-frame decoder.

The whole-frame decoder (ThriftParser without an item limit) is the reference: for any bytes,
cut anywhere, the streamed parser yields the same outcomes, except that an item over the bound
is an Oversized(size) instead of its bytes; and it never holds such an item.  Frames are built
with the `thrift` package (tests/protocols/test_thrift.py helpers), then cut, corrupted or
padded at random.
"""
from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings, strategies as st
from thrift.Thrift import TType

from lanner.protocols import thrift as th
from lanner.protocols.oversized import Oversized
from lanner.protocols.thrift import BadCall, Call, ThriftParser
from tests.protocols.test_thrift import (
    _unknown_fields, call, f_bin_list, f_i32, f_str, field, frame, request_header,
)

BOUND = 100


def whole(data: bytes, upgraded: bool = False) -> list:
    p = ThriftParser()
    p.upgraded = upgraded
    p.feed(data)
    return list(p.commands())


def streamed(data: bytes, cuts, bound=lambda q: BOUND, upgraded: bool = False, stream_over: int = 0):
    """(outcomes, the most `held` ever was) feeding `data` cut before each offset in `cuts`."""
    p = ThriftParser(item_limit=bound, stream_over=stream_over)
    p.upgraded = upgraded
    out, peak, pos = [], 0, 0
    for end in sorted(set(cuts) | {len(data)}):
        p.feed(data[pos:end])
        pos = end
        peak = max(peak, p.held)
        out.extend(p.commands())
        peak = max(peak, p.held)
    return out, peak


def dropped(outcomes: list, bound: int = BOUND) -> list:
    """The outcomes with every put item over `bound` an Oversized: as the streamed parser gives
    them (a frame complete when the parser first sees it is decoded whole, its items bytes;
    the front treats both alike)."""
    out = []
    for o in outcomes:
        if type(o) is Call and o.method == "put":
            items = [Oversized(len(i)) if type(i) is bytes and len(i) > bound else i
                     for i in o.args["items"]]
            o = Call(o.method, o.seqid, {**o.args, "items": items}, o.client_id)
        out.append(o)
    return out


def item(n: int, tag: int) -> bytes:
    return bytes([tag % 256]) * n


# ----------------------------------------------------------------------------- examples

def test_a_big_item_is_dropped_as_it_arrives_in_any_cut():
    big = 8 << 20
    data = call("put", f_str(1, "q"), f_bin_list(2, [b"a", item(big, 1), b"c"]), f_i32(3, 9), seqid=4)
    want = [Call("put", 4, {"queue_name": "q", "items": [b"a", Oversized(big), b"c"],
                            "expiration_msec": 9}, None)]
    for cuts in (range(0, len(data), 64 << 10), [1, *range(2, len(data), 256 << 10)],
                 [*range(0, 1000, 7), *range(1000, len(data), 256 << 10)]):
        got, peak = streamed(data, cuts, bound=lambda q: 64 << 10, stream_over=64 << 10)
        assert got == want
        assert peak <= (256 << 10) + 64                         # one piece fed, never the item
    # fed whole it was held whole before the parser saw it: decoded whole, the item is bytes
    assert streamed(data, [])[0] == whole(data) and whole(data)[0].args["items"][1] == item(big, 1)


def test_items_before_the_queue_name_are_measured_against_every_queue():
    asked = []

    def bound(q):
        asked.append(q)
        return 10 if q is None else 1000
    data = call("put", f_bin_list(2, [item(50, 1)]), f_str(1, "q"), f_bin_list(2, [item(50, 2)]))
    (got,), _ = streamed(data, range(len(data)), bound)
    assert asked == [None, "q"]
    assert got.args["items"] == [item(50, 2)]                    # the last list wins, kept


def test_upgraded_header_and_a_pipelined_frame_after_the_streamed_one():
    data = call("put", f_str(1, "q"), f_bin_list(2, [item(300, 7), b"x"]), seqid=3,
                header=request_header("me"))
    data += call("get_version", seqid=4, header=request_header())
    got, _ = streamed(data, range(0, len(data), 7), upgraded=True)
    assert got == dropped(whole(data, upgraded=True)) == [
        Call("put", 3, {"queue_name": "q", "items": [Oversized(300), b"x"], "expiration_msec": 0}, "me"),
        Call("get_version", 4, {}, None)]


def test_a_frame_malformed_after_its_items_is_type_7_once_it_is_all_in():
    """Nothing about the items is told before the frame ends: the field after them is cut."""
    msg = struct.pack(">Ii", 0x80010001, 3) + b"put" + struct.pack(">i", 5)
    body = (b"\x0b\x00\x01" + struct.pack(">i", 1) + b"q" + b"\x0f\x00\x02\x0b" + struct.pack(">i", 1)
            + struct.pack(">i", 500) + item(500, 3) + b"\x08\x00\x03\x00\x00")
    data = frame(msg + body) + call("get_version", seqid=6)
    p = ThriftParser(item_limit=lambda q: BOUND, stream_over=0)
    p.feed(data[:len(data) - len(call("get_version", seqid=6)) - 1])
    assert p.next() is None                                     # the frame is not all in yet
    p.feed(data[-len(call("get_version", seqid=6)) - 1:])
    bad, good = list(p.commands())
    assert bad == whole(data)[0]
    assert bad == BadCall("put", 5, 7, "put_args field 3 (expiration_msec): frame truncated: "
                                       "4 bytes needed at offset %d of a %d-byte frame"
                          % (len(msg + body) - 2, len(msg + body)))
    assert good == Call("get_version", 6, {}, None)


@pytest.mark.parametrize("head", [
    struct.pack(">Ii", 0x80010001, 3) + b"get" + struct.pack(">i", 1),      # another method
    struct.pack(">Ii", 0x80020001, 3) + b"put" + struct.pack(">i", 1),      # bad version
])
def test_other_frames_are_decoded_whole_as_before(head):
    data = frame(head + b"\x0b\x00\x09" + struct.pack(">i", 500) + item(500, 1) + b"\x00")
    data += call("get_version", seqid=2)
    assert streamed(data, range(len(data)))[0] == whole(data)


def test_a_header_that_needs_more_than_its_window_waits_for_the_whole_frame():
    big_header = request_header(extra=[f_str(40, "h" * (70 << 10))])
    data = call("put", f_str(1, "q"), f_bin_list(2, [item(300, 1)]), header=big_header)
    got, _ = streamed(data, range(0, len(data), 1000), upgraded=True)
    assert got == whole(data, upgraded=True)                     # bytes, as before


# ----------------------------------------------------------------------------- every input

UNKNOWN = _unknown_fields()


def _field(spec):
    kind, value = spec
    if kind == "queue":
        return f_str(1, value)
    if kind == "items":
        return f_bin_list(2, [item(n, i) for i, n in enumerate(value)])
    if kind == "exp":
        return f_i32(3, value)
    if kind == "wrong":                                     # a known id with an unexpected type
        return field(TType.I64, value, 1)
    return UNKNOWN[value]


FIELDS = st.lists(st.one_of(
    st.tuples(st.just("queue"), st.text("qé+", max_size=3)),
    st.tuples(st.just("items"), st.lists(st.integers(0, 250), max_size=4)),
    st.tuples(st.just("exp"), st.integers(-(1 << 31), (1 << 31) - 1)),
    st.tuples(st.just("wrong"), st.sampled_from([1, 2, 3])),
    st.tuples(st.just("unknown"), st.integers(0, len(UNKNOWN) - 1)),
), max_size=6)


@settings(max_examples=300, deadline=None)
@given(fields=FIELDS, strict=st.booleans(), upgraded=st.booleans(),
       cut=st.integers(0, 1 << 16), flip=st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)),
                                                 max_size=2),
       tail=st.binary(max_size=4), cuts=st.lists(st.integers(0, 1 << 12), max_size=12))
def test_any_put_frame_cut_anywhere_decodes_as_it_does_whole(fields, strict, upgraded, cut, flip,
                                                              tail, cuts):
    data = call("put", *[_field(f) for f in fields], seqid=11, strict=strict,
                header=request_header("c") if upgraded else None)
    body = bytearray(data[4:])
    for at, value in flip:                               # anywhere, the message header included
        body[at % len(body)] = value
    body = bytes(body[:len(body) - cut % (len(body) + 1)]) + tail
    data = frame(body) + call("get_version", seqid=12, header=request_header() if upgraded else None)
    want = dropped(whole(data, upgraded), BOUND)
    got, _ = streamed(data, [5, *(c % (len(data) + 1) for c in cuts)], upgraded=upgraded)
    assert dropped(got) == want


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=120), cuts=st.lists(st.integers(0, 150), max_size=10))
def test_arbitrary_argument_bytes_behind_a_put_header(body, cuts):
    msg = struct.pack(">Ii", 0x80010001, 3) + b"put" + struct.pack(">i", 8)
    data = frame(msg + body) + call("get_version", seqid=9)
    assert dropped(streamed(data, [5, 25, *cuts], bound=lambda q: 4)[0], 4) == dropped(whole(data), 4)


def test_stream_over_and_no_item_limit_keep_the_whole_frame_path():
    data = call("put", f_str(1, "q"), f_bin_list(2, [item(300, 1)]))
    assert streamed(data, range(len(data)), stream_over=len(data))[0] == whole(data)
    p = ThriftParser()
    for i in range(len(data)):
        p.feed(data[i:i + 1])
    assert p.next() == whole(data)[0] and th.STREAM_OVER == 64 << 10


BROKEN = {
    "negative string length": b"\x0b\x00\x01\xff\xff\xff\xff",
    "string past the frame": b"\x0b\x00\x01\x00\x00\x10\x00abc",
    "no STOP": b"\x0b\x00\x01\x00\x00\x00\x01q",
    "half a field header": b"\x0b\x00",
    "i32 cut short": b"\x08\x00\x03\x00\x00",
    "list<i32> for items": b"\x0f\x00\x02\x08\x00\x00\x00\x01\x00\x00\x00\x05\x00",
    "negative list size": b"\x0f\x00\x02\x0b\xff\xff\xff\xfe\x00",
    "huge count, tiny frame": b"\x0f\x00\x02\x0b\x7f\xff\xff\xff\x00",
    "item past the frame": b"\x0f\x00\x02\x0b\x00\x00\x00\x02\x00\x00\x00\x09abc",
    "negative item length": b"\x0f\x00\x02\x0b\x00\x00\x00\x01\xff\xff\xff\xf0",
    "unknown field type": b"\x11\x00\x09\x00",
    "unknown field type, signed": b"\x91\x00\x09\x00",
    "unknown type in a struct, unsigned": b"\x0c\x00\x09\x91\x00\x01\x00",
    "void elements": b"\x0f\x00\x09\x01\x00\x00\x00\x03\x00",
    "huge skipped bool list": b"\x0f\x00\x09\x02\x7f\xff\xff\xff\x00",
    "negative map size": b"\x0d\x00\x09\x0b\x0b\xff\xff\xff\xff\x00",
    "map past the frame": b"\x0d\x00\x09\x0b\x08\x00\x00\x00\x02\x00\x00\x00\x01k\x00",
    "nesting too deep": b"\x0c\x00\x09" + b"\x0c\x00\x01" * 80 + b"\x00" * 82,
    "fine, then ignored bytes": b"\x0b\x00\x09\x00\x00\x00\x02ab\x00trailing",
}


@pytest.mark.parametrize("body", list(BROKEN.values()), ids=list(BROKEN))
def test_every_way_a_put_struct_breaks_reads_the_same_byte_by_byte(body):
    msg = struct.pack(">Ii", 0x80010001, 3) + b"put" + struct.pack(">i", 5)
    data = frame(msg + body) + call("get_version", seqid=6)
    got, _ = streamed(data, range(len(data)), bound=lambda q: 1)
    assert dropped(got, 1) == dropped(whole(data), 1) and len(got) == 2
