"""expire_to_queue moves: held open in the source's journal until the target's worker has them.

The source queue's expiry sweep (queue.py) logs an expired item as an open read of its own: a
REMOVE_TENTATIVE under an xid the queue reserves (never a client's, and not counted in any
client-visible stat).  A move into another worker's queue leaves as a message to that worker
(OP_FORWARD_ADD); the target acknowledges it (an ack on the worker→worker ring, sent with the
target's batch replies: after the add's record was written, and fsynced under sync "always").
A move into a queue of the same worker is added at once and acknowledged the same way, to
itself (worker.py `move_here`: its ack is a reply of the batch, taken back by `publish`), so a
target whose own journal could not take the add leaves the move open in the source exactly as
a peer's would.  Only on the ack does the source log the move's CONFIRM_REMOVE
(`QueueCollection.confirm_move`).  Until then this process keeps every move, in order, per
target: a target that died gets the unacknowledged ones again when it is back, in their order,
ahead of the moves that waited for it; a target whose write failed (disk full) answers
SERVER_ERROR and the move is sent again after RETRY_MS.

The journal is what makes a move survive the SOURCE: killed (kill -9) or stopped (a graceful
stop leaves its unconfirmed moves open, and logs how many) while a move is unacknowledged
(target slow, its ring full, target down, a retry due), the item is still an open read in the
source's journal, so replay rolls it back into the source queue like any open read; already
expired, it is moved again by the sweep the worker runs once it is up.  Checkpoints, packs and
rewrites carry these open reads like a client's (queue.open_items).  So the moves a dead source
left in a target's ring are dropped by the target (peers.py peer_down; it reads the
supervisor's news before it runs a worker's messages, `hear_deaths`), as are those left at a
stop, where the source's journal is sure to hold the item (`journal_holds`: not a command
log's, whose replay drops an expired add that was not yet re-logged as held); the others are
run, and may arrive twice.

At least once, not exactly once: an item reaches its target twice when a crash falls between
the target's write and the source's confirm (a target killed before its ack left, a source
killed before it wrote the confirm), or when the source's open record could not be written
(the item goes back to the source's head, and the move already left).  Losing it is the one
thing not allowed.  What this does not cover: a source queue whose storage keeps nothing
(keep_journal = false): its moves exist only here.
"""
from __future__ import annotations

import logging

from lanner.ipc.messages import (FWD_ACK_CONN, OP_FORWARD_ADD, R_OK, R_SERVER_ERROR, RESP, pack_req, send,
                                 unpack_req)
from lanner.queues.placement import worker_of
from lanner.storage.journal.journal import Journal

log = logging.getLogger("lanner.server.worker")

#: How long a move the target could not write waits before it is sent again.
RETRY_MS = 1000

ACK_HEAD = FWD_ACK_CONN.to_bytes(4, "little")     # how an ack starts (a request never does)

#: A move: (target queue name, data, source queue or None, the source's move xid or 0).
#: The source's journal holds the item until `confirm_move`, unless the source keeps no
#: journal (`medium` None): then it exists only here.
Move = tuple


