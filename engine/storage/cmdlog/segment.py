"""workq command-log codec: segment names and header, record framing, Go times,
CRC-32C and the eight command payloads.  Byte-compatible with workq-server as it
is implemented (the workq command-log specification, §1-§2), not as its doc says.

On-disk invariants (a reader may rely on every one of them):

* A segment is `NNNNNNNNN.log` (exactly nine ASCII digits before the FIRST dot,
  `log` after it, value < 2**32).  Every other file name is ignored: `*.lock`,
  `*.rw`, `0000001.log`, `000000001.log.rw`, `lanner-queues.json`.
* A segment is the 8-byte header `77 71 77 71 00 00 00 01` followed by whole
  records and nothing else.  A header-only segment is valid and empty.
* Record = TIME(15) | SIZE (unsigned LEB128) | PAYLOAD(SIZE) | CRC(4), where CRC
  is CRC-32C stored big-endian over TIME || SIZE-bytes-as-stored || PAYLOAD.
  The record time is informational only: nothing replays from it.
* TIME is Go `time.MarshalBinary` v1: version 1, int64 seconds since
  0001-01-01T00:00:00Z, int32 nanoseconds, int16 zone offset in minutes.  We
  always write offset -1 (UTC, `FF FF`) and accept and ignore any offset.
  Go's zero time (`01` + 12 zero bytes + `FF FF`) means "not scheduled".
* Payload = type byte (1 add, 2 schedule, 3 complete, 4 fail, 5 delete,
  6 expire, 7 start-attempt, 8 timeout-attempt), the raw 16-byte job id, then
  per type: add/schedule carry NAME, TTR, TTL, PRIORITY (the only zigzag
  varint), MAX_ATTEMPTS, MAX_FAILS, PAYLOAD, JOB_TIME, JOB_CREATED; complete and
  fail carry a RESULT; the other four nothing.  Byte strings are uvarint length
  + bytes.  A byte left over after a command is an error ("trailing garbage").

Decoding truncates TTR to uint32, priority to int32 and max-attempts/max-fails
to uint8 exactly as Go's decoder does, so the values we see are workq's.

Times travel through this module as integer nanoseconds since the Unix epoch
(`ZERO_TIME_NS` is Go's zero time), which keeps arithmetic exact: a record's
expiry is `base_ns + ttl_ms * 1_000_000`.

Errors are `CmdlogError(path, offset, reason, kind)`; `str()` is one line naming
the file and byte offset.  `kind` tells the torn-tail policy (cmdlog.py) what it
may repair: only "torn" (the file ends inside a record or inside the header).
"""
from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from typing import Iterator, Union

from lanner.storage.cmdlog.crc import crc32c

MAGIC = 0x77717771
VERSION = 1
HEADER = b"\x77\x71\x77\x71\x00\x00\x00\x01"
HEADER_SIZE = 8
TIME_SIZE = 15
CRC_SIZE = 4

GO_UNIX_OFFSET = 62_135_596_800          # seconds from 0001-01-01 to 1970-01-01
NS = 1_000_000_000
ZERO_TIME_NS = -GO_UNIX_OFFSET * NS       # Go's time.Time{}
ZERO_TIME = b"\x01" + bytes(12) + b"\xff\xff"

ADD, SCHEDULE, COMPLETE, FAIL, DELETE, EXPIRE, START_ATTEMPT, TIMEOUT_ATTEMPT = range(1, 9)
COMMAND_NAMES = {ADD: "add", SCHEDULE: "schedule", COMPLETE: "complete", FAIL: "fail",
                 DELETE: "delete", EXPIRE: "expire", START_ATTEMPT: "start-attempt",
                 TIMEOUT_ATTEMPT: "timeout-attempt"}

MAX_TTL_MS = 2_592_000_000               # workq's largest TTL (30 days)
NO_EXPIRY_MAX_FAILS = 255                # with TTL=max and max-attempts 0: Lanner's "never expires"
HELD_MAX_FAILS = 254                     # an add Lanner's replay keeps past its TTL: see held_past_ttl

# error kinds
TORN = "torn"            # the file ends inside a record (or inside the header)
BAD_HEADER = "header"    # a complete header that is not wqwq v1
BAD_CRC = "crc"
CORRUPT = "corrupt"      # bad time version, varint overflow, undecodable payload
REPLAY = "replay"        # semantically impossible sequence (duplicate job)
LOCKED = "lock"
IO = "io"

_TIME = struct.Struct(">Bqih")
_TWO_TIMES = struct.Struct(">BqihBqih")
_CRC = struct.Struct(">I")
_SMALL = [bytes((i,)) for i in range(128)]
_U64 = (1 << 64) - 1


