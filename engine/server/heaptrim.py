"""Give the heap a drained backlog leaves behind back to the OS (glibc's malloc_trim).

Why: an item's data is a bytes object of 1 KiB or so, which glibc carves from the brk heap.
When a backlog drains, the top of that heap stays pinned by something allocated later, so
free() can return nothing: a worker that once held `max_memory_size` of items kept all of it
for its life (measured: 20 MB of private memory still held after 100,000 1 KiB items were
read, with the queue empty).  `malloc_trim(0)` also releases the free pages inside the heap
(madvise), so the memory goes back while the heap's layout stays.

It costs about half a millisecond on a 30 MB heap (and the pages are faulted in again when
reused), so the worker asks at its heartbeat, at most once a second: `mallinfo2` (tens of
microseconds) says how much lies free, and a trim runs only when that is at least `threshold`
and the last trim is `interval` seconds old.  Not glibc (no mallinfo2): nothing is done.
"""
from __future__ import annotations

import ctypes
import gc

THRESHOLD = 4 << 20          # bytes free in malloc's arenas before a trim is worth it
INTERVAL = 5.0               # seconds between two trims at the most


def child_gc() -> None:
    """A server child's collector (supervisor.child_main; perf/hotloop.py mirrors it): what was
    allocated before it lives as long as the process, so the collector leaves it alone, and
    young garbage (per-request objects) builds up more before a collection."""
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)


def release_free_heap(heap=None) -> None:
    """malloc_trim now, whatever lies free: the supervisor before each fork (supervisor.spawn: a
    free but resident page of its heap is inherited by every child and counted once more in the
    tree's memory for nothing; about 1 MB after its imports, mallinfo2), the cleaner after a pack
    (cleaner.run_pack: what the pack allocated).  About half a millisecond; both are rare."""
    heap = heap if heap is not None else GlibcHeap()
    if heap.available:
        heap.trim()


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                 "uordblks", "fordblks", "keepcost")]


class GlibcHeap:
    """The two calls, through ctypes; `available` is False where libc lacks them."""

    def __init__(self) -> None:
        try:
            libc = ctypes.CDLL(None)
            self._info = libc.mallinfo2
            self._trim = libc.malloc_trim
        except (OSError, AttributeError):
            self._info = self._trim = None
        else:
            self._info.restype = _MallInfo2
            self._trim.argtypes = [ctypes.c_size_t]

    @property
    def available(self) -> bool:
        return self._info is not None

    def free_bytes(self) -> int:
        return self._info().fordblks

    def trim(self) -> None:
        self._trim(0)


class HeapTrim:
    """`maybe(now)` from a periodic duty; `now` is a monotonic time in seconds."""

    __slots__ = ("heap", "threshold", "interval", "last", "trims")

    def __init__(self, heap=None, threshold: int = THRESHOLD, interval: float = INTERVAL) -> None:
        self.heap = heap if heap is not None else GlibcHeap()
        self.threshold = threshold
        self.interval = interval
        self.last: float | None = None
        self.trims = 0

    def maybe(self, now: float) -> bool:
        if not self.heap.available or (self.last is not None and now - self.last < self.interval):
            return False
        if self.heap.free_bytes() < self.threshold:
            return False
        self.heap.trim()
        self.last = now
        self.trims += 1
        return True
