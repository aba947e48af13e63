"""A protocol front process: accepts clients, parses, routes to the owning worker.

Every front listens on the same inherited sockets (the supervisor binds them
before forking, so a port in use is a start-up error, not a child's) with
uvloop and `asyncio.Protocol`.  A connection parses its bytes into commands
(protocols/), turns each into one or more protocol-neutral requests
(messages.py) and writes them into the request ring of the worker that owns
the queue (placement.py).  Request rings are published once per loop
iteration; response rings are drained when the worker's eventfd fires.

Replies are written in request order per connection: each command takes a
`Slot` in the connection's reply queue, filled when its response(s) arrive,
and completed slots leave from the head.  A command that may block (a get
with `t=`, monitor) holds back the commands after it until it completes, as
Kestrel's serial per-connection processing does; everything else pipelines.
Commands that span workers (stats, flush_all, multi-key get, alias writes)
send one part to each worker and complete when every part has answered.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections import deque

import msgpack

from lanner.ipc import control
from lanner import __version__
from lanner.ipc.messages import (OP_DISCONNECT, OP_DUMP_CONFIG, OP_RELOAD, OP_STATS, R_DATA, R_SERVER_ERROR,
                       RF_CLOSE, RF_MORE, RESP_SIZE, Reassembler, pack_req, send, unpack_resp)
from lanner.config import validate_queue_name
from lanner.queues.placement import worker_of
from lanner.ipc.wake import prepare_sleep_all
from lanner.ops import latency
from lanner.ops.latency import family_of

log = logging.getLogger(__name__)

# front counters, one slot per front in the shared CounterBlock
FRONT_COUNTERS = ("curr_connections", "total_connections", "bytes_read", "bytes_written",
                  "cmd_get", "cmd_set", "cmd_peek") + latency.COUNTERS
C_CURR, C_TOTAL, C_READ, C_WRITTEN, C_GET, C_SET, C_PEEK = range(7)

GLOBAL_STAT_ORDER = ("uptime", "time", "version", "curr_items", "total_items", "bytes",
                     "reserved_memory_ratio", "curr_connections", "total_connections", "cmd_get",
                     "cmd_set", "cmd_peek", "get_hits", "get_misses", "bytes_read", "bytes_written",
                     "queue_creates", "queue_deletes", "queue_expires")


class Part:
    """One request sent to one worker on behalf of a slot."""
    __slots__ = ("slot", "index", "worker", "status", "flags", "value", "payload", "done")

    def __init__(self, slot, index, worker):
        self.slot = slot
        self.index = index
        self.worker = worker
        self.done = False
        self.status = self.flags = self.value = 0
        self.payload = b""


class Slot:
    """A place in a connection's in-order reply queue."""
    __slots__ = ("parts", "remaining", "out", "close", "finish", "stream", "blocking", "done", "call",
                 "fam", "t0")

    def __init__(self, finish=None, stream=None, blocking=False):
        self.parts: list[Part] = []
        self.remaining = 0
        self.out = b""
        self.close = False
        self.finish = finish      # finish(slot) -> None: builds slot.out from its parts
        self.stream = stream      # stream(slot, part) -> bytes: monitor items, written as they come
        self.blocking = blocking
        self.done = False
        self.fam = -1             # latency family (ops/latency.py); -1: not measured


