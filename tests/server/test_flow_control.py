"""Issue 11, defect 5, against a real server: reply buffering is bounded per connection, a client
that never reads stalls only itself, and large set bodies are not buffered whole in the front."""
from __future__ import annotations

import socket
import statistics
import threading
import time

import psutil
import pytest

from tests.helpers import start_server

pytestmark = pytest.mark.integration

MiB = 1 << 20


def front_process(server) -> psutil.Process:
    """The front child (its name is set to `lanner-f0` with PR_SET_NAME)."""
    for p in psutil.Process(server.proc.pid).children():
        if p.name().endswith("-f0"):
            return p
    raise AssertionError("no front process found")


def peak_rss(p: psutil.Process) -> int:
    """VmHWM: the highest resident size the process has had, in bytes."""
    with open(f"/proc/{p.pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def wait_until(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def flood_never_reading(flood: socket.socket, payload: bytes, probe, check=None) -> tuple[int, list[float]]:
    """Send `payload` on `flood`, a client that never reads, while another client's round trip
    `probe()` runs every 10 ms (and `check()` after it), until the server has stopped reading
    the flooder (3 s without progress).  Returns the bytes it read and the probes' times."""
    flood.settimeout(None)            # blocks while the server does not read; shutdown ends it
    sent = [0]

    def sender():
        view = memoryview(payload)
        try:
            while sent[0] < len(payload):
                sent[0] += flood.send(view[sent[0]:sent[0] + 65536])
        except OSError:
            pass                      # the socket was shut down under it
    t = threading.Thread(target=sender, daemon=True)
    t.start()
    times = []
    start = last_change = time.monotonic()
    last_sent = 0
    while True:
        t0 = time.perf_counter()
        probe()
        times.append(time.perf_counter() - t0)
        now = time.monotonic()
        if sent[0] != last_sent:
            last_sent, last_change = sent[0], now
        if now - last_change > 3.0:
            break                     # the flooder is stopped: the server no longer reads it
        assert now - start < 60, "the server kept reading a client that never reads"
        if check is not None:
            check()
        time.sleep(0.01)              # (a client asking every 10 ms, not a wait)
    flood.shutdown(socket.SHUT_RDWR)
    flood.close()
    t.join(10)
    return last_sent, times


@pytest.fixture
def server(tmp_path):
    # workers serve no client here: every connection is the front's, the process measured
    # (with workers serving too, SO_REUSEPORT could give one to the worker, and a test pass
    # while looking at an idle front; the default layout's case: test_issue11_recheck.py)
    h = start_server(tmp_path, workers=1, fronts=1, worker_fronts=False)
    yield h
    h.stop()


def test_a_client_that_never_reads_stalls_only_itself(server):
    """1M pipelined `get pk/peek` (13 MB) from a client that never reads, while another client
    asks `get other` every 10 ms.  On main the front read all 13 MB, grew by ~800 MiB, and the
    other client's first answer took 13-27 s (it sat behind a million requests in the worker's
    ring); now the front stops reading the flooder, holds a few MiB, and the other client is
    answered at once throughout."""
    setup = server.connect()
    setup.sendall(b"set pk 0 0 100\r\n" + b"x" * 100 + b"\r\n")
    assert setup.recv(100) == b"STORED\r\n"
    front = front_process(server)
    before = peak_rss(front)

    flood = server.connect()
    flood.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    payload = b"get pk/peek\r\n" * 1_000_000
    other = server.connect()
    other.settimeout(10)

    def probe():
        other.sendall(b"get other\r\n")
        assert other.recv(100) == b"END\r\n"

    def check():
        assert peak_rss(front) - before < 48 * MiB
    last_sent, times = flood_never_reading(flood, payload, probe, check)
    growth = peak_rss(front) - before
    print(f"front read {last_sent / MiB:.1f} of {len(payload) / MiB:.1f} MiB; peak RSS growth "
          f"{growth / MiB:.1f} MiB; other client: {len(times)} round trips, median "
          f"{statistics.median(times) * 1000:.2f} ms, max {max(times) * 1000:.1f} ms")
    assert last_sent < len(payload)
    assert growth < 48 * MiB
    # the defect took 13-27 s; these bounds leave room for a loaded 2-core CI box (a 50 ms
    # median bound failed once at load 9 with nothing wrong)
    assert statistics.median(times) < 0.2
    assert max(times) < 2.0


def test_a_deep_pipeline_is_answered_in_full_and_in_order(server):
    n = 50_000
    c = server.connect()
    c.settimeout(60)
    out = b"".join(b"set order 0 0 %d\r\n%d\r\n" % (len(b"%d" % i), i) for i in range(n))
    out += b"get order\r\n" * n
    t = threading.Thread(target=c.sendall, args=(out,), daemon=True)
    t.start()
    want = b"STORED\r\n" * n + b"".join(b"VALUE order 0 %d\r\n%d\r\nEND\r\n" % (len(b"%d" % i), i)
                                       for i in range(n))
    got = bytearray()
    while len(got) < len(want):
        chunk = c.recv(1 << 20)
        assert chunk, "connection closed early"
        got += chunk
    t.join(10)
    assert bytes(got) == want


def test_a_large_set_body_is_not_buffered_whole_in_the_front(server):
    size = 48 * MiB
    front = front_process(server)
    before = peak_rss(front)
    c = server.connect()
    c.settimeout(60)
    c.sendall(b"set big 0 0 %d\r\n" % size)
    block = bytes(range(256)) * 4096
    for _ in range(size // len(block)):
        c.sendall(block)
    c.sendall(b"\r\n")
    assert c.recv(100) == b"STORED\r\n"
    growth = peak_rss(front) - before
    c.sendall(b"get big/peek\r\n")
    head = b"VALUE big/peek 0 %d\r\n" % size
    got = bytearray()
    while len(got) < len(head) + size + 7:
        chunk = c.recv(4 * MiB)
        assert chunk
        got += chunk
    assert got[:len(head)] == head and got[len(head):len(head) + 4096] == block[:4096]
    assert bytes(got[len(head):len(head) + size]) == block * (size // len(block))
    print(f"front peak RSS growth while a {size / MiB:.0f} MiB body arrived: {growth / MiB:.1f} MiB")
    assert growth < size // 4
