"""The reply queue's records and the requests that fill them: a command's `Slot`, one `Part`
per worker request, sent (`request`, `notify`), sealed and completed in command order.

Every command that is neither fused (inline.py) nor routed slot-less (routed.py) takes this
path: thrift calls, blocking gets, monitor, multi-key gets, stats, errors.  Apart from conn.py,
whose compiled `Conn` reads its own fields as a C type's for the per-request flow and reply
code; compiled too (engine/compiled.py), as they were inside conn.py, with no .pxd: these
methods read the connection's fields as any Python code does, yet a compiled function still
spends less than an interpreted one on each of the several calls a slot makes.
"""
from __future__ import annotations

import time

from lanner.ipc.messages import R_SERVER_ERROR


class Part:
    """One request sent to one worker on behalf of a slot."""
    __slots__ = ("slot", "index", "worker", "req", "status", "flags", "value", "payload", "done")

    def __init__(self, slot, index, worker, req):
        self.slot = slot
        self.index = index
        self.worker = worker
        self.req = req
        self.done = False
        self.status = self.flags = self.value = 0
        self.payload = b""


class Slot:
    """A place in a connection's in-order reply queue."""
    __slots__ = ("parts", "remaining", "out", "close", "finish", "stream", "blocking", "done", "call",
                 "fam", "t0", "holds")

    def __init__(self, finish=None, stream=None, blocking=False, call=None, fam=-1, t0=0.0):
        self.parts: list[Part] = []
        self.remaining = 0
        self.out = b""
        self.close = False
        self.finish = finish      # finish(slot) -> None: builds slot.out from its parts
        self.stream = stream      # stream(slot, part, data) -> bytes: monitor items, as they come
        self.blocking = blocking
        self.done = False
        self.call = call          # what `finish` needs besides the parts: thrift's call,
                                  # the key a memcache `get` echoes
        self.fam = fam            # latency family (ops/latency.py); -1: not measured
        self.t0 = t0              # monotonic time its command's bytes were read
        self.holds = None         # (worker, hold id) of the held reads its reply carries (held.py)


class SlotQueue:
    """Conn's reply-queue half (conn.py's class doc: replies and the close).  Empty slots: the
    state is Conn's."""
    __slots__ = ()

    def new_slot(self, finish=None, stream=None, blocking=False, call=None) -> Slot:
        s = Slot(finish, stream, blocking, call, self.cur_fam, self.t_in)
        self.slots.append(s)
        self.nslots += 1
        return s

    def reply_now(self, data: bytes, close: bool = False) -> None:
        """A reply that needs no worker; `close`: the connection closes once it is written."""
        s = Slot()
        s.out = data
        s.close = close
        s.done = True
        if close:
            self.stopped = True
        self.held += len(data)
        self.slots.append(s)
        self.nslots += 1
        self.front.latency.observe(self.cur_fam, time.monotonic() - self.t_in)
        self.drain_slots()

    def close_after_replies(self) -> None:
        """`quit`: close once every reply already earned is written, saying nothing more."""
        self.reply_now(b"", close=True)

    def notify(self, worker: int, op: int, flags: int, queue: str | bytes, a=0,
               b=0, payload: bytes = b"") -> int:
        """Send a request whose response nobody waits for (noreply); returns its number."""
        req = self.next_req
        self.next_req = (req + 1) & 0xFFFFFFFF or 1
        self.batch = None               # an entry's requests are numbered one after the other
        self.touched |= 1 << worker
        self.front.send(worker, self.id, req, op, flags | self.conn_flags, queue, a, b, payload)
        return req

    def request(self, slot: Slot, worker: int, op: int, flags: int, queue: str | bytes, a=0, b=0,
                payload: bytes = b"") -> Part:
        """Send one request whose response becomes a part of `slot`'s reply."""
        req = self.next_req
        self.next_req = (req + 1) & 0xFFFFFFFF or 1
        self.batch = None               # (as in notify)
        self.touched |= 1 << worker
        part = Part(slot, len(slot.parts), worker, req)
        slot.parts.append(part)
        slot.remaining += 1
        if self.front.send(worker, self.id, req, op, flags | self.conn_flags, queue, a, b, payload):
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

    def complete(self, slot: Slot) -> None:
        before = len(slot.out)
        if slot.finish is not None:
            slot.finish(slot)
            slot.finish = None
        slot.parts.clear()      # parts point back at their slot: free them by refcount, not GC
        slot.done = True
        n = len(slot.out)
        self.held += n - before
        self.note_reply(n)
        if slot.fam >= 0:
            self.front.latency.observe(slot.fam, time.monotonic() - slot.t0)
        if slot.close:
            self.stopped = True
        if self.blocked is slot:
            self.blocked = None
        self.drain_slots()
        self.front.write_pending.add(self)

    def fill(self, slot: Slot, data: bytes) -> None:
        """Complete `slot` with a reply made elsewhere (no worker part: e.g. rendered on a
        thread), then write what is ready."""
        if self.closing:
            return
        slot.out = data
        slot.finish = None
        self.held += len(data)
        self.complete(slot)
        self.pump()
