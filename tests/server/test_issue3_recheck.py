"""Issue 3 rechecked on a real `lanner serve` (stop 25): the statements of the issue that no
other test held the server to, or held it to only loosely.

- kill -9 of a front: *its* clients' open reads come back at the head of their queue, and a
  client of the other front keeps its own open read (test_processes' version could open both
  reads on the surviving front and compared sorted contents);
- kill -9 of a worker: a request in flight on its shard is answered `SERVER_ERROR <reason>`;
- `--workers 3 --fronts 2` answers a transcript of cross-shard commands exactly as
  `--workers 1 --fronts 1`;
- no busy-spinning: the whole idle server uses under 1 % of a CPU;
- the supervisor never holds a client connection;
- a memcache command line is capped at 1 MiB, a declared size over `max_item_size` is refused
  without the body being held;
- `/stats.json` carries the same figures as `stats`.
"""
from __future__ import annotations

import json
import socket
import time
import urllib.request

import psutil
import pytest

from lanner.queues.placement import worker_of
from tests.helpers import start_server, wait_for
from tests.server.conftest import Client
from tests.server.test_flow_control import peak_rss
from tests.server.test_local import stat

pytestmark = pytest.mark.integration

DEDICATED = dict(workers=2, fronts=2, worker_fronts=False)


def holder(h, c: Client) -> psutil.Process:
    """The server process whose socket is the server end of client `c` (one alone: a
    connection being handed over is held by two for a moment)."""
    port = c.sock.getsockname()[1]
    found: list[psutil.Process] = []

    def one() -> bool:
        found.clear()
        for p in psutil.Process(h.proc.pid).children():
            try:
                if any(x.raddr and x.raddr.port == port for x in p.net_connections(kind="tcp")):
                    found.append(p)
            except psutil.NoSuchProcess:
                continue
        return len(found) == 1
    assert wait_for(one, 10), f"client port {port} held by {found}"
    return found[0]


def clients_of(h, names: list[str]) -> dict[str, Client]:
    """One connection held by each process named in `names` (SO_REUSEPORT picks; the rest
    are closed)."""
    got: dict[str, Client] = {}
    for _ in range(400):
        c = Client(h.connect())
        assert c.ask(b"version\r\n").startswith(b"VERSION ")
        name = holder(h, c).name()
        if name in names and name not in got:
            got[name] = c
        else:
            c.close()
        if len(got) == len(names):
            return got
    raise AssertionError(f"SO_REUSEPORT never picked all of {names}: {sorted(got)}")


def value(reply: bytes) -> bytes | None:
    return reply.split(b"\r\n")[1] if reply.startswith(b"VALUE ") else None


def test_a_killed_fronts_open_reads_come_back_at_the_head_and_the_other_fronts_stay(tmp_path):
    h = start_server(tmp_path, **DEDICATED)
    try:
        cs = clients_of(h, ["lanner-f0", "lanner-f1"])
        victim_client, survivor = cs["lanner-f0"], cs["lanner-f1"]
        victim = holder(h, victim_client)
        for i in range(4):
            assert survivor.ask(b"set hq 0 0 5\r\nitem%d\r\n" % i) == b"STORED\r\n"
        assert value(victim_client.ask(b"get hq/open\r\n", b"END\r\n")) == b"item0"
        assert value(survivor.ask(b"get hq/open\r\n", b"END\r\n")) == b"item1"
        victim.kill()
        # the worker rolls back the dead front's open read, and only that one
        assert wait_for(lambda: stat(survivor, b"queue_hq_open_transactions") == 1), h.log()
        assert survivor.ask(b"get hq/close\r\n", b"END\r\n") == b"END\r\n"     # item1 confirmed
        assert [value(survivor.ask(b"get hq\r\n", b"END\r\n")) for _ in range(4)] == \
            [b"item0", b"item2", b"item3", None]
        assert wait_for(lambda: any(p.name() == "lanner-f0" and p.pid != victim.pid
                                    for p in psutil.Process(h.proc.pid).children()))
    finally:
        assert h.stop() == 0


