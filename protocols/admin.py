"""The admin HTTP port: a minimal HTTP/1.1 request parser and Ostrich-shaped JSON replies.

Kestrel served its admin port through Ostrich (reference §3.4): `/ping.json`
answers `{"response":"pong"}` and `/stats.json` dumps Ostrich's StatsCollection.
Lanner serves those two plus `/server_info.json`, `/stats.txt`, `/metrics`,
`/` and `/dashboard.json` (lanner.ops); any other path is 404 and any method
but GET and HEAD is 405.  A HEAD is answered with the headers its GET would get
(status, Content-Type, Content-Length) and no body, as HTTP requires, so that a
health check or `curl -I` sees what a GET would.  Pure like the other protocol modules: the front feeds
socket bytes, takes `HttpRequest`s, asks `route()` what to do, and writes bytes.

The parser understands just enough HTTP/1.x for monitoring tools and curl:
request line, headers (only Connection, Content-Length and Transfer-Encoding
matter), a Content-Length body that is skipped, keep-alive and pipelining.
Bounds: the request head is at most `max_head` bytes and a body at most
`max_body` bytes (skipped, never buffered beyond one chunk); a breach, a
malformed head or a chunked body yields `HttpError` (write it, then close) and
stops the parser.

`/stats.json` shape (Ostrich's `StatsCollection` JSON as Kestrel 2.x filled it):
`{"counters": {...}, "gauges": {...}, "labels": {}, "metrics": {}}`, keys sorted.

* global counters (`GLOBAL_COUNTERS`, /metrics's too): `total_items total_connections
  cmd_get cmd_set cmd_peek get_hits get_misses bytes_read bytes_written queue_creates
  queue_deletes queue_expires routed_requests handoffs fsyncs`; every other numeric global stat is a gauge, with
  `curr_connections` named `connections` as Kestrel's gauge was; `time` and
  `version` are left out (they are not measurements);
* per queue, `q/<name>/<stat>`: counters `total_items put_items transactions
  canceled_transactions expired_items discarded total_flushes journal_rewrites
  journal_rotations put_bytes`, gauges for the rest, with `age` named `age_msec`
  and `logsize` named `journal_size` as in `PersistentQueue`'s gauges (Lanner's
  value is the current journal file only); `put_items` repeats `total_items`
  as Kestrel registered both; non-numeric stats (`children`) are left out;
* gauges are written as floats (Ostrich gauges were doubles), counters as ints;
* `labels` and `metrics` are what the caller passes (lanner.ops.ostrich fills them
  with the status and the per-family latency distributions).
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Iterator
from urllib.parse import parse_qsl, unquote

from lanner.protocols.stream import StreamParser

log = logging.getLogger(__name__)

__all__ = [
    "AdminParser", "HttpRequest", "HttpError", "route", "response", "reply", "render_stats_json",
    "render_server_info_json", "PING_BODY", "ENDPOINTS",
]

PING_BODY = b'{"response":"pong"}'
#: Paths answered with data the front must gather first; `route` returns their names.
ENDPOINTS = {"/stats.json": "stats", "/server_info.json": "server_info", "/stats.txt": "stats_txt",
             "/metrics": "metrics", "/": "dashboard", "/dashboard": "dashboard",
             "/dashboard.json": "dashboard_json"}

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            413: "Payload Too Large", 431: "Request Header Fields Too Large",
            500: "Internal Server Error", 501: "Not Implemented", 503: "Service Unavailable",
            505: "HTTP Version Not Supported"}


@dataclass(slots=True)
class HttpRequest:
    method: str
    path: str
    query: dict[str, str] = field(default_factory=dict)
    keep_alive: bool = True
    http10: bool = False        # an HTTP/1.0 request: one kept alive must be told so (`reply`)


@dataclass(slots=True)
class HttpError:
    """A request the parser refuses: write `reply`, then close."""
    status: int
    reply: bytes


def response(status: int, body: bytes, keep_alive: bool = True,
             content_type: str = "application/json", extra: str = "", head_only: bool = False) -> bytes:
    """`head_only`: the answer to a HEAD, the GET's headers (Content-Length the body's) alone."""
    head = "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s%s\r\n" % (
        status, _REASONS.get(status, "Unknown"), content_type, len(body), extra,
        "" if keep_alive else "Connection: close\r\n")
    return head.encode("latin-1") if head_only else head.encode("latin-1") + body


def reply(req: HttpRequest, status: int, body: bytes, content_type: str = "application/json",
          extra: str = "") -> bytes:
    """The response to `req`: its keep-alive, and no body when it is a HEAD.  An HTTP/1.0
    client that asked to keep the connection reads `Connection: keep-alive` back, or it takes
    the connection for closed after the response and waits for the EOF (RFC 9112 §9.3)."""
    if req.keep_alive and req.http10:
        extra += "Connection: keep-alive\r\n"
    return response(status, body, req.keep_alive, content_type, extra, req.method == "HEAD")


def _error_body(status: int, message: str) -> bytes:
    return json.dumps({"error": message, "status": status}, separators=(",", ":")).encode()


def _http_error(status: int, message: str) -> HttpError:
    return HttpError(status, response(status, _error_body(status, message), keep_alive=False))


def route(req: HttpRequest) -> bytes | str:
    """The full response for what needs no data (ping, 404, 405), or the endpoint name
    (`"stats"`, `"server_info"`) whose JSON the front renders and wraps with `reply`."""
    if req.method not in ("GET", "HEAD"):
        return reply(req, 405, _error_body(405, "method %s not allowed" % req.method),
                     extra="Allow: GET, HEAD\r\n")
    if req.path == "/ping.json":
        return reply(req, 200, PING_BODY)
    name = ENDPOINTS.get(req.path)
    if name is None:
        return reply(req, 404, _error_body(404, "no such path: %s" % req.path))
    return name


#: The global stats that only grow: counters in /stats.json and in /metrics (lanner.ops.metrics)
GLOBAL_COUNTERS = frozenset(("total_items", "total_connections", "cmd_get", "cmd_set", "cmd_peek",
                             "get_hits", "get_misses", "bytes_read", "bytes_written", "queue_creates",
                             "queue_deletes", "queue_expires", "routed_requests", "handoffs", "fsyncs"))
_GLOBAL_RENAME = {"curr_connections": "connections"}
_GLOBAL_SKIP = frozenset(("time", "version"))
#: The per-queue (and per-alias: put_items, put_bytes) stats that only grow: counters in
#: /stats.json and Prometheus alike (engine/ops/metrics.py).
QUEUE_COUNTERS = frozenset(("total_items", "put_items", "transactions", "canceled_transactions",
                            "expired_items", "discarded", "total_flushes", "journal_rewrites",
                            "journal_rotations", "put_bytes"))
_QUEUE_RENAME = {"age": "age_msec", "logsize": "journal_size"}


def stat_number(v) -> int | float | None:
    """A stat's value as a number (stats cross the rings as text), or None for one that is not
    a number (`version`); ints stay ints.  /stats.json and the Prometheus collector both use it."""
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, (int, float)):
        return v
    try:
        return int(v)
    except (TypeError, ValueError):
        try:
            return float(v)
        except (TypeError, ValueError):
            return None


def render_stats_json(global_stats: list[tuple[str, object]],
                      queues: list[tuple[str, list[tuple[str, object]]]],
                      labels: dict | None = None, metrics: dict | None = None) -> bytes:
    """Ostrich `/stats.json` body from the same lists `memcache.encode_stats` takes."""
    counters: dict[str, int] = {}
    gauges: dict[str, float] = {}
    for k, v in global_stats:
        n = stat_number(v)
        if n is None or k in _GLOBAL_SKIP:
            continue
        if k in GLOBAL_COUNTERS:
            counters[k] = int(n)
        else:
            gauges[_GLOBAL_RENAME.get(k, k)] = float(n)
    for name, stats in queues:
        prefix = "q/%s/" % name
        for k, v in stats:
            n = stat_number(v)
            if n is None:
                continue
            if k in QUEUE_COUNTERS:
                counters[prefix + k] = int(n)
                if k == "total_items":
                    counters[prefix + "put_items"] = int(n)
            else:
                gauges[prefix + _QUEUE_RENAME.get(k, k)] = float(n)
    doc = {"counters": counters, "gauges": gauges, "labels": labels or {}, "metrics": metrics or {}}
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def render_server_info_json(version: str, start_time_ms: int, uptime_ms: int) -> bytes:
    """Ostrich `/server_info.json`: name, version, start_time and uptime (ms)."""
    doc = {"name": "lanner", "version": version, "start_time": start_time_ms, "uptime": uptime_ms}
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


_HEAD, _BODY, _STOPPED = 0, 1, 2


class AdminParser(StreamParser):
    """Feed socket bytes, take `HttpRequest`/`HttpError` from `next` until it returns None."""

    __slots__ = ("max_head", "max_body", "_skip", "_pending")
    BETWEEN, STOPPED = _HEAD, _STOPPED

    def __init__(self, max_head: int = 8192, max_body: int = 1 << 16) -> None:
        self.max_head = max_head
        self.max_body = max_body
        self._reset()
        self._state = _HEAD
        self._skip = 0                      # BODY: bytes of body still to drop
        self._pending: HttpRequest | None = None  # BODY: yielded once its body is past

    def feed(self, data: bytes) -> None:
        if self._state != _STOPPED:
            self._append(data)

    def requests(self) -> Iterator[HttpRequest | HttpError]:
        while (req := self.next()) is not None:
            yield req

    def next(self) -> HttpRequest | HttpError | None:
        while True:
            buf = self._buf
            pos = self._pos
            if self._state == _BODY:
                n = min(self._skip, len(buf) - pos)
                self._consumed(pos + n)
                self._skip -= n
                if self._skip:
                    return None
                self._state = _HEAD
                req, self._pending = self._pending, None
                return self._done(req)
            if self._state == _STOPPED:
                return None
            # Blank lines before a request line are allowed (RFC 9112 §2.2).
            if buf[pos:pos + 2] == b"\r\n" or buf[pos:pos + 1] == b"\n":
                while buf[pos:pos + 2] == b"\r\n" or buf[pos:pos + 1] == b"\n":
                    pos += 2 if buf[pos] == 13 else 1
                self._consumed(pos)
                buf = self._buf
                pos = self._pos
            end = buf.find(b"\n\r\n", max(pos, self._scan - 2))
            lf_end = buf.find(b"\n\n", max(pos, self._scan - 1))
            if end < 0 and lf_end < 0:
                if len(buf) - pos > self.max_head:
                    return self._stop(_http_error(431, "request head longer than %d bytes" % self.max_head))
                self._scan = len(buf)
                return None
            if end < 0 or (0 <= lf_end < end):
                head_end, cut = lf_end + 1, lf_end + 2
            else:
                head_end, cut = end + 1, end + 3
            if head_end - pos > self.max_head:
                return self._stop(_http_error(431, "request head longer than %d bytes" % self.max_head))
            head = bytes(buf[pos:head_end])
            self._consumed(cut)
            result = self._parse_head(head)
            if type(result) is HttpError:
                return self._stop(result)
            req, length = result
            if length:
                self._state = _BODY
                self._skip = length
                self._pending = req
                continue
            return self._done(req)

    def _done(self, req: HttpRequest) -> HttpRequest:
        if not req.keep_alive:
            self._stop(None)
        return req

    def _stop(self, result):
        self._state = _STOPPED
        self._reset()
        self._pending = None
        return result

    def _parse_head(self, head: bytes):
        lines = head.decode("latin-1").split("\n")
        lines = [ln[:-1] if ln.endswith("\r") else ln for ln in lines]
        if lines and lines[-1] == "":
            lines.pop()
        parts = lines[0].split(" ") if lines else []
        if len(parts) != 3 or not parts[0] or not parts[1]:
            return _http_error(400, "malformed request line")
        method, target, version = parts
        if version not in ("HTTP/1.1", "HTTP/1.0"):
            if version.startswith("HTTP/"):
                return _http_error(505, "unsupported version %s" % version)
            return _http_error(400, "malformed request line")
        if not method.isalpha() or not method.isupper():
            return _http_error(400, "malformed method")
        keep_alive = version == "HTTP/1.1"
        length = 0
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                return _http_error(400, "malformed header line")
            name = name.lower()
            value = value.strip()
            if name == "connection":
                tokens = {t.strip().lower() for t in value.split(",")}
                if "close" in tokens:
                    keep_alive = False
                elif "keep-alive" in tokens:
                    keep_alive = True
            elif name == "content-length":
                if not value.isdigit() or (length and int(value) != length):
                    return _http_error(400, "bad Content-Length")
                length = int(value)
                if length > self.max_body:
                    return _http_error(413, "body longer than %d bytes" % self.max_body)
            elif name == "transfer-encoding":
                return _http_error(501, "Transfer-Encoding is not supported")
        path, _, qs = target.partition("?")
        if "#" in qs:
            qs = qs.partition("#")[0]
        scheme, sep, rest = path.partition("://")
        if sep and scheme.lower() in ("http", "https"):
            # absolute-form (a proxy's, or a client configured with one), which a server must
            # accept (RFC 9112 §3.2.2): the path is what follows the authority
            path = "/" + rest.partition("/")[2]
        query = dict(parse_qsl(qs, keep_blank_values=True))
        return HttpRequest(method, unquote(path), query, keep_alive, version == "HTTP/1.0"), length
