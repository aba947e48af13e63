"""A worker's part of a whole-server `stats` (an admin scrape, the memcache `stats` command),
produced a slice of queues per loop turn.

Why: the figures of 5,000 queues (16 each) take a worker 60 to 120 ms to format and pack, and
done in one go that held every client of the worker for as long (issue 10, "a scrape must not
stall request handling").  So beyond SLICE queues the answer is built over several turns of
the loop, SLICE queues each, with the loop's I/O in between, and sent once whole: the same
msgpack document `PeerOps.stats_payload` makes (the slices are packed item by item into the
array the whole would have held).  A queue deleted between slices is left out; the global
figures are taken with the last slice.  A job for a front that goes down is dropped
(`cancel`): its replacement numbers its connections afresh and must not get the reply.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import msgpack

from lanner.ipc.messages import R_DATA

#: Queues per loop turn (about 15 µs each: a few ms per turn).
SLICE = 256


@dataclass(eq=False)
class StatsJob:
    src: int                  # the asking front slot, its connection and request
    conn: int
    req: int
    names: list[str]          # what to report, fixed at the start
    pos: int = 0
    packed: list[bytes] = field(default_factory=list)   # one msgpack (name, stats) per queue
    cancelled: bool = False


def answer(worker, src: int, conn: int, req: int) -> None:
    """Reply to a whole-server OP_STATS from front slot `src`: at once for a few queues,
    else in slices from the next turn on."""
    names = worker.stats_names(None)
    if len(names) <= SLICE:
        worker.reply(src, conn, req, R_DATA, 0, 0, worker.stats_payload(None))
        return
    job = StatsJob(src, conn, req, names)
    worker.stats_jobs.add(job)
    worker.loop.call_soon(_step, worker, job)


def cancel(worker, src: int) -> None:
    """Front slot `src` went down: drop its jobs."""
    for job in [j for j in worker.stats_jobs if j.src == src]:
        job.cancelled = True
        worker.stats_jobs.discard(job)


def _step(worker, job: StatsJob) -> None:
    if job.cancelled or worker.stopping:
        worker.stats_jobs.discard(job)
        return
    end = min(job.pos + SLICE, len(job.names))
    pack = msgpack.Packer().pack
    for name in job.names[job.pos:end]:
        st = worker.stats_of(name)
        if st is not None:
            job.packed.append(pack((name, st)))
    job.pos = end
    if end < len(job.names):
        worker.loop.call_soon(_step, worker, job)
        return
    worker.stats_jobs.discard(job)
    p = msgpack.Packer()
    head = (p.pack_map_header(2) + p.pack("global") + p.pack(worker.global_figures())
            + p.pack("queues") + p.pack_array_header(len(job.packed)))
    worker.reply(job.src, job.conn, job.req, R_DATA, 0, 0, head + b"".join(job.packed))
    worker.schedule_turn()          # the reply leaves with this turn's batch
