"""lanner-cmdlog: workq's own logs (the fixtures written by a real workq-server), Lanner's
partition logs against the server's replay, and damaged records as rows."""
from __future__ import annotations

import json
import os
import shutil

import pytest

pytest.importorskip("pyspark")

from lanner.clock import FakeClock                                # noqa: E402
from lanner.config import QueueConfig                             # noqa: E402
from lanner.queues.queue import PersistentQueue                   # noqa: E402
from lanner.storage.cmdlog.cmdlog import PartitionLog            # noqa: E402

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "fixtures", "workq")
FIXTURES = os.environ.get("LANNER_WORKQ_FIXTURES", os.path.abspath(FIXTURES))
REPLAY_AT = "2026-11-21T13:10:32Z"          # the time the fixtures' expected replay was taken
T0 = 1_800_000_000_000

needs_fixtures = pytest.mark.skipif(not os.path.isdir(FIXTURES), reason=f"no workq fixtures at {FIXTURES}")


def _fixture(tmp_path, name: str) -> str:
    d = str(tmp_path / name)
    shutil.copytree(os.path.join(FIXTURES, name), d)
    return d


def _expected(name: str) -> dict:
    with open(os.path.join(FIXTURES, "expected", f"{name}.json")) as f:
        return json.load(f)


@needs_fixtures
def test_workq_fixture_items(spark, tmp_path):
    d = _fixture(tmp_path, "a-all-commands")
    rows = spark.read.format("lanner-cmdlog").option("now", REPLAY_AT).load(d).collect()
    got = sorted((r.queue, r.position, r.id[-3:], bytes(r.data), r.priority, r.state) for r in rows)
    assert got == [("report", 0, "0b1", b"future", 2147483647, "scheduled"),
                   ("report", 1, "0b3", b"keep", -2147483648, "scheduled"),
                   ("slow2", 0, "0d2", b"u", 0, "pending")]
    assert all(r.corrupt is False and r.error is None and r.spool == d for r in rows)
    d2 = [r for r in rows if r.id.endswith("0d2")][0]
    assert (d2.expiry - d2.add_time).total_seconds() == 2_592_000        # created + 30 days
    # after the 30-day jobs ran out only the scheduled ones are left
    later = spark.read.format("lanner-cmdlog").option("now", "2027-01-01T00:00:00Z").load(d).collect()
    assert sorted(r.id[-3:] for r in later) == ["0b1", "0b3"]


@needs_fixtures
def test_workq_fixture_records_and_rotation(spark, tmp_path):
    for name in ("a-all-commands", "b-rotation"):
        d = _fixture(tmp_path, name)
        exp = _expected(name)["records"]
        df = spark.read.format("lanner-cmdlog").option("mode", "records").load(d)
        assert df.rdd.getNumPartitions() == len(_expected(name)["segments_in_order"])
        rows = sorted(df.collect(), key=lambda r: (r.segment, r.offset))
        assert len(rows) == len(exp)
        for r, e in zip(rows, exp):
            c = e["command"]
            assert (r.segment, r.offset, r.command, r.id) == (e["segment"], e["offset"], c["cmd"], c["id"])
            assert r.time.timestamp() == pytest.approx(e["time_unix_sec"] + e["time_nsec"] / 1e9, abs=1e-6)
            assert r.corrupt is False
            if "name" in c:
                assert (r.queue, r.ttr, r.ttl, r.priority, r.max_attempts, r.max_fails) == \
                    (c["name"], c["ttr_ms"], c["ttl_ms"], c["priority"], c["max_attempts"], c["max_fails"])
                assert bytes(r.data).hex() == c["payload"]["hex"]
                assert (r.scheduled is None) == c["time"].startswith("ZERO")
            if "result" in c:
                assert bytes(r.result).hex() == c["result"]["hex"]
    items = spark.read.format("lanner-cmdlog").option("now", REPLAY_AT).load(d).collect()
    assert sorted((r.position, r.id[-3:], r.state) for r in items) == \
        [(0, "103", "new"), (1, "104", "new"), (2, "105", "scheduled")]


