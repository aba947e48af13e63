"""The real workq-server segments in ../shared/fixtures/workq (next to the checkout): exact decode,
replay to the states the fixture README lists (clock injected before and after
the cut-offs), the tool's JSON against expected/*.json, appending after them."""
from __future__ import annotations

import base64
import io
import json
import os
import shutil

import pytest

from lanner.storage.cmdlog import segment as sg
from lanner.clock import FakeClock
from lanner.storage.cmdlog.partition import PartitionLog
from lanner.storage.cmdlog.replay import COMPLETED, DELETED, FAILED, NEW, PENDING, Replayer, replay_directory
from lanner.tools.cmdlog import _parse_now, cmdlog_main

from . import indep

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.normpath(os.path.join(REPO, "..", "shared", "fixtures", "workq"))
A = os.path.join(FIXTURES, "a-all-commands")
B = os.path.join(FIXTURES, "b-rotation")

pytestmark = pytest.mark.skipif(
    not os.path.isdir(FIXTURES),
    reason=f"workq fixtures not found at {FIXTURES}: they live in ../shared/fixtures/workq beside the checkout")


def jid(n: int) -> bytes:
    return bytes.fromhex(f"00000000000040008000{n:012x}")


def ns(text: str) -> int:
    return _parse_now(text)


def replay(directory: str, now: str | int) -> Replayer:
    r = Replayer(now if isinstance(now, int) else ns(now), keep_finished=True)
    replay_directory(directory, r)
    return r


def expected(name: str) -> dict:
    with open(os.path.join(FIXTURES, "expected", name + ".json")) as f:
        return json.load(f)


# ------------------------------------------------------------------ decode

@pytest.mark.parametrize("fixture", ["a-all-commands", "b-rotation"])
def test_decode_matches_expected_offsets_and_commands(fixture):
    exp = expected(fixture)
    got = []
    for _seq, name in sg.list_segments(os.path.join(FIXTURES, fixture)):
        for off, t_ns, cmd in sg.iter_segment(os.path.join(FIXTURES, fixture, name)):
            got.append((name, off, t_ns, cmd))
    assert [(g[0], g[1]) for g in got] == [(r["segment"], r["offset"]) for r in exp["records"]]
    for (_n, _o, t_ns, cmd), rec in zip(got, exp["records"]):
        assert t_ns == rec["time_unix_sec"] * 10**9 + rec["time_nsec"]
        assert sg.encode_command(cmd).hex() == rec["payload_hex"]
        assert sg.COMMAND_NAMES[cmd.type] == rec["command"]["cmd"]
    assert exp["segments_in_order"] == [n for _s, n in sg.list_segments(os.path.join(FIXTURES, fixture))]
    for seg in exp["segments"]:
        data = open(os.path.join(FIXTURES, fixture, seg["name"]), "rb").read()
        assert len(data) == seg["size"] and data[:8].hex() == seg["header_hex"]
        assert len(indep.read_segment(data)) == seg["records"]
        assert indep.write_segment(indep.read_segment(data)) == data


@pytest.mark.parametrize("fixture", ["a-all-commands", "b-rotation"])
def test_dump_json_matches_expected_field_for_field(fixture):
    out, err = io.StringIO(), io.StringIO()
    assert cmdlog_main(["dump", os.path.join(FIXTURES, fixture), "--json"], out, err) == 0
    lines = out.getvalue().splitlines()
    exp = expected(fixture)["records"]
    assert len(lines) == len(exp) == expected(fixture)["record_count"]
    for line, rec in zip(lines, exp):
        got = json.loads(line)
        cmd = got["command"]
        for blob in ("payload", "result"):
            if blob in cmd:
                assert base64.b64decode(cmd[blob].pop("base64")).hex() == cmd[blob]["hex"]
        assert got == rec


@pytest.mark.parametrize("fixture", ["a-all-commands", "b-rotation"])
def test_check_accepts_fixtures(fixture):
    out, err = io.StringIO(), io.StringIO()
    assert cmdlog_main(["check", os.path.join(FIXTURES, fixture), "--now", "2026-11-22T00:00:00Z"], out, err) == 0
    assert out.getvalue().startswith("ok: ") and err.getvalue() == ""
    assert cmdlog_main(["check", os.path.join(FIXTURES, fixture), "--now", "2032-01-01T00:00:00Z"], out, err) == 0


