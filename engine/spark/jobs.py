"""`lanner spark dump|stats`: the common jobs over a spool, on Spark.

    lanner spark dump QUEUE_PATH --out DIR [--format parquet|json] [--queues a,b]
    lanner spark stats QUEUE_PATH... [--queues a,b]

Both read the live items of every Kestrel-journal queue (format lanner-journal)
and every command-log queue (lanner-cmdlog) under the paths, never writing to
them, so a live server's spool is fine.  They run on a `local[*]` session
unless `--master` is given.  On a cluster the same file is the application:

    spark-submit --master spark://head:7077 \\
        "$(python -c 'import lanner.spark.jobs as j; print(j.__file__)')" \\
        dump /shared/spool --out /shared/dump

(every node needs `pip install 'lanner[spark]'` and the spool at the same path).
Under spark-submit the master comes from spark-submit.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

USAGE = """usage: lanner spark dump QUEUE_PATH --out DIR [--format parquet|json] [--queues a,b] [--master URL]
       lanner spark stats QUEUE_PATH... [--queues a,b] [--master URL]
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lanner spark", description="Spark jobs over Lanner spools.")
    sub = p.add_subparsers(dest="job", required=True)
    d = sub.add_parser("dump", help="write the live items to Parquet or JSON files")
    d.add_argument("paths", nargs="+", metavar="QUEUE_PATH")
    d.add_argument("--out", required=True, help="output directory (must not exist unless --overwrite)")
    d.add_argument("--format", choices=("parquet", "json"), default="parquet")
    d.add_argument("--overwrite", action="store_true", help="replace DIR if it exists")
    s = sub.add_parser("stats", help="items, bytes and oldest age per queue")
    s.add_argument("paths", nargs="+", metavar="QUEUE_PATH")
    for sp in (d, s):
        sp.add_argument("--queues", help="comma list of queues (default: all)")
        sp.add_argument("--master", help="Spark master URL (default: local[*], or spark-submit's)")
        sp.add_argument("--now", help="replay clock: epoch ms or ISO-8601 (default: now)")
    return p


def session(master: str | None):
    """(spark, created): the active session if there is one, else a new one."""
    # lazy: pyspark loads only when a Spark job runs (`lanner spark --help` works without it)
    from pyspark.sql import SparkSession
    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    # lazy: pyspark loads only when a Spark job runs (`lanner spark --help` works without it)
    from pyspark import SparkConf, SparkContext
    # The JVM first: under spark-submit it is already running and holds spark-submit's
    # --master.  A SparkConf made before the JVM is an empty dict, so local[*] would win.
    SparkContext._ensure_initialized()
    conf = SparkConf()
    if master is None and not conf.contains("spark.master"):
        master = "local[*]"
    b = SparkSession.builder.appName("lanner-spark").config("spark.ui.showConsoleProgress", "false")
    if master is not None:
        b = b.master(master)
    if (master or conf.get("spark.master", "")).startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        b = b.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark, True


def _has_segments(paths: list[str]) -> bool:
    # lazy: pyspark loads only when a Spark job runs (`lanner spark --help` works without it)
    from lanner.spark._cmdlog import find_segment_dirs
    return bool(find_segment_dirs(paths))


