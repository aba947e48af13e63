"""Reference §5 (queue semantics) and its §9 surprises on a real `lanner serve`, statement by
statement where no server test checked them yet: creation on reference, expiry boundaries, full
queues, delete and flush, fanout, aliases, open reads, waiters, max_queue_age, open-transaction
timeouts and connection limits.  Conformance audit, part 3."""
from __future__ import annotations

import threading
import time

import pytest

from tests.helpers import LAYOUTS, start_server, wait_for
from tests.server.audit3 import ask, mc, name, stats  # noqa: F401 (mc: a fixture)

pytestmark = pytest.mark.integration

CONFIG = """
[server]
max_open_transactions = 2
expiration_timer_frequency = "100ms"
[queues."cap"]
max_items = 2
[queues."sized"]
max_size = 510
[queues."one5"]
max_item_size = 5
[queues."aged"]
max_queue_age = "300ms"
[queues."lazy"]
open_transaction_timeout = "200ms"
[aliases."nowhere"]
destinations = []
[aliases."pair"]
destinations = ["pair1", "pair2"]
"""


@pytest.fixture(scope="module")
def h(tmp_path_factory):
    h = start_server(tmp_path_factory.mktemp("queues-audit3"), config=CONFIG)
    yield h
    h.stop()


def qstat(s, q: bytes, key: str) -> str | None:
    return stats(s).get("queue_%s_%s" % (q.decode(), key))


def exists(s, q: bytes) -> bool:
    return qstat(s, q, "items") is not None


def get(s, q: bytes) -> bytes | None:
    r = ask(s, b"get %s\r\n" % q, b"END\r\n")
    return None if r == b"END\r\n" else r.split(b"\r\n")[1]


def closed(s, timeout: float = 5.0) -> bool:
    s.settimeout(timeout)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def in_thread(fn):
    out = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    return t, out


def park(s, sock, q: bytes, options: bytes, waiters: int):
    """Start `get q<options>` on `sock` in a thread; return once the queue counts `waiters`."""
    t, out = in_thread(lambda: ask(sock, b"get %s%s\r\n" % (q, options), b"END\r\n"))
    assert wait_for(lambda: qstat(s, q, "waiters") == str(waiters), 10)
    return t, out


# -- 5.1 creation on reference -------------------------------------------------------------------

def test_which_commands_create_a_queue(h, mc):
    """§5.1 / §9 #18: adds and fetches create; confirm, abort, close, flush, delete,
    flush_expired, dump_stats and anything addressed to an alias do not."""
    s = mc()
    t = mc(h.text_port)
    quiet = [name("n%d" % i) for i in range(8)]
    ask(s, b"get %s/close\r\n" % quiet[0], b"END\r\n")
    ask(s, b"get %s/abort\r\n" % quiet[1], b"END\r\n")
    ask(s, b"flush %s\r\n" % quiet[2])
    ask(s, b"delete %s\r\n" % quiet[3])
    assert ask(s, b"flush_expired %s\r\n" % quiet[4]) == b"0\r\n"
    ask(s, b"dump_stats %s\r\n" % quiet[5], b"END\r\n")
    assert ask(s, b"confirm %s 1\r\n" % quiet[6]) == b"ERROR\r\n"
    assert ask(t, b"confirm %s 1\n" % quiet[7], b"\n") == b"-Not that many transactions open.\n"
    ask(s, b"get nowhere\r\n", b"END\r\n")
    ask(s, b"set nowhere 0 0 1\r\nx\r\n")
    st = stats(s)
    for q in quiet + [b"pair1x"]:
        assert "queue_%s_items" % q.decode() not in st
    assert "queue_nowhere_items" not in st
    made = [name("c%d" % i) for i in range(6)]
    ask(s, b"set %s 0 0 1\r\nx\r\n" % made[0])
    ask(s, b"get %s/peek\r\n" % made[1], b"END\r\n")
    ask(s, b"get %s/t=1\r\n" % made[2], b"END\r\n")
    ask(s, b"monitor %s 1\r\n" % made[3], b"END\r\n")
    ask(t, b"peek %s\n" % made[4], b"\n")
    ask(t, b"monitor %s 1\n" % made[5], b"*\n")
    st = stats(s)
    for q in made:
        assert "queue_%s_items" % q.decode() in st, q


