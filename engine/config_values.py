"""How one configuration value is read and checked: sizes, durations, the per-key checkers and
the tables of known keys; ConfigError.  config.py builds the Config from them.

Sizes are int bytes or strings with binary units (`KB`/`MB`/... are binary too, as in Kestrel),
saturating at 2**63-1 (Kestrel's Long.MaxValue).  Durations are int milliseconds or strings
("250ms", "1s", "5m", "1h", "1d"); `"off"` is None where the setting is optional.  Each checker
is (value, key, lenient) -> validated value; `lenient` is true for command-line overrides,
whose numbers arrive as strings.
"""
from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Callable

from lanner.queues.names import validate_queue_name
from lanner.queues.placement import PARTITIONS

__all__ = ["CMDLOG_FIELDS", "Checker", "ConfigError", "INT_MAX", "LONG_MAX", "QUEUE_FIELDS",
           "SERVER_FIELDS", "ZOOKEEPER_FIELDS", "key_part", "parse_duration", "parse_size",
           "wire_name"]

INT_MAX = 2147483647          # Kestrel's Int.MaxValue
LONG_MAX = 2**63 - 1          # Kestrel's Long.MaxValue
CMDLOG_HEADER_SIZE = 8        # workq segment header; a segment must hold more than that


class ConfigError(Exception):
    """A bad configuration value.  `key` is the dotted TOML key ("" when the
    fault is the file itself) and `file` the config file, None for built-in
    defaults or command-line overrides."""

    def __init__(self, key: str, reason: str, file: str | None = None) -> None:
        self.key = key
        self.reason = reason
        self.file = file
        super().__init__(key, reason, file)

    def __str__(self) -> str:
        return f"{self.brief} (in {self.file})" if self.file else self.brief

    @property
    def brief(self) -> str:
        """The key and the reason without the file: what a client may be told."""
        return f"{self.key}: {self.reason}" if self.key else self.reason

    def in_file(self, file: str | None) -> "ConfigError":
        return ConfigError(self.key, self.reason, file)


# ------------------------------------------------------------------- names and keys

def wire_name(name: str) -> str:
    """The latin-1 str of the name's UTF-8 bytes: what a client sending it uses."""
    return name.encode("utf-8", "surrogatepass").decode("latin-1")


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def key_part(name: str) -> str:
    """`name` as a TOML key: bare when it can be, else a basic string with
    escapes, so an error message stays on one line whatever the name holds."""
    if _BARE_KEY.fullmatch(name):
        return name
    out = []
    for c in name:
        if c in '"\\':
            out.append("\\" + c)
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


# ------------------------------------------------------------------- sizes, durations

_NUMBER = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*")

_SIZE_UNITS: dict[str, int] = {"": 1, "b": 1, "byte": 1, "bytes": 1}
for _i, _p in enumerate("kmgtpe", start=1):
    for _suffix in (_p, _p + "b", _p + "ib"):
        _SIZE_UNITS[_suffix] = 1 << (10 * _i)

_DURATION_UNITS: dict[str, int] = {}
for _names, _ms in ((("", "ms", "msec", "millis", "millisecond", "milliseconds"), 1),
                    (("s", "sec", "secs", "second", "seconds"), 1000),
                    (("m", "min", "mins", "minute", "minutes"), 60_000),
                    (("h", "hr", "hrs", "hour", "hours"), 3_600_000),
                    (("d", "day", "days"), 86_400_000)):
    for _n in _names:
        _DURATION_UNITS[_n] = _ms


def _scaled(text: str, units: dict[str, int]) -> int | None:
    """`text` as a whole number of base units, or None when it is not a number with a known unit."""
    m = _NUMBER.fullmatch(text)
    if m is None:
        return None
    mult = units.get(m.group(2).lower())
    if mult is None:
        return None
    try:
        return int(Decimal(m.group(1)) * mult)
    except InvalidOperation:
        return None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _quantity(value: object, key: str, units: dict, what: str, example: str, forms: str) -> int:
    """A non-negative int, given bare or as a string with one of `units`: sizes and durations
    accept the same two forms and refuse bad input with the same wording."""
    if _is_int(value):
        n = value
    elif isinstance(value, str):
        n = _scaled(value, units)
        if n is None:
            raise ConfigError(key, f"expected a {what} {example}, got {value!r}")
    else:
        raise ConfigError(key, f"expected a {what} ({forms}), got {value!r}")
    if n < 0:
        raise ConfigError(key, f"a {what} cannot be negative, got {value!r}")
    return n


