"""Raw-byte tests of the memcache dialect against a real `lanner serve` (reference §1)."""
import itertools
import os
import time

import pytest

pytestmark = pytest.mark.integration

_n = itertools.count()


def qname(tag="q"):
    return f"{tag}{next(_n)}_{int(time.time() * 1000) % 100000}".encode()


def setq(c, q, data, exp=0):
    return c.ask(b"set %s 0 %d %d\r\n%s\r\n" % (q, exp, len(data), data))


def filled(mc, *items: bytes):
    """A new client and a fresh queue holding `items`, each set checked STORED: how most of these
    tests begin."""
    c = mc()
    q = qname()
    for data in items:
        assert setq(c, q, data) == b"STORED\r\n"
    return c, q


def test_set_get_fifo(mc):
    c, q = filled(mc)
    assert setq(c, q, b"hello") == b"STORED\r\n"
    assert setq(c, q, b"world") == b"STORED\r\n"
    assert c.ask(b"get " + q + b"\r\n", b"END\r\n") == b"VALUE " + q + b" 0 5\r\nhello\r\nEND\r\n"
    assert c.ask(b"GET " + q + b"\n", b"END\r\n") == b"VALUE " + q + b" 0 5\r\nworld\r\nEND\r\n"
    assert c.ask(b"get " + q + b"\r\n", b"END\r\n") == b"END\r\n"


def test_value_echoes_key_as_sent(mc):
    c, q = filled(mc, b"hello")
    got = c.ask(b"get " + q + b"/t=10/open\r\n", b"END\r\n")
    assert got == b"VALUE " + q + b"/t=10/open 0 5\r\nhello\r\nEND\r\n"


def test_binary_data_and_empty_item(mc):
    c, q = filled(mc)
    data = bytes(range(256)) + b"\r\nEND\r\n"
    assert setq(c, q, data) == b"STORED\r\n"
    assert setq(c, q, b"") == b"STORED\r\n"
    want = b"VALUE " + q + b" 0 %d\r\n" % len(data) + data + b"\r\nEND\r\n"
    c.send(b"get " + q + b"\r\n")
    assert c.recv_n(len(want)) == want
    assert c.ask(b"get " + q + b"\r\n", b"END\r\n") == b"VALUE " + q + b" 0 0\r\n\r\nEND\r\n"


def test_pipelining_in_order(mc):
    c, q = filled(mc)
    req = b"".join(b"set %s 0 0 1\r\n%d\r\n" % (q, i) for i in range(10))
    req += b"".join(b"get %s\r\n" % q for i in range(10))
    c.send(req)
    for _ in range(10):
        assert c.recv_until(b"\r\n") == b"STORED\r\n"
    for i in range(10):
        assert c.recv_until(b"END\r\n") == b"VALUE %s 0 1\r\n%d\r\nEND\r\n" % (q, i)


def test_reliable_read_open_close(mc):
    c, q = filled(mc, b"a", b"b")
    assert c.ask(b"get " + q + b"/open\r\n", b"END\r\n").startswith(b"VALUE")
    # plain get with an open read on the same queue: ERROR + close, and the read rolls back
    c.send(b"get " + q + b"\r\n")
    assert c.recv_until(b"\r\n") == b"ERROR\r\n"
    assert c.is_closed()
    d = mc()
    assert d.ask(b"get " + q + b"/open\r\n", b"END\r\n") == b"VALUE " + q + b"/open 0 1\r\na\r\nEND\r\n"
    assert d.ask(b"get " + q + b"/close\r\n", b"END\r\n") == b"END\r\n"
    assert d.ask(b"get " + q + b"\r\n", b"END\r\n") == b"VALUE " + q + b" 0 1\r\nb\r\nEND\r\n"


def test_close_open_and_abort(mc):
    c, q = filled(mc)
    for x in (b"1", b"2", b"3"):
        setq(c, q, x)
    assert c.ask(b"get %s/open\r\n" % q, b"END\r\n").endswith(b"1\r\nEND\r\n")
    assert c.ask(b"get %s/close/open\r\n" % q, b"END\r\n").endswith(b"2\r\nEND\r\n")
    assert c.ask(b"get %s/abort\r\n" % q, b"END\r\n") == b"END\r\n"
    assert c.ask(b"get %s/abort\r\n" % q, b"END\r\n") == b"END\r\n"   # nothing open: still END
    assert c.ask(b"get %s\r\n" % q, b"END\r\n").endswith(b"2\r\nEND\r\n")


