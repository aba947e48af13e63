"""The worker's loop in one process: real in-memory rings (mesh.py) in place of fronts,
a socketpair in place of the supervisor, an injected clock (FakeClock, trio's MockClock
idea) so heartbeats and deadlines move only when the test says so.  Nothing forks.
"""
from __future__ import annotations

import socket
import struct

import msgpack
import pytest

from lanner.clock import FakeClock
from lanner.config import load_config
from lanner.ipc import control
from lanner.ipc.mesh import Mesh, Peers
from lanner.ipc.messages import (CHUNK, F_ABORT, F_CLOSE, F_OPEN, FRAG, FRAG_CONN, OP_DISCONNECT, OP_GET,
                                 OP_SET, OP_TCONFIRM, OP_TGET, R_DATA, R_EMPTY, R_ERROR, R_ITEM, R_OK,
                                 R_VALUE, RESP_SIZE, RF_CLOSE, Reassembler, pack_req, unpack_resp)
from lanner.ipc.shm import IdBlocks, SharedCounter
from lanner.queues.placement import worker_of
from lanner.server.heartbeat import Heartbeats
from lanner.server.status import ServerStatus
from lanner.server import worker as W
from lanner.server.worker import Worker
from tests.engine.test_turn import HoldingUring


class FakeFront:
    """A front's half of the rings to every worker: send requests, collect responses."""

    def __init__(self, mesh: Mesh, f: int) -> None:
        self.req = mesh.req[f]
        self.resp = [mesh.resp[w][f] for w in range(mesh.peers.workers)]
        self.asm = [Reassembler() for _ in self.resp]

    def send(self, w: int, conn: int, req: int, op: int, queue: bytes = b"", flags: int = 0,
             a: int = 0, b: int = 0, payload: bytes = b"") -> None:
        self.req[w].send_parts(pack_req(conn, req, op, flags, len(queue), a, b) + queue, payload)
        self.req[w].publish()

    def replies(self, w: int = 0) -> list[tuple]:
        out = []
        ring = self.resp[w]
        for rec in ring.read_batch(1 << 20):
            msg = self.asm[w].feed(rec)
            if msg is not None:
                conn, req, status, flags, _, value = unpack_resp(msg, 0)
                out.append((conn, req, status, flags, value, bytes(msg[RESP_SIZE:])))
        ring.release()
        return out


class Harness:
    """W workers (booted, loops opened), F fake fronts, the supervisor's control ends."""

    def __init__(self, tmp_path, workers: int = 1, fronts: int = 1, config: str = "") -> None:
        path = tmp_path / "lanner.toml"
        path.write_text(config)
        self.config = load_config(str(path), {"queue_path": str(tmp_path / "q"),
                                              "status_file": str(tmp_path / "status")})
        self.clock = FakeClock()
        self.peers = Peers(workers, fronts)
        self.mesh = Mesh(self.peers)
        self.status = ServerStatus.create(bytearray(ServerStatus.SIZE), str(tmp_path / "status"), "Up",
                                          self.clock)
        self.heartbeats = Heartbeats(self.peers.heartbeat_slots, 2000)
        self.counter = SharedCounter.create()
        self.ctl: list[socket.socket] = []
        self.acks: list[control.Reader] = []
        self.workers: list[Worker] = []
        for w in range(workers):
            self.mesh.discard_unread("worker", w)
            inbound, outbound = self.mesh.worker_rings(w)
            sup_end, worker_end = socket.socketpair()
            self.ctl.append(sup_end)
            self.acks.append(control.Reader(sup_end))
            wk = Worker(w, workers, self.config, self.status, inbound, outbound,
                        self.mesh.worker_wake[w].fd, worker_end, None, clock=self.clock, nfronts=fronts,
                        heart=self.heartbeats.heart(self.peers.heartbeat_slot("worker", w)),
                        ids=IdBlocks(self.counter, block=4))
            wk.boot()
            wk.open_loop()
            self.workers.append(wk)
        self.fronts = [FakeFront(self.mesh, f) for f in range(fronts)]

    def settle(self, turns: int = 50) -> None:
        """Turn every worker's loop until none has anything left to do (never blocks
        long: a held group commit is waited for at most 1 s per turn)."""
        for _ in range(turns):
            busy = False
            for wk in self.workers:
                busy |= wk.step(wait=0)
                if wk.sync_inflight or wk.held:
                    wk.step(wait=1.0)
                    busy = True
            if not busy:
                return
        raise AssertionError("the workers never went idle")

    def tell(self, w: int, msg: dict) -> None:
        control.send(self.ctl[w], msg)

    def close(self) -> None:
        for wk in self.workers:
            wk.shutdown()
            wk.release()
        for s in self.ctl:
            s.close()
        for wake in self.mesh.worker_wake + self.mesh.front_wake:
            wake.close()
        self.counter.close()


