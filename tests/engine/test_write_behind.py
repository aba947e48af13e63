"""Big journal writes go to the worker's writer thread (storage/writer.py, server/commit.py):
only the replies whose records are in such a write wait for it; a write that fails there is
rolled back like a failed flush.  In-process: requests go straight to `Worker.handle`, the
thread's write is injected (held at a gate, or failing)."""
from __future__ import annotations

import errno
import os
import threading

import pytest

from lanner.config import QueueConfig
from lanner.ipc.messages import OP_GET, OP_SET, R_ITEM, R_OK, R_SERVER_ERROR, RF_CLOSE, RF_HELD
from lanner.server.commit import WRITE_BEHIND_BYTES
from lanner.storage import writer as W
from lanner.storage.journal.codec import encode_open
from lanner.storage.journal.files import archived_files
from lanner.queues.item import QItem
from lanner.storage.journal.journal import Journal
from lanner.storage.writer import Writer
from tests.engine.test_worker_rollback import queue_datas, replies, req

BIG = b"x" * (WRITE_BEHIND_BYTES + 1)


@pytest.fixture
def gated(monkeypatch):
    """The writer thread's writes wait at `gate` (and fail with `error[0]` if set)."""
    gate = threading.Event()
    started = threading.Event()
    error: list = []

    def write(fd, data):
        started.set()
        assert gate.wait(10), "the test never opened the gate"
        if error:
            raise OSError(error[0], os.strerror(error[0]))
        return os.write(fd, data)
    monkeypatch.setattr(W, "_write", write)
    return gate, started, error


def settle(w):
    """Wait for the write-behinds under way, then end the turn (as the loop does when the
    writer's byte arrives)."""
    for st in list(w.writing):
        st._inflight.wait()
    w.finish_batch()


def test_a_big_write_holds_only_the_replies_whose_records_it_carries(worker, gated, tmp_path):
    gate, started, _ = gated
    w = worker()
    w.handle(0, req(1, OP_SET, "big", payload=BIG))
    w.handle(0, req(2, OP_SET, "small", payload=b"s", n=2))      # another connection, same turn
    w.finish_batch()
    assert started.wait(10) and w.writing
    assert replies(w) == {2: [(R_OK, 0, b"")]}                   # not held behind the big write
    w.handle(0, req(3, OP_SET, "small", payload=b"t", n=3))       # a later turn, still not held
    w.handle(0, req(1, OP_SET, "small", payload=b"u", n=4))       # the big one's connection
    w.finish_batch()
    assert replies(w) == {3: [(R_OK, 0, b"")], 1: [(R_OK, 0, b"")]}   # (its front orders them)
    gate.set()
    settle(w)
    assert replies(w) == {1: [(R_OK, 0, b"")]}                   # the big set, once written
    assert os.path.getsize(tmp_path / "queues" / "big") == len(BIG) + 21
    assert queue_datas(w, "small") == [b"s", b"t", b"u"]


def test_records_after_a_big_write_wait_for_it_in_order(worker, gated, tmp_path):
    """A get of the item whose ADD is still being written waits for that write and for its own
    REMOVE_TENTATIVE record (a held read: server/holding.py), which goes to the file after it."""
    gate, started, _ = gated
    w = worker()
    w.handle(0, req(1, OP_SET, "big", payload=BIG))
    w.finish_batch()
    assert started.wait(10)
    w.handle(0, req(2, OP_GET, "big"))
    w.finish_batch()
    assert replies(w) == {}
    gate.set()
    settle(w)
    settle(w)                                  # the REMOVE goes out in the turn after
    assert replies(w) == {1: [(R_OK, 0, b"")], 2: [(R_ITEM, RF_HELD, BIG)]}
    with open(tmp_path / "queues" / "big", "rb") as f:
        assert f.read()[-5:] == encode_open(1)  # ADD, then its held read: in order on disk


