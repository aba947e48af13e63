"""A put carrying an item larger than the queue takes: the answer Kestrel gives (thrift: the count
before it, reference §3.3; text: the items stored, §2.2), whatever way the bytes arrive, without
the server holding the item meanwhile (protocols/thrift_put.py, protocols/text.py, oversized.py).
Real `lanner serve` in each process layout, raw sockets and the `thrift` package.
"""
from __future__ import annotations

import struct

import psutil
import pytest

from lanner.perf.thrift_client import KestrelThrift
from tests.helpers import LAYOUTS, recv_exact, recv_until, start_server, wait_for
from tests.protocols.test_thrift import call, f_bin_list, f_i32, f_str, read_reply

pytestmark = pytest.mark.integration

CONFIG = """
[default]
max_item_size = "64KiB"
[queues."big"]
max_item_size = "1MiB"
[queues."wide+copy"]
max_item_size = "1MiB"
[aliases."both"]
destinations = ["small", "big"]
"""
BIG = 8 << 20
HELD = 4 << 20          # what a server process may grow by while a put arrives (it is 8-16 MiB)


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def server(request, tmp_path_factory):
    h = start_server(tmp_path_factory.mktemp("big-puts-" + request.param), layout=request.param,
                     thrift=True, config=CONFIG)
    yield h
    h.stop()


def processes(server) -> list[psutil.Process]:
    top = psutil.Process(server.proc.pid)
    return [top, *top.children(recursive=True)]


def rss(server) -> int:
    return sum(p.memory_info().rss for p in processes(server))


def read_chars(server) -> int:
    return sum(p.io_counters().read_chars for p in processes(server))


def send(sock, data: bytes, how: str) -> None:
    if how == "whole":
        sock.sendall(data)
    elif how == "1-then-rest":
        sock.sendall(data[:1])
        sock.sendall(data[1:])
    else:
        for i in range(0, len(data), 64 << 10):
            sock.sendall(data[i:i + (64 << 10)])


def thrift_result(sock):
    (n,) = struct.unpack(">i", recv_exact(sock, 4))
    _, name, _, seqid, body = read_reply(struct.pack(">i", n) + recv_exact(sock, n))
    return name, seqid, body[0][1] if body else None


def sent_and_read(server, sock, data: bytes, before: int) -> int:
    """Send all of `data` but its last byte, in 64 KiB writes; once the server has read them,
    how much more memory its processes hold than `before`."""
    start = read_chars(server)
    send(sock, data[:-1], "64k")
    assert wait_for(lambda: read_chars(server) - start >= len(data) - 1), "the server stopped reading"
    return rss(server) - before


# ----------------------------------------------------------------------------- thrift

@pytest.mark.parametrize("how", ["whole", "1-then-rest", "64k"])
def test_a_thrift_put_with_an_item_over_max_item_size_counts_up_to_it(server, how):
    q = "t-" + how
    s = server.connect(server.thrift_port)
    try:
        send(s, call("put", f_str(1, q), f_bin_list(2, [b"a", b"b" * BIG, b"c"]), f_i32(3, 0), seqid=7), how)
        assert thrift_result(s) == ("put", 7, 1)
        s.sendall(call("get", f_str(1, q), f_i32(2, 10), seqid=8))      # the same connection
        name, seqid, items = thrift_result(s)
        assert (name, seqid) == ("get", 8) and [i[1][1] for i in items[1]] == [b"a"]
    finally:
        s.close()


def test_the_server_does_not_hold_the_item_while_the_frame_arrives(server):
    s = server.connect(server.thrift_port)
    try:
        data = call("put", f_str(1, "held"), f_bin_list(2, [b"a", b"b" * BIG, b"c"]), seqid=3)
        grown = sent_and_read(server, s, data, rss(server))
        s.sendall(data[-1:])
        assert thrift_result(s) == ("put", 3, 1)
        assert grown < HELD, f"server memory grew by {grown} bytes while an 8 MiB item arrived"
    finally:
        s.close()
    c = KestrelThrift("127.0.0.1", server.thrift_port)
    try:
        assert [i.data for i in c.get("held", 10)] == [b"a"]
    finally:
        c.close()


def test_the_thrift_client_gets_kestrels_counts(server):
    """The `thrift` package as users call it: the count before the refused item; a put of it
    alone creates the queue and stores nothing (0); an item over the master's limit still
    reaches a fanout child that takes it; the queue name after the items is read all the same."""
    c = KestrelThrift("127.0.0.1", server.thrift_port, upgrade=True, client_id="big")
    try:
        assert c.put("client", [b"x" * (64 << 10), b"y" * BIG, b"z"]) == 1
        assert [i.data for i in c.get("client", 10)] == [b"x" * (64 << 10)]
        assert c.put("fresh", [b"y" * BIG]) == 0
        m = server.connect()
        m.sendall(b"stats\r\n")
        assert b"STAT queue_fresh_items 0\r\n" in recv_until(m, b"END\r\n")
        m.close()
        c.peek("wide+copy")                                  # the child exists: it gets copies
        assert c.put("wide", [b"a", b"w" * (512 << 10)]) == 1
        assert [i.data for i in c.get("wide+copy", 10)] == [b"a", b"w" * (512 << 10)]
        assert [i.data for i in c.get("wide", 10)] == [b"a"]
    finally:
        c.close()
    s = server.connect(server.thrift_port)
    try:
        s.sendall(call("put", f_bin_list(2, [b"k", b"l" * BIG]), f_str(1, "late"), seqid=5))
        assert thrift_result(s) == ("put", 5, 1)
        s.sendall(call("get", f_str(1, "late"), f_i32(2, 10), seqid=6))
        assert thrift_result(s) == ("get", 6, (12, [{1: (11, b"k"), 2: (10, 0)}]))
    finally:
        s.close()