@pytest.fixture
def harness(tmp_path):
    made = []

    def make(**kw):
        h = Harness(tmp_path, **kw)
        made.append(h)
        return h
    yield make
    for h in made:
        h.close()


def statuses(replies):
    return [(r[1], r[2], r[5]) for r in replies]


def test_set_get_open_close_abort_from_a_ring(harness):
    h = harness()
    f = h.fronts[0]
    for req, data in ((1, b"a"), (2, b"b")):
        f.send(0, 7, req, OP_SET, b"q", payload=data)
    f.send(0, 7, 3, OP_GET, b"q", F_OPEN, a=-1)                    # get q/open -> a
    f.send(0, 7, 4, OP_GET, b"q", F_CLOSE | F_OPEN, a=-1)          # get q/close/open -> b
    f.send(0, 7, 5, OP_GET, b"q", F_ABORT)                         # get q/abort: b goes back
    f.send(0, 7, 6, OP_GET, b"q", 0, a=-1)                         # get q -> b again
    f.send(0, 7, 7, OP_GET, b"q", 0, a=-1)                         # empty
    h.settle()
    assert statuses(f.replies()) == [(1, R_OK, b""), (2, R_OK, b""), (3, R_ITEM, b"a"),
                                     (4, R_ITEM, b"b"), (5, R_EMPTY, b""), (6, R_ITEM, b"b"),
                                     (7, R_EMPTY, b"")]


def test_a_disconnect_rolls_the_open_read_back(harness):
    h = harness()
    f = h.fronts[0]
    f.send(0, 1, 1, OP_SET, b"q", payload=b"x")
    f.send(0, 1, 2, OP_GET, b"q", F_OPEN, a=-1)
    f.send(0, 1, 0, OP_DISCONNECT)
    f.send(0, 2, 1, OP_GET, b"q", 0, a=-1)
    h.settle()
    assert statuses(f.replies()) == [(1, R_OK, b""), (2, R_ITEM, b"x"), (1, R_ITEM, b"x")]


def test_a_replaced_front_is_served_before_its_peer_up_arrives(harness):
    """Issue 11, defect 1, in process.  The dead front left an open read and half of a
    chunked message; peer_down discards both and is acknowledged.  The replacement's
    first requests come before any peer_up: they are answered, and the loop goes idle
    (it used to skip the down front's ring yet refuse to sleep on it, spinning forever)."""
    h = harness()
    f = h.fronts[0]
    f.send(0, 1, 1, OP_SET, b"q", payload=b"kept")
    f.send(0, 1, 2, OP_GET, b"q", F_OPEN, a=-1)
    h.settle()
    assert statuses(f.replies()) == [(1, R_OK, b""), (2, R_ITEM, b"kept")]
    big = pack_req(1, 3, OP_SET, 0, 1, 0, 0) + b"q" + bytes(CHUNK + 10)
    f.req[0].send(FRAG.pack(FRAG_CONN, len(big)))               # the front dies mid-message
    f.req[0].send(big[:CHUNK])
    f.req[0].publish()
    wk = h.workers[0]
    wk.step(wait=0)
    assert wk.asm[0].partial is not None                            # half a message is buffered
    h.tell(0, {"cmd": "peer_down", "peer": 0})
    h.clock.advance(5000)                                        # the next turn polls control
    h.settle()
    assert h.acks[0].read() == [{"cmd": "ack_down", "peer": 0, "worker": 0}]
    assert wk.down_peers == {0} and wk.asm[0].partial is None
    # the supervisor forks the replacement only now; it reuses connection ids from 1
    h.mesh.discard_unread("front", 0)
    h.mesh.front_rings(0)
    new = FakeFront(h.mesh, 0)
    new.send(0, 1, 1, OP_GET, b"q", 0, a=-1)                     # same conn id as the dead one's
    new.send(0, 1, 2, OP_SET, b"q", payload=b"new")
    h.settle()
    assert statuses(new.replies()) == [(1, R_ITEM, b"kept"), (2, R_OK, b"")]
    assert wk.down_peers == set()
    assert wk.step(wait=0) is False                              # idle: the loop can sleep


