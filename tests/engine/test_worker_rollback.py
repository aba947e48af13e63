"""The worker's batch when its write or fsync fails (issue 11, defect 4), in-process: requests
go straight to `Worker.handle`, replies are captured instead of published."""
from __future__ import annotations

import errno
import gc
import logging
import os
import resource
import threading

import msgpack
import pytest

from lanner.ipc.messages import (F_OPEN, OP_DISCONNECT, OP_GET, OP_SET, OP_TGET, R_DATA, R_EMPTY, R_ITEM, R_OK,
                                 R_SERVER_ERROR, RF_CLOSE, RF_HELD)
from lanner.storage.uring import open_uring
from lanner.storage.journal import journal as J
from tests.engine.conftest import published, req
from tests.helpers import wait_for


def replies(w):
    out = {}
    for conn, status, flags, _, payload in published(w):
        out.setdefault(conn, []).append((status, flags, payload))
    return out


#: The reply of a set to queue q whose fsync failed with EIO.
Q_FSYNC_FAILED = (R_SERVER_ERROR, RF_CLOSE, b"fsync failed: Input/output error (queue 'q')")
#: Two rounds, sets 1 and 2 to q and set 3 to "other": q's fsync failed, other's did not.
Q_FAILED_OTHER_STORED = {1: [Q_FSYNC_FAILED], 2: [Q_FSYNC_FAILED], 3: [(R_OK, 0, b"")]}


def enospc(fd, data):
    raise OSError(errno.ENOSPC, "No space left on device")


def queue_datas(w, name):
    return [i.data for i in w.coll.queue(name).memory_items()]


def test_a_failed_write_fails_exactly_the_requests_it_undid(worker, monkeypatch):
    w = worker()
    w.handle(0, req(1, OP_SET, "q", payload=b"old"))
    w.handle(0, req(1, OP_SET, "other", payload=b"kept"))
    w.finish_batch()
    assert replies(w) == {1: [(R_OK, 0, b""), (R_OK, 0, b"")]}
    w.handle(0, req(2, OP_SET, "q", payload=b"new"))
    w.handle(0, req(3, OP_GET, "q", F_OPEN))
    w.handle(0, req(4, OP_GET, "q"))                         # takes the item set in this batch
    w.handle(0, req(5, OP_GET, "other"))                     # another journal, written fine
    real_write = J._write
    # only the 5-byte REMOVE_TENTATIVE of `other` fits (a held read: the front writes its reply)
    monkeypatch.setattr(J, "_write", lambda fd, data: enospc(fd, data) if len(data) != 5 else
                        real_write(fd, data))
    w.finish_batch()
    got = replies(w)
    for conn in (2, 3, 4):
        (status, flags, why), = got[conn]
        assert (status, flags) == (R_SERVER_ERROR, RF_CLOSE)
        assert why.endswith(b"failed: No space left on device (queue 'q')") and b"/" not in why
    assert got[5] == [(R_ITEM, RF_HELD, b"kept")]
    assert queue_datas(w, "q") == [b"old"] and not w.coll.queue("q").open_items()
    assert not w.sessions.get((0, 3)) or not w.sessions[(0, 3)].open_count("q")


def test_a_failed_fsync_under_always_cuts_back_and_fails_the_batch(worker, monkeypatch, tmp_path):
    w = worker(sync_journal="always", uring=None)
    w.handle(0, req(1, OP_SET, "q", payload=b"a"))
    w.finish_batch()
    w.wait_for_sync()
    assert replies(w) == {1: [(R_OK, 0, b"")]}
    size = os.path.getsize(tmp_path / "queues" / "q")

    def eio(fd):
        raise OSError(errno.EIO, "Input/output error")
    monkeypatch.setattr(J, "_fsync", eio)
    w.handle(0, req(2, OP_SET, "q", payload=b"b"))
    w.handle(0, req(3, OP_GET, "q"))
    w.finish_batch()
    assert w.published == []                                 # held for the fsync
    w.wait_for_sync()
    got = replies(w)
    assert got[2] == [(R_SERVER_ERROR, RF_CLOSE, b"fsync failed: Input/output error (queue 'q')")]
    assert got[3] == [(R_SERVER_ERROR, RF_CLOSE, b"fsync failed: Input/output error (queue 'q')")]
    assert os.path.getsize(tmp_path / "queues" / "q") == size
    assert queue_datas(w, "q") == [b"a"]
    monkeypatch.setattr(J, "_fsync", os.fsync)
    w.handle(0, req(4, OP_GET, "q"))
    w.finish_batch()
    w.wait_for_sync()
    assert replies(w) == {4: [(R_ITEM, RF_HELD, b"a")]}


