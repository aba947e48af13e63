"""Per-partition workq command logs, and `CmdlogStorage`: one queue's view of one.

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

Queue operations as workq commands (one record per seam call):

    record_add(item)        add: id = fresh random UUIDv4, name = queue name
                            (UTF-8), TTR 60000, TTL = expiry - add_time in ms
                            (at least 1), priority = item.priority, max-attempts
                            0, max-fails 0, payload = data, JOB_TIME = zero time,
                            JOB_CREATED = add_time.  An item that never expires
                            is written TTL 2592000000 (workq's maximum) with
                            max-fails 255: see segment.never_expires.  Lanner's
                            replay and cleaner never expire such a record, while
                            workq would drop it 30 days after creation.  An
                            expiry more than 30 days after the add is written
                            with its real TTL, which Lanner replays exactly and
                            workq would refuse ("Invalid TTL").  Any job_id the
                            item carried is replaced: every queue's item is its
                            own job, so fanout copies must be separate QItems.
                            The exception is an item handed out by due_items,
                            which is already logged: nothing is written for it.
    record_remove(item)     expire when the item's expiry has passed (the expiry
                            sweep), otherwise delete (plain get, discard, flush).
                            Replay treats the two alike: the job is gone.
    record_open(item, xid)  start-attempt (xids are not logged: replay numbers
                            leased jobs 1..n in lease order).
    record_confirm          complete with an empty result.
    record_unremove         timeout-attempt; the job is PENDING and goes back to
                            the head of the ready list.  For a workq job with
                            max-attempts whose attempts are used up, workq's
                            replay would FAIL it on that record, so Lanner writes
                            delete + a copy of the job's add/schedule under a new
                            id (attempts restart at 0), keeping replay equal to
                            what the live queue holds.
    erase()                 delete for every live job of the queue, then the name
                            leaves lanner-queues.json.

TTR is always written as 60000 ms and ignored: a Lanner open read never times
out unless the queue sets open_transaction_timeout.  max-attempts from workq
records is kept in the log and applied by replay exactly as workq does (a
timeout-attempt at the limit fails the job); Lanner itself never refuses an open
read for it.  workq's hard cap of 255 attempts is not applied.  max-fails is
kept and ignored, as in workq.  Job names may contain `.` (cmdlog queues only).

Replay (workq §2.5, one pass per partition for all its queues, clock injected):
add/schedule records whose expiration (segment.expires_at_ns) is before now are
skipped; complete/fail/delete/expire/start-attempt on an absent or finished job
are no-ops (workq's NOT-FOUND), and so, unlike workq, are the other impossible
transitions (a second complete, a start-attempt of a leased job); a second add
of a live id is fatal (CmdlogError), as in workq.  Lanner does not re-run workq's
add validation (name charset, 1 MiB payload, TTR range): Kestrel names with `+`
and items over 1 MiB are legal here.  A schedule whose time has passed is ready;
a later one stays in the partition until due: the owner's timer asks
`next_due()` (epoch ms) and takes `due_items(now_ms)`, (queue, QItem) pairs
whose records are already in the log, and appends each item to its queue
(through record_add on that same object, which writes nothing, or directly).
A restart before that simply schedules it again.  Each
queue's ready items come back ordered by (-priority, requeue class, ...): first
jobs that went back by timeout-attempt, most recent first (that is where the
live queue puts an aborted item: at the head), then the rest by (time they
became available = max(scheduled, created), log order).  For Lanner's own
records, whose created times follow log order, this is exactly the live FIFO
order; a wall clock stepping backwards between adds can reorder such items.
Leased jobs come back as open transactions, xids 1..n in lease order, and the
queue rolls them back (record_unremove) as after a Kestrel restart.

Torn tail: only the newest segment may end inside a record (a crash mid-write);
replay truncates it at that record (WARNING with file and offset) provided no
complete valid record follows; a newest segment shorter than its header (a crash
while it was created) gets a bare header again.  A torn record anywhere else,
a CRC mismatch, a
bad header or an undecodable record refuses start-up: CmdlogError, whose str is
one line naming the file and byte offset.

Durability: appends go to a user-space buffer; `flush()` is one write(2) (a
failed or short write is cut back with ftruncate, so no partial record is left
for the next write to bury); `sync()` is flush + fsync.  Rotation, before an
append that finds the active segment at or over segment_size, fsyncs the old
segment, and the directory is fsynced whenever a segment is created.  The owner
(worker) applies the sync policy: `always` | `interval` | `os`.  `sync()` may
also run in another thread while the owner keeps appending (then it fsyncs what
was flushed already): that is how the worker's group commit uses it.
"""
from __future__ import annotations

