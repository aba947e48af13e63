"""Kestrel's thrift protocol: a framed TBinaryProtocol request parser (its reply encoders are
thrift_replies.py).

Pure: bytes in, call objects out; reply values in, bytes out.  No sockets, no clock, no queue
access, and no dependency on the `thrift` package (the tests use it as an independent client).
The front (`fronts/thrift.py`) feeds socket bytes to a `ThriftParser`, asks `next()` for
work, and writes what `encode_*` returns (reference §3).

Wire shape (finagle `ThriftServerFramedCodec` + scrooge 3.0.1 + libthrift TBinaryProtocol):

* every message is one frame: a 4-byte big-endian signed length, then that many bytes;
* a message starts with a strict header (`0x8001 0000 | type`, name, seqid) or an old non-strict
  one (name length >= 0, name, type byte, seqid); both are read, only strict is written;
* the message type is not looked at (scrooge dispatches on the name alone), except that only a
  CALL named `__can__finagle__trace__v3__` upgrades the connection;
* the argument struct follows; unknown field ids, and known ids carrying an unexpected type, are
  skipped as libthrift-generated code does, so a missing or skipped field keeps its IDL default
  (0, "", empty); bytes after the struct's STOP are ignored.

Outcomes of one frame, mirroring what Kestrel did with it:

* `Call`: a known method whose arguments decoded;
* `Upgrade`: the TTwitter upgrade call.  **The parser switches itself to upgraded mode** when it
  returns it, because the very next frame (possibly already buffered, pipelined behind the
  upgrade) must be read with a `RequestHeader` in front.  The front only answers it with
  `encode_upgrade_reply`; setting `upgraded` again is harmless;
* `BadCall`: answered with a `TApplicationException`, the connection stays open.  Type 1 for an
  unknown method name; type 7 when a known method's argument struct cannot be decoded (Kestrel
  closed the connection for the truncation cases libthrift reports as transport errors; the frame
  boundary is known here, so answering and carrying on is safe and says why);
* `ProtocolError`: the bytes cannot be framed or carry no readable message header (or, upgraded,
  no readable `RequestHeader`).  Kestrel's finagle server closed the connection; so must the
  front.  The parser is then stopped: it drops further input and `next()` returns None.

Kestrel handles one call per connection at a time (§3.1), so the front answers each call before
asking for the next one and passes `parser.upgraded` to the encoders.

String decoding: `queue_name` is the latin-1 decoding of its bytes (how every Lanner front names
queues, so a name maps to the same queue over every protocol); method names and the TTwitter
client id are decoded as UTF-8 with replacement, as Java did, since they are compared with
configured text.

Memory bounds: a frame whose declared length exceeds `max_frame` is refused as soon as its 4
length bytes arrive, without waiting for (or buffering) the body.  The buffer holds at most what
was fed since `next()` last returned None.  A `put` frame over `stream_over` bytes, given an
`item_limit`, is decoded as it arrives (thrift_put.py): an item no queue the put reaches would
take is dropped as it comes and reaches the front as an `Oversized`, in its place, so the
front's answer is the one its bytes would have had, whatever way the frame was cut.  Decoding
never preallocates from a declared count: every element consumes at least one byte of the
frame, fixed-width runs are bounds-checked before they are read, and nesting is cut at 64
levels (libthrift's skip depth).
"""
from __future__ import annotations

import logging
import struct
from dataclasses import dataclass
from typing import Iterator

from lanner.protocols.thrift_wire import (
    _CONTAINER, _FIELD, _FIXED, _I32, _MAP, _MAX_DEPTH, _VARIABLE, _VERSION_1, _VERSION_MASK,
    CALL, T_I32, T_I64, T_LIST, T_MAP, T_SET, T_STOP, T_STRING, T_STRUCT, _Bad, _type_name,
    cut_field_header, in_field, negative_length, negative_size, no_stop, not_a_binary_list,
    too_deep, truncated, truncated_string, unknown_element, unknown_type,
)
from lanner.protocols.thrift_put import PutStream
from lanner.protocols.stream import joined

log = logging.getLogger(__name__)

