"""Request latency histograms per command family, shared by every front.

Each front owns one row of the shared `CounterBlock` (ipc/shm.py).  The
columns `COUNTERS` are appended to the front counters: for every family in
`FAMILIES`, one non-cumulative count per bucket of `BOUNDS` (plus +Inf), then
the sum of the observed latencies in microseconds.  A front is the only writer
of its row, so `observe` is two plain stores; readers sum the rows (`read`).

Latency is measured from the moment the request's bytes were read
(`Conn.t_in`, fronts/conn.py) to the moment its reply is complete and queued for
writing, so time spent behind a blocking command or waiting on a worker counts.
A blocking get (`t=`) or a monitor includes its wait.
"""
from __future__ import annotations

from time import monotonic as _monotonic

# COMPILED: True in the compiled build (setup.py), where latency.pxd's C reading of the clock
# replaces `_monotonic()` in `since` (it exists only there); a C constant there.
try:
    import cython
    COMPILED = cython.compiled
except ImportError:             # pure Python without Cython installed
    COMPILED = False

#: command families, in column order
FAMILIES = ("get", "set", "peek", "monitor", "confirm", "abort", "delete", "flush", "stats",
            "admin", "other")
#: bucket upper bounds in seconds (Prometheus `le`); a last +Inf bucket follows
BOUNDS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
          1.0, 2.5, 5.0, 10.0)
if COMPILED:        # observe's C copy of BOUNDS (latency.pxd) must be the same bounds
    assert len(BOUNDS) == 16 and all(_c_bound(i) == b for i, b in enumerate(BOUNDS)), \
        "latency.pxd's bounds differ from BOUNDS"
_NB = len(BOUNDS) + 1           # buckets per family, +Inf included
_STRIDE = _NB + 1               # buckets, then the sum in microseconds

COUNTERS = tuple(
    name for fam in FAMILIES
    for name in [f"lat_{fam}_{i}" for i in range(_NB)] + [f"lat_{fam}_sum_us"])

OTHER = FAMILIES.index("other")

# command class name (memcache, text) or thrift method -> family index
_NAMES = {
    "get": "get", "set": "set", "sethead": "set", "setrefused": "set", "put": "set", "peek": "peek",
    "monitor": "monitor", "confirm": "confirm", "abort": "abort", "delete": "delete",
    "delete_queue": "delete", "flush": "flush", "flushall": "flush", "flushexpired": "flush",
    "flushallexpired": "flush", "flush_queue": "flush", "flush_all_queues": "flush",
    "stats": "stats", "dumpstats": "stats", "dumpconfig": "stats", "httprequest": "admin",
    "httperror": "admin",
}
#: command class -> family index, for the classes whose family the class alone decides; filled
#: by family_of (a connection looks a command's class up here first: no call per request)
BY_TYPE: dict[type, int] = {}


def family_of(cmd) -> int:
    """Family index of a parsed command (memcache/text command objects by class,
    thrift calls by method name, admin requests as `admin`)."""
    i = BY_TYPE.get(type(cmd))
    if i is not None:
        return i
    method = getattr(cmd, "method", None)
    if isinstance(method, str) and type(cmd).__name__ == "Call":
        return FAMILIES.index(_NAMES.get(method, "other"))
    i = BY_TYPE[type(cmd)] = FAMILIES.index(_NAMES.get(type(cmd).__name__.lower(), "other"))
    return i


class Recorder:
    """One front's writer: `observe(family, seconds)`, once per request.  Compiled (setup.py,
    latency.pxd) the row is a typed memoryview and an observation a few C statements, where
    a memoryview's item read-modify-write from Python costs more than the rest of it."""

    __slots__ = ("words", "base")

    def __init__(self, slot, first_column: int) -> None:
        self.words = slot.words          # the front's row, a memoryview of int64
        self.base = first_column

    def since(self, family: int, t0: float) -> None:
        """`observe` of the time since `t0` (time.monotonic()): one call per reply instead of
        the clock's and this one from the caller's bytecode."""
        if COMPILED:
            self.observe(family, _c_monotonic() - t0)
        else:
            self.observe(family, _monotonic() - t0)

    def since_n(self, family: int, t0: float, n: int) -> None:
        """`since` for `n` replies released together (one batch's rendered replies,
        fronts/rendered.py): the counts of `n` calls, in one."""
        if COMPILED:
            self.observe(family, _c_monotonic() - t0, n)
        else:
            self.observe(family, _monotonic() - t0, n)

    def observe(self, family: int, seconds: float, n: int = 1) -> None:
        if family < 0 or n <= 0:
            return
        col = self.base + family * _STRIDE
        if COMPILED:
            i = _c_bucket(seconds)       # (latency.pxd: the same loop over a C array)
        else:
            i = 0
            for bound in BOUNDS:         # bisect_left(BOUNDS, seconds)
                if seconds <= bound:
                    break
                i += 1
        w = self.words
        w[col + i] += n
        us = int(seconds * 1e6)
        w[col + _NB] += us * n


def read(counters) -> dict[str, tuple[list[int], int]]:
    """Sum over every front: family -> (per-bucket counts, +Inf last; sum in µs)."""
    first = counters.column(COUNTERS[0])
    out = {}
    for f, fam in enumerate(FAMILIES):
        col = first + f * _STRIDE
        buckets = [counters.total(col + i) for i in range(_NB)]
        out[fam] = (buckets, counters.total(col + _NB))
    return out


def cumulative(buckets: list[int]) -> list[int]:
    out, run = [], 0
    for b in buckets:
        run += b
        out.append(run)
    return out


def percentile(buckets: list[int], q: float) -> float:
    """The upper bound (seconds) of the bucket holding quantile q; the last finite
    bound for +Inf, 0 when empty (Ostrich's histogram percentiles are bucket bounds too)."""
    total = sum(buckets)
    if not total:
        return 0.0
    rank = q * total
    run = 0
    for i, b in enumerate(buckets):
        run += b
        if run >= rank and b:
            return BOUNDS[min(i, len(BOUNDS) - 1)]
    return BOUNDS[-1]
