"""Kestrel's text protocol: an incremental request parser and the reply encoders.

Pure, like `lanner.protocols.memcache`: bytes in, command objects out (reference §2,
deviation 5).  Kestrel built it on naggati's `readLine(true, "ISO-8859-1")`
and `TextHandler`; this module reproduces both byte for byte:

* every line, command or put item, ends at LF and loses one CR right before
  the LF (so an item line `"\\r\\n"` is empty and ends a put block);
* a command line is split with Java `split(" ")` (empty tokens for double
  spaces, trailing ones dropped) and its first word lower-cased;
* a line ending in `:` (any command, not only `put`) starts a block: the
  following lines are items until an empty line; when 1024 items are already
  held the next line ends the block and is *discarded*, whatever it holds
  (Kestrel's MAX_PUT_BUFFER); then the command is dispatched and only `put`
  uses the items;
* items are kept as the bytes sent (deviation 5: Kestrel re-encoded 0x80-0xFF
  as UTF-8).

What the parser can answer alone it yields as `Reply(bytes)`; the connection
stays open.  What closes the connection (non-numeric `confirm` count or
`monitor` timeout, a line of only spaces, a line over `max_line`, a put block
over `max_block` bytes) is `ProtocolError(reply, close=True)`, whose reply is a
`-<reason>` line the front may write before closing.  After it, and after
`quit`, the parser is stopped and ignores further input.

Bounds: a line may hold at most `max_line` bytes and a put block at most
`max_block` item bytes; Kestrel had neither, so the defaults are generous.  Given
an `item_limit`, a block's item too long for any queue its put reaches is not
held at all: it is dropped as it arrives and stands in the items as an
`Oversized` (see TextParser), which the front has refused where its bytes would
have been.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterator

from lanner.protocols.memcache import (
    STATUS_NAMES, ProtocolError, Quit, Shutdown, Status, Version, _show, parse_int,
)
from lanner.protocols.oversized import Oversized
from lanner.protocols.stream import TOO_LONG, StreamParser

log = logging.getLogger(__name__)

__all__ = [
    "TextParser", "Put", "Get", "Peek", "Monitor", "Confirm", "Flush", "Delete", "Status",
    "Version", "Shutdown", "Quit", "Reply", "ProtocolError", "Command", "MAX_PUT_BUFFER",
    "item", "NONE", "count", "error", "string", "Oversized", "SKIP_OVER",
]

#: Items a put block buffers; the line read after that many ends the block and is lost.
MAX_PUT_BUFFER = 1024
#: A block's item line longer than this is measured against its put's item limit.
SKIP_OVER = 64 << 10


# --------------------------------------------------------------------------- commands

@dataclass(slots=True)
class Put:
    """`expiry_ms` is relative to now and 0 means already expired (reference §9.2 item 6).
    An item is its bytes, or an Oversized when they were dropped as they arrived."""
    queue: str
    expiry_ms: int | None
    items: list[bytes | Oversized]


@dataclass(slots=True)
class Get:
    """Confirm this connection's open reads on `queue`, then a transactional get."""
    queue: str
    timeout_ms: int | None = None


@dataclass(slots=True)
class Peek:
    queue: str
    timeout_ms: int | None = None


@dataclass(slots=True)
class Monitor:
    queue: str
    timeout_ms: int


@dataclass(slots=True)
class Confirm:
    """`count` as sent; 0 or more than are open → `-Not that many transactions open.`"""
    queue: str
    count: int


@dataclass(slots=True)
class Flush:
    queue: str


@dataclass(slots=True)
class Delete:
    queue: str


# Status, Version, Shutdown (the front replies `+0`, then shuts the server down), Quit (close
# without a reply) and ProtocolError(reply, close) are the memcache dialect's own classes: the
# same commands with the same fields, so one definition serves both parsers.


@dataclass(slots=True)
class Reply:
    """A complete answer the parser decided alone; the connection stays open."""
    reply: bytes


Command = (Put | Get | Peek | Monitor | Confirm | Flush | Delete | Status | Version | Shutdown
           | Quit | Reply | ProtocolError)


# --------------------------------------------------------------------------- encoders

NONE = b"*\n"


def item(data: bytes) -> bytes:
    return b":" + data + b"\n"


def count(n: int) -> bytes:
    return b"+%d\n" % n


def error(msg: str) -> bytes:
    """`-<msg>\\n`; like Kestrel's `getBytes("ascii")`, a non-ASCII character becomes `?`."""
    return b"-" + msg.replace("\n", " ").encode("ascii", "replace") + b"\n"


