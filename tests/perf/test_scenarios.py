"""Every scenario, at a tiny size, against a real `lanner serve`: it runs, its checks pass and it
writes valid JSON.  Nothing here asserts a speed."""
from __future__ import annotations

import pytest

from tests.helpers import start_server

pytestmark = pytest.mark.integration


def server_args(server) -> list[str]:
    return ["-p", str(server.port), "--server-pid", str(server.pid)]


def assert_ok(rc, data, printed):
    assert data is not None, printed
    failed = {k: v for k, v in data["checks"].items() if not v["ok"]}
    assert rc == 0 and data["ok"] and not failed, (failed, printed)
    assert data["rows"] and all("label" in r for r in data["rows"])
    assert data["machine"]["cpus"] >= 1 and data["target"]["name"]


def test_put_many_with_checked_get_phase(lanner, run_perf):
    rc, data, printed = run_perf("put-many", *server_args(lanner), "-c", "4", "-n", "200", "-b", "64", "-Q", "2",
                                 "-g", "-q", "pm")
    assert_ok(rc, data, printed)
    put, get = data["rows"]
    assert (put["label"], put["ops"], get["label"], get["ops"]) == ("put", 200, "get", 200)
    assert "get: payloads" in data["checks"] and data["settings"]["queues"] == 2
    assert put["p99_us"] >= put["p50_us"] > 0 and put["client_us_op"] > 0
    assert put["server_us_op"] is not None


def test_flood_blocking_pipelined_with_prefill(lanner, run_perf, tmp_path):
    rc, data, printed = run_perf("flood", *server_args(lanner), "-R", "2", "-C", "2", "-n", "300", "-b", "64",
                                 "-r", "4", "-B", "-P", "10", "-q", "fl", "--plot")
    assert_ok(rc, data, printed)
    assert [p.name for p in tmp_path.glob("out*/*/*.png")] == ["latency.png"]
    [row] = data["rows"]
    assert row["hits"] == 300 and row["items_s"] > 0
    assert data["checks"]["flood: payloads"]["ok"]


def test_many_clients_with_hangups(lanner, run_perf):
    rc, data, printed = run_perf("many-clients", *server_args(lanner), "-n", "15", "-s", "0", "-c", "4", "-k", "25",
                                 "-q", "mc")
    assert_ok(rc, data, printed)
    [row] = data["rows"]
    assert row["items"] >= 15 and row["lost"] == 0
    assert data["settings"]["transactions"] is True


def test_packing_cycles_in_strict_order(lanner, run_perf):
    rc, data, printed = run_perf("packing", *server_args(lanner), "-n", "100", "-c", "2", "-t", "0", "--backlog",
                                 "150", "-b", "32", "-x", "-q", "pk")
    assert_ok(rc, data, printed)
    labels = [r["label"] for r in data["rows"]]
    assert labels == ["empty", "backlog", "cycle 1", "cycle 2", "drain"]
    assert all(r["vs_empty"] > 0 for r in data["rows"] if r["label"].startswith("cycle"))


def test_fairness_small_sets_during_flood(lanner, run_perf):
    rc, data, printed = run_perf("fairness", *server_args(lanner), "-s", "300", "-c", "2", "--large-size", "65536",
                                 "--large-concurrency", "1", "-q", "fair")
    assert_ok(rc, data, printed)
    small, large = data["rows"]
    assert small["ops"] == 300 and large["ops"] > 0


def test_memory_grows_and_drains(lanner, run_perf):
    rc, data, printed = run_perf("memory", *server_args(lanner), "--steps", "0,200,500", "-i", "64", "-c", "2",
                                 "-q", "mem", "--settle", "0.1", "--poll", "0.05")
    assert_ok(rc, data, printed)
    assert [(r["phase"], r["items"]) for r in data["rows"]] == \
        [("grow", 0), ("grow", 200), ("grow", 500), ("drain", 200), ("drain", 0), ("settled", 0)]
    assert all(r["pss_mb"] > 0 and r["rss_mb"] >= r["uss_mb"] for r in data["rows"])
    assert "backlog reached" in data["checks"]
    top = data["rows"][2]
    assert top["queue_items"] == 500 and top["mem_items"] == 500       # all in memory: no read-behind
    assert "w " in top["by_role"] and "s " in top["by_role"]           # per role: workers, supervisor
    peak = data["settings"]["polled_peak"]
    assert peak["pss"] >= max(r["pss_mb"] for r in data["rows"]) * 2**20 * 0.5
    assert {p["role"] for p in peak["procs"]} >= {"worker", "supervisor"}


def test_mixed_sweep_with_plots(lanner, run_perf, tmp_path):
    rc, data, printed = run_perf("mixed", *server_args(lanner), "-c", "1,3", "-s", "100", "-g", "100",
                                 "--prefill", "20", "-q", "mx", "--plot")
    assert_ok(rc, data, printed)
    assert [r["conns"] for r in data["rows"]] == [1, 3]
    assert all(r["ops"] == 200 for r in data["rows"])
    assert len(list(tmp_path.glob("out*/*/*.png"))) == 2


def test_leaky_reader_over_thrift(lanner_thrift, run_perf):
    rc, data, printed = run_perf("leaky-reader", "-p", str(lanner_thrift.thrift_port), "-n", "20", "-d", "0.2",
                                 "-t", "2", "--auto-abort-ms", "200", "-q", "leaky")
    assert_ok(rc, data, printed)
    [row] = data["rows"]
    assert row["items"] == 20 and row["missing"] == 0


def test_compare_lanner_with_memcached(run_perf):
    rc, data, printed = run_perf("compare", "--rounds", "1", "mixed", "-c", "2", "-s", "100", "-g", "100",
                                 "--prefill", "10")
    assert_ok(rc, data, printed)
    [row] = data["rows"]
    assert row["label"] == "c=2" and row["a"] > 0 and row["b"] > 0
    assert row["ratio"] == pytest.approx(row["a"] / row["b"], rel=0.01)
    assert data["settings"]["a"]["name"] == "lanner" and data["settings"]["b"]["kind"] == "memcached"


def test_scrape_effect_size_and_stalls(tmp_path, run_perf):
    h = start_server(tmp_path, workers=2, admin=True)
    try:
        rc, data, printed = run_perf("scrape", "-p", str(h.memcache_port), "--server-pid", str(h.proc.pid),
                                     "--admin-port", str(h.admin_port), "--rounds", "1", "--duration", "0.5",
                                     "--queues", "300", "--repeats", "2", "--max-drop", "1000")
        assert_ok(rc, data, printed)
        assert [r["label"] for r in data["rows"]] == ["plain 1", "scrape 1", "/metrics x2"]
        assert data["rows"][1]["scrapes"] > 0 and data["rows"][0]["server_us_op"] is not None
        notes = "\n".join(data["notes"])
        assert "server CPU per request: median" in notes and "/metrics with 300 queues" in notes
        assert "CPU per scrape: " in notes and "admin " in notes.split("CPU per scrape: ")[1]
        for w in (0, 1):            # a client of each worker, its gets timed during and between
            assert f"worker {w}'s client, back-to-back empty gets: during scrapes" in notes
    finally:
        h.stop()
