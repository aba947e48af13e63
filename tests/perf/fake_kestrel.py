"""A tiny in-process FIFO server speaking Kestrel's memcache dialect, for developing the suite.

Only for development (`LANNER_PERF_FAKE=1`): the suite's tests run against a real `lanner serve`
unless that variable is set.  It covers what the scenarios use: `set`, `get` with `/t=`, `/open`,
`/close`, `/abort`, `/peek`, `flush`, `delete`, `stats` (queue items and canceled transactions),
`version`; open reads go back to the head of their queue when their connection closes.
"""
from __future__ import annotations

import collections
import socketserver
import threading
import time


class Store:
    def __init__(self):
        self.cond = threading.Condition()
        self.queues: dict[str, collections.deque] = collections.defaultdict(collections.deque)
        self.canceled: dict[str, int] = collections.defaultdict(int)

    def pop(self, name: str, timeout_ms: int) -> bytes | None:
        deadline = time.monotonic() + timeout_ms / 1000.0
        with self.cond:
            q = self.queues[name]
            while not q:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.cond.wait(left)
            return q.popleft()


class Handler(socketserver.StreamRequestHandler):
    disable_nagle_algorithm = True

    def handle(self):
        store: Store = self.server.store
        opened: list[tuple[str, bytes]] = []
        try:
            while True:
                line = self.rfile.readline()
                if not line:
                    return
                parts = line.rstrip(b"\r\n").decode("latin-1").split(" ")
                cmd = parts[0].lower()
                if cmd == "set":
                    data = self.rfile.read(int(parts[4]) + 2)[:-2]
                    with store.cond:
                        store.queues[parts[1]].append(data)
                        store.cond.notify()
                    self.wfile.write(b"STORED\r\n")
                elif cmd in ("get", "gets"):
                    self.wfile.write(self.get(store, parts[1], opened))
                elif cmd == "flush":
                    with store.cond:
                        store.queues[parts[1]].clear()
                    self.wfile.write(b"END\r\n")
                elif cmd == "delete":
                    with store.cond:
                        store.queues.pop(parts[1], None)
                    self.wfile.write(b"DELETED\r\n")
                elif cmd == "stats":
                    with store.cond:
                        lines = [f"STAT queue_{n}_items {len(q)}\r\nSTAT queue_{n}_canceled_transactions "
                                 f"{store.canceled[n]}\r\n" for n, q in store.queues.items()]
                    self.wfile.write(("STAT uptime 1\r\n" + "".join(lines) + "END\r\n").encode())
                elif cmd == "version":
                    self.wfile.write(b"VERSION fake\r\n")
                else:
                    self.wfile.write(b"CLIENT_ERROR\r\n")
                    return
                self.wfile.flush()
        except (ConnectionError, OSError):
            pass
        finally:
            with store.cond:
                for name, data in opened:
                    store.queues[name].appendleft(data)
                    store.canceled[name] += 1
                store.cond.notify_all()

    def get(self, store: Store, key: str, opened: list) -> bytes:
        name, *opts = key.split("/")
        timeout = 0
        for o in opts:
            if o.startswith("t="):
                timeout = int(o[2:])
        if "close" in opts or "abort" in opts:
            for i, (q, data) in enumerate(opened):
                if q == name:
                    del opened[i]
                    if "abort" in opts:
                        with store.cond:
                            store.queues[name].appendleft(data)
                    break
            if "open" not in opts:
                return b"END\r\n"
        if "peek" in opts:
            with store.cond:
                q = store.queues[name]
                data = q[0] if q else None
        else:
            data = store.pop(name, timeout)
        if data is None:
            return b"END\r\n"
        if "open" in opts:
            opened.append((name, data))
        return b"VALUE %s 0 %d\r\n%s\r\nEND\r\n" % (name.encode(), len(data), data)


class FakeKestrel(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.store = Store()
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return self.server_address[1]

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
