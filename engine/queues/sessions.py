"""One client connection's open reads (reference §1.5, §1.6, §9.3).

Per queue a FIFO of the xids this connection holds.  Every way of finishing
reads takes from the OLDEST end: `/close`, `/abort` and `confirm n` (all or
nothing).  On disconnect every open read is aborted oldest first; because each
abort puts its item back at the head, the most recently opened item ends up
first (open a then b, disconnect: the queue reads b, a, ...).  The engine keeps
no reference from queues to sessions: a session is plain data the worker keys
by connection.
"""
from __future__ import annotations

from collections import deque


class Session:
    __slots__ = ("key", "_open")

    def __init__(self, key: object) -> None:
        self.key = key
        self._open: dict[str, deque[int]] = {}

    def open_count(self, queue: str) -> int:
        xids = self._open.get(queue)
        return len(xids) if xids else 0

    def add_open(self, queue: str, xid: int) -> None:
        xids = self._open.get(queue)
        if xids is None:
            xids = self._open[queue] = deque()
        xids.append(xid)

    def pop_oldest(self, queue: str) -> int | None:
        xids = self._open.get(queue)
        if not xids:
            return None
        xid = xids.popleft()
        if not xids:
            del self._open[queue]
        return xid

    def pop_oldest_n(self, queue: str, n: int) -> list[int] | None:
        """The oldest `n` xids, or None (and nothing taken) if n <= 0 or more than are open."""
        xids = self._open.get(queue)
        if n <= 0 or not xids or n > len(xids):
            return None
        out = [xids.popleft() for _ in range(n)]
        if not xids:
            del self._open[queue]
        return out

    def discard(self, queue: str, xid: int) -> None:
        """Forget `xid` (its read was rolled back: the client never got the item)."""
        xids = self._open.get(queue)
        if xids is not None and xid in xids:
            xids.remove(xid)
            if not xids:
                del self._open[queue]

    def all_open(self) -> list[tuple[str, int]]:
        """Every open read in the order a disconnect aborts them: per queue, oldest first."""
        return [(queue, xid) for queue, xids in self._open.items() for xid in xids]

    def clear(self) -> None:
        self._open.clear()
