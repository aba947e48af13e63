"""Option parsing shared by the sources and sinks.

Spark hands options over in a case-insensitive dict whose keys are lower-cased
and whose values are strings; `plain()` turns that into a plain dict with
lower-case keys (picklable, and safe to copy), and every getter here looks keys
up lower-cased, so `maxItemsPerBatch` and `maxitemsperbatch` are the same.
"""
from __future__ import annotations

import datetime as dt


def plain(options) -> dict:
    return {str(k).lower(): v for k, v in dict(options).items()}


def get(options, key: str, default=None):
    v = options.get(key.lower())
    return default if v is None else v


def bool_option(options, key: str, default: bool) -> bool:
    raw = get(options, key)
    if raw is None or raw == "":
        return default
    val = str(raw).strip().lower()
    if val in ("true", "1", "yes", "on"):
        return True
    if val in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"option {key} must be true or false, got {raw!r}")


def int_option(options, key: str, default: int | None, lo: int = 1) -> int | None:
    raw = get(options, key)
    if raw is None or raw == "":
        return default
    try:
        val = int(str(raw).strip())
    except ValueError:
        raise ValueError(f"option {key} must be an integer, got {raw!r}") from None
    if val < lo:
        raise ValueError(f"option {key} must be >= {lo}, got {val}")
    return val


def parse_time_ms(text: str) -> int:
    """Epoch milliseconds from an integer string or an ISO-8601 time (UTC unless it says)."""
    text = str(text).strip()
    try:
        return int(text)
    except ValueError:
        pass
    t = dt.datetime.fromisoformat(text)
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.timezone.utc)
    return int(t.timestamp() * 1000)


def now_option(options) -> int | None:
    raw = options.get("now")
    if raw is None or raw == "":
        return None
    try:
        return parse_time_ms(raw)
    except ValueError:
        raise ValueError(f"option now must be epoch milliseconds or an ISO-8601 time, got {raw!r}") from None
