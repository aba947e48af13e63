"""Kestrel's per-queue journal files: record codec, file set, and the `Journal` storage.

Format (reference §6.2, integers little-endian).  Lanner writes only opcodes
1 REMOVE, 2 ADDX, 5 UNREMOVE, 6 CONFIRM_REMOVE, 8 CONTINUE and
9 REMOVE_TENTATIVE_XID, so Kestrel can read Lanner's files; the reader accepts
every opcode 0-9 because old Kestrel journals hold the legacy ones.

Files of queue `q` in the queue directory (§6.1):

* `q`           the current journal; the writer appends here and nowhere else.
* `q.<ms>`      archived journals, replayed in NUMERIC order of <ms>, then `q`.
* `q~~<ms>`     temporary files; deleted when `q` is replayed.
* `q.<ms>.pack` a complete summary of every archive with a timestamp <= ms.
  Whenever archives are listed, older archives are deleted and the pack is
  renamed to `q.<ms>`.

Invariants this module keeps:

1. The records on disk are always a prefix of the records the queue issued, in
   order.  A failed write is truncated away and its records stay buffered until
   the owner either retries the flush or rolls back (`rollback`: the records are
   dropped and the queue undoes their changes, queues/undo.py); nothing is ever
   dropped from the middle, because a lost ADD would make every later REMOVE
   consume the wrong item.  Marks (positions for the undo log) count every byte
   this object ever appended, across rotations and rewrites: `_base` is the mark
   of byte 0 of the current file.
2. Archive timestamps only grow: a new name is max(now, last + 1), created
   exclusively, bumped by 1 ms while taken.  A clock that steps back cannot
   reorder replay.
3. A `.pack` file appears only by an atomic rename of a complete, fsynced file,
   so "delete every archive <= ts, then rename the pack" is safe to redo after
   a crash at any point.  A rewrite first archives the current file, so the
   pack it produces covers every file of the queue (Kestrel left a window where
   a crash replayed the old current file on top of its rewrite).
4. No path ever leaves the queue directory: queue names are asserted to hold no
   `/`, `.`, `~` or NUL before any path is built.

Replay follows Kestrel (§6.3, §5.8): one stream over archives then `q`,
read-behind entered once the queue's bytes reach max_memory_size.  A broken
record is handled by one rule (issue 11, defect 6): only a torn tail is
repaired, that is the current file ending inside its last record (a crash
during a write) or in zero bytes (a filesystem that grew the file before the
data reached it); it is truncated, logged with file, offset and bytes cut.  A
broken record anywhere else (an invalid opcode, a bad size, a torn archive)
stops replay with `JournalReplayError` naming the queue, file and offset, and
start-up fails (exit 3): the files are left exactly as they are, because with
no checksum in Kestrel's format nothing after the break can be trusted or
skipped to.  A flipped byte inside item data is not detectable at all.

Checkpoint packs (§6.5) differ from Kestrel's in one deliberate way: the pack is
computed from the archived files alone (`packer.pack_files`), not from the
queue's memory, so no placeholder items are needed: the files up to the
checkpoint replay to exactly the state at the checkpoint, and the later files
replay on top of their summary.  The server's cleaner process runs the pack;
stand-alone journals run it inline.
"""
from __future__ import annotations

import errno
import logging
import os
import re
import struct
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator, NamedTuple

from lanner.config import validate_queue_name
from lanner.queues.item import QItem
from lanner.storage.seam import ReplayState

log = logging.getLogger(__name__)

# Disk I/O goes through these so tests can inject ENOSPC, short writes and
# failing fsyncs (beanstalkd's `falloc` idea).  Look them up at call time.
_write = os.write
_fsync = os.fsync

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

CHUNK = 1 << 20                 # read size of every journal reader
AUTOFLUSH = 4 << 20             # pending bytes that force a flush
PROGRESS_STEP = 16 << 20        # replay progress callback granularity

_ADDX = struct.Struct("<Biqq")          # opcode, size (= len + 16), add time ms, expiry ms
_XADDX = struct.Struct("<BIiqq")        # opcode, xid, size, add time, expiry (CONTINUE)
_XID = struct.Struct("<BI")             # opcode, xid
_ADDX_pack = _ADDX.pack
_XADDX_pack = _XADDX.pack
_XID_pack = _XID.pack
_i32 = struct.Struct("<i").unpack_from
_u32 = struct.Struct("<I").unpack_from
_qq = struct.Struct("<qq").unpack_from
_iqq = struct.Struct("<iqq").unpack_from
_ii = struct.Struct("<ii").unpack_from

_ARCHIVE_RE = re.compile(r"([0-9]+)(\.pack)?")


class JournalError(OSError):
    """An I/O failure on a journal file; `str()` names the file."""

    def __init__(self, path: str, reason: str, err: int | None = None) -> None:
        super().__init__(err or errno.EIO, f"{path}: {reason}")
        self.path = path
        self.reason = reason


class JournalCorrupt(ValueError):
    """A record that cannot be decoded: `file`, byte `offset` of the record, `reason`;
    `torn` when the file simply ends inside the record (what a crash mid-write leaves)."""

    def __init__(self, file: str, offset: int, reason: str, torn: bool = False) -> None:
        super().__init__(f"{file} at offset {offset}: {reason}")
        self.file = file
        self.offset = offset
        self.reason = reason
        self.torn = torn


