"""One module per scenario.  Each defines NAME, HELP, DEFAULT_PORT, THROUGHPUT (whether `compare`
may run it against memcached), `add_arguments(parser)` and `run(args, ctx) -> Report`."""
from __future__ import annotations

import importlib
from types import ModuleType

MODULES = {
    "put-many": "put_many",
    "flood": "flood",
    "many-clients": "many_clients",
    "packing": "packing",
    "fairness": "fairness",
    "memory": "memory",
    "mixed": "mixed",
    "leaky-reader": "leaky_reader",
    "scrape": "scrape",
}


def load(name: str) -> ModuleType:
    return importlib.import_module(f"lanner.perf.scenarios.{MODULES[name]}")


def int_list(text: str) -> list[int]:
    """`1,10,100` -> [1, 10, 100], for sweeps."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise ValueError(f"expected comma-separated non-negative integers, got {text!r}")
    return values
