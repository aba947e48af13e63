"""A thrift client connection in a front (reference §3): Kestrel's service over framed binary.

Calls are handled one at a time per connection (no thrift multiplexing), so every call
holds the connection until its reply is written.  Thrift open reads are different from
memcache ones: their ids are server-wide (each worker deals ids `k * workers + index + 1`,
so an id names its worker), they outlive the connection and only confirm, abort or the
auto-abort timer settles them.  Errors are TApplicationExceptions with Kestrel's texts.
"""
from __future__ import annotations

import struct

import msgpack

from lanner.protocols import thrift as th
from lanner.protocols import thrift_replies as tr
from lanner.protocols.oversized import Oversized

from lanner import __version__
from lanner.fronts.conn import Conn, expiry_at
from lanner.fronts.counters import C_PEEK, C_SET
from lanner.fronts.putbound import put_bound, refusal
from lanner.fronts.slots import Slot
from lanner.ipc.messages import (F_THRIFT, OP_ALIAS_PUT, OP_DELETE, OP_FLUSH, OP_FLUSH_ALL, OP_PUT_MANY,
                       OP_SET, OP_TABORT, OP_TCONFIRM, OP_TGET, OP_TPEEK, R_DATA, R_OK,
                       R_SERVER_ERROR, R_VALUE)

_AVAIL = "net.lag.kestrel.AvailabilityException: Server not available for operation %s"
_UNLISTED = "net.lag.kestrel.AvailabilityException: "
_UNLIMITED = 1 << 62
_STATUS_OUT = {"Up": th.STATUS_UP, "ReadOnly": th.STATUS_READ_ONLY, "Quiescent": th.STATUS_QUIESCENT}
_STATUS_IN = {th.STATUS_UP: "up", th.STATUS_READ_ONLY: "readonly", th.STATUS_QUIESCENT: "quiescent"}


def count_attempts(front, stored: int, sent: int) -> None:
    """cmd_set of a put: Kestrel's loop tried each item until the first one refused and stopped
    there (reference §3.3, §4.3), so the items after that one were never attempted."""
    front.my.incr(C_SET, stored + 1 if stored < sent else sent)


def _size(item: Oversized) -> int:
    return item.size


