"""Kestrel journal costs: appending, replaying and packing (engine/journal.py, engine/packer.py).

Goals from the journal brief: replay >= 200 MB/s, append >= 500 k records/s
when flushed per batch of 100.  Appends are bound by the OS page-cache write
(about 1 KiB per record); `test_write_baseline` measures a bare os.write of
the same bytes at the same moment, so a slow VM shows up as a slow baseline
rather than a slow journal.

    python -m pytest perf/bench_journal.py -o addopts="" --benchmark-only -p no:cacheprovider
    python -m pytest perf/bench_journal.py --benchmark-only -p no:cacheprovider   # if addopts allow it

Each test stores its rate in the benchmark's extra_info (records/s or MB/s)
and prints it.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import replace

import pytest

from lanner.config import UNBOUNDED_JOURNAL as UNBOUNDED
from lanner.perf.benchkit import bench_write_baseline, report_rate, workdir  # noqa: F401  (workdir: a fixture)
from lanner.clock import FakeClock
from lanner.queues.item import QItem
from lanner.storage.journal.codec import encode_add, encode_remove
from lanner.storage.journal.journal import Journal
from lanner.storage.journal.packer import pack_files

RECORD = 1024                  # item bytes per record
APPENDS = 50_000               # records per append round
REPLAY_MB = 64


def _fresh_journal(workdir: str, name: str) -> Journal:
    Journal.erase_all(workdir, name)
    j = Journal(workdir, name, FakeClock())
    j.replay(UNBOUNDED)
    return j


def _append(workdir: str, batch: int, size: int = RECORD) -> None:
    j = _fresh_journal(workdir, "append")
    item = QItem(1_700_000_000_000, 0, b"x" * size)
    add, flush = j.record_add, j.flush
    for i in range(APPENDS):
        add(item)
        if i % batch == batch - 1:
            flush()
    j.close()


@pytest.mark.parametrize("batch", [1, 100])
def test_append_1k(benchmark, workdir, batch):
    """1 KiB ADDX records, flushed (one os.write) per op or per 100."""
    benchmark.pedantic(_append, args=(workdir, batch), rounds=5, iterations=1, warmup_rounds=1)
    report_rate(benchmark, "records_per_s", APPENDS, "records/s")


def test_append_buffer_only(benchmark, workdir):
    """The Python side of an append (record_add into the buffer), without any write."""
    j = _fresh_journal(workdir, "buffer")
    item = QItem(1_700_000_000_000, 0, b"x" * RECORD)

    def run():
        add = j.record_add
        for _ in range(APPENDS):
            add(item)
            if len(j._pending) > 1 << 20:
                del j._pending[:]
        del j._pending[:]
    benchmark.pedantic(run, rounds=5, iterations=1, warmup_rounds=1)
    report_rate(benchmark, "records_per_s", APPENDS, "records/s")
    j.close()


def test_write_baseline(benchmark, workdir):
    """Bare os.write of the same bytes in 100-record writes: the machine's ceiling."""
    bench_write_baseline(benchmark, os.path.join(workdir, "raw"), b"y" * ((RECORD + 21) * 100), APPENDS // 100,
                         "records/s", APPENDS)


def _make_journal(workdir: str, name: str, pattern: str) -> int:
    """REPLAY_MB of 1 KiB items: "pairs" (add, remove: a busy queue that stays short)
    or "adds" (a queue that only grows: everything is held at the end)."""
    rec = encode_add(QItem(1_700_000_000_000, 0, b"z" * RECORD))
    block = (rec + encode_remove()) * 1024 if pattern == "pairs" else rec * 1024
    path = os.path.join(workdir, name)
    with open(path, "wb") as f:
        for _ in range(REPLAY_MB * (1 << 20) // len(block) + 1):
            f.write(block)
    return os.path.getsize(path)


@pytest.mark.parametrize("pattern", ["pairs", "adds"])
def test_replay(benchmark, workdir, pattern):
    size = _make_journal(workdir, "q", pattern)

    def run():
        j = Journal(workdir, "q", FakeClock())
        st = j.replay(UNBOUNDED)
        j.close()
        return st
    st = benchmark.pedantic(run, rounds=3, iterations=1, warmup_rounds=1)
    assert st.total_items == (0 if pattern == "pairs" else size // (RECORD + 21))
    report_rate(benchmark, "MB_per_s", size / 1e6, "MB/s")


def test_replay_into_read_behind(benchmark, workdir):
    """The same growing queue with max_memory_size 8 MiB: the rest is only counted."""
    size = _make_journal(workdir, "q", "adds")

    def run():
        j = Journal(workdir, "q", FakeClock())
        st = j.replay(replace(UNBOUNDED, max_memory_size=8 << 20))
        j.close()
        return st
    st = benchmark.pedantic(run, rounds=3, iterations=1, warmup_rounds=1)
    assert st.read_behind and len(st.items) == 8 * 1024
    report_rate(benchmark, "MB_per_s", size / 1e6, "MB/s")


@pytest.mark.parametrize("pattern", ["pairs", "adds"])
def test_pack(benchmark, workdir, pattern):
    size = _make_journal(workdir, "q.1", pattern)
    out = os.path.join(workdir, "q.1.out")
    benchmark.pedantic(pack_files, args=([os.path.join(workdir, "q.1")], out), kwargs={"now_ms": 1},
                       rounds=3, iterations=1, warmup_rounds=1)
    report_rate(benchmark, "MB_per_s", size / 1e6, "MB/s")
