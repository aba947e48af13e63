"""/metrics (parsed with prometheus_client.parser), /stats.json labels, metrics and
?period=, /stats.txt, /dashboard.json, against a real server with 2 workers and 2 fronts."""
from __future__ import annotations

import http.client
import json
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import recv_until, start_server

pytestmark = pytest.mark.integration


def get(server, path: str) -> tuple[int, dict, bytes]:
    c = http.client.HTTPConnection("127.0.0.1", server.admin_port, timeout=30)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        c.close()


def mc_stats(server) -> dict[str, str]:
    with server.connect() as s:
        s.sendall(b"stats\r\n")
        raw = recv_until(s, b"END\r\n").decode()
    return {ln.split(" ")[1]: ln.split(" ", 2)[2] for ln in raw.split("\r\n") if ln.startswith("STAT ")}


def samples(body: bytes) -> dict[tuple[str, tuple], float]:
    out = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = start_server(tmp_path_factory.mktemp("metrics"), admin=True, workers=2, fronts=2)
    with srv.connect() as s:
        for q, n in (("alpha", 3), ("beta", 5), ("gamma", 1)):
            for i in range(n):
                s.sendall(b"set %s 0 0 4\r\nitem\r\n" % q.encode())
                assert recv_until(s, b"\r\n") == b"STORED\r\n"
        s.sendall(b"get beta\r\n")
        recv_until(s, b"END\r\n")
        s.sendall(b"get nothing_here\r\n")
        recv_until(s, b"END\r\n")
    yield srv
    assert srv.stop() == 0


def test_metrics_equal_stats(server):
    status, headers, body = get(server, "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=")
    st = mc_stats(server)
    m = samples(body)
    for q in ("alpha", "beta", "gamma"):
        assert m[("lanner_queue_items", (("queue", q),))] == int(st[f"queue_{q}_items"])
        assert m[("lanner_queue_bytes", (("queue", q),))] == int(st[f"queue_{q}_bytes"])
        assert m[("lanner_queue_items_total", (("queue", q),))] == int(st[f"queue_{q}_total_items"])
    assert m[("lanner_queue_items", (("queue", "beta"),))] == 4
    # every global figure is there, merged across workers (curr_items) and fronts (cmd_set)
    assert m[("lanner_curr_items", ())] == int(st["curr_items"]) == 8
    for stat in ("cmd_set", "cmd_get", "get_hits", "get_misses", "queue_creates"):
        assert m[(f"lanner_{stat}_total", ())] == int(st[stat]), stat
    assert m[("lanner_items_total", ())] == int(st["total_items"]) == 9
    assert m[("lanner_build_info", (("version", st["version"]),))] == 1
    assert m[("lanner_server_status", (("status", "Up"),))] == 1
    assert m[("lanner_server_status", (("status", "ReadOnly"),))] == 0
    names = {n for n, _ in m}
    for stat in st:
        if stat.startswith("queue_") and stat not in ("queue_creates", "queue_deletes", "queue_expires"):
            continue
        if stat == "version":
            continue
        assert any(n.startswith("lanner_") and stat.replace("total_", "") in n for n in names), stat


def test_latency_histograms_and_processes(server):
    m = samples(get(server, "/metrics")[2])
    assert m[("lanner_request_latency_seconds_count", (("family", "set"),))] >= 9
    assert m[("lanner_request_latency_seconds_count", (("family", "get"),))] >= 2
    assert m[("lanner_request_latency_seconds_bucket", (("family", "set"), ("le", "+Inf")))] >= 9
    assert m[("lanner_request_latency_seconds_sum", (("family", "set"),))] > 0
    procs = {dict(lab)["process"] for n, lab in m if n == "lanner_process_cpu_seconds_total"}
    assert {"supervisor", "w0", "w1", "f0", "f1", "admin", "cleaner"} <= procs
    rss = [v for (n, _), v in m.items() if n == "lanner_process_resident_memory_bytes"]
    assert len(rss) >= 6 and all(v > 1_000_000 for v in rss)