class CmdlogError(Exception):
    """A command-log problem at a known place; str() is one line: FILE: offset N: reason."""

    def __init__(self, path: str, offset: int, reason: str, kind: str = CORRUPT) -> None:
        super().__init__(f"{path}: offset {offset}: {reason}")
        self.path = path
        self.offset = offset
        self.reason = reason
        self.kind = kind


class CmdlogIOError(CmdlogError, OSError):
    """A write, fsync or open of a segment failed: an OSError too, so the owner's batch
    (which catches OSError from every storage) rolls back; `errno` is the system's."""

    def __init__(self, path: str, offset: int, reason: str, err: int | None = None) -> None:
        CmdlogError.__init__(self, path, offset, reason, IO)
        self.errno = err
        self.strerror = None

    def __str__(self) -> str:
        return self.args[0]


# ------------------------------------------------------------------ commands

@dataclass(slots=True)
class JobCommand:
    """add (type 1) or schedule (type 2): the whole job."""

    type: int
    id: bytes
    name: bytes
    ttr: int                 # ms
    ttl: int                 # ms
    priority: int
    max_attempts: int
    max_fails: int
    payload: bytes
    time_ns: int             # ZERO_TIME_NS for add, the scheduled time for schedule
    created_ns: int


@dataclass(slots=True)
class ResultCommand:
    """complete (3) or fail (4) with the worker's result."""

    type: int
    id: bytes
    result: bytes


@dataclass(slots=True)
class IdCommand:
    """delete (5), expire (6), start-attempt (7), timeout-attempt (8)."""

    type: int
    id: bytes


Command = Union[JobCommand, ResultCommand, IdCommand]


def never_expires(cmd: JobCommand) -> bool:
    """Lanner's marker for an item without expiry.  workq cannot say "never"
    (its TTL tops out at 30 days), so Lanner writes such items as an add with
    TTL = 2592000000, max-attempts 0 and max-fails 255.  workq ignores
    max-fails, so workq reads the record as a 30-day job; Lanner's replay and
    cleaner read exactly that combination as "no expiry".  A workq-written add
    with that combination is therefore kept past 30 days: it errs on keeping data."""
    return (cmd.ttl == MAX_TTL_MS and cmd.max_fails == NO_EXPIRY_MAX_FAILS
            and cmd.max_attempts == 0 and cmd.type == ADD)


def held_past_ttl(cmd: JobCommand) -> bool:
    """Lanner's marker for an expired item on its way to its expire_to_queue target in another
    worker (server/moves.py): the job is logged again as an add with max-fails 254, so that
    Lanner's replay and cleaner keep it, open, past its TTL until the move is confirmed (a
    replay rolls it back into its queue, where it expires and moves again).  workq ignores
    max-fails and drops it at its TTL, as it drops every expired job.  A workq-written add with
    max-fails 254 is kept too, until Lanner's queue expires it (the item carries its real
    expiry): like never_expires, the marker errs on keeping data."""
    return cmd.max_fails == HELD_MAX_FAILS and cmd.type == ADD


def expires_at_ns(cmd: JobCommand) -> int | None:
    """workq's expiration rule (§2.5): scheduled time + TTL when scheduled, else
    created + TTL; None for Lanner's never-expiring items.  A job is expired
    when now is strictly after this instant."""
    if never_expires(cmd):
        return None
    base = cmd.time_ns if cmd.time_ns != ZERO_TIME_NS else cmd.created_ns
    return base + cmd.ttl * 1_000_000


# ------------------------------------------------------------------ primitives

def put_uvarint(v: int) -> bytes:
    """Unsigned LEB128 (Go binary.PutUvarint)."""
    if 0 <= v < 0x80:
        return _SMALL[v]
    if v < 0 or v > _U64:
        raise ValueError(f"uvarint out of range: {v}")
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def put_varint(v: int) -> bytes:
    """Zigzag-signed varint (Go binary.PutVarint), used only for priority."""
    if not -(1 << 63) <= v < (1 << 63):
        raise ValueError(f"varint out of range: {v}")
    return put_uvarint(((v << 1) ^ (v >> 63)) & _U64)


def read_uvarint(buf, pos: int, end: int) -> tuple[int, int]:
    """(value, next position); ValueError as Go's binary.ReadUvarint fails."""
    result = 0
    shift = 0
    for i in range(10):
        if pos >= end:
            raise ValueError("unexpected EOF" if i else "EOF")
        b = buf[pos]
        pos += 1
        if b < 0x80:
            if i == 9 and b > 1:
                raise ValueError("varint overflows a 64-bit integer")
            return result | (b << shift), pos
        result |= (b & 0x7F) << shift
        shift += 7
    raise ValueError("varint overflows a 64-bit integer")


