"""`spark.read.format("lanner-journal")`: Kestrel journals as a batch source.

    spark.read.format("lanner-journal").load("/var/spool/lanner")          # live items
    spark.read.format("lanner-journal").option("mode", "records").load([a, b])

Options (all optional):
  mode             "items" (default): one row per live item after the server's
                   replay; "records": one row per journal record.
  queues           comma list of queue names; other queues' files are never opened.
  now              the replay clock, epoch ms or ISO-8601 (default: planning
                   time).  Items whose expiry is before it are not live; a legacy
                   ADD record gets it as its add time, as at the server's replay.
  includeExpired   "true" keeps expired items in items mode (default false: the
                   server would never serve them).

Partitions: one per queue (items) or per file (records), each carrying the
file sizes (and inodes) seen at planning; see _journal.py for why re-runs are
exact.  The files are only read: a live server's spool is safe to point at.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from pyspark.sql.datasource import DataSourceReader, InputPartition

from . import _journal as JR
from ._arrow import Columns, struct
from ._batch import BatchSource, mode_option
from ._options import bool_option, now_option

ITEMS_SCHEMA = struct("queue STRING, position LONG, add_time TIMESTAMP, expiry TIMESTAMP, data BINARY, "
                      "spool STRING")
RECORDS_SCHEMA = struct("queue STRING, file STRING, offset LONG, op STRING, xid LONG, add_time TIMESTAMP, "
                        "expiry TIMESTAMP, data BINARY, spool STRING")


@dataclass
class JournalPartition(InputPartition):
    spool: str
    queue: str
    files: list
    now_ms: int


class JournalReader(DataSourceReader):
    def __init__(self, options: dict, schema) -> None:
        self.paths = JR.option_paths(options)
        self.queues = JR.option_queues(options)
        self.mode = mode_option(options, JournalSource.NAME)
        self.now_ms = now_option(options)
        self.include_expired = bool_option(options, "includeExpired", False)
        self.schema = schema

    def partitions(self):
        now = self.now_ms if self.now_ms is not None else time.time_ns() // 1_000_000
        parts = []
        for qf in JR.plan(self.paths, self.queues):
            if self.mode == "items":
                parts.append(JournalPartition(qf.spool, qf.queue, qf.files, now))
            else:
                parts.extend(JournalPartition(qf.spool, qf.queue, [f], now) for f in qf.files)
        return parts

    def read(self, partition):
        if getattr(partition, "files", None) is None:      # Spark's stand-in when there is nothing
            return iter(())
        if self.mode == "items":
            return self._items(partition)
        return self._records(partition)

    def _items(self, p: JournalPartition):
        cols = Columns(self.schema, "ms", consts={"queue": p.queue, "spool": p.spool}, counter="position")
        _q, _pos, add, exp, data, _spool = cols.cols
        now = p.now_ms
        keep_expired = self.include_expired
        qf = JR.QueueFiles(p.spool, p.queue, p.files)
        for item in JR.replay_items(qf, now):
            e = item.expiry
            if e and e < now and not keep_expired:
                continue
            add.append(item.add_time)
            exp.append(e or None)
            data.append(item.data)
            cols.nbytes += len(item.data)
            if cols.full():
                yield cols.batch()
                _q, _pos, add, exp, data, _spool = cols.cols
        yield from cols.rest()

    def _records(self, p: JournalPartition):
        ref = p.files[0]
        cols = Columns(self.schema, "ms", consts={"queue": p.queue, "file": ref.name, "spool": p.spool})
        _q, _file, offset, op, xid, add, exp, data, _spool = cols.cols
        names = JR.OP_NAMES
        xid_ops = JR.XID_OPS
        cur = JR.open_cursor(p.spool, p.queue, ref)
        try:
            for off, code, item, x in JR.iter_file(cur, ref.size, p.now_ms):
                offset.append(off)
                op.append(names[code])
                xid.append(x if code in xid_ops else None)
                if item is not None:
                    add.append(item.add_time)
                    exp.append(item.expiry or None)
                    data.append(item.data)
                    cols.nbytes += len(item.data)
                else:
                    add.append(None)
                    exp.append(None)
                    data.append(None)
                if cols.full():
                    yield cols.batch()
                    _q, _file, offset, op, xid, add, exp, data, _spool = cols.cols
        finally:
            cur.close()
        yield from cols.rest()


class JournalSource(BatchSource):
    NAME = "lanner-journal"
    SCHEMAS = {"items": ITEMS_SCHEMA, "records": RECORDS_SCHEMA}
    READER = JournalReader
