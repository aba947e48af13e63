"""What the pytest-benchmark files (bench_*.py) share: a scratch folder and one way of turning a
benchmark's best round into the rate it stores and prints, so that every bench reports alike."""
from __future__ import annotations

import os
import shutil
import tempfile

import pytest


@pytest.fixture
def workdir():
    """A scratch folder removed after each benchmark: the journals and logs are tens of MB, too
    large to leave behind in pytest's kept tmp_path folders."""
    d = tempfile.mkdtemp(prefix="lanner-bench-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def report_rate(benchmark, key: str, amount: float, unit: str) -> float:
    """`amount` per second of the best round: stored in extra_info[key] and printed."""
    stats = benchmark.stats
    best = stats.stats.min if stats is not None else None
    if not best:        # --benchmark-disable: the body ran once as a plain test, nothing timed
        return 0.0
    rate = amount / best
    benchmark.extra_info[key] = round(rate, 1)
    print(f"\n{benchmark.name}: {rate:,.0f} {unit} (best of {benchmark.stats.stats.rounds})")
    return rate


def bench_write_baseline(benchmark, path: str, batch: bytes, writes: int, unit: str, records: int) -> float:
    """Time `writes` bare os.write calls of `batch` into a fresh `path`: the machine's ceiling for
    an append-only log, measured at the same moment as the log itself so a slow VM shows as a
    slow baseline rather than a slow log.  Returns records/s."""
    def run():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        for _ in range(writes):
            os.write(fd, batch)
        os.close(fd)

    benchmark.pedantic(run, rounds=5, iterations=1, warmup_rounds=1)
    return report_rate(benchmark, "records_per_s", records, unit)
