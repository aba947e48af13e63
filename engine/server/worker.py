"""A shard worker: one event loop (uvloop, shardloop.py) that owns a shard of the queues.

The worker owns every queue whose partition maps to it (placement.py), with
their journals and command-log segments, the per-connection open reads of
every client that touched them (keyed by (front slot, connection)), and the
waiters of blocking gets and monitors, so fairness is FIFO per queue across all
fronts.  With worker_fronts (the default) it also serves clients itself
(local.py): requests for its own queues run inline, the rest go over the rings.

A turn (shardloop.py):
  1. requests arrive from the worker's own clients (inline, `local_request`) and
     from every inbound ring (one per front slot, one per other worker), and run
     against the QueueCollection, collecting replies;
  2. at the end of the turn: retry the waiters that adds and aborts woke; hand
     every dirty journal/segment's buffered records to the OS in one write each
     (so an acknowledged item survives `kill -9` of this process);
  3. replies that depend on an fsync (sync "always") are held while a helper
     thread fsyncs all of them at once (group commit); other replies are
     published now, one publish per ring, or handed to the worker's own clients.
     A write (or such an fsync) that fails is rolled back (queues/undo.py): every
     change whose record is lost is undone and the replies of the requests that
     made them become SERVER_ERROR, so what a client is told is what the queue holds;
  4. timers (waiter deadlines, the expiration timer, periodic sync) run from one
     loop timer armed at the earliest deadline; the heart beats on its own timer.
No busy spinning: idle, the worker blocks in epoll.
"""
from __future__ import annotations

import errno
import heapq
import logging
import struct
import os
import select
import signal
from concurrent.futures import ThreadPoolExecutor
from collections import defaultdict
from dataclasses import dataclass

import msgpack

from lanner.clock import SYSTEM_CLOCK
from lanner.config import ConfigError, config_items, reload_config
from lanner.errors import describe_os_error
from lanner.ipc import control
from lanner.ipc.bodies import Bodies
from lanner.ipc.mesh import Peers
from lanner.ipc.shm import IdBlocks, SharedCounter
from lanner.queues.collection import CloseError, QueueCollection
from lanner.ipc.messages import (F_ABORT, F_CLOSE, F_CONFIRM_ALL, F_NOREPLY, F_OPEN, F_PEEK, F_STREAM, F_THRIFT,
                       OP_ALIAS_PUT, OP_CONFIRM, OP_DELETE, OP_DISCONNECT, OP_DUMP_CONFIG, OP_FLUSH,
                       OP_FLUSH_ALL, OP_FLUSH_ALL_EXPIRED, OP_FLUSH_EXPIRED, OP_FORWARD_ADD, OP_GET,
                       OP_MONITOR, OP_PUT_MANY, OP_RELOAD, OP_SET, OP_SET_DATA, OP_STATS, OP_TABORT,
                       OP_TCONFIRM, OP_TGET, OP_TPEEK, OP_HANDOFF, R_CLIENT_ERROR, R_DATA, R_EMPTY, R_END,
                       R_ERROR,
                       R_ITEM, R_NOT_STORED, R_OK, R_SERVER_ERROR, R_VALUE, REQ_SIZE, RF_CLOSE, RF_MORE,
                       Reassembler, pack_req, pack_resp, send, unpack_req, unpack_resp)
from lanner.queues.placement import worker_of
from lanner.queues.sessions import Session
from lanner.storage.factory import StorageFactory
from lanner.storage.sync import sync_all
from lanner.queues.undo import CONFIRM, OPEN, UNREMOVE
from lanner.queues.waiters import Waiter
from lanner.server.exits import EXIT_BOOT_ERROR, EXIT_OK, EXIT_UNSAVED
from lanner.server.heartbeat import MAX_BEAT_INTERVAL
from lanner.server.local import attach_front
from lanner.server.shardloop import ShardLoop

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