__all__ = [
    "Item", "QueueInfo", "Call", "Upgrade", "BadCall", "ProtocolError", "ThriftParser",
    "STATUS_NOT_CONFIGURED", "STATUS_QUIESCENT", "STATUS_READ_ONLY", "STATUS_UP",
    "EXC_UNKNOWN_METHOD", "EXC_INTERNAL_ERROR", "EXC_PROTOCOL_ERROR", "UPGRADE_METHOD", "METHODS",
    "DEFAULT_MAX_FRAME", "STREAM_OVER",
]

STATUS_NOT_CONFIGURED, STATUS_QUIESCENT, STATUS_READ_ONLY, STATUS_UP = 0, 1, 2, 3

#: TApplicationException types Kestrel produces (§3.1 Errors).
EXC_UNKNOWN_METHOD = 1
EXC_INTERNAL_ERROR = 6
EXC_PROTOCOL_ERROR = 7

UPGRADE_METHOD = "__can__finagle__trace__v3__"
DEFAULT_MAX_FRAME = 64 << 20
#: A put frame longer than this is decoded as it arrives when the parser has an item limit.
STREAM_OVER = 64 << 10
_HEAD_MAX = 64 << 10     # bytes of a frame a message header (and RequestHeader) must fit in

# --------------------------------------------------------------------------- values and outcomes

@dataclass(slots=True)
class Item:
    data: bytes
    id: int


@dataclass(slots=True)
class QueueInfo:
    head_item: bytes | None
    items: int
    bytes: int
    journal_bytes: int
    age: int
    waiters: int
    open_transactions: int


@dataclass(slots=True)
class Call:
    """A decoded call; `args` always holds every IDL argument (defaults filled in)."""
    method: str
    seqid: int
    args: dict
    client_id: str | None = None


@dataclass(slots=True)
class Upgrade:
    seqid: int


@dataclass(slots=True)
class BadCall:
    method: str
    seqid: int
    exc_type: int
    message: str


@dataclass(slots=True)
class ProtocolError:
    reason: str


# --------------------------------------------------------------------------- primitive readers
# Each takes (frame, pos) and returns (value, new pos); `frame` is immutable bytes.

def _need(frame: bytes, pos: int, n: int) -> None:
    if pos + n > len(frame):
        raise truncated(n, pos, len(frame))


def _r_i32(frame: bytes, pos: int) -> tuple[int, int]:
    if pos + 4 > len(frame):
        _need(frame, pos, 4)
    return _I32.unpack_from(frame, pos)[0], pos + 4


def _r_binary(frame: bytes, pos: int) -> tuple[bytes, int]:
    if pos + 4 > len(frame):
        _need(frame, pos, 4)
    n = _I32.unpack_from(frame, pos)[0]
    if n < 0:
        raise negative_length(n, pos)
    pos += 4
    end = pos + n
    if end > len(frame):
        raise truncated_string(n, pos, len(frame))
    return frame[pos:end], end


def _r_latin1(frame: bytes, pos: int) -> tuple[str, int]:
    raw, pos = _r_binary(frame, pos)
    return raw.decode("latin-1"), pos


def _r_utf8(frame: bytes, pos: int) -> tuple[str, int]:
    raw, pos = _r_binary(frame, pos)
    return raw.decode("utf-8", "replace"), pos


def _r_container(frame: bytes, pos: int) -> tuple[int, int, int]:
    _need(frame, pos, 5)
    etype, n = _CONTAINER.unpack_from(frame, pos)
    if n < 0:
        raise negative_size(n, pos)
    return etype, n, pos + 5


def _r_binary_list(frame: bytes, pos: int) -> tuple[list[bytes], int]:
    etype, n, pos = _r_container(frame, pos)
    if n and etype != T_STRING:
        raise not_a_binary_list(etype)
    out = []
    append = out.append
    for _ in range(n):
        item, pos = _r_binary(frame, pos)
        append(item)
    return out, pos


def _r_i64_set(frame: bytes, pos: int) -> tuple[set[int], int]:
    etype, n, pos = _r_container(frame, pos)
    if not n:
        return set(), pos
    if etype != T_I64:
        raise _Bad(f"set<{_type_name(etype)}> where set<i64> was expected")
    _need(frame, pos, 8 * n)
    return set(struct.unpack_from(f">{n}q", frame, pos)), pos + 8 * n


