"""Admin-port routes served from this package: `/metrics`, `/` (the dashboard),
`/dashboard.json`, `/stats.json` (with `labels`, `metrics` and `?period=`) and
`/stats.txt`.

These run in the admin process only (`lanner-admin`: the front slot that alone
listens on the admin port and serves no queue client), so rendering never holds
up a loop that serves queues, and the period listeners below exist once per
server.  Each route that needs figures gathers them with the connection's
`stats_slot`, the very request and merge that the memcache `stats` command uses
(each worker answers in slices: server/statsjob.py), then renders them: on the
loop when there are few queues (a few milliseconds), on a one-thread executor
beyond INLINE_QUEUES, so that a large scrape (10,000 queues, seconds of
rendering) leaves the admin process answering `/ping.json` and beating its
heartbeat between the interpreter's thread switches.  The
reply keeps its place in the connection's in-order reply queue: the stats slot
(which writes nothing) is followed by a slot that the render fills.  If a worker
cannot answer, the stats slot writes the 503 and closes, as `/stats.json` did.
"""
from __future__ import annotations

import json
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from importlib import resources

from lanner import __version__
from lanner.fronts.conn import Conn
from lanner.protocols import admin

from . import latency, ostrich, procs

log = logging.getLogger(__name__)

#: path -> route name, merged into protocols.admin.ENDPOINTS
PATHS = {"/metrics": "metrics", "/": "dashboard", "/dashboard": "dashboard",
         "/dashboard.json": "dashboard_json", "/stats.txt": "stats_txt"}

_executor: ThreadPoolExecutor | None = None
_page: bytes | None = None
_listeners: dict[int, ostrich.Listener] = {}
_internal: dict[int, "_InternalConn"] = {}

HTML = "text/html; charset=utf-8"
TEXT = "text/plain; charset=utf-8"
JSON = "application/json"
DASHBOARD_LIMIT = 1000
#: Render on the loop up to this many queues (a few ms); beyond, on the executor thread.
#: A thread costs the loop more than it saves for small renders: every time the loop
#: blocks in epoll it hands the interpreter lock to the render thread and waits up to
#: the switch interval (5 ms) to get it back.
INLINE_QUEUES = 500


def _pool() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:           # made in the front, after fork
        _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lanner-render")
    return _executor


def dashboard_html() -> bytes:
    global _page
    if _page is None:
        _page = resources.files(__package__).joinpath("dashboard.html").read_bytes()
    return _page


def _status(front) -> tuple[str, str]:
    return front.status.reported(), front.status.enforced()


def _finish_later(conn: Conn, req):
    """A slot that holds the reply's place; returns `done(status, body, content_type)`."""
    slot = conn.new_slot()
    slot.close = not req.keep_alive

    def done(status: int, body: bytes, content_type: str) -> None:
        conn.fill(slot, admin.reply(req, status, body, content_type))
    return done


def _gather_render(conn: Conn, req, content_type: str, render) -> None:
    """stats_slot, then `render(global_stats, queues) -> bytes`: inline for a few queues,
    on the executor for more (see INLINE_QUEUES)."""
    loop = conn.front.loop

    def capture(g, queues):
        loop.call_soon(start, g, queues)
        return b""
    conn.stats_slot(capture, call=req)
    done = _finish_later(conn, req)

    def start(g, queues):
        if len(queues) <= INLINE_QUEUES:
            fut = Future()
            try:
                fut.set_result(render(g, queues))
            except Exception as e:
                fut.set_exception(e)
            finished(fut)
            return
        fut = loop.run_in_executor(_pool(), render, g, queues)
        fut.add_done_callback(finished)

    def finished(fut):
        try:
            body = fut.result()
        except Exception as e:              # a bug: say so, keep serving
            log.exception("admin render failed")
            done(500, json.dumps({"error": str(e), "status": 500}).encode(), JSON)
            return
        done(200, body, content_type)


# ------------------------------------------------------------------ routes

def handle(conn: Conn, routed: str, req) -> bool:
    """Serve `routed` if it is one of ours; False when it is not."""
    fn = _ROUTES.get(routed)
    if fn is None:
        return False
    fn(conn, req)
    return True


def _metrics(conn, req):
    # lazy: metrics.py loads prometheus-client (2+ MB per server); the supervisor imports this
    # module before it forks, and only the process that answers a scrape needs the client
    from lanner.ops import metrics
    f = conn.front
    status, lat = _status(f), latency.read(f.counters)

    def render(g, queues):
        return metrics.render(g, queues, status, lat, procs.snapshot())
    _gather_render(conn, req, metrics.CONTENT_TYPE, render)


def _ostrich_doc(conn):
    f = conn.front
    status, lat = _status(f), latency.read(f.counters)

    def build(g, queues):
        body = admin.render_stats_json(g, list(queues.items()))
        return ostrich.document(body, status, __version__, lat), lat
    return build


