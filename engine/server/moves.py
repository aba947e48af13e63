"""expire_to_queue moves into a queue another worker owns, kept until that worker has them.

The source worker logs the item's removal before the move leaves (queue.py's expiry sweep),
so from then on the item exists only in the message to the target worker (OP_FORWARD_ADD).
That message can die with the target: unread in the ring (a new process starts with its
rings emptied, mesh.discard_unread) or read but not yet in its journal.  So the source keeps
every move, in order, until the target acknowledges it (an ack on the worker→worker ring,
sent with the target's batch replies: after the add's record was written, and fsynced under
sync "always"); a target that died gets the unacknowledged ones again when it is back, in
their order, ahead of the moves that waited for it.  A target whose write failed (disk full)
answers SERVER_ERROR and the move is sent again after RETRY_MS; so is a move into a queue of
this worker whose add was rolled back (the source's removal stays: its journal is another).

At least once, not exactly once: a target killed after writing the add but before its ack
left (or before the source read it) gets the item twice.  Losing it is the one thing not
allowed.  What this does not cover: moves still only here when the source itself dies or
stops (unacknowledged, or waiting for a target that is down); the ones already in the ring
are run by the target even when the source is dead (peers.py, peer_down).
"""
from __future__ import annotations

from lanner.ipc.messages import FWD_ACK_CONN, R_SERVER_ERROR, RESP

#: How long a move the target could not write waits before it is sent again.
RETRY_MS = 1000

ACK_HEAD = FWD_ACK_CONN.to_bytes(4, "little")     # how an ack starts (a request never does)


class Moves:
    """The moves of one source worker, per target peer: sent and not yet acknowledged (in send
    order), and waiting (for the peer to come back, or for a retry)."""

    __slots__ = ("seq", "unacked", "waiting", "retry_ms")

    def __init__(self) -> None:
        self.seq = 0
        self.unacked: dict[int, dict[int, tuple[str, bytes]]] = {}   # peer -> seq -> move
        self.waiting: dict[int, list[tuple[str, bytes]]] = {}        # peer -> moves to send
        self.retry_ms = 0        # when failed moves go again (0: none failed)

    def sent(self, peer: int, target: str, data: bytes) -> int:
        """Note a move handed to `peer`'s ring; returns the sequence number its ack carries."""
        self.seq = seq = (self.seq + 1) & 0xFFFFFFFF
        self.unacked.setdefault(peer, {})[seq] = (target, data)
        return seq

    def wait(self, peer: int, target: str, data: bytes) -> None:
        self.waiting.setdefault(peer, []).append((target, data))

    def acked(self, peer: int, ack, now_ms: int) -> None:
        """An ack record from `peer`: the move is done, or (SERVER_ERROR) waits for a retry."""
        _, seq, status = RESP.unpack_from(ack, 0)[:3]
        move = self.unacked.get(peer, {}).pop(seq, None)
        if move is not None and status == R_SERVER_ERROR:
            self.failed(peer, *move, now_ms)

    def failed(self, peer: int, target: str, data: bytes, now_ms: int) -> None:
        """A move whose add was rolled back (by `peer`, or here: `peer` is then this worker's
        own number) goes again RETRY_MS from now."""
        self.wait(peer, target, data)
        if not self.retry_ms:
            self.retry_ms = now_ms + RETRY_MS

    def peer_down(self, peer: int) -> None:
        """`peer` died: what it had not acknowledged goes again, first, when it is back."""
        lost = self.unacked.pop(peer, None)
        if lost:
            self.waiting[peer] = list(lost.values()) + self.waiting.get(peer, [])

    def take(self, peer: int) -> list[tuple[str, bytes]]:
        """The moves waiting for `peer`, in order (they are sent again, or wait again)."""
        return self.waiting.pop(peer, [])

    def pending(self) -> int:
        """Moves not yet known to be in their target (for the shutdown's warning)."""
        return sum(map(len, self.unacked.values())) + sum(map(len, self.waiting.values()))

