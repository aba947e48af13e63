"""Which worker owns a queue.

A queue is placed by a stable hash of its fanout parent's name (the part
before the first '+') into one of PARTITIONS fixed partitions, and partitions
are dealt to workers round-robin.  A parent and its children therefore share a
worker, and changing the worker count between restarts only moves whole
partitions: journals are per queue and command logs are per partition, so no
record is lost or reordered.
"""
from __future__ import annotations

import zlib

PARTITIONS = 64


def parent_name(queue: str | bytes) -> bytes:
    name = queue.encode("latin-1") if isinstance(queue, str) else queue
    plus = name.find(b"+")
    return name if plus < 0 else name[:plus]


def partition_of(queue: str | bytes) -> int:
    return zlib.crc32(parent_name(queue)) % PARTITIONS


def worker_of_partition(partition: int, workers: int) -> int:
    return partition % workers


def worker_of(queue: str | bytes, workers: int) -> int:
    return partition_of(queue) % workers


def partitions_of_worker(worker: int, workers: int) -> list[int]:
    return [p for p in range(PARTITIONS) if p % workers == worker]
