"""Spark pipeline figures: journal scan MB/s and stream source items/s (needs the spark extra).

    python -m lanner.perf.spark_bench                      # 200 MB spool, 100k streamed items
    python -m lanner.perf.spark_bench --spool-mb 50 --stream-items 20000 --json out.json

Scan: a spool of --queues queues written by the engine itself (rotated journals, a
tenth of the items read and confirmed, so replay has work), then on a `local[2]`
session `spark.read.format("lanner-journal")` in items and records modes, aggregated
over every row (count and sum of data lengths, so every byte reaches Spark).  One
warm-up query, then --rounds timed ones; MB/s = spool bytes / wall time of the query.

Stream: a fresh `lanner serve` (max_open_transactions = --batch) preloaded with
--stream-items items, drained by `readStream.format("lanner")` with
`trigger(availableNow=True)` into a `noop` sink; items/s = items / wall time from
start() to the end of the query (query start-up and the final confirm included),
and the queue is checked empty with no open transactions.  A 2000-item query runs
first, so the figure is for a warm session (the first streaming query of a
session also loads and compiles Spark's streaming classes: its time is printed).

Goals (issue 9): >= 50 MB/s scan, >= 5000 items/s streamed, on the 2-core box.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

GOAL_SCAN_MBS = 50.0
GOAL_STREAM_IPS = 5000.0


def build_spool(spool: str, total_mb: int, queues: int, item_size: int) -> int:
    """Journals of `queues` queues holding ~total_mb MB; returns the bytes on disk."""
    # lazy: pyspark and the server helpers load only for the benchmark phase that needs them
    from lanner.clock import FakeClock
    from lanner.config import QueueConfig
    from lanner.queues.queue import PersistentQueue
    from lanner.storage.journal.journal import Journal
    os.makedirs(spool, exist_ok=True)
    clock = FakeClock(1_700_000_000_000)
    per_queue = total_mb * 2**20 // queues
    n = per_queue // (item_size + 21)
    body = bytes(range(256)) * (item_size // 256 + 1)
    for qi in range(queues):
        name = f"q{qi}"
        qc = QueueConfig(max_memory_size=16 << 20, max_journal_size=1 << 40)
        q = PersistentQueue(name, qc, Journal(spool, name, clock), clock)
        q.replay()
        for i in range(n):
            q.add(b"%08d" % i + body[i % 256:i % 256 + item_size - 8])
            if i % 10 == 9:
                item = q.remove(transactional=True)
                q.confirm_remove(item.xid)
            clock.advance(1)
        q.storage.close()
    return sum(os.path.getsize(os.path.join(spool, f)) for f in os.listdir(spool))


def session():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # lazy: pyspark and the server helpers load only for the benchmark phase that needs them
    from pyspark.sql import SparkSession
    from lanner.spark import register
    s = (SparkSession.builder.master("local[2]").appName("lanner-spark-bench")
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.shuffle.partitions", "2")
         .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.driver.memory", "2g").getOrCreate())
    s.sparkContext.setLogLevel("ERROR")
    register(s)
    return s


def tree_cpu() -> float:
    """CPU seconds used so far by this process and all its descendants (the JVM, Spark's
    Python workers): on a shared machine, wall time says little, this says what we used."""
    # lazy: pyspark and the server helpers load only for the benchmark phase that needs them
    import psutil
    me = psutil.Process()
    total = 0.0
    for p in [me] + me.children(recursive=True):
        try:
            c = p.cpu_times()
            total += c.user + c.system
        except psutil.Error:
            pass
    return total


def scan(spark, spool: str, mode: str) -> tuple[float, float, int]:
    """(wall s, CPU s, rows) of one full scan."""
    # lazy: pyspark and the server helpers load only for the benchmark phase that needs them
    from pyspark.sql import functions as F
    c = tree_cpu()
    t = time.perf_counter()
    row = (spark.read.format("lanner-journal").option("mode", mode).load(spool)
           .agg(F.count(F.lit(1)).alias("n"), F.sum(F.length("data")).alias("b")).collect()[0])
    return time.perf_counter() - t, tree_cpu() - c, row.n


def bench_scan(spark, spool: str, nbytes: int, rounds: int) -> dict:
    out = {}
    for mode in ("items", "records"):
        scan(spark, spool, mode)                                   # warm-up
        times = []
        cpus = []
        rows = 0
        for _ in range(rounds):
            dt, cpu, rows = scan(spark, spool, mode)
            times.append(dt)
            cpus.append(cpu)
        best = min(times)
        out[mode] = {"rows": rows, "seconds": times, "cpu_seconds": cpus,
                     "mb_per_s_best": nbytes / 2**20 / best,
                     "mb_per_s_median": nbytes / 2**20 / statistics.median(times),
                     "mb_per_cpu_s": nbytes / 2**20 / statistics.median(cpus)}
    return out


def _drain(spark, port: int, queue: str, batch: int, checkpoint: str):
    """One availableNow query draining `queue` into the noop sink: (wall s, CPU s, progress)."""
    q = (spark.readStream.format("lanner").option("servers", f"127.0.0.1:{port}")
         .option("queue", queue).option("maxItemsPerBatch", batch).option("maxOpenTransactions", batch)
         .load().writeStream.format("noop")
         .option("checkpointLocation", checkpoint)
         .trigger(availableNow=True))
    c0 = tree_cpu()
    t = time.perf_counter()
    run = q.start()
    run.awaitTermination()
    return time.perf_counter() - t, tree_cpu() - c0, run.recentProgress


def bench_stream(spark, items: int, item_size: int, batch: int, workdir: str, warmup: int = 2000) -> dict:
    """A small warm-up query first (the first streaming query of a session pays for class
    loading and JIT: reported as `warmup_seconds`), then the timed one."""
    # lazy: pyspark and the server helpers load only for the benchmark phase that needs them
    from lanner.perf.servers import start_lanner
    from lanner.spark.client import Conn
    cfg = os.path.join(workdir, "stream.toml")
    with open(cfg, "w") as f:
        f.write(f"[server]\nmax_open_transactions = {batch}\n")
    target = start_lanner(config=cfg)
    try:
        addr = ("127.0.0.1", target.port)
        body = b"x" * item_size
        c = Conn(addr)
        c.set_many(("w", b"%08d" % i + body[8:], 0) for i in range(warmup))
        c.close()
        warm_s = _drain(spark, target.port, "w", batch, os.path.join(workdir, "ck-w"))[0] if warmup else None
        c = Conn(addr)
        c.set_many(("s", b"%08d" % i + body[8:], 0) for i in range(items))
        c.close()
        dt, cpu, progress = _drain(spark, target.port, "s", batch, os.path.join(workdir, "ck"))
        batches = [p["numInputRows"] for p in progress]
        c = Conn(addr)
        st = c.stats()
        c.close()
        left = int(st.get("queue_s_items", 0)), int(st.get("queue_s_open_transactions", 0))
        return {"items": items, "item_size": item_size, "batch": batch, "seconds": dt, "cpu_seconds": cpu,
                "warmup_items": warmup, "warmup_seconds": warm_s,
                "items_per_s": items / dt, "batches": batches, "left_items_open": left,
                "steady_items_per_s": _steady(progress)}
    finally:
        target.stop()


def _steady(progress: list) -> float | None:
    """Items/s over the batches after the first (processing time only, from Spark's progress)."""
    rows = sum(p["numInputRows"] for p in progress[1:])
    ms = sum(p["durationMs"].get("triggerExecution", 0) for p in progress[1:])
    return rows / (ms / 1000.0) if rows and ms else None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m lanner.perf.spark_bench", description=__doc__.split("\n")[0])
    p.add_argument("--spool-mb", type=int, default=200)
    p.add_argument("--queues", type=int, default=4)
    p.add_argument("--item-size", type=int, default=1024, help="scan: bytes per item")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--stream-items", type=int, default=100_000)
    p.add_argument("--stream-item-size", type=int, default=100)
    p.add_argument("--batch", type=int, default=20_000, help="stream: maxItemsPerBatch")
    p.add_argument("--skip-scan", action="store_true")
    p.add_argument("--skip-stream", action="store_true")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    workdir = tempfile.mkdtemp(prefix="lanner-spark-bench-")
    result: dict = {"args": vars(args)}
    ok = True
    try:
        spark = session()
        if not args.skip_scan:
            spool = os.path.join(workdir, "spool")
            t = time.perf_counter()
            nbytes = build_spool(spool, args.spool_mb, args.queues, args.item_size)
            print(f"spool: {nbytes / 2**20:.1f} MiB in {len(os.listdir(spool))} files, "
                  f"{args.queues} queues, {args.item_size} B items (built in {time.perf_counter() - t:.1f} s)")
            r = bench_scan(spark, spool, nbytes, args.rounds)
            result["scan"] = {"bytes": nbytes, **r}
            for mode, m in r.items():
                good = m["mb_per_s_best"] >= GOAL_SCAN_MBS
                ok &= good
                print(f"scan {mode:7s}: {m['rows']:>9d} rows  best {m['mb_per_s_best']:6.1f} MB/s  "
                      f"median {m['mb_per_s_median']:6.1f} MB/s  "
                      f"({', '.join(f'{s:.2f}' for s in m['seconds'])} s wall; "
                      f"{m['mb_per_cpu_s']:.1f} MB per CPU-s)  goal {GOAL_SCAN_MBS:.0f}: "
                      f"{'ok' if good else 'MISSED'}")
            shutil.rmtree(spool, ignore_errors=True)
        if not args.skip_stream:
            r = bench_stream(spark, args.stream_items, args.stream_item_size, args.batch, workdir)
            result["stream"] = r
            good = r["items_per_s"] >= GOAL_STREAM_IPS and r["left_items_open"] == (0, 0)
            ok &= good
            steady = r["steady_items_per_s"]
            print(f"stream : {r['items']} items of {r['item_size']} B in {r['seconds']:.2f} s = "
                  f"{r['items_per_s']:.0f} items/s end to end"
                  + (f", {steady:.0f} items/s after the first batch" if steady else "")
                  + f"; {r['cpu_seconds']:.1f} CPU-s (warm-up query of {r['warmup_items']} items: "
                  f"{r['warmup_seconds'] or 0:.1f} s); batches {r['batches']}; "
                  f"left (items, open) {r['left_items_open']}  "
                  f"goal {GOAL_STREAM_IPS:.0f}: {'ok' if good else 'MISSED'}")
        spark.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
