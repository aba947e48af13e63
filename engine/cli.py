"""The `lanner` command: serve, and the offline tools for journals and command logs."""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

from lanner import __version__
from lanner.config import ConfigError, load_config
from lanner.server.exits import EXIT_START_REFUSED

USAGE = """usage: lanner <command> [options]
       lanner --version

commands:
  serve                     run the server (see `lanner serve --help`)
  qdump [-q] [-d] [-A] [-Q] FILE...   describe Kestrel journal files
  qpack -f NEWFILE FILE...  pack journal files into one
  cmdlog check DIR          verify a workq command-log directory
  cmdlog dump DIR [--json]  print every record of a command-log directory
  spark dump QUEUE_PATH --out DIR [--format parquet|json] [--queues a,b] [--master URL]
  spark stats QUEUE_PATH... [--queues a,b] [--master URL]   Spark jobs (needs the spark extra)
"""


def serve_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lanner serve", description="Run the Lanner server.")
    p.add_argument("--config", help="TOML config file")
    p.add_argument("--queue-path", dest="queue_path", help="journals and segments live here")
    p.add_argument("--status-file", dest="status_file", help="persisted server status")
    p.add_argument("--listen", dest="listen_address", help="bind address for every listener")
    p.add_argument("--memcache-port", dest="memcache_port", help="port, or off")
    p.add_argument("--text-port", dest="text_port", help="port, or off")
    p.add_argument("--thrift-port", dest="thrift_port", help="port, or off")
    p.add_argument("--admin-port", dest="admin_port", help="port, or off")
    p.add_argument("--workers", help="shard worker processes")
    p.add_argument("--fronts", help="dedicated protocol front processes (default 0)")
    p.add_argument("--worker-fronts", dest="worker_fronts",
                   help="on (default) or off: whether workers also accept and serve clients")
    p.add_argument("--log-level", dest="log_level", help="debug, info, warning, error")
    p.add_argument("--log-file", dest="log_file",
                   help="log here instead of stderr; reopened on SIGUSR1 (logrotate)")
    p.add_argument("--version", action="version", version=_version())
    return p


def _version() -> str:
    return f"lanner {__version__}"


def setup_logging(level: str, log_file: str | None = None) -> None:
    if log_file:
        # lazy: the log-file handler (and its SIGUSR1 hook) only when asked for
        from lanner.ops import logfile
        logfile.install(log_file, getattr(logging, level.upper(), logging.INFO))
        return
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), stream=sys.stderr,
                        format="%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s")


def cmd_serve(argv: list[str]) -> int:
    args = serve_parser().parse_args(argv)
    overrides = {k: v for k, v in vars(args).items() if k != "config" and v is not None}
    try:
        config = load_config(args.config, overrides)
    except ConfigError as e:
        sys.stderr.write(f"lanner: {e}\n")
        return EXIT_START_REFUSED
    except OSError as e:
        sys.stderr.write(f"lanner: cannot read config {args.config}: {e.strerror or e}\n")
        return EXIT_START_REFUSED
    try:
        setup_logging(config.server.log_level, config.server.log_file)
    except OSError as e:
        sys.stderr.write(f"lanner: cannot open log file {config.server.log_file}: {e.strerror or e}\n")
        return EXIT_START_REFUSED
    # lazy: only `serve` loads the server's processes (the tools never do)
    from lanner.server.supervisor import serve
    return serve(config)


# Each tool's entry point, imported only when it runs: a tool never loads the server, and
# only `lanner spark` needs pyspark.
SUBCOMMANDS = {
    "qdump": "lanner.tools.qtools:qdump_main",
    "qpack": "lanner.tools.qtools:qpack_main",
    "cmdlog": "lanner.tools.cmdlog:cmdlog_main",
    "spark": "lanner.spark.jobs:main",
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        sys.stdout.write(USAGE)
        return 0
    if argv[0] in ("--version", "-V", "version"):
        sys.stdout.write(_version() + "\n")
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "serve":
        return cmd_serve(rest)
    target = SUBCOMMANDS.get(cmd)
    if target:
        module, func = target.split(":")
        return getattr(importlib.import_module(module), func)(rest)
    sys.stderr.write(f"lanner: unknown command {cmd!r}\n{USAGE}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