class Front:
    def __init__(self, index, config, status, counters, req_rings, resp_rings, wake_fd, control_sock,
                 listeners, started_at: float, clock):
        self.index = index
        self.config = config
        self.status = status
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
        self.conns: dict[int, object] = {}
        self.next_conn = 1
        self.dirty_rings: set[int] = set()
        self.flush_scheduled = False
        self.down_workers: set[int] = set()
        self.loop = None
        self.servers = []
        self.stopping = False
        self.write_pending: set = set()
        self.asm = [Reassembler() for _ in resp_rings]
        self.valid_names: set[str] = set()     # names already checked (cleared on reload)
        self.owners: dict[str, int] = {}       # queue -> worker, a cache of placement

    # -- routing ---------------------------------------------------------------------------------
    def owner(self, queue: str) -> int:
        w = self.owners.get(queue)
        if w is None:
            if len(self.owners) > 100_000:     # bounded: names are client-chosen
                self.owners.clear()
            w = self.owners[queue] = worker_of(queue, self.nworkers)
        return w

    def send(self, worker: int, conn_id: int, req: int, op: int, flags: int, queue: bytes,
             a: int = 0, b: int = 0, payload: bytes = b"") -> bool:
        if worker in self.down_workers:
            return False
        send(self.req_rings[worker], pack_req(conn_id, req, op, flags, len(queue), a, b) + queue,
             payload)
        self.dirty_rings.add(worker)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self.flush_rings)
        return True

    def flush_rings(self) -> None:
        self.flush_scheduled = False
        for w in self.dirty_rings:
            self.req_rings[w].publish()
        self.dirty_rings.clear()

    def on_wake(self) -> None:
        try:
            os.eventfd_read(self.wake_fd)
        except BlockingIOError:
            pass
        for w, ring in enumerate(self.req_rings):
            if ring.backlog:             # space freed in a full ring: push the overflow on
                ring.publish()
        conns = self.conns
        while True:
            for w, ring in enumerate(self.resp_rings):
                ring.clear_sleep()
                if w in self.down_workers:
                    continue
                asm = self.asm[w]
                while True:
                    batch = ring.read_batch()
                    if not batch:
                        break
                    for rec in batch:
                        msg = asm.feed(rec)
                        if msg is None:
                            continue
                        conn_id, req, status, flags, _, value = unpack_resp(msg, 0)
                        c = conns.get(conn_id)
                        if c is not None:
                            c.on_response(req, status, flags, value, msg[RESP_SIZE:])
                    del batch
                    ring.release()
            if prepare_sleep_all(self.resp_rings):
                break
        self.flush_writes()

    def flush_writes(self) -> None:
        if self.write_pending:
            pending, self.write_pending = self.write_pending, set()
            for c in pending:
                c.flush_out()

    # -- control ---------------------------------------------------------------------------------
    def on_control(self) -> None:
        for msg in self.ctl_reader.read():
            cmd = msg.get("cmd")
            if cmd == "peer_down":
                w = msg["peer"]
                self.down_workers.add(w)
                self.req_rings[w].drop_backlog()   # its parts fail below: never deliver them later
                ring = self.resp_rings[w]
                ring.resync_consumer(discard=True)
                ring.prepare_sleep()       # resync cleared our flag: the new worker must signal us
                self.asm[w].reset()
                for c in list(self.conns.values()):
                    c.worker_down(w)
                self.flush_writes()
                control.send(self.control, {"cmd": "ack_down", "peer": w, "front": self.index})
            elif cmd == "peer_up":
                self.down_workers.discard(msg["peer"])
                self.on_wake()
            elif cmd == "reload":
                self.reload_local()
            elif cmd == "stop":
                self.begin_stop()
        if self.ctl_reader.eof and not self.stopping:
            log.warning("front %d: supervisor gone, exiting", self.index)
            self.begin_stop()

    def reload_local(self) -> None:
        from lanner.config import ConfigError, reload_config
        try:
            self.config = reload_config(self.config)
        except ConfigError as e:
            log.error("front %d: reload failed: %s", self.index, e)
            return
        self.valid_names.clear()

    def request_reload(self) -> None:
        """`reload` from a client: this front reloads now, every worker reloads through its ring
        (so the client's next command sees the new settings), the supervisor tells the others."""
        self.reload_local()
        control.send(self.control, {"cmd": "reload_all", "front": self.index})

    def request_shutdown(self) -> None:
        self.loop.call_later(0.1, os.kill, os.getppid(), signal.SIGTERM)

    def begin_stop(self) -> None:
        if self.stopping:
            return
        self.stopping = True
        for s in self.servers:
            s.close()
        self.loop.call_later(0.05, self.loop.stop)

    # -- stats -----------------------------------------------------------------------------------
    def global_stats(self, worker_globals: list[dict]) -> list[tuple[str, str]]:
        def wsum(key):
            return sum(g.get(key, 0) for g in worker_globals)
        import psutil
        reserved = wsum("reserved_memory")
        ratio = reserved / psutil.virtual_memory().total
        now = time.time()
        vals = {
            "uptime": int(now - self.started_at),
            "time": int(now),
            "version": __version__,
            "curr_items": wsum("curr_items"),
            "total_items": wsum("total_items"),
            "bytes": wsum("bytes"),
            "reserved_memory_ratio": f"{ratio:.3f}",
            "curr_connections": self.counters.total(C_CURR),
            "total_connections": self.counters.total(C_TOTAL),
            "cmd_get": self.counters.total(C_GET),
            "cmd_set": self.counters.total(C_SET),
            "cmd_peek": self.counters.total(C_PEEK),
            "get_hits": wsum("get_hits"),
            "get_misses": wsum("get_misses"),
            "bytes_read": self.counters.total(C_READ),
            "bytes_written": self.counters.total(C_WRITTEN),
            "queue_creates": wsum("queue_creates"),
            "queue_deletes": wsum("queue_deletes"),
            "queue_expires": wsum("queue_expires"),
        }
        return [(k, str(vals[k])) for k in GLOBAL_STAT_ORDER]


