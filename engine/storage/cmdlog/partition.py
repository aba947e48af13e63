"""One partition's workq command log: replayed once at open, then appended to.

Layout.  `queue_path/cmdlog/<partition>/` holds workq segments `NNNNNNNNN.log`
(codec in segment.py), workq's empty flock files `append.lock` (the owner holds
LOCK_EX for its whole life, so a second server fails fast) and `read.lock`
(replay holds LOCK_SH, the cleaner LOCK_EX per pass), and
`lanner-queues.json`, the names of the queues that exist in this partition (so
an empty queue survives a restart even after the cleaner dropped every record
that named it; rewritten by fsync + rename + directory fsync whenever a queue
is created or erased).  Without that file (a directory workq wrote) every queue
named by a replayed add exists, which is workq's own rule.  workq ignores the
file, as it ignores every non-segment name.  Every queue whose parent hashes
to the partition (placement.py) shares its log.

Durability: appends go to a user-space buffer; `flush()` is one write(2) (a
failed or short write is cut back with ftruncate, so no partial record is left
for the next write to bury); `sync()` is flush + fsync.  Rotation, before an
append that finds the active segment at or over segment_size, fsyncs the old
segment, and the directory is fsynced whenever a segment is created.  The owner
(worker) applies the sync policy: `always` | `interval` | `os`.  `sync()` may
also run in another thread while the owner keeps appending (then it fsyncs what
was flushed already): that is how the worker's group commit uses it.  A failed
write leaves its records buffered until the owner rolls back (`rollback`, which
also cuts written-but-unsynced bytes after a failed fsync; queues/undo.py).

Queues see their partition through `CmdlogStorage` (cmdlog.py), made by `storage_for`.
"""
from __future__ import annotations

import errno
import fcntl
import heapq
import json
import logging
import os
import threading
from collections import deque
from collections.abc import Mapping
from functools import partial
from typing import Iterable

from lanner.storage.cmdlog.crc import crc32c

from lanner.queues.item import QItem
from lanner.storage.cmdlog.cmdlog import CmdlogStorage, name_str
from lanner.storage.cmdlog.replay import Job, ReplayInfo, Replayer, replay_directory
from lanner.storage.cmdlog.segment import (CORRUPT, DELETE, EXPIRE, HEADER, HEADER_SIZE, HELD_MAX_FAILS, IO, LOCKED,
                                           START_ATTEMPT,
                                           TIMEOUT_ATTEMPT, CmdlogError, CmdlogIOError, encode_command,
                                           encode_time, fsync_dir, put_uvarint, segment_name)
from lanner.storage.seam import ReplayState
from lanner.storage.writer import write_all

log = logging.getLogger(__name__)

DEFAULT_SEGMENT_SIZE = 64 * 2**20
QUEUES_FILE = "lanner-queues.json"
APPEND_LOCK = "append.lock"
READ_LOCK = "read.lock"
SYNC_POLICIES = ("always", "interval", "os")

_MS = 1_000_000
_UUID_MASK = ((1 << 128) - 1) ^ (0xF << 76) ^ (0x3 << 62)
_UUID_V4 = (0x4 << 76) | (0x2 << 62)
_ID_PREFIX = {k: bytes((17, k)) for k in (DELETE, EXPIRE, START_ATTEMPT, TIMEOUT_ATTEMPT)}


def _cfg(config, key: str, default):
    if config is None:
        return default
    if isinstance(config, Mapping):
        return config.get(key, default)
    return getattr(config, key, default)


def partition_dir(queue_path: str, partition: int) -> str:
    return os.path.join(queue_path, "cmdlog", str(partition))


def open_partition_logs(queue_path: str, partitions: Iterable[int], clock, cmdlog_config=None
                        ) -> dict[int, "PartitionLog"]:
    """Open (replaying) the log of each partition.  `cmdlog_config` is the
    `[cmdlog]` table (config.CmdlogConfig, a mapping or None for defaults):
    segment_size bytes, sync, sync_interval ms."""
    segment_size = _cfg(cmdlog_config, "segment_size", DEFAULT_SEGMENT_SIZE)
    sync = _cfg(cmdlog_config, "sync", "interval")
    interval = _cfg(cmdlog_config, "sync_interval", 1000)
    logs: dict[int, PartitionLog] = {}
    try:
        for p in partitions:
            logs[p] = PartitionLog(partition_dir(queue_path, p), clock, segment_size, sync, interval)
    except BaseException:
        for plog in logs.values():
            plog.close()
        raise
    return logs


