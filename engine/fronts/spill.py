"""Big replies leave a connection a slice per loop turn (issue 8, P8: a flood of 8 MiB gets must
not stall the small requests of other connections served by the same loop).

uvloop's `transport.write` first tries one write() of all it is given, and libuv writes what the
socket did not take, whole, at the next POLLOUT: an 8 MiB get reply spent 12-22 ms in single
4 MiB socket writes (loopback runs the receiver's side of TCP in the same call), and nothing else
on the loop ran meanwhile.  So a connection hands its transport a reply bigger than WRITE_CHUNK,
and anything queued behind it, at most WRITE_CHUNK bytes at a time, and only while the transport
holds nothing: its high-water mark is 0, so `pause_writing` means "a slice is still unsent" and
`resume_writing` "it has gone".  The rest waits here in order (`spill`, the pieces themselves:
a slice of a big reply is a view, never a copy of the rest).  Each front writes at most
TURN_BYTES of spilled bytes per loop turn, round-robin over its connections (`SpillTurns`), so
a turn's stall is bounded whatever the number of connections with big replies; a connection with
nothing spilled still writes its small replies at once, in one call, as before.

Flow control keeps its meaning (conn.py): a connection's unsent bytes are the spill plus the
transport's slice; past REPLY_BUDGET it stops taking commands and reading (`paused_writing`)
until they fall to WRITE_LOW.  Nothing is dropped or written twice: bytes leave the spill only
into `transport.write`, and a closing connection closes once its spill is written.
"""
from __future__ import annotations

from collections import deque

from lanner.protocols.memcache_replies import SPLICE_MIN, Spliced

#: Unsent reply bytes a connection may have before it stops taking commands (conn.py's Conn).
REPLY_BUDGET = 4 << 20
#: Unsent bytes below which a connection that stopped takes commands again.
WRITE_LOW = 1 << 20
#: The most bytes one connection hands its transport at once (one write() syscall).
WRITE_CHUNK = 256 << 10
#: Spilled bytes a front writes per loop turn, over all its connections.
TURN_BYTES = 512 << 10
# A Spliced reply is always bigger than a chunk, so conn.flush_out never joins or writes one whole.
assert SPLICE_MIN >= WRITE_CHUNK


class SpillTurns:
    """A front's connections with spilled bytes, served round-robin, TURN_BYTES per turn."""

    __slots__ = ("front", "conns", "scheduled")

    def __init__(self, front) -> None:
        self.front = front          # its loop is looked up when needed (a worker's is set late)
        self.conns: deque = deque()
        self.scheduled = False

    def add(self, conn) -> None:
        if not conn.spill_queued:
            conn.spill_queued = True
            self.conns.append(conn)
        if not self.scheduled:
            self.scheduled = True
            self.front.loop.call_soon(self.run)

    def run(self) -> None:
        """One turn's share: a slice from each waiting connection in turn until TURN_BYTES."""
        self.scheduled = False
        conns = self.conns
        budget = TURN_BYTES
        for _ in range(len(conns)):
            if budget <= 0:
                break
            c = conns.popleft()
            c.spill_queued = False
            budget -= c.write_slice(min(budget, WRITE_CHUNK))
        if conns and not self.scheduled:
            self.scheduled = True
            self.front.loop.call_soon(self.run)


class SpillWriter:
    """Conn methods; `spill`, `spilled`, `wbusy`, `spill_queued` are set in Conn.__init__."""

    __slots__ = ()

    def pause_writing(self) -> None:
        self.wbusy = True

    def resume_writing(self) -> None:
        self.wbusy = False
        if self.spill:
            self.front.spills.add(self)
        else:
            if self.unwritten:
                self.held_written()    # the last slice left: confirm what it carried (held.py)
            self.unpause()

    def spill_out(self, pieces: list) -> None:
        """Queue `pieces` behind what is spilled already; they leave on later turns."""
        spill = self.spill
        for p in pieces:
            if type(p) is Spliced:
                spill.extend(p.pieces)       # the value itself, never copied
            else:
                spill.append(p)
            self.spilled += len(p)
        if self.spilled + self.transport.get_write_buffer_size() > REPLY_BUDGET:
            self.paused_writing = True       # the caller (pump) stops reading
        if not self.wbusy:
            self.front.spills.add(self)

    def write_slice(self, limit: int) -> int:
        """Hand the transport up to `limit` spilled bytes, in order; how many it got."""
        spill = self.spill
        t = self.transport
        if t is None or t.is_closing():
            spill.clear()
            self.spilled = 0
            return 0
        if self.wbusy or not spill:
            return 0                         # resume_writing queues it again
        pieces = []
        n = 0
        while spill and n < limit:
            p = spill[0]
            room = limit - n
            if len(p) <= room:
                spill.popleft()
                pieces.append(p)
                n += len(p)
            else:
                v = p if type(p) is memoryview else memoryview(p)
                pieces.append(v[:room])
                spill[0] = v[room:]
                n = limit
        self.spilled -= n
        t.write(pieces[0] if len(pieces) == 1 else b"".join(pieces))
        if self.unwritten and not spill:
            self.held_written()
        if spill:
            if not self.wbusy:
                self.front.spills.add(self)
        elif self.closing:
            t.close()                        # uvloop writes its buffer out before closing
        self.unpause()
        return n

    def unpause(self) -> None:
        """Take commands and read again once the unsent bytes fell to WRITE_LOW."""
        t = self.transport
        if self.paused_writing and t is not None and self.spilled + t.get_write_buffer_size() <= WRITE_LOW:
            self.paused_writing = False
            self.pump()
