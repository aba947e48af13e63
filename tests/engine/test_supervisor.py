"""The supervisor's logic without forking (gunicorn's test_arbiter is the model): fork,
reap and kill are replaced, children are played by the test over real control
socketpairs, and time is a FakeClock.  Covers signal dispatch, the replacement order
(peer_down acknowledged before the fork), backoff, heartbeats and boot failure.
"""
from __future__ import annotations

import gc
import logging
import os
import signal

import pytest

from lanner.clock import FakeClock
from lanner.config import load_config
from lanner.ipc import control
from lanner.ipc.mesh import FRONT, WORKER
import lanner.server.supervisor as supervisor_mod
import lanner.server.worker as worker_mod
from lanner.server import exits
from lanner.server.exits import EXIT_BOOT_ERROR
from lanner.server.heartbeat import Heartbeats
from lanner.server.children import BACKOFF_FIRST, backoff
from lanner.server.supervisor import Supervisor
from tests.helpers import free_port

KILLED = signal.SIGKILL          # wait status of a child killed by SIGKILL


def exited(code: int) -> int:
    return code << 8


class FakeSupervisor(Supervisor):
    """Forks nothing: each 'child' is the far end of its control socketpair."""

    def __init__(self, config, clock):
        super().__init__(config, clock)
        self.next_pid = 1000
        self.ends: dict[tuple[str, int], control.Reader] = {}
        self.exits: list[tuple[int, int]] = []
        self.kills: list[tuple[int, int]] = []
        self.heartbeats = Heartbeats(self.peers.heartbeat_slots, config.server.heartbeat_timeout)

    def fork_child(self, kind, index, child_sock, parent_sock):
        self.next_pid += 1
        self.ends[(kind, index)] = control.Reader(child_sock.dup())
        return self.next_pid

    def reap(self):
        out, self.exits = self.exits, []
        return out

    def kill(self, pid, sig):
        self.kills.append((pid, sig))
        if sig == signal.SIGKILL:
            self.exits.append((pid, KILLED))
        elif sig == signal.SIGTERM:
            self.exits.append((pid, exited(0)))     # stops at once (`shutdown` waits for it)

    # the test's side of a child
    def said_to(self, kind, index) -> list[dict]:
        return self.ends[(kind, index)].read()

    def child_says(self, kind, index, msg) -> None:
        control.send(self.ends[(kind, index)].sock, msg)

    def die(self, kind, index, status=KILLED) -> int:
        pid = self.children[(kind, index)].pid
        self.exits.append((pid, status))
        self.on_signal(signal.SIGCHLD, None)
        return pid

    def turn(self) -> None:
        self.tick(0)

    def close(self) -> None:
        """What a real supervisor's exit closes: its selector, its ends of the children's
        control sockets, and the children's ends this fake kept (the suite makes dozens)."""
        self.sel.close()
        for c in self.children.values():
            if c.sock is not None:
                c.sock.close()
        for end in self.ends.values():
            end.sock.close()


@pytest.fixture
def fake():
    """FakeSupervisor's constructor, closing every one made at the test's end."""
    made = []

    def make(config):
        s = FakeSupervisor(config, FakeClock())
        made.append(s)
        return s
    yield make
    for s in made:
        s.close()


@pytest.fixture
def sup(tmp_path):
    cfg = tmp_path / "lanner.toml"
    cfg.write_text('[server]\nheartbeat_timeout = "2s"\n')
    # no admin port: the peer numbering below has no admin slot (test_admin_process has)
    config = load_config(str(cfg), {"workers": "2", "fronts": "2", "worker_fronts": "off",
                                    "admin_port": "off"})
    s = FakeSupervisor(config, FakeClock())
    for i in range(2):
        s.spawn(WORKER, i)
    for i in range(2):
        s.spawn(FRONT, i)
    for key in list(s.children):
        s.child_says(*key, {"cmd": "ready"})
    s.turn()
    assert all(c.ready for c in s.children.values())
    yield s
    s.close()


def test_signals_are_queued_and_dispatched_by_name(sup, monkeypatch):
    calls = []
    monkeypatch.setattr(sup, "reload", lambda exclude=None: calls.append("reload"))
    sup.on_signal(signal.SIGHUP, None)
    assert calls == []                     # the handler only queues
    sup.turn()
    assert calls == ["reload"]
    sup.on_signal(signal.SIGTERM, None)
    sup.turn()
    assert sup.stopping


