"""The objects every request goes through keep their instance attributes within what Python
3.11 keeps in their class's shared key table (30 names): past it an instance gets a dict of its
own, and every attribute read and method call on it (a connection's `pump`, `room`,
`flush_out`, `fast_reply`; a queue's `add` and `remove`; its journal's records) is looked up
generically instead of by specialised bytecode (issue 8, c=1: -2.5k instructions a request when
a connection went from 32 attributes to 29).  An attribute that applies only sometimes is a
class default, set on the instance when it applies (Conn's refuse_reads, refuse_writes,
last_activity; PersistentQueue's is_fanout_child, expire_sink, hold_moves; Journal's
_torn, _closed, _erased, checkpoint, its pack and rewrite under way)."""
from __future__ import annotations

from lanner.perf.hotloop import Rig

SHARED_KEYS_MAX = 30      # CPython 3.11 Objects/dictobject.c SHARED_KEYS_MAX_SIZE


def served(rig, chunks):
    c = rig.conns[0]
    for chunk in chunks:
        c.data_received(chunk)
        rig.turn()
    return c


def test_a_served_connection_keeps_at_most_30_attributes(tmp_path):
    rig = Rig(str(tmp_path), 1)
    try:
        c = served(rig, (b"set q 0 0 1\r\nx\r\n", b"get q\r\n", b"get q/open\r\n", b"get q/close\r\n",
                         b"delete q\r\n", b"stats\r\n"))
        assert b"".join(c.transport.written).startswith(b"STORED\r\nVALUE q 0 1\r\nx\r\nEND\r\nEND")
        assert len(vars(c)) <= SHARED_KEYS_MAX, sorted(vars(c))
    finally:
        rig.close()


def test_a_served_queue_keeps_at_most_30_attributes(tmp_path):
    """A plain queue and its journal after sets, gets, an open read and its confirm, and a
    fanout child."""
    rig = Rig(str(tmp_path), 1)
    try:
        c = served(rig, (b"get q+child\r\n", b"set q 0 0 1\r\nx\r\n", b"set q 0 0 1\r\ny\r\n",
                         b"get q\r\n", b"get q/open\r\n", b"get q/close\r\n", b"get q+child\r\n"))
        assert b"".join(c.transport.written) == (b"END\r\nSTORED\r\nSTORED\r\nVALUE q 0 1\r\nx\r\nEND\r\n"
                                                 b"VALUE q/open 0 1\r\ny\r\nEND\r\nEND\r\n"
                                                 b"VALUE q+child 0 1\r\nx\r\nEND\r\n")
        queues = rig.worker.coll.queues
        for name in ("q", "q+child"):
            for obj in (queues[name], queues[name].storage):     # the queue and its journal
                assert len(vars(obj)) <= SHARED_KEYS_MAX, (name, type(obj), sorted(vars(obj)))
        assert queues["q+child"].is_fanout_child and not queues["q"].is_fanout_child
    finally:
        rig.close()
