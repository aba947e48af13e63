"""Issue 11, defect 3: one server per data directory (server/dirlock.py).

A second `lanner serve` on a queue path or status file a live server holds exits 1 with
one line naming it and the holder's pid; the lock outlives nothing (kill -9 of the whole
group frees it); offline tools refuse a held directory unless given --ignore-lock.
"""
import os
import signal
import subprocess
import sys

import psutil
import pytest

from lanner.server import dirlock
from tests.helpers import free_port, start_server
from tests.server.conftest import Client

pytestmark = pytest.mark.integration


def serve_args(qp, status_file):
    return [sys.executable, "-m", "lanner.cli", "serve", "--queue-path", str(qp),
            "--status-file", str(status_file), "--listen", "127.0.0.1",
            "--memcache-port", str(free_port()), "--text-port", "off", "--thrift-port", "off",
            "--admin-port", "off", "--workers", "1", "--fronts", "1"]


def refused(args, cwd):
    """Run a second `lanner serve`; fail at once if it gets as far as its ready line."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd)
    try:
        line = proc.stdout.readline()         # b"" when it exits without serving
        assert not line.startswith(b"lanner ready"), "a second server started on the same data"
        proc.wait(30)
        return proc.returncode, proc.stderr.read().decode().strip()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def lanner(*args):
    return subprocess.run([sys.executable, "-m", "lanner.cli", *args], capture_output=True, timeout=60)


def test_second_server_on_the_same_queue_path_is_refused(tmp_path):
    h = start_server(tmp_path, workers=1, fronts=1)
    try:
        c = Client(h.connect())
        assert c.ask(b"set lq 0 0 2\r\nhi\r\n") == b"STORED\r\n"
        code, err = refused(serve_args(h.queue_path, tmp_path / "other-status"), tmp_path)
        assert code == 1, err
        assert len(err.splitlines()) == 1, err
        assert h.queue_path in err and f"pid {h.proc.pid}" in err
        # the status file is locked too, even behind another queue path
        code, err = refused(serve_args(tmp_path / "other-queues", h.status_file), tmp_path)
        assert code == 1 and len(err.splitlines()) == 1, err
        assert h.status_file in err and f"pid {h.proc.pid}" in err
        # the first server never noticed
        assert c.ask(b"get lq\r\n", b"END\r\n") == b"VALUE lq 0 2\r\nhi\r\nEND\r\n"
    finally:
        assert h.stop() == 0


def test_a_status_file_inside_the_queue_path_is_refused_naming_both(tmp_path):
    """`--queue-path data` run from the folder holding it puts the default status file
    (`data/status`) in the queue directory, whose every file is a journal: a one-line
    refusal naming both, not a worker's stray-file error about `status.lock`."""
    args = serve_args("data", "x")
    del args[args.index("--status-file"):args.index("--status-file") + 2]    # the default
    code, err = refused(args, tmp_path)
    assert code == 1 and len(err.splitlines()) == 1, err
    assert "status file data/status is inside the queue path data" in err, err
    assert "--status-file" in err
    assert not (tmp_path / "data" / "status").exists()      # refused before anything was written
    # the same paths spelt differently clash too
    code, err = refused(serve_args(tmp_path / "data", "data/../data/st"), tmp_path)
    assert code == 1 and "is inside the queue path" in err, err


def test_kill_9_of_the_group_frees_the_directory(tmp_path):
    qp = str(tmp_path / "queues")
    h = start_server(tmp_path, workers=2, fronts=1, queue_path=qp)
    c = Client(h.connect())
    assert c.ask(b"set kq 0 0 1\r\nx\r\n") == b"STORED\r\n"
    kids = psutil.Process(h.proc.pid).children(recursive=True)
    h.proc.send_signal(signal.SIGKILL)
    h.proc.wait()
    for p in kids:                    # nothing cleans up after a kill -9: the kernel does
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(kids, timeout=20)
    assert dirlock.live_holder(qp) is None
    h = start_server(tmp_path, workers=1, fronts=1, queue_path=qp)
    try:
        with open(dirlock.queue_lock_path(qp)) as f:
            assert f.read().strip() == str(h.proc.pid)
        c = Client(h.connect())
        assert c.ask(b"get kq\r\n", b"END\r\n") == b"VALUE kq 0 1\r\nx\r\nEND\r\n"
    finally:
        assert h.stop() == 0
    assert dirlock.live_holder(qp) is None


def test_offline_tools_refuse_a_live_directory(tmp_path):
    cfg = '[queues."jobs.cl"]\nstorage = "cmdlog"\n'
    h = start_server(tmp_path, workers=1, fronts=1, config=cfg)
    try:
        c = Client(h.connect())
        assert c.ask(b"set tq 0 0 1\r\na\r\n") == b"STORED\r\n"
        assert c.ask(b"set jobs.cl 0 0 1\r\nb\r\n") == b"STORED\r\n"
        journal = os.path.join(h.queue_path, "tq")
        root = os.path.join(h.queue_path, "cmdlog")
        part = os.path.join(root, os.listdir(root)[0])
        out = str(tmp_path / "packed")
        for args in (["qdump", journal], ["qpack", "-f", out, journal], ["cmdlog", "check", part],
                     ["cmdlog", "dump", part]):
            r = lanner(*args)
            err = r.stderr.decode().strip()
            assert r.returncode == 1, (args, err)
            assert len(err.splitlines()) == 1 and f"pid {h.proc.pid}" in err, (args, err)
            assert "--ignore-lock" in err
        assert not os.path.exists(out)
        r = lanner("qdump", "--ignore-lock", journal)
        assert r.returncode == 0 and b"ADD 1" in r.stdout, r.stderr
        r = lanner("cmdlog", "check", "--ignore-lock", part)
        assert r.returncode == 0, r.stderr
    finally:
        assert h.stop() == 0
    r = lanner("qpack", "-f", out, journal)
    assert r.returncode == 0, r.stderr
    assert lanner("qdump", out).returncode == 0
