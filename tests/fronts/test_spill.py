"""Big replies leave a connection a slice per loop turn (fronts/spill.py, issue 8 P8): no write
hands the transport more than WRITE_CHUNK, a front writes at most TURN_BYTES of them per turn over
all its connections, nothing is written while the transport still holds a slice, and the bytes
arrive exactly once, in order, with the close after them.  On main one `transport.write` took a
whole 8 MiB reply (12-22 ms in the kernel while the loop served nobody else)."""
from __future__ import annotations

import pytest

from lanner.fronts.conn import REPLY_BUDGET
from lanner.fronts.spill import TURN_BYTES, WRITE_CHUNK
from lanner.protocols import memcache_replies as mr
from tests.fronts.harness import SOCKET_BUFFER, Rig

ITEM = bytes(range(256)) * 2400            # 600 KiB: more than two slices


@pytest.fixture
def rig(tmp_path):
    r = Rig(tmp_path)
    yield r
    r.close()


def logged(rig, *clients) -> list:
    """Log each transport write as (client index, size), and "turn" where the front's
    SpillTurns starts a turn; a write while the transport holds a slice fails the test."""
    log: list = []
    for i, c in enumerate(clients):
        t = c.transport
        real = t.write

        def write(data, real=real, t=t, i=i):
            assert not t.writing_paused, "written while the transport still held a slice"
            log.append((i, len(data)))
            real(data)
        t.write = write
    spills = rig.front.spills
    real_call_soon = rig.loop.call_soon

    def call_soon(cb, *args):
        if cb == spills.run:
            def turn():
                log.append("turn")
                cb()
            return real_call_soon(turn)
        return real_call_soon(cb, *args)
    rig.loop.call_soon = call_soon
    return log


def turns(log) -> list[list]:
    out: list[list] = [[]]
    for e in log:
        if e == "turn":
            out.append([])
        else:
            out[-1].append(e)
    return out


def drain(rig, *clients) -> list[bytes]:
    """Every client reads all it has, the rig turns, until nothing more comes."""
    got = [b""] * len(clients)
    for _ in range(10_000):
        more = False
        for i, c in enumerate(clients):
            data = c.read()
            if data:
                got[i] += data
                more = True
        rig.run()
        if not more and not any(c.transport.unread for c in clients):
            return got
    raise AssertionError("the replies never drained")


def value(key: str, data: bytes) -> bytes:
    return mr.single_value(key, data)


def test_a_big_reply_leaves_in_slices_in_order_with_what_follows_it(rig):
    rig.worker().queues["big"].append(ITEM)
    c = rig.connect()
    log = logged(rig, c)
    c.send(b"get big/peek\r\nget none\r\nget big/peek\r\nset s 0 0 1\r\nx\r\nget s\r\n")
    rig.run()
    got = drain(rig, c)[0]
    assert got == value("big/peek", ITEM) + mr.END + value("big/peek", ITEM) + mr.STORED + value("s", b"x")
    sizes = [n for e in log if e != "turn" for n in [e[1]]]
    assert max(sizes) <= WRITE_CHUNK
    assert sum(sizes) == len(got)                   # every byte written once
    assert all(sum(n for _, n in t) <= TURN_BYTES for t in turns(log))
    assert not c.conn.spill and c.conn.spilled == 0


def test_a_client_that_does_not_read_holds_its_transport_to_one_slice(rig):
    rig.worker().queues["big"].append(ITEM)
    c = rig.connect()
    logged(rig, c)                                   # (asserts no write while paused)
    c.send(b"get big/peek\r\n" * 20)                 # 12 MB of replies
    rig.run()
    t = c.transport
    assert t.writing_paused
    assert len(t.unread) <= SOCKET_BUFFER + WRITE_CHUNK
    assert t.get_write_buffer_size() + c.conn.spilled + c.conn.held <= REPLY_BUDGET + 2 * len(ITEM)
    before = t.written
    rig.run()
    assert t.written == before                       # waits for the drain, does not spin
    got = drain(rig, c)[0]
    assert got == value("big/peek", ITEM) * 20


def test_connections_with_big_replies_take_turns(rig):
    item = ITEM[:300 << 10]                          # (both replies fit in the rig's ring at once)
    rig.worker().queues["big"].append(item)
    a, b = rig.connect(), rig.connect()
    log = logged(rig, a, b)
    a.send(b"get big/peek\r\n")
    b.send(b"get big/peek\r\n")
    rig.run()
    got = drain(rig, a, b)
    assert got == [value("big/peek", item)] * 2
    per_turn = [t for t in turns(log) if t]
    assert all(sum(n for _, n in t) <= TURN_BYTES for t in per_turn)
    assert {i for i, _ in per_turn[0]} == {0, 1}     # both got a slice in the first turn


def test_a_small_reply_with_nothing_spilled_is_written_at_once_in_one_write(rig):
    c = rig.connect()
    log = logged(rig, c)
    c.send(b"set s 0 0 1\r\nx\r\nget s\r\n")
    rig.run()
    assert c.read() == mr.STORED + value("s", b"x")
    assert "turn" not in log and len(log) <= 2


def test_the_close_comes_after_a_spilled_reply(rig):
    rig.worker().queues["big"].append(ITEM)
    c = rig.connect()
    c.send(b"get big/peek\r\nquit\r\nget big/peek\r\n")
    rig.run()
    assert not c.closed                              # its reply is still spilled
    got = drain(rig, c)[0]
    assert got == value("big/peek", ITEM)            # whole, once; nothing after quit
    assert c.closed


def test_a_big_value_goes_into_its_reply_without_a_copy():
    data = b"v" * mr.SPLICE_MIN
    r = mr.get_reply("k", data)
    assert r.pieces[1] is data
    assert b"".join(r.pieces) == mr.single_value("k", data) and len(r) == len(mr.single_value("k", data))
    assert mr.get_reply("k", b"small") == mr.single_value("k", b"small")
    view = memoryview(bytearray(data))               # a ring's bytes: copied, never kept
    assert mr.get_reply("k", view) == mr.single_value("k", data)

