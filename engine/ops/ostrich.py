"""Ostrich's stats views: `labels`, `metrics`, `/stats.json?period=N` and `/stats.txt`.

`/stats.json` (protocols/admin.py) maps the merged `stats` figures onto
Ostrich's counters and gauges.  This module adds the two other sections:

* `labels`: `status` (reported), `enforced_status` and `version`, as strings;
* `metrics`: one Ostrich distribution per command family,
  `<family>_latency_usec` (latency.py), with Ostrich's keys: `count`, and when
  it is not zero `sum`, `average`, `minimum`, `maximum`, `p50` `p90` `p95`
  `p99` `p999` `p9999`, in microseconds.  Lanner keeps bucket counts, not
  samples, so percentiles, minimum and maximum are bucket bounds (Ostrich's
  own percentiles were bucket bounds too).

`?period=N` is Ostrich's `LatchedStatsListener`: created by the first request
for that period, it latches the figures every N seconds and every request
until the next latch gets the same answer: counters (and metrics) as deltas
over the latched period, gauges and labels as they were at the latch.  The
first answer, like Ostrich's, counts from zero (the server's start).  Latches
fall on multiples of N seconds of wall-clock time.  The admin process alone
serves the admin port, so there is one listener per period for the whole
server and every scraper, on whatever connection, sees the same window.  At
most `MAX_LISTENERS` periods are kept.

`/stats.txt` is Ostrich's plain-text rendering of the same document (its
`CommandHandler.flatten`): keys sorted, a nested map as `key:` followed by
its lines indented two spaces, a single value as `key: value`, whole doubles
without a fraction.
"""
from __future__ import annotations

import json
import time

from . import latency

MAX_LISTENERS = 8
_PCTS = (("p50", 0.5), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99), ("p999", 0.999),
         ("p9999", 0.9999))


def labels(status, version: str) -> dict[str, str]:
    reported, enforced = status
    return {"status": reported, "enforced_status": enforced, "version": version}


def distribution(buckets: list[int], sum_us: int) -> dict[str, int]:
    count = sum(buckets)
    out = {"count": count}
    if not count:
        return out
    nz = [i for i, b in enumerate(buckets) if b]
    bound_us = [int(b * 1e6) for b in latency.BOUNDS]
    lo, hi = nz[0], nz[-1]
    out.update({"sum": sum_us, "average": sum_us // count,
                "minimum": 0 if lo == 0 else bound_us[lo - 1],
                "maximum": bound_us[min(hi, len(bound_us) - 1)]})
    for key, q in _PCTS:
        out[key] = int(latency.percentile(buckets, q) * 1e6)
    return out


def metrics_section(lat) -> dict[str, dict[str, int]]:
    return {f"{fam}_latency_usec": distribution(b, s) for fam, (b, s) in lat.items()}


def document(stats_json: bytes, status, version: str, lat) -> dict:
    """The full Ostrich document: protocols.admin's counters and gauges plus labels and metrics."""
    doc = json.loads(stats_json)
    doc["labels"] = labels(status, version)
    doc["metrics"] = metrics_section(lat) if lat is not None else {}
    return doc


def dumps(doc: dict) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def _lines(obj) -> list[str]:
    if isinstance(obj, dict):
        out = []
        for k in sorted(obj, key=str):
            sub = _lines(obj[k])
            if len(sub) == 1 and ": " not in sub[0]:
                out.append(f"{k}: {sub[0]}")
            else:
                out.append(f"{k}:")
                out.extend("  " + s for s in sub)
        return out
    if isinstance(obj, (list, tuple)):
        return [line for x in obj for line in _lines(x)]
    if isinstance(obj, float):
        return [str(int(obj)) if obj.is_integer() else repr(obj)]
    return [str(obj)]


def text(doc: dict) -> bytes:
    """Ostrich's `/stats.txt`."""
    return ("\n".join(_lines(doc)) + "\n").encode()


# ------------------------------------------------------------------ period listeners

def _delta_dist(now: tuple[list[int], int], before: tuple[list[int], int] | None):
    if before is None:
        return now
    return [a - b for a, b in zip(now[0], before[0])], now[1] - before[1]


class Listener:
    """One period's latch (Ostrich LatchedStatsListener), in the admin process."""

    def __init__(self, period: float) -> None:
        self.period = period
        self.last_counters: dict[str, int] = {}      # cumulative at the last latch
        self.last_lat: dict | None = None
        self.latched: dict | None = None             # the document served until the next latch
        self.next_at = 0.0

    def latch(self, doc: dict, lat: dict, now: float | None = None) -> None:
        """Take the cumulative document `doc` (with `lat` the raw latency sums) as the new latch."""
        now = time.time() if now is None else now
        counters = doc["counters"]
        deltas = {k: v - self.last_counters.get(k, 0) for k, v in counters.items()}
        lat_d = {fam: _delta_dist(v, (self.last_lat or {}).get(fam)) for fam, v in lat.items()}
        self.latched = {"counters": deltas, "gauges": doc["gauges"], "labels": doc["labels"],
                        "metrics": metrics_section(lat_d)}
        self.last_counters = dict(counters)
        self.last_lat = lat
        if not self.next_at:
            self.next_at = (int(now // self.period) + 1) * self.period

    def advance(self, now: float | None = None) -> None:
        """Move `next_at` to the first boundary after the one just reached (a timer may
        fire a little early or late; neither latches twice in one period)."""
        now = time.time() if now is None else now
        self.next_at += self.period
        while self.next_at <= now:
            self.next_at += self.period

    def delay(self, now: float | None = None) -> float:
        now = time.time() if now is None else now
        return max(0.0, self.next_at - now)


def parse_period(value: str | None) -> int | None:
    """Seconds from `?period=`; None when absent; ValueError when not a positive integer."""
    if value is None:
        return None
    n = int(value)
    if n <= 0 or n > 86400:
        raise ValueError(value)
    return n
