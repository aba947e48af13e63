"""Packing: journal files in, one compact journal out, as a pure function over files.

`pack_files` replays the given files (in order, as one stream) and writes a
journal holding only the resulting state: ADDX + REMOVE_TENTATIVE_XID for each
transaction still open (ascending xid), then ADDX for each queued item in queue
order.  It serves `lanner qpack` (§6.7) and the server's checkpoint packs (§6.5):
the files up to a checkpoint replay to exactly the state at the checkpoint, so
their pack followed by the later files replays to the same state as all the
original files (Kestrel needed placeholder items because it packed from memory).

Memory does not grow with the journal:

* pass 1 streams the records without building items and keeps only where each
  surviving item's record is (a "location": file index << 48 | byte offset).
  Queued locations go through `_LocFifo`, a FIFO spilled to an unlinked
  temporary file (8 bytes per item, read back sequentially); the open
  transactions and the items an UNREMOVE pushed back to the head are few and
  stay in memory;
* pass 2 reads each surviving record again by its location (mostly forward,
  in big chunks) and appends it to the output as ADDX.

A broken record raises `JournalCorrupt` and nothing is written: a pack replaces
its inputs, so skipping what cannot be read would delete it for good.  The one
exception, for `lanner qpack` (`allow_torn_tail`), is a torn tail of the LAST
file (it ends inside its last record, as after a crash mid-write): that record
is left out and reported in `PackResult.broken`, as replay would truncate it.
The inputs are never modified.  The output is written to `<out_path>.tmp`,
fsynced, then renamed to `out_path`.
"""
from __future__ import annotations

import logging
import os
import tempfile
from array import array
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from lanner.clock import SYSTEM_CLOCK
from lanner.storage.journal.codec import CHUNK, Cursor, JournalCorrupt, decode, encode_add, encode_open, pack_addx
from lanner.storage.journal.files import unlink_quietly, write_all

log = logging.getLogger(__name__)

_OFF_BITS = 48
_OFF_MASK = (1 << _OFF_BITS) - 1
_FIFO_BLOCK = 8192            # locations per spill write / read


@dataclass(slots=True)
class PackResult:
    out_path: str
    items: int                 # queued items written (open transactions not included)
    bytes: int                 # their data bytes
    open_xids: list[int] = field(default_factory=list)
    xid_counter: int = 0       # the counter replaying the inputs ends with
    in_bytes: int = 0
    out_bytes: int = 0
    broken: list[tuple[str, int, str]] = field(default_factory=list)   # (file, offset, reason): a torn tail left out


class _LocFifo:
    """FIFO of 64-bit locations; all but the last block live in a temp file."""

    __slots__ = ("_fd", "_w", "_spilled", "_head", "_r", "_r_start")

    def __init__(self, dirpath: str | None) -> None:
        self._fd, path = tempfile.mkstemp(prefix="~~pack-", dir=dirpath)
        os.unlink(path)               # nothing to clean up after a crash (and `~~` names are never queues)
        self._w = array("Q")          # newest entries, not yet spilled
        self._spilled = 0             # entries in the file
        self._head = 0                # entries consumed (an index over file + _w)
        self._r = array("Q")          # read buffer = file entries [_r_start, _r_start + len(_r))
        self._r_start = 0

    def __len__(self) -> int:
        return self._spilled + len(self._w) - self._head

    def push(self, loc: int) -> None:
        w = self._w
        w.append(loc)
        if len(w) >= _FIFO_BLOCK:
            os.pwrite(self._fd, w.tobytes(), self._spilled * 8)
            self._spilled += len(w)
            self._w = array("Q")

    def pop(self) -> int:
        h = self._head
        if h < self._spilled:
            i = h - self._r_start
            if i < 0 or i >= len(self._r):
                n = min(_FIFO_BLOCK, self._spilled - h)
                self._r = array("Q", os.pread(self._fd, n * 8, h * 8))
                self._r_start = h
                i = 0
            loc = self._r[i]
        else:
            loc = self._w[h - self._spilled]
        self._head = h + 1
        if self._head == self._spilled + len(self._w):
            self._reset()
        return loc

    def _reset(self) -> None:
        """Empty again: start the spill file over, so a draining queue keeps it small."""
        self._w = array("Q")
        self._spilled = self._head = self._r_start = 0
        self._r = array("Q")
        os.ftruncate(self._fd, 0)

    def close(self) -> None:
        os.close(self._fd)


class _ItemReader:
    """Reads the record at a location, caching one big chunk per call site."""

    __slots__ = ("_fds", "_paths", "_fi", "_buf", "_base", "_now")

    def __init__(self, paths: list[str], now_ms: int) -> None:
        self._paths = paths
        self._fds = [os.open(p, os.O_RDONLY) for p in paths]
        self._fi = -1
        self._buf = b""
        self._base = 0
        self._now = now_ms

    def get(self, loc: int):
        fi = loc >> _OFF_BITS
        off = loc & _OFF_MASK
        buf = self._buf
        if fi == self._fi and self._base <= off < self._base + len(buf):
            r = decode(buf, off - self._base, len(buf), self._now)
            if r is not None:
                return r[1]
        want = CHUNK
        while True:
            buf = os.pread(self._fds[fi], want, off)
            r = decode(buf, 0, len(buf), self._now) if buf else None
            if r is not None:
                self._fi, self._buf, self._base = fi, buf, off
                return r[1]
            if len(buf) < want:
                raise JournalCorrupt(self._paths[fi], off, "record changed since it was scanned")
            want *= 2

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)