def test_stats_json_labels_and_metrics(server):
    status, headers, body = get(server, "/stats.json")
    doc = json.loads(body)
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert doc["labels"] == {"status": "Up", "enforced_status": "Up", "version": doc["labels"]["version"]}
    d = doc["metrics"]["set_latency_usec"]
    assert d["count"] >= 9 and d["p50"] <= d["p99"] <= d["maximum"] and d["sum"] > 0
    assert doc["metrics"]["abort_latency_usec"] == {"count": 0}
    assert doc["counters"]["q/beta/total_items"] == 5 and doc["gauges"]["q/beta/items"] == 4.0


def test_stats_txt(server):
    status, headers, body = get(server, "/stats.txt")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    lines = body.decode().split("\n")
    assert lines[0] == "counters:" and "  q/alpha/total_items: 3" in lines
    assert "gauges:" in lines and "  q/beta/items: 4" in lines
    assert "labels:" in lines and "  status: Up" in lines
    i = lines.index("  set_latency_usec:")
    assert lines[i + 1].startswith("    average: ") and any(ln.startswith("    count: ") for ln in lines[i:i + 12])


def test_bad_period_is_400(server):
    assert get(server, "/stats.json?period=soon")[0] == 400
    assert get(server, "/stats.json?period=0")[0] == 400


def test_stats_json_period_latches(tmp_path):
    """Ostrich's LatchedStatsListener: deltas over the last whole period, fixed until the next."""
    period = 2
    srv = start_server(tmp_path, admin=True, workers=1)
    try:
        first = json.loads(get(srv, f"/stats.json?period={period}")[2])   # creates the listener
        assert first["counters"]["cmd_set"] == 0 and "labels" in first
        # start right after a wall-clock boundary, so the sets fall in one period
        time.sleep(period - time.time() % period + 0.2)
        with srv.connect() as s:
            s.sendall(b"set p 0 0 1\r\nx\r\n" * 3)
            assert recv_until(s, b"STORED\r\n" * 3) == b"STORED\r\n" * 3
        def latched():
            return json.loads(get(srv, f"/stats.json?period={period}")[2])
        deadline = time.monotonic() + 3 * period
        while (doc := latched())["counters"]["cmd_set"] != 3:
            assert time.monotonic() < deadline, doc["counters"]
            time.sleep(0.1)
        assert doc["gauges"]["q/p/items"] == 3.0
        assert doc["metrics"]["set_latency_usec"]["count"] == 3
        assert latched() == doc            # the same answer until the next latch
        deadline = time.monotonic() + 3 * period
        while (doc := latched())["counters"]["cmd_set"] != 0:   # a quiet period
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert doc["metrics"]["set_latency_usec"] == {"count": 0}
        # /stats.txt takes ?period= too
        assert "  cmd_set: 0" in get(srv, f"/stats.txt?period={period}")[2].decode().split("\n")
    finally:
        assert srv.stop() == 0


def test_dashboard_json_and_page(server):
    status, headers, body = get(server, "/")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert b"dashboard.json" in body and b"<script" in body
    assert b"http://" not in body and b"https://" not in body      # self-contained: no CDN
    doc = json.loads(get(server, "/dashboard.json")[2])
    assert doc["status"] == "Up" and doc["uptime"] >= 0
    rows = {q["name"]: q for q in doc["queues"]}
    assert rows["beta"]["items"] == 4 and rows["alpha"]["total_items"] == 3
    assert doc["queues"][0]["name"] == "beta"            # fullest first
    assert {p["name"] for p in doc["processes"]} >= {"supervisor", "w0", "f0"}
    limited = json.loads(get(server, "/dashboard.json?limit=1")[2])
    assert [q["name"] for q in limited["queues"]] == ["beta"] and limited["queue_count"] == 4
