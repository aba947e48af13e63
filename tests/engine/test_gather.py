"""The gather of the group commit (storage/gather.py `_gather`): the fsync after one that just
returned waits for the clients that fsync answered, for a bounded moment, so that one fdatasync
carries them and the rounds that waited, instead of the two halves alternating (issue 8, P5).
Through a fake ring the test completes (its timer fires when the test says), and the real
kernel's timer (test_uring.py checks the ring's side)."""
import errno
import os
import select

import pytest

from lanner.storage import gather as S
from lanner.storage.syncer import Syncer
from tests.engine.test_syncer import FakeUring, KernelMedium, ring_syncer


class TimerUring(FakeUring):
    """FakeUring with the ring's timer: `arm` records it, `fire` completes it (-ETIME), and a
    `disarm` goes with the next submission, whose two completions come at once (as the kernel's:
    the removal's and the timer's -ECANCELED)."""

    def __init__(self):
        super().__init__()
        self.armed = []                 # (token, seconds)
        self.disarmed = []

    def arm(self, token, seconds):
        self.armed.append((token, seconds))
        self.inflight += 1
        return None

    def disarm(self, token):
        self.disarmed.append(token)

    def submit(self, jobs):
        n, error = super().submit(jobs)
        for token in self.disarmed:
            self.pending += [(token, errno.ECANCELED), (0, 0)]
            self.inflight += 1
            os.eventfd_write(self.fd, 1)
        self.disarmed = []
        return n, error

    def fire(self):
        token, _ = self.armed[-1]
        self.pending.append((token, errno.ETIME))
        os.eventfd_write(self.fd, 1)


@pytest.fixture
def gather(monkeypatch):
    monkeypatch.setattr(S, "GATHER_MIN_S", 0.0)     # the fake's fsyncs take microseconds
    with ring_syncer(TimerUring()) as both:
        yield both


def returned(s, k, fd=10):
    """The fsync of `fd` under way returns and the owner reaps it, publishes the rounds it
    finished and ends its turn (a gather's timer is armed then, `arm_due`): those rounds."""
    k.complete(fd)
    s.poll()
    done = s.done_prefix()
    s.arm_due()
    return done


def held(s, k):
    """Two replies answered by the first fsync of a medium (fd 10), a round waiting behind it,
    whose fsync is now held for them: (medium, that round)."""
    a = KernelMedium(10)
    first = s.start([a], ["r1", "r2"])
    a.written = 2
    second = s.start([a], ["w"])
    assert returned(s, k) == [first] and len(k.fsyncs(10)) == 1 and "held" in s.state()
    return a, second


def test_the_next_fsync_waits_until_as_many_replies_joined_as_the_last_one_answered(gather):
    """Three replies leave with the first fsync while a round waits behind it: its fsync is
    held (a timer armed, bounded by the last fdatasync's duration) until three more replies
    joined, then one fdatasync carries all of them."""
    s, k = gather
    a = KernelMedium(10)
    first = s.start([a], ["r1", "r2", "r3"])
    a.written = 2
    second = s.start([a], ["w"])                # waits for the fsync under way
    assert returned(s, k) == [first]
    assert len(k.fsyncs(10)) == 1 and len(k.armed) == 1
    assert 0 < k.armed[0][1] <= S.GATHER_MAX_S
    a.written = 3
    assert s.join([a], ["r1 again", "r2 again"])
    assert len(k.fsyncs(10)) == 1                # two of three back: still held
    a.written = 4
    assert s.join([a], ["r3 again"])
    assert len(k.fsyncs(10)) == 2 and k.disarmed == [] and s.state().count("held") == 0
    assert returned(s, k) == [second] and a.synced == 4
    assert second.replies == ["w", "r1 again", "r2 again", "r3 again"]
    assert s.fsyncs == 2


def test_the_timer_sends_the_held_fsync_when_the_clients_do_not_come(gather):
    """Nobody comes back: the timer's completion (through the same eventfd) sends the fsync for
    the round that waited; the next time the gather is skipped once (clients that do not come
    back at once must not pay the wait every round)."""
    s, k = gather
    a, second = held(s, k)
    k.fire()
    assert select.select([s.fd], [], [], 0)[0] and s.ready()
    s.poll()
    assert len(k.fsyncs(10)) == 2 and s.done_prefix() == []
    a.written = 3
    third = s.start([a], ["w2"])                 # waits behind the second
    assert returned(s, k) == [second]
    assert len(k.armed) == 1 and len(k.fsyncs(10)) == 3      # no gather this time: sent at once
    assert returned(s, k) == [third]


