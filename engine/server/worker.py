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
     (so an acknowledged item survives `kill -9` of this process); a journal
     write of a megabyte or more goes to the writer thread instead, and only the
     replies whose records it carries wait for it (commit.py, storage/writer.py);
  3. replies that depend on an fsync (sync "always") are held in a round while
     all of its files are fdatasynced at once through io_uring (group commit;
     rounds overlap, storage/syncer.py); other replies are
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
import logging
import struct
import os
import signal
from collections import defaultdict

import msgpack

from lanner.clock import SYSTEM_CLOCK
from lanner.fronts.conn import WorkerBase, expiry_at
from lanner.ipc import control
from lanner.ipc.bodies import Bodies
from lanner.ipc.mesh import Peers
from lanner.ipc.shm import ConfigEpoch, IdBlocks, SharedCounter
from lanner.queues.collection import CloseError, QueueCollection
from lanner.ipc.messages import (F_AFTER_BODY, F_CONFIRM_ALL, F_NOREPLY, F_OPEN, F_STREAM, F_THRIFT,
                       OP_ALIAS_PUT, OP_CONFIRM, OP_DELETE, OP_DISCONNECT, OP_DUMP_CONFIG, OP_FLUSH,
                       OP_FLUSH_ALL, OP_FLUSH_ALL_EXPIRED, OP_FLUSH_EXPIRED, OP_FORWARD_ADD, OP_GET,
                       OP_HELD, OP_MONITOR, OP_PUT_MANY, OP_RELOAD, OP_SET, OP_SET_DATA, OP_STATS, OP_TABORT,
                       OP_TCONFIRM, OP_TGET, OP_TPEEK, OP_HANDOFF, R_CLIENT_ERROR, R_DATA, R_EMPTY, R_ERROR, R_ITEM,
                       R_NOT_STORED, R_OK, R_SERVER_ERROR, R_VALUE, REQ_SIZE, RF_CLOSE, FRAG_SIZE, Reassembler,
                       pack_resp, unpack_req)
from lanner.queues.placement import worker_of
from lanner.queues.sessions import Session
from lanner.storage.factory import StorageFactory
from lanner.storage.syncer import Syncer
from lanner.storage.uring import open_uring
from lanner.storage.writer import Writer
from lanner.server.exits import EXIT_BOOT_ERROR, EXIT_OK, EXIT_UNSAVED
from lanner.server.heaptrim import HeapTrim
from lanner.server.heartbeat import MAX_BEAT_INTERVAL
from lanner.server.holding import Holding, Holds
from lanner.server.inline import InlineOps
from lanner.server.local import attach_front
from lanner.server.opencounts import OpenReadCounts
from lanner.server.commit import GroupCommit
from lanner.server.moves import Moves, MoveOps
from lanner.server.peers import PeerOps
from lanner.server.shardloop import NO_DEADLINE, TURN_READS, ShardLoop
from lanner.server import statsjob
from lanner.server.waiting import Pending, Waiting

log = logging.getLogger(__name__)