class Worker(ShardLoop):
    def __init__(self, index: int, nworkers: int, config, status, inbound, outbound, wake_fd: int,
                 control_sock, cleaner_sock=None, clock=SYSTEM_CLOCK, nfronts: int = 1,
                 heart=None, ids: IdBlocks | None = None, peers: Peers | None = None):
        """inbound[src] / outbound[dst]: rings indexed by peer number (mesh.Peers; None for
        this worker's own slot).  `heart`: its heartbeat slot; `ids`: its supply of thrift
        read ids from the server-wide counter (a private counter when None)."""
        self.index = index
        self.nworkers = nworkers
        self.nfronts = nfronts
        self.peers = peers or Peers(nworkers, nfronts)     # nfronts: front slots
        self.front = None            # the LocalFront serving this worker's own clients (local.py)
        self.local_src = -1          # its front slot
        self.inbox = None            # sockets other workers hand over (ipc/handoff.py)
        self.loop = None
        self.turn_scheduled = False
        self.stop_scheduled = False
        self.stepping = False        # inside step(): an event ends the loop run (tests)
        self.timer = None
        self.timer_when = 0.0
        self.deadlines_changed = True     # a deadline may be earlier than the armed timer
        self.config = config
        self.status = status
        self.inbound = inbound
        self.outbound = outbound
        self.wake_fd = wake_fd
        self.control = control_sock
        self.cleaner = cleaner_sock
        self.clock = clock
        self.heart = heart
        self.beat_interval = heart.interval if heart is not None else MAX_BEAT_INTERVAL
        self.next_beat = 0.0
        self.ctl_reader = control.Reader(control_sock)
        self.cleaner_reader = control.Reader(cleaner_sock) if cleaner_sock is not None else None
        self.rings = [(src, r) for src, r in enumerate(inbound) if r is not None]
        self.in_rings = [r for _, r in self.rings]
        self.outs = [r for r in outbound if r is not None]
        self.asm = {src: Reassembler() for src, _ in self.rings}
        self.sessions: dict[tuple[int, int], Session] = {}
        self.pending_by_conn: dict[tuple[int, int], set[Pending]] = defaultdict(set)
        self.down_peers: set[int] = set()
        self.replies: list[tuple[int, bytes, bytes]] = []
        self.held: list[tuple[int, bytes, bytes]] = []
        self.sync_inflight = False
        self.sync_pool = self.sync_coord = None
        self.sync_batch: list = []       # replies waiting for the fsync under way
        self.sync_failed: list = []      # (storage, error) of the fsync round under way
        self.sync_queue: list = []       # storages dirtied since, for the next fsync round
        self.sync_done_r, self.sync_done_w = os.pipe()
        os.set_blocking(self.sync_done_r, False)
        self.stopping = False
        self.mot = config.server.max_open_transactions
        self.coll: QueueCollection | None = None
        self.next_expire_ms: int | None = None
        self.next_strand_ms = 0
        # thrift open reads: server-wide ids that outlive their connection (§3.3)
        self.tids: dict[int, tuple[str, int, tuple]] = {}     # id -> (queue, xid, owner key)
        self.tcounts: dict[tuple, int] = {}                   # (src, conn, queue) -> open reads
        self.tids_supply = ids if ids is not None else IdBlocks(SharedCounter.create())
        self.taborts: list[tuple[int, int]] = []              # heap of (deadline ms, id)
        self.bodies = Bodies()                                # streamed set bodies, in pieces
        self.closed_conns: set[tuple[int, int]] = set()       # told to close, DISCONNECT to come

    # -- start-up --------------------------------------------------------------------------------
    def owns(self, name: str) -> bool:
        return worker_of(name, self.nworkers) == self.index

    def boot(self) -> None:
        factory = StorageFactory(self.config, self.clock, self.index, self.nworkers, self.cleaner)
        self.coll = QueueCollection(self.config, self.clock, storage_factory=factory, owns=self.owns,
                                    expire_forward=self.forward_add, autoflush=False)
        self.storage_factory = factory
        factory.collection = self.coll

        def progress(name, i, n):
            log.info("worker %d: replaying queue %r (%d/%d)", self.index, name, i, n)
        self.coll.load(progress=progress)
        freq = self.config.server.expiration_timer_frequency
        if freq:
            self.next_expire_ms = self.clock.now_ms() + freq

    # -- the loop: run(), open_loop(), step() and turns are in shardloop.py -----------------------
    def beat(self, now: float) -> None:
        """Stamp the heartbeat and read the control socket, busy or not: a `peer_down`
        must be acknowledged promptly even under load (the supervisor waits for it before
        it starts the replacement)."""
        if self.heart is not None:
            self.heart.beat(now)
        self.next_beat = now + self.beat_interval
        self.poll_control()
        if self.cleaner_reader is not None:
            self.poll_cleaner()

    def poll_control(self) -> None:
        for msg in self.ctl_reader.read():
            self.on_control(msg)
        if self.ctl_reader.eof and not self.stopping:
            log.warning("worker %d: supervisor gone, exiting", self.index)
            self.request_stop()

    def poll_cleaner(self) -> None:
        for msg in self.cleaner_reader.read():
            self.on_cleaner(msg)

    def drain(self, rings) -> bool:
        busy = False
        for src, ring in rings:
            asm = self.asm[src]
            while True:
                batch = ring.read_batch()
                if not batch:
                    break
                busy = True
                if src in self.down_peers:
                    self.peer_back(src)
                for rec in batch:
                    msg = asm.feed(rec)
                    if msg is None:
                        continue
                    try:
                        self.handle(src, msg)
                    except OSError as e:   # a full disk, an I/O error: the log names the file
                        conn, req, _, _, qlen = unpack_req(msg, 0)[:5]
                        queue = bytes(msg[REQ_SIZE:REQ_SIZE + qlen]).decode("latin-1")
                        log.error("worker %d: queue %r: %s", self.index, queue, e)
                        self.reply(src, conn, req, R_SERVER_ERROR, RF_CLOSE, 0,
                                   describe_os_error(e, queue).encode("latin-1", "replace"))
                    except Exception:   # one bad request must not take the shard down
                        log.exception("worker %d: request from peer %d failed", self.index, src)
                        conn, req = unpack_req(msg, 0)[:2]
                        self.reply(src, conn, req, R_SERVER_ERROR, RF_CLOSE, 0, b"internal error")
                del batch
                ring.release()
        if self.coll.woken:
            self.retry_woken()
        return busy

    def next_timeout(self) -> float | None:
        deadlines = []
        d = self.coll.timers.next_deadline()
        if d is not None:
            deadlines.append(d)
        if self.next_expire_ms is not None:
            deadlines.append(self.next_expire_ms)
        d = self.coll.sync_schedule.next_deadline()
        if d is not None:
            deadlines.append(d)
        if self.coll.stranded:
            deadlines.append(self.next_strand_ms)
        if self.taborts:
            deadlines.append(self.taborts[0][0])
        deadlines.extend(self.storage_factory.next_deadlines())
        if not deadlines:
            return None
        return max(0.0, (min(deadlines) - self.clock.now_ms()) / 1000.0)

    # -- replies, batching, group commit ---------------------------------------------------------
    def reply(self, dst: int, conn: int, req: int, status: int, flags: int = 0, value: int = 0,
              payload: bytes = b"") -> None:
        self.replies.append((dst, pack_resp(conn, req, status, flags, 0, value), payload))
        if flags & RF_CLOSE and self.peers.is_front(dst):
            # The front will close this connection: roll its open reads back now, so a
            # client that reconnects through another front already finds them (§1.5).
            self.disconnect(dst, conn)
            self.closed_conns.add((dst, conn))

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

    # -- requests --------------------------------------------------------------------------------
    def handle(self, src: int, rec) -> None:
        conn, req, op, flags, qlen, a, b = unpack_req(rec, 0)
        if self.closed_conns and self.void_after_close(src, conn, op, flags):
            return
        queue = bytes(rec[REQ_SIZE:REQ_SIZE + qlen]).decode("latin-1")
        self.execute(src, conn, req, op, flags, queue, a, b, rec[REQ_SIZE + qlen:])

    def void_after_close(self, src: int, conn: int, op: int, flags: int) -> bool:
        """This worker told the connection to close; what its front sent before learning it
        is void (Kestrel never ran a command after the one that closed).  Its DISCONNECT
        ends that; so does a thrift call, which is only ever sent after the last reply."""
        if (src, conn) not in self.closed_conns:
            return False
        if op != OP_DISCONNECT and not flags & F_THRIFT:
            return True
        self.closed_conns.discard((src, conn))
        return False

    def execute(self, src: int, conn: int, req: int, op: int, flags: int, queue: str, a: int, b: int,
                payload) -> None:
        coll = self.coll
        coll.undo.ctx = (src, conn, req)    # whose reply a rolled-back change must fail
        if op == OP_SET:
            if flags & F_STREAM:             # the body follows in OP_SET_DATA pieces
                self.bodies.begin(src, conn, req, queue, a, b, flags)
                return
            ok = coll.add(queue, bytes(payload), a or None)
            if not flags & F_NOREPLY:
                self.reply(src, conn, req, R_OK if ok else R_NOT_STORED)
        elif op == OP_SET_DATA:
            whole = self.bodies.more(src, conn, req, payload)
            if whole is not None:
                queue, data, expiry, flags = whole
                ok = coll.add(queue, data, expiry or None)
                if not flags & F_NOREPLY:
                    self.reply(src, conn, req, R_OK if ok else R_NOT_STORED)
        elif op == OP_GET:
            self.op_get(src, conn, req, queue, flags, a)
        elif op == OP_MONITOR:
            sess = self.session(src, conn)
            if flags & F_CONFIRM_ALL:
                self.confirm_all(sess, queue)
            budget = b if b >= 0 else self.mot
            p = Pending(src, conn, req, queue, F_OPEN, monitor=True, budget=budget,
                        deadline_ms=self.clock.now_ms() + max(a, 0))
            self.monitor_step(p)
        elif op == OP_CONFIRM:
            sess = self.sessions.get((src, conn))
            xids = sess.pop_oldest_n(queue, a) if sess else None
            if xids is None:
                self.reply(src, conn, req, R_ERROR)
            else:
                for xid in xids:
                    coll.confirm_remove(queue, xid)
                self.reply(src, conn, req, R_OK, 0, a)
        elif op == OP_DISCONNECT:
            self.disconnect(src, conn, thrift=bool(flags & F_THRIFT))
        elif op == OP_DELETE:
            coll.delete(queue)
            if not flags & F_NOREPLY:
                self.reply(src, conn, req, R_OK)
        elif op == OP_FLUSH:
            coll.flush(queue)
            if not flags & F_NOREPLY:
                self.reply(src, conn, req, R_OK)
        elif op == OP_FLUSH_EXPIRED:
            self.reply(src, conn, req, R_VALUE, 0, coll.flush_expired(queue))
        elif op == OP_FLUSH_ALL:
            coll.flush_all()
            if not flags & F_NOREPLY:
                self.reply(src, conn, req, R_OK)
        elif op == OP_FLUSH_ALL_EXPIRED:
            self.reply(src, conn, req, R_VALUE, 0, coll.flush_all_expired())
        elif op == OP_STATS:
            names = msgpack.unpackb(bytes(payload)) if payload else None
            self.reply(src, conn, req, R_DATA, 0, 0, self.stats_payload(names))
        elif op == OP_DUMP_CONFIG:
            self.reply(src, conn, req, R_DATA, 0, 0, self.config_payload())
        elif op == OP_ALIAS_PUT:
            coll.count_alias_put(queue, a, b)
        elif op == OP_FORWARD_ADD:
            coll.add_forwarded(queue, bytes(payload), self.clock.now_ms())
        elif op == OP_RELOAD:
            err = self.reload()
            if err is None:
                self.reply(src, conn, req, R_OK)
            else:
                self.reply(src, conn, req, R_SERVER_ERROR, 0, 0, err.encode("latin-1", "replace"))
        elif op == OP_PUT_MANY:
            added = 0
            for data in msgpack.unpackb(bytes(payload)):
                if not coll.add(queue, data, a or None):
                    break
                added += 1
            self.reply(src, conn, req, R_VALUE, 0, added)
        elif op == OP_TGET:
            (auto_abort,) = struct.unpack_from("<q", payload, 0)
            p = Pending(src, conn, req, queue, F_OPEN if auto_abort > 0 else 0, budget=b,
                        deadline_ms=self.clock.now_ms() + a if a > 0 else None, thrift=True,
                        auto_abort=auto_abort, items=[])
            self.tget_step(p)
        elif op == OP_TCONFIRM or op == OP_TABORT:
            n = 0
            for tid in msgpack.unpackb(bytes(payload)):
                if self.settle_tid(tid, abort=op == OP_TABORT):
                    n += 1
            self.reply(src, conn, req, R_VALUE, 0, n)
        elif op == OP_HANDOFF:
            if self.front is None:
                self.reply(src, conn, req, R_ERROR)
            else:
                self.front.adopt(src, conn, req, flags, a, payload)
        elif op == OP_TPEEK:
            item = coll.peek(queue)
            st = dict(coll.queue_stats(queue) or ())
            info = [item.data if item is not None else None] + [
                int(st.get(k, 0)) for k in ("items", "bytes", "logsize", "age", "waiters",
                                            "open_transactions")]
            self.reply(src, conn, req, R_DATA, 0, 0, msgpack.packb(info))
        else:
            self.reply(src, conn, req, R_CLIENT_ERROR, RF_CLOSE, 0, b"unknown request")

    def holds(self, src: int, conn: int) -> bool:
        """Whether anything of connection (src, conn) lives here: open reads or a waiter."""
        key = (src, conn)
        sess = self.sessions.get(key)
        return bool(sess is not None and sess.all_open()) or key in self.pending_by_conn

    def move_session(self, old: tuple[int, int], new: tuple[int, int]) -> None:
        """A connection moved here (handoff): its open reads follow it to its new key."""
        sess = self.sessions.pop(old, None)
        if sess is not None:
            sess.key = new
            self.sessions[new] = sess

    def session(self, src: int, conn: int) -> Session:
        key = (src, conn)
        sess = self.sessions.get(key)
        if sess is None:
            sess = self.sessions[key] = Session(key)
        return sess

    def confirm_all(self, sess: Session, queue: str) -> None:
        n = sess.open_count(queue)
        if n:
            for xid in sess.pop_oldest_n(queue, n):
                self.coll.confirm_remove(queue, xid)

    def op_get(self, src, conn, req, queue, flags, timeout) -> None:
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
        p = Pending(src, conn, req, queue, flags)
        if self.try_fetch(p):
            return
        if timeout > 0:
            p.deadline_ms = self.clock.now_ms() + timeout
            self.park(p)
        else:
            self.reply(src, conn, req, R_EMPTY)

    def try_fetch(self, p: Pending) -> bool:
        """One attempt at the queue for a GET (or one monitor iteration); replies on success."""
        self.coll.undo.ctx = (p.src, p.conn, p.req)
        if p.flags & F_PEEK:
            item = self.coll.peek(p.queue)
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
            self.deadlines_changed = True

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

    def disconnect(self, src: int, conn: int, thrift: bool = False) -> None:
        self.coll.undo.ctx = None           # the aborts below are nobody's reply
        self.bodies.drop(src, conn)
        for p in self.pending_by_conn.pop((src, conn), ()):
            p.done = True
            if p.waiter is not None:
                self.coll.cancel_wait(p.waiter)
            if p.thrift and p.items:
                self.tget_finish(p, reply=False)     # its items stay open until auto-abort
        if thrift:
            # thrift open reads outlive the connection; only its per-queue counts go (§3.3)
            for key in [k for k in self.tcounts if k[0] == src and k[1] == conn]:
                del self.tcounts[key]
            return
        sess = self.sessions.pop((src, conn), None)
        if sess is not None:
            self.coll.abort_session(sess)

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
            self.deadlines_changed = True
        if reply:
            self.reply(p.src, p.conn, p.req, R_DATA, 0, 0, msgpack.packb(p.items))

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
            for replies in (self.sync_batch, self.held, self.replies):
                for i, (dst, head, payload) in enumerate(replies):
                    conn, req = unpack_resp(head, 0)[:2]
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
            self.fsync_pool().submit(sync_all, due)
        self.storage_factory.tick(now)
        if self.coll.stranded and now >= self.next_strand_ms:
            n = sum(len(x) for x in self.coll.stranded.values())
            log.info("worker %d: aborting %d open reads whose abort could not be written before",
                     self.index, n)
            self.coll.abort_stranded()
            self.next_strand_ms = now + STRAND_RETRY_MS
        if self.coll.woken:
            self.retry_woken()

    # -- cross-shard -----------------------------------------------------------------------------
    def forward_add(self, target: str, data: bytes, now_ms: int) -> None:
        """expire_to_queue into a queue another worker owns."""
        dst = self.peers.of_worker(worker_of(target, self.nworkers))
        ring = self.outbound[dst]
        if ring is None or dst in self.down_peers:
            log.error("worker %d: cannot move an expired item to %r: its worker is down",
                      self.index, target)
            return
        q = target.encode("latin-1")
        send(ring, pack_req(0, 0, OP_FORWARD_ADD, 0, len(q), 0, 0) + q, data)
        ring.publish()

    # -- stats, config ---------------------------------------------------------------------------
    def stats_payload(self, names) -> bytes:
        coll = self.coll
        aliases = self.config.aliases
        out_queues = []
        wanted = names if names is not None else coll.names()
        for name in wanted:
            if name in aliases and self.owns(name):
                out_queues.append((name, coll.alias_stats(name)))
                continue
            st = coll.queue_stats(name)
            out_queues.append((name, st))
        if names is None:
            for name in aliases:
                if self.owns(name):
                    out_queues.append((name, coll.alias_stats(name)))
        return msgpack.packb({"global": coll.stats(), "queues": out_queues})

    def config_payload(self) -> bytes:
        entries = [(name, config_items(self.coll.queue(name, create=False).config))
                   for name in self.coll.names()]
        return msgpack.packb(entries)

    def reload(self) -> str | None:
        """Re-read the config; on failure keep the old one and return why (no file path)."""
        try:
            self.config = reload_config(self.config)
        except ConfigError as e:
            log.error("worker %d: reload failed: %s", self.index, e)
            return e.brief
        self.coll.reload(self.config)
        if self.front is not None:
            self.front.config = self.config
            self.front.valid_names.clear()
        log.info("worker %d: configuration reloaded", self.index)
        return None

    # -- supervisor and cleaner messages ---------------------------------------------------------
    def on_control(self, msg) -> None:
        cmd = msg.get("cmd")
        if cmd == "peer_down":
            peer = msg["peer"]
            for p in self.peer_slots(peer):
                self.peer_down(p)
            if self.front is not None and not self.peers.is_front(peer):
                self.front.worker_down(peer - self.nfronts)
            control.send(self.control, {"cmd": "ack_down", "peer": peer, "worker": self.index})
        elif cmd == "peer_up":
            for p in self.peer_slots(msg["peer"]):
                self.down_peers.discard(p)
            if self.front is not None and not self.peers.is_front(msg["peer"]):
                self.front.down_workers.discard(msg["peer"] - self.nfronts)
        elif cmd == "reload":
            self.reload()
        elif cmd == "stop":
            self.request_stop()

    def peer_slots(self, peer: int) -> list[int]:
        """The peers a process that went down or came up stands for: a worker that serves
        clients is also a front slot (its clients' open reads live here too)."""
        if self.front is not None and not self.peers.is_front(peer):
            return [peer, self.peers.of_embedded(peer - self.nfronts)]
        return [peer]

    def peer_down(self, peer: int) -> None:
        """A front or worker died: whatever it left unread in our rings is void (a
        half-sent large message included), its connections' open reads roll back, and
        nothing more is sent to it until its replacement shows up.  Acknowledged at once
        (on_control): the supervisor starts the replacement only after every peer has, so
        everything in our rings after this point comes from the replacement (ring.py,
        "Crashed peers")."""
        self.down_peers.add(peer)
        ring = self.inbound[peer]
        if ring is not None:
            ring.resync_consumer(discard=True)
            self.asm[peer].reset()
            self.bodies.drop(peer)
        out = self.outbound[peer]
        if out is not None:
            out.drop_backlog()
        if not self.peers.is_front(peer) and self.inbox is not None:
            self.inbox.drop_from(peer - self.nfronts)    # sockets it sent and never claimed
        if self.peers.is_front(peer):
            self.closed_conns = {k for k in self.closed_conns if k[0] != peer}
            for key in [k for k in self.sessions if k[0] == peer]:
                self.disconnect(*key)
            for key in [k for k in self.pending_by_conn if k[0] == peer]:
                self.disconnect(*key)
            self.held = [r for r in self.held if r[0] != peer]
            self.replies = [r for r in self.replies if r[0] != peer]
            if self.sync_inflight:
                self.sync_batch = [r for r in self.sync_batch if r[0] != peer]

    def peer_back(self, peer: int) -> None:
        """A record from a peer we marked down: its replacement is running (it may send
        before its `peer_up` reaches us, and must then get its replies)."""
        self.down_peers.discard(peer)
        log.info("worker %d: peer %d is back", self.index, peer)

    def on_cleaner(self, msg) -> None:
        self.storage_factory.on_cleaner_reply(msg)

    def shutdown(self) -> int:
        """Write and fsync what is left, retry stranded aborts once, close every storage.
        Returns EXIT_UNSAVED, having logged each queue and what it left, if the disk could
        not be brought to the state in memory."""
        log.info("worker %d: shutting down", self.index)
        coll = self.coll
        failures = []
        try:
            self.finish_batch()
            self.wait_for_sync()
            if coll.stranded:
                coll.abort_stranded()
                self.finish_batch()
                self.wait_for_sync()
            if self.front is not None:
                self.front.flush_writes()
                self.front.flush_rings()
                for c in list(self.front.conns.values()):
                    if c.transport is not None:
                        c.transport.abort()
        finally:
            try:
                coll.close()
            except CloseError as e:
                failures = e.failures
        for name, e in failures:
            log.error("worker %d: queue %r could not be flushed and synced at shutdown (%s): what "
                      "it acknowledged last may not be on disk", self.index, name, e)
        for name, xids in coll.stranded.items():
            log.error("worker %d: queue %r: %d open reads could not be returned to the queue (their "
                      "abort could not be written); the journal still holds them open, so they come "
                      "back when the server starts again", self.index, name, len(xids))
        if failures or coll.stranded:
            return EXIT_UNSAVED
        log.info("worker %d: everything written", self.index)
        return EXIT_OK


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


