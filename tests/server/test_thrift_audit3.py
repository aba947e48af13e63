"""Reference §3.3 (thrift semantics) and the thrift side of §4 and §5 on a real `lanner serve`,
with the `thrift` package's binary protocol (perf/thrift_client.py) and memcache `stats` for the
counters: conformance audit, part 3."""
from __future__ import annotations

import time

import pytest

from lanner.perf.thrift_client import NOT_CONFIGURED, QUIESCENT, UP, KestrelThrift, ThriftAppError
from tests.helpers import start_server, wait_for
from tests.server import audit3
from tests.server.audit3 import ask, stats

pytestmark = pytest.mark.integration

CONFIG = """
[server]
max_open_transactions = 3
[queues."tiny"]
max_item_size = 4
[queues."two"]
max_items = 2
[aliases."tal"]
destinations = ["tal1", "tal2"]
"""


@pytest.fixture(scope="module")
def h(tmp_path_factory):
    h = start_server(tmp_path_factory.mktemp("thrift-audit3"), thrift=True, config=CONFIG)
    yield h
    h.stop()


@pytest.fixture
def c(h):
    c = KestrelThrift("127.0.0.1", h.thrift_port)
    yield c
    c.close()


@pytest.fixture
def mc(h):
    s = h.connect()
    yield s
    s.close()


def counters(s, *keys) -> dict[str, int]:
    st = stats(s)
    return {k: int(st[k]) for k in keys}


def name(prefix: str) -> str:
    return audit3.name(prefix).decode()


def test_a_put_counts_the_items_it_tried_up_to_the_first_refused_one(c, mc):
    """§3.3: the first refused item stops the loop (3 items, the second too large: 1), and
    §4.3's cmd_set counts attempts: 2 here, not the 3 items sent."""
    before = counters(mc, "cmd_set", "total_items")
    assert c.put("tiny", [b"ok", b"too long", b"ok2"]) == 1
    after = counters(mc, "cmd_set", "total_items")
    assert after["cmd_set"] - before["cmd_set"] == 2
    assert after["total_items"] - before["total_items"] == 1
    assert [i.data for i in c.get("tiny", 5)] == [b"ok"]
    before = after
    assert c.put("two", [b"a", b"b", b"c", b"d"]) == 2        # full at the third
    after = counters(mc, "cmd_set", "total_items")
    assert after["cmd_set"] - before["cmd_set"] == 3
    assert after["total_items"] - before["total_items"] == 2
    c.flush_queue("two")
    before = after
    assert c.put("two", [b"a", b"b"]) == 2
    assert counters(mc, "cmd_set")["cmd_set"] - before["cmd_set"] == 2
    c.flush_queue("two")


def test_empty_puts_and_gets_of_no_items_create_nothing(c, mc):
    q = name("tnone")
    assert c.put(q, []) == 0
    assert c.get(q, 0) == []
    assert c.get(q, 0, 500) == []
    assert "queue_%s_items" % q not in stats(mc)
    assert c.get(q, 1) == []                    # max_items > 0 creates it (§5.1)
    assert "queue_%s_items" % q in stats(mc)
    p = name("tpeek")
    c.peek(p)                                   # so does peek
    assert "queue_%s_items" % p in stats(mc)


def test_a_negative_max_items_takes_everything(c):
    q = name("tneg")
    assert c.put(q, [b"1", b"2", b"3", b"4", b"5"]) == 5
    assert [i.data for i in c.get(q, -1)] == [b"1", b"2", b"3", b"4", b"5"]


def test_expiration_msec_zero_is_never_and_negative_is_at_once(c):
    q = name("texp")
    assert c.put(q, [b"never"], 0) == 1
    assert c.put(q, [b"gone"], -5) == 1
    assert c.put(q, [b"later"], 60_000) == 1
    assert [i.data for i in c.get(q, 5)] == [b"never", b"later"]


def test_the_open_read_cap_answers_at_once_even_with_a_timeout(h, c):
    """§3.3 / §9 #13: with max_open_transactions (3) open reads on the queue, every get of this
    connection returns [] at once, transactional or not, whatever its timeout; another
    connection is not capped, and the reads stay open after the holder goes."""
    q = name("tcap")
    c.put(q, [b"a", b"b", b"c", b"d", b"e"])
    held = c.get(q, 10, 0, 60_000)
    assert [i.data for i in held] == [b"a", b"b", b"c"]
    t0 = time.monotonic()
    assert c.get(q, 1, 5_000) == []
    assert c.get(q, 1, 5_000, 60_000) == []
    assert time.monotonic() - t0 < 4.0
    with KestrelThrift("127.0.0.1", h.thrift_port) as other:
        assert [i.data for i in other.get(q, 1)] == [b"d"]
        assert other.peek(q).open_transactions == 3
        assert other.confirm("whatever", {i.id for i in held}) == 3    # the name is not used
        assert other.peek(q).open_transactions == 0


