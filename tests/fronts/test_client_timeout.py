"""client_timeout (reference: finagle's read timeout): a connection that sent nothing for that
long is closed, even with a blocking get waiting; the sweep looks only at the connections that
expired and the next one, not at every open connection (issue 8)."""
from __future__ import annotations

import pytest

from lanner.config import Config, ServerConfig
from lanner.fronts.conn import Conn
from lanner.fronts.front import close_idle
from lanner.fronts.memcache import MemcacheConn
from tests.fronts.harness import Rig

LAST_ACTIVITY = Conn.__dict__["last_activity"]       # the field itself (a slot's descriptor)


class Watched(MemcacheConn):
    """A memcache connection whose `last_activity` reads are counted (what a sweep has to look
    at): a property in front of Conn's field, which still holds the value.  A subclass, not a
    patch of Conn: Conn is a C type in the compiled build (conn.pxd), and a C type's
    attributes cannot be set."""
    __slots__ = ()
    reads: list = []

    @property
    def last_activity(self):
        self.reads.append(self.id)
        return LAST_ACTIVITY.__get__(self)

    @last_activity.setter
    def last_activity(self, value):
        LAST_ACTIVITY.__set__(self, value)


@pytest.fixture
def rig(tmp_path):
    r = Rig(tmp_path, config=Config(server=ServerConfig(client_timeout=1000)))
    yield r
    r.close()


@pytest.fixture
def looked_at():
    """The reads of every Watched connection's `last_activity`, from none."""
    Watched.reads = reads = []
    return reads


def test_the_sweep_closes_the_idle_and_looks_at_no_other(rig, looked_at):
    old = [rig.connect(Watched) for _ in range(10)]
    waiting = old[1]
    waiting.send(b"get q/t=60000\r\n")                   # a blocking get: idle all the same
    rig.run()
    rig.clock.advance(600)
    new = [rig.connect(Watched) for _ in range(1000)]
    rig.clock.advance(100)
    busy = old[0]                                        # connected first, but read since
    assert busy.ask(b"version\r\n").startswith(b"VERSION")
    rig.clock.advance(400)
    del looked_at[:]
    close_idle(rig.front, 1.0)
    rig.run()
    assert len(looked_at) == 9 + 1                       # the 9 expired, then the first that is not
    assert [c.closed for c in old] == [False] + [True] * 9
    assert not any(c.closed for c in new)
    assert len(rig.front.idle) == 1001

    rig.clock.advance(500)                               # the new ones expire, `busy` 0.1 s later
    close_idle(rig.front, 1.0)
    rig.run()
    assert all(c.closed for c in new) and not busy.closed
    rig.clock.advance(100)
    del looked_at[:]
    close_idle(rig.front, 1.0)
    rig.run()
    assert busy.closed and looked_at == [busy.conn.id] and not rig.front.idle


def test_the_sweep_comes_back_when_the_first_connection_is_due(rig):
    a = rig.connect()
    rig.clock.advance(300)
    b = rig.connect()
    close_idle(rig.front, 1.0)
    (due, _, cb, args), = rig.loop.timers
    assert due == pytest.approx(rig.loop.time() + 0.7)   # when `a` expires, not a fixed period
    rig.clock.advance(700)
    rig.run()
    assert a.closed and not b.closed
    (due, _, cb, args), = rig.loop.timers
    assert due == pytest.approx(rig.loop.time() + 0.3)
    rig.clock.advance(300)
    rig.run()
    assert b.closed


def test_without_a_client_timeout_a_read_keeps_no_idle_order(tmp_path, looked_at):
    """client_timeout off (the default, and never changed by a reload): no sweep ever runs,
    so no read pays for the order it would walk (issue 8, per request)."""
    r = Rig(tmp_path)
    try:
        c = r.connect(Watched)
        assert c.ask(b"version\r\n").startswith(b"VERSION")
        assert r.front.idle is None and looked_at == []
        c.conn.transport.close()                             # connection_lost with no order to keep
        r.run()
        assert c.closed and not r.front.conns
    finally:
        r.close()
