"""Reference §4 (stats) on a real `lanner serve`, statement by statement: what increments each
counter and when (§4.1-4.3), `dump_stats` with and without names (§4.4), over memcache and the
text protocol.  Conformance audit, part 3."""
from __future__ import annotations

import re
import time

import pytest

from tests.helpers import start_server, wait_for
from tests.server.audit3 import ask, mc, name, stat_lines, stats  # noqa: F401 (mc: a fixture)

pytestmark = pytest.mark.integration

CONFIG = """
[server]
max_open_transactions = 4
[queues."full"]
max_items = 1
[queues."drop"]
max_items = 2
discard_old_when_full = true
[queues."void"]
fanout_only = true
[queues."src"]
expire_to_queue = "sink"
[aliases."both"]
destinations = ["b1", "b2"]
"""

GLOBAL = ["uptime", "time", "version", "curr_items", "total_items", "bytes",
          "reserved_memory_ratio", "curr_connections", "total_connections", "cmd_get", "cmd_set",
          "cmd_peek", "get_hits", "get_misses", "bytes_read", "bytes_written", "queue_creates",
          "queue_deletes", "queue_expires"]
PER_QUEUE = ["items", "bytes", "total_items", "logsize", "expired_items", "mem_items", "mem_bytes",
             "age", "discarded", "waiters", "open_transactions", "transactions",
             "canceled_transactions", "total_flushes", "journal_rewrites", "journal_rotations"]
COUNTERS = ("cmd_get", "cmd_set", "cmd_peek", "get_hits", "get_misses", "total_items",
            "queue_creates", "queue_deletes")


@pytest.fixture(scope="module")
def h(tmp_path_factory):
    h = start_server(tmp_path_factory.mktemp("stats-audit3"), config=CONFIG)
    yield h
    h.stop()


def queue_stats(s, q: str) -> dict[str, str]:
    p = "queue_%s_" % q
    return {k[len(p):]: v for k, v in stat_lines(s) if k.startswith(p)}


class Delta:
    """The global counters' change since the last look (one `stats` per look)."""

    def __init__(self, s):
        self.s = s
        self.last = self.read()

    def read(self) -> dict[str, int]:
        st = stats(self.s)
        return {k: int(st[k]) for k in COUNTERS}

    def __call__(self) -> dict[str, int]:
        now = self.read()
        d = {k: now[k] - self.last[k] for k in COUNTERS if now[k] != self.last[k]}
        self.last = now
        return d


def test_the_references_example_byte_counts_on_a_fresh_server(tmp_path):
    """§4.1's example: one `set q 0 0 5` (20 bytes, `STORED` 8) and the `stats` (7 bytes) on a
    fresh server; the global lines in the reference's order, Lanner's three counters after
    them, then the queue's lines in §4.1's order; `age` 0 (deviation 6)."""
    h = start_server(tmp_path)
    try:
        s = h.connect()
        assert ask(s, b"set q 0 0 5\r\nhello\r\n") == b"STORED\r\n"
        lines = stat_lines(s)
        keys = [k for k, _ in lines]
        assert keys[:19] == GLOBAL
        assert keys[19:22] == ["routed_requests", "handoffs", "fsyncs"]
        assert keys[22:] == ["queue_q_" + k for k in PER_QUEUE]
        st = dict(lines)
        assert {k: st[k] for k in ("curr_items", "total_items", "bytes", "curr_connections",
                                   "total_connections", "cmd_get", "cmd_set", "cmd_peek",
                                   "get_hits", "get_misses", "bytes_read", "bytes_written",
                                   "queue_creates", "queue_deletes", "queue_expires")} == {
            "curr_items": "1", "total_items": "1", "bytes": "5", "curr_connections": "1",
            "total_connections": "1", "cmd_get": "0", "cmd_set": "1", "cmd_peek": "0",
            "get_hits": "0", "get_misses": "0", "bytes_read": "27", "bytes_written": "8",
            "queue_creates": "1", "queue_deletes": "0", "queue_expires": "0"}
        assert abs(int(st["time"]) - time.time()) < 5
        assert re.fullmatch(r"\d+\.\d{3}", st["reserved_memory_ratio"])     # %.3f
        assert {k: st["queue_q_" + k] for k in ("items", "bytes", "total_items", "logsize",
                                                 "mem_items", "mem_bytes", "age")} == {
            "items": "1", "bytes": "5", "total_items": "1", "logsize": "26", "mem_items": "1",
            "mem_bytes": "5", "age": "0"}
        s.close()
    finally:
        h.stop()


