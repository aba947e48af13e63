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
LocalFront.deliver to `fast_reply`.  Why apart from conn.py: the in-order Slot queue is
conn.py's concern; this is the slot-less path beside it (Conn keeps the two in order:
`drain_slots` waits while `fast` is not empty).
"""
from __future__ import annotations

from lanner.fronts.flow import MAX_INFLIGHT, SMALL_REPLY
from lanner.fronts.rendered import family, nth, release
from lanner.ipc.messages import R_ITEM, R_OK, RF_HELD
from lanner.protocols.memcache_replies import END_TAIL, SPLICE_MIN


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

    def fast_reply(self, status: int, flags: int, payload, value: int = 0) -> None:
        """The reply of the oldest inline (or routed: routed.py) request, then of any that came
        back before it.  A held read's id (RF_HELD, `value`) waits with the reply's bytes in
        `unwritten` (held.py)."""
        fast = self.fast
        f = self.front
        out = self.out
        while True:
            _, ok, render, call, fam, t0, w = fast.popleft()
            if ok is None:
                n = render(out, status, flags, payload, call)
            elif status == R_OK:                # a set's STORED
                out.append(ok)
                n = len(ok)
            elif status == R_ITEM and payload.__class__ is bytes and len(payload) < SPLICE_MIN:
                # a get's value: its VALUE line (`ok`: value_heads; `call`: the key as sent),
                # its own bytes and END, joined only with the turn's other output (flush_out)
                n = len(payload)
                head = ok[call, n]
                out += (head, payload, END_TAIL)
                n += len(head) + 7
            else:
                n = render(out, status, flags, payload, call)
            f.latency.since(fam, t0)
            if n < 0:                   # the reply closes the connection
                self.closing = self.stopped = True
                if self.early:
                    self.drop_early()
                fast.clear()
                self.batch = None
                self.batched = 0
                self.slots.clear()      # what was sent after the closing command goes unanswered
                self.held = 0
                f.write_pending.add(self)
                return
            if flags & RF_HELD:
                if self.unwritten is None:
                    self.unwritten = [(w, value)]
                else:
                    self.unwritten.append((w, value))
            if not (self.early and fast and fast[0][0] in self.early):
                break
            status, flags, payload, value = self.early.pop(fast[0][0])
        # the last one's size is estimate enough; below SMALL_REPLY with full room it would
        # change nothing (Conn.note_reply), and skipping only keeps the estimate higher
        if n > SMALL_REPLY or self.idle_room != MAX_INFLIGHT:
            self.note_reply(n)
        if not fast and self.slots:
            self.drain_slots()
        f.write_pending.add(self)

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
