"""The lanner stream source and sink against a real `lanner serve` on 127.0.0.1:
availableNow drains and confirms, processingTime with items arriving, maxItemsPerBatch,
a sink failure then a restart from the checkpoint, the server killed mid-query, and the
batch and streaming sinks."""
from __future__ import annotations

import collections
import signal
import threading
import time

import pytest

pytest.importorskip("pyspark")

from lanner.spark.client import Conn                       # noqa: E402
from tests.helpers import start_server                      # noqa: E402

pytestmark = pytest.mark.integration

CONFIG = """
[server]
max_open_transactions = 1000

[queues."tiny"]
max_items = 5
"""
MOT = "1000"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    h = start_server(tmp_path_factory.mktemp("lanner"), config=CONFIG)
    yield h
    h.stop()


def addr(h) -> str:
    return f"127.0.0.1:{h.memcache_port}"


def put(h, queue: str, items) -> None:
    c = Conn(("127.0.0.1", h.memcache_port))
    try:
        c.set_many((queue, d, 0) for d in items)
    finally:
        c.close()


def qstats(h, queue: str) -> tuple[int, int]:
    """(items, open_transactions) of a queue."""
    c = Conn(("127.0.0.1", h.memcache_port))
    try:
        s = c.stats()
    finally:
        c.close()
    return int(s.get(f"queue_{queue}_items", 0)), int(s.get(f"queue_{queue}_open_transactions", 0))


