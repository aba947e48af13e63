"""The front counters in the shared CounterBlock, and the global stats built from them.

One slot per front; the supervisor sizes the block from FRONT_COUNTERS before forking, the
fronts count into their own slot, and `stats` adds every slot up (reference §4.1).
"""
from __future__ import annotations

import psutil

from lanner import __version__
from lanner.ops import latency

# the first ten, then the latency histogram columns (ops/latency.py); routed_requests: requests
# a worker's own front sent over a ring to another worker, handoffs: connections a worker
# adopted from another worker's front (server/local.py); open_here: see below
FRONT_COUNTERS = ("curr_connections", "total_connections", "bytes_read", "bytes_written",
                  "cmd_get", "cmd_set", "cmd_peek", "routed_requests", "handoffs",
                  "open_here") + latency.COUNTERS
C_CURR, C_TOTAL, C_READ, C_WRITTEN, C_GET, C_SET, C_PEEK, C_ROUTED, C_HANDOFFS, C_HERE = range(10)

# A connection that moves to another worker (server/local.py) leaves its +1 in curr_connections
# where it was accepted, and the slot where it closes takes the -1: only the sum means anything,
# and a move never changes it, so no reader sees a moving connection twice or not at all.
# `open_here` counts the connections that die with this process (accepted or adopted here and
# not handed away): what its replacement takes off curr_connections (forget_dead).


def forget_dead(slot) -> None:
    """The process of this CounterSlot died, and its clients' connections with it."""
    slot.decr(C_CURR, slot.get(C_HERE))
    slot.set(C_HERE, 0)

GLOBAL_STAT_ORDER = ("uptime", "time", "version", "curr_items", "total_items", "bytes",
                     "reserved_memory_ratio", "curr_connections", "total_connections", "cmd_get",
                     "cmd_set", "cmd_peek", "get_hits", "get_misses", "bytes_read", "bytes_written",
                     "queue_creates", "queue_deletes", "queue_expires", "routed_requests", "handoffs",
                     "fsyncs")


def global_stats(counters, started_at: float, now: float,
                 worker_globals: list[dict]) -> list[tuple[str, str]]:
    """The global part of `stats`: the workers' figures summed, the fronts' counters totalled.
    `started_at` and `now` are seconds since the epoch."""
    def wsum(key):
        return sum(g.get(key, 0) for g in worker_globals)
    ratio = wsum("reserved_memory") / psutil.virtual_memory().total
    vals = {
        "uptime": int(now - started_at),
        "time": int(now),
        "version": __version__,
        "curr_items": wsum("curr_items"),
        "total_items": wsum("total_items"),
        "bytes": wsum("bytes"),
        "reserved_memory_ratio": f"{ratio:.3f}",
        "curr_connections": counters.total(C_CURR),
        "total_connections": counters.total(C_TOTAL),
        "cmd_get": counters.total(C_GET),
        "cmd_set": counters.total(C_SET),
        "cmd_peek": counters.total(C_PEEK),
        "get_hits": wsum("get_hits"),
        "get_misses": wsum("get_misses"),
        "bytes_read": counters.total(C_READ),
        "bytes_written": counters.total(C_WRITTEN),
        "queue_creates": wsum("queue_creates"),
        "queue_deletes": wsum("queue_deletes"),
        "queue_expires": wsum("queue_expires"),
        "routed_requests": counters.total(C_ROUTED),
        "handoffs": counters.total(C_HANDOFFS),
        "fsyncs": wsum("fsyncs"),          # the workers' group-commit fsyncs (server/peers.py)
    }
    return [(k, str(vals[k])) for k in GLOBAL_STAT_ORDER]
