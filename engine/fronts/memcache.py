"""A memcache-dialect client connection in a front: commands → worker requests → reply bytes.

The parser (protocols/memcache.py) decides framing and syntax; this module decides
what each command means for the queues (reference §1), which worker(s) it goes to,
and how the responses become Kestrel's bytes (with Lanner's deviations: errors carry a
reason, noreply is honoured, VALUE echoes the key as sent, multi-key get).
"""
from __future__ import annotations

from lanner.protocols import memcache as mc
from lanner.protocols import memcache_replies as mr
from lanner.protocols.memcache_commands import Get, Set
from lanner.protocols.memcache_replies import END_TAIL, SPLICE_MIN, STORED, value_heads

from lanner import __version__
from lanner.fronts.conn import Conn, _append, expiry_at
from lanner.fronts.counters import C_GET, C_PEEK, C_SET
from lanner.fronts.memcache_outcomes import (finish_alias_set, finish_get1, finish_stored, first_failure,
                                             get1_fused, set_fused)
from lanner.fronts.rendered import END3, NOT_STORED3, STORED3, opens
from lanner.server.status import StatusError
from lanner.fronts.slots import Slot
from lanner.ipc.messages import (F_ABORT, F_AFTER_BODY, F_CLOSE, F_HOLD, F_NOREPLY, F_OPEN, F_PEEK, F_STREAM,
                       OP_ALIAS_PUT, OP_CONFIRM, OP_DELETE, OP_FLUSH, OP_FLUSH_ALL, OP_FLUSH_ALL_EXPIRED,
                       OP_FLUSH_EXPIRED, OP_GET, OP_MONITOR, OP_SET, R_ITEM, R_OK, R_VALUE)

_VERSION = mr.version_line(__version__)
#: Set bodies larger than this go to the worker in pieces as they arrive (never whole here).
STREAM_OVER = 64 << 10


# COMPILED: as in memcache_commands.py (memcache.pxd makes it a C constant in the compiled build,
# where front.pxd's `status_seq` exists)
try:
    import cython
    COMPILED = cython.compiled
except ImportError:             # pure Python without Cython installed
    COMPILED = False


