"""How the supervisor (supervisor.py) learns of its children's deaths and brings them about:
reaping, the restart decision, the heartbeat's kill, and the shutdown's TERM-then-KILL.

Apart from the set-up, forking and the main loop because these are what happens to a child at
its end, each on its own timing (a SIGCHLD, a silent heartbeat, a SIGTERM); the replacement
itself is forked by `manage`, in supervisor.py, once peernews.py says its peers know.
"""
from __future__ import annotations

import logging
import os
import signal
import time

from lanner.ipc.mesh import CLEANER, FRONT, WORKER
from lanner.server import peernews
from lanner.server.children import RESTART_WINDOW, ZK, Child, backoff
from lanner.server.exits import EXIT_BOOT_ERROR

log = logging.getLogger("lanner.supervisor")

STOP_GRACE = 15.0            # seconds a child gets to stop on SIGTERM before SIGKILL


class Reaping:
    """Supervisor's children's ends; the state (children, by_pid, stopping ...) is the
    Supervisor's."""

    def handle_chld(self) -> None:
        for pid, status in self.reap():
            child = self.by_pid.pop(pid, None)
            if child is not None:
                self.child_exited(child, pid, status)

    def reap(self) -> list[tuple[int, int]]:
        """Every exited child as (pid, wait status), without blocking.  Tests replace this."""
        out = []
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return out
            if pid == 0:
                return out
            out.append((pid, status))

    def child_exited(self, child: Child, pid: int, status: int) -> None:
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            if child.murdered is not None:
                why = f"killed after {child.murdered:.1f} s without a heartbeat"
            else:
                why = f"killed by signal {sig}" + (" (perhaps out of memory?)" if sig == signal.SIGKILL else "")
        else:
            why = f"exited with status {os.WEXITSTATUS(status)}"
        child.pid = 0
        child.ready = False
        if self.stopping:
            log.info("%s (pid %d) %s", child, pid, why)
            return
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == EXIT_BOOT_ERROR:
            # its `boot_failed` (the reason, for contract.md's one line) was sent before it
            # exited, but the exit can be reaped first: read it from the socket now
            if child.sock is not None and not self.told_why:
                self.read_child(child)
            self.tell_why(f"{child} cannot start (its log above says why)")
            log.error("%s (pid %d) %s: cannot boot, stopping", child, pid, why)
            self.exit_code = EXIT_BOOT_ERROR
            self.stopping = True
            return
        peernews.gone(self, child)
        now = self.clock.monotonic()
        child.restarts = [t for t in child.restarts if now - t < RESTART_WINDOW] + [now]
        child.restart_at = now + backoff(len(child.restarts))
        peernews.announce(self, child, "peer_down")
        # logged once its peers have been told: the line then means they know (an operator, or
        # a test that resumes a stopped peer on seeing it, never acts before the news is out)
        log.warning("%s (pid %d) %s; restarting", child, pid, why)

    def murder_stuck(self) -> None:
        """SIGKILL every ready child whose loop has not stamped its heartbeat in time."""
        hb = self.heartbeats
        if hb is None or not hb.timeout_ms:
            return
        now = self.clock.monotonic()
        for c in self.children.values():
            slot = self.peers.heartbeat_slot(c.kind, c.index)
            if not c.pid or not c.ready or c.murdered is not None or slot is None:
                continue
            silent = hb.overdue(slot, now)
            if silent is None:
                continue
            log.error("%s (pid %d) stuck: no heartbeat for %.1f s; killing it", c, c.pid, silent)
            c.murdered = silent
            self.kill(c.pid, signal.SIGKILL)

    def kill(self, pid: int, sig: int) -> None:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass

    def shutdown(self) -> None:
        self.stopping = True
        for kind in (ZK, FRONT, WORKER, CLEANER):
            group = [c for c in self.children.values() if c.kind == kind and c.pid in self.by_pid]
            for c in group:
                self.kill(c.pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE
            while any(c.pid in self.by_pid for c in group) and time.monotonic() < deadline:
                self.reap_quietly()
                time.sleep(0.01)
            for c in group:
                if c.pid in self.by_pid:
                    log.warning("%s did not stop; killing it", c)
                    self.kill(c.pid, signal.SIGKILL)
            self.reap_quietly(block=True, pids=[c.pid for c in group])
        for socks in self.listeners.values():
            for s in socks.values():
                s.close()
        for fd in self.lock_fds:
            os.close(fd)
        self.lock_fds = []
        log.info("stopped")

    def reap_quietly(self, block: bool = False, pids=()) -> None:
        if block:
            for pid in pids:
                if pid in self.by_pid:
                    try:
                        _, status = os.waitpid(pid, 0)
                    except ChildProcessError:
                        status = 0
                    self.stopped(self.by_pid.pop(pid, None), status)
            return
        for pid, status in self.reap():
            self.stopped(self.by_pid.pop(pid, None), status)

    def stopped(self, child: Child | None, status: int) -> None:
        """A child reaped while stopping: a worker that exits non-zero left something
        unwritten (it logged what), and the server's exit status says so."""
        if child is None or child.kind != "worker" or not os.WIFEXITED(status):
            return
        code = os.WEXITSTATUS(status)
        if code:
            log.error("worker %d stopped with status %d: %s (see above)", child.index, code,
                      "it could not start" if code == EXIT_BOOT_ERROR else "not everything could be written")
            self.exit_code = self.exit_code or code