def test_a_dead_front_is_replaced_only_after_every_worker_acknowledged(sup):
    old = sup.die(FRONT, 0)
    sup.turn()
    assert sup.said_to(WORKER, 0) == [{"cmd": "peer_down", "peer": 0}]
    assert sup.said_to(WORKER, 1) == [{"cmd": "peer_down", "peer": 0}]
    assert sup.said_to(FRONT, 1) == []     # fronts share no ring
    sup.clock.advance(10_000)              # the backoff is long over ...
    sup.turn()
    assert sup.children[(FRONT, 0)].pid == 0            # ... but the workers have not answered
    sup.child_says(WORKER, 0, {"cmd": "ack_down", "peer": 0, "worker": 0})
    sup.turn()
    assert sup.children[(FRONT, 0)].pid == 0
    sup.child_says(WORKER, 1, {"cmd": "ack_down", "peer": 0, "worker": 1})
    sup.turn()
    new = sup.children[(FRONT, 0)]
    assert new.pid not in (0, old)
    sup.child_says(FRONT, 0, {"cmd": "ready"})
    sup.turn()
    assert sup.said_to(WORKER, 0) == [{"cmd": "peer_up", "peer": 0}]
    assert sup.said_to(WORKER, 1) == [{"cmd": "peer_up", "peer": 0}]


def test_a_replacement_is_announced_ready_only_after_its_peers_acknowledged_peer_up(sup, caplog):
    """The "worker 0 ready" line (what operators and tests wait for) comes after every live peer
    acknowledged the replacement's peer_up; a peer that dies meanwhile is not waited for.
    Before, the line came first, and a client acting on it could be told "worker 0 is
    restarting" by a peer that had not read its peer_up yet."""
    caplog.set_level(logging.INFO, logger="lanner.supervisor")
    sup.die(WORKER, 0)
    sup.turn()
    for kind, i, peer in ((FRONT, 0, 0), (FRONT, 1, 0), (WORKER, 1, 2)):
        assert sup.said_to(kind, i) == [{"cmd": "peer_down", "peer": peer}]
        sup.child_says(kind, i, {"cmd": "ack_down", "peer": peer, kind: i})
    sup.clock.advance(1000)
    sup.turn()
    assert sup.children[(WORKER, 0)].pid != 0
    caplog.clear()
    sup.child_says(WORKER, 0, {"cmd": "ready"})
    sup.turn()
    assert sup.said_to(FRONT, 0) == sup.said_to(FRONT, 1) == [{"cmd": "peer_up", "peer": 0}]
    assert sup.said_to(WORKER, 1) == [{"cmd": "peer_up", "peer": 2}]
    ready = [r.getMessage() for r in caplog.records if r.getMessage() == "worker 0 ready"]
    assert ready == []
    sup.child_says(FRONT, 0, {"cmd": "ack_up", "peer": 0, "front": 0})
    sup.child_says(WORKER, 1, {"cmd": "ack_up", "peer": 2, "worker": 1})
    sup.turn()
    assert "worker 0 ready" not in [r.getMessage() for r in caplog.records]
    sup.die(FRONT, 1)                      # never acknowledges: not waited for
    sup.turn()
    assert [r.getMessage() for r in caplog.records].count("worker 0 ready") == 1


def test_only_a_replacement_has_its_rings_emptied_at_its_fork(tmp_path, fake):
    """A first start finds fresh rings; a peer forked before it may already have sent into
    them (worker 0's moves at its start, once its replay is done): emptying them at that fork
    stranded those moves.  A replacement's rings are emptied (what its predecessor left)."""
    cfg = tmp_path / "lanner.toml"
    cfg.write_text("")
    s = fake(load_config(str(cfg), {"workers": "2", "fronts": "0", "admin_port": "off"}))
    emptied = []

    class Mesh:
        def discard_unread(self, kind, index):
            emptied.append((kind, index))
    s.mesh = Mesh()
    for i in range(2):
        s.spawn(WORKER, i)
    assert emptied == []                       # main: [(worker, 0), (worker, 1)]
    s.die(WORKER, 1)
    s.turn()
    s.child_says(WORKER, 0, {"cmd": "ack_down", "peer": s.peers.as_seen_by(WORKER, WORKER, 1),
                             "worker": 0})
    s.clock.advance(1000)
    s.turn()
    assert emptied == [(WORKER, 1)]