class Moves:
    """The moves of one source worker, per target peer: sent and not yet acknowledged (in send
    order), and waiting (for the peer to come back, or for a retry)."""

    __slots__ = ("seq", "unacked", "waiting", "retry_ms")

    def __init__(self) -> None:
        self.seq = 0
        self.unacked: dict[int, dict[int, Move]] = {}   # peer -> seq -> move
        self.waiting: dict[int, list[Move]] = {}        # peer -> moves to send
        self.retry_ms = 0        # when failed moves go again (0: none failed)

    def sent(self, peer: int, move: Move) -> int:
        """Note a move handed to `peer`'s ring; returns the sequence number its ack carries."""
        self.seq = seq = (self.seq + 1) & 0xFFFFFFFF
        self.unacked.setdefault(peer, {})[seq] = move
        return seq

    def wait(self, peer: int, move: Move) -> None:
        self.waiting.setdefault(peer, []).append(move)

    def acked(self, peer: int, ack, now_ms: int) -> Move | None:
        """An ack record from `peer`: returns the move it completes (for its source to confirm),
        or None (unknown, or SERVER_ERROR: the move waits for a retry)."""
        _, seq, status = RESP.unpack_from(ack, 0)[:3]
        move = self.unacked.get(peer, {}).pop(seq, None)
        if move is not None and status == R_SERVER_ERROR:
            if still_open(move):
                self.failed(peer, move, now_ms)
            return None
        return move

    def failed(self, peer: int, move: Move, now_ms: int) -> None:
        """A move whose add was rolled back (by `peer`, or here: `peer` is then this worker's
        own number) goes again RETRY_MS from now."""
        self.wait(peer, move)
        if not self.retry_ms:
            self.retry_ms = now_ms + RETRY_MS

    def peer_down(self, peer: int) -> None:
        """`peer` died: what it had not acknowledged goes again, first, when it is back."""
        lost = self.unacked.pop(peer, None)
        if lost:
            self.waiting[peer] = list(lost.values()) + self.waiting.get(peer, [])

    def take(self, peer: int) -> list[Move]:
        """The moves waiting for `peer`, in order (they are sent again, or wait again)."""
        return self.waiting.pop(peer, [])

    def pending(self) -> int:
        """Moves not yet known to be in their target."""
        return sum(map(len, self.unacked.values())) + sum(map(len, self.waiting.values()))

    def held(self) -> int:
        """How many of those the journal of their source queue holds open (they move again
        after a restart); the rest exist only here (the shutdown logs both)."""
        n = 0
        for moves in (*(d.values() for d in self.unacked.values()), *self.waiting.values()):
            for move in moves:
                source = move[2]
                if source is not None and source.medium is not None:
                    n += 1
        return n


def still_open(move: Move) -> bool:
    """False when the source's own record of the move was rolled back too (a write failure that
    took both, as when source and target share a journal or a command-log partition): the item
    is back in the source and moves again from there, so sending it again would make two."""
    source = move[2]
    return source is None or move[3] in source.open_items()


#: OP_FORWARD_ADD's `a`: the move's item is in its source's journal whatever happens to the
#: source (`journal_holds`), so the target may drop it if the source died (or stops) before
#: it could be acknowledged: the source moves it again after its restart, and it arrives once.
HELD = 1


def journal_holds(move: Move) -> bool:
    """Whether a restart of the source worker finds the item of `move` in its source queue, at
    any moment from the sweep on: a journal's replay has it from its REMOVE_TENTATIVE, or, if
    that is not written yet, from the item's add (journal replay keeps expired items; an add
    not written yet was never acknowledged).  A command log does not: until its re-log of the
    item as held (record_move_open) is written, the item's only record is an add past its
    TTL, which replay drops.  A storage that keeps nothing holds nothing."""
    source = move[2]
    return source is not None and source.storage.__class__ is Journal


