"""The fused local path of a connection served by a worker's own front (server/local.py).

A memcache `set` or plain `get` for a queue the worker owns, taken while no Slot is queued on
the connection, runs against the queue at once (Worker.inline_set / inline_get) with no Slot,
Part, routing or request record; only its number and how to render its reply wait in
`Conn.fast`, as the entry `(req, ok, render, call, latency family, t0, worker)` (worker -1:
this one, which cannot die while its front runs; routed.py's entries name theirs): for a set,
`ok` is the reply's bytes when the worker answers R_OK; for a plain get (never answered R_OK),
the table of VALUE lines (memcache_replies.value_heads, by `call`, the key as sent, and the
value's size) used when it answers R_ITEM with a value under SPLICE_MIN, spliced here with no
render call; None: nothing known in advance (a routed get: its value is a view of the ring).
Any other answer goes to `render(out, status, flags, payload, call)`, which appends the reply
to the connection's output and says its size, or -1 when it closes the connection.  Whether a
request may take this path is decided in one place,
the gate FusedQueues (configuration, placement) with the status's `clear` (status.py); the two
fused branches (MemcacheConn.store and on_get) then number the request, append its entry and
make sure the worker's turn is scheduled in their own frame before calling the worker (a
Python call costs 150-300 instructions here, besides its bytecodes: perf/README.md, stop 14).  Its reply still joins
the worker's batch, so it leaves only when the commit rules allow, and comes back through
LocalFront.deliver to `Conn.fast_reply` (in conn.py: compiled with Conn, conn.pxd).  Why apart
from conn.py: the in-order Slot queue is conn.py's concern; this is the slot-less path beside it
(Conn keeps the two in order: `drain_slots` waits while `fast` is not empty).
"""
from __future__ import annotations

from lanner.fronts.rendered import family, nth, release


class FusedQueues(dict):
    """queue name -> whether a plain `set`/`get` on it may take the fused path as far as the
    configuration and placement say: a legal name (the connection's check_name already passed
    it), no client-id whitelist on it, not an alias, owned by this front's own worker.
    One dict lookup per request instead of four checks; the front clears it with the config
    it was computed from (Front.use_config).  What can change between two requests (the
    server status, the connection's limits and slots, the worker's closed connections, the
    command's own form) the caller still checks per request."""

    __slots__ = ("front",)

    def __init__(self, front) -> None:
        super().__init__()
        self.front = front

    def __missing__(self, queue: str) -> bool:
        f = self.front
        if queue not in f.valid_names:
            return False            # not checked yet: the general path checks it (not kept here)
        if len(self) > 100_000:     # bounded: names are client-chosen
            self.clear()
        cfg = f.config
        if cfg.has_whitelists:
            qc = cfg.queue_config(queue)
            listed = qc.white_list_client_id_for_enqueue is not None or \
                qc.white_list_client_id_for_dequeue is not None
        else:
            listed = False
        ok = self[queue] = not listed and cfg.aliases.get(queue) is None and \
            f.owner(queue) == getattr(f, "local", -1)
        return ok


class InlineReplies:
    """Conn methods; `fast`, `early`, `worker`, `local` and the rest are set in Conn.__init__."""

    __slots__ = ()

    def release_entry(self, out: list, status: int, flags: int, entry: list, call: tuple) -> int:
        """The `render` of a `fast` entry of rendered replies (rendered.py; `call`: the whole
        entry, its first request, t0): hand out `entry`, the whole or its part before a write
        behind (then the rest waits, first in `fast`); the size of its last reply (-1: it
        closes the connection).  fast_reply observes the first reply's latency and takes the
        last step of flow control's estimate (Conn.note_reply): the steps between are here."""
        whole, req, t0 = call
        n, m = release(out, entry, self.front.latency, t0)
        if entry is whole:
            self.batched -= m - 1
            if self.batch is whole:     # (its batch has ended: let its bytes go)
                self.batch = self.batch_of = None
        else:                           # (the rest counts one in `fast`, as the whole did)
            req = nth(req, m)
            self.fast.appendleft((req, None, self.release_entry, (whole, req, t0), family(whole), t0, -1))
            self.batched -= m
        if n > 0:
            self.reply_size = n + int((self.reply_size - n) * 0.875 ** (m - 1))
        return n
