"""The supervisor (gunicorn's arbiter is the model): forks and watches, never serves.

Start-up, in order:
  1. make the queue directory, bind every listener (a port in use is a one-line
     error and exit 1, not a child's problem), create the shared memory (rings,
     status block, counters) and the eventfds, all before any fork, so that no
     resource tracker can unlink shared memory under a live process;
  2. fork the cleaner and the shard workers; each worker replays its journals and
     says `ready` (or `boot_failed`, which halts the server: exit 3);
  3. fork the protocol fronts on the inherited listening sockets; when all are
     ready, print the contract's `lanner ready ...` line.

Main loop: signal handlers only queue the signal; the loop dispatches to
`handle_term`/`handle_hup`/`handle_chld` and reads control messages.  A child
that dies is restarted with backoff after its peers have been told
(`peer_down`, acknowledged, so nothing is sent to a ring nobody reads) and its
rings resynchronised by the replacement; `peer_up` follows its `ready`.
Children die with the supervisor (PR_SET_PDEATHSIG, plus EOF on their control
socket), so a `kill -9` of the supervisor leaves no orphan holding the ports.

Exit codes: 0 clean shutdown; 1 start-up refused (config, port, data dir);
3 a worker could not boot (replay found a file it refuses to guess about).
"""
from __future__ import annotations

import ctypes
import gc
import errno
import logging
import mmap
import os
import selectors
import signal
import socket
import sys
import time
from dataclasses import dataclass, field

from lanner.ipc import control
from lanner.clock import SYSTEM_CLOCK
from lanner.ipc.ring import Ring, WakeFd
from lanner.server.status import ServerStatus
from lanner.ops import notify

log = logging.getLogger("lanner.supervisor")

RING_CAPACITY = 1 << 20
FWD_RING_CAPACITY = 1 << 18
EXIT_START_REFUSED = 1
EXIT_BOOT_ERROR = 3


class StartupError(Exception):
    """One line for stderr; the server exits 1."""


@dataclass
class Child:
    kind: str                 # "worker" | "front" | "cleaner"
    index: int
    pid: int = 0
    sock: socket.socket | None = None     # supervisor's end of the control socketpair
    reader: control.Reader | None = None
    ready: bool = False
    restarts: list = field(default_factory=list)
    awaiting_acks: set = field(default_factory=set)


