"""Group commit: what a worker does at the end of a turn with the replies it collected.

Replies leave only after the records they acknowledge reached the OS (one write per
dirty journal or segment per turn); replies that depend on an fsync (sync "always")
wait in a round while every file the round's batch wrote is fsynced at once (io_uring,
or threads: storage/syncer.py); rounds overlap, so the disk commits one round while the
loop serves the next batch.  A journal under "always" whose fsync is under way or held is
written once per round instead, just before its next fsync (Syncer.defer).

A journal with a megabyte or more to write (a flood of big items, sync not "always") is
written behind, by the worker's writer thread (storage/writer.py): only the replies of the
requests whose records are in it wait for that write (`write_held`, found through the undo
log), so the other queues' replies leave with their own batch.  A write or fsync that
fails is rolled back (queues/undo.py), and the replies of the requests it undid
become SERVER_ERROR, so what a client is told is what the queue holds.
"""
from __future__ import annotations

import logging
import os

from lanner.errors import describe_os_error
from lanner.fronts import rendered
from lanner.ipc.fdwait import wait_readable
from lanner.ipc.messages import (R_SERVER_ERROR, RF_CLOSE, SMALL_MESSAGE, pack_resp, resp_fields,
                                 send)
from lanner.queues.undo import CONFIRM, HELD_ABORT, HELD_CONFIRM, HELD_OPEN, OPEN, UNREMOVE
from lanner.server.waiting import STRAND_RETRY_MS, Pending
from lanner.storage.journal.journal import Journal

log = logging.getLogger(__name__)

#: fsync rounds under way at once; a batch beyond them waits in `held` for the next round.
MAX_ROUNDS = 4
#: Seconds after which a round's fsyncs still under way are logged (check_sync).
STALLED_SYNC_S = 5.0
#: Buffered bytes from which a journal's write goes to the writer thread, off the loop.
WRITE_BEHIND_BYTES = 1 << 20
#: Replies waiting for an fsync up to which the loop runs it itself (`sync_inline`): the case it
#: was measured for (10 connections); at 100 the interleaved pairs went both ways on a loaded box
#: (perf/README.md, stop 24), so bigger rounds keep the ring.
INLINE_MAX_REPLIES = 16


def medium_name(m) -> str:
    """A journal's queue name, a command log's partition directory."""
    return getattr(m, "name", None) or os.path.basename(m.dir)


