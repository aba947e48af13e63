"""An in-process front for tests: the real Front and connection classes, real in-memory rings,
a fake transport per client (pymemcache's MockSocket idea), fake workers, a fake loop on an
injected clock.  Nothing forks, nothing listens, nothing sleeps.

    rig = Rig(tmp_path)
    c = rig.connect()                      # a MemcacheConn on a FakeTransport
    rig.worker(0).queues["jobs"].append(b"x")
    c.send(b"get jobs\\r\\n")
    rig.run()                              # until nothing moves: loop, workers, responses
    assert c.read() == b"VALUE jobs 0 1\\r\\nx\\r\\nEND\\r\\n"

`FakeTransport` keeps what the connection wrote as unread until the client calls `read`; past
SOCKET_BUFFER (what the kernel would take) it counts it as the transport's write buffer, so a
client that never reads drives the high-water mark as a real socket does.  A worker can `hold`
its requests (read but unanswered) to test reply order and the close rule.
"""
from __future__ import annotations

import heapq
import socket
from collections import defaultdict, deque
from dataclasses import dataclass, field

import msgpack

from lanner.clock import FakeClock
from lanner.config import Config
from lanner.fronts.counters import FRONT_COUNTERS
from lanner.fronts.front import Front
from lanner.fronts.memcache import MemcacheConn
from lanner.ipc import messages as m
from lanner.ipc.bodies import Bodies
from lanner.ipc.ring import Ring
from lanner.ipc.wake import WakeFd
from lanner.ipc.shm import CounterBlock
from lanner.server.status import ServerStatus

RING_CAPACITY = 1 << 20
READ_SIZE = 256 << 10          # what uvloop reads from a socket at most, per callback
SOCKET_BUFFER = 256 << 10      # unread bytes the kernel takes before the transport buffers any


class FakeLoop:
    """`call_soon`/`call_later`/`time` on a FakeClock; callbacks run only from `run_ready`."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.ready: deque = deque()
        self.timers: list = []
        self.seq = 0

    def time(self) -> float:
        return self.clock.monotonic()

    def call_soon(self, cb, *args) -> None:
        self.ready.append((cb, args))

    def call_later(self, delay: float, cb, *args) -> None:
        self.seq += 1
        heapq.heappush(self.timers, (self.time() + delay, self.seq, cb, args))

    def run_ready(self) -> bool:
        now = self.time()
        while self.timers and self.timers[0][0] <= now:
            _, _, cb, args = heapq.heappop(self.timers)
            self.ready.append((cb, args))
        ran = bool(self.ready)
        while self.ready:
            cb, args = self.ready.popleft()
            cb(*args)
        return ran


class FakeTransport:
    """The server side of one client socket."""

    def __init__(self, loop: FakeLoop) -> None:
        self.loop = loop
        self.protocol = None
        self.unread = bytearray()     # written by the server, not yet read by the client
        self.inbox = bytearray()      # sent by the client while reading was paused
        self.high = 64 << 10
        self.low = 16 << 10
        self.writing_paused = False
        self.reading = True
        self.closing = False
        self.lost = False
        self.written = 0
        self.max_unread = 0

    # -- the asyncio transport API the connections use ---------------------------------------
    def set_write_buffer_limits(self, high=None, low=None) -> None:
        self.high = high if high is not None else self.high
        self.low = low if low is not None else self.high // 4

    def get_write_buffer_size(self) -> int:
        return max(0, len(self.unread) - SOCKET_BUFFER)

    def write(self, data: bytes) -> None:
        assert not self.closing, "write after close"
        self.unread += data
        self.written += len(data)
        self.max_unread = max(self.max_unread, len(self.unread))
        if not self.writing_paused and self.get_write_buffer_size() > self.high:
            self.writing_paused = True
            self.protocol.pause_writing()

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True
        if self.inbox:
            self.loop.call_soon(self._deliver)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        if not self.closing:
            self.closing = True
            self.loop.call_soon(self._lose)

    abort = close

    def get_extra_info(self, name, default=None):
        return default

    # -- the client's side ------------------------------------------------------------------
    def _deliver(self) -> None:
        """One read of at most READ_SIZE bytes, as a real socket's; the rest on later turns."""
        if self.reading and self.inbox and not self.closing:
            data = bytes(self.inbox[:READ_SIZE])
            del self.inbox[:READ_SIZE]
            self.protocol.data_received(data)
            if self.inbox and self.reading:
                self.loop.call_soon(self._deliver)

    def _lose(self) -> None:
        if not self.lost:
            self.lost = True
            self.protocol.connection_lost(None)

    def send(self, data: bytes) -> None:
        """The client writes: delivered now if the server reads, else kept like kernel buffers."""
        if self.closing:
            return
        self.inbox += data
        if self.reading and len(self.inbox) == len(data):
            self._deliver()

    def read(self, n: int | None = None) -> bytes:
        """The client reads up to n bytes (all when None) of what the server wrote."""
        n = len(self.unread) if n is None else min(n, len(self.unread))
        data = bytes(self.unread[:n])
        del self.unread[:n]
        if self.writing_paused and self.get_write_buffer_size() <= self.low:
            self.writing_paused = False
            self.protocol.resume_writing()
        return data

    def hang_up(self) -> None:
        """The client closes its socket."""
        self.close()


