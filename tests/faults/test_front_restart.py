"""Issue 11, defect 1: a front killed under durable load must not wedge a worker.

The worker used to skip the ring of a front it had marked down while still treating
that ring's records as "data waiting", so the first request of the replacement front
(sent before `peer_up` reached the worker) made every sleep attempt fail: the loop spun
at 100 % CPU without ever reading the control socket that carried `peer_up`.
"""
import signal

import psutil
import pytest

from tests.faults.load import Load, queues_per_worker, service_time, verify
from tests.helpers import start_server, wait_for

pytestmark = pytest.mark.integration

ALWAYS = '[default]\nsync_journal = "always"\n'


def pid_named(h, name: str) -> psutil.Process | None:
    for p in psutil.Process(h.proc.pid).children():
        try:
            if p.name() == name:
                return p
        except psutil.NoSuchProcess:
            continue
    return None


def test_front_killed_under_durable_load_every_shard_keeps_serving(tmp_path):
    h = start_server(tmp_path, workers=2, fronts=2, config=ALWAYS)
    probes = queues_per_worker(2)
    load = Load(h.memcache_port, [b"q"] + probes).start()
    try:
        for _ in range(3):
            base = load.count()
            assert wait_for(lambda: load.count() >= base + 100, 10), "no load before the kill"
            victim = pid_named(h, "lanner-f0")
            victim.send_signal(signal.SIGKILL)
            assert wait_for(lambda: (p := pid_named(h, "lanner-f0")) is not None
                            and p.pid != victim.pid, 10), "front 0 was not replaced"
            # the replacement's first requests race its peer_up: load keeps flowing through it
            base = load.count()
            assert wait_for(lambda: load.count() >= base + 100, 10), "load stalled after the restart"
            took = service_time(h.memcache_port, probes, limit=5.0, conns=16)
            assert took is not None, "a shard stopped answering after front 0 was replaced"
        books = load.stop()
        v = verify(h.memcache_port, books)
        assert v.checked > 300
        assert not v.lost, f"{len(v.lost)} acknowledged items lost"
        assert not v.redelivered, f"{len(v.redelivered)} confirmed items came back"
        assert not v.duplicated
    finally:
        load.stopping.set()
        h.stop()
