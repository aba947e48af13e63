"""`--version`, `--log-file` with SIGUSR1 reopen, `--log-level debug`, the systemd
readiness datagram, and the unit file (systemd-analyze verify when available)."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

from lanner import __version__
from lanner.config import default_layout, load_config
from lanner.perf.servers import ready_line
from tests.helpers import ServerHandle, free_port, recv_until, start_server

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def lanner(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lanner.cli", *args], capture_output=True, text=True,
                          timeout=60)


def test_version():
    for argv in (["--version"], ["serve", "--version"]):
        r = lanner(*argv)
        assert r.returncode == 0 and r.stdout.strip() == f"lanner {__version__}", (argv, r)


def wait_for_text(path: str, text: str, timeout: float = 15.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(path, encoding="utf-8") as f:
                body = f.read()
        except FileNotFoundError:       # reopened on the next line, which may not be written yet
            body = ""
        if text in body:
            return body
        assert time.monotonic() < deadline, f"{text!r} never reached {path}:\n{body[-2000:]}"
        time.sleep(0.05)


@pytest.mark.integration
def test_log_file_reopened_on_sigusr1(tmp_path):
    log = str(tmp_path / "lanner.log")
    server = start_server(tmp_path, "--log-file", log, "--log-level", "debug", workers=1, fronts=1,
                          worker_fronts=False)      # one front, one worker: each logs its own lines
    try:
        assert server.log() == ""                         # nothing on stderr
        wait_for_text(log, "ready: 1 workers, 1 fronts")
        with server.connect() as s:
            s.sendall(b"set debugq 0 0 1\r\nx\r\n")
            assert recv_until(s, b"\r\n") == b"STORED\r\n"
        body = wait_for_text(log, "queue 'debugq': created")          # a worker's debug line
        assert "connection 1 from ('127.0.0.1'" in body              # a front's debug line
        # logrotate: move the file away, then SIGUSR1 to the main process
        os.rename(log, log + ".1")
        server.proc.send_signal(signal.SIGUSR1)
        wait_for_text(log, "log file reopened")
        with server.connect() as s:                                   # a front and a worker log again
            s.sendall(b"status readonly\r\ndelete debugq\r\n")
            recv_until(s, b"END\r\n")
        body = wait_for_text(log, "switched to status ReadOnly")
        assert "connection 2 from" in body
        with open(log + ".1", encoding="utf-8") as f:
            old = f.read()
        assert "log file reopened" not in old and "connection 2 from" not in old
    finally:
        assert server.stop() == 0
    assert "stopped" in wait_for_text(log, "stopped")


def test_unwritable_log_file_is_a_startup_error(tmp_path):
    r = lanner("serve", "--log-file", str(tmp_path / "no" / "such" / "dir" / "x.log"),
               "--queue-path", str(tmp_path / "q"), "--memcache-port", "off")
    assert r.returncode == 1 and r.stderr.startswith("lanner: cannot open log file")


@pytest.mark.integration
def test_sd_notify_ready_and_stopping(tmp_path):
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(30)
    try:
        server = start_server(tmp_path, env={"NOTIFY_SOCKET": path})
        # the datagram is sent right after the ready line, which start_server has seen
        msg = sock.recv(4096).decode().split("\n")
        assert "READY=1" in msg and f"MAINPID={server.proc.pid}" in msg
        assert f"STATUS=memcache=127.0.0.1:{server.memcache_port} text=127.0.0.1:{server.text_port}" in msg
        server.proc.send_signal(signal.SIGHUP)
        assert sock.recv(4096).decode().startswith("RELOADING=1\nMONOTONIC_USEC=")
        assert "READY=1" in sock.recv(4096).decode()
        assert server.stop() == 0
        assert sock.recv(4096) == b"STOPPING=1"
    finally:
        sock.close()


def test_unit_file(tmp_path):
    unit = open(os.path.join(REPO, "etc", "lanner.service")).read()
    for line in ("Type=notify", "ExecReload=/bin/kill -HUP $MAINPID", "LimitNOFILE=1048576"):
        assert line in unit
    exe = shutil.which("lanner") or os.path.join(os.path.dirname(sys.executable), "lanner")
    analyze = shutil.which("systemd-analyze")
    if analyze is None or not os.path.exists(exe):
        pytest.skip("systemd-analyze (or the lanner script) is not available here")
    path = tmp_path / "lanner.service"
    path.write_text(unit.replace("/usr/local/bin/lanner", exe))
    r = subprocess.run([analyze, "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_production_config_loads():
    c = load_config(os.path.join(REPO, "etc", "production.toml"))
    assert c.server.listen_address == "0.0.0.0" and c.server.max_open_transactions == 100
    assert c.default.sync_journal == 100 and c.server.log_file == "/var/log/lanner/lanner.log"
    # the shipped production config keeps the measured-fastest layout, not an older one
    assert (c.server.workers, c.server.fronts) == default_layout() and c.server.worker_fronts


@pytest.mark.integration
def test_serve_without_layout_flags_runs_one_serving_worker_per_cpu(tmp_path):
    """`lanner serve` with no --workers/--fronts on a machine of two CPUs (here its affinity, as
    taskset or a cgroup cpuset gives it) runs default_layout's workers for the CPUs it may use,
    one per CPU, and they serve the clients themselves (perf/README.md, "Layouts (processes)")."""
    cpus = set(sorted(os.sched_getaffinity(0))[:2])
    port = free_port()
    args = [sys.executable, "-m", "lanner.cli", "serve", "--queue-path", str(tmp_path / "q"),
            "--status-file", str(tmp_path / "status"), "--listen", "127.0.0.1", "--memcache-port", str(port),
            "--text-port", "off", "--thrift-port", "off", "--admin-port", "off"]
    with open(tmp_path / "lanner.log", "wb") as log:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, cwd=str(tmp_path),
                                preexec_fn=lambda: os.sched_setaffinity(0, cpus))
    server = ServerHandle(proc, port, None, None, None, str(tmp_path / "q"), str(tmp_path / "status"), args)
    try:
        assert ready_line(proc, 60).startswith(b"lanner ready"), (tmp_path / "lanner.log").read_text()
        names = sorted(p.name() for p in psutil.Process(proc.pid).children())
        workers = default_layout(len(cpus))[0]
        assert workers == len(cpus)
        assert [n for n in names if n.startswith("lanner-w")] == [f"lanner-w{i}" for i in range(workers)], names
        assert not [n for n in names if n.startswith("lanner-f")], names     # no dedicated front
        with server.connect() as s:
            s.sendall(b"set job 0 0 2\r\nhi\r\nget job\r\n")
            assert recv_until(s, b"END\r\n") == b"STORED\r\nVALUE job 0 2\r\nhi\r\nEND\r\n"
    finally:
        assert server.stop() == 0
