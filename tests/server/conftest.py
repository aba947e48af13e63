import socket

import pytest

from tests.helpers import LAYOUTS, recv_exact, start_server


class Client:
    """mustsend/ckresp in the style of beanstalkd's server tests."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv_until(self, terminator: bytes, timeout: float = 10.0) -> bytes:
        self.sock.settimeout(timeout)
        while terminator not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                break
            self.buf += chunk
        i = self.buf.find(terminator)
        if i < 0:
            out, self.buf = self.buf, b""
            return out
        out, self.buf = self.buf[:i + len(terminator)], self.buf[i + len(terminator):]
        return out

    def recv_n(self, n: int, timeout: float = 10.0) -> bytes:
        self.sock.settimeout(timeout)
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                break
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def ask(self, line: bytes, terminator: bytes = b"\r\n") -> bytes:
        self.send(line)
        return self.recv_until(terminator)

    def is_closed(self, timeout: float = 5.0) -> bool:
        if self.buf:
            return False
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except (ConnectionResetError, BrokenPipeError):
            return True
        except socket.timeout:
            return False

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def server(request, tmp_path_factory):
    """One server per process layout: every transcript must read the same in each."""
    tmp = tmp_path_factory.mktemp("srv-" + request.param)
    h = start_server(tmp, layout=request.param)
    yield h
    h.stop()


@pytest.fixture
def mc(server):
    clients = []

    def make(port=None):
        c = Client(server.connect(port))
        clients.append(c)
        return c
    yield make
    for c in clients:
        c.close()


__all__ = ["Client", "recv_exact"]
