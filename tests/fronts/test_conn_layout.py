"""A connection's instance attributes stay within what Python 3.11 keeps in its class's shared
table (30 names): past it the instance gets a dict of its own, and every method call on the
connection (`pump`, `room`, `flush_out`, `fast_reply`: several per turn) is looked up
generically instead of by specialised bytecode (issue 8, c=1: -2.5k instructions a request
when a connection went from 32 attributes to 29).  An attribute that applies only sometimes
is a class default, set on the connection when it applies (Conn's refuse_reads,
refuse_writes, last_activity)."""
from __future__ import annotations

from lanner.perf.hotloop import Rig

SHARED_KEYS_MAX = 30      # CPython 3.11 Objects/dictobject.c SHARED_KEYS_MAX_SIZE


def test_a_served_connection_keeps_at_most_30_attributes(tmp_path):
    rig = Rig(str(tmp_path), 1)
    try:
        c = rig.conns[0]
        for chunk in (b"set q 0 0 1\r\nx\r\n", b"get q\r\n", b"get q/open\r\n", b"get q/close\r\n",
                      b"delete q\r\n", b"stats\r\n"):
            c.data_received(chunk)
            rig.turn()
        assert b"".join(c.transport.written).startswith(b"STORED\r\nVALUE q 0 1\r\nx\r\nEND\r\nEND")
        assert len(vars(c)) <= SHARED_KEYS_MAX, sorted(vars(c))
    finally:
        rig.close()