def test_one_client_never_waits_for_itself(gather):
    """One reply left and no round waits: the next fsync starts as its round comes."""
    s, k = gather
    a = KernelMedium(10)
    first = s.start([a], ["only"])
    assert returned(s, k) == [first] and k.armed == []
    a.written = 2
    second = s.start([a], ["only again"])
    assert len(k.fsyncs(10)) == 2
    assert returned(s, k) == [second]


def test_with_no_round_waiting_the_first_client_back_waits_for_the_others(gather):
    """Two replies left with nothing behind them: the first client back does not start an
    fsync of its own (the other would wait for it and then its own), the medium waits for both."""
    s, k = gather
    a = KernelMedium(10)
    first = s.start([a], ["r1", "r2"])
    assert returned(s, k) == [first] and len(k.armed) == 1
    a.written = 2
    second = s.start([a], ["r1 again"])
    assert len(k.fsyncs(10)) == 1
    a.written = 3
    assert s.join([a], ["r2 again"])
    assert len(k.fsyncs(10)) == 2
    assert returned(s, k) == [second] and second.replies == ["r1 again", "r2 again"] and a.synced == 3


def test_a_gather_nobody_joined_leaves_the_medium_idle(gather):
    s, k = gather
    a = KernelMedium(10)
    first = s.start([a], ["r1", "r2"])
    assert returned(s, k) == [first] and len(k.armed) == 1
    k.fire()
    s.poll()
    assert len(k.fsyncs(10)) == 1 and "held" not in s.state()
    a.written = 2
    r = s.start([a], ["later"])                  # an idle medium: at once
    assert len(k.fsyncs(10)) == 2
    assert returned(s, k) == [r]


def test_a_failed_fsync_after_a_gather_fails_every_round_it_carried(gather):
    s, k = gather
    a, second = held(s, k)
    a.written = 3
    third = s.start([a], ["r1 again"])          # a round of its own, behind the held fsync
    a.written = 4
    assert s.join([a], ["r2 again"])            # joins the third: the count is reached
    assert len(k.fsyncs(10)) == 2
    k.complete(10, errno.EIO)
    s.poll()
    assert s.done_prefix() == [second, third]
    assert [(m.fd, e.errno) for m, e in second.failed] == [(10, errno.EIO)]
    assert [(m.fd, e.errno) for m, e in third.failed] == [(10, errno.EIO)]
    assert third.replies == ["r1 again", "r2 again"]


def test_an_inline_fsync_of_the_held_medium_sends_the_held_fsync_first(gather):
    """`exclusive` (a rotation's fsync) waits for the medium's fsyncs: a held one is sent and
    waited for, never skipped, and the owner's fsync runs after it."""
    s, k = gather
    a, second = held(s, k)
    order = []
    s.exclusive(a, lambda: order.append(len(k.fsyncs(10))))
    assert order == [2]                         # after the held fsync was sent (and reaped)
    assert s.done_prefix() == [second]


def test_the_real_kernels_timer_releases_a_gather(tmp_path, monkeypatch):
    """storage/uring.py's timer: the gather holds a real fdatasync until its timer's completion
    wakes the owner through the eventfd (no test clock: the kernel's)."""
    from lanner.storage.uring import open_uring
    monkeypatch.setattr(S, "GATHER_MIN_S", 0.0)
    u = open_uring()
    assert u is not None
    r, w = os.pipe()
    s = Syncer(w, uring=u)
    fd = os.open(tmp_path / "f", os.O_CREAT | os.O_WRONLY)
    try:
        a = KernelMedium(fd)
        first = s.start([a], ["r1", "r2"])
        a.written = 2
        second = s.start([a], ["w"])
        while not s.done_prefix():
            assert select.select([s.fd], [], [], 10)[0]
            s.poll()
        s.arm_due()                             # (the owner's turn ends)
        assert "held for a gather" in s.state() and second.remaining == 1
        while second.remaining:
            assert select.select([s.fd], [], [], 10)[0], "the timer never fired"
            s.poll()
        assert s.done_prefix() == [second] and a.synced == 2 and first.remaining == 0
    finally:
        s.close()
        os.close(fd)
        os.close(r)
        os.close(w)