def test_an_abort_that_cannot_be_written_is_retried_until_it_is(worker, monkeypatch, clock):
    w = worker()
    w.handle(0, req(1, OP_SET, "q", payload=b"a"))
    w.handle(0, req(2, OP_GET, "q", F_OPEN))
    w.finish_batch()
    assert replies(w)[2] == [(R_ITEM, 0, b"a")]
    monkeypatch.setattr(J, "_write", enospc)
    w.handle(0, req(2, OP_DISCONNECT, ""))                   # the client goes: abort its read
    w.finish_batch()
    q = w.coll.queue("q")
    assert q.length == 0 and len(q.open_items()) == 1 and w.coll.stranded == {"q": [1]}
    clock.advance(2000)
    w.run_timers()
    w.finish_batch()                                        # still full: stranded again
    assert w.coll.stranded == {"q": [1]}
    monkeypatch.setattr(J, "_write", os.write)
    clock.advance(2000)
    w.run_timers()
    w.finish_batch()
    assert w.coll.stranded == {} and queue_datas(w, "q") == [b"a"] and not q.open_items()
    assert w.shutdown() == 0


def test_shutdown_with_stranded_reads_says_so_and_exits_nonzero(worker, monkeypatch, caplog):
    w = worker()
    w.handle(0, req(1, OP_SET, "q", payload=b"a"))
    w.handle(0, req(2, OP_GET, "q", F_OPEN))
    w.finish_batch()
    monkeypatch.setattr(J, "_write", enospc)
    w.handle(0, req(2, OP_DISCONNECT, ""))
    w.finish_batch()
    assert w.shutdown() == 4
    assert "queue 'q': 1 open reads could not be returned" in caplog.text


def test_a_thrift_get_keeps_the_items_that_were_written(worker, monkeypatch, clock):
    w = worker()
    w.handle(0, req(1, OP_SET, "q", payload=b"first"))
    w.finish_batch()
    replies(w)
    # max 2 items, wait up to 1 s, plain reads: takes "first" now, then waits
    w.handle(0, req(7, OP_TGET, "q", a=1000, b=2, payload=(0).to_bytes(8, "little")))
    w.finish_batch()
    assert replies(w) == {}
    w.handle(0, req(1, OP_SET, "q", payload=b"second", n=2))
    w.drain([])                                             # (retries the woken thrift get)
    monkeypatch.setattr(J, "_write", enospc)
    w.finish_batch()
    got = replies(w)
    assert got[1][0][:2] == (R_SERVER_ERROR, RF_CLOSE)
    (status, _, payload), = got[7]
    assert status == R_DATA and msgpack.unpackb(payload) == [[b"first", 0]]
    assert queue_datas(w, "q") == []