@pytest.mark.parametrize("layout", ["dedicated", "embedded"])
def test_a_request_in_flight_on_a_killed_worker_is_answered_server_error(tmp_path, layout):
    """A blocking get waits in worker 1 for a client held by another process (a front, or
    worker 0 when workers serve clients); worker 1 dies: the client is told, at once, and the
    other shard keeps serving."""
    if layout == "dedicated":
        h = start_server(tmp_path, **DEDICATED)
        names = ["lanner-f0"]
    else:
        h = start_server(tmp_path, workers=2)
        names = ["lanner-w0"]
    q1 = next(b"iq%d" % i for i in range(1000) if worker_of("iq%d" % i, 2) == 1)
    q0 = next(b"iq%d" % i for i in range(1000) if worker_of("iq%d" % i, 2) == 0)
    try:
        c = clients_of(h, names)[names[0]]
        other = clients_of(h, names)[names[0]]
        # a queue of worker 0 first: a connection that uses both shards is not handed over
        assert c.ask(b"get %s\r\n" % q0, b"END\r\n") == b"END\r\n"
        c.send(b"get %s/t=60000\r\n" % q1)
        assert wait_for(lambda: stat(other, b"queue_%s_waiters" % q1) == 1), h.log()
        w1 = next(p for p in psutil.Process(h.proc.pid).children() if p.name() == "lanner-w1")
        w1.kill()
        assert c.recv_until(b"\r\n", timeout=10) == b"SERVER_ERROR worker 1 restarted\r\n"
        assert other.ask(b"set %s 0 0 1\r\nx\r\n" % q0) == b"STORED\r\n"
        assert other.ask(b"get %s\r\n" % q0, b"END\r\n") == b"VALUE %s 0 1\r\nx\r\nEND\r\n" % q0
    finally:
        assert h.stop() == 0


CROSS_SHARD = """\
[queues."fan+a"]
max_items = 100
[queues."fan+b"]
max_items = 100
[aliases."both"]
destinations = ["al0", "al2", "al4"]
"""

#: the `stats` lines that do not depend on time, on connections or on the process layout
LAYOUT_FREE = ("curr_items", "total_items", "bytes", "cmd_get", "cmd_set", "cmd_peek", "get_hits",
               "get_misses")


def transcript(h) -> list[bytes]:
    c = Client(h.connect())
    out = []

    def ask(line: bytes, end: bytes = b"\r\n") -> None:
        out.append(line + b" -> " + c.ask(line, end))
    for q in range(8):
        for i in range(3):
            ask(b"set tq%d 0 0 4\r\n%d-%02d\r\n" % (q, q, i))
    ask(b"get tq0 tq1 tq2 tq3 tq4 tq5 tq6 tq7\r\n", b"END\r\n")
    ask(b"get tq3/open\r\n", b"END\r\n")
    ask(b"get tq5/peek\r\n", b"END\r\n")
    ask(b"get fan+a\r\n", b"END\r\n")
    ask(b"get fan+b\r\n", b"END\r\n")
    ask(b"set fan 0 0 3\r\nf-1\r\n")
    ask(b"set both 0 0 3\r\nal!\r\n")
    for q in (b"fan", b"fan+a", b"fan+b", b"al0", b"al2", b"al4"):
        ask(b"get %s/peek\r\n" % q, b"END\r\n")
    ask(b"delete tq7\r\n")
    ask(b"flush tq6\r\n")
    ask(b"get tq3/close\r\n", b"END\r\n")

    def stats() -> None:
        lines = c.ask(b"stats\r\n", b"END\r\n").split(b"\r\n")
        keep = [ln for ln in lines if ln.startswith(b"STAT ") and
                (ln.split()[1].decode() in LAYOUT_FREE or
                 ln.startswith(b"STAT queue_") and not ln.split()[1].endswith((b"_age", b"_logsize")))]
        out.append(b"stats -> " + b"\r\n".join(sorted(keep)))
    stats()
    ask(b"flush_all\r\n")
    stats()
    ask(b"flush_all_expired\r\n")
    c.close()
    return out


def test_three_workers_two_fronts_answer_as_one_worker_one_front(tmp_path):
    """Issue 3: `--workers 3 --fronts 2` gives the same results as `--workers 1 --fronts 1`:
    multi-key gets, fanout, alias writes, stats and flush_all span the shards and merge."""
    got = {}
    for layout, (w, f) in {"3x2": (3, 2), "1x1": (1, 1)}.items():
        (tmp_path / layout).mkdir()
        h = start_server(tmp_path / layout, workers=w, fronts=f, worker_fronts=False, config=CROSS_SHARD)
        try:
            got[layout] = transcript(h)
        finally:
            assert h.stop() == 0
    # the transcript spans every worker of three
    assert {worker_of("tq%d" % q, 3) for q in range(8)} == {0, 1, 2}
    assert {worker_of("al%d" % q, 3) for q in (0, 2, 4)} == {0, 1, 2}
    assert got["3x2"] == got["1x1"]
    assert b"STAT queue_al4_items 1" in got["1x1"][-4]        # (the transcript did what it says)


def server_cpu_seconds(h) -> float:
    total = 0.0
    for p in [psutil.Process(h.proc.pid)] + psutil.Process(h.proc.pid).children(recursive=True):
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
    return total


