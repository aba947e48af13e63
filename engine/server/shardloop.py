"""The worker's event loop: one uvloop loop per worker, turns, timers, the heartbeat.

A turn is one loop iteration that did something: requests came in from the
worker's own clients (inline, `local_request`) or from the rings (the shared
wake eventfd fired, `pump`); `end_turn`, scheduled once per iteration with
call_soon, then finishes the batch (waiters woken by the turn's adds, one write
per dirty journal, replies published or held for the group fsync), writes the
worker's own clients' replies and re-arms the one timer at the earliest deadline
(waiters, expiration, periodic syncs, the cleaner's packs).  Requests that run
in the same iteration share a batch, so the journal write and the fsync are per
batch, never per request (a worker with one connection ends its turn as that connection's
read returns, by `end_quiet_turn`); an iteration that reads more than TURN_READS connections
ends a batch after every TURN_READS of them (`cut_turn`), while they are still in
the caches.

Why uvloop and not a plain epoll loop: the worker runs the front's connection
classes (asyncio Protocols) for its own clients; one loop per process means
one wakeup per event, whatever it is for.

`open_loop` + `step(wait)` drive the same loop one turn at a time, with the
injected clock deciding when the heart beats (tests/engine/test_worker_loop.py);
`run` is the server's: open, serve the listeners, loop until stopped.
"""
from __future__ import annotations

import asyncio
import logging
import signal

import uvloop

from lanner.errors import describe_os_error
from lanner.fronts.front import serve_listeners
from lanner.ipc.messages import R_SERVER_ERROR, RF_CLOSE
from lanner.ipc.wake import clear_sleep_all, drain_eventfd, prepare_sleep_all

log = logging.getLogger("lanner.server.worker")

NO_DEADLINE = float("inf")      # `timer_ms` while no timer is armed

#: Connections a loop iteration reads before it finishes their batch there and then
#: (`cut_turn`), then reads on.  A batch of a thousand ready connections touched each one's
#: objects, buffers and socket twice, a thousand connections apart (read, then reply), by which
#: time they had left the CPU's caches (512 KiB of L2 here); 64 connections' worth stays in
#: them, and one journal write per 64 requests costs next to nothing (issue 8, 100 -> 1000).
TURN_READS = 64


