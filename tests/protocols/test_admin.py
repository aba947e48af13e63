"""lanner.protocols.admin: the HTTP request parser, routing and the Ostrich-shaped JSON."""
import json

import pytest

from lanner.protocols.admin import (
    PING_BODY, AdminParser, HttpError, HttpRequest, render_server_info_json, render_stats_json,
    response, route,
)


def parse(data: bytes, **kw) -> list:
    p = AdminParser(**kw)
    p.feed(data)
    return list(p.requests())


def bytewise(data: bytes, **kw) -> list:
    p = AdminParser(**kw)
    out = []
    for i in range(len(data)):
        p.feed(data[i:i + 1])
        out.extend(p.requests())
    return out


def split_response(raw: bytes):
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    assert int(headers["Content-Length"]) == len(body)
    return lines[0], headers, body


CURL = (b"GET /ping.json HTTP/1.1\r\nHost: 127.0.0.1:2223\r\nUser-Agent: curl/8.5.0\r\n"
        b"Accept: */*\r\n\r\n")


@pytest.mark.parametrize("feed", [parse, bytewise])
def test_curl_request(feed):
    assert feed(CURL) == [HttpRequest("GET", "/ping.json", {}, True)]


def test_query_string_and_percent_decoding():
    got = parse(b"GET /stats%2Ejson?period=60&namespace=x&flag HTTP/1.1\r\n\r\n")
    assert got == [HttpRequest("GET", "/stats.json", {"period": "60", "namespace": "x", "flag": ""}, True)]


def test_http10_defaults_to_close_and_stops():
    p = AdminParser()
    p.feed(b"GET /ping.json HTTP/1.0\r\n\r\nGET /ping.json HTTP/1.0\r\n\r\n")
    assert list(p.requests()) == [HttpRequest("GET", "/ping.json", {}, False, http10=True)]
    assert p.stopped


def test_http10_keep_alive_header():
    assert parse(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n")[0].keep_alive is True


def test_connection_close_header():
    assert parse(b"GET / HTTP/1.1\r\nconnection: close\r\n\r\n")[0].keep_alive is False


def test_pipelined_requests_and_lf_only_heads():
    got = parse(b"GET /a HTTP/1.1\n\nGET /b HTTP/1.1\r\nX: y\r\n\r\n\r\nGET /c HTTP/1.1\r\n\r\n")
    assert [r.path for r in got] == ["/a", "/b", "/c"]


def test_body_is_skipped_and_framing_kept():
    p = AdminParser()
    p.feed(b"POST /ping.json HTTP/1.1\r\nContent-Length: 5\r\n\r\nhel")
    assert p.next() is None
    p.feed(b"loGET /ping.json HTTP/1.1\r\n\r\n")
    assert [r.method for r in p.requests()] == ["POST", "GET"]
    assert p.buffered == 0


@pytest.mark.parametrize("raw, status", [
    (b"GARBAGE\r\n\r\n", 400),
    (b"GET /\r\n\r\n", 400),
    (b"get / HTTP/1.1\r\n\r\n", 400),
    (b"GET / HTTP/2.0\r\n\r\n", 505),
    (b"GET / HTTP/1.1\r\nNoColonHere\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\n Folded: x\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\nContent-Length: 999999999\r\n\r\n", 413),
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 501),
])
def test_bad_requests(raw, status):
    p = AdminParser()
    p.feed(raw + b"GET /ping.json HTTP/1.1\r\n\r\n")
    got = list(p.requests())
    assert len(got) == 1 and isinstance(got[0], HttpError) and got[0].status == status
    line, headers, body = split_response(got[0].reply)
    assert line.startswith("HTTP/1.1 %d " % status) and headers["Connection"] == "close"
    assert json.loads(body)["status"] == status
    assert p.stopped


def test_head_size_cap_without_terminator():
    p = AdminParser(max_head=64)
    p.feed(b"GET / HTTP/1.1\r\nX: " + b"a" * 100)
    err = p.next()
    assert isinstance(err, HttpError) and err.status == 431 and p.buffered == 0


def test_head_size_cap_with_terminator():
    got = parse(b"GET / HTTP/1.1\r\nX: " + b"a" * 100 + b"\r\n\r\n", max_head=64)
    assert got[0].status == 431


