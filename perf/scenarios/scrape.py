"""scrape (Lanner's admin port): what `GET /metrics` costs.

1. effect: the `mixed` load (closed-loop sessions interleaving 64-byte sets and gets on one
   queue) for `--duration` seconds, alternately without and with a Prometheus-style scraper
   that GETs /metrics every `--interval` seconds (100 ms), `--rounds` times each (A B A B ...).
   Reports requests/s of each run, the median of each side and their ratio; the check is that
   scraping costs at most `--max-drop` (5 %).
2. size: `--queues` queues (10,000) holding one item each, then `--repeats` scrapes of
   /metrics (and, for comparison, /stats.json and the memcache `stats` command): wall time,
   body size and sample count.  Meanwhile a client issues empty `get`s back to back; its
   worst latency during the scrapes shows whether a scrape stalls request handling.

Needs the admin port: `--admin-port N`, or with `--start lanner` pass
`--lanner-arg=--admin-port=N` (the scenario reads it from there).
"""
from __future__ import annotations

import http.client
import socket
import statistics
import threading
import time

from lanner.perf.context import ScenarioError, check_clean
from lanner.perf.loadgen import Load
from lanner.perf.report import RATE_COLUMNS, Report
from lanner.perf.scenarios import add_options

NAME = "scrape"
HELP = "Lanner /metrics: scrape time and size with many queues, effect of 100 ms scrapes on mixed"
COMPARE = None


def add_arguments(p) -> None:
    g = p.add_argument_group("scrape")
    g.add_argument("--admin-port", type=int, help="the server's admin HTTP port")
    add_options(g, concurrency=(10, "mixed connections"), duration=(5.0, "seconds per mixed run"))
    g.add_argument("--rounds", type=int, default=3, help="runs without and with scraping, each (default 3)")
    g.add_argument("--interval", type=float, default=0.1, help="seconds between scrapes (default 0.1)")
    g.add_argument("--max-drop", type=float, default=5.0, help="allowed throughput drop in %% (default 5)")
    g.add_argument("--queues", type=int, default=10000, help="queues for the size phase (default 10000)")
    g.add_argument("--repeats", type=int, default=5, help="scrapes in the size phase (default 5)")
    g.add_argument("--skip-effect", action="store_true", help="only the size phase")
    g.add_argument("--skip-size", action="store_true", help="only the effect phase")


def admin_port(args) -> int:
    if args.admin_port:
        return args.admin_port
    extra = list(getattr(args, "lanner_arg", []) or [])
    for i, a in enumerate(extra):
        if a.startswith("--admin-port="):
            return int(a.split("=", 1)[1])
        if a == "--admin-port" and i + 1 < len(extra):
            return int(extra[i + 1])
    raise ScenarioError("scrape needs the admin port: --admin-port N "
                        "(with --start lanner also --lanner-arg=--admin-port=N)")


def fetch(host: str, port: int, path: str) -> tuple[float, bytes]:
    t = time.perf_counter()
    c = http.client.HTTPConnection(host, port, timeout=120)
    try:
        c.request("GET", path)
        r = c.getresponse()
        body = r.read()
        if r.status != 200:
            raise ScenarioError(f"GET {path}: HTTP {r.status}")
    finally:
        c.close()
    return time.perf_counter() - t, body


class Scraper(threading.Thread):
    def __init__(self, host, port, interval):
        super().__init__(daemon=True)
        self.host, self.port, self.interval = host, port, interval
        self.stop_event = threading.Event()
        self.times: list[float] = []
        self.size = 0

    def run(self):
        next_at = time.monotonic()
        while not self.stop_event.is_set():
            dt, body = fetch(self.host, self.port, "/metrics")
            self.times.append(dt)
            self.size = len(body)
            next_at += self.interval
            self.stop_event.wait(max(0.0, next_at - time.monotonic()))


def run(args, ctx) -> Report:
    ctx.require_queues(NAME)
    host, port = ctx.target.host, admin_port(args)
    report = Report(NAME, {"concurrency": args.concurrency, "duration": args.duration, "rounds": args.rounds,
                           "interval": args.interval, "queues": args.queues, "repeats": args.repeats},
                    ctx.target.describe(),
                    columns=RATE_COLUMNS + [("scrapes", "scrapes", "{}"),
                                                                      ("scrape_ms", "scrape ms", "{:.1f}")])
    fetch(host, port, "/ping.json")
    if not args.skip_effect:
        effect(args, ctx, report, host, port)
    if not args.skip_size:
        size(args, ctx, report, host, port)
    return report


