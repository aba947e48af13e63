"""Issue 11 rechecked on a real `lanner serve` in the default layout (stop 25).

test_flow_control.py measures the `lanner-f0` process of a one-worker, one-front server whose
worker also accepts clients, so its connections may land on the worker and leave the measured
front idle; and the default layout has no dedicated front at all.  Here the process measured
is the one that holds the client's socket (psutil), in the default layout (workers serve
clients, no dedicated fronts):

- a client that never reads its replies stalls only itself, and the process holding it stays
  small (defect 5), with another client of the same process answered at once;
- a large set body is not held whole by the dedicated front that routes it to the owning worker;
- what the issue found "already solid", kept so: 2,000 idle connections cost little memory,
  and bytes thrown at every listener leave no traceback and a server that still serves.
"""
from __future__ import annotations

import random
import signal
import socket
import statistics

import psutil
import pytest

from lanner.queues.placement import worker_of
from tests.helpers import start_server, wait_for
from tests.server.conftest import Client
from tests.server.test_flow_control import flood_never_reading, peak_rss
from tests.server.test_issue3_recheck import clients_of, holder

pytestmark = pytest.mark.integration

MiB = 1 << 20


def queue_on(worker: int, prefix: str) -> bytes:
    return next(b"%s%d" % (prefix.encode(), i) for i in range(1000) if worker_of(f"{prefix}{i}", 2) == worker)


@pytest.fixture
def server(tmp_path):
    h = start_server(tmp_path, workers=2)          # the default layout on two CPUs
    yield h
    assert h.stop() == 0


def test_a_client_that_never_reads_stalls_only_itself(server):
    pk, other_q = queue_on(1, "pk"), queue_on(1, "oq")
    cs = clients_of(server, ["lanner-w1"])
    flood = cs["lanner-w1"]
    assert flood.ask(b"set %s 0 0 100\r\n%s\r\n" % (pk, b"x" * 100)) == b"STORED\r\n"
    proc = holder(server, flood)
    assert proc.name() == "lanner-w1"
    before = peak_rss(proc)
    flood.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    payload = b"get %s/peek\r\n" % pk * 1_000_000
    other = clients_of(server, ["lanner-w1"])["lanner-w1"]       # the same process, its own queue

    def probe():
        assert other.ask(b"get %s\r\n" % other_q, b"END\r\n") == b"END\r\n"
    last_sent, times = flood_never_reading(flood.sock, payload, probe)
    growth = peak_rss(proc) - before
    assert holder(server, other).pid == proc.pid        # both clients stayed with that process
    print(f"read {last_sent / MiB:.1f} of {len(payload) / MiB:.1f} MiB; peak RSS growth of "
          f"{proc.name()} {growth / MiB:.1f} MiB; other client: median "
          f"{statistics.median(times) * 1000:.2f} ms, max {max(times) * 1000:.1f} ms")
    assert last_sent < len(payload)
    assert growth < 48 * MiB
    assert statistics.median(times) < 0.2 and max(times) < 2.0


