"""Servers under test: start Lanner, memcached or the C stand-in (standin.c), or describe one
already running at host:port.

A `Target` is what scenarios talk to: an address, a kind (`kestrel` for servers with queue
semantics, `memcached` for a plain key-value cache used as the protocol ceiling) and, when the
server's processes are on this machine, a `ProcTree` that sums CPU time and memory over the
root process and all of its descendants (Lanner is a supervisor with front and worker children).

For a server the suite did not start, the root process is `--server-pid`, or the process that
listens on the port; its ancestors are climbed while they run the same command line, which is
what a forked child of a supervisor looks like.
"""
from __future__ import annotations

import getpass
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from lanner.perf.loadgen import LoadgenError, ensure_built

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 60.0
REPO_ROOT = Path(__file__).resolve().parent.parent


class ServerError(RuntimeError):
    """A server could not be started or found."""


PORTS_ENV = "LANNER_PORTS"
_next_port: list[int] = []


def free_port() -> int:
    """A free 127.0.0.1 port for a server about to be started.  `LANNER_PORTS=LO-HI` (e.g.
    24000-24999) keeps every server of a run inside that range, so runs that share a machine stay
    in the ports they were given.  Without it the port comes from just below the kernel's
    ephemeral range: a port the kernel picked (bind to port 0) is one it also hands to outgoing
    connections, and one of those could take it between this check and the server's bind (CI saw
    "cannot listen on 127.0.0.1:52179 (text): Address already in use").  The range is walked from
    a start drawn per process: a port a finished test just released is not handed out again at
    once, and two runs given the same range rarely meet."""
    span = os.environ.get(PORTS_ENV)
    if span:
        try:
            lo, hi = (int(x) for x in span.split("-"))
        except ValueError:
            raise ServerError(f"{PORTS_ENV}={span!r}: expected a range LO-HI such as 24000-24999") from None
    else:
        lo, hi = below_ephemeral()
        if lo > hi:                     # no room below it: let the kernel pick, as before
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                return s.getsockname()[1]
    size = hi - lo + 1
    if not _next_port or not lo <= _next_port[0] <= hi:
        _next_port[:] = [lo + (os.getpid() * 7919 + time.monotonic_ns()) % size]
    for _ in range(size):
        port = _next_port[0]
        _next_port[0] = lo + (port + 1 - lo) % size
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    where = f"{PORTS_ENV}={span}" if span else f"ports {lo}-{hi} (below the ephemeral range)"
    raise ServerError(f"{where}: no free port in that range")


def below_ephemeral(span: int = 10_000) -> tuple[int, int]:
    """Up to `span` ports just below the kernel's ephemeral range (net.ipv4.ip_local_port_range),
    above the privileged ones; (1, 0), an empty range, if there is no room or no such file."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            first = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 1, 0
    return max(1024, first - span), first - 1


@dataclass(slots=True)
class ProcTree:
    """CPU and memory of a server's processes; processes that exit keep their last CPU reading."""
    root_pid: int
    _procs: dict = field(default_factory=dict)
    _last_cpu: dict = field(default_factory=dict)
    _roles: dict = field(default_factory=dict)

    def processes(self) -> list[psutil.Process]:
        try:
            root = self._procs.get(self.root_pid) or psutil.Process(self.root_pid)
            found = [root] + root.children(recursive=True)
        except psutil.NoSuchProcess:
            found = []
        live = {}
        for p in found:
            live[p.pid] = self._procs.get(p.pid, p)
        self._procs = live
        return list(live.values())

    def cpu_seconds(self) -> float:
        """User + system CPU of every process seen so far (including ones that exited since)."""
        for p in self.processes():
            try:
                t = p.cpu_times()
                self._last_cpu[p.pid] = t.user + t.system
                if p.pid not in self._roles:
                    self._roles[p.pid] = role_of(p, self.root_pid)
            except psutil.NoSuchProcess:
                pass
        return sum(self._last_cpu.values())

    def count(self, role: str) -> int:
        """How many of the server's live processes have `role` (worker, front, admin, ...)."""
        self.cpu_seconds()
        return sum(1 for pid in self._procs if self._roles.get(pid) == role)

    def cpu_by_role(self) -> dict[str, float]:
        """`cpu_seconds()` split by process role (worker, front, cleaner, supervisor; one
        process server: main), read at the same instant."""
        self.cpu_seconds()
        out: dict[str, float] = {}
        for pid, s in self._last_cpu.items():
            role = self._roles.get(pid, "other")
            out[role] = out.get(role, 0.0) + s
        return out

    def memory(self) -> dict:
        """Summed RSS, PSS and USS in bytes.  PSS splits shared pages fairly between the forks."""
        rss = pss = uss = 0
        procs = self.processes()
        for p in procs:
            try:
                m = p.memory_full_info()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            rss += m.rss
            pss += getattr(m, "pss", m.rss)
            uss += getattr(m, "uss", m.rss)
        return {"rss": rss, "pss": pss, "uss": uss, "processes": len(procs)}


