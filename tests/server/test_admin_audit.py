"""The admin HTTP port as a monitoring tool sees it (conformance audit, part 2): a HEAD gets
its GET's status and headers and no body, on every path, and the connection stays usable."""
from __future__ import annotations

import json
import socket

import pytest

from tests.helpers import start_server

PATHS = ["/ping.json", "/stats.json", "/stats.txt", "/server_info.json", "/metrics", "/",
         "/dashboard.json", "/stats.json?period=60", "/no-such-path"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    h = start_server(tmp_path_factory.mktemp("admin-audit"), admin=True, workers=2)
    yield h
    h.stop()


class Http:
    """One keep-alive connection that reads responses by their framing."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buf = b""

    def _fill(self) -> bool:
        chunk = self.sock.recv(65536)
        self.buf += chunk
        return bool(chunk)

    def send(self, method: str, path: str, extra: str = "") -> None:
        self.sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode())

    def response(self, has_body: bool = True) -> tuple[str, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buf:
            assert self._fill(), "connection closed before a response head: %r" % self.buf
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        line, *rest = head.decode("latin-1").split("\r\n")
        headers = dict(h.split(": ", 1) for h in rest)
        n = int(headers["Content-Length"]) if has_body else 0
        while len(self.buf) < n:
            assert self._fill(), "connection closed inside a body"
        body, self.buf = self.buf[:n], self.buf[n:]
        return line, headers, body

    def closed_after_last_response(self) -> bool:
        """Read to the end: True when the server closed with nothing after the last response."""
        while self._fill():
            pass
        return self.buf == b""

    def __enter__(self) -> "Http":
        return self

    def __exit__(self, *exc) -> None:
        self.sock.close()


@pytest.mark.parametrize("path", PATHS)
def test_head_answers_the_gets_headers_without_a_body(server, path):
    with Http(server.admin_port) as c:
        c.send("GET", path)
        get_line, get_headers, get_body = c.response()
        assert len(get_body) == int(get_headers["Content-Length"])
        # HEAD, then a GET pipelined behind it: a body after the HEAD's head would be read
        # as the next response's status line
        c.send("HEAD", path)
        c.send("GET", "/ping.json")
        line, headers, _ = c.response(has_body=False)
        assert line == get_line, path
        assert headers["Content-Type"] == get_headers["Content-Type"]
        assert int(headers["Content-Length"]) > 0
        assert "Connection" not in headers
        assert c.response() == ("HTTP/1.1 200 OK", {"Content-Type": "application/json",
                                                     "Content-Length": "19"},
                                b'{"response":"pong"}')


def test_head_of_a_static_body_has_its_exact_length(server):
    with Http(server.admin_port) as c:
        c.send("GET", "/")
        _, get_headers, page = c.response()
        c.send("HEAD", "/")
        _, headers, _ = c.response(has_body=False)
        assert headers["Content-Length"] == get_headers["Content-Length"] == str(len(page))


def test_head_with_connection_close_closes_after_the_headers(server):
    with Http(server.admin_port) as c:
        c.send("HEAD", "/stats.json", "Connection: close\r\n")
        line, headers, _ = c.response(has_body=False)
        assert line == "HTTP/1.1 200 OK" and headers["Connection"] == "close"
        assert c.closed_after_last_response()


def test_other_methods_are_405_naming_get_and_head(server):
    with Http(server.admin_port) as c:
        c.send("POST", "/ping.json", "Content-Length: 0\r\n")
        line, headers, _ = c.response()
        assert line == "HTTP/1.1 405 Method Not Allowed" and headers["Allow"] == "GET, HEAD"


def test_an_http10_client_kept_alive_is_told_so(server):
    """An HTTP/1.0 request with `Connection: keep-alive` keeps the connection, and the response
    says `Connection: keep-alive`: without it a 1.0 client (ApacheBench -k, old health
    checkers) takes the connection as closing and waits for an EOF that never comes."""
    with Http(server.admin_port) as c:
        for _ in range(2):
            c.sock.sendall(b"GET /ping.json HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            line, headers, body = c.response()
            assert (line, headers.get("Connection"), body) == \
                ("HTTP/1.1 200 OK", "keep-alive", b'{"response":"pong"}')
        c.sock.sendall(b"HEAD /stats.json HTTP/1.0\r\n\r\n")       # no keep-alive: closes
        line, headers, _ = c.response(has_body=False)
        assert line == "HTTP/1.1 200 OK" and headers["Connection"] == "close"
        assert c.closed_after_last_response()


def test_an_absolute_form_target_is_served_like_its_path(server):
    """RFC 9112 §3.2.2: a server must accept `GET http://host:port/path` (what a client sends
    through a proxy); it used to answer 404 naming the whole URL."""
    with Http(server.admin_port) as c:
        c.send("GET", f"http://127.0.0.1:{server.admin_port}/ping.json")
        assert c.response() == ("HTTP/1.1 200 OK", {"Content-Type": "application/json",
                                                     "Content-Length": "19"}, b'{"response":"pong"}')
        c.send("GET", f"HTTP://127.0.0.1:{server.admin_port}/stats.json?period=x")
        assert c.response()[0] == "HTTP/1.1 400 Bad Request"
        c.send("GET", f"http://127.0.0.1:{server.admin_port}")
        assert c.response()[0] == "HTTP/1.1 200 OK"          # the dashboard, at "/"


def test_a_global_stat_is_a_counter_in_stats_json_exactly_when_it_is_one_in_metrics(server):
    """/stats.json and /metrics name the same figures; one that only grows must be a counter in
    both (`routed_requests` and `handoffs` were counters in /stats.json and gauges in /metrics,
    `fsyncs` the other way round), so a tool's rate() works whichever it scrapes."""
    with Http(server.admin_port) as c:
        c.send("GET", "/stats.json")
        doc = json.loads(c.response()[2])
        c.send("GET", "/metrics")
        text = c.response()[2].decode()
    kinds = {}
    for line in text.splitlines():
        if line.startswith("# TYPE lanner_"):
            _, _, name, kind = line.split()
            kinds[name[len("lanner_"):]] = kind
    checked = 0
    for stat in ("total_items", "cmd_get", "routed_requests", "handoffs", "fsyncs", "curr_items", "bytes"):
        counter = stat in doc["counters"]
        assert counter or stat in doc["gauges"], stat
        name = stat[len("total_"):] if counter and stat.startswith("total_") else stat
        kind = kinds.get(name) or kinds.get(name + "_total")   # (prometheus-client names counters
        assert kind == ("counter" if counter else "gauge"), (stat, kind)   # either way by version)
        checked += counter
    assert checked == 5