def test_a_large_set_body_is_not_held_whole_by_the_front_that_routes_it(tmp_path):
    """A dedicated front passes a 48 MiB set body on to the owning worker in pieces.  (In the
    default layout the connection is handed to the owner, which keeps the item as a queue
    item, so there is no routing process to measure.)"""
    size = 48 * MiB
    h = start_server(tmp_path, workers=2, fronts=1, worker_fronts=False)
    try:
        c = Client(h.connect())
        assert c.ask(b"version\r\n").startswith(b"VERSION ")
        front = holder(h, c)
        assert front.name() == "lanner-f0"
        before = peak_rss(front)
        c.sock.settimeout(60)
        c.send(b"set lb 0 0 %d\r\n" % size)
        block = bytes(range(256)) * 4096
        for _ in range(size // len(block)):
            c.send(block)
        c.send(b"\r\n")
        assert c.recv_until(b"\r\n", timeout=60) == b"STORED\r\n"
        growth = peak_rss(front) - before
        print(f"front peak RSS growth while a {size // MiB} MiB body went through: {growth / MiB:.1f} MiB")
        assert growth < size // 4, f"the front grew {growth / MiB:.1f} MiB routing a {size // MiB} MiB body"
        c.close()
    finally:
        assert h.stop() == 0


def server_rss(h) -> int:
    total = 0
    for p in [psutil.Process(h.proc.pid)] + psutil.Process(h.proc.pid).children(recursive=True):
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def test_two_thousand_idle_connections_cost_little_memory(server):
    """Issue 11: "2,000 idle connections added 5 MB. Keep them that way." (20 MB allowed:
    the figure was the issue's, on its own box)."""
    warm = Client(server.connect())
    assert warm.ask(b"version\r\n").startswith(b"VERSION ")
    before = server_rss(server)
    socks = []
    try:
        for _ in range(2000):
            socks.append(socket.create_connection(("127.0.0.1", server.memcache_port), timeout=10))
        probe = Client(server.connect())
        assert wait_for(lambda: int(probe.ask(b"stats\r\n", b"END\r\n").split(b"STAT curr_connections ")[1]
                                    .split(b"\r\n")[0]) >= 2001, 30)
        grown = server_rss(server) - before
        print(f"2,000 idle connections: server RSS +{grown / MiB:.1f} MiB")
        assert grown < 20 * MiB, f"2,000 idle connections took {grown / MiB:.1f} MiB"
        assert probe.ask(b"set idleq 0 0 1\r\nx\r\n") == b"STORED\r\n"
        probe.close()
    finally:
        for s in socks:
            s.close()
        warm.close()


FRAGMENTS = [b"get ", b"set ", b"put ", b"delete ", b"flush ", b"flush_all", b"monitor ", b"confirm ",
             b"status ", b"dump_stats", b"stats", b"q", b"fz", b"/open", b"/close", b"/abort", b"/peek",
             b"/t=", b"noreply", b" ", b"0", b"5", b"-1", b"2147483648", b"\r\n", b"\n", b"\r", b":",
             b"\x00", b"\xff", b"\xe9", b"+", b"..", b"/", b"GET / HTTP/1.1\r\n", b"\x80\x01\x00\x01",
             b"\x00\x00\x00\x10", b"\x0b\x00\x01"]


def test_bytes_thrown_at_every_listener_leave_no_traceback(tmp_path):
    """Issue 11: "120 s of socket fuzzing gave 0 tracebacks ... keep them that way": a few
    seconds of it here, over memcache, text, thrift and the admin port, then every listener
    still answers and the log holds no traceback.  (Seeded: a failure reruns the same bytes.)"""
    h = start_server(tmp_path, workers=2, thrift=True, admin=True)
    rnd = random.Random(11)
    ports = [h.memcache_port, h.text_port, h.thrift_port, h.admin_port]
    try:
        for n in range(400):
            port = ports[n % len(ports)]
            data = b"".join(rnd.choice(FRAGMENTS) if rnd.random() < 0.8 else rnd.randbytes(rnd.randint(1, 12))
                            for _ in range(rnd.randint(1, 60)))
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            try:
                s.sendall(data)
                if rnd.random() < 0.5:
                    s.shutdown(socket.SHUT_WR)
                s.settimeout(0.05)
                try:
                    s.recv(65536)
                except (socket.timeout, OSError):
                    pass
            finally:
                s.close()
        c = Client(h.connect())
        assert c.ask(b"set fzdone 0 0 1\r\nx\r\n") == b"STORED\r\n"
        t = Client(h.connect(h.text_port))
        assert t.ask(b"version\n", b"\n").startswith(b":")
        with socket.create_connection(("127.0.0.1", h.admin_port), timeout=10) as s:
            s.sendall(b"GET /ping.json HTTP/1.0\r\n\r\n")
            assert b"pong" in s.recv(4096) + s.recv(4096)
        assert len([p for p in psutil.Process(h.proc.pid).children()]) >= 3
        log = h.log()
        assert "Traceback" not in log and "ERROR" not in log, log[-4000:]
    finally:
        assert h.stop() == 0


def item_back(h, q: bytes, want: bytes, timeout: float = 10.0) -> bool:
    """Whether `q`'s head is `want` within `timeout` (a held read goes back within a turn or
    two of its connection's end)."""
    c = Client(h.connect())
    try:
        return wait_for(lambda: c.ask(b"get %s/peek\r\n" % q, b"END\r\n") ==
                        b"VALUE %s/peek 0 %d\r\n%s\r\nEND\r\n" % (q, len(want), want), timeout)
    finally:
        c.close()


@pytest.mark.parametrize("pipeline", [
    b"get %(qa)s/open\r\nget %(qb)s\r\n",                 # a worker-decided close (slot), a local get
    b"get %(qa)s\r\nget %(qb)s\r\n",                      # a slot-less routed get closes, a fused get
    b"get %(qa)s/open\r\nget %(qb)s %(qb)s\r\n",          # ... a local multi-key get
], ids=["open-then-get", "routed-then-fused", "open-then-multikey"])
def test_a_local_get_behind_a_close_another_worker_decides_loses_no_item(server, pipeline):
    """Issue 11, defect 2 ("every reply earned before the offending command is written, then
    the error, then the close"; nothing handed out is lost).  A client of worker 0 holds an
    open read on worker 1's queue; it pipelines a second read of that queue (ERROR and a close,
    decided by worker 1) and a plain get of worker 0's queue.  Worker 0 ran that get at once,
    while worker 1 (stopped here, so the order is certain) had not answered: the item left its
    queue and its VALUE went with the closed connection.  Kestrel ran nothing after the error;
    here the get's item must come back."""
    qa, qb = queue_on(1, "ca"), queue_on(0, "cb")
    setup = Client(server.connect())
    assert setup.ask(b"set %s 0 0 1\r\na\r\nset %s 0 0 1\r\nb\r\n" % (qa, qb),
                     b"STORED\r\nSTORED\r\n") == b"STORED\r\nSTORED\r\n"
    setup.close()
    c, watcher = [clients_of(server, ["lanner-w0"])["lanner-w0"] for _ in range(2)]
    assert c.ask(b"get %s/open\r\n" % qa, b"END\r\n") == b"VALUE %s/open 0 1\r\na\r\nEND\r\n" % qa
    w1 = next(p for p in psutil.Process(server.proc.pid).children() if p.name() == "lanner-w1")
    w1.send_signal(signal.SIGSTOP)
    try:
        c.send(pipeline % {b"qa": qa, b"qb": qb})
        # worker 0 has run the get: the item is no longer at the head of its queue
        assert wait_for(lambda: watcher.ask(b"get %s/peek\r\n" % qb, b"END\r\n") == b"END\r\n", 10)
    finally:
        w1.send_signal(signal.SIGCONT)
    out = b""
    c.sock.settimeout(10)
    while True:
        chunk = c.sock.recv(65536)
        if not chunk:
            break
        out += chunk
    assert out == b"ERROR\r\n", out
    assert item_back(server, qb, b"b"), "the item the local get took was lost with the connection"
    assert item_back(server, qa, b"a")