# -- 5.2 item expiration -------------------------------------------------------------------------

def test_expiry_boundaries_by_protocol(h, mc):
    """§5.2: memcache 0 never, below 1,000,000 relative seconds (negative: already past),
    from 1,000,000 absolute Unix seconds; text 0 is now; expired items stay in `items` until a
    touch, and a peek that finds one counts a miss."""
    s = mc()
    q = name("exb")
    now = int(time.time())
    for exptime, data in ((0, b"never"), (-1, b"neg"), (1_000_000, b"abs70"), (now - 1, b"past"),
                          (999_999, b"rel"), (now + 3600, b"ahead")):
        assert ask(s, b"set %s 0 %d %d\r\n%s\r\n" % (q, exptime, len(data), data)) == b"STORED\r\n"
    assert get(s, q) == b"never"
    assert get(s, q) == b"rel"
    assert get(s, q) == b"ahead"
    assert qstat(s, q, "expired_items") == "3"
    t = mc(h.text_port)
    tq = name("tex")
    assert ask(t, b"put %s 0:\nnow\n\n" % tq, b"\n") == b"+1\n"
    assert wait_for(lambda: ask(t, b"peek %s\n" % tq, b"\n") == b"*\n", 5)
    assert qstat(s, tq, "expired_items") == "1"


def test_an_item_that_expires_while_open_comes_back_expired(mc):
    """An open read's item that expires meanwhile goes back on abort and is dropped as expired
    at the next touch (it is not delivered)."""
    s = mc()
    q = name("exo")
    ask(s, b"set %s 0 1 1\r\na\r\n" % q)
    assert ask(s, b"get %s/open\r\n" % q, b"END\r\n") == b"VALUE %s/open 0 1\r\na\r\nEND\r\n" % q
    t0 = time.time()
    while time.time() < t0 + 1.1:
        time.sleep(0.05)                 # the item's second runs out while it is open
    ask(s, b"get %s/abort\r\n" % q, b"END\r\n")
    assert ask(s, b"get %s/peek\r\n" % q, b"END\r\n") == b"END\r\n"
    assert qstat(s, q, "expired_items") == "1" and qstat(s, q, "items") == "0"


# -- 5.3 full queues -----------------------------------------------------------------------------

def test_full_queues(mc):
    """§5.3: max_items refuses with NOT_STORED; max_size lets the last item overshoot (two
    256-byte items under 510, the third refused); max_item_size is inclusive."""
    s = mc()
    assert [ask(s, b"set cap 0 0 1\r\n%d\r\n" % i) for i in range(3)] == \
        [b"STORED\r\n", b"STORED\r\n", b"NOT_STORED\r\n"]
    body = b"z" * 256
    assert [ask(s, b"set sized 0 0 256\r\n%s\r\n" % body) for _ in range(3)] == \
        [b"STORED\r\n", b"STORED\r\n", b"NOT_STORED\r\n"]
    assert qstat(s, b"sized", "bytes") == "512"
    assert ask(s, b"set one5 0 0 5\r\n12345\r\n") == b"STORED\r\n"
    assert ask(s, b"set one5 0 0 6\r\n123456\r\n") == b"NOT_STORED\r\n"
    for q in (b"cap", b"sized", b"one5"):
        ask(s, b"flush %s\r\n" % q)


def test_open_reads_do_not_count_toward_max_items(mc):
    s = mc()
    ask(s, b"set cap 0 0 1\r\na\r\nset cap 0 0 1\r\nb\r\n", b"STORED\r\nSTORED\r\n")
    assert ask(s, b"get cap/open\r\n", b"END\r\n") != b"END\r\n"
    assert ask(s, b"set cap 0 0 1\r\nc\r\n") == b"STORED\r\n"
    assert ask(s, b"set cap 0 0 1\r\nd\r\n") == b"NOT_STORED\r\n"
    ask(s, b"get cap/close\r\n", b"END\r\n")
    ask(s, b"flush cap\r\n")


