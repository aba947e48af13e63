"""Command line: `python -m lanner.perf <scenario> [options]` or `lanner-perf <scenario> [options]`.

Every scenario takes the common options below (which server, how to start it, where results go)
plus its own, named as in Kestrel's load tests or darner's bench.  As in Kestrel, `-h` is the
host name; help is `--help`.  Exit status: 0 when every check passed, 1 when a check failed,
2 when the run could not happen (nothing listening, wrong kind of server, no compiler).
"""
from __future__ import annotations

import argparse
import logging
import sys

from lanner.perf import compare, scenarios, servegrind
from lanner.perf.client import ProtocolError
from lanner.perf.context import Context, ScenarioError
from lanner.perf.loadgen import LoadgenError
from lanner.perf.report import out_dir, render, write_json, write_plots
from lanner.perf.servers import ServerError, external, start_lanner, start_memcached


def add_common(p: argparse.ArgumentParser, default_port: int) -> None:
    g = p.add_argument_group("server and output")
    g.add_argument("--help", action="help", help="show this help and exit")
    g.add_argument("-h", "--hostname", default="127.0.0.1", help="server host (default 127.0.0.1)")
    g.add_argument("-p", "--port", type=int, default=default_port, help=f"server port (default {default_port})")
    g.add_argument("--kind", choices=("kestrel", "memcached"), default="kestrel",
                   help="kestrel: a queue server (payloads are checked); memcached: a plain cache")
    g.add_argument("--start", choices=("lanner", "memcached"),
                   help="start this server on free ports for the run, and stop it afterwards")
    g.add_argument("--workers", type=int, help="with --start lanner: shard workers (default: lanner serve's)")
    g.add_argument("--fronts", type=int, help="with --start lanner: dedicated fronts (default: lanner serve's)")
    g.add_argument("--lanner-config", metavar="FILE", help="with --start lanner: TOML config file")
    g.add_argument("--lanner-arg", action="append", default=[], metavar="ARG",
                   help="with --start lanner: extra `lanner serve` argument (repeatable)")
    g.add_argument("--server-pid", type=int, help="root pid of the server's processes, for CPU and memory "
                                                  "(default: whoever listens on the port, if local)")
    g.add_argument("--procs", type=int, default=1,
                   help="load-generator processes (default 1; at most one per core)")
    g.add_argument("--out", metavar="DIR", help="results folder (default perf/out/)")
    g.add_argument("--plot", action="store_true", help="also write PNG plots")
    g.add_argument("--no-progress", action="store_true", help="no progress bars")
    g.add_argument("--verbose", action="store_true", help="log what the suite does")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lanner-perf", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="SCENARIO")
    for name in scenarios.MODULES:
        mod = scenarios.load(name)
        p = sub.add_parser(name, help=mod.HELP, description=mod.__doc__, add_help=False,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(p)
        add_common(p, scenarios.default_port(mod))
    compare.add_parser(sub)
    servegrind.add_parser(sub)
    return parser


def make_target(args, mod):
    """Start the server asked for, or describe the one at --hostname/--port."""
    thrift = getattr(mod, "NEEDS_THRIFT", False)
    if args.start == "lanner":
        target = start_lanner(args.workers, args.fronts, args.lanner_config, thrift=thrift, extra=args.lanner_arg)
    elif args.start == "memcached":
        target = start_memcached()
    else:
        return external(args.hostname, args.port, args.kind, args.server_pid,
                        thrift_port=args.port if thrift else None)
    if thrift:
        args.port = target.thrift_port
    return target


def run_scenario(args, target) -> "scenarios.Report":
    mod = scenarios.load(args.command)
    ctx = Context(target, procs=args.procs, progress=not args.no_progress)
    return mod.run(args, ctx)


def emit(report, args) -> None:
    """Print the table, write JSON (always) and plots (with --plot)."""
    print(render(report))
    directory = out_dir(args.out, report.scenario)
    path = write_json(report, directory)
    print(f"results: {path}")
    if args.plot:
        for png in write_plots(report, directory):
            print(f"plot: {png}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(name)s: %(message)s")
    try:
        if args.command == "compare":
            report = compare.run(args, build_parser())
        elif args.command == servegrind.NAME:
            report = servegrind.run(args)
        else:
            target = make_target(args, scenarios.load(args.command))
            try:
                report = run_scenario(args, target)
            finally:
                target.stop()
    except (ScenarioError, ServerError, LoadgenError, ProtocolError) as e:
        print(f"lanner-perf {args.command}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"lanner-perf {args.command}: interrupted", file=sys.stderr)
        return 130
    emit(report, args)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
