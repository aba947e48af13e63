"""Kestrel's journal record format (reference §6.2): encoding, decoding, reading a file.

Integers are little-endian.  Lanner writes only opcodes 1 REMOVE, 2 ADDX, 5 UNREMOVE,
6 CONFIRM_REMOVE, 8 CONTINUE and 9 REMOVE_TENTATIVE_XID, so Kestrel can read Lanner's
files; the reader accepts every opcode 0-9 because old Kestrel journals hold the legacy
ones:

    0 ADD                 size i32 | expiry s i32 | data        (size = len + 4)
    1 REMOVE
    2 ADDX                size i32 | add ms i64 | expiry ms i64 | data   (size = len + 16)
    3 REMOVE_TENTATIVE
    4 SAVE_XID            xid
    5 UNREMOVE            xid
    6 CONFIRM_REMOVE      xid
    7 ADD_XID             xid | ADDX body
    8 CONTINUE            xid | ADDX body   (confirm xid, then add)
    9 REMOVE_TENTATIVE_XID xid

There is no checksum: a record that does not decode (an unknown opcode, a size that
cannot be) is found, but a flipped byte inside item data is not.  `storage = "cmdlog"`
(CRC-32C per record) is the choice when that matters.
"""
from __future__ import annotations

import io
import os
import struct
from typing import Iterator, NamedTuple

from lanner.queues.item import QItem

OP_ADD = 0
OP_REMOVE = 1
OP_ADDX = 2
OP_REMOVE_TENTATIVE = 3
OP_SAVE_XID = 4
OP_UNREMOVE = 5
OP_CONFIRM_REMOVE = 6
OP_ADD_XID = 7
OP_CONTINUE = 8
OP_REMOVE_TENTATIVE_XID = 9

ADD_OPS = frozenset((OP_ADD, OP_ADDX, OP_ADD_XID, OP_CONTINUE))

# Read size of every journal reader.  Not 1 MiB: a reader holds its chunk and, while a record
# straddles two, the chunk joined to the next (three chunks for a moment), and the readers that
# run under load are read-behind in the worker that holds `max_memory_size` of items and the pack
# in the cleaner (issue 8, `perf memory` at a 1 GiB backlog: 2 MB of the worker's peak and 3.7 MB
# of the pack's, then a forked child, went with 1 MiB -> 256 KiB).  A pread per 256 KiB costs
# about 1 % more instructions per 1 KiB record than per 1 MiB (callgrind: 7,671 against 7,627).
CHUNK = 256 << 10
BIG_READ = 256 << 10            # item bytes from which a record's data is read in place (Cursor._read_big)

_ADDX = struct.Struct("<Biqq")          # opcode, size (= len + 16), add time ms, expiry ms
_XADDX = struct.Struct("<BIiqq")        # opcode, xid, size, add time, expiry (CONTINUE)
_XID = struct.Struct("<BI")             # opcode, xid
# The record headers as struct packers, for writers that build records in place:
pack_addx = _ADDX.pack                  # (OP_ADDX, len + 16, add ms, expiry ms), data follows
pack_xaddx = _XADDX.pack                # (OP_CONTINUE, xid, len + 16, add ms, expiry ms), data follows
pack_xid = _XID.pack                    # (opcode, xid)
_i32 = struct.Struct("<i").unpack_from
_u32 = struct.Struct("<I").unpack_from
_qq = struct.Struct("<qq").unpack_from


class JournalCorrupt(ValueError):
    """A record that cannot be decoded: `file`, byte `offset` of the record, `reason`;
    `torn` when the file simply ends inside the record (what a crash mid-write leaves)."""

    def __init__(self, file: str, offset: int, reason: str, torn: bool = False) -> None:
        super().__init__(f"{file} at offset {offset}: {reason}")
        self.file = file
        self.offset = offset
        self.reason = reason
        self.torn = torn


class Record(NamedTuple):
    opcode: int
    item: QItem | None     # ADD, ADDX, ADD_XID, CONTINUE
    xid: int               # SAVE_XID, UNREMOVE, CONFIRM, ADD_XID, CONTINUE, REMOVE_TENTATIVE(_XID)


class _Broken(Exception):
    pass


def encode_add(item: QItem) -> bytes:
    """ADDX: `02 | len+16 | add time | expiry | data`."""
    return pack_addx(OP_ADDX, len(item.data) + 16, item.add_time, item.expiry) + item.data



def encode_remove() -> bytes:
    return b"\x01"


def encode_open(xid: int) -> bytes:
    return pack_xid(OP_REMOVE_TENTATIVE_XID, xid)


def encode_unremove(xid: int) -> bytes:
    return pack_xid(OP_UNREMOVE, xid)


def encode_confirm(xid: int) -> bytes:
    return pack_xid(OP_CONFIRM_REMOVE, xid)


def encode_continue(xid: int, item: QItem) -> bytes:
    return pack_xaddx(OP_CONTINUE, xid, len(item.data) + 16, item.add_time, item.expiry) + item.data


_ADDX_NAMES = {2: "ADDX", 7: "ADD_XID", 8: "CONTINUE"}