@dataclass
class Request:
    conn: int
    req: int
    op: int
    flags: int
    queue: str
    a: int
    b: int
    payload: bytes


@dataclass
class FakeWorker:
    """A worker's ring ends and a dict-of-deques model of its queues: enough to answer
    set/get/peek/open/close/abort/confirm-less traffic and reload."""
    index: int
    inbound: Ring            # the front's request ring (we consume)
    outbound: Ring           # the front's response ring (we produce)
    queues: dict = field(default_factory=lambda: defaultdict(deque))
    opens: dict = field(default_factory=lambda: defaultdict(deque))     # conn -> [(queue, data)]
    seen: list = field(default_factory=list)
    held: list = field(default_factory=list)
    hold: bool = False       # read requests but leave them unanswered
    asleep: bool = False     # do not even read the ring (a busy or stuck worker)
    reload_error: str | None = None
    failures: dict = field(default_factory=dict)   # op -> (status, flags, payload) to answer
    disconnects: list = field(default_factory=list)

    def __post_init__(self) -> None:
        self.asm = m.Reassembler()
        self.bodies = Bodies()

    def step(self) -> bool:
        """Read every request; answer them unless holding.  True if anything was read."""
        if self.asleep:
            return False
        got = False
        while True:
            batch = self.inbound.read_batch()
            if not batch:
                break
            got = True
            for rec in batch:
                msg = self.asm.feed(rec)
                if msg is None:
                    continue
                conn, req, op, flags, qlen, a, b = m.unpack_req(msg, 0)
                queue = bytes(msg[m.REQ_SIZE:m.REQ_SIZE + qlen]).decode("latin-1")
                r = Request(conn, req, op, flags, queue, a, b, bytes(msg[m.REQ_SIZE + qlen:]))
                self.seen.append(r)
                self.held.append(r)
            del batch
            self.inbound.release()
        if not self.hold:
            self.release()
        return got

    def release(self, n: int | None = None) -> None:
        """Answer the held requests (the first n), in order."""
        todo = self.held if n is None else self.held[:n]
        self.held = self.held[len(todo):]
        for r in todo:
            self.answer(r)
        self.outbound.publish()

    def reply(self, r: Request, status: int, flags: int = 0, value: int = 0,
              payload: bytes = b"") -> None:
        m.send(self.outbound, m.pack_resp(r.conn, r.req, status, flags, 0, value), payload)

    def answer(self, r: Request) -> None:
        op = r.op
        if op in self.failures:
            status, flags, payload = self.failures[op]
            self.reply(r, status, flags, 0, payload)
            return
        if op == m.OP_SET:
            if r.flags & m.F_STREAM:
                self.bodies.begin(0, r.conn, r.req, r.queue, r.a, r.b, r.flags)
                return
            self.queues[r.queue].append(r.payload)
            if not r.flags & m.F_NOREPLY:
                self.reply(r, m.R_OK)
        elif op == m.OP_SET_DATA:
            whole = self.bodies.more(0, r.conn, r.req, r.payload)
            if whole is not None:
                queue, data, _expiry, flags = whole
                self.queues[queue].append(data)
                if not flags & m.F_NOREPLY:
                    self.reply(r, m.R_OK)
        elif op == m.OP_GET:
            self.get(r)
        elif op == m.OP_PUT_MANY:
            items = msgpack.unpackb(r.payload)
            self.queues[r.queue].extend(items)
            self.reply(r, m.R_VALUE, 0, len(items))
        elif op == m.OP_DISCONNECT:
            self.disconnects.append(r.conn)
            self.bodies.drop(0, r.conn)
            for queue, data in reversed(self.opens.pop(r.conn, ())):
                self.queues[queue].appendleft(data)
        elif op == m.OP_RELOAD:
            if self.reload_error is None:
                self.reply(r, m.R_OK)
            else:
                self.reply(r, m.R_SERVER_ERROR, 0, 0, self.reload_error.encode())
        elif op in (m.OP_DELETE, m.OP_FLUSH):
            self.queues.pop(r.queue, None)
            if not r.flags & m.F_NOREPLY:
                self.reply(r, m.R_OK)
        else:
            self.reply(r, m.R_CLIENT_ERROR, m.RF_CLOSE, 0, b"fake worker: unsupported op %d" % op)

    def get(self, r: Request) -> None:
        q = self.queues[r.queue]
        opens = self.opens[r.conn]
        if r.flags & m.F_ABORT:
            for i, (queue, data) in enumerate(opens):
                if queue == r.queue:
                    del opens[i]
                    q.appendleft(data)
                    break
            self.reply(r, m.R_EMPTY)
            return
        if r.flags & m.F_CLOSE:
            for i, (queue, _) in enumerate(opens):
                if queue == r.queue:
                    del opens[i]
                    break
            if not r.flags & m.F_OPEN:
                self.reply(r, m.R_EMPTY)
                return
        if not q:
            self.reply(r, m.R_EMPTY)
            return
        if r.flags & m.F_PEEK:
            self.reply(r, m.R_ITEM, 0, 0, q[0])
            return
        data = q.popleft()
        if r.flags & (m.F_OPEN | m.F_CONFIRM_ALL):
            opens.append((r.queue, data))
        self.reply(r, m.R_ITEM, 0, 0, data)