@pytest.mark.parametrize("layout", ["default", "dedicated"])
def test_an_idle_server_uses_under_1_percent_of_a_cpu(tmp_path, layout):
    """No busy-spinning: every process of an idle server sleeps (issue 3, "Rings")."""
    if layout == "default":
        h = start_server(tmp_path, workers=2, admin=True, thrift=True)
    else:
        h = start_server(tmp_path, admin=True, thrift=True, **DEDICATED)
    try:
        c = Client(h.connect())
        assert c.ask(b"set idle 0 0 1\r\nx\r\n") == b"STORED\r\n"
        c.close()
        window = 4.0
        before, t0 = server_cpu_seconds(h), time.monotonic()
        time.sleep(window)           # a measurement window, not a wait for something
        used = (server_cpu_seconds(h) - before) / (time.monotonic() - t0)
        assert used < 0.01, f"an idle server used {used:.1%} of a CPU"
    finally:
        assert h.stop() == 0


@pytest.mark.parametrize("layout", ["default", "dedicated"])
def test_the_supervisor_holds_no_client_connection(tmp_path, layout):
    if layout == "default":
        h = start_server(tmp_path, workers=2)
    else:
        h = start_server(tmp_path, **DEDICATED)
    try:
        cs = [Client(h.connect()) for _ in range(16)]
        for c in cs:
            assert c.ask(b"version\r\n").startswith(b"VERSION ")
        ports = {c.sock.getsockname()[1] for c in cs}
        sup = psutil.Process(h.proc.pid)
        assert not [x for x in sup.net_connections(kind="tcp") if x.raddr and x.raddr.port in ports]
        held = [holder(h, c).name() for c in cs]
        assert "lanner" not in held, held
        for c in cs:
            c.close()
    finally:
        assert h.stop() == 0


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    h = start_server(tmp_path_factory.mktemp("small"), workers=2, config='[default]\nmax_item_size = "1KiB"\n')
    yield h
    h.stop()


def test_a_command_line_over_1_mib_is_a_client_error_and_a_close(small):
    c = Client(small.connect())
    try:
        c.send(b"get " + b"x" * (1 << 20) + b"xx")           # no LF: past the cap before one comes
    except BrokenPipeError:
        pass                     # (the server may refuse and close while this is still sending)
    assert c.recv_until(b"\r\n") == b"CLIENT_ERROR line longer than 1048576 bytes\r\n"
    assert c.is_closed()
    d = Client(small.connect())
    assert d.ask(b"set after 0 0 1\r\nx\r\n") == b"STORED\r\n"
    d.close()


def test_a_declared_size_over_max_item_size_is_refused_without_holding_the_body(small):
    mib = 1 << 20
    c = Client(small.connect())
    c.send(b"set toobig 0 0 %d\r\n" % (64 * mib))
    proc = holder(small, c)
    before = peak_rss(proc)
    block = b"y" * mib
    for _ in range(64):
        c.send(block)
    c.send(b"\r\nget toobig\r\nset fits 0 0 1024\r\n" + b"z" * 1024 + b"\r\n")
    assert c.recv_until(b"END\r\nSTORED\r\n", timeout=60) == b"NOT_STORED\r\nEND\r\nSTORED\r\n"
    growth = peak_rss(holder(small, c)) - before
    assert growth < 16 * mib, f"the process holding the connection grew {growth / mib:.1f} MiB"
    c.close()


def test_stats_json_has_the_figures_of_stats(tmp_path):
    """Every figure of `stats` is in `/stats.json` with the same value, under Ostrich's name."""
    h = start_server(tmp_path, workers=2, admin=True)
    try:
        c = Client(h.connect())
        for q in (b"sj0", b"sj1", b"sj2"):
            assert c.ask(b"set %s 0 0 2\r\nab\r\nset %s 0 0 2\r\ncd\r\n" % (q, q),
                         b"STORED\r\nSTORED\r\n") == b"STORED\r\nSTORED\r\n"
        assert value(c.ask(b"get sj1/open\r\n", b"END\r\n")) == b"ab"
        assert c.ask(b"get sj2\r\nget nothing\r\n", b"END\r\nEND\r\n").endswith(b"END\r\nEND\r\n")
        lines = c.ask(b"stats\r\n", b"END\r\n").decode().split("\r\n")
        stats = dict(ln.split(" ", 2)[1:] for ln in lines if ln.startswith("STAT "))
        with urllib.request.urlopen(f"http://127.0.0.1:{h.admin_port}/stats.json", timeout=10) as r:
            doc = json.loads(r.read())
        figures = {**doc["counters"], **doc["gauges"]}
        ostrich = {"curr_connections": "connections"}
        per_queue = {"logsize": "journal_size"}
        moving = {"time", "uptime", "version", "bytes_read", "bytes_written"}
        checked = 0
        for key, val in stats.items():
            if key in moving or key.endswith("_age"):      # (age: milliseconds, it moves)
                continue
            q = next((q for q in ("sj0", "sj1", "sj2", "nothing") if key.startswith(f"queue_{q}_")), None)
            if q is not None:           # (queue_creates and its kind are global)
                field = key[len(f"queue_{q}_"):]
                name = f"q/{q}/{per_queue.get(field, field)}"
            else:
                name = ostrich.get(key, key)
            assert name in figures, f"stats' {key} is not in /stats.json (as {name})"
            assert float(figures[name]) == float(val), f"{key} = {val} in stats, {name} = {figures[name]}"
            checked += 1
        assert checked >= 60, checked
        c.close()
    finally:
        assert h.stop() == 0