class ShardLoop:
    """The loop half of `Worker` (worker.py): what runs when, not what a request does."""

    __slots__ = ()              # the worker's (worker.py)

    def open_loop(self) -> None:
        """The loop and what it waits on: the wake eventfd (rings, and the own front's
        response rings), the control and cleaner sockets, the group-commit pipe and io_uring
        eventfd, the handoff socket."""
        loop = self.loop = uvloop.new_event_loop()
        asyncio.set_event_loop(loop)
        front = self.front
        self.sleep_rings = self.in_rings + ([r for _, r in front.live_resp] if front else [])
        loop.add_reader(self.wake_fd, self.on_wake)
        loop.add_reader(self.control.fileno(), self.on_control_readable)
        loop.add_reader(self.sync_done_r, self.on_sync_readable)
        if self.syncer.fd >= 0:
            loop.add_reader(self.syncer.fd, self.on_uring_readable)   # io_uring fsyncs (syncer.py)
        if self.cleaner_reader is not None:
            loop.add_reader(self.cleaner.fileno(), self.on_cleaner_readable)
        if self.inbox is not None:
            loop.add_reader(self.inbox.fileno(), self.inbox.read)
        if front is not None:
            front.loop = loop

    def run(self) -> int:
        """Serve until stopped (the own front's listeners too, when it has one)."""
        self.open_loop()
        loop = self.loop
        if self.front is not None:
            loop.run_until_complete(serve_listeners(self.front))
        self.sweep_replayed()          # moves left open by the last run go now (worker.py)
        self.pump()
        self.arm_timer()
        self.on_beat_timer()
        if not self.stopping:
            loop.call_soon(self.hear_sigterm)
            loop.run_forever()
        return self.shutdown()              # EXIT_UNSAVED if the disk could not take the last state

    def hear_sigterm(self) -> None:
        """SIGTERM goes to the loop from inside its run: uvloop acts on a signal only through the
        wakeup pipe it sets up for each run, so one its handler took between two runs (the
        listeners' run above and this one) was recorded and never acted on, and the supervisor
        killed the worker after STOP_GRACE (seen as "did not stop" in a third to two thirds of
        quick start-stops).  Until this runs, worker_main's handler holds it (`stopping`)."""
        self.loop.add_signal_handler(signal.SIGTERM, self.request_stop)
        if self.stopping:
            self.request_stop()

    def step(self, wait: float | None = None) -> bool:
        """One turn, for tests: drain, run due timers, finish the batch, beat when the clock
        says so; if nothing was handled, let the loop wait up to `wait` s for an event
        (control, group commit).  True when a request was handled."""
        self.handled = False
        self.pump()
        self.run_timers()
        self.end_turn()
        now = self.clock.monotonic()
        if now >= self.next_beat:
            self.beat(now)
        if self.handled:
            return True
        self.stepping = True
        stop = self.loop.call_later(wait or 0, self.loop.stop)
        try:
            self.loop.run_forever()
        finally:
            self.stepping = False
            stop.cancel()
        return False

    def request_stop(self) -> None:
        self.stopping = True
        if self.loop is None or self.stop_scheduled:
            return
        self.stop_scheduled = True
        if self.front is not None:
            self.front.stopping = True
            for srv in self.front.servers:
                srv.close()
        self.evict_waiters()            # blocked fetchers answer empty in this last turn (§5.10)
        # replies of the last batch still reach the worker's own clients before the loop stops
        self.schedule_turn()
        self.loop.call_later(0.05, self.loop.stop)

    def woke(self) -> None:
        """An event was handled: its work joins this turn's batch, and a `step` ends early."""
        self.schedule_turn()
        if self.stepping:
            self.loop.stop()

    def on_wake(self) -> None:
        drain_eventfd(self.wake_fd)
        self.pump()
        self.woke()

    def pump(self) -> None:
        """Drain every inbound ring (and the own front's response rings), then flag them all
        sleeping so that producers signal the wake eventfd; if more arrived meanwhile, come back
        after this turn's batch instead of looping, so clients and the batch are not starved."""
        for r in self.outs:
            if r.backlog:            # space freed in a full ring: push the overflow on
                r.publish()
        front = self.front
        clear_sleep_all(self.in_rings)
        if self.worker_rings:
            self.hear_deaths()      # a dead worker's moves are not run as a live one's (moves.py)
        if self.drain(self.rings):
            self.handled = True
        if front is not None:
            front.push_overflow()
            front.drain_responses()
            if self.worker_rings:    # what a worker sent before a reply read here goes first (drain)
                self.drain(self.worker_rings)
        if not prepare_sleep_all(self.sleep_rings):
            self.loop.call_soon(self.pump)
        self.schedule_turn()

    def schedule_turn(self) -> None:
        if not self.turn_scheduled:
            self.turn_scheduled = True
            self.loop.call_soon(self.end_turn)

    def end_turn(self) -> None:
        """Once per loop iteration that did something: finish the batch (journal writes,
        replies or a group commit), write the local clients' replies, hand idle connections
        to the worker they use, re-arm the timer if an earlier deadline came, and arm the timer
        of a gather the batch began (Syncer.arm_due: after the replies, not before them)."""
        self.turn_scheduled = False
        self.reads_left = TURN_READS
        if self.coll.woken:
            self.retry_woken()
        self.finish_batch()
        front = self.front
        if front is not None:
            if front.write_pending:
                front.flush_writes()
            if front.candidates:
                front.try_handoffs()
        if self.deadlines_changed:
            self.arm_timer()
        syncer = self.syncer
        if syncer.inline_due:           # the round's fsync, run here now that the replies are out
            self.sync_inline()
        if syncer.timer_due:            # a gather's timer, now that the replies are written
            syncer.arm_due()

    def end_quiet_turn(self) -> None:
        """end_turn for a turn that read only the worker's one connection (Conn.data_received):
        while nothing of the general batch end has work (nobody woken, no write behind, no
        fsync round under way or due, no reply held back), the same steps in one frame, with
        finish_batch's and publish's checks of what a quiet turn cannot have left out (issue 8,
        c=1: a turn per request).  The commit rule is finish_batch's: the batch's records are
        written (write_out) before its replies go; a write that went behind the writer or
        waits for an fsync hands the batch to finish_batch there and then."""
        coll = self.coll
        if coll.woken or self.writing or self.settled or self.write_held or self.held or \
                self.sync_queue or self.syncer.rounds:
            self.end_turn()
            return
        self.turn_scheduled = False     # (reads_left is TURN_READS: no turn was scheduled)
        undo = coll.undo
        undo.ctx = None
        dirty = coll.dirty_storages()
        through = self.write_out(dirty) if dirty else None
        if self.writing or self.sync_queue:
            self.finish_batch()         # nothing left to write: it holds or rounds the replies
            if self.syncer.timer_due or self.syncer.inline_due:     # (it reaped and began a gather,
                self.schedule_turn()    # or left an fsync to run: end_turn, after the replies below)
        else:
            if undo.entries:
                undo.trim(through)
            replies = self.replies
            if replies:
                self.replies = []
                if self.front.deliver(replies, self.local_src) != len(replies):
                    self.send_replies(replies)
        front = self.front
        pending = front.write_pending
        if pending:
            if len(pending) == 1:       # the connection (Front.flush_writes, without its frame)
                pending.pop().pump()
            else:
                front.flush_writes()
        if front.candidates:
            front.try_handoffs()
        if self.deadlines_changed:
            self.arm_timer()

    def cut_turn(self) -> None:
        """TURN_READS connections were read into this iteration's batch: end it now (journal
        write, replies written while those connections are still in the caches) and let the
        iteration read on into a new one.  The end_turn scheduled when the batch began still
        runs at the iteration's end, for whatever comes after; Conn.data_received counts."""
        self.end_turn()
        self.turn_scheduled = True

    def note_deadline(self, ms: int) -> None:
        """Something is due at epoch `ms`: the turn's end re-arms the timer only if that comes
        before the deadline it is armed for (a blocking get's deadline usually does not)."""
        if ms < self.timer_ms:
            self.deadlines_changed = True

    def arm_timer(self) -> None:
        """Arm the loop timer at the earliest deadline.  Whatever adds a deadline says so
        (`note_deadline`, or `deadlines_changed` for the periodic syncs a batch schedules), and
        the timer's firing re-arms it, so a turn that added none pays nothing; what no turn
        announces (the storage's scheduled cmdlog jobs and pack checks) is looked at then and
        on every heartbeat."""
        self.deadlines_changed = False
        ms = self.next_deadline_ms()
        if ms is None or ms >= self.timer_ms:
            return                          # none, or the armed timer comes first (it re-arms)
        if self.timer is not None:
            self.timer.cancel()
        self.timer_ms = ms
        self.timer = self.loop.call_at(
            self.loop.time() + max(0.0, (ms - self.clock.now_ms()) / 1000.0), self.on_timer)

    def on_timer(self) -> None:
        self.timer = None
        self.timer_ms = NO_DEADLINE
        self.deadlines_changed = True       # the deadlines it ran for moved on: look again
        self.run_timers()
        self.schedule_turn()

    def on_beat_timer(self) -> None:
        """The heart beats while the loop turns, busy or idle (heartbeat.py); the timer is
        re-armed too, for the deadlines no turn announces (arm_timer)."""
        now = self.clock.monotonic()
        self.beat(now)
        if self.check_sync(now):        # fsyncs that returned without waking the loop
            self.woke()
        self.arm_timer()
        if not self.stopping:
            self.loop.call_later(self.beat_interval, self.on_beat_timer)

    def on_control_readable(self) -> None:
        self.poll_control()
        self.woke()

    def on_sync_readable(self) -> None:
        self.on_sync_done()
        self.woke()

    def on_uring_readable(self) -> None:
        self.on_synced()
        self.woke()

    def on_cleaner_readable(self) -> None:
        self.poll_cleaner()
        if self.cleaner_reader.eof:
            self.loop.remove_reader(self.cleaner.fileno())
        self.woke()

    def local_request(self, src: int, conn: int, req: int, op: int, flags: int, queue: str | bytes,
                      a: int, b: int, payload) -> None:
        """A request from this worker's own client: run it now; its reply leaves with the batch.
        The connection's queue name comes as it was parsed (str), never encoded for a ring."""
        if self.closed_conns and self.void_after_close(src, conn, op, flags):
            return
        try:
            self.execute(src, conn, req, op, flags,
                         queue if queue.__class__ is str else queue.decode("latin-1"), a, b, payload)
        except Exception as e:   # one bad request must not take the shard down
            self.request_failed(src, conn, req, queue, e)
        if not self.turn_scheduled:
            self.schedule_turn()

    def request_failed(self, src: int, conn: int, req: int, queue: str | bytes, e: Exception) -> None:
        """Answer a request that raised with SERVER_ERROR and close its connection.  An OSError
        (a full disk, an I/O error) is logged with its file; the reply carries the errno's text
        and the queue name, never a server path."""
        name = queue if queue.__class__ is str else queue.decode("latin-1")
        if isinstance(e, OSError):
            log.error("worker %d: queue %r: %s", self.index, name, e)
            why = describe_os_error(e, name).encode("latin-1", "replace")
        else:
            log.error("worker %d: request from slot %d on queue %r failed", self.index, src, name, exc_info=e)
            why = b"internal error"
        self.reply(src, conn, req, R_SERVER_ERROR, RF_CLOSE, 0, why)
