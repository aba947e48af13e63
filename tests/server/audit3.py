"""What the conformance-audit part 3 tests (test_*_audit3.py) share: raw-socket requests and
`stats` read as a dict, against a real `lanner serve`."""
from __future__ import annotations

import time

import pytest

from tests.helpers import recv_until


def ask(s, line: bytes, end: bytes = b"\r\n") -> bytes:
    s.sendall(line)
    return recv_until(s, end)


def stat_lines(s) -> list[tuple[str, str]]:
    """`stats` over memcache socket `s`: its (key, value) pairs in the server's order."""
    out = ask(s, b"stats\r\n", b"\r\nEND\r\n").decode()
    return [tuple(ln.split(" ", 2)[1:]) for ln in out.split("\r\n") if ln.startswith("STAT ")]


def stats(s) -> dict[str, str]:
    return dict(stat_lines(s))


def name(prefix: str) -> bytes:
    """A queue name no other test of the module's server uses."""
    return b"%s%d" % (prefix.encode(), time.monotonic_ns())


class Sockets:
    """Connections to a server, all closed at the end of a test (`mc` fixtures)."""

    def __init__(self, server):
        self.server = server
        self.socks = []

    def __call__(self, port: int | None = None):
        s = self.server.connect(port)
        self.socks.append(s)
        return s

    def close(self) -> None:
        for s in self.socks:
            s.close()


@pytest.fixture
def mc(h):
    """Connections to the test module's server fixture `h`, closed after the test."""
    socks = Sockets(h)
    yield socks
    socks.close()
