"""Compaction of a journal's files (reference §6.4, §6.5): rotation, rewrite and
checkpoint packs, the part of `Journal` that manages files rather than records.

`JournalCompaction` is a base class of `Journal` (journal.py) and nothing else: it holds
the file-management half of one object, split out to keep each module readable.  What
it uses of the writer is declared below (`_dir`, `_path`, `_fd`, ... and `flush`,
`_open_writer`, `_leave_read_behind`); what it owns is set up by `_init_compaction`.

* Rotation: once the current file outgrows max_memory_size (with the queue in
  read-behind) it is renamed to `<queue>.<ms>` (fsynced first unless the policy is
  "never", so an archive never holds records a rollback could take back) and a new
  current file starts.  Past max_journal_size a checkpoint is set.
* Rewrite: a queue that is empty (or small again) has its state dumped to a `~~`
  file, the current file archived, the dump pack-renamed over every archive and made
  the current file (crash-safe at every step: files.py's invariants).
* Checkpoint packs: every file up to the checkpoint is packed by `packer.pack_files`
  (in the cleaner process, or inline stand-alone) once the reader has left them.

Maintenance that fails is logged and skipped: it never fails the client's operation.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from functools import partial
from typing import Callable

from lanner.config_values import LONG_MAX
from lanner.storage.journal.codec import pack_addx, pack_xid, Cursor, encode_add
from lanner.storage.journal.files import archived_files, fsync_dir, parse_archive, unlink_quietly, write_all
from lanner.storage.journal.packer import pack_files
from lanner.storage.seam import EVERY_TIME, WHEN_EMPTY
from lanner.storage.writer import CallJob

#: Buffered bytes a journal with a writer thread sends behind before rotating or rewriting
#: (which write the buffer first, on the loop).
ROTATE_PENDING_MAX = 1 << 20

log = logging.getLogger(__name__)


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


class JournalCompaction:
    # What compaction uses of the writer (journal.Journal sets these up):
    name: str
    sync_policy: str | int
    inline_pack: bool
    _dir: str
    _path: str
    _clock: object
    _fd: int
    _pending: bytearray
    _disk_size: int
    _inflight_n: int
    write_done: bool
    write_behind: Callable[[], bool]
    writer: object
    _synced_size: int
    _rb: Cursor | None
    _closed: bool
    _erased: bool
    flush: Callable[[], None]
    _open_writer: Callable[[], None]
    _leave_read_behind: Callable[[], None]
    _sys_write: Callable[[int, object], int]     # os.write / os.fsync, through the writer's
    _sys_fsync: Callable[[int], None]            # test hooks
    sync_gate: object           # the Syncer of its group-commit fsyncs, once it has one (syncer.py)
    checkpoint: Checkpoint | None
    _pack_outstanding: PackRequest | None
    _rewrite_job: tuple[CallJob, int] | None        # (job, ts of the archive it packs)
    on_checkpoint: Callable[[object], None] | None  # called with the journal when it has file
                                                    # work for its owner's timer: a rotation set a
                                                    # checkpoint, or a rewrite went to the writer
                                                    # thread (factory.py `tick`)
    __slots__ = ()              # Journal's

    def _fsync_current(self) -> None:
        """fsync the current file on the loop (rotation, rewrite), never while the syncer has an
        fsync of it under way: one fsync of a file at a time (syncer.py, `exclusive`)."""
        gate = self.sync_gate
        if gate is None:
            self._sys_fsync(self._fd)
        else:
            gate.exclusive(self, partial(self._sys_fsync, self._fd))

    def _init_compaction(self) -> None:
        self.rewrites = 0
        self.rotations = 0
        self._archived_size = 0
        self._last_ts = 0                            # newest archive timestamp (files.py)
        self._rewrites_allowed_at = float("-inf")   # clock.monotonic()
        self.sync_gate = self.checkpoint = self._pack_outstanding = self._rewrite_job = None
        self.on_checkpoint = None

    @property
    def archived_size(self) -> int:
        return self._archived_size

    # -------------------------------------------------------- rotation, rewrite (§6.4)
    def _check_rotate(self, view, config, now_ms: int = 0) -> None:
        if self._rewrite_job is not None:
            self._adopt_rewrite()
        elif self.check_due is EVERY_TIME and view.length and \
                self._clock.monotonic() < self._rewrites_allowed_at:
            return            # inside min_journal_compact_delay no rule can match yet (`_gate`)
        size = self._disk_size + self._inflight_n + len(self._pending)
        total = size + self._archived_size
        if size <= config.max_memory_size and total <= config.max_journal_size and \
                (size < config.default_journal_size or view.length):
            self._gate(view, config, size, total)      # no rule can match
            return
        if not self.write_done:
            return            # not while a write-behind is under way: again at a later operation
        if self.writer is not None and len(self._pending) >= ROTATE_PENDING_MAX:
            self.write_behind()     # rather than a big write on the loop: rotate once it is written
            return
        allowed = self._clock.monotonic() >= self._rewrites_allowed_at
        aggressive = not config.disable_aggressive_rewrites
        if (aggressive or allowed) and size >= config.default_journal_size and view.length == 0 and \
                self._rewrite_safe(view):
            log.info("queue %r: rewriting journal (qsize=0)", self.name)
            self._rewrite(view)
            if not aggressive and self.logsize >= config.default_journal_size // 2:
                self._disallow_rewrites(config)
        elif self._compact(view, config, total, allowed):
            pass
        elif size > config.max_memory_size:
            if not aggressive and view.length == 0 and self._rewrite_safe(view):
                log.info("queue %r: rewriting journal (qsize=0)", self.name)
                self._rewrite(view)
            if self.logsize > config.max_memory_size:
                self._rotate(view, self.logsize + self._archived_size > config.max_journal_size)
        else:
            self._gate(view, config, size, total)

    def _gate(self, view, config, size: int, total: int) -> None:
        """No rule matched: set `check_at` and `check_due` (seam.py, point 3) so that the queue
        calls the check again exactly when one can, and not per operation before (issue 8: a
        backlog read behind past max_journal_size paid the whole check, ~6k instructions, on
        every add and remove).  A rule can match only once the records reach a size limit
        (`check_at`: the current file past max_memory_size, or at default_journal_size, the files
        together past max_journal_size), the queue empties (the empty queue's rewrite, past
        default_journal_size), its bytes fall below max_memory_size (the compacting rewrite, files
        past max_journal_size), a pack under way ends (`pack_done`: both rewrites wait for it), or
        min_journal_compact_delay passes (the hooks look at the clock first: `EVERY_TIME`).  A
        rewrite under way keeps the check per operation (its adoption)."""
        if self._rewrite_job is not None:
            return
        limit = config.max_memory_size + 1
        if size < config.default_journal_size:
            limit = min(limit, config.default_journal_size)
        if total <= config.max_journal_size:
            limit = min(limit, config.max_journal_size - self._archived_size + 1)
        self.check_at = min(self._base + limit, LONG_MAX)     # (a C integer compiled: journal.pxd)
        below = WHEN_EMPTY if size >= config.default_journal_size else 0
        if total > config.max_journal_size and config.max_memory_size > below:
            below = config.max_memory_size
        if view.size_bytes >= below:
            self.check_due = below or False
        elif self._pack_outstanding is not None:
            self.check_due = False
        elif self._clock.monotonic() < self._rewrites_allowed_at:
            self.check_due = EVERY_TIME
        else:
            self.check_due = True

    # the seam's hooks (seam.py) around every add and remove: both are the rotation check
    # itself, one call per operation
    before_add = after_remove = _check_rotate

    def _compact(self, view, config, total: int, allowed: bool) -> bool:
        """Kestrel's rule 2 (the same in both modes): the files together pass max_journal_size
        while the live state fits in memory, so a rewrite shrinks them; then rate-limited."""
        if not (allowed and total > config.max_journal_size and view.size_bytes < config.max_memory_size
                and self._rewrite_safe(view)):
            return False
        log.info("queue %r: rewriting journal (qsize=%d)", self.name, view.size_bytes)
        self._rewrite(view)
        self._disallow_rewrites(config)
        return True

    def _disallow_rewrites(self, config) -> None:
        delay = config.min_journal_compact_delay
        if delay:
            self._rewrites_allowed_at = self._clock.monotonic() + delay / 1000.0

    def _rewrite_safe(self, view) -> bool:
        """A rewrite writes the queue's memory, so every queued item must be in it
        (Kestrel only compacted when bytes < max_memory_size); and no checkpoint
        pack may be in flight, or its result would resurrect packed files."""
        if self._pack_outstanding is not None or self._rewrite_job is not None:
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

    def _rename_current(self, fname: str) -> None:
        """Rename the current file to archive name `fname`, reserved by `_unique_name`: the
        placeholder goes first, because a rename over an existing file makes ext4
        (auto_da_alloc) write out the renamed file's dirty pages before it returns, 60-90 ms
        per 200 MB on the loop (issue 8); to a free name it is a plain rename.  Nothing else
        makes archive names of this queue in between."""
        path = os.path.join(self._dir, fname)
        os.unlink(path)
        os.rename(self._path, path)

    def _discard(self, path: str) -> None:
        """Delete a packed archive.  With a writer thread (storage/writer.py) the unlink is its:
        unlinking hundreds of MB takes the filesystem tens of ms.  The file is first renamed to a
        `~~` temporary, which is no archive any more and which replay deletes if a crash comes
        first (files.py)."""
        if self.writer is None:
            os.unlink(path)
            return
        # `<name>~~<ts>.old`: as long as `<name>.<ts>.pack`, which the name limit allows for
        trash = os.path.join(self._dir, f"{self.name}~~{os.path.basename(path)[len(self.name) + 1:]}.old")
        os.rename(path, trash)
        self.writer.call(unlink_quietly, trash)

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
                self._fsync_current()
                self._synced_size = self._disk_size
            rotated = self._unique_name(".")
        except OSError as e:
            log.error("queue %r: rotation skipped: %s", self.name, e)
            return
        try:
            self._rename_current(rotated)
        except OSError as e:
            log.error("queue %r: rotation skipped: cannot rename %s: %s", self.name, self._path, e)
            unlink_quietly(os.path.join(self._dir, rotated))
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
            if self.on_checkpoint is not None:
                self.on_checkpoint(self)
            if self._rb is None:
                self._maybe_inline_pack()

    def _rewrite(self, view) -> bool:
        """§6.4 rewrite, made crash-safe (module invariant 3), in two halves.  On the loop: the
        queue's state is dumped to memory, the current file archived as `<queue>.<ts>` and a new
        current file opened, so later records land behind the dump.  Then `_rewrite_files` (on
        the writer's thread when there is one: its fsyncs take 0.1-0.6 s under a flood, issue 8)
        writes the dump to a `~~` file, fsyncs it, renames it to `<queue>.<ts>.pack` (which covers
        every archive up to the one just made) and fsyncs the directory.  Only then does the
        owner adopt it (`_adopt_rewrite`: delete the covered archives, the pack becomes an
        archive); until then the old files stay, so a crash at any point replays either them or
        the durable pack, never less.  Under sync "always" the current file is fsynced before it
        is archived (as at rotation): replies wait only for the current file's fsync."""
        try:
            self.flush()
            if self.sync_policy == "always" and self._synced_size < self._disk_size:
                self._fsync_current()
                self._synced_size = self._disk_size
            tmp = self._unique_name("~~")
        except OSError as e:
            log.error("queue %r: rewrite skipped: %s", self.name, e)
            return False
        tmp_path = os.path.join(self._dir, tmp)
        # the state as of the file archived below: only references here, the records are
        # encoded and written by `_rewrite_files` (a 200k-item dump took 0.5-0.6 s on the loop)
        snapshot = (sorted(view.open_items().items(), reverse=True), list(view.memory_items()))
        try:
            rotated = self._unique_name(".")
        except OSError as e:
            log.error("queue %r: rewrite skipped: %s", self.name, e)
            unlink_quietly(tmp_path)
            return False
        rotated_path = os.path.join(self._dir, rotated)
        try:
            self._rename_current(rotated)
        except OSError as e:
            log.error("queue %r: rewrite skipped: cannot rename %s: %s", self.name, self._path, e)
            unlink_quietly(tmp_path)
            unlink_quietly(rotated_path)
            return False
        old = self._fd
        old_size = self._disk_size
        try:
            self._open_writer()
        except OSError as e:
            log.error("queue %r: rewrite skipped: cannot open a new %s: %s", self.name, self._path, e)
            os.rename(rotated_path, self._path)
            unlink_quietly(tmp_path)
            return False
        self._leave_read_behind()
        self._archived_size += old_size
        # the archived file's fsync waits for a periodic one of it under way (syncer.py)
        fsync_old, gate = self._sys_fsync, self.sync_gate
        if gate is not None and self.writer is not None:
            fsync_old = gate.after_idle(self, fsync_old)      # on the writer's thread
        elif gate is not None:
            gate.wait_idle(self)                              # on this one, below
        args = (old, self.sync_policy not in ("never", "always"), tmp_path, snapshot, rotated_path + ".pack",
                self._dir, self._sys_write, self._sys_fsync, fsync_old)
        if self.writer is None:
            job = CallJob(_rewrite_files, args)
            try:
                _rewrite_files(*args)
            except OSError as e:
                job.error = e
            job.done.set()
        else:
            job = self.writer.run(_rewrite_files, *args)
        self._rewrite_job = (job, parse_archive(self.name, rotated)[0])
        self._adopt_rewrite()
        if self._rewrite_job is not None and self.on_checkpoint is not None:
            # adopted at the owner's next tick, not at this queue's next operation: an idle queue
            # would keep its archive and pack (and `journal_rewrites` its old count) till then
            self.on_checkpoint(self)
        return True

    def rewrite_when_empty(self, view) -> None:
        """A graceful shutdown under ReadOnly or Quiescent rewrites each empty queue's journal
        (reference §5.11), adopted at once: the queue is left as one file of its open reads
        alone (0 bytes with none), as Kestrel left it."""
        if view.length or self._closed or self._erased or not self.write_done or \
                not self._rewrite_safe(view):
            return
        if not (self._disk_size + self._inflight_n + len(self._pending) + self._archived_size):
            return                                   # one empty file already
        log.info("queue %r: rewriting journal at shutdown (qsize=0)", self.name)
        if self._rewrite(view) and self._rewrite_job is not None:
            self._adopt_rewrite(block=True)

    @property
    def rewrite_pending(self) -> bool:
        """A rewrite's files are being written (`_adopt_rewrite` has not taken them yet)."""
        return self._rewrite_job is not None

    def _adopt_rewrite(self, block: bool = False) -> None:
        """Take the outcome of the rewrite under way once it is done (or wait for it): its pack
        is durable, so the archives it covers go and it becomes an archive itself."""
        job, ts = self._rewrite_job
        if not job.done.is_set():
            if not block:
                return
            job.wait()
        self._rewrite_job = None
        if job.error is not None:
            log.error("queue %r: rewrite stopped half way (the files remain consistent): %s",
                      self.name, job.error)
        else:
            self.rewrites += 1
            cp = self.checkpoint
            if cp is not None and parse_archive(self.name, cp.file)[0] <= ts:
                self.checkpoint = None           # its files are in the pack now
        if self._erased:
            return
        self._update_archived_size()              # lists the archives: finishes the pack
        if job.error is None and not self._closed:
            self._pack_into_current(ts)

    def _pack_into_current(self, ts: int) -> None:
        """Kestrel's layout after a rewrite, one file, when nothing was written since: the pack,
        now the only archive, replaces the empty current file (a rename that a crash may undo
        without harm: the same records replay either way)."""
        if self._disk_size or self._pending or self._chain or self._rb is not None:
            return
        packed = os.path.join(self._dir, f"{self.name}.{ts}")
        try:
            if archived_files(self._dir, self.name, self._discard) != [f"{self.name}.{ts}"]:
                return
            os.rename(packed, self._path)
        except OSError as e:
            log.error("queue %r: rewrite: cannot rename %s: %s", self.name, packed, e)
            return
        self._switch_writer()
        self._archived_size = 0

    def _update_archived_size(self) -> None:
        try:
            self._archived_size = sum(os.path.getsize(os.path.join(self._dir, a))
                                      for a in archived_files(self._dir, self.name, self._discard))
        except OSError as e:
            log.error("queue %r: cannot list archived journals: %s", self.name, e)

    # -------------------------------------------------------- a flush in read-behind
    def drop_behind(self, n: int) -> tuple[int, tuple] | None:
        """A flush (queue.py) drops the `n` queued items the reader has not reached without
        reading them back (issue 8): their removes are recorded, one byte each (replay pops
        them from the head like any remove), and read-behind ends.  Returns (the mark of
        those records, what `undrop_behind` needs to take it back), or None when not in
        read-behind.  What the files still hold goes at the next rewrite or pack."""
        rb = self._rb
        if rb is None:
            return None
        p = self._pending
        mark = self._origin + len(p)
        p += b"\x01" * n
        self.check_due = True         # records past `check_at`, perhaps (journal.py)
        self._leave_read_behind()
        return mark, (rb.name, rb.pos)     # (its `path` is stale once its file is rotated)

    def undrop_behind(self, token: tuple) -> None:
        """The records of a `drop_behind` were lost (undo.py): read behind again from where
        the reader was.  Its file is still there: a rotation, rewrite or pack of it waits
        for the records before it to be written."""
        name, pos = token
        self._rb = Cursor(os.path.join(self._dir, name), name, pos)
        log.info("queue %r: back in read-behind at %s:%d (a flush was undone)", self.name, name, pos)

    # -------------------------------------------------------- checkpoint packs (§6.5)
    def pack_due(self) -> PackRequest | None:
        """The pack to run now, if any: once a checkpoint is set and the reader is
        no longer inside the files it covers.  Marks it outstanding until
        `pack_done`."""
        if self._rewrite_job is not None:
            self._adopt_rewrite()
            if self._rewrite_job is not None:
                return None                      # its pack would overlap this one
        cp = self.checkpoint
        if cp is None or self._pack_outstanding is not None or self._closed:
            return None
        rb = self._rb
        if rb is not None and rb.name != self.name and \
                parse_archive(self.name, rb.name)[0] <= parse_archive(self.name, cp.file)[0]:
            return None                          # cheap answer for owners that poll every batch
        archives = archived_files(self._dir, self.name, self._discard)
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
        self.check_due = True         # the rewrites may go ahead now (`_gate`)
        if result is None or self._closed or self._erased:
            unlink_quietly(req.out_path)
            return
        pack = os.path.join(self._dir, req.checkpoint_file + ".pack")
        try:
            os.rename(result.out_path, pack)
        except OSError as e:
            log.error("queue %r: cannot install the pack of %s: %s", self.name, req.checkpoint_file, e)
            unlink_quietly(result.out_path)
            return
        if result.out_path != req.out_path:
            unlink_quietly(req.out_path)
        try:
            archived_files(self._dir, self.name, self._discard)     # deletes the packed archives, renames the pack
            fsync_dir(self._dir)
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
        try:
            result = pack_files(req.files, req.out_path, req.open_xids, now_ms=self._clock.now_ms())
        except (OSError, ValueError) as e:
            log.error("queue %r: pack of %s failed: %s", self.name, req.checkpoint_file, e)
            result = None
        self.pack_done(result)


#: Bytes of a rewrite's dump encoded before they are written (`_write_dump`)
DUMP_CHUNK = 1 << 20


def _rewrite_files(old_fd: int, sync_old: bool, tmp_path: str, snapshot: tuple, pack_path: str,
                   dir_path: str, write, fsync, fsync_old) -> None:
    """The slow half of a rewrite (`JournalCompaction._rewrite`), in crash-safe order: the dump
    of `snapshot` is written and fsynced, then renamed to a `.pack` and the directory fsynced.
    `old_fd` is the archived file: closed here, after an fsync (`fsync_old`) under a periodic
    sync policy (its records are due to be durable soon, and the pack may fail)."""
    try:
        if sync_old:
            fsync_old(old_fd)
    except OSError as e:
        log.error("%s: fsync failed: %s", pack_path, e)
    finally:
        os.close(old_fd)
    try:
        fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_dump(fd, snapshot, tmp_path, write)
            fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp_path, pack_path)
    except OSError:
        unlink_quietly(tmp_path)
        raise
    fsync_dir(dir_path)


def _write_dump(fd: int, snapshot: tuple, path: str, write) -> None:
    """A rewrite's dump (§6.4): each open read as an ADDX and its REMOVE_TENTATIVE, highest xid
    first, then the queued items, encoded a chunk at a time (on the writer's thread, the loop
    gets the interpreter back between chunks; no copy of the whole queue at once)."""
    opened, items = snapshot
    buf = bytearray()
    for xid, item in opened:
        buf += encode_add(item)
        buf += pack_xid(9, xid)
    for item in items:
        data = item.data
        buf += pack_addx(2, len(data) + 16, item.add_time, item.expiry)
        buf += data
        if len(buf) >= DUMP_CHUNK:
            write_all(fd, buf, path, write)
            buf = bytearray()
    if buf:
        write_all(fd, buf, path, write)
