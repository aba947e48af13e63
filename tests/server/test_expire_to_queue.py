"""expire_to_queue (reference §5.2) when the target queue lives on another worker.

Kestrel moves an expired item inside one process, so a client that saw `get src` come back
empty finds the item in the target at once.  With the target on another worker the move is a
message between workers; this holds the server to Kestrel's order in every layout.  (A move
while the target's worker is down: tests/engine/test_worker_loop.py.)
"""
import os
import signal
import time

import psutil
import pytest

from lanner.queues.placement import worker_of
from tests.helpers import LAYOUTS, start_server, wait_for
from tests.server.conftest import Client
from tests.server.test_local import clients_on, replaced, worker_procs

pytestmark = pytest.mark.integration

MAX_AGE_MS = 60


def cross_pairs(n: int) -> list[tuple[str, str]]:
    """`n` (source, target) name pairs whose queues are on different workers of two, half of
    them each way."""
    pairs, want = [], 0
    i = 0
    while len(pairs) < n:
        src, dst = f"xs{i}", f"xd{i}"
        i += 1
        if worker_of(src, 2) == want and worker_of(dst, 2) != want:
            pairs.append((src, dst))
            want ^= 1
    return pairs


def config_for(pairs) -> str:
    return "".join(f'[queues.{s}]\nexpire_to_queue = "{d}"\nmax_age = "{MAX_AGE_MS}ms"\n'
                   for s, d in pairs)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_client_finds_the_moved_item_right_after_the_source_came_back_empty(tmp_path, layout):
    pairs = cross_pairs(8)
    h = start_server(tmp_path, layout=layout, config=config_for(pairs))
    try:
        for rnd in range(3):
            conns = [Client(h.connect()) for _ in pairs]
            for (src, _), c in zip(pairs, conns):
                assert c.ask(b"set %s 0 0 2\r\n%02d\r\n" % (src.encode(), rnd)) == b"STORED\r\n"
            time.sleep(2 * MAX_AGE_MS / 1000)       # the items' own max_age runs out
            for (src, dst), c in zip(pairs, conns):
                assert c.ask(b"get %s\r\n" % src.encode(), b"END\r\n") == b"END\r\n"
                got = c.ask(b"get %s\r\n" % dst.encode(), b"END\r\n")
                assert got == b"VALUE %s 0 2\r\n%02d\r\nEND\r\n" % (dst.encode(), rnd), (src, dst, rnd)
            for c in conns:
                c.close()
    finally:
        assert h.stop() == 0



def pair_from(src_worker: int) -> tuple[str, str]:
    """A (source, target) pair: the source on worker `src_worker` of two, the target on the other."""
    i = 0
    while not (worker_of(f"ks{i}", 2) == src_worker and worker_of(f"kd{i}", 2) != src_worker):
        i += 1
    return f"ks{i}", f"kd{i}"


def drain_queue(c: Client, q: str, into: list[bytes]) -> None:
    """Get every item of `q` into `into` (as they come: a connection that fails midway keeps
    what it got)."""
    while True:
        r = c.ask(b"get %s\r\n" % q.encode(), b"END\r\n")
        if r == b"END\r\n":
            return
        if r.startswith(b"SERVER_ERROR worker "):
            raise ConnectionError(r)       # the connection's worker has not yet heard it is back
        assert r.startswith(b"VALUE "), r   # never a silent close
        into.append(r.split(b"\r\n")[1])