def test_auto_abort_counts_a_cancel_and_a_late_confirm_settles_nothing(c, mc):
    q = name("tauto")
    c.put(q, [b"x"])
    got = c.get(q, 1, 0, 100)
    assert [i.data for i in got] == [b"x"] and got[0].id > 0
    assert wait_for(lambda: c.peek(q).items == 1, 10)
    st = stats(mc)
    assert st["queue_%s_canceled_transactions" % q] == "1"
    assert st["queue_%s_open_transactions" % q] == "0"
    assert c.confirm(q, {got[0].id}) == 0
    assert c.abort(q, {got[0].id}) == 0
    assert [(i.data, i.id) for i in c.get(q, 1)] == [(b"x", 0)]


def test_gets_count_hits_and_misses_not_cmd_get_and_no_bytes(c, mc):
    """§4.3: a thrift get counts one hit per item and a miss for the iteration that finds the
    queue empty, never cmd_get; peek counts cmd_peek and a hit or miss; thrift bytes are not in
    bytes_read/bytes_written (§9 #26)."""
    q = name("tcnt")
    c.put(q, [b"1", b"2"])
    keys = ("cmd_get", "cmd_peek", "get_hits", "get_misses", "bytes_read", "bytes_written")
    before = counters(mc, *keys)
    assert len(c.get(q, 5)) == 2
    c.peek(q)
    after = counters(mc, *keys)
    stats_len = after["bytes_read"] - before["bytes_read"]
    assert stats_len == len(b"stats\r\n")           # only the stats request itself
    d = {k: after[k] - before[k] for k in keys[:4]}
    assert d == {"cmd_get": 0, "cmd_peek": 1, "get_hits": 2, "get_misses": 2}


def test_alias_reads_are_empty_and_peek_fails(c, mc):
    """§5.7 / §3.3: a thrift get on an alias is [] and counts neither a hit nor a miss; peek on
    an alias is INTERNAL_ERROR (Kestrel found no `items` stat), the connection stays up."""
    c.put("tal", [b"v"])
    before = counters(mc, "get_hits", "get_misses")
    assert c.get("tal", 3) == []
    assert counters(mc, "get_hits", "get_misses") == before
    with pytest.raises(ThriftAppError) as e:
        c.peek("tal")
    assert e.value.type == 6 and "key not found: items" in e.value.message
    c.flush_queue("tal")                         # no-ops on an alias
    c.delete_queue("tal")
    assert [i.data for i in c.get("tal1", 3)] == [b"v"]
    assert [i.data for i in c.get("tal2", 3)] == [b"v"]


def test_a_put_to_an_alias_counts_in_its_put_items_and_put_bytes(c, mc):
    """§5.7's alias stats count a thrift put as a memcache set or a text put does (a thrift
    put used to leave them at 0)."""
    st = stats(mc)
    items, size = int(st["queue_tal_put_items"]), int(st["queue_tal_put_bytes"])
    assert c.put("tal", [b"abc", b"de"]) == 2
    st = stats(mc)
    assert int(st["queue_tal_put_items"]) - items == 2
    assert int(st["queue_tal_put_bytes"]) - size == 5
    assert st["queue_tal_children"] == "tal1,tal2"
    c.flush_queue("tal1")
    c.flush_queue("tal2")


def test_peek_reports_the_queues_stats(c, mc):
    q = name("tinfo")
    c.put(q, [b"head", b"xy"])
    info = c.peek(q)
    st = stats(mc)
    assert info.head_item == b"head" and info.items == 2 and info.bytes == 6
    assert info.journal_bytes == int(st["queue_%s_logsize" % q]) > 0
    assert info.waiters == 0 and info.open_transactions == 0 and info.age == 0


def test_status_mapping_and_confirm_under_quiescent(c, mc):
    """§3.3: WriteAvoid reads as NOT_CONFIGURED; in Quiescent get/peek/flush/delete fail with
    the operation named, confirm and abort still work."""
    q = name("tstat")
    c.put(q, [b"1", b"2"])
    held = c.get(q, 2, 0, 60_000)
    assert ask(mc, b"status writeavoid\r\n") == b"END\r\n"
    try:
        assert c.current_status() == NOT_CONFIGURED
        c.set_status(QUIESCENT)
        assert c.current_status() == QUIESCENT
        for call, op in ((lambda: c.get(q, 1), "monitorUntil"), (lambda: c.peek(q), "getItem"),
                         (lambda: c.flush_queue(q), "flush"), (lambda: c.delete_queue(q), "delete"),
                         (lambda: c.put(q, [b"z"]), "setItem")):
            with pytest.raises(ThriftAppError) as e:
                call()
            assert e.value.type == 6
            assert e.value.message.endswith("Server not available for operation %s'" % op)
        assert c.confirm(q, {held[0].id}) == 1
        assert c.abort(q, {held[1].id}) == 1
    finally:
        c.set_status(UP)
    assert [i.data for i in c.get(q, 5)] == [b"2"]


def test_get_version_is_memcaches_version(c, mc):
    assert ask(mc, b"version\r\n") == b"VERSION %s\r\n" % c.get_version().encode()