def string(s: str) -> bytes:
    return b":" + s.replace("\n", " ").encode("ascii", "replace") + b"\n"


_QUEUE_REQUIRED = Reply(error("Queue name required."))


# --------------------------------------------------------------------------- dispatch

def _name(tok: bytes) -> str:
    return tok.decode("latin-1")


class _Refused(Exception):
    """Raised by the argument readers below with the reply that refuses the command, so each
    command's parser reads as the arguments it takes; `_dispatch` turns it into that reply."""

    def __init__(self, reply) -> None:
        self.reply = reply


def _queue(args) -> str:
    if not args:
        raise _Refused(_QUEUE_REQUIRED)
    return _name(args[0])


def _optional_int(args, what: str) -> int | None:
    """The int after the queue name, if any; a bad one is refused with a plain error reply."""
    if len(args) < 2:
        return None
    n = parse_int(args[1])
    if n is None:
        raise _Refused(Reply(error(f"Error parsing {what}.")))
    return n


def _required_int(args, missing: str, what: str) -> int:
    """The int after the queue name; missing, a plain error; bad, an error that closes the
    connection (Kestrel's handler threw)."""
    if len(args) < 2:
        raise _Refused(Reply(error(missing)))
    n = parse_int(args[1])
    if n is None:
        raise _Refused(ProtocolError(error(f"Error parsing {what}: " + _show(args[1])), True))
    return n


def _put(args, items):
    queue = _queue(args)
    expiry = _optional_int(args, "expiration time")
    if not items:
        return Reply(count(0))  # setItem is never called: nothing created, nothing checked
    return Put(queue, expiry, items)


def _get_like(cls):
    def parse(args, items):
        return cls(_queue(args), _optional_int(args, "timeout"))
    return parse


def _monitor(args, items):
    timeout = _required_int(args, "Queue name & timeout required.", "timeout")
    return Monitor(_name(args[0]), timeout)


def _confirm(args, items):
    n = _required_int(args, "Queue name & count required.", "count")
    return Confirm(_name(args[0]), n)


def _one_queue(cls):
    def parse(args, items):
        return cls(_queue(args))
    return parse


def _status(args, items):
    if not args:
        return Status(None)
    name = _name(args[0]).lower()
    if name in STATUS_NAMES:
        return Status(name)
    if name == "down":
        return Reply(error("Status forbidden."))
    return Reply(error("Unknown status."))


_COMMANDS = {
    "put": _put,
    "get": _get_like(Get),
    "peek": _get_like(Peek),
    "monitor": _monitor,
    "confirm": _confirm,
    "flush": _one_queue(Flush),
    "delete": _one_queue(Delete),
    "status": _status,
    "version": lambda args, items: Version(),
    "shutdown": lambda args, items: Shutdown(),
    "quit": lambda args, items: Quit(),
}


def _dispatch(toks: list[bytes], items: list[bytes]):
    if not toks:
        # Kestrel: segments(0) of an empty array; the exception closed the connection.
        return ProtocolError(error("Protocol error: a command line of only spaces."), True)
    # Java's toLowerCase on the ISO-8859-1 string: lower-cases Latin-1 letters too.
    word = toks[0].decode("latin-1").lower()
    handler = _COMMANDS.get(word)
    if handler is None:
        return Reply(error("Unknown command: " + word))
    try:
        return handler(toks[1:], items)
    except _Refused as r:
        return r.reply


def _split(line: bytes) -> list[bytes]:
    toks = line.split(b" ")
    while toks and not toks[-1]:
        toks.pop()
    if not toks and not line:
        toks = [b""]  # Java: "".split(" ") is [""], so an empty line is an unknown command ""
    return toks


_LINE, _BLOCK, _STOPPED = 0, 1, 2