def _pdeathsig() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)       # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Supervisor:
    def __init__(self, config, clock=SYSTEM_CLOCK):
        self.config = config
        self.clock = clock
        srv = config.server
        self.nworkers = srv.workers
        self.nfronts = srv.fronts
        self.children: dict[tuple[str, int], Child] = {}
        self.by_pid: dict[int, Child] = {}
        self.sig_queue: list[int] = []
        self.stopping = False
        self.started_at = time.time()
        self.listeners: dict[str, socket.socket] = {}
        self.sel = selectors.DefaultSelector()
        self.exit_code = 0

    # -- set-up ----------------------------------------------------------------------------------
    def prepare(self) -> None:
        srv = self.config.server
        qp = srv.queue_path
        try:
            os.makedirs(qp, exist_ok=True)
            probe = os.path.join(qp, ".lanner-write-test")
            with open(probe, "wb"):
                pass
            os.unlink(probe)
        except OSError as e:
            raise StartupError(f"queue path {qp!r} is not writable: {e.strerror or e}") from None
        for kind, port in (("memcache", srv.memcache_port), ("text", srv.text_port),
                           ("thrift", srv.thrift_port), ("admin", srv.admin_port)):
            if port is None:
                continue
            self.listeners[kind] = self.bind(kind, srv.listen_address, port)
        self.status_mem = mmap.mmap(-1, ServerStatus.SIZE, flags=mmap.MAP_SHARED)
        self.status = ServerStatus.create(self.status_mem, srv.status_file, srv.default_status,
                                          self.clock, srv.status_change_grace_period)
        from lanner.fronts.front import FRONT_COUNTERS
        from lanner.ipc.shm import CounterBlock
        self.counters = CounterBlock.create(self.nfronts, FRONT_COUNTERS)
        self.worker_wake = [WakeFd.create() for _ in range(self.nworkers)]
        self.front_wake = [WakeFd.create() for _ in range(self.nfronts)]
        W, F = self.nworkers, self.nfronts
        self.req = [[Ring.create(RING_CAPACITY, wake_fd=self.worker_wake[w], space_fd=self.front_wake[f],
                                 name=f"f{f}->w{w}") for w in range(W)] for f in range(F)]
        self.resp = [[Ring.create(RING_CAPACITY, wake_fd=self.front_wake[f], space_fd=self.worker_wake[w],
                                  name=f"w{w}->f{f}") for f in range(F)] for w in range(W)]
        self.fwd = [[None if a == b else
                     Ring.create(FWD_RING_CAPACITY, wake_fd=self.worker_wake[b], space_fd=self.worker_wake[a],
                                 name=f"w{a}->w{b}") for b in range(W)] for a in range(W)]
        self.cleaner_socks = [socket.socketpair() for _ in range(W)]
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)

    def bind(self, kind: str, host: str, port: int) -> list[socket.socket]:
        """One SO_REUSEPORT socket per front, so the kernel spreads connections evenly and a
        restarted front finds its backlog waiting.  A probe bind without SO_REUSEPORT first
        makes a port held by anyone, another Lanner included, a start-up error."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        probe = socket.socket(family)
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as e:
            raise StartupError(f"cannot listen on {host}:{port} ({kind}): {e.strerror or e}") from None
        finally:
            probe.close()
        socks = []
        for _ in range(self.nfronts):
            s = socket.socket(family)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            try:
                s.bind((host, port))
                s.listen(1024)
            except OSError as e:
                s.close()
                for x in socks:
                    x.close()
                raise StartupError(f"cannot listen on {host}:{port} ({kind}): {e.strerror or e}") from None
            s.setblocking(False)
            socks.append(s)
            if port == 0:        # an ephemeral port: every front shares the one the kernel chose
                port = s.getsockname()[1]
        return socks

    # -- forking ---------------------------------------------------------------------------------
    def spawn(self, kind: str, index: int) -> Child:
        child = self.children.get((kind, index)) or Child(kind, index)
        self.children[(kind, index)] = child
        parent_sock, child_sock = socket.socketpair()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                parent_sock.close()
                _pdeathsig()
                if os.getppid() == 1:
                    os._exit(1)
                for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGINT):
                    signal.signal(sig, signal.SIG_DFL)
                signal.set_wakeup_fd(-1)
                for c in self.children.values():
                    if c.sock is not None:
                        c.sock.close()
                code = self.child_main(kind, index, child_sock)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
            except BaseException:
                logging.getLogger("lanner").exception("%s %d crashed", kind, index)
                code = 1
            finally:
                logging.shutdown()
                os._exit(code)
        child_sock.close()
        if child.sock is not None:
            try:
                self.sel.unregister(child.sock)
            except (KeyError, ValueError):
                pass
            child.sock.close()
        child.pid = pid
        child.sock = parent_sock
        child.reader = control.Reader(parent_sock)
        child.ready = False
        self.by_pid[pid] = child
        self.sel.register(parent_sock, selectors.EVENT_READ, child)
        log.info("started %s %d (pid %d)", kind, index, pid)
        return child

    def child_main(self, kind: str, index: int, sock: socket.socket) -> int:
        _name_process(f"lanner-{kind[0]}{index}" if kind not in ("cleaner", "zk") else f"lanner-{kind}")
        # Everything allocated so far lives as long as the process: keep the collector off it,
        # and let young garbage (per-request objects) build up more before a collection.
        gc.freeze()
        gc.set_threshold(50_000, 20, 20)
        for kind_, socks in self.listeners.items():
            for i, s in enumerate(socks):
                if kind != "front" or i != index:
                    s.close()
        if kind == "worker":
            from lanner.server.worker import worker_main
            F, W = self.nfronts, self.nworkers
            inbound = [self.req[f][index] for f in range(F)] + [self.fwd[a][index] for a in range(W)]
            outbound = [self.resp[index][f] for f in range(F)] + [self.fwd[index][b] for b in range(W)]
            for r in inbound:
                if r is not None:
                    r.resync_consumer(discard=True)
            for r in outbound:
                if r is not None:
                    r.resync_producer()
            return worker_main(index, W, self.config, self.status_view(), inbound, outbound,
                               self.worker_wake[index].fd, sock, self.cleaner_socks[index][0], F)
        if kind == "front":
            from lanner.fronts.front import front_main
            req = self.req[index]
            resp = [self.resp[w][index] for w in range(self.nworkers)]
            for r in req:
                r.resync_producer()
            for r in resp:
                r.resync_consumer(discard=True)
            self.counters.slot(index).set(0, 0)    # curr_connections of a dead front
            mine = {k: socks[index] for k, socks in self.listeners.items()}
            return front_main(index, self.config, self.status_view(), self.counters, req, resp,
                              self.front_wake[index].fd, sock, mine, self.started_at,
                              self.clock)
        if kind == "zk":
            from lanner.ops.serverset import serverset_main
            return serverset_main(self.config, self.status_view(), self.ports, sock)
        from lanner.server.cleaner import cleaner_main
        return cleaner_main(self.config, [p[1] for p in self.cleaner_socks], sock)

    def status_view(self) -> ServerStatus:
        srv = self.config.server
        return ServerStatus(self.status_mem, srv.status_file, self.clock, srv.status_change_grace_period)

    # -- running ---------------------------------------------------------------------------------
    def run(self) -> int:
        self.prepare()
        self.ports = {k: socks[0].getsockname()[1] for k, socks in self.listeners.items()}
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD, signal.SIGUSR1):
            signal.signal(sig, self.on_signal)
        self.sel.register(r, selectors.EVENT_READ, "signal")
        self.spawn("cleaner", 0)
        for i in range(self.nworkers):
            self.spawn("worker", i)
        if not self.wait_ready("worker"):
            self.shutdown()
            return self.exit_code or EXIT_BOOT_ERROR
        for i in range(self.nfronts):
            self.spawn("front", i)
        if not self.wait_ready("front"):
            self.shutdown()
            return self.exit_code or 1
        srv = self.config.server
        parts = ["lanner ready"]
        for kind, port in (("memcache", srv.memcache_port), ("text", srv.text_port),
                           ("thrift", srv.thrift_port), ("admin", srv.admin_port)):
            if port is not None and kind in self.listeners:
                host, p = self.listeners[kind][0].getsockname()[:2]
                parts.append(f"{kind}={host}:{p}")
        sys.stdout.write(" ".join(parts) + "\n")
        sys.stdout.flush()
        notify.ready(" ".join(parts[1:]))
        log.info("ready: %d workers, %d fronts", self.nworkers, self.nfronts)
        if self.config.zookeeper is not None:
            self.spawn("zk", 0)
        while not self.stopping:
            self.tick(1.0)
        self.shutdown()
        return self.exit_code

    def wait_ready(self, kind: str, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            pending = [c for c in self.children.values() if c.kind == kind and not c.ready]
            if not pending:
                return True
            if self.stopping:
                return False
            if deadline is not None and time.monotonic() > deadline:
                return False
            self.tick(0.5)

    def tick(self, timeout: float) -> None:
        for key, _ in self.sel.select(timeout):
            if key.data == "signal":
                try:
                    os.read(key.fd, 4096)
                except BlockingIOError:
                    pass
            else:
                child: Child = key.data
                for msg in child.reader.read():
                    self.on_message(child, msg)
                if child.reader.eof:
                    try:
                        self.sel.unregister(child.sock)
                    except (KeyError, ValueError):
                        pass
        while self.sig_queue:
            sig = self.sig_queue.pop(0)
            name = {signal.SIGTERM: "term", signal.SIGINT: "term", signal.SIGHUP: "hup",
                    signal.SIGCHLD: "chld", signal.SIGUSR1: "usr1"}.get(sig)
            if name:
                getattr(self, "handle_" + name)()

    def on_signal(self, sig, frame) -> None:
        """NO logging here: just queue the signal for the main loop."""
        self.sig_queue.append(sig)

    def on_message(self, child: Child, msg: dict) -> None:
        cmd = msg.get("cmd")
        if cmd == "ready":
            child.ready = True
            log.info("%s %d ready", child.kind, child.index)
            if child.restarts:
                self.announce(child, "peer_up")
        elif cmd == "boot_failed":
            sys.stderr.write(f"lanner: worker {child.index} cannot start: {msg.get('reason')}\n")
            sys.stderr.flush()
            self.exit_code = EXIT_BOOT_ERROR
            self.stopping = True
        elif cmd == "ack_down":
            for c in self.children.values():
                c.awaiting_acks.discard((child.kind, child.index))
        elif cmd == "reload_all":
            self.reload(exclude=("front", child.index))

    def peer_id(self, child: Child) -> int:
        return child.index if child.kind == "front" else self.nfronts + child.index

    def announce(self, child: Child, what: str) -> None:
        """Tell the peers that talk to `child` over rings that it went down or came up."""
        if child.kind == "worker":
            targets = [c for c in self.children.values() if c.kind == "front" or
                       (c.kind == "worker" and c.index != child.index)]
            peer = child.index
        elif child.kind == "front":
            targets = [c for c in self.children.values() if c.kind == "worker"]
            peer = child.index
        else:
            return
        for c in targets:
            # fronts index workers 0..W-1; workers index peers fronts-first
            p = peer if c.kind == "front" else (self.peer_id(child))
            try:
                control.send(c.sock, {"cmd": what, "peer": p})
            except OSError:
                continue
            if what == "peer_down":
                child.awaiting_acks.add((c.kind, c.index))

    def handle_term(self) -> None:
        if not self.stopping:
            log.info("shutting down")
            notify.stopping()
        self.stopping = True

    def handle_hup(self) -> None:
        notify.reloading()
        self.reload()
        notify.ready()

    def handle_usr1(self) -> None:
        from lanner.ops import logfile
        logfile.request_reopen()
        log.info("log file reopened")

    def reload(self, exclude=None) -> None:
        from lanner.config import ConfigError, reload_config
        try:
            self.config = reload_config(self.config)
        except ConfigError as e:
            log.error("reload failed: %s", e)
            return
        for key, c in self.children.items():
            if key == exclude or c.kind == "cleaner":
                continue
            if exclude is not None and c.kind == "worker":
                continue        # the requesting front reloaded every worker through its rings
            try:
                control.send(c.sock, {"cmd": "reload"})
            except OSError:
                pass
        log.info("configuration reloaded")

    def handle_chld(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            child = self.by_pid.pop(pid, None)
            if child is None:
                continue
            if os.WIFSIGNALED(status):
                sig = os.WTERMSIG(status)
                why = f"killed by signal {sig}" + (" (perhaps out of memory?)" if sig == signal.SIGKILL else "")
            else:
                why = f"exited with status {os.WEXITSTATUS(status)}"
            if self.stopping:
                log.info("%s %d (pid %d) %s", child.kind, child.index, pid, why)
                continue
            log.warning("%s %d (pid %d) %s; restarting", child.kind, child.index, pid, why)
            if os.WIFEXITED(status) and os.WEXITSTATUS(status) == EXIT_BOOT_ERROR:
                self.exit_code = EXIT_BOOT_ERROR
                self.stopping = True
                continue
            self.restart(child)

    def restart(self, child: Child) -> None:
        now = time.monotonic()
        child.restarts = [t for t in child.restarts if now - t < 60] + [now]
        self.announce(child, "peer_down")
        deadline = time.monotonic() + 5.0
        while child.awaiting_acks and time.monotonic() < deadline and not self.stopping:
            self.tick(0.1)
        child.awaiting_acks.clear()
        backoff = min(0.05 * (2 ** (len(child.restarts) - 1)), 5.0)
        end = time.monotonic() + backoff
        while time.monotonic() < end and not self.stopping:
            self.tick(end - time.monotonic())
        if not self.stopping:
            self.spawn(child.kind, child.index)

    # -- stopping --------------------------------------------------------------------------------
    def shutdown(self) -> None:
        self.stopping = True
        for kind in ("zk", "front", "worker", "cleaner"):
            group = [c for c in self.children.values() if c.kind == kind and c.pid in self.by_pid]
            for c in group:
                try:
                    os.kill(c.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 15.0
            while any(c.pid in self.by_pid for c in group) and time.monotonic() < deadline:
                self.reap_quietly()
                time.sleep(0.01)
            for c in group:
                if c.pid in self.by_pid:
                    log.warning("%s %d did not stop; killing it", c.kind, c.index)
                    try:
                        os.kill(c.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            self.reap_quietly(block=True, pids=[c.pid for c in group])
        for socks in self.listeners.values():
            for s in socks:
                s.close()
        log.info("stopped")

    def reap_quietly(self, block: bool = False, pids=()) -> None:
        if block:
            for pid in pids:
                if pid in self.by_pid:
                    try:
                        os.waitpid(pid, 0)
                    except ChildProcessError:
                        pass
                    self.by_pid.pop(pid, None)
            return
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.by_pid.pop(pid, None)


def _name_process(title: str) -> None:
    try:
        libc = ctypes.CDLL(None)
        libc.prctl(15, ctypes.c_char_p(title.encode()[:15]), 0, 0, 0)   # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def serve(config) -> int:
    sup = Supervisor(config)
    try:
        return sup.run()
    except StartupError as e:
        sys.stderr.write(f"lanner: {e}\n")
        return EXIT_START_REFUSED
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EROFS, errno.ENOSPC):
            sys.stderr.write(f"lanner: {e}\n")
            return EXIT_START_REFUSED
        raise