def decode(buf: bytes, i: int, n: int, now_ms: int, items: bool = True):
    """Decode the record at buf[i] (i < n).  Returns (opcode, item, xid, end) or
    None when buf[i:n] does not hold the whole record.  With items=False no
    QItem is built (packing only needs offsets).  Raises _Broken."""
    op = buf[i]
    if op == 2 or op == 8 or op == 7:
        # ADDX, and CONTINUE / ADD_XID: an i32 xid, then the same ADDX body
        if op == 2:
            xid, at = 0, i + 1
        else:
            if i + 9 > n:
                return None
            xid, at = _u32(buf, i + 1)[0], i + 5
        if at + 4 > n:
            return None
        size = _i32(buf, at)[0]
        end = at + 4 + size
        if size < 0:
            raise _Broken(f"negative size {size} in {_ADDX_NAMES[op]} record")
        if end > n:
            return None
        if size < 16:
            raise _Broken(f"ADDX body of {size} bytes (< 16)")
        if not items:
            return op, None, xid, end
        add, exp = _qq(buf, at + 4)
        return op, QItem(add, exp, buf[at + 20:end]), xid, end
    if op == 1:
        return 1, None, 0, i + 1
    if op == 9 or op == 5 or op == 6 or op == 4:
        if i + 5 > n:
            return None
        return op, None, _u32(buf, i + 1)[0], i + 5
    if op == 0:
        if i + 5 > n:
            return None
        size = _i32(buf, i + 1)[0]
        end = i + 5 + size
        if size < 0:
            raise _Broken(f"negative size {size} in ADD record")
        if end > n:
            return None
        if size < 4:
            raise _Broken(f"ADD body of {size} bytes (< 4)")
        if not items:
            return 0, None, 0, end
        exp_s = _i32(buf, i + 5)[0]
        return 0, QItem(now_ms, exp_s * 1000 if exp_s else 0, buf[i + 9:end]), 0, end
    if op == 3:
        return 3, None, 0, i + 1
    raise _Broken(f"invalid opcode {op}")


class Cursor:
    """Reads records of one file from a byte offset, in big pread chunks.

    `limit` (a file offset) keeps it from reading bytes the writer has not
    finished: a cursor never buffers past it, so a torn write that was later
    truncated can never be decoded."""

    __slots__ = ("path", "name", "fd", "pos", "buf", "base", "items")

    def __init__(self, path: str, name: str, pos: int = 0, items: bool = True) -> None:
        self.path = path
        self.name = name
        self.fd = os.open(path, os.O_RDONLY)
        self.pos = pos
        self.base = pos
        self.buf = b""
        self.items = items

    def read(self, now_ms: int, limit: int = -1):
        """The next record as (opcode, item, xid, end-in-buffer), or None at a
        clean end of file (or at `limit`).  Raises JournalCorrupt."""
        buf = self.buf
        i = self.pos - self.base
        n = len(buf)
        while True:
            if i < n:
                try:
                    r = decode(buf, i, n, now_ms, self.items)
                except _Broken as e:
                    raise JournalCorrupt(self.path, self.pos, str(e)) from None
                if r is not None:
                    self.pos = self.base + r[3]
                    return r
                if self.items and n - i >= 25:
                    r = self._read_big(buf, i, n, limit)
                    if r is not None:
                        return r
            at = self.base + n
            want = max(CHUNK, 2 * (n - i))
            if limit >= 0:
                want = min(want, limit - at)
            more = os.pread(self.fd, want, at) if want > 0 else b""
            if not more:
                if i >= n:
                    return None
                raise JournalCorrupt(self.path, self.pos, "end of file inside a record", torn=True)
            buf = self.buf = buf[i:] + more if i < n else more
            self.base = self.pos
            i = 0
            n = len(buf)

    def _read_big(self, buf: bytes, i: int, n: int, limit: int):
        """An ADDX / ADD_XID / CONTINUE of BIG_READ bytes or more whose head is buffered: its data
        is read straight into the `bytes` the item keeps (a BytesIO over a fresh `bytes` of the
        data's size, whose `getvalue` hands over that very object: CPython), in preads that run
        without the GIL.  Growing the buffer chunk by chunk copied an 8 MiB item three to four
        times, then once more to slice it out (issue 8: read-behind on the flood worker's loop).
        The record as `read` returns it, or None when it is not such a record."""
        op = buf[i]
        if op == 2:
            xid, at = 0, i + 1
        elif op == 8 or op == 7:
            xid, at = _u32(buf, i + 1)[0], i + 5
        else:
            return None
        size = _i32(buf, at)[0]
        if size - 16 < BIG_READ or at + 20 > n:
            return None
        add, exp = _qq(buf, at + 4)
        start = self.base + at + 20               # file offset of the data
        end = start + size - 16
        if 0 <= limit < end:
            raise JournalCorrupt(self.path, self.pos, "end of file inside a record", torn=True)
        have = min(n - (at + 20), size - 16)
        out = io.BytesIO(bytes(size - 16))
        with out.getbuffer() as view:
            view[:have] = memoryview(buf)[at + 20:at + 20 + have]
            got = have
            while got < len(view):
                k = os.preadv(self.fd, [view[got:]], start + got)
                if k <= 0:
                    raise JournalCorrupt(self.path, self.pos, "end of file inside a record", torn=True)
                got += k
        data = out.getvalue()
        del out
        self.pos = self.base = end
        self.buf = b""
        return op, QItem(add, exp, data), xid, 0

    def drop_buffer(self) -> None:
        self.buf = b""
        self.base = self.pos

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def read_records(path: str, start: int = 0, now_ms: int = 0) -> Iterator[tuple[int, Record]]:
    """Yield (offset, Record) for every record of one journal file.  A legacy
    ADD gets `now_ms` as its add time.  Raises JournalCorrupt at a broken record
    (after yielding everything before it)."""
    cur = Cursor(path, os.path.basename(path), start)
    try:
        while True:
            off = cur.pos
            r = cur.read(now_ms)
            if r is None:
                return
            yield off, Record(r[0], r[1], r[2])
    finally:
        cur.close()
