"""Clocks.  Every engine call reads "now" from a clock object so that tests
drive time by hand instead of sleeping (trio's MockClock, Kestrel's FakeTimer).
"""
from __future__ import annotations

import time

# COMPILED: True in the compiled build (setup.py), where clock.pxd's C reading of the clock
# replaces the Python expression beside it (it exists only there); a C constant there.
try:
    import cython
    COMPILED = cython.compiled
except ImportError:             # pure Python without Cython installed
    COMPILED = False


class SystemClock:
    """Wall-clock milliseconds since the epoch, as Kestrel stamps items."""

    __slots__ = ()

    def now_ms(self) -> int:
        # read once per request (an add's stamp, a remove's expiry check): ~1.1k instructions
        # through time.time_ns, ~100 in C
        if COMPILED:
            return _c_now_ms()
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
