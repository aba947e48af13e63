"""kill -9 workers while fresh clients connect, set and get: what do clients see, what is lost?

    python -m lanner.perf.stress_restarts [--seconds 30] [--kill-every 1.5] [--clients 6]
                                          [--only-worker-1]

A real `lanner serve` with two workers.  Client threads each open a new connection, send one to
four commands (a `set` with a unique payload or a plain `get`) on one queue of worker 0 or of
worker 1 (two routed commands move a connection to the other worker: server/local.py), and
close; a killer thread SIGKILLs a worker (alternately, or only worker 1) every `--kill-every`
seconds, give or take half.  Run it beside CPU hogs to widen the races.

It counts, per command: a complete reply, an error line (SERVER_ERROR, which closes the
connection), a close with no reply, a reset.  Each close with no reply is printed with
whether a worker was killed while its connection was open (that death may be the close: the
killed worker may have held the connection); one with no kill meanwhile is a connection
closed in silence by a live server, the defect this hunts (exit status 1).  At the end it
drains both queues through a new connection and reports the stored items neither a client nor the drain got (LOST).  With --only-worker-1 only
worker 1 dies and only worker 0's queue is used, so every lost item was removed by worker 0,
which never died, for a reply that died with worker 1.
"""
from __future__ import annotations

import argparse
import random
import signal
import socket
import threading
import time

import psutil

from lanner.perf.servers import start_lanner
from lanner.queues.placement import worker_of


def queue_of(worker: int, prefix: str) -> bytes:
    i = 0
    while worker_of(f"{prefix}{i}", 2) != worker:
        i += 1
    return f"{prefix}{i}".encode()


def workers(pid: int) -> list[psutil.Process]:
    """The worker processes in index order (lanner-w0, lanner-w1)."""
    out = []
    for p in psutil.Process(pid).children():
        try:
            if p.name().startswith("lanner-w"):
                out.append((p.name(), p))
        except psutil.NoSuchProcess:
            pass
    return [p for _, p in sorted(out, key=lambda t: t[0])]


def read_reply(s: socket.socket, buf: bytes, until_end: bool) -> tuple[bytes, bytes | None]:
    """(one reply, what follows it); (what came, None) if the connection closed first."""
    while True:
        if buf.startswith(b"SERVER_ERROR") or not until_end:
            if b"\r\n" in buf:
                i = buf.index(b"\r\n") + 2
                return buf[:i], buf[i:]
        elif b"END\r\n" in buf:
            i = buf.index(b"END\r\n") + 5
            return buf[:i], buf[i:]
        chunk = s.recv(65536)
        if not chunk:
            return buf, None
        buf += chunk