class Worker(WorkerBase, GroupCommit, Waiting, Holding, PeerOps, ShardLoop, MoveOps):
    """A shard's queues and everything that touches them; the mixins hold the turn's end
    (commit.py), waiting requests (waiting.py) and peer/control duties (peers.py)."""
    # Slots, not a dict: what the fused path reads per request stays specialised lookups whatever
    # names the process sets (test_hot_layout.py); "handled", "sleep_rings": shardloop.py's;
    # "inline_set", "inline_get" (the fused set and get, InlineOps' bound methods, boot) and
    # what else a connection reads per request: WorkerBase's (fronts/conn.py).
    __slots__ = ("index", "nworkers", "nfronts", "peers", "front", "local_src", "inbox", "loop",
                 "stop_scheduled", "stopping", "stepping", "timer", "timer_ms", "deadlines_changed",
                 "config", "epoch", "_own_epoch", "status", "inbound",
                 "outbound", "wake_fd", "control", "cleaner", "clock", "heart", "beat_interval", "next_beat",
                 "heap_trim", "ctl_reader", "cleaner_reader", "rings", "worker_rings", "worker_srcs",
                 "in_rings", "outs", "asm", "sessions", "pending_by_conn", "down_peers", "moves", "own_slot",
                 "void_moves", "moves_voided", "holding", "stats_jobs", "held", "sync_queue",
                 "sync_done_r", "sync_done_w", "syncer", "writer", "writing", "settled", "write_held", "mot",
                 "coll", "storage_factory", "next_expire_ms", "next_strand_ms", "tids", "tcounts",
                 "tids_supply", "taborts", "bodies", "handled", "sleep_rings")

    def __init__(self, index: int, nworkers: int, config, status, inbound, outbound, wake_fd: int,
                 control_sock, cleaner_sock=None, clock=SYSTEM_CLOCK, nfronts: int = 1,
                 heart=None, ids: IdBlocks | None = None, peers: Peers | None = None,
                 epoch: ConfigEpoch | None = None):
        """inbound[src] / outbound[dst]: rings indexed by peer number (mesh.Peers; None for
        this worker's own slot).  `heart`: its heartbeat slot; `ids`: its supply of thrift
        read ids from the server-wide counter (a private counter when None)."""
        self.index, self.nworkers, self.nfronts = index, nworkers, nfronts
        self.peers = peers or Peers(nworkers, nfronts)     # nfronts: front slots
        self.front = None            # the LocalFront serving this worker's own clients (local.py)
        self.local_src = -1          # its front slot
        self.inbox = None            # sockets other workers hand over (ipc/handoff.py)
        self.loop = None
        self.turn_scheduled = self.stop_scheduled = self.stopping = False
        self.reads_left = TURN_READS     # connections this iteration may still read into its batch
        self.stepping = False        # inside step(): an event ends the loop run (tests)
        self.timer, self.timer_ms = None, NO_DEADLINE       # epoch ms the armed timer is for
        self.deadlines_changed = True     # a deadline may be earlier than the armed timer
        self.config = config
        self.epoch = epoch if epoch is not None else ConfigEpoch()    # generation of `config`
        self._own_epoch = epoch is None       # made here (tests, the rig): `release` closes it
        self.status, self.inbound, self.outbound, self.wake_fd = status, inbound, outbound, wake_fd
        self.control, self.cleaner, self.clock, self.heart = control_sock, cleaner_sock, clock, heart
        self.beat_interval = heart.interval if heart is not None else MAX_BEAT_INTERVAL
        self.next_beat = 0.0
        self.heap_trim = HeapTrim()      # a drained backlog's heap goes back to the OS (heaptrim.py)
        self.ctl_reader = control.Reader(control_sock)
        self.cleaner_reader = control.Reader(cleaner_sock) if cleaner_sock is not None else None
        self.rings = [(src, r) for src, r in enumerate(inbound) if r is not None]
        # Other workers' rings: what they send (expire_to_queue moves) goes before any front's
        # request read after it, so a client that saw the move's cause sees the move (drain).
        self.worker_rings = [(src, r) for src, r in self.rings if not self.peers.is_front(src)]
        self.worker_srcs = frozenset(src for src, _ in self.worker_rings)   # their acks: from_worker
        self.in_rings = [r for _, r in self.rings]
        self.outs = [r for r in outbound if r is not None]
        self.asm = {src: Reassembler() for src, _ in self.rings}
        self.sessions: dict[tuple[int, int], Session] = {}
        self.pending_by_conn: dict[tuple[int, int], set[Pending]] = defaultdict(set)
        self.down_peers: set[int] = set()
        self.moves = Moves()              # expire_to_queue moves, until their target acked them
        self.own_slot = self.peers.of_worker(index)     # whom a move into this worker's queue acks
        self.void_moves: set[int] = set()     # workers whose held moves are dropped (moves.py)
        self.moves_voided = 0
        self.holding = Holds()            # plain reads other processes answer, until written (holding.py)
        self.stats_jobs: set = set()          # stats answers being built in slices (statsjob.py)
        self.replies, self.held = [], []        # list[tuple[int, bytes, bytes]] each
        self.sync_queue: list = []       # storages written since the last round, for the next one
        self.sync_done_r, self.sync_done_w = os.pipe()
        os.set_blocking(self.sync_done_r, False)
        # fsync rounds (commit.py); the loop runs a lone round's fsync itself (end_turn)
        self.syncer = Syncer(self.sync_done_w, uring=open_uring(), inline=self.every_client_waits)
        self.writer = Writer(self.sync_done_w)      # write-behind of big journal writes (commit.py)
        self.writing: set = set()                   # journals with a write-behind under way
        self.settled: list = []                     # journals whose write-behind was just taken
        self.write_held: list = []                  # replies whose records it is writing
        self.mot = config.server.max_open_transactions
        self.coll: QueueCollection | None = None
        self.next_expire_ms, self.next_strand_ms = None, 0       # int | None, int
        # thrift open reads: server-wide ids that outlive their connection (§3.3)
        self.tids: dict[int, tuple[str, int, tuple]] = {}     # id -> (queue, xid, owner key)
        self.tcounts = OpenReadCounts()                       # (src, conn, queue) -> open reads
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
        factory.on_deadline = self.note_deadline
        fused = InlineOps(self, self.coll)      # the fused local path's set and get (inline.py)
        self.inline_set, self.inline_get = fused.inline_set, fused.inline_get

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
        self.heap_trim.maybe(now)
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
        worker_rings = self.worker_rings
        for src, ring in rings:
            asm = self.asm[src]
            from_front = src not in self.worker_srcs
            handle = self.handle if from_front else self.from_worker
            while True:
                batch = ring.read_batch()
                if not batch:
                    break
                busy = True
                if src in self.down_peers:
                    self.peer_back(src)
                if from_front and worker_rings and rings is not worker_rings:
                    # A worker's message published before this batch was read (e.g. the move of
                    # an expired item whose source a client has just seen empty) goes first.
                    # Only before a front's batch: before a worker's, it would read on in that
                    # ring and release it, freeing this batch's records for its producer to
                    # overwrite before they ran (a restarted worker's first moves never arrived).
                    self.drain(worker_rings)
                for rec in batch:
                    # a whole small message is the record itself: no call (messages.Reassembler)
                    msg = rec if asm.partial is None and len(rec) != FRAG_SIZE else asm.feed(rec)
                    if msg is None:
                        continue
                    try:
                        handle(src, msg)
                    except Exception as e:   # one bad request must not take the shard down
                        conn, req, _, _, qlen = unpack_req(msg, 0)[:5]
                        self.request_failed(src, conn, req, bytes(msg[REQ_SIZE:REQ_SIZE + qlen]), e)
                del batch
                ring.release()
        if self.coll.woken:
            self.retry_woken()
        return busy

    def next_deadline_ms(self) -> int | None:
        """The earliest epoch ms anything is due: waiters, the expiration timer, periodic
        syncs, stranded aborts, thrift auto-aborts, the storage's own deadlines."""
        coll = self.coll
        best = coll.timers.next_deadline()
        for d in (self.next_expire_ms, coll.sync_schedule.next_deadline(), self.moves.retry_ms or None,
                  self.next_strand_ms if coll.stranded else None,
                  self.taborts[0][0] if self.taborts else None,
                  *self.storage_factory.next_deadlines()):
            if d is not None and (best is None or d < best):
                best = d
        return best

    # -- replies, batching, group commit ---------------------------------------------------------
    def reply(self, dst: int, conn: int, req: int, status: int, flags: int = 0, value: int = 0,
              payload: bytes = b"") -> None:
        self.replies.append((dst, pack_resp(conn, req, status, flags, 0, value), payload))
        if flags & RF_CLOSE and self.peers.is_front(dst):
            # The front will close this connection: roll its open reads back now, so a
            # client that reconnects through another front already finds them (§1.5).
            self.disconnect(dst, conn)
            self.closed_conns.add((dst, conn))

    # -- requests --------------------------------------------------------------------------------
    def handle(self, src: int, rec) -> None:
        """One request from a ring.  A plain set or get, most of what arrives, runs here as
        `execute` would run it, without that call and its walk down the ops (issue 8, the routed
        request)."""
        conn, req, op, flags, qlen, a, b = unpack_req(rec, 0)
        if self.closed_conns and self.void_after_close(src, conn, op, flags):
            return
        end = REQ_SIZE + qlen
        queue = str(rec[REQ_SIZE:end], "latin-1")
        if not flags:
            if op == OP_SET:
                coll = self.coll
                coll.undo.ctx = (src, conn, req)    # whose reply a rolled-back change must fail
                ok = coll.add(queue, bytes(rec[end:]), a or None)
                self.replies.append((src, pack_resp(conn, req, R_OK if ok else R_NOT_STORED, 0, 0, 0), b""))
                return
            if op == OP_GET and a <= 0:
                self.plain_get(src, conn, req, queue)
                return
        self.execute(src, conn, req, op, flags, queue, a, b, rec[end:])

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
                if flags & F_AFTER_BODY:     # a relative exptime: from now, the body's end (§5.2)
                    expiry = expiry_at(self.clock.now_ms() + expiry)
                ok = coll.add(queue, data, expiry or None)
                if not flags & F_NOREPLY:
                    self.reply(src, conn, req, R_OK if ok else R_NOT_STORED)
        elif op == OP_GET:
            self.op_get(src, conn, req, queue, flags, a)
        elif op == OP_HELD:
            self.settle_holds(src, a, payload)
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
            if payload:
                self.reply(src, conn, req, R_DATA, 0, 0, self.stats_payload(msgpack.unpackb(bytes(payload))))
            else:
                statsjob.answer(self, src, conn, req)     # in slices when there are many queues
        elif op == OP_DUMP_CONFIG:
            self.reply(src, conn, req, R_DATA, 0, 0, self.config_payload())
        elif op == OP_ALIAS_PUT:
            coll.count_alias_put(queue, a, b)
        elif op == OP_FORWARD_ADD:
            self.add_move(src, req, queue, bytes(payload))
        elif op == OP_RELOAD:
            err = self.reload()
            if err is None:
                self.reply(src, conn, req, R_OK)
            else:
                self.reply(src, conn, req, R_SERVER_ERROR, 0, 0, err.encode("latin-1", "replace"))
        elif op == OP_PUT_MANY:
            added = 0
            for data in msgpack.unpackb(bytes(payload)):
                if type(data) is int:   # an item's size: the front dropped its bytes, over every
                    coll.queue(queue)   # limit (fronts/putbound.py): refused as the add would
                    break               # refuse it, after creating the queue as the add would
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
            self.tcounts.drop_conn(src, conn)
            return
        sess = self.sessions.pop((src, conn), None)
        if sess is not None:
            self.coll.abort_session(sess)

    def shutdown(self) -> int:
        """Write and fsync what is left, retry stranded aborts once, close every storage.
        Returns EXIT_UNSAVED, having logged each queue and what it left, if the disk could
        not be brought to the state in memory."""
        log.info("worker %d: shutting down", self.index)
        coll = self.coll
        failures = []
        try:
            self.settle_writes(block=True)
            if self.worker_rings:
                # acks of our moves that came in: their confirms go into the last batch (a move
                # still unacknowledged stays open in its source's journal: moves.py); moves
                # that journal holds are left to it (we could not acknowledge them now)
                self.void_moves = set(self.worker_srcs)
                self.drain(self.worker_rings)
            self.finish_batch()
            self.wait_for_sync()
            if coll.stranded:
                coll.abort_stranded()
                self.finish_batch()
                self.wait_for_sync()
            if self.status.blocks_writes():       # ReadOnly or Quiescent in force (§5.11)
                coll.rewrite_empty_journals()
            if self.front is not None:
                self.front.flush_writes()
                self.front.flush_rings()
                for c in list(self.front.conns.values()):
                    if c.transport is not None:
                        c.transport.abort()
        finally:
            self.syncer.close()
            self.writer.close()
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
        held = self.moves.held()
        only_here = self.moves.pending() - held
        if held:
            log.info("worker %d: %d expired items moving to queues of other workers were not "
                     "acknowledged yet; their queues' journals hold them, and they move again "
                     "after the next start", self.index, held)
        if only_here:
            log.error("worker %d: %d expired items moving to queues of this worker after a failed "
                      "write were not moved again; they may be lost", self.index, only_here)
        if failures or coll.stranded:
            return EXIT_UNSAVED
        log.info("worker %d: everything written", self.index)
        return EXIT_OK

    def release(self) -> None:
        """Close what the worker opened besides its storages (after shutdown).  A worker process
        exits instead; tests and the benchmark rig make hundreds in one process, where leaked
        descriptors pile up past select's 1024."""
        self.syncer.close()
        self.writer.close()
        loop = getattr(self, "loop", None)
        if loop is not None and not loop.is_closed():
            loop.close()
        for fd in (self.sync_done_r, self.sync_done_w):
            try:
                os.close(fd)
            except OSError:     # closed already
                pass
        self.control.close()
        if self._own_epoch:
            self.epoch.counter.close()


def worker_main(index, peers, config, status, inbound, outbound, wake_fd, control_sock,
                cleaner_sock, heart=None, ids=None, front=None, epoch=None) -> int:
    """Entry point in the forked child.  `front`: (slot, request rings, response rings, wake fd,
    listeners, counters, started_at, handoff channels) when this worker serves clients too."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    w = Worker(index, peers.workers, config, status, inbound, outbound, wake_fd, control_sock,
               cleaner_sock, nfronts=peers.slots, heart=heart, ids=ids, peers=peers, epoch=epoch)
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
