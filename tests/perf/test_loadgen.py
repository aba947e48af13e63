"""The C load generator: build, counts, pipelining, payload checks, merging of several processes."""
from __future__ import annotations

import socket

import pytest

from lanner.perf import loadgen
from lanner.perf.client import MemcacheClient
from lanner.perf.loadgen import Load, LoadgenError, merge, merge_hist, percentiles, split
from lanner.perf.servers import free_port

ALPHA = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def good_value(producer: int, seq: int, size: int) -> bytes:
    """What loadgen.c writes for (producer, seq): 16 hex digits, then the pattern shifted by seq % 61."""
    pattern = ALPHA * (size // len(ALPHA) + 3)
    start = 16 + seq % 61
    return b"%08x%08x" % (producer, seq) + pattern[start:start + size - 16]


def test_binary_is_built_once_per_source():
    first = loadgen.ensure_built()
    assert loadgen.ensure_built() == first
    assert loadgen.SOURCE.read_bytes()  # the binary's name carries the source hash
    assert first.rsplit("-", 1)[1] in __import__("hashlib").sha256(loadgen.SOURCE.read_bytes()).hexdigest()


def test_counts_and_latency_against_memcached(memcached):
    res = loadgen.run(Load(port=memcached.port, conns=4, sets=600, gets=400, value_size=100, queue="lg"))
    assert res["ops"] == 1000 and res["sets"] == 600 and res["gets"] == 400
    assert res["stored"] == 600 and res["errors"] == 0 and not res["timed_out"]
    assert res["hits"] + res["misses"] == 400
    lat = res["latency_us"]
    assert lat["n"] == 1000 and lat["min"] <= lat["p50"] <= lat["p99"] <= lat["max"]
    assert res["cpu_user_s"] + res["cpu_sys_s"] > 0 and res["cpu_us_per_op"] > 0
    assert res["bytes_out"] >= 600 * 100


def test_pipelined_batches_count_every_reply(memcached):
    res = loadgen.run(Load(port=memcached.port, producers=3, sets=1000, depth=32, value_size=10, queue="pipe"))
    assert res["stored"] == 1000 and res["depth"] == 32 and res["errors"] == 0
    assert res["set_latency_us"]["n"] == 1000 and res["get_latency_us"]["n"] == 0


def test_duration_mode_stops(memcached):
    res = loadgen.run(Load(port=memcached.port, conns=2, duration=0.3, get_ratio=0.25, queue="dur"))
    assert res["ops"] > 0 and res["errors"] == 0
    assert 0.25 <= res["elapsed_s"] < 5
    assert res["gets"] == pytest.approx(res["ops"] * 0.25, abs=3)


def test_payload_checks_find_foreign_duplicate_and_reordered_items(memcached):
    with MemcacheClient("127.0.0.1", memcached.port) as c:
        c.set("bad", b"x" * 64)
        c.set("dup", good_value(0, 3, 64))
    bad = loadgen.run(Load(port=memcached.port, consumers=1, gets=3, value_size=64, queue="bad", verify=True,
                           expect_producers=1, expect_count=10))
    assert bad["verify"]["checked"] == 3 and bad["verify"]["bad_payload"] == 3
    dup = loadgen.run(Load(port=memcached.port, consumers=1, gets=3, value_size=64, queue="dup", verify=True,
                           expect_producers=1, expect_count=10))
    v = dup["verify"]
    assert (v["checked"], v["bad_payload"], v["duplicates"], v["out_of_order"], v["distinct"]) == (3, 0, 2, 2, 1)
    strict = loadgen.run(Load(port=memcached.port, consumers=1, gets=1, value_size=64, queue="dup", verify=True,
                              expect_producers=1, expect_count=10, strict_order=True))
    assert strict["verify"]["out_of_order"] == 1  # the first item of a strict run must be seq 0
    outside = loadgen.run(Load(port=memcached.port, consumers=1, gets=1, value_size=64, queue="dup", verify=True,
                               expect_producers=1, expect_count=3))
    assert outside["verify"]["unexpected"] == 1


def test_producer_values_carry_identity(memcached):
    loadgen.run(Load(port=memcached.port, producers=1, sets=5, value_size=40, queue="ident", verify=True,
                     producer_base=7, seq_base=100))
    with MemcacheClient("127.0.0.1", memcached.port) as c:
        assert c.get("ident") == good_value(7, 104, 40)


def test_server_error_is_reported_not_hidden(memcached):
    # memcached refuses a set larger than its item limit (16 MiB here) and keeps going
    res = loadgen.run(Load(port=memcached.port, producers=1, sets=1, value_size=20 * 2**20, queue="huge"))
    assert res["errors"] == 1 and "SERVER_ERROR" in res["first_error"]


def test_a_server_that_stops_answering_is_reported_not_waited_for():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        res = loadgen.run(Load(port=listener.getsockname()[1], conns=2, duration=0.1, stop_grace=0.2))
    assert res["timed_out"] and res["errors"] == 2 and res["ops"] == 0
    assert "stopped answering" in res["first_error"]
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        res = loadgen.run(Load(port=listener.getsockname()[1], conns=1, sets=10, stall=0.2))
    assert res["timed_out"] and res["errors"] == 1 and res["ops"] == 0


@pytest.mark.parametrize("depth", [1, 4])
def test_pauses_come_at_exact_counts_on_the_same_connections(memcached, depth):
    """servegrind reads a server's counters in the pauses: every reply in, no request under
    way, and no connection opened or closed in between."""
    seen = []

    def at_pause(responses: int) -> None:
        with MemcacheClient("127.0.0.1", memcached.port) as c:
            stats = c.stats()
        seen.append((responses, int(stats["total_connections"]), int(stats["cmd_set"]) + int(stats["cmd_get"])))

    with MemcacheClient("127.0.0.1", memcached.port) as c:
        before = int(c.stats()["total_connections"])
    res = loadgen.run(Load(port=memcached.port, conns=5, sets=500, gets=503, depth=depth, queue=f"pause{depth}",
                           pause_after=(100, 250, 653)), on_pause=at_pause)
    assert res["ops"] == 1003 and res["errors"] == 0 and not res["timed_out"]
    assert [r for r, _, _ in seen] == [100, 350, 1003]
    # the five connections (and each pause's stats connection) opened once: +1 per pause
    assert [t for _, t, _ in seen] == [before + 6, before + 7, before + 8]
    requests = [n for _, _, n in seen]
    assert requests[1] - requests[0] == 250 and requests[2] - requests[1] == 653


def test_a_failing_pause_ends_the_run_and_is_raised(memcached):
    def at_pause(responses: int) -> None:
        raise RuntimeError("no counters")

    with pytest.raises(RuntimeError, match="no counters"):
        loadgen.run(Load(port=memcached.port, conns=2, sets=50, gets=50, queue="pausefail", pause_after=(10,)),
                    on_pause=at_pause)


def test_cannot_connect_names_the_address():
    port = free_port()
    with pytest.raises(LoadgenError, match=f"cannot connect to 127.0.0.1:{port}"):
        loadgen.run(Load(port=port, conns=1, sets=1))


def test_split_shares_connections_budgets_and_producer_ids():
    parts = split(Load(producers=5, consumers=3, sets=101, gets=50, procs=2), 2)
    assert [p.producers for p in parts] == [3, 2] and [p.consumers for p in parts] == [2, 1]
    assert [p.sets for p in parts] == [51, 50] and [p.gets for p in parts] == [25, 25]
    assert [p.producer_base for p in parts] == [0, 3]
    assert split(Load(producers=4, verify=True, procs=2), 2) == [Load(producers=4, verify=True, procs=2)]


def test_two_processes_merge(memcached):
    res = loadgen.run(Load(port=memcached.port, conns=4, sets=400, gets=400, queue="two", procs=2))
    assert len(res.per_process) == 2
    assert res["ops"] == 800 and res["conns"] == 4 and res["latency_us"]["n"] == 800


def test_percentiles_of_sparse_histogram():
    hist = [[10, 50], [20, 40], [1000, 9], [5000, 1]]
    p = percentiles(hist)
    assert (p["n"], p["min"], p["max"], p["p50"], p["p75"], p["p90"], p["p99"], p["p999"]) == \
        (100, 10, 5000, 10, 20, 20, 1000, 5000)
    assert percentiles([])["n"] == 0
    assert merge_hist([[[1, 2], [5, 1]], [[1, 1], [3, 4]]]) == [[1, 3], [3, 4], [5, 1]]


def test_merge_adds_counts_and_keeps_slowest_elapsed():
    def one(ops, elapsed, hist):
        return {"ops": ops, "conns": 1, "sets": ops, "stored": ops, "not_stored": 0, "gets": 0, "hits": 0, "misses": 0,
                "closes": 0, "errors": 0, "connect_failures": 0, "bytes_out": 10, "bytes_in": 5, "cpu_user_s": 0.1,
                "cpu_sys_s": 0.1, "elapsed_s": elapsed, "timed_out": False, "first_error": "",
                "verify": {"enabled": False, "checked": 0, "bad_payload": 0, "duplicates": 0, "out_of_order": 0,
                           "unexpected": 0, "distinct": 0},
                "hist_set": hist, "hist_get": []}
    m = merge([one(100, 1.0, [[5, 100]]), one(300, 2.0, [[50, 300]])])
    assert m["ops"] == 400 and m["elapsed_s"] == 2.0 and m["ops_per_s"] == 200.0
    assert m["cpu_us_per_op"] == pytest.approx(0.4 * 1e6 / 400)
    assert m["set_latency_us"]["p50"] == 50 and m["set_latency_us"]["p75"] == 50
    assert m["latency_us"]["min"] == 5 and percentiles(m["hist_set"])["p9999"] == 50
