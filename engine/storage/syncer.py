"""fsync off the owner's critical path, in rounds that overlap (a worker's group commit,
server/commit.py).

A round is the set of byte streams (each storage's `medium`) that one batch of replies depends
on under sync "always".  Its media are fsynced in parallel (the filesystem commits concurrent
fsyncs in one journal transaction), and when the last one returns the round is done.  The owner
starts a round as soon as a batch has written its records, without waiting for earlier rounds:
an fsync that starts while another is under way joins the kernel's next commit instead of
waiting for the owner to notice the first one.  So the disk never idles while replies wait, and
a reply waits for about one commit, not up to two plus a loop turn.

Two engines run the fsyncs (issue 8, P5):
* io_uring (storage/uring.py, the default on Linux x86-64): the owner submits fdatasyncs
  (`sync_target` of the medium says which fd and whether fdatasync covers it) and reaps their
  completions on its own thread when the loop sees the eventfd `fd`, or at the end of a turn in
  which one came (`ready`, `poll`).  No Python thread, no GIL hand-off, no lock contention.
  The rounds that waited for a medium's fsync under way get one fsync when the owner reaps it,
  covering every batch written meanwhile; a batch that comes while the newest round still waits
  `join`s it (one round per fsync, however many turns the batches took).
  With `follow_on` (off by default), a round for a medium whose fsync is under way, when that is
  the only fsync under way (one busy queue), gets its fsync submitted at once, drained behind it
  (IOSQE_IO_DRAIN): the kernel starts it the moment the first returns, with no trip through the
  loop, and still never runs two fsyncs of one file at once; one such follow-on per medium, later
  rounds wait for the next.  (Drained, it would hold back every fsync submitted after it: hence
  only with one medium busy.)  It is off because it carries only the batches that came before it
  was submitted, early in the fsync under way, and the ones behind them wait for one fsync more:
  at 10 closed-loop clients on one queue, 3.3 items per fdatasync with it, about 5 without, and
  more server CPU per item (perf/README.md, stop 18).
  With `inline` (the worker's test), the one fsync of an owner that has nothing else of the ring
  under way is not submitted but left for the owner (`inline_due`), which runs it with a
  blocking fdatasync at the end of its turn when all its clients wait for it (`sync_inline`,
  server/commit.py): the loop would only idle in epoll meanwhile, and the ring's hand-off (the
  kernel's worker thread, the completion, the eventfd, the wake-up) costs ~0.1 ms of a round.
* threads (no io_uring, and tests that inject fsync functions): a few threads call `medium.sync()`
  (fsync releases the GIL); the thread whose fsync returns fsyncs the same medium again at once
  for the rounds that waited (their records are written), and a finished round writes one byte to
  `notify_w` unless one is already waiting there.

The owner finishes rounds in the order it started them (`done_prefix`), so replies leave in batch
order and a failed fsync can still turn every later reply that depends on it into an error.
Media are only ever asked to fsync what their owner already wrote (seam.py), never to touch
their buffers.

One medium is never fsynced twice at once: Linux reports a write-back error to only one of the
fsyncs of a file that check for it, so with two under way the later round could take the error
and the earlier one report success for bytes that were lost.  A round that needs a medium whose
fsync is under way waits for it, and every round that waited gets one fsync after it (which
covers all of them: they all wrote before it starts).  Rounds over different media overlap.
Once an fsync of a medium failed, a later fsync may succeed although the bytes are gone, so every
round that needs that medium fails with the same error, without an fsync, until the owner has
rolled the medium back (`clear`).

While a medium's fsync is under way or held (io_uring engine), its owner may leave the records
of the turns that come buffered (`defer`): `_issue` writes them just before the medium's next
fsync, one write per round, and a write that fails there fails the rounds like a failed fsync.

Periodic fsyncs (`later`) go the same way; their failures are logged (storage/sync.py).

The owner's own inline fsyncs of a medium's file (a journal's rotation and rewrite, a command-log
segment's rotation) obey the same rule through `exclusive`: they wait for the fsync under way, run
with the medium held busy, and a failure poisons the medium like a round's (every round that needs
it fails until the owner rolls it back), or the next round's fsync could succeed over lost bytes.
A medium learns its syncer (`sync_gate`) the first time a round or a periodic fsync asks for it.
"""
from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections import deque
from queue import SimpleQueue