def test_moves_in_flight_survive_the_death_of_the_target_worker(tmp_path):
    """Items expire off a source queue while the worker of their target queue is stopped (their
    moves wait in the ring between the workers), then that worker is killed: every item ends up in
    the target once its replacement runs.  Before, the source had logged the removals and the
    replacement started with the ring emptied: the items were in neither queue."""
    src, dst = pair_from(0)
    n = 40
    h = start_server(tmp_path, workers=2, config=config_for([(src, dst)]))
    try:
        procs = worker_procs(h)
        [c] = clients_on(h, 0, 1)
        for i in range(n):
            assert c.ask(b"set %s 0 0 3\r\n%03d\r\n" % (src.encode(), i)) == b"STORED\r\n"
        target = procs[1]
        target.send_signal(signal.SIGSTOP)
        try:
            time.sleep(2 * MAX_AGE_MS / 1000)       # the items' own max_age runs out
            assert c.ask(b"get %s\r\n" % src.encode(), b"END\r\n") == b"END\r\n"   # all moved out
        finally:
            target.send_signal(signal.SIGKILL)
        assert wait_for(lambda: replaced(h, target)), h.log()
        assert wait_for(lambda: h.log().count("worker 1 ready") >= 2, timeout=60), h.log()
        got = target_receives(h, dst, n)
        assert sorted(got) == [b"%03d" % i for i in range(n)], got
    finally:
        assert h.stop() == 0


# -- moves held open in the SOURCE's journal (server/moves.py) ------------------------------------
#: Items this big fill the ring between the workers (mesh.FWD_RING_CAPACITY, 256 KiB) with
#: fewer than N_HELD moves, so the rest wait in the source process itself.
BIG = 8 << 10
N_HELD = 48


def big_item(i: int) -> bytes:
    return b"%03d" % i + b"." * (BIG - 3)


def gone(p) -> bool:
    try:
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def expire_into_a_stopped_target(h, src: str, n: int):
    """Store `n` big items in `src` (worker 0), stop the target's worker (1) and let them
    expire: their moves are sent (the ring fills) or wait in the source.  Returns the
    worker processes (source, target), the target stopped."""
    source, target = worker_procs(h)
    [c] = clients_on(h, 0, 1)
    for i in range(n):
        assert c.ask(b"set %s 0 0 %d\r\n%s\r\n" % (src.encode(), BIG, big_item(i))) == b"STORED\r\n"
    target.send_signal(signal.SIGSTOP)
    time.sleep(2 * MAX_AGE_MS / 1000)           # the items' own max_age runs out
    assert c.ask(b"get %s\r\n" % src.encode(), b"END\r\n") == b"END\r\n"    # all moving out
    c.close()
    return source, target


def every_item_reaches(h, src: str, dst: str, n: int) -> list[bytes]:
    """Drain `dst` until it gave every item (duplicates allowed: at least once); each round
    first reads `src`, whose sweep moves what the source's replay put back.  Returns the
    three-byte numbers got."""
    got: list[bytes] = []

    def drained() -> bool:
        d = Client(h.connect())
        try:
            assert d.ask(b"get %s\r\n" % src.encode(), b"END\r\n") == b"END\r\n"
            drain_queue(d, dst, got)
        except ConnectionError:
            pass                       # (a connection the replacement closed: made again)
        finally:
            d.close()
        return len({g[:3] for g in got}) >= n
    assert wait_for(drained, timeout=60), sorted({g[:3] for g in got})
    assert {g[:3] for g in got} == {b"%03d" % i for i in range(n)}
    return got


@pytest.mark.parametrize("storage", ["journal", "cmdlog"])
def test_moves_held_by_a_source_worker_that_is_killed_reach_their_target(tmp_path, storage):
    """Items expire off a source queue while the target's worker is stopped (the ring between
    them fills; the other moves wait in the source), then the SOURCE worker is killed: every
    item ends up in the target, after the source's replacement replays its journal (the moves
    were open reads there) and moves them again.  Before, the source had logged plain removals,
    so the moves that had not reached the ring were in neither queue (a command log's replay
    dropped the expired jobs)."""
    src, dst = pair_from(0)
    h = source_killed_with_moves_held(tmp_path, storage, src, dst)
    try:
        every_item_reaches(h, src, dst, N_HELD)
    finally:
        assert h.stop() == 0


