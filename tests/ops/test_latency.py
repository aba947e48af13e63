"""Where an observation lands (ops/latency.py): the bucket of the first bound not below it, as
bisect_left(BOUNDS, seconds); the compiled build reads a C copy of BOUNDS (latency.pxd), which
must place every value as the tuple does."""
from __future__ import annotations

import bisect
from array import array

import pytest

from lanner.ops import latency as lat

STRIDE = len(lat.BOUNDS) + 2         # the buckets, +Inf, then the sum


class Row:
    """What a Recorder needs of a CounterBlock slot: its row of int64 words."""

    def __init__(self, n: int) -> None:
        self.words = memoryview(array("q", [0] * n))


EDGES = sorted({0.0, 5e-5, 20.0} | {b for b in lat.BOUNDS} | {b * 1.0001 for b in lat.BOUNDS}
               | {b * 0.9999 for b in lat.BOUNDS})


@pytest.mark.parametrize("seconds", EDGES)
def test_an_observation_lands_in_the_bucket_bisect_gives(seconds):
    row = Row(2 + len(lat.FAMILIES) * STRIDE)
    rec = lat.Recorder(row, 2)
    fam = lat.FAMILIES.index("set")
    rec.observe(fam, seconds)
    col = 2 + fam * STRIDE
    want = bisect.bisect_left(lat.BOUNDS, seconds)
    assert [i for i in range(STRIDE - 1) if row.words[col + i]] == [want]
    assert row.words[col + STRIDE - 1] == int(seconds * 1e6)
    assert sum(row.words) == 1 + int(seconds * 1e6)      # nothing else written
