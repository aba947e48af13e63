"""Kestrel's thrift service against a real `lanner serve` (reference §3)."""
import time

import pytest

from tests.helpers import start_server
from lanner.perf.thrift_client import KestrelThrift, ThriftAppError

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tserver(tmp_path_factory):
    h = start_server(tmp_path_factory.mktemp("thrift"), workers=2, fronts=2, thrift=True,
                     config="[server]\nmax_open_transactions = 10\n")
    yield h
    h.stop()


@pytest.fixture(params=[False, True], ids=["plain", "ttwitter"])
def client(tserver, request):
    c = KestrelThrift("127.0.0.1", tserver.thrift_port, upgrade=request.param, client_id="tests")
    yield c
    c.close()


def test_put_get_plain(client):
    q = "tp%d" % time.monotonic_ns()
    assert client.put(q, [b"a", b"b", b"c"]) == 3
    assert client.put(q, []) == 0
    got = client.get(q, 2)
    assert [(i.data, i.id) for i in got] == [(b"a", 0), (b"b", 0)]
    assert [i.data for i in client.get(q, 10)] == [b"c"]
    assert client.get(q, 10) == []
    assert client.get(q, 0) == []


def test_reliable_reads_outlive_the_connection(tserver, client):
    q = "tr%d" % time.monotonic_ns()
    client.put(q, [b"x", b"y"])
    items = client.get(q, 2, 0, 60_000)
    assert [i.data for i in items] == [b"x", b"y"]
    ids = [i.id for i in items]
    assert all(i > 0 for i in ids) and len(set(ids)) == 2
    info = client.peek(q)
    assert info.items == 0 and info.open_transactions == 2
    client.close()
    other = KestrelThrift("127.0.0.1", tserver.thrift_port)
    try:
        assert other.peek(q).open_transactions == 2        # still open after the disconnect
        assert other.abort(q, {ids[1]}) == 1
        assert other.confirm(q, {ids[0], 999_999}) == 1
        assert [i.data for i in other.get(q, 5)] == [b"y"]
    finally:
        other.close()


def test_auto_abort(client):
    q = "ta%d" % time.monotonic_ns()
    client.put(q, [b"z"])
    assert [i.data for i in client.get(q, 1, 0, 200)] == [b"z"]
    deadline = time.monotonic() + 5
    while client.peek(q).items == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [i.data for i in client.get(q, 1)] == [b"z"]


def test_get_waits_for_timeout(client):
    q = "tw%d" % time.monotonic_ns()
    client.put(q, [b"1"])
    t0 = time.monotonic()
    got = client.get(q, 5, 300)
    assert [i.data for i in got] == [b"1"]
    assert time.monotonic() - t0 >= 0.28      # fewer than max_items: returns at the deadline


def test_peek_flush_delete_status_version(client):
    q = "tf%d" % time.monotonic_ns()
    client.put(q, [b"hello", b"w"])
    info = client.peek(q)
    assert info.head_item == b"hello" and info.items == 2 and info.bytes == 6
    client.flush_queue(q)
    assert client.peek(q).items == 0
    client.delete_queue(q)
    assert client.current_status() == 3
    assert client.get_version()
    with pytest.raises(ThriftAppError) as e:
        client.set_status(0)
    assert e.value.type == 6 and "Unknown status" in e.value.message


def test_readonly_refuses_puts(client):
    client.set_status(2)
    try:
        assert client.current_status() == 2
        with pytest.raises(ThriftAppError) as e:
            client.put("tro", [b"x"])
        assert e.value.type == 6
        assert "setItem" in e.value.message
    finally:
        client.set_status(3)


def test_illegal_queue_name(client):
    with pytest.raises(ThriftAppError) as e:
        client.put("../etc", [b"x"])
    assert e.value.type == 6
    assert client.get_version()               # the connection stays usable