class MoveOps:
    """Worker methods: moves out of this worker's queues, their acks, and the sweep at start.

    Filled by Worker: coll, moves, peers, nworkers, index, own_slot, outbound, down_peers,
    worker_rings, void_moves, moves_voided, clock, loop; reply, request_failed, handle,
    note_deadline, schedule_turn, poll_control.
    """
    __slots__ = ()              # the worker's (worker.py)

    def sweep_replayed(self) -> int:
        """Once the loop is up: expired items of queues with an expire_to_queue target move now.
        Among them are the moves the last run left open, which replay rolled back into their
        source (above); without this they waited for a client to touch the source (or for
        the expiration timer, off by default)."""
        self.poll_control()                # first the peers known down at its birth: theirs wait
        coll = self.coll
        coll.undo.ctx = None               # nobody's request
        n = 0
        for name in coll.names():
            q = coll.queue(name, create=False)
            if q.expire_sink is not None and q.length and not q.closed:
                n += q.discard_expired()
        if n:
            log.info("worker %d: %d expired items moved at start", self.index, n)
        return n

    def forward_add(self, target: str, data: bytes, now_ms: int, source=None, xid: int = 0) -> None:
        """expire_to_queue out of `source`, which logged the item as its open move `xid`, so it
        stays open there (and here) until the target's owner acknowledges the add (moves.py);
        while that worker is down the move waits and goes when it is back (`send_parked`).  A
        target of this worker is written in this batch and acknowledged to itself once written
        (`move_here`)."""
        self.send_move((target, data, source, xid))

    def send_move(self, move) -> None:
        target, data = move[0], move[1]
        dst = self.peers.of_worker(worker_of(target, self.nworkers))
        if dst == self.own_slot:
            self.move_here(move)
            return
        ring = self.outbound[dst]
        if ring is None or dst in self.down_peers:
            log.warning("worker %d: an expired item for %r waits for its worker, which is down",
                        self.index, target)
            self.moves.wait(dst, move)
            return
        q = target.encode("latin-1")
        seq = self.moves.sent(dst, move)
        held = HELD if journal_holds(move) else 0
        send(ring, pack_req(0, seq, OP_FORWARD_ADD, 0, len(q), held, 0) + q, data)
        ring.publish()

    def move_here(self, move) -> None:
        """A move into a queue of this worker: added now, as a peer adds a move it receives, and
        acknowledged to this worker with the batch's replies (publish: `moved_here`), so its
        source confirms it only once the add is written (fsynced under "always"); an add rolled
        back turns the ack into SERVER_ERROR, and the move goes again, still open in its source."""
        own = self.own_slot
        self.add_move(own, self.moves.sent(own, move), move[0], move[1])

    def add_move(self, src: int, seq: int, target: str, data: bytes) -> None:
        """Add move `seq` of worker slot `src` (a peer's OP_FORWARD_ADD, or `move_here`) and
        acknowledge it with the batch's replies, which leave once the add is written; a failed
        add's ack is SERVER_ERROR, and its source sends it again later."""
        try:
            self.coll.add_forwarded(target, data, self.clock.now_ms(), (src, FWD_ACK_CONN, seq))
        except Exception as e:     # one bad move must not take the shard down
            self.request_failed(src, FWD_ACK_CONN, seq, target, e)
        else:
            self.reply(src, FWD_ACK_CONN, seq, R_OK)

    def moved_here(self, ack) -> None:
        """The ack of a `move_here`, published: its add is written (or failed)."""
        self.acked_move(self.own_slot, ack)
        if self.loop is not None:
            self.schedule_turn()    # the source's confirm goes into a batch of its own

    def send_parked(self, peer: int) -> None:
        """`peer` is back (or failed moves are due again): the moves that waited for it go,
        in their order."""
        for move in self.moves.take(peer):
            self.send_move(move)

    def retry_moves(self, now_ms: int) -> None:
        """Moves a target could not write (its SERVER_ERROR ack, or a rollback here) go again,
        RETRY_MS later."""
        moves = self.moves
        if moves.retry_ms and now_ms >= moves.retry_ms:
            moves.retry_ms = 0
            for peer in list(moves.waiting):
                if peer not in self.down_peers:
                    self.send_parked(peer)

    def from_worker(self, src: int, msg) -> None:
        """A message on another worker's ring: a request it sends (a move), or the ack of one
        of ours."""
        if msg[:4] == ACK_HEAD:
            self.acked_move(src, msg)
        elif src in self.void_moves and self.void_move(msg):
            return
        else:
            self.handle(src, msg)

    def void_move(self, msg) -> bool:
        """A message a dead (or stopping) worker left: True for a move its journal holds, which is
        dropped (it moves again after the restart; run here too, it would arrive twice)."""
        _, _, op, _, _, a = unpack_req(msg, 0)[:6]
        if op == OP_FORWARD_ADD and a == HELD:
            self.moves_voided += 1
            return True
        return False

    def hear_deaths(self) -> None:
        """Before a worker's messages are run, the supervisor's news is read: a dead worker's
        moves are then run (or dropped) as such by peer_down (peers.py), not as a live one's."""
        down = self.down_peers
        for src, ring in self.worker_rings:
            if src not in down and not ring.empty():
                self.poll_control()
                return

    def acked_move(self, src: int, msg) -> None:
        moves = self.moves
        done = moves.acked(src, msg, self.clock.now_ms())
        if done is not None and done[2] is not None:
            # the target has it: the source's journal lets it go (nobody's reply)
            undo = self.coll.undo
            ctx, undo.ctx = undo.ctx, None
            try:
                self.coll.confirm_move(done[2], done[3])
            finally:
                undo.ctx = ctx
        if moves.retry_ms:
            self.note_deadline(moves.retry_ms)
