"""Single-producer/single-consumer byte rings in shared memory, with eventfd wakeups.

One ring per (front, worker) pair per direction carries framed messages between
processes (measured on the development VM: 1.1 µs per message per side when
publishing every 16 messages, no syscall at all while both sides are busy).

Memory.  The supervisor creates every ring BEFORE forking, over an anonymous
``mmap(-1, n, MAP_SHARED)``; children inherit the mapping and the eventfds.
Nothing is ever unlinked, so no resource tracker can pull the memory away from
a surviving process (``multiprocessing.shared_memory`` on 3.11 does).

Layout (all integers native-endian, the ring never leaves the machine)::

    0    head              u64  consumer position: everything before it is free
    8    sleep_seq         u64  consumer's count of sleeps (same line: consumer-written)
    64   tail              u64  producer position: everything before it is readable
    128  consumer_sleeping u64  sleep_seq of the sleep the consumer is (about to be) in, or 0
    192  producer_waiting  u64  1 while the producer holds overflow and wants space
    256  magic u64, capacity u64
    320  data area, `capacity` bytes (a power of two, multiple of 64)

Each shared word sits on its own 64-byte cache line, so the side that writes it
does not steal the line the other side writes.

Invariants:

* Positions only grow (u64, never wrap in practice); ``pos & (capacity - 1)``
  indexes the data area.  ``head <= tail <= head + capacity`` always.
* Only the consumer stores ``head``, ``sleep_seq`` and ``consumer_sleeping``; only the producer
  stores ``tail``.  ``producer_waiting`` is set by the producer and cleared by
  either side (see "Space wakeups").
* A record starts on an 8-byte boundary: ``u32 len | payload | pad to 8``.
  A record never straddles the end of the data area: when it does not fit, the
  producer writes the wrap marker ``len == 0xFFFFFFFF`` and the record starts
  at index 0 of the next lap.  The published ``tail`` is always a record
  boundary, and every record before it is complete.
* Records written but not published are invisible; a producer that dies
  mid-write leaves only garbage beyond ``tail`` that its replacement overwrites.

Publishing.  The producer writes records against private positions and makes
them visible with one store of ``tail`` in `publish()`, so a batch costs one
shared-line write.  It re-reads ``head`` only when its cached copy says the
ring is full; the consumer likewise re-reads ``tail`` only when it has caught
up with its cached copy.

Memory ordering.  CPython has no atomics, but on x86-64 (TSO) stores are seen
in program order by other cores and loads are not reordered with older loads.
So "write record bytes, then store tail" is seen in that order by a consumer
that "loads tail, then loads record bytes"; the same holds for head.  Aligned
8-byte memoryview item stores compile to single ``mov``s, so no word is seen
torn.  The only reordering TSO allows is a later load passing an earlier store
(store buffering), which is exactly the sleep/wake handshake below (Dekker's
pattern); there we put a full fence between the store and the load.  The fence
is an uncontended ``threading.Lock`` acquire + release: glibc implements it
with ``lock``-prefixed read-modify-writes, which drain the store buffer (the
same effect as ``mfence``), at ~0.1 µs.  On weakly ordered CPUs (aarch64) an
acquire/release pair is not a full fence and none of the above holds: Lanner's
ring targets x86-64 only.

Sleep/wake ("flag" protocol).  A consumer that found every ring empty calls
`prepare_sleep()` (or wake.prepare_sleep_all(rings)): store sleeping=seq (a new,
non-zero number per sleep), fence, re-read tail; if data arrived it clears the
flag and does not sleep.  The producer's `publish()` stores tail, fences, and
writes the consumer's eventfd only if the flag is set.  With a fence on both
sides at least one of them sees the other's store, so a wakeup is never lost,
and a busy consumer costs the producer no syscall.  The consumer clears the
flag (`clear_sleep()`) when it wakes, and drains its eventfd (wake.py).
One eventfd serves all the rings a process consumes (``Ring.create(...,
wake_fd=...)``).  Numbering the sleeps lets a producer that publishes again
before the consumer has woken skip the redundant eventfd write (it remembers
the seq it signalled): the consumer woken for that sleep re-reads tail before
it can sleep again, and by Dekker's argument its next prepare_sleep sees the
new tail whenever this producer saw the old flag.  ``sleep_seq`` lives in
shared memory so a replacement consumer never reuses a number.

Overflow.  `send()` never fails: when the ring is full the message goes to a
private deque that `publish()` drains first, so order is kept and a front never
blocks (its flow control bounds that deque).  While the deque is non-empty
`write()`/`reserve()` refuse, so nothing overtakes it.

Space wakeups.  A producer with overflow needs to run again when the consumer
frees space, even if it has nothing new to send.  If the ring was created with
``space_fd`` (the PRODUCER's own wakeup eventfd), `publish()` leaves overflow
behind only after setting producer_waiting=1, fencing and retrying; the
consumer's `release()` stores head, fences, and when the flag is set clears it
and writes ``space_fd``.  Clearing before signalling means any re-arm the clear
overwrote is followed by a signal, after which the producer re-arms.  The
producer's loop must then call `publish()` on rings whose `backlog` is non-zero.
Without ``space_fd`` the caller must retry `publish()` itself.

Crashed peers.  Detecting them is the supervisor's job.  Because positions are
monotonic and live in shared memory, the survivor needs no reset: the
replacement process calls `resync_producer()` or `resync_consumer()` on each
ring it inherits (adopting the shared positions; a new consumer discards what
its predecessor left unread), and `reset()` zeroes a ring nobody is using.
A surviving consumer discards what a dead producer left (`resync_consumer`: a
half-sent chunked message included), and a surviving producer forgets what it
had not yet published for a dead consumer (`drop_backlog`).  The one ordering
rule that makes this safe: the survivor does so BEFORE the replacement exists
(the supervisor forks it only once every survivor has acknowledged `peer_down`),
so a discard can never swallow the replacement's first records, and every record
read after it comes from the replacement.
"""
from __future__ import annotations