class StrayFile(ValueError):
    """A file in the queue directory that is not a journal: Kestrel refuses to start on
    one, and so do we, naming it."""


class JournalReplayError(ValueError):
    """Replay refuses a journal it cannot read to the end (module docstring): one line
    naming the queue, the file, the offset and what to do."""


class Record(NamedTuple):
    opcode: int
    item: QItem | None     # ADD, ADDX, ADD_XID, CONTINUE
    xid: int               # SAVE_XID, UNREMOVE, CONFIRM, ADD_XID, CONTINUE, REMOVE_TENTATIVE(_XID)


class _Broken(Exception):
    pass


# ---------------------------------------------------------------- codec

def encode_add(item: QItem) -> bytes:
    """ADDX: `02 | len+16 | add time | expiry | data`."""
    return _ADDX_pack(OP_ADDX, len(item.data) + 16, item.add_time, item.expiry) + item.data


def encode_remove() -> bytes:
    return b"\x01"


def encode_open(xid: int) -> bytes:
    return _XID_pack(OP_REMOVE_TENTATIVE_XID, xid)


def encode_unremove(xid: int) -> bytes:
    return _XID_pack(OP_UNREMOVE, xid)


def encode_confirm(xid: int) -> bytes:
    return _XID_pack(OP_CONFIRM_REMOVE, xid)


def encode_continue(xid: int, item: QItem) -> bytes:
    return _XADDX_pack(OP_CONTINUE, xid, len(item.data) + 16, item.add_time, item.expiry) + item.data


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


# ---------------------------------------------------------------- file set

def _check_name(name: str) -> None:
    assert name and not any(c in name for c in "/.~\0"), f"unsafe journal queue name {name!r}"


_STRAY = ("not a journal file (expected <queue>, <queue>.<epoch-ms> or <queue>.<epoch-ms>.pack); "
          "move it out of the queue path")


def parse_archive(name: str, fname: str) -> tuple[int, bool] | None:
    """(timestamp, is_pack) for `<name>.<ts>` / `<name>.<ts>.pack`; None if fname is
    not an archive of `name`.  Raises StrayFile for `<name>.<junk>`."""
    if not fname.startswith(name + "."):
        return None
    m = _ARCHIVE_RE.fullmatch(fname, len(name) + 1)
    if m is None:
        raise StrayFile(f"{fname}: {_STRAY}")
    return int(m.group(1)), m.group(2) is not None


def archived_files(queue_path: str, name: str) -> list[str]:
    """Archive file names of `name` in replay order, after finishing any pack:
    a `<name>.<ts>.pack` deletes every archive with t <= ts, then becomes `<name>.<ts>`."""
    _check_name(name)
    while True:
        entries = []
        for fname in os.listdir(queue_path):
            p = parse_archive(name, fname)
            if p is not None and os.path.isfile(os.path.join(queue_path, fname)):
                entries.append((p[0], p[1], fname))
        packs = sorted(e for e in entries if e[1])
        if not packs:
            entries.sort()
            return [e[2] for e in entries]
        ts, _, pack = packs[0]
        for t, is_pack, fname in entries:
            if not is_pack and t <= ts:
                log.info("queue %r: deleting packed file %s", name, fname)
                os.unlink(os.path.join(queue_path, fname))
        os.rename(os.path.join(queue_path, pack), os.path.join(queue_path, f"{name}.{ts}"))


def journal_files(queue_path: str, name: str) -> list[str]:
    """Every journal file of the queue in replay order (names, current last if present)."""
    files = archived_files(queue_path, name)
    if os.path.isfile(os.path.join(queue_path, name)):
        files.append(name)
    return files


def stored_items(queue_path: str, name: str) -> int | None:
    """Items (queued or open) the journal files of `name` hold, read without changing them
    (no replay, no truncation); None if a file cannot be read to its end."""
    queued = 0
    opened: set[int] = set()
    try:
        files = journal_files(queue_path, name)
    except OSError:
        return None
    for fname in files:
        try:
            cur = Cursor(os.path.join(queue_path, fname), fname, items=False)
        except OSError:
            return None
        try:
            while True:
                try:
                    r = cur.read(0)
                except JournalCorrupt as e:
                    if e.torn and fname == files[-1]:
                        break
                    return None
                if r is None:
                    break
                op = r[0]
                if op in ADD_OPS:
                    if op == OP_CONTINUE:
                        opened.discard(r[2])
                    queued += 1
                elif op == OP_REMOVE or op == OP_REMOVE_TENTATIVE or op == OP_REMOVE_TENTATIVE_XID:
                    if queued:
                        queued -= 1
                        if op != OP_REMOVE:
                            opened.add(r[2])
                elif op == OP_UNREMOVE:
                    if r[2] in opened:
                        opened.discard(r[2])
                        queued += 1
                elif op == OP_CONFIRM_REMOVE:
                    opened.discard(r[2])
        finally:
            cur.close()
    return queued + len(opened)


