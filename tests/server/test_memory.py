"""Memory of a real server (issue 8: ≤ 80 MB PSS at a 1 GiB backlog).  The full figure is a
benchmark (`python -m lanner.perf memory`); these are the cheap rules behind it:

* every process is forked from the supervisor and inherits what it imported, so the
  supervisor imports nothing the server does not need (the `crc32c` package's own
  __init__ and prometheus-client cost about 4 MB of heap together);
* read-behind keeps a queue's items in memory within `max_memory_size` whatever the
  backlog, and serves the rest from disk in order;
* memory that held a backlog goes back to the OS once the backlog is read.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib

import crc32c as crc32c_package
import psutil

from lanner.storage.cmdlog.crc import crc32c
from tests.helpers import start_server, wait_for
from tests.server.conftest import Client

# Modules no server process needs before it forks: prometheus-client only renders a scrape
# (ops/metrics.py, imported by the process that answers one); importlib.metadata, email,
# csv are what `import crc32c` drags in; the rest belong to tools, Spark, ZooKeeper or perf.
UNNEEDED = ("prometheus_client", "importlib.metadata", "email", "csv", "pyspark", "kazoo",
            "matplotlib", "numpy", "pandas", "thrift", "tqdm")


def test_the_supervisor_imports_nothing_a_server_process_does_not_need():
    """What `lanner serve` has imported when it forks (cli, then the supervisor module)."""
    code = ("import json, sys\n"
            "import lanner.cli\n"
            "import lanner.server.supervisor\n"
            "print(json.dumps(sorted(sys.modules)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONWARNINGS": "ignore"})
    loaded = json.loads(out.stdout.splitlines()[-1])
    extra = [m for m in loaded if m.split(".")[0] in UNNEEDED or m in UNNEEDED
             or any(m.startswith(u + ".") for u in UNNEEDED)]
    assert extra == []


def test_crc32c_loaded_without_its_package_is_the_packages_function():
    assert crc32c(b"123456789") == 0xE3069283            # the CRC-32C check value
    blob = os.urandom(70_000)
    for value in (0, 1, 0xFFFFFFFF, zlib.crc32(blob)):
        assert crc32c(blob, value) == crc32c_package.crc32c(blob, value)
    assert crc32c(memoryview(blob)[5:999]) == crc32c_package.crc32c(blob[5:999])


def stats_of(c: Client, queue: str) -> dict[str, int]:
    c.send(b"stats\r\n")
    out = {}
    prefix = f"queue_{queue}_".encode()
    for line in c.recv_until(b"END\r\n").split(b"\r\n"):
        parts = line.split(b" ")
        if len(parts) == 3 and parts[1].startswith(prefix):
            out[parts[1][len(prefix):].decode()] = int(parts[2])
    return out


def store_numbered(c: Client, queue: bytes, n: int, size: int, batch: int, pad: bytes) -> None:
    """Set items 0..n-1 of `size` bytes (an 8-digit number, then `pad`), `batch` per write."""
    for start in range(0, n, batch):
        c.send(b"".join(b"set %s 0 0 %d\r\n%s\r\n" % (queue, size, b"%08d" % i + pad * (size - 8))
                        for i in range(start, start + batch)))
        for _ in range(batch):
            assert c.recv_until(b"\r\n") == b"STORED\r\n"


def test_read_behind_keeps_a_backlog_out_of_memory(tmp_path):
    """4 MB of 1 KiB items against max_memory_size 64KiB (default layout: two workers that
    serve clients): memory holds at most 64 KiB (plus the one item a refill may overshoot by),
    the rest waits on disk, and every item comes back once, in order."""
    limit, size, n = 64 * 1024, 1024, 4000
    h = start_server(tmp_path, layout="embedded", config='[default]\nmax_memory_size = "64KiB"\n')
    try:
        c = Client(h.connect())
        store_numbered(c, b"rb", n, size, 100, b".")
        s = stats_of(c, "rb")
        assert s["items"] == n
        assert 0 < s["mem_bytes"] <= limit + size
        assert s["mem_items"] == s["mem_bytes"] // size < n // 10
        seen = []
        for i in range(n):
            c.send(b"get rb\r\n")
            reply = c.recv_until(b"END\r\n")
            assert reply.startswith(b"VALUE rb 0 %d\r\n" % size), reply[:40]
            seen.append(int(reply.split(b"\r\n")[1][:8]))
            if i % 1000 == 0:
                s = stats_of(c, "rb")
                assert s["mem_bytes"] <= limit + size, s
        assert seen == list(range(n))
        assert stats_of(c, "rb")["items"] == 0
    finally:
        assert h.stop() == 0


def private_kb(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return sum(int(line.split()[1]) for line in f
                   if line.startswith(("Private_Clean:", "Private_Dirty:")))


def worker_pids(h) -> list[int]:
    return [p.pid for p in psutil.Process(h.proc.pid).children() if p.name().startswith("lanner-w")]


def drain(c: Client, queue: bytes, batch: int, size: int, stored: bool = True) -> None:
    """Read `batch` items of `size` bytes from `queue` (storing them first when `stored`)."""
    if stored:
        store_numbered(c, queue, batch, size, batch, b"-")
    c.send(b"get %s\r\n" % queue * batch)
    for _ in range(batch):
        assert c.recv_until(b"END\r\n").startswith(b"VALUE %s 0 %d\r\n" % (queue, size))


def test_a_drained_backlog_gives_its_memory_back(tmp_path):
    """20 MB of items held in memory (below max_memory_size), then all read: the worker
    that held them returns the heap to the OS within a few seconds (heaptrim.py).  Before,
    glibc kept it all: the worker stayed ~20 MB above where it started, for its life."""
    size, n = 1024, 20_000
    h = start_server(tmp_path, layout="embedded")
    try:
        pids = worker_pids(h)
        assert len(pids) == 2
        c = Client(h.connect())
        batch = 200
        # the baseline is a worker that has served this shape once (its connection, the queue,
        # its journal and buffers exist): what must come back is the backlog's memory, not
        # what the first requests create for good (it failed by 32-268 kB on a loaded box)
        drain(c, b"mb", batch, size)
        before = max(private_kb(p) for p in pids)
        store_numbered(c, b"mb", n, size, batch, b"-")
        full = max(private_kb(p) for p in pids)
        assert full >= before + 16_000, (before, full)       # the items really are in memory
        for start in range(0, n, batch):
            drain(c, b"mb", batch, size, stored=False)
        assert stats_of(c, "mb")["items"] == 0
        assert wait_for(lambda: max(private_kb(p) for p in pids) <= before + 6_000, timeout=20), \
            (before, full, [private_kb(p) for p in pids])
    finally:
        assert h.stop() == 0
