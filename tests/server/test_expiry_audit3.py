"""Reference §5.2 (item expiration) on a real `lanner serve`, conformance audit part 3: a
memcache `set`'s relative exptime counts from the moment the whole request is in, as Kestrel's
handler saw it (naggati hands over a set only with its body), also when Lanner streams a large
body to its worker as it arrives (fronts/memcache.py, ipc/bodies.py)."""
from __future__ import annotations

import time

import pytest

from tests.helpers import LAYOUTS, recv_until, start_server
from tests.server.audit3 import ask, name

pytestmark = pytest.mark.integration

BODY = 256 << 10           # over the front's STREAM_OVER (64 KiB): the body is streamed
GAP = 1.0                  # seconds between the set's header and the rest of its body


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def server(request, tmp_path_factory):
    h = start_server(tmp_path_factory.mktemp("expiry-" + request.param), layout=request.param)
    yield h
    h.stop()


def slow_set(s, queue: bytes, exptime: int, noreply: bool) -> float:
    """A set whose first body bytes come with its header and the rest GAP seconds later (a
    slow client, a big item); returns the client's clock just before the rest was sent."""
    data = b"x" * BODY
    s.sendall(b"set %s 0 %d %d%s\r\n" % (queue, exptime, BODY, b" noreply" if noreply else b"")
              + data[:1000])
    time.sleep(GAP)                     # the client's pause is the scenario, not a wait
    sent = time.time()
    s.sendall(data[1000:] + b"\r\n")
    if not noreply:
        assert recv_until(s, b"\r\n") == b"STORED\r\n"
    return sent


@pytest.mark.parametrize("noreply", [False, True], ids=["reply", "noreply"])
def test_a_streamed_sets_relative_exptime_counts_from_its_end(server, noreply):
    """exptime 2 on a body that took GAP (1 s) to arrive: the item is there until 2 s after its
    last byte (it used to expire 2 s after the header, 1 s after the STORED)."""
    s = server.connect()
    try:
        for attempt in range(3):        # a reply later than 2 s after the body tells nothing
            q = name("slow")
            sent = slow_set(s, q, 2, noreply)      # a peek behind a noreply set runs after it
            deadline = sent + 1.6
            while time.time() < deadline:
                time.sleep(0.05)        # probing the item's lifetime, not waiting for a change
            got = ask(s, b"get %s/peek\r\n" % q, b"END\r\n")
            answered = time.time()
            if answered >= sent + 2.0:
                continue
            assert got.startswith(b"VALUE %s/peek 0 %d\r\n" % (q, BODY)), \
                "the item expired %.0f ms after its body was in, not 2000" % ((answered - sent) * 1000)
            return
        pytest.fail("in 3 tries the server never answered a peek within 2 s of the body")
    finally:
        s.close()


def test_a_streamed_set_with_an_absolute_exptime_keeps_it(server):
    """An absolute exptime (>= 1,000,000: Unix seconds) is a moment, whenever the body ends:
    one already past leaves nothing to get; one an hour ahead keeps the item."""
    s = server.connect()
    try:
        past = name("abs-past")
        data = b"y" * BODY
        assert ask(s, b"set %s 0 %d %d\r\n%s\r\n" % (past, int(time.time()) - 5, BODY, data)) == \
            b"STORED\r\n"
        assert ask(s, b"get %s\r\n" % past, b"END\r\n") == b"END\r\n"
        ahead = name("abs-ahead")
        assert ask(s, b"set %s 0 %d %d\r\n%s\r\n" % (ahead, int(time.time()) + 3600, BODY, data)) == \
            b"STORED\r\n"
        assert ask(s, b"get %s\r\n" % ahead, b"END\r\n").startswith(b"VALUE %s 0 %d\r\n" % (ahead, BODY))
    finally:
        s.close()
