"""Blocking gets, monitors and thrift reads: requests that wait on a queue.

A waiting request is a plain record (Pending) parked on its queue's wait list; the
worker retries the woken ones at the end of a turn and fails the expired ones from
its timers, so fairness is FIFO per queue across every client of the server.
"""
from __future__ import annotations

import heapq
import logging
from dataclasses import dataclass

import msgpack

from lanner.ipc.messages import (F_ABORT, F_CLOSE, F_CONFIRM_ALL, F_HOLD, F_OPEN, F_PEEK, R_DATA,
                                 R_EMPTY, R_END, R_ERROR, R_ITEM, RF_CLOSE, RF_HELD, RF_MORE,
                                 pack_resp, resp_fields)
from lanner.queues.waiters import Waiter

log = logging.getLogger(__name__)

STRAND_RETRY_MS = 1000   # how often to retry aborting open reads whose abort could not be written


@dataclass(slots=True, eq=False)
class Pending:
    """A blocked GET or a running MONITOR, parked on a queue's wait list."""
    src: int
    conn: int
    req: int
    queue: str
    flags: int
    monitor: bool = False
    budget: int = 0          # monitor: items still allowed
    deadline_ms: int | None = None
    waiter: Waiter | None = None
    done: bool = False
    thrift: bool = False     # a thrift get: collects items, replies once
    auto_abort: int = 0      # thrift: ms before an unconfirmed item goes back (0: plain removes)
    items: list | None = None
    hold: int = 0            # thrift without auto-abort, for another process: its items' hold id