def test_full_is_judged_before_the_expiry_sweep(mc):
    """§5.2 / §9 #21: a queue full of expired items still refuses an add (expiry_timer aside:
    the sweep runs every 100 ms here, so the refusal is looked for before it), and a get
    that sweeps makes room."""
    s = mc()
    now = int(time.time())
    ask(s, b"set cap 0 %d 1\r\na\r\n" % (now + 1), b"\r\n")
    ask(s, b"set cap 0 %d 1\r\nb\r\n" % (now + 1), b"\r\n")
    # both expire at the same instant; pipelined so no timer sweep falls between the two
    end = now + 2
    while time.time() < end + 0.01:
        time.sleep(0.02)
    out = ask(s, b"set cap 0 0 1\r\nc\r\nget cap\r\nset cap 0 0 1\r\nd\r\n", b"END\r\nSTORED\r\n")
    # the timer may have swept first (then c is stored); without it c is refused
    assert out in (b"NOT_STORED\r\nEND\r\nSTORED\r\n", b"STORED\r\nVALUE cap 0 1\r\nc\r\nEND\r\nSTORED\r\n")
    ask(s, b"flush cap\r\n")


# -- 5.4 max_queue_age ---------------------------------------------------------------------------

def test_max_queue_age_deletes_an_empty_queue_on_the_timer(mc):
    s = mc()
    before = stats(s)
    ask(s, b"set aged 0 0 1\r\na\r\n")
    assert get(s, b"aged") == b"a"
    assert wait_for(lambda: not exists(s, b"aged"), 10)
    after = stats(s)
    assert int(after["queue_expires"]) - int(before["queue_expires"]) == 1
    assert int(after["queue_deletes"]) - int(before["queue_deletes"]) == 1
    ask(s, b"set aged 0 0 1\r\nb\r\n")              # back when referenced, stats from 0
    assert qstat(s, b"aged", "total_items") == "1"


# -- 5.5 delete and flush ------------------------------------------------------------------------

def test_delete_wakes_waiters_empty_and_later_confirms_are_silent(mc):
    s, r, w = mc(), mc(), mc()
    q = name("del")
    ask(s, b"set %s 0 0 1\r\na\r\n" % q)
    assert ask(r, b"get %s/open\r\n" % q, b"END\r\n") != b"END\r\n"
    w2 = name("delw")
    ask(s, b"set %s 0 0 1\r\na\r\n" % w2)
    ask(s, b"get %s\r\n" % w2, b"END\r\n")
    t, out = park(s, w, w2, b"/t=20000", 1)
    assert ask(s, b"delete %s\r\n" % w2) == b"DELETED\r\n"
    t.join(10)
    assert out == [b"END\r\n"]
    assert ask(s, b"delete %s\r\n" % q) == b"DELETED\r\n"
    assert ask(r, b"get %s/close\r\n" % q, b"END\r\n") == b"END\r\n"
    assert not exists(s, q)
    ask(s, b"set %s 0 0 1\r\nb\r\n" % q)
    assert qstat(s, q, "total_items") == "1" and qstat(s, q, "canceled_transactions") == "0"


def test_flush_leaves_open_reads_to_abort_back(mc):
    s, r = mc(), mc()
    q = name("fl")
    ask(s, b"set %s 0 0 1\r\na\r\nset %s 0 0 1\r\nb\r\n" % (q, q), b"STORED\r\nSTORED\r\n")
    assert ask(r, b"get %s/open\r\n" % q, b"END\r\n") == b"VALUE %s/open 0 1\r\na\r\nEND\r\n" % q
    assert ask(s, b"flush %s\r\n" % q) == b"END\r\n"
    assert (qstat(s, q, "items"), qstat(s, q, "open_transactions"), qstat(s, q, "total_flushes")) == \
        ("0", "1", "1")
    ask(r, b"get %s/abort\r\n" % q, b"END\r\n")
    assert get(s, q) == b"a" and get(s, q) is None


# -- 5.6 fanout, 5.7 aliases ---------------------------------------------------------------------

