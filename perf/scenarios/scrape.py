"""scrape (Lanner's admin port): what `GET /metrics` costs, and whether it holds up queue clients.

The admin port is served by the `lanner-admin` process alone; each worker builds its part of
the figures in slices.  This scenario measures the result on a noisy machine by comparing
interleaved runs, and reports the figures that noise does not move (server CPU per request,
CPU per scrape) next to the ones it does (requests/s, wall-clock latency).

1. effect: the `mixed` load (closed-loop sessions interleaving 64-byte sets and gets on one
   queue) for `--duration` seconds, without and with a Prometheus-style scraper that GETs
   /metrics every `--interval` seconds (100 ms), `--rounds` pairs in A B B A order.  Reports
   each side's median requests/s and median server CPU µs per request; the checks are that
   scraping costs at most `--max-drop` % (5) of either.
2. size: `--queues` queues (10,000) holding one item each, then `--repeats` scrapes of
   /metrics, each after a quiet spell as long as the scrape before it (and, for comparison,
   /stats.json and the memcache `stats` command): wall time, body size, sample count, and
   the CPU one scrape costs each process role.  Meanwhile a client of each worker (a process
   of its own: perf/stall.py) gets an empty queue that worker owns, back to back: its p50,
   p99 and worst round trip during the scrapes against the quiet spells between them shows
   how long a scrape holds that worker's clients.

Needs the admin port: `--admin-port N`, or a server `--start lanner` started (its admin port
is on).  `--lanner-config` with
`[default]` `keep_journal = false` makes creating 10,000 queues take seconds, not minutes.
"""
from __future__ import annotations

import http.client
import os
import socket
import statistics
import tempfile
import threading
import time

from lanner.perf import stall
from lanner.perf.context import ScenarioError, check_clean
from lanner.perf.loadgen import Load
from lanner.perf.report import RATE_COLUMNS, Report
from lanner.perf.scenarios import add_options
from lanner.queues.placement import worker_of

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


def admin_port(args, target) -> int:
    """--admin-port, else the port of the server `--start` started."""
    port = args.admin_port or target.admin_port
    if not port:
        raise ScenarioError("scrape needs the admin port: --admin-port N")
    return port


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
    host, port = ctx.target.host, admin_port(args, ctx.target)
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


def _pct(after: float, before: float) -> float:
    return 100.0 * (after / before - 1) if before else 0.0


def effect(args, ctx, report, host, port) -> None:
    queue = "scrape_mixed"
    ctx.flush(queue)
    _, res = ctx.measure(Load(producers=1, sets=512, value_size=64, queue=queue, depth=32), "prefill", 512)
    check_clean(report, res, "prefill")
    rates: dict[bool, list[float]] = {False: [], True: []}
    cpu: dict[bool, list[float]] = {False: [], True: []}
    per_scrape: list[float] = []
    for r in range(args.rounds):
        for scraping in ((False, True) if r % 2 == 0 else (True, False)):     # A B B A ...
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
            if row["server_us_op"] is not None:
                cpu[scraping].append(row["server_us_op"])
            admin_us = (row["server_us_op_by_role"] or {}).get("admin")
            if scraper and scraper.times and admin_us:
                per_scrape.append(admin_us * row["ops"] / len(scraper.times) / 1000)
    plain, scraped = statistics.median(rates[False]), statistics.median(rates[True])
    drop = -_pct(scraped, plain)
    report.notes.append(f"mixed c={args.concurrency}: median {plain:.0f} req/s without scrapes, "
                        f"{scraped:.0f} with a /metrics scrape every {args.interval * 1000:.0f} ms "
                        f"({drop:+.1f} % drop; wall-clock rates on a shared machine are noisy)")
    report.check("scrape effect (req/s)", drop <= args.max_drop, f"{drop:.1f} % drop (allowed {args.max_drop} %)")
    if cpu[False] and cpu[True]:
        c0, c1 = statistics.median(cpu[False]), statistics.median(cpu[True])
        more = _pct(c1, c0)
        report.notes.append(f"server CPU per request: median {c0:.1f} µs without scrapes, {c1:.1f} µs with "
                            f"({more:+.1f} %)" + (f"; the admin process spends {statistics.median(per_scrape):.1f}"
                                                  f" ms of CPU per scrape" if per_scrape else ""))
        report.check("scrape cost (server µs/op)", more <= args.max_drop,
                     f"{more:+.1f} % CPU per request (allowed {args.max_drop} %)")


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


