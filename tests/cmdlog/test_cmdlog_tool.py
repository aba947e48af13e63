"""`lanner cmdlog check|dump`: exit codes, one-line errors naming file and
offset, text and JSON dumps of Lanner-written logs."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest

from lanner.storage.cmdlog import segment as sg
from lanner.clock import FakeClock
from lanner.storage.cmdlog.partition import PartitionLog
from lanner.tools.cmdlog import cmdlog_main, format_time
from lanner.queues.item import QItem

from . import indep


def run(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = cmdlog_main(list(argv), out, err)
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture
def logdir(tmp_path):
    clock = FakeClock(1_800_000_000_123)
    plog = PartitionLog(str(tmp_path / "p"), clock, segment_size=200)
    st = plog.storage_for("q")
    a = QItem(clock.now_ms(), 0, b"never\xff")
    b = QItem(clock.now_ms(), clock.now_ms() + 5000, b"five seconds")
    st.record_add(a)
    st.record_add(b)
    st.record_open(a, 1)
    st.record_confirm(a, 1)
    plog.close()
    return plog.dir


def test_check_ok_and_dump_of_a_lanner_log(logdir):
    rc, out, err = run("check", logdir, "--now", "2027-01-15T08:00:00Z")
    assert rc == 0 and err == "" and out.startswith(f"ok: {logdir}: 2 segments, 4 records")
    rc, out, err = run("dump", logdir)
    lines = out.splitlines()
    assert rc == 0 and len(lines) == 4
    assert lines[0].startswith("000000001.log@8 2027-01-15T08:00:00.123000000Z add ")
    assert "ttr=60000 ttl=2592000000" in lines[0] and "(lanner: no expiry)" in lines[0]
    assert "ttl=5000" in lines[1] and "payload=12:b'five seconds'" in lines[1]
    assert lines[2].split()[2] == "start-attempt" and lines[3].split()[2] == "complete"
    assert lines[3].endswith("result=0:b''")
    rc, out, _ = run("dump", logdir, "--json")
    recs = [json.loads(line) for line in out.splitlines()]
    assert [r["index"] for r in recs] == [1, 2, 3, 4]
    first = recs[0]
    assert first["segment"] == "000000001.log" and first["offset"] == 8
    assert first["time_rfc3339"] == "2027-01-15T08:00:00.123000000Z" and first["time_offset_min"] == -1
    cmd = first["command"]
    assert cmd["cmd"] == "add" and cmd["name"] == "q" and cmd["lanner_no_expiry"] is True
    assert cmd["payload"] == {"hex": "6e65766572ff", "text": "never\u00ff", "base64": "bmV2ZXL/"}
    assert cmd["time"].startswith("ZERO") and cmd["created"] == "2027-01-15T08:00:00.123000000Z"
    assert len(cmd["id"]) == 36 and cmd["id"][14] == "4"
    assert "lanner_no_expiry" not in recs[1]["command"]
    assert recs[3]["command"]["result"] == {"hex": "", "text": "", "base64": ""}
    assert recs[3]["segment"] == "000000002.log"


def test_problems_are_one_line_with_file_and_offset(logdir):
    seg = os.path.join(logdir, "000000001.log")
    data = bytearray(open(seg, "rb").read())
    offsets = [r["offset"] for r in indep.read_segment(bytes(data))]
    second, last = offsets[1], offsets[-1]
    data[second + 20] ^= 0x10
    open(seg, "wb").write(bytes(data))
    rc, out, err = run("check", logdir)
    assert rc == 1 and out == ""
    assert err == f"{seg}: offset {second}: " + err.split(": ", 2)[2] and err.count("\n") == 1
    assert "crc mismatch" in err
    rc, out, err = run("dump", logdir)                       # the first record, then the error
    assert rc == 1 and len(out.splitlines()) == 1 and f"{seg}: offset {second}: crc mismatch" in err
    data[second + 20] ^= 0x10
    open(seg, "wb").write(bytes(data[:-2]))                  # torn tail (serve would truncate it)
    rc, _, err = run("check", logdir)
    assert rc == 1 and err.startswith(f"{seg}: offset {last}: torn record")
    open(seg, "wb").write(b"wqwq\x00\x00\x00\x07" + bytes(data[8:]))
    rc, _, err = run("check", logdir)
    assert rc == 1 and err.startswith(f"{seg}: offset 0: invalid segment header")


def test_check_reports_a_duplicate_live_job(tmp_path):
    clock = FakeClock()
    plog = PartitionLog(str(tmp_path / "p"), clock)
    cmd = sg.JobCommand(sg.ADD, b"\x22" * 16, b"q", 1, 60000, 0, 0, 0, b"", sg.ZERO_TIME_NS, clock.now_ms() * 10**6)
    plog.append_command(cmd)
    plog.append_command(cmd)
    plog.close()
    seg = os.path.join(plog.dir, "000000001.log")
    second = indep.read_segment(open(seg, "rb").read())[1]["offset"]
    rc, _, err = run("check", plog.dir, "--now", "2023-11-14T22:13:20Z")
    assert rc == 1 and err.startswith(f"{seg}: offset {second}: duplicate job 22222222-2222-2222-2222-222222222222")
    rc, _, _ = run("check", plog.dir, "--now", "2030-01-01T00:00:00Z")     # both adds expired: fine
    assert rc == 0


def test_usage_errors(tmp_path):
    assert run("check", str(tmp_path / "missing"))[0] == 2
    assert run("frobnicate", str(tmp_path))[0] == 2
    for what in ("check", "dump"):                           # an empty directory is no log at all
        rc, out, err = run(what, str(tmp_path))
        assert (rc, out) == (1, "") and err == f"{tmp_path}: no command-log segments (NNNNNNNNN.log) here\n"
    assert run("check", str(tmp_path), "--now", "yesterday")[0] == 2


def test_a_queue_path_points_at_its_partitions(tmp_path, clock):
    for p in (3, 17):
        plog = PartitionLog(str(tmp_path / "cmdlog" / str(p)), clock)
        plog.close()
        plog = PartitionLog(str(tmp_path / "cmdlog" / str(p)), clock)
        plog.append_command(sg.IdCommand(sg.DELETE, bytes(16)))
        plog.close()
    for d in (tmp_path, tmp_path / "cmdlog"):
        rc, _, err = run("check", str(d))
        assert rc == 1 and err == (f"{d}: no command-log segments (NNNNNNNNN.log) here; the logs are one per "
                                   f"partition: {tmp_path / 'cmdlog' / '3'}, {tmp_path / 'cmdlog' / '17'}\n")


def test_format_time():
    assert format_time(sg.ZERO_TIME_NS).startswith("ZERO (0001-01-01T00:00:00Z")
    assert format_time(0) == "1970-01-01T00:00:00.000000000Z"
    assert format_time(-1) == "1969-12-31T23:59:59.999999999Z"
    assert format_time((sg.ZERO_TIME_NS + 10**9)) == "0001-01-01T00:00:01.000000000Z"


def test_lanner_cli_entry_point(logdir):
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.dirname(__file__)))}
    p = subprocess.run([sys.executable, "-m", "lanner.cli", "cmdlog", "check", logdir], capture_output=True,
                       text=True, env=env, timeout=60)
    assert p.returncode == 0 and p.stdout.startswith("ok: ")
