"""Kestrel's memcache dialect: an incremental request parser (the reply encoders are in
memcache_replies.py).

Pure: bytes in, command objects out.  No sockets, no
clock, no queue access, so the front can drive it from any event loop and the
tests can replay raw byte streams (reference §1, deviations 1-4 and 8).

Framing (naggati's `MemcacheCodec`, reference §1.1):

* a request line ends at LF; one CR right before the LF is dropped;
* the line is split on single spaces with Java `split(" ")` semantics: two
  spaces give an empty token, trailing empty tokens vanish, TAB is not a
  separator; a line made only of spaces has no tokens at all;
* only the first token is lower-cased (ASCII is enough: no ISO-8859-1
  character lower-cases into ASCII, so the command table matches exactly);
* storage commands (`set add replace append prepend cas`) need 5 tokens and a
  non-negative 32-bit `<bytes>`; the parser then takes `<bytes>` data bytes and
  2 more bytes that are thrown away unchecked (a client that lies about the
  length desynchronises itself, as with Kestrel).

Errors are decided here whenever the bytes alone decide them, as
`ProtocolError(reply, close)` with the exact keyword and close behaviour of
§1.7 plus a reason (deviation 1).  Errors that Kestrel raised only after the
data block was read (`set` flags/exptime, `add`/`cas`/...) are emitted only
after that block has streamed past, so the byte stream stays in step and the
timing matches Kestrel's.  After any error that closes, and after `quit` or
`shutdown`, the parser is *stopped*: it drops everything fed to it and never
yields again, because the front is closing the connection.

Memory bounds (Kestrel had none; a front facing the network needs them):

* a line longer than `max_line` bytes (its CRLF not counted), even before its LF arrives,
  yields `CLIENT_ERROR` + close and stops the parser;
* a `set` whose declared size exceeds `item_limit(queue)` yields
  `SetRefused` at once and the declared bytes + 2 are then skipped as they
  arrive, without being buffered (`feed` drops them before they reach the
  buffer).  The same streaming skip serves every data block whose command has
  already failed.
* with `stream_over` set, a `set` body larger than that is not buffered whole either: the
  parser yields `SetHead` at once, then `SetPiece`s of at least STREAM_PIECE bytes (the
  last may be shorter) as the bytes arrive, so the front can pass them on.

The buffer invariant (stream.py): `_buf[_pos:]` holds the bytes not yet consumed; in the LINE
state `_scan` is how far it is already known to contain no LF, so feeding a long line one byte
at a time stays linear.  The compiled parser reads `set` and plain `get` lines where they lie
in the buffer (memcache.pxd `_c_hot_line`); every other line is cut out and parsed by `_line`.
It also reuses, as no caller can tell: the last name when the next is the same, and the last
plain Get and Set once nothing else holds them, the process's, shared by every connection's
parser (memcache.pxd `_c_name`, `_c_plain_get`, `_c_new_set`).
"""
from __future__ import annotations

import logging
from typing import Callable, Iterator

from lanner.protocols.memcache_commands import (
    GetKey, Get, Set, plain_get, new_set, SetHead, SetPiece, SetRefused, Delete, Flush, FlushAll,
    FlushExpired, FlushAllExpired, Stats,
    DumpStats, DumpConfig, Monitor, Confirm, Status, Version, Reload, Shutdown, Quit, ProtocolError, Command)
from lanner.protocols.memcache_replies import client_error
from lanner.protocols.stream import StreamParser

# COMPILED: as in stream.py (its branches name stream.pxd's C helpers)
try:
    import cython
    COMPILED = cython.compiled
except ImportError:             # pure Python without Cython installed
    COMPILED = False

log = logging.getLogger(__name__)

__all__ = [
    "MemcacheParser", "GetKey", "Get", "Set", "SetHead", "SetPiece", "SetRefused", "Delete", "Flush",
    "FlushAll", "FlushExpired", "FlushAllExpired", "Stats", "DumpStats", "DumpConfig", "Monitor",
    "Confirm", "Status", "Version", "Reload", "Shutdown", "Quit", "ProtocolError", "Command",
    "parse_int", "parse_get_key", "STATUS_NAMES", "STREAM_PIECE", "EXPTIME_ABSOLUTE_FROM",
    "is_relative",
]

