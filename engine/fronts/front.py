"""A protocol front process: its event loop, its rings to the workers, its listeners.

Every front listens on the same inherited sockets (the supervisor binds them before forking, so
a port in use is a start-up error, not a child's) with uvloop and `asyncio.Protocol`.  Its
connections (conn.py and one module per protocol) write requests into the request ring of the
worker that owns the queue (placement.py); request rings are published once per loop iteration,
and response rings are drained when the workers' shared eventfd fires, each response going to
the connection that asked.  The supervisor's control socket brings peer_down/peer_up, reload
and stop.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections import OrderedDict

import uvloop

from lanner.config import ConfigError, reload_config
from lanner.fronts.conn import Conn, FrontBase
from lanner.fronts.counters import FRONT_COUNTERS, global_stats
from lanner.fronts.held import Settles
from lanner.fronts.inline import FusedQueues
from lanner.fronts.putbound import put_bound
from lanner.fronts.routed import Routes
from lanner.fronts.spill import SpillTurns
from lanner.ipc import control
from lanner.ipc.messages import (FRAG_SIZE, RESP_SIZE, RF_HELD, Reassembler, pack_req, send,
                                 unpack_resp)
from lanner.ipc.shm import ConfigEpoch
from lanner.ipc.wake import drain_eventfd, prepare_sleep_all
from lanner.ops import latency
from lanner.queues.placement import worker_of

__all__ = ["FRONT_COUNTERS", "Front", "front_main"]    # the supervisor sizes the counters from it

log = logging.getLogger(__name__)

# COMPILED: as in memcache_commands.py (front.pxd makes it a C constant in the compiled build,
# where memcache_commands.pxd's _c_slot_fields exists)
try:
    import cython
    COMPILED = cython.compiled
except ImportError:             # pure Python without Cython installed
    COMPILED = False

#: Messages a request ring may hold in overflow (its worker lagging by a full ring) before the
#: front stops taking new commands on every connection until the worker catches up.
BACKLOG_LIMIT = 64

class ItemLimits(dict):
    """queue -> the largest set body it could store under the front's config: the memcache
    parser refuses a set over it without reading the body (NOT_STORED).  That is the queue's
    own max_item_size, or more where a fanout child or an alias destination takes more
    (putbound.py): those copies are made before the master's own check (collection.py `add`),
    so refusing at the master's limit would lose them.  The parser asks on every set, so a
    dict lookup answers, and the config resolves a queue only on a miss."""

    __slots__ = ("front",)

    def __init__(self, front) -> None:
        super().__init__()
        self.front = front

    def __missing__(self, queue: str) -> int:
        if len(self) > 100_000:            # bounded: names are client-chosen
            self.clear()
        config = self.front.config
        limit = self[queue] = max(config.queue_config(queue).max_item_size, put_bound(config, queue))
        return limit


class Front(FrontBase):
    """One front process's state: its rings, its connections, the config it serves.

    Slots, no instance dict, as a connection's (conn.py): a worker's own front is read on every
    request (`deliver`, `latency`, `write_pending`, `fused`, `status` ...), and with a dict its
    47 names were past the 30 a class's shared key table holds, so every such read was a
    generic lookup (tests/engine/test_hot_layout.py).  A subclass adds its own slots; what a
    connection reads per request is FrontBase's (conn.py)."""

    __slots__ = ("index", "config", "status", "counters", "req_rings", "resp_rings", "nworkers",
                 "wake_fd", "control", "listeners", "started_at", "clock", "next_conn",
                 "dirty_rings", "flush_scheduled", "down_workers", "ctl_reader", "servers",
                 "stopping", "spills", "ring_waiters", "asm", "live_req", "live_resp",
                 "valid_names", "item_limits", "owners", "settles", "fused", "routes")

    def __init__(self, index, config, status, counters, req_rings, resp_rings, wake_fd, control_sock,
                 listeners, started_at: float, clock, loop, epoch: ConfigEpoch | None = None):
        self.index = index
        self.config = config
        self.epoch = epoch if epoch is not None else ConfigEpoch()    # generation of `config`
        self.status = status
        if COMPILED and getattr(status, "seq", None) is not None:
            self.status_seq = status.seq    # (front.pxd: a typed view, for memcache.py's handlers)
        self.counters = counters           # CounterBlock
        self.my = counters.slot(index)
        self.latency = latency.Recorder(self.my, counters.column(latency.COUNTERS[0]))
        self.req_rings = req_rings          # [worker] -> Ring (we produce)
        self.resp_rings = resp_rings        # [worker] -> Ring (we consume)
        self.nworkers = len(req_rings)
        self.wake_fd = wake_fd
        self.control = control_sock
        self.listeners = listeners          # {"memcache": sock, "text": sock, "admin": sock}
        self.started_at = started_at
        self.clock = clock
        self.conns: dict[int, Conn] = {}
        # the connections with a socket, least recently read first: the client_timeout sweep
        # looks only at its front (`serve_listeners`), not at every connection (issue 8).
        # None without a client_timeout (a server setting, never reloaded): then no read pays
        # for the bookkeeping (a clock reading and a move_to_end, ~800 instructions).
        self.idle: OrderedDict[int, Conn] | None = \
            OrderedDict() if config.server.client_timeout else None
        self.next_conn = 1
        self.dirty_rings: set[int] = set()
        self.flush_scheduled = False
        self.down_workers: set[int] = set()
        self.loop = loop                     # the asyncio loop (tests pass a fake one)
        self.ctl_reader = control.Reader(control_sock) if control_sock is not None else None
        self.servers = []
        self.stopping = False
        self.write_pending: set[Conn] = set()
        self.spills = SpillTurns(self)          # connections with big replies to write, a slice per turn
        self.ring_waiters: set[Conn] = set()     # connections waiting for room in a request ring
        self.congested = False                   # some request ring holds over BACKLOG_LIMIT
        self.asm = [Reassembler() for _ in resp_rings]
        # (worker, ring) of the rings that exist: a worker's own front has none to that worker
        self.live_req = [(w, r) for w, r in enumerate(req_rings) if r is not None]
        self.live_resp = [(w, r) for w, r in enumerate(resp_rings) if r is not None]
        self.valid_names: set[str] = set()     # names already checked (cleared by use_config)
        self.item_limits = ItemLimits(self)    # queue -> max_item_size (cleared by use_config)
        self.owners: dict[str, int] = {}       # queue -> worker, a cache of placement
        self.settles = Settles(self)           # held reads written or not, for their owners (held.py)
        self.fused = FusedQueues(self)         # queue -> fused path allowed (cleared by use_config)
        self.routes = Routes(self)             # queue -> (owner, name as bytes) (fronts/routed.py)

    # -- routing ---------------------------------------------------------------------------------
    def owner(self, queue: str) -> int:
        w = self.owners.get(queue)
        if w is None:
            if len(self.owners) > 100_000:     # bounded: names are client-chosen
                self.owners.clear()
            w = self.owners[queue] = worker_of(queue, self.nworkers)
        return w

    def send(self, worker: int, conn_id: int, req: int, op: int, flags: int, queue: str | bytes,
             a: int = 0, b: int = 0, payload: bytes = b"") -> bool:
        """Queue a request on `worker`'s ring.  A queue name is a str inside a process (a worker
        serving its own client takes it as it is: local.py) and latin-1 bytes on a ring."""
        if worker in self.down_workers:
            return False
        if queue.__class__ is str:
            queue = queue.encode("latin-1")
        send(self.req_rings[worker], pack_req(conn_id, req, op, flags, len(queue), a, b) + queue,
             payload)
        self.dirty_rings.add(worker)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self.flush_rings)
        return True

    def note_routed(self, worker: int, conn_id: int) -> None:
        """A request of connection `conn_id` went to `worker` over its ring (a dedicated front's
        every request does: nothing to note; a worker's own front counts them, local.py)."""

    def ring_room(self, targets, conn: Conn) -> bool:
        """Whether the request rings to the workers of `targets` ((worker, request) pairs) hold
        no overflow.  If one does, `conn` is pumped again when the workers make room: a streamed
        body waits for its worker instead of piling up in this process."""
        for w, _ in targets:
            r = self.req_rings[w]
            if r is not None and r.backlog:
                self.ring_waiters.add(conn)
                return False
        return True

    def room_for_commands(self, conn: Conn) -> bool:
        """False while a worker lags so far that its ring's overflow passed BACKLOG_LIMIT
        messages; `conn` is pumped again when it has caught up.  What one connection's
        budget does not bound (noreply commands, many connections) is bounded here."""
        if self.congested:
            self.ring_waiters.add(conn)
            return False
        return True

    def flush_rings(self) -> None:
        if self.settles.due:        # held reads settled: with the requests (fronts/held.py)
            self.settles.ride(self.dirty_rings)
        self.flush_scheduled = False
        for w in self.dirty_rings:
            self.req_rings[w].publish()
        self.dirty_rings.clear()
        self.update_congestion()
        if self.ring_waiters:
            # the publish may have emptied an overflow without a space wakeup to come
            self.loop.call_soon(self.wake_ring_waiters)

    def update_congestion(self) -> None:
        self.congested = any(r.backlog > BACKLOG_LIMIT for _, r in self.live_req)

    def wake_ring_waiters(self) -> None:
        if self.ring_waiters:
            waiters, self.ring_waiters = self.ring_waiters, set()
            _pump_each(waiters)

    def on_wake(self) -> None:
        drain_eventfd(self.wake_fd)
        self.push_overflow()
        while True:
            self.drain_responses()
            if prepare_sleep_all(r for _, r in self.live_resp):
                break
        self.flush_writes()

    def push_overflow(self) -> None:
        for _, ring in self.live_req:
            if ring.backlog:             # space freed in a full ring: push the overflow on
                ring.publish()
        self.update_congestion()
        self.wake_ring_waiters()

    def drain_responses(self) -> None:
        """Hand every published response to its connection (the rings stay unflagged)."""
        conns = self.conns
        for w, ring in self.live_resp:
            ring.clear_sleep()
            if w in self.down_workers:
                continue
            asm = self.asm[w]
            while True:
                batch = ring.read_batch()
                if not batch:
                    break
                for rec in batch:
                    # a whole small message is the record itself: no call (messages.Reassembler)
                    msg = rec if asm.partial is None and len(rec) != FRAG_SIZE else asm.feed(rec)
                    if msg is None:
                        continue
                    conn_id, req, status, flags, _, value = unpack_resp(msg, 0)
                    c = conns.get(conn_id)
                    if c is not None:
                        fast = c.fast
                        if fast and fast[0][0] == req and not c.closing:    # on_response's first case
                            c.fast_reply(status, flags, msg[RESP_SIZE:], value)
                            continue
                        if c.on_response(req, status, flags, value, msg[RESP_SIZE:]):
                            continue
                    if flags & RF_HELD:             # nobody will write it: the item goes back
                        self.settles.add(w, value, abort=True)
                del batch
                ring.release()

    def flush_writes(self) -> None:
        """Pump every connection with replies to write (a fresh set takes those that must wait
        again while this one is walked; with one, it is taken out and the set stays: the
        common turn of one connection allocates nothing here)."""
        pending = self.write_pending
        if pending:
            if len(pending) == 1:
                c = pending.pop()
                c.pump()            # (compiled: a C call, `c` typed in front.pxd)
                return
            self.write_pending = set()
            for c in pending:
                c.pump()

    # -- control ---------------------------------------------------------------------------------
    def on_control(self) -> None:
        for msg in self.ctl_reader.read():
            cmd = msg.get("cmd")
            if cmd == "peer_down":
                self.worker_down(msg["peer"])
                control.send(self.control, {"cmd": "ack_down", "peer": msg["peer"], "front": self.index})
            elif cmd == "peer_up":
                self.down_workers.discard(msg["peer"])
                control.send(self.control, {"cmd": "ack_up", "peer": msg["peer"], "front": self.index})
                self.on_wake()
            elif cmd == "reload":
                if self.epoch.behind():      # else a client's batch made it catch up already
                    self.catch_up_config()
            elif cmd == "stop":
                self.begin_stop()
        if self.ctl_reader.eof and not self.stopping:
            log.warning("front %d: supervisor gone, exiting", self.index)
            self.begin_stop()

    def worker_down(self, w: int) -> None:
        """Worker `w` died: what it left unread is void, its requests in flight fail."""
        self.down_workers.add(w)
        self.req_rings[w].drop_backlog()   # its parts fail below: never deliver them later
        ring = self.resp_rings[w]
        ring.resync_consumer(discard=True)
        ring.prepare_sleep()       # resync cleared our flag: the new worker must signal us
        self.asm[w].reset()
        for c in list(self.conns.values()):
            c.worker_down(w)
        self.flush_writes()

    def reload_local(self) -> str | None:
        """Re-read the config file; on failure keep the old config and return why (the key and
        the reason, never the file's path: the reason may go to a client)."""
        at = self.epoch.start()
        try:
            config = reload_config(self.config)
        except ConfigError as e:
            self.epoch.loaded(at)
            log.error("front %d: reload failed: %s", self.index, e)
            return e.brief
        self.use_config(config)
        self.epoch.loaded(at)
        return None

    def catch_up_config(self) -> None:
        """Another process validated a reloaded file and may have answered "Reloaded config.":
        load it before parsing another request (Conn.data_received asks)."""
        self.reload_local()

    def use_config(self, config) -> None:
        """Serve `config` from now on: what was cached from the old one goes."""
        self.config = config
        self.valid_names.clear()
        self.item_limits.clear()
        self.fused.clear()

    def request_reload(self) -> str | None:
        """`reload` from a client: this front reloads now; if that worked, the caller sends every
        worker a reload through its ring (so the client's next command sees the new settings);
        the other fronts follow the bumped epoch before their next batch, and the supervisor's
        relay only reaches the idle ones.  Returns why it failed, or None."""
        at = self.epoch.start()
        err = self.reload_local()
        if err is None:
            self.epoch.publish(at)       # before any reply: every front follows from now on
            control.send(self.control, {"cmd": "reload_all", "front": self.index})
        return err

    def request_shutdown(self) -> None:
        self.loop.call_later(0.1, os.kill, os.getppid(), signal.SIGTERM)

    def begin_stop(self) -> None:
        if self.stopping:
            return
        self.stopping = True
        for s in self.servers:
            s.close()
        for c in list(self.conns.values()):
            c.answer_blocked_empty()         # waiters answer empty before they close (§5.10)
        self.flush_writes()
        self.loop.call_later(0.05, self.loop.stop)

    # -- stats -----------------------------------------------------------------------------------
    def global_stats(self, worker_globals: list[dict]) -> list[tuple[str, str]]:
        return global_stats(self.counters, self.started_at, self.clock.now_ms() / 1000.0,
                            worker_globals)


