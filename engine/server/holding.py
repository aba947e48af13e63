"""Plain reads a worker answers to another process's client: held until that process wrote them.

A plain `get` removes its item for good.  When the client's connection is this worker's own
(the fused path, or a request of its own front slot), the process that removes the item also
writes the reply, as in Kestrel, and nothing changes.  When the request came over a ring (a
dedicated front, or another worker serving its own clients), the reply crosses a process that
can die before it has written it to the client's socket; the item would then be in no journal
and with no client.  So the owner removes it as a held read (queues/openreads.py: an open read
of the queue's own, invisible to clients) and answers with RF_HELD and a hold id in the reply's
`value`.  The process holding the connection sends back, once per turn, one OP_HELD message per
owner with the ids whose replies it handed to the kernel (confirmed: CONFIRM_REMOVE) and those
it could not deliver (aborted: the connection was gone, or the reply became an error; the item
goes back to the head).  If that process dies first, `peer_down` aborts every hold it had
(`drop_holds`).  What the owner holds here is keyed by ring (front slot), not by connection: a
connection's DISCONNECT or its handoff to another worker changes nothing, since the front that
received the reply always settles it.

The guarantee is at least once, never lost: an item whose reply was written but whose confirm
did not reach the owner (the front died right after writing, the owner died before it wrote
the confirm, or the confirm's write failed) is served again.  A memcache multi-key get, a
blocking `get q/t=...` (also when a waiter is served later) and a thrift get without
auto_abort are plain reads too; a thrift get holds all its items under one id.

Ids are `pid << 32 | n`: a front that still holds ids of this worker's predecessor (it died
and was replaced) can never settle one of this worker's reads with them.
"""
from __future__ import annotations

import os
from array import array

from lanner.ipc.messages import R_ITEM, RF_HELD, pack_resp


class Holds:
    """Held reads by front slot: slot -> {hold id: (queue, xid or list of xids)}, oldest first."""

    __slots__ = ("base", "seq", "by_src")

    def __init__(self, pid: int | None = None) -> None:
        self.base = (os.getpid() if pid is None else pid) << 32
        self.seq = 0
        self.by_src: dict[int, dict[int, tuple]] = {}

    def add(self, src: int, q, xids) -> int:
        self.seq = seq = (self.seq + 1) & 0xFFFFFFFF
        hid = self.base | seq
        held = self.by_src.get(src)
        if held is None:
            held = self.by_src[src] = {}
        held[hid] = (q, xids)
        return hid

    def __len__(self) -> int:
        return sum(map(len, self.by_src.values()))


def settle(entry: tuple, abort: bool) -> None:
    """Confirm or abort one hold's reads; aborts newest first, so the items come back to the head
    in the order they were read."""
    q, xids = entry
    if xids.__class__ is int:
        if abort:
            q.abort_held(xids)
        else:
            q.confirm_held(xids)
    elif abort:
        for xid in reversed(xids):
            q.abort_held(xid)
    else:
        for xid in xids:
            q.confirm_held(xid)


class Holding:
    """Worker methods; the attributes they use are set in Worker.__init__.

    Filled by Worker: coll, holding, replies.
    """
    __slots__ = ()              # the worker's (worker.py)

    def held_remove(self, src: int, conn: int, req: int, queue: str) -> bool:
        """A plain read for front slot `src`'s client: take the head as a held read and answer
        it (RF_HELD, its hold id); False, answering nothing, if the queue is empty."""
        q, item = self.coll.remove_held(queue)
        if item is None:
            return False
        hid = self.holding.add(src, q, item.xid)
        self.replies.append((src, pack_resp(conn, req, R_ITEM, RF_HELD, 0, hid), item.data))
        return True

    def hold_for(self, p, q, xid: int) -> None:
        """Thrift get `p` (waiting.py) took held read `xid` of `q`: all its items go under one
        hold, the id its reply carries."""
        if not p.hold:
            p.hold = self.holding.add(p.src, q, [xid])
        else:
            self.holding.by_src[p.src][p.hold][1].append(xid)

    def settle_holds(self, src: int, nconfirm: int, payload) -> None:
        """OP_HELD from front slot `src`: the first `nconfirm` ids were written to their
        clients, the rest were not.  Unknown ids (settled already, or a predecessor's) are
        ignored."""
        held = self.holding.by_src.get(src)
        if not held:
            return
        ids = array("q")
        ids.frombytes(payload)
        self.coll.undo.ctx = None           # nobody's reply
        for hid in ids[:nconfirm]:
            entry = held.pop(hid, None)
            if entry is not None:
                q, xids = entry
                if xids.__class__ is int:   # a plain get's one read: `settle`, inline
                    q.confirm_held(xids)
                else:
                    settle(entry, abort=False)
        for hid in reversed(ids[nconfirm:]):
            entry = held.pop(hid, None)
            if entry is not None:
                settle(entry, abort=True)

    def abort_hold(self, src: int, hid: int) -> None:
        """Hold `hid` will never be answered (its thrift get's connection went first)."""
        held = self.holding.by_src.get(src)
        entry = held.pop(hid, None) if held else None
        if entry is not None:
            settle(entry, abort=True)

    def drop_holds(self, src: int) -> int:
        """Front slot `src` died: everything it held goes back, newest first (so each queue
        reads them again in their order, ahead of the rest); how many holds there were."""
        held = self.holding.by_src.pop(src, None)
        if not held:
            return 0
        self.coll.undo.ctx = None
        for entry in reversed(held.values()):
            settle(entry, abort=True)
        return len(held)

    def forget_held(self, queue: str, xid: int) -> None:
        """Held read `xid` of `queue` was rolled back (its record was lost, undo.HELD_OPEN): its
        reply is SERVER_ERROR or leaves it out, and its hold must not settle anything."""
        for held in self.holding.by_src.values():
            for hid, (q, xids) in list(held.items()):
                if q.name != queue:
                    continue
                if xids.__class__ is int:
                    if xids == xid:
                        del held[hid]
                elif xid in xids:
                    xids.remove(xid)