def _skip(frame: bytes, pos: int, ttype: int, depth: int) -> int:
    """Step over one value of `ttype`; libthrift's TProtocolUtil.skip, with bounds checks."""
    width = _FIXED.get(ttype)
    if width is not None:
        _need(frame, pos, width)
        return pos + width
    if ttype == T_STRING:
        return _r_binary(frame, pos)[1]
    if depth >= _MAX_DEPTH:
        raise too_deep(pos)
    if ttype == T_STRUCT:
        while True:
            _need(frame, pos, 1)
            ftype = frame[pos]
            if ftype == T_STOP:
                return pos + 1
            _need(frame, pos, 3)
            pos = _skip(frame, pos + 3, ftype, depth + 1)
    if ttype in (T_LIST, T_SET):
        etype, n, pos = _r_container(frame, pos)
        return _skip_run(frame, pos, n, (etype,), depth)
    if ttype == T_MAP:
        _need(frame, pos, 6)
        ktype, vtype, n = _MAP.unpack_from(frame, pos)
        if n < 0:
            raise negative_size(n, pos)
        return _skip_run(frame, pos + 6, n, (ktype, vtype), depth)
    raise unknown_type(ttype, pos)


def _skip_run(frame: bytes, pos: int, n: int, types: tuple[int, ...], depth: int) -> int:
    """Skip n elements (n pairs for a map); each consumes >= 1 byte, so the loop is bounded."""
    if not n:
        return pos
    widths = [_FIXED.get(t) for t in types]
    if None not in widths:
        total = n * sum(widths)
        _need(frame, pos, total)
        return pos + total
    for t in types:
        if t not in _FIXED and t not in _VARIABLE:
            raise unknown_element(t, pos)
    for _ in range(n):
        for t in types:
            pos = _skip(frame, pos, t, depth + 1)
    return pos


# --------------------------------------------------------------------------- message structure

def _r_name(frame: bytes, pos: int) -> tuple[str, int]:
    raw, pos = _r_binary(frame, pos)
    name = _KNOWN_NAMES.get(raw)
    return (raw.decode("utf-8", "replace") if name is None else name), pos


def _read_message_begin(frame: bytes, pos: int) -> tuple[str, int, int, int]:
    _need(frame, pos, 4)
    word = _I32.unpack_from(frame, pos)[0]
    if word < 0:
        if (word & _VERSION_MASK) != _VERSION_1:
            raise _Bad(f"Bad version in readMessageBegin: 0x{word & 0xFFFFFFFF:08x}")
        mtype = word & 0xFF
        name, pos = _r_name(frame, pos + 4)
        seqid, pos = _r_i32(frame, pos)
        return name, mtype, seqid, pos
    name, pos = _r_name(frame, pos)
    _need(frame, pos, 5)
    mtype = frame[pos]
    seqid = _I32.unpack_from(frame, pos + 1)[0]
    return name, mtype, seqid, pos + 5


def _struct_field(frame: bytes, pos: int, want_fid: int, want_type: int, read, depth: int):
    """Scan a struct for the one field (id and type) wanted, skipping every other at nesting
    `depth`: (its value read by `read`, or None when absent; the offset after the STOP)."""
    value = None
    while True:
        _need(frame, pos, 1)
        if frame[pos] == T_STOP:
            return value, pos + 1
        _need(frame, pos, 3)
        ftype, fid = _FIELD.unpack_from(frame, pos)
        pos += 3
        if fid == want_fid and ftype == want_type:
            value, pos = read(frame, pos)
        else:
            pos = _skip(frame, pos, ftype, depth)


def _read_request_header(frame: bytes, pos: int) -> tuple[str | None, int]:
    """TTwitter RequestHeader: only field 6 (ClientId {1: string name}) matters here."""
    return _struct_field(frame, pos, 6, T_STRUCT, _read_client_id, 1)


def _read_client_id(frame: bytes, pos: int) -> tuple[str | None, int]:
    return _struct_field(frame, pos, 1, T_STRING, _r_utf8, 2)