def test_fanout_delete_of_a_child_unregisters_it_and_of_a_master_keeps_children(mc):
    s = mc()
    m = name("fan")
    ask(s, b"get %s+a\r\n" % m, b"END\r\n")
    ask(s, b"get %s+b\r\n" % m, b"END\r\n")
    assert not exists(s, m)                       # the parent need not exist
    ask(s, b"set %s 0 0 1\r\n1\r\n" % m)
    assert qstat(s, m, "children") in ("%s+a,%s+b" % (m.decode(), m.decode()),
                                       "%s+b,%s+a" % (m.decode(), m.decode()))
    assert ask(s, b"delete %s+a\r\n" % m) == b"DELETED\r\n"
    ask(s, b"set %s 0 0 1\r\n2\r\n" % m)
    assert not exists(s, m + b"+a")               # not fed, not re-created
    assert qstat(s, m, "children") == "%s+b" % m.decode()
    assert ask(s, b"delete %s\r\n" % m) == b"DELETED\r\n"
    assert qstat(s, m + b"+b", "items") == "2"
    ask(s, b"set %s 0 0 1\r\n3\r\n" % m)           # a new master: the child registers again
    assert qstat(s, m + b"+b", "items") == "3"


def test_items_written_before_a_child_existed_are_not_copied(mc):
    s = mc()
    m = name("late")
    ask(s, b"set %s 0 0 1\r\n1\r\n" % m)
    ask(s, b"get %s+c/peek\r\n" % m, b"END\r\n")
    ask(s, b"set %s 0 0 1\r\n2\r\n" % m)
    assert get(s, m + b"+c") == b"2" and get(s, m + b"+c") is None


def test_aliases(mc):
    """§5.7: an alias without destinations accepts everything; reads are empty; delete and
    flush reply as usual and do nothing."""
    s = mc()
    assert ask(s, b"set nowhere 0 0 1\r\nx\r\n") == b"STORED\r\n"
    assert ask(s, b"set pair 0 0 1\r\np\r\n") == b"STORED\r\n"
    assert ask(s, b"get pair\r\n", b"END\r\n") == b"END\r\n"
    assert ask(s, b"get pair/open\r\n", b"END\r\n") == b"END\r\n"
    assert ask(s, b"delete pair\r\n") == b"DELETED\r\n"
    assert ask(s, b"flush pair\r\n") == b"END\r\n"
    assert get(s, b"pair1") == b"p" and get(s, b"pair2") == b"p"
    st = stats(s)
    assert st["queue_nowhere_children"] == "" and st["queue_pair_children"] == "pair1,pair2"


# -- 5.9 open reads ------------------------------------------------------------------------------

def test_disconnect_rolls_back_last_opened_first(mc):
    """§9 #10: two open reads rolled back by a disconnect come back in reverse order."""
    s, r = mc(), mc()
    q = name("rb")
    ask(s, b"set %s 0 0 1\r\na\r\nset %s 0 0 1\r\nb\r\nset %s 0 0 1\r\nc\r\n" % (q, q, q),
        b"STORED\r\nSTORED\r\nSTORED\r\n")
    ask(r, b"get %s/open\r\n" % q, b"END\r\n")
    ask(r, b"get %s/open\r\n" % q, b"END\r\n")
    r.close()
    assert wait_for(lambda: qstat(s, q, "open_transactions") == "0", 10)
    assert [get(s, q) for _ in range(3)] == [b"b", b"a", b"c"]


def test_open_read_violations_close_and_roll_back(mc):
    """§9 #11: beyond max_open_transactions (2), and a plain get with an open read on the same
    queue, answer ERROR and close, which rolls the reads back; a peek and another queue are
    fine."""
    s, r, p = mc(), mc(), mc()
    q = name("ov")
    for i in range(3):
        ask(s, b"set %s 0 0 1\r\n%d\r\n" % (q, i))
    ask(r, b"get %s/open\r\n" % q, b"END\r\n")
    assert ask(r, b"get %s/peek\r\n" % q, b"END\r\n") == b"VALUE %s/peek 0 1\r\n1\r\nEND\r\n" % q
    assert ask(r, b"get other%s\r\n" % q, b"END\r\n") == b"END\r\n"
    ask(r, b"get %s/open\r\n" % q, b"END\r\n")
    assert ask(r, b"get %s/open\r\n" % q) == b"ERROR\r\n"
    assert closed(r)
    assert wait_for(lambda: qstat(s, q, "items") == "3", 10)
    ask(p, b"get %s/open\r\n" % q, b"END\r\n")
    assert ask(p, b"get %s\r\n" % q) == b"ERROR\r\n"
    assert closed(p)
    assert wait_for(lambda: qstat(s, q, "items") == "3", 10)
    assert qstat(s, q, "canceled_transactions") == "3"


