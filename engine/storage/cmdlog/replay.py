"""Replaying workq command logs: workq's job state machine over a partition's segments.

Replay (workq §2.5, one pass per partition for all its queues, clock injected):
add/schedule records whose expiration (segment.expires_at_ns) is before now are
skipped, but for an add marked held (segment.held_past_ttl: an expired item's move); complete/fail/delete/expire/start-attempt on an absent or finished job
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
"""
from __future__ import annotations

import gc
import logging
import os
import uuid
from dataclasses import dataclass
from operator import attrgetter
from typing import Callable

from lanner.storage.cmdlog.segment import (ADD, COMPLETE, DELETE, EXPIRE, FAIL, HEADER, HEADER_SIZE,
                                           MAX_TTL_MS, NO_EXPIRY_MAX_FAILS, REPLAY, SCHEDULE, START_ATTEMPT,
                                           TIMEOUT_ATTEMPT, TORN, ZERO_TIME_NS, CmdlogError, JobCommand,
                                           SegmentFile, check_header, decoded_records, list_segments,
                                           held_past_ttl, valid_record_after)

log = logging.getLogger(__name__)

# workq job states (inspect's numbers), plus how a finished job left
NEW, COMPLETED, FAILED, PENDING, LEASED = 0, 1, 2, 3, 4
DELETED, EXPIRED = 5, 6
STATE_NAMES = {NEW: "new", COMPLETED: "completed", FAILED: "failed", PENDING: "pending",
               LEASED: "leased", DELETED: "deleted", EXPIRED: "expired"}

_MS = 1_000_000
_ORDER = attrgetter("order")


def job_uuid(jid: bytes) -> str:
    return str(uuid.UUID(bytes=jid)) if len(jid) == 16 else jid.hex()


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
                if self.now_ns > exp and not held_past_ttl(cmd):
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
                records = decoded_records(buf, path, keep_payload)
                try:
                    for off, _, _, _, cmd in records:
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
                    records.close()
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
    if offset < HEADER_SIZE:
        log.warning("%s: the newest segment ends inside its header (%d of %d bytes, a crash while "
                    "it was created): a bare header written", path, size, HEADER_SIZE)
    else:
        log.warning("%s: offset %d: torn record at the end of the newest segment: truncated %d bytes",
                    path, offset, size - offset)