class GroupCommit:
    """Worker methods; the attributes they use are set in Worker.__init__.

    Filled by Worker: replies, held, sync_queue, syncer (storage/syncer.py), coll, loop hooks.
    Replies of a batch that wrote records under sync "always" wait in an fsync round; rounds
    overlap (a new one starts while earlier ones are under way, up to MAX_ROUNDS) and finish in
    the order they started.  Other replies leave at once unless a round is under way, in which
    case they follow the latest round (a rollback may still have to turn them into errors).
    """
    __slots__ = ()              # the worker's (worker.py)

    def finish_batch(self) -> None:
        """Flush journals, then publish replies or hold them for a group fsync.  A storage
        that cannot write is rolled back, and the replies of what it undid become errors.
        A turn whose requests wrote nothing allocates nothing here."""
        coll = self.coll
        undo = coll.undo
        undo.ctx = None
        dirty = coll.dirty_storages()
        if self.writing:
            self.settle_writes()
        if self.settled:            # write-behinds done: the records that came in behind them
            dirty = self.take_settled(dirty)
        through = self.write_out(dirty) if dirty else None
        # (a batch that joins a round commits nothing now: the round's end trims, take_synced;
        # under "always" this turn's trim would walk every entry still waiting for the fsync)
        if undo.entries and not self.sync_queue:
            undo.trim(through)
        if self.writing or self.write_held:
            self.hold_unwritten()
        syncer = self.syncer
        rounds = syncer.rounds
        replies = self.replies
        needs_sync = self.sync_queue
        if replies or needs_sync:
            self.replies = []
            if needs_sync or self.held:
                self.held.extend(replies)
                self.start_sync()
            elif rounds:
                rounds[-1].replies.extend(replies)
            else:
                self.publish(replies)
        # An fsync returned during this turn: its replies go now.  Reaped after this batch's
        # round was started (or joined the one waiting), so the fsync that the reap starts for
        # the rounds that waited carries this batch too, instead of the one after it.
        if rounds and syncer.ready():
            self.on_synced()

    def write_out(self, dirty):
        """One write per dirty storage (or a write-behind for a big buffer); under sync
        "always" the storage joins the next fsync round, under a period its fsync is scheduled.
        Returns a journal of `dirty` whose records are all committed now (written here, its
        policy not "always"), or None: the undo log's trim need not ask it (UndoLog.trim)."""
        now = None
        through = None
        for st in dirty:
            try:
                # a journal: its next bytes go behind a write under way, and big buffers behind
                # the writer's thread; anything else (a cmdlog partition) is written at once
                if st.__class__ is Journal:
                    if st.sync_policy == "always" and self.syncer.defer(st):
                        self.sync_queue.append(st)      # written just before its next fsync
                        continue
                    if st.flush(self.writer, WRITE_BEHIND_BYTES):
                        self.writing.add(st)
                        continue
                    through = st
                else:
                    st.flush()
            except OSError as e:
                log.error("worker %d: %s", self.index, e)      # the file is named here, not to clients
                self.undo_replies(self.coll.rollback(st), describe_os_error(e, getattr(st, "name", None)))
                continue
            if st.sync_policy != "never":
                if now is None:
                    now = self.clock.now_ms()
                    schedule = self.coll.sync_schedule
                    scheduled = len(schedule)
                if schedule.written(st, now):      # sync "always": replies wait for it
                    self.sync_queue.append(st)
                    if through is st:
                        through = None
        if now is not None and len(schedule) > scheduled:     # a periodic fsync came due later
            self.deadlines_changed = True
        return through

    def settle_writes(self, block: bool = False) -> None:
        """Take the results of the write-behinds done so far (all of them, waiting, if `block`):
        a journal's marks move past each finished write of its chain; a failed one is rolled
        back like a failed flush.  A storage whose chain is done goes to `settled`: under a
        sync policy its bytes still need their fsync round, which the next batch's end starts;
        one whose chain goes on joins the next round at once under "always", for the replies
        its finished writes let go."""
        for st in list(self.writing):
            before = st.written_mark
            try:
                st.settle_write(block)
            except OSError as e:
                self.writing.discard(st)
                self.settled.append(st)
                log.error("worker %d: %s", self.index, e)
                self.undo_replies(self.coll.rollback(st), describe_os_error(e, getattr(st, "name", None)))
                continue
            if st.write_done:
                self.writing.discard(st)
                self.settled.append(st)
            elif st.written_mark != before and st.sync_policy == "always":
                self.sync_queue.append(st)      # replies it lets go (hold_unwritten) wait for that

    def take_settled(self, dirty) -> list:
        """`dirty` and the settled storages that hold records to write, each once."""
        settled, self.settled = self.settled, []
        out = list(dirty)
        for st in settled:
            if st.dirty and st not in out:
                out.append(st)
        return out

    def hold_unwritten(self) -> None:
        """Replies whose requests have records not yet written (a write under way, or chained
        behind one) wait in `write_held`; the others join this batch's replies."""
        keys = set()
        writing = self.writing
        for e in self.coll.undo.entries:
            if e[0] in writing and e[6] is not None and e[1] >= e[0].written_mark:
                ctx = e[6]
                keys.add((ctx.src, ctx.conn, ctx.req) if type(ctx) is Pending else ctx)
        waiting = self.write_held + self.replies
        self.write_held, self.replies = [], []
        for r in waiting:
            if r[2].__class__ is list:      # a connection's rendered replies: parted at the first
                go, wait = rendered.split(r, keys)      # that waits, as if carried one by one
                if go is not None:
                    self.replies.append(go)
                if wait is not None:
                    self.write_held.append(wait)
            elif (r[0], *resp_fields(r[1])[:2]) in keys:
                self.write_held.append(r)
            else:
                self.replies.append(r)

    @property
    def sync_inflight(self) -> bool:
        return bool(self.syncer.rounds)

    def start_sync(self) -> None:
        """The held replies join the round that still waits for the fsyncs of their storages
        (Syncer.join), or start a round of every storage they depend on, if there is room
        (MAX_ROUNDS; else they wait in `held` for a round to finish)."""
        syncer = self.syncer
        if syncer.join(self.sync_queue, self.held):
            self.sync_queue, self.held = [], []
        elif len(syncer) < MAX_ROUNDS:
            media, self.sync_queue = self.sync_queue, []
            held, self.held = self.held, []
            syncer.start(media, held, self.clock.monotonic())

    def check_sync(self, now: float) -> bool:
        """The heartbeat's look at the fsyncs: completions that came without waking the loop are
        taken (the kernel may hold them back with no eventfd signal: uring.py `_overflowed`), and
        a round still waiting after STALLED_SYNC_S is logged, once.  True if it took some: their
        replies go out at the end of the turn the caller schedules, as after a wake-up."""
        syncer = self.syncer
        # (an fsync left for the loop is run by the turn this schedules, if none did yet)
        took = bool(syncer.rounds) and (syncer.ready() or syncer.inline_due)
        if took:
            self.on_synced()
        r = syncer.stalled(now, STALLED_SYNC_S)
        if r is not None:
            names = ", ".join(sorted({medium_name(m) for m in r.media}))
            log.warning("worker %d: fsync of %s under way for %.1f s, %d replies wait for it (the disk or "
                        "the kernel has not completed it); %s", self.index, names, now - r.started,
                        len(r.replies), syncer.state(medium_name))
        return took

    def sync_inline(self) -> None:
        """Run the fsync the syncer left for the loop (Syncer.sync_inline) and write the replies
        it lets go, if every client of the worker waits for a round: none of them can send
        anything the loop would serve meanwhile (a one-queue durable load).  Otherwise it goes
        through the ring, and the loop serves the others during it.  The end of a turn calls
        it, after that turn's own replies were written (the syncer asked `every_client_waits`
        when it left the fsync; rounds finished since have been answered)."""
        if not self.every_client_waits():
            self.syncer.send_due()
            return
        self.syncer.sync_inline()
        self.on_synced()
        front = self.front
        if front is not None and front.write_pending:
            front.flush_writes()
        if self.syncer.inline_due:      # (one more round to sync: after a look at the sockets)
            self.schedule_turn()

    def every_client_waits(self) -> bool:
        """Do the rounds under way hold a reply for each of the worker's own connections, and
        no more than INLINE_MAX_REPLIES?  (A connection with several requests in them counts
        once for each: a client that pipelines may make it look so while another is idle; that
        one then waits one fsync.)  A worker without its own clients (dedicated fronts) cannot
        tell: no."""
        front = self.front
        if front is None:
            return False
        waiting = 0
        for r in self.syncer.rounds:
            waiting += len(r.replies)
        return len(front.conns) <= waiting <= INLINE_MAX_REPLIES

    def waiting_replies(self):
        """Every list of replies not yet published: the rounds', the held ones, this batch's."""
        for r in self.syncer.rounds:
            yield r.replies
        yield self.write_held
        yield self.held
        yield self.replies

    def on_sync_done(self) -> None:
        """The notify pipe (fsync threads, the writer) woke the loop."""
        try:
            os.read(self.sync_done_r, 4096)
        except BlockingIOError:
            pass
        self.on_synced()

    def on_synced(self) -> None:
        """fsyncs returned (the io_uring eventfd woke the loop, or the pipe): publish what they made
        durable and start the round that waited for a free slot."""
        self.take_synced()
        if self.held or self.sync_queue:
            self.start_sync()

    def take_synced(self) -> None:
        """Publish the replies of the rounds done, in order; a failed fsync's are made errors."""
        self.syncer.poll()
        taken = self.syncer.done_prefix()
        for i, r in enumerate(taken):
            for st, e in r.failed:          # not durable: cut it off, undo it, tell the clients
                # (rounds taken with this one are no longer the syncer's: their replies are failed
                # here too, or a later round's reply to a request this rollback undid would leave)
                self.undo_replies(self.coll.rollback(st, unsynced=True),
                                  describe_os_error(e, getattr(st, "name", None)),
                                  done=[x.replies for x in taken[i:]])
                self.syncer.clear(st)
            self.publish(r.replies)
        self.coll.undo.trim()

    def publish(self, replies) -> None:
        """Hand replies to the worker's own clients, or send them: one ring publish per peer."""
        local = self.local_src
        if local >= 0 and self.front.deliver(replies, local) == len(replies):
            return                          # every reply was the worker's own clients'
        self.send_replies(replies)

    def send_replies(self, replies) -> None:
        """The replies not to the worker's own clients (`publish` delivered those): one ring
        publish per peer."""
        local = self.local_src
        touched = None
        own = self.own_slot
        for dst, head, payload in replies:
            if dst == local:
                continue
            if dst in self.down_peers:
                continue
            if dst == own:                  # a move into this worker's own queue: written
                self.moved_here(head)
                continue
            if head.__class__ is tuple:     # (a fused-path reply's head is packed only for a ring)
                head = pack_resp(*head)
            if len(payload) < SMALL_MESSAGE:
                self.outbound[dst].send_parts(head, payload)     # messages.send's common case
            else:
                send(self.outbound[dst], head, payload)
            if touched is None:
                touched = {dst}
            else:
                touched.add(dst)
        if touched is not None:
            for dst in touched:
                self.outbound[dst].publish()

    def undo_replies(self, undone, reason: str, done: list[list] | None = None) -> None:
        """Changes were rolled back because their records were lost (queues/undo.py): make
        every reply that reported one an error (SERVER_ERROR; the connection closes, and is
        disconnected here as `reply` does), take undone open reads out of their sessions (and
        undone held reads out of their holds), and strand undone confirms and aborts (the item
        is reserved again; nobody holds it, so `run_timers` aborts it again later).  A thrift
        get keeps the items that were not undone and drops the others."""
        coll = self.coll
        failed = set()
        thrift: dict[Pending, set[int]] = {}
        for u in undone:
            ctx = u.ctx
            kind = u.kind
            if kind == UNREMOVE or kind == CONFIRM or kind == HELD_CONFIRM or kind == HELD_ABORT:
                coll.strand(u.queue, u.xid)
            elif kind == HELD_OPEN:
                self.forget_held(u.queue, u.xid)     # its reply fails below: nothing to settle
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
        if coll.stranded:
            if not self.next_strand_ms:
                self.next_strand_ms = self.clock.now_ms() + STRAND_RETRY_MS
            self.note_deadline(self.next_strand_ms)
        if not failed:
            return
        for dst, conn in {key[:2] for key in failed}:
            if self.peers.is_front(dst):    # the error closes the connection, as reply() does
                self.disconnect(dst, conn)
                self.closed_conns.add((dst, conn))
        why = reason.encode("latin-1", "replace")
        seen: set = set()
        for replies in done or ():
            _fail_requests(replies, failed, why, seen)
        for replies in self.waiting_replies():
            _fail_requests(replies, failed, why, seen)

    def wait_for_sync(self) -> None:
        """Block until no write or group fsync is under way and no reply waits for one
        (shutdown)."""
        while self.writing or self.write_held:      # (a batch may start one more write-behind)
            self.settle_writes(block=True)
            self.finish_batch()
        while self.syncer.rounds or self.held or self.sync_queue:
            if not self.syncer.rounds:
                self.start_sync()
            if self.syncer.inline_due:
                self.syncer.sync_inline()
                self.on_synced()
                continue
            if self.syncer.timer_due:   # (a gather begun here must be bounded before we block)
                self.syncer.arm_due()
            wait_readable([self.sync_done_r] + ([self.syncer.fd] if self.syncer.fd >= 0 else []), 1.0)
            self.on_sync_done()


def _fail_requests(replies: list, failed: set, why: bytes, seen: set) -> None:
    """Replace (in place) the reply of every request in `failed` ((dst, conn, req) keys) by
    SERVER_ERROR with the connection closing, as Kestrel answers an availability failure; later
    replies of the same request (a monitor's) are dropped.  `seen` carries that across lists.
    A connection's rendered replies (a list, fronts/rendered.py) are cut at the first failed
    one, which becomes that SERVER_ERROR (the list stays the reply, its head as it was)."""
    out = []
    for dst, head, payload in replies:
        conn, req = resp_fields(head)[:2]
        key = (dst, conn, req)
        if payload.__class__ is list:
            rendered.cut(payload, failed, dst, head, why)
        elif key in failed:
            if key in seen:
                continue
            seen.add(key)
            head = pack_resp(conn, req, R_SERVER_ERROR, RF_CLOSE, 0, 0)
            payload = why
        out.append((dst, head, payload))
    replies[:] = out
