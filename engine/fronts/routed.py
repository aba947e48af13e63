"""The slot-less routed request: a plain `set` or `get` for another worker's queue.

A connection that uses a queue of another worker (a dedicated front's every request; in a worker
serving its own clients, a client of several queues, or one not handed over yet: server/local.py)
used to pay a Slot, a Part, the generic `request`/`seal`/`complete`/`drain_slots` walk and the
routing layers of `Front.send` for each such request: measured, more Python than the whole fused
local request (perf/README.md, "The routed request, stop 14").  Taken while the connection has no
Slot queued, such a request is handled as the fused local path handles its own (inline.py): its
record goes straight into the owner's request ring, and its number and how to render its reply
wait in `Conn.fast`, the entry `(req, ok, render, call, latency family, t0, worker)`.  Its reply
comes back on the ring and reaches `fast_reply` through `Conn.on_response`, in order with the
local ones (a reply ahead of an older one waits in `early`).

Held reads (server/holding.py, fronts/held.py).  A plain get's reply from another process carries
RF_HELD and a hold id: `fast_reply` puts the id in `unwritten` when it puts the reply's bytes in
`out`, so it is confirmed once those bytes reached the kernel, as a Slot's are.  An id whose
reply is never rendered is aborted: a reply kept in `early` when the connection closes
(`drop_early`), and a reply no connection takes (`on_response` says so; the caller aborts it,
Front.drain_responses).  A worker that dies fails its entries here as it fails its Parts
(`fail_fast`).
"""
from __future__ import annotations

from lanner.ipc.messages import R_SERVER_ERROR, RF_CLOSE, RF_HELD, SMALL_MESSAGE, pack_req, send


class Routes(dict):
    """queue name -> (owner worker, the name as a ring carries it): what a routed request needs
    of its queue, one dict lookup instead of a placement call and an encode per request.
    Placement never changes while the server runs; bounded, as names are the clients'."""

    __slots__ = ("front",)

    def __init__(self, front) -> None:
        super().__init__()
        self.front = front

    def __missing__(self, queue: str) -> tuple[int, bytes]:
        if len(self) > 100_000:
            self.clear()
        route = self[queue] = (self.front.owner(queue), queue.encode("latin-1"))
        return route


class RoutedRequests:
    """Conn methods; `fast`, `early`, `front` and the rest are set in Conn.__init__."""

    __slots__ = ()

    def route_fast(self, queue: str, op: int, a: int, payload, ok, render, call) -> bool:
        """Send a plain set (`payload`: its body) or get of `queue` to its worker without a
        Slot, if nothing queued before it needs one; False (nothing sent) otherwise.  The caller
        checked everything the request's own form and the queue's configuration ask."""
        f = self.front
        w, name = f.routes[queue]
        ring = f.req_rings[w]          # None: the connection's own worker (not routed)
        if ring is None or self.nslots or w in f.down_workers:
            return False
        req = self.next_req
        self.next_req = (req + 1) & 0xFFFFFFFF or 1
        self.batch = None              # its reply goes behind the rendered ones (rendered.py)
        self.touched |= 1 << w
        head = pack_req(self.id, req, op, self.conn_flags, len(name), a, len(payload)) + name
        if len(payload) < SMALL_MESSAGE:
            ring.send_parts(head, payload)      # messages.send's common case
        else:
            send(ring, head, payload)
        f.note_routed(w, self.id)
        f.dirty_rings.add(w)
        if not f.flush_scheduled:
            f.flush_scheduled = True
            f.loop.call_soon(f.flush_rings)
        self.fast.append((req, ok, render, call, self.cur_fam, self.t_in, w))
        return True

    def drop_early(self) -> None:
        """The connection closes with replies kept in `early` unrendered: their holds go back
        (their entries are still in `fast`, which names the worker)."""
        early = self.early
        held = [(req, e[3]) for req, e in early.items() if e[1] & RF_HELD]
        self.early = None               # (empty is None: Conn.__init__)
        if held:
            workers = {e[0]: e[6] for e in self.fast}
            settles = self.front.settles
            for req, hid in held:
                settles.add(workers[req], hid, abort=True)

    def fail_fast(self, w: int) -> bool:
        """Worker `w` died: its entries' replies will never come; each becomes the error a Part
        of it gets (Conn.worker_down).  Whether there were any."""
        failed = [e[0] for e in self.fast if e[6] == w]
        for req in failed:
            self.on_response(req, R_SERVER_ERROR, RF_CLOSE, 0, b"worker %d restarted" % w)
        return bool(failed)