def effect(args, ctx, report, host, port) -> None:
    queue = "scrape_mixed"
    ctx.flush(queue)
    _, res = ctx.measure(Load(producers=1, sets=512, value_size=64, queue=queue, depth=32), "prefill", 512)
    check_clean(report, res, "prefill")
    rates = {False: [], True: []}
    for r in range(args.rounds):
        for scraping in (False, True):
            label = f"{'scrape' if scraping else 'plain'} {r + 1}"
            scraper = Scraper(host, port, args.interval) if scraping else None
            if scraper:
                scraper.start()
            row, res = ctx.measure(Load(conns=args.concurrency, duration=args.duration, get_ratio=0.5,
                                        value_size=64, queue=queue), label)
            if scraper:
                scraper.stop_event.set()
                scraper.join()
            check_clean(report, res, label)
            row.update(label=label, scrapes=len(scraper.times) if scraper else 0,
                       scrape_ms=1000 * statistics.median(scraper.times) if scraper and scraper.times else 0.0)
            report.rows.append(row)
            rates[scraping].append(row["ops_s"])
    plain, scraped = statistics.median(rates[False]), statistics.median(rates[True])
    drop = 100.0 * (1 - scraped / plain) if plain else 0.0
    report.notes.append(f"mixed c={args.concurrency}: median {plain:.0f} req/s without scrapes, "
                        f"{scraped:.0f} with a /metrics scrape every {args.interval * 1000:.0f} ms "
                        f"({drop:+.1f} % drop)")
    report.check("scrape effect", drop <= args.max_drop,
                 f"{drop:.1f} % drop (allowed {args.max_drop} %)")


def _fill(host, port, n) -> None:
    with socket.create_connection((host, port)) as s:
        batch = 500
        for start in range(0, n, batch):
            s.sendall(b"".join(b"set scrape_q%05d 0 0 4\r\nitem\r\n" % i
                               for i in range(start, min(n, start + batch))))
            want = b"STORED\r\n" * (min(n, start + batch) - start)
            got = b""
            while len(got) < len(want):
                chunk = s.recv(65536)
                if not chunk:
                    raise ScenarioError("server closed the connection while creating queues")
                got += chunk
            if got != want:
                raise ScenarioError(f"creating queues: unexpected reply {got[:80]!r}")


class Pinger(threading.Thread):
    """Back-to-back `get` of an empty queue; records each round trip."""

    def __init__(self, host, port):
        super().__init__(daemon=True)
        self.host, self.port = host, port
        self.stop_event = threading.Event()
        self.lat: list[float] = []

    def run(self):
        with socket.create_connection((self.host, self.port)) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while not self.stop_event.is_set():
                t = time.perf_counter()
                s.sendall(b"get scrape_ping\r\n")
                buf = b""
                while not buf.endswith(b"END\r\n"):
                    buf += s.recv(4096)
                self.lat.append(time.perf_counter() - t)


def size(args, ctx, report, host, port) -> None:
    t = time.perf_counter()
    _fill(ctx.target.host, ctx.target.port, args.queues)
    report.notes.append(f"created {args.queues} queues in {time.perf_counter() - t:.1f} s")
    idle = Pinger(ctx.target.host, ctx.target.port)
    idle.start()
    time.sleep(1.0)
    idle.stop_event.set()
    idle.join()
    pinger = Pinger(ctx.target.host, ctx.target.port)
    pinger.start()
    times, body = [], b""
    for _ in range(args.repeats):
        dt, body = fetch(host, port, "/metrics")
        times.append(dt)
    pinger.stop_event.set()
    pinger.join()
    samples = sum(1 for ln in body.split(b"\n") if ln and not ln.startswith(b"#"))
    js = [fetch(host, port, "/stats.json")[0] for _ in range(args.repeats)]
    st = []
    with socket.create_connection((ctx.target.host, ctx.target.port)) as s:
        for _ in range(args.repeats):
            t = time.perf_counter()
            s.sendall(b"stats\r\n")
            buf = b""
            while not buf.endswith(b"\r\nEND\r\n"):
                buf += s.recv(1 << 20)
            st.append(time.perf_counter() - t)
    q = lambda xs: statistics.quantiles(xs, n=1000)[-1] if len(xs) > 10 else max(xs)  # noqa: E731
    report.notes.append(
        f"/metrics with {args.queues} queues: median {statistics.median(times) * 1000:.0f} ms "
        f"(min {min(times) * 1000:.0f}, max {max(times) * 1000:.0f}) over {args.repeats} scrapes, "
        f"{len(body) / 1e6:.2f} MB, {samples} samples")
    report.notes.append(f"/stats.json: median {statistics.median(js) * 1000:.0f} ms; memcache `stats`: "
                        f"median {statistics.median(st) * 1000:.0f} ms")
    report.notes.append(
        f"empty get round trip while scraping: p50 {statistics.median(pinger.lat) * 1e6:.0f} µs, "
        f"p99.9 {q(pinger.lat) * 1e6:.0f} µs, max {max(pinger.lat) * 1000:.1f} ms "
        f"({len(pinger.lat)} gets); idle: p50 {statistics.median(idle.lat) * 1e6:.0f} µs, "
        f"max {max(idle.lat) * 1000:.1f} ms")
    report.rows.append({"label": f"/metrics x{args.repeats}", "ops": args.repeats, "scrapes": args.repeats,
                        "scrape_ms": 1000 * statistics.median(times)})
