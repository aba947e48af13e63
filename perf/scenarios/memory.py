"""memory (darner's mem_rss.sh): RSS, PSS and USS summed over all of the server's processes while
a queue's backlog grows to N items (default 1M x 1 KiB = 1 GiB) and then drains, measured at
each step of a doubling series.  PSS is the fair figure for a forked server: pages shared by the
supervisor and its children are split between them instead of counted once per process.  Needs
the server's processes on this machine (--start, --server-pid, or a local listener).  Items are
read back with their payloads checked, so a lost or mangled item fails the run.

After the drain, `--settle` seconds later, one more row ("settled") shows what the server
keeps once the backlog is gone.  Each step's row also splits PSS by process role (w workers, c cleaner, s supervisor, ...) and
carries the queue's `mem_items`/`mem_bytes`, which show read-behind at work (they stay at
`max_memory_size` while the backlog grows past it).  Step samples alone miss short-lived
processes (the cleaner forks one per journal pack) and whatever happens between steps, so a
poller thread also reads the whole tree every `--poll` seconds and the report's peak is the
largest total it saw, with that moment's per-process figures.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import psutil

from lanner.perf.context import ScenarioError, check_clean, check_payloads
from lanner.perf.loadgen import Load
from lanner.perf.report import Plot, Report
from lanner.perf.scenarios import add_options, int_list
from lanner.perf.servers import ProcTree, role_of
from lanner.perf.smaps import ProcMaps, read_all

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
    g.add_argument("--poll", type=float, default=0.25, help="seconds between peak-PSS polls (default 0.25)")
    g.add_argument("--settle", type=float, default=7.0,
                   help="seconds to wait after the drain before a last sample (default 7; a worker "
                        "hands a drained backlog's heap back within about 5 s)")


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
                             ("by_role", "PSS by role MB", "{}"), ("mem_items", "mem_items", "{:,}"),
                             ("mem_mb", "mem MB", "{:,.1f}"), ("ops_s", "ops/s", "{:,.0f}"),
                             ("client_us_op", "client µs/op", "{:.1f}"), ("server_us_op", "server µs/op", "{:.1f}")])
    if not args.no_flush:
        ctx.flush(args.queue)

    def sample(phase: str, items: int, row: dict | None) -> None:
        snap = Snapshot.take(ctx.target.tree)
        stats = ctx.queue_stats(args.queue)
        report.rows.append({"label": f"{phase} {items}", "phase": phase, "items": items,
                            "backlog_mb": round(items * size / MB, 1), "rss_mb": round(snap.rss / MB, 1),
                            "pss_mb": round(snap.pss / MB, 1), "uss_mb": round(snap.uss / MB, 1),
                            "processes": len(snap.procs), "by_role": snap.by_role(),
                            "ops_s": row["ops_s"] if row else None,
                            "client_us_op": row["client_us_op"] if row else None,
                            "server_us_op": row["server_us_op"] if row else None,
                            "queue_items": _int(stats.get("items")), "mem_items": _int(stats.get("mem_items")),
                            "mem_mb": _mb(stats.get("mem_bytes")), "mem_bytes": _int(stats.get("mem_bytes"))})

    poller = PeakPoller(ctx.target.tree, args.poll)
    poller.start()
    try:
        _grow_and_drain(args, ctx, report, levels, size, sample)
    finally:
        poller.stop()
    peak = max(r["pss_mb"] for r in report.rows)
    total = levels[-1]
    report.notes.append(f"peak PSS {peak:,.1f} MB at the steps with up to {total:,} items "
                        f"({total * size / MB:,.0f} MB) queued")
    if poller.peak is not None:
        report.notes.append(f"peak PSS {poller.peak.pss / MB:,.1f} MB polled every {args.poll:g} s "
                            f"({poller.polls} polls); at that moment: {poller.peak.describe()}")
        report.settings["polled_peak"] = poller.peak.to_json()
        for p in sorted(poller.peak.procs, key=lambda p: (p.role, p.name)):
            m = poller.peak.maps.get(p.pid)
            if m is not None:
                report.notes.append(f"at the peak, {p.name} ({p.role}) PSS/USS MB by mapping: {m.describe()}")
    report.plots.append(Plot("memory-grow.png", "items", ["rss_mb", "pss_mb", "uss_mb"], "items queued", "MB",
                             f"memory while growing ({size} B items)", logx=True, rows="grow"))
    report.plots.append(Plot("memory-drain.png", "items", ["rss_mb", "pss_mb", "uss_mb"], "items queued", "MB",
                             f"memory while draining ({size} B items)", logx=True, rows="drain"))
    return report


def _grow_and_drain(args, ctx, report: Report, levels: list[int], size: int, sample) -> None:
    conns = args.concurrency
    current = 0
    sample("grow", 0, None)
    for level in levels[1:]:
        load = Load(producers=conns, sets=level - current, value_size=size, queue=args.queue, depth=args.depth,
                    verify=True, producer_base=0, seq_base=current)
        row, res = ctx.measure(load, f"grow to {level}", level - current)
        check_clean(report, res, f"grow to {level}")
        current = level
        sample("grow", level, row)
    total = current
    top = report.rows[-1]
    report.check("backlog reached", top["queue_items"] == total,
                 f"the queue held {top['queue_items']} items at the top, {total:,} sent")
    if top["mem_bytes"] is not None:
        report.notes.append(f"at the top: {top['mem_items']:,} items ({top['mem_bytes'] / MB:,.1f} MB) in memory, "
                            f"the rest read behind from disk")
    for level in reversed(levels[:-1]):
        load = Load(consumers=conns, gets=current - level, value_size=size, queue=args.queue, depth=args.depth,
                    verify=True, expect_producers=conns, expect_count=total)
        row, res = ctx.measure(load, f"drain to {level}", current - level)
        check_clean(report, res, f"drain to {level}")
        check_payloads(report, res, f"drain to {level}", None)
        report.check(f"drain to {level}: no misses", res["misses"] == 0, f"{res['misses']} gets found the queue empty")
        current = level
        sample("drain", level, row)
    if args.settle > 0:
        time.sleep(args.settle)          # a benchmark's wait, not a test's: memory given back is the figure
        sample("settled", current, None)


@dataclass(slots=True)
class ProcMem:
    pid: int
    role: str
    name: str
    rss: int
    pss: int
    uss: int


@dataclass(slots=True)
class Snapshot:
    """The whole tree's memory at one moment, per process; `maps` (smaps.py, per pid) only
    for the poller's peak: where that memory lives."""
    procs: list[ProcMem] = field(default_factory=list)
    maps: dict[int, ProcMaps] = field(default_factory=dict)

    @classmethod
    def take(cls, tree: ProcTree) -> "Snapshot":
        out = cls()
        for p in tree.processes():
            try:
                m = p.memory_full_info()
                role = role_of(p, tree.root_pid)
                if role == "cleaner" and p.ppid() != tree.root_pid:
                    role = "pack"          # a child the cleaner forks (a command-log rewrite) carries its name
                out.procs.append(ProcMem(p.pid, role, p.name(), m.rss, getattr(m, "pss", m.rss),
                                         getattr(m, "uss", m.rss)))
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return out

    @property
    def rss(self) -> int:
        return sum(p.rss for p in self.procs)

    @property
    def pss(self) -> int:
        return sum(p.pss for p in self.procs)

    @property
    def uss(self) -> int:
        return sum(p.uss for p in self.procs)

    def by_role(self) -> str:
        """PSS per role, as `w 30.1+11.0 s 10.3 c 7.0` (one figure per process, MB)."""
        roles: dict[str, list[str]] = {}
        for p in sorted(self.procs, key=lambda p: (p.role, p.name)):
            roles.setdefault(p.role, []).append(f"{p.pss / MB:.1f}")
        return " ".join(f"{_ROLE_LETTER.get(r, r)} {'+'.join(v)}" for r, v in roles.items())

    def describe(self) -> str:
        return ", ".join(f"{p.name} ({p.role}) RSS {p.rss / MB:.1f} PSS {p.pss / MB:.1f} USS {p.uss / MB:.1f}"
                         for p in sorted(self.procs, key=lambda p: (p.role, p.name)))

    def to_json(self) -> dict:
        return {"pss": self.pss, "rss": self.rss, "uss": self.uss,
                "procs": [{"pid": p.pid, "role": p.role, "name": p.name, "rss": p.rss, "pss": p.pss, "uss": p.uss,
                           "maps": self.maps[p.pid].to_json() if p.pid in self.maps else None}
                          for p in self.procs]}


_ROLE_LETTER = {"worker": "w", "front": "f", "cleaner": "c", "supervisor": "s", "pack": "p", "admin": "a",
                "main": "m"}


class PeakPoller:
    """Reads the tree every `interval` seconds on a thread and keeps the snapshot with the
    largest total PSS: the peak between two steps, or of a pack child that lives for a second."""

    def __init__(self, tree: ProcTree, interval: float) -> None:
        self.tree = ProcTree(tree.root_pid)        # its own psutil handles: never shared across threads
        self.interval = interval
        self.peak: Snapshot | None = None
        self.polls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memory-poller", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            snap = Snapshot.take(self.tree)
            self.polls += 1
            if snap.procs and (self.peak is None or snap.pss > self.peak.pss):
                snap.maps = read_all(p.pid for p in snap.procs)     # a few ms: only at a new peak
                self.peak = snap
            self._stop.wait(self.interval)


def _mb(value) -> float | None:
    n = _int(value)
    return None if n is None else round(n / MB, 1)


def _int(value) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
