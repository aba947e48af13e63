"""The fused local path (fronts/inline.py, Worker.inline_set / inline_get), in-process: a real
worker with its own front and memcache connections on fake transports (perf/hotloop.py's rig).
Each test checks that the path was taken (the front's `inline_requests`) and that a rule of the
normal path still holds: reply order, the commit gate, rollback, open reads."""
from __future__ import annotations

import errno
import os
import threading
import time

import pytest

from lanner.config import Config, QueueConfig, ServerConfig
from lanner.fronts.conn import REPLY_BUDGET, room_for
from lanner.perf.hotloop import NullTransport, Rig
from lanner.server import worker as W
from lanner.storage.journal import journal as J


class Transport(NullTransport):
    """The benchmark's transport, but a close is recorded rather than an error."""

    def __init__(self) -> None:
        super().__init__()
        self.closed = False

    def is_closing(self) -> bool:
        return self.closed

    def write(self, data: bytes) -> None:
        assert not self.closed
        self.written.append(data)

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True


@pytest.fixture
def rig(tmp_path):
    made = []

    def make(conns: int = 1, **default) -> Rig:
        cfg = Config(server=ServerConfig(queue_path=str(tmp_path / "q"), status_file=str(tmp_path / "status")),
                     default=QueueConfig(**default))
        os.makedirs(cfg.server.queue_path, exist_ok=True)
        r = Rig(str(tmp_path), conns, config=cfg, transport=Transport)
        made.append(r)
        return r
    yield make
    for r in made:
        r.close()


def out(c) -> bytes:
    data = b"".join(c.transport.written)
    c.transport.written.clear()
    return data


def run(r: Rig, c, data: bytes) -> bytes:
    c.data_received(data)
    r.turn()
    return out(c)


def test_set_and_get_take_the_fused_path(rig):
    r = rig()
    [c] = r.conns
    assert run(r, c, b"set q 0 0 3\r\nabc\r\nget q\r\nget q\r\n") == \
        b"STORED\r\nVALUE q 0 3\r\nabc\r\nEND\r\nEND\r\n"
    assert r.worker.front.inline_requests == 3
    assert not c.slots and not c.parts and not c.fast
    st = r.worker.coll.stats()
    assert (st["get_hits"], st["get_misses"]) == (1, 1)
    assert list(c.front.my.words[4:6]) == [2, 1]    # cmd_get, cmd_set (fronts/counters.py)


def test_fused_request_numbers_wrap_past_2_to_the_32_to_1_never_0(rig):
    """A connection's request numbers are 32-bit and 0 is no request: the fused path's numbering
    wraps as the ring's does ((req + 1) & 0xFFFFFFFF or 1), and the replies still pair up."""
    r = rig()
    [c] = r.conns
    c.next_req = 0xFFFFFFFE
    assert run(r, c, b"set q 0 0 1\r\na\r\nset q 0 0 1\r\nb\r\nget q\r\nget q\r\n") == \
        b"STORED\r\nSTORED\r\nVALUE q 0 1\r\na\r\nEND\r\nVALUE q 0 1\r\nb\r\nEND\r\n"
    assert c.next_req == 3
    assert r.worker.front.inline_requests == 4


def test_a_get_with_ignored_options_takes_the_fused_path_and_echoes_its_key(rig):
    """`get q/` and `get q/junk` are plain gets (Get.plain): fused, VALUE echoes the key as sent."""
    r = rig()
    [c] = r.conns
    assert run(r, c, b"set q 0 0 1\r\na\r\nset q 0 0 1\r\nb\r\nget q/\r\nget q/junk\r\n") == \
        b"STORED\r\nSTORED\r\nVALUE q/ 0 1\r\na\r\nEND\r\nVALUE q/junk 0 1\r\nb\r\nEND\r\n"
    assert r.worker.front.inline_requests == 4


def test_no_reply_before_the_turn_writes_the_journal(rig):
    """A reply leaves with its batch, after the journal write, never from the handler.  (Two
    connections: the worker's one connection ends the turn in data_received itself,
    tests/engine/test_turn.py.)"""
    r = rig(conns=2)
    c = r.conns[0]
    c.data_received(b"set q 0 0 1\r\nx\r\n")
    assert c.transport.written == [] and len(c.fast) == 1
    r.turn()
    assert out(c) == b"STORED\r\n"
    folder = r.config.server.queue_path
    assert sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder) if n.startswith("q")) > 0