def test_clients_that_write_other_files_release_the_gather_and_back_off(gather):
    """One queue per client (-Q 10): a round of another file sends the held fsync at once, and
    gathers that catch nobody are skipped more and more (1, 2, 4 ... rounds), so such clients
    pay the timer rarely."""
    s, k = gather
    a, b = KernelMedium(10), KernelMedium(11)
    skipped = []
    for n in range(4):
        first = s.start([a], ["r1", "r2"])
        a.written += 1
        s.start([a], ["w"])
        armed = len(k.armed)
        assert returned(s, k) == [first]
        if len(k.armed) == armed:               # skipped: the fsync went at once
            skipped.append(n)
        else:
            b.written += 1
            other = s.start([b], ["elsewhere"])  # releases the held fsync of a at once
            assert "held" not in s.state()
            assert returned(s, k, 11) == [] and other.remaining == 0
        while s.rounds:
            k.complete(10)
            s.poll()
            s.done_prefix()
        a.written += 1
    assert skipped == [1, 3]                    # a miss at 0: one skipped; a miss at 2: two
    assert s._skip == 1                         # (the second of those two still to come)


def test_rounds_that_wrote_other_files_too_are_not_gathered_for(gather):
    s, k = gather
    a, b = KernelMedium(10), KernelMedium(11)
    first = s.start([a, b], ["r1", "r2"])
    a.written = 2
    second = s.start([a], ["w"])
    k.complete(11)
    assert returned(s, k) == [first]
    assert k.armed == [] and len(k.fsyncs(10)) == 2      # the next fsync went at once
    assert returned(s, k) == [second]


def test_an_inline_fsync_never_leaves_a_gather_held_behind_it(gather):
    """The held fsync that `exclusive` sends returns with two replies again: the gather must
    not hold the medium once more (the inline fsync would run over it and drop the rounds that
    wait, whose replies would then never leave)."""
    s, k = gather
    a, second = held(s, k)
    a.written = 3
    third = s.start([a], ["r1 again"])          # behind the held fsync, and not enough to end it
    assert len(k.fsyncs(10)) == 1
    real = k.submit

    def complete_at_once(jobs):                 # the kernel returns every fsync at once
        n, e = real(jobs)
        for token, fd, *_ in jobs[:n]:
            k.complete(fd)
        return n, e
    k.submit = complete_at_once
    s.exclusive(a, lambda: None)
    assert "held" not in s.state() and a.synced == 3
    assert s.done_prefix() == [second, third]


def test_the_timer_is_armed_when_the_owner_has_written_the_replies(gather):
    """The gather holds at the reap but arms its timer only when the owner asks (`arm_due`, at
    the end of the turn that wrote the replies): its io_uring_enter is off the path from the
    fdatasync's return to the replies.  A gather released before that arms and removes nothing."""
    s, k = gather
    a = KernelMedium(10)
    first = s.start([a], ["r1", "r2"])
    a.written = 2
    second = s.start([a], ["w"])
    k.complete(10)
    s.poll()
    assert s.done_prefix() == [first] and "held for a gather" in s.state()
    assert k.armed == [] and 0 < s.timer_due <= S.GATHER_MAX_S
    s.arm_due()
    assert len(k.armed) == 1 and s.timer_due == 0
    a.written = 4
    assert s.join([a], ["r1 again", "r2 again"])         # the held fsync goes, its timer removed
    assert len(k.fsyncs(10)) == 2 and len(k.disarmed) == 0 and len(k.pending) == 2
    assert returned(s, k) == [second] and len(k.armed) == 2     # three left: a gather again
    k.fire()                                             # nobody comes: a goes idle
    s.poll()
    assert "held" not in s.state()
    k.pending.clear()
    s._skip = 0                                          # (no backoff for this test's next gather)
    b = KernelMedium(11)
    third = s.start([b], ["x1", "x2"])
    k.complete(11)
    s.poll()
    assert s.done_prefix() == [third] and "held for a gather" in s.state()
    b.written = 2
    fourth = s.start([b], ["x1 again", "x2 again"])      # back within the same turn
    assert len(k.fsyncs(11)) == 2 and s.timer_due == 0
    s.arm_due()
    assert len(k.armed) == 2 and k.disarmed == [] and k.pending == []    # none armed, none removed
    assert returned(s, k, 11) == [fourth]
