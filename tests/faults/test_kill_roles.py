"""Fault injection (issue 11, "How it is shown"): kill -9 of each process role under
durable load (`sync_journal = "always"`), three rounds each.

After every kill, fresh connections must get every shard answered within 5 s (for the
supervisor, whose death takes the group down, within 5 s of starting the server again
on the same data).  At the end the queues are drained and held against the books
(tests/faults/load.py): no acknowledged (STORED) item lost, no confirmed item back, no
item twice.  Each test prints one FAULTS line with its figures (run with -s to see them).
"""
import signal
import time

import psutil
import pytest

from tests.faults.load import Load, queues_per_worker, service_time, verify
from tests.faults.test_front_restart import pid_named, wait_for
from tests.helpers import start_server

pytestmark = pytest.mark.integration

DURABLE = '[default]\nsync_journal = "always"\n'
ROUNDS = 3
SERVICE_LIMIT = 5.0
PROGRESS = 300          # acknowledged writes between kills: the load really runs


def progress(load: Load, n: int = PROGRESS, timeout: float = 15.0) -> None:
    base = load.count()
    assert wait_for(lambda: load.count() >= base + n, timeout), "the load stalled"


def check_books(port: int, load: Load, role: str, times: list[float]) -> None:
    books = load.stop()
    v = verify(port, books)
    print(f"\nFAULTS role={role} rounds={len(times)} checked={v.checked} "
          f"confirmed={len(books.confirmed)} uncertain={len(books.uncertain)} "
          f"client_errors={books.errors} service_s={'/'.join(f'{t:.2f}' for t in times)}")
    assert v.checked >= PROGRESS * len(times)
    assert not v.lost, f"{len(v.lost)} acknowledged items lost, e.g. {v.lost[:5]}"
    assert not v.redelivered, f"{len(v.redelivered)} confirmed items came back"
    assert not v.duplicated, f"{len(v.duplicated)} items twice"


@pytest.mark.parametrize("role", ["worker", "front", "cleaner"])
def test_kill_9_of_a_child_under_durable_load(tmp_path, role):
    h = start_server(tmp_path, workers=2, fronts=2, config=DURABLE)
    probes = queues_per_worker(2)
    load = Load(h.memcache_port, [b"q"] + probes, tag=role).start()
    times = []
    try:
        for rnd in range(ROUNDS):
            progress(load)
            name = {"worker": f"lanner-w{rnd % 2}", "front": f"lanner-f{rnd % 2}",
                    "cleaner": "lanner-cleaner"}[role]
            victim = pid_named(h, name)
            victim.send_signal(signal.SIGKILL)
            took = service_time(h.memcache_port, probes, SERVICE_LIMIT)
            assert took is not None, \
                f"round {rnd}: no service {SERVICE_LIMIT} s after killing {name}; the server's log:\n{h.log()[-6000:]}"
            times.append(took)
            assert wait_for(lambda: (p := pid_named(h, name)) is not None and p.pid != victim.pid, 10)
        progress(load)
        check_books(h.memcache_port, load, role, times)
    finally:
        load.stopping.set()
        h.stop()


def test_kill_9_of_the_supervisor_then_restart(tmp_path):
    qp = str(tmp_path / "queues")
    h = start_server(tmp_path, workers=2, fronts=2, config=DURABLE, queue_path=qp)
    probes = queues_per_worker(2)
    load = Load(h.memcache_port, [b"q"] + probes, tag="sup").start()
    times = []
    try:
        for rnd in range(ROUNDS):
            progress(load)
            group = psutil.Process(h.proc.pid).children(recursive=True)
            h.proc.send_signal(signal.SIGKILL)
            h.proc.wait()
            h.stop()
            _, alive = psutil.wait_procs(group, timeout=20)     # children follow their parent
            assert not alive, f"orphans after kill -9 of the supervisor: {alive}"
            t0 = time.monotonic()
            h = start_server(tmp_path, workers=2, fronts=2, config=DURABLE, queue_path=qp)
            ready = time.monotonic() - t0
            load.port = h.memcache_port
            took = service_time(h.memcache_port, probes, SERVICE_LIMIT)
            assert took is not None, f"round {rnd}: no service after the restart"
            times.append(time.monotonic() - t0)
            assert times[-1] < SERVICE_LIMIT, \
                f"round {rnd}: service back after {times[-1]:.1f} s (the ready line after {ready:.1f} s)"
        progress(load)
        check_books(h.memcache_port, load, "supervisor", times)
    finally:
        load.stopping.set()
        h.stop()
