"""fsync and fdatasync through io_uring, for the group commit (syncer.py).

Why not threads: an fsync thread needs the GIL after every fsync (and for the queue it takes
work from and the byte that wakes the owner), and the owner's loop needs it between every
callback, so under "always" the two convoy: py-spy of a worker at 10 connections put the loop in
its journal `write` and in `SimpleQueue.put` a third of its time, waiting to get the GIL back
(issue 8, P5).  An fsync submitted here runs in one of the kernel's io_uring workers, threads of
this process with no Python in them (so their CPU counts as the server's, and they run on any
core: Linux AIO's fsync, tried first, runs in a kworker bound to the submitting core, which then
preempts the loop for the ~50 µs of CPU each fsync costs).  Its completion lands in the
completion ring, read here without a syscall (`ready`, `reap`), and signals an eventfd that the
owner's loop watches.  Everything here runs on the owner's thread.  The kernel holds the file
open from submission to completion, so the owner may close or rotate it meanwhile.

The rings are shared memory read and written with plain loads and stores, which x86-64 orders
as io_uring needs (a store of the tail after the entries it publishes, loads of the entries after
the load of the tail); other machines would need barriers Python cannot make, so `open_uring`
returns None there, as it does where io_uring is missing or disabled (EPERM, ENOSYS): the syncer
then uses threads.  os has no io_uring calls: the three syscalls go through ctypes.
"""
from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import os
import platform
import struct
import weakref

log = logging.getLogger(__name__)

#: fsyncs under way at once (more wait for a free slot); the completion ring has twice as many.
EVENTS = 64

_SETUP, _ENTER, _REGISTER = 425, 426, 427       # x86-64 (and every architecture since 5.1)
_REGISTER_EVENTFD = 4
_ENTER_GETEVENTS = 1
_SQ_CQ_OVERFLOW = 2                             # IORING_SQ_CQ_OVERFLOW, in the SQ ring's flags
_FEAT_SINGLE_MMAP = 1
_OFF_SQ_RING, _OFF_CQ_RING, _OFF_SQES = 0, 0x8000000, 0x10000000
_OP_FSYNC, _FSYNC_DATASYNC = 3, 1
_OP_TIMEOUT, _OP_TIMEOUT_REMOVE = 11, 12
_IO_DRAIN = 2                                   # IOSQE_IO_DRAIN
_SQE = struct.Struct("=BBHiQQIIQ24x")           # opcode flags ioprio fd off addr len fsync_flags user_data
_CQE = struct.Struct("=QiI")                    # user_data res flags
_U32 = struct.Struct("=I")


