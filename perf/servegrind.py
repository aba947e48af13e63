"""servegrind: instructions per request of a real `lanner serve`, counted by valgrind's callgrind.

hotloop counts one worker built in the benchmark's own process; it cannot see what only a real
server has (objects shaped by everything the process did before: start-up, other journals, the
adopted and handed-off connections, the admin's stats polls).  This starts `lanner serve`
(default layout unless --workers/--fronts/--lanner-config say otherwise) with every process
under `valgrind --tool=callgrind --trace-children=yes` (forked children are traced, one dump
file per pid), drives `mixed`'s shape at it with the C load generator (sets and gets of
--item-size bytes on one queue, -c connections, -r requests per write), and per measured run
zeroes every server process's counters (`callgrind_control -z PID`), sends exactly -n
requests, dumps them (`callgrind_control -d PID`) and reads each dump's instruction count.
It prints instructions per request in total and by role: the queue's worker (the worker that
owns the queue, placement.worker_of), the other workers, fronts, supervisor, cleaner, admin.

Counts are repeatable where wall clock is not: every process runs under valgrind alone on its
core's time, batches are the same as long as the client (native) outpaces the server (~50x
slower), and the server runs with PYTHONHASHSEED=0.  What still moves with wall time is the
idle work of timers (each process's periodic ticks), which lands in the non-queue roles.

Under valgrind a server answers a few hundred requests a second and takes a minute to start,
so the heartbeat check is turned off (`[server] heartbeat_timeout = "off"`, added to a copy of
--lanner-config when that does not set it): a child slowed 50x must not be killed as hung.
--dumps DIR keeps the dump files (`callgrind_annotate DIR/cg.PID.N`) for a look at where the
instructions go; --python runs another checkout's server (its venv's interpreter) under this
checkout's tool.
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import tomllib

from lanner.perf import loadgen
from lanner.perf.client import MemcacheClient
from lanner.perf.context import check_clean
from lanner.perf.report import Report
from lanner.perf.servers import ProcTree, ServerError, role_of, start_lanner
from lanner.queues.placement import worker_of

NAME = "servegrind"
READY_TIMEOUT_S = 600.0        # start-up under valgrind on a shared 2-core box: a minute or more
STOP_GRACE_S = 120.0
STALL_S = 300.0                # the load generator's "no reply for this long" limit
AGREE = 0.01                   # the measured runs must agree to within 1 %
ROLES = ("queue worker", "other workers", "fronts", "supervisor", "cleaner", "admin", "other")


def add_parser(sub) -> None:
    p = sub.add_parser(NAME, help="instructions per request of a real lanner serve under callgrind",
                       description=__doc__, add_help=False, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--help", action="help", help="show this help and exit")
    p.add_argument("-n", "--requests", type=int, default=5000, help="requests per measured run (default 5000)")
    p.add_argument("-c", "--concurrency", type=int, default=10, help="connections (default 10)")
    p.add_argument("-r", "--depth", type=int, default=1, help="requests per write (default 1: closed loop)")
    p.add_argument("-i", "--item-size", type=int, default=1024, help="bytes per item (default 1024)")
    p.add_argument("-q", "--queue", default="db_bench", help="queue (default db_bench, as mixed)")
    p.add_argument("--prefill", type=int, default=512, help="items put first (default 512, as mixed)")
    p.add_argument("--warmup", type=int, default=2000, help="requests before the first measured run (default 2000)")
    p.add_argument("--rounds", type=int, default=2, help="measured runs on the one server (default 2)")
    p.add_argument("--workers", type=int, help="shard workers (default: lanner serve's)")
    p.add_argument("--fronts", type=int, help="dedicated fronts (default: lanner serve's)")
    p.add_argument("--lanner-config", metavar="FILE", help="TOML config file")
    p.add_argument("--lanner-arg", action="append", default=[], metavar="ARG", help="extra serve argument")
    p.add_argument("--python", metavar="EXE", help="interpreter whose lanner serves (default this one)")
    p.add_argument("--dumps", metavar="DIR", help="keep callgrind's dump files here (default: removed)")
    p.add_argument("--cache-sim", action="store_true",
                   help="also simulate the caches (callgrind --cache-sim=yes): the queue worker's L1 data "
                        "and last-level misses per request, user space only (this VM has no hardware "
                        "counters); about twice as slow")
    p.add_argument("--ll-size", type=int, metavar="BYTES",
                   help="with --cache-sim: the simulated last level's size (16-way, 64-byte lines; "
                        "default the host's): e.g. 1048576 for a core's L2, which callgrind does not model")
    p.add_argument("--out", metavar="DIR", help="results folder (default perf/out/)")
    p.add_argument("--plot", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--verbose", action="store_true", help="log what the suite does")


def run(args) -> Report:
    if not shutil.which("valgrind") or not shutil.which("callgrind_control"):
        raise ServerError("valgrind is not installed (apt-get install valgrind)")
    report = Report(NAME, {k: getattr(args, k) for k in ("requests", "concurrency", "depth", "item_size", "queue",
                                                          "prefill", "warmup", "rounds", "workers", "fronts",
                                                          "lanner_config", "python")},
                    {}, columns=[("total", "total", "{:,.0f}")] + [(r, r, "{:,.0f}") for r in ROLES])
    scratch = tempfile.mkdtemp(prefix="lanner-servegrind-")
    dumps = os.path.abspath(args.dumps) if args.dumps else os.path.join(scratch, "dumps")
    os.makedirs(dumps, exist_ok=True)
    config = relaxed_config(args.lanner_config, scratch)
    wrap = ["valgrind", "--tool=callgrind", "--trace-children=yes", f"--callgrind-out-file={dumps}/cg.%p"]
    if args.cache_sim:
        wrap.insert(2, "--cache-sim=yes")
        if args.ll_size:
            wrap.insert(3, f"--LL={args.ll_size},16,64")
    target = start_lanner(args.workers, args.fronts, config, extra=args.lanner_arg, wrap=wrap, python=args.python,
                          env={"PYTHONHASHSEED": "0"}, ready_timeout=READY_TIMEOUT_S)
    try:
        report.target = target.describe()
        roles, owner = process_roles(target.tree, args.queue)
        if args.prefill:
            drive(target, loadgen.Load(producers=1, sets=args.prefill, value_size=args.item_size,
                                       queue=args.queue, depth=32, stall=STALL_S), report, "prefill")
        pauses = 0
        handed_before = handoffs(target)       # the prefill's connection may have been handed over

        def between_runs(responses: int) -> None:
            """A pause of the load: the connections are idle; count the run before, start the next."""
            nonlocal pauses
            if pauses == 0:
                report.settings["handoffs_in_warmup"] = handoffs(target) - handed_before
            else:
                counts = {pid: dumped(dumps, pid) for pid in roles if callgrind_control("-d", pid)}
                report.rows.append({"label": f"run {pauses}", **per_request(counts, roles, args.requests)})
                if args.cache_sim:
                    report.notes.append(f"run {pauses}, queue worker, per request: " + misses(
                        newest_dump(dumps, [p for p, r in roles.items() if r == "queue worker"][0]), args.requests))
            pauses += 1
            if pauses <= args.rounds:
                for pid in roles:
                    callgrind_control("-z", pid)

        drive(target, mixed_load(args, (args.warmup,) + (args.requests,) * args.rounds), report, "mixed",
              between_runs)
    finally:
        target.stop(STOP_GRACE_S)
        shutil.rmtree(scratch, ignore_errors=True)
    check_agreement(report)
    if args.dumps:
        report.notes.append(f"dumps in {dumps} (callgrind_annotate --inclusive=yes FILE)")
    report.notes.append(f"instructions per request; the queue worker is {owner}, the owner of {args.queue!r}; "
                        f"{report.settings.get('handoffs_in_warmup')} of the {args.concurrency} connections "
                        f"were handed to it in the warm-up")
    return report


def relaxed_config(path: str | None, folder: str) -> str:
    """A copy of `path` (or an empty config) with the heartbeat check off, unless it sets one."""
    text = open(path).read() if path else ""
    server = tomllib.loads(text).get("server", {})
    if "heartbeat_timeout" not in server:
        line = 'heartbeat_timeout = "off"     # servegrind: children run ~50x slower under valgrind\n'
        if re.search(r"^\[server\]\s*$", text, re.M):
            text = re.sub(r"^\[server\]\s*$\n?", lambda m: "[server]\n" + line, text, count=1, flags=re.M)
        else:
            text += "\n[server]\n" + line
    out = os.path.join(folder, "servegrind.toml")
    with open(out, "w") as f:
        f.write(text)
    return out


def process_roles(tree: ProcTree, queue: str) -> tuple[dict[int, str], str | None]:
    """pid -> role for every process of the server, and the name of the worker that owns `queue`
    (the queue worker).  The root is the supervisor: under valgrind its name is valgrind's."""
    procs = tree.processes()
    names = {p.pid: p.name() for p in procs}
    workers = sum(1 for n in names.values() if n.startswith("lanner-w"))
    owner = f"lanner-w{worker_of(queue, workers)}" if workers else None
    return {p.pid: role_name(names[p.pid], role_of(p, tree.root_pid), p.pid == tree.root_pid, owner)
            for p in procs}, owner


