"""Kestrel journals as Spark input, without pyspark: planning and reading.

Planning (on the driver) lists the journal files of each queue in the server's
replay order and records each file's size and inode at that moment.  Reading
(on an executor, possibly more than once) opens each file, checks it is still
the same inode (following a rename: rotation turns `q` into `q.<ms>`, a pack
install turns `q.<ms>.pack` into `q.<ms>`), and reads exactly the planned
bytes.  So a re-run of a task yields identical rows while the server appends.
A file the server has since deleted (packed or rewritten away) fails the task
with a message that says so; re-running the query plans afresh.

Nothing here writes to the spool: where the server's replay would finish a
pack (delete the archives it covers, rename it), planning computes the same
file list without touching anything (`replay_order`).

Records are decoded by the engine's own codec (`journal.Cursor`/`decode`).
Items mode is the server's replay (`Journal.replay` + `PersistentQueue.replay`)
restated as a pure function over the engine's reader, `replay_locations`:
ADD/ADDX/ADD_XID append, REMOVE takes the head, REMOVE_TENTATIVE(_XID)
reserves the head under its xid (the legacy opcode under xid 0, as the server
does), UNREMOVE puts a reservation back at the head, CONFIRM_REMOVE drops it,
CONTINUE confirms and appends; a broken record ends its file (the server
truncates the current file there, and skips the rest of an archive); open
reads left at the end roll back to the head, lowest xid first.  It keeps only
record locations in memory (8 bytes per live item, not the items), then reads
the survivors back in queue order.  tests/spark checks it against the server's
replay on the same files.
"""
from __future__ import annotations

import json
import logging
import os
from collections import deque
from dataclasses import dataclass, field

from ._engine import J, JF

log = logging.getLogger(__name__)

OP_NAMES = {0: "ADD", 1: "REMOVE", 2: "ADDX", 3: "REMOVE_TENTATIVE", 4: "SAVE_XID", 5: "UNREMOVE",
            6: "CONFIRM_REMOVE", 7: "ADD_XID", 8: "CONTINUE", 9: "REMOVE_TENTATIVE_XID"}
XID_OPS = frozenset((4, 5, 6, 7, 8, 9))

_OFF_BITS = 48
_OFF_MASK = (1 << _OFF_BITS) - 1


class JournalChanged(RuntimeError):
    """A planned journal file is gone: the server packed or rewrote it after planning."""


@dataclass(frozen=True, slots=True)
class FileRef:
    name: str          # file name at planning time
    size: int          # bytes to read
    ino: int


@dataclass(slots=True)
class QueueFiles:
    """One queue's journal files in replay order (one items-mode partition)."""
    spool: str
    queue: str
    files: list[FileRef] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)


# ------------------------------------------------------------------ options

def option_paths(options) -> list[str]:
    """`load(p)` gives options['path']; `load([a, b])` gives options['paths'] as JSON."""
    paths = []
    raw = options.get("paths")
    if raw:
        try:
            val = json.loads(raw)
        except ValueError:
            val = [p for p in raw.split(",") if p]
        paths.extend([val] if isinstance(val, str) else list(val))
    if options.get("path"):
        paths.append(options["path"])
    if not paths:
        raise ValueError("no path given: use load(QUEUE_PATH), load(FILE) or load([PATH, ...])")
    return paths


def option_queues(options) -> set[str] | None:
    raw = options.get("queues")
    if not raw:
        return None
    return {q.strip() for q in raw.split(",") if q.strip()}


# ------------------------------------------------------------------ planning

def _classify(fname: str) -> tuple[str, int | None, bool] | None:
    """(queue, archive ts or None for the current file, is_pack), or None for a
    file that is not a journal (temp `~~` files, strays)."""
    if "~~" in fname or fname.startswith("."):
        return None
    name = fname.split(".", 1)[0]
    if not name:
        return None
    if name == fname:
        return name, None, False
    try:
        p = JF.parse_archive(name, fname)
    except JF.StrayFile:
        return None
    return name, p[0], p[1]


def replay_order(entries: list[tuple[int, bool, str]]) -> list[str]:
    """Archive names in replay order, as `journal.archived_files` would leave
    them, computed without renaming or deleting anything: each `.pack`
    (oldest first) replaces every archive with a timestamp <= its own."""
    entries = list(entries)
    while True:
        packs = sorted(e for e in entries if e[1])
        if not packs:
            return [e[2] for e in sorted(entries)]
        ts, _, pack = packs[0]
        entries = [e for e in entries if e[1] and e is not packs[0] or (not e[1] and e[0] > ts)]
        entries.append((ts, False, pack))


def _ref(spool: str, fname: str) -> FileRef:
    st = os.stat(os.path.join(spool, fname))
    return FileRef(fname, st.st_size, st.st_ino)