def role_of(p: psutil.Process, root_pid: int) -> str:
    """A Lanner child names itself lanner-w0 / lanner-f1 / lanner-admin / lanner-cleaner (PR_SET_NAME)."""
    try:
        name = p.name()
    except psutil.Error:
        return "other"
    if name.startswith("lanner-w"):
        return "worker"
    if name.startswith("lanner-f"):
        return "front"
    if name == "lanner-cleaner":
        return "cleaner"
    if name == "lanner-admin":
        return "admin"
    if p.pid == root_pid:
        return "supervisor" if name.startswith("python") or "lanner" in name else "main"
    return "other"


@dataclass(slots=True)
class Target:
    name: str
    kind: str
    host: str
    port: int
    thrift_port: int | None = None
    admin_port: int | None = None
    tree: ProcTree | None = None
    proc: subprocess.Popen | None = None
    workdir: str | None = None
    settings: dict = field(default_factory=dict)

    @property
    def queues(self) -> bool:
        """Whether the server has queue semantics (payload and ordering checks make sense)."""
        return self.kind == "kestrel"

    def describe(self) -> dict:
        return {"name": self.name, "kind": self.kind, "host": self.host, "port": self.port,
                "thrift_port": self.thrift_port, "root_pid": self.tree.root_pid if self.tree else None,
                **self.settings}

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM, and SIGKILL after `grace` seconds (longer for a server under valgrind)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc is not None and self.proc.stdout:
            self.proc.stdout.close()
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None