def test_a_dead_worker_is_named_the_way_each_peer_numbers_it(sup):
    sup.die(WORKER, 1)
    sup.turn()
    assert sup.said_to(FRONT, 0) == [{"cmd": "peer_down", "peer": 1}]     # fronts: worker index
    assert sup.said_to(WORKER, 0) == [{"cmd": "peer_down", "peer": 3}]    # workers: F + index
    assert sup.children[(WORKER, 1)].awaiting_acks == {(FRONT, 0), (FRONT, 1), (WORKER, 0)}


def test_a_dead_serving_worker_is_named_after_the_front_slots(tmp_path, fake):
    """Workers that serve clients are front slots too (mesh.Peers): with 2 dedicated fronts,
    the admin process (front slot 2) and 2 serving workers, a worker is peer 5 + index to the
    other workers; the admin process hears of it like any front."""
    config = load_config(None, {"workers": "2", "fronts": "2", "heartbeat_timeout": "2s",
                                "queue_path": str(tmp_path / "q")})
    s = fake(config)
    for kind, n in ((WORKER, 2), (FRONT, 3)):
        for i in range(n):
            s.spawn(kind, i)
    for key in list(s.children):
        s.child_says(*key, {"cmd": "ready"})
    s.turn()
    s.die(WORKER, 1)
    s.turn()
    assert s.said_to(FRONT, 0) == [{"cmd": "peer_down", "peer": 1}]
    assert s.said_to(FRONT, 2) == [{"cmd": "peer_down", "peer": 1}]
    assert s.said_to(WORKER, 0) == [{"cmd": "peer_down", "peer": 6}]
    s.child_says(WORKER, 0, {"cmd": "ack_down", "peer": 6, "worker": 0})
    s.turn()
    assert (WORKER, 0) not in s.children[(WORKER, 1)].awaiting_acks
    assert (FRONT, 2) in s.children[(WORKER, 1)].awaiting_acks


def test_the_admin_process_alone_serves_the_admin_port(tmp_path, fake):
    """The admin port's one listening socket belongs to the admin process's front slot (the
    last dedicated one); the other ports have a socket for every other slot, so no worker or
    queue front ever accepts an admin connection.  The admin process is named for its role."""
    mc, tx, ad = free_port(), free_port(), free_port()
    config = load_config(None, {"workers": "2", "fronts": "1", "queue_path": str(tmp_path / "q"),
                                "status_file": str(tmp_path / "status"),
                                "listen_address": "127.0.0.1", "memcache_port": str(mc),
                                "text_port": str(tx), "thrift_port": "off", "admin_port": str(ad)})
    s = fake(config)
    assert s.peers.slots == 4 and s.admin_index == 1        # f0, admin, w0's front, w1's front
    s.prepare()
    try:
        assert list(s.listeners["admin"]) == [1]
        assert list(s.listeners["memcache"]) == list(s.listeners["text"]) == [0, 2, 3]
        assert s.listener_slot(FRONT, 1) == 1 and s.listener_slot(WORKER, 0) == 2
        admin = s.spawn(FRONT, 1)
        assert str(admin) == "admin" and admin.process_name == "lanner-admin"
        assert s.spawn(FRONT, 0).process_name == "lanner-f0"
        assert s.ready_line() == f"lanner ready memcache=127.0.0.1:{mc} text=127.0.0.1:{tx} " \
                                 f"admin=127.0.0.1:{ad}"
    finally:
        s.shutdown()
    off = load_config(None, {"workers": "2", "fronts": "1", "admin_port": "off",
                             "queue_path": str(tmp_path / "q2")})
    s = fake(off)
    assert s.admin_index is None and s.peers.slots == 3      # no admin port: no admin process


