"""Durable load against a live server, with the books a fault test checks afterwards.

Writers `set` numbered items and remember every STORED one; readers take items with
`get q/open` and confirm them with `get q/close`, remembering what was confirmed (the
close answered) and what was only handed out (the connection died in between, so the
server may have rolled it back or not).  `verify` drains the queues and checks the two
promises: nothing acknowledged is lost, nothing confirmed comes back.
"""
from __future__ import annotations

import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from lanner.queues.placement import worker_of

IO_TIMEOUT = 5.0


class Conn:
    """A blocking memcache connection with a read buffer (OSError on any trouble)."""

    def __init__(self, port: int, timeout: float = IO_TIMEOUT) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def ask(self, line: bytes, terminator: bytes = b"\r\n") -> bytes:
        self.sock.sendall(line)
        while terminator not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionResetError("server closed the connection")
            self.buf += chunk
        i = self.buf.index(terminator) + len(terminator)
        out, self.buf = self.buf[:i], self.buf[i:]
        return out

    def set(self, queue: bytes, data: bytes) -> bytes:
        return self.ask(b"set %s 0 0 %d\r\n%s\r\n" % (queue, len(data), data))

    def get(self, queue: bytes, opts: bytes = b"") -> bytes | None:
        """The item's data, or None for an empty answer."""
        r = self.ask(b"get %s%s\r\n" % (queue, opts), b"END\r\n")
        if r == b"END\r\n":
            return None
        if not r.startswith(b"VALUE "):
            raise ConnectionResetError(f"unexpected reply {r[:80]!r}")
        return r.split(b"\r\n", 2)[1]

    def close(self) -> None:
        self.sock.close()


def queues_per_worker(workers: int, prefix: str = "fq") -> list[bytes]:
    """One queue name owned by each worker, so a probe touches every shard."""
    names: dict[int, bytes] = {}
    i = 0
    while len(names) < workers:
        name = f"{prefix}{i}"
        names.setdefault(worker_of(name, workers), name.encode())
        i += 1
    return [names[w] for w in range(workers)]


def service_time(port: int, queues: list[bytes], limit: float, conns: int = 8) -> float | None:
    """Seconds until `conns` fresh connections in a row each get a set and a get answered
    on every queue (SO_REUSEPORT spreads them over the fronts); None after `limit`."""
    t0 = time.monotonic()
    ok = 0
    while time.monotonic() - t0 < limit:
        try:
            c = Conn(port, timeout=1.0)
            try:
                for q in queues:
                    if c.set(q + b"-probe", b"p") != b"STORED\r\n":
                        raise ConnectionResetError("not stored")
                    if c.get(q + b"-probe") != b"p":
                        raise ConnectionResetError("probe item missing")
            finally:
                c.close()
            ok += 1
            if ok >= conns:
                return time.monotonic() - t0
        except OSError:
            ok = 0
            time.sleep(0.02)
    return None


@dataclass
class Books:
    acked: dict[bytes, list[bytes]] = field(default_factory=dict)     # queue -> STORED items
    confirmed: list[bytes] = field(default_factory=list)              # taken and confirmed
    uncertain: set[bytes] = field(default_factory=set)                # taken, confirm unanswered
    errors: int = 0


class Load:
    """`writers` threads per queue list round-robin, `readers` threads taking and confirming."""

    def __init__(self, port: int, queues: list[bytes], writers: int = 4, readers: int = 1,
                 tag: str = "") -> None:
        self.port = port
        self.queues = queues
        self.books = Books(acked={q: [] for q in queues})
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.tag = tag.encode()
        self.threads = [threading.Thread(target=self.writer, args=(n,), daemon=True)
                        for n in range(writers)]
        self.threads += [threading.Thread(target=self.reader, args=(n,), daemon=True)
                         for n in range(readers)]

    def start(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def stop(self) -> Books:
        self.stopping.set()
        for t in self.threads:
            t.join(IO_TIMEOUT * 3)
            assert not t.is_alive(), "a load thread is stuck"
        return self.books

    def count(self) -> int:
        with self.lock:
            return sum(len(v) for v in self.books.acked.values())

    def _connect(self) -> Conn | None:
        try:
            return Conn(self.port)
        except OSError:
            with self.lock:
                self.books.errors += 1
            time.sleep(0.02)
            return None

    def _loop(self, step) -> None:
        """Call `step(conn, i)` for i = 0, 1, ... until stopped, on a connection made here and
        made again after `step` reports it failed (returns False): writers and readers survive
        a killed process alike."""
        c = None
        i = 0
        while not self.stopping.is_set():
            if c is None:
                c = self._connect()
                continue
            ok = step(c, i)
            i += 1
            if not ok:
                c.close()
                c = None

    def writer(self, n: int) -> None:
        def put(c: Conn, i: int) -> bool:
            q = self.queues[i % len(self.queues)]
            data = b"%s-w%d-%d" % (self.tag, n, i)
            try:
                r = c.set(q, data)
            except OSError:
                r = b""
            with self.lock:
                if r == b"STORED\r\n":
                    self.books.acked[q].append(data)
                    return True
                self.books.errors += 1
            return False
        self._loop(put)

    def reader(self, n: int) -> None:
        def take(c: Conn, i: int) -> bool:
            q = self.queues[(n + i) % len(self.queues)]
            item = None
            try:
                item = c.get(q, b"/open")
                if item is None:
                    return True
                if c.get(q, b"/close") is not None:
                    raise ConnectionResetError("close handed out an item")
                with self.lock:
                    self.books.confirmed.append(item)
                    self.books.uncertain.discard(item)
                return True
            except OSError:
                with self.lock:
                    self.books.errors += 1
                    if item is not None:
                        self.books.uncertain.add(item)
                return False
        self._loop(take)


@dataclass
class Verdict:
    checked: int          # acknowledged items accounted for
    lost: list[bytes]
    redelivered: list[bytes]
    duplicated: list[bytes]


def verify(port: int, books: Books) -> Verdict:
    """Drain every queue and hold the books against what is left."""
    c = Conn(port)
    remaining: list[bytes] = []
    for q in books.acked:
        while (item := c.get(q)) is not None:
            remaining.append(item)
    c.close()
    left = set(remaining)
    confirmed = set(books.confirmed)
    acked = [d for items in books.acked.values() for d in items]
    lost = [d for d in acked if d not in left and d not in confirmed and d not in books.uncertain]
    redelivered = sorted(confirmed & left)
    duplicated = sorted(d for d, n in Counter(remaining + books.confirmed).items() if n > 1)
    return Verdict(len(acked), lost, redelivered, duplicated)
