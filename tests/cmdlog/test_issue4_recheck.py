"""Issue 4 rechecked: `lanner cmdlog check|dump` show their progress on a terminal (a byte
counter on stderr), and never when stderr is a file or a pipe, where stdout stays exactly the
records."""
from __future__ import annotations

import subprocess
import sys

import pytest

from lanner.clock import FakeClock
from lanner.queues.item import QItem
from lanner.storage.cmdlog.partition import PartitionLog
from tests.terminal import run_on_a_terminal


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    """A Lanner-written log of a few segments: 2,000 adds of 1 KiB."""
    clock = FakeClock(1_800_000_000_123)
    plog = PartitionLog(str(tmp_path_factory.mktemp("cmdlog") / "p"), clock, segment_size=1 << 20)
    st = plog.storage_for("q")
    for _ in range(2000):
        st.record_add(QItem(clock.now_ms(), 0, b"x" * 1024))
    plog.close()
    return plog.dir


@pytest.mark.parametrize("args", [["dump"], ["dump", "--json"], ["check"]])
def test_progress_on_a_terminal_only(logdir, args):
    code, out, term = run_on_a_terminal(["cmdlog", *args, logdir])
    assert code == 0
    assert b"%|" in term and b"B/s" in term, term[:300]
    r = subprocess.run([sys.executable, "-m", "lanner.cli", "cmdlog", *args, logdir],
                       capture_output=True, timeout=60)
    assert r.returncode == 0 and r.stderr == b""
    assert r.stdout == out
    if args[0] == "dump":
        assert len(out.splitlines()) == 2000
