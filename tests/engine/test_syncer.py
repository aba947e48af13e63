"""fsync rounds overlap and finish in the order they started (storage/syncer.py)."""
import errno
import os
import select
import threading
import time
from contextlib import contextmanager

import pytest

from lanner.queues.item import QItem
from lanner.storage.uring import open_uring
from lanner.storage.journal.journal import Journal
from lanner.storage.syncer import Syncer


class Medium:
    """A medium whose fsync returns when the test lets it (or fails with `error`)."""

    def __init__(self, name, error=None):
        self.name = name
        self.error = error
        self.go = threading.Event()
        self.started = threading.Event()
        self.syncs = 0

    def sync(self):
        self.started.set()
        assert self.go.wait(10)
        self.syncs += 1
        if self.error is not None:
            raise OSError(self.error, os.strerror(self.error))


@pytest.fixture
def syncer():
    r, w = os.pipe()
    s = Syncer(w, threads=4)
    s.notify_r = r
    yield s
    s.close()
    os.close(r)
    os.close(w)


def wait_notified(s):
    assert select.select([s.notify_r], [], [], 10)[0], "no round finished"
    os.read(s.notify_r, 64)


def test_a_later_round_that_finishes_first_waits_for_the_earlier(syncer):
    a, b = Medium("a"), Medium("b")
    first = syncer.start([a], ["reply 1"])
    second = syncer.start([b, b], ["reply 2"])          # a medium is fsynced once per round
    assert a.started.wait(10) and b.started.wait(10)    # both fsyncs are under way at once
    b.go.set()
    wait_notified(syncer)
    assert second.remaining == 0 and syncer.done_prefix() == []     # the first is not done yet
    a.go.set()
    wait_notified(syncer)
    assert syncer.done_prefix() == [first, second]
    assert len(syncer) == 0 and b.syncs == 1


def test_a_failed_fsync_is_reported_with_its_round(syncer):
    ok, bad = Medium("ok"), Medium("bad", errno.EIO)
    ok.go.set()
    bad.go.set()
    r = syncer.start([ok, bad], [])
    wait_notified(syncer)
    assert syncer.done_prefix() == [r]
    assert [(m.name, e.errno) for m, e in r.failed] == [("bad", errno.EIO)]


def test_a_round_with_nothing_to_fsync_finishes_after_the_ones_before(syncer):
    a = Medium("a")
    first = syncer.start([a], [])
    marker = syncer.start([], ["reply after"])
    wait_notified(syncer)
    assert syncer.done_prefix() == []
    a.go.set()
    wait_notified(syncer)
    assert syncer.done_prefix() == [first, marker]


def test_one_medium_is_never_fsynced_twice_at_once(syncer):
    """Linux reports a write-back error to one fsync only: rounds of one medium take turns, and
    the rounds that waited share the next fsync."""
    a = Medium("a")
    running = []
    real = a.sync

    def sync():
        running.append(1)
        assert len(running) == 1, "two fsyncs of one medium at once"
        try:
            real()
        finally:
            running.pop()
    a.sync = sync
    rounds = [syncer.start([a], [i]) for i in range(3)]
    assert a.started.wait(10)
    a.go.set()
    done = []
    while len(done) < 3:
        wait_notified(syncer)
        done += syncer.done_prefix()
    assert done == rounds and a.syncs == 2               # the 2nd and 3rd share one fsync


def test_the_thread_whose_fsync_returned_fsyncs_the_rounds_that_waited_at_once():
    """The records of the rounds that waited are written: the thread that just fsynced the medium
    fsyncs it again itself, before other work queued meanwhile (here: b's, on the only thread)."""
    r, w = os.pipe()
    s = Syncer(w, threads=1)
    s.notify_r = r
    a, b = Medium("a"), Medium("b")
    order = []
    for m in (a, b):
        m.sync = (lambda real, name: lambda: (order.append(name), real())[1])(m.sync, m.name)
    try:
        rounds = [s.start([a], [1]), s.start([b], [2]), s.start([a], [3])]
        assert a.started.wait(10)
        b.go.set()
        a.go.set()
        assert wait_for(lambda: all(x.remaining == 0 for x in rounds))
        assert order == ["a", "a", "b"]
    finally:
        s.close()
        os.close(r)
        os.close(w)


