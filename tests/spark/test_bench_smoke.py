"""perf/spark_bench.py on a tiny spool and stream, so the figures' code cannot rot."""
import pytest

pytest.importorskip("pyspark")

from lanner.perf import spark_bench  # noqa: E402


def test_bench_runs_small(spark, tmp_path):
    spool = str(tmp_path / "spool")
    nbytes = spark_bench.build_spool(spool, 2, 2, 512)
    assert nbytes > 2_000_000
    r = spark_bench.bench_scan(spark, spool, nbytes, rounds=1)
    adds = 2 * 2**20 // 2 // (512 + 21)             # per queue; every tenth is read and confirmed
    assert r["items"]["rows"] == 2 * (adds - adds // 10)
    assert r["records"]["rows"] == 2 * (adds + 2 * (adds // 10))
    s = spark_bench.bench_stream(spark, 500, 50, 200, str(tmp_path), warmup=0)
    assert s["left_items_open"] == (0, 0)
    assert sum(s["batches"]) == 500 and max(s["batches"]) <= 200