import errno
import fcntl
import gc
import heapq
import json
import logging
import os
import threading
import uuid
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, replace
from operator import attrgetter
from typing import Callable, Iterable

from crc32c import crc32c

from lanner.queues.item import QItem
from lanner.storage.cmdlog.segment import (ADD, COMPLETE, CORRUPT, DELETE, EXPIRE, FAIL, HEADER, HEADER_SIZE, IO, LOCKED,
                      MAX_TTL_MS, NO_EXPIRY_MAX_FAILS, REPLAY, SCHEDULE, START_ATTEMPT,
                      TIMEOUT_ATTEMPT, TORN, ZERO_TIME, ZERO_TIME_NS, CmdlogError, CmdlogIOError, JobCommand, SegmentFile,
                      check_header, decode_command, encode_command, encode_time,
                      fsync_dir, list_segments, put_uvarint, put_varint, record_spans, segment_name,
                      valid_record_after)
from lanner.storage.seam import ReplayState

log = logging.getLogger(__name__)

LANNER_TTR_MS = 60_000
DEFAULT_SEGMENT_SIZE = 64 * 2**20
QUEUES_FILE = "lanner-queues.json"
APPEND_LOCK = "append.lock"
READ_LOCK = "read.lock"
SYNC_POLICIES = ("always", "interval", "os")

# workq job states (inspect's numbers), plus how a finished job left
NEW, COMPLETED, FAILED, PENDING, LEASED = 0, 1, 2, 3, 4
DELETED, EXPIRED = 5, 6
STATE_NAMES = {NEW: "new", COMPLETED: "completed", FAILED: "failed", PENDING: "pending",
               LEASED: "leased", DELETED: "deleted", EXPIRED: "expired"}

_MS = 1_000_000
_UUID_MASK = ((1 << 128) - 1) ^ (0xF << 76) ^ (0x3 << 62)
_UUID_V4 = (0x4 << 76) | (0x2 << 62)
_TTR = put_uvarint(LANNER_TTR_MS)
_NO_EXPIRY_TAIL = put_uvarint(MAX_TTL_MS) + b"\x00\x00" + put_uvarint(NO_EXPIRY_MAX_FAILS)
_ORDER = attrgetter("order")
_ID_PREFIX = {k: bytes((17, k)) for k in (DELETE, EXPIRE, START_ATTEMPT, TIMEOUT_ATTEMPT)}
_CONFIRM = bytes((18, COMPLETE))
_ADD_FIXED = 1 + 16 + len(_TTR) + 2 * 15        # type, id, TTR, JOB_TIME, JOB_CREATED


def job_uuid(jid: bytes) -> str:
    return str(uuid.UUID(bytes=jid)) if len(jid) == 16 else jid.hex()


def name_str(name: bytes) -> str:
    return name.decode("utf-8", "surrogateescape")


def name_bytes(name: str | bytes) -> bytes:
    return name if isinstance(name, bytes) else name.encode("utf-8", "surrogateescape")


# ------------------------------------------------------------------ replay

@dataclass(slots=True)
class Job:
    """A job while replaying: its add/schedule command plus workq's mutable state."""

    cmd: JobCommand
    expire_ns: int | None
    seq: int                        # log position of its add/schedule record
    state: int = NEW
    attempts: int = 0
    scheduled: bool = False         # waiting for its time (not ready yet)
    order: tuple = ()               # sort key in its queue's ready list
    lease_seq: int = 0
    result: bytes | None = None     # set when finished (kept only with keep_finished)


