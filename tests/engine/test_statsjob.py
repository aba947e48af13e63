"""A worker's part of a whole-server `stats` comes in slices (server/statsjob.py): the same
document as at once, other requests answered between the slices, nothing sent to a front that
went down meanwhile.  Plus the wakeup a replacement front relies on.  In process, over real
rings (the worker-loop harness)."""
from __future__ import annotations

import select

import msgpack
import pytest

from lanner.ipc.messages import OP_GET, OP_SET, OP_STATS, R_DATA, R_EMPTY, R_OK
from lanner.server import statsjob
from tests.engine.test_worker_loop import FakeFront, Harness, statuses

QUEUES = 2 * statsjob.SLICE + 7


def finish_jobs(h, turns: int = 50) -> int:
    """Turn worker 0's loop until its stats jobs are done; returns the turns it took."""
    wk = h.workers[0]
    for n in range(1, turns + 1):
        wk.step(wait=0)
        if not wk.stats_jobs:
            h.settle()
            return n
    raise AssertionError("the stats job never finished")


@pytest.fixture
def h(tmp_path):
    harness = Harness(tmp_path, config='[default]\nkeep_journal = false\n')
    f = harness.fronts[0]
    for i in range(QUEUES):
        f.send(0, 1, i + 1, OP_SET, b"q%04d" % i, payload=b"x")
    f.send(0, 1, QUEUES + 1, OP_GET, b"empty", 0, a=-1)
    harness.settle()
    assert statuses(f.replies()) == [(i + 1, R_OK, b"") for i in range(QUEUES)] + \
        [(QUEUES + 1, R_EMPTY, b"")]
    yield harness
    harness.close()


def test_sliced_stats_are_the_whole_document_and_others_are_served_between(h):
    f, wk = h.fronts[0], h.workers[0]
    f.send(0, 2, 1, OP_STATS)
    f.send(0, 3, 1, OP_GET, b"empty", 0, a=-1)
    wk.step(wait=0)
    # the get is answered in the first turn; the stats answer waits for its last slice
    assert statuses(f.replies()) == [(1, R_EMPTY, b"")] and len(wk.stats_jobs) == 1
    assert finish_jobs(h) >= 2                    # more turns: a slice each
    (rep,) = f.replies()
    assert rep[:3] == (2, 1, R_DATA) and not wk.stats_jobs
    assert rep[5] == wk.stats_payload(None)             # byte for byte what the one-go answer packs
    doc = msgpack.unpackb(rep[5])
    assert len(doc["queues"]) == QUEUES + 1 and doc["global"]["curr_items"] == QUEUES


def test_a_small_stats_is_answered_at_once(tmp_path):
    h = Harness(tmp_path)
    try:
        f, wk = h.fronts[0], h.workers[0]
        f.send(0, 1, 1, OP_SET, b"one", payload=b"x")
        f.send(0, 1, 2, OP_STATS)
        wk.step(wait=0)
        reps = f.replies()
        assert [r[2] for r in reps] == [R_OK, R_DATA] and not wk.stats_jobs
    finally:
        h.close()


def test_a_front_that_goes_down_mid_stats_gets_nothing(h):
    f, wk = h.fronts[0], h.workers[0]
    f.send(0, 2, 1, OP_STATS)
    wk.step(wait=0)
    assert len(wk.stats_jobs) == 1
    h.tell(0, {"cmd": "peer_down", "peer": 0})
    h.clock.advance(5000)
    h.settle()
    assert not wk.stats_jobs
    h.mesh.discard_unread("front", 0)
    h.mesh.front_rings(0)
    new = FakeFront(h.mesh, 0)
    new.send(0, 2, 1, OP_GET, b"nothing", 0, a=-1)     # the same connection and request ids
    h.settle()
    assert statuses(new.replies()) == [(1, R_EMPTY, b"")]     # no stale stats answer


def test_a_dead_fronts_ring_is_flagged_sleeping_so_the_replacement_wakes_the_worker(h):
    """Regression: peer_down resynced the ring, which clears its sleeping flag, and left it so;
    the replacement's publish then signalled nobody and an idle worker never woke."""
    wk = h.workers[0]
    h.tell(0, {"cmd": "peer_down", "peer": 0})
    h.clock.advance(5000)
    h.settle()
    wake = h.mesh.worker_wake[0].fd
    while select.select([wake], [], [], 0)[0]:          # what earlier turns left signalled
        wk.on_wake()
    h.mesh.discard_unread("front", 0)
    h.mesh.front_rings(0)
    FakeFront(h.mesh, 0).send(0, 1, 1, OP_GET, b"nothing", 0, a=-1)
    assert select.select([wake], [], [], 1.0)[0], "the replacement's request did not wake the worker"
