"""workq command-log costs (engine/cmdlog.py, engine/rewrite.py): appending
through the storage seam, replaying a partition, and the cleaner's rewrite.

    python -m pytest perf/bench_cmdlog.py -o addopts="" --benchmark-only -p no:cacheprovider -s

* append: `CmdlogStorage.record_add` of 64 B / 1 KiB items, flushed per op
  (one write(2) each), per batch of 100, or never (encoding only), and with
  an fsync per batch of 100 / per op; `test_write_baseline` is a bare os.write
  of the same bytes per batch, so a slow VM shows as a slow baseline.
* queue cycle: add + open + confirm per item (three records), batch of 100.
* replay: open a partition of ~24 MB (half the jobs finished) -> MB/s and records/s.
* rewrite: one cleaner pass over ~24 MB of closed segments where 90 % of the
  jobs are finished -> MB/s of input.

Each test stores its rate in the benchmark's extra_info and prints it.
"""
from __future__ import annotations

import os
import shutil

import pytest

from lanner.perf.benchkit import bench_write_baseline, report_rate, workdir  # noqa: F401  (workdir: a fixture)
from lanner.clock import FakeClock
from lanner.storage.cmdlog.partition import PartitionLog
from lanner.queues.item import QItem
from lanner.storage.cmdlog.rewrite import rewrite_segments
from lanner.storage.cmdlog.segment import list_segments

APPENDS = 20_000
LOG_MB = 24


def _fresh(workdir: str, name: str = "p", **kw) -> PartitionLog:
    d = os.path.join(workdir, name)
    shutil.rmtree(d, ignore_errors=True)
    return PartitionLog(d, FakeClock(), **kw)


def _dir_bytes(d: str) -> int:
    return sum(os.path.getsize(os.path.join(d, n)) for _s, n in list_segments(d))


@pytest.mark.parametrize("size", [64, 1024])
@pytest.mark.parametrize("flush_every", [1, 100, 0], ids=["flush-per-op", "flush-per-100", "no-flush"])
def test_append(benchmark, workdir, size, flush_every):
    data = b"x" * size

    def run():
        plog = _fresh(workdir)
        st = plog.storage_for("bench")
        add, flush, clock = st.record_add, plog.flush, plog._clock
        for i in range(APPENDS):
            add(QItem(clock.now_ms(), 0, data))
            if flush_every and i % flush_every == flush_every - 1:
                flush()
        plog.close()

    benchmark.pedantic(run, rounds=5, iterations=1, warmup_rounds=1)
    report_rate(benchmark, "records_per_s", APPENDS, "records/s")


@pytest.mark.parametrize("per", [1, 100], ids=["fsync-per-op", "fsync-per-100"])
def test_append_durable(benchmark, workdir, per):
    n = 1_000 if per == 1 else APPENDS
    data = b"x" * 1024

    def run():
        plog = _fresh(workdir)
        st = plog.storage_for("bench")
        for i in range(n):
            st.record_add(QItem(0, 0, data))
            if i % per == per - 1:
                plog.sync()                        # flush + fsync, as the worker's group commit does
        plog.close()

    benchmark.pedantic(run, rounds=3, iterations=1, warmup_rounds=1)
    report_rate(benchmark, "records_per_s", n, "durable records/s")


def test_queue_cycle(benchmark, workdir):
    """add + open + confirm per item, flushed per 100 items: a consumer keeping up."""
    data = b"y" * 64

    def run():
        plog = _fresh(workdir)
        st = plog.storage_for("bench")
        for i in range(APPENDS):
            item = QItem(0, 0, data)
            st.record_add(item)
            st.record_open(item, 1)
            st.record_confirm(item, 1)
            if i % 100 == 99:
                plog.flush()
        plog.close()

    benchmark.pedantic(run, rounds=5, iterations=1, warmup_rounds=1)
    report_rate(benchmark, "items_per_s", APPENDS, "items/s (3 records each)")


def test_write_baseline(benchmark, workdir):
    plog = _fresh(workdir)
    st = plog.storage_for("bench")
    st.record_add(QItem(0, 0, b"x" * 1024))
    record = bytes(plog._buf)
    plog.close()
    bench_write_baseline(benchmark, os.path.join(workdir, "baseline"), record * 100, APPENDS // 100,
                         "records/s (os.write per 100 x 1 KiB records)", APPENDS)


def _build_log(d: str, size: int, finished_share: float, segment_size: int) -> int:
    """Write ~LOG_MB of adds of `size`-byte items over several queues, then
    finish `finished_share` of them (complete or delete); returns records."""
    plog = PartitionLog(d, FakeClock(), segment_size=segment_size)
    storages = [plog.storage_for(f"q{i}") for i in range(8)]
    data = b"z" * size
    per_item = size + 110
    count = LOG_MB * 2**20 // per_item
    items = []
    for i in range(count):
        item = QItem(0, 0, data)
        storages[i % 8].record_add(item)
        items.append(item)
        if i % 1000 == 999:
            plog.flush()
    records = count
    finish = int(count * finished_share)
    for i, item in enumerate(items[:finish]):
        st = storages[i % 8]
        if i % 2:
            st.record_remove(item)
            records += 1
        else:
            st.record_open(item, 1)
            st.record_confirm(item, 1)
            records += 2
    # one more add so the active segment is the last one
    storages[0].record_add(QItem(0, 0, data))
    plog.close()
    return records + 1


@pytest.mark.parametrize("size", [64, 1024])
def test_replay(benchmark, workdir, size):
    d = os.path.join(workdir, "replay")
    records = _build_log(d, size, 0.5, 64 * 2**20)
    nbytes = _dir_bytes(d)

    def run():
        plog = PartitionLog(d, FakeClock())
        plog.close()

    benchmark.pedantic(run, rounds=3, iterations=1, warmup_rounds=1)
    report_rate(benchmark, "MB_per_s", nbytes / 1e6, "MB/s")
    report_rate(benchmark, "records_per_s", records, f"records ({nbytes / 1e6:.1f} MB)")


@pytest.mark.parametrize("size", [64, 1024])
def test_rewrite(benchmark, workdir, size):
    src = os.path.join(workdir, "src")
    _build_log(src, size, 0.9, 4 * 2**20)
    nbytes = _dir_bytes(src)
    d = os.path.join(workdir, "clean")

    def setup():
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(src, d)
        return (d, FakeClock()), {}

    result = []
    benchmark.pedantic(lambda *a: result.append(rewrite_segments(*a)), setup=setup, rounds=3, iterations=1)
    report_rate(benchmark, "MB_per_s", nbytes / 1e6, "MB/s of log read")
    st = result[-1]
    print(f"  {nbytes / 1e6:.1f} MB in {st.segments} segments -> {_dir_bytes(d) / 1e6:.1f} MB: "
          f"{st.rewritten} rewritten, {st.deleted} deleted, {st.records_dropped:,} of "
          f"{st.records_scanned:,} records dropped, {st.live_jobs:,} live jobs")