import logging
import mmap
import os
import platform
import threading
from collections import deque

log = logging.getLogger(__name__)

if platform.machine() not in ("x86_64", "AMD64"):
    log.warning("lanner.ipc.ring relies on x86-64 (TSO) memory ordering; on %s a published record "
                "may be seen before its bytes", platform.machine())

HEAD = 0            # u64 indexes into the header's 'Q' view
SLEEP_SEQ = 1
TAIL = 8
SLEEPING = 16
WAITING = 24
MAGIC = 32
CAPACITY = 33
HEADER_SIZE = 320   # data area offset
MAGIC_VALUE = 0x4C414E4E52494E47   # "LANNRING"
WRAP = 0xFFFFFFFF   # record length meaning "continue at index 0 of the next lap"
MIN_CAPACITY = 64
MAX_CAPACITY = 1 << 31


class RingError(Exception):
    """A ring's shared memory holds something no producer could have written."""


# -- fence -------------------------------------------------------------------------------

_fence_lock = threading.Lock()
_acquire = _fence_lock.acquire
_release = _fence_lock.release


def fence() -> None:
    """Full memory barrier (on x86-64): an uncontended lock's atomic RMWs."""
    _acquire()
    _release()


def _new_fence_lock() -> None:
    # A lock copied by fork() while some thread held it would stay held forever
    # in the child; give each child a fresh one.
    global _fence_lock, _acquire, _release
    _fence_lock = threading.Lock()
    _acquire = _fence_lock.acquire
    _release = _fence_lock.release


os.register_at_fork(after_in_child=_new_fence_lock)


# -- ring --------------------------------------------------------------------------------

