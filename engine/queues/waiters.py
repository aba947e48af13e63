"""Blocked fetches as plain data: per-queue FIFO wait lists and a deadline heap.

No threads and no asyncio: the worker's event loop owns every waiter, so a
waiter is just a record, and "waking" one means moving it to a list the loop
drains (trio's ParkingLot, Kestrel's DeadlineWaitQueue).

Life of a `Waiter`:

    added (queued) --wake_one/wake_all--> woken (not queued)
          |                                  |  the owner retries the fetch; if another
          |                                  |  client won the race it re-adds the waiter
          |                                  +--> queued again, at the TAIL, same deadline
          +--cancel / deadline--> cancelled (never queued again)

Invariants:
* `WaitList` is FIFO.  Cancelling is O(1) and lazy: the record stays in the
  deque, marked, and is skipped when it reaches the front.  `len()` counts
  only live (queued, not cancelled) waiters: it is the `waiters` stat.
* `TimerHeap` never removes entries early either.  `pop_due` skips entries
  whose item is cancelled, and skips a waiter that is not queued at that
  moment (woken and in flight: the owner answers it, or re-adds it, which
  pushes a fresh timer entry).  Duplicate entries for one waiter are
  therefore harmless: whoever handles the first one cancels the waiter.
"""
from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass
from itertools import count


@dataclass(slots=True, eq=False)
class Waiter:
    key: object                # opaque to the engine (the worker keeps its pending request here)
    queue: str
    deadline_ms: int | None    # None = wait forever
    peek: bool = False
    transactional: bool = False
    cancelled: bool = False
    woken: bool = False
    evicted: bool = False      # woken by delete/shutdown: answer empty, do not retry
    queued: bool = False       # in a WaitList right now (managed by WaitList)


def _live(item) -> bool:
    if getattr(item, "cancelled", False):
        return False
    return getattr(item, "queued", True)


class WaitList:
    """One queue's blocked fetchers, oldest first."""

    __slots__ = ("_dq", "live")

    def __init__(self) -> None:
        self._dq: deque[Waiter] = deque()
        self.live = 0                  # waiters queued and not cancelled (every add tests it)

    def __len__(self) -> int:
        return self.live

    def add(self, w: Waiter) -> None:
        """Queue `w` at the tail (also how a woken waiter that lost the race rejoins)."""
        if w.cancelled or w.queued:
            return
        w.queued = True
        w.woken = False
        self._dq.append(w)
        self.live += 1

    def wake_one(self) -> Waiter | None:
        dq = self._dq
        while dq:
            w = dq.popleft()
            if w.queued and not w.cancelled:
                w.queued = False
                w.woken = True
                self.live -= 1
                return w
        return None

    def wake_all(self) -> list[Waiter]:
        """Evict everyone (queue deleted or server stopping): they answer empty."""
        out = []
        for w in self._dq:
            if w.queued and not w.cancelled:
                w.queued = False
                w.woken = True
                w.evicted = True
                out.append(w)
        self._dq.clear()
        self.live = 0
        return out

    def cancel(self, w: Waiter) -> None:
        """Withdraw `w` (disconnect, deadline, or served after a wake-up).  Idempotent."""
        if w.queued and not w.cancelled:
            self.live -= 1
            w.queued = False
            # Keep the deque from filling with dead records when a long-lived
            # list sees many cancels (e.g. short `t=` polls on an idle queue).
            if len(self._dq) > 64 and len(self._dq) > 4 * self.live:
                w.cancelled = True
                self._dq = deque(x for x in self._dq if x.queued and not x.cancelled)
        w.cancelled = True


class TimerHeap:
    """Deadlines for waiters (and anything else with an optional `cancelled`), lazily deleted."""

    __slots__ = ("_heap", "_seq", "_compact_at")

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, object]] = []
        self._seq = count()
        self._compact_at = 1024

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, deadline_ms: int, item) -> None:
        heapq.heappush(self._heap, (deadline_ms, next(self._seq), item))
        if len(self._heap) >= self._compact_at:
            # Served waiters leave dead entries until their deadline; with long
            # deadlines and busy queues they would pile up.  Amortised O(1).
            self._heap = [e for e in self._heap if _live(e[2])]
            heapq.heapify(self._heap)
            self._compact_at = max(1024, 2 * len(self._heap))

    def pop_due(self, now_ms: int) -> list:
        """Items whose deadline <= now, oldest deadline first, each at most once."""
        heap = self._heap
        out = []
        seen = set()
        while heap and heap[0][0] <= now_ms:
            item = heapq.heappop(heap)[2]
            if _live(item) and id(item) not in seen:
                seen.add(id(item))
                out.append(item)
        return out

    def next_deadline(self) -> int | None:
        """The earliest deadline of a live entry; drops dead entries found on top."""
        heap = self._heap
        while heap and not _live(heap[0][2]):
            heapq.heappop(heap)
        return heap[0][0] if heap else None
