"""The front inside a worker: the worker serves clients, and requests for its own queues run inline.

Seastar's shard-per-core shape.  With worker_fronts (the default) every worker also
accepts on the shared listeners (its own SO_REUSEPORT socket, front slot
F + w after the F dedicated fronts) and runs the same connection classes as a
front process, in the worker's one uvloop loop.  A request for a queue this worker
owns never crosses a process: `LocalFront.send` hands it straight to
`Worker.local_request`, which runs it against the collection at once; its reply
joins the worker's batch and reaches the connection in `deliver` after the batch's
journal write (or group fsync), exactly as a ring reply would.  Requests for other
workers' queues, and the parts of fan-out commands (stats, flush_all, multi-key
get, alias writes) that other workers own, go over this front slot's rings as
from any front; their responses arrive on the worker's wake eventfd, which the
slot's response rings share.

The fused path: a memcache set or plain get for an own queue, on a connection with no reply
slot queued, skips even `send`: the connection calls Worker.inline_set / inline_get itself
(fronts/inline.py) and `deliver` hands the reply straight back to it.

Why inline and not a ring to itself: a request that stays in the process pays no
record copy, no wakeup and no second loop turn; per request that was most of the
cost of the process split (issue 8).

Connection affinity.  SO_REUSEPORT picks the accepting worker at random, so a
client that uses one queue usually starts on the wrong worker.  When a
connection's last HANDOFF_AFTER requests all went to one other worker, it has
touched no other worker, and nothing is in flight for it (no reply owed, nothing
unwritten, its parser between commands), this front hands the connection itself
to that worker: reading stops, the socket's fd goes over the handoff channel
(ipc/handoff.py) and an OP_HANDOFF request with the unparsed input follows on the
ring, behind every earlier request of the connection.  The adopter moves the
connection's open reads to its own front slot, wraps the fd in a new connection
of the same protocol and answers R_OK; only then does this front close its
descriptor, without the disconnect that would roll the open reads back.  If the
adopter dies first, the connection is closed after an error line (the client sees
an error, never a silence or a reply from the wrong place); if it declines, reading
resumes here.  Blocking gets and monitors are never moved while they wait: they
are requests in flight.
"""
from __future__ import annotations

import logging
import os
import socket

from lanner.fronts.counters import C_CURR, C_HANDOFFS, C_HERE, C_ROUTED
from lanner.fronts.front import Front
from lanner.ipc import handoff
from lanner.ipc.messages import (OP_DISCONNECT, OP_DUMP_CONFIG, OP_FLUSH_ALL, OP_FLUSH_ALL_EXPIRED,
                                 OP_HANDOFF, OP_RELOAD, OP_STATS, R_ERROR, R_OK, R_SERVER_ERROR, RF_HELD,
                                 unpack_resp)

log = logging.getLogger(__name__)

# COMPILED: as in memcache_commands.py (local.pxd makes it a C constant in the compiled build,
# where memcache_commands.pxd's _c_slot_fields exists)
try:
    import cython
    COMPILED = cython.compiled
except ImportError:             # pure Python without Cython installed
    COMPILED = False

# the parts of commands sent to every worker say nothing about where a connection belongs
FANOUT_OPS = frozenset((OP_STATS, OP_FLUSH_ALL, OP_FLUSH_ALL_EXPIRED, OP_DUMP_CONFIG, OP_RELOAD))
HANDOFF_AFTER = 2             # consecutive requests to one other worker before the connection moves
MAX_UNPARSED = 1 << 16        # a connection holding more unparsed input stays until it has less


def movable_classes() -> tuple:
    """The connection classes that can move (fronts/kinds.py), loaded at the first handoff:
    memcache.so cimports LocalFront (memcache.pxd), so it loads this module as it loads."""
    from lanner.fronts.kinds import MOVABLE
    return MOVABLE


