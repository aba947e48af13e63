"""The supervisor (gunicorn's arbiter is the model): forks and watches, never serves.

Start-up, in order:
  1. make the queue directory and lock it and the status file for this server's life
     (dirlock.py: a second server on the same data is refused, naming the holder's
     pid); bind every listener (a port in use is a one-line error and exit 1, not a
     child's problem); create the shared memory (rings, status block, counters,
     heartbeats, the thrift id counter) and the eventfds, all before any fork, so that
     no resource tracker can unlink shared memory under a live process;
  2. fork the cleaner and the shard workers; each worker replays its journals and
     says `ready` (or `boot_failed`, which halts the server: exit 3);
  3. fork the fronts and the admin process (a front slot alone on the admin port, so a
     scrape never holds up a loop that serves queues); when all are ready, print the
     contract's `lanner ready ...` line.

Main loop (`tick`): signal handlers only queue the signal; the loop dispatches to
`handle_term`/`handle_hup`/`handle_chld`, reads control messages, kills children
whose heartbeat stopped (`murder_stuck`, heartbeat.py) and forks the replacements
that are due (`manage`).  Nothing in it blocks.

Replacing a child X, in the order every shared ring relies on (ring.py, "Crashed peers"):
  1. X is reaped.  Every live process that shares rings with X is told `peer_down(X)`:
     it discards what X left in their rings, drops X's connections and queued
     messages, stops sending to X, and acknowledges.  A process forked while X is
     down is told at birth, and must acknowledge too.
  2. Once every one of them has acknowledged (one that dies meanwhile need not: its
     own replacement starts from nothing) and X's backoff has passed, X' is forked,
     its inbound rings emptied just before the fork (mesh.py).  Nothing times this wait out:
     a process that never acknowledges is stuck, and the heartbeat kills it.
  3. When X' is ready its peers are told `peer_up(X')`, and X' is logged ready once they all
     acknowledged it (peernews.py).  A worker also takes the first record from X' as proof
     that it is up, since X' may send before that message lands.

Children die with the supervisor (PR_SET_PDEATHSIG, plus EOF on their control
socket), so a `kill -9` of the supervisor leaves no orphan holding the ports; the
data-directory lock goes when the last of them exits.  Exit codes: exits.py; a worker
that stops unclean (EXIT_UNSAVED: some state could not be written, each queue logged)
makes the server exit with its status, so a full disk at shutdown is not "exit 0".
"""
from __future__ import annotations

import contextlib
import errno
import gc
import logging
import mmap
import os
import selectors
import signal
import socket
import sys
import time

from lanner.clock import SYSTEM_CLOCK
from lanner.config import ConfigError, reload_config
from lanner.fronts.counters import forget_dead
from lanner.fronts.front import FRONT_COUNTERS, front_main
# Loaded here, before any fork, though only the children use them: front.py and local.py load
# the connection classes lazily (kinds.py), and each child loading them itself would keep its own
# copy of memcache.so's and the parser's modules (+9 MB PSS at perf memory's 1 GiB backlog).
from lanner.fronts.kinds import CONN_CLASSES  # noqa: F401
from lanner.ipc import control, handoff
from lanner.ipc.mesh import CLEANER, FRONT, WORKER, Mesh, Peers
from lanner.ipc.shm import ConfigEpoch, CounterBlock, IdBlocks, SharedCounter
from lanner.ops import logfile, notify
from lanner.server import dirlock, peernews
from lanner.server.children import ADMIN, ZK, Child, name_process, pdeathsig, relay_reload
from lanner.server.cleaner import cleaner_main
from lanner.server.exits import EXIT_BOOT_ERROR, EXIT_CHILD_CRASHED, EXIT_OK, EXIT_START_REFUSED
from lanner.server.heaptrim import child_gc, release_free_heap
from lanner.server.heartbeat import Heartbeats
from lanner.server.reaping import Reaping
from lanner.server.status import ServerStatus
from lanner.server.worker import worker_main

log = logging.getLogger("lanner.supervisor")


class StartupError(Exception):
    """One line for stderr; the server exits EXIT_START_REFUSED."""


