"""The process shape under faults: kill -9 of a front, a worker, the supervisor; worker counts."""
import os
import signal
import socket
import threading
import time

import psutil
import pytest

from tests.helpers import free_port, start_server, wait_for
from tests.server.conftest import Client
from tests.server.test_local import stat

pytestmark = pytest.mark.integration


def children(h):
    return psutil.Process(h.proc.pid).children(recursive=True)


def kind_pids(h, kind):
    out = []
    for p in children(h):
        try:
            name = p.name()
        except psutil.NoSuchProcess:
            continue
        if name == "lanner-cleaner" if kind == "cleaner" else \
                (name.startswith("lanner-" + kind[0]) and name != "lanner-cleaner"):
            out.append(p)
    return out


def client(h, port=None):
    return Client(h.connect(port))


def setq(c, q, data, sync=True):
    return c.ask(b"set %s 0 0 %d\r\n%s\r\n" % (q, len(data), data))


def drain(c, q):
    out = []
    while True:
        r = c.ask(b"get %s\r\n" % q, b"END\r\n")
        if r == b"END\r\n":
            return out
        out.append(r.split(b"\r\n")[1])


def test_same_results_with_more_workers_and_restart(tmp_path):
    """--workers 3 --fronts 2 behaves as --workers 1 --fronts 1, and a restart with another
    worker count loses and reorders nothing."""
    qp = str(tmp_path / "queues")
    h = start_server(tmp_path, workers=3, fronts=2, queue_path=qp)
    try:
        c = client(h)
        for qi in range(8):
            for i in range(20):
                assert setq(c, b"wq%d" % qi, b"%d-%d" % (qi, i)) == b"STORED\r\n"
        got = drain(c, b"wq0")
        assert got == [b"0-%d" % i for i in range(20)]
        assert c.ask(b"get wq1/open\r\n", b"END\r\n").endswith(b"1-0\r\nEND\r\n")
    finally:
        h.stop()
    h = start_server(tmp_path, workers=1, fronts=1, queue_path=qp)
    try:
        c = client(h)
        for qi in range(1, 8):
            assert drain(c, b"wq%d" % qi) == [b"%d-%d" % (qi, i) for i in range(20)]
    finally:
        h.stop()


def test_kill_front_returns_open_reads(tmp_path):
    h = start_server(tmp_path, workers=2, fronts=2)
    try:
        setter = client(h)
        for i in range(3):
            setq(setter, b"fq", b"item%d" % i)
        # open reads on many connections; some land on each front
        conns = []
        for _ in range(12):      # SO_REUSEPORT spreads them over both fronts
            c = client(h)
            conns.append(c)
        opened = []
        for c in conns[:2]:
            r = c.ask(b"get fq/open\r\n", b"END\r\n")
            opened.append(r.split(b"\r\n")[1])
        fronts = kind_pids(h, "front")
        assert len(fronts) == 2
        victim = fronts[0]
        victim.send_signal(signal.SIGKILL)
        assert wait_for(lambda: len(kind_pids(h, "front")) == 2 and victim.pid not in
                        [p.pid for p in kind_pids(h, "front")])
        # clients of the other front notice nothing; the victim's open reads are back
        survivors = []
        for c in conns:
            try:
                if c.ask(b"version\r\n").startswith(b"VERSION"):
                    survivors.append(c)
            except OSError:
                pass
        assert survivors
        fresh = client(h)
        for c in conns:
            c.close()
        # the survivors' open reads go back once their worker has seen the closes
        assert wait_for(lambda: stat(fresh, b"queue_fq_open_transactions") == 0), h.log()
        got = drain(fresh, b"fq")
        assert sorted(got) == [b"item0", b"item1", b"item2"]
    finally:
        h.stop()


@pytest.mark.parametrize("cfg", [
    '[default]\nsync_journal = "always"\n',
    '[default]\nstorage = "cmdlog"\n[cmdlog]\nsync = "always"\nsegment_size = "64KiB"\n',
], ids=["journal", "cmdlog"])
def test_kill_worker_under_load_loses_nothing(tmp_path, cfg):
    h = start_server(tmp_path, workers=2, config=cfg)      # default layout: workers serve clients
    acked = []
    stop = threading.Event()

    def writer(n):
        try:
            c = client(h)
        except OSError:
            return
        i = 0
        while not stop.is_set():
            data = b"w%d-%d" % (n, i)
            try:
                r = c.ask(b"set kq%d 0 0 %d\r\n%s\r\n" % (n, len(data), data))
            except OSError:
                try:
                    c = client(h)
                except OSError:
                    time.sleep(0.05)
                continue
            if r == b"STORED\r\n":
                acked.append((n, data))
            elif not r or r.startswith(b"SERVER_ERROR"):
                try:
                    c.close()
                    c = client(h)
                except OSError:
                    time.sleep(0.05)
            i += 1
    try:
        threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        workers = kind_pids(h, "worker")
        assert len(workers) == 2
        workers[0].send_signal(signal.SIGKILL)
        time.sleep(1.5)
        stop.set()
        for t in threads:
            t.join(30)
        assert wait_for(lambda: len(kind_pids(h, "worker")) == 2)
        c = client(h)
        # every shard serves again
        for n in range(4):
            assert wait_for(lambda: c.ask(b"get kq%d/peek\r\n" % n, b"END\r\n") is not None)
        for n in range(4):
            got = set(drain(c, b"kq%d" % n))
            want = {d for m, d in acked if m == n}
            assert want <= got, f"lost {len(want - got)} acknowledged items on kq{n}"
    finally:
        stop.set()
        h.stop()