INT_MIN = -(1 << 31)
INT_MAX = (1 << 31) - 1

#: The biggest set body (+ 2) whose Set the compiled parser keeps to make the next one in
#: (memcache.pxd _c_new_set): the process never holds more than this of a body it is done with.
SPARE_MAX = 4096 + 2
#: the process's spare name, plain Get and Set (memcache.pxd; the compiled build only)
_last_name = _spare_get = _spare_set = None

#: A storage command's exptime below this is seconds from now, from it on a Unix time in
#: seconds (§1.1); 0 is "never", before either.
EXPTIME_ABSOLUTE_FROM = 1_000_000


def is_relative(exptime: int) -> bool:
    """Is a non-zero exptime counted from now?  The rule's one place: the front's expiry, a
    streamed set's (counted by its worker from the body's end) and the Spark sink's column."""
    return exptime < EXPTIME_ABSOLUTE_FROM


#: Status names `status <name>` accepts (case-insensitive); `down` exists but may not be set.
STATUS_NAMES = ("up", "readonly", "quiescent", "writeavoid")


# --------------------------------------------------------------------------- parsing helpers

def parse_int(tok: bytes) -> int | None:
    """Java `Integer.parseInt`: optional sign, ASCII decimal digits, 32-bit range; else None."""
    n = len(tok)
    if 0 < n < 10:
        # the common case, up to 9 plain digits (no overflow possible): a C loop where
        # memcache.pxd types it, instead of a call to int()
        v = 0
        for c in tok:
            if c < 48 or c > 57:
                break
            v = v * 10 + (c - 48)
        else:
            return v
    # bytes.isdigit is ASCII-only, unlike str.isdigit
    if tok.isdigit() or (n > 1 and tok[0] in b"+-" and tok[1:].isdigit()):
        big = int(tok)
        return big if INT_MIN <= big <= INT_MAX else None
    return None


def _show(tok: bytes, limit: int = 48) -> str:
    """A client token quoted for an error reason: short and free of control bytes."""
    s = tok[:limit].decode("latin-1")
    s = "".join(c if " " <= c <= "~" or c >= "\xa0" else repr(c)[1:-1] for c in s)
    return s + "..." if len(tok) > limit else s


def parse_get_key(raw: str) -> GetKey | ProtocolError:
    """§1.4: split on `/` (trailing empty pieces dropped), piece 0 is the queue, `t=<ms>` (last
    wins), exact lower-case `open close abort peek`, anything else ignored."""
    if "/" not in raw:
        if not raw:
            return ProtocolError(client_error("empty queue name"), True)
        return GetKey(raw, raw)
    pieces = raw.split("/")
    while pieces and not pieces[-1]:
        pieces.pop()
    if not pieces:
        # Kestrel: options(0) on an empty array -> IndexOutOfBounds -> CLIENT_ERROR, kept open.
        return ProtocolError(client_error("missing queue name"), False)
    key = GetKey(raw, pieces[0])
    for opt in pieces[1:]:
        if opt.startswith("t="):
            t = parse_int(opt[2:].encode("latin-1"))
            if t is None:
                return ProtocolError(client_error("bad t= value: " + _show(opt.encode("latin-1"))), True)
            key.timeout_ms = t
        elif opt == "open":
            key.open = True
        elif opt == "close":
            key.close = True
        elif opt == "abort":
            key.abort = True
        elif opt == "peek":
            key.peek = True
    if not key.queue:
        return ProtocolError(client_error("empty queue name"), True)
    if (key.peek or key.abort) and (key.open or key.close):
        return ProtocolError(client_error("peek/abort cannot be combined with open/close"), True)
    if key.peek and key.abort:
        return ProtocolError(client_error("peek cannot be combined with abort"), True)
    return key


def _missing(what: str) -> ProtocolError:
    # Kestrel HEAD caught the IndexOutOfBoundsException: bare CLIENT_ERROR, connection kept.
    return ProtocolError(client_error(what), False)


def _bad_number(what: str, tok: bytes) -> ProtocolError:
    return ProtocolError(client_error("bad %s: %s" % (what, _show(tok))), True)


def _noreply(toks: list[bytes], nargs: int) -> bool:
    """Deviation 2: `noreply` counts only as an extra last token, never as a required argument."""
    return len(toks) > nargs + 1 and toks[-1] == b"noreply"


