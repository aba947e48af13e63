"""Which rings join which processes, and how each process numbers its peers.

The one place that knows the numbering (issue 12: "peer numbering in one place"):

* front slots: the F dedicated fronts 0..F-1, then, when workers serve clients
  (`embedded`, server/local.py), worker w's own front at F+w; S = F (+ W) slots;
* a worker indexes its inbound/outbound ring lists by peer: front slots 0..S-1, then
  workers S..S+W-1 (its own worker slot and its own front slot hold None);
* a front indexes its request/response rings by worker 0..W-1 (None: its own worker);
* control messages (`peer_down`, `peer_up`) name a peer the way the receiver numbers it;
* every child has one heartbeat slot: the cleaner 0, workers 1..W, fronts W+1..W+F.

Rings: one request ring per (front, worker), one response ring per (worker, front)
and one forwarding ring per ordered pair of workers.  Each ring signals its
consumer's eventfd and, when full, its producer's (space wakeups, ring.py).  All of
it is created by the supervisor before it forks; the supervisor empties a new
process's inbound rings just before the fork (`discard_unread`), and
`worker_rings`/`front_rings` hand the new process its rings (ring.py, "Crashed peers").
"""
from __future__ import annotations

from dataclasses import dataclass

from lanner.ipc.ring import Ring
from lanner.ipc.wake import WakeFd

RING_CAPACITY = 1 << 20        # front <-> worker, each direction
FWD_RING_CAPACITY = 1 << 18    # worker -> worker (expire_to_queue moves only)

CLEANER = "cleaner"
WORKER = "worker"
FRONT = "front"


@dataclass(frozen=True, slots=True)
class Peers:
    """The numbering of W workers and F dedicated fronts (and, `embedded`, the front each
    worker runs for its own clients)."""
    workers: int
    fronts: int
    embedded: bool = False

    @property
    def slots(self) -> int:
        """Front slots: every front, dedicated or inside a worker."""
        return self.fronts + (self.workers if self.embedded else 0)

    def of_front(self, f: int) -> int:
        """A front's number in a worker's ring lists."""
        return f

    def of_embedded(self, w: int) -> int:
        """The front slot of worker `w`'s own front."""
        return self.fronts + w

    def own(self, slot: int, w: int) -> bool:
        """Whether front slot `slot` is worker `w`'s own front (no ring joins them)."""
        return self.embedded and slot == self.fronts + w

    def of_worker(self, w: int) -> int:
        """A worker's number in another worker's ring lists."""
        return self.slots + w

    def is_front(self, peer: int) -> bool:
        return peer < self.slots

    def as_seen_by(self, listener_kind: str, kind: str, index: int) -> int:
        """How a `listener_kind` process numbers the child (`kind`, `index`) in control messages."""
        if listener_kind == FRONT:
            return index                  # fronts talk only to workers, numbered 0..W-1
        return self.of_front(index) if kind == FRONT else self.of_worker(index)

    def named_by(self, listener_kind: str, peer: int) -> tuple[str, int]:
        """The child (kind, index) that a `listener_kind` process calls `peer`."""
        if listener_kind == FRONT:
            return (WORKER, peer)
        return (FRONT, peer) if self.is_front(peer) else (WORKER, peer - self.slots)

    def talk(self, kind: str) -> tuple[str, ...]:
        """The kinds of process a `kind` exchanges ring traffic with."""
        return {WORKER: (FRONT, WORKER), FRONT: (WORKER,)}.get(kind, ())

    @property
    def heartbeat_slots(self) -> int:
        return 1 + self.workers + self.fronts

    def heartbeat_slot(self, kind: str, index: int) -> int | None:
        """The child's slot, or None for a kind that does not beat (it is never judged)."""
        if kind == CLEANER:
            return 0
        if kind == WORKER:
            return 1 + index
        if kind == FRONT:
            return 1 + self.workers + index
        return None


