"""The cleaner's segment rewrite: drop the records of finished jobs from closed
segments, as workq's cleaner does (spec §3.3), without changing what replay
rebuilds.

One pass, holding `read.lock` exclusively (the owner's start-up replay takes it
shared, so the two never overlap; the owner's appends take no lock, and this
pass never touches the active segment):

1. Remove stale `NNNNNNNNN.log.rw` files left by an interrupted pass.
2. List the segments once.  The highest is the active one (the owner may be
   appending to it); the others are closed and never change under us.
3. Scan every segment with the replay state machine (cmdlog.Replayer, job
   payloads not kept), the active one only up to its last whole record.  What
   is left in `Replayer.jobs` is the live set: jobs neither completed, failed,
   deleted, expired, failed by max-attempts nor past their TTL at `now`.
   Memory is proportional to the live jobs, not to the log.  This scan
   verifies every CRC; the later reads of the (unchanging) closed segments
   only frame records.
4. For each closed segment: if every record belongs to a live job, leave it;
   if none does (or it holds no record), delete it and fsync the directory;
   otherwise copy the records of live jobs, byte for byte, into `S.rw`, fsync
   it, rename it over `S` and fsync the directory.

Why replay is unchanged (for any replay at or after `now`): a live job keeps
every record.  A job outside the live set is absent after the whole prefix of
the log we scanned; dropping its records from the closed segments leaves only
its records in the active segment and after, and replaying those from "absent"
ends in the same state as replaying them after its dropped records did (an add
that would be a duplicate there makes the original log fail replay anyway).
Relative order of the kept records, which decides queue order and xids, is
unchanged.  Expired adds stay expired at any later `now`.

workq's "average expiration" skip heuristic is not implemented: a segment with
nothing to drop costs one read and no write.
"""
from __future__ import annotations

import fcntl
import logging
import os
from dataclasses import dataclass
from typing import Callable

from lanner.storage.cmdlog.partition import READ_LOCK, flock_path
from lanner.storage.cmdlog.replay import Replayer, replay_directory
from lanner.storage.cmdlog.segment import (HEADER, LOCKED, CmdlogError, SegmentFile, check_header, fsync_dir, list_segments,
                      record_spans, segment_seq)

log = logging.getLogger(__name__)

_CHUNK = 1 << 20


@dataclass(slots=True)
class RewriteStats:
    segments: int = 0            # segments listed, the active one included
    rewritten: int = 0
    deleted: int = 0
    untouched: int = 0
    records_scanned: int = 0     # records of closed segments
    records_dropped: int = 0
    bytes_before: int = 0        # total size of the closed segments before the pass
    bytes_after: int = 0         # ... and after
    live_jobs: int = 0
    stale_rw_removed: int = 0
    skipped: bool = False        # the lock was busy and wait=False


def rewrite_segments(directory: str, clock, progress: Callable[[int], None] | None = None,
                     wait: bool = True) -> RewriteStats:
    """One cleaning pass over `directory` (see the module docstring).
    `progress(n)` is called with byte counts as segments are read and written.
    With `wait=False` a busy read.lock returns at once with `skipped` set."""
    stats = RewriteStats()
    mode = fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB
    try:
        rfd = flock_path(os.path.join(directory, READ_LOCK), mode)
    except CmdlogError as e:
        if not wait and e.kind == LOCKED:
            stats.skipped = True
            return stats
        raise
    try:
        stats.stale_rw_removed = _remove_stale_rw(directory)
        segs = list_segments(directory)
        stats.segments = len(segs)
        if len(segs) < 2:
            return stats
        replayer = Replayer(clock.now_ms() * 1_000_000)
        replay_directory(directory, replayer, keep_payload=False, active_tolerant=True,
                         segments=segs, progress=progress)
        live = replayer.jobs
        stats.live_jobs = len(live)
        for _seq, name in segs[:-1]:
            _clean_segment(os.path.join(directory, name), live, stats, progress)
        stats.stale_rw_removed += _remove_stale_rw(directory)
    finally:
        os.close(rfd)
    log.info("%s: cleaned %d closed segments: %d rewritten, %d deleted, %d of %d records dropped, "
             "%d -> %d bytes", directory, stats.segments - 1, stats.rewritten, stats.deleted,
             stats.records_dropped, stats.records_scanned, stats.bytes_before, stats.bytes_after)
    return stats


def _remove_stale_rw(directory: str) -> int:
    n = 0
    for name in os.listdir(directory):
        if name.endswith(".rw") and segment_seq(name[:-3]) is not None:
            os.unlink(os.path.join(directory, name))
            n += 1
    return n


def _clean_segment(path: str, live: dict, stats: RewriteStats, progress) -> None:
    with SegmentFile(path) as seg:
        buf = seg.buf
        size = len(buf)
        check_header(buf, path)
        kept = dropped = 0
        for _off, ps, _pe, _end in record_spans(buf, path, verify=False):
            if buf[ps + 1:ps + 17] in live:
                kept += 1
            else:
                dropped += 1
        stats.records_scanned += kept + dropped
        stats.records_dropped += dropped
        stats.bytes_before += size
        if kept and not dropped:
            stats.untouched += 1
            stats.bytes_after += size
            if progress is not None:
                progress(size)
            return
        if kept:
            written = _write_rw(path, buf, live)
    if not kept:
        os.unlink(path)
        fsync_dir(os.path.dirname(path))
        stats.deleted += 1
    else:
        os.replace(path + ".rw", path)
        fsync_dir(os.path.dirname(path))
        stats.rewritten += 1
        stats.bytes_after += written
    if progress is not None:
        progress(size)


def _write_rw(path: str, buf, live: dict) -> int:
    """Copy the header and the records of live jobs into path.rw, fsynced; its size."""
    rw = path + ".rw"
    fd = os.open(rw, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        out = bytearray(HEADER)
        total = 0
        run_start = run_end = -1
        with memoryview(buf) as mv:
            for off, ps, _pe, end in record_spans(buf, path, verify=False):
                if buf[ps + 1:ps + 17] not in live:
                    continue
                if off == run_end:
                    run_end = end
                    continue
                if run_end > run_start:
                    out += mv[run_start:run_end]
                run_start, run_end = off, end
                if len(out) >= _CHUNK:
                    total += _write_out(fd, out)
            if run_end > run_start:
                out += mv[run_start:run_end]
        total += _write_out(fd, out)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(rw)
        raise
    os.close(fd)
    return total


def _write_out(fd: int, out: bytearray) -> int:
    n = len(out)
    with memoryview(out) as mv:
        done = 0
        while done < n:
            done += os.write(fd, mv[done:])
    out.clear()
    return n