def live_items(spark, paths: list[str], queues: str | None, now: str | None):
    """One DataFrame of every live item: storage, queue, position, add_time, expiry, data, spool, id, priority."""
    # lazy: pyspark loads only when a Spark job runs (`lanner spark --help` works without it)
    from pyspark.sql import functions as F
    from lanner.spark import register
    register(spark)
    now_ms = now or str(time.time_ns() // 1_000_000)
    r = spark.read.format("lanner-journal").option("now", now_ms)
    if queues:
        r = r.option("queues", queues)
    df = r.load(paths).select(F.lit("journal").alias("storage"), "queue", "position", "add_time", "expiry",
                              "data", "spool", F.lit(None).cast("string").alias("id"),
                              F.lit(0).alias("priority"))
    if _has_segments(paths):
        c = spark.read.format("lanner-cmdlog").option("now", now_ms)
        if queues:
            c = c.option("queues", queues)
        cm = c.load(paths)
        bad = cm.where("corrupt").select("error").collect()
        for row in bad:
            sys.stderr.write(f"lanner spark: command log damaged, replay stopped: {row.error}\n")
        df = df.unionByName(cm.where("NOT corrupt").select(
            F.lit("cmdlog").alias("storage"), "queue", "position", "add_time", "expiry", "data", "spool",
            "id", "priority"))
    return df


def stats_rows(df, now_ms: int, roots: list[str]) -> list[tuple]:
    """(root, queue, items, bytes, oldest age in s) per queue, root being the given
    path the queue was found under (command-log queues live in directories below it)."""
    # lazy: pyspark loads only when a Spark job runs (`lanner spark --help` works without it)
    from pyspark.sql import functions as F
    rows = (df.groupBy("spool", "queue")
            .agg(F.count(F.lit(1)).alias("items"), F.sum(F.length("data")).alias("bytes"),
                 F.min(F.unix_millis("add_time")).alias("oldest"))
            .collect())
    absroots = sorted((os.path.abspath(r) for r in roots), key=len, reverse=True)
    merged: dict[tuple[str, str], list] = {}
    for r in rows:
        root = next((a for a in absroots if r.spool == a or r.spool.startswith(a.rstrip("/") + "/")), r.spool)
        m = merged.setdefault((root, r.queue), [0, 0, None])
        m[0] += r.items
        m[1] += r.bytes or 0
        if r.oldest is not None and (m[2] is None or r.oldest < m[2]):
            m[2] = r.oldest
    return [(root, q, n, b, max(now_ms - oldest, 0) / 1000.0 if oldest is not None else 0.0)
            for (root, q), (n, b, oldest) in sorted(merged.items())]


def format_stats(rows, many_roots: bool) -> str:
    head = (["spool"] if many_roots else []) + ["queue", "items", "bytes", "oldest_age_s"]
    table = [head]
    for root, q, n, b, age in rows:
        table.append(([root] if many_roots else []) + [q, str(n), str(b), f"{age:.3f}"])
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    lines = []
    for row in table:
        lines.append("  ".join(c.ljust(w) if i < len(head) - 3 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(row, widths))).rstrip())
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None, out=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = out or sys.stdout
    if not argv or argv[0] in ("-h", "--help", "help"):
        out.write(USAGE)
        return 0
    args = _parser().parse_args(argv)
    for p in args.paths:
        if not os.path.exists(p):
            sys.stderr.write(f"lanner spark: no such file or directory: {p}\n")
            return 1
    try:
        import pyspark  # noqa: F401
    except ImportError:
        sys.stderr.write("lanner spark: pyspark is not installed: pip install 'lanner[spark]'\n")
        return 1
    # lazy: pyspark loads only when a Spark job runs (`lanner spark --help` works without it)
    from lanner.spark._options import parse_time_ms
    now_ms = parse_time_ms(args.now) if args.now else time.time_ns() // 1_000_000
    spark, created = session(args.master)
    try:
        df = live_items(spark, args.paths, args.queues, str(now_ms))
        if args.job == "stats":
            rows = stats_rows(df, now_ms, args.paths)
            out.write(format_stats(rows, len(set(args.paths)) > 1))
            return 0
        if os.path.exists(args.out) and not args.overwrite:
            sys.stderr.write(f"lanner spark: {args.out} exists (use --overwrite to replace it)\n")
            return 1
        df = df.cache()
        n = df.count()
        df.write.mode("overwrite" if args.overwrite else "errorifexists").format(args.format).save(args.out)
        queues = df.select("spool", "queue").distinct().count()
        df.unpersist()
        out.write(f"wrote {n} items of {queues} queues to {args.out} ({args.format})\n")
        return 0
    finally:
        if created:
            spark.stop()


if __name__ == "__main__":              # spark-submit .../lanner/spark/jobs.py dump ...
    sys.exit(main())