async def serve_listeners(front: Front) -> None:
    """Accept on the front's listeners and close connections idle for longer than
    client_timeout (a front process, or a worker serving its own clients: local.py)."""
    # imported here, not with the module: memcache.so cimports Front (memcache.pxd), so it
    # loads this module as it loads, before its own class exists
    from lanner.fronts.kinds import CONN_CLASSES
    loop = front.loop
    for kind, sock in front.listeners.items():
        cls = CONN_CLASSES[kind]
        srv = await loop.create_server(lambda cls=cls: cls(front), sock=sock, backlog=1024)
        front.servers.append(srv)
    timeout = front.config.server.client_timeout
    if timeout:
        loop.call_later(timeout / 1000.0, close_idle, front, timeout / 1000.0)


def close_idle(front: Front, timeout: float) -> None:
    """Close the connections that read nothing for `timeout` seconds, even with a blocking get
    waiting (reference §client_timeout: finagle's read timeout), then come back when the next
    one would be due.  `front.idle` is in order of last read, so this looks at the expired
    ones and one more, however many connections are open."""
    loop = front.loop
    now = loop.time()
    idle = front.idle
    due = timeout                       # none open: a new one expires no sooner than this
    while idle:
        c = next(iter(idle.values()))
        left = c.last_activity + timeout - now
        if left > 0:
            due = left
            break
        del idle[c.id]                  # closed: looked at once (connection_lost finds it gone)
        if c.transport is not None:
            c.transport.close()
    if not front.stopping:
        loop.call_later(max(due, 0.05), close_idle, front, timeout)


