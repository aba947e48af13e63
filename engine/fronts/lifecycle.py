"""A connection's life outside its requests: connected, a worker lost, the front stopping, gone.

Each runs once per connection or per failure, never per request, so it is plain Python, apart
from the compiled `Conn` (conn.py) whose per-request code reads its fields as a C type's.
"""
from __future__ import annotations

import logging
import socket

from lanner.fronts.counters import C_CURR, C_HERE, C_TOTAL
from lanner.ipc.messages import R_EMPTY, R_END, R_SERVER_ERROR, RF_CLOSE

log = logging.getLogger("lanner.fronts.conn")     # the connection's log, as before the split


class Lifecycle:
    """Conn's asyncio callbacks but `data_received`, and its failure paths.  Empty slots: the
    state is Conn's."""
    __slots__ = ()

    def connection_made(self, transport):
        self.transport = transport
        transport.set_write_buffer_limits(high=0, low=0)     # pause_writing: a slice is unsent
        f = self.front
        f.conns[self.id] = self
        if self.counts_connection and not self.adopted:
            f.my.incr(C_CURR)
            f.my.incr(C_TOTAL)
            f.my.incr(C_HERE)
        sessions = f.counters.total(C_CURR)
        srv = f.config.server
        if srv.connection_limit_refuse_writes is not None and sessions > srv.connection_limit_refuse_writes:
            self.refuse_writes = True
        if srv.connection_limit_refuse_reads is not None and sessions > srv.connection_limit_refuse_reads:
            self.refuse_reads = True
        if f.idle is not None:                   # client_timeout is on
            self.last_activity = f.loop.time()
            f.idle[self.id] = self               # the newest, at the end (front.close_idle)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("front %d: %s connection %d from %s", f.index, type(self).__name__, self.id,
                      transport.get_extra_info("peername"))
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def connection_lost(self, exc):
        f = self.front
        self.closing = self.stopped = True
        f.conns.pop(self.id, None)
        if f.idle is not None:
            f.idle.pop(self.id, None)
        f.ring_waiters.discard(self)
        if self.early:
            self.drop_early()
        self.fast.clear()
        self.batch = None
        self.batched = 0
        if self.counts_connection and not self.moved:
            f.my.decr(C_CURR)
            if not self.moving:
                f.my.decr(C_HERE)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("front %d: connection %d closed (%s)", f.index, self.id, exc or "clean")
        self.send_disconnects()
        if self.held_slots or self.unwritten:
            self.drop_held()           # replies it never wrote: their items go back (held.py)
        self.slots.clear()
        self.nslots = 0
        self.parts.clear()
        self.held = 0
        self.spill.clear()
        self.spilled = 0

    def answer_blocked_empty(self) -> None:
        """The front is stopping: the blocking get, monitor or thrift get this connection waits
        on answers now, empty (a thrift get: no items; a multi-key get: the items it has), before
        the connection closes, as Kestrel's shutdown woke every waiter (reference §5.10).  The
        worker's own answer, later, finds nobody and goes back (on_response)."""
        slot = self.blocked
        if slot is None or self.closing:
            return
        status = R_END if slot.stream is not None else R_EMPTY
        for req in [r for r, p in self.parts.items() if p.slot is slot]:
            self.on_response(req, status, 0, 0, b"")

    def worker_down(self, w: int) -> None:
        failed = [req for req, p in self.parts.items() if p.worker == w]
        for req in failed:
            self.on_response(req, R_SERVER_ERROR, RF_CLOSE, 0, b"worker %d restarted" % w)
        if (self.fast and self.fail_fast(w)) or failed:
            self.front.write_pending.add(self)
        self.touched &= ~(1 << w)
