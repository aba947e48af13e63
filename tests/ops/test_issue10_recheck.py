"""Issue 10, rechecked on a real `lanner serve` in the default layout (two workers that serve
clients themselves, no dedicated front, the admin process): every `stats` figure, global and
per queue, is a `lanner_…` metric with the same value; `--admin-port off` runs no admin
process; `--log-level debug` logs each connection a worker serves and each queue event;
`/stats.json?period=60` answers with its sections filled; the dashboard shows every column
the issue lists and polls once a second; and a ZooKeeper member with a digest credential and no
memcache listener advertises thrift, is readable by anyone and writable by that identity only."""
from __future__ import annotations

import json
import time

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from lanner.queues.placement import worker_of
from tests.helpers import start_server
from tests.ops.test_admin_process import get as http_get
from tests.ops.test_dashboard import browser  # noqa: F401  (fixture)
from tests.ops.zk import wait_for, zookeeper  # noqa: F401  (fixture)
from tests.server.conftest import Client

pytestmark = pytest.mark.integration

WORKERS = 2


def stats(c: Client) -> dict[str, str]:
    raw = c.ask(b"stats\r\n", b"END\r\n").decode()
    return {ln.split(" ")[1]: ln.split(" ", 2)[2] for ln in raw.split("\r\n") if ln.startswith("STAT ")}


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    status, body = http_get(port, "/metrics")
    assert status == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(body.decode()) for s in fam.samples}


def queue_on(worker: int, prefix: str) -> str:
    i = 0
    while worker_of(f"{prefix}{i}", WORKERS) != worker:
        i += 1
    return f"{prefix}{i}"


# README "Monitoring": a per-queue figure <s> is lanner_queue_<s>, a counter lanner_queue_<s>_total
# with a leading `total_` moved to the end, and two carry their unit
QUEUE_UNITS = {"age": "lanner_queue_age_milliseconds", "logsize": "lanner_queue_logsize_bytes"}
# figures that move between the `stats` request and the scrape (the scrape's own connection)
MOVING = {"uptime", "time", "curr_connections", "total_connections", "bytes_read", "bytes_written"}


def queue_metric(m: dict, queue: str, stat: str) -> float:
    label = (("queue", queue),)
    if stat in QUEUE_UNITS:
        return m[(QUEUE_UNITS[stat], label)]
    base = stat[len("total_"):] if stat.startswith("total_") else stat
    for name in (f"lanner_queue_{stat}", f"lanner_queue_{base}_total"):
        if (name, label) in m:
            return m[(name, label)]
    raise AssertionError(f"queue {queue!r}: stat {stat} has no lanner_queue_ metric")


def global_metric(m: dict, stat: str) -> float:
    base = stat[len("total_"):] if stat.startswith("total_") else stat
    for name in (f"lanner_{stat}", f"lanner_{base}_total", f"lanner_{stat}_seconds"):
        if (name, ()) in m:
            return m[(name, ())]
    raise AssertionError(f"global stat {stat} has no lanner_ metric")


def test_every_stats_figure_is_a_metric_with_its_value(tmp_path):
    config = '[aliases."both"]\ndestinations = ["%s", "%s"]\n' % (queue_on(0, "a"), queue_on(1, "b"))
    server = start_server(tmp_path, workers=WORKERS, admin=True, config=config)
    queues = [queue_on(0, "a"), queue_on(1, "b"), queue_on(0, "held"), queue_on(1, "waited")]
    try:
        c = Client(server.connect())
        for q in queues[:3]:
            for _ in range(3):
                assert c.ask(b"set %s 0 0 4\r\nitem\r\n" % q.encode()) == b"STORED\r\n"
        assert c.ask(b"set both 0 0 3\r\nabc\r\n") == b"STORED\r\n"
        assert c.ask(b"get %s\r\n" % queues[0].encode(), b"END\r\n").startswith(b"VALUE")
        held = Client(server.connect())            # an open transaction
        assert held.ask(b"get %s/open\r\n" % queues[2].encode(), b"END\r\n").startswith(b"VALUE")
        waiter = Client(server.connect())          # a waiter on the other worker's queue
        waiter.send(b"get %s/t=60000\r\n" % queues[3].encode())
        wait_for(lambda: stats(c).get(f"queue_{queues[3]}_waiters") == "1")
        st = stats(c)
        m = scrape(server.admin_port)
        assert st[f"queue_{queues[2]}_open_transactions"] == "1"
        for q in queues:
            fields = [k[len(f"queue_{q}_"):] for k in st if k.startswith(f"queue_{q}_")]
            assert len(fields) >= 16, fields
            for stat in fields:
                if stat == "age":                  # grows between the two reads
                    assert queue_metric(m, q, stat) >= 0
                    continue
                assert queue_metric(m, q, stat) == float(st[f"queue_{q}_{stat}"]), (q, stat)
        assert m[("lanner_alias_put_items_total", (("alias", "both"),))] == int(st["queue_both_put_items"]) == 1
        assert m[("lanner_alias_put_bytes_total", (("alias", "both"),))] == int(st["queue_both_put_bytes"]) == 3
        globals_ = [k for k in st if not k.startswith("queue_") or k in ("queue_creates", "queue_deletes",
                                                                          "queue_expires")]
        for stat in globals_:
            if stat == "version":
                assert m[("lanner_build_info", (("version", st["version"]),))] == 1
            elif stat not in MOVING:
                assert global_metric(m, stat) == float(st[stat]), stat
            else:
                global_metric(m, stat)
        # merged across both workers: each holds some of the items
        assert m[("lanner_curr_items", ())] == int(st["curr_items"]) == 2 + 3 + 2 + 1 + 1
        # a put lands on the waiter's worker and reaches it; the figures follow
        assert c.ask(b"set %s 0 0 1\r\nx\r\n" % queues[3].encode()) == b"STORED\r\n"
        assert waiter.recv_until(b"END\r\n") == b"VALUE %s/t=60000 0 1\r\nx\r\nEND\r\n" % queues[3].encode()
        wait_for(lambda: scrape(server.admin_port)[("lanner_queue_waiters", (("queue", queues[3]),))] == 0)
        for client in (c, held, waiter):
            client.close()
    finally:
        assert server.stop() == 0


