"""leaky-reader (Kestrel's LeakyThriftReader), over thrift: one producer puts N items while T
consumers read them one at a time with reliable reads (`get(q, 1, 100, auto_abort_msec)`) and now
and then (-d, a fraction) fail to confirm one.  The server must abort each unconfirmed read back
to the queue after auto_abort_msec, so in the end every item is confirmed exactly once.  Speaks
TBinaryProtocol in TFramedTransport to the thrift port (default 2229).
"""
from __future__ import annotations

import logging
import random
import threading
import time

from thrift.Thrift import TException

from lanner.perf.context import ScenarioError, run_threads
from lanner.perf.report import Plot, Report
from lanner.perf.scenarios import add_options
from lanner.perf.thrift_client import KestrelThrift, ThriftAppError

NAME = "leaky-reader"
HELP = "thrift: reliable reads that sometimes fail to confirm; every item confirmed once"
DEFAULT_PORT = 2229
COMPARE = None
NEEDS_THRIFT = True


def add_arguments(p) -> None:
    g = p.add_argument_group("leaky-reader (Kestrel's names and defaults)")
    add_options(g, count=1000)
    g.add_argument("-d", "--drop-rate", type=float, default=0.01,
                   help="fraction of reads left unconfirmed (default 0.01)")
    add_options(g, queue="spam-thrift")
    g.add_argument("-t", "--threads", type=int, default=1, help="consumers (default 1)")
    add_options(g, no_flush=True)
    g.add_argument("-v", "--verbose-reads", action="store_true", help="print each read as it is opened")
    g.add_argument("--auto-abort-ms", type=int, default=5000, help="auto-abort of unconfirmed reads (default 5000)")
    add_options(g, seed=(1, "random seed for drops"), timeout=300.0)


def connect(ctx, port: int) -> KestrelThrift:
    host = ctx.target.host
    logging.getLogger("thrift.transport.TSocket").setLevel(logging.CRITICAL)  # the error below says it
    try:
        return KestrelThrift(host, port)
    except (TException, OSError) as e:
        raise ScenarioError(f"nothing answers thrift on {host}:{port} ({e}); start a Kestrel-compatible server "
                            f"with a thrift port, e.g. `lanner serve --thrift-port {port}`, or pass -p") from None


def run(args, ctx) -> Report:
    port = ctx.target.thrift_port or args.port
    report = Report(NAME, {"count": args.count, "drop_rate": args.drop_rate, "threads": args.threads,
                           "auto_abort_ms": args.auto_abort_ms, "queue": args.queue, "thrift_port": port},
                    ctx.target.describe(),
                    columns=[("items", "items", "{:,}"), ("items_s", "items/s", "{:,.1f}"),
                             ("reads", "reads", "{:,}"), ("dropped", "dropped", "{:,}"),
                             ("redelivered", "redelivered", "{:,}"), ("missing", "missing", "{:,}")])
    admin = connect(ctx, port)
    try:
        version = admin.get_version()
        if not args.no_flush:
            admin.flush_queue(args.queue)
    except TException as e:
        raise ScenarioError(f"thrift server on {ctx.target.host}:{port} failed a call: {e}") from None
    finally:
        admin.close()
    lock = threading.Lock()
    seen: dict[int, int] = {}
    confirmed: set[int] = set()
    errors: list[str] = []
    counts = {"reads": 0, "dropped": 0}
    deadline = time.monotonic() + args.timeout

    def fail(msg: str) -> None:
        with lock:
            errors.append(msg)

    def produce() -> None:
        try:
            c = connect(ctx, port)
            try:
                for i in range(args.count):
                    if c.put(args.queue, [b"%08x" % i]) != 1:
                        fail(f"put of item {i:08x} to {args.queue} was refused")
            finally:
                c.close()
        except (TException, ThriftAppError, ScenarioError, OSError) as e:
            fail(f"producer: {e}")

    def consume(k: int) -> None:
        rng = random.Random(args.seed * 7919 + k)
        try:
            c = connect(ctx, port)
        except ScenarioError as e:
            fail(f"consumer {k}: {e}")
            return
        try:
            while time.monotonic() < deadline:
                with lock:
                    if len(confirmed) >= args.count or errors:
                        return
                items = c.get(args.queue, 1, 100, args.auto_abort_ms)
                if not items:
                    continue
                if len(items) > 1:
                    fail(f"get(max_items=1) returned {len(items)} items")
                    return
                data, xid = items[0]
                item = int(data, 16)
                with lock:
                    counts["reads"] += 1
                    seen[item] = seen.get(item, 0) + 1
                if args.verbose_reads:
                    print(f"open {xid:016x} = {item:08x}", flush=True)
                if rng.random() < args.drop_rate:
                    with lock:
                        counts["dropped"] += 1
                    continue
                n = c.confirm(args.queue, {xid})
                if n != 1:
                    fail(f"confirm of {xid} ({item:08x}) confirmed {n} reads")
                    return
                with lock:
                    if item in confirmed:
                        errors.append(f"item {item:08x} confirmed twice")
                    confirmed.add(item)
        except (TException, ThriftAppError, OSError, ValueError) as e:
            fail(f"consumer {k}: {e}")
        finally:
            c.close()

    threads = [threading.Thread(target=produce, daemon=True)]
    threads += [threading.Thread(target=consume, args=(k,), daemon=True) for k in range(args.threads)]
    elapsed = run_threads(threads, deadline)
    missing = sorted(set(range(args.count)) - confirmed)
    report.rows.append({"label": f"t={args.threads}", "items": len(confirmed), "elapsed_s": round(elapsed, 3),
                        "items_s": round(len(confirmed) / elapsed, 1) if elapsed else None, "reads": counts["reads"],
                        "dropped": counts["dropped"], "redelivered": sum(1 for n in seen.values() if n > 1),
                        "missing": len(missing)})
    report.check("all confirmed", not missing,
                 f"{len(missing)} items never confirmed" + (f", e.g. {[f'{i:08x}' for i in missing[:10]]}" if missing
                                                            else f" (server version {version})"))
    report.check("no errors", not errors, "; ".join(errors[:3]) or "no errors")
    report.plots.append(Plot("reads.png", "label", ["items", "reads", "dropped", "redelivered"], "", "count",
                             f"leaky-reader: {args.count} items, drop rate {args.drop_rate:g}", kind="bar"))
    return report