class MemcacheConn(Conn):
    """A memcache client's connection: a C type in the compiled build (memcache.pxd), whose
    `store` and `on_get` read the front, its counters and the command typed."""
    __slots__ = ()               # Conn's slots are all its state (conn.py)

    def __init__(self, front):
        # the queue's max_item_size under the config in force now (it changes on reload)
        super().__init__(front, mc.MemcacheParser(item_limit=front.item_limits,
                                                  stream_over=STREAM_OVER), HANDLERS)

    def handle(self, cmd) -> None:
        self.handlers[type(cmd)](self, cmd)

    def dispatch(self, handlers: dict, kind: type, cmd):
        """Conn.dispatch: a set and a plain get, nearly every command, straight to `store` and
        `on_get` (compiled: C calls, where the table's entries are Python calls, ~300
        instructions a command); the table for the rest, and for all when a connection was given
        another table (tests wrap a handler so)."""
        if handlers is HANDLERS:
            if kind is Set:
                return self.store(cmd)
            if kind is Get:
                return self.on_get(cmd)
        return handlers[kind](self, cmd)

    def unavailable(self, slot: Slot, reason: str) -> None:
        slot.out = mr.server_error(reason)
        slot.close = True

    # -- helpers ---------------------------------------------------------------------------------
    def bad_name(self, queue: str) -> bool:
        return self.close_with(self.check_name(queue), mr.client_error)

    def writes_blocked(self) -> bool:
        return self.close_with(self.write_refusal(), mr.server_error)

    def reads_blocked(self) -> bool:
        return self.close_with(self.read_refusal(), mr.server_error)

    def not_listed(self, queue: str, op: str) -> bool:
        """A client-id whitelist on the queue (or an alias's destinations) refuses `op`: memcache
        callers carry no client id, so this is SERVER_ERROR and a close, like any
        AvailabilityException (§1.2)."""
        return self.close_with(self.whitelist_refusal(queue, op), mr.server_error)

    # -- storage ---------------------------------------------------------------------------------
    def on_set_piece(self, cmd: mc.SetPiece) -> None:
        self.body_piece(cmd.data, cmd.last)

    def store(self, cmd: mc.Set | mc.SetHead) -> bool | None:
        """One set: its body whole (Set), or announced (SetHead) when it follows in SetPieces,
        which go to the same worker(s) as they arrive (F_STREAM, then OP_SET_DATA;
        ipc/bodies.py)."""
        f = self.front
        stream = type(cmd) is not Set
        if stream:
            q, exptime, noreply = cmd.queue, cmd.exptime, cmd.noreply
        else:
            s = cmd                     # (compiled: a Set, its fields read as C struct members)
            q, exptime, noreply = s.queue, s.exptime, s.noreply
        st = f.status
        fused = _c_entry(f.fused, q) if COMPILED else f.fused[q]    # (a C lookup: conn.pxd)
        if not fused or status_moved(f, st) or self.refuse_writes:
            # the checks FusedQueues and the status's `clear` stand for (inline.py, status.py)
            if q not in f.valid_names and self.bad_name(q):
                return
            if (self.refuse_writes or st.blocks_writes()) and self.writes_blocked():
                return
            if f.config.has_whitelists and self.not_listed(q, "add"):
                return
            fused = f.fused[q]          # the name is checked now
        my = f.my                       # (compiled: `incr` a C call, memcache.pxd)
        my.incr(C_SET)
        expiry = exptime and expiry_of(exptime, f.clock)
        wk = self.worker                # (compiled: a WorkerBase, conn.pxd: struct reads)
        if fused and not stream and not noreply and not self.nslots and not wk.closed_conns:
            # the hot path: one queue of this worker, one reply, the body whole
            # the fused request's number and reply entry (inline.py), here and in on_get
            lf = f                      # (fused: a worker's own front; compiled, a LocalFront)
            n = self.next_req           # (compiled: C ints, conn.pxd and memcache.pxd)
            # (n + 1) & 0xFFFFFFFF or 1, in C ints below 2**30 (Cython makes 0xFFFFFFFF an object)
            self.next_req = n + 1 if n < 0x3FFFFFFF else (n + 1) & 0xFFFFFFFF or 1
            req = n                     # (compiled: the request's one int object, entry and call)
            if self.touched != self.local_bit:     # (an int compare; `|=` is a generic call)
                self.touched |= self.local_bit
            if lf.streak:
                lf.streak.pop(self.id, None)    # a local request breaks a streak towards a handoff
            lf.inline_requests += 1
            if not wk.turn_scheduled:
                wk.schedule_turn()
            fast = self.fast
            if fast:
                # replies owed already: this one may join them, rendered (rendered.py), as in on_get
                ok = wk.inline_set(f.index, self.id, req, q, expiry, s.data)
                ent = self.batch
                if ok is not None and (ent is not None or len(fast) > 1):
                    replies = wk.replies
                    if ent is not None and self.batch_of is replies:
                        replies.pop()
                        ent += STORED3 if ok else NOT_STORED3
                        self.batched += 1
                        return True
                    if opens(self, replies, STORED3 if ok else NOT_STORED3):
                        return True
                self.batch = None
                _append(fast, (req, STORED, set_fused, None, self.cur_fam, self.t_in, -1))
                return True
            _append(fast, (req, STORED, set_fused, None, self.cur_fam, self.t_in, -1))
            wk.inline_set(f.index, self.id, req, q, expiry, s.data)
            return True                 # fused: one reply in flight and nothing else (Conn.process)
        dests = f.config.aliases.get(q)
        if stream:
            flags, size, payload = F_STREAM, cmd.size, b""
            if exptime and mc.is_relative(exptime):
                # relative: from the body's end, which may come long after this header (§5.2)
                flags, expiry = F_STREAM | F_AFTER_BODY, exptime * 1000
        else:
            flags, size, payload = 0, len(cmd.data), cmd.data
        if dests is None and noreply:
            # nothing to wait for: fire and forget, no slot
            w = f.owner(q)
            req = self.notify(w, OP_SET, flags | F_NOREPLY, q, expiry, size, payload)
            if stream:
                self.begin_body([(w, req)])
            return
        if dests is None:                # one queue, one reply, through its worker's ring
            if not stream and self.route_fast(q, OP_SET, expiry, payload, STORED, set_fused, None):
                return True             # no Slot: one reply in flight, as fused (routed.py)
            slot = self.new_slot(finish_stored)
            part = self.request(slot, f.owner(q), OP_SET, flags, q, expiry, size, payload)
            self.seal(slot)
            if stream:
                self.begin_body([(part.worker, part.req)])
            return
        slot = self.new_slot(finish_alias_set, call=noreply)
        f.send(f.owner(q), self.id, 0, OP_ALIAS_PUT, 0, q, 1, size)
        targets = []
        for d in dests:
            part = self.request(slot, f.owner(d), OP_SET, flags, d, expiry, size, payload)
            targets.append((part.worker, part.req))
        self.seal(slot)
        if stream:
            self.begin_body(targets)

    def on_set_refused(self, cmd: mc.SetRefused) -> None:
        if self.bad_name(cmd.queue) or self.writes_blocked():
            return
        if self.front.config.has_whitelists and self.not_listed(cmd.queue, "add"):
            return
        self.front.my.incr(C_SET)
        if not cmd.noreply:
            self.reply_now(mr.NOT_STORED)

    # -- get -------------------------------------------------------------------------------------
    def on_get(self, cmd: mc.Get) -> bool | None:
        f = self.front
        k = cmd.plain
        if k is not None:
            # the hot path: a plain `get q` (one key, no option)
            q = k.queue
            st = f.status
            fused = _c_entry(f.fused, q) if COMPILED else f.fused[q]    # (as in store)
            if not fused or status_moved(f, st) or self.refuse_reads:
                # the checks FusedQueues and the status's `clear` stand for (inline.py, status.py)
                if q not in f.valid_names and self.bad_name(q):
                    return
                if (self.refuse_reads or st.blocks_reads()) and self.reads_blocked():
                    return
                if f.config.has_whitelists and self.not_listed(q, "remove"):
                    return
                fused = f.fused[q]      # the name is checked now
            my = f.my                   # (compiled: `incr` a C call, memcache.pxd)
            my.incr(C_GET)
            wk = self.worker            # (as in store)
            if fused and not self.nslots and not wk.closed_conns and (
                    self.touched == self.local_bit or not self.fast or not routed_ahead(self.fast)):
                # the fused request's number and reply entry (inline.py), as in store
                lf = f                  # (fused: a worker's own front; compiled, a LocalFront)
                n = self.next_req       # (as in store)
                self.next_req = n + 1 if n < 0x3FFFFFFF else (n + 1) & 0xFFFFFFFF or 1
                req = n
                if self.touched != self.local_bit:     # (an int compare; `|=` is a generic call)
                    self.touched |= self.local_bit
                if lf.streak:
                    lf.streak.pop(self.id, None)
                lf.inline_requests += 1
                if not wk.turn_scheduled:
                    wk.schedule_turn()
                fast = self.fast
                if fast:
                    data = wk.inline_get(f.index, self.id, req, q)
                    ent = self.batch
                    if ent is None and len(fast) < 2:
                        pieces = None   # (nothing to join: its reply alone)
                    elif data is False:
                        pieces = END3
                    elif data.__class__ is bytes and len(data) < SPLICE_MIN:
                        pieces = (value_heads[k.raw, len(data)], data, END_TAIL)
                    else:               # it answered itself (None), or a value too big to render
                        pieces = None
                    if pieces is not None:
                        replies = wk.replies
                        if ent is not None and self.batch_of is replies:
                            replies.pop()
                            ent += pieces
                            self.batched += 1
                            return True
                        if opens(self, replies, pieces):
                            return True
                    self.batch = None
                    _append(fast, (req, value_heads, get1_fused, k.raw, self.cur_fam, self.t_in, -1))
                    return True
                _append(fast, (req, value_heads, get1_fused, k.raw, self.cur_fam, self.t_in, -1))
                wk.inline_get(f.index, self.id, req, q)
                return True         # fused: one reply in flight and nothing else (Conn.process)
            if f.config.aliases.get(q) is not None:
                self.reply_now(mr.END)
                return
            if self.route_fast(q, OP_GET, -1, b"", None, get1_fused, k.raw):
                return True         # no Slot: one reply in flight, as fused (routed.py)
            w = f.owner(q)
            slot = self.new_slot(finish_get1, call=k.raw)
            self.request(slot, w, OP_GET, hold_flag(self, w), q, -1)
            self.seal(slot)
            return
        keys = cmd.keys
        for k in keys:
            # a close or abort alone creates no queue, so no name is refused there (reference
            # §5.1: the name is checked when the queue is created); it only pops this
            # connection's open reads, which such a name cannot have: END
            if (k.open or k.peek or not (k.close or k.abort)) and self.bad_name(k.queue):
                return
        blocking = False
        plan = []
        for k in keys:
            fetching = k.open or k.peek or not (k.close or k.abort)
            if k.abort:
                plan.append((k, F_ABORT, -1))
                continue
            if fetching and f.config.aliases.get(k.queue) is not None:
                f.my.incr(C_PEEK if k.peek else C_GET)
                plan.append((k, None, 0))        # alias: always empty
                continue
            refusal = self.read_refusal() if fetching else None
            if refusal is None and fetching and not k.peek and f.config.has_whitelists:
                refusal = self.whitelist_refusal(k.queue, "remove")
            if refusal is not None:
                # Closes and aborts before the status check still happen (Kestrel's order);
                # their END is not written: the reply is the availability error alone.
                if k.close:
                    plan.append((k, F_CLOSE, -1))
                for pk, pflags, _ in plan:
                    if pflags is not None:
                        self.notify(f.owner(pk.queue), OP_GET, pflags, pk.queue, -1)
                self.close_with(refusal, mr.server_error)
                return
            flags = (F_OPEN if k.open else 0) | (F_CLOSE if k.close else 0) | (F_PEEK if k.peek else 0)
            if fetching:
                f.my.incr(C_PEEK if k.peek else C_GET)
            timeout = k.timeout_ms if (fetching and k.timeout_ms is not None) else -1
            if timeout > 0:
                blocking = True
            plan.append((k, flags, timeout))
        self.send_plan(plan, blocking)

    def send_plan(self, plan, blocking: bool) -> None:
        if not plan:
            return
        f = self.front
        if len(plan) == 1:
            k, flags, timeout = plan[0]
            if flags is None:
                self.reply_now(mr.END)
                return
            slot = self.new_slot(finish_get1, blocking=blocking, call=k.raw)
            w = f.owner(k.queue)
            self.request(slot, w, OP_GET, flags or hold_flag(self, w), k.queue, timeout)
            self.seal(slot)
            return
        keys = []

        def finish(slot):
            if first_failure(slot):
                return
            out = []
            for raw, p in keys:
                if p is not None and p.status == R_ITEM:
                    out.append(mr.value_block(raw, p.payload))
            out.append(mr.END)
            slot.out = b"".join(out)
        slot = self.new_slot(finish, blocking=blocking)
        for k, flags, timeout in plan:
            if flags is None:
                keys.append((k.raw, None))
                continue
            w = f.owner(k.queue)
            p = self.request(slot, w, OP_GET, flags or hold_flag(self, w), k.queue, timeout)
            keys.append((k.raw, p))
        self.seal(slot)

    # -- monitor / confirm -----------------------------------------------------------------------
    def on_monitor(self, cmd: mc.Monitor) -> None:
        q = cmd.queue
        if self.bad_name(q) or self.reads_blocked():
            return
        f = self.front
        if f.config.has_whitelists and self.not_listed(q, "remove"):
            return
        if f.config.aliases.get(q) is not None or cmd.seconds <= 0:
            self.reply_now(mr.END)
            return

        def stream(slot, part, data):
            if part.status == R_ITEM:
                return mr.single_value(q, data)
            return b""

        def finish(slot):
            if not first_failure(slot):
                slot.out += mr.END
        slot = self.new_slot(finish, stream=stream, blocking=True)
        max_items = cmd.max_items if cmd.max_items is not None else -1
        self.request(slot, f.owner(q), OP_MONITOR, 0, q, cmd.seconds * 1000, max_items)
        self.seal(slot)

    def on_confirm(self, cmd: mc.Confirm) -> None:
        if cmd.count < 0:
            self.reply_now(mr.client_error("negative confirm count"), close=True)
            return
        f = self.front

        def finish(slot):
            if slot.parts[0].status == R_OK:
                slot.out = mr.END
            elif not first_failure(slot):
                slot.out = mr.ERROR
        slot = self.new_slot(finish)
        self.request(slot, f.owner(cmd.queue), OP_CONFIRM, 0, cmd.queue, cmd.count)
        self.seal(slot)

    # -- delete / flush --------------------------------------------------------------------------
    def simple_queue_op(self, op: int, queue: str, noreply: bool, ok: bytes) -> None:
        if self.writes_blocked():
            return
        f = self.front
        if op == OP_FLUSH and f.config.has_whitelists and self.not_listed(queue, "remove"):
            return              # a flush is removes (Kestrel: `while (remove().isDefined)`)
        if f.config.aliases.get(queue) is not None or self.check_name(queue) is not None:
            if not noreply:
                self.reply_now(ok)          # aliases and names that cannot exist: a no-op
            return
        if noreply:
            self.notify(f.owner(queue), op, F_NOREPLY, queue)
            return

        def finish(slot):
            if not first_failure(slot):
                slot.out = ok
        slot = self.new_slot(finish)
        self.request(slot, f.owner(queue), op, 0, queue)
        self.seal(slot)

    def on_delete(self, cmd: mc.Delete) -> None:
        self.simple_queue_op(OP_DELETE, cmd.queue, cmd.noreply, mr.DELETED)

    def on_flush(self, cmd: mc.Flush) -> None:
        self.simple_queue_op(OP_FLUSH, cmd.queue, cmd.noreply, mr.END)

    def on_flush_all(self, cmd: mc.FlushAll) -> None:
        if self.writes_blocked():
            return

        def finish(slot):
            if not first_failure(slot):
                slot.out = b"" if cmd.noreply else mr.FLUSHED_ALL
        self.broadcast(self.new_slot(finish), OP_FLUSH_ALL)

    def on_flush_expired(self, cmd: mc.FlushExpired) -> None:
        if self.writes_blocked():
            return
        q = cmd.queue
        f = self.front
        if f.config.aliases.get(q) is not None or self.check_name(q) is not None:
            self.reply_now(mr.count_line(0))
            return

        def finish(slot):
            if not first_failure(slot):
                slot.out = mr.count_line(slot.parts[0].value)
        slot = self.new_slot(finish)
        self.request(slot, f.owner(q), OP_FLUSH_EXPIRED, 0, q)
        self.seal(slot)

    def on_flush_all_expired(self, cmd) -> None:
        def finish(slot):
            if not first_failure(slot):
                slot.out = mr.count_line(sum(p.value for p in slot.parts if p.status == R_VALUE))
        self.broadcast(self.new_slot(finish), OP_FLUSH_ALL_EXPIRED)

    # -- stats and admin commands ----------------------------------------------------------------
    def on_stats(self, cmd) -> None:
        self.stats_slot(lambda g, queues: mr.encode_stats(g, list(queues.items())))

    def on_dump_stats(self, cmd: mc.DumpStats) -> None:
        names = cmd.names or None

        def fmt(g, queues):
            if names is None:
                return mr.encode_dump_stats(list(queues.items()))
            return mr.encode_dump_stats([(n, queues.get(n)) for n in names])
        self.stats_slot(fmt, names)

    def on_dump_config(self, cmd) -> None:
        self.config_slot(mr.encode_dump_config)

    def on_status(self, cmd: mc.Status) -> None:
        st = self.front.status
        if cmd.name is None:
            self.reply_now(mr.status_line(st.reported()))
            return
        try:
            st.set(cmd.name)
        except StatusError as e:
            self.reply_now(mr.client_error(str(e)), close=True)
            return
        self.reply_now(mr.END)

    def on_version(self, cmd) -> None:
        self.reply_now(_VERSION)

    def on_reload(self, cmd) -> None:
        self.reload_slot(mr.RELOADED, mr.server_error)

    def on_shutdown(self, cmd) -> None:
        self.close_after_replies()
        self.front.request_shutdown()

    def on_quit(self, cmd) -> None:
        self.close_after_replies()

    def on_protocol_error(self, cmd: mc.ProtocolError) -> None:
        self.reply_now(cmd.reply, close=cmd.close)