class Replayer:
    """workq's replay state machine over a stream of commands (rules in the
    module docstring).  `jobs` holds live jobs only, so memory follows the live
    set, not the log; `finished` (tools and tests) also keeps how every other
    job ended."""

    __slots__ = ("now_ns", "jobs", "finished", "applied", "seq", "skipped", "_leases", "_requeues")

    def __init__(self, now_ns: int, keep_finished: bool = False) -> None:
        self.now_ns = now_ns
        self.jobs: dict[bytes, Job] = {}
        self.finished: dict[bytes, Job] | None = {} if keep_finished else None
        self.applied: dict[bytes, int] = {}     # queue name -> add/schedule records applied
        self.seq = 0
        self.skipped = 0                        # expired adds/schedules
        self._leases = 0
        self._requeues = 0

    def apply(self, cmd, path: str, offset: int) -> None:
        self.seq += 1
        t = cmd.type
        jobs = self.jobs
        if t == ADD or t == SCHEDULE:
            # segment.expires_at_ns(cmd), inlined: this runs once per add in the log
            if cmd.ttl == MAX_TTL_MS and cmd.max_fails == NO_EXPIRY_MAX_FAILS and not cmd.max_attempts and t == ADD:
                exp = None
            else:
                exp = (cmd.time_ns if cmd.time_ns != ZERO_TIME_NS else cmd.created_ns) + cmd.ttl * _MS
                if self.now_ns > exp:
                    self.skipped += 1
                    return
            jid = cmd.id
            if jid in jobs:
                raise CmdlogError(path, offset, f"duplicate job {job_uuid(jid)} (already live)", REPLAY)
            job = Job(cmd, exp, self.seq)
            job.order = (-cmd.priority, 1, max(cmd.time_ns, cmd.created_ns), self.seq)
            if t == SCHEDULE and cmd.time_ns > self.now_ns:
                job.scheduled = True
            jobs[jid] = job
            name = cmd.name
            self.applied[name] = self.applied.get(name, 0) + 1
            if self.finished is not None:
                self.finished.pop(jid, None)
            return
        job = jobs.get(cmd.id)
        if job is None:
            return
        if t == START_ATTEMPT:
            self._leases += 1
            job.state = LEASED
            job.attempts += 1
            job.scheduled = False
            job.lease_seq = self._leases
        elif t == TIMEOUT_ATTEMPT:
            if job.state != LEASED:
                return
            limit = job.cmd.max_attempts
            if limit and job.attempts >= limit:
                self._finish(job, FAILED, b"")
            else:
                self._requeues += 1
                job.state = PENDING
                job.order = (-job.cmd.priority, 0, -self._requeues, 0)
        elif t == COMPLETE:
            self._finish(job, COMPLETED, cmd.result)
        elif t == FAIL:
            self._finish(job, FAILED, cmd.result)
        elif t == DELETE:
            self._finish(job, DELETED, None)
        elif t == EXPIRE:
            self._finish(job, EXPIRED, None)

    def _finish(self, job: Job, state: int, result: bytes | None) -> None:
        del self.jobs[job.cmd.id]
        if self.finished is not None:
            job.state = state
            job.result = result
            job.scheduled = False
            self.finished[job.cmd.id] = job

    def queue_jobs(self) -> dict[bytes, tuple[list[Job], list[Job], list[Job]]]:
        """Per queue name: (ready in serving order, leased in lease order, scheduled by time)."""
        out: dict[bytes, tuple[list[Job], list[Job], list[Job]]] = {}
        for job in self.jobs.values():
            lists = out.get(job.cmd.name)
            if lists is None:
                lists = out[job.cmd.name] = ([], [], [])
            if job.state == LEASED:
                lists[1].append(job)
            elif job.scheduled:
                lists[2].append(job)
            else:
                lists[0].append(job)
        for ready, leased, scheduled in out.values():
            ready.sort(key=_ORDER)
            leased.sort(key=attrgetter("lease_seq"))
            scheduled.sort(key=lambda j: (j.cmd.time_ns, j.seq))
        return out


