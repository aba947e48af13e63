"""fsync and fdatasync through Linux's native AIO (io_submit), for the group commit (syncer.py).

Why not threads: an fsync thread needs the GIL after every fsync (and for the queue it takes
work from and the byte that wakes the owner), and the owner's loop needs it between every
callback, so under "always" the two convoy: py-spy of a worker at 10 connections put the loop
in its journal `write` and in `SimpleQueue.put` for a third of its time, waiting to get the GIL
back (issue 8, P5).  An fsync submitted here runs in a kernel worker (since Linux 4.18); its
completion signals an eventfd that the owner's loop watches, and `reap` collects it, all on the
owner's thread.  The kernel holds the file open from submission to completion, so the owner may
close or rotate it meanwhile.

Called through ctypes (os has no io_submit; ctypes releases the GIL for each call, which takes
microseconds).  `open_aio` returns None where this does not work (not Linux x86-64/arm64, AIO
disabled or its system-wide limit reached): the syncer then uses threads.
"""
from __future__ import annotations

import ctypes
import errno
import logging
import os
import platform
import weakref

log = logging.getLogger(__name__)

#: fsyncs under way at once per context (more wait for a free slot).  Each counts against the
#: system-wide /proc/sys/fs/aio-max-nr (65536 by default), shared with every other process.
EVENTS = 128

_IOCB_CMD_FSYNC, _IOCB_CMD_FDSYNC = 2, 3
_IOCB_FLAG_RESFD = 1
_AIO_RING_MAGIC = 0xA10A10A1
# io_setup, io_destroy, io_getevents, io_submit
_SYSCALLS = {"x86_64": (206, 207, 208, 209), "aarch64": (0, 1, 4, 2)}


class _Iocb(ctypes.Structure):
    _fields_ = [("aio_data", ctypes.c_uint64), ("aio_key", ctypes.c_uint32), ("aio_rw_flags", ctypes.c_int32),
                ("aio_lio_opcode", ctypes.c_uint16), ("aio_reqprio", ctypes.c_int16),
                ("aio_fildes", ctypes.c_uint32), ("aio_buf", ctypes.c_uint64), ("aio_nbytes", ctypes.c_uint64),
                ("aio_offset", ctypes.c_int64), ("aio_reserved2", ctypes.c_uint64), ("aio_flags", ctypes.c_uint32),
                ("aio_resfd", ctypes.c_uint32)]


class _IoEvent(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64), ("obj", ctypes.c_uint64), ("res", ctypes.c_int64),
                ("res2", ctypes.c_int64)]


class Aio:
    """One AIO context, made at the first `submit`, and the eventfd its completions signal (`fd`,
    non-blocking, made at once so that the owner's loop can watch it from the start)."""

    def __init__(self, syscall, numbers: tuple[int, int, int, int]) -> None:
        self._syscall = syscall
        self._setup, self._destroy, self._getevents, self._submit = numbers
        self._ctx: ctypes.c_ulong | None = None
        self.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._iocbs = (_Iocb * EVENTS)()
        self._ptrs = (ctypes.POINTER(_Iocb) * EVENTS)(*[ctypes.pointer(c) for c in self._iocbs])
        self._events = (_IoEvent * EVENTS)()
        self._ring = None
        self._closer = None
        self.inflight = 0

    def open(self) -> bool:
        """Make the context (once); False, logged, if the kernel refuses (AIO disabled, or the
        system-wide limit reached): the caller uses threads instead."""
        if self._ctx is not None:
            return True
        ctx = ctypes.c_ulong(0)
        if self._syscall(self._setup, ctypes.c_long(EVENTS), ctypes.byref(ctx)) < 0:
            log.warning("no kernel AIO for fsync (io_setup: %s): fsync threads instead",
                        os.strerror(ctypes.get_errno()))
            return False
        self._ctx = ctx
        # The kernel's completion ring is mapped at the context's address: head != tail means a
        # completion is waiting, readable without a syscall (as libaio does).
        ring = (ctypes.c_uint * 5).from_address(ctx.value)
        self._ring = ring if ring[4] == _AIO_RING_MAGIC else None
        # A context counts against the system-wide limit until destroyed: also when an owner is
        # dropped without `close` (tests)
        self._closer = weakref.finalize(self, self._syscall, self._destroy, ctypes.c_ulong(ctx.value))
        return True

    def submit(self, jobs: list[tuple[int, int, bool]]) -> tuple[int, OSError | None]:
        """fsync (fdatasync if the bool is true) each (token, fd, datasync) of `jobs`.  Returns how
        many, from the first, the kernel took, and the error that stopped the rest."""
        iocbs = self._iocbs
        n = min(len(jobs), EVENTS - self.inflight)      # the rest wait for a free slot
        for i in range(n):
            token, fd, datasync = jobs[i]
            cb = iocbs[i]
            cb.aio_data = token
            cb.aio_lio_opcode = _IOCB_CMD_FDSYNC if datasync else _IOCB_CMD_FSYNC
            cb.aio_fildes = fd
            cb.aio_flags = _IOCB_FLAG_RESFD
            cb.aio_resfd = self.fd
        done = 0
        error = None
        while done < n:
            got = self._syscall(self._submit, self._ctx, ctypes.c_long(n - done),
                                ctypes.byref(self._ptrs, done * ctypes.sizeof(ctypes.c_void_p)))
            if got < 0:
                e = ctypes.get_errno()
                if e == errno.EINTR:
                    continue
                error = OSError(e, f"io_submit: {os.strerror(e)}")
                break
            done += got
        self.inflight += done
        return done, error

    def ready(self) -> bool:
        """A completion waits to be reaped (no syscall)."""
        ring = self._ring
        return ring is None or ring[2] != ring[3]

    def reap(self, wait: bool = False) -> list[tuple[int, int]]:
        """(token, errno or 0) of each fsync done; with `wait`, block for at least one if any is
        under way (shutdown)."""
        try:
            os.eventfd_read(self.fd)
        except BlockingIOError:
            pass
        out = []
        events = self._events
        while self.inflight:
            n = self._syscall(self._getevents, self._ctx, ctypes.c_long(1 if wait and not out else 0),
                              ctypes.c_long(EVENTS), events, None)
            if n < 0:
                if ctypes.get_errno() == errno.EINTR:
                    continue
                raise OSError(ctypes.get_errno(), "io_getevents failed")
            if n == 0:
                break
            self.inflight -= n
            for i in range(n):
                ev = events[i]
                out.append((ev.data, -ev.res if ev.res < 0 else 0))
        return out

    def close(self) -> None:
        """Wait for the fsyncs under way, then free the context."""
        while self.inflight:
            self.reap(wait=True)
        if self._closer is not None:
            self._closer()              # io_destroy
        os.close(self.fd)
        self.fd = -1


def open_aio() -> Aio | None:
    """Kernel AIO for fsyncs, or None where the platform offers none (the context itself is made
    at the first fsync, `Aio.open`)."""
    numbers = _SYSCALLS.get(platform.machine())
    if numbers is None or not hasattr(os, "eventfd"):
        return None
    try:
        syscall = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    syscall.restype = ctypes.c_long
    return Aio(syscall, numbers)