def test_admin_port_off_runs_no_admin_process(tmp_path):
    server = start_server(tmp_path, workers=WORKERS)          # start_server turns it off
    try:
        names = sorted(p.name() for p in psutil.Process(server.proc.pid).children())
        assert names == ["lanner-cleaner", "lanner-w0", "lanner-w1"], names
    finally:
        assert server.stop() == 0


def test_debug_logs_each_connection_a_worker_serves_and_each_queue_event(tmp_path):
    log = tmp_path / "lanner.log"
    server = start_server(tmp_path, "--log-file", str(log), "--log-level", "debug", workers=WORKERS)
    q = queue_on(1, "dbg")
    try:
        c = Client(server.connect())
        assert c.ask(b"set %s 0 0 1\r\nx\r\n" % q.encode()) == b"STORED\r\n"
        assert c.ask(b"flush %s\r\n" % q.encode()) == b"END\r\n"
        assert c.ask(b"delete %s\r\n" % q.encode()) == b"DELETED\r\n"
        c.close()
        wait_for(lambda: "connection 1 closed" in log.read_text())
    finally:
        assert server.stop() == 0
    body = log.read_text()
    assert server.log() == ""                                   # all of it went to the file
    assert "MemcacheConn connection 1 from ('127.0.0.1'" in body, body[-3000:]
    for event in ("created", "flushed", "deleted"):
        assert f"queue '{q}': {event}" in body, (event, body[-3000:])


def test_stats_json_period_60_answers_with_labels_and_metrics(tmp_path):
    server = start_server(tmp_path, workers=WORKERS, admin=True)
    try:
        c = Client(server.connect())
        assert c.ask(b"set p 0 0 1\r\nx\r\n") == b"STORED\r\n"
        c.close()
        status, body = http_get(server.admin_port, "/stats.json?period=60")
        doc = json.loads(body)
        assert status == 200 and doc["labels"]["status"] == "Up" and doc["labels"]["version"]
        assert {"counters", "gauges", "labels", "metrics"} <= set(doc)
        assert "set_latency_usec" in doc["metrics"]
        status, body = http_get(server.admin_port, "/stats.txt?period=60")
        assert status == 200 and body.startswith(b"counters:\n") and b"\nlabels:\n" in body
    finally:
        assert server.stop() == 0