def encode_time(ns: int) -> bytes:
    sec, nsec = divmod(ns, NS)
    return _TIME.pack(1, sec + GO_UNIX_OFFSET, nsec, -1)


def decode_time(buf, pos: int) -> int:
    """Nanoseconds since the Unix epoch of the 15-byte Go time at `pos` (offset ignored)."""
    version, sec, nsec, _offset = _TIME.unpack_from(buf, pos)
    if version != 1:
        raise ValueError(f"Time.UnmarshalBinary: unsupported version {version}")
    return (sec - GO_UNIX_OFFSET) * NS + nsec


def time_fields(raw) -> tuple[int, int, int]:
    """(unix seconds, nanoseconds, zone offset minutes) of a 15-byte Go time; for tools."""
    version, sec, nsec, offset = _TIME.unpack_from(raw, 0)
    if version != 1:
        raise ValueError(f"Time.UnmarshalBinary: unsupported version {version}")
    return sec - GO_UNIX_OFFSET, nsec, offset


def _bytes_field(data: bytes) -> bytes:
    return put_uvarint(len(data)) + data


# ------------------------------------------------------------------ payloads

def encode_command(cmd: Command) -> bytes:
    t = cmd.type
    if t == ADD or t == SCHEDULE:
        return b"".join((
            _SMALL[t], cmd.id, _bytes_field(cmd.name), put_uvarint(cmd.ttr), put_uvarint(cmd.ttl),
            put_varint(cmd.priority), put_uvarint(cmd.max_attempts), put_uvarint(cmd.max_fails),
            _bytes_field(cmd.payload), encode_time(cmd.time_ns), encode_time(cmd.created_ns)))
    if t == COMPLETE or t == FAIL:
        return b"".join((_SMALL[t], cmd.id, _bytes_field(cmd.result)))
    if DELETE <= t <= TIMEOUT_ATTEMPT:
        return _SMALL[t] + cmd.id
    raise ValueError(f"unknown command type {t}")


def _int32(v: int) -> int:
    if -0x80000000 <= v <= 0x7FFFFFFF:
        return v
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= (1 << 31) else v


def decode_command(buf, start: int = 0, end: int | None = None, keep_payload: bool = True) -> Command:
    """Decode one payload buf[start:end].  ValueError names what is wrong.
    `keep_payload=False` skips copying the job payload (the cleaner's scan).

    Replay speed lives here: one-byte varints (names, priorities, counts,
    short payload lengths) are read inline, longer ones by read_uvarint, and
    a field that overruns `end` is caught by the final position check."""
    if end is None:
        end = len(buf)
    if start >= end:
        raise ValueError("EOF (empty payload)")
    t = buf[start]
    pos = start + 17
    if pos > end:
        raise ValueError("unexpected EOF in job id")
    jid = bytes(buf[start + 1:pos])
    if t == ADD or t == SCHEDULE:
        # seven varints: name length, TTR, TTL, zigzag priority, max-attempts,
        # max-fails, payload length; loops inlined (no call per field)
        vals = [0, 0, 0, 0, 0, 0, 0]
        try:
            for k in range(7):
                b = buf[pos]
                pos += 1
                if b < 0x80:
                    v = b
                else:
                    v = b & 0x7F
                    shift = 7
                    while True:
                        b = buf[pos]
                        pos += 1
                        if b < 0x80:
                            if shift == 63 and b > 1:
                                raise ValueError("varint overflows a 64-bit integer")
                            v |= b << shift
                            break
                        v |= (b & 0x7F) << shift
                        shift += 7
                        if shift > 63:
                            raise ValueError("varint overflows a 64-bit integer")
                vals[k] = v
                if k == 0:
                    name = bytes(buf[pos:pos + v])
                    pos += v
            n = vals[6]
            payload = bytes(buf[pos:pos + n]) if keep_payload else b""
            pos += n
            if pos + 2 * TIME_SIZE > end:
                raise ValueError("unexpected EOF in job fields")
            v1, s1, n1, _o1, v2, s2, n2, _o2 = _TWO_TIMES.unpack_from(buf, pos)
        except IndexError:
            raise ValueError("unexpected EOF in job fields") from None
        _n, ttr, ttl, zz, max_attempts, max_fails, _p = vals
        if v1 != 1 or v2 != 1:
            raise ValueError(f"Time.UnmarshalBinary: unsupported version {v1 if v1 != 1 else v2}")
        pos += 2 * TIME_SIZE
        cmd: Command = JobCommand(t, jid, name, ttr & 0xFFFFFFFF, ttl, _int32((zz >> 1) ^ -(zz & 1)),
                                  max_attempts & 0xFF, max_fails & 0xFF, payload,
                                  (s1 - GO_UNIX_OFFSET) * NS + n1, (s2 - GO_UNIX_OFFSET) * NS + n2)
    elif t == COMPLETE or t == FAIL:
        n, pos = read_uvarint(buf, pos, end)
        if pos + n > end:
            raise ValueError("unexpected EOF in result")
        cmd = ResultCommand(t, jid, bytes(buf[pos:pos + n]))
        pos += n
    elif DELETE <= t <= TIMEOUT_ATTEMPT:
        cmd = IdCommand(t, jid)
    else:
        raise ValueError(f"unable to recognize cmd type {t}")
    if pos != end:
        if pos > end:
            raise ValueError(f"unexpected EOF in the {COMMAND_NAMES[t]} command")
        raise ValueError(f"trailing garbage detected ({end - pos} bytes after the {COMMAND_NAMES[t]} command)")
    return cmd