def queue_names_in(queue_path: str) -> list[str]:
    """Names of the queues whose journals are in `queue_path` (start-up listing, §5.1),
    sorted: regular files only (directories such as `cmdlog/` are not journals), `~~`
    temporaries ignored, name = the part before the first `.`, after which only an
    archive suffix (`<ms>` or `<ms>.pack`) may follow.  Any other file, or a name that is
    not a legal journal queue name, raises StrayFile naming it."""
    names = set()
    with os.scandir(queue_path) as it:
        for entry in it:
            if "~~" in entry.name or not entry.is_file():
                continue
            name, dot, rest = entry.name.partition(".")
            if dot and not _ARCHIVE_RE.fullmatch(rest):
                raise StrayFile(f"{entry.path}: {_STRAY}")
            try:
                validate_queue_name(name)
            except ValueError as e:
                raise StrayFile(f"{entry.path}: {e}") from None
            names.add(name)
    return sorted(names)


def _zeros_from(path: str, offset: int) -> bool:
    """True if every byte of `path` from `offset` on is zero."""
    with open(path, "rb") as f:
        f.seek(offset)
        while True:
            chunk = f.read(CHUNK)
            if not chunk:
                return True
            if chunk.count(0) != len(chunk):
                return False


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        _fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------- Journal

@dataclass(slots=True)
class Checkpoint:
    """Recorded at a rotation once the journal outgrew max_journal_size: every
    file up to and including `file` may be packed."""
    file: str
    open_xids: list[int]


@dataclass(slots=True)
class PackRequest:
    """Work for `packer.pack_files(files, out_path, open_xids)`; its result goes
    back to `Journal.pack_done` of the same queue."""
    queue: str
    files: list[str]          # full paths, replay order, ending with the checkpoint file
    out_path: str             # a `<queue>~~<ms>` temp name: deleted at replay if never used
    checkpoint_file: str
    open_xids: list[int] = field(default_factory=list)


_WFLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT


