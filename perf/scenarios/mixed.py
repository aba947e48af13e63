"""mixed (darner's `db` bench and flood.sh): closed-loop sessions that interleave sets and gets on
one queue at the ratio gets:sets, 64-byte items by default, swept over concurrency levels
(`-c 1,10,100,1000`).  Like darner's flood.sh, a few items are put first so gets usually find one.
Reports requests/s and latency per concurrency, plus the drop between the lowest and highest
concurrency of 100 or more.  With --depth D each connection writes D requests at a time.
"""
from __future__ import annotations

from lanner.perf.context import check_clean
from lanner.perf.loadgen import Load
from lanner.perf.report import RATE_COLUMNS, Plot, Report
from lanner.perf.scenarios import add_options, int_list

NAME = "mixed"
HELP = "darner's db: interleaved set/get at a ratio, concurrency sweep"
COMPARE = "ops_s"


def add_arguments(p) -> None:
    g = p.add_argument_group("mixed (darner's db names and defaults)")
    add_options(g, sets=(10000, "sets per concurrency level"))
    g.add_argument("-g", "--gets", type=int, default=10000, help="gets per concurrency level (default 10000)")
    add_options(g, item_size=64)
    g.add_argument("-c", "--concurrency", type=int_list, default=[10],
                   help="connections; a comma list sweeps, e.g. 1,10,100,1000 (default 10)")
    add_options(g, queue="db_bench", depth=(1, "requests per write (default 1: closed loop)"))
    add_options(g, duration=(None, "run each level this many seconds (ratio gets/(gets+sets)) instead of counts"))
    g.add_argument("--prefill", type=int, default=512, help="items put first (default 512, as flood.sh)")
    add_options(g, no_flush=True)


def run(args, ctx) -> Report:
    report = Report(NAME, {"sets": args.sets, "gets": args.gets, "item_size": args.item_size,
                           "concurrency": args.concurrency, "depth": args.depth, "duration": args.duration,
                           "prefill": args.prefill, "queue": args.queue},
                    ctx.target.describe(), columns=[("conns", "conns", "{}")] + RATE_COLUMNS)
    if not args.no_flush:
        ctx.flush(args.queue)
    if args.prefill:
        _, res = ctx.measure(Load(producers=1, sets=args.prefill, value_size=args.item_size, queue=args.queue,
                                  depth=32), "prefill", args.prefill)
        check_clean(report, res, "prefill")
    ratio = args.gets / (args.gets + args.sets) if args.gets + args.sets else 0.5
    for conns in args.concurrency:
        if args.duration:
            load = Load(conns=conns, duration=args.duration, get_ratio=ratio, value_size=args.item_size,
                        queue=args.queue, depth=args.depth)
            expect = None
        else:
            load = Load(conns=conns, sets=args.sets, gets=args.gets, value_size=args.item_size,
                        queue=args.queue, depth=args.depth)
            expect = args.sets + args.gets
        row, res = ctx.measure(load, f"c={conns}", expect)
        report.rows.append({"label": f"c={conns}", **row})
        check_clean(report, res, f"c={conns}")
    big = [r for r in report.rows if r["conns"] >= 100]
    if len(big) >= 2 and big[0]["ops_s"]:
        drop = 100.0 * (1 - big[-1]["ops_s"] / big[0]["ops_s"])
        report.notes.append(f"throughput drop from {big[0]['conns']} to {big[-1]['conns']} connections: {drop:.1f} %")
    report.plots.append(Plot("throughput.png", "conns", ["ops_s"], "connections", "requests/s",
                             f"mixed: {args.item_size} B, gets:sets {args.gets}:{args.sets}", logx=True))
    report.plots.append(Plot("latency.png", "conns", ["p50_us", "p99_us", "p999_us"], "connections", "latency (µs)",
                             f"mixed: latency, {args.item_size} B", logx=True, logy=True))
    return report
