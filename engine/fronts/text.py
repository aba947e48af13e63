"""A text-protocol client connection in a front (reference §2).

Every text get is a reliable read that the next get, peek, monitor or confirm on
the same queue confirms (F_CONFIRM_ALL), so consumers are always one item behind;
availability errors are `-Server not available for operation <op>` lines and the
connection stays open.
"""
from __future__ import annotations

from lanner.protocols import text as tx

from lanner import __version__
from lanner.fronts.conn import Conn, expiry_at
from lanner.fronts.counters import C_GET, C_PEEK, C_SET
from lanner.fronts.putbound import put_bound, refusal
from lanner.fronts.slots import Slot
from lanner.server.status import StatusError
from lanner.ipc.messages import (F_CONFIRM_ALL, F_OPEN, F_PEEK, OP_ALIAS_PUT, OP_CONFIRM, OP_DELETE,
                       OP_FLUSH, OP_GET, OP_MONITOR, OP_PUT_MANY, OP_SET, R_ERROR, R_ITEM, R_OK,
                       R_SERVER_ERROR, RF_CLOSE)

_VERSION = tx.string(__version__)


def _blocked(op: str) -> bytes:
    return tx.error("Server not available for operation " + op)


class TextConn(Conn):
    __slots__ = ()               # Conn's slots are all its state (conn.py)

    def __init__(self, front):
        # a put item larger than any queue the put reaches takes is dropped as it arrives
        super().__init__(front, tx.TextParser(item_limit=lambda q: put_bound(front.config, q)))

    def handle(self, cmd) -> None:
        _HANDLERS[type(cmd)](self, cmd)

    def unavailable(self, slot: Slot, reason: str) -> None:
        slot.out = tx.error(reason)

    def bad_name(self, queue: str) -> bool:
        return self.close_with(self.check_name(queue), tx.error)

    def refused(self, queue: str, refusal, op_name: str, listed_op: str | None = None) -> bool:
        """Whether the command ends here: a bad queue name closes the connection; a refused
        read or write (`refusal`: read_refusal or write_refusal) answers Kestrel's error for the
        handler `op_name`, and the connection stays; so does a client-id whitelist refusing
        the queue operation `listed_op` ("add" or "remove"; text callers have no client id)."""
        if self.bad_name(queue):
            return True
        if refusal() is not None:
            self.reply_now(_blocked(op_name))
            return True
        return listed_op is not None and self.not_listed(queue, listed_op)

    def not_listed(self, queue: str, op: str) -> bool:
        reason = self.front.config.has_whitelists and self.whitelist_refusal(queue, op)
        if reason:
            self.reply_now(tx.error(reason))
        return bool(reason)

    def failure(self, slot: Slot) -> bool:
        """A worker failure becomes an error line; if the worker said RF_CLOSE (it rolled the
        connection's open reads back and takes nothing more from it), the connection closes."""
        for p in slot.parts:
            if p.status == R_SERVER_ERROR:
                slot.out = tx.error(p.payload.decode("latin-1", "replace"))
                slot.close = bool(p.flags & RF_CLOSE)
                return True
        return False

    # -- commands --------------------------------------------------------------------------------
    def on_put(self, cmd: tx.Put) -> None:
        q = cmd.queue
        if self.refused(q, self.write_refusal, "setItem", "add"):
            return
        f = self.front
        f.my.incr(C_SET, len(cmd.items))
        expiry = 0 if cmd.expiry_ms is None else expiry_at(f.clock.now_ms() + cmd.expiry_ms)
        dests = f.config.aliases.get(q)
        targets = dests if dests is not None else (q,)
        if dests is not None:
            f.send(f.owner(q), self.id, 0, OP_ALIAS_PUT, 0, q.encode("latin-1"), len(cmd.items),
                   sum(len(i) if type(i) is bytes else i.size for i in cmd.items))
        ntargets = len(targets)

        def finish(slot):
            if self.failure(slot):
                return
            stored = 0
            parts = slot.parts
            for i in range(0, len(parts), max(ntargets, 1)):
                group = parts[i:i + ntargets]
                if all(p.status == R_OK for p in group):
                    stored += 1
            if ntargets == 0:
                stored = len(cmd.items)
            slot.out = tx.count(stored)
        slot = self.new_slot(finish)
        for data in cmd.items:
            if type(data) is bytes:
                for t in targets:
                    self.request(slot, f.owner(t), OP_SET, 0, t.encode("latin-1"), expiry, 0, data)
            else:               # an Oversized: refused where its bytes would have been
                for t in targets:
                    self.request(slot, f.owner(t), OP_PUT_MANY, 0, t.encode("latin-1"), expiry, 0,
                                 refusal(data))
        self.seal(slot)

    def fetch(self, queue: str, flags: int, timeout: int | None, counter: int, op_name: str) -> None:
        if self.refused(queue, self.read_refusal, op_name, None if flags & F_PEEK else "remove"):
            return
        f = self.front
        f.my.incr(counter)
        if f.config.aliases.get(queue) is not None:
            self.reply_now(tx.NONE)
            return
        t = timeout if timeout is not None and timeout > 0 else -1
        mot = f.config.server.max_open_transactions

        def finish(slot):
            if self.failure(slot):
                return
            p = slot.parts[0]
            if p.status == R_ITEM:
                slot.out = tx.item(p.payload)
            elif p.status == R_ERROR:
                slot.out = tx.error("Too many open transactions; limit=%d" % mot)
            else:
                slot.out = tx.NONE
        slot = self.new_slot(finish, blocking=t > 0)
        self.request(slot, f.owner(queue), OP_GET, flags, queue.encode("latin-1"), t)
        self.seal(slot)

    def on_get(self, cmd: tx.Get) -> None:
        self.fetch(cmd.queue, F_CONFIRM_ALL | F_OPEN, cmd.timeout_ms, C_GET, "getItem")

    def on_peek(self, cmd: tx.Peek) -> None:
        self.fetch(cmd.queue, F_CONFIRM_ALL | F_PEEK, cmd.timeout_ms, C_PEEK, "getItem")

    def on_monitor(self, cmd: tx.Monitor) -> None:
        q = cmd.queue
        if self.refused(q, self.read_refusal, "monitorUntil", "remove"):
            return
        f = self.front
        if f.config.aliases.get(q) is not None:
            self.reply_now(tx.NONE)
            return

        def stream(slot, part, data):
            return tx.item(data) if part.status == R_ITEM else b""

        def finish(slot):
            if not self.failure(slot):
                slot.out += tx.NONE
        slot = self.new_slot(finish, stream=stream, blocking=True)
        self.request(slot, f.owner(q), OP_MONITOR, F_CONFIRM_ALL, q.encode("latin-1"),
                     max(cmd.timeout_ms, 0), -1)
        self.seal(slot)

    def on_confirm(self, cmd: tx.Confirm) -> None:
        f = self.front
        if cmd.count < 0:
            self.reply_now(tx.error("Not that many transactions open."))
            return

        def finish(slot):
            if self.failure(slot):
                return
            if slot.parts[0].status == R_OK:
                slot.out = tx.count(cmd.count)
            else:
                slot.out = tx.error("Not that many transactions open.")
        slot = self.new_slot(finish)
        self.request(slot, f.owner(cmd.queue), OP_CONFIRM, 0, cmd.queue.encode("latin-1"), cmd.count)
        self.seal(slot)

    def queue_op(self, op: int, queue: str, op_name: str) -> None:
        f = self.front
        if self.write_refusal() is not None:
            self.reply_now(_blocked(op_name))
            return
        if f.config.aliases.get(queue) is not None or self.check_name(queue) is not None:
            self.reply_now(tx.count(0))
            return
        if op == OP_FLUSH and self.not_listed(queue, "remove"):
            return              # a flush is removes (Kestrel: `while (remove().isDefined)`)

        def finish(slot):
            if not self.failure(slot):
                slot.out = tx.count(0)
        slot = self.new_slot(finish)
        self.request(slot, f.owner(queue), op, 0, queue.encode("latin-1"))
        self.seal(slot)

    def on_flush(self, cmd: tx.Flush) -> None:
        self.queue_op(OP_FLUSH, cmd.queue, "flush")

    def on_delete(self, cmd: tx.Delete) -> None:
        self.queue_op(OP_DELETE, cmd.queue, "delete")

    def on_status(self, cmd: tx.Status) -> None:
        st = self.front.status
        if cmd.name is None:
            self.reply_now(tx.string(st.reported().upper()))
            return
        try:
            st.set(cmd.name)
        except StatusError as e:
            self.reply_now(tx.error(str(e)))
            return
        self.reply_now(tx.count(0))

    def on_version(self, cmd) -> None:
        self.reply_now(_VERSION)

    def on_shutdown(self, cmd) -> None:
        self.reply_now(tx.count(0))
        self.front.request_shutdown()

    def on_quit(self, cmd) -> None:
        self.close_after_replies()

    def on_reply(self, cmd: tx.Reply) -> None:
        self.reply_now(cmd.reply)

    def on_protocol_error(self, cmd: tx.ProtocolError) -> None:
        self.reply_now(cmd.reply, close=cmd.close)


_HANDLERS = {
    tx.Put: TextConn.on_put, tx.Get: TextConn.on_get, tx.Peek: TextConn.on_peek,
    tx.Monitor: TextConn.on_monitor, tx.Confirm: TextConn.on_confirm, tx.Flush: TextConn.on_flush,
    tx.Delete: TextConn.on_delete, tx.Status: TextConn.on_status, tx.Version: TextConn.on_version,
    tx.Shutdown: TextConn.on_shutdown, tx.Quit: TextConn.on_quit, tx.Reply: TextConn.on_reply,
    tx.ProtocolError: TextConn.on_protocol_error,
}
