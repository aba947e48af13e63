"""Kestrel's client-id whitelists (reference §5.12): which client may add to or remove from a queue.

Checked only where a queue's configuration names a whitelist (`config.has_whitelists`), so plain
Python, apart from the compiled `Conn` (conn.py).
"""
from __future__ import annotations


class Whitelists:
    """Conn's whitelist check.  Empty slots: the state is Conn's."""
    __slots__ = ()

    def whitelist_refusal(self, queue: str, op: str, client_id: str | None = None) -> str | None:
        """Why Kestrel's client-id whitelists (reference §5.12) refuse `op` ("add" or
        "remove") on `queue` (an add to an alias: on any destination), or None.  Only a thrift
        call's TTwitter header carries a client id, so memcache and text callers (None) never
        pass a whitelist.  A fanout child's enqueue list is not checked: its master's add is
        the one that counts."""
        cfg = self.front.config
        names = (queue,)
        if op == "add":
            names = cfg.aliases.get(queue) or names
        for q in names:
            qc = cfg.queue_config(q)
            if op == "add":
                allowed = None if "+" in q else qc.white_list_client_id_for_enqueue
                verb = "enqueue to"
            else:
                allowed = qc.white_list_client_id_for_dequeue
                verb = "dequeue from"
            if allowed is None or client_id == allowed:
                continue
            if client_id is None:
                why = f"ClientId not specified when queue {q} only allows a white-listed clientId"
            else:
                why = f"ClientId {client_id} is not allowed to {verb} queue {q}"
            return f"The operation {op} is disallowed on queue {q}. {why}"
        return None
