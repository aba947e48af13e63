"""Command line, exit statuses, reports and server discovery, against memcached (no queue server)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request

from lanner.perf import scenarios
from lanner.perf.__main__ import build_parser
from lanner.perf.report import Plot, Report, format_table, progress_bar, render, write_json, write_plots
from lanner.perf.servers import ProcTree, find_server_pid, free_port, start_lanner

from tests.helpers import wait_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_scenario_has_help_with_kestrel_option_names():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert set(sub.choices) == set(scenarios.MODULES) | {"compare", "servegrind"}
    helps = {name: p.format_help() for name, p in sub.choices.items()}
    assert "--hostname" in helps["put-many"] and "--count" in helps["put-many"] and "--queues" in helps["put-many"]
    assert "--producers" in helps["flood"] and "--rollup" in helps["flood"] and "--blocking" in helps["flood"]
    assert "--kill" in helps["many-clients"] and "--cycles" in helps["packing"]
    assert "--concurrency" in helps["mixed"] and "--drop-rate" in helps["leaky-reader"]


def test_module_entry_point_runs():
    out = subprocess.run([sys.executable, "-m", "perf", "mixed", "--help"], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0 and "darner" in out.stdout


def test_parse_kestrel_style_short_options():
    args = build_parser().parse_args(["flood", "-h", "example", "-p", "1234", "-R", "3", "-C", "2", "-r", "8", "-B"])
    assert (args.hostname, args.port, args.producers, args.consumers, args.rollup, args.blocking) == \
        ("example", 1234, 3, 2, 8, True)
    assert build_parser().parse_args(["leaky-reader"]).port == 2229
    assert build_parser().parse_args(["mixed", "-c", "1,10,100"]).concurrency == [1, 10, 100]


def test_queue_scenarios_refuse_a_plain_cache(memcached, run_perf):
    for scenario in ("memory", "many-clients", "packing"):
        rc, data, printed = run_perf(scenario, "-p", str(memcached.port), "--kind", "memcached")
        assert rc == 2 and data is None and "needs queue semantics" in printed


def test_leaky_reader_without_a_thrift_server_says_so(run_perf):
    port = free_port()
    rc, data, printed = run_perf("leaky-reader", "-p", str(port))
    assert rc == 2 and f"nothing answers thrift on 127.0.0.1:{port}" in printed


def test_nothing_listening_is_a_clear_error(run_perf):
    port = free_port()
    rc, data, printed = run_perf("mixed", "-p", str(port), "-F", "--prefill", "0", "-s", "1", "-g", "1")
    assert rc == 2 and f"cannot connect to 127.0.0.1:{port}" in printed


def test_plain_cache_skips_payload_checks(memcached, run_perf):
    rc, data, printed = run_perf("put-many", "-p", str(memcached.port), "--kind", "memcached", "-c", "3", "-n", "30",
                                 "-b", "64", "-g")
    assert rc == 0 and data["ok"] and [r["label"] for r in data["rows"]] == ["put", "get"]
    assert any("payload checks skipped" in n for n in data["notes"])
    assert "put" in printed and "client µs/op" in printed and "server µs/op" in printed
    assert data["rows"][0]["server_us_op"] is not None  # memcached's pid was found from its port


def test_a_failed_check_exits_1(memcached, run_perf):
    # Claiming memcached is a queue server: every get returns the last value set under the key,
    # so the payload check sees duplicates and lost items, and says so.
    rc, data, printed = run_perf("put-many", "-p", str(memcached.port), "-c", "2", "-n", "20", "-b", "64", "-g",
                                 "-q", "notaqueue", "-F")
    assert rc == 1 and not data["ok"]
    assert not data["checks"]["get: payloads"]["ok"] and "FAILED" in printed


def test_unexpected_reply_is_a_clear_error(memcached, run_perf):
    rc, data, printed = run_perf("put-many", "-p", str(memcached.port), "-c", "1", "-n", "1", "-q", "notaqueue")
    assert rc == 2 and "flush notaqueue" in printed and "got b'ERROR'" in printed


def test_compare_two_given_servers(memcached, run_perf):
    spec = f"127.0.0.1:{memcached.port}"
    rc, data, printed = run_perf("compare", "--a", spec, "--a-kind", "memcached", "--b", spec, "--b-kind",
                                 "memcached", "--rounds", "2", "flood", "-R", "1", "-C", "1", "-n", "200", "-b", "64")
    assert rc == 0, printed
    [row] = data["rows"]
    assert row["label"] == "1p1c" and len(row["a_rounds"]) == 2 and row["ratio"] > 0
    assert data["settings"]["metric"] == "items_s"


def test_find_server_pid_and_proc_tree(memcached):
    assert find_server_pid("127.0.0.1", memcached.port) == memcached.pid
    tree = ProcTree(memcached.pid)
    assert tree.cpu_seconds() >= 0
    mem = tree.memory()
    assert mem["processes"] == 1 and mem["rss"] >= mem["pss"] > 0
    assert find_server_pid("127.0.0.1", free_port()) is None


def test_table_json_and_plots(tmp_path):
    report = Report("demo", {"n": 1}, {"name": "x", "kind": "kestrel"},
                    rows=[{"label": "c=1", "conns": 1, "ops_s": 1000.0, "p99_us": 50},
                          {"label": "c=10", "conns": 10, "ops_s": 12345.6, "p99_us": None}],
                    columns=[("ops_s", "ops/s", "{:,.0f}"), ("p99_us", "p99 µs", "{:,.0f}")],
                    plots=[Plot("t.png", "conns", ["ops_s"], "connections", "ops/s", "t", logx=True),
                           Plot("b.png", "label", ["ops_s", "p99_us"], "", "", "b", kind="bar")])
    report.check("fine", True, "all good")
    table = format_table(report.columns, report.rows)
    assert table.splitlines()[2].split() == ["c=1", "1,000", "50"]
    assert table.splitlines()[3].split() == ["c=10", "12,346", "-"]
    assert "check fine: ok - all good" in render(report)
    data = json.loads(write_json(report, tmp_path).read_text())
    assert data["ok"] is True and data["rows"][1]["ops_s"] == 12345.6
    paths = write_plots(report, tmp_path)
    assert [p.name for p in paths] == ["t.png", "b.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)
    report.check("broken", False, "nope")
    assert not report.ok and "check broken: FAILED - nope" in render(report)


def test_progress_bar_is_silent_off_a_terminal():
    bar = progress_bar(10, "x")
    bar.update(3)
    bar.close()
    assert bar.n == 3 and type(bar).__name__ == "_NoBar"


def test_a_started_lanner_has_the_default_layout_admin_process_included():
    """`--start lanner` runs what `lanner serve` runs: the admin port on, so the admin process
    is in every figure; `--admin-port=off` leaves it out."""
    target = start_lanner(workers=1)
    try:
        assert target.admin_port
        with urllib.request.urlopen(f"http://127.0.0.1:{target.admin_port}/ping.json", timeout=10) as r:
            assert r.status == 200
        assert wait_for(lambda: target.tree.count("admin") == 1, 10)
    finally:
        target.stop()
    target = start_lanner(workers=1, extra=["--admin-port=off"])
    try:
        assert target.admin_port is None and target.tree.count("admin") == 0
    finally:
        target.stop()