def test_route_ping():
    line, headers, body = split_response(route(HttpRequest("GET", "/ping.json")))
    assert line == "HTTP/1.1 200 OK" and body == PING_BODY == b'{"response":"pong"}'
    assert headers["Content-Type"] == "application/json" and "Connection" not in headers


def test_route_ping_without_keep_alive_says_close():
    _, headers, _ = split_response(route(HttpRequest("GET", "/ping.json", {}, False)))
    assert headers["Connection"] == "close"


def test_route_404_and_405():
    line, _, body = split_response(route(HttpRequest("GET", "/nope")))
    assert line == "HTTP/1.1 404 Not Found" and json.loads(body)["status"] == 404
    line, headers, _ = split_response(route(HttpRequest("POST", "/ping.json")))
    assert line == "HTTP/1.1 405 Method Not Allowed" and headers["Allow"] == "GET, HEAD"
    line, _, _ = split_response(route(HttpRequest("DELETE", "/stats.json")))
    assert line.startswith("HTTP/1.1 405")


def test_route_data_endpoints_are_named():
    assert route(HttpRequest("GET", "/stats.json")) == "stats"
    assert route(HttpRequest("GET", "/server_info.json")) == "server_info"


def test_response_builder():
    assert response(200, b"{}") == b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


GLOBAL = [("uptime", 3), ("time", 1700000000), ("version", "0.1.0"), ("curr_items", 1), ("total_items", 1),
          ("bytes", 5), ("reserved_memory_ratio", "0.125"), ("curr_connections", 1), ("total_connections", 1),
          ("cmd_get", 0), ("cmd_set", 1), ("cmd_peek", 0), ("get_hits", 0), ("get_misses", 0),
          ("bytes_read", 27), ("bytes_written", 8), ("queue_creates", 1), ("queue_deletes", 0),
          ("queue_expires", 0)]
QUEUE = [("items", 1), ("bytes", 5), ("total_items", 1), ("logsize", 26), ("expired_items", 0),
         ("mem_items", 1), ("mem_bytes", 5), ("age", 0), ("discarded", 0), ("waiters", 0),
         ("open_transactions", 0), ("transactions", 0), ("canceled_transactions", 0), ("total_flushes", 0),
         ("journal_rewrites", 0), ("journal_rotations", 0), ("children", "q+a,q+b")]


def test_stats_json_shape():
    doc = json.loads(render_stats_json(GLOBAL, [("q", QUEUE), ("al", [("put_items", 2), ("put_bytes", 9),
                                                                      ("children", "q")])]))
    assert set(doc) == {"counters", "gauges", "labels", "metrics"}
    assert doc["labels"] == {} and doc["metrics"] == {}
    c, g = doc["counters"], doc["gauges"]
    assert c["cmd_set"] == 1 and c["bytes_read"] == 27 and c["total_items"] == 1 and c["queue_creates"] == 1
    assert g["connections"] == 1.0 and g["curr_items"] == 1.0 and g["reserved_memory_ratio"] == 0.125
    assert "time" not in g and "version" not in g and "uptime" in g
    assert c["q/q/total_items"] == c["q/q/put_items"] == 1 and c["q/q/journal_rotations"] == 0
    assert g["q/q/items"] == 1.0 and g["q/q/journal_size"] == 26.0 and g["q/q/age_msec"] == 0.0
    assert "q/q/children" not in g and "q/q/logsize" not in g
    assert c["q/al/put_items"] == 2 and c["q/al/put_bytes"] == 9
    assert all(isinstance(v, int) for v in c.values()) and all(isinstance(v, float) for v in g.values())


def test_stats_json_keys_are_sorted_and_compact():
    raw = render_stats_json([("cmd_set", 1), ("cmd_get", 2)], [])
    assert raw == b'{"counters":{"cmd_get":2,"cmd_set":1},"gauges":{},"labels":{},"metrics":{}}'


def test_server_info_json():
    doc = json.loads(render_server_info_json("0.1.0", 1700000000000, 5000))
    assert doc == {"name": "lanner", "version": "0.1.0", "start_time": 1700000000000, "uptime": 5000}
