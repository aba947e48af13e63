"""Group commit: what a worker does at the end of a turn with the replies it collected.

Replies leave only after the records they acknowledge reached the OS (one write per
dirty journal or segment per turn); replies that depend on an fsync (sync "always")
wait while a helper thread fsyncs every dirty file at once.  A write or fsync that
fails is rolled back (queues/undo.py), and the replies of the requests it undid
become SERVER_ERROR, so what a client is told is what the queue holds.
"""
from __future__ import annotations

import logging
import os
import select
from concurrent.futures import ThreadPoolExecutor


from lanner.errors import describe_os_error
from lanner.ipc.messages import (R_SERVER_ERROR, RF_CLOSE, pack_resp, send, unpack_resp)
from lanner.queues.undo import CONFIRM, OPEN, UNREMOVE
from lanner.server.waiting import STRAND_RETRY_MS, Pending

log = logging.getLogger(__name__)


class GroupCommit:
    """Worker methods; the attributes they use are set in Worker.__init__.

    Filled by Worker: replies, held, sync_* state, coll, loop hooks (reply, arm).
    """

    def finish_batch(self) -> None:
        """Flush journals, then publish replies or hold them for a group fsync.  A storage
        that cannot write is rolled back, and the replies of what it undid become errors."""
        coll = self.coll
        coll.undo.ctx = None
        dirty = coll.dirty_storages()
        needs_sync = []
        now = self.clock.now_ms()
        scheduled = len(coll.sync_schedule)
        for st in dirty:
            try:
                st.flush()
            except OSError as e:
                log.error("worker %d: %s", self.index, e)      # the file is named here, not to clients
                self.undo_replies(coll.rollback(st), describe_os_error(e, getattr(st, "name", None)))
                continue
            if coll.sync_schedule.written(st, now):      # sync "always": replies wait for it
                needs_sync.append(st)
        if len(coll.sync_schedule) > scheduled:         # a periodic fsync came due later
            self.deadlines_changed = True
        coll.undo.trim()
        if needs_sync or (self.sync_inflight and self.replies):
            self.held.extend(self.replies)
            self.replies = []
            if needs_sync and not self.sync_inflight:
                self.start_sync(needs_sync)
            elif needs_sync:
                self.sync_queue.extend(needs_sync)
        if self.replies:
            self.publish(self.replies)
            self.replies = []

    def start_sync(self, storages) -> None:
        """fsync every storage the held replies depend on, in parallel (the filesystem
        journal commits concurrent fsyncs together), off the loop's thread."""
        self.sync_inflight = True
        held, self.held = self.held, []
        self.sync_batch = held
        pool = self.fsync_pool()

        def sync_one(st):
            try:
                st.sync()
            except OSError as e:
                log.error("worker %d: fsync failed: %s", self.index, e)
                self.sync_failed.append((st, e))

        def work():
            if len(storages) == 1:
                sync_one(storages[0])
            else:
                for _ in pool.map(sync_one, storages):
                    pass
            os.write(self.sync_done_w, b"x")
        self.sync_coord.submit(work)

    def fsync_pool(self) -> ThreadPoolExecutor:
        """The threads that fsync (fsync releases the GIL): group commits and periodic syncs."""
        if self.sync_pool is None:
            self.sync_pool = ThreadPoolExecutor(8, thread_name_prefix="fsync")
            self.sync_coord = ThreadPoolExecutor(1, thread_name_prefix="group-commit")
        return self.sync_pool

    def on_sync_done(self) -> None:
        try:
            os.read(self.sync_done_r, 64)
        except BlockingIOError:
            return
        self.sync_inflight = False
        failed, self.sync_failed = self.sync_failed, []
        for st, e in failed:                # not durable: cut it off, undo it, tell the clients
            self.undo_replies(self.coll.rollback(st, unsynced=True),
                              describe_os_error(e, getattr(st, "name", None)))
        self.coll.undo.trim()
        self.publish(self.sync_batch)
        self.sync_batch = []
        more, self.sync_queue = self.sync_queue, []
        if more:
            self.start_sync(list(dict.fromkeys(more)))
        elif self.held:
            self.publish(self.held)
            self.held = []

    def publish(self, replies) -> None:
        touched = set()
        local = self.local_src
        for dst, head, payload in replies:
            if dst == local:
                self.front.deliver(head, payload)
                continue
            if dst in self.down_peers:
                continue
            send(self.outbound[dst], head, payload)
            touched.add(dst)
        for dst in touched:
            self.outbound[dst].publish()

    def undo_replies(self, undone, reason: str) -> None:
        """Changes were rolled back because their records were lost (queues/undo.py): make
        every reply that reported one an error (SERVER_ERROR; the connection closes, and is
        disconnected here as `reply` does), take undone open reads out of their sessions, and
        strand undone confirms and aborts (the item is reserved again; nobody holds it, so
        `run_timers` aborts it again later).  A thrift get keeps the items that were not
        undone and drops the others."""
        coll = self.coll
        failed = set()
        thrift: dict[Pending, set[int]] = {}
        for u in undone:
            ctx = u.ctx
            if u.kind == UNREMOVE or u.kind == CONFIRM:
                coll.strand(u.queue, u.xid)
            if ctx is None:
                continue
            if type(ctx) is Pending:
                thrift.setdefault(ctx, set()).add(id(u.item.data))
                continue
            failed.add(ctx)
            if u.kind == OPEN:
                sess = self.sessions.get(ctx[:2])
                if sess is not None:
                    sess.discard(u.queue, u.xid)
        for p, gone in thrift.items():
            self.tget_undo(p, gone)
        if coll.stranded and not self.next_strand_ms:
            self.next_strand_ms = self.clock.now_ms() + STRAND_RETRY_MS
            self.deadlines_changed = True
        if not failed:
            return
        for dst, conn in {key[:2] for key in failed}:
            if self.peers.is_front(dst):    # the error closes the connection, as reply() does
                self.disconnect(dst, conn)
                self.closed_conns.add((dst, conn))
        why = reason.encode("latin-1", "replace")
        seen: set = set()
        self.sync_batch = _fail_requests(self.sync_batch, failed, why, seen)
        self.held = _fail_requests(self.held, failed, why, seen)
        self.replies = _fail_requests(self.replies, failed, why, seen)

    def wait_for_sync(self) -> None:
        """Block until no group fsync is under way and no reply waits for one (shutdown)."""
        while self.sync_inflight or self.held:
            if not self.sync_inflight:
                self.finish_batch()
                if not self.sync_inflight:
                    self.publish(self.held)
                    self.held = []
                    return
            select.select([self.sync_done_r], [], [], 1.0)
            self.on_sync_done()


def _fail_requests(replies, failed: set, why: bytes, seen: set):
    """Replace the reply of every request in `failed` ((dst, conn, req) keys) by SERVER_ERROR
    with the connection closing, as Kestrel answers an availability failure; later replies
    of the same request (a monitor's) are dropped.  `seen` carries that across lists."""
    out = []
    for dst, head, payload in replies:
        conn, req = unpack_resp(head, 0)[:2]
        key = (dst, conn, req)
        if key in failed:
            if key in seen:
                continue
            seen.add(key)
            head = pack_resp(conn, req, R_SERVER_ERROR, RF_CLOSE, 0, 0)
            payload = why
        out.append((dst, head, payload))
    return out