# ------------------------------------------------------------------ records

def encode_record(time_ns: int, payload: bytes) -> bytes:
    body = b"".join((encode_time(time_ns), put_uvarint(len(payload)), payload))
    return body + _CRC.pack(crc32c(body))


def record_spans(buf, path: str, start: int = HEADER_SIZE, end: int | None = None, verify: bool = True
                 ) -> Iterator[tuple[int, int, int, int]]:
    """Frame records in buf[start:end]: yields (offset, payload_start,
    payload_end, record_end) per record, CRC checked.  Raises CmdlogError at
    the first problem: kind TORN when the data ends inside a record (including
    a SIZE that runs past the end), CORRUPT for a bad time version or an
    overlong varint, BAD_CRC for a checksum mismatch.  `verify=False` skips
    the CRC, for bytes already verified that cannot have changed since."""
    if end is None:
        end = len(buf)
    mv = memoryview(buf)
    try:
        yield from _spans(buf, mv if verify else None, path, start, end)
    finally:
        mv.release()


def _spans(buf, mv: memoryview | None, path: str, pos: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    while pos < end:
        if end - pos < TIME_SIZE:
            raise CmdlogError(path, pos, f"torn record: unexpected EOF in TIME ({end - pos} bytes left)", TORN)
        if buf[pos] != 1:
            raise CmdlogError(path, pos, f"Time.UnmarshalBinary: unsupported version {buf[pos]}", CORRUPT)
        p = pos + TIME_SIZE
        size = 0
        shift = 0
        for i in range(10):
            if p >= end:
                raise CmdlogError(path, pos, "torn record: unexpected EOF in SIZE", TORN)
            b = buf[p]
            p += 1
            if b < 0x80:
                if i == 9 and b > 1:
                    raise CmdlogError(path, pos, "SIZE varint overflows a 64-bit integer", CORRUPT)
                size |= b << shift
                break
            size |= (b & 0x7F) << shift
            shift += 7
        else:
            raise CmdlogError(path, pos, "SIZE varint overflows a 64-bit integer", CORRUPT)
        rec_end = p + size + CRC_SIZE
        if rec_end > end:
            raise CmdlogError(path, pos, f"torn record: SIZE {size} runs past the end "
                                         f"({end - p} bytes left)", TORN)
        if mv is not None:
            crc = crc32c(mv[pos:p + size])
            stored = _CRC.unpack_from(buf, p + size)[0]
            if crc != stored:
                raise CmdlogError(path, pos, f"crc mismatch (stored {stored:08x}, computed {crc:08x})", BAD_CRC)
        yield pos, p, p + size, rec_end
        pos = rec_end


def valid_record_after(buf, start: int, end: int) -> int | None:
    """Offset of the first position after `start` from which CRC-valid records
    run to the end of the data (or to a torn last record), or None.  The
    torn-tail policy asks this before truncating: a break followed by good
    records is corruption in the middle, not a torn tail, and must not be
    "repaired" by throwing the good records away.  A record that merely
    appears inside the torn record's bytes (an item that is itself a workq
    record) is not followed by a clean chain, so it does not count."""
    pos = start + 1
    while pos + TIME_SIZE + 1 + CRC_SIZE <= end:
        pos = _find_version_byte(buf, pos, end)
        if pos < 0:
            return None
        found = False
        try:
            for _span in record_spans(buf, "", pos, end):
                found = True
            if found:
                return pos
        except CmdlogError as e:
            if found and e.kind == TORN:
                return pos
        pos += 1
    return None


def _find_version_byte(buf, pos: int, end: int) -> int:
    if isinstance(buf, (bytes, bytearray, mmap.mmap)):
        return buf.find(b"\x01", pos, end)
    while pos < end:
        if buf[pos] == 1:
            return pos
        pos += 1
    return -1


def check_header(buf, path: str) -> None:
    """Raise unless buf starts with a complete wqwq v1 header.  A file that is
    shorter than the header and a prefix of it is TORN (a crash while the
    segment was being created); anything else is BAD_HEADER."""
    n = len(buf)
    if n < HEADER_SIZE:
        if bytes(buf[:n]) == HEADER[:n]:
            raise CmdlogError(path, 0, f"invalid segment header: unexpected EOF ({n} bytes)", TORN)
        raise CmdlogError(path, 0, f"invalid segment header ({n} bytes)", BAD_HEADER)
    if bytes(buf[:HEADER_SIZE]) != HEADER:
        raise CmdlogError(path, 0, f"invalid segment header {bytes(buf[:HEADER_SIZE]).hex()}", BAD_HEADER)


class SegmentFile:
    """A whole segment mapped read-only: `buf` supports len(), indexing,
    slicing and the buffer protocol.  Use as a context manager."""

    __slots__ = ("path", "buf", "_mm", "_file")

    def __init__(self, path: str) -> None:
        self.path = path
        self._file = open(path, "rb")
        size = os.fstat(self._file.fileno()).st_size
        if size:
            self._mm = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
            self.buf = self._mm
        else:
            self._mm = None
            self.buf = b""

    def close(self) -> None:
        if self._mm is not None:
            self._mm.close()
            self._mm = None
        self.buf = b""
        self._file.close()

    def __enter__(self) -> "SegmentFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def segment_records(path: str, keep_payload: bool = True) -> Iterator[tuple]:
    """Stream one segment's records as (buf, offset, payload_start, payload_end, record_end,
    command); `buf` is valid until the next record is asked for.  Raises CmdlogError (with
    path and offset) at the first problem."""
    with SegmentFile(path) as seg:
        buf = seg.buf
        check_header(buf, path)
        records = decoded_records(buf, path, keep_payload)
        try:
            for off, ps, pe, end, cmd in records:
                yield buf, off, ps, pe, end, cmd
        finally:
            records.close()


def decoded_records(buf, path: str, keep_payload: bool = True) -> Iterator[tuple]:
    """(offset, payload_start, payload_end, record_end, command) per record of a segment's
    buffer after its header: `record_spans`, each decoded, a bad command a CmdlogError (CORRUPT)
    at its offset.  Close it (or run it out) before closing the segment: its spans hold a view
    of the buffer."""
    spans = record_spans(buf, path)
    try:
        for off, ps, pe, end in spans:
            try:
                cmd = decode_command(buf, ps, pe, keep_payload)
            except ValueError as e:
                raise CmdlogError(path, off, str(e), CORRUPT) from None
            yield off, ps, pe, end, cmd
    finally:
        spans.close()


def iter_segment(path: str, keep_payload: bool = True) -> Iterator[tuple[int, int, Command]]:
    """Stream one segment: (offset, record_time_ns, command) per record."""
    for buf, off, _ps, _pe, _end, cmd in segment_records(path, keep_payload):
        try:
            t_ns = decode_time(buf, off)
        except ValueError as e:
            raise CmdlogError(path, off, str(e), CORRUPT) from None
        yield off, t_ns, cmd


# ------------------------------------------------------------------ directory

def segment_seq(name: str) -> int | None:
    """Sequence number of a segment file name, None for any other file (workq's rules)."""
    base, dot, ext = name.partition(".")
    if not dot or ext != "log" or len(base) != 9 or not (base.isascii() and base.isdigit()):
        return None
    seq = int(base)
    return seq if seq <= 0xFFFFFFFF else None


def segment_name(seq: int) -> str:
    if not 0 <= seq <= 999_999_999:
        raise ValueError(f"segment sequence {seq} does not fit nine digits")
    return f"{seq:09d}.log"


def list_segments(directory: str) -> list[tuple[int, str]]:
    """(sequence, file name) of every segment, in sequence order; gaps are normal."""
    out = []
    for name in os.listdir(directory):
        seq = segment_seq(name)
        if seq is not None:
            out.append((seq, name))
    out.sort()
    return out


def fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