class Supervisor(Reaping):
    def __init__(self, config, clock=SYSTEM_CLOCK):
        self.config = config
        self.clock = clock
        srv = config.server
        # front slots: the dedicated fronts, the admin process (the last dedicated slot, when
        # there is an admin port), then each serving worker's own (mesh.Peers)
        self.admin_index = srv.fronts if srv.admin_port is not None else None
        self.peers = Peers(srv.workers, srv.fronts + (self.admin_index is not None), srv.worker_fronts)
        self.nworkers = srv.workers
        self.nfronts = srv.fronts
        self.children: dict[tuple[str, int], Child] = {}
        self.by_pid: dict[int, Child] = {}
        self.sig_queue: list[int] = []
        self.stopping = False
        self.started_at = time.time()
        self.listeners: dict[str, dict[int, socket.socket]] = {}    # kind -> front slot -> socket
        self.lock_fds: list[int] = []
        self.sel = selectors.DefaultSelector()
        self.exit_code = EXIT_OK
        self.told_why = False            # the one stderr line saying why start-up failed is out
        self.heartbeats: Heartbeats | None = None
        self.mesh: Mesh | None = None

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
        try:
            self.lock_fds = dirlock.lock_server(qp, srv.status_file)
        except (dirlock.DirLocked, dirlock.PathClash) as e:
            raise StartupError(str(e)) from None
        except OSError as e:
            raise StartupError(f"cannot lock {e.filename or qp}: {e.strerror or e}") from None
        for kind, port in (("memcache", srv.memcache_port), ("text", srv.text_port),
                           ("thrift", srv.thrift_port), ("admin", srv.admin_port)):
            if port is None:
                continue
            self.listeners[kind] = self.bind(kind, srv.listen_address, port)
        self.status_mem = mmap.mmap(-1, ServerStatus.SIZE, flags=mmap.MAP_SHARED)
        self.status = ServerStatus.create(self.status_mem, srv.status_file, srv.default_status,
                                          self.clock, srv.status_change_grace_period)
        self.counters = CounterBlock.create(self.peers.slots, FRONT_COUNTERS)
        self.heartbeats = Heartbeats(self.peers.heartbeat_slots, srv.heartbeat_timeout)
        self.thrift_ids = SharedCounter.create("lanner-thrift-ids")
        self.epoch = ConfigEpoch()       # the config generation a reply to `reload` binds (shm.py)
        self.mesh = Mesh(self.peers)
        self.cleaner_socks = [socket.socketpair() for _ in range(self.nworkers)]
        # serving workers hand connections to each other (ipc/handoff.py)
        self.handoff = handoff.channels(self.nworkers) if self.peers.embedded and self.nworkers > 1 \
            else None
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)

    def serving_slots(self, kind: str) -> list[int]:
        """The front slots that accept `kind` connections: the admin port only the admin
        process's, every other port every other slot's."""
        if kind == "admin":
            return [self.admin_index]
        return [s for s in range(self.peers.slots) if s != self.admin_index]

    def bind(self, kind: str, host: str, port: int) -> dict[int, socket.socket]:
        """One SO_REUSEPORT socket per front slot that serves `kind` (serving_slots), so the kernel
        spreads connections evenly and a restarted front or worker finds its backlog waiting.
        A probe bind without SO_REUSEPORT first makes a port held by anyone, another Lanner
        included, a start-up error."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        probe = socket.socket(family)
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as e:
            raise StartupError(f"cannot listen on {host}:{port} ({kind}): {e.strerror or e}") from None
        finally:
            probe.close()
        socks: dict[int, socket.socket] = {}
        for slot in self.serving_slots(kind):
            s = socket.socket(family)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            try:
                s.bind((host, port))
                s.listen(1024)
            except OSError as e:
                s.close()
                for x in socks.values():
                    x.close()
                raise StartupError(f"cannot listen on {host}:{port} ({kind}): {e.strerror or e}") from None
            s.setblocking(False)
            socks[slot] = s
            if port == 0:        # an ephemeral port: every front shares the one the kernel chose
                port = s.getsockname()[1]
        return socks

    # -- forking ---------------------------------------------------------------------------------
    def spawn(self, kind: str, index: int) -> Child:
        reborn = (kind, index) in self.children
        child = self.children.get((kind, index)) or \
            Child(kind, index, ADMIN if kind == FRONT and index == self.admin_index else "")
        self.children[child.key] = child
        parent_sock, child_sock = socket.socketpair()
        slot = self.peers.heartbeat_slot(kind, index)
        if self.heartbeats is not None and slot is not None:
            self.heartbeats.stamp(slot, self.clock.monotonic())
        if self.mesh is not None and reborn:
            # (a first start has fresh rings, which a peer started earlier may already have sent
            # into: a worker's moves at its start, a routed request of an early client)
            self.mesh.discard_unread(kind, index)
        # Keep what lives now out of the collector's reach (CPython's gc docs, Instagram): a full
        # collection here would write every object's header and unshare the children's pages.
        gc.freeze()
        release_free_heap()
        pid = self.fork_child(kind, index, child_sock, parent_sock)
        child_sock.close()
        if child.sock is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(child.sock)
            child.sock.close()
        child.pid = pid
        child.sock = parent_sock
        child.reader = control.Reader(parent_sock)
        child.ready = False
        child.restart_at = None
        child.murdered = None
        self.by_pid[pid] = child
        self.sel.register(parent_sock, selectors.EVENT_READ, child)
        log.info("started %s (pid %d)", child, pid)
        for down in self.children.values():
            if down.pid == 0 and down.kind in self.peers.talk(kind):
                peernews.tell(self, child, "peer_down", down)     # born while `down` is down
        return child

    def fork_child(self, kind: str, index: int, child_sock: socket.socket,
                   parent_sock: socket.socket) -> int:
        """Fork; the child runs `child_main` and never returns.  Tests replace this."""
        pid = os.fork()
        if pid:
            return pid
        code = EXIT_CHILD_CRASHED
        try:
            parent_sock.close()
            pdeathsig()
            if os.getppid() == 1:
                os._exit(EXIT_CHILD_CRASHED)
            for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGINT):
                signal.signal(sig, signal.SIG_DFL)
            signal.set_wakeup_fd(-1)
            for c in self.children.values():
                if c.sock is not None:
                    c.sock.close()
            code = self.child_main(kind, index, child_sock)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else EXIT_CHILD_CRASHED
        except BaseException:
            logging.getLogger("lanner").exception("%s %d crashed", kind, index)
            code = EXIT_CHILD_CRASHED
        finally:
            logging.shutdown()
            os._exit(code)

    def child_main(self, kind: str, index: int, sock: socket.socket) -> int:
        name_process(self.children[(kind, index)].process_name)
        child_gc()
        mine = self.listener_slot(kind, index)
        for socks in self.listeners.values():
            for i, s in socks.items():
                if i != mine:
                    s.close()
        slot = self.peers.heartbeat_slot(kind, index)
        heart = self.heartbeats.heart(slot) if slot is not None else None
        if kind == WORKER:
            inbound, outbound = self.mesh.worker_rings(index)
            front = None
            if self.peers.embedded:
                slot = self.peers.of_embedded(index)
                req, resp = self.mesh.front_rings(slot)
                forget_dead(self.counters.slot(slot))    # a dead worker's clients are gone
                mine = {k: socks[slot] for k, socks in self.listeners.items() if slot in socks}
                front = (slot, req, resp, self.mesh.front_wake[slot].fd, mine, self.counters,
                         self.started_at, self.handoff)
            return worker_main(index, self.peers, self.config, self.status_view(), inbound, outbound,
                               self.mesh.worker_wake[index].fd, sock, self.cleaner_socks[index][0],
                               heart=heart, ids=IdBlocks(self.thrift_ids), front=front,
                               epoch=self.epoch.for_child())
        if kind == FRONT:
            req, resp = self.mesh.front_rings(index)
            forget_dead(self.counters.slot(index))    # a dead front's clients are gone
            mine = {k: socks[index] for k, socks in self.listeners.items() if index in socks}
            return front_main(index, self.config, self.status_view(), self.counters, req, resp,
                              self.mesh.front_wake[index].fd, sock, mine, self.started_at,
                              self.clock, heart=heart, epoch=self.epoch.for_child())
        if kind == ZK:
            # imported here: kazoo, which it needs, is an optional dependency
            from lanner.ops.serverset import serverset_main
            return serverset_main(self.config, self.status_view(), self.ports, sock)
        return cleaner_main(self.config, [p[1] for p in self.cleaner_socks], sock, heart=heart)

    def listener_slot(self, kind: str, index: int) -> int | None:
        """Which of the listening sockets a child serves: a front its own, a worker that
        serves clients its front slot's; None for the others."""
        if kind == FRONT:
            return index
        if kind == WORKER and self.peers.embedded:
            return self.peers.of_embedded(index)
        return None

    def status_view(self) -> ServerStatus:
        srv = self.config.server
        return ServerStatus(self.status_mem, srv.status_file, self.clock, srv.status_change_grace_period)

    # -- running ---------------------------------------------------------------------------------
    def run(self) -> int:
        self.prepare()
        self.ports = {k: self.address(k)[1] for k in self.listeners}
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD, signal.SIGUSR1):
            signal.signal(sig, self.on_signal)
        self.sel.register(r, selectors.EVENT_READ, "signal")
        self.spawn(CLEANER, 0)
        for i in range(self.nworkers):
            self.spawn(WORKER, i)
        if not self.wait_ready(WORKER):
            self.shutdown()
            return self.exit_code or EXIT_BOOT_ERROR
        for i in range(self.peers.fronts):      # the queue fronts, then the admin process
            self.spawn(FRONT, i)
        if not self.wait_ready(FRONT):
            self.shutdown()
            return self.exit_code or EXIT_CHILD_CRASHED
        line = self.ready_line()
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
        notify.ready(line[len("lanner ready "):])
        log.info("ready: %d workers, %d fronts%s", self.nworkers, self.nfronts,
                 ", the admin process" if self.admin_index is not None else "")
        if self.config.zookeeper is not None:
            self.spawn(ZK, 0)
        while not self.stopping:
            self.tick(self.tick_interval())
        self.shutdown()
        return self.exit_code

    def ready_line(self) -> str:
        srv = self.config.server
        parts = ["lanner ready"]
        for kind, port in (("memcache", srv.memcache_port), ("text", srv.text_port),
                           ("thrift", srv.thrift_port), ("admin", srv.admin_port)):
            if port is not None and kind in self.listeners:
                host, p = self.address(kind)
                parts.append(f"{kind}={host}:{p}")
        return " ".join(parts)

    def address(self, kind: str) -> tuple[str, int]:
        """(host, port) of the `kind` listener (every slot's socket shares them)."""
        return next(iter(self.listeners[kind].values())).getsockname()[:2]

    def tick_interval(self) -> float:
        """How long the loop may sleep: a second, less while a restart or a heartbeat is due."""
        t = 1.0
        if self.heartbeats is not None:
            t = min(t, self.heartbeats.interval)
        now = self.clock.monotonic()
        for c in self.children.values():
            if c.restart_at is not None and not c.awaiting_acks:
                t = min(t, max(0.0, c.restart_at - now))
        return t

    def wait_ready(self, kind: str) -> bool:
        while True:
            if not [c for c in self.children.values() if c.kind == kind and not c.ready]:
                return True
            if self.stopping:
                return False
            self.tick(min(0.5, self.tick_interval()))

    def tick(self, timeout: float) -> None:
        for key, _ in self.sel.select(timeout):
            if key.data == "signal":
                try:
                    os.read(key.fd, 4096)
                except BlockingIOError:
                    pass
            else:
                self.read_child(key.data)
        while self.sig_queue:
            self.dispatch(self.sig_queue.pop(0))
        if not self.stopping:
            self.murder_stuck()
            self.manage()

    def read_child(self, child: Child) -> None:
        for msg in child.reader.read():
            self.on_message(child, msg)
        if child.reader.eof:
            try:
                self.sel.unregister(child.sock)
            except (KeyError, ValueError):
                pass

    def on_signal(self, sig, frame) -> None:
        """NO logging here: just queue the signal for the main loop."""
        self.sig_queue.append(sig)

    def dispatch(self, sig: int) -> None:
        name = {signal.SIGTERM: "term", signal.SIGINT: "term", signal.SIGHUP: "hup",
                signal.SIGCHLD: "chld", signal.SIGUSR1: "usr1"}.get(sig)
        if name:
            getattr(self, "handle_" + name)()

    def on_message(self, child: Child, msg: dict) -> None:
        cmd = msg.get("cmd")
        if cmd == "ready":
            peernews.came_up(self, child)      # its peers hear peer_up first
        elif cmd == "boot_failed":
            # contract.md: one line says why start-up failed.  Every worker replays the same
            # queue_path, so a stray file fails them all: the first one's reason is that line.
            self.tell_why(f"worker {child.index} cannot start: {msg.get('reason')}")
            self.exit_code = EXIT_BOOT_ERROR
            self.stopping = True
        elif cmd == "ack_down":
            down = self.children.get(self.peers.named_by(child.kind, msg["peer"]))
            if down is not None:
                down.awaiting_acks.discard(child.key)
        elif cmd == "ack_up":
            peernews.acked_up(self, child, msg)
        elif cmd == "reload_all":        # from a front, or from a worker's own front
            self.reload(exclude=child.key)

    # -- signals ---------------------------------------------------------------------------------
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
        logfile.request_reopen()
        log.info("log file reopened")

    def reload(self, exclude=None) -> None:
        """SIGHUP (exclude None), or a client's `reload` the front `exclude` has published."""
        at = self.epoch.start()
        try:
            self.config = reload_config(self.config)
        except ConfigError as e:
            log.error("reload failed: %s", e)
            return
        if exclude is None:
            self.epoch.publish(at)
        else:
            self.epoch.loaded(at)
        relay_reload(self.children, exclude)
        log.info("configuration reloaded")

    def tell_why(self, reason: str) -> None:
        """contract.md's one stderr line saying why start-up failed: the first reason only."""
        if not self.told_why:
            sys.stderr.write(f"lanner: {reason}\n")
            sys.stderr.flush()
            self.told_why = True

    def manage(self) -> None:
        """Fork every replacement whose peers have all acknowledged and whose backoff is over."""
        now = self.clock.monotonic()
        for c in list(self.children.values()):
            if c.pid == 0 and c.restart_at is not None and not c.awaiting_acks \
                    and now >= c.restart_at and not self.stopping:
                self.spawn(c.kind, c.index)



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
