"""The commands every protocol has that span all workers: stats, dump_config, reload.

Each sends one part to every worker (or to the owners of the queues it names) and formats the
merged answer when the last part is in; the protocol passes the formatter, so the merge is
written once for memcache, text, thrift and admin.  A mixin of `Conn` (conn.py), which provides
`new_slot`, `request`, `seal`, `reply_now`, `unavailable` and `front`.
"""
from __future__ import annotations

import msgpack

from typing import TYPE_CHECKING

from lanner.ipc.messages import OP_DUMP_CONFIG, OP_RELOAD, OP_STATS, R_DATA, R_OK

if TYPE_CHECKING:                 # conn.py imports this mixin, not the reverse
    from lanner.fronts.slots import Slot


class ServerCommands:
    __slots__ = ()       # Conn's slots hold the state (conn.py)

    def broadcast(self, slot: Slot, op: int, payload: bytes = b"", flags: int = 0) -> None:
        for w in range(self.front.nworkers):
            self.request(slot, w, op, flags, b"", 0, 0, payload)
        self.seal(slot)

    def stats_slot(self, finish_bytes, names=None, call=None) -> None:
        """Ask every worker (or the owners of `names`) for stats and let finish_bytes format them.
        `call` rides on the slot for `unavailable` (the admin port's request: a HEAD gets no body)."""
        f = self.front

        def finish(slot):
            worker_globals, queues = [], {}
            err = None
            for p in slot.parts:
                if p.status != R_DATA:
                    err = p
                    continue
                d = msgpack.unpackb(p.payload)
                if "global" in d:
                    worker_globals.append(d["global"])
                for name, st in d["queues"]:
                    queues[name] = st
            if err is not None:
                self.unavailable(slot, err.payload.decode("latin-1", "replace") or "worker unavailable")
                return
            slot.out = finish_bytes(f.global_stats(worker_globals), queues)

        slot = self.new_slot(finish, call=call)
        if names is None:
            self.broadcast(slot, OP_STATS)
            return
        by_worker: dict[int, list[str]] = {}
        for n in names:
            by_worker.setdefault(f.owner(n), []).append(n)
        for w, ns in by_worker.items():
            self.request(slot, w, OP_STATS, 0, b"", 0, 0, msgpack.packb(ns))
        self.seal(slot)

    def config_slot(self, finish_bytes) -> None:
        def finish(slot):
            entries = []
            for p in slot.parts:
                if p.status == R_DATA:
                    entries.extend(msgpack.unpackb(p.payload))
            slot.out = finish_bytes(sorted(entries))
        slot = self.new_slot(finish)
        self.broadcast(slot, OP_DUMP_CONFIG)

    def reload_slot(self, ok: bytes, error) -> None:
        """`reload`: this front checks the file first; if it is bad, the answer is
        `error(reason)` at once and nothing changes anywhere.  Otherwise every worker reloads,
        and the answer is `ok` only if every one of them succeeded."""
        err = self.front.request_reload()
        if err is not None:
            self.reply_now(error("reload failed: " + err))
            return

        def finish(slot):
            for p in slot.parts:
                if p.status != R_OK:
                    why = p.payload.decode("latin-1", "replace") or "worker %d failed" % p.worker
                    slot.out = error("reload failed: " + why)
                    return
            slot.out = ok
        slot = self.new_slot(finish)
        self.broadcast(slot, OP_RELOAD)
