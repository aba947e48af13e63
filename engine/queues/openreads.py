"""A queue's open reads: a client's (§5.9), and the held reads of plain gets another process
answers.

A client's open read (`_open`) ends with its client's confirm or abort (`confirm_remove`,
`unremove`), or goes back when its connection goes; queue.py opens it (`remove`) and times it out.

Held reads.  A plain read removes its item for good, and Kestrel's rule is that the process
that removes it also writes the reply.  When the client's connection lives in another process
(a dedicated front, or another worker serving its own clients), that process can die between
the owner's remove and its write to the socket, and the item would be in no journal and with
no client.  So the owner keeps such an item as an open read of the queue's own (`_held`, xid ->
item): a REMOVE_TENTATIVE (a command log's start-attempt) under a fresh xid, until the process
holding the connection says the reply was written (`confirm_held`: CONFIRM_REMOVE) or could not
be (`abort_held`: the item goes back to the head, as an aborted open read does).  The worker
keeps who holds what (server/holding.py).

Held reads are invisible to clients: not in `open_transactions`, `transactions` or
`canceled_transactions`, never timed out by open_transaction_timeout, and no client can confirm
or abort one.  Storage sees them with the client reads (`open_items`), so checkpoints, packs
and rewrites carry them, and replay after a crash of the owner rolls them back like any open
read: at least once, never lost.

`OpenReads` is a base class of `PersistentQueue` (queue.py) and nothing else.
"""
from __future__ import annotations

import logging

from lanner.queues.item import QItem
from lanner.queues.undo import CONFIRM, HELD_ABORT, HELD_CONFIRM, HELD_OPEN, OPEN, UNREMOVE

log = logging.getLogger(__name__)

_XID_MAX = 0x7FFFFFFF     # journal xids are i32; wrap to 1 (0 is never used)

#: The client kind each held kind stands for in a storage's own bookkeeping (`undo_record`).
_STORAGE_KIND = {HELD_OPEN: OPEN, HELD_CONFIRM: CONFIRM, HELD_ABORT: UNREMOVE}


class OpenReads:
    # What it uses of the queue (PersistentQueue sets these up):
    _held: dict[int, QItem]
    _open: dict[int, QItem]
    _open_deadline: dict[int, int]
    _moving: dict[int, QItem]
    _xid: int
    transactions: int
    canceled_transactions: int
    __slots__ = ()              # PersistentQueue's

    def _close_open(self, xid: int, what: str):
        """The open read `xid`, no longer open (its deadline dropped), for `what` ("abort",
        "confirm") to finish; None, logged, when it is not open (or the queue is closed)."""
        if self.touched is not None:
            self.touched[self] = None
        item = self._open.pop(xid, None) if not self.closed else None
        if item is None:
            log.warning("queue %r: %s of xid %d, which is not open", self.name, what, xid)
            return None
        self._open_deadline.pop(xid, None)
        return item

    def unremove(self, xid: int) -> bool:
        """Abort: the reserved item goes back to the HEAD and wakes one waiter (§5.9)."""
        item = self._close_open(xid, "abort")
        if item is None:
            return False
        self._abort(item, xid)
        if self.waiters:
            self._wake_one()
        return True

    def confirm_remove(self, xid: int) -> bool:
        item = self._close_open(xid, "confirm")
        if item is None:
            return False
        self._log(self.storage.record_confirm(item, xid), CONFIRM, item, xid)
        return True

    def _abort(self, item: QItem, xid: int, primary: bool = True) -> None:
        self._put_back(item, xid, UNREMOVE, primary)
        self.canceled_transactions += 1

    def _put_back(self, item: QItem, xid: int, kind: int, primary: bool) -> None:
        """An open read's item goes back to the head (an UNREMOVE record, logged as `kind`)."""
        self._push_head(item)
        self._log(self.storage.record_unremove(item, xid), kind, item, xid, primary)
        item.xid = 0

    # -- held reads ----------------------------------------------------------------------------
    def remove_held(self) -> QItem | None:
        """Take the head item as a held read (`item.xid` names it).  A transactional `remove`,
        so every rule of a remove applies once (expiry, read-behind, rotation checks), then made
        the queue's own: out of the client reads and their counters, its undo entry relabelled."""
        transactions = self.transactions
        item = self.remove(transactional=True)
        self.transactions = transactions
        if item is None:
            return None
        xid = item.xid
        del self._open[xid]
        if self._open_deadline:
            self._open_deadline.pop(xid, None)
        self._held[xid] = item
        undo = self.undo
        if undo is not None and undo.entries:
            e = undo.entries[-1]
            if e[4] is item and e[3] == OPEN:
                undo.entries[-1] = (e[0], e[1], e[2], HELD_OPEN, item, xid, e[6])
        return item

    def confirm_held(self, xid: int) -> bool:
        """The reply carrying held read `xid` was written; False if it is not held (any more)."""
        if self.touched is not None:
            self.touched[self] = None
        item = self._held.pop(xid, None) if not self.closed else None
        if item is None:
            return False
        self._log(self.storage.record_confirm(item, xid), HELD_CONFIRM, item, xid, False)
        return True

    def abort_held(self, xid: int) -> bool:
        """The reply carrying held read `xid` never reached its client: the item goes back to
        the head and wakes one waiter, uncounted (no client aborted anything)."""
        if self.touched is not None:
            self.touched[self] = None
        item = self._held.pop(xid, None) if not self.closed else None
        if item is None:
            return False
        self._put_back(item, xid, HELD_ABORT, False)
        if self.waiters:
            self._wake_one()
        return True

    @property
    def held_reads(self) -> int:
        return len(self._held)

    def revert_held(self, kind: int, item: QItem, xid: int) -> int:
        """`revert` of a held kind (undo.py); returns the client kind it stands for."""
        if kind == HELD_OPEN:
            self._held.pop(xid, None)
            item.xid = 0
            self._push_head(item)
        else:           # a confirm or abort taken back: held again (the owner strands it)
            if kind == HELD_ABORT and self._items and self._items[0] is item:
                self._pop_head()
            item.xid = xid
            self._held[xid] = item
        return _STORAGE_KIND[kind]

    def _recycle_timed_out(self, now: int) -> None:
        """open_transaction_timeout (§5.9, §9 #17): lazily, on a remove from a
        non-empty queue, abort the single oldest open transaction if its time
        is up, so this remove returns it.  No waiter is woken: the remover
        takes the item."""
        xid, deadline = next(iter(self._open_deadline.items()))
        if deadline < now:
            del self._open_deadline[xid]
            item = self._open.pop(xid)
            log.info("queue %r: open transaction %d timed out; redelivering", self.name, xid)
            self._abort(item, xid, primary=False)

    def _next_xid(self) -> int:
        xid = self._xid
        open_ = self._open
        moving = self._moving
        held = self._held
        while True:
            xid = xid + 1 if xid < _XID_MAX else 1
            if xid not in open_ and xid not in moving and xid not in held:
                break
        self._xid = xid
        return xid
