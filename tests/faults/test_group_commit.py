"""Overlapping group-commit rounds (storage/syncer.py) under kill -9: with many queues on one
worker and many connections writing at once under sync "always", every item acknowledged
before the worker died is there after its replacement replayed the files, in journals and in
command logs alike (tests/faults/load.py keeps the books)."""
import signal

import pytest

from tests.faults.load import Conn, Load, verify
from tests.faults.test_front_restart import pid_named, wait_for
from tests.faults.test_kill_roles import progress
from tests.helpers import start_server

pytestmark = pytest.mark.integration

CONFIGS = {
    "journal": '[default]\nsync_journal = "always"\n',
    "cmdlog": '[default]\nstorage = "cmdlog"\n[cmdlog]\nsync = "always"\n',
}


@pytest.mark.parametrize("storage", sorted(CONFIGS))
@pytest.mark.parametrize("nqueues", [12, 1])
def test_kill_9_right_after_acks_loses_nothing_acknowledged(tmp_path, storage, nqueues):
    """(One queue: the batches of many turns join the round behind its fdatasync under way.)"""
    h = start_server(tmp_path, workers=1, config=CONFIGS[storage])
    queues = [b"gc%d" % i for i in range(nqueues)]       # one worker: every queue is its
    load = Load(h.memcache_port, queues, writers=10, tag=storage).start()
    try:
        for _ in range(2):
            progress(load, 400)                           # rounds are under way when it dies
            victim = pid_named(h, "lanner-w0")
            victim.send_signal(signal.SIGKILL)
            assert wait_for(lambda: (p := pid_named(h, "lanner-w0")) is not None and p.pid != victim.pid, 15)
        progress(load, 200)
        books = load.stop()
        v = verify(h.memcache_port, books)
        assert v.checked >= 1000
        assert not v.lost, f"{len(v.lost)} acknowledged items lost, e.g. {v.lost[:5]}"
        assert not v.redelivered and not v.duplicated
    finally:
        load.stopping.set()
        h.stop()


def test_stats_count_the_fsyncs_of_the_group_commit(tmp_path):
    """`stats` fsyncs: the fdatasyncs the workers' group commits issued, what a user divides
    cmd_set by for the items one carried under sync "always" (0 under "never")."""
    for policy, config in (("always", CONFIGS["journal"]), ("never", '[default]\nsync_journal = "never"\n')):
        (tmp_path / policy).mkdir()
        h = start_server(tmp_path / policy, workers=1, config=config)
        load = Load(h.memcache_port, [b"gc0"], writers=10, tag=policy).start()
        try:
            progress(load, 300)
            load.stop()
            c = Conn(h.memcache_port)
            lines = c.ask(b"stats\r\n", b"END\r\n").decode().splitlines()
            stats = dict(ln.split(" ")[1:3] for ln in lines if ln.startswith("STAT "))
            sets, fsyncs = int(stats["cmd_set"]), int(stats["fsyncs"])
            assert sets >= 300
            assert (0 < fsyncs <= sets) if policy == "always" else fsyncs == 0
        finally:
            load.stopping.set()
            h.stop()