def worker_main(index, peers, config, status, inbound, outbound, wake_fd, control_sock,
                cleaner_sock, heart=None, ids=None, front=None) -> int:
    """Entry point in the forked child.  `front`: (slot, request rings, response rings, wake fd,
    listeners, counters, started_at, handoff channels) when this worker serves clients too."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    w = Worker(index, peers.workers, config, status, inbound, outbound, wake_fd, control_sock,
               cleaner_sock, nfronts=peers.slots, heart=heart, ids=ids, peers=peers)
    signal.signal(signal.SIGTERM, lambda *_: setattr(w, "stopping", True) or _poke(wake_fd))
    signal.signal(signal.SIGHUP, signal.SIG_IGN)   # reload arrives as a control message
    try:
        w.boot()
    except Exception as e:
        log.error("worker %d: start-up failed: %s", index, e)
        control.send(control_sock, {"cmd": "boot_failed", "worker": index, "reason": str(e)})
        return EXIT_BOOT_ERROR
    if front is not None:
        attach_front(w, front, control_sock)
    control.send(control_sock, {"cmd": "ready", "worker": index})
    return w.run()


def _poke(fd: int) -> None:
    try:
        os.eventfd_write(fd, 1)
    except OSError as e:
        if e.errno != errno.EAGAIN:
            raise