def test_open_transaction_timeout_is_lazy(mc):
    """§5.9 / §9 #17: a timed-out open read stays open until someone removes from the
    non-empty queue; that remove gets the item back, and the holder's close is a no-op."""
    s, r = mc(), mc()
    ask(s, b"set lazy 0 0 1\r\nA\r\nset lazy 0 0 1\r\nB\r\n", b"STORED\r\nSTORED\r\n")
    assert ask(r, b"get lazy/open\r\n", b"END\r\n") == b"VALUE lazy/open 0 1\r\nA\r\nEND\r\n"
    t0 = time.time()
    while time.time() < t0 + 0.5:
        time.sleep(0.05)                 # well past the 200 ms timeout
    assert qstat(s, b"lazy", "open_transactions") == "1"
    assert get(s, b"lazy") == b"A"
    assert qstat(s, b"lazy", "canceled_transactions") == "1"
    assert ask(r, b"get lazy/close\r\n", b"END\r\n") == b"END\r\n"
    assert get(s, b"lazy") == b"B"


# -- 5.10 waiters --------------------------------------------------------------------------------

def test_waiters_fifo_abort_wakes_and_peek_waiter_takes_the_wakeup(mc):
    s, a, b, r = mc(), mc(), mc(), mc()
    q = name("wf")
    ta, oa = park(s, a, q, b"/t=20000", 1)
    tb, ob = park(s, b, q, b"/t=20000", 2)
    ask(s, b"set %s 0 0 1\r\n1\r\n" % q)
    ta.join(10)
    assert oa == [b"VALUE %s/t=20000 0 1\r\n1\r\nEND\r\n" % q]
    ask(s, b"set %s 0 0 1\r\n2\r\n" % q)
    tb.join(10)
    assert ob == [b"VALUE %s/t=20000 0 1\r\n2\r\nEND\r\n" % q]
    # an abort wakes a waiter
    ask(s, b"set %s 0 0 1\r\n3\r\n" % q)
    ask(r, b"get %s/open\r\n" % q, b"END\r\n")
    ta, oa = park(s, a, q, b"/t=20000", 1)
    ask(r, b"get %s/abort\r\n" % q, b"END\r\n")
    ta.join(10)
    assert oa == [b"VALUE %s/t=20000 0 1\r\n3\r\nEND\r\n" % q]
    # a peek waiter ahead of a get waiter takes the one wake-up (§5.10, §9 #16)
    tp, op = park(s, a, q, b"/peek/t=20000", 1)
    tg, og = park(s, b, q, b"/t=600", 2)
    ask(s, b"set %s 0 0 1\r\n4\r\n" % q)
    tp.join(10)
    tg.join(10)
    assert op == [b"VALUE %s/peek/t=20000 0 1\r\n4\r\nEND\r\n" % q]
    assert og == [b"END\r\n"]
    assert get(s, q) == b"4"


def test_abort_ignores_t_and_close_alone_does_not_fetch(mc):
    s = mc()
    q = name("ab")
    ask(s, b"set %s 0 0 1\r\nx\r\n" % q)
    t0 = time.monotonic()
    assert ask(s, b"get %s/abort/t=5000\r\n" % q, b"END\r\n") == b"END\r\n"
    assert ask(s, b"get %s/close/t=5000\r\n" % q, b"END\r\n") == b"END\r\n"
    assert time.monotonic() - t0 < 4
    assert get(s, q) == b"x"


def test_option_words_are_case_sensitive(mc):
    """§9 #4: `/Open` is no option: the get is a plain, destructive one."""
    s = mc()
    q = name("cs")
    ask(s, b"set %s 0 0 1\r\nx\r\n" % q)
    assert ask(s, b"get %s/Open\r\n" % q, b"END\r\n") == b"VALUE %s/Open 0 1\r\nx\r\nEND\r\n" % q
    assert qstat(s, q, "open_transactions") == "0" and qstat(s, q, "items") == "0"


