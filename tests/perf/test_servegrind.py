"""servegrind's parts that need no server under valgrind (that takes minutes to start on the
2-core box): its config relaxation, reading callgrind's dumps of a real process, the role of
every process of a real server, the per-request figures and the agreement check."""
from __future__ import annotations

import shutil
import subprocess
import time

import pytest

from lanner.config import load_config
from lanner.perf import servegrind
from lanner.perf.__main__ import main as perf_main
from lanner.perf.report import Report
from lanner.perf.servers import ProcTree
from lanner.queues.placement import worker_of

needs_valgrind = pytest.mark.skipif(not shutil.which("valgrind"), reason="valgrind is not installed")


def heartbeat_of(path: str):
    return load_config(path, {}).server.heartbeat_timeout


def test_relaxed_config_turns_the_heartbeat_check_off_unless_the_file_sets_it(tmp_path):
    assert heartbeat_of(servegrind.relaxed_config(None, str(tmp_path))) is None
    with_server = tmp_path / "server.toml"
    with_server.write_text('[server]\nworkers = 2\n\n[default]\nmax_items = 7\n')
    relaxed = servegrind.relaxed_config(str(with_server), str(tmp_path))
    assert heartbeat_of(relaxed) is None
    assert load_config(relaxed, {}).server.workers == 2 and load_config(relaxed, {}).default.max_items == 7
    queues_only = tmp_path / "queues.toml"
    queues_only.write_text('[default]\nmax_items = 7\n')
    assert heartbeat_of(servegrind.relaxed_config(str(queues_only), str(tmp_path))) is None
    own = tmp_path / "own.toml"
    own.write_text('[server]\nheartbeat_timeout = "90s"\n')
    assert heartbeat_of(servegrind.relaxed_config(str(own), str(tmp_path))) == 90_000


@needs_valgrind
def test_the_newest_dump_of_a_real_process_is_read(tmp_path):
    proc = subprocess.Popen(["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp_path}/cg.%p",
                             "sleep", "60"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not servegrind.callgrind_control("-d", proc.pid):      # until valgrind has started
            assert proc.poll() is None and time.monotonic() < deadline
        assert servegrind.callgrind_control("-z", proc.pid)
        assert servegrind.callgrind_control("-d", proc.pid)
        parts = sorted(tmp_path.glob(f"cg.{proc.pid}.*"), key=lambda p: int(p.suffix[1:]))
        assert len(parts) >= 2
        newest = parts[-1].read_text()
        totals = int(newest.split("\ntotals:")[1].split()[0])
        # `summary` is what ran since the zero; `totals` (the sum of the file's cost lines) may
        # also carry costs of calls that were under way at the zero
        assert 0 < servegrind.dumped(str(tmp_path), proc.pid) == servegrind.summary(str(parts[-1])) <= totals
    finally:
        proc.kill()
        proc.wait()


def test_every_process_of_a_real_server_has_its_role(lanner):
    roles, owner = servegrind.process_roles(ProcTree(lanner.pid), "db_bench")
    assert owner == f"lanner-w{worker_of('db_bench', 2)}"
    assert roles[lanner.pid] == "supervisor"
    assert sorted(roles.values()) == sorted(["supervisor", "queue worker", "other workers", "cleaner"])


def test_figures_per_request_by_role_and_the_agreement_check():
    roles = {1: "supervisor", 2: "queue worker", 3: "other workers", 4: "other workers"}
    row = servegrind.per_request({1: 1000, 2: 400_000, 3: 2000, 4: 3000}, roles, 10)
    assert row["total"] == 40_600 and row["queue worker"] == 40_000 and row["other workers"] == 500
    assert row["supervisor"] == 100 and row["admin"] is None
    report = Report("servegrind", {}, {})
    report.rows = [{"total": 1000, "queue worker": 900}, {"total": 1009, "queue worker": 911}]
    servegrind.check_agreement(report)
    assert report.checks["runs agree (total)"].ok and not report.checks["runs agree (queue worker)"].ok


def test_servegrind_is_a_perf_command(capsys):
    with pytest.raises(SystemExit) as done:
        perf_main(["servegrind", "--help"])
    assert done.value.code == 0 and "callgrind" in capsys.readouterr().out
