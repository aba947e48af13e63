"""The commands of Kestrel's memcache dialect, as the parser (memcache.py) yields them; memcache.py
re-exports every name, so callers keep using `lanner.protocols.memcache`.  Apart from the parser
because they are data, used by the parser and by every front that handles them."""
from __future__ import annotations

from dataclasses import dataclass

# COMPILED: as in stream.py (memcache_commands.pxd's _c_slot_fields exists only then)
try:
    import cython
    COMPILED = cython.compiled
except ImportError:             # pure Python without Cython installed
    COMPILED = False

# The three commands of nearly every request (GetKey, Get, Set) are written out rather than
# made by @dataclass: memcache_commands.pxd makes them C types in the compiled build (a parsed command
# costs a C allocation, not a Python __init__), which Cython's dataclass support cannot do with
# slots.  They keep the dataclasses' constructor, fields, equality (by value, unhashable) and repr.

class _Command:
    __slots__ = ()
    FIELDS = ()

    def __repr__(self) -> str:
        return "%s(%s)" % (type(self).__name__,
                           ", ".join("%s=%r" % (n, getattr(self, n)) for n in self.FIELDS))

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in self.FIELDS)

    __hash__ = None


class GetKey(_Command):
    """One key of a `get`: `raw` is echoed verbatim in the VALUE line (deviation 3)."""
    __slots__ = FIELDS = ("raw", "queue", "timeout_ms", "open", "close", "abort", "peek")

    def __init__(self, raw: str, queue: str, timeout_ms: int | None = None, open: bool = False,
                 close: bool = False, abort: bool = False, peek: bool = False) -> None:
        self.raw, self.queue, self.timeout_ms = raw, queue, timeout_ms
        self.open, self.close, self.abort, self.peek = open, close, abort, peek


class Get(_Command):
    """`get`/`gets` with one or more keys (deviation 4): one VALUE block per hit, then END.
    `plain`: its one key when that has no option (what nearly every get is), else None, so a
    front's hot path asks one field instead of the key's five (each a descriptor call on the
    compiled type); derived from `keys`, so not one of the FIELDS."""
    __slots__ = ("keys", "plain")
    FIELDS = ("keys",)

    def __init__(self, keys: list[GetKey]) -> None:
        self.keys = keys
        k = keys[0] if len(keys) == 1 else None
        self.plain = k if k is not None and not (k.open or k.close or k.abort or k.peek or k.timeout_ms) \
            else None


class Set(_Command):
    __slots__ = FIELDS = ("queue", "flags", "exptime", "data", "noreply")

    def __init__(self, queue: str, flags: int, exptime: int, data: bytes, noreply: bool = False) -> None:
        self.queue, self.flags, self.exptime, self.data, self.noreply = queue, flags, exptime, data, noreply


def plain_get(raw: str) -> Get:
    """`get <raw>`, one key with no option: what nearly every get parses to.  Compiled
    (memcache_commands.pxd), two C allocations and field stores instead of two constructor calls
    that parse their arguments; equal to `Get([GetKey(raw, raw)])`."""
    k = GetKey.__new__(GetKey)
    k.raw = k.queue = raw
    k.timeout_ms = None
    k.open = k.close = k.abort = k.peek = False
    g = Get.__new__(Get)
    g.keys = [k]
    g.plain = k
    return g


def new_set(queue: str, flags: int, exptime: int, noreply: bool) -> Set:
    """`Set(queue, flags, exptime, b"", noreply)`, its data to come: the same, compiled, as
    plain_get."""
    s = Set.__new__(Set)
    s.queue, s.flags, s.exptime, s.data, s.noreply = queue, flags, exptime, b"", noreply
    return s


if COMPILED:
    # the fields a front's handler reads per request, as a `__slots__` class's are read
    # (memcache_commands.pxd); `plain` is not one of Get's FIELDS, but is read the most
    _c_slot_fields(GetKey, GetKey.FIELDS)
    _c_slot_fields(Get, ("keys", "plain"))
    _c_slot_fields(Set, Set.FIELDS)


@dataclass(slots=True)
class SetHead:
    """A `set` whose body is streamed (larger than the parser's `stream_over`): the body follows
    as SetPiece commands, the last one with `last` true.  Nothing of it is buffered whole."""
    queue: str
    flags: int
    exptime: int
    size: int
    noreply: bool = False


@dataclass(slots=True)
class SetPiece:
    """The next bytes of the body announced by the last SetHead."""
    data: bytes
    last: bool


@dataclass(slots=True)
class SetRefused:
    """A `set` larger than the queue's item limit; its data is being skipped.  Reply NOT_STORED
    (after the usual queue-name and write-status checks) unless `noreply`."""
    queue: str
    size: int
    noreply: bool = False


@dataclass(slots=True)
class Delete:
    queue: str
    noreply: bool = False


@dataclass(slots=True)
class Flush:
    queue: str
    noreply: bool = False


@dataclass(slots=True)
class FlushAll:
    noreply: bool = False


@dataclass(slots=True)
class FlushExpired:
    queue: str


@dataclass(slots=True)
class FlushAllExpired:
    pass


@dataclass(slots=True)
class Stats:
    pass


@dataclass(slots=True)
class DumpStats:
    """Empty `names` means every queue and alias."""
    names: list[str]


@dataclass(slots=True)
class DumpConfig:
    pass


@dataclass(slots=True)
class Monitor:
    """`seconds` may be 0 or negative (deadline already passed: answer END at once);
    `max_items` None means `maxOpenTransactions`."""
    queue: str
    seconds: int
    max_items: int | None = None


@dataclass(slots=True)
class Confirm:
    """`count` is passed through as sent; 0 answers ERROR and a negative count must be
    refused by the front (Kestrel corrupted its list)."""
    queue: str
    count: int


@dataclass(slots=True)
class Status:
    """`name` None asks for the status; otherwise it is one of STATUS_NAMES, lower-cased."""
    name: str | None = None


@dataclass(slots=True)
class Version:
    pass


@dataclass(slots=True)
class Reload:
    pass


@dataclass(slots=True)
class Shutdown:
    pass


@dataclass(slots=True)
class Quit:
    pass


@dataclass(slots=True)
class ProtocolError:
    """Write `reply`, then close the connection if `close`."""
    reply: bytes
    close: bool


Command = (Get | Set | SetHead | SetPiece | SetRefused | Delete | Flush | FlushAll | FlushExpired | FlushAllExpired
           | Stats | DumpStats | DumpConfig | Monitor | Confirm | Status | Version | Reload
           | Shutdown | Quit | ProtocolError)
