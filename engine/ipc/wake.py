"""Waking a process that consumes several rings: one eventfd per process, and
the sleep handshake over all of its rings at once (ring.py describes the
flag protocol of one ring, and the fence both rely on).

Usage (a consumer of several rings sharing one WakeFd ``wake``)::

    while running:
        for r in out_rings:
            if r.backlog: r.publish()             # space wakeups land here
        busy = False
        for r in in_rings:
            for rec in r.read_batch():            # memoryviews: copy what you keep
                handle(rec); busy = True
            r.release()
        publish replies (every ~16 and at the end)
        if not busy and prepare_sleep_all(in_rings):
            wake.wait(timeout)
            clear_sleep_all(in_rings)
            wake.drain()

A front does the same from ``loop.add_reader(wake.fd, on_wake)``, staying
flagged while it is back in the event loop.
"""
from __future__ import annotations

import os
from typing import Iterable

from lanner.ipc.fdwait import wait_readable
from lanner.ipc.ring import Ring, fence


def drain_eventfd(fd: int) -> int:
    """Reset a non-blocking eventfd; how many signals were pending (0 if none).  The fronts and
    shard loops hold the bare fd (an event-loop reader), the WakeFd wraps it: both drain here."""
    try:
        return os.eventfd_read(fd)
    except BlockingIOError:
        return 0


class WakeFd:
    """One non-blocking eventfd per consuming process.

    Not close-on-exec on purpose: the fd must survive into forked children (fork
    keeps fds anyway; no exec ever happens).  Producers write it only when a
    consumer flagged sleeping, so reads are rare and drain everything at once.
    """

    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd

    @classmethod
    def create(cls) -> WakeFd:
        return cls(os.eventfd(0, os.EFD_NONBLOCK))

    def signal(self) -> None:
        os.eventfd_write(self.fd, 1)

    def drain(self) -> int:
        """Reset the counter; return how many signals were pending (0 if none)."""
        return drain_eventfd(self.fd)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until signalled (True) or `timeout` seconds pass (False).  Does not
        drain: the caller drains after it has cleared its sleeping flags."""
        return wait_readable((self.fd,), timeout)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def prepare_sleep_all(rings: Iterable[Ring]) -> bool:
    """`prepare_sleep` for every ring a consumer reads, with one fence.  True: all
    are empty and flagged, sleep on the shared wake fd.  False: some ring has data;
    every flag is cleared again."""
    rings = tuple(rings)
    for r in rings:
        r.flag_sleep()
    fence()
    for r in rings:
        if not r.empty():
            clear_sleep_all(rings)
            return False
    return True


def clear_sleep_all(rings: Iterable[Ring]) -> None:
    for r in rings:
        r.clear_sleep()