def test_dump_stats_with_no_queue_and_no_alias_is_a_crlf_and_end(tmp_path):
    h = start_server(tmp_path)
    try:
        s = h.connect()
        assert ask(s, b"dump_stats\r\n", b"END\r\n") == b"\r\nEND\r\n"
        assert ask(s, b"dump_stats nosuch\r\n", b"END\r\n") == b"queue 'nosuch' {\r\n  \r\n}\r\nEND\r\n"
        assert ask(s, b"dump_stats\r\n", b"END\r\n") == b"\r\nEND\r\n"        # nothing created
        s.close()
    finally:
        h.stop()


def test_memcache_reads_count_as_the_reference_says(mc):
    """§4.3: peek counts cmd_peek and a hit or miss (and creates); /open and /t= count cmd_get;
    /close and /abort alone count nothing; a get on an alias counts cmd_get only; monitor
    counts a hit per item and a miss when it ends, never cmd_get."""
    s = mc()
    d = Delta(s)
    q = name("cnt")
    assert ask(s, b"get %s/peek\r\n" % q, b"END\r\n") == b"END\r\n"
    assert d() == {"cmd_peek": 1, "get_misses": 1, "queue_creates": 1}
    ask(s, b"set %s 0 0 1\r\na\r\n" % q)
    assert d() == {"cmd_set": 1, "total_items": 1}
    ask(s, b"get %s/peek\r\n" % q, b"END\r\n")
    assert d() == {"cmd_peek": 1, "get_hits": 1}
    assert ask(s, b"get %s/open\r\n" % q, b"END\r\n") != b"END\r\n"
    assert d() == {"cmd_get": 1, "get_hits": 1}
    ask(s, b"get %s/abort\r\n" % q, b"END\r\n")
    ask(s, b"get %s/close\r\n" % q, b"END\r\n")
    assert d() == {}
    ask(s, b"get %s/close/open\r\n" % q, b"END\r\n")        # the aborted item again
    ask(s, b"get %s/close/open\r\n" % q, b"END\r\n")        # empty now
    assert d() == {"cmd_get": 2, "get_hits": 1, "get_misses": 1}
    ask(s, b"get %s/close\r\n" % q, b"END\r\n")
    ask(s, b"get %s/t=30\r\n" % q, b"END\r\n")
    assert d() == {"cmd_get": 1, "get_misses": 1}
    ask(s, b"get both\r\n", b"END\r\n")
    ask(s, b"get both/peek\r\n", b"END\r\n")
    assert d() == {"cmd_get": 1, "cmd_peek": 1}
    ask(s, b"set %s 0 0 1\r\nb\r\nset %s 0 0 1\r\nc\r\n" % (q, q), b"STORED\r\nSTORED\r\n")
    d()
    out = ask(s, b"monitor %s 1 5\r\n" % q, b"END\r\nEND\r\n")
    assert out == b"VALUE %s 0 1\r\nb\r\nEND\r\nVALUE %s 0 1\r\nc\r\nEND\r\nEND\r\n" % (q, q)
    assert d() == {"get_hits": 2, "get_misses": 1}
    assert ask(s, b"confirm %s 2\r\n" % q) == b"END\r\n"
    qs = queue_stats(s, q.decode())
    # open reads tried on a non-empty queue: /open, the /close/open after the abort, two monitor
    # items (not the /close/open nor the monitor iteration that found it empty)
    assert qs["transactions"] == "4" and qs["canceled_transactions"] == "1"


def test_text_commands_count_as_the_reference_says(h, mc):
    """§4.3 over the text protocol: get counts cmd_get, peek cmd_peek, monitor neither; a put
    of N items counts N in cmd_set, NOT_STORED included."""
    s = mc()
    t = h.connect(h.text_port)
    try:
        d = Delta(s)
        q = name("txt")
        assert ask(t, b"get %s\n" % q, b"\n") == b"*\n"
        assert d() == {"cmd_get": 1, "get_misses": 1, "queue_creates": 1}
        assert ask(t, b"peek %s\n" % q, b"\n") == b"*\n"
        assert d() == {"cmd_peek": 1, "get_misses": 1}
        assert ask(t, b"put %s:\n1\n2\n\n" % q, b"\n") == b"+2\n"
        assert d() == {"cmd_set": 2, "total_items": 2}
        assert ask(t, b"monitor %s 200\n" % q, b"*\n") == b":1\n:2\n*\n"
        assert d() == {"get_hits": 2, "get_misses": 1}
        assert ask(t, b"confirm %s 2\n" % q, b"\n") == b"+2\n"
        assert ask(t, b"flush full\n", b"\n") == b"+0\n"      # a flush creates nothing
        assert ask(t, b"put full:\nx\ny\n\n", b"\n") == b"+1\n"
        assert d().items() >= {"cmd_set": 2, "total_items": 1}.items()
        ask(t, b"flush full\n", b"\n")
    finally:
        t.close()