def test_open_beyond_limit_is_error_and_close(mc):
    c, q = filled(mc, b"x", b"y")
    assert c.ask(b"get %s/open\r\n" % q, b"END\r\n").endswith(b"x\r\nEND\r\n")
    c.send(b"get %s/open\r\n" % q)
    assert c.recv_until(b"\r\n") == b"ERROR\r\n"
    assert c.is_closed()
    d = mc()
    assert d.ask(b"get %s\r\n" % q, b"END\r\n").endswith(b"x\r\nEND\r\n")


def test_disconnect_rolls_back(mc):
    c, q = filled(mc, b"keep")
    assert c.ask(b"get %s/open\r\n" % q, b"END\r\n").endswith(b"keep\r\nEND\r\n")
    c.close()
    d = mc()
    assert d.ask(b"get %s/t=2000\r\n" % q, b"END\r\n").endswith(b"keep\r\nEND\r\n")


def test_peek(mc):
    c, q = filled(mc)
    assert c.ask(b"get %s/peek\r\n" % q, b"END\r\n") == b"END\r\n"
    setq(c, q, b"p")
    assert c.ask(b"get %s/peek\r\n" % q, b"END\r\n").endswith(b"p\r\nEND\r\n")
    assert c.ask(b"get %s/peek\r\n" % q, b"END\r\n").endswith(b"p\r\nEND\r\n")
    assert c.ask(b"get %s\r\n" % q, b"END\r\n").endswith(b"p\r\nEND\r\n")


def test_blocking_get_times_out_and_wakes(mc):
    c, q = filled(mc)
    t0 = time.monotonic()
    assert c.ask(b"get %s/t=300\r\n" % q, b"END\r\n") == b"END\r\n"
    assert time.monotonic() - t0 >= 0.28
    d = mc()
    c.send(b"get %s/t=5000\r\n" % q)
    setq(d, q, b"late")
    assert c.recv_until(b"END\r\n").endswith(b"late\r\nEND\r\n")


def test_blocking_get_fifo_across_fronts(mc):
    q = qname()
    waiters = [mc() for _ in range(4)]
    watcher = mc()
    for n, w in enumerate(waiters, 1):
        w.send(b"get %s/t=10000\r\n" % q)
        # wait until the worker has parked it, so the FIFO order is the order sent
        deadline = time.monotonic() + 10
        while b"waiters=%d\r\n" % n not in watcher.ask(b"dump_stats %s\r\n" % q, b"END\r\n"):
            assert time.monotonic() < deadline
            time.sleep(0.01)
    p = mc()
    for i in range(4):
        setq(p, q, b"%d" % i)
    got = [w.recv_until(b"END\r\n") for w in waiters]
    assert [g.split(b"\r\n")[1] for g in got] == [b"0", b"1", b"2", b"3"]


def test_expiry_relative_and_absolute(mc):
    c, q = filled(mc)
    assert c.ask(b"set %s 0 1000000 1\r\nx\r\n" % q) == b"STORED\r\n"   # absolute, long past
    assert c.ask(b"get %s\r\n" % q, b"END\r\n") == b"END\r\n"
    assert c.ask(b"set %s 0 -1 1\r\nx\r\n" % q) == b"STORED\r\n"
    time.sleep(0.01)
    assert c.ask(b"get %s\r\n" % q, b"END\r\n") == b"END\r\n"
    assert c.ask(b"set %s 0 100 1\r\ny\r\n" % q) == b"STORED\r\n"
    assert c.ask(b"get %s\r\n" % q, b"END\r\n").endswith(b"y\r\nEND\r\n")


def test_delete_and_flush(mc):
    c, q = filled(mc, b"1", b"2")
    assert c.ask(b"flush %s\r\n" % q) == b"END\r\n"
    assert c.ask(b"get %s\r\n" % q, b"END\r\n") == b"END\r\n"
    setq(c, q, b"3")
    assert c.ask(b"delete %s\r\n" % q) == b"DELETED\r\n"
    assert c.ask(b"delete nosuchqueue%s\r\n" % q) == b"DELETED\r\n"
    assert c.ask(b"get %s\r\n" % q, b"END\r\n") == b"END\r\n"


def test_noreply(mc):
    c, q = filled(mc)
    c.send(b"set %s 0 0 1 noreply\r\na\r\n" % q)
    c.send(b"set %s 0 0 1 noreply\r\nb\r\n" % q)
    assert c.ask(b"get %s\r\n" % q, b"END\r\n").endswith(b"a\r\nEND\r\n")
    c.send(b"flush %s noreply\r\n" % q)
    assert c.ask(b"get %s\r\n" % q, b"END\r\n") == b"END\r\n"