def test_normal_slots_wait_for_the_inline_replies_before_them(rig):
    """set (fused), get/peek (a Slot), set (behind a Slot: the normal path), get (fused again
    only once nothing is queued): replies in command order."""
    r = rig()
    [c] = r.conns
    assert run(r, c, b"set q 0 0 1\r\na\r\nget q/peek\r\nset q 0 0 1\r\nb\r\nget q\r\n") == \
        b"STORED\r\nVALUE q/peek 0 1\r\na\r\nEND\r\nSTORED\r\nVALUE q 0 1\r\na\r\nEND\r\n"
    assert r.worker.front.inline_requests == 1
    assert run(r, c, b"get q\r\n") == b"VALUE q 0 1\r\nb\r\nEND\r\n"
    assert r.worker.front.inline_requests == 2
    # a reply made at once (no worker) waits for the inline reply before it
    assert run(r, c, b"set q 0 0 1\r\nc\r\nversion\r\n").startswith(b"STORED\r\nVERSION ")
    assert r.worker.front.inline_requests == 3


def test_inline_replies_that_come_back_out_of_order_leave_in_order(rig):
    """A write-behind may hold one queue's reply while a later one on another queue leaves
    (server/commit.py hold_unwritten): the connection still answers in command order.  (Two
    connections, so that the turn ends in `r.turn()`, not in data_received.)"""
    r = rig(conns=2)
    c = r.conns[0]
    assert run(r, c, b"set a 0 0 1\r\n1\r\nset b 0 0 1\r\n2\r\n") == b"STORED\r\nSTORED\r\n"
    for get in (b"get a\r\n", b"get b\r\n", b"get a\r\n"):
        c.data_received(get)        # a read each: replies carried one by one (rendered.py)
    assert len(r.worker.replies) == 3
    r.worker.replies.reverse()
    r.turn()
    assert out(c) == b"VALUE a 0 1\r\n1\r\nEND\r\nVALUE b 0 1\r\n2\r\nEND\r\nEND\r\n"
    assert not c.fast and not c.early


def test_a_plain_get_with_an_open_read_on_the_queue_is_an_error(rig):
    r = rig()
    [c] = r.conns
    assert run(r, c, b"set q 0 0 1\r\na\r\nset q 0 0 1\r\nb\r\nget q/open\r\n") == \
        b"STORED\r\nSTORED\r\nVALUE q/open 0 1\r\na\r\nEND\r\n"
    before = r.worker.front.inline_requests
    assert run(r, c, b"get q\r\nset q 0 0 1\r\nc\r\n") == b"ERROR\r\n"
    assert r.worker.front.inline_requests == before + 1
    assert c.transport.closed
    r.turn()                                      # the disconnect rolls the open read back
    assert [i.data for i in r.worker.coll.queue("q").memory_items()] == [b"a", b"b"]


