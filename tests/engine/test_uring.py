"""io_uring fsyncs against the real kernel (storage/uring.py): completions the kernel could not put
in the completion ring wait on its overflow list, and `reap` must still take every one."""
import ctypes
import errno
import os
import select

import pytest

from lanner.storage import uring as U
from tests.helpers import wait_for


@pytest.fixture
def ring():
    u = U.open_uring()
    assert u is not None and u.open(), "this machine's kernel has io_uring (CI's too)"
    yield u
    u.close()


def overflow(ring, fd) -> int:
    """Fill the completion ring past its size with returned fdatasyncs of `fd`, none reaped (the
    cap on fsyncs under way would stop the filling, so this takes them off its count by hand,
    then puts them all back): how many, the kernel holding the last 3 on its overflow list."""
    size = ring._cq_mask + 1                   # the completion ring's entries
    want = size + 3
    sent = 0
    while sent < want:
        n = min(U.EVENTS - ring.inflight, want - sent)
        assert ring.submit([(sent + i, fd, True, False) for i in range(n)]) == (n, None)
        sent += n
        # every one returned: those past the ring's size all on the overflow list (the flag
        # alone is up from the first of them, while the others may still be under way)
        assert wait_for(lambda: in_ring(ring) == min(sent, size) and
                        on_overflow_list(ring) == max(0, sent - size), timeout=30)
        ring.inflight -= n
    assert in_ring(ring) == size and overflowed(ring)
    ring.inflight = want
    return want


def test_completions_on_the_kernels_overflow_list_are_reaped(ring, tmp_path):
    """More fdatasyncs return than the completion ring holds: the kernel keeps the rest on its
    overflow list, with no room and perhaps no eventfd signal, until a GETEVENTS enter.  `ready`
    sees them and `reap` takes all.  Before, `reap` read the ring alone and left them there for
    ever (the sync "always" stall, where the kernel did this with the ring all but empty)."""
    fd = os.open(tmp_path / "f", os.O_CREAT | os.O_WRONLY)
    try:
        want = overflow(ring, fd)
        got = ring.reap()
        assert sorted(t for t, _ in got) == list(range(want)) and {e for _, e in got} == {0}
        assert ring.inflight == 0 and not ring.ready()
    finally:
        ring.inflight = 0               # every one has returned: `close` must not wait for any
        os.close(fd)


def test_a_submission_refused_busy_while_completions_overflow_goes_in_after_they_move(ring, tmp_path):
    """Kernels before 5.19 refuse submissions (EBUSY) while completions wait on the overflow
    list; this one does not, so its enter is made to refuse once.  The fsync goes in after the
    completions moved into the ring, instead of failing its round (a durable set's error)."""
    fd = os.open(tmp_path / "f", os.O_CREAT | os.O_WRONLY)
    try:
        want = overflow(ring, fd)               # the ring full, 3 on the overflow list
        got = take(ring, 64)                    # room for them, as at a worker (64 under way at most)
        real = ring._syscall
        refused = []

        def busy_once(nr, *args):
            if nr == U._ENTER and args[1] and not refused:      # the first enter that submits
                refused.append(args)
                ctypes.set_errno(errno.EBUSY)
                return -1
            return real(nr, *args)
        ring._syscall = busy_once
        ring.inflight = 0                       # (the cap, by hand again)
        assert ring.submit([(1000, fd, True, False)]) == (1, None) and refused
        ring.inflight = want - 64 + 1
        while ring.inflight:
            assert wait_for(ring.ready, timeout=30)
            got += ring.reap()
        assert sorted(t for t, _ in got) == list(range(want)) + [1000]
    finally:
        ring.inflight = 0
        os.close(fd)


def take(u, n) -> list:
    """Read `n` completions from the ring the way `reap` does, without entering the kernel."""
    head = U._U32.unpack_from(u._cq, u._cq_head)[0]
    out = []
    for _ in range(n):
        token, res, _ = U._CQE.unpack_from(u._cq, u._cqes + (head & u._cq_mask) * U._CQE.size)
        out.append((token, res))
        head = (head + 1) & 0xFFFFFFFF
    U._U32.pack_into(u._cq, u._cq_head, head)
    return out


def in_ring(u) -> int:
    head = U._U32.unpack_from(u._cq, u._cq_head)[0]
    tail = U._U32.unpack_from(u._cq, u._cq_tail)[0]
    return (tail - head) & 0xFFFFFFFF


def on_overflow_list(u) -> int:
    """How many completions the kernel holds on its overflow list, from the ring's fdinfo
    (its `CqOverflowList:` section, one `user_data=` line each)."""
    with open(f"/proc/self/fdinfo/{u._ring_fd}") as f:
        text = f.read()
    assert "CqOverflowList:" in text, text
    listed = text.split("CqOverflowList:", 1)[1]
    return sum(1 for line in listed.splitlines() if line.strip().startswith("user_data="))


def overflowed(u) -> bool:
    """The kernel's own flag (IORING_SQ_CQ_OVERFLOW), read here so the test does not trust the
    code it checks."""
    return bool(U._U32.unpack_from(u._sq, u._sq_flags)[0] & 2)


def test_a_timer_completes_through_the_eventfd_and_a_disarm_goes_with_the_next_submission(ring, tmp_path):
    """The gather's timer (syncer.py): its completion (-ETIME) comes like an fsync's, eventfd
    and all; one disarmed before it fires is removed in the enter of the next fsync, no syscall
    of its own, and both of its completions come (the timer's -ECANCELED, the removal's)."""
    assert ring.arm(7, 0.0005) is None
    assert select.select([ring.fd], [], [], 10)[0]
    assert ring.reap() == [(7, errno.ETIME)] and ring.inflight == 0
    assert ring.arm(8, 30.0) is None
    ring.disarm(8)
    fd = os.open(tmp_path / "f", os.O_CREAT | os.O_WRONLY)
    try:
        assert ring.submit([(9, fd, True, False)]) == (1, None)
        got = []
        while ring.inflight:
            assert wait_for(ring.ready, timeout=30)
            got += ring.reap()
        assert sorted(got) == [(0, 0), (8, errno.ECANCELED), (9, 0)]
    finally:
        os.close(fd)


def test_a_disarm_can_go_with_the_next_timer(ring):
    """A disarm with no fsync after it rides the next `arm`'s enter, and is removed properly."""
    assert ring.arm(5, 30.0) is None
    ring.disarm(5)
    assert ring.arm(6, 0.0005) is None
    got = []
    while ring.inflight:
        assert select.select([ring.fd], [], [], 10)[0] or ring.ready()
        got += ring.reap()
    assert sorted(got) == [(0, 0), (5, errno.ECANCELED), (6, errno.ETIME)]
