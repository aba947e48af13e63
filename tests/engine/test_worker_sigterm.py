"""A worker's SIGTERM (ShardLoop.run, hear_sigterm): uvloop acts on a signal only through the
wakeup pipe it sets up for each run of the loop, so a SIGTERM that its handler took between two
runs was recorded and never acted on; the supervisor killed the worker after STOP_GRACE (15 s),
in a third to two thirds of quick start-stops of a real server on a loaded machine."""
from __future__ import annotations

import os
import select
import signal

from tests.engine.conftest import CapturingWorker
from tests.engine.forking import child_result, in_child

DEADLINE = 20.0      # the worker stops in well under a second; the old code never did


def test_a_sigterm_that_lands_before_the_loop_runs_stops_the_worker(worker, monkeypatch):
    """The SIGTERM comes while the worker sweeps the moves its replay left, after the listeners'
    run of the loop and before the serving one (the supervisor's shutdown right after `ready`)."""
    w = worker()
    w.wake_fd = os.eventfd(0, os.EFD_NONBLOCK)         # (the fixture's worker has none: no loop)
    monkeypatch.setattr(CapturingWorker, "sweep_replayed", lambda self: os.kill(os.getpid(), signal.SIGTERM))

    def run() -> int:
        # worker_main's handler, which holds SIGTERM until the loop hears it
        signal.signal(signal.SIGTERM, lambda *_: setattr(w, "stopping", True))
        return w.run()
    pid, rfd = in_child(run)
    stopped = False
    try:
        stopped = bool(select.select([rfd], [], [], DEADLINE)[0])
    finally:
        os.close(w.wake_fd)
        if not stopped:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(rfd)
    assert stopped, f"the worker did not stop within {DEADLINE} s of its SIGTERM"
    assert child_result(pid, rfd) == 0            # run()'s exit code: a clean shutdown