def test_a_write_that_fails_in_the_thread_is_rolled_back(worker, gated, tmp_path):
    gate, started, error = gated
    w = worker()
    w.handle(0, req(1, OP_SET, "big", payload=b"old"))
    w.finish_batch()
    assert replies(w) == {1: [(R_OK, 0, b"")]}
    size = os.path.getsize(tmp_path / "queues" / "big")
    w.handle(0, req(2, OP_SET, "big", payload=BIG))
    w.handle(0, req(3, OP_SET, "other", payload=b"kept"))
    w.finish_batch()
    assert started.wait(10)
    assert replies(w) == {3: [(R_OK, 0, b"")]}
    w.handle(0, req(4, OP_GET, "big"))                           # takes "old" behind the big write
    w.finish_batch()
    error.append(errno.ENOSPC)
    gate.set()
    settle(w)
    got = replies(w)
    why = b"write of %d bytes failed: No space left on device (queue 'big')" % (len(BIG) + 21)
    assert got[2] == [(R_SERVER_ERROR, RF_CLOSE, why)]
    assert got[4][0][:2] == (R_SERVER_ERROR, RF_CLOSE)            # its REMOVE was lost with it
    assert queue_datas(w, "big") == [b"old"] and queue_datas(w, "other") == [b"kept"]
    assert os.path.getsize(tmp_path / "queues" / "big") == size   # cut back
    error.clear()
    w.handle(0, req(5, OP_GET, "big"))
    settle(w)
    assert replies(w) == {5: [(R_ITEM, RF_HELD, b"old")]}


def test_packed_archives_are_deleted_by_the_writer_thread_and_a_leftover_by_replay(tmp_path, clock):
    """A worker's journal deletes the archives a pack replaced off the loop: renamed to a `~~`
    temporary at once (no longer an archive), unlinked by the writer thread; one a crash left
    behind is deleted at the next replay."""
    d = tmp_path / "queues"
    d.mkdir()
    for n in ("q.100", "q.200.pack", "q.300"):
        (d / n).write_bytes(b"")
    (d / "q~~50.old").write_bytes(b"left by a crash")
    r, w = os.pipe()
    writer = Writer(w)
    j = Journal(str(d), "q", clock)
    j.replay(QueueConfig())
    assert "q~~50.old" not in os.listdir(d)
    j.writer = writer
    (d / "q.400.pack").write_bytes(b"")
    assert archived_files(str(d), "q", j._discard) == ["q.400"]
    writer.close()                               # runs what was queued, then stops
    assert sorted(os.listdir(d)) == ["q", "q.400"]
    j.close()
    os.close(r)
    os.close(w)


class DoneAfterFirstLook:
    """A write's `done` that the writer's thread sets right after the owner's first look at it:
    that look answers False, then the held write is let go and finished (the thread sets this
    very object, which stands in the job's slot)."""

    def __init__(self, real: threading.Event, gate: threading.Event) -> None:
        self.real, self.gate, self.looks = real, gate, 0

    def is_set(self) -> bool:
        self.looks += 1
        was = self.real.is_set()
        if self.looks == 1:
            self.gate.set()
            assert self.real.wait(10), "the writer's thread did not finish the write"
        return was

    def set(self) -> None:
        self.real.set()

    def wait(self, timeout=None) -> bool:
        return self.real.wait(timeout)


def test_a_write_finished_while_settle_write_looks_is_taken_later_not_failed(tmp_path, clock, gated, writer):
    """settle_write(block=False) looks at each write's `done` while the writer's thread may
    finish one at any moment.  Before, after the look that found a write under way, it looked
    at that write again, found it done, and took it for a failed one (seen in test_quiet_turn
    under load: AttributeError on its `error`, None, and the file cut back).  Now the write is
    taken, as done, at the next settle."""
    gate, started, _ = gated
    d = tmp_path / "queues"
    d.mkdir()
    j = Journal(str(d), "q", clock)
    j.replay(QueueConfig())
    j.writer = writer
    j.record_add(QItem(clock.now_ms(), 0, b"one"))
    assert j.write_behind() and started.wait(10)
    [job] = j._chain
    job.done = DoneAfterFirstLook(job.done, gate)
    j.settle_write(block=False)
    assert job.done.looks >= 1 and job.error is None
    j.settle_write(block=False)
    assert not j._chain and j.write_done
    j.close()
    again = Journal(str(d), "q", clock)
    assert [i.data for i in again.replay(QueueConfig()).items] == [b"one"]
    again.close()