def expiry_of(exptime: int, clock) -> int:
    """A set's expiry, absolute epoch ms, from its exptime (not 0; mc.is_relative).  "Now" is
    when the whole set is in: a streamed body's relative exptime goes to its worker as
    F_AFTER_BODY instead (store)."""
    if mc.is_relative(exptime):
        return expiry_at(clock.now_ms() + exptime * 1000)
    return exptime * 1000


def routed_ahead(fast) -> bool:
    """Whether a request of `fast` (Conn.fast) went to another worker (routed.py), whose reply
    may yet close the connection (issue 11, defect 2: Kestrel ran nothing after the error).  A
    plain get behind it is not fused: it takes a request, with `hold_flag`."""
    for ent in fast:
        if ent[6] >= 0:
            return True
    return False


def hold_flag(c, w: int) -> int:
    """F_HOLD for a plain get of worker `w`, the connection's own worker, while a request of
    `c` is in flight at another one: its item is then held until its reply is written and goes
    back if the connection closes first (Waiting.op_get, fronts/held.py); else 0."""
    if w != c.local:
        return 0
    if routed_ahead(c.fast):
        return F_HOLD
    for part in c.parts.values():
        if part.worker != w:
            return F_HOLD
    return 0


def status_moved(f, st) -> bool:
    """Whether the status block's seq word is not `st.clear` (server/status.py): the fused path's
    check per request (store, on_get).  Compiled, a C read of the front's typed view of the word
    (front.pxd `status_seq`) and a C compare (memcache.pxd), where `st.seq[0] != st.clear` was a
    generic attribute read, a memoryview index, a new int and a rich compare."""
    if COMPILED and f.status_seq is not None:
        word = f.status_seq[0]
        clear = st.clear
        return word != clear
    return st.seq[0] != st.clear


HANDLERS = {kind: getattr(MemcacheConn, name) for kind, name in {
    # by name, looked up on the class: compiled, `MemcacheConn.store` would be the C function
    # of the cpdef method (memcache.pxd), not the Python entry Conn.pump calls
    mc.Get: "on_get", mc.Set: "store", mc.SetRefused: "on_set_refused", mc.SetHead: "store",
    mc.SetPiece: "on_set_piece", mc.Delete: "on_delete", mc.Flush: "on_flush",
    mc.FlushAll: "on_flush_all", mc.FlushExpired: "on_flush_expired",
    mc.FlushAllExpired: "on_flush_all_expired", mc.Stats: "on_stats",
    mc.DumpStats: "on_dump_stats", mc.DumpConfig: "on_dump_config", mc.Monitor: "on_monitor",
    mc.Confirm: "on_confirm", mc.Status: "on_status", mc.Version: "on_version",
    mc.Reload: "on_reload", mc.Shutdown: "on_shutdown", mc.Quit: "on_quit",
    mc.ProtocolError: "on_protocol_error",
}.items()}