class Run:
    def __init__(self, port: int, queues: list[bytes]) -> None:
        self.port = port
        self.queues = queues
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.stored: set[bytes] = set()
        self.got: list[bytes] = []
        self.counts = dict.fromkeys(("reply", "error_line", "close_no_reply", "reset", "other"), 0)
        self.silent: list[tuple] = []      # (connection opened at, queue, command index, payload)
        self.kills: list[tuple[float, int]] = []
        self.seq = 0

    def client(self, tid: int) -> None:
        rnd = random.Random(tid)
        while not self.stop.is_set():
            q = rnd.choice(self.queues)
            opened = time.time()
            try:
                s = socket.create_connection(("127.0.0.1", self.port), timeout=30)
            except OSError:
                continue
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                self.commands(s, rnd, q, opened, tid)
            except (ConnectionResetError, BrokenPipeError):
                self.count("reset")
            finally:
                s.close()

    def commands(self, s, rnd, q, opened, tid) -> None:
        buf = b""
        for k in range(rnd.randint(1, 4)):
            payload = None
            if rnd.random() < 0.55:
                with self.lock:
                    self.seq += 1
                    payload = b"%d-%d" % (tid, self.seq)
                s.sendall(b"set %s 0 0 %d\r\n%s\r\n" % (q, len(payload), payload))
                r, buf = read_reply(s, buf, False)
                if r == b"STORED\r\n":
                    with self.lock:
                        self.stored.add(payload)
            else:
                s.sendall(b"get %s\r\n" % q)
                r, buf = read_reply(s, buf, True)
                if r.startswith(b"VALUE ") and r.endswith(b"END\r\n"):
                    with self.lock:
                        self.got.append(r.split(b"\r\n")[1])
            if buf is None:
                self.count("close_no_reply" if not r else "other")
                with self.lock:
                    self.silent.append((opened, time.time(), q, k, payload))
                return
            if r.startswith(b"SERVER_ERROR"):
                self.count("error_line")
                return
            self.count("reply" if r.startswith((b"STORED", b"VALUE", b"END")) else "other")

    def count(self, what: str) -> None:
        with self.lock:
            self.counts[what] += 1

    def killer(self, pid: int, every: float, only_1: bool) -> None:
        i = 0
        while not self.stop.wait(every * random.uniform(0.5, 1.5)):
            w = 1 if only_1 else i % 2
            i += 1
            procs = workers(pid)
            if len(procs) == 2:
                try:
                    procs[w].send_signal(signal.SIGKILL)
                    self.kills.append((time.time(), w))
                except psutil.NoSuchProcess:
                    pass

    def drain(self, timeout: float = 60.0) -> list[bytes]:
        """Every item left, through new connections until both workers answer."""
        end = time.time() + timeout
        out: list[bytes] = []
        while time.time() < end:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=10) as d:
                    buf = b""
                    for q in self.queues:
                        while True:
                            d.sendall(b"get %s\r\n" % q)
                            r, buf = read_reply(d, buf, True)
                            if r == b"END\r\n":
                                break
                            if not r.startswith(b"VALUE "):
                                raise ConnectionError(r)
                            out.append(r.split(b"\r\n")[1])
                return out
            except OSError:
                time.sleep(0.3)        # a worker not yet back: try again
        raise RuntimeError("the server never answered the drain")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--kill-every", type=float, default=1.5)
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--only-worker-1", action="store_true",
                    help="kill only worker 1 and use only worker 0's queue")
    a = ap.parse_args(argv)
    queues = [queue_of(0, "sa"), queue_of(1, "sb")]
    if a.only_worker_1:
        queues = queues[:1]
    t = start_lanner(workers=2, fronts=0, extra=["--admin-port", "off"])
    try:
        run = Run(t.port, queues)
        threads = [threading.Thread(target=run.client, args=(i,)) for i in range(a.clients)]
        threads.append(threading.Thread(target=run.killer, args=(t.proc.pid, a.kill_every, a.only_worker_1)))
        for th in threads:
            th.start()
        time.sleep(a.seconds)
        run.stop.set()
        for th in threads:
            th.join()
        drained = run.drain()
    finally:
        t.stop()
    lost = run.stored - set(run.got) - set(drained)
    print("kills", len(run.kills), "commands", run.counts)
    print("stored", len(run.stored), "got", len(run.got), "drained", len(drained),
          "got twice", len(run.got) - len(set(run.got)), "LOST", len(lost))
    fresh = 0
    for opened, closed, q, k, payload in run.silent:
        # a kill while the connection was open (a little slack: the kill is noted after it is
        # sent) may be the death of the process that held it
        killed = [kt for kt, _ in run.kills if opened - 0.05 <= kt <= closed + 0.05]
        fresh += not killed
        print("close without a reply: %s, command %d (%s), connection open %.3f s, %s"
              % (q.decode(), k, "set" if payload else "get", closed - opened,
                 "a worker killed meanwhile" if killed else "NO KILL WHILE IT WAS OPEN"))
    print("closes without a reply with no kill while the connection was open:", fresh)
    return 1 if fresh else 0


if __name__ == "__main__":
    raise SystemExit(main())
