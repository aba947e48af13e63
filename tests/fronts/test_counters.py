"""curr_connections across a handoff (fronts/counters.py): the +1 stays where a connection was
accepted, the -1 goes where it ends, and a dead process's slot gives back exactly the
connections that died with it."""
from __future__ import annotations

import socket

from lanner.fronts.counters import C_CURR, C_HERE, FRONT_COUNTERS, forget_dead
from lanner.ipc import handoff
from lanner.ipc.shm import CounterBlock


def test_a_dead_slot_gives_back_only_what_died_with_it():
    block = CounterBlock.create(2, FRONT_COUNTERS)
    a, b = block.slot(0), block.slot(1)
    for _ in range(3):                 # a accepted three connections
        a.incr(C_CURR)
        a.incr(C_HERE)
    a.decr(C_HERE)                     # handed one to b, which adopted it
    b.incr(C_HERE)
    assert block.total(C_CURR) == 3
    forget_dead(a)                     # a dies: its two, not the one b serves
    assert block.total(C_CURR) == 1 and a.get(C_HERE) == 0
    b.decr(C_CURR)                     # the moved one closes at b
    b.decr(C_HERE)
    assert block.total(C_CURR) == 0
    forget_dead(b)
    assert block.total(C_CURR) == 0


def test_drop_from_says_how_many_handed_connections_it_ended():
    recv, send = handoff.channels(1)[0]
    socks = [socket.socket() for _ in range(2)]
    try:
        assert handoff.send(send, 3, 1, socks[0].fileno())
        assert handoff.send(send, 3, 2, socks[1].fileno())
        assert handoff.send(send, 4, 1, socks[1].fileno())
        inbox = handoff.Inbox(recv)
        assert inbox.drop_from(3) == 2
        assert inbox.drop_from(3) == 0
        assert inbox.drop_from(4) == 1
    finally:
        for s in socks + [recv, send]:
            s.close()