def test_a_failed_fsync_in_the_thread_fails_its_queue_in_every_round_and_spares_others(worker, monkeypatch,
                                                                                       tmp_path):
    """Rounds overlap (storage/syncer.py): while q's fsync is under way a second round starts for
    `other` and q.  q's fsync fails: both of q's sets are undone and answered SERVER_ERROR (a later
    fsync of q must not vouch for bytes the failed one lost); `other`'s set is kept."""
    w = worker(sync_journal="always", uring=None)
    q_path = str(tmp_path / "queues" / "q")
    gate, calls = threading.Event(), []
    real = os.fsync

    def fsync(fd):
        if os.path.samefile(f"/proc/self/fd/{fd}", q_path):
            calls.append(fd)
            if len(calls) == 1:
                assert gate.wait(10)
                raise OSError(errno.EIO, "Input/output error")
        real(fd)
    monkeypatch.setattr(J, "_fsync", fsync)
    w.handle(0, req(1, OP_SET, "q", payload=b"a"))
    w.finish_batch()                                          # round 1: q, held at the gate
    w.handle(0, req(2, OP_SET, "q", payload=b"b"))
    w.handle(0, req(3, OP_SET, "other", payload=b"c"))
    w.finish_batch()                                          # round 2 starts meanwhile
    assert len(w.syncer) == 2 and w.published == []
    gate.set()
    w.wait_for_sync()
    assert replies(w) == Q_FAILED_OTHER_STORED
    assert len(calls) == 1                                    # no fsync of q vouched for "b"
    assert queue_datas(w, "q") == [] and queue_datas(w, "other") == [b"c"]
    assert os.path.getsize(q_path) == 0
    w.handle(0, req(4, OP_SET, "q", payload=b"d"))            # rolled back: q is fsynced again
    w.finish_batch()
    w.wait_for_sync()
    assert replies(w) == {4: [(R_OK, 0, b"")]} and len(calls) == 2


class FailingUring:
    """io_uring (storage/uring.py), except that the first fdatasync of `path` fails with EIO when
    the test says (`fail`), and one drained behind it (IOSQE_IO_DRAIN) waits for that and then
    succeeds; the others go to the kernel."""

    def __init__(self, path):
        self.real = open_uring()
        self.fd = self.real.fd
        self.path = path
        self.held = None                # (token, errno) submitted, not yet completed
        self.behind = []                # drained behind it: (token, 0)
        self.done = []
        self.calls = 0                  # fsyncs of `path`

    def open(self):
        return self.real.open()

    @property
    def inflight(self):
        return self.real.inflight + (self.held is not None) + len(self.behind) + len(self.done)

    def submit(self, jobs):
        rest = []
        for token, fd, datasync, after in jobs:
            if os.path.samefile(f"/proc/self/fd/{fd}", self.path):
                assert self.held is None or after, "two fsyncs of one file at once"
                assert datasync
                self.calls += 1
                if self.calls == 1:
                    self.held = (token, errno.EIO)
                    continue
                if self.held is not None:
                    self.behind.append((token, 0))
                    continue
            rest.append((token, fd, datasync, after))
        done, error = self.real.submit(rest)
        assert done == len(rest) and error is None
        return len(jobs), None

    def fail(self):
        self.done += [self.held] + self.behind
        self.held, self.behind = None, []
        os.eventfd_write(self.fd, 1)

    def ready(self):
        return bool(self.done) or self.real.ready()

    def reap(self, wait=False):
        if wait and not self.done and self.held is not None and not self.real.inflight:
            self.fail()                 # (a test that failed holding it: the teardown's close)
        out, self.done = self.done, []
        return out + self.real.reap(wait and not out)

    def close(self):
        self.real.close()


def failing_uring_worker(worker, tmp_path, follow_on=False):
    """A worker under sync "always" whose io_uring fails q's fdatasyncs on `fail()`: (worker,
    that uring, q's journal path).  `follow_on`: the syncer's drained follow-on (syncer.py)."""
    q_path = str(tmp_path / "queues" / "q")
    made = []
    w = worker(sync_journal="always", uring=lambda: made.append(FailingUring(q_path)) or made[0])
    w.syncer.follow_on = follow_on
    return w, made[0], q_path