from lanner.storage.gather import Gather
from lanner.storage.syncthreads import SyncThreads

log = logging.getLogger(__name__)

#: fsync threads per owner (thread engine): enough to fsync every file of a busy round at once.
THREADS = 8
#: Seconds a rewrite's writer thread waits for a medium's fsync under way (`after_idle`): the
#: owner's loop reaps it within one fsync, unless the loop is stuck or shutting down.
IDLE_WAIT = 5.0
#: An inline fsync (`sync_inline`) slower than this sends the next INLINE_SKIP through the ring:
#: while the disk is slow the loop keeps serving the owner's other clients during its fsyncs.
INLINE_SLOW_S = 20e-3
INLINE_SKIP = 64


class Round:
    """Media fsynced for one batch of replies; `replies` leave when `remaining` is 0."""
    __slots__ = ("media", "replies", "remaining", "failed", "started", "warned")

    def __init__(self, media: list, replies: list, started: float = 0.0) -> None:
        self.media = media
        self.replies = replies
        self.remaining = len(media)
        self.failed: list = []          # (medium, OSError) whose fsync failed
        self.started = started          # the owner's monotonic seconds (`stalled`)
        self.warned = False


class Syncer(Gather, SyncThreads):
    """The fsyncs of one owner and the rounds it has started, oldest first.  With `uring`
    (storage/uring.py) the owner's loop watches `fd` and calls `poll` when it is readable."""

    def __init__(self, notify_w: int, threads: int = THREADS, name: str = "fsync", uring=None,
                 follow_on: bool = False, gather: bool = True, inline=None) -> None:
        self.notify_w = notify_w
        self.follow_on = follow_on
        # `inline`: the owner's test whether it may run an fsync itself (`sync_inline`, at the end
        # of its turn); asked again then (a stand-in ring may not have what it needs)
        self.inline = inline if not follow_on and hasattr(uring, "quiet") else None
        self.inline_due = False         # the one fsync to run is left for the owner (`sync_inline`)
        self._inline_skip = 0           # fsyncs to send through the ring (after a slow inline one)
        # the gather needs the ring's timer (a test's stand-in ring may have none)
        self.gather = gather and not follow_on and hasattr(uring, "arm")
        self.fsyncs = 0                 # fdatasyncs (or fsyncs) issued for rounds: `stats`
        self.uring = uring
        self.fd = uring.fd if uring is not None else -1
        self.rounds: deque[Round] = deque()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)    # a medium's fsyncs are over (thread engine)
        self._busy: dict = {}           # medium -> rounds waiting for its fsync under way
        self._failed: dict = {}         # medium -> the OSError of its failed fsync, until `clear`
        self._notified = False          # a byte on notify_w the owner has not taken yet
        self._tasks: SimpleQueue = SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._nthreads = threads
        self._name = name
        self._inflight: dict[int, tuple] = {}   # uring token -> (medium, rounds, the medium's token)
        self._token = 0
        self._jobs: list = []           # uring fsyncs to submit together
        self._after: dict = {}          # medium -> token of its fsync drained behind the one under way
        self._deferred: set = set()     # media whose owner left records for their next fsync to write (`defer`)
        # the gather (`_gather`): the medium whose next fsync waits for the clients just answered,
        # the replies it waits for (a count of replies joined), its timer's token; the start of
        # the fsync under way and the duration of the last one (the one-medium case only)
        self._held = None
        self._held_until = 0
        self._held_timer = 0
        self.timer_due = 0.0            # the held gather's bound, its timer not armed yet (`arm_due`)
        self._gathered = 0
        self._skip = 0                  # gathers to skip (a backoff after ones that missed)
        self._backoff = 0               # ... the last such skip: doubled by a miss, 0 by a catch
        self._sync_started = 0.0
        self.last_sync_s = 0.0

    def __len__(self) -> int:
        """Rounds started and not yet taken by `done_prefix`."""
        return len(self.rounds)

    def start(self, media: list, replies: list, now: float = 0.0) -> Round:
        """fsync `media` (each once) now; `replies` wait for it.  `now`: the owner's monotonic
        seconds, for `stalled`."""
        media = list(dict.fromkeys(media))
        r = Round(media, replies, now)
        self.rounds.append(r)
        if not media:
            self._notify()
        for m in media:
            self._ask(m, r)
        if self._held is not None:
            if self._held in media:
                self._joined(len(replies))
            else:                       # the clients went to other files: nothing to gather
                self._release(disarm=True, missed=True)
        self._submit()
        return r

    def join(self, media: list, replies: list) -> bool:
        """Add `replies` to the newest round instead of starting one, if that round's fsyncs are
        all still to be issued (it waits for each of its media's fsync under way) and `media` are
        among its own: the fsyncs it will get start after the records of `replies` were written,
        so they cover them too.  One fsync then carries every batch that came while the one
        before ran, however many turns they took (issue 8, P5).  False: `start` a round."""
        rounds = self.rounds
        if not rounds:
            return False
        last = rounds[-1]
        with self._lock:
            for m in last.media:
                if last not in self._busy.get(m, ()):
                    return False
        for m in media:
            if m not in last.media:
                return False
        last.replies.extend(replies)
        if self._held is not None:
            self._joined(len(replies))
        return True

    def defer(self, medium) -> bool:
        """May the owner leave `medium`'s buffered records (sync "always") for the write that
        `_issue` makes just before the medium's next fsync?  Yes while an fsync of it is under
        way or held for a gather (io_uring engine): the records could not be covered by that
        fsync anyway, so one write per round carries every turn's records that came meanwhile,
        not one write per turn (issue 8, P5).  Their replies wait in the rounds that fsync
        finishes, as before; a failed write fails those rounds like a failed fsync (`_issue`).
        True: the owner must not write them itself, and puts the medium in its round."""
        if self.uring is None or self.follow_on or medium not in self._busy or medium in self._failed:
            return False
        self._deferred.add(medium)
        return True

    def stalled(self, now: float, after: float) -> Round | None:
        """The oldest round, once, if its fsyncs have not all returned `after` seconds after it
        started: the owner keeps waiting (a reply never leaves before its fsync), but says so in
        its log, since a disk or kernel that sits on an fsync looks from outside like a server
        that stopped answering."""
        if self.rounds:
            r = self.rounds[0]
            if r.remaining and not r.warned and now - r.started >= after:
                r.warned = True
                return r
        return None

    def state(self, name=repr) -> str:
        """What the fsyncs wait on, for the stall warning: a round can wait only for an fsync the
        kernel holds (`in flight`), one gathered and not yet submitted, or a medium busy with
        rounds behind it; the kernel's own view is in /proc/PID/fdinfo of the ring."""
        with self._lock:
            busy = ", ".join(f"{name(m)}:{len(w)}" for m, w in self._busy.items()) or "none"
            return (f"{len(self.rounds)} rounds, the oldest missing {self.rounds[0].remaining if self.rounds else 0}; "
                    f"in flight {sorted(name(m) for m, _, _ in self._inflight.values())}, "
                    f"to submit {len(self._jobs)}, busy (rounds waiting) {busy}, "
                    + (f"held for a gather {name(self._held)}, " if self._held is not None else "") +
                    f"ring in flight {self.uring.inflight if self.uring is not None else '-'}")

    def later(self, media) -> None:
        """Periodic fsyncs: nobody waits for them; a failure is logged."""
        for m in media:
            self._ask(m, None)
        self._submit()

    def exclusive(self, medium, fsync) -> None:
        """Run `fsync()`, the owner's own fsync of `medium`'s file, with no other fsync of it under
        way (module doc): after the one under way returned, the medium busy meanwhile.  Raises its
        error, or the error of the one before (the bytes may be gone either way); the medium then
        fails every round that needs it until `clear`."""
        self.wait_idle(medium)
        with self._lock:
            error = self._failed.get(medium)
            if error is None:
                self._busy[medium] = []
        if error is not None:
            raise error
        try:
            fsync()
        except OSError as e:
            error = e
        waiting = self._finish(medium, [], error, notify=False)
        if waiting:                     # (none can come: only the owner asks, and it is here)
            self._spawn()
            self._tasks.put((medium, waiting))
        if error is not None:
            raise error

    def after_idle(self, medium, fsync):
        """`fsync(fd)` for another thread (a rewrite's writer) to run on a file `medium` has just
        let go of: it first waits for the fsyncs of `medium` under way, which may be of that file
        (the owner's loop reaps them meanwhile), at most IDLE_WAIT seconds (then it logs)."""
        def run(fd: int) -> None:
            with self._idle:
                if not self._idle.wait_for(lambda: medium not in self._busy, IDLE_WAIT):
                    log.warning("fsync: %s still busy after %.0f s; fsyncing its old file anyway",
                                getattr(medium, "name", medium), IDLE_WAIT)
            fsync(fd)
        return run

    def wait_idle(self, medium) -> None:
        """Block until no fsync of `medium` is under way (the owner's thread)."""
        if medium not in self._busy:    # only the owner makes a medium busy
            return
        while medium in self._busy:
            if self._held is medium:    # its fsync goes now (each time a reap here gathers again)
                self._release(disarm=True)
                self._submit()
                continue
            if self.uring is None:      # thread engine: the fsync threads finish the medium
                with self._idle:
                    while medium in self._busy:
                        self._idle.wait()
            elif self._inflight or self._jobs:
                self.poll(wait=True)
            else:
                log.error("fsync: medium busy with no fsync under way")     # (cannot happen)
                break
        self._notify()      # the owner's loop may not look before another fsync returns: a byte

    def clear(self, medium) -> None:
        """The owner rolled `medium` back after its failed fsync: it may be fsynced again."""
        with self._lock:
            self._failed.pop(medium, None)

    def ready(self) -> bool:
        """An io_uring fsync (or the gather's timer) has completed and waits for `poll` (no
        syscall)."""
        return (bool(self._inflight) or self._held is not None) and self.uring.ready()

    def poll(self, wait: bool = False) -> None:
        """Take the io_uring fsyncs that completed (with `wait`, at least one if any is under way):
        their rounds count them, and the rounds that waited for one get the next fsync now."""
        if self.uring is None:
            return
        if wait and self.inline_due:    # (the owner waits for it: `wait_idle`, `close`)
            self.sync_inline()
            return
        for token, err in self.uring.reap(wait):
            self._completed(token, err)
        self._submit()

    def sync_inline(self) -> None:
        """Run the fsync `_submit` left for the owner (`inline_due`) here, on the owner's thread,
        and take its completion as `poll` would.  The owner calls it at the end of its turn,
        once the turn's other replies are written: the one fsync under way is then all it waits
        for (the clients of a one-queue round all wait for it), and a blocking fdatasync spares
        the ring's hand-off — the submission, the kernel's worker thread woken to run it and
        its completion, the eventfd, the loop's wake-up in epoll — about 50–100 µs per round on
        a 0.3–0.5 ms fdatasync (issue 8, P5; perf/README.md, stop 24).  A timer removal that
        waits for the next submission goes first, on its own.  One slower than INLINE_SLOW_S
        sends the next INLINE_SKIP fsyncs through the ring, where the loop serves meanwhile."""
        self.inline_due = False
        jobs, self._jobs = self._jobs, []
        if len(jobs) != 1:              # (cannot happen: `_submit` leaves exactly one)
            self._jobs = jobs
            self._submit()
            return
        (token, fd, datasync, _), = jobs
        self.uring.send_disarm()        # (refused: the timer fires later, and `poll` ignores it)
        self._sync_started = started = time.monotonic()
        try:
            if datasync:
                os.fdatasync(fd)
            else:
                os.fsync(fd)
            err = 0
        except OSError as e:
            err = e.errno or errno.EIO
        if time.monotonic() - started > INLINE_SLOW_S:
            self._inline_skip = INLINE_SKIP
        self._completed(token, err)
        self._submit()

    def send_due(self) -> None:
        """Send the fsync left for the owner (`inline_due`) through the ring after all: the owner
        has other clients to serve while it runs."""
        self.inline_due = False
        self._submit(ring=True)

    def _completed(self, token: int, err: int) -> None:
        """The fsync (or timer) of `token` completed with errno `err` (0: success)."""
        job = self._inflight.pop(token, None)
        if job is None:                 # the gather's timer (or its removal's completion)
            if token == self._held_timer and self._held is not None:
                self._release(missed=not self._gathered)
            return
        medium, rounds, mtoken = job
        if not self._inflight:
            self.last_sync_s = time.monotonic() - self._sync_started
        error = self._failed.get(medium)
        if error is None or err:        # (a follow-on's success after a failure vouches for nothing)
            error = medium.sync_done(mtoken, OSError(err, os.strerror(err)) if err else None)
            if error is not None:
                log.error("fsync failed: %s", error)
        self._reaped(token, medium, rounds, error)

    def _reaped(self, token: int, medium, rounds: list, error: OSError | None) -> None:
        after = self._after.get(medium)
        if after is None or after == token:         # the medium's last fsync under way
            self._after.pop(medium, None)
            self._finish(medium, rounds, error or self._failed.get(medium), notify=False)
            return
        # The first of two returned; the follow-on runs now, and the medium stays busy.
        with self._lock:
            waiting, self._busy[medium] = self._busy[medium], []
            if error is not None:       # every round that needs the medium fails (see above): the
                self._failed[medium] = error        # follow-on's and the waiting ones, at once
                _, frounds, fmtoken = self._inflight[after]
                rounds = rounds + frounds + waiting
                self._inflight[after] = (medium, [], fmtoken)
                waiting = []
            self._settle_locked(rounds, medium, error)
        del self._after[medium]
        # the rounds that waited get the next follow-on now, drained behind the one now running
        if waiting and not (len(self._inflight) == 1 and self._issue(medium, waiting, after=True)):
            self._busy[medium] = waiting

    def done_prefix(self) -> list[Round]:
        """Take the finished rounds at the head, in the order they were started."""
        out = []
        rounds = self.rounds
        with self._lock:
            self._notified = False
            while rounds and rounds[0].remaining == 0:
                out.append(rounds.popleft())
        return out

    def close(self) -> None:
        """Stop once the fsyncs already asked for are done (shutdown, tests)."""
        for _ in self._threads:
            self._tasks.put(None)
        for t in self._threads:
            t.join()
        self._threads = []
        self.gather = False             # (a reap below must not hold an fsync again)
        if self.uring is not None:
            if self._held is not None:
                self._release(disarm=True)
                self._submit()
            while self._inflight:
                self.poll(wait=True)
            self.uring.close()
            self.uring = None
            self.fd = -1

    # -- both engines ------------------------------------------------------------------------------
    def _ask(self, medium, r: Round | None) -> None:
        """fsync `medium` for round `r` (None: periodic): now, or after the one under way."""
        medium.sync_gate = self         # its owner's inline fsyncs go through `exclusive`
        with self._lock:
            error = self._failed.get(medium)
            if error is None:
                waiting = self._busy.get(medium)
                if waiting is not None:
                    if not (self.follow_on and self.uring is not None and len(self._inflight) == 1 and medium not in self._after
                            and self._issue(medium, [r], after=True)):
                        waiting.append(r)
                    return
                self._busy[medium] = []
        if error is None:
            self._issue(medium, [r])
        elif self._settle([r], medium, error):
            self._notify()

    def _issue(self, medium, rounds: list, notify: bool = True, after: bool = False) -> bool:
        """fsync `medium` for `rounds`; `after`: drained behind its fsync under way (io_uring).
        False if `after` and there is nothing to fsync beyond what that one covers."""
        if self._deferred and medium in self._deferred:
            self._deferred.discard(medium)
            try:
                medium.flush()          # the records its owner left for this fsync (`defer`)
            except OSError as e:
                log.error("write before fsync failed: %s", e)
                self._finish(medium, rounds, e, notify)     # fails them all, as a failed fsync
                return True
        if self.uring is not None and not self.uring.open():
            self.uring = None                         # (logged) no io_uring after all: threads from now on
        if self.uring is None:
            self._spawn()
            self._tasks.put((medium, rounds))
            return True
        target = medium.sync_target()
        if target is None:
            if after:           # the fsync under way may not cover it: wait for it
                return False
            self._finish(medium, rounds, None, notify)    # already durable: the fsync before covered it
            return True
        fd, mtoken, datasync = target
        self.fsyncs += 1
        if not self._inflight:
            self._sync_started = time.monotonic()
        self._token += 1
        self._inflight[self._token] = (medium, rounds, mtoken)
        self._jobs.append((self._token, fd, datasync, after))
        if after:
            self._after[medium] = self._token
        return True

    def _submit(self, ring: bool = False) -> None:
        """Submit the io_uring fsyncs gathered (those beyond the context's slots wait for `poll` to
        free some); one the kernel refused fails its rounds.  The only fsync of the owner, with
        nothing else of the ring under way, is left for the owner to run itself instead
        (`inline_due`, `sync_inline`), unless `ring`."""
        if self.inline is not None and self._jobs and not ring:
            if (len(self._jobs) == 1 and len(self._inflight) == 1 and not self._jobs[0][3]
                    and self.uring.quiet() and self.inline()):
                if not self._inline_skip:
                    self.inline_due = True
                    return
                self._inline_skip -= 1
            self.inline_due = False
        while self._jobs:
            jobs = self._jobs
            done, error = self.uring.submit(jobs)
            self._jobs = jobs[done:]
            if error is None:
                return
            for token, _, _, _ in jobs[done:done + 1]:
                self._jobs.pop(0)
                medium, rounds, mtoken = self._inflight.pop(token)
                failed = medium.sync_done(mtoken, error)
                if failed is not None:
                    log.error("fsync failed: %s", failed)
                if self._after.get(medium) == token:    # the one under way goes on: these wait for
                    del self._after[medium]             # the fsync after it, as without a follow-on
                    self._busy[medium].extend(rounds)
                    continue
                self._finish(medium, rounds, failed)

    def _finish(self, medium, rounds: list, error: OSError | None, notify: bool = True) -> list | None:
        """`medium`'s fsync for `rounds` returned; on the io_uring engine, fsync it again for the rounds
        that waited.  Returns those rounds (the thread engine fsyncs them itself).  `notify`:
        wake the owner if a round finished (not when the owner itself is reaping, `poll`)."""
        with self._lock:
            waiting = self._busy.pop(medium)
            if error is not None:
                self._failed[medium] = error
                rounds = rounds + waiting         # their bytes may be gone too: no fsync for them
                waiting = []
            elif waiting:
                self._busy[medium] = []
            if not waiting:
                self._idle.notify_all()
            finished = self._settle_locked(rounds, medium, error)
        if finished and notify:
            self._notify()
        if self.gather and error is None and self._gather(medium, rounds, waiting):
            return None
        if not waiting:
            return None
        if self.uring is None:
            return waiting
        self._issue(medium, waiting, notify)
        return None

    def _settle(self, rounds: list, medium, error: OSError | None) -> bool:
        with self._lock:
            return self._settle_locked(rounds, medium, error)

    @staticmethod
    def _settle_locked(rounds: list, medium, error: OSError | None) -> bool:
        """`medium` is done (or failed) for `rounds`; True if one of them is finished."""
        finished = False
        for r in rounds:
            if r is not None:
                if error is not None:
                    r.failed.append((medium, error))
                r.remaining -= 1
                finished |= r.remaining == 0
        return finished

    def _notify(self) -> None:
        """Wake the owner with one byte, unless one it has not taken yet is waiting already.
        (On the io_uring engine the owner finishes its own rounds in `poll`, and needs no byte.)"""
        with self._lock:
            if self._notified:
                return
            self._notified = True
        os.write(self.notify_w, b"x")
