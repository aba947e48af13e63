"""Peer numbering and ring hand-over (ipc/mesh.py), in one process."""
from lanner.ipc.mesh import FRONT, WORKER, Mesh, Peers
from lanner.ipc.messages import OP_SET, pack_req


def test_peer_numbering_round_trips():
    p = Peers(workers=3, fronts=2)
    for kind, index in [(FRONT, 0), (FRONT, 1), (WORKER, 0), (WORKER, 2)]:
        for listener in (WORKER, FRONT):
            if listener == FRONT and kind == FRONT:
                continue                                # fronts share no ring
            assert p.named_by(listener, p.as_seen_by(listener, kind, index)) == (kind, index)
    assert [p.of_worker(w) for w in range(3)] == [2, 3, 4]
    assert p.is_front(1) and not p.is_front(2)
    slots = {p.heartbeat_slot(k, i) for k, n in (("cleaner", 1), (WORKER, 3), (FRONT, 2)) for i in range(n)}
    assert slots == set(range(p.heartbeat_slots))


def test_what_a_newborn_peer_sends_between_the_fork_and_the_adoption_is_kept():
    """The supervisor empties a replacement's inbound rings before forking it; the child
    then only adopts the positions, so a record a peer publishes in between (a front
    spawned meanwhile, which was never told this worker was down) is not thrown away."""
    m = Mesh(Peers(workers=1, fronts=1), capacity=1 << 18, fwd_capacity=1 << 18)
    stale = m.req[0][0]
    stale.send(pack_req(1, 1, OP_SET, 0, 1, 0, 0) + b"q" + b"left by the dead")
    stale.publish()
    m.discard_unread(WORKER, 0)                          # supervisor, before the fork
    req, _ = m.front_rings(0)                            # a newborn front ...
    req[0].send(pack_req(1, 1, OP_SET, 0, 1, 0, 0) + b"q" + b"fresh")
    req[0].publish()                                     # ... sends at once
    inbound, _ = m.worker_rings(0)                       # the worker child adopts its rings
    got = [bytes(r) for r in inbound[0].read_batch()]
    assert [g[-5:] for g in got] == [b"fresh"]
