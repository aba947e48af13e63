"""`spark.readStream.format("lanner")`: live queues as an at-least-once stream.

    (spark.readStream.format("lanner")
         .option("servers", "10.0.0.1:22133,10.0.0.2:22133").option("queue", "events")
         .option("maxItemsPerBatch", 10000).option("maxOpenTransactions", 10000)
         .load())

Rows: server STRING, queue STRING, data BINARY, fetched_at TIMESTAMP.

Options:
  servers              host:port list (required).
  queue / queues       one queue, or a comma list (required).
  maxItemsPerBatch     most items per micro-batch (default 1000).
  maxOpenTransactions  the servers' `max_open_transactions` setting (default 1,
                       Kestrel's and Lanner's default).  A connection holds at
                       most this many open reads per queue.
  connectionsPerServer connections the driver may open per server (default:
                       enough for maxItemsPerBatch, at most 64).  A batch holds
                       at most servers x connections x maxOpenTransactions
                       items per queue.
  numPartitions        partitions per micro-batch (default 2).
  timeout              socket timeout in seconds (default 30).

How delivery works (the at-least-once design prototyped for this project, README "Spark"):
Spark runs `latestOffset`, `partitions` and `commit` in one long-lived Python
process per query.  There, `latestOffset` takes up to maxItemsPerBatch items
with reliable reads (`get q/open`, pipelined) and keeps them open; the offset
is a counter of items taken (`{"seq": n}`).  `partitions` ships the items'
bytes to the executors inside the partitions, so `read` is pure and Spark may
re-run it.  An item is confirmed (`confirm q n`, its connection's oldest n
open reads) only once Spark has committed the batch holding it: at the next
`latestOffset(start)` (every batch below `start` is in the commit log by then)
and in `commit(end)`.  Spark never calls `stop()`; when the query ends or dies
its process is killed, the connections drop, and the servers put every
unconfirmed item back at the head of its queue.

At-least-once, so an item can be delivered twice:
* the last micro-batch of a `processingTime` query is confirmed at the next
  trigger; if the query stops first, its items are delivered again by the next
  run (an `availableNow` query confirms its last batch before it ends);
* a batch that failed (sink error, driver crash) is replayed after a restart
  from its checkpoint with no rows (its items went back to the queues) and the
  items come again in a later batch;
* a server that restarts, or a connection that breaks, before a confirm
  reached it, hands the items out again.
Nothing is lost: an item leaves a queue only when confirmed, and it is
confirmed only after its batch is committed.  Items carry no ids, so
producers that need deduplication must put an id in the payload.

Server settings the source relies on:
* `max_open_transactions` >= maxOpenTransactions (the source fails with a
  clear error if the server refuses an open read);
* `open_transaction_timeout` off, or longer than the longest micro-batch plus
  one trigger interval: a timed-out open read is handed to someone else while
  the batch still delivers it (a duplicate), and a later confirm on that
  connection could then confirm a newer item early.
* `client_timeout` off or longer than the trigger interval: an idle
  connection that the server closes gives its open reads back (duplicates).
"""
from __future__ import annotations

import logging
import math
import time
from collections import deque
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadMaxRows, SupportsTriggerAvailableNow

from ._arrow import arrow_schema, struct
from ._options import int_option, plain
from .client import ClientError, Conn, TooManyOpen, parse_servers, server_name

log = logging.getLogger(__name__)

PROBE_READS = 16

STREAM_SCHEMA = struct("server STRING, queue STRING, data BINARY, fetched_at TIMESTAMP")


def option_queue_list(options) -> list[str]:
    raw = options.get("queues") or options.get("queue")
    queues = [q.strip() for q in (raw or "").split(",") if q.strip()]
    if not queues:
        raise ValueError("the lanner source needs the option `queue` (or `queues`, a comma list)")
    return queues


@dataclass
class ItemsPartition(InputPartition):
    """A slice of one micro-batch: the rows themselves, so read() is a pure replay."""
    servers: list
    queues: list
    data: list
    fetched_us: list


class _Slot:
    """One driver-side connection and its open reads: queue -> seqs, oldest first."""

    __slots__ = ("conn", "server", "open", "taking")

    def __init__(self, conn: Conn, server: int) -> None:
        self.conn = conn
        self.server = server
        self.open: dict[str, deque[int]] = {}
        self.taking: dict[str, int] = {}          # opened in the fetch under way, not numbered yet

    def held(self, queue: str) -> int:
        return len(self.open.get(queue, ())) + self.taking.get(queue, 0)


class QueueStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Built in several processes at query start: the constructor does no I/O."""

    def __init__(self, options, schema) -> None:
        self.servers = parse_servers(options.get("servers"))
        self.queues = option_queue_list(options)
        self.max_items = int_option(options, "maxItemsPerBatch", 1000)
        self.mot = int_option(options, "maxOpenTransactions", 1)
        self.cps = int_option(options, "connectionsPerServer", None) or \
            max(1, min(64, math.ceil(self.max_items / self.mot)))
        self.num_partitions = int_option(options, "numPartitions", 2)
        self.timeout = float(options.get("timeout") or 30.0)
        self.schema = schema
        self._reset_state()

    def _reset_state(self) -> None:
        self._slots: list[list[_Slot]] = [[] for _ in self.servers]
        self._batches: deque[tuple[int, int, list]] = deque()      # (start, end, rows) not yet confirmed
        self._budget: int | None = None
        self._rr = 0
        self._ask: dict[tuple[int, str], int] = {}      # (server, queue) -> reads to pipeline next


    def __getstate__(self):
        # executors get a copy for read(): no sockets, no items
        d = dict(self.__dict__)
        d["_slots"] = [[] for _ in self.servers]
        d["_batches"] = deque()
        return d

    # -- offsets ------------------------------------------------------------------------------
    def initialOffset(self) -> dict:
        return {"seq": 0}

    def getDefaultReadLimit(self):
        return ReadMaxRows(self.max_items)

    def prepareForTriggerAvailableNow(self) -> None:
        """availableNow: take at most what the queues hold now, then end."""
        total = 0
        for i, addr in enumerate(self.servers):
            try:
                conn = Conn(addr, self.timeout)
                try:
                    stats = conn.stats()
                finally:
                    conn.close()
            except ClientError as e:
                log.warning("lanner source: %s; counting no items there", e)
                continue
            for q in self.queues:
                total += int(stats.get(f"queue_{q}_items", "0"))
        self._budget = total

    def latestOffset(self, start: dict, limit) -> dict:
        s = int(start["seq"])
        self._confirm_below(s)
        want = self.max_items
        if isinstance(limit, ReadMaxRows):
            want = min(want, limit.max_rows)
        if self._budget is not None:
            want = min(want, self._budget)
        rows = self._fetch(s, want) if want > 0 else []
        if self._budget is not None:
            self._budget -= len(rows)
        if rows:
            self._batches.append((s, s + len(rows), rows))
        return {"seq": s + len(rows)}

    def partitions(self, start: dict, end: dict) -> list:
        s, e = int(start["seq"]), int(end["seq"])
        rows = []
        for bs, be, brows in self._batches:
            if be <= s or bs >= e:
                continue
            rows.extend(brows[max(s, bs) - bs:min(e, be) - bs])
        if len(rows) < e - s:
            # A replay after a restart: the process that took these items is gone, so the
            # servers have put them back in their queues; they come again in a later batch.
            log.info("lanner source: batch [%d, %d) has %d of its items in this run; the others were "
                     "returned to their queues and will be delivered again", s, e, len(rows))
        if not rows:
            return []
        n = max(1, min(self.num_partitions, len(rows)))
        step = math.ceil(len(rows) / n)
        parts = []
        for i in range(0, len(rows), step):
            chunk = rows[i:i + step]
            parts.append(ItemsPartition([r[0] for r in chunk], [r[1] for r in chunk],
                                        [r[2] for r in chunk], [r[3] for r in chunk]))
        return parts

    def read(self, partition):
        if getattr(partition, "data", None) is None:
            return iter(())
        schema = arrow_schema(self.schema)
        ts = schema.field("fetched_at").type
        rb = pa.RecordBatch.from_arrays(
            [pa.array(partition.servers, pa.string()), pa.array(partition.queues, pa.string()),
             pa.array(partition.data, pa.binary()), pa.array(partition.fetched_us, pa.int64()).cast(ts)],
            schema=schema)
        return iter([rb])

    def commit(self, end: dict) -> None:
        self._confirm_below(int(end["seq"]))

    def stop(self) -> None:            # documented but never called by Spark 4.3; harmless if it is
        for slots in self._slots:
            for slot in slots:
                slot.conn.close()
        self._reset_state()

    # -- the servers --------------------------------------------------------------------------
    def _drop(self, slot: _Slot, err: BaseException) -> None:
        """A broken connection: the server rolls its open reads back (redelivered later)."""
        pending = sum(len(d) for d in slot.open.values())
        log.warning("lanner source: %s; %d unconfirmed items on that connection go back to their queue "
                    "and will be delivered again", err, pending)
        slot.conn.close()
        self._slots[slot.server].remove(slot)

    def _confirm_below(self, bound: int) -> None:
        """Confirm every open read with seq < bound (their batches are committed)."""
        for slots in self._slots:
            for slot in list(slots):
                for q, seqs in slot.open.items():
                    k = 0
                    for seq in seqs:
                        if seq >= bound:
                            break
                        k += 1
                    if not k:
                        continue
                    try:
                        slot.conn.confirm(q, k)
                    except ClientError as e:
                        self._drop(slot, e)
                        break
                    for _ in range(k):
                        seqs.popleft()
        while self._batches and self._batches[0][1] <= bound:
            self._batches.popleft()

    def _slot_with_room(self, si: int, queue: str) -> _Slot | None:
        for slot in self._slots[si]:
            if slot.held(queue) < self.mot:
                return slot
        if len(self._slots[si]) >= self.cps:
            return None
        slot = _Slot(Conn(self.servers[si], self.timeout), si)   # ClientError: server unreachable
        self._slots[si].append(slot)
        return slot

    def _fetch(self, s: int, want: int) -> list:
        """Open up to `want` items across servers and queues; rows numbered from s."""
        taken: list[tuple[_Slot, str, bytes]] = []
        failed: set[_Slot] = set()              # the objects themselves, so ids are never reused
        n_servers = len(self.servers)
        order = [(self._rr + i) % n_servers for i in range(n_servers)]
        self._rr += 1
        down: set[int] = set()
        for si in order:
            for q in self.queues:
                while len(taken) < want and si not in down:
                    try:
                        slot = self._slot_with_room(si, q)
                    except ClientError as e:
                        log.warning("lanner source: %s; skipping it this batch", e)
                        down.add(si)
                        break
                    if slot is None:
                        break
                    # A queue found empty last time is probed with a few reads, not a whole batch
                    # of them; the probe doubles while the replies come back full.
                    ask = self._ask.get((si, q), want)
                    k = min(want - len(taken), self.mot - slot.held(q), ask)
                    try:
                        got = slot.conn.open_items(q, k)
                    except TooManyOpen as e:
                        self._drop(slot, e)
                        raise RuntimeError(
                            f"{e}. Set the source option maxOpenTransactions to the server's "
                            f"max_open_transactions (now {self.mot}), or raise that server setting") from None
                    except ClientError as e:
                        failed.add(slot)
                        self._drop(slot, e)
                        break
                    taken.extend((slot, q, d) for d in got)
                    slot.taking[q] = slot.taking.get(q, 0) + len(got)
                    if len(got) < k:
                        self._ask[(si, q)] = PROBE_READS
                        break                                   # this queue is empty on this server
                    self._ask[(si, q)] = 2 * k
        now_us = time.time_ns() // 1000
        rows = []
        seq = s
        for slot, q, d in taken:
            slot.taking.clear()
            if slot in failed:
                continue                                        # rolled back by its server already
            slot.open.setdefault(q, deque()).append(seq)        # each connection's reads stay in order
            rows.append((server_name(self.servers[slot.server]), q, d, now_us))
            seq += 1
        return rows


class QueueSource(DataSource):
    """Format "lanner": the stream source, and the batch and streaming sinks (sink.py)."""

    @classmethod
    def name(cls) -> str:
        return "lanner"

    def schema(self):
        return STREAM_SCHEMA

    def streamReader(self, schema):
        return QueueStreamReader(plain(self.options), schema)

    def reader(self, schema):
        raise ValueError("the lanner format reads live queues as a stream only: use "
                         "spark.readStream.format('lanner') with trigger(availableNow=True) to drain a "
                         "queue once (a batch read could not confirm what it took), or "
                         "spark.read.format('lanner-journal') to read a spool's items without taking them")

    def writer(self, schema, overwrite: bool):
        # lazy: the sink's pyspark writer classes load only when Spark asks for a writer
        from .sink import QueueWriter, refuse_overwrite
        refuse_overwrite(overwrite, "mode('append')")
        return QueueWriter(plain(self.options), schema)

    def streamWriter(self, schema, overwrite: bool):
        # lazy: the sink's pyspark writer classes load only when Spark asks for a writer
        from .sink import QueueStreamWriter, refuse_overwrite
        refuse_overwrite(overwrite, "outputMode('append')")
        return QueueStreamWriter(plain(self.options), schema)