@dataclass(slots=True)
class ReplayInfo:
    segments: int = 0
    records: int = 0
    bytes: int = 0
    newest_seq: int | None = None
    newest_size: int = 0
    truncated: tuple[str, int, int] | None = None    # (path, offset, bytes cut)


def replay_directory(directory: str, replayer: Replayer, *, repair_tail: bool = False,
                     keep_payload: bool = True, progress: Callable[[int], None] | None = None,
                     active_tolerant: bool = False, segments: list[tuple[int, str]] | None = None
                     ) -> ReplayInfo:
    """Feed every record of every segment, in order, to `replayer`.

    `repair_tail` (the owner at start-up) truncates a torn tail of the newest
    segment, and rewrites a newest segment that is a torn header prefix.
    `active_tolerant` (the cleaner, reading while the owner appends) stops
    quietly at a torn or half-written end of the newest segment instead.
    `segments` fixes the listing (default: list the directory now).

    The cyclic garbage collector is paused meanwhile: replay allocates a few
    objects per live job and no reference cycles, and collections over that
    growing heap cost about a third of the replay time."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _replay_directory(directory, replayer, repair_tail, keep_payload, progress, active_tolerant,
                                 segments)
    finally:
        if enabled:
            gc.enable()


def _replay_directory(directory, replayer, repair_tail, keep_payload, progress, active_tolerant, segments):
    info = ReplayInfo()
    segs = list_segments(directory) if segments is None else segments
    for i, (seq, name) in enumerate(segs):
        newest = i == len(segs) - 1
        path = os.path.join(directory, name)
        cut: int | None = None
        with SegmentFile(path) as seg:
            buf = seg.buf
            size = len(buf)
            try:
                check_header(buf, path)
            except CmdlogError as e:
                if newest and active_tolerant:
                    break
                if not (newest and repair_tail and e.kind == TORN):
                    raise
                cut = 0
            if cut is None:
                spans = record_spans(buf, path)
                try:
                    for off, ps, pe, _end in spans:
                        try:
                            cmd = decode_command(buf, ps, pe, keep_payload)
                        except ValueError as e:
                            raise CmdlogError(path, off, str(e), CORRUPT) from None
                        replayer.apply(cmd, path, off)
                        info.records += 1
                except CmdlogError as e:
                    if newest and active_tolerant and e.kind != REPLAY:
                        pass
                    elif (newest and repair_tail and e.kind == TORN
                          and valid_record_after(buf, e.offset, size) is None):
                        cut = e.offset
                    else:
                        raise
                finally:
                    spans.close()
        if cut is not None:
            _truncate(path, cut, size)
            info.truncated = (path, cut, size - cut)
            size = max(cut, HEADER_SIZE)
        info.segments += 1
        info.bytes += size
        info.newest_seq = seq
        info.newest_size = size
        if progress is not None:
            progress(size)
    return info


def _truncate(path: str, offset: int, size: int) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, offset)
        if offset < HEADER_SIZE:
            os.ftruncate(fd, 0)
            os.pwrite(fd, HEADER, 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    log.warning("%s: offset %d: torn record at the end of the newest segment: truncated %d bytes",
                path, offset, size - offset)


# ------------------------------------------------------------------ configuration

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


# ------------------------------------------------------------------ the partition log

class PartitionLog:
    """One partition's command log: replayed once at open, then appended to.
    Owned by one thread (the worker's loop); only sync() may run elsewhere."""

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
            _write_all(fd, data)
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
            _write_all(fd, HEADER)
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
        os.fsync(old)
        self._synced = self._flushed
        self._create_segment(self._active_seq + 1)
        os.close(old)
        self.rotations += 1

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
        with self._fd_lock:
            if gen == self._cut_gen and upto > self._synced:   # not if rollback cut those bytes meanwhile
                self._synced = upto

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
                os.fsync(self._fd)
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


def _write_all(fd: int, data: bytes) -> None:
    with memoryview(data) as mv:
        done = 0
        while done < len(data):
            done += os.write(fd, mv[done:])


# ------------------------------------------------------------------ the storage seam

class CmdlogStorage:
    """One queue's view of its partition's log (the QueueStorage seam)."""

    can_read_behind = False
    in_read_behind = False
    rewrites = 0

    def __init__(self, plog: PartitionLog, name: str, state: ReplayState | None, live: set[bytes]) -> None:
        self._log = plog
        self.name = name
        self._state = state
        self._live = live
        nb = name_bytes(name)
        self._name_field = put_uvarint(len(nb)) + nb

    @property
    def sync_policy(self) -> str | int:
        return self._log.sync_policy

    def replay(self, config=None) -> ReplayState:
        """The state the partition replay rebuilt for this queue (once)."""
        st = self._state
        self._state = None
        return st if st is not None else ReplayState()

    # -- the medium: the partition's log, shared by its queues (seam.py, undo.py) ------------
    @property
    def medium(self) -> PartitionLog:
        return self._log

    # -- records (each returns the mark where its record starts, or None if none is written) --
    def record_add(self, item: QItem) -> int | None:
        plog = self._log
        jid = item.job_id
        if plog._handed and jid in plog._handed:
            plog._handed.discard(jid)
            self._live.add(jid)
            return None
        mark = plog._flushed + len(plog._buf)
        jid = plog._new_job_id()
        item.job_id = jid
        expiry = item.expiry
        prio = item.priority
        if expiry:
            ttl = expiry - item.add_time
            mid = put_uvarint(ttl if ttl > 0 else 1) + (put_varint(prio) if prio else b"\x00") + b"\x00\x00"
        elif not prio:
            mid = _NO_EXPIRY_TAIL
        else:
            mid = put_uvarint(MAX_TTL_MS) + put_varint(prio) + b"\x00" + put_uvarint(NO_EXPIRY_MAX_FAILS)
        data = item.data
        n = len(data)
        dlen = put_uvarint(n)
        name_field = self._name_field
        size = _ADD_FIXED + len(name_field) + len(mid) + len(dlen) + n
        plog._put(b"".join((plog._now_time(), put_uvarint(size), b"\x01", jid, name_field, _TTR, mid, dlen, data,
                            ZERO_TIME, plog._created_time(item.add_time))))
        self._live.add(jid)
        return mark

    def record_remove(self, item: QItem) -> int | None:
        jid = item.job_id
        if jid is None:
            return None
        plog = self._log
        mark = plog._flushed + len(plog._buf)
        expiry = item.expiry
        plog._append_id(EXPIRE if expiry and expiry < plog._clock.now_ms() else DELETE, jid)
        self._discard(jid)
        return mark

    def record_open(self, item: QItem, xid: int) -> int | None:
        jid = item.job_id
        if jid is None:
            return None
        plog = self._log
        mark = plog._flushed + len(plog._buf)
        plog._append_id(START_ATTEMPT, jid)
        if plog._limited:
            job = plog._limited.get(jid)
            if job is not None:
                job.attempts += 1
        if plog._handed:
            plog._handed.discard(jid)
        return mark

    def record_unremove(self, item: QItem, xid: int) -> int | None:
        jid = item.job_id
        if jid is None:
            return None
        plog = self._log
        mark = plog._flushed + len(plog._buf)
        job = plog._limited.get(jid) if plog._limited else None
        if job is not None and job.attempts >= job.cmd.max_attempts:
            self._relog(item, job)
        else:
            plog._append_id(TIMEOUT_ATTEMPT, jid)
        return mark

    def record_confirm(self, item: QItem, xid: int) -> int | None:
        jid = item.job_id
        if jid is None:
            return None
        plog = self._log
        mark = plog._flushed + len(plog._buf)
        plog._put(b"".join((plog._now_time(), _CONFIRM, jid, b"\x00")))
        self._discard(jid)
        return mark

    def undo_record(self, kind: int, item: QItem, xid: int) -> None:
        """A record of this queue was rolled back (queues/undo.py): put the partition's
        bookkeeping back as it was before it.  (Kinds as in undo.py: 0 add, 1 remove,
        2 open, 3 abort, 4 confirm.)"""
        jid = item.job_id
        if jid is None:
            return
        plog = self._log
        if kind == 0:
            self._live.discard(jid)
        elif kind == 1 or kind == 4:
            self._live.add(jid)
        elif kind == 2:
            job = plog._limited.get(jid) if plog._limited else None
            if job is not None and job.attempts:
                job.attempts -= 1
        elif kind == 3:
            old = plog._relogged.pop(jid, None)
            if old is not None:             # the abort had re-logged the job under a new id
                old_id, job = old
                self._live.discard(jid)
                self._live.add(old_id)
                plog._limited.pop(jid, None)
                plog._limited[old_id] = job
                item.job_id = old_id

    def _discard(self, jid: bytes) -> None:
        self._live.discard(jid)
        plog = self._log
        if plog._limited:
            plog._limited.pop(jid, None)
        if plog._handed:
            plog._handed.discard(jid)

    def _relog(self, item: QItem, job: Job) -> None:
        """A workq job at its max-attempts goes back to the queue: workq's replay
        would fail it on a timeout-attempt, so log it as a fresh job instead."""
        plog = self._log
        old = item.job_id
        new = plog._new_job_id()
        cmd = replace(job.cmd, id=new, payload=item.data)
        plog._append_id(DELETE, old)
        plog.append_command(cmd)
        plog._limited.pop(old, None)
        plog._limited[new] = Job(cmd, job.expire_ns, job.seq)
        relogged = plog._relogged
        if len(relogged) >= 1024:             # long committed: only the newest can roll back
            del relogged[next(iter(relogged))]
        relogged[new] = (old, job)
        self._live.discard(old)
        self._live.add(new)
        item.job_id = new

    # -- the rest of the seam ---------------------------------------------------------------
    def before_add(self, view, config, now_ms: int) -> None:
        """Nothing: rotation happens on append and cleaning in the cleaner process."""

    def after_remove(self, view, config, now_ms: int) -> None:
        """Nothing, as before_add."""

    def start_read_behind(self) -> None:
        raise RuntimeError(f"cmdlog queue {self.name!r} keeps every item in memory (no read-behind)")

    def fill_read_behind(self, max_bytes: int, now_ms: int) -> list[QItem]:
        return []

    @property
    def dirty(self) -> bool:
        return self._log.dirty

    def flush(self) -> None:
        self._log.flush()

    def sync(self) -> None:
        self._log.sync()

    def close(self) -> None:
        plog = self._log
        if not plog.closed:
            plog.sync()

    def erase(self) -> None:
        """Delete every live job of the queue (ready, open, scheduled), make
        that durable, then forget the queue name.  If the deletes cannot be made
        durable they are taken back and the error raised: nothing changed."""
        plog = self._log
        mark = plog.mark
        live = sorted(self._live)
        for jid in live:
            plog._append_id(DELETE, jid)
        try:
            plog.sync()
        except OSError:
            plog.rollback(mark)
            raise
        for jid in live:
            plog._scheduled.pop(jid, None)
            plog._limited.pop(jid, None)
            plog._handed.discard(jid)
        self._live.clear()
        self._state = None
        plog._forget(self.name)

    @property
    def logsize(self) -> int:
        return self._log.logsize

    @property
    def rotations(self) -> int:
        return self._log.rotations

    @property
    def live_jobs(self) -> int:
        """Jobs of this queue alive in the log (queued, open or scheduled)."""
        return len(self._live)
