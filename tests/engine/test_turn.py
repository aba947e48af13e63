"""What a worker's turn pays for (issue 8, per-loop-turn costs), in-process: the timer is armed
when a deadline comes that is earlier than the armed one, never as a matter of course, and the
batch's end visits the storages its requests wrote, not every storage that is not yet synced."""
from __future__ import annotations

import asyncio
import os
import threading

from lanner.ipc.messages import OP_SET, R_OK, pack_req, unpack_resp
from lanner.perf.hotloop import Rig
from lanner.server.commit import WRITE_BEHIND_BYTES
from lanner.storage import writer as WR


NO_DEADLINE = float("inf")      # the armed timer's deadline while none is armed (shardloop.py)


def req(conn, op, queue, payload=b"", n=1, a=0):
    q = queue.encode()
    return pack_req(conn, n, op, 0, len(q), a, 0) + q + payload


def statuses(w):
    out = [(unpack_resp(head, 0)[0], unpack_resp(head, 0)[2]) for _, head, _ in w.published]
    w.published.clear()
    return out


class HoldingUring:
    """io_uring (storage/uring.py) as the syncer sees it, with no kernel behind it: fdatasyncs
    complete at once, except those of `path`, which complete when the test says (`release`).
    `calls` counts the fdatasyncs of `path` submitted."""

    def __init__(self, path):
        self.fd = os.eventfd(0, os.EFD_NONBLOCK)
        self.path = path
        self.held, self.done = [], []
        self.calls = 0
        self.inflight = 0

    def open(self):
        return True

    def submit(self, jobs):
        for token, fd, _datasync, _after in jobs:
            if os.path.samefile(f"/proc/self/fd/{fd}", self.path):
                self.calls += 1
                self.held.append((token, 0))
            else:
                self.done.append((token, 0))
        os.eventfd_write(self.fd, 1)
        return len(jobs), None

    def release(self):
        self.done += self.held
        self.held = []
        os.eventfd_write(self.fd, 1)

    def ready(self):
        return bool(self.done)

    def reap(self, wait=False):
        out, self.done = self.done, []
        return out

    def close(self):
        os.close(self.fd)


def test_a_journal_is_fsynced_for_the_batches_that_wrote_it_not_for_every_turn(worker, tmp_path):
    """sync "always": while q's fdatasync is under way, batches that wrote only `other` (or
    nothing) fsync `other` alone.  (The batch's end used to list every journal not yet synced,
    so each of those batches submitted one more fdatasync of q, drained behind the first.)"""
    made = []
    w = worker(sync_journal="always",
               uring=lambda: made.append(HoldingUring(str(tmp_path / "queues" / "q"))) or made[0])
    uring = made[0]
    w.handle(0, req(1, OP_SET, "q", b"a"))
    w.finish_batch()                                  # round 1: q's fdatasync, held
    assert uring.calls == 1
    for n in range(2, 5):
        w.handle(0, req(n, OP_SET, "other", b"b", n=n))
        w.finish_batch()                              # a round of `other`
        w.finish_batch()                              # and a turn that wrote nothing
    assert statuses(w) == []                          # behind round 1, in order
    uring.release()
    w.wait_for_sync()
    assert statuses(w) == [(1, R_OK), (2, R_OK), (3, R_OK), (4, R_OK)]
    assert uring.calls == 1


def test_a_write_behind_leaves_the_records_behind_it_to_the_batch_that_takes_it(worker, monkeypatch,
                                                                                  tmp_path):
    """Records that come in while a journal's write is under way (the writer thread) go out
    chained behind it, and their replies leave once that chain is taken, by a batch's end in
    which no request touched the queue, none before."""
    w = worker(uring=None)
    gate = threading.Event()
    real = WR._write

    def write(fd, data):
        assert gate.wait(10)
        return real(fd, data)
    monkeypatch.setattr(WR, "_write", write)
    big = b"x" * (WRITE_BEHIND_BYTES // 2 + 1)
    w.handle(0, req(1, OP_SET, "q", big))
    w.handle(0, req(2, OP_SET, "q", big, n=2))
    w.finish_batch()                                  # written behind, held at the gate
    assert w.writing and statuses(w) == []
    w.handle(0, req(3, OP_SET, "q", b"small", n=3))
    w.finish_batch()                                  # chained behind the write under way
    assert statuses(w) == []
    gate.set()
    w.settle_writes(block=True)
    w.finish_batch()                                  # nothing touched q in this turn
    assert statuses(w) == [(1, R_OK), (2, R_OK), (3, R_OK)]
    assert not w.coll.queue("q").storage.dirty
    assert [i.data for i in w.coll.queue("q").memory_items()][-1] == b"small"


def test_turns_that_add_no_deadline_do_not_arm_the_timer(tmp_path):
    """A turn ends with a look at the timer only if one of its requests added a deadline earlier
    than the armed one (it used to compute the earliest deadline of everything whenever no
    timer was armed, i.e. on every turn of a worker with nothing timed)."""
    rig = Rig(str(tmp_path), 1)
    try:
        w = rig.worker
        arms = []
        real = w.arm_timer

        def counted():
            arms.append(1)
            real()
        w.arm_timer = counted
        c = rig.conns[0]
        c.data_received(b"get q\r\n")
        rig.turn()                                    # the first turn looks (as `run` does)
        arms.clear()
        for i in range(50):
            c.data_received(b"set q 0 0 1\r\nx\r\n" if i % 2 == 0 else b"get q\r\n")
            rig.turn()
        assert arms == []
        assert b"".join(c.transport.written).count(b"VALUE q 0 1\r\nx\r\nEND") == 25
        assert w.timer is None and w.timer_ms == NO_DEADLINE
    finally:
        rig.close()


def test_a_deadline_earlier_than_the_armed_timer_re_arms_it_and_a_later_one_does_not(tmp_path):
    rig = Rig(str(tmp_path), 3)
    try:
        w = rig.worker
        a, b, c = rig.conns
        a.data_received(b"get q/t=5000\r\n")
        rig.turn()
        first = w.timer_ms
        assert first != NO_DEADLINE and w.timer is not None
        b.data_received(b"get q/t=10000\r\n")        # later: the armed timer stays
        rig.turn()
        assert w.timer_ms == first
        # earlier: re-armed for it (300 ms, not 1: a 1 ms timer could fire inside the turn, and
        # the check below then saw no timer armed at all)
        c.data_received(b"get r/t=300\r\n")
        rig.turn()
        assert w.timer_ms < first
        loop = w.loop
        deadline = loop.time() + 5
        while not c.transport.written and loop.time() < deadline:
            loop.run_until_complete(asyncio.sleep(0.005))
        assert b"".join(c.transport.written) == b"END\r\n"         # the 300 ms get, on time
        assert not a.transport.written and not b.transport.written
        while w.turn_scheduled:                 # the turn the timer scheduled, if still to come
            rig.turn()
        assert w.timer_ms == first                                  # back to the 5 s one
    finally:
        rig.close()
