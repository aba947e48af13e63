"""The front's half of held reads (server/holding.py): settle each once its reply is written.

A plain get's reply that crossed a ring carries RF_HELD and a hold id: the owner keeps the
item as an open read of its own until this process says what became of the reply.  A
connection collects its slots' hold ids as the replies arrive (`hold`).  When a slot leaves
the reply queue its ids wait in `unwritten` with its bytes (a slot that closes the connection
is an error reply, which carries no item: its ids are aborted); once every byte handed out so
far has reached the kernel (nothing in `out`, in the spill, or in the transport's buffer) they
are confirmed (`held_written`).  A connection that goes first aborts what it still holds
(`drop_held`), as does a reply whose connection is gone or closing; the item goes back to the
head of its queue.  This process's death leaves the aborting to the owner (peer_down).

What is confirmed is what the kernel took: bytes still unsent when the client vanishes, or when
this process dies with unread input on the socket (the kernel then resets the connection), are
lost to the client after all.  That is Kestrel's own limit for every plain get; the owner
confirms nothing earlier than that.

Confirms and aborts go at most once per turn, one OP_HELD message per owner, riding with that
owner's requests (`Settles`).
"""
from __future__ import annotations

from array import array

from lanner.ipc.messages import OP_HELD, pack_req, send


#: Seconds a confirm or abort may wait for a request to its owner to ride with (below).
SETTLE_LAG = 0.01


class Settles:
    """A front's confirms and aborts not sent yet: worker -> hold ids.

    They ride with the requests of a later turn to the same owner (`ride`, from the front's
    `flush_rings`): a closed-loop client's next request carries the confirm of its last reply,
    and the owner takes both in one turn and one journal write.  Sent alone, they cost the owner
    a wakeup, a loop turn and a write of their own: measured, that was most of the price of
    holding.  What no request carries goes after SETTLE_LAG (`on_timer`), one timer at a time;
    meanwhile the items stay held (a death of this process then delivers them again)."""

    __slots__ = ("front", "confirm", "abort", "due", "armed")

    def __init__(self, front) -> None:
        self.front = front
        self.confirm: dict[int, list[int]] = {}
        self.abort: dict[int, list[int]] = {}
        self.due = False
        self.armed = False

    def add(self, worker: int, hid: int, abort: bool = False) -> None:
        self.confirm_all(((worker, hid),), self.abort if abort else self.confirm)

    def confirm_all(self, held, by: dict | None = None) -> None:
        """Every (worker, id) of `held` into `by` (the confirms unless told), sent within
        SETTLE_LAG: one call per connection's write, not one per id (issue 8, the routed
        request)."""
        if by is None:
            by = self.confirm
        for w, hid in held:
            ids = by.get(w)
            if ids is None:
                by[w] = [hid]
            else:
                ids.append(hid)
        self.due = True
        if not self.armed:
            self.armed = True
            self.front.loop.call_later(SETTLE_LAG, self.on_timer)

    def on_timer(self) -> None:
        self.armed = False
        if self.due:
            self.ride(None)
            f = self.front
            if not f.flush_scheduled:
                f.flush_scheduled = True
                f.loop.call_soon(f.flush_rings)

    def ride(self, dirty) -> None:
        """One OP_HELD per owner (confirmed ids first, `a` of them) into its request ring, for
        the caller's publish: only to the owners in `dirty` (rings published this turn anyway),
        or to all when None.  A worker that is down lost its holds with its memory (its replay
        rolls them back), and its replacement must not get its ids: they are dropped."""
        f = self.front
        confirm, abort = self.confirm, self.abort
        for w in list(confirm.keys() | abort.keys()):
            if dirty is not None and w not in dirty:
                continue
            conf = confirm.pop(w, ())
            ab = abort.pop(w, ())
            if w in f.down_workers:
                continue
            ids = array("q", conf)
            ids.extend(ab)
            ring = f.req_rings[w]
            if ring is None:            # a worker's own front: its worker's holds, by a call
                f.send(w, 0, 0, OP_HELD, 0, b"", len(conf), 0, ids.tobytes())     # (LocalFront.send)
                continue
            send(ring, pack_req(0, 0, OP_HELD, 0, 0, len(conf), 0), ids.tobytes())
            f.dirty_rings.add(w)
        self.due = bool(confirm or abort)


class HeldItems:
    """Conn methods (conn.py); `held_slots`, `unwritten`, `transport`, `out`, `spilled`,
    `front` are Conn's slots."""

    __slots__ = ()

    def hold(self, slot, worker: int, hid: int) -> None:
        """A reply for `slot` carried hold `hid` of `worker`."""
        holds = slot.holds
        if holds is None:
            slot.holds = [(worker, hid)]
            if self.held_slots is None:
                self.held_slots = {slot}
            else:
                self.held_slots.add(slot)
        else:
            holds.append((worker, hid))

    def held_out(self, slot) -> None:
        """`slot` leaves the reply queue (drain_slots): its ids wait for its bytes to be
        written, or are aborted if it is an error that closes the connection."""
        holds, slot.holds = slot.holds, None
        self.held_slots.discard(slot)
        if slot.close:
            settles = self.front.settles
            for w, hid in holds:
                settles.add(w, hid, abort=True)
        elif self.unwritten is None:
            self.unwritten = holds
        else:
            self.unwritten += holds

    def held_written(self) -> None:
        """Confirm the ids waiting in `unwritten` if every byte before them reached the kernel."""
        t = self.transport
        if self.out or self.spilled or t is None or t.is_closing() or t.get_write_buffer_size():
            return
        self.front.settles.confirm_all(self.unwritten)
        self.unwritten = None

    def drop_held(self) -> None:
        """The connection is gone (connection_lost): abort every id it still holds."""
        settles = self.front.settles
        for w, hid in self.unwritten or ():
            settles.add(w, hid, abort=True)
        self.unwritten = None
        for slot in self.held_slots or ():
            for w, hid in slot.holds:
                settles.add(w, hid, abort=True)
            slot.holds = None
        self.held_slots = None
