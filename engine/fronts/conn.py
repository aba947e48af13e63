"""What every client connection of a front shares: the in-order reply queue, routing, flow control.

A connection parses its bytes into commands (protocols/), turns each into one or more
protocol-neutral requests (ipc/messages.py) for the worker that owns the queue, and writes the
replies back in request order: each command takes a `Slot` in the connection's reply queue,
filled when its response(s) arrive, and completed slots leave from the head.  A command that may
block (a get with `t=`, monitor, every thrift call) holds back the commands after it until it
completes, as Kestrel's serial per-connection processing does; everything else pipelines.
Commands that span workers (stats, flush_all, multi-key get, alias writes) send one part to each
worker and complete when every part has answered.

A protocol's connection class (memcache.py, text.py, thrift.py, admin.py) gives `Conn` its
parser and implements the two hooks `Conn` declares: `handle` and `unavailable`.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import TYPE_CHECKING

from lanner.fronts.counters import C_READ, C_WRITTEN
from lanner.fronts.flow import MAX_INFLIGHT, SMALL_REPLY, room_for
from lanner.fronts.held import HeldItems
from lanner.fronts.inline import InlineReplies
from lanner.fronts.lifecycle import Lifecycle
from lanner.fronts.routed import RoutedRequests
from lanner.fronts.servercmds import ServerCommands
from lanner.fronts.slots import Part, Slot, SlotQueue
from lanner.fronts.spill import REPLY_BUDGET, WRITE_CHUNK, WRITE_LOW, SpillWriter  # noqa: F401 (WRITE_LOW: tests)
from lanner.fronts.whitelists import Whitelists
from lanner.ops.latency import BY_TYPE, family_of
from lanner.protocols.memcache import MemcacheParser
from lanner.protocols.memcache_replies import END_TAIL, SPLICE_MIN
from lanner.queues.names import validate_queue_name
from lanner.ipc.messages import OP_DISCONNECT, OP_SET_DATA, R_ITEM, R_OK, RF_HELD, RF_MORE

#: Unparsed bytes a connection holds while it cannot take commands, before it stops reading.
INPUT_LIMIT = 64 << 10

#: deque's own methods, called with the deque (`fast`, memcache.py's handlers and fast_reply):
#: compiled, a call of a method descriptor, where `fast.append(x)` looked the method up on every
#: call (PyObject_VectorcallMethod, ~230 instructions; deque has no C API for Cython to call).
#: queues/queue.py does the same for its items (a front process does not load the queue).
_append = deque.append
_popleft = deque.popleft

#: Conn's C-typed fields (conn.pxd): t_in a double, the others Py_ssize_t; every other field
#: is an object.  Interpreted code reads and writes them as before, as int and float.
TYPED = ("t_in", "next_req", "id", "idle_room", "reply_size", "nslots")

if TYPE_CHECKING:                 # the loop imports the connection classes, not the reverse
    from lanner.fronts.front import Front

# COMPILED: as in memcache_commands.py (conn.pxd makes it a C constant in the compiled build,
# where memcache_commands.pxd's _c_slot_fields exists)
try:
    import cython
    COMPILED = cython.compiled
except ImportError:             # pure Python without Cython installed
    COMPILED = False


def expiry_at(ms: int) -> int:
    """An expiry computed from a client's relative or absolute time: never 0 (which means
    "no expiry") and never negative (an instant before the epoch is simply expired)."""
    return ms if ms > 0 else 1


class FrontBase:
    """What a connection reads of its front per request (`Front`'s first base, front.py): in the
    compiled build a C type declared here, in conn.pxd, so `Conn`'s methods read these fields
    as C struct members through a typed local (front.pxd cimports conn.pxd for `Conn`: conn.pxd
    cannot cimport `Front` back, a cycle at load).  Slots, set by Front.__init__."""
    __slots__ = ("epoch", "my", "latency", "conns", "idle", "loop", "write_pending", "congested")


class WorkerBase:
    """What a connection of a worker's own front (local.py) reads of that worker per request
    (`Worker`'s first base, server/worker.py): in the compiled build a C type declared in
    conn.pxd, as FrontBase, so data_received and the memcache handlers (memcache.pxd) read the
    turn's state and call the fused set/get through struct members, not generic lookups of a
    Python object's slots.  Slots, set by the worker."""
    __slots__ = ("turn_scheduled", "reads_left", "closed_conns", "replies", "inline_set",
                 "inline_get")


class ConnBase:
    """Conn's first base: empty, a C type in the compiled build (conn.pxd), where Cython wants
    a C type's first base to be one; the mixins after it stay Python classes with empty slots."""
    __slots__ = ()


class Conn(ConnBase, SlotQueue, InlineReplies, RoutedRequests, SpillWriter, HeldItems, ServerCommands,
           Whitelists, Lifecycle, asyncio.Protocol):
    """One client connection.  A subclass passes its protocol's parser (`feed(bytes)`, `next()`
    -> command or None, `buffered` -> bytes held), maybe its handler table and whether its bytes
    are counted, and implements `handle` and `unavailable`.

    Replies and the close.  Every reply takes its place in `slots`, in command order, and leaves
    from the head.  A reply that closes the connection (an error, `quit`) is a slot like any
    other: the commands before it are answered first, in order, then the error line is written,
    then the connection closes; no command after it is taken (`stopped`).

    Flow control.  The connection takes a command only while its unsent replies stay under
    REPLY_BUDGET: the transport's buffer, finished replies held behind an unfinished one
    (`held`), and the replies still in flight at the workers, estimated from the sizes replies
    have had so far (`reply_size`, pessimistic at first), with at most MAX_INFLIGHT in flight.
    While it cannot take commands the parser keeps what arrives, up to INPUT_LIMIT bytes; then
    the connection stops reading (the kernel's buffers and TCP push back on the client).
    A client that does not read its replies leaves them unsent (the transport's slice and the
    spill behind it, spill.py): past REPLY_BUDGET, `paused_writing` stops both taking commands
    and reading until they drain to WRITE_LOW.  A big reply leaves a slice per turn (spill.py).
    """

    # Per protocol, never set on a connection (`handlers` and `count_bytes`, read on every
    # turn, are slots: a class attribute read through an instance is a generic lookup):
    counts_connection = True     # curr/total_connections cover memcache, text and thrift
    conn_flags = 0               # thrift: F_THRIFT on every request (ipc/messages.py)

    # Slots, no instance dict: every read and method call on a connection (`pump`, `room`,
    # `fast_reply`: several per request) stays a specialised slot read or dict-less method
    # lookup whatever names other instances set (a dict's shared key table holds 30 names per
    # class, process-wide: a handoff's `adopted` or `moved` used to push connections past it),
    # and a misspelt attribute fails loudly (tests/engine/test_hot_layout.py).  The mixins
    # (InlineReplies ...) have empty slots; a subclass that keeps state adds its own.  In the
    # order of conn.pxd, where the order is the C struct's: what every request touches first.
    __slots__ = ("front", "parser", "out", "fast", "body", "stopped", "closing", "paused_writing",
                 "blocked", "held", "spilled", "wbusy", "worker", "batch", "cur_fam", "count_bytes",
                 "t_in", "next_req", "id", "idle_room", "reply_size", "nslots",
                 "handlers", "transport", "reading_paused", "refuse_reads", "refuse_writes",
                 "early", "unwritten", "touched", "local_bit", "batched",
                 "slots", "parts", "batch_of", "spill", "spill_queued", "local", "last_activity",
                 "adopted", "moving", "moved", "held_slots")

    def __init__(self, front: Front, parser, handlers: dict | None = None, count_bytes: bool = True):
        self.front = front
        self.parser = parser
        self.handlers = handlers       # command class -> handler(conn, cmd), else `handle` is called
        self.count_bytes = count_bytes     # bytes_read / bytes_written (not thrift's, §9.5)
        self.id = front.next_conn
        front.next_conn = (front.next_conn + 1) & 0xFFFFFFFF or 1
        self.transport = None
        self.slots: deque[Slot] = deque()
        self.nslots = 0                # len(slots): what the fused path's "no slot" tests read
        self.parts: dict[int, Part] = {}
        self.next_req = 1
        self.blocked: Slot | None = None
        self.stopped = False           # a closing reply is queued: take no further command
        self.closing = False           # the closing reply is out (or the peer left): close now
        self.out: list[bytes] = []
        self.held = 0                  # bytes of the slots' replies not yet handed to `out`
        self.reply_size = REPLY_BUDGET // 16     # running estimate of one reply's size
        self.idle_room = room_for(0, REPLY_BUDGET, self.reply_size)     # `room` with nothing out
        self.body: list[tuple[int, int]] | None = None    # while a streamed set body arrives:
                                       # the (worker, request) pairs its pieces go to
        self.touched = 0               # bitmask of workers this connection sent requests to
        self.paused_writing = False    # too much unsent: take no commands, read nothing
        self.spill: deque = deque()    # reply bytes waiting for the transport (spill.py)
        self.spilled = 0
        self.wbusy = False             # the transport still holds a slice
        self.spill_queued = False      # in the front's SpillTurns
        self.reading_paused = False
        self.cur_fam = -1              # latency family of the command being handled
        self.t_in = 0.0                # monotonic time of the last bytes read (latency start)
        # The fused local path (inline.py): requests this worker ran for the connection
        # without a Slot, oldest first, as (req, ok, render, call, latency family, t0); replies
        # that came back ahead of an older one (a write-behind held it) wait in `early`.
        self.fast: deque[tuple] = deque()
        self.early: dict[int, tuple] | None = None     # None while empty: a test of the
                                       # field, not of a dict's cold line, per reply (fast_reply)
        # Fused replies rendered as their requests ran (rendered.py): the entry still open for
        # this read and batch, the worker's reply list of that batch, and how many replies the
        # entries in `fast` hold beyond one each (flow control counts every reply in flight).
        self.batch: list | None = None
        self.batch_of: list | None = None
        self.batched = 0
        self.worker = getattr(front, "worker", None)      # a LocalFront's worker, else None
        self.local = getattr(front, "local", -1)          # that worker's index
        self.local_bit = 1 << self.local if self.local >= 0 else 0     # its bit in `touched`
        self.refuse_reads = False      # over connection_limit_refuse_reads when it connected
        self.refuse_writes = False     # over connection_limit_refuse_writes when it connected
        self.last_activity = 0.0       # loop time of its last read, with a client_timeout only
        self.adopted = False           # moved here from another worker: counted where it was accepted
        self.moving = False            # handed to another worker (no longer in this slot's open_here)
        self.moved = False             # ... which took it: its close here ends nothing (counters.py)
        self.held_slots: set | None = None    # slots with hold ids, not yet out of the queue (held.py)
        self.unwritten: list | None = None    # (worker, id) of replies handed out, not yet written

    # -- the protocol hooks ----------------------------------------------------------------------
    # (not abc.abstractmethod: a C type cannot have ABCMeta; a subclass without them fails at
    # its first command or failed worker, tests/fronts/test_conn_hooks.py)
    def handle(self, cmd) -> None:
        """Act on one command: reply at once (`reply_now`) or take a slot and send requests."""
        raise NotImplementedError("%s.handle" % type(self).__name__)

    def unavailable(self, slot: Slot, reason: str) -> None:
        """Make `slot` the protocol's availability error (a worker failed or restarted)."""
        raise NotImplementedError("%s.unavailable" % type(self).__name__)

    # -- asyncio callbacks -----------------------------------------------------------------------
    def data_received(self, data: bytes):
        f = self.front
        epoch = f.epoch
        if epoch.behind():              # a reload was answered somewhere: follow it first
            f.catch_up_config()
        if self.count_bytes:
            my = f.my                   # (compiled: `incr` a C call, conn.pxd)
            my.incr(C_READ, len(data))
        idle = f.idle
        if idle is not None:                     # client_timeout is on
            self.last_activity = f.loop.time()
            idle.move_to_end(self.id)            # least recently read first (front.close_idle)
        if COMPILED:
            self.t_in = _c_monotonic()      # (latency.pxd; a C double field, conn.pxd)
        else:
            self.t_in = time.monotonic()
        parser = self.parser
        if type(parser) is MemcacheParser:
            mp = parser                 # (compiled: `feed` a C call, as `next` in pump)
            mp.feed(data)
        else:
            parser.feed(data)
        w = self.worker
        if w is None or w.turn_scheduled or len(f.conns) != 1:
            # a read's rendered replies share its time (rendered.py); a quiet turn's read is its
            # batch's only one: its entries end with it
            self.batch = None
            self.pump()
            if w is not None and w.turn_scheduled:
                w.reads_left -= 1
                if not w.reads_left:       # a batch of TURN_READS connections (ShardLoop.cut_turn)
                    w.cut_turn()
            return
        # The worker's one connection: no other client's requests can join this turn's batch,
        # so it ends here, not in a call_soon handle (ShardLoop.end_turn; issue 8, per turn).
        w.turn_scheduled = True
        try:
            self.pump()
        finally:
            w.end_quiet_turn()

    # -- flow ------------------------------------------------------------------------------------
    def pump(self) -> None:
        """Write what is ready (so the budget sees it), take what commands the budget allows,
        write again, then read or not.  Taking commands is inline, not a method of its own:
        pump is its one caller, and a frame costs ~700 instructions, per turn (issue 8)."""
        if self.out:
            self.flush_out()
        parser = self.parser
        # memcache's parser (nearly every connection's) read as its C type, compiled: `next` a
        # C call, `buffered` two C reads of its fields (stream.pxd's _c_buffered), where the
        # others' are a method lookup and a descriptor call
        mp = parser if type(parser) is MemcacheParser else None
        buffered = parser.buffered if mp is None or not COMPILED else _c_buffered(mp)
        if buffered or self.body is not None:    # no bytes held: no command to take
            # Take commands while `room` allows; a handler that took the fused path returns
            # True: that used exactly the one reply in flight `room` counted, anything else
            # asks again.
            handlers = self.handlers
            next_command = parser.next if mp is None else None     # (bound once)
            room = self.room()
            while room:
                cmd = next_command() if mp is None else mp.next()
                if cmd is None:
                    # taken to the last whole command with room to spare: what is left (a
                    # part of one) cannot stop the reading below however big (update_reading)
                    buffered = 0
                    break
                kind = type(cmd)
                fam = dict.get(BY_TYPE, kind)       # (compiled: one C lookup)
                self.cur_fam = fam if fam is not None else family_of(cmd)
                if handlers is None:
                    self.handle(cmd)
                elif self.dispatch(handlers, kind, cmd) is True:
                    room -= 1
                    continue
                room = self.room()
            else:
                buffered = parser.buffered if mp is None or not COMPILED else _c_buffered(mp)
        if self.out or self.closing:
            self.flush_out()
        if self.reading_paused or self.stopped or self.paused_writing or buffered > INPUT_LIMIT:
            self.update_reading()      # else reading is on and stays on: the common case, no call

    def dispatch(self, handlers: dict, kind: type, cmd):
        """`cmd` to its handler in `handlers` (pump); what the handler returns.  A C method
        (conn.pxd), so that a protocol's connection can call its hot handlers as C calls
        (MemcacheConn.dispatch), where a handler from the table is a Python call."""
        return handlers[kind](self, cmd)

    def room(self) -> int:
        """How many more commands flow control (class doc) allows, each one more reply in flight."""
        if self.stopped:
            return 0
        if self.body is not None:      # a body's pieces go on whatever the budget, ring room permitting
            return 1 if self.front.ring_room(self.body, self) else 0
        if self.blocked is not None or self.paused_writing:
            return 0
        f = self.front
        if f.congested and not f.room_for_commands(self):
            return 0
        if not (self.nslots or self.fast or self.held or self.spilled or self.wbusy):
            # nothing in flight or unsent, the common case: `wbusy` (pause_writing, spill.py)
            # stands for a transport holding bytes, its high-water mark being 0
            # (connection_made), where asking it was a method call (~210 instructions)
            return self.idle_room
        t = self.transport
        return room_for(self.nslots + len(self.fast) + self.batched,
                        REPLY_BUDGET - self.held - self.spilled - (t.get_write_buffer_size() if t is not None else 0),
                        self.reply_size)

    def update_reading(self) -> None:
        want = not self.stopped and not self.paused_writing and \
            (self.parser.buffered <= INPUT_LIMIT or self.room() > 0)
        if want != self.reading_paused:
            return                     # reading already is as it should be
        t = self.transport
        if t is None or t.is_closing():
            return
        if want:
            self.reading_paused = False
            t.resume_reading()
        else:
            self.reading_paused = True
            t.pause_reading()

    def send_disconnects(self) -> None:
        """Tell every worker this connection touched that it is gone (once)."""
        f = self.front
        touched, self.touched = self.touched, 0
        w = 0
        while touched:
            if touched & 1:
                f.send(w, self.id, 0, OP_DISCONNECT, self.conn_flags, b"")
            touched >>= 1
            w += 1

    def read_refusal(self) -> str | None:
        """Why reads are refused on this connection right now (status or connection limit)."""
        return self._refusal("reads", self.refuse_reads, self.front.status.blocks_reads)

    def write_refusal(self) -> str | None:
        """Why writes are refused on this connection right now (status or connection limit)."""
        return self._refusal("writes", self.refuse_writes, self.front.status.blocks_writes)

    def _refusal(self, what: str, over_limit: bool, status_blocks) -> str | None:
        """The connection limit speaks first, then the server status."""
        if over_limit:
            return what + " refused: connection limit"
        if status_blocks():
            return "server is " + self.front.status.enforced()
        return None

    def close_with(self, reason: str | None, encode) -> bool:
        """With a reason, reply `encode(reason)` and close the connection; whether it did.  The
        connections' bad-name and refused-read/write checks all end this way."""
        if reason is None:
            return False
        self.reply_now(encode(reason), close=True)
        return True

    # -- streamed set bodies --------------------------------------------------------------------
    def begin_body(self, targets: list[tuple[int, int]]) -> None:
        """The pieces of the body just announced go to these (worker, request) pairs."""
        self.body = targets

    def body_piece(self, data: bytes, last: bool) -> None:
        f = self.front
        for w, req in self.body:
            f.send(w, self.id, req, OP_SET_DATA, 0, b"", 0, 0, data)
        if last:
            self.body = None

    def on_response(self, req: int, status: int, flags: int, value: int, payload) -> bool:
        """A worker's response to request `req`.  False when nobody takes it (the connection
        closes, or no longer waits for it): the caller, which knows the worker, then aborts
        the held read it carries (RF_HELD, held.py)."""
        fast = self.fast
        if fast and fast[0][0] == req:
            if self.closing:
                return False
            self.fast_reply(status, flags, payload, value)
            return True
        part = self.parts.pop(req, None)
        if part is None or self.closing:
            if part is None and fast and not self.closing and any(e[0] == req for e in fast):
                # a fast request's reply ahead of an older one's: keep it until that comes (a
                # batch's rendered replies, a list, as they are: rendered.py)
                if self.early is None:
                    self.early = {}
                self.early[req] = (status, flags, payload if payload.__class__ is list else
                                   bytes(payload) if payload else b"", value)
                return True
            return False
        slot = part.slot
        if flags & RF_MORE:                # more responses follow for this request
            self.parts[req] = part
            part.status, part.flags, part.value = status, flags, value
            if slot.stream is not None:
                data = slot.stream(slot, part, bytes(payload))
                if data:
                    if self.slots and self.slots[0] is slot and not self.fast:
                        self.out.append(data)
                    else:
                        slot.out += data
                        self.held += len(data)
                    self.front.write_pending.add(self)
            return True
        part.status, part.flags, part.value = status, flags, value
        part.payload = bytes(payload) if payload else b""
        part.done = True
        if flags & RF_HELD:
            self.hold(slot, part.worker, value)
        slot.remaining -= 1
        if slot.remaining == 0:
            self.complete(slot)
        return True

    def fast_reply(self, status: int, flags: int, payload, value: int = 0) -> None:
        """The reply of the oldest fused (inline.py) or routed (routed.py) request, then of any
        that came back before it.  A held read's id (RF_HELD, `value`) waits with the reply's
        bytes in `unwritten` (held.py).  Here, not in inline.py's mixin: in the compiled build
        it reads the connection's fields as a C type's (conn.pxd)."""
        fast = self.fast
        f = self.front
        out = self.out
        latency = f.latency
        pending = f.write_pending
        while True:
            _, ok, render, call, fam, t0, w = _popleft(fast)     # (_append)
            if ok is None:
                n = render(out, status, flags, payload, call)
            elif status == R_OK:                # a set's STORED
                out.append(ok)
                n = len(ok)
            elif status == R_ITEM and type(payload) is bytes and len(payload) < SPLICE_MIN:
                # a get's value: its VALUE line (`ok`: value_heads; `call`: the key as sent),
                # its own bytes and END, joined only with the turn's other output (flush_out)
                n = len(payload)
                head = _c_entry(ok, (call, n)) if COMPILED else ok[call, n]     # (conn.pxd)
                out += (head, payload, END_TAIL)
                n += len(head) + 7
            else:
                n = render(out, status, flags, payload, call)
            latency.since(fam, t0)
            if n < 0:                   # the reply closes the connection
                self.closing = self.stopped = True
                if self.early:
                    self.drop_early()
                fast.clear()
                self.batch = None
                self.batched = 0
                self.slots.clear()      # what was sent after the closing command goes unanswered
                self.nslots = 0
                self.held = 0
                pending.add(self)
                return
            if flags & RF_HELD:
                if self.unwritten is None:
                    self.unwritten = [(w, value)]
                else:
                    self.unwritten.append((w, value))
            if not (self.early and fast and fast[0][0] in self.early):
                break
            status, flags, payload, value = self.early.pop(fast[0][0])
            if not self.early:
                self.early = None
        # the last one's size is estimate enough; below SMALL_REPLY with full room it would
        # change nothing (Conn.note_reply), and skipping only keeps the estimate higher
        if n > SMALL_REPLY or self.idle_room != MAX_INFLIGHT:
            self.note_reply(n)
        if not fast and self.nslots:
            self.drain_slots()
        pending.add(self)

    def note_reply(self, n: int) -> None:
        """A reply of `n` bytes moves the running estimate flow control uses (class doc).  Fused
        replies (inline.py) count too: without them a connection that only sets and gets kept
        the first, pessimistic estimate and took 16 pipelined commands a turn, not 32."""
        size = self.reply_size
        size += (n - size) >> 3
        self.reply_size = size
        if size > SMALL_REPLY or self.idle_room != MAX_INFLIGHT:
            self.idle_room = room_for(0, REPLY_BUDGET, size)

    def drain_slots(self) -> None:
        if self.fast:
            return                      # inline requests taken before these slots answer first
        slots = self.slots
        while slots and slots[0].done:
            s = slots.popleft()
            self.nslots -= 1
            if s.holds is not None:
                self.held_out(s)
            if s.out:
                self.out.append(s.out)
                self.held -= len(s.out)
            if s.close:
                self.closing = self.stopped = True
                slots.clear()           # what was sent after the closing command goes unanswered
                self.nslots = 0
                self.held = 0
                break

    def flush_out(self) -> None:
        t = self.transport
        if self.closing and self.touched:
            # roll back open reads before the client can see the reply and reconnect
            self.send_disconnects()
            self.front.flush_rings()
        out = self.out
        if out and t is not None and not t.is_closing():
            data = out[0]
            n = len(data)
            if len(out) > 1:
                n = 0
                for piece in out:       # (compiled: a C loop, where sum(map(len, out)) looked up
                    n += len(piece)     # two builtins and called through them)
                if n <= WRITE_CHUNK:
                    data = b"".join(out)
            if self.count_bytes:
                f = self.front
                my = f.my               # (compiled: `incr` a C call, conn.pxd)
                my.incr(C_WRITTEN, n)
            if n > WRITE_CHUNK or self.spilled or self.wbusy:
                self.spill_out([data] if n <= WRITE_CHUNK else out)    # behind what waits: a slice per turn
            else:
                t.write(data)
        out.clear()
        if self.unwritten:
            self.held_written()
        if self.closing and not self.spilled and t is not None and not t.is_closing():
            t.close()

    # -- helpers for subclasses ------------------------------------------------------------------
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



if COMPILED:
    # interpreted readers (the mixins, subclasses, fronts, tests) read Conn's fields as member
    # descriptors (LOAD_ATTR_SLOT), not Cython's getsets (memcache_commands.pxd)
    _c_slot_fields(Conn, tuple(n for n in Conn.__slots__ if n not in TYPED))
    _c_member_fields(Conn, ("t_in",), T_DOUBLE)
    _c_member_fields(Conn, tuple(n for n in TYPED if n != "t_in"), T_PYSSIZET)
    _c_slot_fields(FrontBase, FrontBase.__slots__)
    _c_slot_fields(WorkerBase, WorkerBase.__slots__)