def test_a_put_frame_malformed_after_its_items_stores_nothing(server):
    body = call("put", f_str(1, "broken"), f_bin_list(2, [b"m", b"n" * BIG]), seqid=9)[4:-1]
    body += b"\x08\x00\x03\x00\x00"                              # expiration_msec cut short
    s = server.connect(server.thrift_port)
    try:
        send(s, struct.pack(">i", len(body)) + body, "64k")
        (n,) = struct.unpack(">i", recv_exact(s, 4))
        _, name, _, seqid, exc = read_reply(struct.pack(">i", n) + recv_exact(s, n))
        assert (name, seqid, exc.type) == ("put", 9, 7) and "expiration_msec" in exc.message
        s.sendall(call("get", f_str(1, "broken"), f_i32(2, 10), seqid=10))
        assert thrift_result(s) == ("get", 10, (12, []))
    finally:
        s.close()


# ----------------------------------------------------------------------------- text

def text_get(sock, queue: bytes) -> bytes:
    sock.sendall(b"get " + queue + b"\n")
    return recv_until(sock, b"\n")


@pytest.mark.parametrize("how", ["whole", "1-then-rest", "64k"])
def test_a_text_put_with_a_line_over_max_item_size_stores_the_others(server, how):
    s = server.connect(server.text_port)
    try:
        q = b"x-" + how.encode()
        send(s, b"put " + q + b":\nok1\n" + b"x" * (1 << 20) + b"\r\nok2\n\n", how)
        assert recv_until(s, b"\n") == b"+2\n"
        assert [text_get(s, q) for _ in range(3)] == [b":ok1\n", b":ok2\n", b"*\n"]
    finally:
        s.close()


def test_the_server_does_not_hold_the_long_lines_while_the_block_arrives(server):
    s = server.connect(server.text_port)
    try:
        data = b"put lines:\nok1\n" + b"".join(bytes([65 + i]) * (1000 << 10) + b"\n" for i in range(16))
        data += b"ok2\n\n"
        grown = sent_and_read(server, s, data, rss(server))
        s.sendall(data[-1:])
        assert recv_until(s, b"\n") == b"+2\n"
        assert grown < HELD, f"server memory grew by {grown} bytes while 16 MB of lines arrived"
        assert [text_get(s, b"lines") for _ in range(3)] == [b":ok1\n", b":ok2\n", b"*\n"]
    finally:
        s.close()


def test_text_lines_still_reach_the_queues_that_take_them(server):
    """An alias stores through every destination that takes the item (the bound is the
    largest of theirs); a line over max_line is still that error."""
    s = server.connect(server.text_port)
    try:
        s.sendall(b"put both:\nok\n" + b"v" * (512 << 10) + b"\n\n")
        assert recv_until(s, b"\n") == b"+1\n"
        assert [text_get(s, b"big") for _ in range(3)] == [b":ok\n", b":" + b"v" * (512 << 10) + b"\n", b"*\n"]
        assert [text_get(s, b"small") for _ in range(2)] == [b":ok\n", b"*\n"]
        s.sendall(b"put small:\n" + b"x" * ((1 << 20) + 2))          # no LF: known too long
        assert recv_until(s, b"\n") == b"-Line longer than 1048576 bytes.\n"
    finally:
        s.close()


def test_a_memcache_set_over_the_masters_limit_still_reaches_a_fanout_child_that_takes_it(server):
    """Kestrel's collection gives a master's fanout children their copies before the master's
    own add refuses an item too large for it (reference §5.6, collection.py `add`), for a set as
    for a put; the memcache parser refused such a set at the master's limit, so the child never
    got it.  An item over every limit the set reaches is still refused without being held."""
    c = KestrelThrift("127.0.0.1", server.thrift_port, upgrade=True, client_id="memcache-wide")
    m = server.connect()
    try:
        c.peek("wide+copy")                                  # the child exists: it gets copies
        c.get("wide+copy", 100)
        c.get("wide", 100)
        body = b"m" * (512 << 10)
        m.sendall(b"set wide 0 0 %d\r\n" % len(body) + body + b"\r\n")
        assert recv_until(m, b"\r\n") == b"NOT_STORED\r\n"   # the master's own limit: 64 KiB
        before = rss(server)
        m.sendall(b"set wide 0 0 %d\r\n" % BIG + b"w" * BIG + b"\r\n")
        assert recv_until(m, b"\r\n") == b"NOT_STORED\r\n"   # over the child's 1 MiB too
        assert rss(server) - before < HELD
        m.sendall(b"set wide 0 0 1\r\nz\r\n")
        assert recv_until(m, b"\r\n") == b"STORED\r\n"
        assert [i.data for i in c.get("wide+copy", 10)] == [body, b"z"]
        assert [i.data for i in c.get("wide", 10)] == [b"z"]
    finally:
        m.close()
        c.close()