class Journal:
    """The storage seam (seam.py) over Kestrel journal files; it is its own `medium`.

    Writes are buffered in a bytearray; `flush()` hands them to the OS in one
    write.  Write-failure policy: a failed flush truncates the file back to its
    last good size, keeps every pending record buffered and raises JournalError;
    the owner then rolls back (`rollback`, queues/undo.py) and answers
    SERVER_ERROR.  Flushes the journal starts itself (a big buffer, read-behind
    catching up) never raise: a failure there leaves the records buffered for
    the owner's flush.  `logsize` counts buffered bytes (as Kestrel's size did),
    `flushed_size` only what the OS has.  Maintenance (rotate, rewrite) that
    fails is logged and skipped: it never fails the client's operation.

    Threads: every method runs on the owner's thread except `sync()`, which the
    worker may call from its group-commit thread; there it only fsyncs what
    `flush()` already wrote and never touches the buffer.
    """

    can_read_behind = True

    def __init__(self, queue_path: str, name: str, clock, sync_policy: str | int = "never",
                 *, inline_pack: bool = True) -> None:
        _check_name(name)
        self._dir = queue_path
        self._path = os.path.join(queue_path, name)
        assert os.path.dirname(os.path.normpath(self._path)) == os.path.normpath(queue_path), name
        self.name = name
        self._clock = clock
        self.sync_policy = sync_policy
        self.inline_pack = inline_pack
        self.progress: Callable[[int, int], None] | None = None
        self.rewrites = 0
        self.rotations = 0
        self._owner = threading.get_ident()
        self._fd = -1
        self._gen = 0                    # bumped whenever _fd changes
        self._pending = bytearray()
        self._base = 0                   # mark of byte 0 of the current file (module invariant 1)
        self._disk_size = 0              # bytes of the current file the OS has
        self._synced_size = 0
        self._torn = False               # a failed write may have left bytes past _disk_size
        self._archived_size = 0
        self._last_ts = 0
        self._rewrites_allowed_at = float("-inf")   # clock.monotonic()
        self._rb: Cursor | None = None
        self.checkpoint: Checkpoint | None = None
        self._pack_outstanding: PackRequest | None = None
        self._closed = False
        self._erased = False

    # -------------------------------------------------------- stats, state
    @property
    def logsize(self) -> int:
        return self._disk_size + len(self._pending)

    @property
    def flushed_size(self) -> int:
        return self._disk_size

    @property
    def archived_size(self) -> int:
        return self._archived_size

    @property
    def in_read_behind(self) -> bool:
        return self._rb is not None

    # -------------------------------------------------------- the medium (seam.py, undo.py)
    @property
    def medium(self) -> "Journal":
        return self

    @property
    def written_mark(self) -> int:
        return self._base + self._disk_size

    @property
    def durable_mark(self) -> int:
        return self._base + self._synced_size

    @property
    def committed_mark(self) -> int:
        return self._base + (self._synced_size if self.sync_policy == "always" else self._disk_size)

    def rollback(self, mark: int) -> None:
        """Drop every record from `mark` on: buffered ones, and ones written but not fsynced
        (the file is cut back).  Owner's thread, with no fsync of this journal under way."""
        start = self._base + self._disk_size
        if mark >= start:
            del self._pending[mark - start:]
            return
        del self._pending[:]
        off = mark - self._base
        if off < 0:     # cannot happen: rotation and rewrite leave everything before them durable
            log.error("queue %r: cannot roll back into an archived journal (mark %d, file starts at %d)",
                      self.name, mark, self._base)
            off = 0
        self._disk_size = off
        if self._synced_size > off:
            self._synced_size = off
        self._gen += 1               # an fsync under way in a thread must not count these bytes
        self._torn = True
        try:
            self._untear()
        except JournalError as e:
            log.error("queue %r: %s (retried before the next write)", self.name, e)
        rb = self._rb
        if rb is not None and rb.name == self.name and rb.pos > off:
            rb.pos = off
            rb.drop_buffer()

    def undo_record(self, kind: int, item: QItem, xid: int) -> None:
        """Nothing: a journal keeps no state per record besides the bytes."""

    @property
    def dirty(self) -> bool:
        """Buffered records, or (unless the policy is "never") unsynced ones."""
        return bool(self._pending) or (self.sync_policy != "never" and self._synced_size < self._disk_size)

    def files(self) -> list[str]:
        return journal_files(self._dir, self.name)

    # -------------------------------------------------------- replay
    def replay(self, config) -> ReplayState:
        """Rebuild the queue from its files (§6.3), entering read-behind as Kestrel
        does (§5.8), then open the writer on `<queue>`."""
        now = self._clock.now_ms()
        max_mem = config.max_memory_size
        os.makedirs(self._dir, exist_ok=True)
        tmp_prefix = self.name + "~~"
        for fname in os.listdir(self._dir):
            if fname.startswith(tmp_prefix):
                os.unlink(os.path.join(self._dir, fname))
        archives = archived_files(self._dir, self.name)
        if archives:
            self._last_ts = max(parse_archive(self.name, a)[0] for a in archives)
        new = not archives and not os.path.exists(self._path)
        if not os.path.exists(self._path):
            os.close(os.open(self._path, _WFLAGS, 0o644))
        files = archives + [self.name]
        sizes = [os.path.getsize(os.path.join(self._dir, f)) for f in files]
        total = sum(sizes)
        progress = self.progress
        next_report = PROGRESS_STEP

        st = ReplayState()
        mem = st.items
        open_tx = st.open_transactions
        mem_bytes = length = nbytes = adds = 0
        xid_counter = 0
        rb: Cursor | None = None
        done_before = 0
        last = len(files) - 1
        for idx, fname in enumerate(files):
            path = os.path.join(self._dir, fname)
            try:
                cur = Cursor(path, fname)
            except OSError as e:
                raise JournalReplayError(f"queue {self.name!r}: cannot read journal {path} "
                                         f"({e.strerror}); refusing to start without it") from None
            read = cur.read
            try:
                while True:
                    try:
                        r = read(now)
                    except JournalCorrupt as e:
                        self._broken(e, idx == last)
                        break
                    if r is None:
                        break
                    op = r[0]
                    if op == 2 or op == 8 or op == 0 or op == 7:
                        if op == 8:
                            open_tx.pop(r[2], None)
                        item = r[1]
                        n = len(item.data)
                        adds += 1
                        length += 1
                        nbytes += n
                        if rb is None:
                            mem.append(item)
                            mem_bytes += n
                            if nbytes >= max_mem:
                                log.info("queue %r: replay drops to read-behind at %s:%d", self.name, fname, cur.pos)
                                rb = Cursor(path, fname, cur.pos)
                    elif op == 1 or op == 9 or op == 3:
                        if op != 1:
                            xid_counter = r[2]
                        if mem:
                            item = mem.popleft()
                            n = len(item.data)
                            mem_bytes -= n
                            length -= 1
                            nbytes -= n
                            if op != 1:
                                item.xid = r[2]
                                open_tx[r[2]] = item
                            if rb is not None and mem_bytes < max_mem:
                                rb, got = self._replay_fill(rb, files, fname, cur.pos, max_mem - mem_bytes, mem, now)
                                mem_bytes += got
                    elif op == 5:
                        item = open_tx.pop(r[2], None)
                        if item is not None:
                            item.xid = 0
                            n = len(item.data)
                            mem.appendleft(item)
                            length += 1
                            nbytes += n
                            mem_bytes += n
                    elif op == 6:
                        open_tx.pop(r[2], None)
                    else:                           # 4 SAVE_XID
                        xid_counter = r[2]
                    if progress is not None and done_before + cur.pos >= next_report:
                        progress(done_before + cur.pos, total)
                        next_report = done_before + cur.pos + PROGRESS_STEP
            finally:
                cur.close()
            done_before += sizes[idx]
        if progress is not None:
            progress(total, total)

        if rb is not None:
            rb.drop_buffer()       # the current file may have been truncated under it
        self._rb = rb
        self._open_writer()
        self._archived_size = sum(sizes[:-1])
        st.total_items = length
        st.total_bytes = nbytes
        st.xid_counter = xid_counter
        st.read_behind = rb is not None
        st.replayed_adds = adds
        if new:
            log.info("queue %r: new queue, journal %s created", self.name, self._path)
        else:
            log.info("queue %r: replayed %d files, %d bytes: %d items (%d in memory), %d open, xid=%d",
                     self.name, len(files), total, length, len(mem), len(open_tx), xid_counter)
        return st

    def _broken(self, e: JournalCorrupt, is_current: bool) -> None:
        """Truncate a torn tail of the current file; refuse anything else (module docstring)."""
        size = os.path.getsize(e.file)
        if is_current and (e.torn or _zeros_from(e.file, e.offset)):
            log.warning("queue %r: torn record at the end of %s: offset %d (%s); truncating %d bytes "
                        "(a write that never completed)", self.name, e.file, e.offset, e.reason,
                        size - e.offset)
            os.truncate(self._path, e.offset)
            return
        where = "" if is_current else "archived "
        raise JournalReplayError(
            f"queue {self.name!r}: {where}journal {e.file} is corrupt at offset {e.offset} of {size} "
            f"({e.reason}); refusing to start rather than drop the {size - e.offset} bytes after it. "
            f"Keep a copy of the file, then either cut it there to accept that loss "
            f"(truncate -s {e.offset} {e.file}) or move the queue's files out of the queue path")

    def _replay_fill(self, rb: Cursor, files: list[str], lim_name: str, lim_pos: int, want: int,
                     mem: deque, now: int) -> tuple[Cursor | None, int]:
        """Kestrel's fillReadBehind while replaying: the reader follows the replay
        position and leaves read-behind when it reaches it."""
        got = 0
        while got < want:
            if rb.name == lim_name and rb.pos >= lim_pos:
                rb.close()
                return None, got
            try:
                r = rb.read(now)
            except JournalCorrupt:
                r = None                  # replay already reported it; skip the rest of the file
            if r is None:
                nxt = files[files.index(rb.name) + 1]
                rb.close()
                rb = Cursor(os.path.join(self._dir, nxt), nxt)
                continue
            if r[0] in ADD_OPS:
                mem.append(r[1])
                got += len(r[1].data)
        return rb, got

    # -------------------------------------------------------- writer
    def _open_writer(self) -> None:
        """Open `<queue>` for appending; marks continue from where the old file ended."""
        end = self._base + self._disk_size
        self._fd = os.open(self._path, _WFLAGS, 0o644)
        self._gen += 1
        self._disk_size = self._synced_size = os.fstat(self._fd).st_size
        self._base = end - self._disk_size
        self._torn = False

    # Each record_* returns the mark where its record starts (seam.py).
    def record_add(self, item: QItem) -> int:
        p = self._pending
        mark = self._base + self._disk_size + len(p)
        p += _ADDX_pack(2, len(item.data) + 16, item.add_time, item.expiry)
        p += item.data
        if len(p) > AUTOFLUSH:
            self._flush_quietly()
        return mark

    def record_remove(self, item: QItem) -> int:
        p = self._pending
        mark = self._base + self._disk_size + len(p)
        p.append(1)
        return mark

    def record_open(self, item: QItem, xid: int) -> int:
        p = self._pending
        mark = self._base + self._disk_size + len(p)
        p += _XID_pack(9, xid)
        return mark

    def record_unremove(self, item: QItem, xid: int) -> int:
        p = self._pending
        mark = self._base + self._disk_size + len(p)
        p += _XID_pack(5, xid)
        return mark

    def record_confirm(self, item: QItem, xid: int) -> int:
        p = self._pending
        mark = self._base + self._disk_size + len(p)
        p += _XID_pack(6, xid)
        return mark

    def record_continue(self, xid: int, item: QItem) -> int:
        """CONTINUE: confirm `xid` and append `item` (Kestrel's library `continue`)."""
        p = self._pending
        mark = self._base + self._disk_size + len(p)
        p += _XADDX_pack(8, xid, len(item.data) + 16, item.add_time, item.expiry)
        p += item.data
        if len(p) > AUTOFLUSH:
            self._flush_quietly()
        return mark

    def _flush_quietly(self) -> bool:
        """A flush the journal starts on its own: on failure the records stay buffered for
        the owner's flush, which fails too and rolls back."""
        try:
            self.flush()
        except JournalError:
            return False
        return True

    def flush(self) -> None:
        """One write of everything pending.  On failure the file is cut back to
        its last good size and the records stay pending (module invariant 1)."""
        p = self._pending
        if not p:
            return
        if self._torn:
            self._untear()
        total = len(p)
        try:
            done = _write(self._fd, p)
            if done != total:
                self._write_rest(p, done)
        except OSError as e:
            # a view of the buffer may live on in the traceback: keep a copy instead
            self._pending = bytearray(p)
            self._torn = True
            try:
                self._untear()
            except JournalError:
                pass
            raise JournalError(self._path, f"write of {total} bytes failed: {e.strerror or e}", e.errno) from e
        self._disk_size += total
        del p[:]                # (keeps big buffers cheap to refill, unlike clear())

    def _write_rest(self, p: bytearray, done: int) -> None:
        """Finish a short write."""
        fd = self._fd
        total = len(p)
        with memoryview(p) as view:
            while done < total:
                n = _write(fd, view[done:])
                if n <= 0:
                    raise OSError(errno.EIO, "write returned 0")
                done += n

    def _untear(self) -> None:
        try:
            os.ftruncate(self._fd, self._disk_size)
        except OSError as e:
            raise JournalError(self._path, f"cannot truncate a failed write back to {self._disk_size} "
                                           f"bytes: {e.strerror}", e.errno) from e
        self._torn = False

    def sync(self) -> None:
        """flush + fsync.  Off the owner's thread: fsync of flushed data only."""
        if threading.get_ident() == self._owner:
            self.flush()
        fd, gen, target = self._fd, self._gen, self._disk_size
        if self._synced_size >= target or fd < 0:
            return
        try:
            _fsync(fd)
        except OSError as e:
            if gen != self._gen:
                return             # the file was switched meanwhile; rotation synced the old one
            raise JournalError(self._path, f"fsync failed: {e.strerror}", e.errno) from e
        if gen == self._gen and target > self._synced_size:
            self._synced_size = target

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._fd >= 0:
                self.flush()
                _fsync(self._fd)
                self._synced_size = self._disk_size
        except OSError as e:
            log.error("queue %r: closing journal %s: %s", self.name, self._path, e)
            raise
        finally:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
                self._gen += 1
            if self._rb is not None:
                self._rb.close()
                self._rb = None

    def erase(self) -> None:
        """Close and delete every file of the queue."""
        self._pending.clear()
        try:
            self.close()
        except OSError:
            pass
        self._erased = True
        Journal.erase_all(self._dir, self.name)

    @staticmethod
    def erase_all(queue_path: str, name: str) -> None:
        """Delete every journal file of `name` (`keep_journal = false`, delete)."""
        _check_name(name)
        try:
            listing = os.listdir(queue_path)
        except FileNotFoundError:
            return
        for fname in listing:
            if fname == name or fname.startswith(name + ".") or fname.startswith(name + "~~"):
                path = os.path.join(queue_path, fname)
                if os.path.isfile(path):
                    os.unlink(path)

    # -------------------------------------------------------- read-behind
    def start_read_behind(self) -> None:
        """Read-behind starts where the next record will be written, so the buffer must be
        written first; if it cannot be, the queue stays in memory for now."""
        if self._rb is not None or not self._flush_quietly():
            return
        self._rb = Cursor(self._path, self.name, self._disk_size)
        log.info("queue %r: dropping to read-behind at %s:%d", self.name, self.name, self._disk_size)

    def fill_read_behind(self, max_bytes: int, now_ms: int) -> list[QItem]:
        """Items from the reader until their bytes reach `max_bytes` (the last may
        overshoot) or the reader catches up with the writer (leaving read-behind)."""
        rb = self._rb
        out: list[QItem] = []
        if rb is None:
            return out
        got = 0
        while got < max_bytes:
            if rb.name == self.name:
                if rb.pos >= self._disk_size:
                    if self._pending:
                        if self._flush_quietly():
                            continue
                        break                 # the owner's flush fails too and rolls back
                    self._leave_read_behind()
                    break
                limit = self._disk_size
            else:
                limit = -1
            try:
                r = rb.read(now_ms, limit)
            except JournalCorrupt as e:
                log.error("queue %r: read-behind hit a broken record in %s at offset %d (%s); "
                          "DATA MAY HAVE BEEN LOST! Skipping the rest of that file.",
                          self.name, e.file, e.offset, e.reason)
                if rb.name == self.name:
                    self._leave_read_behind()
                    break
                r = None
            if r is None:
                if rb.name == self.name:
                    self._leave_read_behind()
                    break
                left = rb.name
                nxt = self._file_after(left)
                rb.close()
                rb = self._rb = Cursor(os.path.join(self._dir, nxt), nxt)
                log.info("queue %r: read-behind moves from %s to %s", self.name, left, nxt)
                if self.checkpoint is not None and self.checkpoint.file == left:
                    self._maybe_inline_pack()
                continue
            if r[0] in ADD_OPS:
                out.append(r[1])
                got += len(r[1].data)
        return out

    def _leave_read_behind(self) -> None:
        if self._rb is not None:
            self._rb.close()
            self._rb = None
            log.info("queue %r: coming out of read-behind", self.name)

    def _file_after(self, fname: str) -> str:
        ts = parse_archive(self.name, fname)[0]
        for a in archived_files(self._dir, self.name):
            if parse_archive(self.name, a)[0] > ts:
                return a
        return self.name

    # -------------------------------------------------------- rotation, rewrite (§6.4)
    def before_add(self, view, config, now_ms: int) -> None:
        self._check_rotate(view, config)

    def after_remove(self, view, config, now_ms: int) -> None:
        self._check_rotate(view, config)

    def _check_rotate(self, view, config) -> None:
        size = self._disk_size + len(self._pending)
        total = size + self._archived_size
        if size < config.default_journal_size and size <= config.max_memory_size \
                and total <= config.max_journal_size:
            return                               # no rule can match: the per-operation fast path
        allowed = self._clock.monotonic() >= self._rewrites_allowed_at
        if not config.disable_aggressive_rewrites:
            if size >= config.default_journal_size and view.length == 0 and self._rewrite_safe(view):
                log.info("queue %r: rewriting journal (qsize=0)", self.name)
                self._rewrite(view)
            elif (allowed and total > config.max_journal_size and view.size_bytes < config.max_memory_size
                  and self._rewrite_safe(view)):
                log.info("queue %r: rewriting journal (qsize=%d)", self.name, view.size_bytes)
                self._rewrite(view)
                self._disallow_rewrites(config)
            elif size > config.max_memory_size:
                self._rotate(view, total > config.max_journal_size)
        else:
            if allowed and size >= config.default_journal_size and view.length == 0 and self._rewrite_safe(view):
                log.info("queue %r: rewriting journal (qsize=0)", self.name)
                self._rewrite(view)
                if self.logsize >= config.default_journal_size // 2:
                    self._disallow_rewrites(config)
            elif (allowed and total > config.max_journal_size and view.size_bytes < config.max_memory_size
                  and self._rewrite_safe(view)):
                log.info("queue %r: rewriting journal (qsize=%d)", self.name, view.size_bytes)
                self._rewrite(view)
                self._disallow_rewrites(config)
            elif size > config.max_memory_size:
                if view.length == 0 and self._rewrite_safe(view):
                    log.info("queue %r: rewriting journal (qsize=0)", self.name)
                    self._rewrite(view)
                if self.logsize > config.max_memory_size:
                    self._rotate(view, self.logsize + self._archived_size > config.max_journal_size)

    def _disallow_rewrites(self, config) -> None:
        delay = config.min_journal_compact_delay
        if delay:
            self._rewrites_allowed_at = self._clock.monotonic() + delay / 1000.0

    def _rewrite_safe(self, view) -> bool:
        """A rewrite writes the queue's memory, so every queued item must be in it
        (Kestrel only compacted when bytes < max_memory_size); and no checkpoint
        pack may be in flight, or its result would resurrect packed files."""
        if self._pack_outstanding is not None:
            return False
        if self._rb is None:
            return True
        n = 0
        for _ in view.memory_items():
            n += 1
        return n == view.length

    def _unique_name(self, sep: str) -> str:
        """`<queue><sep><ms>`, reserved by exclusive create (module invariant 2)."""
        ts = max(self._clock.now_ms(), self._last_ts + 1)
        while True:
            fname = f"{self.name}{sep}{ts}"
            try:
                os.close(os.open(os.path.join(self._dir, fname), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            except FileExistsError:
                ts += 1
                continue
            self._last_ts = ts
            return fname

    def _switch_writer(self) -> None:
        """The current file was renamed away: start a fresh `<queue>`."""
        old = self._fd
        self._open_writer()
        if old >= 0:
            os.close(old)

    def _rotate(self, view, set_checkpoint: bool) -> None:
        try:
            self.flush()
            if self.sync_policy != "never" and self._synced_size < self._disk_size:
                # An archive is never rolled back (see `rollback`): make it durable first.
                _fsync(self._fd)
                self._synced_size = self._disk_size
            rotated = self._unique_name(".")
        except OSError as e:
            log.error("queue %r: rotation skipped: %s", self.name, e)
            return
        try:
            os.rename(self._path, os.path.join(self._dir, rotated))
        except OSError as e:
            log.error("queue %r: rotation skipped: cannot rename %s: %s", self.name, self._path, e)
            os.unlink(os.path.join(self._dir, rotated))
            return
        self._archived_size += self._disk_size
        try:
            self._switch_writer()
        except OSError as e:
            log.error("queue %r: cannot open a new %s after rotation: %s", self.name, self._path, e)
            os.rename(os.path.join(self._dir, rotated), self._path)
            self._archived_size -= self._disk_size
            return
        if self._rb is not None and self._rb.name == self.name:
            self._rb.name = rotated
        self.rotations += 1
        log.info("queue %r: rotated journal to %s", self.name, rotated)
        if set_checkpoint and self.checkpoint is None:
            self.checkpoint = Checkpoint(rotated, sorted(view.open_items()))
            log.info("queue %r: checkpoint at %s", self.name, rotated)
            if self._rb is None:
                self._maybe_inline_pack()

    def _write_file(self, path: str, chunks) -> int:
        """Write an iterable of byte strings to a new file, in big writes, fsynced."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        size = 0
        try:
            buf = bytearray()
            for c in chunks:
                buf += c
                if len(buf) >= CHUNK:
                    size += write_all(fd, buf, path)
                    buf.clear()
            size += write_all(fd, buf, path)
            _fsync(fd)
        finally:
            os.close(fd)
        return size

    def _rewrite(self, view) -> bool:
        """§6.4 rewrite, made crash-safe (module invariant 3): dump to `~~`, archive
        the current file, pack-rename the dump so it covers every archive, then
        make it the current file."""
        try:
            self.flush()
            tmp = self._unique_name("~~")
        except OSError as e:
            log.error("queue %r: rewrite skipped: %s", self.name, e)
            return False
        tmp_path = os.path.join(self._dir, tmp)
        opened = view.open_items()
        try:
            def dump():
                for xid in sorted(opened, reverse=True):
                    yield encode_add(opened[xid])
                    yield _XID_pack(9, xid)
                for item in view.memory_items():
                    yield _ADDX_pack(2, len(item.data) + 16, item.add_time, item.expiry)
                    yield item.data
            self._write_file(tmp_path, dump())
            rotated = self._unique_name(".")
        except OSError as e:
            log.error("queue %r: rewrite skipped: writing %s failed: %s", self.name, tmp_path, e)
            _unlink_quietly(tmp_path)
            return False
        try:
            os.rename(self._path, os.path.join(self._dir, rotated))
        except OSError as e:
            log.error("queue %r: rewrite skipped: cannot rename %s: %s", self.name, self._path, e)
            _unlink_quietly(tmp_path)
            _unlink_quietly(os.path.join(self._dir, rotated))
            return False
        self._leave_read_behind()
        old = self._fd
        self._fd = -1
        os.close(old)
        try:
            ts = self._last_ts + 1
            while os.path.exists(os.path.join(self._dir, f"{self.name}.{ts}")) or \
                    os.path.exists(os.path.join(self._dir, f"{self.name}.{ts}.pack")):
                ts += 1
            self._last_ts = ts
            os.rename(tmp_path, os.path.join(self._dir, f"{self.name}.{ts}.pack"))
            archived_files(self._dir, self.name)
            os.rename(os.path.join(self._dir, f"{self.name}.{ts}"), self._path)
            _fsync_dir(self._dir)
        except OSError as e:
            log.error("queue %r: rewrite stopped half way (the files remain consistent): %s", self.name, e)
            _unlink_quietly(tmp_path)
        finally:
            self._open_writer()
            self._update_archived_size()
        self.checkpoint = None
        self.rewrites += 1
        return True

    def _update_archived_size(self) -> None:
        try:
            self._archived_size = sum(os.path.getsize(os.path.join(self._dir, a))
                                      for a in archived_files(self._dir, self.name))
        except OSError as e:
            log.error("queue %r: cannot list archived journals: %s", self.name, e)

    # -------------------------------------------------------- checkpoint packs (§6.5)
    def pack_due(self) -> PackRequest | None:
        """The pack to run now, if any: once a checkpoint is set and the reader is
        no longer inside the files it covers.  Marks it outstanding until
        `pack_done`."""
        cp = self.checkpoint
        if cp is None or self._pack_outstanding is not None or self._closed:
            return None
        rb = self._rb
        if rb is not None and rb.name != self.name and \
                parse_archive(self.name, rb.name)[0] <= parse_archive(self.name, cp.file)[0]:
            return None                          # cheap answer for owners that poll every batch
        archives = archived_files(self._dir, self.name)
        if cp.file not in archives:
            self.checkpoint = None
            return None
        covered = archives[:archives.index(cp.file) + 1]
        if self._rb is not None and self._rb.name in covered:
            return None
        req = PackRequest(self.name, [os.path.join(self._dir, f) for f in covered],
                          os.path.join(self._dir, self._unique_name("~~")), cp.file, list(cp.open_xids))
        self._pack_outstanding = req
        return req

    def pack_done(self, result) -> None:
        """Install a finished pack (a `packer.PackResult`), or forget a failed one
        (None: the next `pack_due` asks again)."""
        req = self._pack_outstanding
        self._pack_outstanding = None
        if req is None:
            return
        if result is None or self._closed or self._erased:
            _unlink_quietly(req.out_path)
            return
        pack = os.path.join(self._dir, req.checkpoint_file + ".pack")
        try:
            os.rename(result.out_path, pack)
        except OSError as e:
            log.error("queue %r: cannot install the pack of %s: %s", self.name, req.checkpoint_file, e)
            _unlink_quietly(result.out_path)
            return
        if result.out_path != req.out_path:
            _unlink_quietly(req.out_path)
        try:
            archived_files(self._dir, self.name)     # deletes the packed archives, renames the pack
            _fsync_dir(self._dir)
        except OSError as e:                         # the next listing (or replay) finishes the job
            log.error("queue %r: installing the pack of %s: %s", self.name, req.checkpoint_file, e)
        self.checkpoint = None
        self._update_archived_size()
        log.info("queue %r: packed journals up to %s", self.name, req.checkpoint_file)

    def _maybe_inline_pack(self) -> None:
        if not self.inline_pack:
            return
        req = self.pack_due()
        if req is None:
            return
        from lanner.storage.journal.packer import pack_files
        try:
            result = pack_files(req.files, req.out_path, req.open_xids, now_ms=self._clock.now_ms())
        except (OSError, ValueError) as e:
            log.error("queue %r: pack of %s failed: %s", self.name, req.checkpoint_file, e)
            result = None
        self.pack_done(result)


def write_all(fd: int, buf, path: str) -> int:
    total = len(buf)
    done = 0
    with memoryview(buf) as view:
        while done < total:
            try:
                n = _write(fd, view[done:])
            except OSError as e:
                raise JournalError(path, f"write failed: {e.strerror or e}", e.errno) from e
            if n <= 0:
                raise JournalError(path, "write returned 0")
            done += n
    return total


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
