"""Items a queue takes that no client sent to it: a fanout master's copies for its children
(reference §5.6) and the items another queue's expiry moves into it (expire_to_queue, §5.4).

Both write to a queue other than the one named, with the undo log told why (queues/undo.py:
FanoutCopy, MOVE, ForwardedMove), so that a rollback undoes the copies with their master's record
and fails a forwarded move's acknowledgement.  The collection's module doc says what each counts.

`Forwarding` is a base class of `QueueCollection` (collection.py) and nothing else.
"""
from __future__ import annotations

import logging

from lanner.queues.queue import PersistentQueue
from lanner.queues.undo import ADD, MOVE, FanoutCopy, ForwardedMove

log = logging.getLogger("lanner.queues.collection")


class Forwarding:
    """QueueCollection's fanout copies and expiry moves; the state is the collection's."""
    __slots__ = ()              # QueueCollection's

    def _add_fanout(self, q: PersistentQueue, children: list[str], data: bytes, expiry_ms, now: int) -> bool:
        """`add` to a master with children: the copies first (a lost copy fails no reply: the
        reply is the master's), tied to the master's record (undo.FanoutCopy)."""
        queues = self._queues
        undo = self.undo
        ctx, undo.ctx = undo.ctx, FanoutCopy()
        copies = undo.ctx
        undo.copies = True
        for child in children:
            cq = queues.get(child)
            if cq is not None and cq.add(data, expiry_ms, now):
                self.total_items += 1
        undo.ctx = ctx
        n = len(undo.entries)
        ok = q.add(data, expiry_ms, now, now)
        for e in undo.entries[n:]:
            if e[2] is q and e[3] == ADD:
                copies.master = (e[0], e[1])
        if ok:
            self.total_items += 1
        if self.autoflush:
            self.flush_storages()
        return ok

    def add_forwarded(self, name: str, data: bytes, now_ms: int, ack: tuple | None = None) -> bool:
        """An expire_to_queue move into `name`: no client expiry (the target's max_age applies),
        add time now, no fanout, no global total_items.  `ack`: the key of the reply that
        acknowledges it to its sender, which a rollback must fail (server/moves.py)."""
        ok = self._move(name, data, now_ms, MOVE if ack is None else ForwardedMove(ack))
        if self.autoflush:
            self.flush_storages()
        return ok

    def _move(self, name: str, data: bytes, now_ms: int, why=MOVE) -> bool:
        undo = self.undo
        ctx, undo.ctx = undo.ctx, why
        try:
            return self.queue(name).add(data, None, now_ms)
        finally:
            undo.ctx = ctx

    def _expire_into(self, target: str, source: PersistentQueue, data: bytes, now_ms: int, xid: int) -> None:
        """`source`'s sweep expired an item (`xid`: its open move, when `source.hold_moves`)."""
        if self._expire_forward is not None:     # held open in `source` until the target has it
            self._expire_forward(target, data, now_ms, source, xid)
        elif self._owns is None or self._owns(target):
            self._move(target, data, now_ms)
        else:
            log.error("cannot move an expired item to %r: no worker serves it here", target)

    def confirm_move(self, source: PersistentQueue, xid: int) -> bool:
        """The target of `source`'s open move `xid` acknowledged it.  False if that move is not
        open any more (the queue deleted meanwhile, or its open record rolled back)."""
        name = source.name
        parked = self._parked.get(name) is source
        ok = (parked or self._queues.get(name) is source) and source.confirm_move(xid)
        if ok and parked:
            self._unpark(source)
        if ok and self.autoflush:
            self.flush_storages()
        return ok