class ThriftConn(Conn):
    conn_flags = F_THRIFT          # its open reads outlive it; it never pipelines past an error
    __slots__ = ()               # Conn's slots are all its state (conn.py)

    def __init__(self, front):
        # a put item larger than any queue the put reaches takes is dropped as it arrives
        # bytes_read / bytes_written cover memcache and text only (§9.5)
        super().__init__(front, th.ThriftParser(item_limit=lambda q: put_bound(front.config, q)),
                         count_bytes=False)

    def unavailable(self, slot: Slot, reason: str) -> None:
        call = slot.call
        slot.out = tr.encode_exception(call.method, call.seqid, 6,
                                       tr.internal_error(call.method, "java.io.IOException: " + reason),
                                       self.parser.upgraded)

    # -- replies ---------------------------------------------------------------------------------
    def reply(self, call, value) -> None:
        self.reply_now(tr.encode_reply(call, value, self.parser.upgraded))

    def fail(self, call, java_exception: str) -> None:
        self.reply_now(tr.encode_exception(call.method, call.seqid, 6,
                                           tr.internal_error(call.method, java_exception),
                                           self.parser.upgraded))

    def call_slot(self, call, finish) -> Slot:
        """A slot whose reply is built by `finish(slot) -> value`; worker failures become
        INTERNAL_ERROR exceptions."""
        up = self.parser.upgraded

        def done(slot):
            for p in slot.parts:
                if p.status == R_SERVER_ERROR:
                    self.unavailable(slot, p.payload.decode("latin-1", "replace"))
                    return
            slot.out = tr.encode_reply(call, finish(slot), up)
        return self.new_slot(done, blocking=True, call=call)

    # -- calls -----------------------------------------------------------------------------------
    def handle(self, cmd) -> None:
        t = type(cmd)
        if t is th.Call:
            getattr(self, "do_" + cmd.method)(cmd)
        elif t is th.Upgrade:
            self.reply_now(tr.encode_upgrade_reply(cmd.seqid))
            self.parser.upgraded = True
        elif t is th.BadCall:
            self.reply_now(tr.encode_exception(cmd.method, cmd.seqid, cmd.exc_type, cmd.message,
                                               self.parser.upgraded))
        else:                     # a ProtocolError: Kestrel's finagle server closed, saying nothing
            self.close_after_replies()

    def queue_ok(self, call, queue: str) -> bool:
        reason = self.check_name(queue)
        if reason is None:
            return True
        self.fail(call, "java.lang.Exception: " + reason)
        return False

    def not_listed(self, call, queue: str, op: str) -> bool:
        """A client-id whitelist refuses `op` on the queue (or an alias's destinations) for this
        call's client id (its TTwitter header's, or none): INTERNAL_ERROR, connection kept."""
        reason = self.front.config.has_whitelists and self.whitelist_refusal(queue, op, call.client_id)
        if reason:
            self.fail(call, _UNLISTED + reason)
        return bool(reason)

    def do_put(self, call) -> None:
        q = call.args["queue_name"]
        items = call.args["items"]
        f = self.front
        if self.write_refusal() is not None:
            self.fail(call, _AVAIL % "setItem")
            return
        if not items:
            self.reply(call, 0)
            return
        if not self.queue_ok(call, q) or self.not_listed(call, q, "add"):
            return
        ms = call.args["expiration_msec"]
        expiry = 0 if ms == 0 else expiry_at(f.clock.now_ms() + ms)
        dests = f.config.aliases.get(q)
        if dests is None:
            def stored(slot):
                n = slot.parts[0].value if slot.parts[0].status == R_VALUE else 0
                count_attempts(f, n, len(items))
                return n
            slot = self.call_slot(call, stored)
            # an Oversized goes as its size: the worker refuses it there and stops (OP_PUT_MANY)
            self.request(slot, f.owner(q), OP_PUT_MANY, 0, q.encode("latin-1"), expiry, 0,
                         msgpack.packb(items, default=_size))
            self.seal(slot)
            return
        # the alias's own put_items/put_bytes (§5.7), counted by its owner as memcache and text do
        f.send(f.owner(q), self.id, 0, OP_ALIAS_PUT, 0, q.encode("latin-1"), len(items),
               sum(_size(i) if type(i) is Oversized else len(i) for i in items))
        n = max(len(dests), 1)

        def count(slot):
            added = 0
            for i in range(len(items)):
                if all(p.status == R_OK for p in slot.parts[i * n:(i + 1) * n]):
                    added += 1
                else:
                    break
            added = added if dests else len(items)
            count_attempts(f, added, len(items))
            return added
        slot = self.call_slot(call, count)
        for data in items:
            for d in dests:
                if type(data) is Oversized:
                    self.request(slot, f.owner(d), OP_PUT_MANY, 0, d.encode("latin-1"), expiry, 0,
                                 refusal(data))
                else:
                    self.request(slot, f.owner(d), OP_SET, 0, d.encode("latin-1"), expiry, 0, data)
        self.seal(slot)

    def do_get(self, call) -> None:
        a = call.args
        q = a["queue_name"]
        f = self.front
        if self.read_refusal() is not None:
            self.fail(call, _AVAIL % "monitorUntil")
            return
        max_items = a["max_items"]
        if max_items == 0:          # [] at once: no name lookup, no whitelist (reference §3.3)
            self.reply(call, [])
            return
        if not self.queue_ok(call, q) or self.not_listed(call, q, "remove"):
            return
        if f.config.aliases.get(q) is not None:
            self.reply(call, [])
            return
        budget = max_items if max_items > 0 else _UNLIMITED

        def items(slot):
            p = slot.parts[0]
            if p.status != R_DATA:
                return []
            return [th.Item(data, tid) for data, tid in msgpack.unpackb(p.payload)]
        slot = self.call_slot(call, items)
        self.request(slot, f.owner(q), OP_TGET, 0, q.encode("latin-1"), max(a["timeout_msec"], 0),
                     budget, struct.pack("<q", max(a["auto_abort_msec"], 0)))
        self.seal(slot)

    def settle(self, call, op: int) -> None:
        # Ids come from one server-wide sequence (§3.3), so they do not name their worker:
        # every worker settles the ones it holds and the counts add up.
        ids = [tid for tid in call.args["ids"] if tid > 0]
        if not ids:
            self.reply(call, 0)
            return
        slot = self.call_slot(call, lambda s: sum(p.value for p in s.parts if p.status == R_VALUE))
        self.broadcast(slot, op, msgpack.packb(ids))

    def do_confirm(self, call) -> None:
        self.settle(call, OP_TCONFIRM)

    def do_abort(self, call) -> None:
        self.settle(call, OP_TABORT)

    def do_peek(self, call) -> None:
        q = call.args["queue_name"]
        f = self.front
        if self.read_refusal() is not None:
            self.fail(call, _AVAIL % "getItem")
            return
        if f.config.aliases.get(q) is not None:
            self.fail(call, "java.util.NoSuchElementException: key not found: items")
            return
        if not self.queue_ok(call, q):
            return
        f.my.incr(C_PEEK)

        def info(slot):
            head, items, nbytes, logsize, age, waiters, opens = msgpack.unpackb(slot.parts[0].payload)
            return th.QueueInfo(head, items, nbytes, logsize, age, waiters, opens)
        slot = self.call_slot(call, info)
        self.request(slot, f.owner(q), OP_TPEEK, 0, q.encode("latin-1"))
        self.seal(slot)

    def queue_write(self, call, op: int, op_name: str) -> None:
        q = call.args["queue_name"]
        f = self.front
        if self.write_refusal() is not None:
            self.fail(call, _AVAIL % op_name)
            return
        if f.config.aliases.get(q) is not None or self.check_name(q) is not None:
            self.reply(call, None)
            return
        if op == OP_FLUSH and self.not_listed(call, q, "remove"):
            return              # a flush is removes (Kestrel: `while (remove().isDefined)`)
        slot = self.call_slot(call, lambda s: None)
        self.request(slot, f.owner(q), op, 0, q.encode("latin-1"))
        self.seal(slot)

    def do_flush_queue(self, call) -> None:
        self.queue_write(call, OP_FLUSH, "flush")

    def do_delete_queue(self, call) -> None:
        self.queue_write(call, OP_DELETE, "delete")

    def do_flush_all_queues(self, call) -> None:
        if self.write_refusal() is not None:
            self.fail(call, _AVAIL % "flush")
            return
        slot = self.call_slot(call, lambda s: None)
        self.broadcast(slot, OP_FLUSH_ALL)

    def do_current_status(self, call) -> None:
        self.reply(call, _STATUS_OUT.get(self.front.status.reported(), th.STATUS_NOT_CONFIGURED))

    def do_set_status(self, call) -> None:
        name = _STATUS_IN.get(call.args["status"])
        if name is None:
            self.fail(call, "net.lag.kestrel.UnknownStatusException: Unknown status.")
            return
        self.front.status.set(name)
        self.reply(call, None)

    def do_get_version(self, call) -> None:
        self.reply(call, __version__)
