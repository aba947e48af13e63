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
rewrites carry these open reads like a client's (queue.open_items).

At least once, not exactly once: an item reaches its target twice when a crash falls between
the target's write and the source's confirm (a target killed before its ack left, a source
killed before it wrote the confirm), or when the source's open record could not be written
(the item goes back to the source's head, and the move already left).  Losing it is the one
thing not allowed.  What this does not cover: a source queue whose storage keeps nothing
(keep_journal = false): its moves exist only here.
"""
from __future__ import annotations

from lanner.ipc.messages import FWD_ACK_CONN, R_SERVER_ERROR, RESP

#: How long a move the target could not write waits before it is sent again.
RETRY_MS = 1000

ACK_HEAD = FWD_ACK_CONN.to_bytes(4, "little")     # how an ack starts (a request never does)

#: A move: (target queue name, data, source queue or None, the source's move xid or 0).
#: With a source, the source's journal holds the item until `confirm_move`; without one
#: (a move made without a source: undo.MOVE) it exists only here.
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
