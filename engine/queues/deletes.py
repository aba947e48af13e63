"""`delete` of a queue (§5.5), and of one whose expired items are still on their way to its
expire_to_queue target (server/moves.py: open moves in its storage).

Those items were moved out before the delete: they belong to the target, and until the target
has them the source's storage is their only durable copy.  So such a queue goes from every view
at once (stats, names, its waiters answer empty, queue_deletes counts it), its items go, and
its storage stays until the last move is confirmed, then is erased.  A client that names the
queue meanwhile gets that same queue back, empty (a new one must not open the same files); a
restart before the last confirm finds the queue with the moves rolled back into it, and the
worker moves them at once.

`Deletes` is a base class of `QueueCollection` (collection.py) and nothing else.
"""
from __future__ import annotations

import logging
from typing import Callable

log = logging.getLogger("lanner.queues.collection")


class Deletes:
    # What it uses of the collection (QueueCollection sets these up):
    _queues: dict
    _parked: dict          # name -> a deleted queue whose moves are still open
    _children: dict
    _factory: object
    stranded: dict
    undo: object
    sync_schedule: object
    queue_deletes: int
    woken_append: Callable
    __slots__ = ()              # QueueCollection's

    def delete(self, name: str) -> None:
        """Close the queue, erase its files, drop it and its stats (§5.5).  Its
        waiters are evicted into `woken` and answer empty.  Items it already expired and
        has not yet seen reach their expire_to_queue target (open moves) belong to the
        target: the queue goes from every view, but keeps them in its storage until they
        are confirmed (`_park`)."""
        q = self._queues.get(name)
        if q is None:
            return
        if q.moves_open:
            self._park(q)
        else:
            self._erase(q)                 # raises, leaving the queue as it was, if it cannot
            self.stranded.pop(name, None)
        del self._queues[name]
        self.queue_deletes += 1
        log.debug("queue %r: deleted", name)
        plus = name.find("+")
        if plus >= 0:
            children = self._children.get(name[:plus])
            if children and name in children:
                children.remove(name)

    def _erase(self, q) -> None:
        q.destroy()
        if getattr(q.storage, "medium", None) is q.storage:   # its own stream: nothing left to undo
            self.undo.forget(q.storage)
        self.sync_schedule.forget(getattr(q.storage, "medium", None))
        forget = getattr(self._factory, "forget", None)     # a factory that tracks its storages
        if forget is not None:
            forget(q.name)

    def _park(self, q) -> None:
        """A deleted queue with open moves: its items go (recorded as removes), its waiters are
        evicted and its figures start again, but its storage keeps the moves open until the last
        is confirmed (`confirm_move`), then is erased.  Referenced meanwhile, the name gets this
        queue back (`_create`), empty: a new queue must not open the same files.  A restart before
        the last confirm finds the queue with the moves rolled back into it, and moves them."""
        log.info("queue %r: deleted with %d expired items on their way to %r; its storage keeps "
                 "them until they are there", q.name, q.moves_open, q.config.expire_to_queue)
        q.flush()
        for w in q.waiters.wake_all():
            self.woken_append(w)
        q.total_items = q.expired_items = q.discarded = q.transactions = 0
        q.canceled_transactions = q.total_flushes = 0
        self._parked[q.name] = q

    def _unpark(self, q) -> None:
        """`q`'s last open move was confirmed since its queue was deleted: erase it now."""
        if q.moves_open or self._parked.get(q.name) is not q:
            return
        try:
            self._erase(q)
        except OSError as e:       # (a command log that cannot write its deletes): at restart
            log.error("queue %r: deleted, but its storage could not be erased: %s", q.name, e)
            return
        del self._parked[q.name]
        self.stranded.pop(q.name, None)
