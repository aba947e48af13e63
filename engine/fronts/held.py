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

Confirms and aborts go once per turn, one OP_HELD message per owner (`Settles`), sent by the
front's `flush_rings` ahead of the turn's publish.
"""
from __future__ import annotations

from array import array

from lanner.ipc.messages import OP_HELD, pack_req, send


class Settles:
    """A front's confirms and aborts not sent yet: worker -> hold ids."""

    __slots__ = ("front", "confirm", "abort", "due")

    def __init__(self, front) -> None:
        self.front = front
        self.confirm: dict[int, list[int]] = {}
        self.abort: dict[int, list[int]] = {}
        self.due = False

    def add(self, worker: int, hid: int, abort: bool = False) -> None:
        by = self.abort if abort else self.confirm
        ids = by.get(worker)
        if ids is None:
            by[worker] = [hid]
        else:
            ids.append(hid)
        if not self.due:
            self.due = True
            f = self.front
            if not f.flush_scheduled:
                f.flush_scheduled = True
                f.loop.call_soon(f.flush_rings)

    def send(self) -> None:
        """One OP_HELD per owner (confirmed ids first, `a` of them) into its request ring, for
        the caller's publish.  A worker that is down lost its holds with its memory (its replay
        rolls them back), and its replacement must not get its ids: they are dropped."""
        f = self.front
        confirm, abort = self.confirm, self.abort
        self.confirm, self.abort, self.due = {}, {}, False
        for w in confirm.keys() | abort.keys():
            if w in f.down_workers:
                continue
            ids = array("q", confirm.get(w, ()))
            n = len(ids)
            ids.extend(abort.get(w, ()))
            send(f.req_rings[w], pack_req(0, 0, OP_HELD, 0, 0, n, 0), ids.tobytes())
            f.dirty_rings.add(w)


class HeldItems:
    """Conn methods (conn.py); `transport`, `out`, `spilled`, `front` are Conn's."""

    __slots__ = ()

    held_slots: set | None = None      # slots with hold ids, not yet out of the reply queue
    unwritten: list | None = None      # (worker, id) of replies handed out, not yet written

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
        settles = self.front.settles
        for w, hid in self.unwritten:
            settles.add(w, hid)
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