class Client:
    """A test's handle on one connection: its Conn and its FakeTransport."""

    def __init__(self, rig: "Rig", conn) -> None:
        self.rig = rig
        self.conn = conn
        self.transport: FakeTransport = conn.transport

    def send(self, data: bytes) -> None:
        self.transport.send(data)

    def read(self, n: int | None = None) -> bytes:
        return self.transport.read(n)

    @property
    def closed(self) -> bool:
        return self.transport.closing

    def ask(self, data: bytes) -> bytes:
        """Send, then read until the server has nothing more to write (a big reply comes a
        slice per turn: fronts/spill.py)."""
        self.send(data)
        self.rig.run()
        got = self.read()
        while True:
            self.rig.run()
            more = self.read()
            if not more:
                return got
            got += more


class Rig:
    """One front (index 0) with `nworkers` fake workers, all in this process."""

    def __init__(self, tmp_path, nworkers: int = 1, config: Config | None = None,
                 epoch=None) -> None:
        self.clock = FakeClock()
        self.loop = FakeLoop(self.clock)
        self.front_wake = WakeFd.create()
        self.worker_wake = WakeFd.create()
        self.req = [Ring.create(RING_CAPACITY, wake_fd=self.worker_wake, name=f"req{w}")
                    for w in range(nworkers)]
        self.resp = [Ring.create(RING_CAPACITY, wake_fd=self.front_wake, name=f"resp{w}")
                     for w in range(nworkers)]
        self.control, self.supervisor_end = socket.socketpair()
        self.counters = CounterBlock.create(1, FRONT_COUNTERS)
        self.status = ServerStatus.create(bytearray(ServerStatus.SIZE), str(tmp_path / "status"),
                                          "Up", self.clock)
        self.front = Front(0, config or Config(), self.status, self.counters, self.req, self.resp,
                           self.front_wake.fd, self.control, {}, self.clock.now_ms() / 1000.0,
                           self.clock, self.loop, epoch)
        for r in self.resp:
            r.prepare_sleep()
        self.workers = [FakeWorker(w, self.req[w], self.resp[w]) for w in range(nworkers)]

    def worker(self, w: int = 0) -> FakeWorker:
        return self.workers[w]

    def connect(self, cls=MemcacheConn) -> Client:
        conn = cls(self.front)
        t = FakeTransport(self.loop)
        t.protocol = conn
        conn.connection_made(t)
        return Client(self, conn)

    def run(self, limit: int = 100_000) -> None:
        """Turn the loop, the workers and the front's response handling until nothing moves."""
        for _ in range(limit):
            moved = self.loop.run_ready()
            for w in self.workers:
                moved = w.step() or moved
            self.front.on_wake()
            moved = self.loop.run_ready() or moved
            if not moved:
                return
        raise AssertionError("the rig never settled")

    def close(self) -> None:
        """Close the descriptors; the anonymous mappings go with the objects."""
        self.front_wake.close()
        self.worker_wake.close()
        self.control.close()
        self.supervisor_end.close()
