"""HeapTrim's policy with a fake heap (the real one is glibc's, exercised by
tests/server/test_memory.py on a real server)."""
from __future__ import annotations

import platform

from lanner.server.heaptrim import GlibcHeap, HeapTrim


class FakeHeap:
    def __init__(self, free: int = 0, available: bool = True) -> None:
        self.free = free
        self.available = available
        self.trims = 0

    def free_bytes(self) -> int:
        return self.free

    def trim(self) -> None:
        self.trims += 1
        self.free = 0


def test_trims_only_when_enough_lies_free():
    heap = FakeHeap(free=(4 << 20) - 1)
    t = HeapTrim(heap, threshold=4 << 20, interval=5.0)
    assert not t.maybe(100.0)
    heap.free = 4 << 20
    assert t.maybe(100.5)
    assert heap.trims == 1 and t.trims == 1


def test_at_most_one_trim_per_interval():
    heap = FakeHeap(free=64 << 20)
    t = HeapTrim(heap, threshold=4 << 20, interval=5.0)
    assert t.maybe(10.0)
    heap.free = 64 << 20
    assert not t.maybe(14.9)
    assert t.maybe(15.0)
    assert heap.trims == 2


def test_nothing_without_the_glibc_calls():
    heap = FakeHeap(free=64 << 20, available=False)
    assert not HeapTrim(heap).maybe(0.0)
    assert heap.trims == 0


def test_the_glibc_calls_are_found_on_glibc():
    heap = GlibcHeap()
    assert heap.available == (platform.libc_ver()[0] == "glibc")
    if heap.available:
        junk = [bytes(2000) for _ in range(5000)]     # 10 MB from the brk heap ...
        del junk[:-1]                                 # ... freed below a live one
        assert heap.free_bytes() >= 8 << 20
        heap.trim()


def test_release_free_heap_trims_a_heap_that_can_and_leaves_one_that_cannot():
    from lanner.server.heaptrim import release_free_heap
    heap = FakeHeap(free=1 << 20)
    release_free_heap(heap)
    assert heap.trims == 1
    other = FakeHeap(free=1 << 20, available=False)
    release_free_heap(other)
    assert other.trims == 0
    release_free_heap()                     # the real one (glibc, or nothing where there is none)
