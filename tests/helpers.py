"""Start a real `lanner serve` the way a user does, on free 127.0.0.1 ports."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

from lanner.perf.servers import free_port, ready_line

READY_TIMEOUT = 60.0


@dataclass
class ServerHandle:
    proc: subprocess.Popen
    memcache_port: int | None
    text_port: int | None
    thrift_port: int | None
    admin_port: int | None
    queue_path: str
    status_file: str
    args: list[str] = field(default_factory=list)
    ready_line: str = ""
    log_path: str = ""

    def log(self) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def connect(self, port: int | None = None, timeout: float = 10.0) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", port or self.memcache_port), timeout=timeout)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()
        return self.proc.returncode


# (workers, dedicated fronts, worker_fronts) of every process layout `lanner serve` offers
LAYOUTS = {"embedded": (2, 0, True), "dedicated": (2, 2, False), "both": (2, 2, True)}


def start_server(tmp_path, *extra: str, workers: int = 1, fronts: int = 0, config: str | None = None,
                 thrift: bool = False, admin: bool = False, queue_path: str | None = None,
                 env: dict | None = None, cwd: str | None = None, worker_fronts: bool = True,
                 layout: str | None = None) -> ServerHandle:
    """Start `lanner serve` and wait for its ready line.  Ports not asked for are turned off.
    `layout` (a LAYOUTS key) overrides workers, fronts and worker_fronts."""
    if layout is not None:
        workers, fronts, worker_fronts = LAYOUTS[layout]
    qp = queue_path or os.path.join(str(tmp_path), "queues")
    status_file = os.path.join(str(tmp_path), "status", "status")
    mc, tx = free_port(), free_port()
    th = free_port() if thrift else None
    ad = free_port() if admin else None
    args = [sys.executable, "-m", "lanner.cli", "serve",
            "--queue-path", qp, "--status-file", status_file, "--listen", "127.0.0.1",
            "--memcache-port", str(mc), "--text-port", str(tx),
            "--thrift-port", str(th) if th else "off", "--admin-port", str(ad) if ad else "off",
            "--workers", str(workers), "--fronts", str(fronts),
            "--worker-fronts", "on" if worker_fronts else "off"]
    if config:
        path = os.path.join(str(tmp_path), "lanner.toml")
        with open(path, "w") as f:
            f.write(config)
        args += ["--config", path]
    args += list(extra)
    # stderr goes to a file: a pipe nobody reads would stall a chatty server once it fills
    log_path = os.path.join(str(tmp_path), "lanner-%d.log" % time.monotonic_ns())
    log = open(log_path, "wb")
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, cwd=cwd or str(tmp_path),
                            env={**os.environ, **(env or {})})
    log.close()
    line = ready_line(proc, READY_TIMEOUT)
    if not line.startswith(b"lanner ready"):
        proc.kill()
        proc.wait()
        with open(log_path, "rb") as f:
            err = f.read().decode(errors="replace")
        raise RuntimeError(f"lanner serve did not become ready: {line!r}\n{err[-4000:]}")
    return ServerHandle(proc, mc, tx, th, ad, qp, status_file, args, line.decode().strip(), log_path)


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            break
        buf += chunk
    return buf


def recv_until(sock: socket.socket, terminator: bytes) -> bytes:
    buf = b""
    while not buf.endswith(terminator):
        chunk = sock.recv(65536)
        if not chunk:
            break
        buf += chunk
    return buf


def wait_for(cond, timeout: float = 30.0) -> bool:
    """Poll `cond` until it holds (True) or `timeout` seconds pass (False), so a test waits on
    the condition it needs rather than a fixed sleep; callers assert on the result and may add
    their own message."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return False
