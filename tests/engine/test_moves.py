"""expire_to_queue moves between workers (server/moves.py), in one process: the source keeps
each move until the target acknowledges that its add was written, so neither a failed write
at the target nor the death of either worker loses the item."""
from __future__ import annotations

import errno

import pytest

from lanner.ipc.messages import F_PEEK, OP_GET, OP_SET, R_EMPTY, R_ITEM, R_OK
from lanner.queues.collection import QueueCollection
from lanner.queues.placement import worker_of
from lanner.server.moves import RETRY_MS
from lanner.storage.journal import journal as J
from tests.engine.test_worker_loop import harness, statuses  # noqa: F401 (a fixture)


def pair():
    return next((f"s{i}", f"d{i}") for i in range(100)
                if worker_of(f"s{i}", 2) == 0 and worker_of(f"d{i}", 2) == 1)


def moved_out(h, src: str, data: bytes = b"moved"):
    """Store `data` in `src` (worker 0), let it expire and have worker 0 alone sweep it, so its
    move is in the ring to worker 1, unread."""
    f = h.fronts[0]
    f.send(0, 1, 1, OP_SET, src.encode(), payload=data)
    h.settle()
    assert statuses(f.replies(0)) == [(1, R_OK, b"")]
    h.clock.advance(5000)
    f.send(0, 1, 2, OP_GET, src.encode(), 0, a=-1)
    h.workers[0].step(wait=0)
    assert statuses(f.replies(0)) == [(2, R_EMPTY, b"")]


def target_holds(h, dst: str, req: int) -> list:
    f = h.fronts[0]
    f.send(1, 2, req, OP_GET, dst.encode(), 0, a=-1)
    h.settle()
    return statuses(f.replies(1))


def config(src, dst):
    return f'[queues.{src}]\nexpire_to_queue = "{dst}"\nmax_age = "1s"\n'


def test_a_move_is_kept_until_the_target_acknowledges_it(harness):
    src, dst = pair()
    h = harness(workers=2, config=config(src, dst))
    moved_out(h, src)
    target = h.peers.of_worker(1)
    assert [m[:2] for m in h.workers[0].moves.unacked[target].values()] == [(dst, b"moved")]
    source = h.workers[0].coll.queue(src)
    assert source.moves_open == 1                  # open in the source's journal meanwhile
    h.settle()
    assert not h.workers[0].moves.pending()
    assert source.moves_open == 0                  # the ack confirmed it there
    assert target_holds(h, dst, 3) == [(3, R_ITEM, b"moved")]


