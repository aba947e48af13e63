"""`spark.read.format("lanner-cmdlog")`: workq command-log segments as a batch source.

    spark.read.format("lanner-cmdlog").load("/var/spool/lanner")             # live jobs
    spark.read.format("lanner-cmdlog").option("mode", "records").load(WORKQ_DIR)

PATH is a queue_path, its `cmdlog/` directory, any workq segment directory, or
a list of them; every directory below holding `NNNNNNNNN.log` segments is read.

Options (all optional):
  mode      "items" (default): one row per live job after workq's replay rules
            (cmdlog.Replayer, the server's own); "records": one row per record.
  queues    items mode: comma list of queue (workq job) names to keep.
  now       the replay clock, epoch ms or ISO-8601 (default: planning time).
            workq drops adds whose TTL has run out at replay, so fixtures
            written long ago need it.

A CRC failure or an undecodable record is a row with corrupt = true and the
reason in `error`, never a failed job (see _cmdlog.py for how reading goes on).
Partitions: one per segment directory (items) or per segment (records).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from pyspark.sql.datasource import DataSourceReader, InputPartition

from . import _cmdlog as CR
from ._arrow import Columns, struct
from ._batch import BatchSource, mode_option
from ._engine import S, name_str
from ._journal import option_paths, option_queues
from ._options import now_option

ITEMS_SCHEMA = struct("queue STRING, id STRING, data BINARY, priority INT, add_time TIMESTAMP, "
                      "expiry TIMESTAMP, state STRING, position LONG, spool STRING, corrupt BOOLEAN, "
                      "error STRING")
RECORDS_SCHEMA = struct("spool STRING, segment STRING, offset LONG, time TIMESTAMP, command STRING, id STRING, "
                        "queue STRING, ttr LONG, ttl LONG, priority INT, max_attempts INT, max_fails INT, "
                        "data BINARY, scheduled TIMESTAMP, created TIMESTAMP, result BINARY, corrupt BOOLEAN, "
                        "error STRING")


@dataclass
class CmdlogPartition(InputPartition):
    spool: str
    segments: list
    newest: str | None
    now_ns: int


class CmdlogReader(DataSourceReader):
    def __init__(self, options: dict, schema) -> None:
        self.paths = option_paths(options)
        self.queues = option_queues(options)
        self.mode = mode_option(options, CmdlogSource.NAME)
        self.now_ms = now_option(options)
        self.schema = schema
        if self.queues is not None and self.mode == "records":
            raise ValueError("lanner-cmdlog: option queues works in items mode only (most records "
                             "name a job id, not a queue); filter records on their columns instead")

    def partitions(self):
        now_ms = self.now_ms if self.now_ms is not None else time.time_ns() // 1_000_000
        now_ns = now_ms * 1_000_000
        parts = []
        for sd in CR.find_segment_dirs(self.paths):
            newest = sd.segments[-1].name if sd.segments else None
            if self.mode == "items":
                parts.append(CmdlogPartition(sd.spool, sd.segments, newest, now_ns))
            else:
                parts.extend(CmdlogPartition(sd.spool, [r], newest, now_ns) for r in sd.segments)
        return parts

    def read(self, partition):
        if getattr(partition, "segments", None) is None:
            return iter(())
        if self.mode == "items":
            return self._items(partition)
        return self._records(partition)

    def _items(self, p: CmdlogPartition):
        cols = Columns(self.schema)
        rp, error = CR.replay_dir(CR.SegmentDir(p.spool, p.segments), p.now_ns)
        wanted = self.queues
        us = CR.ns_to_us
        for q, pos, state, job in CR.live_jobs(rp):
            if wanted is not None and q not in wanted:
                continue
            cmd = job.cmd
            for col, v in zip(cols.cols, (q, CR.job_uuid(cmd.id), cmd.payload, cmd.priority,
                                          us(cmd.created_ns), us(job.expire_ns), state, pos, p.spool,
                                          False, None)):
                col.append(v)
            cols.nbytes += len(cmd.payload)
            if cols.full():
                yield cols.batch()
        if error is not None:
            for col, v in zip(cols.cols, (None,) * 8 + (p.spool, True, error)):
                col.append(v)
        yield from cols.rest()

    def _records(self, p: CmdlogPartition):
        cols = Columns(self.schema)
        ref = p.segments[0]
        us = CR.ns_to_us
        names = S.COMMAND_NAMES
        for off, t_ns, cmd, error in CR.iter_segment_records(p.spool, ref, ref.name == p.newest):
            if error is not None:
                row = (p.spool, ref.name, off) + (None,) * 13 + (True, error)
            else:
                if isinstance(cmd, S.JobCommand):
                    q = name_str(cmd.name)
                    sched = None if cmd.time_ns == S.ZERO_TIME_NS else us(cmd.time_ns)
                    row = (p.spool, ref.name, off, us(t_ns), names.get(cmd.type), CR.job_uuid(cmd.id), q,
                           cmd.ttr, cmd.ttl, cmd.priority, cmd.max_attempts, cmd.max_fails, cmd.payload,
                           sched, us(cmd.created_ns), None, False, None)
                    cols.nbytes += len(cmd.payload)
                else:
                    result = cmd.result if isinstance(cmd, S.ResultCommand) else None
                    row = (p.spool, ref.name, off, us(t_ns), names.get(cmd.type), CR.job_uuid(cmd.id), None,
                           None, None, None, None, None, None, None, None, result, False, None)
            for col, v in zip(cols.cols, row):
                col.append(v)
            if cols.full():
                yield cols.batch()
        yield from cols.rest()


class CmdlogSource(BatchSource):
    NAME = "lanner-cmdlog"
    SCHEMAS = {"items": ITEMS_SCHEMA, "records": RECORDS_SCHEMA}
    READER = CmdlogReader
