"""Issue 9 rechecked from its text: what the other Spark tests do not show a user.

The jobs run as a user runs them, in processes of their own: the `lanner` console script
(`lanner spark stats|dump`, on `local[*]` unless `--master` is given) and `spark-submit` of
the job file (the master then comes from spark-submit).  Which master a job really ran on is
read from Spark's own event log, switched on through a SPARK_CONF_DIR of the test's.
"""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import tomllib

import pytest

pytest.importorskip("pyspark")

from packaging.requirements import Requirement                # noqa: E402

from lanner.clock import FakeClock                             # noqa: E402
from lanner.perf.servers import free_port                      # noqa: E402

from .journals import T0, close, open_queue                   # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)
JOB_TIMEOUT = 300


def test_spark_extra_pins_pyspark_4_3_and_adds_pyarrow_without_pandas():
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    extra = {Requirement(r).name: Requirement(r) for r in project["optional-dependencies"]["spark"]}
    assert set(extra) == {"pyspark", "pyarrow"}
    pins = extra["pyspark"].specifier
    assert all(v in pins for v in ("4.3.0", "4.3.9")) and not any(v in pins for v in ("4.2.9", "4.4.0"))
    assert not any(Requirement(r).name == "pandas" for r in project["dependencies"])


def _spools(root) -> tuple[str, str]:
    """Two queue_paths: a holds jobs (3 items of 10 bytes) and mail (1), b holds jobs (2)."""
    clock = FakeClock(T0)
    paths = []
    for spool, queues in (("a", {"jobs": 3, "mail": 1}), ("b", {"jobs": 2})):
        d = os.path.join(str(root), spool)
        for name, n in queues.items():
            q = open_queue(d, name, clock)
            for i in range(n):
                q.add(b"%s%07d" % (spool.encode() + name[:2].encode(), i))
            close(q)
        paths.append(d)
    return paths[0], paths[1]