class Ring:
    """An SPSC byte ring; one object, used by the producer in one process and by
    the consumer in another (each uses only its half of the methods).

    Producer: `write`/`write_parts`/`reserve`+`commit` (return False/-1 when
    full), or `send`/`send_parts` (never fail), then `publish()`.
    Consumer: `read_offset`/`read`/`read_batch`, then `release()`; sleep with
    `prepare_sleep()` / `clear_sleep()`.
    """

    __slots__ = (
        "name", "capacity", "max_payload", "wake_fd", "space_fd", "buf", "signals", "space_signals",
        "rec_len", "_mm", "_hdr", "_u32", "_mask", "_wtail", "_published", "_head_cache",
        "_reserved", "_overflow", "_rhead", "_tail_cache", "_signalled",
    )

    def __init__(self, mm: mmap.mmap, capacity: int, wake_fd: int, space_fd: int | None, name: str) -> None:
        self.name = name
        self.capacity = capacity
        self.max_payload = capacity - 4       # a record of `capacity` bytes fills an empty ring
        self.wake_fd = wake_fd                # the consumer's eventfd
        self.space_fd = space_fd              # the producer's eventfd, or None
        self._mm = mm
        self.buf = memoryview(mm)             # absolute offsets from read_offset()/reserve()
        self._hdr = self.buf[:HEADER_SIZE].cast("Q")
        self._u32 = self.buf.cast("I")
        self._mask = capacity - 1
        self.signals = 0                      # eventfd writes this process made as producer
        self.space_signals = 0                # ... and as consumer, to a waiting producer
        self.rec_len = 0                      # payload length of the record read_offset() returned
        self._overflow: deque[bytes] = deque()
        self._reset_local()

    def _reset_local(self) -> None:
        hdr = self._hdr
        self._wtail = self._published = hdr[TAIL]
        self._head_cache = hdr[HEAD]
        self._reserved = -1
        self._signalled = 0                  # the sleep seq this producer last signalled
        self._overflow.clear()
        self._rhead = hdr[HEAD]
        self._tail_cache = hdr[TAIL]

    @classmethod
    def create(cls, capacity: int = 1 << 20, *, wake_fd=None, space_fd=None,
               name: str = "ring") -> Ring:
        """Map a new ring (call before fork).  `wake_fd` is the consumer's eventfd
        (shared by all rings it consumes; a new one is made if None); `space_fd`
        is the producer's, to be woken when a full ring gets space."""
        if capacity < MIN_CAPACITY or capacity > MAX_CAPACITY or capacity & (capacity - 1):
            raise ValueError(f"ring {name}: capacity {capacity} is not a power of two in "
                             f"[{MIN_CAPACITY}, {MAX_CAPACITY}]")
        if wake_fd is None:
            wake_fd = os.eventfd(0, os.EFD_NONBLOCK)
        wake_fd = getattr(wake_fd, "fd", wake_fd)        # a wake.WakeFd or a bare descriptor
        space_fd = getattr(space_fd, "fd", space_fd)
        mm = mmap.mmap(-1, HEADER_SIZE + capacity, flags=mmap.MAP_SHARED,
                       prot=mmap.PROT_READ | mmap.PROT_WRITE)
        ring = cls(mm, capacity, wake_fd, space_fd, name)
        ring._hdr[MAGIC] = MAGIC_VALUE
        ring._hdr[CAPACITY] = capacity
        return ring

    def __repr__(self) -> str:
        if self._mm.closed or self.buf.obj is None:
            return f"<Ring {self.name} closed>"
        hdr = self._hdr
        return (f"<Ring {self.name} cap={self.capacity} head={hdr[HEAD]} tail={hdr[TAIL]} "
                f"sleeping={hdr[SLEEPING]} backlog={len(self._overflow)}>")

    # -- producer --------------------------------------------------------------------

    def write(self, payload) -> bool:
        """Append one record (unpublished).  False, writing nothing, when the ring
        has no room or overflow is pending.  `payload`: any contiguous bytes-like
        object with 1-byte items."""
        return self.write_parts(payload, b"")

    def write_parts(self, header, body) -> bool:
        """`write(header + body)` without building the concatenation: a `reserve` and `commit`
        (the slow path of `send_parts`, which writes its common case itself)."""
        h = len(header)
        n = h + len(body)
        off = self.reserve(n)
        if off < 0:
            return False
        mm = self._mm
        mm[off:off + h] = header
        mm[off + h:off + n] = body
        self.commit(n)
        return True

    def reserve(self, n: int) -> int:
        """Room for a payload of up to `n` bytes: its absolute offset in `buf`
        (fill it, e.g. with `struct.pack_into(fmt, ring.buf, off, ...)`, then
        `commit(actual_len)`), or -1 when full.  No allocation, no tuple."""
        size = (n + 11) & ~7
        tail = self._wtail
        idx = tail & self._mask
        if size > self.capacity - idx or self._overflow or tail + size - self._head_cache > self.capacity:
            idx = self._make_room(size, n)
            if idx < 0:
                return -1
        self._reserved = n
        return HEADER_SIZE + idx + 4

    def commit(self, n: int) -> None:
        """Finish the record `reserve()` started, with `n` <= reserved bytes."""
        if n > self._reserved or n < 0:
            raise ValueError(f"ring {self.name}: commit({n}) without a reserve() of at least {n} bytes "
                             f"(reserved {self._reserved})")
        tail = self._wtail
        self._u32[(HEADER_SIZE + (tail & self._mask)) >> 2] = n
        self._wtail = tail + ((n + 11) & ~7)
        self._reserved = -1

    def _make_room(self, size: int, n: int) -> int:
        """Slow path of a write (`write_parts`, `reserve`): refuse behind overflow, wrap at the
        end of the data area, refuse oversized records, re-read the consumer's head when the
        cached one leaves no room.  Returns the data index to write at, or -1."""
        if size > self.capacity:
            raise ValueError(f"ring {self.name}: a {n}-byte payload can never fit "
                             f"(max {self.max_payload} bytes)")
        if self._overflow:
            return -1
        cap = self.capacity
        tail = self._wtail
        idx = tail & self._mask
        room = cap - idx
        if size > room:
            # The wrap marker consumes the rest of the lap even if the record then
            # does not fit, so a record bigger than `idx` still fits once the
            # consumer catches up.
            if tail + room - self._head_cache > cap:
                self._head_cache = self._hdr[HEAD]
                if tail + room - self._head_cache > cap:
                    return -1
            self._u32[(HEADER_SIZE + idx) >> 2] = WRAP
            tail += room
            self._wtail = tail
            idx = 0
        if tail + size - self._head_cache > cap:
            self._head_cache = self._hdr[HEAD]
            if tail + size - self._head_cache > cap:
                return -1
        return idx

    def send(self, payload) -> None:
        """`write`, or keep a copy for the next `publish()` when the ring is full."""
        if not self.write(payload):
            self._overflow.append(bytes(payload))

    def send_parts(self, header, body) -> None:
        """`send(header + body)` without building the concatenation.  The common case (room
        before the end of the data area by the cached head, no overflow) is `write_parts`
        inline: a message costs one Python call, not two (issue 8, the routed request)."""
        h = len(header)
        n = h + len(body)
        size = (n + 11) & ~7
        tail = self._wtail
        idx = tail & self._mask
        cap = self.capacity
        if size <= cap - idx and tail + size - self._head_cache <= cap and not self._overflow:
            off = HEADER_SIZE + idx + 4
            self._u32[(off - 4) >> 2] = n
            mm = self._mm
            mm[off:off + h] = header
            mm[off + h:off + n] = body
            self._wtail = tail + size
        elif not self.write_parts(header, body):
            self._overflow.append(bytes(header) + bytes(body))

    @property
    def backlog(self) -> int:
        """Messages held in overflow, waiting for room."""
        return len(self._overflow)

    @property
    def unpublished(self) -> bool:
        return self._wtail != self._published

    def publish(self) -> bool:
        """Make every record written so far visible (after moving what overflow
        fits into the ring), and wake the consumer if it flagged sleeping.
        Returns True when the consumer's eventfd was written."""
        if self._overflow:
            self._drain_overflow()
        tail = self._wtail
        if tail == self._published:
            return False
        self._published = tail
        hdr = self._hdr
        hdr[TAIL] = tail
        _acquire()
        _release()
        seq = hdr[SLEEPING]
        if seq and seq != self._signalled:
            self._signalled = seq
            os.eventfd_write(self.wake_fd, 1)
            self.signals += 1
            return True
        return False

    def _drain_overflow(self) -> None:
        ov = self._overflow
        self._overflow = q = deque()          # write() refuses while overflow is non-empty
        try:
            while ov and self.write(ov[0]):
                ov.popleft()
        finally:
            self._overflow = ov
        if not ov or self.space_fd is None:
            return
        hdr = self._hdr
        hdr[WAITING] = 1
        _acquire()
        _release()
        # Retry after arming: the consumer may have released just before the flag landed.
        self._overflow = q
        try:
            while ov and self.write(ov[0]):
                ov.popleft()
        finally:
            self._overflow = ov
        if not ov:
            hdr[WAITING] = 0

    # -- consumer --------------------------------------------------------------------

    def read_offset(self) -> int:
        """Next record: absolute offset of its payload in `buf` (length in
        `rec_len`), or -1 when nothing is published.  Allocation-free; the bytes
        stay valid until `release()`."""
        head = self._rhead
        if head == self._tail_cache:
            self._tail_cache = self._hdr[TAIL]
            if head == self._tail_cache:
                return -1
        idx = head & self._mask
        n = self._u32[(HEADER_SIZE + idx) >> 2]
        if n > self.max_payload:
            return self._read_wrapped(head, n)
        self._rhead = head + ((n + 11) & ~7)
        self.rec_len = n
        return HEADER_SIZE + idx + 4

    def _read_wrapped(self, head: int, n: int) -> int:
        if n != WRAP:
            raise RingError(f"ring {self.name}: record length {n} at position {head} exceeds "
                            f"the maximum {self.max_payload} (corrupt ring)")
        head += self.capacity - (head & self._mask)
        self._rhead = head
        if head == self._tail_cache:
            self._tail_cache = self._hdr[TAIL]
            if head == self._tail_cache:
                return -1
        n = self._u32[HEADER_SIZE >> 2]
        if n > self.max_payload:
            raise RingError(f"ring {self.name}: record length {n} at position {head} exceeds "
                            f"the maximum {self.max_payload} (corrupt ring)")
        self._rhead = head + ((n + 11) & ~7)
        self.rec_len = n
        return HEADER_SIZE + 4

    def read(self) -> memoryview | None:
        """Next record's payload as a memoryview valid until `release()`, or None."""
        off = self.read_offset()
        if off < 0:
            return None
        return self.buf[off:off + self.rec_len]

    def read_batch(self, max_records: int = 64) -> list[memoryview]:
        """Up to `max_records` payloads (memoryviews valid until `release()`).  `read_offset`
        inline for records that need no wrap: one Python call per batch, not one per record
        plus one (issue 8, the routed request)."""
        out = []
        buf = self.buf
        u32 = self._u32
        mask = self._mask
        top = self.max_payload
        head = self._rhead
        tail = self._tail_cache
        for _ in range(max_records):
            if head == tail:
                tail = self._tail_cache = self._hdr[TAIL]
                if head == tail:
                    break
            idx = head & mask
            n = u32[(HEADER_SIZE + idx) >> 2]
            if n > top:                 # a wrap marker (or a corrupt length): the slow path
                self._rhead = head
                off = self._read_wrapped(head, n)
                head = self._rhead      # past the marker, and past the record if there is one
                if off < 0:
                    break
                out.append(buf[off:off + self.rec_len])
                tail = self._tail_cache
                continue
            off = HEADER_SIZE + idx + 4
            head += (n + 11) & ~7
            out.append(buf[off:off + n])
        self._rhead = head
        return out

    def release(self) -> None:
        """Free everything read so far for the producer (invalidates the views),
        and wake a producer that waits for space."""
        hdr = self._hdr
        hdr[HEAD] = self._rhead
        if self.space_fd is not None:
            _acquire()
            _release()
            if hdr[WAITING]:
                hdr[WAITING] = 0
                os.eventfd_write(self.space_fd, 1)
                self.space_signals += 1

    def empty(self) -> bool:
        """Nothing published beyond what this consumer has read."""
        return self._rhead == self._hdr[TAIL]

    def prepare_sleep(self) -> bool:
        """Release, flag sleeping, fence, re-check.  True: the ring is empty and the
        producer will signal `wake_fd` on its next publish, so sleep.  False: data
        arrived meanwhile; the flag is cleared again, do not sleep."""
        self.flag_sleep()
        _acquire()
        _release()
        if self._rhead != self._hdr[TAIL]:
            self._hdr[SLEEPING] = 0
            return False
        return True

    def flag_sleep(self) -> None:
        """`prepare_sleep` up to the fence: release, then flag sleeping under a new
        sleep number.  The caller fences and re-checks `empty()` (wake.prepare_sleep_all
        does so once for all of a process's rings)."""
        self.release()
        hdr = self._hdr
        seq = hdr[SLEEP_SEQ] + 1
        hdr[SLEEP_SEQ] = seq
        hdr[SLEEPING] = seq

    def clear_sleep(self) -> None:
        self._hdr[SLEEPING] = 0

    # -- lifecycle -------------------------------------------------------------------

    def reset(self) -> None:
        """Zero the shared positions and flags and this process's view of them.
        Only while no other process uses the ring (e.g. in the supervisor before
        any child runs); use the resync_* methods in a replacement peer instead."""
        hdr = self._hdr
        hdr[HEAD] = 0
        hdr[SLEEP_SEQ] = 0
        hdr[TAIL] = 0
        hdr[SLEEPING] = 0
        hdr[WAITING] = 0
        self._reset_local()

    def resync_producer(self) -> None:
        """Become the producer of a ring whose previous producer died: continue at
        the published tail (whatever it left unpublished is overwritten)."""
        self._reset_local()
        self._hdr[WAITING] = 0

    def resync_consumer(self, discard: bool = True) -> None:
        """Become the consumer of a ring whose previous consumer died.  With
        `discard`, skip what it left unread (addressed to its connections or
        state); otherwise resume at the shared head."""
        hdr = self._hdr
        hdr[SLEEPING] = 0
        if discard:
            hdr[HEAD] = hdr[TAIL]
        self._reset_local()

    def drop_backlog(self) -> int:
        """Producer whose consumer died: forget what it has not published yet, overflow
        included (it was addressed to the dead process), and stop waiting for space.
        Returns how many overflow messages went.  Without this a replacement consumer
        would receive requests or replies whose senders were already told they failed."""
        n = len(self._overflow)
        self._overflow.clear()
        self._wtail = self._published
        self._reserved = -1
        self._hdr[WAITING] = 0
        return n

    def close(self) -> None:
        """Unmap (in this process only).  Fails if record views are still held."""
        for v in (self._hdr, self._u32, self.buf):
            v.release()
        try:
            self._mm.close()
        except BufferError:
            raise BufferError(f"ring {self.name}: cannot unmap while record views are held") from None