def test_moves_held_at_a_graceful_stop_reach_their_target_after_the_restart(tmp_path):
    """The same with a graceful stop of the whole server while the target's worker is stopped:
    the source leaves its unacknowledged moves open in its journal (and says so), and the next
    start moves them.  Before, it logged that they may be lost, and they were."""
    src, dst = pair_from(0)
    conf = config_for([(src, dst)])
    h = stopped_with_moves_held(tmp_path, conf, src)
    stopped = h.log()
    h = start_server(tmp_path, workers=2, config=conf, queue_path=h.queue_path)
    try:
        every_item_reaches(h, src, dst, N_HELD)
    finally:
        assert h.stop() == 0
    assert "move again after the next start" in stopped and "may be lost" not in stopped, stopped


def source_killed_with_moves_held(tmp_path, storage: str, src: str, dst: str):
    """A server whose source worker was killed (-9) while N_HELD moves out of `src` waited for
    their stopped target, once the source's replacement is ready."""
    h = start_server(tmp_path, workers=2, config=config_for([(src, dst)]).replace(
        "\n", f'\nstorage = "{storage}"\n', 1))
    try:
        source, target = expire_into_a_stopped_target(h, src, N_HELD)
        try:
            source.send_signal(signal.SIGKILL)
            assert wait_for(lambda: gone(source)), h.log()
        finally:
            target.send_signal(signal.SIGCONT)
        assert wait_for(lambda: h.log().count("worker 0 ready") >= 2, timeout=60), h.log()
    except BaseException:
        h.stop()
        raise
    return h


def stopped_with_moves_held(tmp_path, conf: str, src: str):
    """A server stopped gracefully (SIGTERM) while N_HELD moves out of `src` wait for their
    stopped target; returns its handle, stopped."""
    h = start_server(tmp_path, workers=2, config=conf)
    try:
        source, target = expire_into_a_stopped_target(h, src, N_HELD)
        try:
            h.proc.send_signal(signal.SIGTERM)
            assert wait_for(lambda: gone(source)), h.log()
        finally:
            target.send_signal(signal.SIGCONT)
        assert h.stop() == 0, h.log()
    finally:
        h.stop()
    return h


def target_receives(h, dst: str, n: int) -> list[bytes]:
    """Drain `dst` alone (its source is never touched, so no client's get sweeps it) until it
    gave every item; returns the three-byte numbers got."""
    got: list[bytes] = []

    def drained() -> bool:
        d = Client(h.connect())
        try:
            drain_queue(d, dst, got)
        except ConnectionError:
            # a connection a worker takes before it has heard that the other is back (its
            # peer_up follows the ready line) is answered "SERVER_ERROR worker N is restarting"
            # and closed: the drain goes on through a new connection
            pass
        finally:
            d.close()
        return len({g[:3] for g in got}) >= n
    assert wait_for(drained, timeout=60), (sorted({g[:3] for g in got}), h.log())
    return [g[:3] for g in got]


@pytest.mark.parametrize("storage", ["journal", "cmdlog"])
def test_moves_left_open_by_a_killed_source_go_when_it_is_back_without_a_client(tmp_path, storage):
    """As above, but nobody reads the source after its replacement started: the replacement
    moves what replay put back as soon as it is up.  Before, the items waited in the source
    until a client touched it (the expiration timer is off by default)."""
    src, dst = pair_from(0)
    h = source_killed_with_moves_held(tmp_path, storage, src, dst)
    try:
        assert set(target_receives(h, dst, N_HELD)) == {b"%03d" % i for i in range(N_HELD)}
    finally:
        assert h.stop() == 0


def test_moves_held_at_a_graceful_stop_go_at_the_next_start_without_a_client(tmp_path):
    src, dst = pair_from(0)
    conf = config_for([(src, dst)])
    h = stopped_with_moves_held(tmp_path, conf, src)
    h = start_server(tmp_path, workers=2, config=conf, queue_path=h.queue_path)
    try:
        assert set(target_receives(h, dst, N_HELD)) == {b"%03d" % i for i in range(N_HELD)}
    finally:
        assert h.stop() == 0