def test_a_failed_journal_write_makes_the_inline_reply_an_error(rig, monkeypatch):
    r = rig()
    [c] = r.conns
    assert run(r, c, b"set q 0 0 1\r\na\r\n") == b"STORED\r\n"

    def enospc(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(J, "_write", enospc)
    got = run(r, c, b"set q 0 0 1\r\nb\r\n")
    assert got.startswith(b"SERVER_ERROR ") and b"No space left on device" in got, got
    assert b"/" not in got                         # no server path in a reply
    assert c.transport.closed
    assert [i.data for i in r.worker.coll.queue("q").memory_items()] == [b"a"]


class Unreadable:
    """A queue config every read of which raises: the queue's add or remove fails half-way."""

    def __getattr__(self, name):
        raise RuntimeError("config unreadable: " + name)


@pytest.mark.parametrize("request_", [b"set q 0 0 1\r\nb\r\n", b"get q\r\n"])
def test_a_fused_request_the_queue_raises_on_is_a_server_error_that_closes(rig, request_):
    """The worker's fused set and get (server/inline.py) answer a request whose queue call
    raised as the worker answers any (request_failed): SERVER_ERROR, the connection closed,
    the shard and the queue's items untouched."""
    r = rig(2)
    c, other = r.conns
    assert run(r, c, b"set q 0 0 1\r\na\r\n") == b"STORED\r\n"
    q = r.worker.coll.queue("q")
    config, q.config = q.config, Unreadable()
    before = r.worker.front.inline_requests
    assert run(r, other, request_) == b"SERVER_ERROR internal error\r\n"
    assert r.worker.front.inline_requests == before + 1
    assert other.transport.closed and not c.transport.closed
    q.config = config
    assert run(r, c, b"get q\r\nget q\r\n") == b"VALUE q 0 1\r\na\r\nEND\r\nEND\r\n"


def test_under_sync_always_no_reply_before_the_fsync(rig, monkeypatch):
    monkeypatch.setattr(W, "open_uring", lambda: None)   # the fsync threads, which call J._fsync
    r = rig(sync_journal="always")
    [c] = r.conns
    gate = threading.Event()
    started = threading.Event()

    def fsync(fd):
        started.set()
        assert gate.wait(10)
        os.fsync(fd)
    monkeypatch.setattr(J, "_fsync", fsync)
    c.data_received(b"set q 0 0 1\r\nx\r\nget q\r\n")
    r.turn()
    assert started.wait(10)
    r.turn()
    assert c.transport.written == []              # the fsync has not finished: nothing replied
    assert r.worker.front.inline_requests == 2
    gate.set()
    deadline = time.monotonic() + 10
    while not c.transport.written and time.monotonic() < deadline:
        r.turn()                                  # the fsync thread's pipe wakes the loop
    assert out(c) == b"STORED\r\nVALUE q 0 1\r\nx\r\nEND\r\n"


def test_room_with_nothing_out_follows_the_reply_size_estimate(rig):
    """`Conn.room`'s shortcut when nothing is in flight or unsent (`idle_room`) is the general
    rule's answer, also after replies changed the size estimate it is computed from."""
    r = rig()
    c = r.conns[0]
    assert c.room() == room_for(0, REPLY_BUDGET, c.reply_size)
    before = c.reply_size
    for _ in range(20):                 # small replies through slots: the estimate falls
        s = c.new_slot()
        c.fill(s, b"y" * 100)
    out(c)
    assert c.reply_size < before and not (c.slots or c.fast or c.held or c.spilled)
    assert c.room() == room_for(0, REPLY_BUDGET, c.reply_size) > room_for(0, REPLY_BUDGET, before)


def replies_to(r: Rig, c, n: int) -> bytes:
    """`c`'s output once it holds `n` replies (END lines), turning the loop until then: a big
    batch's journal write goes behind, to the writer thread, and its replies come back in a
    later turn (how many later depends on the machine's load: a fixed count failed under load)."""
    got = b""
    deadline = time.monotonic() + 30
    while got.count(b"END\r\n") < n and time.monotonic() < deadline:
        r.turn()
        got += out(c)
    return got


def test_fused_replies_move_the_size_estimate_so_a_pipeline_of_32_takes_one_turn(rig):
    """Only slot replies moved `reply_size`, so a connection that only sets and gets kept the
    first, pessimistic estimate (REPLY_BUDGET / 16): 16 commands a turn, and 32 pipelined
    requests took two turns and two journal writes.  Fused replies now move it too; a big one
    raises it again, so flow control still bounds what big replies may pile up."""
    r = rig()
    c = r.conns[0]
    first = c.room()
    assert first == 16
    for _ in range(40):                  # small fused replies: the estimate falls
        c.data_received(b"set q 0 0 1\r\nx\r\nget q\r\n")
        r.turn()
    out(c)
    assert c.room() > 32
    c.data_received(b"set q 0 0 1\r\nx\r\nget q\r\n" * 16)     # 32 requests in one write
    r.turn()
    assert out(c) == b"STORED\r\nVALUE q 0 1\r\nx\r\nEND\r\n" * 16     # all in the one turn
    big = b"b" * (1 << 20)
    for _ in range(8):                   # big fused replies: the estimate climbs back
        c.data_received(b"set q 0 0 %d\r\n%s\r\nget q\r\n" % (len(big), big))
        assert replies_to(r, c, 1).count(b"VALUE q 0 %d\r\n" % len(big)) == 1
    assert c.reply_size > 64 << 10 and c.idle_room == room_for(0, REPLY_BUDGET, c.reply_size) < 64
