"""A queue's command-log jobs live in its own partition (queues/placement.py).  Jobs found in
another partition's directory (a workq log copied into the wrong one) are not served, and the
start-up log says so, naming the queue, the count and both partition directories."""
from __future__ import annotations

import logging

from lanner.clock import FakeClock
from lanner.config import Config, QueueConfig, ServerConfig
from lanner.queues.item import QItem
from lanner.queues.placement import PARTITIONS, partition_of
from lanner.storage.cmdlog.partition import PartitionLog, partition_dir
from lanner.storage.factory import StorageFactory


def write_jobs(queue_path: str, partition: int, queue: str, n: int, clock) -> None:
    plog = PartitionLog(partition_dir(queue_path, partition), clock)
    st = plog.storage_for(queue)
    for i in range(n):
        st.record_add(QItem(clock.now_ms(), 0, b"job %d" % i))
    plog.close()


def test_jobs_in_a_partition_not_their_queues_own_are_named_in_the_log(tmp_path, caplog):
    qp, clock = str(tmp_path / "queues"), FakeClock(1_800_000_000_000)
    stray, home_q = "email.send", "report"
    home, other = partition_of(stray), (partition_of(stray) + 1) % PARTITIONS
    write_jobs(qp, other, stray, 2, clock)                   # copied into the wrong partition
    write_jobs(qp, partition_of(home_q), home_q, 1, clock)   # where it belongs: no warning
    factory = StorageFactory(Config(server=ServerConfig(queue_path=qp),
                                    default=QueueConfig(storage="cmdlog")), clock)
    try:
        with caplog.at_level(logging.WARNING, logger="lanner.storage.factory"):
            names = factory.queue_names()
    finally:
        factory.close()
    assert stray in names and home_q in names
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning == (f"queue '{stray}': 2 live jobs in command-log partition {other} "
                       f"({partition_dir(qp, other)}) are not served: the queue's partition is "
                       f"{home} ({partition_dir(qp, home)})")