def test_multi_key_get(mc):
    c = mc()
    a, b, e = qname("a"), qname("b"), qname("e")
    setq(c, a, b"A")
    setq(c, b, b"B")
    got = c.ask(b"get %s %s %s\r\n" % (a, e, b), b"END\r\n")
    assert got == b"VALUE %s 0 1\r\nA\r\nVALUE %s 0 1\r\nB\r\nEND\r\n" % (a, b)


def test_errors(mc):
    c = mc()
    assert c.ask(b"bogus\r\n").startswith(b"CLIENT_ERROR")
    assert c.is_closed()
    c = mc()
    assert c.ask(b"get\r\n").startswith(b"CLIENT_ERROR")
    assert c.ask(b"version\r\n").startswith(b"VERSION ")     # still open
    assert c.ask(b"set q 0 0 1\r\nx\r\n".replace(b"q", qname()) ) == b"STORED\r\n"
    assert c.ask(b"set foo x 0 1\r\nx\r\n").startswith(b"CLIENT_ERROR")   # flags: stays open
    assert c.ask(b"version\r\n").startswith(b"VERSION ")
    closes_with_client_error(c, b"get a.b\r\n")
    for request in (b"get q/open/peek\r\n", b"add q 0 0 1\r\nx\r\n", b"get q/t=abc\r\n"):
        closes_with_client_error(mc(), request)


def closes_with_client_error(c, request: bytes) -> None:
    c.send(request)
    assert c.recv_until(b"\r\n").startswith(b"CLIENT_ERROR")
    assert c.is_closed()


def test_illegal_names_never_escape(mc, server):
    for bad in (b"../x", b"a/b", b"..", b"~root", b"x\\y"):
        closes_with_client_error(mc(), b"set %s 0 0 1\r\nx\r\n" % bad)
    parent = os.path.dirname(server.queue_path)
    assert not os.path.exists(os.path.join(parent, "x"))


def test_confirm(mc):
    c, q = filled(mc, b"1")
    assert c.ask(b"confirm %s 1\r\n" % q) == b"ERROR\r\n"
    assert c.ask(b"get %s/open\r\n" % q, b"END\r\n").endswith(b"1\r\nEND\r\n")
    assert c.ask(b"confirm %s 0\r\n" % q) == b"ERROR\r\n"
    assert c.ask(b"confirm %s 1\r\n" % q) == b"END\r\n"
    assert c.ask(b"confirm %s\r\n" % q).startswith(b"CLIENT_ERROR")


def test_monitor(mc):
    c, q = filled(mc, b"a")
    assert c.ask(b"monitor %s 0\r\n" % q) == b"END\r\n"
    got = c.ask(b"monitor %s 1 1\r\n" % q, b"END\r\nEND\r\n")
    assert got == b"VALUE %s 0 1\r\na\r\nEND\r\nEND\r\n" % q
    assert c.ask(b"confirm %s 1\r\n" % q) == b"END\r\n"


def test_flush_expired_and_flush_all_expired(mc):
    c, q = filled(mc)
    c.ask(b"set %s 0 -1 1\r\nx\r\n" % q)
    c.ask(b"set %s 0 -1 1\r\nx\r\n" % q)
    time.sleep(0.01)
    # the second add swept the first expired item at the head (reference §5.2)
    assert c.ask(b"flush_expired %s\r\n" % q) == b"1\r\n"
    assert c.ask(b"flush_expired nosuch%s\r\n" % q) == b"0\r\n"
    assert c.ask(b"flush_all_expired\r\n").rstrip().isdigit()


def test_stats_shape(mc):
    c, q = filled(mc, b"hello")
    out = c.ask(b"stats\r\n", b"\r\nEND\r\n").decode()
    lines = out.split("\r\n")
    keys = [ln.split(" ")[1] for ln in lines if ln.startswith("STAT ")]
    assert keys[:19] == ["uptime", "time", "version", "curr_items", "total_items", "bytes",
                         "reserved_memory_ratio", "curr_connections", "total_connections", "cmd_get",
                         "cmd_set", "cmd_peek", "get_hits", "get_misses", "bytes_read",
                         "bytes_written", "queue_creates", "queue_deletes", "queue_expires"]
    qk = [k[len("queue_%s_" % q.decode()):] for k in keys if k.startswith("queue_%s_" % q.decode())]
    assert qk == ["items", "bytes", "total_items", "logsize", "expired_items", "mem_items",
                  "mem_bytes", "age", "discarded", "waiters", "open_transactions", "transactions",
                  "canceled_transactions", "total_flushes", "journal_rewrites", "journal_rotations"]
    assert f"STAT queue_{q.decode()}_items 1" in lines
    assert f"STAT queue_{q.decode()}_logsize 26" in lines