def _conf_dir(tmp_path) -> tuple[dict, str]:
    """(environment, event-log folder): spark-defaults.conf with the event log on, no UI, and
    the driver's ports from this run's range."""
    conf, events = tmp_path / "conf", tmp_path / "events"
    conf.mkdir()
    events.mkdir()
    (conf / "spark-defaults.conf").write_text(
        "spark.eventLog.enabled true\n"
        "spark.eventLog.compress false\n"
        f"spark.eventLog.dir file://{events}\n"
        "spark.ui.enabled false\n"
        f"spark.driver.port {free_port()}\n"
        f"spark.blockManager.port {free_port()}\n"
        "spark.driver.extraJavaOptions -XX:TieredStopAtLevel=1\n")
    env = {**os.environ, "SPARK_CONF_DIR": str(conf), "SPARK_LOCAL_IP": "127.0.0.1",
           "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    return env, str(events)


def _masters(events: str) -> list[str]:
    """spark.master of every application in the event-log folder (Spark 4 rolls each
    application's log into a folder of its own)."""
    found = []
    for path in glob.glob(os.path.join(events, "**", "events_*"), recursive=True):
        with open(path) as f:
            for line in f:
                event = json.loads(line)
                if event.get("Event") == "SparkListenerEnvironmentUpdate":
                    found.append(event["Spark Properties"]["spark.master"])
    return found


def _run(cmd: list[str], env: dict, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, cwd=str(cwd), capture_output=True, text=True, timeout=JOB_TIMEOUT)


def test_lanner_spark_stats_of_several_paths_runs_on_local_star(tmp_path):
    a, b = _spools(tmp_path)
    env, events = _conf_dir(tmp_path)
    done = _run([os.path.join(BIN, "lanner"), "spark", "stats", a, b], env, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["spool", "queue", "items", "bytes", "oldest_age_s"]
    assert [ln.split()[:4] for ln in lines[1:]] == [[a, "jobs", "3", "30"], [a, "mail", "1", "10"],
                                                     [b, "jobs", "2", "20"]]
    assert _masters(events) == ["local[*]"]


def test_lanner_spark_dump_with_master_and_queues(tmp_path):
    a, _ = _spools(tmp_path)
    env, events = _conf_dir(tmp_path)
    out = tmp_path / "dump"
    done = _run([os.path.join(BIN, "lanner"), "spark", "dump", a, "--out", str(out), "--format", "json",
                 "--queues", "jobs", "--master", "local[1]"], env, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "wrote 3 items of 1 queues" in done.stdout
    rows = [json.loads(line) for f in glob.glob(str(out / "part-*.json")) for line in open(f)]
    assert sorted((r["queue"], r["position"]) for r in rows) == [("jobs", 0), ("jobs", 1), ("jobs", 2)]
    assert _masters(events) == ["local[1]"]


def test_spark_submit_of_the_job_file_runs_on_spark_submits_master(tmp_path):
    """README "Spark": the same job submitted with spark-submit runs where spark-submit says."""
    import pyspark
    a, b = _spools(tmp_path)
    env, events = _conf_dir(tmp_path)
    from lanner.spark import jobs
    submit = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-submit")
    done = _run([submit, "--master", "local[1]", jobs.__file__, "stats", a, b], env, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [ln.split()[1:3] for ln in done.stdout.splitlines()[1:]] == [["jobs", "3"], ["mail", "1"], ["jobs", "2"]]
    assert _masters(events) == ["local[1]"]


def test_stream_source_schema_types(spark):
    df = spark.readStream.format("lanner").option("servers", "127.0.0.1:1").option("queue", "q").load()
    assert [(f.name, f.dataType.simpleString()) for f in df.schema.fields] == \
        [("server", "string"), ("queue", "string"), ("data", "binary"), ("fetched_at", "timestamp")]


def test_journal_load_of_a_list_of_files_and_records_pruning(spark, tmp_path):
    a, b = _spools(tmp_path)
    files = [os.path.join(a, "mail"), os.path.join(b, "jobs")]
    rows = spark.read.format("lanner-journal").load(files).collect()
    assert sorted((r.spool, r.queue, bytes(r.data)) for r in rows) == \
        [(a, "mail", b"ama0000000"), (b, "jobs", b"bjo0000000"), (b, "jobs", b"bjo0000001")]
    recs = spark.read.format("lanner-journal").option("mode", "records").option("queues", "mail").load([a, b])
    assert recs.rdd.getNumPartitions() == 1                        # only a/mail was planned
    assert [(r.queue, r.op) for r in recs.collect()] == [("mail", "ADDX")]


def test_cmdlog_items_columns(spark, tmp_path):
    df = spark.read.format("lanner-cmdlog").load(str(tmp_path))
    types = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    assert {k: types.get(k) for k in ("queue", "id", "data", "priority", "add_time", "expiry")} == \
        {"queue": "string", "id": "string", "data": "binary", "priority": "int", "add_time": "timestamp",
         "expiry": "timestamp"}
    assert types["corrupt"] == "boolean"


def test_a_running_server_never_imports_pyspark(tmp_path):
    """Every process of a real `lanner serve` (every listener on, two workers, a request on
    each protocol path a user takes, a /metrics scrape) imports no pyspark, py4j or pyarrow:
    the interpreter reports each import on stderr (PYTHONPROFILEIMPORTTIME)."""
    import urllib.request

    from tests.helpers import recv_until, start_server
    h = start_server(tmp_path, workers=2, thrift=True, admin=True, env={"PYTHONPROFILEIMPORTTIME": "1"})
    try:
        with h.connect() as s:
            s.sendall(b"set q 0 0 2\r\nhi\r\nget q\r\n")
            assert recv_until(s, b"END\r\n") == b"STORED\r\nVALUE q 0 2\r\nhi\r\nEND\r\n"
        with urllib.request.urlopen(f"http://127.0.0.1:{h.admin_port}/metrics", timeout=30) as r:
            assert r.status == 200
    finally:
        assert h.stop() == 0
    imports = [ln.split("|")[-1].strip() for ln in h.log().splitlines() if ln.startswith("import time:")]
    assert "lanner.server.worker" in imports
    assert not [m for m in imports if m.split(".")[0] in ("pyspark", "py4j", "pyarrow")]


def test_cmdlog_rerun_reads_the_planned_bytes_while_the_server_appends(tmp_path):
    """"lanner-cmdlog does the same" as lanner-journal: a task run again reads the segment
    bytes its partition recorded at planning, though the server has appended since."""
    from lanner.config import QueueConfig
    from lanner.queues.queue import PersistentQueue
    from lanner.spark.cmdlog_source import ITEMS_SCHEMA, CmdlogReader
    from lanner.storage.cmdlog.partition import PartitionLog
    clock = FakeClock(T0)
    plog = PartitionLog(str(tmp_path / "queues" / "cmdlog" / "3"), clock)
    q = PersistentQueue("jobs", QueueConfig(storage="cmdlog"), plog.storage_for("jobs"), clock)
    q.replay()
    for i in range(5):
        q.add(b"job%d" % i)
    plog.flush()
    reader = CmdlogReader({"path": str(tmp_path / "queues"), "now": str(T0 + 1000)}, ITEMS_SCHEMA)
    (part,) = reader.partitions()

    def rows():
        return [row for rb in reader.read(part) for row in zip(*(c.to_pylist() for c in rb.columns))]
    first = rows()
    assert [r[2] for r in first] == [b"job%d" % i for i in range(5)]
    q.remove()
    for i in range(5, 9):
        q.add(b"job%d" % i)
    plog.flush()
    assert rows() == first
    plog.close()