class _Params(ctypes.Structure):
    _fields_ = [("sq_entries", ctypes.c_uint32), ("cq_entries", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("sq_thread_cpu", ctypes.c_uint32), ("sq_thread_idle", ctypes.c_uint32),
                ("features", ctypes.c_uint32), ("wq_fd", ctypes.c_uint32), ("resv", ctypes.c_uint32 * 3),
                # head tail ring_mask ring_entries flags dropped|overflow array|cqes resv1 user_addr(u64)
                ("sq_off", ctypes.c_uint32 * 10), ("cq_off", ctypes.c_uint32 * 10)]


class Uring:
    """One io_uring, made at the first `open`, and the eventfd its completions signal (`fd`,
    non-blocking, made at once so that the owner's loop can watch it from the start)."""

    def __init__(self, syscall) -> None:
        self._syscall = syscall
        self.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._ring_fd = -1
        self.inflight = 0
        self._timespec = (ctypes.c_int64 * 2)()     # `arm`'s delay, read by the kernel in enter
        self._disarm: int | None = None             # a timer to remove with the next submission

    def open(self) -> bool:
        """Make the ring (once); False, logged, if the kernel refuses: the caller uses threads."""
        if self._ring_fd >= 0:
            return True
        p = _Params()
        ring_fd = self._syscall(_SETUP, ctypes.c_uint(EVENTS), ctypes.byref(p))
        if ring_fd < 0:
            log.warning("no io_uring for fsync (io_uring_setup: %s): fsync threads instead",
                        os.strerror(ctypes.get_errno()))
            return False
        try:
            self._map(ring_fd, p)
            efd = ctypes.c_int(self.fd)
            if self._syscall(_REGISTER, ring_fd, _REGISTER_EVENTFD, ctypes.byref(efd), 1) < 0:
                raise OSError(ctypes.get_errno(), "io_uring_register")
        except OSError as e:
            os.close(ring_fd)
            log.warning("no io_uring for fsync (%s): fsync threads instead", e)
            return False
        self._ring_fd = ring_fd
        # the ring counts against the process's locked memory until closed: also when an owner is
        # dropped without `close` (tests)
        self._closer = weakref.finalize(self, os.close, ring_fd)
        return True

    def _map(self, ring_fd: int, p: _Params) -> None:
        sq_off, cq_off = list(p.sq_off), list(p.cq_off)
        sq_size = sq_off[6] + p.sq_entries * 4
        cq_size = cq_off[5] + p.cq_entries * 16
        flags, prot = mmap.MAP_SHARED | mmap.MAP_POPULATE, mmap.PROT_READ | mmap.PROT_WRITE
        if p.features & _FEAT_SINGLE_MMAP:
            sq = cq = mmap.mmap(ring_fd, max(sq_size, cq_size), flags, prot, offset=_OFF_SQ_RING)
        else:
            sq = mmap.mmap(ring_fd, sq_size, flags, prot, offset=_OFF_SQ_RING)
            cq = mmap.mmap(ring_fd, cq_size, flags, prot, offset=_OFF_CQ_RING)
        self._sq, self._cq = sq, cq
        self._sqes = mmap.mmap(ring_fd, p.sq_entries * _SQE.size, flags, prot, offset=_OFF_SQES)
        self._sq_entries = p.sq_entries
        self._sq_tail, self._sq_flags, self._sq_array = sq_off[1], sq_off[4], sq_off[6]
        self._sq_mask = _U32.unpack_from(sq, sq_off[2])[0]
        self._cq_head, self._cq_tail, self._cqes = cq_off[0], cq_off[1], cq_off[5]
        self._cq_mask = _U32.unpack_from(cq, cq_off[2])[0]

    def submit(self, jobs: list[tuple[int, int, bool, bool]]) -> tuple[int, OSError | None]:
        """fsync each (token, fd, datasync, after) of `jobs`: fdatasync if `datasync`; if `after`,
        only once every fsync submitted before it has completed (IOSQE_IO_DRAIN: the kernel starts
        it the moment the one under way returns).  Returns how many, from the first, the kernel
        took, and the error that stopped the rest.  A timer `disarm` asked for goes in the same
        enter (no syscall of its own)."""
        n = min(len(jobs), EVENTS - self.inflight)     # the rest wait for a free slot
        done = 0
        error = None
        while done < n:
            batch = min(n - done, self._sq_entries - 1)
            entries = [(_OP_FSYNC, _IO_DRAIN if after else 0, fd, 0, 0, 0, _FSYNC_DATASYNC if datasync else 0, token)
                       for token, fd, datasync, after in jobs[done:done + batch]]
            got, error = self._enter(entries)
            done += got
            if error is not None:
                break
        self.inflight += done
        return done, error

    def arm(self, token: int, seconds: float) -> OSError | None:
        """A timer: a completion of `token` (its result -ETIME) `seconds` from now, through the
        eventfd like an fsync's (the gather of syncer.py; the loop's own timers have millisecond
        steps, an fdatasync here takes a few hundred microseconds).  The error if refused."""
        ns = int(seconds * 1e9)
        self._timespec[0], self._timespec[1] = ns // 1_000_000_000, ns % 1_000_000_000
        got, error = self._enter([(_OP_TIMEOUT, 0, -1, 0, ctypes.addressof(self._timespec), 1, 0, token)])
        self.inflight += got
        return error

    def disarm(self, token: int) -> None:
        """Remove the timer `token` with the next submission: two completions come of it (the
        removal's, and the timer's own, -ECANCELED, or -ETIME and -ENOENT if it had fired)."""
        self._disarm = token

    def quiet(self) -> bool:
        """Nothing of this ring under way but a timer whose removal waits for the next
        submission (`disarm`): an fsync run on the owner's thread meanwhile is the only one of
        the owner's (syncer.py `sync_inline`)."""
        return self.inflight == (self._disarm is not None)

    def send_disarm(self) -> OSError | None:
        """Submit the pending timer removal on its own (no fsync goes with it); the error if
        refused."""
        if self._disarm is None:
            return None
        return self._enter([])[1]

    def _enter(self, entries: list) -> tuple[int, OSError | None]:
        """Put `entries` ((opcode, flags, fd, off, addr, len, op flags, token) each) in the
        submission ring, with the pending `disarm`, and enter them; how many of `entries` the
        kernel took (all or none), and the error if none."""
        sq, sqes, mask = self._sq, self._sqes, self._sq_mask
        extra = self._disarm
        if extra is not None:
            entries = entries + [(_OP_TIMEOUT_REMOVE, 0, -1, 0, extra, 0, 0, 0)]
        count = len(entries)
        while True:
            tail = _U32.unpack_from(sq, self._sq_tail)[0]
            for k, (op, flags, fd, off, addr, length, opflags, token) in enumerate(entries):
                i = (tail + k) & mask
                _SQE.pack_into(sqes, i * _SQE.size, op, flags, 0, fd, off, addr, length, opflags, token)
                _U32.pack_into(sq, self._sq_array + i * 4, i)
            _U32.pack_into(sq, self._sq_tail, (tail + count) & 0xFFFFFFFF)
            got = self._syscall(_ENTER, self._ring_fd, ctypes.c_uint(count), 0, 0, None, 0)
            if got >= 0:
                break
            e = ctypes.get_errno()
            # the kernel took none of them: take them back (it reads the tail only in enter)
            _U32.pack_into(sq, self._sq_tail, tail)
            if e == errno.EINTR:
                continue
            if e == errno.EBUSY and self._overflowed():
                # (kernels before 5.19 refuse submissions while completions wait on the
                # overflow list: move them into the ring, which has room for every fsync
                # under way, and submit again; `reap` takes them)
                self._enter_getevents(0)
                if not self._overflowed():
                    continue
            return 0, OSError(e, f"io_uring_enter: {os.strerror(e)}")
        if got < count:             # (cannot happen without SQPOLL: enter takes all it is given)
            _U32.pack_into(sq, self._sq_tail, (tail + got) & 0xFFFFFFFF)
        if extra is not None and got == count:
            self._disarm = None
            self.inflight += 1      # (the removal's completion; the timer's own was counted by `arm`)
            got -= 1
        return min(got, len(entries) - (extra is not None)), None

    def ready(self) -> bool:
        """A completion waits to be reaped (no syscall), in the ring or held back by the kernel."""
        cq = self._cq
        return (_U32.unpack_from(cq, self._cq_head)[0] != _U32.unpack_from(cq, self._cq_tail)[0]
                or self._overflowed())

    def _overflowed(self) -> bool:
        """The kernel holds completions on its overflow list.  It puts one there when it finds no
        free entry in the completion ring at that moment, and then every later one too (their
        order), until a GETEVENTS enter moves them in; their eventfd signal may have come and
        gone while the ring looked empty.  Seen on 6.18 with a handful of fsyncs under way and
        the ring all but empty: the worker's replies then waited for ever (a sync "always"
        stall)."""
        return bool(_U32.unpack_from(self._sq, self._sq_flags)[0] & _SQ_CQ_OVERFLOW)

    def _enter_getevents(self, wait: int) -> None:
        """Move the overflowed completions into the ring, and with `wait`, block for one."""
        while self._syscall(_ENTER, self._ring_fd, 0, wait, _ENTER_GETEVENTS, None, 0) < 0:
            if ctypes.get_errno() != errno.EINTR:
                raise OSError(ctypes.get_errno(), "io_uring_enter (getevents) failed")

    def reap(self, wait: bool = False) -> list[tuple[int, int]]:
        """(token, errno or 0) of each fsync done; with `wait`, block for at least one if any is
        under way (shutdown)."""
        try:
            os.eventfd_read(self.fd)
        except BlockingIOError:
            pass
        if not self.inflight:
            return []
        if wait and not self.ready():
            self._enter_getevents(1)
        cq, base, mask = self._cq, self._cqes, self._cq_mask
        out = []
        while True:
            if self._overflowed():
                self._enter_getevents(0)
            head = _U32.unpack_from(cq, self._cq_head)[0]
            tail = _U32.unpack_from(cq, self._cq_tail)[0]
            if head == tail:
                break
            while head != tail:
                token, res, _ = _CQE.unpack_from(cq, base + (head & mask) * _CQE.size)
                out.append((token, -res if res < 0 else 0))
                head = (head + 1) & 0xFFFFFFFF
            _U32.pack_into(cq, self._cq_head, head)
        self.inflight -= len(out)
        return out

    def close(self) -> None:
        """Wait for the fsyncs under way, then free the ring."""
        while self.inflight:
            self.reap(wait=True)
        if self._ring_fd >= 0:
            self._sqes.close()
            self._sq.close()
            self._cq.close()
            self._closer()
            self._ring_fd = -1
        os.close(self.fd)
        self.fd = -1


def open_uring() -> Uring | None:
    """io_uring for fsyncs, or None where this module cannot use it (the ring itself is made at
    the first fsync, `Uring.open`)."""
    if platform.machine() != "x86_64" or not hasattr(os, "eventfd"):
        return None
    try:
        syscall = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    syscall.restype = ctypes.c_long
    return Uring(syscall)
