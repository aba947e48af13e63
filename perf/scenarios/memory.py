"""memory (darner's mem_rss.sh): RSS, PSS and USS summed over all of the server's processes while
a queue's backlog grows to N items (default 1M x 1 KiB = 1 GiB) and then drains, measured at
each step of a doubling series.  PSS is the fair figure for a forked server: pages shared by the
supervisor and its children are split between them instead of counted once per process.  Needs
the server's processes on this machine (--start, --server-pid, or a local listener).  Items are
read back with their payloads checked, so a lost or mangled item fails the run.
"""
from __future__ import annotations

from lanner.perf.context import ScenarioError, check_clean, check_payloads
from lanner.perf.loadgen import Load
from lanner.perf.report import Plot, Report
from lanner.perf.scenarios import add_options, int_list

NAME = "memory"
HELP = "RSS/PSS of all server processes as a backlog grows to N items and drains"
COMPARE = None
MB = 2**20


def add_arguments(p) -> None:
    g = p.add_argument_group("memory (darner's mem_rss names)")
    g.add_argument("-n", "--items", type=int, default=1048576, help="largest backlog in items (default 1048576)")
    add_options(g, item_size=1024, concurrency=10, depth=16)
    g.add_argument("--steps", type=int_list, help="backlog sizes to measure at (default: 0, 1024, 2048, ... N)")
    add_options(g, queue="db_bench", no_flush=True)


def steps(n: int) -> list[int]:
    out, s = [0], 1024
    while s < n:
        out.append(s)
        s *= 2
    return out + [n] if n else out


def run(args, ctx) -> Report:
    ctx.require_queues(NAME)
    if ctx.target.tree is None:
        raise ScenarioError(f"memory needs the server's processes: run it on the server's machine, "
                            f"pass --server-pid, or use --start ({ctx.target.name} has no local listener)")
    levels = sorted(set(args.steps)) if args.steps else steps(args.items)
    size = max(args.item_size, 16)
    report = Report(NAME, {"items": levels[-1], "item_size": size, "steps": levels, "concurrency": args.concurrency,
                           "depth": args.depth, "queue": args.queue},
                    ctx.target.describe(),
                    columns=[("items", "items", "{:,}"), ("backlog_mb", "backlog MB", "{:,.0f}"),
                             ("rss_mb", "RSS MB", "{:,.1f}"), ("pss_mb", "PSS MB", "{:,.1f}"),
                             ("uss_mb", "USS MB", "{:,.1f}"), ("processes", "procs", "{}"),
                             ("ops_s", "ops/s", "{:,.0f}")])
    if not args.no_flush:
        ctx.flush(args.queue)
    conns = args.concurrency
    current = 0

    def sample(phase: str, items: int, row: dict | None) -> None:
        mem = ctx.target.tree.memory()
        stats = ctx.queue_stats(args.queue)
        report.rows.append({"label": f"{phase} {items}", "phase": phase, "items": items,
                            "backlog_mb": round(items * size / MB, 1), "rss_mb": round(mem["rss"] / MB, 1),
                            "pss_mb": round(mem["pss"] / MB, 1), "uss_mb": round(mem["uss"] / MB, 1),
                            "processes": mem["processes"], "ops_s": row["ops_s"] if row else None,
                            "queue_items": _int(stats.get("items")), "mem_items": _int(stats.get("mem_items")),
                            "mem_bytes": _int(stats.get("mem_bytes"))})

    sample("grow", 0, None)
    for level in levels[1:]:
        load = Load(producers=conns, sets=level - current, value_size=size, queue=args.queue, depth=args.depth,
                    verify=True, producer_base=0, seq_base=current)
        row, res = ctx.measure(load, f"grow to {level}", level - current)
        check_clean(report, res, f"grow to {level}")
        current = level
        sample("grow", level, row)
    total = current
    for level in reversed(levels[:-1]):
        load = Load(consumers=conns, gets=current - level, value_size=size, queue=args.queue, depth=args.depth,
                    verify=True, expect_producers=conns, expect_count=total)
        row, res = ctx.measure(load, f"drain to {level}", current - level)
        check_clean(report, res, f"drain to {level}")
        check_payloads(report, res, f"drain to {level}", None)
        report.check(f"drain to {level}: no misses", res["misses"] == 0, f"{res['misses']} gets found the queue empty")
        current = level
        sample("drain", level, row)
    peak = max(r["pss_mb"] for r in report.rows)
    report.notes.append(f"peak PSS {peak:,.1f} MB with up to {total:,} items ({total * size / MB:,.0f} MB) queued")
    report.plots.append(Plot("memory-grow.png", "items", ["rss_mb", "pss_mb", "uss_mb"], "items queued", "MB",
                             f"memory while growing ({size} B items)", logx=True, rows="grow"))
    report.plots.append(Plot("memory-drain.png", "items", ["rss_mb", "pss_mb", "uss_mb"], "items queued", "MB",
                             f"memory while draining ({size} B items)", logx=True, rows="drain"))
    return report


def _int(value) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