def parse_size(value: object, key: str) -> int:
    """Bytes from an int or a string such as "512KiB", "1.5MiB", "1GB" or "100".

    Units are binary whatever their spelling, as Kestrel's StorageUnit; results
    above 2**63-1 saturate there, so "8EiB" means "no limit".
    """
    n = _quantity(value, key, _SIZE_UNITS, "size", "such as 16MiB", "integer bytes or a string such as \"16MiB\"")
    return min(n, LONG_MAX)


def parse_duration(value: object, key: str) -> int | None:
    """Milliseconds from an int or a string such as "250ms", "1s", "5m", "1h", "1d"; "off" is None.

    Callers decide whether None (and 0) are allowed for their setting.
    """
    if isinstance(value, str) and value.strip().lower() == "off":
        return None
    n = _quantity(value, key, _DURATION_UNITS, "duration", "such as 250ms, 1s, 5m, 1h, 1d or \"off\"",
                  "integer milliseconds or a string such as \"1s\"")
    if n > LONG_MAX:
        raise ConfigError(key, f"duration too long: {value!r}")
    return n


# ------------------------------------------------------------------- value checkers
# Each checker is (value, key, lenient) -> validated value.  `lenient` is true for
# command-line overrides, whose numbers arrive as strings.

Checker = Callable[[object, str, bool], object]


def _int_value(value: object, key: str, lenient: bool, what: str) -> int:
    if _is_int(value):
        return value
    if lenient and isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
        return int(value)
    raise ConfigError(key, f"expected {what}, got {value!r}")


def _int(lo: int, hi: int = LONG_MAX) -> Checker:
    what = f"an integer from {lo} to {hi}" if hi != LONG_MAX else ("an integer" if lo == 0 else f"an integer >= {lo}")

    def check(value, key, lenient):
        n = _int_value(value, key, lenient, "an integer")
        if not lo <= n <= hi:
            raise ConfigError(key, f"expected {what}, got {n}")
        return n
    return check


def _is_off(value: object, lenient: bool) -> bool:
    return (lenient and value is None) or (isinstance(value, str) and value.strip().lower() == "off")


def _optional(inner: Checker) -> Checker:
    def check(value, key, lenient):
        return None if _is_off(value, lenient) else inner(value, key, lenient)
    return check


def _size(lo: int = 0) -> Checker:
    def check(value, key, lenient):
        n = parse_size(value, key)
        if n < lo:
            raise ConfigError(key, f"must be larger than {lo - 1} bytes, got {value!r}")
        return n
    return check


def _duration(lo: int = 0, optional: bool = False) -> Checker:
    def check(value, key, lenient):
        if lenient and value is None and optional:
            return None
        n = parse_duration(value, key)
        if n is None:
            if optional:
                return None
            raise ConfigError(key, "\"off\" is not allowed here; expected a duration")
        if n < lo:
            raise ConfigError(key, f"expected a duration of at least {lo}ms, got {value!r}")
        return n
    return check


def _bool(value, key, lenient):
    if isinstance(value, bool):
        return value
    if lenient and isinstance(value, str) and value.strip().lower() in ("true", "false", "on", "off"):
        return value.strip().lower() in ("true", "on")
    raise ConfigError(key, f"expected true or false, got {value!r}")


def _choice(*names: str) -> Checker:
    canon = {n.lower(): n for n in names}
    shown = ", ".join(names)

    def check(value, key, lenient):
        if isinstance(value, str) and value.strip().lower() in canon:
            return canon[value.strip().lower()]
        raise ConfigError(key, f"expected one of {shown}, got {value!r}")
    return check


def _text(value, key, lenient):
    if isinstance(value, str) and value.strip() and not any(c.isspace() or ord(c) < 0x20 for c in value):
        return value
    raise ConfigError(key, f"expected a non-empty string without spaces, got {value!r}")


def _path(value, key, lenient):
    if isinstance(value, str) and value and "\x00" not in value:
        return value
    raise ConfigError(key, f"expected a non-empty path, got {value!r}")