def _pump_each(conns: set) -> None:
    """Pump every connection of a set its owner has already swapped for an empty one, so a
    connection that must wait again can re-add itself while the loop runs."""
    for c in conns:
        c.pump()


def front_main(index, config, status, counters, req_rings, resp_rings, wake_fd, control_sock,
               listeners, started_at, clock, heart=None, epoch=None) -> int:
    """Entry point in the forked child."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    stop_asked = []
    signal.signal(signal.SIGTERM, lambda *_: stop_asked.append(1))     # until the loop hears it
    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    front = Front(index, config, status, counters, req_rings, resp_rings, wake_fd, control_sock,
                  listeners, started_at, clock, loop, epoch)
    for r in resp_rings:
        r.prepare_sleep()
    loop.add_reader(wake_fd, front.on_wake)
    loop.add_reader(control_sock.fileno(), front.on_control)

    loop.run_until_complete(serve_listeners(front))
    if heart is not None:
        def beat():      # the supervisor kills a front whose loop stops turning (heartbeat.py)
            heart.beat(clock.monotonic())
            loop.call_later(heart.interval, beat)
        beat()
    control.send(control_sock, {"cmd": "ready", "front": index})

    def hear_sigterm() -> None:
        """SIGTERM goes to the loop from inside this run, as a worker's (ShardLoop.hear_sigterm):
        one uvloop's handler took between the listeners' run and this one was never acted on
        (the front stopped 15 s late, killed)."""
        loop.add_signal_handler(signal.SIGTERM, front.begin_stop)
        if stop_asked:
            front.begin_stop()
    loop.call_soon(hear_sigterm)
    try:
        loop.run_forever()
    finally:
        for c in list(front.conns.values()):
            if c.transport is not None:
                c.transport.abort()
        front.flush_rings()
    return 0


if COMPILED:
    # interpreted readers (conn.py's def methods, the other protocols, tests) read Front's fields
    # as member descriptors (LOAD_ATTR_SLOT), not Cython's getsets (memcache_commands.pxd)
    _c_slot_fields(Front, Front.__slots__)
