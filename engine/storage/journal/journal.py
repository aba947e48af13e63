"""The `Journal` storage (seam.py): one queue's Kestrel journal files, written, read
behind, rotated, rewritten and packed (reference §6).  The record format is codec.py's,
the file names files.py's, replay replay.py's.

Invariants:

1. The records on disk are always a prefix of the records the queue issued, in
   order.  A failed write is truncated away and its records stay buffered until
   the owner either retries the flush or rolls back (`rollback`: the records are
   dropped and the queue undoes their changes, queues/undo.py); nothing is ever
   dropped from the middle, because a lost ADD would make every later REMOVE
   consume the wrong item.  Marks (positions for the undo log) count every byte
   this object ever appended, across rotations and rewrites: `_base` is the mark
   of byte 0 of the current file.
2. A rewrite first archives the current file, so the pack it produces covers every
   file of the queue (Kestrel left a window where a crash replayed the old current
   file on top of its rewrite).  An archive is fsynced before it is renamed, so
   nothing written but unsynced is ever in an archive (rollback never reaches one).

Checkpoint packs (§6.5) differ from Kestrel's in one deliberate way: the pack is
computed from the archived files alone (`packer.pack_files`), not from the
queue's memory, so no placeholder items are needed: the files up to the
checkpoint replay to exactly the state at the checkpoint, and the later files
replay on top of their summary.  The server's cleaner process runs the pack;
stand-alone journals run it inline.
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Callable

from lanner.queues.item import QItem
from lanner.storage.journal.codec import pack_addx, pack_xaddx, pack_xid, Cursor
from lanner.storage.journal.files import (JournalError, archived_files, check_name, erase_files, fsync_dir,
                                          journal_files, parse_archive)
from lanner.storage.journal.compaction import JournalCompaction
from lanner.storage.journal.readbehind import JournalReadBehind
from lanner.storage.journal.replay import replay_files
from lanner.storage.journal.writebehind import WRITE_BEHIND_MAX, JournalWriteBehind
from lanner.storage.seam import ReplayState
from lanner.storage.writer import write_all

log = logging.getLogger(__name__)

try:                            # COMPILED: as in memcache_commands.py (journal.pxd)
    import cython
    COMPILED = cython.compiled
except ImportError:             # pure Python without Cython installed
    COMPILED = False

# Disk I/O of the writer goes through these so tests can inject ENOSPC, short
# writes and failing fsyncs (beanstalkd's `falloc` idea).  Looked up at call time.
_write = os.write
_fsync = os.fsync

AUTOFLUSH = 4 << 20             # pending bytes that force a flush
BIG_RECORD = 1 << 20            # item bytes written from the item itself, not copied (_add_behind)


_WFLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT
#: The fields journal.pxd gives a C type: getsets for interpreted code, not member descriptors.
C_TYPED = ("_pending", "_origin", "check_at")


class JournalBase:
    """Empty, first: a C type in the compiled build (journal.pxd), whose first base must be
    one; the mixins after it stay Python classes."""
    __slots__ = ()


class Journal(JournalBase, JournalCompaction, JournalReadBehind, JournalWriteBehind):
    """The storage seam (seam.py) over Kestrel journal files; it is its own `medium`.
    Rotation, rewrite and checkpoint packs are a base class's (compaction.py), read-behind
    another's (readbehind.py), write-behind a third's (writebehind.py).

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

    Write-behind (storage/writer.py): with a `writer`, `write_behind()` hands the
    buffer to the writer's thread and returns at once; new records go to a fresh
    buffer behind it.  Marks count those bytes (`_inflight_n`) but `written_mark`
    does not until the owner settles the job (`settle_write`, which waits for it if
    needed).  Everything that needs the file as the OS has it (flush, rollback,
    rotation, rewrite, read-behind, close) settles first, so the module invariants
    hold as if the write had been made inline; a failed one leaves its records at
    the front of the buffer, and `settle_write` raises as `flush` would.
    """

    can_read_behind = True
    # Slots, not a dict: its lookups per record stay specialised whatever names other objects
    # of the process set (tests/engine/test_hot_layout.py).
    __slots__ = ("_dir", "_path", "name", "_clock", "sync_policy", "inline_pack", "_owner", "_listing",
                 # the file and its buffer (module invariants)
                 "_fd", "_gen", "_opened", "_pending", "_base", "_disk_size", "_synced_size", "writer",
                 "_inflight_n", "_origin", "_chain", "_torn", "_closed", "_erased",
                 "_cursor", "in_read_behind", "_read_mark",                 # readbehind.py
                 # rotation, rewrite, checkpoint packs (compaction.py, _init_compaction)
                 "check_due", "check_at", "rewrites", "rotations", "_archived_size", "_last_ts",
                 "_rewrites_allowed_at", "checkpoint", "_pack_outstanding", "_rewrite_job",
                 "sync_gate", "on_checkpoint")

    def __init__(self, queue_path: str, name: str, clock, sync_policy: str | int = "never",
                 *, inline_pack: bool = True, listing: list[str] | None = None) -> None:
        """`listing`: the files of `name` in the directory as its factory knows them
        (files.files_by_queue), for `replay` instead of listing the whole directory."""
        check_name(name)
        self._dir = queue_path
        self._path = os.path.join(queue_path, name)
        assert os.path.dirname(os.path.normpath(self._path)) == os.path.normpath(queue_path), name
        self.name = name
        self._clock = clock
        self.sync_policy = sync_policy
        self.inline_pack = inline_pack
        self._owner = threading.get_ident()
        self._fd = -1
        self._gen = 0                    # bumped whenever _fd changes or the file is cut back
        self._opened = 0                 # bumped whenever _fd changes
        self._pending = bytearray()
        self._base = 0                   # mark of byte 0 of the current file (module invariant 1)
        self._disk_size = 0              # bytes of the current file the OS has
        self._synced_size = 0
        self.writer = None               # a storage.writer.Writer: big flushes go to its thread
        self._inflight_n = 0             # bytes of the jobs under way: after _disk_size, before _pending
        # _base + _disk_size + _inflight_n, the mark of the buffer's first byte: a record's mark
        # is one add, not three of ints that a long-lived journal's marks make big (`_moved`
        # after a change of any of them; `flush` adds what it wrote)
        self._origin = 0
        self._chain: list = []           # the WriteJobs under way, oldest first (big items: _add_behind)
        self._rb: Cursor | None = None
        self._read_mark = 0              # end of the current file's records read-behind returned
        self._listing = listing
        self._torn = False               # a failed write may have left bytes past _disk_size
        self._closed = self._erased = False
        # The rotation check (compaction.py, `_check_rotate`) has something to do only once the
        # records reach `check_at` (a mark): every record_* sets `check_due` when its end does,
        # and the queue calls before_add / after_remove only while it is set (seam.py, point 3;
        # a number of bytes: only while the queue's are below it, `_gate`).
        self.check_due = True
        self.check_at = 0
        self._init_compaction()

    # -------------------------------------------------------- stats, state
    @property
    def logsize(self) -> int:
        return self._disk_size + self._inflight_n + len(self._pending)

    @property
    def pending_bytes(self) -> int:
        """Buffered bytes no write has taken yet."""
        return len(self._pending)

    @property
    def flushed_size(self) -> int:
        return self._disk_size

    def _set_rb(self, cursor: Cursor | None) -> None:     # every add and remove asks
        self._cursor, self.in_read_behind = cursor, cursor is not None    # a plain attribute
    _rb = property(lambda self: self._cursor, _set_rb)     # the read-behind cursor

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
        if self._chain:
            try:
                self.settle_write()
            except JournalError:
                pass                 # its records went back into the buffer, dropped below
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
        self._moved()
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
        if self._read_mark > mark:
            self._read_mark = mark

    def undo_record(self, kind: int, item: QItem, xid: int) -> None:
        """Nothing: a journal keeps no state per record besides the bytes."""

    @property
    def dirty(self) -> bool:
        """Buffered records, or (unless the policy is "never") unsynced ones."""
        return bool(self._pending) or self._chain or \
            (self.sync_policy != "never" and self._synced_size < self._disk_size)

    def files(self) -> list[str]:
        return journal_files(self._dir, self.name)

    # -------------------------------------------------------- replay
    def replay(self, config, progress: Callable[[int, int], None] | None = None) -> ReplayState:
        """Rebuild the queue from its files (§6.3, replay.py), entering read-behind as
        Kestrel does (§5.8), then open the writer on `<queue>`; `progress(done, total)` in
        bytes replayed."""
        os.makedirs(self._dir, exist_ok=True)
        listing, self._listing = self._listing, None     # from now on its own files change it
        tmp_prefix = self.name + "~~"
        for fname in os.listdir(self._dir) if listing is None else listing:
            if fname.startswith(tmp_prefix):
                os.unlink(os.path.join(self._dir, fname))
        archives = archived_files(self._dir, self.name, listing=listing)
        if archives:
            self._last_ts = max(parse_archive(self.name, a)[0] for a in archives)
        new = not archives and not os.path.exists(self._path)
        if not os.path.exists(self._path):
            os.close(os.open(self._path, _WFLAGS, 0o644))
            if self.sync_policy == "always":
                fsync_dir(self._dir)         # (see _open_writer)
        files = archives + [self.name]
        sizes = [os.path.getsize(os.path.join(self._dir, f)) for f in files]
        st, self._rb = replay_files(self._dir, self.name, files, sizes, self._clock.now_ms(),
                                    config.max_memory_size, progress)
        self._open_writer(fresh=False)
        self._archived_size = sum(sizes[:-1])
        if new:
            log.info("queue %r: new queue, journal %s created", self.name, self._path)
        else:
            log.info("queue %r: replayed %d files, %d bytes: %d items (%d in memory), %d open, xid=%d",
                     self.name, len(files), sum(sizes), st.total_items, len(st.items),
                     len(st.open_transactions), st.xid_counter)
        return st

    # -------------------------------------------------------- writer
    def _sys_write(self, fd: int, data) -> int:
        return _write(fd, data)

    def _sys_fsync(self, fd: int) -> None:
        _fsync(fd)

    def _open_writer(self, fresh: bool = True) -> None:
        """Open `<queue>` for appending; marks continue from where the old file ended.  A `fresh`
        file (made or renamed in by rotation or rewrite) has its directory entry fsynced first
        under sync "always": the replies to its records promise they survive a power cut, and an
        fdatasync of the file (syncer.py) does not cover its name."""
        end = self._base + self._disk_size
        self._fd = os.open(self._path, _WFLAGS, 0o644)
        if fresh and self.sync_policy == "always":
            try:
                fsync_dir(self._dir)
            except OSError:
                os.close(self._fd)
                self._fd = -1
                raise
        self._gen += 1
        self._opened += 1
        self._disk_size = self._synced_size = os.fstat(self._fd).st_size
        self._base = end - self._disk_size
        self._moved()
        self._torn = False
        self.check_due = True            # `check_at` counted from the old file's start

    # Each record_* returns the mark where its record starts (seam.py).
    def record_add(self, item: QItem) -> int:
        p = self._pending
        data = item.data
        n = len(data)
        mark = self._origin + len(p)
        if mark + n + 21 >= self.check_at:       # 21: the ADDX head
            self.check_due = True
        add_time, expiry = item.add_time, item.expiry
        if COMPILED and n < BIG_RECORD and type(data) is bytes and type(add_time) is int and \
                type(expiry) is int:
            _c_put_addx(p, data, add_time, expiry)      # (in place, journal.pxd)
        else:
            head = pack_addx(2, n + 16, add_time, expiry)
            if n >= BIG_RECORD and self._add_behind(item, head):
                return mark
            p += head
            p += data
        if len(p) > AUTOFLUSH:
            self._autoflush()
        return mark

    def _moved(self) -> None:
        """`_base`, `_disk_size` or `_inflight_n` changed (but for `flush`'s write): the
        buffer's first byte has a new mark.  (settle_write moves bytes from one to the other.)"""
        self._origin = self._base + self._disk_size + self._inflight_n

    def record_remove(self, item: QItem) -> int:
        p = self._pending
        mark = self._origin + len(p)
        if mark >= self.check_at - 1:
            self.check_due = True
        if COMPILED:
            _c_grow(p, 1)[0] = 1                # (REMOVE: one byte; journal.pxd)
        else:
            p.append(1)
        return mark

    def record_open(self, item: QItem, xid: int) -> int:
        p = self._pending
        mark = self._origin + len(p)
        if mark + 5 >= self.check_at:
            self.check_due = True
        p += pack_xid(9, xid)
        return mark

    def record_unremove(self, item: QItem, xid: int) -> int:
        p = self._pending
        mark = self._origin + len(p)
        if mark + 5 >= self.check_at:
            self.check_due = True
        p += pack_xid(5, xid)
        return mark

    def record_confirm(self, item: QItem, xid: int) -> int:
        p = self._pending
        mark = self._origin + len(p)
        if mark + 5 >= self.check_at:
            self.check_due = True
        p += pack_xid(6, xid)
        return mark

    def record_continue(self, xid: int, item: QItem) -> int:
        """CONTINUE: confirm `xid` and append `item` (Kestrel's library `continue`)."""
        p = self._pending
        mark = self._origin + len(p)
        if mark + len(item.data) + 25 >= self.check_at:     # 25: the CONTINUE head
            self.check_due = True
        head = pack_xaddx(8, xid, len(item.data) + 16, item.add_time, item.expiry)
        if len(item.data) >= BIG_RECORD and self._add_behind(item, head):
            return mark               # (as for an ADDX: the item's own bytes, not a copy)
        p += head
        p += item.data
        if len(p) > AUTOFLUSH:
            self._autoflush()
        return mark

    def _autoflush(self) -> None:
        """A big buffer: behind the writer's thread when there is one (inline only when a
        write is already under way and the buffer behind it grew past WRITE_BEHIND_MAX)."""
        if self.writer is not None and (not self._chain or len(self._pending) < WRITE_BEHIND_MAX):
            self.write_behind()
        else:
            self._flush_quietly()

    def _flush_quietly(self) -> bool:
        """A flush the journal starts on its own: on failure the records stay buffered for
        the owner's flush, which fails too and rolls back."""
        try:
            self.flush()
        except JournalError:
            return False
        return True

    def flush(self, writer=None, behind: int | None = None) -> bool:
        """One write of everything pending; True if it went behind instead.  On failure the file
        is cut back to its last good size and the records stay pending (module invariant 1).

        At a batch's end (server/commit.py `write_out`, with `behind`) the buffer goes to
        `writer`'s thread if a write is under way (the records chain behind it) or it holds
        `behind` bytes or more (not under sync "always", whose replies wait for an fsync
        anyway).  One method, not a batch-end method calling this one: a frame is ~700
        instructions, paid per request at one connection (issue 8, c=1)."""
        if behind is not None:
            chain = self._chain
            if chain and not chain[-1].done.is_set():
                self.write_behind()
                return True
            if self.writer is None:
                self.writer = writer
            if len(self._pending) >= behind and self.sync_policy != "always":
                self.settle_write()
                if self.write_behind():
                    return True
        if self._chain:
            self.settle_write()
        p = self._pending
        if not p:
            return False
        if self._torn:
            self._untear()
        total = len(p)
        try:
            done = _write(self._fd, p)
            if done != total:
                write_all(self._fd, p, done, _write)
        except OSError as e:
            # a view of the buffer may live on in the traceback: keep a copy instead
            self._pending = bytearray(p)
            raise self._write_failed(total, e) from e
        self._disk_size += total
        self._origin += total
        del p[:]                # (frees the buffer, as clear() would: the next turn regrows it)
        return False

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
        target = self.sync_target()
        if target is None:
            return
        try:
            _fsync(target[0])
        except OSError as e:
            error = self.sync_done(target[1], e)
            if error is not None:
                raise error from e
            return
        self.sync_done(target[1], None)

    def sync_target(self) -> tuple[int, tuple[int, int, int], bool] | None:
        """What an fsync now makes durable (storage/syncer.py): (fd, token for `sync_done`, True:
        fdatasync is enough), or None if every written byte is durable.  The file only grows
        (or is cut back by `rollback`), so fdatasync, which commits the size with the data,
        covers it; the directory entry of a new file is fsynced when it is created."""
        fd, target = self._fd, self._disk_size
        if self._synced_size >= target or fd < 0:
            return None
        return fd, (self._gen, self._opened, target), True

    def sync_done(self, token: tuple[int, int, int], error: OSError | None) -> OSError | None:
        """The fsync of `sync_target`'s `token` returned (`error`): count its bytes durable, or
        return the error to report (None if the file was switched meanwhile: rotation fsynced
        the old one before it let it go).  A rollback in between cuts the file back but keeps
        it: the error still counts, or replies whose bytes the failed fsync lost would leave as
        durable."""
        gen, opened, target = token
        if error is not None:
            if opened != self._opened:
                return None
            return JournalError(self._path, f"fsync failed: {error.strerror}", error.errno)
        if gen == self._gen and target > self._synced_size:
            self._synced_size = target
        return None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._rewrite_job is not None:
                self._adopt_rewrite(block=True)      # its thread closes the archived fd, writes the pack
            if self._chain:
                self.settle_write()
            if self._fd >= 0:
                self.flush()
                self._fsync_current()     # never beside a group-commit fsync of it (syncer.py)
                self._synced_size = self._disk_size
        except OSError as e:
            log.error("queue %r: closing journal %s: %s", self.name, self._path, e)
            raise
        finally:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
                self._gen += 1
                self._opened += 1
            if self._rb is not None:
                self._rb.close()
                self._rb = None

    def erase(self) -> None:
        """Close and delete every file of the queue."""
        if self._chain:
            try:
                self.settle_write()
            except JournalError:
                pass
        self._pending.clear()
        try:
            self.close()
        except OSError:
            pass
        self._erased = True
        Journal.erase_all(self._dir, self.name)

    @staticmethod
    def erase_all(queue_path: str, name: str, listing: list[str] | None = None) -> None:
        """Delete every journal file of `name` (`keep_journal = false`, delete)."""
        erase_files(queue_path, name, listing)


if COMPILED:
    # interpreted readers (the mixins, the syncer, tests) read the object fields as member
    # descriptors, LOAD_ATTR_SLOT, not Cython's getsets (memcache_commands.pxd); the buffer and
    # `_origin`, typed in journal.pxd for record_*, stay getsets: no interpreted code reads them
    # per request
    _c_slot_fields(Journal, tuple(n for n in Journal.__slots__ if n not in C_TYPED))