def _name(tok: bytes) -> str:
    return tok.decode("latin-1")


def _status(toks):
    if len(toks) < 2:
        return Status(None)
    name = _name(toks[1]).lower()
    if name in STATUS_NAMES:
        return Status(name)
    if name == "down":
        return ProtocolError(client_error("status down cannot be set"), True)
    return ProtocolError(client_error("unknown status: " + _show(toks[1])), True)


def _get(toks):
    if len(toks) == 2:  # the hot path: one plain key
        raw = toks[1].decode("latin-1")
        if raw and "/" not in raw:
            return Get([GetKey(raw, raw)])
    elif len(toks) < 2:
        return _missing("get needs a queue name")
    keys = []
    for i in range(1, len(toks)):
        tok = toks[i]
        if not tok and i > 1:
            continue  # an extra space between keys; Kestrel never read past the first key
        key = parse_get_key(tok.decode("latin-1"))
        if type(key) is ProtocolError:
            return key
        keys.append(key)
    return Get(keys)


def _delete(toks):
    if len(toks) < 2:
        return _missing("delete needs a queue name")
    return Delete(_name(toks[1]), _noreply(toks, 1))


def _flush(toks):
    if len(toks) < 2:
        return _missing("flush needs a queue name")
    return Flush(_name(toks[1]), _noreply(toks, 1))


def _flush_all(toks):
    return FlushAll(_noreply(toks, 0))


def _flush_expired(toks):
    if len(toks) < 2:
        # Kestrel ran this inside a future: any failure closed the connection.
        return ProtocolError(client_error("flush_expired needs a queue name"), True)
    return FlushExpired(_name(toks[1]))


def _monitor(toks):
    if len(toks) < 3:
        return ProtocolError(client_error("monitor needs a queue name and seconds"), True)
    seconds = parse_int(toks[2])
    if seconds is None:
        return _bad_number("monitor seconds", toks[2])
    max_items = None
    if len(toks) > 3:
        max_items = parse_int(toks[3])
        if max_items is None:
            return _bad_number("monitor max_items", toks[3])
    return Monitor(_name(toks[1]), seconds, max_items)


def _confirm(toks):
    if len(toks) < 3:
        return _missing("confirm needs a queue name and a count")
    count = parse_int(toks[2])
    if count is None:
        return _bad_number("confirm count", toks[2])
    return Confirm(_name(toks[1]), count)


_SIMPLE = {
    b"get": _get,
    b"gets": _get,
    b"delete": _delete,
    b"flush": _flush,
    b"flush_all": _flush_all,
    b"flush_expired": _flush_expired,
    b"flush_all_expired": lambda toks: FlushAllExpired(),
    b"stats": lambda toks: Stats(),
    b"dump_stats": lambda toks: DumpStats([_name(t) for t in toks[1:]]),
    b"dump_config": lambda toks: DumpConfig(),
    b"monitor": _monitor,
    b"confirm": _confirm,
    b"status": _status,
    b"version": lambda toks: Version(),
    b"reload": lambda toks: Reload(),
    b"shutdown": lambda toks: Shutdown(),
    b"quit": lambda toks: Quit(),
}

_STORAGE = frozenset((b"set", b"add", b"replace", b"append", b"prepend", b"cas"))
_MAY_STOP = frozenset((ProtocolError, Quit, Shutdown))

_LINE, _DATA, _SKIP, _STOPPED, _BODY = 0, 1, 2, 3, 4     # C ints in the compiled build

#: A streamed body is yielded in pieces of at least this many bytes (the last may be shorter).
STREAM_PIECE = 64 << 10


# --------------------------------------------------------------------------- the parser

BINARY_MAGIC = 0x80     # starts every binary request; its client would wait forever for a newline


