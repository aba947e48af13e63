"""workq command logs as Spark input, without pyspark: planning and reading.

A segment directory is any directory holding `NNNNNNNNN.log` files (workq's
naming, `segment.segment_seq`): Lanner's `queue_path/cmdlog/<partition>/` or
workq's own `-cmdlog-path`.  Planning finds them below the given paths and
records each segment's size and inode.  Framing, CRC, command decoding and
replay are the engine's (`segment.record_spans`, `decode_command`,
`cmdlog.Replayer`); this module only decides what a damaged log becomes:

* records mode: a record that fails its CRC, will not decode, or a framing
  break becomes one row with corrupt = true and the reason; reading goes on
  with the next record (a CRC failure keeps the framing) or at the next chain
  of valid records (`segment.valid_record_after`), as far as there is one.
* items mode: replay stops at the first problem, as workq's does, and the
  live jobs up to there come out plus one corrupt row naming the file and
  offset.  A torn record at the end of the newest segment is what a crash
  leaves and the server truncates: replay just ends there.

A segment the cleaner rewrote after planning (new inode) is read as it now
is: the cleaner keeps every record a live job needs, so items mode is
unaffected (records mode fails the task instead, since offsets moved).  A
segment the cleaner deleted held only records of finished jobs: items mode
skips it.
"""
from __future__ import annotations

import mmap
import os
from dataclasses import dataclass, field

from ._engine import LEASED, PENDING, STATE_NAMES, Replayer, S, job_uuid, name_str


class SegmentChanged(RuntimeError):
    """records mode: a planned segment was rewritten or deleted by the cleaner."""


@dataclass(frozen=True, slots=True)
class SegRef:
    name: str
    size: int
    ino: int


@dataclass(slots=True)
class SegmentDir:
    spool: str
    segments: list[SegRef] = field(default_factory=list)


def find_segment_dirs(paths: list[str]) -> list[SegmentDir]:
    """Every directory at or below the paths that holds workq segments, with
    each segment's size and inode now.  A directory reached twice is read once."""
    seen: dict[str, SegmentDir] = {}
    for p in paths:
        p = os.path.abspath(os.path.expanduser(p))
        if os.path.isfile(p) and S.segment_seq(os.path.basename(p)) is not None:
            roots = [(os.path.dirname(p), [os.path.basename(p)])]
        elif os.path.isdir(p):
            roots = [(d, files) for d, _dirs, files in os.walk(p)]
        else:
            raise FileNotFoundError(f"lanner-cmdlog: no such file or directory: {p}")
        for d, files in roots:
            segs = sorted((S.segment_seq(f), f) for f in files if S.segment_seq(f) is not None)
            if not segs:
                continue
            sd = seen.setdefault(d, SegmentDir(d))
            have = {r.name for r in sd.segments}
            for _seq, f in segs:
                if f in have:
                    continue
                try:
                    st = os.stat(os.path.join(d, f))
                except FileNotFoundError:
                    continue
                sd.segments.append(SegRef(f, st.st_size, st.st_ino))
            sd.segments.sort(key=lambda r: S.segment_seq(r.name))
    return [seen[d] for d in sorted(seen)]


class Mapped:
    """A segment mapped read-only; `buf` and `end` (the bytes to read)."""

    def __init__(self, spool: str, ref: SegRef, strict: bool) -> None:
        self.path = os.path.join(spool, ref.name)
        self._mm = None
        self._f = None
        try:
            self._f = open(self.path, "rb")
        except FileNotFoundError:
            if strict:
                raise SegmentChanged(f"{self.path}: deleted by the cleaner after the query was planned; "
                                     "run the query again") from None
            self.buf, self.end = b"", 0
            self.vanished = True
            return
        self.vanished = False
        st = os.fstat(self._f.fileno())
        if st.st_ino == ref.ino:
            self.end = min(ref.size, st.st_size)
        elif strict:
            self._f.close()
            raise SegmentChanged(f"{self.path}: rewritten by the cleaner after the query was planned; "
                                 "run the query again")
        else:
            self.end = st.st_size
        if self.end:
            self._mm = mmap.mmap(self._f.fileno(), 0, access=mmap.ACCESS_READ)
            self.buf = self._mm
        else:
            self.buf = b""

    def close(self) -> None:
        if self._mm is not None:
            self._mm.close()
            self._mm = None
        if self._f is not None:
            self._f.close()
            self._f = None


