"""What the pytest-benchmark files (bench_*.py) share: a scratch folder and one way of turning a
benchmark's best round into the rate it stores and prints, so that every bench reports alike."""
from __future__ import annotations

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
    best = benchmark.stats.stats.min
    rate = amount / best
    benchmark.extra_info[key] = round(rate, 1)
    print(f"\n{benchmark.name}: {rate:,.0f} {unit} (best of {benchmark.stats.stats.rounds})")
    return rate
