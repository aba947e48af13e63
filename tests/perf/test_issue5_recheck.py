"""Issue 5 rechecked from its text: what test_scenarios.py and test_cli.py do not show.

`lanner-perf` runs with nothing installed beyond the perf extra (perf/README's install line);
the `lanner-perf` console script on a terminal draws a progress bar; many-clients without
transactions delivers each item exactly once; fairness's darner variant floods the small
sets' own queue; memory and packing against a server whose backlog lives on disk
(`max_memory_size` far below it), with memory's RSS-versus-items plots; and the
pytest-benchmark files cover the hot paths the issue names.
"""
from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests import terminal
from tests.helpers import start_server

pytestmark = pytest.mark.integration

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
READ_BEHIND = """
[default]
max_memory_size = "4KiB"
"""


def run_on_terminal(argv: list[str], cwd) -> tuple[int, str]:
    """Run a command with a 100x24 pseudo-terminal as stdin, stdout and stderr, as from a
    user's shell; (exit status, everything it wrote)."""
    rc, _, seen = terminal.run_on_terminal(argv, cwd=str(cwd), columns=100, whole=True)
    return rc, seen.decode(errors="replace")


def test_lanner_perf_draws_a_progress_bar_on_a_terminal(lanner, tmp_path):
    perf = os.path.join(os.path.dirname(sys.executable), "lanner-perf")
    argv = [perf, "put-many", "-p", str(lanner.port), "-c", "2", "-n", "2000", "-b", "64", "-q", "bar"]
    rc, shown = run_on_terminal(argv + ["--out", str(tmp_path / "a")], tmp_path)
    assert rc == 0, shown
    assert "\rput:" in shown and "%|" in shown and "/2000 [" in shown, shown
    head = next(ln for ln in shown.splitlines() if ln.lstrip().startswith("ops "))      # the table's head
    assert head.index("client µs/op") < head.index("server µs/op"), head  # client CPU beside the server's
    rc, quiet = run_on_terminal(argv + ["--out", str(tmp_path / "b"), "--no-progress"], tmp_path)
    assert rc == 0 and "%|" not in quiet and "check put: clean: ok" in quiet


def test_many_clients_plain_reads_deliver_each_item_exactly_once(lanner, run_perf):
    rc, data, printed = run_perf("many-clients", "-p", str(lanner.port), "--server-pid", str(lanner.pid),
                                 "-n", "20", "-s", "0", "-c", "4", "-q", "mcplain")
    assert rc == 0 and data["ok"], printed
    assert data["settings"]["transactions"] is False
    [row] = data["rows"]
    assert (row["items"], row["redelivered"], row["lost"]) == (20, 0, 0)
    assert data["checks"]["exactly once"]["ok"] and data["checks"]["queue drained"]["ok"]
    assert "redelivered" in printed and "lost" in printed                  # the table


def test_fairness_same_queue_is_darners_variant(lanner, run_perf):
    rc, data, printed = run_perf("fairness", "-p", str(lanner.port), "--server-pid", str(lanner.pid),
                                 "-s", "200", "-c", "2", "--large-size", "65536", "--large-concurrency", "1",
                                 "--same-queue", "-q", "fairsame")
    assert rc == 0 and data["ok"], printed
    assert data["settings"]["small_queue"] == "fairsame"
    small, large = data["rows"]
    assert small["label"] == "64 B sets (same queue)" and small["ops"] == 200 and small["p99_us"] > 0
    assert large["label"] == "64 KiB flood" and large["ops"] > 0


@pytest.fixture(scope="module")
def behind(tmp_path_factory):
    """A server that keeps 4 KiB of each queue in memory and reads the rest from its journal."""
    h = start_server(tmp_path_factory.mktemp("behind"), config=READ_BEHIND)
    yield h
    h.stop()