def plan(paths: list[str], queues: set[str] | None = None) -> list[QueueFiles]:
    """Every queue's files under the given queue directories and/or files.
    Files named one by one are grouped per (directory, queue) and put in
    replay order.  The same queue reached twice is read once."""
    groups: dict[tuple[str, str], dict] = {}

    def add(spool: str, fname: str) -> None:
        c = _classify(fname)
        if c is None:
            log.warning("lanner-journal: skipping %s: not a journal file name", os.path.join(spool, fname))
            return
        name, ts, is_pack = c
        if queues is not None and name not in queues:
            return
        g = groups.setdefault((spool, name), {"archives": {}, "current": False})
        if ts is None:
            g["current"] = True
        else:
            g["archives"][fname] = (ts, is_pack, fname)

    for p in paths:
        p = os.path.abspath(os.path.expanduser(p))
        if os.path.isdir(p):
            with os.scandir(p) as it:
                for entry in it:
                    if entry.is_file():
                        c = _classify(entry.name)
                        if c is not None:
                            add(p, entry.name)
        elif os.path.isfile(p):
            add(os.path.dirname(p), os.path.basename(p))
        else:
            raise FileNotFoundError(f"lanner-journal: no such file or directory: {p}")

    out = []
    for (spool, name), g in sorted(groups.items()):
        names = replay_order(list(g["archives"].values()))
        if g["current"]:
            names.append(name)
        qf = QueueFiles(spool, name)
        for fname in names:
            try:
                qf.files.append(_ref(spool, fname))
            except FileNotFoundError:          # packed away while we listed: the pack covers it
                continue
        out.append(qf)
    return out


# ------------------------------------------------------------------ reading

def open_cursor(spool: str, queue: str, ref: FileRef, items: bool = True) -> "J.Cursor":
    """A Cursor on the planned file, found by inode if the server renamed it."""
    path = os.path.join(spool, ref.name)
    try:
        cur = J.Cursor(path, ref.name, items=items)
        if os.fstat(cur.fd).st_ino == ref.ino:
            return cur
        cur.close()
    except FileNotFoundError:
        pass
    try:
        listing = os.listdir(spool)
    except OSError:
        listing = []
    for fname in listing:
        if fname != queue and not fname.startswith(queue + "."):
            continue
        p = os.path.join(spool, fname)
        try:
            if os.stat(p).st_ino != ref.ino:
                continue
            cur = J.Cursor(p, fname, items=items)
        except OSError:
            continue
        if os.fstat(cur.fd).st_ino == ref.ino:
            return cur
        cur.close()
    raise JournalChanged(f"{path}: this journal file was packed or rewritten by the server after the "
                         f"query was planned (its data now lives in other files); run the query again")


def iter_file(cur: "J.Cursor", size: int, now_ms: int):
    """(offset, opcode, item or None, xid) for each record in the first `size`
    bytes; stops quietly at a torn or broken record, as replay does."""
    read = cur.read
    while True:
        off = cur.pos
        try:
            r = read(now_ms, size)
        except J.JournalCorrupt as e:
            if off < size:
                log.warning("lanner-journal: %s: stopping at offset %d: %s", cur.path, e.offset, e.reason)
            return
        if r is None:
            return
        yield off, r[0], r[1], r[2]


def replay_locations(cursors: list["J.Cursor"], sizes: list[int], now_ms: int) -> list[int]:
    """The server's replay over the files (module docstring), as the locations
    (file index << 48 | offset) of the live items in queue order after the
    open reads are rolled back.  Cursors must have been opened with items=False."""
    head: deque[int] = deque()          # items UNREMOVE put back at the head
    fifo: deque[int] = deque()
    opened: dict[int, int] = {}

    for fi, cur in enumerate(cursors):
        base = fi << _OFF_BITS
        for off, op, _item, xid in iter_file(cur, sizes[fi], now_ms):
            if op == 2 or op == 0 or op == 7:
                fifo.append(base | off)
            elif op == 1:
                if head:
                    head.popleft()
                elif fifo:
                    fifo.popleft()
            elif op == 9 or op == 3:
                loc = head.popleft() if head else (fifo.popleft() if fifo else None)
                if loc is not None:
                    opened[xid] = loc
            elif op == 5:
                loc = opened.pop(xid, None)
                if loc is not None:
                    head.appendleft(loc)
            elif op == 6:
                opened.pop(xid, None)
            elif op == 8:
                opened.pop(xid, None)
                fifo.append(base | off)
            # 4 SAVE_XID: only the xid counter
    out = [opened[x] for x in sorted(opened)]
    out.extend(head)
    out.extend(fifo)
    return out


class ItemReader:
    """Reads the item recorded at a location, through one cached chunk."""

    def __init__(self, fds: list[int], paths: list[str], now_ms: int) -> None:
        self._fds = fds
        self._paths = paths
        self._now = now_ms
        self._fi = -1
        self._buf = b""
        self._base = 0

    def get(self, loc: int):
        fi = loc >> _OFF_BITS
        off = loc & _OFF_MASK
        buf = self._buf
        if fi == self._fi and self._base <= off < self._base + len(buf):
            r = J.decode(buf, off - self._base, len(buf), self._now)
            if r is not None:
                return r[1]
        want = J.CHUNK
        while True:
            buf = os.pread(self._fds[fi], want, off)
            r = J.decode(buf, 0, len(buf), self._now) if buf else None
            if r is not None:
                self._fi, self._buf, self._base = fi, buf, off
                return r[1]
            if len(buf) < want:
                raise JournalChanged(f"{self._paths[fi]}: record at offset {off} changed while it was read")
            want *= 2


def replay_items(qf: QueueFiles, now_ms: int):
    """The live items of one queue, head first (QItems; expired ones included)."""
    cursors = []
    try:
        for ref in qf.files:
            cursors.append(open_cursor(qf.spool, qf.queue, ref, items=False))
        locs = replay_locations(cursors, [f.size for f in qf.files], now_ms)
        reader = ItemReader([c.fd for c in cursors], [c.path for c in cursors], now_ms)
        get = reader.get
        for loc in locs:
            yield get(loc)
    finally:
        for c in cursors:
            c.close()