def test_rounds_that_finish_before_the_owner_looks_wake_it_once(syncer):
    a, b = Medium("a"), Medium("b")
    first, second = syncer.start([a], [1]), syncer.start([b], [2])
    a.go.set()
    b.go.set()
    assert wait_for(lambda: second.remaining == 0 and first.remaining == 0)
    assert select.select([syncer.notify_r], [], [], 10)[0]
    assert os.read(syncer.notify_r, 64) == b"x"                # one byte for both
    assert syncer.done_prefix() == [first, second]
    c = Medium("c")
    c.go.set()
    third = syncer.start([c], [3])                          # the owner looked: the next one wakes it
    wait_notified(syncer)
    assert syncer.done_prefix() == [third]


def wait_for(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


# -- the io_uring engine (storage/uring.py), through a fake kernel the test completes ----------------

class FakeUring:
    """Takes fsyncs like storage/uring.Uring and completes them when the test says, through the
    same eventfd signal the kernel uses."""

    def __init__(self, slots=128, refuse=None):
        self.fd = os.eventfd(0, os.EFD_NONBLOCK)
        self.slots = slots
        self.refuse = refuse            # errno io_uring_enter fails the next submission with
        self.inflight = 0
        self.submitted = []             # (token, fd, datasync, after), in order
        self.completed = []
        self.pending = []               # completed, not yet reaped

    def open(self):
        return True

    def submit(self, jobs):
        if self.refuse is not None:
            e, self.refuse = self.refuse, None
            return 0, OSError(e, os.strerror(e))
        n = min(len(jobs), self.slots - self.inflight)
        self.submitted += jobs[:n]
        self.inflight += n
        return n, None

    def complete(self, fd, err=0):
        """The oldest fsync of `fd` under way returns `err`."""
        done = {t for t, _ in self.completed}
        token = next(t for t, f, *_ in self.submitted if f == fd and t not in done)
        self.completed.append((token, err))
        self.pending.append((token, err))
        os.eventfd_write(self.fd, 1)

    def ready(self):
        return bool(self.pending)

    def reap(self, wait=False):
        try:
            os.eventfd_read(self.fd)
        except BlockingIOError:
            pass
        if wait and not self.pending:                   # (close: the kernel finishes them all)
            done = {t for t, _ in self.completed}
            self.pending = [(t, 0) for t, *_ in self.submitted if t not in done]
            self.completed += self.pending
        out, self.pending = self.pending, []
        self.inflight -= len(out)
        return out

    def close(self):
        os.close(self.fd)

    def fsyncs(self, fd):
        return [j for j in self.submitted if j[1] == fd]


class KernelMedium:
    """A medium with `written` bytes of which `synced` are durable; `fd` only names it."""

    def __init__(self, fd):
        self.fd = fd
        self.written = 1
        self.synced = 0

    def sync_target(self):
        return None if self.synced >= self.written else (self.fd, self.written, True)

    def sync_done(self, token, error):
        if error is not None:
            return error
        self.synced = max(self.synced, token)
        return None


@contextmanager
def ring_syncer(fake, **kw):
    """A Syncer on the io_uring engine with `fake` for its ring: (syncer, fake)."""
    r, w = os.pipe()
    s = Syncer(w, uring=fake, **kw)
    s.notify_r = r
    try:
        yield s, fake
    finally:
        s.close()
        os.close(r)
        os.close(w)


@pytest.fixture
def uring_syncer():
    with ring_syncer(FakeUring()) as both:
        yield both


@pytest.fixture
def follow_on_syncer():
    """A uring syncer with the drained follow-on on (syncer.py: off by default)."""
    with ring_syncer(FakeUring(), follow_on=True) as both:
        yield both


def test_uring_rounds_finish_in_the_order_they_started(uring_syncer):
    s, k = uring_syncer
    a, b = KernelMedium(10), KernelMedium(11)
    first, second = s.start([a], [1]), s.start([b, b], [2])
    assert [j[1:] for j in k.submitted] == [(10, True, False), (11, True, False)]   # both now, fdatasync
    k.complete(11)
    assert select.select([s.fd], [], [], 0)[0]                          # the loop's wake-up
    s.poll()
    assert second.remaining == 0 and s.done_prefix() == []
    k.complete(10)
    s.poll()
    assert s.done_prefix() == [first, second] and a.synced == b.synced == 1
    assert not select.select([s.notify_r], [], [], 0)[0]                # the owner reaped: no byte


def rounds_behind_one_fsync(s):
    """A medium (fd 10) and three rounds of it, each after one more record: (medium, rounds...)."""
    a = KernelMedium(10)
    first = s.start([a], [1])
    a.written = 2
    second = s.start([a], [2])
    a.written = 3
    return (a, first, second, s.start([a], [3]))


def test_uring_rounds_that_waited_for_one_busy_medium_share_the_fsync_started_at_its_reap(uring_syncer):
    """By default (no follow-on) nothing more of a busy medium is submitted while its fsync is
    under way: every round that came meanwhile gets the one fsync the reap starts, which covers
    all their records (it starts after they were written)."""
    s, k = uring_syncer
    a, first, second, third = rounds_behind_one_fsync(s)
    assert len(k.fsyncs(10)) == 1
    k.complete(10)
    s.poll()
    assert s.done_prefix() == [first] and [j[3] for j in k.fsyncs(10)] == [False, False]
    k.complete(10)
    s.poll()
    assert s.done_prefix() == [second, third] and a.synced == 3


def test_uring_a_batch_joins_the_newest_round_while_it_waits_for_its_media(uring_syncer):
    """`join`: replies whose records are written go into the round that still waits for the fsync
    under way of every medium they wrote (it will get an fsync that starts after them), and leave
    with it; one fsync per medium carries them all."""
    s, k = uring_syncer
    a, b = KernelMedium(10), KernelMedium(11)
    assert not s.join([a], [0])                     # no round at all
    first = s.start([a, b], [1])
    a.written = 2
    assert not s.join([a], [2])                     # first's fsyncs are under way: not covered
    second = s.start([a], [2])
    assert not s.join([b], [3])                     # b is not second's: its fsync may not come
    a.written = 3
    assert s.join([a], [3]) and s.join([], [4])     # (a reply with nothing to fsync follows too)
    assert second.replies == [2, 3, 4] and len(s) == 2
    k.complete(10)
    k.complete(11)
    s.poll()
    assert s.done_prefix() == [first]
    assert not s.join([a], [5])                     # second's fsync is now under way
    k.complete(10)
    s.poll()
    assert s.done_prefix() == [second] and a.synced == 3 and len(k.fsyncs(10)) == 2


def test_a_batch_joins_a_waiting_round_on_the_thread_engine_too(syncer):
    a = Medium("a")
    first = syncer.start([a], [1])
    assert a.started.wait(10)
    second = syncer.start([a], [2])
    assert syncer.join([a], [3]) and second.replies == [2, 3]
    a.go.set()
    taken = []
    while len(taken) < 2:
        wait_notified(syncer)
        taken += syncer.done_prefix()
    assert taken == [first, second] and a.syncs == 2


def test_uring_one_busy_medium_gets_its_next_fsync_drained_behind_the_one_under_way(follow_on_syncer):
    """With one medium busy, the next round's fsync is submitted at once, to start when the one
    under way returns (the kernel's drain: never two at once, no trip through the loop between
    them); rounds after it wait and share the next follow-on, submitted when the first is reaped."""
    s, k = follow_on_syncer
    a, first, second, third = rounds_behind_one_fsync(s)
    a.written = 4
    fourth = s.start([a], [4])
    assert [j[3] for j in k.fsyncs(10)] == [False, True]               # first, then second's, drained
    k.complete(10)
    s.poll()
    assert s.done_prefix() == [first] and a.synced == 1
    assert [j[3] for j in k.fsyncs(10)] == [False, True, True]         # third and fourth share one
    k.complete(10)
    s.poll()
    assert s.done_prefix() == [second] and a.synced == 2
    k.complete(10)
    s.poll()
    assert s.done_prefix() == [third, fourth] and a.synced == 4 and len(k.fsyncs(10)) == 3
    assert not select.select([s.notify_r], [], [], 0)[0]


def test_uring_a_follow_on_is_drained_only_while_its_medium_is_the_only_one_busy(follow_on_syncer):
    s, k = follow_on_syncer
    a, b = KernelMedium(10), KernelMedium(11)
    first = s.start([a, b], [1])
    a.written = 2
    second = s.start([a], [2])                      # two fsyncs under way: it waits for the reap
    assert len(k.fsyncs(10)) == 1
    k.complete(10)
    k.complete(11)
    s.poll()
    assert s.done_prefix() == [first] and [j[3] for j in k.fsyncs(10)] == [False, False]
    k.complete(10)
    s.poll()
    assert s.done_prefix() == [second]


def test_uring_a_failed_fsync_fails_its_follow_on_and_the_rounds_that_waited(follow_on_syncer):
    """Linux reports a write-back error once: when the fsync under way fails, the drained one
    behind it may succeed for bytes that are gone, so its rounds fail with the first's error."""
    s, k = follow_on_syncer
    a = KernelMedium(10)
    first = s.start([a], [1])
    a.written = 2
    second = s.start([a], [2])                      # the drained follow-on
    a.written = 3
    third = s.start([a], [3])                       # waits
    k.complete(10, errno.EIO)
    s.poll()
    assert s.done_prefix() == [first, second, third]
    assert all([e.errno for _, e in r.failed] == [errno.EIO] for r in (first, second, third))
    fourth = s.start([a], [4])                      # not cleared: fails at once
    assert fourth.remaining == 0 and fourth.failed
    os.read(s.notify_r, 64)
    assert s.done_prefix() == [fourth]
    s.clear(a)                                      # (the owner rolled it back)
    a.written, a.synced = 1, 0
    fifth = s.start([a], [5])                       # the follow-on still runs: drained behind it
    assert [j[3] for j in k.fsyncs(10)] == [False, True, True]
    k.complete(10)                                  # the old follow-on: its success vouches for nothing
    s.poll()
    assert s.done_prefix() == [] and fifth.remaining == 1
    k.complete(10)
    s.poll()
    assert s.done_prefix() == [fifth] and not fifth.failed


def test_uring_a_failed_fsync_fails_every_round_of_its_medium_until_cleared(uring_syncer):
    s, k = uring_syncer
    a, b = KernelMedium(10), KernelMedium(11)
    b.written = 2
    first = s.start([a], [1])
    second = s.start([b], [2])
    a.written = 2
    third = s.start([a, b], [3])                    # waits for a (two busy: no follow-on) and b
    k.complete(11)
    k.complete(10, errno.EIO)
    s.poll()
    assert s.done_prefix() == [first, second, third]
    assert [(m.fd, e.errno) for m, e in first.failed] == [(10, errno.EIO)]
    assert [(m.fd, e.errno) for m, e in third.failed] == [(10, errno.EIO)]   # no fsync vouched for it
    fourth = s.start([a], [4])                      # not cleared: fails, no fsync
    assert len(k.fsyncs(10)) == 1 and fourth.remaining == 0 and fourth.failed
    assert select.select([s.notify_r], [], [], 0)[0]                    # finished on the owner's call: woken
    os.read(s.notify_r, 64)
    assert s.done_prefix() == [fourth]
    s.clear(a)
    fifth = s.start([a], [5])
    assert len(k.fsyncs(10)) == 2
    k.complete(10)
    s.poll()
    assert s.done_prefix() == [fifth] and not fifth.failed


def test_uring_nothing_to_fsync_finishes_the_round_at_once(uring_syncer):
    s, k = uring_syncer
    a = KernelMedium(10)
    a.synced = 1                                                        # (rotation fsynced it)
    r = s.start([a], [1])
    assert k.submitted == [] and r.remaining == 0
    assert select.select([s.notify_r], [], [], 0)[0]
    assert s.done_prefix() == [r]


def test_uring_fsyncs_beyond_the_contexts_slots_wait_for_one_to_return(uring_syncer):
    s, k = uring_syncer
    k.slots = 2
    media = [KernelMedium(fd) for fd in (10, 11, 12)]
    r = s.start(media, [1])
    assert [j[1] for j in k.submitted] == [10, 11]
    k.complete(10)
    s.poll()
    assert [j[1] for j in k.submitted] == [10, 11, 12]
    k.complete(11)
    k.complete(12)
    s.poll()
    assert s.done_prefix() == [r] and not r.failed


def test_uring_a_submission_the_kernel_refuses_fails_its_round(uring_syncer):
    s, k = uring_syncer
    k.refuse = errno.EINVAL
    a, b = KernelMedium(10), KernelMedium(11)
    r = s.start([a, b], [1])
    assert [j[1] for j in k.submitted] == [11]                          # the next one still went
    k.complete(11)
    s.poll()
    assert s.done_prefix() == [r] and [(m.fd, e.errno) for m, e in r.failed] == [(10, errno.EINVAL)]


def test_io_uring_fdatasyncs_a_journal_and_fails_a_pipe(tmp_path):
    """The real thing (Linux x86-64): a journal's written bytes become durable through an
    fdatasync the loop reaps; an fd that cannot be fsynced fails its round with the kernel's
    error."""
    r, w = os.pipe()
    s = Syncer(w, uring=open_uring())
    j = Journal(str(tmp_path), "q", Clock(), sync_policy="always")
    j.replay(Config())

    def finished():
        done = []
        while not done:
            assert select.select([s.fd], [], [], 10)[0]
            s.poll()
            done = s.done_prefix()
        return done
    try:
        j.record_add(QItem(0, 0, b"x" * 100))
        j.flush()
        assert j.durable_mark < j.written_mark
        first = s.start([j], [1])
        assert finished() == [first] and not first.failed and j.durable_mark == j.written_mark
        bad = s.start([KernelMedium(r)], [2])
        assert finished() == [bad] and [e.errno for _, e in bad.failed] == [errno.EINVAL]
    finally:
        s.close()
        j.close()
        os.close(r)
        os.close(w)


class Clock:
    def now_ms(self):
        return 1_700_000_000_000

    def monotonic(self):
        return 0.0


class Config:
    max_memory_size = 1 << 20


def test_uring_rounds_the_fsync_before_covered_finish_when_it_is_reaped_without_a_wake_up(uring_syncer):
    """Records written before the fsync for the rounds that waited was submitted are durable when
    it returns: a round that waited behind it finishes at that reap, and the owner, who is
    reaping, gets no byte on the pipe.  (Two media busy: no drained follow-on.)"""
    s, k = uring_syncer
    a, b = KernelMedium(10), KernelMedium(11)
    first = s.start([a, b], [1])
    a.written = 2
    second = s.start([a], [2])
    k.complete(10)
    a.written = 3                                   # a batch flushed before the owner reaped
    s.poll()                                        # second's fsync goes now, covering 3
    third = s.start([a], [3])                       # waits for it
    k.complete(11)
    k.complete(10)
    s.poll()
    assert s.done_prefix() == [first, second, third] and a.synced == 3 and len(k.fsyncs(10)) == 2
    assert not select.select([s.notify_r], [], [], 0)[0]


def test_uring_a_follow_on_that_succeeds_after_a_failure_leaves_the_medium_undurable(follow_on_syncer):
    """The failed fsync took the write-back error; the follow-on drained behind it then succeeds
    although the bytes may be gone: the medium must not count them durable (the owner's rollback
    cuts back to what is)."""
    s, k = follow_on_syncer
    a = KernelMedium(10)
    first = s.start([a], [1])
    a.written = 2
    second = s.start([a], [2])
    k.complete(10, errno.EIO)
    k.complete(10)                                  # both reaped at once
    s.poll()
    assert s.done_prefix() == [first, second] and second.failed and a.synced == 0


# -- the owner's inline fsyncs (rotation, rewrite) never overlap the syncer's -----------------------

def under_way(k, fd) -> bool:
    """An fsync of `fd` was submitted to the fake kernel and has not returned."""
    done = {t for t, _ in k.completed}
    return any(t not in done for t, *_ in k.fsyncs(fd))


class HookedJournal(Journal):
    """A journal whose `sync` and `_sys_fsync` a test replaces on the instance (a Journal has
    slots, no dict)."""


def written_journal(tmp_path, policy="always"):
    j = HookedJournal(str(tmp_path), "q", Clock(), sync_policy=policy)
    j.replay(Config())
    j.record_add(QItem(0, 0, b"x" * 100))
    j.flush()
    return j


def test_a_journal_rotation_fsyncs_only_after_the_group_commit_fsync_under_way(uring_syncer, tmp_path):
    s, k = uring_syncer
    j = written_journal(tmp_path)
    fd = j._fd
    first = s.start([j], [1])                       # its fdatasync is under way ...
    j.record_add(QItem(0, 0, b"y" * 100))
    j.flush()
    seen = []
    j._sys_fsync = lambda f: seen.append((f, under_way(k, f)))
    j._rotate(None, False)                          # ... when the journal rotates
    assert seen == [(fd, False)]                    # main: [(fd, True)], two at once
    assert j.rotations == 1
    assert s.done_prefix() == [first] and not first.failed
    assert select.select([s.notify_r], [], [], 0)[0]     # reaped off the loop's path: a byte wakes it
    j.close()


def test_a_failed_fsync_under_way_fails_its_round_and_stops_the_rotation(uring_syncer, tmp_path):
    """The error goes to the round that waited for the fsync (main: the rotation's own fsync
    succeeded, the file was switched, and the failure was dropped as the old file's: the round's
    replies left as durable)."""
    s, k = uring_syncer
    j = written_journal(tmp_path)
    first = s.start([j], [1])
    k.complete(j._fd, errno.EIO)                    # returned, not yet reaped
    j._sys_fsync = lambda f: None
    j._rotate(None, False)
    s.poll()
    assert s.done_prefix() == [first] and [e.errno for _, e in first.failed] == [errno.EIO]
    assert j.rotations == 0                         # an archive must be durable: none was made
    with pytest.raises(OSError):                    # not rolled back: nor can a close vouch for it
        j.close()


def test_an_inline_fsync_that_fails_fails_the_rounds_of_its_file_until_rolled_back(uring_syncer, tmp_path):
    """Linux tells one fsync of a write-back error: after the rotation's took it, the next round's
    would succeed over lost bytes, so the round fails without one, until the owner's rollback."""
    s, k = uring_syncer
    j = written_journal(tmp_path)
    fd = j._fd
    s.start([j], [1])
    k.complete(fd)
    s.poll()
    assert len(s.done_prefix()) == 1
    j.record_add(QItem(0, 0, b"y" * 100))
    j.flush()

    def eio(f):
        raise OSError(errno.EIO, "Input/output error")
    j._sys_fsync = eio
    j._rotate(None, False)                          # logged, skipped
    assert j.rotations == 0
    second = s.start([j], [2])
    assert len(k.fsyncs(fd)) == 1                   # no fsync: it could not vouch for anything
    assert s.done_prefix() == [second] and [e.errno for _, e in second.failed] == [errno.EIO]
    j.rollback(j.durable_mark)
    s.clear(j)
    j.record_add(QItem(0, 0, b"z" * 100))
    j.flush()
    third = s.start([j], [3])
    k.complete(fd)
    s.poll()
    assert s.done_prefix() == [third] and not third.failed
    j._sys_fsync = lambda f: None
    j.close()


def test_threads_a_journal_rewrite_under_always_waits_for_the_fsync_under_way(syncer, tmp_path):
    """The thread engine: the rewrite's fsync of the current file starts only once the fsync
    thread's has returned."""
    j = written_journal(tmp_path)
    running = threading.Event()
    release = threading.Event()
    overlap = []
    real = os.fsync

    def slow_sync():             # the thread engine calls medium.sync()
        running.set()
        assert release.wait(10)
        real(j._fd)
        j._synced_size = j._disk_size
    j.sync = slow_sync
    first = syncer.start([j], [1])
    assert running.wait(10)
    j.record_add(QItem(0, 0, b"y" * 100))
    j.flush()
    j._sys_fsync = lambda f: overlap.append(not release.is_set())
    threading.Timer(0.05, release.set).start()     # (the rewrite, blocked, cannot let it go)
    assert j._rewrite(_View()) is True
    assert overlap[0] is False                      # the current file's; main: True
    assert syncer.done_prefix() == [first]
    j.close()


class _View:
    def open_items(self):
        return {}

    def memory_items(self):
        return []


def partition_under_fsync(uring_syncer, tmp_path, monkeypatch):
    """A command-log partition with one add written and a round's fsync of it under way: (the
    syncer, the log, its fd, the round, [(fd, whether the ring had an fsync of it under way)
    for each inline fsync the partition runs])."""
    from lanner.storage.cmdlog import partition as P       # (the journal tests above need none of it)
    s, k = uring_syncer
    plog = P.PartitionLog(str(tmp_path / "p"), Clock(), sync_policy="always")
    plog.storage_for("q").record_add(QItem(0, 0, b"x" * 100))
    plog.flush()
    first = s.start([plog], [1])
    seen = []
    monkeypatch.setattr(P.os, "fsync", lambda f: seen.append((f, under_way(k, f))))
    return s, plog, plog._fd, first, seen


def test_a_cmdlog_segment_rotation_waits_for_the_fsync_under_way(uring_syncer, tmp_path, monkeypatch):
    s, plog, fd, first, seen = partition_under_fsync(uring_syncer, tmp_path, monkeypatch)
    plog._rotate()
    assert seen and seen[0] == (fd, False)          # main: (fd, True)
    assert s.done_prefix() == [first]
    monkeypatch.undo()
    plog.close()


def test_a_periodic_rewrite_fsyncs_the_old_file_on_the_writer_after_the_fsync_under_way(
        syncer, tmp_path, writer):
    """Under a periodic policy the archived file's fsync runs on the writer's thread (the loop
    never waits for it: issue 8's fairness); there it waits for the periodic fsync under way."""
    j = HookedJournal(str(tmp_path), "q", Clock(), sync_policy=1000)
    j.replay(Config())
    j.writer = writer
    j.record_add(QItem(0, 0, b"x" * 100))
    j.flush()
    running, release = threading.Event(), threading.Event()

    def slow_sync():             # the thread engine calls medium.sync()
        running.set()
        assert release.wait(10)
    j.sync = slow_sync
    syncer.later([j])
    assert running.wait(10)
    old = j._fd
    order = []
    j._sys_fsync = lambda f: order.append((f == old, release.is_set()))
    assert j._rewrite(_View()) is True              # at once: nothing waited on this thread
    # the writer fsyncs the old file (main) or waits for the periodic fsync (the condition's waiter)
    assert wait_for(lambda: order or getattr(getattr(syncer, "_idle", None), "_waiters", None))
    release.set()
    j._adopt_rewrite(block=True)
    assert order[0] == (True, True)                 # main: (True, False), both at once
    j.close()


def test_a_journal_closed_by_a_delete_fsyncs_only_after_the_group_commit_fsync_under_way(
        uring_syncer, tmp_path):
    """`delete` closes (and erases) the journal while a round's fdatasync of it may be under way:
    the close's fsync waits for it, and the round is still reaped."""
    s, k = uring_syncer
    j = written_journal(tmp_path)
    fd = j._fd
    first = s.start([j], [1])                       # its fdatasync is under way ...
    j.record_add(QItem(0, 0, b"y" * 100))
    seen = []
    j._sys_fsync = lambda f: seen.append((f, under_way(k, f)))
    j.close()                                       # ... when the queue is deleted
    assert seen == [(fd, False)]                    # main: [(fd, True)], two at once
    assert s.done_prefix() == [first] and not first.failed


def test_a_journal_close_after_a_failed_fsync_under_way_raises_it(uring_syncer, tmp_path):
    """The error of the fsync under way reaches the round that waited for it and the close (whose
    own fsync could succeed over the lost bytes)."""
    s, k = uring_syncer
    j = written_journal(tmp_path)
    first = s.start([j], [1])
    k.complete(j._fd, errno.EIO)                    # returned, not yet reaped
    j._sys_fsync = lambda f: None
    with pytest.raises(OSError):
        j.close()
    s.poll()
    assert s.done_prefix() == [first] and [e.errno for _, e in first.failed] == [errno.EIO]


def test_a_cmdlog_partition_close_waits_for_the_fsync_under_way(uring_syncer, tmp_path, monkeypatch):
    s, plog, fd, first, seen = partition_under_fsync(uring_syncer, tmp_path, monkeypatch)
    plog.close()
    assert seen == [(fd, False)]                    # main: [(fd, True)]
    assert s.done_prefix() == [first]


def test_stalled_gives_the_oldest_round_once_when_its_fsync_is_late(uring_syncer):
    """A disk or kernel that sits on an fsync looks like a server that stopped answering: the
    owner's heartbeat asks `stalled` and logs the round, once, and goes on waiting for it."""
    s, k = uring_syncer
    a, b = KernelMedium(10), KernelMedium(11)
    first = s.start([a], [1], now=100.0)
    s.start([b], [2], now=103.0)
    assert s.stalled(104.9, 5.0) is None
    assert s.stalled(105.0, 5.0) is first
    assert s.stalled(200.0, 5.0) is None                    # once per round
    k.complete(10)
    s.poll()
    assert s.done_prefix() == [first]
    late = s.stalled(108.0, 5.0)                            # now the oldest: the round of fd 11
    assert late is not None and late.media == [b]
    k.complete(11)
    s.poll()
    s.done_prefix()
    assert s.stalled(1000.0, 5.0) is None                   # nothing under way