def test_dashboard_shows_every_listed_figure_and_polls_each_second(browser, tmp_path):  # noqa: F811
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    server = start_server(tmp_path, workers=WORKERS, admin=True)
    held_q, waited_q = queue_on(0, "dh"), queue_on(1, "dw")
    try:
        wait = WebDriverWait(browser, 40, poll_frequency=0.1)
        browser.get(f"http://127.0.0.1:{server.admin_port}/")
        wait.until(lambda d: d.find_element(By.ID, "status").text == "Up")

        def cells(d, rows: str) -> dict[str, dict[str, str]]:
            """{row key: {cell class: text}} of a table, read in one script (the page redraws
            its tables every second, so elements found one by one can go stale)."""
            return d.execute_script(
                "const out = {};"
                "for (const tr of document.querySelectorAll(arguments[0]))"
                "  out[tr.dataset.queue || tr.dataset.process] = Object.fromEntries("
                "    [...tr.children].map((td, i) => [td.className || String(i), td.textContent]));"
                "return out;", rows)

        def row(d, queue: str) -> dict[str, str] | None:
            return cells(d, "#queues tr[data-queue]").get(queue)

        c = Client(server.connect())
        for _ in range(3):
            assert c.ask(b"set %s 0 0 5\r\nhello\r\n" % held_q.encode()) == b"STORED\r\n"
        held = Client(server.connect())
        assert held.ask(b"get %s/open\r\n" % held_q.encode(), b"END\r\n").startswith(b"VALUE")
        waiter = Client(server.connect())
        waiter.send(b"get %s/t=60000\r\n" % waited_q.encode())
        got = wait.until(lambda d: (r := row(d, held_q)) and r.get("open") == "1" and r)
        assert got["items"] == "2" and got["bytes"] == "10 B" and got["total"] == "3"
        assert got["age"] and float(got["put-rate"]) >= 0 and float(got["get-rate"]) >= 0
        wait.until(lambda d: (r := row(d, waited_q)) and r.get("waiters") == "1")
        # a steady stream of puts shows as a put rate in the table and the chart's legend
        deadline = time.monotonic() + 30
        while not (float((row(browser, held_q) or {}).get("put-rate") or 0) > 0
                   and float(browser.find_element(By.ID, "put-rate").text) > 0):
            assert time.monotonic() < deadline, row(browser, held_q)
            assert c.ask(b"set %s 0 0 5\r\nhello\r\n" % held_q.encode()) == b"STORED\r\n"
            time.sleep(0.1)
        # per-process CPU and memory
        procs = cells(browser, "#processes tr[data-process]")
        assert {"supervisor", "w0", "w1", "admin", "cleaner"} <= set(procs), procs
        assert all(float(p["cpu"]) >= 0 and p["rss"].endswith("MiB") for p in procs.values()), procs
        # the chart has been drawn: some pixels of the canvas are not blank
        drawn = browser.execute_script(
            "const c = document.getElementById('chart');"
            "return c.getContext('2d').getImageData(0, 0, c.width, c.height).data.some((v) => v !== 0);")
        assert drawn
        # it polls /dashboard.json once a second
        polls = lambda: int(browser.find_element(By.TAG_NAME, "body").get_attribute("data-polls") or 0)  # noqa: E731
        first, t0 = polls(), time.monotonic()
        wait.until(lambda d: polls() >= first + 4)
        assert time.monotonic() - t0 >= 2.5, "polled faster than once a second"
        assert browser.find_element(By.ID, "error").text == ""
        shot = tmp_path / "dashboard.png"
        assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
        for client in (c, held, waiter):
            client.close()
    finally:
        assert server.stop() == 0


def test_a_member_with_a_digest_and_no_memcache_advertises_thrift(zookeeper, tmp_path):  # noqa: F811
    from kazoo.client import KazooClient
    from kazoo.exceptions import NoAuthError
    prefix = "/lanner/digest"
    server = start_server(tmp_path, "--memcache-port", "off", thrift=True, config=f"""
[zookeeper]
hosts = "{zookeeper.hosts}"
path_prefix = "{prefix}"
session_timeout = "4s"
digest = "lanner:s3cret"
""")
    anonymous = KazooClient(hosts=zookeeper.hosts, timeout=5)
    anonymous.start(timeout=15)
    try:
        for name in ("write", "read"):
            path = f"{prefix}/{name}"
            children = wait_for(lambda: anonymous.exists(path) and anonymous.get_children(path))
            (member,) = children
            data, _ = anonymous.get(f"{path}/{member}")           # anyone can discover
            doc = json.loads(data)
            assert doc["serviceEndpoint"] == {"host": "127.0.0.1", "port": server.thrift_port}
            assert set(doc["additionalEndpoints"]) == {"thrift", "text"} and doc["status"] == "ALIVE"
            acl, _ = anonymous.get_acls(f"{path}/{member}")
            schemes = {(a.id.scheme, a.id.id.split(":")[0]) for a in acl}
            assert ("digest", "lanner") in schemes and ("world", "anyone") in schemes, acl
            with pytest.raises(NoAuthError):                        # only the server's identity
                anonymous.delete(f"{path}/{member}")
        assert server.stop() == 0                                  # a clean stop leaves both sets
        assert anonymous.get_children(f"{prefix}/write") == anonymous.get_children(f"{prefix}/read") == []
    finally:
        server.stop()
        anonymous.stop()
        anonymous.close()
