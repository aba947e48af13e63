"""Kestrel's client-id whitelists (reference §5.12) on a real `lanner serve`: only a thrift
caller whose TTwitter header names the listed client id may add to (or remove from) such a
queue; memcache and text callers carry no client id and are always refused."""
import socket

import pytest

from lanner.perf.thrift_client import KestrelThrift, ThriftAppError
from tests.helpers import recv_until, start_server

pytestmark = pytest.mark.integration

CONFIG = """
[queues."inbox"]
white_list_client_id_for_enqueue = "writer"
[queues."outbox"]
white_list_client_id_for_dequeue = "reader"
[queues."fan+locked"]
white_list_client_id_for_enqueue = "nobody"
[aliases."both"]
destinations = ["free", "inbox"]
"""
NO_ID = "ClientId not specified when queue {q} only allows a white-listed clientId"


@pytest.fixture(scope="module")
def h(tmp_path_factory):
    h = start_server(tmp_path_factory.mktemp("whitelists"), workers=2, thrift=True, config=CONFIG)
    yield h
    h.stop()


def mc(h):
    return socket.create_connection(("127.0.0.1", h.memcache_port), timeout=10)


def ask(sock, data: bytes, end: bytes = b"\r\n") -> bytes:
    sock.sendall(data)
    return recv_until(sock, end)


def closed(sock) -> bool:
    return sock.recv(1) == b""


def test_memcache_set_on_an_enqueue_whitelist_is_server_error_and_close(h):
    s = mc(h)
    reply = ask(s, b"set inbox 0 0 1\r\nx\r\n")
    assert reply == ("SERVER_ERROR The operation add is disallowed on queue inbox. "
                     + NO_ID.format(q="inbox") + "\r\n").encode()
    assert closed(s)
    s = mc(h)
    assert ask(s, b"set both 0 0 1\r\nx\r\n").startswith(b"SERVER_ERROR The operation add")
    assert closed(s)                      # an alias with a whitelisted destination
    s = mc(h)
    assert ask(s, b"set outbox 0 0 1\r\nx\r\n") == b"STORED\r\n"      # only removes are listed
    # peek is not a remove; the head is this x, or the text test's y when that ran first (the
    # module's server, whose outbox only a thrift reader empties)
    assert ask(s, b"get outbox/peek\r\n", b"END\r\n") in (b"VALUE outbox/peek 0 1\r\nx\r\nEND\r\n",
                                                          b"VALUE outbox/peek 0 1\r\ny\r\nEND\r\n")
    assert ask(s, b"set fan 0 0 1\r\nx\r\n") == b"STORED\r\n"   # a fanout child's list is not checked
    s.close()


@pytest.mark.parametrize("request_line", [b"get outbox\r\n", b"get outbox/open\r\n",
                                          b"get outbox/t=10\r\n", b"monitor outbox 1\r\n",
                                          b"flush outbox\r\n"])
def test_memcache_removes_on_a_dequeue_whitelist_are_server_error_and_close(h, request_line):
    s = mc(h)
    reply = ask(s, request_line)
    assert reply == ("SERVER_ERROR The operation remove is disallowed on queue outbox. "
                     + NO_ID.format(q="outbox") + "\r\n").encode()
    assert closed(s)


def test_memcache_replies_before_the_refusal_are_written_first(h):
    s = mc(h)
    s.sendall(b"set free 0 0 2\r\nok\r\nget free\r\nget outbox\r\nget free\r\n")
    got = b""
    while (chunk := s.recv(4096)):
        got += chunk
    assert got.startswith(b"STORED\r\nVALUE free 0 2\r\nok\r\nEND\r\nSERVER_ERROR The operation remove")
    assert got.endswith(b"white-listed clientId\r\n")    # the get after the refusal: no answer


def test_text_refusals_name_the_queue_and_keep_the_connection(h):
    s = socket.create_connection(("127.0.0.1", h.text_port), timeout=10)
    assert ask(s, b"put inbox:\nx\n\n", b"\n") == (
        "-The operation add is disallowed on queue inbox. " + NO_ID.format(q="inbox") + "\n").encode()
    assert ask(s, b"put outbox:\ny\n\n", b"\n") == b"+1\n"
    assert ask(s, b"peek outbox\n", b"\n") in (b":x\n", b":y\n")   # peek is not a remove
    assert ask(s, b"get outbox\n", b"\n") == (
        "-The operation remove is disallowed on queue outbox. " + NO_ID.format(q="outbox") + "\n").encode()
    assert ask(s, b"version\n", b"\n").startswith(b":")          # still open
    s.close()


def test_thrift_callers_pass_with_the_listed_client_id_only(h):
    writer = KestrelThrift("127.0.0.1", h.thrift_port, upgrade=True, client_id="writer")
    other = KestrelThrift("127.0.0.1", h.thrift_port, upgrade=True, client_id="mallory")
    plain = KestrelThrift("127.0.0.1", h.thrift_port)
    reader = KestrelThrift("127.0.0.1", h.thrift_port, upgrade=True, client_id="reader")
    try:
        assert writer.put("inbox", [b"a", b"b"]) == 2
        with pytest.raises(ThriftAppError) as e:
            other.put("inbox", [b"c"])
        assert e.value.type == 6
        assert ("net.lag.kestrel.AvailabilityException: The operation add is disallowed on queue "
                "inbox. ClientId mallory is not allowed to enqueue to queue inbox") in e.value.message
        with pytest.raises(ThriftAppError) as e:
            plain.put("inbox", [b"c"])
        assert NO_ID.format(q="inbox") in e.value.message
        assert other.get_version()                                # the connection stays usable
        assert [i.data for i in other.get("inbox", 5)] == [b"a", b"b"]   # inbox lists adds only

        assert plain.put("outbox", [b"z"]) == 1
        with pytest.raises(ThriftAppError) as e:
            other.get("outbox", 1)
        assert "ClientId mallory is not allowed to dequeue from queue outbox" in e.value.message
        assert other.peek("outbox").items >= 1                    # peek is not a remove
        assert b"z" in [i.data for i in reader.get("outbox", 10)]
    finally:
        for c in (writer, other, plain, reader):
            c.close()


def test_whitelist_keys_load_and_reject_bad_values(tmp_path):
    from lanner.config import ConfigError, load_config
    p = tmp_path / "bad.toml"
    p.write_text('[default]\nwhite_list_client_id_for_enqueue = ""\n')
    with pytest.raises(ConfigError, match="white_list_client_id_for_enqueue"):
        load_config(str(p))
    p.write_text('[queues."q"]\nwhite_list_client_id_for_dequeue = "r"\n')
    c = load_config(str(p))
    assert c.has_whitelists and c.queue_config("q").white_list_client_id_for_dequeue == "r"
    assert c.queue_config("other").white_list_client_id_for_dequeue is None