def _sync_journal(value, key, lenient):
    """"never", "always", or an fsync period in ms; a period of 0 is "always" (§6.6)."""
    if isinstance(value, str) and value.strip().lower() in ("never", "always"):
        return value.strip().lower()
    try:
        n = parse_duration(value, key)
    except ConfigError:
        n = None
    if n is None:
        raise ConfigError(key, f"expected \"never\", \"always\" or a period such as \"100ms\", got {value!r}")
    return "always" if n == 0 else n


def _queue_name_ref(value, key, lenient):
    if _is_off(value, lenient):
        return None
    if not isinstance(value, str):
        raise ConfigError(key, f"expected a queue name or \"off\", got {value!r}")
    name = wire_name(value)
    try:
        validate_queue_name(name, allow_dots=True)
    except ValueError as e:
        raise ConfigError(key, f"{e} ({value!r})") from None
    return name


_port = _optional(_int(1, 65535))

QUEUE_FIELDS: dict[str, Checker] = {
    "max_items": _int(0, INT_MAX),
    "max_size": _size(),
    "max_item_size": _size(),
    "max_age": _duration(optional=True),
    "default_journal_size": _size(),
    "max_memory_size": _size(),
    "max_journal_size": _size(),
    "min_journal_compact_delay": _duration(optional=True),
    "discard_old_when_full": _bool,
    "keep_journal": _bool,
    "sync_journal": _sync_journal,
    "expire_to_queue": _queue_name_ref,
    "max_expire_sweep": _int(0, INT_MAX),
    "fanout_only": _bool,
    "max_queue_age": _duration(optional=True),
    "disable_aggressive_rewrites": _bool,
    "open_transaction_timeout": _duration(optional=True),
    "storage": _choice("journal", "cmdlog"),
    "white_list_client_id_for_enqueue": _optional(_text),
    "white_list_client_id_for_dequeue": _optional(_text),
}

SERVER_FIELDS: dict[str, Checker] = {
    "listen_address": _text,
    "memcache_port": _port,
    "text_port": _port,
    "thrift_port": _port,
    "admin_port": _port,
    "queue_path": _path,
    "status_file": _path,
    "default_status": _choice("Up", "ReadOnly", "Quiescent", "WriteAvoid"),
    "status_change_grace_period": _duration(),
    "max_open_transactions": _int(0, INT_MAX),
    "expiration_timer_frequency": _duration(lo=1, optional=True),
    "client_timeout": _duration(lo=1, optional=True),
    "connection_limit_refuse_writes": _optional(_int(0)),
    "connection_limit_refuse_reads": _optional(_int(0)),
    "heartbeat_timeout": _duration(lo=1, optional=True),
    "workers": _int(1, PARTITIONS),
    "fronts": _int(0, 1024),
    "worker_fronts": _bool,
    "log_level": _choice("debug", "info", "warning", "error"),
    "log_file": _optional(_path),
}


def _zk_hosts(value, key, lenient):
    if isinstance(value, list) and value and all(isinstance(h, str) for h in value):
        value = ",".join(value)
    if isinstance(value, str) and value.strip() and not any(c.isspace() for c in value):
        return value
    raise ConfigError(key, f"expected \"host:port,host:port\" or a list of them, got {value!r}")


def _zk_path(value, key, lenient):
    if isinstance(value, str) and value.startswith("/") and value != "/" and not value.endswith("/") \
            and "//" not in value and not any(c.isspace() for c in value):
        return value
    raise ConfigError(key, f"expected an absolute ZooKeeper path such as \"/lanner/prod\", got {value!r}")


def _zk_digest(value, key, lenient):
    if isinstance(value, str) and value.partition(":")[0] and ":" in value:
        return value
    raise ConfigError(key, "expected \"user:password\"")


ZOOKEEPER_FIELDS: dict[str, Checker] = {
    "hosts": _zk_hosts,
    "path_prefix": _zk_path,
    "session_timeout": _duration(lo=1000),
    "digest": _optional(_zk_digest),
    "advertise_host": _optional(_text),
}

CMDLOG_FIELDS: dict[str, Checker] = {
    "segment_size": _size(lo=CMDLOG_HEADER_SIZE + 1),
    "sync": _choice("interval", "os", "always"),
    "sync_interval": _duration(lo=1),
    "clean_interval": _duration(lo=1),
}
