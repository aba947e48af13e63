"""compare: one throughput scenario against two servers, interleaved A B A B ..., with ratios.

By default A is a fresh `lanner serve` and B is Debian's memcached on 127.0.0.1, the protocol
ceiling: the same memcache text protocol with no queue semantics, no journal and C threads.
Either side may be any HOST:PORT instead, or `standin:US`: perf/standin.c, a C server with Lanner's
syscalls per request and per turn and US µs of spinning per request where Lanner runs Python
(what CPU per request a target ratio leaves: perf/README.md, "What a target leaves for Python").  Each round runs the whole scenario on A and then on B,
so drifts of the machine (other tenants, thermal, page cache) hit both alike; per row the
median over rounds is taken and A/B printed.  memcached has no queues: against it, payload and
ordering checks are skipped (a get returns the last value set under that key).
"""
from __future__ import annotations

import argparse
import statistics

from lanner.perf import scenarios
from lanner.perf.context import Context, ScenarioError
from lanner.perf.report import Plot, Report
from lanner.perf.servers import external, start_lanner, start_memcached, start_standin

THROUGHPUT_SCENARIOS = [n for n in scenarios.MODULES if scenarios.load(n).COMPARE]


def add_parser(sub) -> None:
    p = sub.add_parser("compare", help="run a scenario against two servers, interleaved, and print ratios",
                       description=__doc__, add_help=False, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--help", action="help", help="show this help and exit")
    p.add_argument("--a", default="lanner", help="first server: lanner, memcached, standin:US or HOST:PORT (default lanner)")
    p.add_argument("--b", default="memcached", help="second server (default memcached)")
    p.add_argument("--a-kind", choices=("kestrel", "memcached"), help="kind of a HOST:PORT server A")
    p.add_argument("--b-kind", choices=("kestrel", "memcached"), help="kind of a HOST:PORT server B")
    p.add_argument("--rounds", type=int, default=2, help="A B rounds (default 2)")
    p.add_argument("--workers", type=int, help="lanner: shard workers (default: lanner serve's)")
    p.add_argument("--fronts", type=int, help="lanner: dedicated fronts (default: lanner serve's)")
    p.add_argument("--lanner-config", metavar="FILE", help="lanner: TOML config file")
    p.add_argument("--lanner-arg", action="append", default=[], metavar="ARG", help="lanner: extra serve argument")
    p.add_argument("--procs", type=int, default=1, help="load-generator processes (default 1)")
    p.add_argument("--out", metavar="DIR", help="results folder (default perf/out/)")
    p.add_argument("--plot", action="store_true", help="also write PNG plots")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--verbose", action="store_true", help="log what the suite does")
    p.add_argument("compare_scenario", metavar="SCENARIO", choices=THROUGHPUT_SCENARIOS,
                   help="scenario to run on both: " + ", ".join(THROUGHPUT_SCENARIOS))
    p.add_argument("scenario_args", nargs=argparse.REMAINDER, help="the scenario's own options")


def make_target(spec: str, kind: str | None, args):
    if spec == "lanner":
        return start_lanner(args.workers, args.fronts, args.lanner_config, extra=args.lanner_arg)
    if spec == "memcached":
        return start_memcached()
    if spec.startswith("standin:"):
        burn = spec.split(":", 1)[1]
        try:
            return start_standin(float(burn))
        except ValueError:
            raise ScenarioError(f"server {spec!r}: standin:US takes µs of CPU per request, e.g. standin:15") from None
    host, _, port = spec.rpartition(":")
    if not host or not port.isdigit():
        raise ScenarioError(f"server {spec!r} is not lanner, memcached, standin:US or HOST:PORT")
    return external(host, int(port), kind or "kestrel")


def run(args, parser) -> Report:
    sargs = parser.parse_args([args.compare_scenario, *args.scenario_args])
    sargs.procs, sargs.no_progress = args.procs, args.no_progress
    args.out = args.out or sargs.out         # output options may follow the scenario's own
    args.plot = args.plot or sargs.plot
    mod = scenarios.load(args.compare_scenario)
    primary = mod.COMPARE
    targets = []
    try:
        targets.append(make_target(args.a, args.a_kind, args))
        targets.append(make_target(args.b, args.b_kind, args))
        runs: list[list[Report]] = [[], []]
        for _ in range(args.rounds):
            for i, target in enumerate(targets):
                runs[i].append(mod.run(sargs, Context(target, procs=args.procs, progress=not args.no_progress)))
    finally:
        for t in targets:
            t.stop()
    return combine(args, mod, primary, targets, runs)


def combine(args, mod, primary: str, targets, runs: list[list[Report]]) -> Report:
    a_name, b_name = targets[0].name, targets[1].name
    report = Report("compare", {"scenario": mod.NAME, "scenario_args": args.scenario_args, "rounds": args.rounds,
                                "metric": primary, "a": targets[0].describe(), "b": targets[1].describe(),
                                "a_settings": runs[0][0].settings},
                    {"name": f"{a_name} vs {b_name}", "kind": f"{targets[0].kind}/{targets[1].kind}"},
                    columns=[("a", a_name, "{:,.0f}"), ("b", b_name, "{:,.0f}"), ("ratio", "A/B", "{:.2f}"),
                             ("a_p99_us", "A p99 µs", "{:,.0f}"), ("b_p99_us", "B p99 µs", "{:,.0f}"),
                             ("a_client_us_op", "A client µs/op", "{:.1f}"),
                             ("a_server_us_op", "A server µs/op", "{:.1f}"),
                             ("a_server_us_op_by_role", "A by role", "{:.1f}"),
                             ("b_client_us_op", "B client µs/op", "{:.1f}"),
                             ("b_server_us_op", "B server µs/op", "{:.1f}"),
                             ("server_ratio", "A/B server µs/op", "{:.1f}")])
    for row in runs[0][0].rows:
        label = row["label"]
        a_rows = [r for rep in runs[0] for r in rep.rows if r["label"] == label]
        b_rows = [r for rep in runs[1] for r in rep.rows if r["label"] == label]
        if not b_rows:
            continue
        out = {"label": label, "conns": row.get("conns"), "a": _median(a_rows, primary), "b": _median(b_rows, primary)}
        out["ratio"] = round(out["a"] / out["b"], 3) if out["a"] is not None and out["b"] else None
        for side, rows in (("a", a_rows), ("b", b_rows)):
            for key in ("p50_us", "p99_us", "client_us_op", "server_us_op"):
                out[f"{side}_{key}"] = _median(rows, key)
            out[f"{side}_server_us_op_by_role"] = _median_roles(rows)
            out[f"{side}_rounds"] = [r.get(primary) for r in rows]
        out["server_ratio"] = (round(out["a_server_us_op"] / out["b_server_us_op"], 2)
                               if out["a_server_us_op"] and out["b_server_us_op"] else None)
        report.rows.append(out)
    for side, reps in (("A", runs[0]), ("B", runs[1])):
        failed = [f"round {n}: {name}: {c.detail}" for n, rep in enumerate(reps, 1)
                  for name, c in rep.checks.items() if not c.ok]
        total = sum(len(rep.checks) for rep in reps)
        report.check(f"{side} ({targets[0 if side == 'A' else 1].name})", not failed,
                     "; ".join(failed[:5]) or f"all {total} checks passed")
        for rep in reps:
            report.notes += [f"{side}: {note}" for note in rep.notes if f"{side}: {note}" not in report.notes]
    report.notes.append(f"metric: {primary}, median of {args.rounds} rounds; A = {a_name}, B = {b_name}")
    title = f"{mod.NAME}: {a_name} vs {b_name}"
    names = {"a": a_name, "b": b_name}
    ylabel = primary.replace("_s", "/s").replace("_us", " µs")
    if len({r["conns"] for r in report.rows}) > 1:
        report.plots.append(Plot("compare.png", "conns", ["a", "b"], "connections", ylabel, title, logx=True,
                                 labels=names))
    else:
        report.plots.append(Plot("compare.png", "label", ["a", "b"], "", ylabel, title, kind="bar", labels=names))
    return report


def _median(rows: list[dict], key: str):
    values = [r[key] for r in rows if r.get(key) is not None]
    return round(statistics.median(values), 2) if values else None


def _median_roles(rows: list[dict]) -> dict | None:
    """Median server µs/op per process role over rounds."""
    per = [r["server_us_op_by_role"] for r in rows if r.get("server_us_op_by_role")]
    if not per:
        return None
    roles = sorted({k for d in per for k in d})
    return {k: round(statistics.median([d.get(k, 0.0) for d in per]), 2) for k in roles}