def expiry_at(ms: int) -> int:
    """An expiry computed from a client's relative or absolute time: never 0 (which means
    "no expiry") and never negative (an instant before the epoch is simply expired)."""
    return ms if ms > 0 else 1


class BaseConn(asyncio.Protocol):
    """What every client connection shares: ids, the reply queue, routing, flow control.

    A protocol's connection class adds `feed(data)` (into its parser), `next_command()`,
    `handle(command)` and `unavailable(slot, reason)` (its availability error)."""

    count_bytes = True           # bytes_read / bytes_written (thrift is not counted, §9.5)
    counts_connection = True     # curr/total_connections cover memcache, text and thrift
    disconnect_flags = 0         # thrift: F_THRIFT, its open reads outlive the connection

    def __init__(self, front: Front):
        self.front = front
        self.id = front.next_conn
        front.next_conn = (front.next_conn + 1) & 0xFFFFFFFF or 1
        self.transport = None
        self.slots: deque[Slot] = deque()
        self.parts: dict[int, Part] = {}
        self.next_req = 1
        self.blocked: Slot | None = None
        self.closing = False
        self.out: list[bytes] = []
        self.touched = 0               # bitmask of workers this connection sent requests to
        self.refuse_reads = False
        self.refuse_writes = False
        self.paused_writing = False
        self.reading_paused = False
        self.last_activity = 0.0
        self.cur_fam = -1              # latency family of the command being handled
        self.t_in = 0.0                # monotonic time of the last bytes read (latency start)

    # -- asyncio callbacks -----------------------------------------------------------------------
    def connection_made(self, transport):
        self.transport = transport
        f = self.front
        f.conns[self.id] = self
        if self.counts_connection:
            f.my.incr(C_CURR)
            f.my.incr(C_TOTAL)
        sessions = f.counters.total(C_CURR)
        srv = f.config.server
        if srv.connection_limit_refuse_writes is not None and sessions > srv.connection_limit_refuse_writes:
            self.refuse_writes = True
        if srv.connection_limit_refuse_reads is not None and sessions > srv.connection_limit_refuse_reads:
            self.refuse_reads = True
        self.last_activity = f.loop.time()
        if log.isEnabledFor(logging.DEBUG):
            log.debug("front %d: %s connection %d from %s", f.index, type(self).__name__, self.id,
                      transport.get_extra_info("peername"))
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                import socket as _s
                sock.setsockopt(_s.IPPROTO_TCP, _s.TCP_NODELAY, 1)
            except OSError:
                pass

    def data_received(self, data: bytes):
        f = self.front
        if self.count_bytes:
            f.my.incr(C_READ, len(data))
        self.last_activity = f.loop.time()
        self.t_in = time.monotonic()
        self.feed(data)
        self.process()
        self.flush_out()

    def connection_lost(self, exc):
        f = self.front
        self.closing = True
        f.conns.pop(self.id, None)
        if self.counts_connection:
            f.my.decr(C_CURR)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("front %d: connection %d closed (%s)", f.index, self.id, exc or "clean")
        self.send_disconnects()
        self.slots.clear()
        self.parts.clear()

    def send_disconnects(self) -> None:
        """Tell every worker this connection touched that it is gone (once)."""
        f = self.front
        touched, self.touched = self.touched, 0
        w = 0
        while touched:
            if touched & 1:
                f.send(w, self.id, 0, OP_DISCONNECT, self.disconnect_flags, b"")
            touched >>= 1
            w += 1

    def read_refusal(self) -> str | None:
        """Why reads are refused on this connection right now (status or connection limit)."""
        if self.refuse_reads:
            return "reads refused: connection limit"
        if self.front.status.blocks_reads():
            return "server is " + self.front.status.enforced()
        return None

    def write_refusal(self) -> str | None:
        if self.refuse_writes:
            return "writes refused: connection limit"
        if self.front.status.blocks_writes():
            return "server is " + self.front.status.enforced()
        return None

    def pause_writing(self):
        self.paused_writing = True
        if not self.reading_paused:
            self.reading_paused = True
            self.transport.pause_reading()

    def resume_writing(self):
        self.paused_writing = False
        if self.reading_paused and self.blocked is None:
            self.reading_paused = False
            self.transport.resume_reading()
        self.process()
        self.flush_out()

    # -- command processing ----------------------------------------------------------------------
    def process(self) -> None:
        while self.blocked is None and not self.closing and not self.paused_writing:
            cmd = self.next_command()
            if cmd is None:
                return
            self.cur_fam = family_of(cmd)
            self.handle(cmd)

    def new_slot(self, finish=None, stream=None, blocking=False) -> Slot:
        s = Slot(finish, stream, blocking)
        s.fam = self.cur_fam
        s.t0 = self.t_in
        self.slots.append(s)
        return s

    def reply_now(self, data: bytes, close: bool = False) -> None:
        """A reply that needs no worker."""
        s = Slot()
        s.out = data
        s.close = close
        s.done = True
        self.slots.append(s)
        self.front.latency.observe(self.cur_fam, time.monotonic() - self.t_in)
        self.drain_slots()
        if close:
            self.closing = True

    def request(self, slot: Slot, worker: int, op: int, flags: int, queue: bytes, a=0, b=0,
                payload: bytes = b"") -> Part:
        req = self.next_req
        self.next_req = (req + 1) & 0xFFFFFFFF or 1
        part = Part(slot, len(slot.parts), worker)
        slot.parts.append(part)
        slot.remaining += 1
        self.touched |= 1 << worker
        if self.front.send(worker, self.id, req, op, flags, queue, a, b, payload):
            self.parts[req] = part
        else:
            part.status = R_SERVER_ERROR
            part.payload = b"worker %d is restarting" % worker
            part.done = True
            slot.remaining -= 1
        return part

    def seal(self, slot: Slot) -> None:
        """All parts are sent: complete now if they all failed fast, else maybe block."""
        if slot.remaining == 0:
            self.complete(slot)
        elif slot.blocking:
            self.blocked = slot

    def on_response(self, req: int, status: int, flags: int, value: int, payload) -> None:
        part = self.parts.get(req)
        if part is None:
            return
        slot = part.slot
        if flags & RF_MORE:
            part.status, part.flags, part.value = status, flags, value
            if slot.stream is not None:
                data = slot.stream(slot, part, bytes(payload))
                if data:
                    slot.out += data
                    if self.slots and self.slots[0] is slot:
                        self.out.append(slot.out)
                        slot.out = b""
                        self.front.write_pending.add(self)
            return
        del self.parts[req]
        part.status, part.flags, part.value = status, flags, value
        part.payload = bytes(payload) if payload else b""
        part.done = True
        slot.remaining -= 1
        if slot.remaining == 0:
            self.complete(slot)

    def complete(self, slot: Slot) -> None:
        if slot.finish is not None:
            slot.finish(slot)
            slot.finish = None
        slot.parts.clear()      # parts point back at their slot: free them by refcount, not GC
        slot.done = True
        if slot.fam >= 0:
            self.front.latency.observe(slot.fam, time.monotonic() - slot.t0)
        if self.blocked is slot:
            self.blocked = None
            if self.reading_paused and not self.paused_writing:
                self.reading_paused = False
                self.transport.resume_reading()
            self.drain_slots()
            self.process()
        else:
            self.drain_slots()
        self.front.write_pending.add(self)

    def drain_slots(self) -> None:
        slots = self.slots
        while slots and slots[0].done:
            s = slots.popleft()
            if s.out:
                self.out.append(s.out)
            if s.close:
                self.closing = True
                slots.clear()
                break

    def flush_out(self) -> None:
        if self.closing and self.touched:
            # roll back open reads before the client can see the reply and reconnect
            self.send_disconnects()
            self.front.flush_rings()
        if self.out and self.transport is not None and not self.transport.is_closing():
            data = b"".join(self.out) if len(self.out) > 1 else self.out[0]
            self.out.clear()
            if self.count_bytes:
                self.front.my.incr(C_WRITTEN, len(data))
            self.transport.write(data)
        else:
            self.out.clear()
        if self.closing and self.transport is not None and not self.transport.is_closing():
            self.send_disconnects()
            self.front.flush_rings()
            self.transport.close()

    def worker_down(self, w: int) -> None:
        failed = [req for req, p in self.parts.items() if p.worker == w]
        for req in failed:
            self.on_response(req, R_SERVER_ERROR, RF_CLOSE, 0, b"worker %d restarted" % w)
        if failed:
            self.front.write_pending.add(self)
        self.touched &= ~(1 << w)

    # -- helpers for subclasses ------------------------------------------------------------------
    def broadcast(self, slot: Slot, op: int, payload: bytes = b"", flags: int = 0) -> None:
        for w in range(self.front.nworkers):
            self.request(slot, w, op, flags, b"", 0, 0, payload)
        self.seal(slot)

    def check_name(self, queue: str) -> str | None:
        """Why a queue name is illegal, or None.  Cmdlog-stored queues may contain dots."""
        f = self.front
        if queue in f.valid_names:
            return None
        cfg = f.config
        try:
            validate_queue_name(queue, allow_dots=cfg.queue_config(queue).storage == "cmdlog")
        except ValueError as e:
            return str(e)
        if len(f.valid_names) > 100_000:      # bounded: names are client-chosen
            f.valid_names.clear()
        f.valid_names.add(queue)
        return None

    def stats_slot(self, finish_bytes, names=None) -> None:
        """Ask every worker (or the owners of `names`) for stats and let finish_bytes format them."""
        f = self.front

        def finish(slot):
            worker_globals, queues = [], {}
            err = None
            for p in slot.parts:
                if p.status != R_DATA:
                    err = p
                    continue
                d = msgpack.unpackb(p.payload)
                if "global" in d:
                    worker_globals.append(d["global"])
                for name, st in d["queues"]:
                    queues[name] = st
            if err is not None:
                self.unavailable(slot, err.payload.decode("latin-1", "replace") or "worker unavailable")
                return
            slot.out = finish_bytes(f.global_stats(worker_globals), queues)

        slot = self.new_slot(finish)
        if names is None:
            self.broadcast(slot, OP_STATS)
            return
        by_worker: dict[int, list[str]] = {}
        for n in names:
            by_worker.setdefault(f.owner(n), []).append(n)
        for w, ns in by_worker.items():
            self.request(slot, w, OP_STATS, 0, b"", 0, 0, msgpack.packb(ns))
        self.seal(slot)

    def config_slot(self, finish_bytes) -> None:
        def finish(slot):
            entries = []
            for p in slot.parts:
                if p.status == R_DATA:
                    entries.extend(msgpack.unpackb(p.payload))
            slot.out = finish_bytes(sorted(entries))
        slot = self.new_slot(finish)
        self.broadcast(slot, OP_DUMP_CONFIG)

    def reload_slot(self, reply: bytes) -> None:
        self.front.request_reload()

        def finish(slot):
            slot.out = reply
        slot = self.new_slot(finish)
        self.broadcast(slot, OP_RELOAD)


