"""A small set on the queue a flood of big items writes to (issue 8, same-queue fairness): its
record goes to the writer thread chained right behind the big write under way, not with the next
big item, and its reply leaves once that record is written, while big writes chained after it are
still under way (storage/journal/journal.py `write_behind`, `settle_write(block=False)`;
server/commit.py `hold_unwritten` by mark).  Nor does the writer thread make it wait for the big
one's write-out, or for file work (unlinks, a rewrite's fsyncs) queued before it (writer.py).
In-process: requests go straight to `Worker.handle`; the thread's big writes are held at gates."""
from __future__ import annotations

import os
import threading

import pytest

from lanner.ipc.messages import OP_SET, R_OK
from lanner.server.commit import WRITE_BEHIND_BYTES
from lanner.storage import writer as W
from lanner.storage.journal import journal as J
from lanner.storage.writer import Writer
from tests.engine.test_worker_rollback import queue_datas, replies, req

BIG = b"x" * (WRITE_BEHIND_BYTES + 1)
SMALL_WRITE = 256 << 10          # the fixture's gates hold writes this big or bigger


@pytest.fixture
def big_gates(monkeypatch):
    """The writer thread's writes of a big item's bytes each wait at the next gate in turn;
    small writes go through."""
    gates = [threading.Event() for _ in range(8)]
    reached = [threading.Event() for _ in range(8)]
    n = [0]

    def write(fd, data):
        if len(data) >= SMALL_WRITE:
            i = n[0]
            n[0] += 1
            reached[i].set()
            gates[i].wait(10)        # (no assert: the thread must live on to let the worker close)
        return os.write(fd, data)
    monkeypatch.setattr(W, "_write", write)
    yield gates, reached
    for g in gates:                  # (a failed test must not leave the worker's shutdown waiting)
        g.set()


def wait_for(cond, what: str) -> None:
    for _ in range(1000):
        if cond():
            return
        threading.Event().wait(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_small_set_behind_a_big_write_waits_only_for_it_not_for_the_next(worker, big_gates, tmp_path):
    gates, reached = big_gates
    w = worker()
    w.handle(0, req(1, OP_SET, "q", payload=BIG))                  # big write 1: held at gate 0
    w.finish_batch()
    assert reached[0].wait(10)
    w.handle(0, req(2, OP_SET, "q", payload=b"small", n=2))        # chained behind it at once
    w.finish_batch()
    w.handle(0, req(3, OP_SET, "q", payload=BIG, n=3))             # big write 2, behind the small one
    w.finish_batch()
    assert replies(w) == {}
    gates[0].set()                                                 # big 1 written; big 2 held
    assert reached[1].wait(10)
    j = w.coll.queue("q").storage
    wait_for(lambda: len(j._chain) == 3 and j._chain[1].done.is_set(), "the small write, on its own")
    w.finish_batch()
    assert replies(w) == {1: [(R_OK, 0, b"")], 2: [(R_OK, 0, b"")]}     # not behind big 2
    assert w.writing                                                # big 2 still under way
    gates[1].set()
    j._chain[-1].wait()
    w.finish_batch()
    assert replies(w) == {3: [(R_OK, 0, b"")]}
    assert queue_datas(w, "q") == [BIG, b"small", BIG]
    with open(tmp_path / "queues" / "q", "rb") as f:
        data = f.read()
    assert data.index(b"small") == len(BIG) + 21 + 21 and len(data) == 3 * 21 + 2 * len(BIG) + 5


def test_under_always_a_reply_let_go_by_its_written_record_still_waits_for_its_fsync(
        worker, big_gates, monkeypatch, tmp_path):
    """Replies leave as each write of a chain finishes (above), but under sync "always" only
    after an fsync covering their records, though the chain goes on (a later write under way)."""
    gates, reached = big_gates
    q_path = str(tmp_path / "queues" / "q")
    synced, fsync_gate, armed = [], threading.Event(), []

    def fsync(fd):
        if armed and os.path.samefile(f"/proc/self/fd/{fd}", q_path):
            assert fsync_gate.wait(10)
            synced.append(os.fstat(fd).st_size)
        os.fsync(fd)
    monkeypatch.setattr(J, "_fsync", fsync)
    w = worker(sync_journal="always", uring=None)
    try:
        w.handle(0, req(9, OP_SET, "q", payload=b"first"))            # the journal made and fsynced
        w.finish_batch()
        w.wait_for_sync()
        assert replies(w) == {9: [(R_OK, 0, b"")]}
        armed.append(True)
        w.handle(0, req(1, OP_SET, "q", payload=BIG))
        w.finish_batch()
        assert reached[0].wait(10)
        w.handle(0, req(2, OP_SET, "q", payload=b"small", n=2))
        w.finish_batch()
        w.handle(0, req(3, OP_SET, "q", payload=BIG, n=3))
        w.finish_batch()
        gates[0].set()                                                 # big 1 and small written
        assert reached[1].wait(10)
        j = w.coll.queue("q").storage
        wait_for(lambda: j._chain[1].done.is_set(), "the small write")
        w.finish_batch()
        assert replies(w) == {} and synced == []                       # written, not yet durable
        fsync_gate.set()
        wait_for(lambda: w.on_sync_done() or w.published, "the fsync of the first two records")
        assert replies(w) == {1: [(R_OK, 0, b"")], 2: [(R_OK, 0, b"")]}
        assert synced and synced[0] >= len(BIG) + 5                    # the small record's included
        gates[1].set()
        w.wait_for_sync()
        assert replies(w) == {3: [(R_OK, 0, b"")]}
    finally:
        fsync_gate.set()             # (a failed test must not leave the fsync thread waiting)


def test_a_small_write_does_not_wait_for_file_work_or_the_write_out_before_it(tmp_path, monkeypatch):
    """An unlink (or a rewrite's fsync) that takes long, queued before a small write, and the
    write-out wait of a big write, do not hold the small write."""
    held = threading.Event()
    release = threading.Event()

    def slow(*_):
        held.set()
        assert release.wait(10)
    gate = threading.Event()

    def write(fd, data):
        gate.wait(10)
        return os.write(fd, data)
    monkeypatch.setattr(W, "_sync_file_range", slow)
    monkeypatch.setattr(W, "_write", write)
    r, wfd = os.pipe()
    writer = Writer(wfd)
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        files = writer.run(lambda: release.wait(10))                # file work, taking its time
        big = writer.submit(fd, bytearray(b"b" * SMALL_WRITE))      # its write-out waits in `slow`
        small = writer.submit(fd, bytearray(b"s"), None, big)       # queued while big is written
        gate.set()
        assert small.done.wait(10), "the small write waited"
        assert not files.done.is_set()
        assert os.path.getsize(tmp_path / "f") == SMALL_WRITE + 1
    finally:
        release.set()
        writer.close()
        os.close(fd)
        os.close(r)
        os.close(wfd)
    assert held.is_set()                                            # the write-out did happen
