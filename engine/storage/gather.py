"""The gather: a syncer's next fsync of one busy file held until the clients it just answered
have written again (`_gather` says when and why), on the io_uring engine.

Apart from syncer.py's rounds and media because it is a policy of its own, with its own state
(`_held`, `_gathered`, the backoff) and its own timer, which only these methods touch besides
`wait_idle`, `close` and `_completed` releasing it.
"""
from __future__ import annotations

#: The gather's longest wait, in seconds, and its share of the last fdatasync's duration (`_gather`).
GATHER_MAX_S = 1e-3
GATHER_SHARE = 1.0
#: A gather shorter than this is not worth its timer (seconds).
GATHER_MIN_S = 20e-6


class Gather:
    """Syncer's gather (storage/syncer.py); the state is the Syncer's."""

    def _gather(self, medium, rounds: list, waiting: list) -> bool:
        """`medium`'s fsync just returned for `rounds`, and `waiting` rounds (perhaps none) wait
        for the next one.  If the clients it answered (their replies leave now) are about to
        send again, hold that next fsync until as many replies joined as just left, or for a
        bounded moment (GATHER_SHARE of the last fdatasync, at most GATHER_MAX_S), whichever
        comes first.  Without it, 10 closed-loop clients on one queue split into two halves that
        alternate, each waiting for the other's fdatasync and then its own: 5 items per
        fdatasync; with it one carries all 10, and the per-fdatasync CPU (the kernel's io-wq,
        the enter, the loop's wake-up) is paid half as often (issue 8, P5).  With no round
        waiting the medium is held as well (the first client back would otherwise start an
        fsync alone, and the halves would form again).  Like MySQL's
        binlog_group_commit_sync_delay with its no_delay_count, but the count is what just left
        and the delay follows the disk.  Never when no reply just left, nor for a lone client
        (nobody else to wait for: it never waits); only when this fsync was the only one under
        way and its rounds wrote this file alone (one busy file); after gathers that caught
        nobody, the next ones are skipped (`_release`).  True if held: `_joined`, the timer (`poll`), a round of other files
        (`start`) or an inline fsync (`wait_idle`) releases it.  The timer is armed by `arm_due`,
        once the owner has written the replies."""
        if self._inflight or self._jobs or self._held is not None or self.uring is None:
            return False
        released = 0
        for r in rounds:
            if r is not None and not r.remaining:
                if len(r.media) > 1:    # its clients wrote other files too (a queue each)
                    return False
                released += len(r.replies)
        if released < (1 if waiting else 2):
            return False
        if self._skip:
            self._skip -= 1
            return False
        delay = min(GATHER_MAX_S, GATHER_SHARE * self.last_sync_s)
        if delay < GATHER_MIN_S:
            return False
        self._token += 1
        self._held, self._held_timer, self._held_until, self._gathered = medium, self._token, released, 0
        self.timer_due = delay
        with self._lock:
            self._busy[medium] = waiting
        return True

    def arm_due(self) -> None:
        """Arm the held gather's timer (its io_uring_enter), which `_gather` left for the owner
        to ask for once it has written the replies the returning fsync let go: the enter then
        runs while those clients prepare their next requests, not between the fsync's return
        and their replies, where every microsecond is one the round waits (issue 8, P5).  The
        count cannot be reached before: those clients have not had their replies yet.  The
        owner calls it at the end of the turn that reaped (and before it blocks for a round at
        shutdown); a gather released before that never arms one."""
        delay, self.timer_due = self.timer_due, 0.0
        if delay and self._held is not None and self.uring.arm(self._held_timer, delay) is not None:
            self._release()             # (no timer: the fsync goes now, as without a gather)
            self._submit()

    def _joined(self, n: int) -> None:
        """`n` replies joined the rounds the gather holds for: release it once enough came."""
        self._gathered += n
        if self._gathered >= self._held_until:
            self._release(disarm=True)
            self._submit()

    def _release(self, disarm: bool = False, missed: bool = False) -> None:
        """Issue the held fsync for every round that waits for it (`_submit` sends it);
        `disarm`: its timer has not fired, and is removed with that submission.  `missed`: the
        gather caught nobody, so the next ones are skipped, twice as many after each miss in a
        row (up to 64): clients that do not come back at once, or that write other files (one
        queue each), pay its timer rarely."""
        if missed:
            self._backoff = min(2 * self._backoff or 1, 64)
            self._skip = self._backoff
        else:
            self._backoff = 0
        medium, self._held = self._held, None
        if self.timer_due:              # never armed (`arm_due`): nothing to remove
            self.timer_due = 0.0
        elif disarm:
            self.uring.disarm(self._held_timer)
        with self._lock:
            waiting = self._busy.pop(medium)
            if waiting:
                self._busy[medium] = []
            else:                       # nobody came: the medium is idle
                self._idle.notify_all()
        if waiting:
            self._issue(medium, waiting)
