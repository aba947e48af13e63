"""Heartbeats: how the supervisor tells a child whose loop stopped turning (gunicorn's model).

Every child's loop stamps its slot with the monotonic clock at least every
`beat_interval` seconds, including while it blocks in epoll (its wait is bounded by
the interval).  The supervisor reads the stamps once per tick and SIGKILLs a ready
child whose stamp is older than `[server] heartbeat_timeout`; the normal restart path
then replaces it.  gunicorn stamps the mtime of an unlinked temp file; a shared-memory
word (shm.CounterBlock, one 64-byte line per child, one writer each) costs a store
instead of a syscall.  CLOCK_MONOTONIC is the same in every process on Linux, so a
child's stamp and the supervisor's clock compare directly.
"""
from __future__ import annotations

from lanner.ipc.shm import CounterBlock

MAX_BEAT_INTERVAL = 1.0      # seconds; a quarter of the timeout when that is shorter


def beat_interval(timeout_ms: int | None) -> float:
    """How often a child stamps its slot, given the supervisor's timeout."""
    if not timeout_ms:
        return MAX_BEAT_INTERVAL
    return min(MAX_BEAT_INTERVAL, timeout_ms / 4000.0)


class Heart:
    """A child's slot.  `beat(now)` is one memoryview store."""

    __slots__ = ("_words", "interval")

    def __init__(self, words, interval: float) -> None:
        self._words = words
        self.interval = interval

    def beat(self, now: float) -> None:
        self._words[0] = round(now * 1000)


class Heartbeats:
    """One stamp (monotonic ms) per child slot, in shared memory made before forking."""

    def __init__(self, slots: int, timeout_ms: int | None) -> None:
        self.block = CounterBlock.create(slots, ("beat_ms",))
        self.timeout_ms = timeout_ms
        self.interval = beat_interval(timeout_ms)

    def heart(self, slot: int) -> Heart:
        return Heart(self.block.slot(slot).words, self.interval)

    def stamp(self, slot: int, now: float) -> None:
        """Start a new child's clock (its predecessor's stamp must not count against it)."""
        self.block.slot(slot).set(0, round(now * 1000))

    def silent_for(self, slot: int, now: float) -> float:
        """Seconds since the slot's last stamp."""
        return now - self.block.get(slot, 0) / 1000.0

    def overdue(self, slot: int, now: float) -> float | None:
        """Seconds of silence when past the timeout, else None."""
        if not self.timeout_ms:
            return None
        silent = self.silent_for(slot, now)
        return silent if silent * 1000 > self.timeout_ms else None
