"""Kestrel's memcache dialect: the reply encoders (the request parser is memcache.py).

Pure: reply values in, bytes out (reference §1, §4; deviations 1, 3 and 8).  A reason given
to an error encoder ends up inside one reply line, so CR and LF in it are escaped.
"""
from __future__ import annotations

__all__ = [
    "END", "STORED", "NOT_STORED", "DELETED", "ERROR", "CLIENT_ERROR", "SERVER_ERROR",
    "FLUSHED_ALL", "RELOADED", "value_block", "single_value", "get_reply", "value_heads", "END_TAIL",
    "Spliced", "SPLICE_MIN",
    "client_error", "server_error", "count_line",
    "version_line", "status_line", "encode_stats", "encode_dump_stats", "encode_dump_config",
]

END = b"END\r\n"
STORED = b"STORED\r\n"
NOT_STORED = b"NOT_STORED\r\n"
DELETED = b"DELETED\r\n"
ERROR = b"ERROR\r\n"
CLIENT_ERROR = b"CLIENT_ERROR\r\n"
SERVER_ERROR = b"SERVER_ERROR\r\n"
FLUSHED_ALL = b"Flushed all queues.\r\n"
RELOADED = b"Reloaded config.\r\n"


def value_block(key_raw: str, data: bytes) -> bytes:
    """`VALUE <key> 0 <len>\\r\\n<data>\\r\\n`; the caller appends END once after all keys."""
    return b"VALUE %s 0 %d\r\n%s\r\n" % (key_raw.encode("latin-1"), len(data), data)


_SINGLE = b"VALUE %s 0 %d\r\n%s\r\nEND\r\n"
#: What follows a value in a one-key get's reply.
END_TAIL = b"\r\nEND\r\n"


class _Heads(dict):
    """(key as sent, value size) -> `VALUE <key> 0 <size>\\r\\n`: a queue's consumers get values
    of one size over and over, and formatting the line was a tenth of a fused get's
    instructions; a hit is one dict lookup, no Python frame.  Bounded: keys are the clients'."""

    __slots__ = ()

    def __missing__(self, key: tuple[str, int]) -> bytes:
        if len(self) >= 4096:
            self.clear()
        head = self[key] = b"VALUE %s 0 %d\r\n" % (key[0].encode("latin-1"), key[1])
        return head


#: value_heads[key_raw, n]: a one-key get's VALUE line (a value of n bytes).
value_heads = _Heads()


def single_value(key_raw: str, data: bytes) -> bytes:
    """`value_block` + END in one copy of `data` (a get of one key): `value_block(...) + END`
    copied an 8 MiB item twice on the loop (issue 8)."""
    return _SINGLE % (key_raw.encode("latin-1"), len(data), data)


#: A value at least this big is sent from its own bytes (`Spliced`), not copied into the reply.
SPLICE_MIN = 256 << 10


class Spliced:
    """A reply made of pieces that are written in order and never joined, so an 8 MiB value is
    not copied on the loop to frame it (issue 8).  len() is its size in bytes; the front's
    writer (fronts/spill.py) writes the pieces."""

    __slots__ = ("pieces", "size")

    def __init__(self, pieces: tuple) -> None:
        self.pieces = pieces
        self.size = sum(map(len, pieces))

    def __len__(self) -> int:
        return self.size


def get_reply(key_raw: str, data) -> bytes | Spliced:
    """`single_value`; for a big value that is `bytes` (never a view of a buffer that is reused)
    the value itself goes in the reply, between its line and END."""
    n = len(data)
    if n < SPLICE_MIN or type(data) is not bytes:
        return _SINGLE % (key_raw.encode("latin-1"), n, data)      # single_value, one call less
    return Spliced((b"VALUE %s 0 %d\r\n" % (key_raw.encode("latin-1"), n), data, b"\r\nEND\r\n"))


def _reason_bytes(reason: str) -> bytes:
    # A reason ends up inside one reply line: it must never carry CR or LF.
    return reason.replace("\r", "\\r").replace("\n", "\\n").encode("latin-1", "backslashreplace")


def client_error(reason: str = "") -> bytes:
    """`CLIENT_ERROR <reason>\\r\\n`, or the bare Kestrel keyword when no reason is given."""
    if not reason:
        return CLIENT_ERROR
    return b"CLIENT_ERROR " + _reason_bytes(reason) + b"\r\n"


def server_error(reason: str = "") -> bytes:
    if not reason:
        return SERVER_ERROR
    return b"SERVER_ERROR " + _reason_bytes(reason) + b"\r\n"


def count_line(n: int) -> bytes:
    """Reply of `flush_expired` / `flush_all_expired`."""
    return b"%d\r\n" % n


def version_line(version: str) -> bytes:
    return b"VERSION " + version.encode("latin-1") + b"\r\n"


def status_line(status: str) -> bytes:
    """Reply of bare `status`: the status name upper-cased (`UP`, `READONLY`, ...)."""
    return status.upper().encode("latin-1") + b"\r\n"


def _text(v) -> bytes:
    if isinstance(v, bytes):
        return v
    return str(v).encode("latin-1")


def encode_stats(global_stats: list[tuple[str, object]],
                 queues: list[tuple[str, list[tuple[str, object]]]]) -> bytes:
    """§4.1: `STAT <k> <v>` lines joined by CRLF, then `\\r\\nEND\\r\\n`; per-queue keys become
    `queue_<name>_<key>`.  Values are written with str() (or as-is if bytes)."""
    lines = [b"STAT %s %s" % (_text(k), _text(v)) for k, v in global_stats]
    for name, stats in queues:
        prefix = b"STAT queue_" + _text(name) + b"_"
        lines.extend(prefix + b"%s %s" % (_text(k), _text(v)) for k, v in stats)
    return b"\r\n".join(lines) + b"\r\nEND\r\n"


def _blocks(entries) -> list[bytes]:
    lines = []
    for name, stats in entries:
        lines.append(b"queue '" + _text(name) + b"' {")
        lines.append(b"  " + b"\r\n  ".join(b"%s=%s" % (_text(k), _text(v)) for k, v in (stats or ())))
        lines.append(b"}")
    return lines


def encode_dump_stats(entries: list[tuple[str, list[tuple[str, object]] | None]]) -> bytes:
    """§4.4, quirks included: an unknown name (stats None or empty) gives a stats line of two
    spaces, and no entries at all gives `\\r\\nEND\\r\\n` (Kestrel's mkString)."""
    return b"\r\n".join(_blocks(entries)) + b"\r\nEND\r\n"


def encode_dump_config(entries: list[tuple[str, list[tuple[str, object]]]]) -> bytes:
    """Deviation 8: `queue '<name>' {`, `  <key>=<value>` lines, `}` per queue, then `END`.
    Kestrel never shipped this command, so it is written without dump_stats's quirks: no
    blank stats line for an empty block and a plain `END\\r\\n` when there are no queues."""
    out = []
    for name, config in entries:
        out.append(b"queue '" + _text(name) + b"' {\r\n")
        out.extend(b"  %s=%s\r\n" % (_text(k), _text(v)) for k, v in config)
        out.append(b"}\r\n")
    out.append(END)
    return b"".join(out)