def test_status_is_kept_in_the_status_file_enforced_after_the_grace_period_by_every_process(tmp_path):
    """Reference §5.11 through the real server: a stricter status is reported at once and
    written to the status file, enforced after `status_change_grace_period` by every process
    that serves clients, and applied at once on the next start."""
    grace = 3.0
    cfg = f'[server]\nstatus_change_grace_period = "{int(grace * 1000)}ms"\n'
    h = start_server(tmp_path, workers=2, config=cfg)
    try:
        cs = clients_of(h, ["lanner-w0", "lanner-w1"])
        a, b = cs["lanner-w0"], cs["lanner-w1"]
        q0 = next(b"sq%d" % i for i in range(1000) if worker_of("sq%d" % i, 2) == 0)
        t0 = time.monotonic()
        assert a.ask(b"status readonly\r\n") == b"END\r\n"
        assert b.ask(b"status\r\n") == b"READONLY\r\n"                 # reported at once
        reply = b.ask(b"set %s 0 0 1\r\nx\r\n" % q0)
        if time.monotonic() - t0 < grace * 0.8:
            assert reply == b"STORED\r\n"                                # not yet enforced
        with open(h.status_file) as f:
            assert f.read() == "ReadOnly\n"

        def refused(c: Client) -> bool:
            r = c.ask(b"set %s 0 0 1\r\ny\r\n" % q0)
            assert r == b"STORED\r\n" or r.startswith(b"SERVER_ERROR "), r
            return r != b"STORED\r\n"
        assert wait_for(lambda: refused(b), grace + 10)                  # (and the close follows)
        assert time.monotonic() - t0 >= grace * 0.9
        assert refused(a)                                                # the other worker too
    finally:
        assert h.stop() == 0
    h = start_server(tmp_path, workers=2, config=cfg, queue_path=h.queue_path)
    try:
        c = Client(h.connect())
        assert c.ask(b"status\r\n") == b"READONLY\r\n"
        c.send(b"set restart 0 0 1\r\nx\r\n")                          # enforced at once: no grace
        assert c.recv_until(b"\r\n").startswith(b"SERVER_ERROR")
    finally:
        assert h.stop() == 0


def test_serve_with_only_ports_given_keeps_its_data_under_dot_data_and_prints_the_ready_line(tmp_path):
    """contract.md: `lanner serve` without a queue path keeps its data under `./data/`, and
    prints `lanner ready memcache=HOST:PORT text=... thrift=... admin=...` once every listener
    accepts (the embedded default ports themselves are outside the ports a test may use)."""
    import subprocess
    import sys
    from lanner.perf.servers import free_port, ready_line
    ports = {k: free_port() for k in ("memcache", "text", "thrift", "admin")}
    args = [sys.executable, "-m", "lanner.cli", "serve"]
    for k, p in ports.items():
        args += [f"--{k}-port", str(p)]
    log = open(tmp_path / "serve.log", "wb")
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, cwd=tmp_path)
    log.close()
    try:
        line = ready_line(proc, 60).decode()
        assert line == "lanner ready " + " ".join(f"{k}=127.0.0.1:{p}" for k, p in ports.items()) + "\n", line
        for k, p in ports.items():
            socket.create_connection(("127.0.0.1", p), timeout=5).close()
        c = Client(socket.create_connection(("127.0.0.1", ports["memcache"]), timeout=10))
        assert c.ask(b"set dotdata 0 0 1\r\nx\r\nstatus readonly\r\nstatus up\r\n",
                     b"END\r\nEND\r\n") == b"STORED\r\nEND\r\nEND\r\n"
        c.close()
        assert (tmp_path / "data" / "queues" / "dotdata").stat().st_size > 0
        assert (tmp_path / "data" / "status").read_text() == "Up\n"
    finally:
        proc.terminate()
        assert proc.wait(30) == 0
        proc.stdout.close()
