"""fsync off the owner's thread, in rounds that overlap (a worker's group commit, server/commit.py).

A round is the set of byte streams (each storage's `medium`) that one batch of replies depends
on under sync "always".  Its media are fsynced by a few threads in parallel (fsync releases the
GIL; the filesystem commits concurrent fsyncs in one journal transaction), and when the last one
returns the round is done and one byte on `notify_w` wakes the owner.  The owner starts a round as
soon as a batch has written its records, without waiting for earlier rounds: an fsync that starts
while another is under way joins the kernel's next commit instead of waiting for the owner to
notice the first one.  So the disk never idles while replies wait, and a reply waits for about one
commit, not up to two plus a loop turn.

The owner finishes rounds in the order it started them (`done_prefix`), so replies leave in batch
order and a failed fsync can still turn every later reply that depends on it into an error.
Media are only ever asked to `sync()` (fsync what their owner already wrote; seam.py), never to
touch their buffers.

One medium is never fsynced twice at once: Linux reports a write-back error to only one of the
fsyncs of a file that check for it, so with two under way the later round could take the error
and the earlier one report success for bytes that were lost.  A round that needs a medium whose
fsync is under way waits for it, and every round that waited gets one fsync after it (which
covers all of them: they all wrote before it starts).  Rounds over different media overlap.
Once an fsync of a medium failed, a later fsync may succeed although the bytes are gone, so every
round that needs that medium fails with the same error, without an fsync, until the owner has
rolled the medium back (`clear`).

Periodic fsyncs (`later`) run on the same threads; their failures are logged (storage/sync.py).
"""
from __future__ import annotations

import logging
import os
import threading
from collections import deque
from queue import SimpleQueue

log = logging.getLogger(__name__)

#: fsync threads per owner: enough to fsync every file of a busy round at once.
THREADS = 8


class Round:
    """Media fsynced for one batch of replies; `replies` leave when `remaining` is 0."""
    __slots__ = ("media", "replies", "remaining", "failed")

    def __init__(self, media: list, replies: list) -> None:
        self.media = media
        self.replies = replies
        self.remaining = len(media)
        self.failed: list = []          # (medium, OSError) whose fsync failed


class Syncer:
    """The fsync threads of one owner and the rounds it has started, oldest first."""

    def __init__(self, notify_w: int, threads: int = THREADS, name: str = "fsync") -> None:
        self.notify_w = notify_w
        self.rounds: deque[Round] = deque()
        self._tasks: SimpleQueue = SimpleQueue()
        self._lock = threading.Lock()
        self._busy: dict = {}           # medium -> rounds waiting for its fsync under way
        self._failed: dict = {}         # medium -> the OSError of its failed fsync, until `clear`
        self._threads: list[threading.Thread] = []
        self._nthreads = threads
        self._name = name

    def __len__(self) -> int:
        """Rounds started and not yet taken by `done_prefix`."""
        return len(self.rounds)

    def start(self, media: list, replies: list) -> Round:
        """fsync `media` (each once) now; `replies` wait for it."""
        media = list(dict.fromkeys(media))
        r = Round(media, replies)
        self.rounds.append(r)
        self._spawn()
        if not media:
            os.write(self.notify_w, b"x")
        for m in media:
            self._ask(m, r)
        return r

    def later(self, media) -> None:
        """Periodic fsyncs: nobody waits for them; a failure is logged."""
        self._spawn()
        for m in media:
            self._ask(m, None)

    def clear(self, medium) -> None:
        """The owner rolled `medium` back after its failed fsync: it may be fsynced again."""
        with self._lock:
            self._failed.pop(medium, None)

    def _ask(self, medium, r: Round | None) -> None:
        """fsync `medium` for round `r` (None: periodic): now, or after the one under way."""
        with self._lock:
            error = self._failed.get(medium)
            if error is None:
                waiting = self._busy.get(medium)
                if waiting is not None:
                    waiting.append(r)
                    return
                self._busy[medium] = []
        if error is None:
            self._tasks.put((medium, [r]))
        elif self._settle(medium, [r], error):
            os.write(self.notify_w, b"x")

    def _settle(self, medium, rounds: list, error: OSError | None) -> bool:
        """`medium` is done (or failed) for `rounds`; True if one of them is finished."""
        finished = False
        with self._lock:
            for r in rounds:
                if r is not None:
                    if error is not None:
                        r.failed.append((medium, error))
                    r.remaining -= 1
                    finished |= r.remaining == 0
        return finished

    def done_prefix(self) -> list[Round]:
        """Take the finished rounds at the head, in the order they were started."""
        out = []
        rounds = self.rounds
        while rounds and rounds[0].remaining == 0:
            out.append(rounds.popleft())
        return out

    def close(self) -> None:
        """Stop the threads once the fsyncs already asked for are done (shutdown, tests)."""
        for _ in self._threads:
            self._tasks.put(None)
        for t in self._threads:
            t.join()
        self._threads = []

    def _spawn(self) -> None:
        if self._threads:
            return
        for i in range(self._nthreads):
            t = threading.Thread(target=self._run, name=f"{self._name}-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def _run(self) -> None:
        tasks, lock, busy = self._tasks, self._lock, self._busy
        while True:
            task = tasks.get()
            if task is None:
                return
            medium, rounds = task
            error = None
            try:
                medium.sync()
            except OSError as e:
                log.error("fsync failed: %s", e)
                error = e
            with lock:
                waiting = busy.pop(medium)
                if error is not None:
                    self._failed[medium] = error
                    rounds = rounds + waiting     # their bytes may be gone too: no fsync for them
                elif waiting:
                    busy[medium] = []
                    tasks.put((medium, waiting))
            if self._settle(medium, rounds, error):
                os.write(self.notify_w, b"x")