def test_total_items_counts_fanout_copies_fanout_only_masters_and_alias_destinations(mc):
    """§4.3: +1 per add into a real queue: a master with one child counts 2, a fanout_only
    master 1 although it keeps nothing, an alias one per destination; NOT_STORED counts in
    cmd_set only; an expire_to_queue move counts in neither."""
    s = mc()
    ask(s, b"get void+c\r\n", b"END\r\n")
    ask(s, b"get void/peek\r\n", b"END\r\n")
    child = name("fan")
    ask(s, b"get %s+c\r\n" % child, b"END\r\n")
    d = Delta(s)
    assert ask(s, b"set %s 0 0 1\r\nx\r\n" % child) == b"STORED\r\n"
    assert d() == {"cmd_set": 1, "total_items": 2, "queue_creates": 1}
    assert ask(s, b"set void 0 0 1\r\nx\r\n") == b"STORED\r\n"
    assert d() == {"cmd_set": 1, "total_items": 2}
    qv = queue_stats(s, "void")
    assert qv["items"] == "0" and qv["total_items"] == "0" and qv["children"] == "void+c"
    assert queue_stats(s, "void+c")["items"] == "1"
    d()
    assert ask(s, b"set both 0 0 2\r\nxy\r\n") == b"STORED\r\n"
    assert d()["total_items"] == 2
    assert ask(s, b"set full 0 0 1\r\nx\r\nset full 0 0 1\r\ny\r\n", b"STORED\r\nNOT_STORED\r\n")
    assert d() == {"cmd_set": 2, "total_items": 1}
    ask(s, b"flush full\r\n")
    assert "queue_sink_items" not in stats(s)
    d()
    assert ask(s, b"set src 0 -1 1\r\nm\r\n") == b"STORED\r\n"
    assert stats(s)["queue_sink_items"] == "0"          # made with its source (§5.2)
    assert ask(s, b"get src\r\n", b"END\r\n") == b"END\r\n"        # expires, moves to sink
    assert wait_for(lambda: queue_stats(s, "sink").get("items") == "1", 10)
    assert d() == {"cmd_set": 1, "cmd_get": 1, "get_misses": 1, "total_items": 1, "queue_creates": 2}
    assert queue_stats(s, "src")["expired_items"] == "1"
    assert ask(s, b"get sink\r\n", b"END\r\n") == b"VALUE sink 0 1\r\nm\r\nEND\r\n"


def test_per_queue_counters(mc):
    """§4.2: transactions count open reads tried on a non-empty queue, even when the head had
    expired; aborts and disconnect rollbacks count as canceled; discard_old_when_full's drops
    as discarded; age is the last removed item's; flushes count once per flush."""
    s, x = mc(), mc()
    q = name("pq")
    ask(s, b"set %s 0 -1 1\r\nz\r\n" % q)
    assert queue_stats(s, q.decode())["items"] == "1"       # expired, not yet swept (§9 #23)
    assert ask(s, b"get %s/open\r\n" % q, b"END\r\n") == b"END\r\n"
    st = queue_stats(s, q.decode())
    assert (st["items"], st["expired_items"], st["transactions"]) == ("0", "1", "1")
    ask(s, b"set %s 0 0 1\r\na\r\nset %s 0 0 1\r\nb\r\n" % (q, q), b"STORED\r\nSTORED\r\n")
    ask(x, b"get %s/open\r\n" % q, b"END\r\n")
    ask(x, b"get %s/abort\r\n" % q, b"END\r\n")
    ask(x, b"get %s/open\r\n" % q, b"END\r\n")
    x.close()
    assert wait_for(lambda: queue_stats(s, q.decode())["open_transactions"] == "0", 10)
    st = queue_stats(s, q.decode())
    assert (st["transactions"], st["canceled_transactions"], st["items"]) == ("3", "2", "2")
    ask(s, b"flush %s\r\n" % q)
    ask(s, b"flush %s\r\n" % q)
    assert queue_stats(s, q.decode())["total_flushes"] == "2"
    for i in range(3):
        ask(s, b"set drop 0 0 1\r\n%d\r\n" % i)
    st = queue_stats(s, "drop")
    assert (st["items"], st["discarded"], st["total_items"]) == ("2", "1", "3")
    a = name("age")
    ask(s, b"set %s 0 0 3\r\nold\r\n" % a)
    t0 = time.monotonic()
    while time.monotonic() < t0 + 0.3:
        time.sleep(0.02)                # the item grows old: what age reports
    ask(s, b"set %s 0 0 1\r\nn\r\n" % a)
    ask(s, b"get %s\r\n" % a, b"END\r\n")
    assert 300 <= int(queue_stats(s, a.decode())["age"]) < 10_000
    ask(s, b"get %s\r\n" % a, b"END\r\n")
    assert queue_stats(s, a.decode())["age"] == "0"           # bytes == 0