class Mesh:
    """Every ring and wake eventfd of one server."""

    def __init__(self, peers: Peers, capacity: int = RING_CAPACITY,
                 fwd_capacity: int = FWD_RING_CAPACITY) -> None:
        W, F = peers.workers, peers.slots
        self.peers = peers
        self.worker_wake = [WakeFd.create() for _ in range(W)]
        # a worker's own front shares its worker's eventfd: one process, one wakeup
        self.front_wake = [WakeFd.create() for _ in range(peers.fronts)] + \
            (self.worker_wake if peers.embedded else [])
        own = peers.own
        self.req = [[None if own(f, w) else
                     Ring.create(capacity, wake_fd=self.worker_wake[w], space_fd=self.front_wake[f],
                                 name=f"f{f}->w{w}") for w in range(W)] for f in range(F)]
        self.resp = [[None if own(f, w) else
                      Ring.create(capacity, wake_fd=self.front_wake[f], space_fd=self.worker_wake[w],
                                  name=f"w{w}->f{f}") for f in range(F)] for w in range(W)]
        self.fwd = [[None if a == b else
                     Ring.create(fwd_capacity, wake_fd=self.worker_wake[b], space_fd=self.worker_wake[a],
                                 name=f"w{a}->w{b}") for b in range(W)] for a in range(W)]

    def inbound_of(self, kind: str, index: int) -> list[Ring]:
        """Every ring the process (`kind`, `index`) consumes."""
        p = self.peers
        if kind == WORKER:
            rings = [self.req[f][index] for f in range(p.slots)] + \
                [self.fwd[a][index] for a in range(p.workers)]
            if p.embedded:          # its own front's responses
                rings += [self.resp[w][p.of_embedded(index)] for w in range(p.workers)]
            return [r for r in rings if r is not None]
        if kind == FRONT:
            return [self.resp[w][index] for w in range(p.workers)]
        return []

    def discard_unread(self, kind: str, index: int) -> None:
        """In the supervisor, just before forking (`kind`, `index`): drop whatever its dead
        predecessor left unread.  Done here and not in the child, because only here is it
        certain that every producer has stopped sending to it (they acknowledged
        `peer_down`) and none has started again (they learn of the newborn later)."""
        for r in self.inbound_of(kind, index):
            r.resync_consumer(discard=True)

    def worker_rings(self, w: int) -> tuple[list[Ring | None], list[Ring | None]]:
        """(inbound, outbound) of worker `w`, indexed by peer number, adopted by a new
        process at the shared positions (`discard_unread` ran before the fork)."""
        F, W = self.peers.slots, self.peers.workers
        inbound = [self.req[f][w] for f in range(F)] + [self.fwd[a][w] for a in range(W)]
        outbound = [self.resp[w][f] for f in range(F)] + [self.fwd[w][b] for b in range(W)]
        for r in inbound:
            if r is not None:
                r.resync_consumer(discard=False)
        for r in outbound:
            if r is not None:
                r.resync_producer()
        return inbound, outbound

    def front_rings(self, f: int) -> tuple[list[Ring | None], list[Ring | None]]:
        """(requests, responses) of front slot `f`, indexed by worker, adopted likewise
        (a worker's own front: None for that worker)."""
        req = self.req[f]
        resp = [self.resp[w][f] for w in range(self.peers.workers)]
        for r in req:
            if r is not None:
                r.resync_producer()
        for r in resp:
            if r is not None:
                r.resync_consumer(discard=False)
        return req, resp


def duplex(capacity: int, a_wake: WakeFd, b_wake: WakeFd, name: str = "") -> tuple[Ring, Ring]:
    """The two rings joining processes A and B: (A→B, B→A).  Each ring signals
    its consumer's wake fd and, when full, its producer's (space wakeups)."""
    ab = Ring.create(capacity, wake_fd=b_wake, space_fd=a_wake, name=f"{name}>" if name else "a>b")
    ba = Ring.create(capacity, wake_fd=a_wake, space_fd=b_wake, name=f"{name}<" if name else "b>a")
    return ab, ba