def wait_for_port(host: str, port: int, proc: subprocess.Popen | None, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ServerError(f"server exited with status {proc.returncode} before listening on {host}:{port}")
        try:
            socket.create_connection((host, port), timeout=1.0).close()
            return
        except OSError:
            time.sleep(0.05)
    raise ServerError(f"nothing listens on {host}:{port} after {timeout:.0f} s")


def start_memcached(port: int | None = None, extra: list[str] | None = None) -> Target:
    """Debian's memcached on 127.0.0.1, sized so 8 MiB items and 1000+ connections fit."""
    binary = shutil.which("memcached") or "/usr/bin/memcached"
    if not os.path.exists(binary):
        raise ServerError("memcached is not installed (apt-get install memcached)")
    port = port or free_port()
    args = [binary, "-l", "127.0.0.1", "-p", str(port), "-U", "0", "-c", "4096", "-m", "1024", "-I", "16m"]
    if os.geteuid() == 0:
        args += ["-u", getpass.getuser()]
    args += list(extra or [])
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_port("127.0.0.1", port, proc, 10.0)
    log.info("memcached pid %d on 127.0.0.1:%d", proc.pid, port)
    return Target("memcached", "memcached", "127.0.0.1", port, tree=ProcTree(proc.pid), proc=proc,
                  settings={"args": " ".join(args[1:])})


def start_standin(burn_us: float, port: int | None = None) -> Target:
    """perf/standin.c on 127.0.0.1: one queue, Lanner's syscalls per request and per turn, and
    `burn_us` µs of spinning per request in place of Python; its journal goes to a temporary
    folder.  Kind `memcached`: it answers set/get but has no stats or flush."""
    try:
        binary = ensure_built(Path(__file__).with_name("standin.c"))
    except LoadgenError as e:
        raise ServerError(str(e)) from None
    port = port or free_port()
    workdir = tempfile.mkdtemp(prefix="lanner-standin-")
    args = [binary, str(port), str(int(burn_us * 1000)), os.path.join(workdir, "journal")]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    target = Target("standin", "memcached", "127.0.0.1", port, tree=ProcTree(proc.pid), proc=proc,
                    workdir=workdir, settings={"burn_us": burn_us})
    try:
        wait_for_port("127.0.0.1", port, proc, 10.0)
    except BaseException:
        target.stop()
        raise
    log.info("standin pid %d on 127.0.0.1:%d, %s µs per request", proc.pid, port, burn_us)
    return target


def start_lanner(workers: int | None = None, fronts: int | None = None, config: str | None = None, thrift: bool = False,
                 extra: list[str] | None = None, queue_path: str | None = None, wrap: list[str] | None = None,
                 python: str | None = None, env: dict | None = None, ready_timeout: float = READY_TIMEOUT_S) -> Target:
    """`lanner serve` on free 127.0.0.1 ports with its data in a fresh temporary directory.
    The admin port is on, as `lanner serve`'s is, so the admin process is in every figure
    (`--lanner-arg=--admin-port=off` leaves it out).  `wrap` runs the server under another
    command (servegrind's valgrind), `python` is the interpreter with the lanner to measure
    (another checkout's venv), `env` adds to the server's environment."""
    workdir = tempfile.mkdtemp(prefix="lanner-perf-")
    mc, ad = free_port(), free_port()
    th = free_port() if thrift else None
    extra = list(extra or [])
    for i, a in enumerate(extra):        # the last --admin-port wins, as in `lanner serve`
        if a.startswith("--admin-port"):
            value = a.split("=", 1)[1] if "=" in a else (extra[i + 1] if i + 1 < len(extra) else "")
            ad = int(value) if value.isdigit() else None
    args = [python or sys.executable, "-m", "lanner.cli", "serve",
            "--queue-path", queue_path or os.path.join(workdir, "queues"),
            "--status-file", os.path.join(workdir, "status"), "--listen", "127.0.0.1",
            "--memcache-port", str(mc), "--text-port", "off", "--admin-port", str(ad) if ad else "off",
            "--thrift-port", str(th) if th else "off"]
    if workers is not None:          # None: `lanner serve`'s own default layout
        args += ["--workers", str(workers)]
    if fronts is not None:
        args += ["--fronts", str(fronts)]
    if config:
        args += ["--config", os.path.abspath(config)]
    args += extra
    env = dict(os.environ, **(env or {}))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    # stderr goes to a file: a long run's logging must never fill a pipe nobody reads and stall the server
    with open(os.path.join(workdir, "lanner.log"), "wb") as err:
        proc = subprocess.Popen(list(wrap or []) + args, stdout=subprocess.PIPE, stderr=err, cwd=workdir, env=env)
    target = Target("lanner", "kestrel", "127.0.0.1", mc, thrift_port=th, admin_port=ad, tree=ProcTree(proc.pid), proc=proc,
                    workdir=workdir, settings={"workers": workers, "fronts": fronts, "config": config,
                                               "args": " ".join(args[3:])})
    try:
        _wait_ready(proc, os.path.join(workdir, "lanner.log"), ready_timeout)
        threading.Thread(target=_drain, args=(proc.stdout,), daemon=True).start()
    except BaseException:
        target.stop()
        raise
    log.info("lanner serve pid %d on 127.0.0.1:%d (workers %s, fronts %s)", proc.pid, mc, workers, fronts)
    return target


def _drain(stream) -> None:
    """Reads whatever the server prints after its ready line, until it exits (or stop() closes it)."""
    try:
        for _ in stream:
            pass
    except (ValueError, OSError):
        pass


def ready_line(proc: subprocess.Popen, timeout: float) -> bytes:
    """Read `lanner serve`'s stdout until its `lanner ready ...` line, the server exits, or
    `timeout` seconds pass; the last line read (the ready line when it started).  The test
    helpers start servers through it too, so both wait for readiness the same way."""
    deadline = time.monotonic() + timeout
    line = b""
    # poll, not select: a test process may hold descriptors past select's FD_SETSIZE (1024)
    waiting = select.poll()
    waiting.register(proc.stdout, select.POLLIN)
    while time.monotonic() < deadline:
        if waiting.poll(500):
            line = proc.stdout.readline()
            if line.startswith(b"lanner ready"):
                return line
            if not line and proc.poll() is not None:
                break
        elif proc.poll() is not None:
            break
    return line


def _wait_ready(proc: subprocess.Popen, log_path: str, timeout: float) -> None:
    line = ready_line(proc, timeout)
    if line.startswith(b"lanner ready"):
        return
    proc.kill()
    proc.wait()
    with open(log_path, "rb") as f:
        err = f.read().decode(errors="replace")
    raise ServerError(f"lanner serve did not become ready (last stdout line {line!r}): {err[-2000:]}")


def external(host: str, port: int, kind: str, server_pid: int | None = None,
             thrift_port: int | None = None) -> Target:
    """A server somebody else started; its processes are measured when they are on this machine."""
    pid = server_pid or find_server_pid(host, port)
    return Target(f"{host}:{port}", kind, host, port, thrift_port=thrift_port,
                  tree=ProcTree(pid) if pid else None)


def find_server_pid(host: str, port: int) -> int | None:
    """The root of the process tree that listens on `port` here, or None if it is not local."""
    if host not in ("127.0.0.1", "localhost", "::1", "0.0.0.0") and not _is_local(host):
        return None
    try:
        conns = psutil.net_connections(kind="tcp")
    except psutil.AccessDenied:
        return None
    pids = [c.pid for c in conns if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid]
    if not pids:
        return None
    proc = psutil.Process(pids[0])
    try:
        cmd = proc.cmdline()
        parent = proc.parent()
        while parent is not None and parent.pid != 1 and parent.cmdline() == cmd:
            proc, parent = parent, parent.parent()
    except psutil.Error:
        pass
    return proc.pid


def _is_local(host: str) -> bool:
    try:
        addrs = {a[4][0] for a in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    local = {a.address for nic in psutil.net_if_addrs().values() for a in nic}
    return bool(addrs & local)