def front_main(index, config, status, counters, req_rings, resp_rings, wake_fd, control_sock,
               listeners, started_at, clock, heart=None) -> int:
    """Entry point in the forked child."""
    import uvloop
    from lanner.fronts.admin import AdminConn
    from lanner.fronts.memcache import MemcacheConn
    from lanner.fronts.text import TextConn
    from lanner.fronts.thrift import ThriftConn
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    front = Front(index, config, status, counters, req_rings, resp_rings, wake_fd, control_sock,
                  listeners, started_at, clock)
    front.loop = loop
    front.ctl_reader = control.Reader(control_sock)
    loop.add_signal_handler(signal.SIGTERM, front.begin_stop)
    for r in resp_rings:
        r.prepare_sleep()
    loop.add_reader(wake_fd, front.on_wake)
    loop.add_reader(control_sock.fileno(), front.on_control)
    kinds = {"memcache": MemcacheConn, "text": TextConn, "admin": AdminConn, "thrift": ThriftConn}

    async def start():
        for kind, sock in listeners.items():
            cls = kinds[kind]
            srv = await loop.create_server(lambda cls=cls: cls(front), sock=sock, backlog=1024)
            front.servers.append(srv)
    loop.run_until_complete(start())
    timeout = config.server.client_timeout
    if timeout:
        def sweep():
            limit = loop.time() - timeout / 1000.0
            for c in list(front.conns.values()):
                if c.last_activity < limit and c.transport is not None:
                    c.transport.close()
            if not front.stopping:
                loop.call_later(max(timeout / 4000.0, 0.05), sweep)
        loop.call_later(max(timeout / 4000.0, 0.05), sweep)
    if heart is not None:
        def beat():      # the supervisor kills a front whose loop stops turning (heartbeat.py)
            heart.beat(clock.monotonic())
            loop.call_later(heart.interval, beat)
        beat()
    control.send(control_sock, {"cmd": "ready", "front": index})
    try:
        loop.run_forever()
    finally:
        for c in list(front.conns.values()):
            if c.transport is not None:
                c.transport.abort()
        front.flush_rings()
    return 0
