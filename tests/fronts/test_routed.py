"""The routed request without a Slot (fronts/routed.py): a plain set or get for another
worker's queue goes straight into the owner's ring and waits in `Conn.fast`; its reply, its held
read and a worker's death keep every rule the Slot path keeps."""
from __future__ import annotations

import os
import random

import pytest

from lanner.fronts.routed import RoutedRequests
from lanner.ipc import messages as m
from lanner.perf.hotloop import NullTransport
from lanner.perf.hotroute import RoutedRig, queue_of
from tests.fronts.test_held import queue_on, rig, settle  # noqa: F401 (a fixture)


def test_a_routed_plain_set_and_get_take_no_slot(rig):
    """The defect: each routed set or get cost a Slot, a Part and the walk that completes them,
    more Python than a whole fused local request (perf/README.md, stop 14)."""
    q = queue_on(0)
    w = rig.worker(0)
    w.hold = True
    c = rig.connect()
    c.send(b"set %s 0 0 1\r\na\r\nget %s\r\n" % (q.encode(), q.encode()))
    rig.run()
    conn = c.conn
    assert not conn.slots and not conn.parts
    assert [e[0] for e in conn.fast] == [1, 2] and all(e[6] == 0 for e in conn.fast)
    w.release()
    rig.run()
    assert c.read() == b"STORED\r\nVALUE %s 0 1\r\na\r\nEND\r\n" % q.encode()
    assert not conn.fast


def reply_kept_early(rig):
    """A get of worker 0's queue (its reply held back) and then one of worker 1's, each finding
    an item: the second's reply arrives first."""
    q0, q1 = queue_on(0), queue_on(1)
    w0, w1 = rig.worker(0), rig.worker(1)
    w0.queues[q0].append(b"x")
    w1.queues[q1].append(b"y")
    w0.hold = True
    c = rig.connect()
    c.send(b"get %s\r\nget %s\r\n" % (q0.encode(), q1.encode()))
    rig.run()
    return c, (q0, q1), (w0, w1)


def test_a_held_reply_kept_early_is_confirmed_once_written(rig):
    """The reply of worker 1 comes before the older one of worker 0: it waits in `early` with its
    hold, and is confirmed only after both are written, in command order."""
    c, (q0, q1), (w0, w1) = reply_kept_early(rig)
    assert c.read() == b"" and list(c.conn.early) == [2]
    settle(rig)
    assert w1.settled == []                     # not written yet: not confirmed
    w0.hold = False
    w0.release()
    rig.run()
    assert c.read() == b"VALUE %s 0 1\r\nx\r\nEND\r\nVALUE %s 0 1\r\ny\r\nEND\r\n" % (q0.encode(), q1.encode())
    settle(rig)
    assert w0.confirmed() == [1001] and w1.confirmed() == [1001]
    assert w0.aborted() == w1.aborted() == []


def test_a_held_reply_kept_early_goes_back_when_the_client_leaves(rig):
    """The client hangs up while a held reply waits in `early` and another is still owed: both
    items go back (aborted), none is confirmed."""
    c, (q0, q1), (w0, w1) = reply_kept_early(rig)
    assert list(c.conn.early) == [2]
    c.transport.hang_up()
    rig.run()
    w0.hold = False
    w0.release()                                # its reply finds no connection
    settle(rig)
    assert w1.aborted() == [1001] and w0.aborted() == [1001]
    assert w0.confirmed() == w1.confirmed() == []


def test_a_held_reply_behind_a_closing_one_goes_back(rig):
    """A reply that closes the connection drops the held reply that came early behind it."""
    q0, q1 = queue_on(0), queue_on(1)
    w0, w1 = rig.worker(0), rig.worker(1)
    w1.queues[q1].append(b"y")
    w0.hold = True
    c = rig.connect()
    c.send(b"set %s 0 0 1\r\nx\r\nget %s\r\n" % (q0.encode(), q1.encode()))
    rig.run()
    assert list(c.conn.early) == [2]
    w0.failures[m.OP_SET] = (m.R_SERVER_ERROR, m.RF_CLOSE, b"disk full")
    w0.hold = False
    w0.release()
    rig.run()
    assert c.read() == b"SERVER_ERROR disk full\r\n" and c.closed
    settle(rig)
    assert w1.aborted() == [1001] and w1.confirmed() == []


