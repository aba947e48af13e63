"""io_uring fsyncs against the real kernel (storage/uring.py): completions the kernel could not put
in the completion ring wait on its overflow list, and `reap` must still take every one."""
import os

import pytest

from lanner.storage import uring as U
from tests.helpers import wait_for


@pytest.fixture
def ring():
    u = U.open_uring()
    assert u is not None and u.open(), "this machine's kernel has io_uring (CI's too)"
    yield u
    u.close()


def test_completions_on_the_kernels_overflow_list_are_reaped(ring, tmp_path):
    """More fdatasyncs return than the completion ring holds (U.EVENTS under way at a time, not
    reaped in between): the kernel keeps the rest on its overflow list, with no room and perhaps
    no eventfd signal, until a GETEVENTS enter.  `ready` sees them and `reap` takes all.
    Before, `reap` read the ring alone and left them there for ever (the sync "always" stall)."""
    fd = os.open(tmp_path / "f", os.O_CREAT | os.O_WRONLY)
    try:
        size = ring._cq_mask + 1                   # the completion ring's entries
        want = size + 3
        sent = 0
        while sent < want:
            n = min(U.EVENTS - ring.inflight, want - sent)
            assert ring.submit([(sent + i, fd, True, False) for i in range(n)]) == (n, None)
            sent += n
            # all returned, into the ring or onto the overflow list; the cap on fsyncs under
            # way would stop the filling, so the test takes them off its count by hand
            assert wait_for(lambda: in_ring(ring) == min(sent, size) and
                            (sent <= size or overflowed(ring)), timeout=30)
            ring.inflight -= n
        assert in_ring(ring) == size and overflowed(ring)
        ring.inflight = want
        got = ring.reap()
        assert sorted(t for t, _ in got) == list(range(want)) and {e for _, e in got} == {0}
        assert ring.inflight == 0 and not ring.ready()
    finally:
        ring.inflight = 0               # every one has returned: `close` must not wait for any
        os.close(fd)


def in_ring(u) -> int:
    head = U._U32.unpack_from(u._cq, u._cq_head)[0]
    tail = U._U32.unpack_from(u._cq, u._cq_tail)[0]
    return (tail - head) & 0xFFFFFFFF


def overflowed(u) -> bool:
    """The kernel's own flag (IORING_SQ_CQ_OVERFLOW), read here so the test does not trust the
    code it checks."""
    return bool(U._U32.unpack_from(u._sq, u._sq_flags)[0] & 2)