# ------------------------------------------------------------------ replay: a-all-commands

def test_a_replay_before_cutoff_gives_the_readme_states():
    r = replay(A, "2026-11-21T13:10:32Z")
    fin = r.finished
    a1, a2 = fin[jid(0xA1)], fin[jid(0xA2)]
    assert (a1.state, a1.attempts, a1.result) == (COMPLETED, 1, b"done")
    assert (a2.state, a2.attempts, a2.result) == (FAILED, 1, b"boom")
    assert fin[jid(0xA3)].state == DELETED and jid(0xA3) not in r.jobs
    b1 = r.jobs[jid(0xB1)]
    assert (b1.state, b1.scheduled, b1.cmd.priority, b1.cmd.max_attempts, b1.cmd.max_fails) == (
        NEW, True, 2147483647, 255, 255)
    assert b1.cmd.time_ns == ns("2030-01-01T00:00:00Z")
    b2 = fin[jid(0xB2)]
    assert (b2.state, b2.attempts, b2.result) == (COMPLETED, 0, b"early")
    b3 = r.jobs[jid(0xB3)]
    assert (b3.state, b3.scheduled, b3.cmd.priority, b3.cmd.time_ns) == (
        NEW, True, -2147483648, ns("2031-01-01T00:00:00Z"))
    assert jid(0xC1) not in r.jobs and jid(0xC1) not in fin          # skipped: created + 1.5 s passed
    d1 = fin[jid(0xD1)]
    assert (d1.state, d1.attempts, d1.result) == (FAILED, 1, b"")    # max-attempts 1 at timeout
    d2 = r.jobs[jid(0xD2)]
    assert (d2.state, d2.attempts, d2.scheduled) == (PENDING, 1, False)
    assert jid(0xE1) not in r.jobs and jid(0xE1) not in fin          # run job: expire was a no-op
    assert set(r.jobs) == {jid(0xB1), jid(0xB3), jid(0xD2)}
    q = r.queue_jobs()
    assert {n: tuple(len(x) for x in lists) for n, lists in q.items()} == {
        b"report": (0, 0, 2), b"slow2": (1, 0, 0)}
    assert [j.cmd.id for j in q[b"report"][2]] == [jid(0xB1), jid(0xB3)]
    assert set(r.applied) == {b"ping", b"email.send", b"report", b"slow", b"slow2"}


def test_a_expiry_boundaries_are_strict():
    a1_exp = ns("2026-11-21T13:10:14Z") + 487466019 + 2592000000 * 10**6
    assert jid(0xA1) in replay(A, a1_exp).finished
    assert jid(0xA1) not in replay(A, a1_exp + 1).finished


def test_a_replay_after_the_30_day_cutoffs():
    r = replay(A, "2026-12-22T00:00:00Z")
    assert set(r.jobs) == {jid(0xB1), jid(0xB3)}
    assert set(r.finished) == {jid(0xB2)}             # a1, a2, a3, d1, d2 (30 days) and c1 skipped
    assert r.skipped == 6
    # b1's time has passed: it is ready, the highest priority first
    r = replay(A, "2030-01-15T00:00:00Z")
    ready, leased, sched = r.queue_jobs()[b"report"]
    assert [j.cmd.id for j in ready] == [jid(0xB1)] and [j.cmd.id for j in sched] == [jid(0xB3)]
    r = replay(A, "2030-02-01T00:00:00Z")
    assert set(r.jobs) == {jid(0xB3)} and jid(0xB2) in r.finished
    r = replay(A, "2030-07-02T00:00:00Z")
    assert set(r.jobs) == {jid(0xB3)} and not r.finished.get(jid(0xB2))
    r = replay(A, "2031-02-01T00:00:00Z")
    assert not r.jobs and not r.finished