def test_a_worker_that_dies_fails_the_routed_requests_it_owed(rig):
    """Its requests in flight get the error a Slot's part gets; the connection closes after the
    replies already earned."""
    q0, q1 = queue_on(0), queue_on(1)
    rig.worker(0).hold = True
    c = rig.connect()
    c.send(b"set %s 0 0 1\r\na\r\nset %s 0 0 1\r\nb\r\nset %s 0 0 1\r\nc\r\n" %
           (q1.encode(), q0.encode(), q1.encode()))
    rig.run()
    assert len(c.conn.fast) == 2                # the first is answered; worker 0 holds the 2nd
    rig.front.worker_down(0)
    rig.run()
    assert c.read() == b"STORED\r\nSERVER_ERROR worker 0 restarted\r\n" and c.closed


# -- the same replies and queues as the Slot path, two real workers -----------------------------

class Written(NullTransport):
    def close(self) -> None:      # a reply that closes would end the comparison: none is sent
        raise AssertionError("the server closed a connection")


def _script(seed: int, names: list[bytes], conns: int, turns: int) -> list[list[bytes]]:
    """Per turn, per connection: the bytes it sends (sets, plain gets, peeks, noreply sets,
    multi-key gets, open/close reads; queues of both workers)."""
    rnd = random.Random(seed)
    out = []
    for _ in range(turns):
        row = []
        for _ in range(conns):
            cmds = []
            for _ in range(rnd.randint(1, 6)):
                q = rnd.choice(names)
                k = rnd.random()
                if k < 0.35:
                    data = os.urandom(rnd.choice((0, 1, 10, 700, 5000))).hex().encode()
                    cmds.append(b"set %s 0 0 %d\r\n%s\r\n" % (q, len(data), data))
                elif k < 0.7:
                    cmds.append(b"get %s\r\n" % q)
                elif k < 0.78:
                    cmds.append(b"get %s/peek\r\n" % q)
                elif k < 0.86:
                    cmds.append(b"set %s 0 0 2 noreply\r\nnr\r\n" % q)
                elif k < 0.93:
                    cmds.append(b"get %s %s\r\n" % (q, rnd.choice(names)))
                else:
                    cmds.append(b"get %s/open\r\nget %s/close\r\n" % (q, q))
            row.append(b"".join(cmds))
        out.append(row)
    return out


def _play(tmp_path, script, conns: int, slots_only: bool, monkeypatch) -> tuple:
    if slots_only:
        monkeypatch.setattr(RoutedRequests, "route_fast", lambda self, *a: False)
    else:
        monkeypatch.undo()
    rig = RoutedRig(str(tmp_path), conns, home=1, transport=Written)
    try:
        for row in script:
            for c, data in zip(rig.conns, row):
                c.data_received(data)
            for _ in range(3):
                rig.spin(rig.home)
                rig.spin(rig.workers[0])
        for _ in range(3):               # what is left, and the last held reads' settles
            rig.home.front.settles.on_timer()
            rig.spin(rig.home)
            rig.spin(rig.workers[0])
        written = [b"".join(c.transport.written) for c in rig.conns]
        stats = [sorted((n, dict(w.coll.queue_stats(n))) for n in w.coll.names()) for w in rig.workers]
        for per in stats:
            for _, st in per:
                st.pop("age", None)
                st.pop("create_time", None)
        held = [len(w.holding) for w in rig.workers]
        return written, stats, held
    finally:
        rig.close()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_routed_requests_answer_as_the_slot_path_does(tmp_path, monkeypatch, seed):
    """Random batches from a worker's own clients over queues of both workers: the same replies,
    byte for byte, and the same queues, whether routed sets and gets take Slots or not; no
    held read is left unsettled."""
    names = [queue_of(0).encode(), queue_of(1).encode(), b"r" + queue_of(0).encode()]
    script = _script(seed, names, conns=5, turns=30)
    slow = _play(tmp_path / "slots", script, 5, True, monkeypatch)
    fast = _play(tmp_path / "fast", script, 5, False, monkeypatch)
    assert fast[0] == slow[0]
    assert fast[1] == slow[1]
    assert fast[2] == slow[2] == [0, 0]
    assert any(b"VALUE" in w for w in fast[0])