class LocalFront(Front):
    """A front whose own worker is this process: `send` to it is a call, not a ring write."""

    __slots__ = ("worker", "local", "first_slot", "channels", "streak", "candidates", "handoff_seq",
                 "receive_ends", "inline_requests")

    def __init__(self, worker, slot, config, status, counters, req_rings, resp_rings, wake_fd,
                 control_sock, listeners, started_at, clock, channels=None):
        super().__init__(slot, config, status, counters, req_rings, resp_rings, wake_fd, control_sock,
                         listeners, started_at, clock, None,      # the loop: open_loop sets it
                         worker.epoch)                           # one view per process
        self.worker = worker
        self.local = worker.index
        self.first_slot = slot - worker.index      # front slot of worker 0's own front
        self.channels = channels    # handoff send end per worker (None: connections never move)
        self.streak: dict[int, list] = {}         # conn id -> [other worker, requests in a row]
        self.candidates: set[int] = set()          # conn ids that earned a move
        self.handoff_seq = 0
        self.receive_ends = None    # every worker's handoff receive end (attach_front)
        self.inline_requests = 0    # requests its connections ran by the fused path (MemcacheConn.store, on_get)

    def catch_up_config(self) -> None:
        """The whole worker follows a reload answered elsewhere: its queues and this front."""
        self.worker.reload()

    def send(self, worker: int, conn_id: int, req: int, op: int, flags: int, queue: str | bytes,
             a: int = 0, b: int = 0, payload: bytes = b"") -> bool:
        streak = self.streak
        if worker == self.local:
            if streak:
                streak.pop(conn_id, None)
            self.worker.local_request(self.index, conn_id, req, op, flags, queue, a, b, payload)
            return True
        if op == OP_DISCONNECT:
            streak.pop(conn_id, None)
        elif op != OP_HANDOFF:
            if op in FANOUT_OPS:           # a command for every worker: no worker to move to
                self.my.incr(C_ROUTED)
                streak.pop(conn_id, None)
            else:
                self.note_routed(worker, conn_id)
        return Front.send(self, worker, conn_id, req, op, flags, queue, a, b, payload)

    def note_routed(self, worker: int, conn_id: int) -> None:
        """A request of connection `conn_id` went to `worker` (`send`, or a routed request
        without a Slot: fronts/routed.py): counted, and a step towards handing it over."""
        self.my.incr(C_ROUTED)
        streak = self.streak
        st = streak.get(conn_id)
        if st is None or st[0] != worker:
            streak[conn_id] = [worker, 1]
        else:
            st[1] += 1
            if st[1] >= HANDOFF_AFTER and self.channels is not None:
                self.candidates.add(conn_id)

    # -- handing connections to the worker they use -----------------------------------------------
    def try_handoffs(self) -> None:
        """At the end of a turn (replies written): move the candidates that are idle now."""
        for cid in list(self.candidates):
            c = self.conns.get(cid)
            st = self.streak.get(cid)
            if c is None or st is None or st[1] < HANDOFF_AFTER:
                self.candidates.discard(cid)
                continue
            if c.slots or c.fast or c.parts or c.out or c.held or c.spilled:
                continue                   # a reply is owed: look again when it has left
            self.candidates.discard(cid)
            w = st[0]
            unparsed = self.movable(c, w)
            if unparsed is not None:
                self.hand_off(c, w, unparsed)

    def movable(self, c, w: int) -> bytes | None:
        """The unparsed input to carry if `c` can move to worker `w` now, else None."""
        t = c.transport
        touched = c.touched
        if touched & (1 << self.local) and not self.worker.holds(self.index, c.id):
            touched &= ~(1 << self.local)      # e.g. a `stats` long ago: nothing of it is here
        if (not isinstance(c, movable_classes()) or c.closing or c.stopped or t is None or t.is_closing()
                or c.blocked is not None or c.body is not None or c.reading_paused
                or c.paused_writing or c in self.ring_waiters
                or touched != 1 << w or w in self.down_workers
                or t.get_write_buffer_size()):
            return None
        unparsed = c.parser.unparsed()
        if unparsed is None or len(unparsed) > MAX_UNPARSED:
            return None
        return unparsed

    def hand_off(self, c, w: int, unparsed: bytes) -> None:
        sock = c.transport.get_extra_info("socket")
        if sock is None:
            return
        self.handoff_seq += 1
        seq = self.handoff_seq
        if not handoff.send(self.channels[w], self.local, seq, sock.fileno()):
            log.info("front %d: worker %d's handoff channel is full", self.index, w)
            return                         # the next requests try again
        # Stop reading (not through `reading_paused`, which flow control would undo): what the
        # client sends from now on waits in the kernel for the adopter.
        c.transport.pause_reading()
        # Should this process die now, the socket lives on in the adopter (or the adopter closes
        # it and takes the count off: Inbox.drop_from), not with us (counters.py, open_here).
        c.moving = True
        self.my.decr(C_HERE)
        slot = c.new_slot(lambda s: self.handed_off(c, s), blocking=True)
        c.request(slot, w, OP_HANDOFF, movable_classes().index(type(c)), b"", seq, 0, unparsed)
        c.seal(slot)

    def handed_off(self, c, slot) -> None:
        p = slot.parts[0]
        self.streak.pop(c.id, None)
        log.debug("front %d: handoff of connection %d to worker %d: status %d", self.index, c.id,
                  p.worker, p.status)
        if p.status == R_OK:
            # The adopter holds the socket and the open reads now: close this descriptor
            # without the disconnect that would roll them back (nothing of it is held here).
            if c.touched & (1 << self.local):
                self.worker.disconnect(self.index, c.id)     # an empty session, if any
            c.touched = 0
            c.moved = True                 # counted where it was accepted, closed where it ends
            slot.close = True
        elif p.status == R_ERROR:          # declined: the connection stays here
            c.moving = False
            self.my.incr(C_HERE)
            c.transport.resume_reading()
        else:
            # The adopter died (or lost the socket): the connection ends, but not in silence.
            # What the client sent meanwhile waits unread, and may have been read and answered
            # by the adopter before it died; either way an error line is the true answer to
            # the next command, and it follows every reply already written.
            c.unavailable(slot, bytes(p.payload).decode("latin-1", "replace")
                          or "worker %d restarted" % p.worker)
            slot.close = True

    def worker_down(self, w: int) -> None:
        """Also: the sockets handed to `w` that it never took are void (their handoffs fail
        below, and their senders close them).  Each is held open by its copy in `w`'s channel
        until someone closes that copy, so close them now, not when `w`'s replacement starts
        (Inbox.drop_all there): a client must not wait out a restart for its close.  Other
        workers may drain the channel at the same time (each closes what it reads); the
        replacement, its reader, is forked only after every one has acknowledged."""
        if self.receive_ends is not None:
            handoff.Inbox(self.receive_ends[w]).drop_all()
        Front.worker_down(self, w)

    def adopt(self, src: int, conn: int, req: int, kind: int, seq: int, unparsed) -> None:
        """OP_HANDOFF from front slot `src`: take over its connection `conn`."""
        w = self.worker
        fd = w.inbox.take(src - self.first_slot, seq)
        if fd is None:
            log.warning("front %d: a connection handed over by front %d came without its socket",
                        self.index, src)
            w.reply(src, conn, req, R_SERVER_ERROR, 0, 0, b"connection handoff lost its socket")
            return
        if self.stopping or (src, conn) in w.pending_by_conn or kind >= len(movable_classes()):
            log.info("front %d: declined a connection from front %d", self.index, src)
            os.close(fd)
            w.reply(src, conn, req, R_ERROR)
            return
        c = movable_classes()[kind](self)
        c.adopted = True           # curr/total_connections counted it where it was accepted
        self.my.incr(C_HERE)       # it dies with this process from now on
        c.touched = 1 << self.local
        w.move_session((src, conn), (self.index, c.id))
        if unparsed:
            c.parser.feed(bytes(unparsed))
        self.my.incr(C_HANDOFFS)
        sock = socket.socket(fileno=fd)
        self.loop.create_task(self.adopted(c, sock))
        w.reply(src, conn, req, R_OK)

    async def adopted(self, c, sock: socket.socket) -> None:
        try:
            await self.loop.connect_accepted_socket(lambda: c, sock)
        except OSError as e:
            log.warning("front %d: cannot adopt a connection: %s", self.index, e)
            sock.close()
            self.my.decr(C_CURR)       # it ends here: its sender has let go (R_OK)
            self.my.decr(C_HERE)
            self.worker.disconnect(self.index, c.id)
            return
        c.pump()           # commands its unparsed input already completes

    def deliver(self, replies, src: int) -> int:
        """The replies of the worker (a published batch: (dst, head, payload)) to this front's
        requests, front slot `src`, handed to their connections; how many there were.  `head`
        packed, or a fused-path reply's tuple (messages.resp_fields, inline here).  One call per
        batch, not per reply."""
        n = 0
        conns = self.conns
        for dst, head, payload in replies:
            if dst != src:
                continue
            n += 1
            conn_id, req, status, flags, _, value = head if type(head) is tuple else unpack_resp(head, 0)
            c = conns.get(conn_id)
            if c is not None:
                fast = c.fast
                if fast and fast[0][0] == req and not c.closing:    # Conn.on_response's first case
                    c.fast_reply(status, flags, payload)
                    continue
                if c.on_response(req, status, flags, value, payload):
                    continue
            if flags & RF_HELD:         # nobody will write it: the item goes back (Waiting.op_get)
                self.settles.add(self.local, value, abort=True)
        return n


def attach_front(worker, parts, control_sock, front_class=LocalFront) -> None:
    """Give `worker` its own front (its listeners are served once its loop runs).
    `front_class`: a subclass that records what tests watch (a C type cannot be patched)."""
    slot, req, resp, wake_fd, listeners, counters, started_at, chans = parts
    front = front_class(worker, slot, worker.config, worker.status, counters, req, resp, wake_fd,
                       control_sock, listeners, started_at, worker.clock,
                       channels=[send for _, send in chans] if chans else None)
    worker.front = front
    worker.local_src = slot
    if chans:
        front.receive_ends = [recv for recv, _ in chans]
        worker.inbox = handoff.Inbox(chans[worker.index][0])
        worker.inbox.drop_all()      # a dead predecessor's unclaimed sockets: those clients are gone


if COMPILED:
    # interpreted readers (the worker, tests) read LocalFront's fields as member descriptors
    # (LOAD_ATTR_SLOT), not Cython's getsets (memcache_commands.pxd)
    _c_slot_fields(LocalFront, LocalFront.__slots__)