@pytest.mark.parametrize("follow_on", [False, True])
def test_a_failed_io_uring_fsync_fails_its_queue_in_every_round_and_spares_others(worker, tmp_path, follow_on):
    """The io_uring engine (the default): as above, the failed fdatasync of q fails both of q's
    sets, the second although (with the follow-on) the fdatasync drained behind the first, for
    round 2, succeeds; `other` keeps its set."""
    w, k, q_path = failing_uring_worker(worker, tmp_path, follow_on)
    w.handle(0, req(1, OP_SET, "q", payload=b"a"))
    w.finish_batch()                                          # round 1: q, held
    w.handle(0, req(2, OP_SET, "q", payload=b"b"))
    w.handle(0, req(3, OP_SET, "other", payload=b"c"))
    w.finish_batch()                                          # round 2 starts meanwhile
    assert len(w.syncer) == 2 and w.published == [] and k.calls == 1 + follow_on
    assert len(k.behind) == follow_on
    k.fail()                                                  # (q's second fsync, behind, succeeds)
    w.wait_for_sync()
    assert replies(w) == Q_FAILED_OTHER_STORED
    assert queue_datas(w, "q") == [] and queue_datas(w, "other") == [b"c"]   # its success vouched
    assert os.path.getsize(q_path) == 0                                      # for nothing
    w.handle(0, req(4, OP_SET, "q", payload=b"d"))            # rolled back: q is fsynced again
    w.finish_batch()
    w.wait_for_sync()
    assert replies(w) == {4: [(R_OK, 0, b"")]} and k.calls == 2 + follow_on
    w.syncer.close()


@pytest.mark.parametrize("follow_on", [False, True])
def test_rounds_finished_together_after_a_failed_fsync_all_reply_errors(worker, tmp_path, follow_on):
    """q's fdatasync fails and the round behind it finishes in the same reap: the rollback for the
    first undoes the second's set too, and its reply must say so although that round has already
    left the syncer (it used to be published as STORED for an item no longer there)."""
    w, k, q_path = failing_uring_worker(worker, tmp_path, follow_on)
    w.handle(0, req(1, OP_SET, "q", payload=b"a"))
    w.finish_batch()                                          # round 1: q, held
    w.handle(0, req(2, OP_SET, "q", payload=b"b"))
    w.finish_batch()                                          # round 2: q, waits (or drained behind)
    assert len(w.syncer) == 2 and len(k.behind) == follow_on
    k.fail()                                                  # both come back in one reap
    w.wait_for_sync()
    assert replies(w) == {1: [Q_FSYNC_FAILED], 2: [Q_FSYNC_FAILED]}
    assert queue_datas(w, "q") == [] and os.path.getsize(q_path) == 0
    w.syncer.close()


def test_a_failed_fsync_fails_the_batches_that_joined_the_round_behind_it(worker, tmp_path):
    """Batches of several turns joined the round waiting behind q's failing fdatasync
    (Syncer.join): the rollback undoes all of them and every one of their replies is an error."""
    w, k, q_path = failing_uring_worker(worker, tmp_path)
    w.handle(0, req(1, OP_SET, "q", payload=b"a"))
    w.finish_batch()                                          # round 1: q, held (it will fail)
    for n, data in ((2, b"b"), (3, b"c")):
        w.handle(0, req(n, OP_SET, "q", payload=data))
        w.finish_batch()                                      # round 2, then 3 joins it
    assert len(w.syncer) == 2 and k.calls == 1
    k.fail()
    w.wait_for_sync()
    assert replies(w) == {n: [Q_FSYNC_FAILED] for n in (1, 2, 3)}
    assert queue_datas(w, "q") == [] and os.path.getsize(q_path) == 0
    w.syncer.close()