def role_name(name: str, role: str, root: bool, owner: str | None) -> str:
    if root:
        return "supervisor"
    if role == "worker":
        return "queue worker" if name == owner else "other workers"
    if role == "front":
        return "fronts"
    return role if role in ROLES else "other"


def mixed_load(args, phases: tuple[int, ...]) -> loadgen.Load:
    """`mixed`'s load on the same connections throughout, paused after each phase: a run's
    connections (and so which of them were handed to the queue's worker) are the same in
    every measured run, as in a benchmark's steady state."""
    requests = sum(phases)
    sets = requests // 2
    return loadgen.Load(conns=args.concurrency, sets=sets, gets=requests - sets, value_size=args.item_size,
                        queue=args.queue, depth=args.depth, stall=STALL_S, pause_after=phases)


def handoffs(target) -> int:
    """Connections handed to another worker so far (`stats` handoffs): what the run's layout depends on."""
    with MemcacheClient(target.host, target.port, 60.0) as c:
        return int(c.stats().get("handoffs", 0))


def drive(target, load: loadgen.Load, report: Report, label: str, on_pause=None) -> None:
    load.host, load.port = target.host, target.port
    res = loadgen.run(load, on_pause=on_pause)
    check_clean(report, res, label)
    asked = (load.sets or 0) + (load.gets or 0)      # the counts per request divide by exactly these
    report.check(f"{label}: all answered", res["ops"] == asked, f"{res['ops']} of {asked} requests")