class Waiting:
    """Worker methods; the attributes they use are set in Worker.__init__.

    Filled by Worker: coll, sessions, pending_by_conn, tids*, clock, reply().
    """
    __slots__ = ()              # the worker's (worker.py)

    def plain_get(self, src, conn, req, queue, hold=False) -> None:
        """`get q` with no option and no wait, the common request: remove the head or answer
        empty; an open read on the queue makes it a protocol error (it closes the connection).
        The fused local path (MemcacheConn.on_get) calls it directly, with no request record
        around it, so it answers its own failure; op_get for every other caller.  A reply to
        this worker's own front keeps its head unpacked (it stays in this process,
        messages.resp_fields); another process's client gets a held read (holding.py), and so
        does this worker's own client with `hold` (op_get's F_HOLD)."""
        try:
            sessions = self.sessions        # none at all, the common case: no key tuple made
            sess = sessions.get((src, conn)) if sessions else None
            if sess is not None and sess.open_count(queue):
                self.reply(src, conn, req, R_ERROR, RF_CLOSE)
            else:
                coll = self.coll
                coll.undo.ctx = (src, conn, req)
                if src != self.local_src or hold:
                    if not self.held_remove(src, conn, req, queue):
                        self.replies.append((src, pack_resp(conn, req, R_EMPTY, 0, 0, 0), b""))
                    return
                item = coll.remove(queue)
                head = (conn, req, R_ITEM if item is not None else R_EMPTY, 0, 0, 0)
                self.replies.append((src, head if src == self.local_src else pack_resp(*head),
                                     item.data if item is not None else b""))
        except Exception as e:   # one bad request must not take the shard down
            self.request_failed(src, conn, req, queue, e)

    def op_get(self, src, conn, req, queue, flags, timeout) -> None:
        """F_HOLD: this worker's own client sent the get while a request of its connection was
        in flight at another worker, whose reply may yet close the connection (issue 11, defect
        2; MemcacheConn.on_get): a plain read is then held as another process's is, so its item
        goes back if its reply is never written (holding.py, fronts/held.py)."""
        hold = flags & F_HOLD
        if hold:
            flags ^= F_HOLD
        if not flags and timeout <= 0:
            self.plain_get(src, conn, req, queue, hold)
            return
        coll = self.coll
        sess = self.sessions.get((src, conn))
        if flags & F_CONFIRM_ALL:
            sess = sess or self.session(src, conn)
            self.confirm_all(sess, queue)
        if flags & F_ABORT:
            xid = sess.pop_oldest(queue) if sess else None
            if xid is not None:
                coll.unremove(queue, xid)
            self.reply(src, conn, req, R_EMPTY)
            return
        if flags & F_CLOSE:
            xid = sess.pop_oldest(queue) if sess else None
            if xid is not None:
                coll.confirm_remove(queue, xid)
            if not flags & F_OPEN:
                self.reply(src, conn, req, R_EMPTY)
                return
        opens = sess.open_count(queue) if sess else 0
        if flags & F_OPEN:
            if opens >= self.mot:
                if flags & F_CONFIRM_ALL:   # text protocol: an error line, connection stays
                    self.reply(src, conn, req, R_ERROR, 0, self.mot)
                else:
                    self.reply(src, conn, req, R_ERROR, RF_CLOSE)
                return
        elif not flags & F_PEEK and opens:
            self.reply(src, conn, req, R_ERROR, RF_CLOSE)
            return
        if not flags:
            # a plain get, the common request: a Pending only if it has to wait
            coll.undo.ctx = (src, conn, req)
            if src != self.local_src or hold:
                if self.held_remove(src, conn, req, queue):
                    return
            else:
                item = coll.remove(queue)
                if item is not None:
                    self.reply(src, conn, req, R_ITEM, 0, 0, item.data)
                    return
            p = None
        else:
            p = Pending(src, conn, req, queue, flags)
            if self.try_fetch(p):
                return
        if timeout > 0:
            p = p or Pending(src, conn, req, queue, flags)
            p.deadline_ms = self.clock.now_ms() + timeout
            self.park(p)
        else:
            self.reply(src, conn, req, R_EMPTY)

    def try_fetch(self, p: Pending) -> bool:
        """One attempt at the queue for a GET (or one monitor iteration); replies on success."""
        self.coll.undo.ctx = (p.src, p.conn, p.req)
        if p.flags & F_PEEK:
            item = self.coll.peek(p.queue)
        elif not p.flags & F_OPEN and p.src != self.local_src:
            return self.held_remove(p.src, p.conn, p.req, p.queue)     # (holding.py)
        else:
            item = self.coll.remove(p.queue, transactional=bool(p.flags & F_OPEN))
        if item is None:
            return False
        if p.flags & F_OPEN:
            self.session(p.src, p.conn).add_open(p.queue, item.xid)
        self.reply(p.src, p.conn, p.req, R_ITEM, RF_MORE if p.monitor else 0, 0, item.data)
        return True

    def monitor_step(self, p: Pending) -> None:
        now = self.clock.now_ms()
        while True:
            sess = self.sessions.get((p.src, p.conn))
            opens = sess.open_count(p.queue) if sess else 0
            if (p.budget <= 0 or now >= p.deadline_ms or opens >= self.mot
                    or self.status.blocks_reads()):
                self.finish(p, R_END)
                return
            if not self.try_fetch(p):
                self.park(p)
                return
            p.budget -= 1

    def park(self, p: Pending) -> None:
        w = Waiter(key=p, queue=p.queue, deadline_ms=p.deadline_ms, peek=bool(p.flags & F_PEEK),
                   transactional=bool(p.flags & F_OPEN))
        p.waiter = w
        self.coll.wait(w)
        self.pending_by_conn[(p.src, p.conn)].add(p)
        if p.deadline_ms is not None:
            self.note_deadline(p.deadline_ms)

    def unpark(self, p: Pending) -> None:
        """`p` is answered: forget it (its connection's set, its waiter)."""
        p.done = True
        p.waiter = None          # the waiter points back at p: free both by refcount
        key = (p.src, p.conn)
        s = self.pending_by_conn.get(key)
        if s is not None:
            s.discard(p)
            if not s:
                del self.pending_by_conn[key]

    def finish(self, p: Pending, status: int) -> None:
        self.unpark(p)
        self.reply(p.src, p.conn, p.req, status)

    def retry_woken(self) -> None:
        woken, self.coll.woken = self.coll.woken, []
        for w in woken:
            p: Pending = w.key
            if p.done or w.cancelled:
                continue
            if w.evicted or self.coll.queue(p.queue, create=False) is None:   # deleted: answer empty
                self.coll.cancel_wait(w)
                if p.thrift:
                    self.tget_finish(p)
                else:
                    self.finish(p, R_END if p.monitor else R_EMPTY)
                continue
            if p.thrift:
                self.coll.cancel_wait(w)
                self.tget_step(p)             # takes what it can, or parks again at the tail
                continue
            if p.monitor:
                if self.try_fetch(p):
                    p.budget -= 1
                    self.coll.cancel_wait(w)
                    self.monitor_step(p)
                else:
                    self.coll.wait(w)          # lost the race: back to the tail, same deadline
                continue
            if self.try_fetch(p):
                self.coll.cancel_wait(w)
                self.unpark(p)
            else:
                self.coll.wait(w)
        if self.coll.woken:
            self.retry_woken()

    def evict_waiters(self) -> None:
        """Stopping: blocked gets, monitors and thrift gets answer now, empty (or with the items
        a thrift get has collected), as Kestrel's shutdown woke every waiter (§5.10)."""
        self.coll.evict_waiters()
        self.retry_woken()

    # -- thrift --------------------------------------------------------------------------------
    def tget_step(self, p: Pending) -> None:
        """Kestrel's thrift get is its monitor loop: collect until max_items, the deadline, the
        connection's open-read cap on the queue, or an empty queue with no timeout (§3.3)."""
        self.coll.undo.ctx = p              # a rolled-back item is dropped from its reply
        key = (p.src, p.conn, p.queue)
        while True:
            if (p.budget <= 0 or self.tcounts.get(key, 0) >= self.mot
                    or self.status.blocks_reads()):
                self.tget_finish(p)
                return
            if p.auto_abort <= 0 and p.src != self.local_src:
                q, item = self.coll.remove_held(p.queue)   # held for the front (holding.py)
                if item is not None:
                    self.hold_for(p, q, item.xid)
            else:
                item = self.coll.remove(p.queue, transactional=p.auto_abort > 0)
            if item is None:
                if p.deadline_ms is None or self.clock.now_ms() >= p.deadline_ms:
                    self.tget_finish(p)
                else:
                    self.park(p)
                return
            tid = 0
            if p.auto_abort > 0:
                tid = self.tids_supply.next()
                self.tids[tid] = (p.queue, item.xid, key)
                self.tcounts[key] = self.tcounts.get(key, 0) + 1
            p.items.append((item.data, tid))
            p.budget -= 1

    def tget_finish(self, p: Pending, reply: bool = True) -> None:
        self.unpark(p)
        if p.auto_abort > 0:
            # the auto-abort timers start when the call returns
            due = self.clock.now_ms() + p.auto_abort
            for _, tid in p.items:
                heapq.heappush(self.taborts, (due, tid))
            self.note_deadline(due)
        if reply:
            self.reply(p.src, p.conn, p.req, R_DATA, RF_HELD if p.hold else 0, p.hold,
                       msgpack.packb(p.items))
        elif p.hold:
            self.abort_hold(p.src, p.hold)       # nobody will write them: they go back

    def tget_undo(self, p: Pending, gone: set[int]) -> None:
        """Items of thrift get `p` were rolled back (their removal was not written): drop
        them, and their ids, from what the get hands out; rebuild its reply if it is made."""
        keep = []
        for data, tid in p.items:
            if id(data) in gone:
                if tid:
                    self.forget_tid(tid)
            else:
                keep.append((data, tid))
        p.items = keep
        if p.done:
            packed = msgpack.packb(keep)
            for replies in self.waiting_replies():
                for i, (dst, head, payload) in enumerate(replies):
                    conn, req = resp_fields(head)[:2]
                    if dst == p.src and conn == p.conn and req == p.req:
                        replies[i] = (dst, head, packed)

    def forget_tid(self, tid: int):
        """Drop thrift read id `tid`; its (queue, xid, owner) or None."""
        entry = self.tids.pop(tid, None)
        if entry is None:
            return None
        owner = entry[2]
        n = self.tcounts.get(owner)
        if n is not None:
            if n <= 1:
                del self.tcounts[owner]
            else:
                self.tcounts[owner] = n - 1
        return entry

    def settle_tid(self, tid: int, abort: bool) -> bool:
        entry = self.forget_tid(tid)
        if entry is None:
            return False
        queue, xid, _owner = entry
        if abort:
            self.coll.unremove(queue, xid)
        else:
            self.coll.confirm_remove(queue, xid)
        return True

    # -- timers ----------------------------------------------------------------------------------
    def run_timers(self) -> None:
        now = self.clock.now_ms()
        self.coll.undo.ctx = None
        taborts = self.taborts
        while taborts and taborts[0][0] <= now:
            _, tid = heapq.heappop(taborts)
            self.settle_tid(tid, abort=True)
        for w in self.coll.expire_waiters(now):
            p: Pending = w.key
            if p.done:
                continue
            if p.thrift:
                self.tget_finish(p)
            elif p.monitor:
                self.finish(p, R_END)
            else:
                self.finish(p, R_EMPTY)
        if self.next_expire_ms is not None and now >= self.next_expire_ms:
            self.coll.expire_queues()
            self.next_expire_ms = now + self.config.server.expiration_timer_frequency
        due = self.coll.sync_schedule.due(now)
        if due:
            self.syncer.later(due)
        self.storage_factory.tick(now)
        self.retry_moves(now)
        if self.coll.stranded and now >= self.next_strand_ms:
            n = sum(len(x) for x in self.coll.stranded.values())
            log.info("worker %d: aborting %d open reads whose abort could not be written before",
                     self.index, n)
            self.coll.abort_stranded()
            self.next_strand_ms = now + STRAND_RETRY_MS
        if self.coll.woken:
            self.retry_woken()