# Per method: (a function giving fresh defaults, {field id: (ttype, key, reader)}).
_QUEUE = {1: (T_STRING, "queue_name", _r_latin1)}
_IDS = {1: (T_STRING, "queue_name", _r_latin1), 2: (T_SET, "ids", _r_i64_set)}
_ARGS: dict[str, tuple] = {
    "put": (lambda: {"queue_name": "", "items": [], "expiration_msec": 0},
            {1: (T_STRING, "queue_name", _r_latin1), 2: (T_LIST, "items", _r_binary_list),
             3: (T_I32, "expiration_msec", _r_i32)}),
    "get": (lambda: {"queue_name": "", "max_items": 0, "timeout_msec": 0, "auto_abort_msec": 0},
            {1: (T_STRING, "queue_name", _r_latin1), 2: (T_I32, "max_items", _r_i32),
             3: (T_I32, "timeout_msec", _r_i32), 4: (T_I32, "auto_abort_msec", _r_i32)}),
    "confirm": (lambda: {"queue_name": "", "ids": set()}, _IDS),
    "abort": (lambda: {"queue_name": "", "ids": set()}, _IDS),
    "peek": (lambda: {"queue_name": ""}, _QUEUE),
    "flush_queue": (lambda: {"queue_name": ""}, _QUEUE),
    "flush_all_queues": (dict, {}),
    "delete_queue": (lambda: {"queue_name": ""}, _QUEUE),
    "current_status": (dict, {}),
    "set_status": (lambda: {"status": 0}, {1: (T_I32, "status", _r_i32)}),
    "get_version": (dict, {}),
}
#: The service's method names, in IDL order.
METHODS = tuple(_ARGS)
_KNOWN_NAMES = {m.encode(): m for m in (*METHODS, UPGRADE_METHOD)}


def _read_args(frame: bytes, pos: int, method: str) -> dict:
    defaults, fields = _ARGS[method]
    args = defaults()
    flen = len(frame)
    while True:
        if pos >= flen:
            raise no_stop(method, pos)
        ftype = frame[pos]
        if ftype == T_STOP:
            return args
        if pos + 3 > flen:
            raise cut_field_header(method, pos)
        ftype, fid = _FIELD.unpack_from(frame, pos)
        pos += 3
        spec = fields.get(fid)
        if spec is not None and spec[0] == ftype:
            if ftype == T_I32 and pos + 4 <= flen:      # the common case, inline
                args[spec[1]] = _I32.unpack_from(frame, pos)[0]
                pos += 4
                continue
            try:
                args[spec[1]], pos = spec[2](frame, pos)
            except _Bad as e:
                raise in_field(method, fid, spec[1], e) from None
        else:
            try:
                pos = _skip(frame, pos, ftype, 1)
            except _Bad as e:
                raise in_field(method, fid, None, e) from None


# --------------------------------------------------------------------------- the parser

