"""Heartbeats (issue 11, defect 1): a child whose loop stops turning is killed and replaced.

SIGSTOP freezes a child the way a livelock or a hung syscall would; SIGKILL from the
supervisor still takes it.  An idle server, whose children block in epoll, must not be
mistaken for a stuck one.
"""
import signal
import time

import pytest

from tests.faults.load import queues_per_worker, service_time
from tests.faults.test_front_restart import pid_named, wait_for
from tests.helpers import start_server

pytestmark = pytest.mark.integration

FAST = '[server]\nheartbeat_timeout = "2s"\n'


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    h = start_server(tmp_path_factory.mktemp("hb"), workers=2, fronts=2, config=FAST)
    yield h
    h.stop()


def test_an_idle_server_is_not_killed(server):
    before = len(server.log())          # (the module's server: earlier tests may have killed children)
    time.sleep(5.0)        # two and a half timeouts of silence: every child must survive
    during = server.log()[before:]
    assert "stuck" not in during
    assert "restarting" not in during


@pytest.mark.parametrize("name", ["lanner-w1", "lanner-f0", "lanner-cleaner"])
def test_a_frozen_child_is_killed_replaced_and_named(server, name):
    victim = pid_named(server, name)
    victim.send_signal(signal.SIGSTOP)
    t0 = time.monotonic()
    assert wait_for(lambda: (p := pid_named(server, name)) is not None and p.pid != victim.pid, 10)
    took = time.monotonic() - t0
    kind, index = {"lanner-w1": ("worker", 1), "lanner-f0": ("front", 0),
                   "lanner-cleaner": ("cleaner", 0)}[name]
    log = server.log()
    assert f"{kind} {index} (pid {victim.pid}) stuck: no heartbeat for " in log
    assert f"{kind} {index} (pid {victim.pid}) killed after " in log
    assert took < 8.0, f"replaced after {took:.1f} s with a 2 s timeout"
    assert service_time(server.memcache_port, queues_per_worker(2), limit=5.0) is not None
