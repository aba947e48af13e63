"""One module per scenario.  Each defines NAME, HELP, COMPARE (the report column by which `compare`
ranks two servers, or None where the scenario is not a throughput race `compare` may run against
memcached), `add_arguments(parser)` and `run(args, ctx) -> Report`; DEFAULT_PORT only where it is
not the memcache port (see `default_port`)."""
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


MEMCACHE_PORT = 22133


def default_port(mod: ModuleType) -> int:
    """Most scenarios speak memcache, so its port is the default unless a scenario names another
    (leaky-reader speaks thrift); one place keeps that default from drifting between scenarios."""
    return getattr(mod, "DEFAULT_PORT", MEMCACHE_PORT)


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


# The options most scenarios take, declared once so that their flags, types and wording agree
# across scenarios: name -> (flags, argparse keywords, help).  A scenario picks the ones it takes
# with `add_options`, giving each its own default (and, where the meaning narrows, its own help).
COMMON: dict[str, tuple[tuple[str, ...], dict, str]] = {
    "queue": (("-q", "--queue"), {}, "queue"),
    "count": (("-n", "--count"), {"type": int}, "items to put"),
    "sets": (("-s", "--sets"), {"type": int}, "sets"),
    "kilobytes": (("-k", "--kilobytes"), {"type": int}, "KiB per item"),
    "bytes": (("-b", "--bytes"), {"type": int}, "bytes per item"),
    "item_size": (("-i", "--item-size"), {"type": int}, "bytes per item"),
    "concurrency": (("-c", "--concurrency"), {"type": int}, "connections"),
    "clients": (("-c", "--clients"), {"type": int}, "concurrent clients"),
    "rollup": (("-r", "--rollup"), {"type": int}, "requests per write"),
    "depth": (("-r", "--depth"), {"type": int}, "requests per write"),
    "duration": (("--duration",), {"type": float}, "seconds to run"),
    "seed": (("--seed",), {"type": int}, "random seed"),
    "timeout": (("--timeout",), {"type": float}, "give up after this many seconds"),
    "no_flush": (("-F", "--no-flush"), {"action": "store_true"}, "don't flush the queue first"),
}


def add_options(group, **chosen) -> None:
    """Add the COMMON options a scenario takes.  Each keyword is an option's default, or a
    (default, help) pair.  The help names the default (argparse's plain formatter would not),
    unless it is None or the help already says it in its own words.  A flag (`no_flush=True`)
    takes no default."""
    for name, given in chosen.items():
        flags, kwargs, help_text = COMMON[name]
        default, help_text = given if isinstance(given, tuple) else (given, help_text)
        if kwargs.get("action") == "store_true":
            group.add_argument(*flags, help=help_text, **kwargs)
            continue
        if default is not None and "(default" not in help_text:
            shown = f"{default:g}" if isinstance(default, float) else default
            help_text = f"{help_text} (default {shown})"
        group.add_argument(*flags, default=default, help=help_text, **kwargs)
