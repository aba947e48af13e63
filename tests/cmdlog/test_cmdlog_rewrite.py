"""rewrite.py: what the cleaner drops, deletes and leaves alone, its safety
beside a live appender, and the property replay(before) == replay(after)."""
from __future__ import annotations

import fcntl
import os
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from lanner.storage.cmdlog import segment as sg
from lanner.clock import FakeClock
from lanner.storage.cmdlog.partition import PartitionLog
from lanner.storage.cmdlog.replay import Replayer, replay_directory
from lanner.queues.item import QItem
from lanner.storage.cmdlog.rewrite import rewrite_segments
from lanner.storage.cmdlog.segment import CmdlogError, IdCommand, JobCommand, ResultCommand

from . import indep

MS = 1_000_000


def jid(n: int) -> bytes:
    return bytes.fromhex(f"00000000000040008000{n:012x}")


def job(n, name=b"q", ttl=60000, created_ms=0, t=sg.ADD, time_ms=None, prio=0, max_att=0, max_fails=0,
        payload=b"p"):
    return JobCommand(t, jid(n), name, 60000, ttl, prio, max_att, max_fails, payload,
                      sg.ZERO_TIME_NS if time_ms is None else time_ms * MS, created_ms * MS)


def write_log(d: str, clock, cmds, segment_size=10**6) -> None:
    plog = PartitionLog(d, clock, segment_size=segment_size)
    for c in cmds:
        plog.append_command(c)
    plog.close()


def snapshot(d: str, now_ns: int):
    r = Replayer(now_ns)
    try:
        replay_directory(d, r)
    except CmdlogError as e:
        return ("error", e.kind)
    out = {}
    for name, (ready, leased, sched) in r.queue_jobs().items():
        out[name] = ([(j.cmd.id, j.state, j.attempts) for j in ready],
                     [(j.cmd.id, j.attempts) for j in leased],
                     [j.cmd.id for j in sched])
    return out


def seg_bytes(d: str) -> dict[str, bytes]:
    return {n: open(os.path.join(d, n), "rb").read() for _s, n in sg.list_segments(d)}


def test_drops_finished_jobs_deletes_empty_segments_and_spares_the_active_one(tmp_path, clock):
    now = clock.now_ms()
    d = str(tmp_path / "p")
    cmds = [job(1, created_ms=now), job(2, created_ms=now), job(3, created_ms=now),     # segment 1
            job(4, created_ms=now), job(5, created_ms=now, ttl=10),                     # segment 2
            ResultCommand(sg.COMPLETE, jid(1), b"r"), IdCommand(sg.DELETE, jid(2)),
            IdCommand(sg.START_ATTEMPT, jid(3)), ResultCommand(sg.FAIL, jid(3), b"no"),
            IdCommand(sg.START_ATTEMPT, jid(4)),
            job(6, created_ms=now), IdCommand(sg.EXPIRE, jid(6)),                         # all finished
            job(7, created_ms=now), IdCommand(sg.DELETE, jid(4))]                          # active: delete 4
    write_log(d, clock, cmds, segment_size=9)              # one record per segment
    before = seg_bytes(d)
    names = list(before)
    assert len(names) == len(cmds) == 14
    clock.advance(11)                                       # job 5 is now past its TTL
    snap = snapshot(d, clock.now_ms() * MS)
    open(os.path.join(d, names[0] + ".rw"), "wb").write(b"stale")
    stats = rewrite_segments(d, clock)
    after = seg_bytes(d)
    assert snapshot(d, clock.now_ms() * MS) == snap == {b"q": ([(jid(7), 0, 0)], [], [])}
    assert list(after) == [names[12], names[13]]            # job 7's add, and the active segment
    assert after == {n: before[n] for n in after}            # kept bytes are identical
    assert not any(n.endswith(".rw") for n in os.listdir(d)) and stats.stale_rw_removed == 1
    assert (stats.deleted, stats.rewritten, stats.untouched, stats.live_jobs) == (12, 0, 1, 1)
    assert (stats.records_scanned, stats.records_dropped) == (13, 12)


