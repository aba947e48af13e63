"""fairness: small sets are measured while large items (8 MiB by default) flood another queue of
the same worker from other connections (issue 8's P8: a flood on one queue must not stall small
requests on OTHER queues of the worker).  A server that serves connections fairly keeps the small
sets' tail latency low even while it moves hundreds of MB/s of large items.

The small sets go to `<queue>_small<n>`, the first such name whose placement partition
(queues/placement.py) is the flood queue's: the same partition is on the same worker whatever the
worker count.  `--same-queue` is darner's fairness.sh instead: the small sets go into the flood's
own queue.  darner's flood only set; here the flood connections also read by default
(--large-get-ratio 0.5) so the backlog, and the disk it takes, stays bounded; pass 0 for darner's
exact setup.
"""
from __future__ import annotations

from lanner.perf.context import check_clean
from lanner.perf.loadgen import Load, start
from lanner.perf.report import RATE_COLUMNS, Plot, Report, progress_bar
from lanner.perf.scenarios import add_options
from lanner.queues.placement import partition_of

NAME = "fairness"
HELP = "small sets on a queue of the same worker measured while large items flood another queue"
COMPARE = "p99_us"


def add_arguments(p) -> None:
    g = p.add_argument_group("fairness (darner's db names and defaults)")
    add_options(g, sets=(100000, "small sets measured"), concurrency=(10, "small-set connections"),
                item_size=(64, "bytes per small item"), queue="db_bench")
    g.add_argument("--large-size", type=int, default=8 * 2**20, help="bytes per large item (default 8 MiB)")
    g.add_argument("--large-concurrency", type=int, default=10, help="flooding connections (default 10)")
    g.add_argument("--large-get-ratio", type=float, default=0.5,
                   help="share of gets among the flood's requests (default 0.5; darner: 0)")
    g.add_argument("--same-queue", action="store_true",
                   help="darner's variant: the small sets go into the flood's queue")
    add_options(g, duration=(None, "measure small sets for this many seconds instead of -s"), no_flush=True)


def run(args, ctx) -> Report:
    report = Report(NAME, {"sets": args.sets, "concurrency": args.concurrency, "item_size": args.item_size,
                           "large_size": args.large_size, "large_concurrency": args.large_concurrency,
                           "large_get_ratio": args.large_get_ratio, "duration": args.duration,
                           "queue": args.queue, "small_queue": small_queue(args)},
                    ctx.target.describe(), columns=[("mb_s", "MB/s", "{:,.1f}")] + RATE_COLUMNS)
    small_q = small_queue(args)
    if not args.no_flush:
        ctx.flush(*dict.fromkeys([args.queue, small_q]))
    flood = start(Load(host=ctx.target.host, port=ctx.target.port, conns=args.large_concurrency,
                       duration=24 * 3600.0, get_ratio=args.large_get_ratio, value_size=args.large_size,
                       queue=args.queue), progress=lambda n: None)
    try:
        bar = progress_bar(None, "flood starting", ctx.progress)
        started = flood.started.wait(60.0)
        bar.close()
        if args.duration:
            small = Load(producers=args.concurrency, duration=args.duration, value_size=args.item_size,
                         queue=small_q)
        else:
            small = Load(producers=args.concurrency, sets=args.sets, value_size=args.item_size, queue=small_q)
        row, res = ctx.measure(small, "small sets", None if args.duration else args.sets)
    finally:
        large = flood.stop()
    mb_s = round(res["bytes_out"] / res["elapsed_s"] / 1e6, 2) if res["elapsed_s"] else None
    where = "same queue" if small_q == args.queue else f"queue {small_q}"
    report.rows.append({"label": f"{args.item_size} B sets ({where})", "mb_s": mb_s, **row})
    check_clean(report, res, "small sets")
    lrow = {"label": f"{human(args.large_size)} flood", "ops": large["ops"],
            "ops_s": round(large["ops_per_s"], 1),
            "mb_s": round((large["bytes_out"] + large["bytes_in"]) / large["elapsed_s"] / 1e6, 1),
            "p50_us": large["latency_us"]["p50"], "p99_us": large["latency_us"]["p99"],
            "p999_us": large["latency_us"]["p999"], "max_us": large["latency_us"]["max"],
            "client_us_op": round(large["cpu_us_per_op"], 1),
            "errors": large["errors"]}
    report.rows.append(lrow)
    report.check("flood: running", started and large["ops"] > 0,
                 f"{large['ops']} large requests during the measurement")
    report.check("flood: clean", large["errors"] == 0 and not large["not_stored"],
                 f"{large['errors']} errors, {large['not_stored']} NOT_STORED (first: {large['first_error']})"
                 if large["errors"] or large["not_stored"] else "no errors")
    report.notes.append("server µs/op of the small-set row includes the CPU spent on the flood")
    report.plots.append(Plot("latency.png", "label", ["p50_us", "p99_us", "p999_us", "max_us"], "",
                             "latency (µs)", f"fairness: {args.item_size} B sets during a "
                             f"{human(args.large_size)} flood", kind="bar", logy=True))
    return report


def small_queue(args) -> str:
    """Where the small sets go: the flood's queue (--same-queue), or the first `<queue>_small<n>`
    in the flood queue's partition, which is on the flood's worker whatever the worker count."""
    if args.same_queue:
        return args.queue
    want = partition_of(args.queue)
    n = 0
    while partition_of(f"{args.queue}_small{n}") != want:
        n += 1
    return f"{args.queue}_small{n}"


def human(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} B"
