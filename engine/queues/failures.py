"""What a QueueCollection does when a storage cannot write its records (disk full, I/O errors).

Every recorded change is also in the collection's `undo` (queues/undo.py).  When a storage
cannot write (or, under sync "always", fsync) its records, `rollback` undoes the changes they
stood for and drops the records, so memory equals what is on disk again; stand-alone calls
then raise the error (an add that raised is not in the queue, a remove that raised took
nothing).  The worker does the same per batch and fixes its replies.  A master's add that is
rolled back takes its fanout children's copies with it, written or not (undo.FanoutCopy): the
set is answered SERVER_ERROR, so no queue may hold the item.  A confirm or abort taken back
leaves its item reserved with nobody holding it in the server: the worker `strand`s it and
`abort_stranded` retries the abort.  The confirm of an expired item's move (undo.MOVE_CONFIRM:
its target has the item) is stranded here, and `abort_stranded` writes the confirm again.  A
held read's confirm or abort (queues/openreads.py) taken back is stranded by the worker and
aborted again: the item is served once more (at least once).

`WriteFailures` is a base class of `QueueCollection` (collection.py) and nothing else.
"""
from __future__ import annotations

import logging
from typing import Callable

from lanner.queues.undo import MOVE_CONFIRM, Undone, UndoLog, counted_adds

log = logging.getLogger(__name__)


class WriteFailures:
    # What it uses of the collection (QueueCollection sets these up):
    undo: UndoLog
    stranded: dict[str, list[int]]
    _queues: dict
    _parked: dict
    confirm_move: Callable
    autoflush: bool
    total_items: int
    flush_storages: Callable[[], None]
    __slots__ = ()              # QueueCollection's

    def rollback(self, storage, *, unsynced: bool = False) -> list[Undone]:
        """`storage` could not write its buffer (or, `unsynced`, fsync what it wrote): undo
        every change whose record is lost, newest first, and drop those records.  Returns
        the changes undone, for the owner to correct what it told its clients."""
        medium = getattr(storage, "medium", None)
        if medium is None:
            return []
        mark = medium.durable_mark if unsynced else medium.written_mark
        undone = []
        cuts = [(medium, mark)]
        while cuts:          # a master's add goes with its children's copies, written or not
            m, p = cuts.pop()
            undone += self.undo.rollback(m, p)
            m.rollback(p)
            cuts += self.undo.copies_of(m, p)
        self.total_items -= counted_adds(undone)     # the queues' own figures: Queue.revert
        for u in undone:
            if u.kind == MOVE_CONFIRM:      # the target has it: confirmed again later
                self.strand(u.queue, u.xid)
        if undone:
            log.warning("rolled back %d changes whose records could not be %s: %s", len(undone),
                        "made durable" if unsynced else "written",
                        ", ".join(sorted({u.queue for u in undone})))
        return undone

    def strand(self, name: str, xid: int) -> None:
        """An open read whose confirm or abort was undone and that no client holds any more."""
        self.stranded.setdefault(name, []).append(xid)

    def abort_stranded(self) -> int:
        """Abort every stranded open read again (its item goes back to the head); confirm a
        stranded move again (its target has the item)."""
        stranded, self.stranded = self.stranded, {}
        undo = self.undo
        ctx, undo.ctx = undo.ctx, None
        n = 0
        try:
            for name, xids in stranded.items():
                q = self._queues.get(name)
                if q is None:
                    q = self._parked.get(name)        # deleted: only its moves are left
                    if q is None:
                        continue
                    for xid in xids:
                        if self.confirm_move(q, xid):
                            n += 1
                    continue
                for xid in xids:
                    if q.confirm_move(xid) or q.abort_held(xid) or q.unremove(xid):
                        n += 1
        finally:
            undo.ctx = ctx
        if n and self.autoflush:
            self.flush_storages()
        return n
