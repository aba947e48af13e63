"""`lanner spark stats|dump` through the `lanner` command's dispatcher (in this process,
so the jobs reuse the tests' SparkSession instead of starting a second JVM)."""
from __future__ import annotations

import base64
import glob
import json
import os

import pytest

pytest.importorskip("pyspark")

from lanner.cli import main                                       # noqa: E402
from lanner.clock import FakeClock                                # noqa: E402
from lanner.config import QueueConfig                             # noqa: E402
from lanner.queues.queue import PersistentQueue                   # noqa: E402
from lanner.storage.cmdlog.cmdlog import PartitionLog            # noqa: E402

from .journals import T0, close, open_queue                      # noqa: E402


@pytest.fixture(scope="module")
def spool(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("jobs") / "queues")
    clock = FakeClock(T0)
    a = open_queue(root, "alpha", clock)
    for i in range(3):
        a.add(b"a%09d" % i)                      # 10 bytes each
        clock.advance(1000)
    close(a)
    b = open_queue(root, "beta", clock)
    b.add(b"bb")
    b.add(b"gone", expiry_ms=clock.now_ms() + 1)
    close(b)
    plog = PartitionLog(os.path.join(root, "cmdlog", "3"), clock)
    c = PersistentQueue("gamma.jobs", QueueConfig(storage="cmdlog"), plog.storage_for("gamma.jobs"), clock)
    c.replay()
    for i in range(4):
        c.add(b"c%d" % i)
    plog.close()
    return root, T0 + 60_000


def test_stats(spark, spool, capsys):
    root, now = spool
    assert main(["spark", "stats", root, "--now", str(now)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["queue", "items", "bytes", "oldest_age_s"]
    assert [ln.split() for ln in lines[1:]] == [["alpha", "3", "30", "60.000"],
                                                ["beta", "1", "2", "57.000"],
                                                ["gamma.jobs", "4", "8", "57.000"]]
    assert main(["spark", "stats", root, "--now", str(now), "--queues", "beta"]) == 0
    assert [ln.split()[0] for ln in capsys.readouterr().out.splitlines()[1:]] == ["beta"]


def test_dump_json_and_parquet(spark, spool, tmp_path, capsys):
    root, now = spool
    out = str(tmp_path / "dump")
    assert main(["spark", "dump", root, "--out", out, "--format", "json", "--now", str(now)]) == 0
    assert "wrote 8 items of 3 queues" in capsys.readouterr().out
    rows = []
    for f in glob.glob(os.path.join(out, "part-*.json")):
        with open(f) as fh:
            rows.extend(json.loads(line) for line in fh)
    got = sorted((r["storage"], r["queue"], r["position"], base64.b64decode(r["data"])) for r in rows)
    assert got == [("cmdlog", "gamma.jobs", i, b"c%d" % i) for i in range(4)] + \
        [("journal", "alpha", i, b"a%09d" % i) for i in range(3)] + [("journal", "beta", 0, b"bb")]
    assert main(["spark", "dump", root, "--out", out, "--now", str(now)]) == 1      # exists
    assert "exists" in capsys.readouterr().err
    assert main(["spark", "dump", root, "--out", out, "--overwrite", "--queues", "alpha"]) == 0
    back = spark.read.parquet(out).collect()
    assert sorted(bytes(r.data) for r in back) == [b"a%09d" % i for i in range(3)]


def test_usage_and_missing_path(capsys, tmp_path):
    assert main(["spark"]) == 0
    assert "lanner spark dump" in capsys.readouterr().out
    assert main(["spark", "stats", str(tmp_path / "nope")]) == 1
    assert "no such file" in capsys.readouterr().err