def _stats(conn, req, as_text=False):
    keep = req.keep_alive
    try:
        period = ostrich.parse_period(req.query.get("period"))
    except ValueError:
        conn.reply_now(admin.reply(req, 400, b'{"error":"period must be a whole number of seconds '
                                             b'from 1 to 86400","status":400}'), close=not keep)
        return
    fmt = (ostrich.text, TEXT) if as_text else (ostrich.dumps, JSON)
    if period is not None:
        lst = _listeners.get(period)
        if lst is not None and lst.latched is not None:
            conn.reply_now(admin.reply(req, 200, fmt[0](lst.latched), fmt[1]), close=not keep)
            return
        if lst is None:
            if len(_listeners) >= ostrich.MAX_LISTENERS:
                _listeners.pop(next(iter(_listeners)))
            lst = _listeners[period] = ostrich.Listener(period)
        build = _ostrich_doc(conn)

        def render_period(g, queues):
            doc, lat = build(g, queues)
            first = lst.latched is None
            if first:
                lst.latch(doc, lat)
                conn.front.loop.call_soon_threadsafe(_schedule, conn.front, lst)
            return fmt[0](lst.latched)
        _gather_render(conn, req, fmt[1], render_period)
        return
    build = _ostrich_doc(conn)
    _gather_render(conn, req, fmt[1], lambda g, q: fmt[0](build(g, q)[0]))


def _stats_txt(conn, req):
    _stats(conn, req, as_text=True)


def _dashboard(conn, req):
    conn.reply_now(admin.reply(req, 200, dashboard_html(), HTML), close=not req.keep_alive)


def dashboard_doc(g, queues, status, lat, processes, started_at: float, limit: int) -> dict:
    gl = {}
    for k, v in g:
        try:
            gl[k] = int(v)
        except (TypeError, ValueError):
            try:
                gl[k] = float(v)
            except (TypeError, ValueError):
                gl[k] = v
    rows = []
    for name, stats in queues.items():
        if stats is None:
            continue
        d: dict = {"name": name}
        for k, v in stats:
            try:
                d[k] = int(v)
            except (TypeError, ValueError):
                d[k] = v
        if "put_items" in d and "items" not in d:
            d["alias"] = True
        rows.append(d)
    rows.sort(key=lambda d: (-d.get("items", 0), d["name"]))
    lat_sum = {}
    for fam, (b, s) in lat.items():
        n = sum(b)
        if n:
            lat_sum[fam] = {"count": n, "mean_us": s // n,
                            "p50_us": int(latency.percentile(b, 0.5) * 1e6),
                            "p99_us": int(latency.percentile(b, 0.99) * 1e6)}
    return {"version": __version__, "time_ms": int(time.time() * 1000),
            "uptime": gl.get("uptime", 0), "started_at": started_at,
            "status": status[0], "enforced_status": status[1], "global": gl,
            "queue_count": len(rows), "queues": rows[:limit], "processes": processes,
            "latency": lat_sum}


def _dashboard_json(conn, req):
    f = conn.front
    status, lat = _status(f), latency.read(f.counters)
    try:
        limit = int(req.query.get("limit", DASHBOARD_LIMIT))
    except ValueError:
        limit = DASHBOARD_LIMIT

    def render(g, queues):
        doc = dashboard_doc(g, queues, status, lat, procs.snapshot(), f.started_at, max(0, limit))
        return json.dumps(doc, separators=(",", ":")).encode()
    _gather_render(conn, req, JSON, render)


_ROUTES = {"metrics": _metrics, "stats": _stats, "stats_txt": _stats_txt,
           "dashboard": _dashboard, "dashboard_json": _dashboard_json}


# ------------------------------------------------------------------ period latches

class _InternalConn(Conn):
    """A connection with no socket, for the latches' own stats requests."""
    counts_connection = False
    __slots__ = ()

    def __init__(self, front):
        super().__init__(front, admin.AdminParser(), count_bytes=False)
        front.conns[self.id] = self

    def handle(self, cmd) -> None:
        raise AssertionError("an internal connection reads no commands")

    def unavailable(self, slot, reason: str) -> None:
        log.warning("front %d: period stats not latched: %s", self.front.index, reason)
        slot.out = b""


def _schedule(front, lst: ostrich.Listener) -> None:
    if front.stopping or _listeners.get(int(lst.period)) is not lst:
        return
    front.loop.call_later(lst.delay(), _relatch, front, lst)


def _relatch(front, lst: ostrich.Listener) -> None:
    """At a period boundary: schedule the next one, then gather and latch (a gather that
    fails, a worker restarting, leaves the previous latch in place)."""
    if front.stopping or _listeners.get(int(lst.period)) is not lst:
        return
    lst.advance()
    _schedule(front, lst)
    ic = _internal.get(front.index)
    if ic is None:
        ic = _internal[front.index] = _InternalConn(front)
    status, lat = _status(front), latency.read(front.counters)

    def capture(g, queues):
        body = admin.render_stats_json(g, list(queues.items()))
        lst.latch(ostrich.document(body, status, __version__, lat), lat)
        return b""
    ic.cur_fam = -1
    ic.stats_slot(capture)
    ic.flush_out()