def test_control_is_read_while_busy_and_the_heart_beats(harness):
    h = harness()
    wk = h.workers[0]
    slot = h.peers.heartbeat_slot("worker", 0)
    f = h.fronts[0]
    h.clock.advance(10_000)
    f.send(0, 1, 1, OP_SET, b"q", payload=b"1")
    h.tell(0, {"cmd": "peer_up", "peer": 0})
    h.tell(0, {"cmd": "peer_down", "peer": 0})
    assert wk.step(wait=0) is True                               # busy, yet control was read
    assert h.acks[0].read() == [{"cmd": "ack_up", "peer": 0, "worker": 0},
                                {"cmd": "ack_down", "peer": 0, "worker": 0}]
    assert h.heartbeats.silent_for(slot, h.clock.monotonic()) == pytest.approx(0, abs=1e-6)
    assert wk.beat_interval == 0.5                               # a quarter of the 2 s timeout
    h.clock.advance(300)
    wk.step(wait=0)
    assert h.heartbeats.silent_for(slot, h.clock.monotonic()) == pytest.approx(0.3)  # not due yet
    h.clock.advance(300)
    wk.step(wait=0)
    assert h.heartbeats.silent_for(slot, h.clock.monotonic()) == pytest.approx(0, abs=1e-6)


def test_peer_down_of_a_front_drops_replies_owed_to_it(harness, monkeypatch, tmp_path):
    """The front dies while its STORED waits for q's fdatasync (held until then: a fast disk
    could return it within the step, and the reply would reach the front before it died)."""
    made = []
    monkeypatch.setattr(W, "open_uring", lambda: made.append(HoldingUring(str(tmp_path / "q" / "q"))) or made[0])
    h = harness(config='[default]\nsync_journal = "always"\n')
    f = h.fronts[0]
    f.send(0, 1, 1, OP_SET, b"q", payload=b"x")
    wk = h.workers[0]
    wk.step(wait=0)                                              # the STORED waits for fsync
    [uring] = made
    assert wk.sync_inflight and uring.calls == 1
    h.tell(0, {"cmd": "peer_down", "peer": 0})
    wk.poll_control()
    uring.release()
    uring.path = str(tmp_path)                                  # (holds no more of q's)
    h.settle()
    assert f.replies() == []                                     # nothing for the dead front
    h.mesh.discard_unread("front", 0)
    h.mesh.front_rings(0)
    new = FakeFront(h.mesh, 0)
    new.send(0, 1, 1, OP_GET, b"q", 0, a=-1)
    h.settle()
    assert statuses(new.replies()) == [(1, R_ITEM, b"x")]       # the item itself was kept


def _queue_on(worker: int, workers: int) -> bytes:
    return next(f"t{i}".encode() for i in range(100) if worker_of(f"t{i}", workers) == worker)


def test_thrift_ids_are_one_sequence_across_workers(harness):
    h = harness(workers=2, config="[server]\nmax_open_transactions = 10\n")
    f = h.fronts[0]
    q1, q0 = _queue_on(1, 2), _queue_on(0, 2)
    for w, q in ((1, q1), (0, q0)):
        for i in range(2):
            f.send(w, 1, i + 1, OP_SET, q, payload=b"%d" % i)
    h.settle()
    f.replies(0), f.replies(1)

    def tget(w, q, req, n):
        f.send(w, 1, req, OP_TGET, q, a=0, b=n, payload=struct.pack("<q", 60_000))
        h.settle()
        (r,) = f.replies(w)
        assert r[2] == R_DATA
        return [tid for _, tid in msgpack.unpackb(r[5])]
    assert tget(1, q1, 10, 1) == [1]                             # the first read anywhere gets 1
    assert tget(0, q0, 11, 2) == [5, 6]                          # worker 0's first block: 5..8
    assert tget(1, q1, 12, 1) == [2]
    for w in (0, 1):                                             # a confirm goes to every worker
        f.send(w, 1, 20 + w, OP_TCONFIRM, q0, payload=msgpack.packb([1, 2, 5, 6]))
    h.settle()
    assert sorted(r[4] for w in (0, 1) for r in f.replies(w) if r[2] == R_VALUE) == [2, 2]


def test_an_open_read_twice_on_one_connection_is_an_error_that_closes(harness):
    h = harness()
    f = h.fronts[0]
    f.send(0, 1, 1, OP_SET, b"q", payload=b"x")
    f.send(0, 1, 2, OP_SET, b"q", payload=b"y")
    f.send(0, 1, 3, OP_GET, b"q", F_OPEN, a=-1)
    f.send(0, 1, 4, OP_GET, b"q", F_OPEN, a=-1)
    h.settle()
    r = f.replies()
    assert [(x[1], x[2]) for x in r] == [(1, R_OK), (2, R_OK), (3, R_ITEM), (4, R_ERROR)]
    assert r[3][3] & RF_CLOSE
    f.send(0, 2, 1, OP_GET, b"q", 0, a=-1)                        # the close rolled x back
    h.settle()
    assert statuses(f.replies()) == [(1, R_ITEM, b"x")]


