"""A small blocking memcache client for the Spark stream source and sink.

Only what they need, pipelined: reliable reads (`get q/open`), `confirm q n`,
`set`, `stats`.  No pyspark import, so it can be used (and tested) on its own.

Every protocol or socket failure raises `ClientError` and leaves the
connection closed: the server then rolls back every read this connection had
open (Kestrel semantics, reference §1.5), which is what the at-least-once
source relies on.
"""
from __future__ import annotations

import socket

DEFAULT_PORT = 22133
SET_WINDOW = 256                  # sets per pipelined write
SET_WINDOW_BYTES = 1 << 20


class ClientError(OSError):
    """A connection that failed; `str()` names the server."""


class TooManyOpen(ClientError):
    """The server answered ERROR to `get q/open`: more open reads than its
    max_open_transactions allows.  It has closed the connection."""


class NotStored(Exception):
    """A `set` refused with NOT_STORED (queue full, item too large, shutting down)."""

    def __init__(self, server: str, queue: str) -> None:
        super().__init__(f"{server}: queue {queue!r} refused an item (NOT_STORED: the queue is full, "
                         f"the item is larger than max_item_size, or the server is shutting down)")
        self.server = server
        self.queue = queue


def parse_servers(text: str | None) -> list[tuple[str, int]]:
    """'host:port,host2:port2' (port defaults to 22133) -> [(host, port), ...]."""
    out = []
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        if part.startswith("["):                      # [::1]:22133
            host, _, rest = part[1:].partition("]")
            port = rest.lstrip(":") or DEFAULT_PORT
        elif part.count(":") == 1:
            host, port = part.split(":")
        else:
            host, port = part, DEFAULT_PORT
        out.append((host, int(port)))
    if not out:
        raise ValueError("option 'servers' is required: a comma list of host:port")
    return out


def server_name(addr: tuple[str, int]) -> str:
    host, port = addr
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _key(queue: str) -> bytes:
    q = queue.encode("utf-8")
    if not q or any(c in q for c in b" \r\n\0"):
        raise ValueError(f"illegal queue name {queue!r}")
    return q


class Conn:
    """One memcache connection.  Not thread-safe."""

    def __init__(self, addr: tuple[str, int], timeout: float = 30.0) -> None:
        self.addr = addr
        self.name = server_name(addr)
        self._buf = bytearray()
        try:
            self.sock = socket.create_connection(addr, timeout=timeout)
        except OSError as e:
            raise ClientError(f"{self.name}: cannot connect: {e}") from e
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    # -- plumbing ------------------------------------------------------------------------------
    def close(self) -> None:
        s, self.sock = self.sock, None
        if s is not None:
            try:
                s.close()
            except OSError:
                pass

    @property
    def closed(self) -> bool:
        return self.sock is None

    def _fail(self, what: str, exc: BaseException | None = None, cls=ClientError):
        self.close()
        raise cls(f"{self.name}: {what}{f': {exc}' if exc else ''}")

    def _send(self, data) -> None:
        if self.sock is None:
            raise ClientError(f"{self.name}: connection is closed")
        try:
            self.sock.sendall(data)
        except OSError as e:
            self._fail("send failed", e)

    def _fill(self) -> None:
        try:
            chunk = self.sock.recv(1 << 18)
        except OSError as e:
            self._fail("receive failed", e)
        if not chunk:
            self._fail("connection closed by the server")
        self._buf += chunk

    def _line(self) -> bytes:
        while True:
            i = self._buf.find(b"\r\n")
            if i >= 0:
                line = bytes(self._buf[:i])
                del self._buf[:i + 2]
                return line
            if self.sock is None:
                raise ClientError(f"{self.name}: connection is closed")
            self._fill()

    def _exact(self, n: int) -> bytes:
        while len(self._buf) < n:
            self._fill()
        data = bytes(self._buf[:n])
        del self._buf[:n]
        return data

    def _value_or_end(self, cmd: str) -> bytes | None:
        """One `get` reply: the item's bytes, or None for END."""
        line = self._line()
        if line == b"END":
            return None
        if line.startswith(b"VALUE "):
            parts = line.split(b" ")
            try:
                n = int(parts[-1])
            except ValueError:
                self._fail(f"bad VALUE line {line[:80]!r}")
            data = self._exact(n + 2)
            if data[-2:] != b"\r\n" or self._line() != b"END":
                self._fail(f"bad item block after {line[:80]!r}")
            return data[:-2]
        if line == b"ERROR":
            self._fail(f"{cmd}: ERROR (more open reads than the server's max_open_transactions)",
                       cls=TooManyOpen)
        self._fail(f"{cmd}: unexpected reply {line[:200]!r}")

    # -- commands ------------------------------------------------------------------------------
    def open_items(self, queue: str, n: int) -> list[bytes]:
        """Up to n reliable reads, pipelined (one round trip).  Stops at the
        first empty reply; later replies are read and are empty too."""
        if n <= 0:
            return []
        self._send((b"get " + _key(queue) + b"/open\r\n") * n)
        out = []
        for _ in range(n):
            v = self._value_or_end("get/open")
            if v is not None:
                out.append(v)
        return out

    def confirm(self, queue: str, count: int) -> None:
        """Confirm this connection's `count` oldest open reads on `queue`."""
        if count <= 0:
            return
        self._send(b"confirm %s %d\r\n" % (_key(queue), count))
        line = self._line()
        if line != b"END":
            self._fail(f"confirm {queue} {count}: unexpected reply {line[:200]!r}")

    def set_many(self, items) -> int:
        """Pipelined `set`s of (queue, data, exptime) triples; returns the count
        stored.  Raises NotStored at the first refusal (the items before it
        were stored; the ones after it in the same window may have been)."""
        stored = 0
        out = bytearray()
        queues: list[str] = []
        for queue, data, exptime in items:
            out += b"set %s 0 %d %d\r\n" % (_key(queue), exptime, len(data))
            out += data
            out += b"\r\n"
            queues.append(queue)
            if len(queues) >= SET_WINDOW or len(out) >= SET_WINDOW_BYTES:
                stored += self._set_replies(out, queues)
                out = bytearray()
                queues = []
        if queues:
            stored += self._set_replies(out, queues)
        return stored

    def _set_replies(self, out: bytearray, queues: list[str]) -> int:
        self._send(out)
        refused = None
        for q in queues:
            try:
                line = self._line()
            except ClientError as e:
                raise ClientError(f"{e} while storing into queue {q!r} (a server closes the connection "
                                  f"on an illegal queue name: '.', '/' and '~' are refused outside "
                                  f"command-log queues)") from None
            if line == b"STORED":
                continue
            if line == b"NOT_STORED":
                refused = refused or q
                continue
            self._fail(f"set {q}: unexpected reply {line[:200]!r}")
        if refused is not None:
            raise NotStored(self.name, refused)
        return len(queues)

    def stats(self) -> dict[str, str]:
        self._send(b"stats\r\n")
        out = {}
        while True:
            line = self._line()
            if line == b"END":
                return out
            parts = line.split(b" ", 2)
            if len(parts) == 3 and parts[0] == b"STAT":
                out[parts[1].decode("utf-8", "replace")] = parts[2].decode("utf-8", "replace")
            else:
                self._fail(f"stats: unexpected reply {line[:200]!r}")

    def queue_items(self, queue: str) -> int:
        """The queue's `items` stat (0 when the queue does not exist)."""
        return int(self.stats().get(f"queue_{queue}_items", "0"))