def test_backoff_doubles_within_the_window_and_resets_after_it(sup):
    assert [backoff(n) for n in (1, 2, 3, 4)] == [BACKOFF_FIRST, 2 * BACKOFF_FIRST,
                                                   4 * BACKOFF_FIRST, 8 * BACKOFF_FIRST]
    assert backoff(30) == 5.0
    delays = []
    for _ in range(3):
        sup.die(FRONT, 1)
        sup.turn()
        c = sup.children[(FRONT, 1)]
        delays.append(round(c.restart_at - sup.clock.monotonic(), 3))
        for w in range(2):
            sup.child_says(WORKER, w, {"cmd": "ack_down", "peer": 1, "worker": w})
        sup.turn()
        assert c.pid == 0                  # not before its backoff
        sup.clock.advance(int(delays[-1] * 1000))
        sup.turn()
        assert c.pid != 0
        for w in range(2):
            sup.said_to(WORKER, w)
    assert delays == [0.05, 0.1, 0.2]
    sup.clock.advance(61_000)
    sup.die(FRONT, 1)
    sup.turn()
    assert round(sup.children[(FRONT, 1)].restart_at - sup.clock.monotonic(), 3) == 0.05


def test_a_peer_that_dies_is_not_waited_for_and_newborns_hear_of_the_dead(sup):
    sup.die(WORKER, 0)
    sup.turn()
    sup.die(FRONT, 1)                      # dies before acknowledging worker 0's death
    sup.turn()
    w0 = sup.children[(WORKER, 0)]
    assert (FRONT, 1) not in w0.awaiting_acks
    sup.child_says(FRONT, 0, {"cmd": "ack_down", "peer": 0, "front": 0})
    sup.child_says(WORKER, 1, {"cmd": "ack_down", "peer": 2, "worker": 1})   # w0 as workers see it
    sup.child_says(WORKER, 1, {"cmd": "ack_down", "peer": 1, "worker": 1})   # f1
    sup.clock.advance(1000)
    sup.turn()
    # worker 0 restarts first; born while front 1 is down, it is told so and awaited
    f1, w0 = sup.children[(FRONT, 1)], sup.children[(WORKER, 0)]
    assert w0.pid != 0 and f1.pid == 0
    assert sup.said_to(WORKER, 0) == [{"cmd": "peer_down", "peer": 1}]
    assert f1.awaiting_acks == {(WORKER, 0)}
    sup.child_says(WORKER, 0, {"cmd": "ack_down", "peer": 1, "worker": 0})
    sup.turn()
    assert f1.pid != 0
    assert sup.said_to(FRONT, 1) == []     # worker 0 is alive (booting): nothing to hear


def test_a_newborn_is_told_of_a_dead_peer_and_holds_its_restart(sup):
    sup.die(WORKER, 0)
    sup.turn()
    sup.child_says(FRONT, 0, {"cmd": "ack_down", "peer": 0, "front": 0})
    sup.child_says(FRONT, 1, {"cmd": "ack_down", "peer": 0, "front": 1})
    sup.child_says(WORKER, 1, {"cmd": "ack_down", "peer": 2, "worker": 1})
    sup.turn()
    assert sup.children[(WORKER, 0)].awaiting_acks == set()
    sup.spawn(FRONT, 1)                    # (say a front was replaced meanwhile)
    assert sup.said_to(FRONT, 1) == [{"cmd": "peer_down", "peer": 0}]
    sup.clock.advance(1000)
    sup.turn()
    assert sup.children[(WORKER, 0)].pid == 0      # waits for the newborn's acknowledgement
    sup.child_says(FRONT, 1, {"cmd": "ack_down", "peer": 0, "front": 1})
    sup.turn()
    assert sup.children[(WORKER, 0)].pid != 0


def test_a_silent_child_is_killed_and_the_log_says_for_how_long(sup, caplog):
    slot = sup.peers.heartbeat_slot
    now = sup.clock.monotonic()
    for key in sup.children:
        sup.heartbeats.stamp(slot(*key), now)
    sup.clock.advance(1500)
    for key in sup.children:
        if key != (WORKER, 1):
            sup.heartbeats.stamp(slot(*key), sup.clock.monotonic())
    sup.turn()
    assert sup.kills == []                 # 1.5 s of silence is within the 2 s timeout
    sup.clock.advance(1000)
    for key in sup.children:
        if key != (WORKER, 1):
            sup.heartbeats.stamp(slot(*key), sup.clock.monotonic())
    victim = sup.children[(WORKER, 1)].pid
    with caplog.at_level(logging.INFO, logger="lanner.supervisor"):
        sup.turn()
        assert sup.kills == [(victim, signal.SIGKILL)]
        sup.on_signal(signal.SIGCHLD, None)
        sup.turn()
    text = caplog.text
    assert f"worker 1 (pid {victim}) stuck: no heartbeat for 2.5 s; killing it" in text
    assert f"worker 1 (pid {victim}) killed after 2.5 s without a heartbeat; restarting" in text
    sup.turn()
    assert sup.kills == [(victim, signal.SIGKILL)]      # killed once, not once per tick


