"""Conn's two protocol hooks (conn.py): a connection class that leaves one out fails at its
first use, with an error that names the class and the hook.  They were abc.abstractmethods,
which failed at instantiation; Conn is a C type in the compiled build (conn.pxd), and a C type
cannot have ABCMeta."""
from __future__ import annotations

import pytest

from lanner.fronts.conn import Conn
from lanner.ipc import messages as m
from lanner.protocols.memcache import MemcacheParser
from tests.fronts.harness import Rig


class Bare(Conn):
    """A protocol's connection that implements neither hook."""
    __slots__ = ()

    def __init__(self, front):
        super().__init__(front, MemcacheParser())


class NoUnavailable(Bare):
    """One that takes commands (every one a `stats`) but has no availability error."""
    __slots__ = ()

    def handle(self, cmd) -> None:
        self.stats_slot(lambda worker_globals, queues: b"STATS\r\n")


@pytest.fixture
def rig(tmp_path):
    r = Rig(tmp_path)
    yield r
    r.close()


def test_a_connection_class_without_handle_fails_at_its_first_command(rig):
    c = rig.connect(Bare)
    with pytest.raises(NotImplementedError, match=r"^Bare\.handle$"):
        c.send(b"version\r\n")
        rig.run()


def test_a_connection_class_without_unavailable_fails_when_a_worker_fails_a_reply(rig):
    c = rig.connect(NoUnavailable)
    rig.worker(0).failures[m.OP_STATS] = (m.R_SERVER_ERROR, m.RF_CLOSE, b"worker 0 restarted")
    with pytest.raises(NotImplementedError, match=r"^NoUnavailable\.unavailable$"):
        c.send(b"stats\r\n")
        rig.run()