def test_requests_behind_a_monitor_or_a_blocking_get_wait_for_it(mc):
    """§9 #42: requests are served one after another per connection, so a set pipelined behind
    a monitor (or a blocking get) of the same queue runs only once that has ended: the monitor
    times out empty and the item is still there afterwards."""
    s = mc()
    q = name("pipe")
    assert ask(s, b"monitor %s 1\r\nset %s 0 0 1\r\nz\r\n" % (q, q), b"STORED\r\n") == \
        b"END\r\nSTORED\r\n"
    assert ask(s, b"get %s/t=300\r\nset %s 0 0 1\r\ny\r\n" % (q, q), b"STORED\r\n") == \
        b"VALUE %s/t=300 0 1\r\nz\r\nEND\r\nSTORED\r\n" % q
    assert get(s, q) == b"y"
    q2 = name("pipe")
    assert ask(s, b"get %s/t=300\r\nset %s 0 0 1\r\nx\r\n" % (q2, q2), b"STORED\r\n") == \
        b"END\r\nSTORED\r\n"
    assert get(s, q2) == b"x"


# -- 5.12 connection limits ----------------------------------------------------------------------

def test_connection_limits_refuse_for_the_connections_whole_life(tmp_path):
    """§5.12: a connection accepted while the sessions (itself included) are above the limit
    refuses writes (or reads) for its whole life, with the status-blocking errors; one accepted
    under the limit keeps working when more arrive."""
    h = start_server(tmp_path, config="[server]\nconnection_limit_refuse_writes = 2\n"
                                      "connection_limit_refuse_reads = 3\n")
    socks = []
    try:
        def conn(port=None):
            s = h.connect(port)
            socks.append(s)
            return s
        first, second = conn(), conn()
        assert ask(first, b"set cl 0 0 1\r\na\r\n") == b"STORED\r\n"
        assert ask(second, b"set cl 0 0 1\r\nb\r\n") == b"STORED\r\n"
        third = conn()
        assert ask(third, b"get cl/peek\r\n", b"END\r\n") == b"VALUE cl/peek 0 1\r\na\r\nEND\r\n"
        assert ask(third, b"set cl 0 0 1\r\nc\r\n").startswith(b"SERVER_ERROR")
        assert closed(third)
        fourth = conn(h.text_port)             # sessions: first, second, this (third is gone)
        assert ask(fourth, b"peek cl\n", b"\n") == b":a\n"
        assert ask(fourth, b"put cl:\nd\n\n", b"\n") == b"-Server not available for operation setItem\n"
        fifth = conn(h.text_port)
        assert ask(fifth, b"get cl\n", b"\n") == b"-Server not available for operation getItem\n"
        assert ask(first, b"set cl 0 0 1\r\ne\r\n") == b"STORED\r\n"    # still allowed
    finally:
        for s in socks:
            s.close()
        h.stop()


# -- 5.10 a stopping server ----------------------------------------------------------------------

def read_to_eof(s, timeout: float = 20.0) -> bytes:
    s.settimeout(timeout)
    buf = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return buf
            buf += chunk
    except ConnectionResetError:
        return buf + b"<reset>"


@pytest.mark.parametrize("layout", ["one-worker"] + sorted(LAYOUTS))
def test_a_stopping_server_answers_its_waiters_empty(tmp_path, layout):
    """§5.10: shutting the server down wakes every waiter, which answers empty: a blocking
    get `END`, a monitor its final `END`, a text get `*`, a thrift get its items so far
    (none: []); then the connection closes and the server exits 0.  (They used to be closed
    with no reply.)"""
    from lanner.perf.thrift_client import KestrelThrift
    h = start_server(tmp_path, thrift=True, layout=None if layout == "one-worker" else layout)
    g, m = h.connect(), h.connect()
    t = h.connect(h.text_port)
    th = KestrelThrift("127.0.0.1", h.thrift_port)
    s = h.connect()
    try:
        queues = [b"w%d" % i for i in range(4)]
        g.sendall(b"get %s/t=60000\r\n" % queues[0])
        m.sendall(b"monitor %s 60\r\n" % queues[1])
        t.sendall(b"get %s 60000\n" % queues[2])
        got = []
        tt = threading.Thread(target=lambda: got.append(th.get(queues[3].decode(), 5, 60_000)))
        tt.start()
        assert wait_for(lambda: all(qstat(s, q, "waiters") == "1" for q in queues), 20)
        s.close()
        assert h.stop() == 0
        assert read_to_eof(g) == b"END\r\n"
        assert read_to_eof(m) == b"END\r\n"
        assert read_to_eof(t) == b"*\n"
        tt.join(20)
        assert got == [[]]
    finally:
        for c in (g, m, t):
            c.close()
        th.close()
        h.stop()
