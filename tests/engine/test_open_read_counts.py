"""Open thrift reads per (connection, queue) (server/opencounts.py): a thrift disconnect drops
its connection's counts without walking every connection's (issue 8)."""
from __future__ import annotations

import msgpack

from lanner.ipc.messages import F_THRIFT, OP_DISCONNECT, OP_SET, OP_TCONFIRM, OP_TGET, R_DATA
from lanner.server.opencounts import OpenReadCounts
from tests.engine.conftest import published, req


def replies(w):
    out = {}
    for conn, status, _, value, payload in published(w):
        out.setdefault(conn, []).append((status, value, payload))
    return out


def test_counts_are_dropped_by_connection():
    c = OpenReadCounts()
    c[(0, 1, "a")] = 2
    c[(0, 1, "b")] = 1
    c[(0, 2, "a")] = 3
    c[(1, 1, "a")] = 4
    del c[(0, 1, "b")]
    c[(0, 1, "b")] = 5
    c.drop_conn(0, 1)
    assert (c.get((0, 1, "a")), c.get((0, 1, "b")), c.get((0, 2, "a")), c.get((1, 1, "a"))) == (None, None, 3, 4)
    assert len(c) == 2
    c.drop_conn(0, 1)                      # twice, or never counted: nothing to do
    del c[(0, 2, "a")]
    c.drop_conn(0, 2)
    assert len(c) == 1 and (1, 1, "a") in c


def test_a_thrift_disconnect_drops_only_its_counts_without_a_walk(worker):
    w = worker()
    walked = []

    class NoWalk(type(w.tcounts)):
        """The worker's counts, failing any walk over all of them."""
        def __iter__(self):
            walked.append(True)
            raise AssertionError("a disconnect walked every connection's counts")

        def keys(self):
            return iter(self)

    w.tcounts = NoWalk()
    for i, name in enumerate(("q", "q", "r")):
        w.handle(0, req(9, OP_SET, name, payload=b"item%d" % i, n=i + 1))
    abort_after = (60_000).to_bytes(8, "little")
    w.handle(0, req(1, OP_TGET, "q", b=1, payload=abort_after))
    w.handle(0, req(1, OP_TGET, "r", b=1, payload=abort_after, n=2))
    w.handle(0, req(2, OP_TGET, "q", b=1, payload=abort_after))
    w.finish_batch()
    got = replies(w)
    ids1 = [tid for status, _, payload in got[1] for _, tid in msgpack.unpackb(payload)]
    assert [status for status, _, _ in got[1]] == [R_DATA, R_DATA] and len(ids1) == 2
    assert (w.tcounts.get((0, 1, "q")), w.tcounts.get((0, 1, "r")), w.tcounts.get((0, 2, "q"))) == (1, 1, 1)

    w.handle(0, req(1, OP_DISCONNECT, "", F_THRIFT))
    w.finish_batch()
    assert walked == []
    assert (w.tcounts.get((0, 1, "q")), w.tcounts.get((0, 1, "r")), w.tcounts.get((0, 2, "q"))) == (None, None, 1)
    # its reads outlive it (§3.3): another connection confirms them
    w.handle(0, req(3, OP_TCONFIRM, "", payload=msgpack.packb(ids1)))
    w.finish_batch()
    assert replies(w)[3][0][1] == 2
    assert w.tcounts.get((0, 2, "q")) == 1