def test_a_move_the_target_could_not_write_is_sent_again(harness, monkeypatch):
    """The target's journal write fails (disk full): its add is rolled back and its ack says
    SERVER_ERROR, so the source sends the item again later.  Before, the item was gone."""
    src, dst = pair()
    h = harness(workers=2, config=config(src, dst))
    moved_out(h, src)

    def enospc(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(J, "_write", enospc)
    h.workers[1].step(wait=0)                      # runs the move; its write fails
    monkeypatch.undo()
    h.settle()
    assert target_holds(h, dst, 3) == [(3, R_EMPTY, b"")]
    assert h.workers[0].moves.pending() == 1       # waiting for its retry
    h.clock.advance(RETRY_MS)
    h.settle()
    assert target_holds(h, dst, 4) == [(4, R_ITEM, b"moved")]
    assert not h.workers[0].moves.pending()


def test_moves_unread_by_a_target_that_died_go_again_when_it_is_back(harness):
    src, dst = pair()
    h = harness(workers=2, config=config(src, dst))
    moved_out(h, src)
    target = h.peers.of_worker(1)
    h.tell(0, {"cmd": "peer_down", "peer": target})
    h.workers[0].step(wait=0)                      # polls control
    h.mesh.discard_unread("worker", 1)             # what the supervisor does for the replacement
    assert [m[:2] for m in h.workers[0].moves.waiting[target]] == [(dst, b"moved")]
    h.tell(0, {"cmd": "peer_up", "peer": target})
    h.settle()
    assert target_holds(h, dst, 3) == [(3, R_ITEM, b"moved")]


@pytest.mark.parametrize("storage", ["journal", "cmdlog"])
def test_moves_a_dead_source_published_arrive_once(harness, storage):
    """The source dies with its move in the ring.  A journal source holds the item (its
    REMOVE_TENTATIVE, or its add) whatever the moment of its death, so the target drops the
    move and the source's replay moves it again: it arrives once.  Before, the target ran it
    too, and the item arrived twice.  A command log's replay would drop the item (an add past
    its TTL) if its re-log as held was not written yet, so that move is run: never lost."""
    src, dst = pair()
    h = harness(workers=2, config=config(src, dst) + f'storage = "{storage}"\n')
    moved_out(h, src)
    h.tell(1, {"cmd": "peer_down", "peer": h.peers.of_worker(0)})
    h.workers[1].poll_control()                    # before its loop reads the ring
    held = target_holds(h, dst, 3)
    if storage == "cmdlog":
        assert held == [(3, R_ITEM, b"moved")]
        return
    assert held == [(3, R_EMPTY, b"")]                 # main: the item, a second copy to come
    source = h.workers[0]
    source.shutdown()                              # (as a kill -9 would: the move stays open)
    source.release()
    h.workers = h.workers[1:]
    again = QueueCollection(h.config, h.clock, owns=lambda n: worker_of(n, 2) == 0)
    again.load()
    assert [i.data for i in again.queue(src).memory_items()] == [b"moved"]
    again.close()


def test_a_dead_sources_move_is_dropped_even_when_the_ring_is_read_first(harness):
    """The target's loop wakes for the dead source's ring before it read the supervisor's
    peer_down: it reads its control socket first (hear_deaths), so the move is dropped as a
    dead worker's, not run as a live one's."""
    src, dst = pair()
    h = harness(workers=2, config=config(src, dst))
    moved_out(h, src)
    h.tell(1, {"cmd": "peer_down", "peer": h.peers.of_worker(0)})
    h.workers[1].pump()                            # the ring first, as a wake-up would
    assert target_holds(h, dst, 3) == [(3, R_EMPTY, b"")]


def test_a_move_whose_add_raised_is_sent_again(harness, monkeypatch):
    """The target cannot even create the queue (its journal file cannot be opened): the ack
    says SERVER_ERROR, not a response the source would read as a request."""
    src, dst = pair()
    h = harness(workers=2, config=config(src, dst))
    moved_out(h, src)
    coll = h.workers[1].coll
    real = QueueCollection.add_forwarded

    def refuse(self, *a, **kw):             # the target's (a collection has no dict to patch)
        if self is not coll:
            return real(self, *a, **kw)
        raise OSError(errno.EMFILE, "Too many open files")
    monkeypatch.setattr(QueueCollection, "add_forwarded", refuse)
    h.workers[1].step(wait=0)
    monkeypatch.undo()
    h.settle()
    assert h.workers[0].moves.pending() == 1
    h.clock.advance(RETRY_MS)
    h.settle()
    assert target_holds(h, dst, 3) == [(3, R_ITEM, b"moved")]


def move_into_a_target_that_cannot_write(harness, monkeypatch):
    """Source and target on one worker, separate journals: an item expires in the source and
    its move's add in the target fails (disk full) and is rolled back."""
    src, dst = next((f"s{i}", f"d{i}") for i in range(100)
                    if worker_of(f"s{i}", 2) == 0 and worker_of(f"d{i}", 2) == 0)
    h = harness(workers=2, config=config(src, dst))
    f = h.fronts[0]
    f.send(0, 1, 1, OP_SET, src.encode(), payload=b"moved")
    f.send(0, 1, 2, OP_GET, dst.encode(), 0, a=-1)          # the target's journal exists
    h.settle()
    assert statuses(f.replies(0)) == [(1, R_OK, b""), (2, R_EMPTY, b"")]
    h.clock.advance(5000)
    target_fd = h.workers[0].coll.queue(dst).storage._fd
    real_write = J._write

    def write(fd, data):
        if fd == target_fd:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)
    monkeypatch.setattr(J, "_write", write)
    f.send(0, 1, 3, OP_GET, src.encode(), 0, a=-1)          # the sweep moves the item
    h.settle()
    monkeypatch.undo()
    return h, f, src, dst


def test_a_move_within_one_worker_whose_write_failed_is_made_again(harness, monkeypatch):
    """Source and target on one worker, separate journals: the source's removal is written, the
    target's add is not (disk full) and is rolled back.  The move is made again RETRY_MS later;
    before, the item was in neither queue."""
    h, f, src, dst = move_into_a_target_that_cannot_write(harness, monkeypatch)
    assert statuses(f.replies(0)) == [(3, R_EMPTY, b"")]
    assert h.workers[0].coll.queue(dst).length == 0
    h.clock.advance(RETRY_MS)
    h.settle()
    f.send(0, 1, 4, OP_GET, dst.encode(), 0, a=-1)
    h.settle()
    assert statuses(f.replies(0)) == [(4, R_ITEM, b"moved")]


