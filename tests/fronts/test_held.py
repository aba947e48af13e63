"""The front's half of held reads (fronts/held.py), in process: a reply carrying RF_HELD is
confirmed to its owner once its bytes are with the kernel, in one OP_HELD per owner per turn,
and aborted when it never will be (the connection went, or the reply became an error)."""
from __future__ import annotations

from array import array

import pytest

from lanner.ipc import messages as m
from lanner.queues.placement import worker_of
from lanner.fronts.held import SETTLE_LAG
from tests.fronts.harness import SOCKET_BUFFER, FakeWorker, Rig


class HoldingWorker(FakeWorker):
    """Answers a plain get as a real owner answers another process's client (RF_HELD and a hold
    id), and keeps every OP_HELD it receives as (confirmed ids, aborted ids)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.next_id = 1000
        self.settled: list[tuple[list[int], list[int]]] = []

    def answer(self, r) -> None:
        if r.op == m.OP_HELD:
            ids = array("q")
            ids.frombytes(r.payload)
            self.settled.append((list(ids[:r.a]), list(ids[r.a:])))
        elif r.op == m.OP_GET and not r.flags and self.queues[r.queue]:
            self.next_id += 1
            self.reply(r, m.R_ITEM, m.RF_HELD, self.next_id, self.queues[r.queue].popleft())
        else:
            super().answer(r)

    def confirmed(self) -> list[int]:
        return [i for conf, _ in self.settled for i in conf]

    def aborted(self) -> list[int]:
        return [i for _, ab in self.settled for i in ab]


@pytest.fixture
def rig(tmp_path):
    r = Rig(tmp_path, nworkers=2)
    r.workers = [HoldingWorker(w, r.req[w], r.resp[w]) for w in range(2)]
    yield r
    r.close()


def settle(rig) -> None:
    """Let the confirms and aborts that no request carried go (Settles.on_timer)."""
    rig.run()
    rig.clock.advance(int(SETTLE_LAG * 1000) + 1)
    rig.run()


def queue_on(w: int) -> str:
    i = 0
    while worker_of("hq%d" % i, 2) != w:
        i += 1
    return "hq%d" % i


def test_written_replies_are_confirmed_in_one_message_per_turn(rig):
    q = queue_on(0)
    w = rig.worker(0)
    w.queues[q].extend([b"a", b"b", b"c"])
    c = rig.connect()
    out = c.ask(b"get %s\r\nget %s\r\nget %s\r\n" % ((q.encode(),) * 3))
    assert out == b"".join(b"VALUE %s 0 1\r\n%s\r\nEND\r\n" % (q.encode(), d) for d in (b"a", b"b", b"c"))
    assert w.settled == []                # they wait for a request to ride with ...
    w.queues[q].append(b"d")
    assert c.ask(b"get %s\r\n" % q.encode()) == b"VALUE %s 0 1\r\nd\r\nEND\r\n" % q.encode()
    assert w.settled == [([1001, 1002, 1003], [])]
    assert [r.op for r in w.seen][-2:] == [m.OP_GET, m.OP_HELD]     # ... in the same publish
    settle(rig)                           # ... or for SETTLE_LAG
    assert w.settled == [([1001, 1002, 1003], []), ([1004], [])]


def test_a_reply_whose_connection_went_first_is_aborted(rig):
    q = queue_on(0)
    w = rig.worker(0)
    w.queues[q].append(b"a")
    w.hold = True
    c = rig.connect()
    c.send(b"get %s\r\n" % q.encode())
    rig.run()
    c.transport.hang_up()
    rig.run()
    w.hold = False
    w.release()
    settle(rig)
    assert (w.confirmed(), w.aborted()) == ([], [1001])


def test_a_reply_the_kernel_has_not_taken_is_confirmed_only_once_it_has(rig):
    """A client that does not read: the reply waits in the transport (and the spill); its hold
    is confirmed when the last of it leaves for the socket, and aborted if the client hangs up
    first."""
    q = queue_on(0)
    w = rig.worker(0)
    big = b"x" * (SOCKET_BUFFER * 3)
    w.queues[q].extend([big, big])
    c = rig.connect()
    c.send(b"get %s\r\n" % q.encode())
    rig.run()
    assert w.settled == []
    got = c.read()
    while len(got) < len(big):
        rig.run()
        got += c.read()
    settle(rig)
    assert w.confirmed() == [1001]
    c.send(b"get %s\r\n" % q.encode())
    rig.run()
    c.transport.hang_up()
    settle(rig)
    assert (w.confirmed(), w.aborted()) == ([1001], [1002])


def test_an_error_reply_aborts_the_items_it_left_out(rig):
    """A multi-key get whose other part fails answers only the error (and closes): the item it
    got from worker 0 was never written, so it goes back."""
    q0, q1 = queue_on(0), queue_on(1)
    rig.worker(0).queues[q0].append(b"a")
    rig.worker(1).failures[m.OP_GET] = (m.R_SERVER_ERROR, m.RF_CLOSE, b"disk full")
    c = rig.connect()
    assert c.ask(b"get %s %s\r\n" % (q0.encode(), q1.encode())) == b"SERVER_ERROR disk full\r\n"
    settle(rig)
    assert (rig.worker(0).confirmed(), rig.worker(0).aborted()) == ([], [1001])


def test_replies_after_a_closing_one_are_aborted(rig):
    """Replies behind an error that closes the connection are never written: aborted."""
    q0, q1 = queue_on(0), queue_on(1)
    rig.worker(0).queues[q0].extend([b"a", b"b"])
    rig.worker(1).failures[m.OP_GET] = (m.R_SERVER_ERROR, m.RF_CLOSE, b"disk full")
    c = rig.connect()
    out = c.ask(b"get %s\r\nget %s\r\nget %s\r\n" % (q0.encode(), q1.encode(), q0.encode()))
    assert out == b"VALUE %s 0 1\r\na\r\nEND\r\nSERVER_ERROR disk full\r\n" % q0.encode()
    settle(rig)
    assert (rig.worker(0).confirmed(), rig.worker(0).aborted()) == ([1001], [1002])
