"""Issue 4 rechecked: `lanner cmdlog check|dump` show their progress on a terminal (a byte
counter on stderr), and never when stderr is a file or a pipe, where stdout stays exactly the
records; the cleaner's rewrite takes memory for the live jobs, not for the log."""
from __future__ import annotations

import os
import subprocess
import sys
import tracemalloc

import pytest

from lanner.clock import FakeClock
from lanner.queues.item import QItem
from lanner.storage.cmdlog import segment as sg
from lanner.storage.cmdlog.partition import PartitionLog
from lanner.storage.cmdlog.rewrite import rewrite_segments
from lanner.storage.cmdlog.segment import IdCommand
from tests.cmdlog.test_cmdlog_rewrite import jid, job, write_log
from tests.terminal import run_on_a_terminal


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    """A Lanner-written log of a few segments: 2,000 adds of 1 KiB."""
    clock = FakeClock(1_800_000_000_123)
    plog = PartitionLog(str(tmp_path_factory.mktemp("cmdlog") / "p"), clock, segment_size=1 << 20)
    st = plog.storage_for("q")
    for _ in range(2000):
        st.record_add(QItem(clock.now_ms(), 0, b"x" * 1024))
    plog.close()
    return plog.dir


@pytest.mark.parametrize("args", [["dump"], ["dump", "--json"], ["check"]])
def test_progress_on_a_terminal_only(logdir, args):
    code, out, term = run_on_a_terminal(["cmdlog", *args, logdir])
    assert code == 0
    assert b"%|" in term and b"B/s" in term, term[:300]
    r = subprocess.run([sys.executable, "-m", "lanner.cli", "cmdlog", *args, logdir],
                       capture_output=True, timeout=60)
    assert r.returncode == 0 and r.stderr == b""
    assert r.stdout == out
    if args[0] == "dump":
        assert len(out.splitlines()) == 2000


def finished_log(d: str, clock, finished: int) -> None:
    """`finished` deleted jobs, then one live job, in 32 KiB segments."""
    cmds = []
    for i in range(finished):
        cmds += [job(i, created_ms=clock.now_ms(), payload=b"x" * 100), IdCommand(sg.DELETE, jid(i))]
    cmds.append(job(finished, created_ms=clock.now_ms()))
    write_log(d, clock, cmds, segment_size=32 << 10)


def test_a_rewrites_memory_does_not_grow_with_the_log(tmp_path):
    """Issue 4: the cleaner's rewrite runs "with memory bounded independently of the log's
    size": a log four times longer, with the same live jobs, takes no more heap (tracemalloc
    peak, the segments themselves are mapped), and the rewrite leaves only the live job's
    records in closed segments."""
    clock = FakeClock(1_800_000_000_000)
    peaks = []
    for n in (1000, 4000):
        d = str(tmp_path / str(n))
        finished_log(d, clock, n)
        tracemalloc.start()
        try:
            stats = rewrite_segments(d, clock)
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
        assert stats.records_dropped > 1.8 * n and stats.live_jobs == 1, stats
    assert peaks[1] < 256 << 10 and peaks[1] <= peaks[0] + (32 << 10), peaks


def test_a_rewrite_goes_through_rw_fsync_rename_and_a_directory_fsync(tmp_path, monkeypatch):
    """Issue 4's order of a cleaner rewrite, seen at the system calls: a mixed segment's live
    records go to `S.rw`, which is fsynced before it is renamed over `S`, and the directory is
    fsynced after the rename; a segment with nothing live is unlinked, then the directory is
    fsynced; the active segment is never opened for writing."""
    clock = FakeClock(1_800_000_000_000)
    now = clock.now_ms()
    d = str(tmp_path / "p")
    write_log(d, clock, [job(1, created_ms=now), job(2, created_ms=now)])            # 1: mixed
    write_log(d, clock, [IdCommand(sg.DELETE, jid(2)), job(3, created_ms=now),        # 2: all finished
                         IdCommand(sg.DELETE, jid(3)), job(4, created_ms=now)], segment_size=9)
    names = [n for _s, n in sg.list_segments(d)]
    assert len(names) == 5                 # 000000001 (1, 2), then one record per segment
    events = []
    real_fsync, real_replace, real_unlink, real_open = os.fsync, os.replace, os.unlink, os.open

    def path_of(fd: int) -> str:
        return os.path.relpath(os.readlink(f"/proc/self/fd/{fd}"), d)
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("fsync", path_of(fd))), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(("rename", os.path.relpath(a, d),
                                                                    os.path.relpath(b, d))), real_replace(a, b))[1])
    monkeypatch.setattr(os, "unlink", lambda p: (events.append(("unlink", os.path.relpath(p, d))), real_unlink(p))[1])

    def spy_open(p, flags, *rest):
        if flags & (os.O_WRONLY | os.O_RDWR):
            events.append(("write", os.path.relpath(p, d)))
        return real_open(p, flags, *rest)
    monkeypatch.setattr(os, "open", spy_open)
    stats = rewrite_segments(d, clock)
    assert (stats.rewritten, stats.deleted) == (1, 3), stats
    first, active = names[0], names[-1]
    assert events[events.index(("write", first + ".rw")):events.index(("rename", first + ".rw", first)) + 2] == [
        ("write", first + ".rw"), ("fsync", first + ".rw"), ("rename", first + ".rw", first), ("fsync", ".")]
    for gone in names[1:4]:
        i = events.index(("unlink", gone))
        assert events[i + 1] == ("fsync", "."), events
    assert ("write", active) not in events and not any(e[-1] == active for e in events), events
