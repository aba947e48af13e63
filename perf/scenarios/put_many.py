"""put-many (Kestrel's PutMany): C clients each put N/C items of B bytes into Q queues, closed loop
(or R per write with --rollup); with --get, the same clients then read every item back and each
payload is checked (identity, bytes, order per producer, none lost or duplicated).  Reports
throughput and latency percentiles per phase.  Against memcached the get phase measures reads
of a key-value cache and payload checks are skipped.
"""
from __future__ import annotations

from dataclasses import replace

from lanner.perf.context import check_clean, check_payloads
from lanner.perf.loadgen import Load
from lanner.perf.report import RATE_COLUMNS, Plot, Report
from lanner.perf.scenarios import add_options

NAME = "put-many"
HELP = "C clients put N items of B bytes into Q queues; optional checked get phase"
COMPARE = "ops_s"


def add_arguments(p) -> None:
    g = p.add_argument_group("put-many (Kestrel's names and defaults)")
    add_options(g, clients=100, count=(10000, "total items to put"), bytes=1024,
                rollup=(1, "requests per write, i.e. pipelining"),
                queue=("spam", "queue name, or prefix with -Q"))
    g.add_argument("-Q", "--queues", type=int, default=1, help="number of queues (default 1)")
    add_options(g, no_flush=(None, "don't flush the queue(s) first"))
    g.add_argument("-g", "--get", action="store_true", help="get (and check) the items afterwards")


def queue_names(args) -> list[str]:
    return [args.queue + (str(i) if args.queues > 1 else "") for i in range(args.queues)]


def run(args, ctx) -> Report:
    per_client = args.count // args.clients
    total = per_client * args.clients
    checking = ctx.target.queues and args.bytes >= 16
    report = Report(NAME, {"clients": args.clients, "count": total, "bytes": args.bytes, "rollup": args.rollup,
                           "queue": args.queue, "queues": args.queues, "get": args.get},
                    ctx.target.describe(), columns=[("ops", "ops", "{:,}")] + RATE_COLUMNS)
    if not args.no_flush:
        ctx.flush(*queue_names(args))
    base = Load(depth=args.rollup, value_size=args.bytes, queue=args.queue, queues=args.queues)
    put = replace(base, producers=args.clients, sets=total, verify=checking)
    row, res = ctx.measure(put, "put", total)
    report.rows.append({"label": "put", "phase": "put", **row})
    check_clean(report, res, "put")
    if args.get:
        get = replace(base, consumers=args.clients, gets=total, verify=checking,
                      expect_producers=args.clients, expect_count=per_client)
        row, res = ctx.measure(get, "get", total)
        report.rows.append({"label": "get", "phase": "get", **row})
        check_clean(report, res, "get")
        if checking:
            check_payloads(report, res, "get", total)
            report.check("get: no misses", res["misses"] == 0, f"{res['misses']} gets found the queue empty")
        else:
            report.notes.append(f"{ctx.target.name} has no queue semantics (or items < 16 bytes): "
                                "payload checks skipped")
    report.plots.append(Plot("latency.png", "label", ["p50_us", "p99_us", "p999_us", "max_us"], "phase",
                             "latency (µs)", f"put-many: {args.clients} clients, {args.bytes} B", kind="bar",
                             logy=True))
    return report
