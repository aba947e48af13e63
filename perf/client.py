"""A small blocking client for Kestrel's memcache dialect, for setup and checks (not for load).

Scenarios use it to flush queues, read stats, prefill, and in `many-clients`, where correctness
(every item delivered, none lost) matters more than speed and a slow trickle is the point.
Replies are read through one buffer per connection; a reply the dialect does not allow raises
`ProtocolError` naming the command and the bytes the server sent.
"""
from __future__ import annotations

import socket


class ProtocolError(RuntimeError):
    """The server's reply was not one the command allows."""


class MemcacheClient:
    def __init__(self, host: str, port: int, timeout: float | None = 10.0):
        self.host, self.port = host, port
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()

    def __enter__(self) -> "MemcacheClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    # -- commands -------------------------------------------------------------------------

    def set(self, queue: str, data: bytes, exptime: int = 0) -> bool:
        """True when stored, False on NOT_STORED (queue full or item too large)."""
        self.send(b"set %s 0 %d %d\r\n%s\r\n" % (queue.encode(), exptime, len(data), data))
        return self._stored(f"set {queue}")

    def set_many(self, queue: str, items: list[bytes]) -> int:
        """Pipelines the sets in one write; returns how many were stored."""
        q = queue.encode()
        self.send(b"".join(b"set %s 0 0 %d\r\n%s\r\n" % (q, len(d), d) for d in items))
        return sum(self._stored(f"set {queue}") for _ in items)

    def get(self, key: str) -> bytes | None:
        """`key` may carry Kestrel options (`q/t=1000/open`); None means the queue had nothing."""
        self.send(b"get %s\r\n" % key.encode())
        return self.read_value(f"get {key}")

    def flush(self, queue: str) -> None:
        self.send(b"flush %s\r\n" % queue.encode())
        self._expect(b"END", f"flush {queue}")

    def delete(self, queue: str) -> None:
        self.send(b"delete %s\r\n" % queue.encode())
        self._expect(b"DELETED", f"delete {queue}")

    def stats(self) -> dict[str, str]:
        self.send(b"stats\r\n")
        out = {}
        while True:
            line = self.readline()
            if line == b"END":
                return out
            parts = line.split(b" ", 2)
            if len(parts) != 3 or parts[0] != b"STAT":
                raise ProtocolError(f"stats on {self.host}:{self.port}: unexpected line {line!r}")
            out[parts[1].decode()] = parts[2].decode(errors="replace")

    def version(self) -> str:
        self.send(b"version\r\n")
        line = self.readline()
        if not line.startswith(b"VERSION "):
            raise ProtocolError(f"version on {self.host}:{self.port}: got {line!r}")
        return line[8:].decode(errors="replace")

    # -- wire -----------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_value(self, what: str) -> bytes | None:
        line = self.readline()
        if line == b"END":
            return None
        if not line.startswith(b"VALUE "):
            raise ProtocolError(f"{what} on {self.host}:{self.port}: got {line!r}")
        try:
            n = int(line.split(b" ")[3])
        except (IndexError, ValueError):
            raise ProtocolError(f"{what} on {self.host}:{self.port}: bad VALUE line {line!r}") from None
        data = self.read_exact(n + 2)[:n]
        self._expect(b"END", what)
        return data

    def readline(self) -> bytes:
        while True:
            i = self.buf.find(b"\r\n")
            if i >= 0:
                line = bytes(self.buf[:i])
                del self.buf[:i + 2]
                return line
            self._fill()

    def read_exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ProtocolError(f"{self.host}:{self.port} closed the connection")
        self.buf += chunk

    def _stored(self, what: str) -> bool:
        line = self.readline()
        if line == b"STORED":
            return True
        if line == b"NOT_STORED":
            return False
        raise ProtocolError(f"{what} on {self.host}:{self.port}: got {line!r}")

    def _expect(self, want: bytes, what: str) -> None:
        line = self.readline()
        if line != want:
            raise ProtocolError(f"{what} on {self.host}:{self.port}: expected {want!r}, got {line!r}")
