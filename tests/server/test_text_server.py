"""Raw-byte tests of the text protocol against a real `lanner serve` (reference §2)."""
import itertools
import time

import pytest

pytestmark = pytest.mark.integration

_n = itertools.count()


def qn():
    return b"tq%d_%d" % (next(_n), int(time.time() * 1000) % 100000)


@pytest.fixture
def tc(mc, server):
    def make():
        return mc(server.text_port)
    return make


def test_put_get_one_behind(tc):
    c = tc()
    q = qn()
    assert c.ask(b"put %s:\nfirst\nsecond\n\n" % q, b"\n") == b"+2\n"
    assert c.ask(b"get %s\n" % q, b"\n") == b":first\n"
    assert c.ask(b"get %s\n" % q, b"\n") == b":second\n"   # confirms "first"
    c.close()
    d = tc()
    # "second" was never confirmed: it comes back once the disconnect is processed
    assert d.ask(b"get %s 5000\n" % q, b"\n") == b":second\n"
    assert d.ask(b"confirm %s 1\n" % q, b"\n") == b"+1\n"
    assert d.ask(b"get %s\n" % q, b"\n") == b"*\n"


def test_bytes_stored_as_sent(tc):
    c = tc()
    q = qn()
    assert c.ask(b"put %s:\ncaf\xe9\n\n" % q, b"\n") == b"+1\n"
    assert c.ask(b"get %s\n" % q, b"\n") == b":caf\xe9\n"


def test_put_expiry_and_errors(tc):
    c = tc()
    q = qn()
    assert c.ask(b"put %s 0:\ngone\n\n" % q, b"\n") == b"+1\n"
    time.sleep(0.01)
    assert c.ask(b"peek %s\n" % q, b"\n") == b"*\n"
    assert c.ask(b"put %s abc:\nx\n\n" % q, b"\n") == b"-Error parsing expiration time.\n"
    assert c.ask(b"put:\n\n", b"\n") == b"-Queue name required.\n"
    assert c.ask(b"frob\n", b"\n") == b"-Unknown command: frob\n"
    assert c.ask(b"\n", b"\n") == b"-Unknown command: \n"
    assert c.ask(b"get\n", b"\n") == b"-Queue name required.\n"
    assert c.ask(b"confirm %s 5\n" % q, b"\n") == b"-Not that many transactions open.\n"
    assert c.ask(b"monitor %s\n" % q, b"\n") == b"-Queue name & timeout required.\n"


def test_peek_timeout_and_wake(tc):
    c = tc()
    q = qn()
    t0 = time.monotonic()
    assert c.ask(b"get %s 200\n" % q, b"\n") == b"*\n"
    assert time.monotonic() - t0 >= 0.18
    d = tc()
    c.send(b"get %s 5000\n" % q)
    assert d.ask(b"put %s:\nhi\n\n" % q, b"\n") == b"+1\n"
    assert c.recv_until(b"\n") == b":hi\n"


def test_monitor(tc):
    c = tc()
    q = qn()
    c.ask(b"put %s:\na\n\n" % q, b"\n")
    assert c.ask(b"monitor %s 100\n" % q, b"*\n") == b":a\n*\n"


def test_flush_delete_status_version(tc):
    c = tc()
    q = qn()
    c.ask(b"put %s:\na\nb\n\n" % q, b"\n")
    assert c.ask(b"flush %s\n" % q, b"\n") == b"+0\n"
    assert c.ask(b"peek %s\n" % q, b"\n") == b"*\n"
    assert c.ask(b"delete %s\n" % q, b"\n") == b"+0\n"
    assert c.ask(b"status\n", b"\n") == b":UP\n"
    assert c.ask(b"status bogus\n", b"\n") == b"-Unknown status.\n"
    assert c.ask(b"status down\n", b"\n") == b"-Status forbidden.\n"
    assert c.ask(b"version\n", b"\n").startswith(b":")


def test_quit(tc):
    c = tc()
    c.send(b"quit\n")
    assert c.is_closed()