@needs_fixtures
def test_a_crc_failure_is_a_row_not_a_failed_job(spark, tmp_path):
    d = _fixture(tmp_path, "a-all-commands")
    seg = os.path.join(d, "000000001.log")
    with open(seg, "r+b") as f:                  # record 5 (complete a1 "done"), inside its payload
        f.seek(321 + 30)
        b = f.read(1)
        f.seek(321 + 30)
        f.write(bytes((b[0] ^ 0xFF,)))
    recs = spark.read.format("lanner-cmdlog").option("mode", "records").load(d).collect()
    bad = [r for r in recs if r.corrupt]
    assert len(bad) == 1 and bad[0].offset == 321 and "crc mismatch" in bad[0].error
    assert len(recs) == 21                       # every other record still decodes
    items = spark.read.format("lanner-cmdlog").option("now", REPLAY_AT).load(d).collect()
    (err,) = [r for r in items if r.corrupt]
    assert "000000001.log: offset 321" in err.error and err.spool == d
    # replay stopped there, as workq's does: a1 (leased before the break) is live, a2 not yet leased
    assert sorted((r.queue, r.id[-3:], r.state) for r in items if not r.corrupt) == \
        [("email.send", "0a3", "new"), ("ping", "0a1", "leased"), ("ping", "0a2", "new")]


def _lanner_log(root: str, clock) -> str:
    """A Lanner partition log with rotation, open reads and expiring items."""
    d = os.path.join(root, "cmdlog", "7")
    plog = PartitionLog(d, clock, segment_size=400)
    queues = {}
    for name in ("mail", "jobs.hi"):
        q = PersistentQueue(name, QueueConfig(storage="cmdlog"), plog.storage_for(name), clock)
        q.replay()
        queues[name] = q
    for i in range(30):
        for name, q in queues.items():
            q.add(b"%s-%d" % (name.encode(), i), expiry_ms=clock.now_ms() + 500 if i % 6 == 5 else None)
        clock.advance(10)
        if i % 3 == 2:
            item = queues["mail"].remove(transactional=True)
            if i % 2:
                queues["mail"].confirm_remove(item.xid)
            queues["jobs.hi"].remove()
    queues["jobs.hi"].remove(transactional=True)          # open at the end
    plog.close()
    clock.advance(1_000)
    return d


def _server_drain(d: str, name: str, now_ms: int, tmp: str) -> list[tuple]:
    copy = os.path.join(tmp, "oracle-" + name.replace(".", "_"))
    shutil.copytree(d, copy)
    clock = FakeClock(now_ms)
    plog = PartitionLog(copy, clock)
    q = PersistentQueue(name, QueueConfig(storage="cmdlog"), plog.storage_for(name), clock)
    q.replay()
    out = []
    while (item := q.remove()) is not None:
        out.append((bytes(item.data), item.add_time, item.expiry))
    plog.close()
    return out


def test_lanner_partition_logs_match_the_servers_replay(spark, tmp_path):
    clock = FakeClock(T0)
    root = str(tmp_path / "queues")
    d = _lanner_log(root, clock)
    assert len([n for n in os.listdir(d) if n.endswith(".log")]) > 3         # rotated
    now = clock.now_ms()
    df = spark.read.format("lanner-cmdlog").option("now", str(now)).load(root)    # found below queue_path
    rows = df.selectExpr("queue", "position", "data", "unix_millis(add_time) AS add_ms",
                         "coalesce(unix_millis(expiry), 0) AS exp_ms", "spool").collect()
    assert {r.spool for r in rows} == {d}
    for name in ("mail", "jobs.hi"):
        got = [(bytes(r.data), r.add_ms, r.exp_ms) for r in sorted(rows, key=lambda r: r.position)
               if r.queue == name]
        assert got == _server_drain(d, name, now, str(tmp_path)), name
    only = spark.read.format("lanner-cmdlog").option("now", str(now)).option("queues", "mail") \
        .load(os.path.join(root, "cmdlog")).collect()
    assert {r.queue for r in only} == {"mail"}
