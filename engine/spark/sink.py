"""`df.write.format("lanner")` and `df.writeStream.format("lanner")`: load rows into queues.

    df.write.format("lanner").option("servers", "127.0.0.1:22133").option("queue", "jobs") \\
        .mode("append").save()

Columns: `data` (BINARY or STRING, required), `queue` (STRING, optional: where
set it overrides the `queue` option), `expiry` (optional: a TIMESTAMP is an
absolute time, rounded up to the second; an integer is memcache's exptime,
seconds from now below 1000000 and a unix time above; null or 0 = never).
Other columns are ignored.  Writes append (`mode("append")`); overwrite is
refused, since a queue cannot be replaced.

Each task opens one connection, to the server at (partition id mod the
number of servers), and pipelines `set`s (256 per round trip).  A refusal
(NOT_STORED: queue full, item too large, server shutting down) fails the task
with the queue named.  Delivery is at-least-once: queue writes cannot be
rolled back, so a retried task or a replayed micro-batch sends its rows again.
`commit` and `abort` only report.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import (BinaryType, ByteType, IntegerType, LongType, ShortType, StringType,
                               TimestampNTZType, TimestampType)

from lanner.protocols.memcache import EXPTIME_ABSOLUTE_FROM

from .client import Conn, parse_servers, server_name

log = logging.getLogger(__name__)

_INTEGRAL = (ByteType, ShortType, IntegerType, LongType)
_INT32_MAX = 0x7FFFFFFF


@dataclass
class SinkCommit(WriterCommitMessage):
    server: str
    items: int


@dataclass(frozen=True)
class _Plan:
    servers: list
    queue: str | None
    data_col: str
    data_is_text: bool
    queue_col: str | None
    expiry_col: str | None
    expiry_kind: str | None         # "timestamp" | "exptime"
    timeout: float


def refuse_overwrite(overwrite: bool, use: str) -> None:
    if overwrite:
        raise ValueError(f"the lanner sink can only add items to queues, not replace them: use {use}")


def plan_sink(options, schema) -> _Plan:
    """Check the options and the input columns (on the driver, before any task runs)."""
    servers = parse_servers(options.get("servers"))
    queue = options.get("queue") or None
    fields = {f.name.lower(): f for f in schema.fields}
    data = fields.get("data")
    if data is None:
        raise ValueError("the lanner sink needs a `data` column (BINARY or STRING); "
                         f"the input has {', '.join(f.name for f in schema.fields) or 'no columns'}")
    if not isinstance(data.dataType, (BinaryType, StringType)):
        raise ValueError(f"the lanner sink's `data` column must be BINARY or STRING, not {data.dataType.simpleString()}")
    qf = fields.get("queue")
    if qf is not None and not isinstance(qf.dataType, StringType):
        raise ValueError(f"the lanner sink's `queue` column must be STRING, not {qf.dataType.simpleString()}")
    if qf is None and queue is None:
        raise ValueError("the lanner sink needs the option `queue` or a `queue` column")
    ef = fields.get("expiry")
    kind = None
    if ef is not None:
        if isinstance(ef.dataType, (TimestampType, TimestampNTZType)):
            kind = "timestamp"
        elif isinstance(ef.dataType, _INTEGRAL):
            kind = "exptime"
        else:
            raise ValueError("the lanner sink's `expiry` column must be a TIMESTAMP or an integer "
                             f"(memcache exptime), not {ef.dataType.simpleString()}")
    timeout = float(options.get("timeout") or 30.0)
    return _Plan(servers, queue, data.name, isinstance(data.dataType, StringType),
                 qf.name if qf is not None else None, ef.name if ef is not None else None, kind, timeout)


def _exptimes(arr: pa.Array, kind: str) -> list[int]:
    if kind == "timestamp":
        out = []
        for us in arr.cast(pa.int64()).to_pylist():
            if us is None:
                out.append(0)
            else:
                sec = -(-us // 1_000_000)                     # round up: never expire early
                out.append(min(max(sec, EXPTIME_ABSOLUTE_FROM), _INT32_MAX))
        return out
    out = []
    for v in arr.to_pylist():
        if v is None:
            out.append(0)
        elif not -0x80000000 <= v <= _INT32_MAX:
            raise ValueError(f"expiry {v} does not fit memcache's 32-bit exptime")
        else:
            out.append(v)
    return out


def _items(plan: _Plan, batches):
    """(queue, data bytes, exptime) for every row."""
    for rb in batches:
        n = rb.num_rows
        if not n:
            continue
        names = rb.schema.names
        data = rb.column(names.index(plan.data_col)).to_pylist()
        if plan.queue_col is not None:
            queues = rb.column(names.index(plan.queue_col)).to_pylist()
        else:
            queues = [plan.queue] * n
        exps = _exptimes(rb.column(names.index(plan.expiry_col)), plan.expiry_kind) \
            if plan.expiry_col is not None else [0] * n
        for q, d, e in zip(queues, data, exps):
            if d is None:
                raise ValueError("the lanner sink got a row whose data is null")
            if q is None:
                q = plan.queue
                if q is None:
                    raise ValueError("the lanner sink got a row whose queue is null and no `queue` option")
            if plan.data_is_text:
                d = d.encode("utf-8")
            yield q, d, e


def write_partition(plan: _Plan, batches) -> SinkCommit:
    # lazy: pyspark loads only inside a Spark task
    from pyspark import TaskContext
    ctx = TaskContext.get()
    pid = ctx.partitionId() if ctx is not None else 0
    addr = plan.servers[pid % len(plan.servers)]
    conn = None
    try:
        it = _items(plan, batches)
        first = next(it, None)
        if first is None:
            return SinkCommit(server_name(addr), 0)
        conn = Conn(addr, plan.timeout)

        def all_items():
            yield first
            yield from it
        n = conn.set_many(all_items())
        return SinkCommit(conn.name, n)
    finally:
        if conn is not None:
            conn.close()


class QueueWriter(DataSourceArrowWriter):
    """Batch sink: `df.write.format("lanner")`."""

    def __init__(self, options, schema) -> None:
        self.plan = plan_sink(options, schema)

    def write(self, iterator) -> SinkCommit:
        return write_partition(self.plan, iterator)

    def commit(self, messages) -> None:
        n = sum(m.items for m in messages if m is not None)
        log.info("lanner sink: %d items stored", n)

    def abort(self, messages) -> None:
        n = sum(m.items for m in messages if m is not None)
        log.warning("lanner sink: write failed; %d items were already stored (queue writes cannot be "
                    "undone: a retry sends them again)", n)


class QueueStreamWriter(DataSourceStreamArrowWriter):
    """Streaming sink: `df.writeStream.format("lanner")`."""

    def __init__(self, options, schema) -> None:
        self.plan = plan_sink(options, schema)

    def write(self, iterator) -> SinkCommit:
        return write_partition(self.plan, iterator)

    def commit(self, messages, batchId: int) -> None:
        n = sum(m.items for m in messages if m is not None)
        log.info("lanner sink: batch %d: %d items stored", batchId, n)

    def abort(self, messages, batchId: int) -> None:
        n = sum(m.items for m in messages if m is not None)
        log.warning("lanner sink: batch %d failed; %d items were already stored and will be sent again "
                    "when the batch is retried", batchId, n)