def test_a_move_within_one_worker_whose_write_failed_survives_a_stop_before_its_retry(harness, monkeypatch):
    """As above, and the worker stops before the retry: the source's journal holds the move
    open (it was never acknowledged), so the next start has the item in the source, to move
    again.  Before, the source had logged a plain remove and the retry lived only in memory:
    the item was in neither queue."""
    h, f, src, dst = move_into_a_target_that_cannot_write(harness, monkeypatch)
    w = h.workers[0]
    assert statuses(f.replies(0)) == [(3, R_EMPTY, b"")]
    assert w.coll.queue(dst).length == 0 and w.moves.pending() == 1
    assert w.coll.queue(src).moves_open == 1                  # held open in the source
    w.shutdown()                                              # before the retry is due
    w.release()
    h.workers = h.workers[1:]                      # (stopped: the harness must not stop it again)
    again = QueueCollection(h.config, h.clock, owns=lambda n: worker_of(n, 2) == 0)
    again.load()
    assert [i.data for i in again.queue(src).memory_items()] == [b"moved"]   # main: []
    assert again.queue(dst).length == 0
    again.close()


def test_a_move_whose_source_record_was_rolled_back_too_is_not_made_twice(harness, monkeypatch):
    """A queue that expires into itself: the move's record and the add share one journal, and a
    failed write takes both back, so the item is at the source's head again (and moves again
    from there).  Before, the move was also made again from memory: two copies."""
    src = next(f"s{i}" for i in range(100) if worker_of(f"s{i}", 2) == 0)
    h = harness(workers=2, config=config(src, src))
    f = h.fronts[0]
    f.send(0, 1, 1, OP_SET, src.encode(), payload=b"moved")
    h.settle()
    h.clock.advance(5000)

    def enospc(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(J, "_write", enospc)
    f.send(0, 1, 2, OP_GET, src.encode(), F_PEEK, a=-1)     # the sweep moves the item
    h.settle()
    monkeypatch.undo()
    q = h.workers[0].coll.queue(src)
    assert q.length == 1 and q.moves_open == 0                # both rolled back
    h.clock.advance(RETRY_MS)
    h.settle()
    assert not h.workers[0].moves.pending()
    assert q.length == 1, [i.data for i in q.memory_items()]  # main: 2


def test_a_move_acknowledged_while_its_source_stops_is_confirmed_in_its_journal(harness):
    """The target has written the move and acknowledged it, and the source stops before its
    loop read the ack: its shutdown reads it, so the confirm is in the source's journal and the
    next start does not move the item a second time."""
    src, dst = pair()
    h = harness(workers=2, config=config(src, dst))
    moved_out(h, src)
    h.workers[1].step(wait=0)                      # the target writes it and acknowledges it
    source = h.workers[0]
    assert source.coll.queue(src).moves_open == 1
    source.shutdown()
    assert source.coll.queue(src, create=False).moves_open == 0
    h.workers = h.workers[1:]                      # (stopped: the harness must not stop it again)
    again = QueueCollection(h.config, h.clock, owns=lambda n: worker_of(n, 2) == 0)
    again.load()
    assert again.queue(src).length == 0 and again.queue(src).moves_open == 0
    again.close()


class WatchedRing:
    """A ring whose batches must each be run and released before the ring is read again."""

    def __init__(self, ring) -> None:
        self.ring = ring
        self.unreleased = False

    def __getattr__(self, name):
        return getattr(self.ring, name)

    def read_batch(self, *a):
        assert not self.unreleased, "the ring was read again while a batch of it had not run"
        out = self.ring.read_batch(*a)
        self.unreleased = bool(out)
        return out

    def release(self) -> None:
        self.unreleased = False
        self.ring.release()


def test_a_workers_batch_runs_before_its_ring_is_read_again(harness):
    """Draining every ring, a worker's batch is not preceded by a drain of the workers' rings
    (only a front's is): that drain read on in the same ring and released it, so the producer
    could overwrite the batch's records before they ran.  A restarted source's first moves
    never arrived so (tests/server/test_expire_to_queue.py, the killed source, under load)."""
    src, dst = pair()
    h = harness(workers=2, config=config(src, dst))
    moved_out(h, src)
    target = h.workers[1]
    peer = h.peers.of_worker(0)
    watched = WatchedRing(dict(target.rings)[peer])
    for pairs in (target.rings, target.worker_rings):       # (the lists drain uses, in place)
        pairs[:] = [(s, watched if s == peer else r) for s, r in pairs]
    target.step(wait=0)                                    # main: AssertionError
    h.settle()
    assert not h.workers[0].moves.pending()
    assert target_holds(h, dst, 3) == [(3, R_ITEM, b"moved")]