def _workers(ctx) -> int:
    """How many workers the server runs (its processes named lanner-w*), 1 if unknown."""
    tree = ctx.target.tree
    if tree is None:
        return 1
    return max(1, tree.count("worker"))


def _cpu_ms(before: dict, after: dict, n: int) -> str:
    per = {r: (after.get(r, 0.0) - before.get(r, 0.0)) * 1000 / n for r in after}
    return ", ".join(f"{r} {ms:.0f} ms" for r, ms in sorted(per.items()) if ms >= 0.5) or "none measured"


def size(args, ctx, report, host, port) -> None:
    t = time.perf_counter()
    _fill(ctx.target.host, ctx.target.port, args.queues)
    report.notes.append(f"created {args.queues} queues in {time.perf_counter() - t:.1f} s")
    tree = ctx.target.tree
    cpu0 = tree.cpu_by_role() if tree else {}
    times, body = [], b""
    for _ in range(args.repeats):                # alone: what a scrape costs each process role
        dt, body = fetch(host, port, "/metrics")
        times.append(dt)
    cpu1 = tree.cpu_by_role() if tree else {}
    nworkers = _workers(ctx)
    tmp = tempfile.mkdtemp(prefix="lanner-scrape-")
    clients = []
    for w in range(nworkers):
        q = next(f"scrape_idle{i}" for i in range(10_000) if worker_of(f"scrape_idle{i}", nworkers) == w)
        path = os.path.join(tmp, f"w{w}.gets")
        clients.append((w, stall.start(ctx.target.port, q, path, ctx.target.host), path))
    try:
        time.sleep(1.0)          # the clients' connections settle on their workers
        scraping, quiet = [], []
        for _ in range(args.repeats):            # with a client of each worker: how long it waits
            t0 = time.perf_counter()
            time.sleep(statistics.median(times))          # a quiet spell as long as a scrape
            t1 = time.perf_counter()
            dt, _ = fetch(host, port, "/metrics")
            quiet.append((t0, t1))
            scraping.append((t1, t1 + dt))
        gets = {w: stall.finish(proc, path) for w, proc, path in clients}
    finally:
        for _, proc, _ in clients:
            if proc.poll() is None:
                proc.kill()
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
    report.notes.append(
        f"/metrics with {args.queues} queues: median {statistics.median(times) * 1000:.0f} ms "
        f"(min {min(times) * 1000:.0f}, max {max(times) * 1000:.0f}) over {args.repeats} scrapes in a row, "
        f"{len(body) / 1e6:.2f} MB, {samples} samples; CPU per scrape: {_cpu_ms(cpu0, cpu1, args.repeats)}")
    report.notes.append(f"/stats.json: median {statistics.median(js) * 1000:.0f} ms; memcache `stats`: "
                        f"median {statistics.median(st) * 1000:.0f} ms")
    for w, g in gets.items():
        during = stall.summary([d for ds in stall.within(g, scraping) for d in ds])
        idle = stall.summary([d for ds in stall.within(g, quiet) for d in ds])
        worst = statistics.median(max(ds, default=0.0) for ds in stall.within(g, scraping)) * 1000
        report.notes.append(
            f"worker {w}'s client, back-to-back empty gets: during scrapes p50 {during['p50_ms'] * 1000:.0f} µs, "
            f"p99 {during['p99_ms']:.1f} ms, max {during['max_ms']:.1f} ms (median of the scrapes' worst "
            f"{worst:.1f} ms; {during['n']} gets); quiet: p50 {idle['p50_ms'] * 1000:.0f} µs, "
            f"p99 {idle['p99_ms']:.1f} ms, max {idle['max_ms']:.1f} ms ({idle['n']} gets)")
    report.rows.append({"label": f"/metrics x{args.repeats}", "ops": args.repeats, "scrapes": args.repeats,
                        "scrape_ms": 1000 * statistics.median(times)})