def pack_files(files: list[str], out_path: str, open_xids_at_checkpoint=None,
               progress: Callable[[int, int], None] | None = None, *, now_ms: int | None = None,
               legacy_xids: bool = False, allow_torn_tail: bool = False) -> PackResult:
    """Replay `files` in order and write their state as one journal at `out_path`.

    `open_xids_at_checkpoint` (the journal's snapshot at the checkpoint) is
    only cross-checked: the files are the authority.  A legacy ADD gets
    `now_ms` as its add time, as at replay.  A legacy REMOVE_TENTATIVE reserves
    under xid 0 as the server's replay does, or, with `legacy_xids` (qpack),
    under the next free xid as Kestrel's JournalPacker did.  `progress(done,
    total)` is called every few MiB."""
    if now_ms is None:
        now_ms = SYSTEM_CLOCK.now_ms()
    if len(files) >= 1 << (64 - _OFF_BITS):
        raise ValueError(f"too many journal files to pack at once: {len(files)}")
    sizes = [os.path.getsize(p) for p in files]
    in_total = sum(sizes)
    result = PackResult(out_path, 0, 0, in_bytes=in_total)
    report_every = 4 << 20
    next_report = report_every

    fifo = _LocFifo(os.path.dirname(os.path.abspath(out_path)))
    try:
        head: deque[int] = deque()            # locations UNREMOVE put back at the head
        opened: dict[int, int] = {}           # xid -> location
        xid_counter = 0
        legacy_counter = 0                    # JournalPacker's currentXid: SAVE_XID and legacy RSVs only
        done_before = 0

        def take():
            if head:
                return head.popleft()
            if len(fifo):
                return fifo.pop()
            return None

        # pass 1: where is every surviving item?
        for fi, path in enumerate(files):
            base = fi << _OFF_BITS
            cur = Cursor(path, os.path.basename(path), items=False)
            try:
                while True:
                    off = cur.pos
                    try:
                        r = cur.read(now_ms)
                    except JournalCorrupt as e:
                        if not (allow_torn_tail and e.torn and fi == len(files) - 1):
                            raise
                        log.warning("pack: %s ends inside its last record (offset %d): a torn write, "
                                    "left out", e.file, e.offset)
                        result.broken.append((e.file, e.offset, e.reason))
                        break
                    if r is None:
                        break
                    op = r[0]
                    if op == 2 or op == 0 or op == 7:
                        fifo.push(base | off)
                    elif op == 1:
                        take()
                    elif op == 9 or op == 3:
                        xid = r[2]
                        if op == 3 and legacy_xids:
                            legacy_counter += 1
                            while legacy_counter == 0 or legacy_counter in opened:
                                legacy_counter += 1
                            xid = legacy_counter
                        xid_counter = xid
                        loc = take()
                        if loc is not None:
                            opened[xid] = loc
                    elif op == 5:
                        loc = opened.pop(r[2], None)
                        if loc is not None:
                            head.appendleft(loc)
                    elif op == 6:
                        opened.pop(r[2], None)
                    elif op == 8:
                        opened.pop(r[2], None)
                        fifo.push(base | off)
                    else:
                        xid_counter = legacy_counter = r[2]
                    if progress is not None and done_before + off >= next_report:
                        progress(done_before + off, 2 * in_total)
                        next_report = done_before + off + report_every
            finally:
                cur.close()
            done_before += sizes[fi]

        result.open_xids = sorted(opened)
        result.xid_counter = xid_counter
        if open_xids_at_checkpoint is not None and sorted(open_xids_at_checkpoint) != result.open_xids:
            log.warning("pack of %s: the files leave open xids %s, the checkpoint recorded %s; "
                        "the files win", files[-1] if files else "(nothing)", result.open_xids,
                        sorted(open_xids_at_checkpoint))

        # pass 2: copy the survivors
        survivors = len(head) + len(fifo)
        tmp = out_path + ".tmp"
        reader = _ItemReader(files, now_ms)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            out = bytearray()
            written = 0
            for xid in result.open_xids:
                out += encode_add(reader.get(opened[xid]))
                out += encode_open(xid)
            addx = pack_addx
            while True:
                loc = take()
                if loc is None:
                    break
                item = reader.get(loc)
                n = len(item.data)
                out += addx(2, n + 16, item.add_time, item.expiry)
                out += item.data
                result.items += 1
                result.bytes += n
                if len(out) >= CHUNK:
                    written += write_all(fd, out, tmp)
                    out.clear()
                    if progress is not None:
                        progress(in_total + in_total * result.items // max(survivors, 1), 2 * in_total)
            written += write_all(fd, out, tmp)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            reader.close()
            unlink_quietly(tmp)
            raise
        os.close(fd)
        reader.close()
        os.rename(tmp, out_path)
        result.out_bytes = written
        if progress is not None:
            progress(2 * in_total, 2 * in_total)
        return result
    finally:
        fifo.close()