def test_moves_a_killed_source_left_in_the_ring_arrive_once(tmp_path):
    """The source is killed with moves in the ring to its (stopped) target, and the target
    resumes only once the supervisor has told it (peer_down): it drops the moves the source's
    journal holds, and the source's replacement moves every item once.  Exactly as many items
    reach the target as expired.  Before, the target ran the ring's moves and the replacement
    moved them again: each of those arrived twice."""
    src, dst = pair_from(0)
    h = start_server(tmp_path, workers=2, config=config_for([(src, dst)]))
    try:
        source, target = expire_into_a_stopped_target(h, src, N_HELD)
        try:
            source.send_signal(signal.SIGKILL)
            assert wait_for(lambda: "killed by signal 9" in h.log()), h.log()   # peer_down sent
        finally:
            target.send_signal(signal.SIGCONT)
        assert wait_for(lambda: h.log().count("worker 0 ready") >= 2, timeout=60), h.log()
        # (a copy the target ran would be ahead of the replacement's moves in the queue)
        got = target_receives(h, dst, N_HELD)
        assert sorted(got) == [b"%03d" % i for i in range(N_HELD)], got
        assert "moves worker 0 left are left to its journal" in h.log(), h.log()
    finally:
        assert h.stop() == 0


def test_items_moving_out_of_a_deleted_queue_reach_their_target_after_kill_9(tmp_path):
    """A client deletes the source queue while its expired items are on their way to a target
    whose worker is stopped (some in the ring, the rest waiting in the source), then the source
    worker is killed: the items were moved out before the delete, so every one reaches the
    target, once.  Before, the delete erased the source's journal, and the moves not yet in
    the ring died with the worker."""
    src, dst = pair_from(0)
    h = start_server(tmp_path, workers=2, config=config_for([(src, dst)]))
    try:
        [c] = clients_on(h, 0, 1)                   # (a connection worker 1 took would hang)
        source, target = expire_into_a_stopped_target(h, src, N_HELD)
        try:
            assert c.ask(b"delete %s\r\n" % src.encode()) == b"DELETED\r\n"
            source.send_signal(signal.SIGKILL)
            assert wait_for(lambda: "killed by signal 9" in h.log()), h.log()
        finally:
            target.send_signal(signal.SIGCONT)
        assert wait_for(lambda: h.log().count("worker 0 ready") >= 2, timeout=60), h.log()
        got = target_receives(h, dst, N_HELD)
        assert sorted(got) == [b"%03d" % i for i in range(N_HELD)], got
    finally:
        assert h.stop() == 0


def test_a_deleted_queue_whose_moves_arrived_is_gone_for_good(tmp_path):
    """Without a crash: the target resumes, takes every move, and the deleted source's
    journal is erased once the last is confirmed; a restart does not bring it back."""
    src, dst = pair_from(0)
    conf = config_for([(src, dst)])
    h = start_server(tmp_path, workers=2, config=conf)
    try:
        [c] = clients_on(h, 0, 1)                   # (a connection worker 1 took would hang)
        source, target = expire_into_a_stopped_target(h, src, N_HELD)
        try:
            assert c.ask(b"delete %s\r\n" % src.encode()) == b"DELETED\r\n"
            assert os.path.exists(os.path.join(h.queue_path, src))     # keeps the moves
        finally:
            target.send_signal(signal.SIGCONT)
        assert sorted(target_receives(h, dst, N_HELD)) == [b"%03d" % i for i in range(N_HELD)]
        assert wait_for(lambda: not os.path.exists(os.path.join(h.queue_path, src))), h.log()
    finally:
        assert h.stop() == 0
    h = start_server(tmp_path, workers=2, config=conf, queue_path=h.queue_path)
    try:
        c = Client(h.connect())
        assert b"queue_%s_" % src.encode() not in c.ask(b"stats\r\n", b"END\r\n")
        assert c.ask(b"get %s\r\n" % dst.encode(), b"END\r\n") == b"END\r\n"
        c.close()
    finally:
        assert h.stop() == 0