def test_memory_with_the_backlog_on_disk_plots_rss_against_items(behind, run_perf, tmp_path):
    rc, data, printed = run_perf("memory", "-p", str(behind.memcache_port), "--server-pid", str(behind.proc.pid),
                                 "--steps", "0,300", "-i", "64", "-c", "2", "-q", "membehind",
                                 "--settle", "0.1", "--poll", "0.05", "--plot")
    assert rc == 0 and data["ok"], printed
    top = data["rows"][1]
    assert top["queue_items"] == 300 and top["mem_items"] < 300          # read behind from disk
    assert any("the rest read behind from disk" in n for n in data["notes"])
    assert data["checks"]["drain to 0: payloads"]["ok"]
    pngs = sorted(p.name for p in tmp_path.glob("out*/*/*.png"))
    assert pngs == ["memory-drain.png", "memory-grow.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in tmp_path.glob("out*/*/*.png"))
    assert "RSS MB" in printed and "PSS MB" in printed
    head = next(ln for ln in printed.splitlines() if ln.lstrip().startswith("items "))
    assert head.index("client µs/op") < head.index("server µs/op"), head  # the load's CPU, as everywhere
    assert top["client_us_op"] > 0 and top["server_us_op"] is not None


def test_packing_a_backlog_larger_than_max_memory_size(behind, run_perf):
    rc, data, printed = run_perf("packing", "-p", str(behind.memcache_port), "--server-pid", str(behind.proc.pid),
                                 "-n", "100", "-c", "2", "-t", "0", "--backlog", "300", "-b", "64", "-q", "pkbehind")
    assert rc == 0 and data["ok"], printed
    assert data["settings"]["backlog"] * 64 > 4096
    assert [r["label"] for r in data["rows"]] == ["empty", "backlog", "cycle 1", "cycle 2", "drain"]
    assert all(data["checks"][f"{c}: payloads"]["ok"] for c in ("empty", "cycle 1", "cycle 2", "drain"))
    assert "vs empty" in printed


def test_microbenchmarks_cover_the_hot_paths_the_issue_names():
    files = [os.path.join("perf", f"bench_{n}.py") for n in ("protocols", "ring", "journal", "cmdlog")]
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-o", "addopts=",
                           "-p", "no:cacheprovider", *files], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ids = [ln.split("[")[0] for ln in done.stdout.splitlines() if "::" in ln]
    for wanted in ("bench_protocols.py::test_memcache_set_64",           # memcache request parsing
                   "bench_ring.py::test_ring_fork_pingpong_rtt",          # ring round trip
                   "bench_journal.py::test_append_1k",                    # journal append
                   "bench_cmdlog.py::test_append",                        # cmdlog append
                   "bench_journal.py::test_replay", "bench_cmdlog.py::test_replay"):   # replay
        assert os.path.join("perf", wanted) in ids, (wanted, ids)


# Imports refused in the child: a module found on sys.path but not installed by the extras given
BLOCKER = """
import sys
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (not in the perf extra)", name=name)
sys.meta_path.insert(0, Refuse())
from lanner.perf.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


def test_lanner_perf_needs_nothing_beyond_the_perf_extra(lanner, tmp_path):
    """perf/README: `pip install -e ".[perf]"` is what an operator installs.  Every module that
    only the test extra brings is refused in the child; the scenarios must still run."""
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    extras = project["optional-dependencies"]

    def names(reqs):
        return {canonicalize_name(Requirement(r).name) for r in reqs}
    only_test = names(extras["test"]) - names(project["dependencies"]) - names(extras["perf"])
    blocked = sorted(mod for mod, dists in importlib.metadata.packages_distributions().items()
                     if all(canonicalize_name(d) in only_test for d in dists))
    assert "pylibmc" in blocked                       # the blocker has something to refuse
    code = f"BLOCKED = {set(blocked)!r}\n" + BLOCKER
    for argv in (["leaky-reader", "--help"],
                 ["mixed", "-p", str(lanner.port), "-c", "1", "-s", "50", "-g", "50", "--prefill", "5", "-q", "extra",
                  "--plot", "--no-progress", "--out", str(tmp_path / "out")]):
        done = subprocess.run([sys.executable, "-c", code, *argv], cwd=str(tmp_path), capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, (argv[0], done.stdout[-2000:], done.stderr[-2000:])
    assert [p.name for p in sorted(tmp_path.glob("out/*/*.png"))] == ["latency.png", "throughput.png"]


def test_microbenchmarks_run_as_plain_tests_under_benchmark_disable():
    """`pytest --benchmark-disable perf/bench_*.py` runs each body once as a test (a quick check
    that they still work): nothing is timed then, and the rate report must not divide by it."""
    files = sorted(os.path.join("perf", f) for f in os.listdir(os.path.join(REPO, "perf"))
                   if f.startswith("bench_") and f.endswith(".py"))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-o", "addopts=", "-p", "no:cacheprovider",
                           "--benchmark-disable", *files], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
