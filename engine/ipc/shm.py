"""Counters and small blocks in anonymous shared memory, for stats across processes.

The supervisor creates these BEFORE forking (``mmap(-1, n, MAP_SHARED)``, as the
rings in ring.py are), so every front and worker shares them without a file,
a name or a resource tracker.

`CounterBlock`: one row ("slot") of signed 64-bit counters per process, e.g.
curr_connections / total_connections / bytes_read / bytes_written per front.
Invariants:

* Each process writes only its own slot, so increments need no atomics: a
  slot's words have a single writer, and an aligned 8-byte store is never seen
  torn on x86-64.
* A slot is padded to a multiple of 64 bytes, so two processes never write the
  same cache line.
* Readers sum a column over all slots (`total`).  The sum is not a snapshot
  across processes (each word is read at a slightly different moment), which is
  what memcached-style stats and connection limits need: a gauge may be off by
  the connections accepted during the read.
* Counters are signed, so a gauge decremented by a process that did not
  increment it (a slot zeroed after a crash) reads negative instead of 2**64.

Layout: ``slots`` rows of ``stride`` int64 words, word ``slot*stride + index``.

`SharedBytes`: a small fixed block (the server status block) with one writer
and any number of readers, guarded by a sequence word (seqlock): the writer
makes it odd, writes, makes it even; a reader retries while it is odd or
changed.  Stores and loads keep program order on x86-64, so a reader that saw
the same even sequence before and after copying got one writer's whole value.
Layout: ``u64 seq | u64 length | data[capacity]``.

`SharedCounter`: one server-wide sequence that any process takes blocks from
(thrift read ids, reference §3.3).  CPython has no atomic read-modify-write on
shared memory, so the counter is guarded by a POSIX record lock (`lockf`) on the
anonymous file that holds it: such locks belong to a process, so the workers,
sharing one inherited descriptor, still exclude each other, and the kernel drops
the lock of a process that dies holding it (a `kill -9` mid-take loses at most
the block being taken, never hands it out twice).  Taking a block costs two
syscalls; callers amortise them over the block.

`ConfigEpoch`: one process's view of the server-wide config generation, a
SharedCounter bumped by whoever validated a reloaded file, before anyone is told
"Reloaded config.".  Every process serving clients compares it with the generation it
loaded before parsing what a client sent, so a reply to `reload` binds every front at
once, whatever the supervisor's relay to the other fronts is doing.
"""
from __future__ import annotations

import fcntl
import logging
import mmap
import os

log = logging.getLogger(__name__)

_LINE = 64


def _shared_map(size: int) -> mmap.mmap:
    return mmap.mmap(-1, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)


class CounterSlot:
    """One process's row.  Cheap enough for every request: compiled (setup.py, shm.pxd), `incr`
    and `decr` are a C store into the row (`_row`, the same words typed); from Python,
    ``slot.words[i] += n`` is one memoryview read-modify-write, which costs several times
    more."""

    __slots__ = ("words", "_row", "_base", "index")

    def __init__(self, words: memoryview, base: int, index: dict[str, int]) -> None:
        self.words = words[base:base + len(index)]
        self._row = self.words
        self._base = base
        self.index = index           # counter name -> column

    def incr(self, index: int, n: int = 1) -> None:
        self._row[index] += n

    def decr(self, index: int, n: int = 1) -> None:
        self._row[index] -= n

    def set(self, index: int, value: int) -> None:
        self.words[index] = value

    def get(self, index: int) -> int:
        return self.words[index]

    def clear(self) -> None:
        """Zero the whole row (a replaced process starts from nothing)."""
        w = self.words
        for i in range(len(w)):
            w[i] = 0