def test_a_rolled_back_add_read_back_by_read_behind_leaves_no_copy(worker, monkeypatch):
    """Read-behind caught up with the writer reads a record of this very batch back from the file
    (the journal writes its buffer to do so) as a new object; the add's fsync then fails.  The
    set is answered SERVER_ERROR, and that copy must go with the rollback: before, `revert` only
    looked for the original object, so the copy stayed and a later get returned it."""
    w = worker(sync_journal="always", uring=None, max_memory_size=1)
    for n, data in enumerate((b"a", b"b"), 1):
        w.handle(0, req(1, OP_SET, "q", payload=data, n=n))
    w.handle(0, req(1, OP_GET, "q", n=3))              # takes a; read-behind reads b in
    w.finish_batch()
    w.wait_for_sync()
    assert replies(w) == {1: [(R_OK, 0, b""), (R_OK, 0, b""), (R_ITEM, RF_HELD, b"a")]}
    q = w.coll.queue("q")
    assert q.storage.in_read_behind and queue_datas(w, "q") == [b"b"]

    def eio(fd):
        raise OSError(errno.EIO, "Input/output error")
    monkeypatch.setattr(J, "_fsync", eio)
    w.handle(0, req(2, OP_SET, "q", payload=b"x"))     # read-behind: recorded, not in memory
    w.handle(0, req(3, OP_GET, "q"))                   # takes b; the refill reads x back
    w.finish_batch()
    w.wait_for_sync()
    got = replies(w)
    assert got[2][0][0] == R_SERVER_ERROR and got[3][0][0] == R_SERVER_ERROR
    monkeypatch.setattr(J, "_fsync", os.fsync)
    assert (q.length, q.size_bytes) == (1, 1)
    w.handle(0, req(4, OP_SET, "q", payload=b"y"))
    for n in (2, 3, 4):
        w.handle(0, req(4, OP_GET, "q", n=n))
    w.finish_batch()
    w.wait_for_sync()
    # before: x (refused) came back instead of y, and y was never served
    assert replies(w) == {4: [(R_OK, 0, b""), (R_ITEM, RF_HELD, b"b"), (R_ITEM, RF_HELD, b"y"),
                              (R_EMPTY, 0, b"")]}
    assert queue_datas(w, "q") == [] and q.length == 0


def test_a_rolled_back_add_read_back_as_read_behind_ended_leaves_no_copy(worker, monkeypatch):
    """As above, but the refill that read the record back also caught up with the writer and
    left read-behind, so the journal must remember how far it had read."""
    w = worker(sync_journal="always", uring=None, max_memory_size=4)
    w.handle(0, req(1, OP_SET, "q", payload=b"aaaa"))
    w.handle(0, req(1, OP_SET, "q", payload=b"b", n=2))      # read-behind: b stays on disk
    w.finish_batch()
    w.wait_for_sync()
    q = w.coll.queue("q")
    assert q.storage.in_read_behind and queue_datas(w, "q") == [b"aaaa"]

    def eio(fd):
        raise OSError(errno.EIO, "Input/output error")
    monkeypatch.setattr(J, "_fsync", eio)
    w.handle(0, req(2, OP_SET, "q", payload=b"x"))
    w.handle(0, req(3, OP_GET, "q"))        # takes aaaa; the refill reads b and x, and ends
    assert not q.storage.in_read_behind and queue_datas(w, "q") == [b"b", b"x"]
    w.finish_batch()
    w.wait_for_sync()
    got = replies(w)
    assert got[2][0][0] == R_SERVER_ERROR and got[3][0][0] == R_SERVER_ERROR
    monkeypatch.setattr(J, "_fsync", os.fsync)
    for n in (1, 2, 3):
        w.handle(0, req(4, OP_GET, "q", n=n))
    w.finish_batch()
    w.wait_for_sync()
    assert replies(w) == {4: [(R_ITEM, RF_HELD, b"aaaa"), (R_ITEM, RF_HELD, b"b"), (R_EMPTY, 0, b"")]}
    assert queue_datas(w, "q") == [] and q.length == 0


def test_a_master_whose_fsync_fails_takes_the_fanout_copies_with_it(worker, monkeypatch):
    """Under sync "always" the child's fsync succeeds and the master's fails: the set is answered
    SERVER_ERROR, so the child's copy (already durable) goes too, with its record.  Before, the
    child kept it and served it."""
    w = worker(sync_journal="always", uring=None)
    w.handle(0, req(1, OP_GET, "m+c"))                       # registers the child
    w.handle(0, req(1, OP_SET, "m", payload=b"a", n=2))
    w.finish_batch()
    w.wait_for_sync()
    replies(w)
    master_fd = w.coll.queue("m").storage._fd
    child = w.coll.queue("m+c")
    size = child.storage.flushed_size

    def fsync(fd):
        if fd == master_fd:
            raise OSError(errno.EIO, "Input/output error")
        os.fsync(fd)
    monkeypatch.setattr(J, "_fsync", fsync)
    w.handle(0, req(2, OP_SET, "m", payload=b"x"))
    w.finish_batch()
    w.wait_for_sync()
    assert replies(w)[2][0][0] == R_SERVER_ERROR
    monkeypatch.setattr(J, "_fsync", os.fsync)
    assert queue_datas(w, "m+c") == [b"a"] and child.length == 1
    assert child.storage.flushed_size == size                # its record is gone too
    assert w.coll.stats()["total_items"] == 2                # a and its copy