def test_dump_stats(mc):
    c, q = filled(mc, b"hello")
    out = c.ask(b"dump_stats %s nosuch%s\r\n" % (q, q), b"\r\nEND\r\n")
    assert out.startswith(b"queue '%s' {\r\n  items=1\r\n" % q)
    assert b"queue 'nosuch%s' {\r\n  \r\n}\r\nEND\r\n" % q in out


def test_status_and_version(mc):
    c = mc()
    assert c.ask(b"status\r\n") == b"UP\r\n"
    assert c.ask(b"version\r\n").startswith(b"VERSION ")
    c.send(b"status bogus\r\n")
    assert c.recv_until(b"\r\n").startswith(b"CLIENT_ERROR")
    assert c.is_closed()


def test_status_readonly_blocks_writes(mc):
    c, q = filled(mc, b"z")
    assert c.ask(b"status readonly\r\n") == b"END\r\n"
    try:
        assert c.ask(b"status\r\n") == b"READONLY\r\n"
        d = mc()
        d.send(b"set %s 0 0 1\r\nx\r\n" % q)
        assert d.recv_until(b"\r\n").startswith(b"SERVER_ERROR")
        assert d.is_closed()
        e = mc()
        assert e.ask(b"get %s\r\n" % q, b"END\r\n").endswith(b"z\r\nEND\r\n")   # reads still allowed
        assert e.ask(b"flush_all_expired\r\n").rstrip().isdigit()
    finally:
        assert c.ask(b"status up\r\n") == b"END\r\n"


def test_quit_closes_silently(mc):
    c = mc()
    c.send(b"quit\r\n")
    assert c.is_closed()


def test_data_block_over_many_writes(mc):
    c, q = filled(mc)
    data = b"x" * 300_000
    c.send(b"set %s 0 0 %d\r\n" % (q, len(data)))
    for i in range(0, len(data), 7000):
        c.send(data[i:i + 7000])
    c.send(b"\r\n")
    assert c.recv_until(b"\r\n") == b"STORED\r\n"
    c.send(b"get %s\r\n" % q)
    head = c.recv_until(b"\r\n")
    assert head == b"VALUE %s 0 %d\r\n" % (q, len(data))
    assert c.recv_n(len(data) + 7) == data + b"\r\nEND\r\n"


def test_large_item_through_rings(mc):
    c, q = filled(mc)
    data = bytes(range(256)) * (9 * 4096)     # 9 MiB: larger than a ring, and than the pipeline cap
    c.send(b"set %s 0 0 %d\r\n" % (q, len(data)) + data + b"\r\n")
    assert c.recv_until(b"\r\n") == b"STORED\r\n"
    c.send(b"get %s\r\n" % q)
    assert c.recv_until(b"\r\n") == b"VALUE %s 0 %d\r\n" % (q, len(data))
    assert c.recv_n(len(data) + 7) == data + b"\r\nEND\r\n"


def test_dump_config(mc):
    c, q = filled(mc, b"x")
    out = c.ask(b"dump_config\r\n", b"END\r\n")
    block = out.split(b"queue '%s' {\r\n" % q)[1].split(b"}\r\n")[0]
    lines = block.decode().split("\r\n")
    assert "  max_items=2147483647" in lines
    assert out.endswith(b"END\r\n")


def test_close_then_open_while_quiescent(mc):
    c, q = filled(mc, b"a", b"b")
    assert c.ask(b"get %s/open\r\n" % q, b"END\r\n").endswith(b"a\r\nEND\r\n")
    admin = mc()
    assert admin.ask(b"status quiescent\r\n") == b"END\r\n"
    try:
        c.send(b"get %s/close/open\r\n" % q)
        assert c.recv_until(b"\r\n").startswith(b"SERVER_ERROR")   # and nothing before it
        assert c.is_closed()
    finally:
        assert admin.ask(b"status up\r\n") == b"END\r\n"
    d = mc()
    # the close happened before the status check: "a" is gone, "b" is next
    assert d.ask(b"get %s\r\n" % q, b"END\r\n").endswith(b"b\r\nEND\r\n")