def callgrind_control(command: str, pid: int) -> bool:
    """Send one command to one process (never to all: other people's callgrind runs share the box)."""
    done = subprocess.run(["callgrind_control", command, str(pid)], capture_output=True, text=True)
    return done.returncode == 0 and "OK" in done.stdout


def newest_dump(folder: str, pid: int) -> str:
    """`pid`'s newest dump file (`cg.PID.N`: counted since the last zero)."""
    parts = glob.glob(os.path.join(folder, f"cg.{pid}.*"))
    if not parts:
        raise ServerError(f"callgrind wrote no dump for pid {pid} in {folder}")
    return max(parts, key=lambda p: int(p.rsplit(".", 1)[1]))


def dumped(folder: str, pid: int) -> int:
    """The instruction count of `pid`'s newest dump."""
    return summary(newest_dump(folder, pid))


def misses(path: str, requests: int) -> str:
    """A --cache-sim dump's data-cache misses per request: L1 reads and writes (D1mr, D1mw) and
    last-level (DLmr, DLmw), as callgrind's simulated caches (the host's sizes) count them."""
    names = values = None
    with open(path) as f:
        for line in f:
            if line.startswith("events:"):
                names = line.split()[1:]
            elif line.startswith("summary:"):
                values = [int(v) for v in line.split()[1:]]
    if not names or not values:
        raise ServerError(f"{path} has no events or summary line")
    ev = dict(zip(names, values))
    return ", ".join(f"{k} {ev.get(k, 0) / requests:.1f}" for k in ("D1mr", "D1mw", "DLmr", "DLmw"))


def summary(path: str) -> int:
    """The `summary:` line of a callgrind dump: instructions (Ir) in the dumped interval."""
    with open(path) as f:
        for line in f:
            if line.startswith("summary:"):
                return int(line.split()[1])
    raise ServerError(f"{path} has no summary line")


def per_request(counts: dict[int, int], roles: dict[int, str], requests: int) -> dict:
    """Instructions per request: the total, and by role (roles with no process: None)."""
    out: dict[str, float | None] = {r: None for r in ROLES}
    for pid, n in counts.items():
        role = roles[pid]
        out[role] = (out[role] or 0) + n / requests
    return {"total": round(sum(counts.values()) / requests),
            **{r: round(v) if v is not None else None for r, v in out.items()}}


def check_agreement(report: Report) -> None:
    """The measured runs' totals and queue-worker counts must agree within AGREE."""
    for key in ("total", "queue worker"):
        values = [r[key] for r in report.rows if r.get(key)]
        if len(values) < 2:
            continue
        spread = (max(values) - min(values)) / statistics.median(values)
        report.check(f"runs agree ({key})", spread <= AGREE,
                     f"spread {100 * spread:.2f} % of the median over {len(values)} runs")