def test_a_as_a_partition_log(tmp_path):
    d = str(tmp_path / "p")
    shutil.copytree(A, d)
    for f in os.listdir(d):
        os.chmod(os.path.join(d, f), 0o644)
    os.chmod(d, 0o755)
    before = open(os.path.join(d, "000000001.log"), "rb").read()
    clock = FakeClock(ns("2026-11-21T13:10:32Z") // 10**6)
    plog = PartitionLog(d, clock)
    assert plog.queue_names() == ["email.send", "ping", "report", "slow", "slow2"]
    assert open(os.path.join(d, "000000001.log"), "rb").read() == before       # replay appends nothing
    st = plog.storage_for("slow2").replay(None)
    assert [(i.data, i.job_id, i.xid) for i in st.items] == [(b"u", jid(0xD2), 0)]
    assert st.open_transactions == {} and st.total_items == 1 and st.replayed_adds == 1
    assert plog.storage_for("ping").replay(None).items == type(st.items)()
    assert plog.next_due() == ns("2030-01-01T00:00:00Z") // 10**6
    assert plog.due_items(ns("2029-12-31T23:59:59.999Z") // 10**6) == []
    due = plog.due_items(ns("2030-06-01T00:00:00Z") // 10**6)
    assert [(q, i.data, i.priority) for q, i in due] == [("report", b"future", 2147483647)]
    assert plog.next_due() == ns("2031-01-01T00:00:00Z") // 10**6
    plog.close()


# ------------------------------------------------------------------ replay: b-rotation

def test_b_replay_states():
    r = replay(B, "2026-11-21T13:13:40Z")
    a = r.finished[jid(0x101)]
    assert (a.state, a.attempts, a.result) == (COMPLETED, 1, b"ok")
    assert r.finished[jid(0x102)].state == DELETED
    ready, leased, sched = r.queue_jobs()[b"rot"]
    assert [j.cmd.id for j in ready] == [jid(0x103), jid(0x104)]      # 103 leased first
    assert all(j.state == NEW for j in ready) and leased == []
    assert [j.cmd.id for j in sched] == [jid(0x105)]
    r = replay(B, "2026-12-22T00:00:00Z")
    assert set(r.jobs) == {jid(0x105)}
    assert not replay(B, "2030-02-01T00:00:00Z").jobs


def test_b_appends_continue_in_the_newest_segment(tmp_path):
    d = str(tmp_path / "p")
    shutil.copytree(B, d)
    os.chmod(d, 0o755)
    for f in os.listdir(d):
        os.chmod(os.path.join(d, f), 0o644)
    clock = FakeClock(ns("2026-11-21T13:13:42Z") // 10**6)
    plog = PartitionLog(d, clock, segment_size=200)
    st = plog.storage_for("after").replay(None)
    assert st.total_items == 0
    from lanner.queues.item import QItem
    plog.storage_for("after").record_add(QItem(clock.now_ms(), clock.now_ms() + 60000, b"z"))
    plog.close()
    assert os.path.getsize(os.path.join(d, "000000003.log")) > 93
    assert not os.path.exists(os.path.join(d, "000000004.log"))
    recs = indep.read_segment(open(os.path.join(d, "000000003.log"), "rb").read())
    assert [r["command"]["type"] for r in recs] == [2, 1]
    plog = PartitionLog(d, clock, segment_size=200)
    assert [i.data for i in plog.storage_for("after").replay(None).items] == [b"z"]
    assert [i.data for i in plog.storage_for("rot").replay(None).items] == [b"p3", b"p4"]
    plog.close()


def test_b_records_rewritten_by_lanner_rotate_like_workq(tmp_path):
    """Same commands, limit 200: the same 263 / 207 / 93 byte segments."""
    cmds = [c for _s, n in sg.list_segments(B) for _o, _t, c in sg.iter_segment(os.path.join(B, n))]
    d = str(tmp_path / "p")
    plog = PartitionLog(d, FakeClock(), segment_size=200)
    for c in cmds:
        plog.append_command(c)
    plog.close()
    sizes = [os.path.getsize(os.path.join(d, n)) for _s, n in sg.list_segments(d)]
    assert sizes == [263, 207, 93]
    for _s, n in sg.list_segments(d):
        mine = [r["payload"] for r in indep.read_segment(open(os.path.join(d, n), "rb").read())]
        theirs = [r["payload"] for r in indep.read_segment(open(os.path.join(B, n), "rb").read())]
        assert mine == theirs