class PartitionLog:
    """One partition's command log: replayed once at open, then appended to.
    Owned by one thread (the worker's loop); only sync() may run elsewhere."""

    sync_gate = None            # the Syncer of its group-commit fsyncs, once it has one (syncer.py)

    def __init__(self, directory: str, clock, segment_size: int = DEFAULT_SEGMENT_SIZE,
                 sync_policy: str = "interval", sync_interval_ms: int = 1000) -> None:
        if not isinstance(segment_size, int) or segment_size <= HEADER_SIZE:
            raise ValueError(f"cmdlog segment_size must be > {HEADER_SIZE} bytes, got {segment_size!r}")
        if sync_policy not in SYNC_POLICIES:
            raise ValueError(f"cmdlog sync must be one of {', '.join(SYNC_POLICIES)}, got {sync_policy!r}")
        if sync_policy == "interval" and not (isinstance(sync_interval_ms, int) and sync_interval_ms > 0):
            raise ValueError(f"cmdlog sync_interval must be > 0 ms with sync = interval, got {sync_interval_ms!r}")
        self.dir = directory
        self.segment_size = segment_size
        self.sync_mode = sync_policy
        self.sync_interval_ms = sync_interval_ms
        self._clock = clock
        self._owner = threading.get_ident()
        self._fd_lock = threading.Lock()
        self._fd: int | None = None
        self._active_seq: int | None = None
        self._size = 0                  # bytes of the active segment on disk (flushed)
        self._buf = bytearray()
        self._flushed = 0               # bytes handed to the OS since open (monotonic)
        self._synced = 0                # ... of which known durable
        self._closed = False
        self._broken: str | None = None
        self._rotate_failed = False     # the last rotation attempt failed; retry after a good flush
        self._write = os.write          # tests swap in failing writes
        self._time_ms = -1
        self._time_bytes = b""
        self._ctime_ms = -1
        self._ctime_bytes = b""
        self._rand = b""
        self._rand_pos = 0
        self.rotations = 0
        self.replay_info = ReplayInfo()
        self._storages: dict[str, CmdlogStorage] = {}
        self._pending: dict[str, tuple[ReplayState, set[bytes]]] = {}
        self._names: set[str] = set()
        self._scheduled: dict[bytes, tuple[str, QItem]] = {}
        self._heap: list[tuple[int, int, bytes]] = []
        self._limited: dict[bytes, Job] = {}
        self._relogged: dict[bytes, tuple[bytes, Job]] = {}   # new id -> (old id, job): undo of a re-log
        self._handed: set[bytes] = set()
        self._held: set[bytes] = set()       # live jobs logged as held (segment.held_past_ttl)
        self._cut_gen = 0               # bumped when rollback cuts written bytes (see sync)
        os.makedirs(directory, exist_ok=True)
        self._lock_fd = flock_path(os.path.join(directory, APPEND_LOCK), fcntl.LOCK_EX | fcntl.LOCK_NB)
        try:
            self._load()
        except BaseException:
            os.close(self._lock_fd)
            raise

    # -- start-up ---------------------------------------------------------------------------
    def _load(self) -> None:
        rfd = flock_path(os.path.join(self.dir, READ_LOCK), fcntl.LOCK_SH)
        try:
            replayer = Replayer(self._clock.now_ms() * _MS)
            info = replay_directory(self.dir, replayer, repair_tail=True)
        finally:
            os.close(rfd)
        self.replay_info = info
        self._active_seq = info.newest_seq
        self._size = info.newest_size
        names_with_jobs: set[str] = set()
        for nb, (ready, leased, scheduled) in replayer.queue_jobs().items():
            name = name_str(nb)
            names_with_jobs.add(name)
            items = deque(_qitem(j) for j in ready)
            opens: dict[int, QItem] = {}
            for xid, job in enumerate(leased, 1):
                item = _qitem(job)
                item.xid = xid
                opens[xid] = item
            live = {j.cmd.id for j in ready}
            live.update(j.cmd.id for j in leased)
            for job in scheduled:
                jid = job.cmd.id
                live.add(jid)
                self._scheduled[jid] = (name, _qitem(job))
                self._heap.append((job.cmd.time_ns, job.seq, jid))
            for group in (ready, leased, scheduled):
                for job in group:
                    if job.cmd.max_attempts:
                        self._limited[job.cmd.id] = job
                    if job.cmd.max_fails == HELD_MAX_FAILS:
                        self._held.add(job.cmd.id)
            st = ReplayState(items=items, total_items=len(items), total_bytes=sum(len(i.data) for i in items),
                             open_transactions=opens, xid_counter=len(leased),
                             replayed_adds=replayer.applied.get(nb, 0))
            self._pending[name] = (st, live)
        heapq.heapify(self._heap)
        for nb, count in replayer.applied.items():
            name = name_str(nb)
            if name not in self._pending:
                self._pending[name] = (ReplayState(replayed_adds=count), set())
        marker = self._read_marker()
        if marker is None:
            self._names = {name_str(nb) for nb in replayer.applied} | names_with_jobs
            if self._names:
                self._write_marker()
        else:
            self._names = marker | names_with_jobs
            if self._names != marker:
                self._write_marker()
        log.info("%s: replayed %d records from %d segments (%d bytes): %d live jobs in %d queues",
                 self.dir, info.records, info.segments, info.bytes, len(replayer.jobs), len(names_with_jobs))

    def _read_marker(self) -> set[str] | None:
        path = os.path.join(self.dir, QUEUES_FILE)
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return None
        try:
            doc = json.loads(raw)
            names = doc["queues"]
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise ValueError("queues is not a list of strings")
        except (ValueError, KeyError, TypeError) as e:
            raise CmdlogError(path, 0, f"unreadable queue list: {e}", CORRUPT) from None
        return set(names)

    def _write_marker(self) -> None:
        path = os.path.join(self.dir, QUEUES_FILE)
        tmp = path + ".tmp"
        data = json.dumps({"queues": sorted(self._names)}).encode()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            write_all(fd, data, 0, os.write)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        fsync_dir(self.dir)

    # -- queues -----------------------------------------------------------------------------
    def queue_names(self) -> list[str]:
        """Queues that exist in this partition: recreate them at start-up."""
        return sorted(self._names)

    def has_queue(self, queue_name: str) -> bool:
        return queue_name in self._names

    def live_count(self, queue_name: str) -> int:
        """Jobs of `queue_name` alive in this log (queued, open or scheduled)."""
        st = self._storages.get(queue_name)
        if st is not None:
            return len(st._live)
        pending = self._pending.get(queue_name)
        return len(pending[1]) if pending is not None else 0

    def storage_for(self, queue_name: str) -> "CmdlogStorage":
        st = self._storages.get(queue_name)
        if st is not None:
            return st
        state, live = self._pending.pop(queue_name, (None, set()))
        st = CmdlogStorage(self, queue_name, state, live)
        self._storages[queue_name] = st
        if queue_name not in self._names:
            self._names.add(queue_name)
            self._write_marker()
        return st

    def _forget(self, queue_name: str) -> None:
        self._storages.pop(queue_name, None)
        self._pending.pop(queue_name, None)
        if queue_name in self._names:
            self._names.discard(queue_name)
            self._write_marker()

    # -- scheduled jobs ---------------------------------------------------------------------
    def next_due(self) -> int | None:
        """Epoch ms at which the earliest scheduled job becomes due, or None."""
        heap = self._heap
        while heap and heap[0][2] not in self._scheduled:
            heapq.heappop(heap)
        if not heap:
            return None
        return -(-heap[0][0] // _MS)

    def due_items(self, now_ms: int) -> list[tuple[str, QItem]]:
        """Scheduled jobs whose time has come, as (queue name, item).  They are
        already in the log: put the item itself at its queue's tail, either
        without record_add or with record_add on this very object (its job id
        is recognised once and nothing is written)."""
        heap = self._heap
        now_ns = now_ms * _MS
        out = []
        while heap and heap[0][0] <= now_ns:
            _t, _s, jid = heapq.heappop(heap)
            entry = self._scheduled.pop(jid, None)
            if entry is not None:
                out.append(entry)
                self._handed.add(jid)
        return out

    def scheduled_count(self, queue_name: str | None = None) -> int:
        if queue_name is None:
            return len(self._scheduled)
        return sum(1 for name, _item in self._scheduled.values() if name == queue_name)

    # -- appending --------------------------------------------------------------------------
    def _new_job_id(self) -> bytes:
        pos = self._rand_pos
        if pos >= len(self._rand):
            self._rand = os.urandom(4096)
            pos = 0
        self._rand_pos = pos + 16
        v = int.from_bytes(self._rand[pos:pos + 16], "big") & _UUID_MASK | _UUID_V4
        return v.to_bytes(16, "big")

    def _open_active(self) -> None:
        if self._closed:
            raise CmdlogError(self.dir, 0, "command log is closed", IO)
        if self._active_seq is None:
            self._create_segment(1)
            return
        path = os.path.join(self.dir, segment_name(self._active_seq))
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        with self._fd_lock:
            self._fd = fd
            self._size = os.fstat(fd).st_size

    def _create_segment(self, seq: int) -> None:
        path = os.path.join(self.dir, segment_name(seq))
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        try:
            write_all(fd, HEADER, 0, os.write)
            fsync_dir(self.dir)
        except BaseException:
            os.close(fd)
            raise
        with self._fd_lock:
            self._fd = fd
            self._active_seq = seq
            self._size = HEADER_SIZE

    def _rotate(self) -> None:
        self.flush()
        old = self._fd
        self._fsync_fd(old)
        self._synced = self._flushed
        self._create_segment(self._active_seq + 1)
        os.close(old)
        self.rotations += 1

    def _fsync_fd(self, fd: int) -> None:
        """The owner's own fsync of the active segment (rotation, close): never while the syncer
        fsyncs it (syncer.py, `exclusive`)."""
        if self.sync_gate is None:
            os.fsync(fd)
        else:
            self.sync_gate.exclusive(self, partial(os.fsync, fd))

    def _prepare_append(self) -> None:
        """Open the active segment, or rotate, before buffering a record.  A failure here is
        not the record's: it stays buffered (the segment grows past segment_size) and the
        owner's flush reports the problem and rolls back."""
        try:
            if self._fd is None:
                self._open_active()
            if self._size + len(self._buf) >= self.segment_size and not self._rotate_failed:
                self._rotate()
        except OSError as e:
            if self._fd is not None and not self._rotate_failed:
                log.error("%s: cannot start a new segment: %s (retried after the next good write)",
                          self.dir, e)
                self._rotate_failed = True

    def _now_time(self) -> bytes:
        """The encoded record time for now (cached per millisecond)."""
        now = self._clock.now_ms()
        if now != self._time_ms:
            self._time_ms = now
            self._time_bytes = encode_time(now * _MS)
        return self._time_bytes

    def _put(self, body: bytes) -> None:
        """Buffer one record: body is TIME + SIZE + payload; the CRC is added here.
        Rotation happens first, when the active segment is already at or over the limit.
        Never raises for I/O (seam.py): problems surface at `flush`."""
        if self._fd is None or self._size + len(self._buf) >= self.segment_size:
            self._prepare_append()
        buf = self._buf
        buf += body
        buf += crc32c(body).to_bytes(4, "big")

    @property
    def mark(self) -> int:
        """Where the next record starts (seam.py): bytes ever flushed + bytes buffered."""
        return self._flushed + len(self._buf)

    def _append(self, payload: bytes) -> None:
        self._put(b"".join((self._now_time(), put_uvarint(len(payload)), payload)))

    def _append_id(self, kind: int, jid: bytes) -> None:
        """delete / expire / start-attempt / timeout-attempt: a 17-byte payload."""
        self._put(b"".join((self._now_time(), _ID_PREFIX[kind], jid)))

    def _created_time(self, ms: int) -> bytes:
        if ms == self._time_ms:
            return self._time_bytes
        if ms != self._ctime_ms:
            self._ctime_ms = ms
            self._ctime_bytes = encode_time(ms * _MS)
        return self._ctime_bytes

    def append_command(self, cmd) -> None:
        """Append any command (tools, tests, and the re-log of limited jobs)."""
        self._append(encode_command(cmd))

    def _active_path(self) -> str:
        seq = self._active_seq
        return os.path.join(self.dir, segment_name(seq)) if seq is not None else self.dir

    # -- durability -------------------------------------------------------------------------
    @property
    def dirty(self) -> bool:
        return bool(self._buf) or self._flushed > self._synced

    @property
    def pending_fsync(self) -> bool:
        """Flushed bytes not yet known durable."""
        return self._flushed > self._synced

    @property
    def logsize(self) -> int:
        return self._size + len(self._buf)

    def flush(self) -> None:
        """One write(2) of everything buffered.  On failure the segment is cut
        back to its last whole record and the buffer kept for a retry."""
        buf = self._buf
        if not buf:
            return
        if self._broken:
            raise CmdlogIOError(self._active_path(), self._size, self._broken)
        if self._fd is None:
            try:
                self._open_active()
            except OSError as e:
                raise CmdlogIOError(self._active_path(), self._size, f"cannot open a segment: {e}",
                                    e.errno) from e
        fd = self._fd
        n = len(buf)
        done = 0
        try:
            with memoryview(buf) as mv:
                while done < n:
                    done += self._write(fd, mv[done:])
        except OSError as e:
            if done:
                try:
                    os.ftruncate(fd, self._size)
                except OSError as e2:
                    self._broken = f"partial write could not be undone: {e2}"
            self._buf = bytearray(buf)      # the failed write's traceback may still export `buf`
            raise CmdlogIOError(self._active_path(), self._size, f"write failed: {e.strerror or e}",
                                e.errno) from e
        self._size += n
        with self._fd_lock:
            self._flushed += n
        buf.clear()
        self._rotate_failed = False

    def sync(self) -> None:
        """flush + fsync.  From a thread other than the owner's it fsyncs what
        the owner has flushed (the buffer belongs to the owner)."""
        if threading.get_ident() == self._owner:
            self.flush()
        with self._fd_lock:
            fd = self._fd
            upto = self._flushed
            gen = self._cut_gen
            if fd is None or upto <= self._synced:
                return
            fd = os.dup(fd)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self.sync_done((gen, upto), None)

    def sync_target(self) -> tuple[int, tuple[int, int], bool] | None:
        """What an fsync now makes durable (storage/syncer.py, on the owner's thread): (fd, token
        for `sync_done`, True: fdatasync is enough: a segment only grows, or is cut back by
        rollback, and every new segment's directory entry is fsynced when it is created), or
        None if every flushed byte is durable."""
        fd = self._fd
        if fd is None or self._flushed <= self._synced:
            return None
        return fd, (self._cut_gen, self._flushed), True

    def sync_done(self, token: tuple[int, int], error: OSError | None) -> OSError | None:
        """The fsync of `token` returned: count its bytes durable, or return `error` to report."""
        if error is not None:
            return error
        gen, upto = token
        with self._fd_lock:
            if gen == self._cut_gen and upto > self._synced:   # not if rollback cut those bytes meanwhile
                self._synced = upto
        return None

    # -- the medium (seam.py, undo.py, storage/sync.py) ----------------------------------------
    @property
    def medium(self) -> "PartitionLog":
        return self

    @property
    def sync_policy(self) -> str | int:
        """[cmdlog] sync as storage/sync.py reads it: interval -> its period in ms, os -> never."""
        mode = self.sync_mode
        return "always" if mode == "always" else self.sync_interval_ms if mode == "interval" else "never"

    @property
    def written_mark(self) -> int:
        return self._flushed

    @property
    def durable_mark(self) -> int:
        return self._synced

    @property
    def committed_mark(self) -> int:
        return self._synced if self.sync_mode == "always" else self._flushed

    def rollback(self, mark: int) -> None:
        """Drop every record from `mark` on: buffered ones, and ones written but not fsynced
        (the active segment is cut back).  Owner's thread, with no fsync under way."""
        start = self._flushed
        if mark >= start:
            del self._buf[mark - start:]
            return
        del self._buf[:]
        off = self._size - (start - mark)
        if off < HEADER_SIZE:    # cannot happen: rotation fsyncs the segment it leaves
            log.error("%s: cannot roll back into a closed segment (mark %d)", self.dir, mark)
            return
        with self._fd_lock:
            try:
                os.ftruncate(self._fd, off)
            except OSError as e:
                self._broken = f"a failed write could not be cut back: {e}"
            self._cut_gen += 1
            self._size = off
            self._flushed = mark
            if self._synced > mark:
                self._synced = mark

    def close(self) -> None:
        if self._closed:
            return
        try:
            if self._fd is not None and not self._broken:
                self.flush()
                self._fsync_fd(self._fd)
                self._synced = self._flushed
        finally:
            self._closed = True
            with self._fd_lock:
                fd, self._fd = self._fd, None
            if fd is not None:
                os.close(fd)
            os.close(self._lock_fd)

    @property
    def closed(self) -> bool:
        return self._closed


def _qitem(job: Job) -> QItem:
    cmd = job.cmd
    exp = job.expire_ns
    return QItem(cmd.created_ns // _MS, 0 if exp is None else exp // _MS, cmd.payload, 0, cmd.id, cmd.priority)


def flock_path(path: str, mode: int) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, mode)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise CmdlogError(path, 0, "command log is locked by another process", LOCKED) from None
        raise
    return fd

