"""Clocks.  Every engine call reads "now" from a clock object so that tests
drive time by hand instead of sleeping (trio's MockClock, Kestrel's FakeTimer).
"""
from __future__ import annotations

import time


class SystemClock:
    """Wall-clock milliseconds since the epoch, as Kestrel stamps items."""

    __slots__ = ()

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()


class FakeClock:
    """A clock that moves only when told to."""

    __slots__ = ("_ms", "_mono")

    def __init__(self, now_ms: int = 1_700_000_000_000) -> None:
        self._ms = now_ms
        self._mono = 1000.0

    def now_ms(self) -> int:
        return self._ms

    def monotonic(self) -> float:
        return self._mono

    def advance(self, ms: int) -> None:
        self._ms += ms
        self._mono += ms / 1000.0

    def set(self, now_ms: int) -> None:
        self._mono += (now_ms - self._ms) / 1000.0
        self._ms = now_ms


SYSTEM_CLOCK = SystemClock()
