"""Kestrel's thrift service against a real `lanner serve` (reference §3)."""
import time

import pytest

from lanner.queues.placement import worker_of
from tests.helpers import LAYOUTS, start_server
from lanner.perf.thrift_client import KestrelThrift, ThriftAppError

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def tserver(request, tmp_path_factory):
    h = start_server(tmp_path_factory.mktemp("thrift-" + request.param), layout=request.param,
                     thrift=True, config="[server]\nmax_open_transactions = 10\n")
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


def test_get_of_no_items_answers_empty_without_looking_at_the_name(client):
    """Reference §3.3: `max_items = 0` returns [] immediately, even for a name no queue may
    have; asking for items of that name is still the illegal-name exception."""
    assert client.get("a~b", 0) == []
    with pytest.raises(ThriftAppError):
        client.get("a~b", 1)
    assert client.get("tq%d" % time.monotonic_ns(), 1) == []     # the connection is still good


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


def test_read_ids_are_one_server_wide_sequence_from_1(tmp_path):
    """Issue 11, defect 11: the first reliable read anywhere gets id 1, even on worker 1
    (workers used to deal k*W + index + 1), and ids never repeat across workers."""
    h = start_server(tmp_path, workers=2, fronts=1, thrift=True,
                     config="[server]\nmax_open_transactions = 10\n")
    c = KestrelThrift("127.0.0.1", h.thrift_port)
    try:
        q1 = next(f"on1-{i}" for i in range(100) if worker_of(f"on1-{i}", 2) == 1)
        q0 = next(f"on0-{i}" for i in range(100) if worker_of(f"on0-{i}", 2) == 0)
        c.put(q1, [b"a", b"b"])
        c.put(q0, [b"c", b"d"])
        first = c.get(q1, 1, 0, 60_000)
        assert [(i.data, i.id) for i in first] == [(b"a", 1)]
        on0 = [i.id for i in c.get(q0, 2, 0, 60_000)]
        on1 = [i.id for i in c.get(q1, 1, 0, 60_000)]
        ids = [1] + on0 + on1
        assert len(set(ids)) == 4 and all(i > 0 for i in ids)
        assert on0 == sorted(on0) and on1[0] > 1
        # one confirm call settles ids held by both workers
        assert c.confirm(q0, set(ids)) == 4
        assert c.peek(q0).open_transactions == 0 and c.peek(q1).open_transactions == 0
    finally:
        c.close()
        h.stop()
