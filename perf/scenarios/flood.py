"""flood (Kestrel's Flood): R producers and C consumers at once push N items through one queue;
items/s end to end (from the first put to the last item read).  -B makes consumers use blocking
reads (`get q/t=1000`); -r rolls R requests into one write (pipelining) on both sides.  Every
item read is checked: intact, read once, and in order per producer.  Kestrel's consumers rolled
up reads with `monitor`; here they pipeline plain gets, which works on any memcache server.
"""
from __future__ import annotations

from dataclasses import replace

from lanner.perf.context import check_clean, check_payloads
from lanner.perf.loadgen import Load
from lanner.perf.report import RATE_COLUMNS, Plot, Report
from lanner.perf.scenarios import add_options

NAME = "flood"
HELP = "producers and consumers at once through one queue; items/s end to end"
COMPARE = "items_s"


def add_arguments(p) -> None:
    g = p.add_argument_group("flood (Kestrel's names and defaults)")
    add_options(g, count=(10000, "items to push through"), kilobytes=1,
                bytes=(None, "bytes per item (overrides -k)"), queue=("spam", "queue name"))
    g.add_argument("-P", "--prefill", type=int, default=0, help="items put before the test (default 0)")
    g.add_argument("-R", "--producers", type=int, default=1, help="producer connections (default 1)")
    g.add_argument("-C", "--consumers", type=int, default=1, help="consumer connections (default 1)")
    add_options(g, rollup=1)
    g.add_argument("-B", "--blocking", action="store_true", help="blocking reads (get q/t=1000)")
    add_options(g, no_flush=True, timeout=600.0)


def run(args, ctx) -> Report:
    size = args.bytes if args.bytes is not None else args.kilobytes * 1024
    checking = ctx.target.queues and size >= 16
    report = Report(NAME, {"count": args.count, "bytes": size, "producers": args.producers,
                           "consumers": args.consumers, "rollup": args.rollup, "blocking": args.blocking,
                           "prefill": args.prefill, "queue": args.queue},
                    ctx.target.describe(),
                    columns=[("items_s", "items/s", "{:,.0f}"), ("misses", "misses", "{:,}")] + RATE_COLUMNS)
    if not args.no_flush:
        ctx.flush(args.queue)
    per_producer = -(-args.count // args.producers)
    base = Load(depth=args.rollup, value_size=size, queue=args.queue, verify=checking, timeout=args.timeout)
    if args.prefill:
        pre = replace(base, producers=1, sets=args.prefill, producer_base=args.producers)
        row, res = ctx.measure(pre, "prefill", args.prefill)
        check_clean(report, res, "prefill")
    load = replace(base, producers=args.producers, consumers=args.consumers, sets=args.count, gets=args.count,
                   until_hits=True, get_suffix="/t=1000" if args.blocking else "",
                   expect_producers=args.producers + 1, expect_count=max(per_producer, args.prefill))
    row, res = ctx.measure(load, "flood", 2 * args.count)
    report.rows.append({"label": f"{args.producers}p{args.consumers}c", **row})
    check_clean(report, res, "flood")
    if checking:
        check_payloads(report, res, "flood", args.count)
    else:
        report.notes.append(f"{ctx.target.name} has no queue semantics: items are not checked")
    report.plots.append(Plot("latency.png", "label", ["p50_us", "p99_us", "p999_us", "max_us"], "",
                             "latency (µs)", f"flood: {args.producers} producers, {args.consumers} consumers, "
                             f"{size} B", kind="bar", logy=True))
    return report