def test_an_expired_item_moved_while_the_target_worker_is_down_waits_for_it(harness):
    """expire_to_queue into a queue of a worker that is down: the move waits for the
    replacement's peer_up instead of being dropped (the source has already logged the
    removal, so a drop lost an item a producer was told was stored)."""
    src, dst = next((f"s{i}", f"d{i}") for i in range(100)
                    if worker_of(f"s{i}", 2) == 0 and worker_of(f"d{i}", 2) == 1)
    h = harness(workers=2, config=f'[queues.{src}]\nexpire_to_queue = "{dst}"\nmax_age = "1s"\n')
    f = h.fronts[0]
    f.send(0, 1, 1, OP_SET, src.encode(), payload=b"moved")
    h.settle()
    assert statuses(f.replies(0)) == [(1, R_OK, b"")]
    target = h.peers.of_worker(1)
    h.tell(0, {"cmd": "peer_down", "peer": target})
    h.clock.advance(5000)                          # the item expires; the next turn polls control
    h.settle()
    assert h.acks[0].read() == [{"cmd": "ack_down", "peer": target, "worker": 0}]
    f.send(0, 1, 2, OP_GET, src.encode(), 0, a=-1)          # the sweep moves the item
    f.send(1, 1, 3, OP_GET, dst.encode(), 0, a=-1)
    h.settle()
    assert statuses(f.replies(0)) == [(2, R_EMPTY, b"")]
    assert statuses(f.replies(1)) == [(3, R_EMPTY, b"")]    # not there while its worker is down
    h.tell(0, {"cmd": "peer_up", "peer": target})
    h.clock.advance(5000)
    h.settle()
    f.send(1, 1, 4, OP_GET, dst.encode(), 0, a=-1)
    h.settle()
    assert statuses(f.replies(1)) == [(4, R_ITEM, b"moved")]


class GatherUring(HoldingUring):
    """HoldingUring with the ring's timer (the gather's, storage/syncer.py): `arm` notes which
    replies the front had at that moment (the timer's io_uring_enter is a syscall on the loop)."""

    def __init__(self, path, front_replies):
        super().__init__(path)
        self.front_replies = front_replies
        self.armed = []                 # the replies the front had read when each timer was armed

    def arm(self, token, seconds):
        self.armed.append(self.front_replies())
        return None

    def disarm(self, token):
        pass


def test_the_gathers_timer_is_armed_after_the_replies_it_gathers_for_went_out(harness, monkeypatch,
                                                                                tmp_path):
    """Two clients' sets answered by one fdatasync: the fdatasync after it is held for those two
    (the gather), bounded by a timer whose io_uring_enter costs the loop tens of microseconds.
    The replies leave first, the timer is armed at the turn's end (Syncer.arm_due), while the
    clients prepare their next sets: the round waits for the replies, not for the timer."""
    made, got = [], []
    monkeypatch.setattr(W, "open_uring", lambda: made.append(
        GatherUring(str(tmp_path / "q" / "q"), lambda: got.extend(f.replies()) or list(got))) or made[0])
    h = harness(config='[default]\nsync_journal = "always"\n')
    f = h.fronts[0]
    f.send(0, 1, 1, OP_SET, b"q", payload=b"x")
    f.send(0, 2, 1, OP_SET, b"q", payload=b"y")
    wk = h.workers[0]
    wk.step(wait=0)                                   # one round, its fdatasync held
    [uring] = made
    assert uring.calls == 1 and wk.sync_inflight and uring.armed == []
    uring.release()
    wk.step(wait=1.0)                                 # the reap: replies out, the gather held
    assert "held for a gather" in wk.syncer.state()
    assert [statuses(a) for a in uring.armed] == [[(1, R_OK, b""), (1, R_OK, b"")]]
    f.send(0, 1, 2, OP_SET, b"q", payload=b"x2")     # both back: the held fdatasync goes
    f.send(0, 2, 2, OP_SET, b"q", payload=b"y2")
    wk.step(wait=0)
    assert uring.calls == 2 and "held" not in wk.syncer.state()
    uring.release()
    uring.path = str(tmp_path)                        # (holds no more of q's)
    h.settle()
    assert statuses(got + f.replies()) == [(1, R_OK, b""), (1, R_OK, b""), (2, R_OK, b""), (2, R_OK, b"")]