def ns_to_us(ns: int | None):
    # lazy: _arrow imports pyarrow, which reading segments without Spark does not need
    from ._arrow import MAX_US, MIN_US
    if ns is None:
        return None
    us = ns // 1000
    return us if MIN_US <= us <= MAX_US else None


# ------------------------------------------------------------------ items mode

def replay_dir(sd: SegmentDir, now_ns: int) -> tuple[Replayer, str | None]:
    """Replay a segment directory; (replayer, error or None).  The error is the
    one-line CmdlogError text of the first problem (replay stopped there)."""
    rp = Replayer(now_ns)
    last = len(sd.segments) - 1
    for i, ref in enumerate(sd.segments):
        m = Mapped(sd.spool, ref, strict=False)
        try:
            if m.vanished:
                continue
            buf, end = m.buf, m.end
            try:
                S.check_header(buf[:S.HEADER_SIZE] if end >= S.HEADER_SIZE else buf[:end], m.path)
            except S.CmdlogError as e:
                if i == last and e.kind == S.TORN:
                    break
                return rp, str(e)
            spans = S.record_spans(buf, m.path, S.HEADER_SIZE, end)
            try:
                for off, ps, pe, _rend in spans:
                    try:
                        cmd = S.decode_command(buf, ps, pe)
                    except ValueError as e:
                        raise S.CmdlogError(m.path, off, str(e), S.CORRUPT) from None
                    rp.apply(cmd, m.path, off)
            except S.CmdlogError as e:
                if i == last and e.kind == S.TORN and S.valid_record_after(buf, e.offset, end) is None:
                    break
                return rp, str(e)
            finally:
                spans.close()
        finally:
            m.close()
    return rp, None


def live_jobs(rp: Replayer):
    """(queue, position, state, job) per live job, in the order the server
    would serve them after a restart: leased jobs roll back to the head in
    lease order, then the ready list, then scheduled jobs by time."""
    for nb, (ready, leased, scheduled) in sorted(rp.queue_jobs().items()):
        q = name_str(nb)
        pos = 0
        for group, fixed in ((leased, "leased"), (ready, None), (scheduled, "scheduled")):
            for job in group:
                state = fixed or ("pending" if job.state == PENDING else STATE_NAMES.get(job.state, "new"))
                yield q, pos, state, job
                pos += 1


# ------------------------------------------------------------------ records mode

def iter_segment_records(spool: str, ref: SegRef, newest: bool):
    """(offset, record_time_ns, command, None) per record, or
    (offset, None, None, reason) per damaged place (module docstring)."""
    m = Mapped(spool, ref, strict=True)
    try:
        buf, end = m.buf, m.end
        try:
            S.check_header(buf[:S.HEADER_SIZE] if end >= S.HEADER_SIZE else buf[:end], m.path)
        except S.CmdlogError as e:
            if not (newest and e.kind == S.TORN):
                yield 0, None, None, e.reason
            return
        pos = S.HEADER_SIZE
        while pos < end:
            spans = S.record_spans(buf, m.path, pos, end)
            try:
                for off, ps, pe, rend in spans:
                    pos = rend
                    try:
                        t = S.decode_time(buf, off)
                        cmd = S.decode_command(buf, ps, pe)
                    except ValueError as e:
                        yield off, None, None, str(e)
                        continue
                    yield off, t, cmd, None
                return
            except S.CmdlogError as e:
                if e.kind == S.TORN and newest and S.valid_record_after(buf, e.offset, end) is None:
                    return                  # the end of a segment being written, or a crash's torn tail
                yield e.offset, None, None, e.reason
                if e.kind == S.BAD_CRC:               # the framing holds: go on after this record
                    skip = S.record_spans(buf, m.path, e.offset, end, verify=False)
                    try:
                        pos = next(skip)[3]
                    finally:
                        skip.close()
                else:
                    nxt = S.valid_record_after(buf, e.offset, end)
                    if nxt is None:
                        return
                    pos = nxt
            finally:
                spans.close()
    finally:
        m.close()


__all__ = ["SegRef", "SegmentDir", "find_segment_dirs", "replay_dir", "live_jobs", "iter_segment_records",
           "ns_to_us", "SegmentChanged", "job_uuid", "LEASED"]
