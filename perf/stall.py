"""A client that shows how long a server holds its requests: back-to-back `get`s of an empty
queue, each timed, in a process of its own (a thread would share the measuring process's
interpreter lock, and its own stalls would be counted as the server's).

`start(port, queue, path)` runs `python -m lanner.perf.stall PORT QUEUE PATH`; the child times
every get until a line arrives on its stdin, then writes (start, seconds) of each, as native
doubles, to PATH (`time.perf_counter`, which on Linux is the system-wide monotonic clock, so
the starts compare with the parent's own readings).  `finish` stops it and returns them;
`within` picks the gets that overlap time windows (scrapes, quiet spells) and `summary` gives
their count, p50, p99 and max.  Used by the `scrape` scenario and tests/ops.
"""
from __future__ import annotations

import array
import select
import socket
import statistics
import subprocess
import sys
import time


def start(port: int, queue: str, path: str, host: str = "127.0.0.1") -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "lanner.perf.stall", host, str(port), queue, path],
                            stdin=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, path: str, timeout: float = 30.0) -> list[tuple[float, float]]:
    """Stop the child; its gets as (start, seconds)."""
    proc.communicate("stop\n", timeout=timeout)
    if proc.returncode:
        raise RuntimeError(f"the stall client exited with status {proc.returncode}")
    a = array.array("d")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    return list(zip(a[0::2], a[1::2]))


def within(gets, windows) -> list[list[float]]:
    """For each (t0, t1) window, the durations of the gets in flight during it."""
    return [[d for t, d in gets if t < t1 and t + d > t0] for t0, t1 in windows]


def summary(durations: list[float]) -> dict:
    """count, p50, p99 and max in milliseconds (zeros when there is none)."""
    if not durations:
        return {"n": 0, "p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}
    xs = sorted(durations)
    return {"n": len(xs), "p50_ms": 1000 * statistics.median(xs),
            "p99_ms": 1000 * xs[min(len(xs) - 1, int(len(xs) * 0.99))], "max_ms": 1000 * xs[-1]}


def main(argv: list[str]) -> int:
    host, port, queue, path = argv[0], int(argv[1]), argv[2].encode(), argv[3]
    s = socket.create_connection((host, port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    cmd = b"get %s\r\n" % queue
    out = array.array("d")
    clock = time.perf_counter
    while not select.select([sys.stdin], [], [], 0)[0]:
        t = clock()
        s.sendall(cmd)
        buf = s.recv(4096)
        while not buf.endswith(b"END\r\n"):
            chunk = s.recv(4096)
            if not chunk:
                raise ConnectionError("the server closed the connection")
            buf += chunk
        if buf != b"END\r\n":
            raise ValueError(f"{queue.decode()} is not empty: {buf[:60]!r}")
        out.append(t)
        out.append(clock() - t)
    with open(path, "wb") as f:
        out.tofile(f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