def test_mixed_segment_is_rewritten_with_the_live_records_only(tmp_path, clock):
    d = str(tmp_path / "p")
    now = clock.now_ms()
    cmds = [job(1, created_ms=now), job(2, created_ms=now), job(3, created_ms=now), job(4, created_ms=now),
            IdCommand(sg.START_ATTEMPT, jid(3)), IdCommand(sg.DELETE, jid(2))]
    write_log(d, clock, cmds[:4])
    write_log(d, clock, cmds[4:], segment_size=9)           # rotates: the deletes go to segment 2
    before = seg_bytes(d)
    first = indep.read_segment(before["000000001.log"])
    stats = rewrite_segments(d, clock)
    after = seg_bytes(d)
    kept = indep.read_segment(after["000000001.log"])
    assert [r["command"]["id"] for r in kept] == [jid(1), jid(3), jid(4)]
    assert after["000000001.log"] == sg.HEADER + b"".join(
        before["000000001.log"][r["offset"]:r["offset"] + 15 + len(r["size_raw"]) + len(r["payload"]) + 4]
        for r in first if r["command"]["id"] != jid(2))
    assert stats.rewritten == 1 and stats.bytes_after < stats.bytes_before
    assert snapshot(d, now * MS) == {b"q": ([(jid(1), 0, 0), (jid(4), 0, 0)], [(jid(3), 1)], [])}


def test_untouched_when_nothing_to_drop_and_header_only_segments_go(tmp_path, clock):
    d = str(tmp_path / "p")
    now = clock.now_ms()
    write_log(d, clock, [job(i, created_ms=now) for i in range(6)], segment_size=200)
    open(os.path.join(d, "000000000.log"), "wb").write(sg.HEADER)
    before = seg_bytes(d)
    stats = rewrite_segments(d, clock)
    after = seg_bytes(d)
    assert "000000000.log" not in after and stats.deleted == 1
    assert {n: b for n, b in before.items() if n != "000000000.log"} == after
    assert stats.rewritten == 0 and stats.untouched == len(after) - 1
    assert rewrite_segments(str(tmp_path / "p"), clock).records_dropped == 0


def test_single_segment_is_never_touched(tmp_path, clock):
    d = str(tmp_path / "p")
    write_log(d, clock, [job(1), IdCommand(sg.DELETE, jid(1))])
    before = seg_bytes(d)
    stats = rewrite_segments(d, clock)
    assert seg_bytes(d) == before and stats.segments == 1 and stats.records_scanned == 0


def test_ttl_passed_and_max_attempts_failures_count_as_finished(tmp_path, clock):
    d = str(tmp_path / "p")
    now = clock.now_ms()
    cmds = [job(1, created_ms=now, ttl=5), job(2, created_ms=now, max_att=1),
            IdCommand(sg.START_ATTEMPT, jid(2)), IdCommand(sg.TIMEOUT_ATTEMPT, jid(2)),
            job(3, created_ms=now - 40 * 86_400_000, ttl=sg.MAX_TTL_MS, max_fails=255),   # Lanner: never expires
            job(4, created_ms=now)]
    write_log(d, clock, cmds, segment_size=9)               # one record per segment
    clock.advance(6)
    stats = rewrite_segments(d, clock)
    remaining = [r["command"]["id"] for p in seg_bytes(d).values() for r in indep.read_segment(p)]
    assert remaining == [jid(3), jid(4)] and stats.live_jobs == 2


def test_rewrite_beside_a_live_appender(tmp_path, clock):
    plog = PartitionLog(str(tmp_path / "p"), clock, segment_size=300)
    st = plog.storage_for("q")
    items = []
    for i in range(30):
        it = QItem(clock.now_ms(), 0, b"%03d" % i)
        st.record_add(it)
        items.append(it)
        if i % 3 == 0:
            plog.flush()
    for it in items[:20]:
        st.record_remove(it)
    plog.flush()
    st.record_add(QItem(clock.now_ms(), 0, b"buffered"))    # still in the owner's buffer
    stats = rewrite_segments(plog.dir, clock)
    assert stats.deleted + stats.rewritten > 0
    for i in range(5):
        st.record_add(QItem(clock.now_ms(), 0, b"late%d" % i))
    rewrite_segments(plog.dir, clock)
    plog.close()
    plog = PartitionLog(plog.dir, clock, segment_size=300)
    assert [i.data for i in plog.storage_for("q").replay(None).items] == (
        [b"%03d" % i for i in range(20, 30)] + [b"buffered"] + [b"late%d" % i for i in range(5)])
    plog.close()


def test_busy_lock_and_corruption(tmp_path, clock):
    d = str(tmp_path / "p")
    write_log(d, clock, [job(i) for i in range(6)], segment_size=200)
    fd = os.open(os.path.join(d, "read.lock"), os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_SH)
    assert rewrite_segments(d, clock, wait=False).skipped
    os.close(fd)
    first = os.path.join(d, "000000001.log")
    data = bytearray(open(first, "rb").read())
    data[20] ^= 1
    open(first, "wb").write(bytes(data))
    before = seg_bytes(d)
    with pytest.raises(CmdlogError) as e:
        rewrite_segments(d, clock)
    assert e.value.path == first and e.value.kind == sg.BAD_CRC
    assert seg_bytes(d) == before


