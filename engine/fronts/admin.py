"""An admin HTTP connection: `/ping.json`, `/stats.json`, `/server_info.json`, and the
operations routes of lanner.ops.endpoints (`/metrics`, `/`, `/stats.txt`, ...).  Only the
admin process (`lanner-admin`, a front slot that listens on the admin port alone) runs these.

The figures are the same as the memcache `stats` command's, gathered from every
worker the same way, rendered in the shape Kestrel's Ostrich admin served them.
"""
from __future__ import annotations

import time

from lanner.protocols import admin

from lanner import __version__
from lanner.fronts.conn import Conn
from lanner.fronts.slots import Slot
from lanner.ops import endpoints


class AdminConn(Conn):
    counts_connection = False
    __slots__ = ()               # Conn's slots are all its state (conn.py)

    def __init__(self, front):
        super().__init__(front, admin.AdminParser(), count_bytes=False)

    def unavailable(self, slot: Slot, reason: str) -> None:
        body = b'{"error":"%s"}' % reason.encode("ascii", "replace")
        head_only = isinstance(slot.call, admin.HttpRequest) and slot.call.method == "HEAD"
        slot.out = admin.response(503, body, keep_alive=False, head_only=head_only)
        slot.close = True

    def handle(self, req) -> None:
        if isinstance(req, admin.HttpError):
            self.reply_now(req.reply, close=True)
            return
        routed = admin.route(req)
        keep = req.keep_alive
        if isinstance(routed, bytes):
            self.reply_now(routed, close=not keep)
            return
        if routed == "server_info":
            f = self.front
            body = admin.render_server_info_json(__version__, int(f.started_at * 1000),
                                                 int((time.time() - f.started_at) * 1000))
            self.reply_now(admin.reply(req, 200, body), close=not keep)
            return
        endpoints.handle(self, routed, req)     # /stats.json, /stats.txt, /metrics, /, /dashboard.json