def wait_for(cond, timeout: float = 90.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


class Collector:
    """A foreachBatch sink that remembers every row per batch (runs in this process)."""

    def __init__(self, fail_batch: int | None = None, fail_after_write: bool = True) -> None:
        self.batches: dict[int, list[bytes]] = {}
        self.sizes: list[int] = []
        self.lock = threading.Lock()
        self.fail_batch = fail_batch
        self.fail_after_write = fail_after_write

    def __call__(self, df, batch_id: int) -> None:
        rows = [bytes(r.data) for r in df.select("data").collect()]
        with self.lock:
            if batch_id == self.fail_batch and not self.fail_after_write:
                self.fail_batch = None
                raise RuntimeError("injected sink failure before the write")
            self.batches.setdefault(batch_id, []).extend(rows)
            self.sizes.append(len(rows))
            if batch_id == self.fail_batch:
                self.fail_batch = None
                raise RuntimeError("injected sink failure after the write")

    def all(self) -> list[bytes]:
        with self.lock:
            return [d for rows in self.batches.values() for d in rows]


def source(spark, h, queue: str, batch: int = 1000, **extra):
    r = (spark.readStream.format("lanner").option("servers", addr(h)).option("queue", queue)
         .option("maxItemsPerBatch", batch).option("maxOpenTransactions", MOT))
    for k, v in extra.items():
        r = r.option(k, v)
    return r.load()


def test_available_now_drains_confirms_and_honours_max_items(spark, server, tmp_path):
    items = [b"drain-%03d" % i for i in range(50)]
    put(server, "drain", items)
    df = source(spark, server, "drain", batch=20)
    assert df.columns == ["server", "queue", "data", "fetched_at"]
    sink = Collector()
    q = (df.writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(availableNow=True).start())
    assert q.awaitTermination(180)
    assert q.exception() is None
    assert [s for s in sink.sizes if s] == [20, 20, 10]
    assert sorted(sink.all()) == items                        # each exactly once
    assert qstats(server, "drain") == (0, 0)                  # empty, and the last batch confirmed too


def test_processing_time_with_items_arriving(spark, server, tmp_path):
    first = [b"pt-a-%03d" % i for i in range(30)]
    second = [b"pt-b-%03d" % i for i in range(30)]
    sink = Collector()
    rows_seen = []
    df = source(spark, server, "arrive", batch=25)
    q = (df.writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(processingTime="1 second").start())
    try:
        put(server, "arrive", first)
        wait_for(lambda: set(first) <= set(sink.all()), what="the first items")
        put(server, "arrive", second)
        wait_for(lambda: set(second) <= set(sink.all()), what="the items added during the run")
        rows_seen = sink.all()
    finally:
        q.stop()
    assert max(sink.sizes) <= 25
    assert sorted(set(rows_seen)) == sorted(first + second)
    assert len(rows_seen) == 60                               # nothing twice while it ran
    # stopping leaves at most the last batch unconfirmed: its items go back to the queue
    wait_for(lambda: qstats(server, "arrive")[1] == 0, what="the open reads to roll back")
    left, _ = qstats(server, "arrive")
    assert left <= 25


def test_sink_failure_then_restart_from_the_checkpoint(spark, server, tmp_path):
    items = [b"fail-%03d" % i for i in range(50)]
    put(server, "fail", items)
    ck = str(tmp_path / "ck")
    sink = Collector(fail_batch=1)                            # batch 1 is written, then the sink fails
    q = (source(spark, server, "fail", batch=20).writeStream.foreachBatch(sink)
         .option("checkpointLocation", ck).trigger(availableNow=True).start())
    with pytest.raises(Exception, match="injected sink failure"):
        q.awaitTermination(180)
    wait_for(lambda: qstats(server, "fail")[1] == 0, what="the failed query's reads to roll back")
    assert qstats(server, "fail")[0] == 30                    # batch 0 confirmed; batch 1's items are back
    q = (source(spark, server, "fail", batch=20).writeStream.foreachBatch(sink)
         .option("checkpointLocation", ck).trigger(availableNow=True).start())
    assert q.awaitTermination(180)
    got = sink.all()
    assert sorted(set(got)) == items                          # nothing lost
    dups = [d for d, n in collections.Counter(got).items() if n > 1]
    assert 0 < len(dups) <= 20                                # at most the failed batch twice
    assert qstats(server, "fail") == (0, 0)


def _listening(port: int) -> bool:
    import socket
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def test_server_killed_mid_query_then_restarted(spark, tmp_path):
    (tmp_path / "srv").mkdir()
    (tmp_path / "srv2").mkdir()
    h = start_server(tmp_path / "srv", config=CONFIG)
    port = h.memcache_port
    first = [b"kill-a-%03d" % i for i in range(40)]
    second = [b"kill-b-%03d" % i for i in range(20)]
    put(h, "k", first)
    sink = Collector()
    q = (source(spark, h, "k", batch=10).writeStream.foreachBatch(sink)
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(processingTime="1 second").start())
    try:
        wait_for(lambda: len(sink.all()) >= 10, what="the first batch")
        h.proc.send_signal(signal.SIGKILL)                    # mid-query, reads open
        h.proc.wait()
        wait_for(lambda: not _listening(port), what="the killed server's processes to go")
        h = start_server(tmp_path / "srv2", "--memcache-port", str(port), config=CONFIG,
                         queue_path=h.queue_path)
        h.memcache_port = port                                # the later --memcache-port flag wins
        put(h, "k", second)
        wait_for(lambda: set(first + second) <= set(sink.all()), timeout=120, what="every item after the restart")
        assert q.exception() is None and q.isActive          # the query rode through the restart
    finally:
        q.stop()
        h.stop()
    assert sorted(set(sink.all())) == sorted(first + second)


def test_batch_and_streaming_sink_counts(spark, server, tmp_path):
    from pyspark.sql import functions as F
    df = spark.range(1000).select(F.format_string("b-%04d", "id").alias("data"),
                                  F.when(F.col("id") % 4 == 0, F.lit("sink_b")).alias("queue"))
    (df.repartition(3).write.format("lanner").option("servers", addr(server)).option("queue", "sink_a")
     .mode("append").save())
    assert qstats(server, "sink_a")[0] == 750                 # a queue column overrides the option
    assert qstats(server, "sink_b")[0] == 250
    # expiry: a TIMESTAMP in the past means the item is already expired; null means never
    ex = spark.createDataFrame([(b"old", "2001-01-01 00:00:00"), (b"new", None)], "data binary, e string") \
        .select("data", F.to_timestamp("e").alias("expiry"))
    ex.write.format("lanner").option("servers", addr(server)).option("queue", "sink_exp").mode("append").save()
    c = Conn(("127.0.0.1", server.memcache_port))
    try:
        assert c.open_items("sink_exp", 2) == [b"new"]
        c.confirm("sink_exp", 1)
    finally:
        c.close()
    # streaming: queue sink_a -> queue sink_c through the source and the streaming sink
    q = (source(spark, server, "sink_a", batch=300).select("data").writeStream.format("lanner")
         .option("servers", addr(server)).option("queue", "sink_c")
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    assert q.awaitTermination(180)
    assert qstats(server, "sink_c")[0] == 750
    assert qstats(server, "sink_a") == (0, 0)
    c = Conn(("127.0.0.1", server.memcache_port))
    try:
        got = c.open_items("sink_c", 750)
    finally:
        c.close()
    assert sorted(got) == sorted(b"b-%04d" % i for i in range(1000) if i % 4)


def test_sink_refusal_names_the_queue_and_bad_columns_fail_early(spark, server):
    df = spark.createDataFrame([(f"t{i}",) for i in range(8)], "data string")
    with pytest.raises(Exception, match="queue 'tiny' refused an item"):
        df.coalesce(1).write.format("lanner").option("servers", addr(server)).option("queue", "tiny") \
            .mode("append").save()
    with pytest.raises(Exception, match="needs a `data` column"):
        spark.range(3).write.format("lanner").option("servers", addr(server)).option("queue", "x") \
            .mode("append").save()
    with pytest.raises(Exception, match="can only add items to queues"):
        df.write.format("lanner").option("servers", addr(server)).option("queue", "x").mode("overwrite").save()
    with pytest.raises(Exception, match="reads live queues as a stream only"):
        spark.read.format("lanner").option("servers", addr(server)).option("queue", "x").load().collect()


# -- the driver-side reader on its own (what Spark's runner process calls), no query ---------

def _reader(servers: str, queues: str, **opts):
    from lanner.spark.stream_source import STREAM_SCHEMA, QueueStreamReader
    options = {"servers": servers, "queues": queues, "maxopentransactions": MOT,
               **{k.lower(): str(v) for k, v in opts.items()}}
    return QueueStreamReader(options, STREAM_SCHEMA)


def _rows(reader, parts) -> list[tuple]:
    out = []
    for p in parts:
        for rb in reader.read(p):
            out.extend(zip(*(c.to_pylist() for c in rb.columns)))
    return out


def test_reader_confirms_only_committed_batches_across_servers_and_queues(server, tmp_path):
    import pickle
    (tmp_path / "two").mkdir()
    other = start_server(tmp_path / "two", config=CONFIG)
    try:
        for h, tag in ((server, b"s1"), (other, b"s2")):
            put(h, "ua", [tag + b"-a%d" % i for i in range(7)])
            put(h, "ub", [tag + b"-b%d" % i for i in range(5)])
        r = _reader(f"{addr(server)},{addr(other)}", "ua,ub", maxItemsPerBatch=10, numPartitions=3)
        start = r.initialOffset()
        end = r.latestOffset(start, r.getDefaultReadLimit())
        assert end == {"seq": 10}
        parts = r.partitions(start, end)
        assert len(parts) == 3
        executor_copy = pickle.loads(pickle.dumps(r))            # what an executor gets: no items, no sockets
        rows = _rows(executor_copy, parts)
        assert len(rows) == 10 and _rows(executor_copy, parts) == rows      # read() is a pure replay
        assert {row[0] for row in rows} <= {addr(server), addr(other)}
        opened = sum(qstats(h, q)[1] for h in (server, other) for q in ("ua", "ub"))
        assert opened == 10                                        # taken, not confirmed
        end2 = r.latestOffset(end, r.getDefaultReadLimit())       # batch 0 is committed by now
        assert end2 == {"seq": 20}
        assert sum(qstats(h, q)[1] for h in (server, other) for q in ("ua", "ub")) == 10   # only batch 1 open
        rows += _rows(r, r.partitions(end, end2))
        r.commit(end2)
        end3 = r.latestOffset(end2, r.getDefaultReadLimit())
        assert end3 == {"seq": 24}                                 # the last 4 of 24
        rows += _rows(r, r.partitions(end2, end3))
        r.commit(end3)
        seen = [row[2] for row in rows]
        assert len(seen) == 24 == len(set(seen))
        assert all(qstats(h, q) == (0, 0) for h in (server, other) for q in ("ua", "ub"))
        assert r.latestOffset(end3, r.getDefaultReadLimit()) == end3          # nothing left
        # a replay of a range this process never took (after a restart) is empty
        fresh = _reader(addr(server), "ua")
        assert fresh.partitions({"seq": 3}, {"seq": 9}) == []
    finally:
        other.stop()


def test_reader_refuses_more_open_reads_than_the_server_allows(server):
    put(server, "mot", [b"m%d" % i for i in range(1100)])         # the server allows 1000 per connection
    r = _reader(addr(server), "mot", maxItemsPerBatch=1500, maxOpenTransactions=1500, connectionsPerServer=1)
    with pytest.raises(RuntimeError, match="maxOpenTransactions"):
        r.latestOffset(r.initialOffset(), r.getDefaultReadLimit())
    wait_for(lambda: qstats(server, "mot") == (1100, 0), what="the refused reads to roll back")
