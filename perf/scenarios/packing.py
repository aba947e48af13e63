"""packing (Kestrel's JournalPacking, darner's packing.sh): first one cycle on the empty queue (the
baseline), then a backlog (default: N items, as Kestrel's first write-only cycle; make it larger
than the server's max_memory_size to test read-behind), then cycles in which one producer writes
N items while one consumer reads N items concurrently, with pauses between cycles for the
journal packer; finally the backlog is drained.  One producer and one consumer make the order
strict: every item must come back with exactly the next sequence number.  Reports items/s read
per cycle and its ratio to the empty-queue baseline.
"""
from __future__ import annotations

import time
from dataclasses import replace

from lanner.perf.context import check_clean, check_payloads
from lanner.perf.loadgen import Load
from lanner.perf.report import Plot, Report
from lanner.perf.scenarios import add_options

NAME = "packing"
HELP = "backlog beyond memory, then concurrent write/read cycles with strict order checks"
COMPARE = None


def add_arguments(p) -> None:
    g = p.add_argument_group("packing (Kestrel's JournalPacking names and defaults)")
    add_options(g, queue="spam", count=(25000, "items written and read per cycle"), kilobytes=1,
                bytes=(None, "bytes per item (overrides -k)"))
    g.add_argument("-t", "--pause", type=float, default=1.0, help="seconds between cycles (default 1)")
    g.add_argument("-c", "--cycles", type=int, default=100, help="read/write cycles (default 100)")
    g.add_argument("-x", "--transactions", action="store_true", help="read with get q/t=1000/close/open")
    g.add_argument("--backlog", type=int, help="items written before the cycles (default: -n)")
    g.add_argument("--no-baseline", action="store_true", help="skip the empty-queue cycle")
    add_options(g, no_flush=True, timeout=(600.0, "give up a cycle after this many seconds"))


def run(args, ctx) -> Report:
    ctx.require_queues(NAME)
    size = args.bytes if args.bytes is not None else args.kilobytes * 1024
    backlog = args.count if args.backlog is None else args.backlog
    report = Report(NAME, {"count": args.count, "bytes": size, "cycles": args.cycles, "pause_s": args.pause,
                           "backlog": backlog, "backlog_mb": round(backlog * size / 2**20, 1),
                           "transactions": args.transactions, "queue": args.queue},
                    ctx.target.describe(),
                    columns=[("backlog", "backlog", "{:,}"), ("items_s", "items/s", "{:,.0f}"),
                             ("vs_empty", "vs empty", "{:.2f}"), ("misses", "misses", "{:,}"),
                             ("set_p99_us", "set p99 µs", "{:,.0f}"), ("get_p99_us", "get p99 µs", "{:,.0f}"),
                             ("client_us_op", "client µs/op", "{:.1f}"), ("server_us_op", "server µs/op", "{:.1f}")])
    if not args.no_flush:
        ctx.flush(args.queue)
    suffix = "/t=1000" + ("/close/open" if args.transactions else "")
    base = Load(value_size=max(size, 16), queue=args.queue, verify=True, timeout=args.timeout)
    state = {"write": 0, "read": 0}

    def cycle(label: str, writes: int, reads: int, in_backlog: int) -> dict:
        load = replace(base, producers=1 if writes else 0, consumers=1 if reads else 0, sets=writes, gets=reads,
                       until_hits=True, get_suffix=suffix, seq_base=state["write"], expect_producers=1,
                       expect_count=reads, expect_seq_base=state["read"], strict_order=True)
        row, res = ctx.measure(load, label, writes + reads)
        check_clean(report, res, label)
        if reads:
            check_payloads(report, res, label, reads)
        state["write"] += writes
        state["read"] += reads
        phase = "cycle" if writes and reads else ("fill" if writes else "drain")
        row = {"label": label, "phase": phase, "backlog": in_backlog,
               **row, "items_s": round(res["hits"] / res["elapsed_s"], 1) if reads and res["elapsed_s"] else None}
        report.rows.append(row)
        return row

    empty = None
    if not args.no_baseline:
        empty = cycle("empty", args.count, args.count, 0)
    if backlog:
        cycle("backlog", backlog, 0, 0)
    for i in range(1, args.cycles + 1):
        cycle(f"cycle {i}", args.count, args.count, backlog)
        if args.pause and i < args.cycles:
            time.sleep(args.pause)
    if backlog:
        cycle("drain", 0, backlog, backlog)
    if empty and empty["items_s"]:
        for row in report.rows:
            if row["phase"] == "cycle" and row["items_s"] is not None:
                row["vs_empty"] = round(row["items_s"] / empty["items_s"], 3)
    cycles = [r for r in report.rows if r["label"].startswith("cycle")]
    if cycles and empty:
        worst = min(r["vs_empty"] for r in cycles)
        report.notes.append(f"worst cycle with a {backlog:,}-item ({backlog * size / 2**20:.0f} MiB) backlog: "
                            f"{worst:.2f}x the empty-queue throughput")
    report.plots.append(Plot("cycles.png", "label", ["items_s"], "cycle", "items read/s",
                             f"packing: {backlog:,} x {size} B backlog", rows="cycle"))
    return report