def test_progress_reports_bytes(tmp_path, clock):
    d = str(tmp_path / "p")
    write_log(d, clock, [job(i) for i in range(6)] + [IdCommand(sg.DELETE, jid(0))], segment_size=200)
    seen = []
    rewrite_segments(d, clock, progress=seen.append)
    assert sum(seen) > 0 and all(n > 0 for n in seen)


# ------------------------------------------------------------------ property

NAMES = [b"a", b"b.c", b"d+e"]
KINDS = ["add", "add", "add", "schedule", "complete", "fail", "delete", "expire", "start", "start",
         "timeout", "timeout"]


def gen_commands(data, base_ms: int, count: int, used: list[int], maybe_live: set[int], nxt: list[int]) -> list:
    """Random workq commands that never re-add a job that may still be live
    (replay would refuse the log, as workq does)."""
    cmds = []
    for _ in range(count):
        kind = data.draw(st.sampled_from(KINDS))
        if kind in ("add", "schedule"):
            free = [n for n in used if n not in maybe_live]
            if free and data.draw(st.booleans()):
                n = data.draw(st.sampled_from(free))
            else:
                n = nxt[0]
                nxt[0] += 1
                used.append(n)
            maybe_live.add(n)
            created = base_ms + data.draw(st.integers(-70_000, 0))
            ttl = data.draw(st.sampled_from([1, 500, 5_000, 60_000, sg.MAX_TTL_MS]))
            time_ms = created + data.draw(st.integers(-2_000, 30_000)) if kind == "schedule" else None
            cmds.append(job(n, name=data.draw(st.sampled_from(NAMES)), ttl=ttl, created_ms=created,
                            t=sg.SCHEDULE if kind == "schedule" else sg.ADD, time_ms=time_ms,
                            prio=data.draw(st.sampled_from([0, 0, 3, -2])),
                            max_att=data.draw(st.sampled_from([0, 0, 1, 2])),
                            max_fails=data.draw(st.sampled_from([0, 255])), payload=b"x" * (n % 7)))
            continue
        n = data.draw(st.sampled_from(used)) if used and data.draw(st.integers(0, 9)) else 999
        if kind in ("complete", "fail"):
            cmds.append(ResultCommand(sg.COMPLETE if kind == "complete" else sg.FAIL, jid(n), b"r"))
        else:
            t = {"delete": sg.DELETE, "expire": sg.EXPIRE, "start": sg.START_ATTEMPT,
                 "timeout": sg.TIMEOUT_ATTEMPT}[kind]
            cmds.append(IdCommand(t, jid(n)))
        if kind in ("complete", "fail", "delete", "expire"):
            maybe_live.discard(n)
    return cmds


@pytest.fixture
def no_fsync(monkeypatch):
    """Durability is not what this property checks; real fsyncs make it slow."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.data())
def test_replay_is_unchanged_by_rewrite(no_fsync, data):
    base_ms = 1_800_000_000_000
    clock = FakeClock(base_ms)
    ids = ([], set(), [1])
    head = gen_commands(data, base_ms, data.draw(st.integers(1, 45)), *ids)
    tail = gen_commands(data, base_ms, data.draw(st.integers(0, 8)), *ids)
    seg_size = data.draw(st.integers(60, 500))
    with tempfile.TemporaryDirectory() as root:
        orig, cleaned = os.path.join(root, "orig"), os.path.join(root, "cleaned")
        write_log(orig, clock, head, seg_size)
        shutil.copytree(orig, cleaned)
        clock.advance(data.draw(st.integers(0, 40_000)))
        now = clock.now_ms() * MS
        before = snapshot(orig, now)
        assert isinstance(before, dict)
        rewrite_segments(cleaned, clock)
        assert snapshot(cleaned, now) == before
        later = now + data.draw(st.integers(0, 100_000)) * MS
        assert snapshot(cleaned, later) == snapshot(orig, later)
        # keep appending to both, clean again, and compare once more
        for d in (orig, cleaned):
            plog = PartitionLog(d, clock, segment_size=seg_size)
            for c in tail:
                plog.append_command(c)
            plog.close()
        rewrite_segments(cleaned, clock)
        assert snapshot(cleaned, later) == snapshot(orig, later)