class CounterBlock:
    """`slots` rows × `counters` columns of shared int64 counters."""

    __slots__ = ("counters", "slots", "stride", "index", "_mm", "_words")

    def __init__(self, mm: mmap.mmap, slots: int, counters: tuple[str, ...], stride: int) -> None:
        self.counters = counters
        self.slots = slots
        self.stride = stride
        self.index = {name: i for i, name in enumerate(counters)}
        self._mm = mm
        self._words = memoryview(mm).cast("q")

    @classmethod
    def create(cls, slots: int, counters: tuple[str, ...]) -> CounterBlock:
        if slots < 1:
            raise ValueError(f"counter block: slots must be >= 1, got {slots}")
        if not counters or len(set(counters)) != len(counters):
            raise ValueError(f"counter block: counter names must be non-empty and unique: {counters!r}")
        stride = -(-len(counters) * 8 // _LINE) * _LINE // 8
        return cls(_shared_map(slots * stride * 8), slots, tuple(counters), stride)

    def column(self, name: str | int) -> int:
        """Index of counter `name`, for `CounterSlot.incr(index)`; an int index is
        checked and returned as is."""
        if isinstance(name, int):
            if 0 <= name < len(self.counters):
                return name
        elif name in self.index:
            return self.index[name]
        raise KeyError(f"counter block has no counter {name!r} (has {', '.join(self.counters)})")

    def slot(self, i: int) -> CounterSlot:
        if not 0 <= i < self.slots:
            raise IndexError(f"counter block: slot {i} out of range 0..{self.slots - 1}")
        return CounterSlot(self._words, i * self.stride, self.index)

    def total(self, name: str | int) -> int:
        """Sum of counter `name` (or column index) over all slots."""
        col = self.column(name)
        words, stride = self._words, self.stride
        return sum(words[s * stride + col] for s in range(self.slots))

    def get(self, slot: int, name: str | int) -> int:
        """One slot's value of counter `name` (a per-process gauge)."""
        if not 0 <= slot < self.slots:
            raise IndexError(f"counter block: slot {slot} out of range 0..{self.slots - 1}")
        return self._words[slot * self.stride + self.column(name)]

    def per_slot(self, name: str | int) -> list[int]:
        col = self.column(name)
        return [self._words[s * self.stride + col] for s in range(self.slots)]

    def totals(self) -> dict[str, int]:
        return {name: self.total(name) for name in self.counters}

    def close(self) -> None:
        self._words.release()
        self._mm.close()


_SEQ = 0
_LEN = 1
_DATA = 16
_MAX_READ_ATTEMPTS = 100_000


class SharedBytes:
    """A small shared block, one writer, many readers (seqlock)."""

    __slots__ = ("capacity", "_mm", "_hdr")

    def __init__(self, mm: mmap.mmap, capacity: int) -> None:
        self.capacity = capacity
        self._mm = mm
        self._hdr = memoryview(mm)[:_DATA].cast("Q")

    @classmethod
    def create(cls, n: int) -> SharedBytes:
        if n < 1:
            raise ValueError(f"shared block: size must be >= 1, got {n}")
        return cls(_shared_map(_DATA + n), n)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Replace the contents.  One writer only (the supervisor)."""
        n = len(data)
        if n > self.capacity:
            raise ValueError(f"shared block: {n} bytes do not fit in {self.capacity}")
        hdr = self._hdr
        seq = hdr[_SEQ]
        hdr[_SEQ] = seq + 1                  # odd: write in progress
        self._mm[_DATA:_DATA + n] = data
        hdr[_LEN] = n
        hdr[_SEQ] = seq + 2

    def read(self) -> bytes:
        """The last complete write (b"" before the first)."""
        hdr, mm = self._hdr, self._mm
        for attempt in range(_MAX_READ_ATTEMPTS):
            seq = hdr[_SEQ]
            if not seq & 1:
                n = hdr[_LEN]
                if n <= self.capacity:       # else a torn length: retry
                    data = mm[_DATA:_DATA + n]
                    if hdr[_SEQ] == seq:
                        return data
            if attempt >= 64:
                os.sched_yield()             # the writer may be descheduled mid-write
        raise RuntimeError(f"shared block: writer stuck mid-write (sequence {hdr[_SEQ]}); "
                           f"did it die while writing?")

    @property
    def version(self) -> int:
        """Number of completed writes; lets readers skip unchanged blocks cheaply."""
        return self._hdr[_SEQ] >> 1

    def close(self) -> None:
        self._hdr.release()
        self._mm.close()


class SharedCounter:
    """A u64 sequence in an anonymous file, shared across fork; values start at 1."""

    __slots__ = ("fd", "_mm", "_word")

    def __init__(self, fd: int, mm: mmap.mmap) -> None:
        self.fd = fd
        self._mm = mm
        self._word = memoryview(mm).cast("Q")

    @classmethod
    def create(cls, name: str = "lanner-counter") -> SharedCounter:
        fd = os.memfd_create(name, 0)        # inherited by forked children, never exec'd
        os.ftruncate(fd, 8)
        return cls(fd, mmap.mmap(fd, 8, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE))

    def take(self, n: int) -> int:
        """Reserve `n` consecutive values for this process; return the first."""
        if n < 1:
            raise ValueError(f"shared counter: cannot take {n} values")
        fcntl.lockf(self.fd, fcntl.LOCK_EX)
        try:
            first = self._word[0] + 1
            self._word[0] = first + n - 1
        finally:
            fcntl.lockf(self.fd, fcntl.LOCK_UN)
        return first

    @property
    def value(self) -> int:
        """The last value handed out (0 before the first take)."""
        return self._word[0]

    def close(self) -> None:
        self._word.release()
        self._mm.close()
        os.close(self.fd)


class IdBlocks:
    """One process's supply of ids from a SharedCounter, `block` at a time: unique
    server-wide and increasing within this process."""

    __slots__ = ("counter", "block", "_next", "_end")

    def __init__(self, counter: SharedCounter, block: int = 128) -> None:
        self.counter = counter
        self.block = block
        self._next = self._end = 0

    def next(self) -> int:
        if self._next == self._end:
            self._next = self.counter.take(self.block)
            self._end = self._next + self.block
        n = self._next
        self._next = n + 1
        return n


class ConfigEpoch:
    """This process's view of the config generation (module doc): `seen` is the generation
    of the file it last read.  Reading the file AFTER taking `start()` is what makes `seen`
    safe: a bump after the read leaves this process behind, never wrongly up to date."""

    __slots__ = ("counter", "word", "seen")

    def __init__(self, counter: SharedCounter | None = None, seen: int | None = None) -> None:
        self.counter = counter if counter is not None else SharedCounter.create("lanner-config-epoch")
        self.word = self.counter._word     # read on every batch a front parses: one index
        self.seen = self.counter.value if seen is None else seen

    def for_child(self) -> ConfigEpoch:
        """The view of a child forked with this process's config: at its generation."""
        return ConfigEpoch(self.counter, self.seen)

    def behind(self) -> bool:
        return self.word[0] != self.seen

    def start(self) -> int:
        """The generation a file read from now on is at least as new as."""
        return self.word[0]

    def loaded(self, at: int) -> None:
        """The file was read (or failed to read: retrying each batch would not help) at `at`."""
        self.seen = at

    def publish(self, at: int) -> None:
        """A file read at `at` was valid and is in force here: every process must follow it.
        If another bump came in between, this process reads the file once more to be sure."""
        new = self.counter.take(1)
        if new == at + 1:
            self.seen = new