def test_kill_supervisor_children_exit(tmp_path):
    h = start_server(tmp_path, workers=2)
    kids = children(h)
    assert len(kids) >= 3
    h.proc.send_signal(signal.SIGKILL)
    h.proc.wait()
    gone, alive = psutil.wait_procs(kids, timeout=20)
    assert not alive, f"orphans: {alive}"
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", h.memcache_port))     # the port is free again
    s.close()


def test_sigterm_clean_exit_and_sighup_reload(tmp_path):
    h = start_server(tmp_path, workers=2, config="[queues.\"rq\"]\nmax_items = 1\n")
    try:
        c = client(h)
        assert setq(c, b"rq", b"1") == b"STORED\r\n"
        assert setq(c, b"rq", b"2") == b"NOT_STORED\r\n"
        with open(os.path.join(str(tmp_path), "lanner.toml"), "w") as f:
            f.write("[queues.\"rq\"]\nmax_items = 5\n")
        assert c.ask(b"reload\r\n") == b"Reloaded config.\r\n"
        assert setq(c, b"rq", b"2") == b"STORED\r\n"
        with open(os.path.join(str(tmp_path), "lanner.toml"), "w") as f:
            f.write("[queues.\"rq\"]\nmax_items = 2\n")
        h.proc.send_signal(signal.SIGHUP)
        assert wait_for(lambda: setq(client(h), b"rq", b"3") == b"NOT_STORED\r\n", 10)
    finally:
        assert h.stop() == 0


def test_port_in_use_is_an_error(tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "lanner.cli", "serve", "--queue-path", str(tmp_path / "q"),
                        "--status-file", str(tmp_path / "st"), "--memcache-port", str(port),
                        "--text-port", "off", "--thrift-port", "off", "--admin-port", "off"],
                       capture_output=True, timeout=60, cwd=tmp_path)
    s.close()
    assert r.returncode != 0
    assert str(port) in r.stderr.decode()
    assert len(r.stderr.decode().strip().splitlines()) == 1


def test_bad_config_is_an_error(tmp_path):
    import subprocess
    import sys
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[default]\nmax_items = \"lots\"\n")
    r = subprocess.run([sys.executable, "-m", "lanner.cli", "serve", "--config", str(cfg)],
                       capture_output=True, timeout=60, cwd=tmp_path)
    assert r.returncode != 0
    assert "max_items" in r.stderr.decode()


def test_an_unusable_queue_path_is_a_one_line_error(tmp_path):
    """contract.md: an unwritable data directory stops start-up with a non-zero status and a
    one-line reason naming it (here the queue path lies under a regular file)."""
    import subprocess
    import sys
    (tmp_path / "afile").write_bytes(b"")
    qp = tmp_path / "afile" / "queues"
    r = subprocess.run([sys.executable, "-m", "lanner.cli", "serve", "--queue-path", str(qp),
                        "--status-file", str(tmp_path / "st"), "--memcache-port", str(free_port()),
                        "--text-port", "off", "--thrift-port", "off", "--admin-port", "off"],
                       capture_output=True, timeout=60, cwd=tmp_path)
    assert r.returncode != 0 and r.stdout == b""
    err = r.stderr.decode()
    assert len(err.strip().splitlines()) == 1 and str(qp) in err, err


def serve_beside_a_stray_file(tmp_path, *layout: str):
    """`lanner serve` over a queue path holding a file that is not a journal: it must refuse
    to start.  Returns (exit status, stderr)."""
    import subprocess
    import sys
    qp = tmp_path / "q"
    qp.mkdir()
    (qp / "foo.txt").write_bytes(b"not a journal")
    r = subprocess.run([sys.executable, "-m", "lanner.cli", "serve", "--queue-path", str(qp),
                        "--status-file", str(tmp_path / "st"), "--memcache-port", str(free_port()),
                        "--text-port", "off", "--thrift-port", "off", "--admin-port", "off", *layout],
                       capture_output=True, timeout=60, cwd=tmp_path)
    return r.returncode, r.stderr.decode()


def test_stray_file_in_queue_path_refuses_start(tmp_path):
    code, err = serve_beside_a_stray_file(tmp_path, "--workers", "1", "--fronts", "1")
    assert code == 3
    assert "foo.txt" in err


def test_a_start_up_failure_every_worker_hits_is_reported_once(tmp_path):
    """contract.md: a one-line reason on stderr.  Both workers replay the queue path and both
    refuse the stray file; the user reads one `lanner:` line, and no log line claims that
    something could not be written."""
    code, err = serve_beside_a_stray_file(tmp_path, "--workers", "2", "--log-level", "warning")
    assert code == 3
    reasons = [line for line in err.splitlines() if line.startswith("lanner:")]
    assert len(reasons) == 1 and "foo.txt" in reasons[0], err
    assert "could be written" not in err


def test_kill_cleaner_is_restarted(tmp_path):
    h = start_server(tmp_path, workers=2)
    try:
        def cleaners():
            return [p.pid for p in kind_pids(h, "cleaner")]
        assert wait_for(lambda: len(cleaners()) == 1)     # (it names itself after its fork)
        old = cleaners()
        os.kill(old[0], signal.SIGKILL)
        assert wait_for(lambda: (pids := cleaners()) and pids != old)
        c = client(h)
        assert setq(c, b"cq", b"x") == b"STORED\r\n"
        assert drain(c, b"cq") == [b"x"]
    finally:
        assert h.stop() == 0
