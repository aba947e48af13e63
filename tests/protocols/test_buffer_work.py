"""What the parsers' buffer work costs per request (issue 8, stream.py): a read with nothing
left before it is parsed where it lies, commands are taken by moving an offset, and the parser
lets a read go once it has consumed it."""
from __future__ import annotations

import sys
import tracemalloc

from lanner.protocols import memcache as mc
from lanner.protocols import text as tx
from lanner.protocols import thrift as th
from tests.protocols.test_thrift import call, f_i32, f_str

READ = b"get q\r\n" * (1 << 17)         # 896 KiB of pipelined gets in one read


def _peak_while(parse) -> int:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        parse()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def _drain(p) -> int:
    n = 0
    while p.next() is not None:
        n += 1
    return n


def test_a_read_of_whole_requests_is_parsed_in_place_not_copied():
    """Before: the read was appended to a bytearray (a copy of all of it) and each command was
    then deleted from its front (CPython moving the rest when the array fell under half its
    allocation)."""
    p = mc.MemcacheParser()
    count = []

    def parse():
        p.feed(READ)
        count.append(_drain(p))
    peak = _peak_while(parse)
    assert count == [1 << 17] and p.buffered == 0
    assert peak < len(READ) // 8, peak


def test_the_text_and_thrift_parsers_parse_a_read_in_place_too():
    p = tx.TextParser()
    peak = _peak_while(lambda: (p.feed(READ), _drain(p)))
    assert p.buffered == 0 and peak < len(READ) // 8, peak
    frames = call("get", f_str(1, "q"), f_i32(2, 1)) * 20_000
    t = th.ThriftParser()
    peak = _peak_while(lambda: (t.feed(frames), _drain(t)))
    assert t.buffered == 0 and peak < len(frames) // 8, peak


def test_a_consumed_read_is_let_go_and_a_tail_kept_alone():
    """An idle connection pins no read: once its last byte is taken, the parser drops it; a
    request cut by the end of a read keeps only its own bytes, never the read they came in."""
    p = mc.MemcacheParser()
    data = b"set q 0 0 3\r\nabc\r\n" * 100 + b"get q\r\n"
    refs = sys.getrefcount(data)
    p.feed(data)
    assert _drain(p) == 101
    assert sys.getrefcount(data) == refs
    cut = b"get q\r\n" * 1000 + b"set q 0 0 5\r\nab"
    refs = sys.getrefcount(cut)
    p.feed(cut)
    assert _drain(p) == 1000 and p.buffered == 2       # the body begun: "ab"
    p.feed(b"c")                        # the tail moves out of the read once
    assert sys.getrefcount(cut) == refs
    p.feed(b"de\r\nget q\r\n")
    cmds = list(p.commands())
    assert cmds == [mc.Set("q", 0, 0, b"abcde"), mc.Get([mc.GetKey("q", "q")])] and p.buffered == 0


def test_item_limits_may_be_a_dict_whose_missing_computes():
    """The front's ItemLimits (a dict with __missing__) is looked up in C, not called through
    its bound __getitem__ (~500 instructions a set)."""
    asked = []

    class Limits(dict):
        def __missing__(self, queue):
            asked.append(queue)
            limit = self[queue] = 4 if queue == "small" else 100
            return limit
    p = mc.MemcacheParser(item_limit=Limits())
    p.feed(b"set small 0 0 5\r\nhello\r\nset small 0 0 3\r\nabc\r\nset big 0 0 5\r\nhello\r\n"
           b"set small 0 0 9\r\n123456789\r\n")
    assert list(p.commands()) == [mc.SetRefused("small", 5, False), mc.Set("small", 0, 0, b"abc"),
                                  mc.Set("big", 0, 0, b"hello"), mc.SetRefused("small", 9, False)]
    assert asked == ["small", "big"]