def test_waiters_count_blocked_fetchers_and_drop_on_disconnect(mc):
    s, w1, w2 = mc(), mc(), mc()
    q = name("wt")
    w1.sendall(b"get %s/t=20000\r\n" % q)
    w2.sendall(b"monitor %s 20\r\n" % q)
    assert wait_for(lambda: queue_stats(s, q.decode()).get("waiters") == "2", 10)
    w1.close()
    w2.close()
    assert wait_for(lambda: queue_stats(s, q.decode()).get("waiters") == "0", 10)


def test_dump_stats_names_in_the_order_given(mc):
    """§4.4: exactly the names given, in that order (repeats too); a fanout master's block ends
    with its children; an alias has its three keys; an unknown name's block is one line of two
    spaces and creates nothing."""
    s = mc()
    m = name("dm")
    ask(s, b"get %s+k\r\n" % m, b"END\r\n")
    ask(s, b"set %s 0 0 1\r\na\r\n" % m)
    nosuch = name("nosuch")
    out = ask(s, b"dump_stats %s both %s %s\r\n" % (m, nosuch, m), b"\r\nEND\r\n").decode()
    blocks = out[:-len("\r\nEND\r\n")].split("\r\n}\r\n")
    assert blocks[-1].endswith("\r\n}")
    blocks[-1] = blocks[-1][:-len("\r\n}")]
    heads = [b.split("\r\n")[0] for b in blocks]
    assert heads == ["queue '%s' {" % m.decode(), "queue 'both' {", "queue '%s' {" % nosuch.decode(),
                     "queue '%s' {" % m.decode()]
    keys = [ln.strip().split("=")[0] for ln in blocks[0].split("\r\n")[1:]]
    assert keys == PER_QUEUE + ["children"]
    assert blocks[0].split("\r\n")[-1] == "  children=%s+k" % m.decode()
    assert [ln.split("=")[0] for ln in blocks[1].split("\r\n")[1:]] == \
        ["  put_items", "  put_bytes", "  children"]
    assert blocks[1].endswith("  children=b1,b2")
    assert blocks[2] == "queue '%s' {\r\n  " % nosuch.decode()
    assert blocks[3] == blocks[0]
    assert "queue_%s_items" % nosuch.decode() not in stats(s)
    whole = ask(s, b"dump_stats\r\n", b"\r\nEND\r\n").decode()
    assert "queue '%s' {" % m.decode() in whole and "queue 'both' {" in whole


def test_restart_replays_into_per_queue_total_items_not_the_global_one(tmp_path):
    """§4.2/§4.3/§9 #25: after a restart a queue's total_items counts its replayed adds, the
    global total_items starts at 0, and queue_creates counts the queues loaded from disk."""
    h = start_server(tmp_path)
    s = h.connect()
    for q in (b"r1", b"r2"):
        ask(s, b"set %s 0 0 1\r\na\r\nset %s 0 0 1\r\nb\r\n" % (q, q), b"STORED\r\nSTORED\r\n")
    ask(s, b"get r1\r\n", b"END\r\n")
    s.close()
    assert h.stop() == 0
    h = start_server(tmp_path, queue_path=h.queue_path)
    try:
        s = h.connect()
        st = stats(s)
        assert (st["total_items"], st["curr_items"], st["queue_creates"]) == ("0", "3", "2")
        assert st["queue_r1_total_items"] == "2" and st["queue_r2_total_items"] == "2"
        assert st["queue_r1_items"] == "1"
        s.close()
    finally:
        h.stop()