class MemcacheParser(StreamParser):
    """Feed socket bytes with `feed`, take commands with `next` until it returns None.

    `item_limit(queue_name) -> int | None` gives the queue's max item size (inclusive);
    None for the callable or its result means unlimited.  It may also be a dict (queue name ->
    limit, its `__missing__` computing a miss): looked up, not called.  A `set` body larger than
    `stream_over` bytes is yielded as SetHead then SetPiece commands as it arrives, never
    buffered whole (None: every body is buffered and yielded as one Set)."""

    __slots__ = ("item_limit", "stream_over", "_need", "_set", "_after")
    BETWEEN, STOPPED = _LINE, _STOPPED

    def __init__(self, max_line: int = 1 << 20,
                 item_limit: Callable[[str], int | None] | dict | None = None,
                 stream_over: int | None = None) -> None:
        self.max_line = max_line
        self.item_limit = item_limit
        self.stream_over = stream_over
        self._reset()           # _buf[_pos:] unconsumed; LINE: _buf[:_scan] holds no LF
        self._state = _LINE
        self._need = 0          # DATA: bytes to wait for (data + 2); SKIP: bytes still to drop;
                                # BODY: body bytes not yet yielded
        self._set: Set | None = None       # DATA: the Set waiting for its data
        self._after = None      # SKIP: what to yield once the skipped block is past

    def feed(self, data: bytes) -> None:
        state = self._state
        if state == _SKIP and self._pos == len(self._buf):
            # nothing held: the bytes to skip are dropped as they come, never buffered
            n = len(data)
            need = self._need
            if n <= need:
                self._need = need - n
                return
            self._need = 0
            self._append(data)
            self._pos = self._scan = need
            return
        if state == _STOPPED:
            return
        self._append(data)

    def commands(self) -> Iterator[Command]:
        """Every command the buffered bytes complete, in order."""
        while (cmd := self.next()) is not None:
            yield cmd

    def next(self) -> Command | None:
        while True:
            state = self._state
            if state == _LINE:
                pos = self._pos
                if self._scan == pos and pos < len(self._buf):      # a line's first byte
                    if COMPILED:
                        first = _c_byte(self._buf, pos)
                    else:
                        first = self._buf[pos]
                    if first == BINARY_MAGIC:
                        return self._stop(ProtocolError(client_error(
                            "the memcache binary protocol is not supported; use the text protocol"), True))
                i = self._line_end()
                if i < 0:
                    if i == -1:
                        return None
                    return self._stop(ProtocolError(
                        client_error("line longer than %d bytes" % self.max_line), True))
                end = i - 1 if self._before(i) == 13 else i
                if COMPILED:
                    # the two lines of nearly every request, read in place (memcache.pxd): no
                    # line object; exactly the lines the parse in _line makes ["get", key] (no
                    # b"/" in key) or a set of plain numbers
                    name = _c_hot_line(self, self._buf, pos, end, cython.address(sl))
                    if name is not None:
                        self._consumed(i + 1)
                        if sl.get:
                            return _c_plain_get(name)
                        cmd = self._set_cmd(name, sl.flags, sl.exptime, sl.size, sl.noreply)
                        if cmd is not None:
                            return cmd
                        continue
                    line = _c_slice(self._buf, pos, end - pos)
                else:
                    line = bytes(self._buf[pos:end])
                self._consumed(i + 1)
                cmd = self._line(line)
                if cmd is not None:
                    return cmd
            elif state == _DATA:
                buf = self._buf
                pos = self._pos
                need = self._need
                if len(buf) - pos < need:
                    return None
                set_ = self._set
                set_.data = _c_slice(buf, pos, need - 2) if COMPILED else bytes(buf[pos:pos + need - 2])
                if COMPILED and need > SPARE_MAX:
                    _c_drop_spare(set_)     # (memcache.pxd _c_new_set)
                self._consumed(pos + need)
                self._set = None
                self._state = _LINE
                return set_
            elif state == _BODY:
                buf = self._buf
                pos = self._pos
                need = self._need
                n = len(buf) - pos
                if n < need and n < STREAM_PIECE:
                    return None
                if n > need:
                    n = need
                if not pos and n == len(buf) and type(buf) is bytes:
                    piece = buf         # a read that is all body: the piece itself, no copy
                else:
                    piece = _c_slice(buf, pos, n) if COMPILED else bytes(buf[pos:pos + n])
                self._consumed(pos + n)
                self._need = need - n
                if self._need:
                    return SetPiece(piece, False)
                self._skip(2, None)          # the 2 bytes after the data, unchecked
                return SetPiece(piece, True)
            elif state == _SKIP:
                n = self._need
                if n:
                    pos = self._pos
                    have = len(self._buf) - pos
                    if have < n:
                        self._need = n - have
                        self._reset()
                        return None
                    self._consumed(pos + n)
                    self._need = 0
                self._state = _LINE
                cmd = self._after
                self._after = None
                if cmd is not None:
                    if type(cmd) is ProtocolError and cmd.close:
                        return self._stop(cmd)
                    return cmd
            else:
                return None

    # ----------------------------------------------------------------- internals

    def _stop(self, cmd):
        self._state = _STOPPED
        self._reset()
        self._set = self._after = None
        return cmd

    def _line(self, line: bytes):
        """Parse one request line; return a command, or None after arming a data block."""
        if not COMPILED and line.startswith(b"get "):       # (compiled: read in place in next)
            # the hot path: `get <key>` with one plain key, which split(" ") below would make
            # exactly ["get", key]: straight to its command, without the split
            key = line[4:]
            if key and 32 not in key and 47 not in key:      # no b" ", no b"/" (an int: memchr)
                return plain_get(key.decode("latin-1"))
        toks = line.split(b" ")
        while toks and not toks[-1]:
            toks.pop()
        if not toks:
            if line:
                return self._stop(ProtocolError(client_error("line of only spaces"), True))
            return self._stop(ProtocolError(client_error("empty command line"), True))
        word = toks[0]
        # the two commands of nearly every request, as clients send them (lower case): straight
        # to their parsing, past the table, the lower-casing and the stop check
        if word == b"set":
            return self._storage(word, toks)
        word = word.lower()
        handler = _SIMPLE.get(word)
        if handler is not None:
            cmd = handler(toks)
            if type(cmd) in _MAY_STOP and (type(cmd) is not ProtocolError or cmd.close):
                return self._stop(cmd)
            return cmd
        if word in _STORAGE:
            return self._storage(word, toks)
        return self._stop(ProtocolError(client_error("unknown command: " + _show(toks[0])), True))

    def _storage(self, word: bytes, toks: list[bytes]):
        if len(toks) < 5:
            return self._stop(ProtocolError(
                client_error("%s needs <queue> <flags> <exptime> <bytes>" % word.decode()), True))
        size = parse_int(toks[4])
        if size is None or size < 0:
            return self._stop(ProtocolError(client_error("bad data chunk length: " + _show(toks[4])), True))
        if word != b"set":
            return self._skip(size + 2, ProtocolError(
                client_error("%s is not supported, only set" % word.decode()), True))
        # Kestrel's order: exptime (closes), then flags (kept open), then the queue's checks.
        exptime = parse_int(toks[3])
        if exptime is None:
            return self._skip(size + 2, _bad_number("exptime", toks[3]))
        flags = parse_int(toks[2])
        if flags is None:
            return self._skip(size + 2, ProtocolError(client_error("bad flags: " + _show(toks[2])), False))
        name = toks[1]
        queue = name.decode("latin-1")
        noreply = _noreply(toks, 4)
        return self._set_cmd(queue, flags, exptime, size, noreply)

    def _set_cmd(self, queue: str, flags: int, exptime: int, size: int, noreply: bool):
        """A set line's command once its fields are read: refused over the queue's item limit,
        announced (SetHead) when its body is streamed, else its body is awaited (None)."""
        limits = self.item_limit
        if limits is not None:
            if isinstance(limits, dict):
                # a C lookup: a dict subclass's own [] goes through a Python-level __getitem__
                # (slot_mp_subscript, ~500 instructions); a miss asks it, so __missing__ runs
                limit = dict.get(limits, queue)
                if limit is None:
                    limit = limits[queue]
            else:
                limit = limits(queue)
            # (compiled: a C compare, no int object made for size)
            if _c_over(size, limit) if COMPILED else limit is not None and size > limit:
                self._skip(size + 2, None)
                return SetRefused(queue, size, noreply)
        over = self.stream_over
        if _c_over(size, over) if COMPILED else over is not None and size > over:
            self._state = _BODY
            self._need = size
            return SetHead(queue, flags, exptime, size, noreply)
        self._set = _c_new_set(queue, flags, exptime, noreply) if COMPILED else \
            new_set(queue, flags, exptime, noreply)
        self._need = size + 2
        self._state = _DATA
        return None

    def _skip(self, n: int, after):
        """Drop the next n bytes as they arrive, then yield `after` (None: nothing)."""
        self._state = _SKIP
        self._need = n
        self._after = after
        return None