class ThriftParser:
    """Incremental frame parser for one connection; see the module docstring for its contract.

    `item_limit(queue)` (None: none) is the largest put item that could be stored anywhere a put
    to `queue` reaches (`queue` None: to any queue); with it, a put frame larger than
    `stream_over` is decoded as it arrives (thrift_put.py) and an item over the limit reaches
    the call as an `Oversized`, its bytes never held."""

    __slots__ = ("max_frame", "upgraded", "item_limit", "stream_over", "_buf", "_pos", "_stopped",
                 "_put", "_call", "_whole", "_tried")

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME, item_limit=None,
                 stream_over: int = STREAM_OVER):
        self.max_frame = max_frame
        self.upgraded = False
        self.item_limit = item_limit
        self.stream_over = stream_over
        self._buf = b""         # _buf[_pos:]: the bytes not decoded yet (stream.py `joined`)
        self._pos = 0
        self._stopped = False
        self._put: PutStream | None = None      # the put frame being decoded as it arrives
        self._call: tuple | None = None         # (seqid, client id) of that put
        self._whole = False     # the frame arriving is decoded once complete, not streamed
        self._tried = 0         # bytes of it the last look for a put header had

    @property
    def buffered(self) -> int:
        """Bytes held and not yet decoded (the front watches this for back-pressure)."""
        return len(self._buf) - self._pos

    @property
    def held(self) -> int:
        """Every byte of the connection's input held: not yet decoded, or a put item kept."""
        return len(self._buf) - self._pos + (self._put.kept if self._put is not None else 0)

    @property
    def stopped(self) -> bool:
        """True once a ProtocolError was returned: the connection must close."""
        return self._stopped

    def feed(self, data: bytes) -> None:
        if self._stopped:
            return
        if self._put is not None:       # the put decodes from this very bytearray (thrift_put.py)
            self._buf += data
            return
        self._buf = joined(self._buf, self._pos, data)
        self._pos = 0

    def commands(self) -> Iterator[Call | Upgrade | BadCall | ProtocolError]:
        """Every outcome the buffered bytes complete, in order."""
        while (cmd := self.next()) is not None:
            yield cmd

    def next(self) -> Call | Upgrade | BadCall | ProtocolError | None:
        """The outcome of the next complete frame, or None until one has fully arrived."""
        if self._stopped:
            return None
        if self._put is not None:
            return self._streamed()
        buf = self._buf
        pos = self._pos
        if len(buf) - pos < 4:
            return None
        n = _I32.unpack_from(buf, pos)[0]
        if n < 0 or n > self.max_frame:
            return self._stop(f"frame length {n} outside 0..{self.max_frame}")
        end = pos + 4 + n
        if len(buf) < end:
            if n > self.stream_over and self.item_limit is not None and not self._whole:
                return self._start_put(n)
            return None
        self._whole = False
        self._tried = 0
        if type(buf) is bytes:
            frame = buf[pos + 4:end]
        else:
            with memoryview(buf) as view:           # one copy, not two
                frame = bytes(view[pos + 4:end])
        if end == len(buf):             # all taken: the read is let go (stream.py)
            self._buf = b""
            self._pos = 0
        else:
            self._pos = end
        return self._decode(frame)

    def _start_put(self, n: int) -> Call | BadCall | None:
        """A big frame still arriving: once its message header is in, a put goes on as a
        PutStream; any other method (or a header not readable from its first _HEAD_MAX bytes)
        waits to be decoded whole.  The header is decoded from what has arrived, again each
        time that doubled (so feeding it byte by byte stays linear); a header that decodes from
        a prefix decodes the same from the whole frame."""
        buf = self._buf
        start = self._pos + 4
        have = len(buf) - start
        if have < self._tried:
            return None
        self._tried = 2 * have
        head = bytes(buf[start:start + min(have, _HEAD_MAX)])
        try:
            client_id, pos = _read_request_header(head, 0) if self.upgraded else (None, 0)
            name, _, seqid, pos = _read_message_begin(head, pos)
        except _Bad:
            self._whole = have >= _HEAD_MAX
            return None
        if name != "put":
            self._whole = True
            return None
        if type(buf) is bytes:          # the put takes bytes from the front of a bytearray
            buf = bytearray(memoryview(buf)[start + pos:])
        else:
            del buf[:start + pos]
        self._buf = buf
        self._pos = 0
        defaults, fields = _ARGS["put"]
        self._put = PutStream(buf, pos, n, defaults(), fields, self.item_limit)
        self._call = (seqid, client_id)
        return self._streamed()

    def _streamed(self) -> Call | BadCall | None:
        out = self._put.step()
        if out is None:
            return None
        (seqid, client_id), self._put, self._call, self._tried = self._call, None, None, 0
        if type(out) is dict:
            return Call("put", seqid, out, client_id)
        return BadCall("put", seqid, EXC_PROTOCOL_ERROR, str(out))

    def _stop(self, reason: str) -> ProtocolError:
        self._stopped = True
        self._buf = b""
        self._pos = 0
        self._put = self._call = None
        log.debug("thrift connection unframeable: %s", reason)
        return ProtocolError(reason)

    def _decode(self, frame: bytes) -> Call | Upgrade | BadCall | ProtocolError:
        client_id = None
        try:
            pos = 0
            if self.upgraded:
                client_id, pos = _read_request_header(frame, 0)
            name, mtype, seqid, pos = _read_message_begin(frame, pos)
        except _Bad as e:
            what = "RequestHeader or message header" if self.upgraded else "message header"
            return self._stop(f"unreadable {what}: {e}")
        if name in _ARGS:
            try:
                return Call(name, seqid, _read_args(frame, pos, name), client_id)
            except _Bad as e:
                return BadCall(name, seqid, EXC_PROTOCOL_ERROR, str(e))
        if not self.upgraded and mtype == CALL and name == UPGRADE_METHOD:
            try:
                _skip(frame, pos, T_STRUCT, 0)
            except _Bad as e:
                return self._stop(f"unreadable {UPGRADE_METHOD} arguments: {e}")
            self.upgraded = True
            return Upgrade(seqid)
        return BadCall(name, seqid, EXC_UNKNOWN_METHOD, f"Invalid method name: '{name}'")