def test_a_child_whose_write_fails_loses_only_its_copy(worker, monkeypatch):
    """The other way round the reply is the master's: STORED, and the master holds the item; the
    child that could not write its copy does not have it (and tells nobody)."""
    w = worker()
    w.handle(0, req(1, OP_GET, "m+c"))
    w.finish_batch()
    replies(w)
    child_fd = w.coll.queue("m+c").storage._fd
    real_write = J._write
    monkeypatch.setattr(J, "_write", lambda fd, data: enospc(fd, data) if fd == child_fd else
                        real_write(fd, data))
    w.handle(0, req(2, OP_SET, "m", payload=b"x"))
    w.finish_batch()
    monkeypatch.setattr(J, "_write", real_write)
    assert replies(w) == {2: [(R_OK, 0, b"")]}
    assert queue_datas(w, "m") == [b"x"] and queue_datas(w, "m+c") == []
    assert w.coll.stats()["total_items"] == 1


def test_waiting_for_the_fsync_works_with_descriptors_past_1024(worker):
    """A worker with a thousand connections has descriptors past select's FD_SETSIZE; its
    shutdown wait (wait_for_sync) must still work (select raised ValueError there)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:         # raising the soft limit up to the hard one needs no privilege
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    gc.collect()            # an earlier test's garbage closed later would free a low descriptor
    filler = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        w = worker(sync_journal="always", uring=None)
        assert w.sync_done_r > 1024
        w.handle(0, req(1, OP_SET, "q", payload=b"a"))
        w.finish_batch()
        w.wait_for_sync()
        assert replies(w) == {1: [(R_OK, 0, b"")]}
    finally:
        for fd in filler:
            os.close(fd)


def test_the_heartbeat_takes_an_fsync_that_returned_without_waking_the_loop(worker, clock):
    """The kernel may keep a completion on its overflow list and signal no eventfd (uring.py
    `_overflowed`); the heartbeat (commit.py `check_sync`) looks, and the replies leave then
    instead of never: before, a closed-loop client's set under sync "always" stalled for good."""
    w = worker(sync_journal="always")
    w.handle(0, req(1, OP_SET, "q", payload=b"a"))
    w.finish_batch()                                          # q's fdatasync, in the kernel
    assert wait_for(w.syncer.ready)                           # returned; nothing woke this loop
    assert w.published == []
    w.check_sync(clock.monotonic())
    assert replies(w) == {1: [(R_OK, 0, b"")]}


def test_an_fsync_under_way_too_long_is_logged_once_with_its_queue(worker, tmp_path, clock, caplog):
    """The heartbeat's check (commit.py `check_sync`): the replies keep waiting for the
    fdatasync, and the log says which queue's file and for how long."""
    w, k, q_path = failing_uring_worker(worker, tmp_path)
    w.handle(0, req(1, OP_SET, "q", payload=b"a"))
    w.finish_batch()                                          # q's fdatasync, held by the ring
    clock.advance(4_900)
    with caplog.at_level(logging.WARNING, logger="lanner.server.commit"):
        w.check_sync(clock.monotonic())
        assert caplog.records == []
        clock.advance(200)
        w.check_sync(clock.monotonic())
        w.check_sync(clock.monotonic())
    assert [r.getMessage() for r in caplog.records] == [
        "worker 0: fsync of q under way for 5.1 s, 1 replies wait for it (the disk or the kernel has not "
        "completed it); 1 rounds, the oldest missing 1; in flight ['q'], to submit 0, busy (rounds waiting) "
        "q:0, ring in flight 1"]
    assert w.published == []                                  # still held: it never leaves early
    k.fail()
    w.wait_for_sync()