class TextParser(StreamParser):
    """Feed socket bytes with `feed`, take commands with `next` until it returns None.

    `item_limit(queue)` (None: none) is the largest item a put to `queue` could store
    anywhere; with it, a block's item line longer than `skip_over` and than that limit (for a
    block no put reads: than 0) is dropped as it arrives and reaches the command as an
    `Oversized` (oversized.py): nothing else changes, not the line and block bounds, not the
    items counted, so the answer is the one its bytes would have had."""

    __slots__ = ("max_block", "item_limit", "skip_over", "_toks", "_items", "_block_bytes",
                 "_kept", "_bound", "_skipped", "_skip_cr")
    BETWEEN, STOPPED = _LINE, _STOPPED

    def __init__(self, max_line: int = 1 << 20, max_block: int = 1 << 26, item_limit=None,
                 skip_over: int = SKIP_OVER) -> None:
        self.max_line = max_line
        self.max_block = max_block
        self.item_limit = item_limit
        self.skip_over = skip_over
        self._reset()           # _buf[_pos:] unconsumed; _buf[:_scan] is known to hold no LF
        self._state = _LINE
        self._toks: list[bytes] = []     # BLOCK: the command that opened the block
        self._items: list = []           # BLOCK: items read so far (bytes or Oversized)
        self._block_bytes = 0            # BLOCK: their sizes, added up (max_block)
        self._kept = 0                   # BLOCK: the bytes of those held
        self._bound = -1                 # BLOCK: item_limit of its put, once asked; else -1
        self._skipped = -1               # BLOCK: bytes of an item line dropped so far; else -1
        self._skip_cr = False            # (whether the last of them was a CR)

    @property
    def buffered(self) -> int:
        """Bytes held and not yet parsed, put items already read included."""
        return len(self._buf) - self._pos + self._kept

    def feed(self, data: bytes) -> None:
        if self._state != _STOPPED:
            self._append(data)

    def commands(self) -> Iterator[Command]:
        while (cmd := self.next()) is not None:
            yield cmd

    def next(self) -> Command | None:
        while self._state != _STOPPED:
            line = self._take_item() if self._state == _BLOCK else self._take_line()
            if line is None:
                return None
            if line is TOO_LONG:
                return self._stop(ProtocolError(error("Line longer than %d bytes." % self.max_line), True))
            if self._state == _BLOCK:
                items = self._items
                if line and len(items) < MAX_PUT_BUFFER:
                    if type(line) is bytes:
                        size = len(line)
                        self._kept += size
                    else:
                        size = line.size
                    self._block_bytes += size
                    if self._block_bytes > self.max_block:
                        return self._stop(ProtocolError(
                            error("Put block larger than %d bytes." % self.max_block), True))
                    items.append(line)
                    continue
                toks = self._toks
                self._end_block()
                cmd = _dispatch(toks, items)
            elif line[-1:] == b":":
                self._toks = _split(line[:-1])
                self._state = _BLOCK
                continue
            else:
                cmd = _dispatch(_split(line), [])
            t = type(cmd)
            if t is ProtocolError or t is Quit:
                return self._stop(cmd)
            return cmd
        return None

    def _take_item(self):
        """A block's next line, as `_take_line` gives it, except that a line over the block's
        item bound (and `skip_over`) is an Oversized: its bytes are dropped as they come,
        counted for the same line bound, and it ends at the same LF, less the same CR."""
        if self._skipped >= 0:
            return self._skip_rest()
        line = self._take_line()
        if self.item_limit is None:
            return line
        if line is None:
            buf = self._buf
            n = len(buf) - self._pos
            if n > self.skip_over + 1 and n > self._item_bound() + 1:
                self._skipped = n                # (+ 1: room for the CR of a CRLF)
                self._skip_cr = buf[-1] == 13
                self._reset()
                return self._skip_rest()
            return None
        if line is not TOO_LONG and len(line) > self.skip_over and len(line) > self._item_bound():
            return Oversized(len(line))
        return line

    def _skip_rest(self):
        buf = self._buf
        pos = self._pos
        i = buf.find(b"\n", pos)
        if i < 0:
            if len(buf) > pos:
                self._skipped += len(buf) - pos
                self._skip_cr = buf[-1] == 13
                self._reset()
            if self._skipped > self.max_line + 1:
                self._skipped = -1
                return TOO_LONG
            return None
        cr = buf[i - 1] == 13 if i > pos else self._skip_cr
        size = self._skipped + i - pos - cr
        self._consumed(i + 1)
        self._skipped = -1
        return TOO_LONG if size > self.max_line else Oversized(size)

    def _item_bound(self) -> int:
        bound = self._bound
        if bound < 0:
            toks = self._toks
            if len(toks) >= 2 and toks[0].decode("latin-1").lower() == "put":
                bound = self.item_limit(_name(toks[1]))
            else:
                bound = 0       # no other command reads its block's items
            self._bound = bound
        return bound

    def _end_block(self) -> None:
        self._toks, self._items, self._block_bytes, self._kept = [], [], 0, 0
        self._bound = self._skipped = -1
        self._state = _LINE

    def _stop(self, cmd):
        self._end_block()
        self._state = _STOPPED
        self._reset()
        return cmd