def test_a_child_not_yet_ready_is_not_judged_by_its_heartbeat(sup):
    sup.children[(WORKER, 0)].ready = False  # booting: replaying journals takes what it takes
    sup.clock.advance(60_000)
    sup.turn()
    assert [pid for pid, _ in sup.kills] == [c.pid for k, c in sup.children.items() if k != (WORKER, 0)]


def test_a_boot_failure_halts_instead_of_restarting(sup):
    sup.die(WORKER, 1, status=exited(EXIT_BOOT_ERROR))
    sup.turn()
    assert sup.stopping and sup.exit_code == EXIT_BOOT_ERROR
    sup.clock.advance(10_000)
    sup.turn()
    assert sup.children[(WORKER, 1)].pid == 0


def test_a_boot_failure_reaped_before_its_message_still_says_why_on_one_line(sup, capsys):
    """contract.md: start-up that cannot proceed exits non-zero with a one-line reason.  The
    worker sends `boot_failed` and exits; when the exit is reaped before the message is read
    (seen on a loaded box), the supervisor stops reading children and the reason was lost."""
    sup.child_says(WORKER, 1, {"cmd": "boot_failed", "worker": 1, "reason": "queue 'q': broken"})
    sup.die(WORKER, 1, status=exited(EXIT_BOOT_ERROR))
    sup.dispatch(signal.SIGCHLD)            # the exit, before the loop reads the socket
    assert capsys.readouterr().err == "lanner: worker 1 cannot start: queue 'q': broken\n"
    sup.turn()                              # the message, read now, is not said twice
    assert capsys.readouterr().err == ""
    assert sup.stopping and sup.exit_code == EXIT_BOOT_ERROR


def test_a_boot_failure_without_a_reason_still_gets_its_line(sup, capsys):
    sup.die(WORKER, 0, status=exited(EXIT_BOOT_ERROR))
    sup.dispatch(signal.SIGCHLD)
    assert capsys.readouterr().err == "lanner: worker 0 cannot start (its log above says why)\n"


def test_exit_codes_live_in_one_place():
    assert supervisor_mod.EXIT_BOOT_ERROR is exits.EXIT_BOOT_ERROR
    assert worker_mod.EXIT_BOOT_ERROR is exits.EXIT_BOOT_ERROR
    src = open(os.path.join(os.path.dirname(supervisor_mod.__file__), "worker.py")).read()
    assert "EXIT_BOOT_ERROR =" not in src



def replace_front_0(sup) -> None:
    """Front 0 dies, every worker acknowledges, its backoff passes: the supervisor forks it again."""
    sup.die(FRONT, 0)
    sup.turn()
    sup.clock.advance(10_000)
    for i in range(2):
        sup.child_says(WORKER, i, {"cmd": "ack_down", "peer": 0, "worker": i})
    sup.turn()


def test_what_lives_at_a_fork_is_frozen_out_of_the_collector(sup):
    """A full collection in the supervisor would write to every object it tracks and so copy
    every page it shares with its children (about 9 MB with one child, measured): whatever is
    alive when it forks must be frozen (gc.freeze) first."""
    gc.unfreeze()
    try:
        replace_front_0(sup)
        assert sup.children[(FRONT, 0)].pid != 0                # forked again ...
        assert gc.get_freeze_count() > 0                       # ... with the heap frozen first
    finally:
        gc.unfreeze()


def test_the_supervisor_hands_its_free_heap_back_before_a_fork(sup, monkeypatch):
    """A free but resident page of the supervisor's heap is inherited by every child and counted
    in the tree's memory for nothing (about 1 MB after its imports: issue 8, perf memory), so
    each fork comes after a malloc_trim (heaptrim.release_free_heap)."""
    events = []
    monkeypatch.setattr(supervisor_mod, "release_free_heap", lambda: events.append("trim"))
    forked = sup.fork_child

    def fork_child(*args):
        events.append("fork")
        return forked(*args)
    monkeypatch.setattr(sup, "fork_child", fork_child)
    replace_front_0(sup)
    assert sup.children[(FRONT, 0)].pid != 0
    assert events == ["trim", "fork"]
