"""segment.py: golden vectors (spec §2.3), CRC vectors, Go times, varints,
decoder strictness and framing errors."""
from __future__ import annotations

import datetime as dt
import os

import pytest
from hypothesis import given, settings, strategies as st

from lanner.storage.cmdlog import segment as sg
from lanner.storage.cmdlog.segment import CmdlogError, IdCommand, JobCommand, ResultCommand

from . import indep

ID = bytes.fromhex("61a444a0612841c08078cc757d3bd2d8")


def unix_ns(y, mo, d, h=0, mi=0, s=0, ns=0) -> int:
    t = dt.datetime(y, mo, d, h, mi, s, tzinfo=dt.timezone.utc)
    return int(t.timestamp()) * 10**9 + ns


GOLDEN_ADD = bytes.fromhex(
    "01" "61a444a0612841c08078cc757d3bd2d8" "0470696e67" "e807" "e0d403" "14" "03" "01" "0161"
    "01000000000000000000000000ffff" "010000000ecfd1eba000000000ffff")
GOLDEN_SCHEDULE = bytes.fromhex(
    "02" "61a444a0612841c08078cc757d3bd2d8" "0470696e67" "e807" "e0d403" "14" "03" "01" "0161"
    "010000000ecff8ec0000000000ffff" "010000000ecfd1eba000000000ffff")


def golden_job(t, time_ns):
    return JobCommand(t, ID, b"ping", 1000, 60000, 10, 3, 1, b"a", time_ns, unix_ns(2016, 12, 1, 10))


def test_golden_add_and_schedule_vectors():
    add = golden_job(sg.ADD, sg.ZERO_TIME_NS)
    assert sg.encode_command(add) == GOLDEN_ADD
    assert sg.decode_command(GOLDEN_ADD) == add
    sched = golden_job(sg.SCHEDULE, unix_ns(2016, 12, 31))
    assert sg.encode_command(sched) == GOLDEN_SCHEDULE
    assert sg.decode_command(GOLDEN_SCHEDULE) == sched


@pytest.mark.parametrize("cmd,hexpayload", [
    (ResultCommand(sg.COMPLETE, ID, b"a"), "03" + ID.hex() + "0161"),
    (ResultCommand(sg.FAIL, ID, b"a"), "04" + ID.hex() + "0161"),
    (IdCommand(sg.DELETE, ID), "05" + ID.hex()),
    (IdCommand(sg.EXPIRE, ID), "06" + ID.hex()),
    (IdCommand(sg.START_ATTEMPT, ID), "07" + ID.hex()),
    (IdCommand(sg.TIMEOUT_ATTEMPT, ID), "08" + ID.hex()),
])
def test_golden_id_command_vectors(cmd, hexpayload):
    assert sg.encode_command(cmd).hex() == hexpayload
    assert sg.decode_command(bytes.fromhex(hexpayload)) == cmd


def test_crc_vectors():
    assert sg.crc32c(b"123456789") == 0xE3069283
    assert indep.crc32c(b"123456789") == 0xE3069283
    # captain fixture: TIME, SIZE 1, payload "1", CRC 0x7e0a1267
    rec = bytes.fromhex("010000000ed007cfd730c21cbfffff" "01" "31" "7e0a1267")
    assert [s for s in sg.record_spans(rec, "x", 0)] == [(0, 16, 17, 21)]
    assert sg.encode_record(sg.decode_time(rec, 0), b"1") == rec
    # workq's test vector: Unix 1482828625 s, SIZE 1, payload "a" -> 3508673586
    r = sg.encode_record(1482828625 * 10**9, b"a")
    assert int.from_bytes(r[-4:], "big") == 3508673586 == 0xD1221C32


def test_time_encoding():
    raw = bytes.fromhex("010000000ed007cfd730c21cbfffff")
    ns = sg.decode_time(raw, 0)
    assert ns == 1484118231 * 10**9 + 818027711
    assert sg.encode_time(ns) == raw
    assert sg.encode_time(sg.ZERO_TIME_NS) == sg.ZERO_TIME == bytes.fromhex("01" + "00" * 12 + "ffff")
    # any zone offset is accepted and ignored; the writer always puts FF FF
    other = raw[:13] + b"\x00\x3c"
    assert sg.decode_time(other, 0) == ns
    with pytest.raises(ValueError, match="unsupported version"):
        sg.decode_time(b"\x02" + raw[1:], 0)
    before_epoch = unix_ns(1969, 12, 31, 23, 59, 59, 5)
    assert sg.decode_time(sg.encode_time(before_epoch), 0) == before_epoch


@pytest.mark.parametrize("value,hexbytes", [
    (1, "01"), (1000, "e807"), (30000, "b0ea01"), (60000, "e0d403"), (1500, "dc0b"),
    (2592000000, "8090fbd309"), (255, "ff01"), (3, "03")])
def test_uvarint_encodings(value, hexbytes):
    assert sg.put_uvarint(value).hex() == hexbytes
    assert sg.read_uvarint(bytes.fromhex(hexbytes), 0, len(hexbytes) // 2) == (value, len(hexbytes) // 2)


@pytest.mark.parametrize("value,hexbytes", [
    (0, "00"), (10, "14"), (-5, "09"), (2147483647, "feffffff0f"), (-2147483648, "ffffffff0f")])
def test_priority_zigzag(value, hexbytes):
    assert sg.put_varint(value).hex() == hexbytes


def test_uvarint_errors():
    with pytest.raises(ValueError, match="EOF"):
        sg.read_uvarint(b"\x80", 0, 1)
    with pytest.raises(ValueError, match="overflow"):
        sg.read_uvarint(b"\xff" * 9 + b"\x02", 0, 10)
    with pytest.raises(ValueError, match="overflow"):
        sg.read_uvarint(b"\xff" * 11, 0, 11)
    assert sg.read_uvarint(b"\xff" * 9 + b"\x01", 0, 10) == ((1 << 64) - 1, 10)
    with pytest.raises(ValueError):
        sg.put_uvarint(-1)
    with pytest.raises(ValueError):
        sg.put_uvarint(1 << 64)


def test_decoder_strictness():
    with pytest.raises(ValueError, match="EOF"):
        sg.decode_command(b"")
    with pytest.raises(ValueError, match="trailing garbage"):
        sg.decode_command(b"\x05" + ID + b"\x00")
    with pytest.raises(ValueError, match="trailing garbage"):
        sg.decode_command(GOLDEN_ADD + b"\x00")
    with pytest.raises(ValueError, match="recognize"):
        sg.decode_command(b"\x09" + ID)
    with pytest.raises(ValueError, match="EOF"):
        sg.decode_command(b"\x05" + ID[:15])
    for cut in range(18, len(GOLDEN_ADD)):
        with pytest.raises(ValueError):
            sg.decode_command(GOLDEN_ADD[:cut])
    with pytest.raises(ValueError, match="unsupported version"):
        sg.decode_command(GOLDEN_ADD[:-15] + b"\x00" + GOLDEN_ADD[-14:])


def test_decoder_truncates_like_go():
    cmd = golden_job(sg.ADD, sg.ZERO_TIME_NS)
    wide = JobCommand(sg.ADD, ID, b"n", (1 << 32) + 7, 5, (1 << 31) + 1, 256 + 3, 512 + 4, b"",
                      sg.ZERO_TIME_NS, cmd.created_ns)
    back = sg.decode_command(sg.encode_command(wide))
    assert (back.ttr, back.priority, back.max_attempts, back.max_fails) == (7, -(1 << 31) + 1, 3, 4)


def test_expiration_rule_and_no_expiry_marker():
    created = unix_ns(2026, 1, 1)
    add = JobCommand(sg.ADD, ID, b"q", 60000, 1500, 0, 0, 0, b"", sg.ZERO_TIME_NS, created)
    assert sg.expires_at_ns(add) == created + 1500 * 10**6
    sched = JobCommand(sg.SCHEDULE, ID, b"q", 60000, 1500, 0, 0, 0, b"", created + 10**9, created)
    assert sg.expires_at_ns(sched) == created + 10**9 + 1500 * 10**6
    forever = JobCommand(sg.ADD, ID, b"q", 60000, sg.MAX_TTL_MS, 0, 0, 255, b"", sg.ZERO_TIME_NS, created)
    assert sg.never_expires(forever) and sg.expires_at_ns(forever) is None
    # workq's own 30-day jobs (fixture a1: max-fails 1; b1: a schedule with 255/255) still expire
    for other in (JobCommand(sg.ADD, ID, b"q", 60000, sg.MAX_TTL_MS, 10, 3, 1, b"", sg.ZERO_TIME_NS, created),
                  JobCommand(sg.SCHEDULE, ID, b"q", 60000, sg.MAX_TTL_MS, 0, 255, 255, b"", created, created),
                  JobCommand(sg.ADD, ID, b"q", 60000, sg.MAX_TTL_MS, 0, 1, 255, b"", sg.ZERO_TIME_NS, created)):
        assert sg.expires_at_ns(other) == created + sg.MAX_TTL_MS * 10**6


@pytest.mark.parametrize("cmd", [
    JobCommand(sg.ADD, ID, b"q", 1, 1500, 0, 0, 0, b"", sg.ZERO_TIME_NS, 10**18),
    JobCommand(sg.SCHEDULE, ID, b"q", 1, 1500, 0, 0, 0, b"", 10**18 + 7, 10**18),
    JobCommand(sg.SCHEDULE, ID, b"q", 1, 1500, 0, 0, 0, b"", 10**18 - 10**12, 10**18),
    JobCommand(sg.ADD, ID, b"q", 1, sg.MAX_TTL_MS, 0, 0, 255, b"", sg.ZERO_TIME_NS, 10**18),
    JobCommand(sg.ADD, ID, b"q", 1, sg.MAX_TTL_MS, 0, 0, 254, b"", sg.ZERO_TIME_NS, 10**18),
])
def test_replay_skips_exactly_what_expires_at_ns_says(cmd):
    """...but for an add held past its TTL (max-fails 254: an expired item's open move)."""
    from lanner.storage.cmdlog.replay import Replayer
    exp = sg.expires_at_ns(cmd)
    for now in ((10**18, 10**19) if exp is None else (exp - 1, exp, exp + 1)):
        r = Replayer(now)
        r.apply(cmd, "f", 8)
        assert (cmd.id in r.jobs) == (exp is None or now <= exp or sg.held_past_ttl(cmd))
    assert sg.held_past_ttl(cmd) == (cmd.max_fails == 254 and cmd.type == sg.ADD)


@pytest.mark.parametrize("name,seq", [
    ("000000001.log", 1), ("000000000.log", 0), ("123456789.log", 123456789),
    ("0000001.log", None), ("0000000002.log", None), ("0000002.notlog.log", None),
    ("000000001.log.rw", None), ("foo.log", None), ("000000003.LOG", None), ("00000001", None),
    ("append.lock", None), ("lanner-queues.json", None), ("+00000001.log", None),
    ("００００００００１.log", None), ("999999999.log", 999999999)])
def test_segment_names(name, seq):
    assert sg.segment_seq(name) == seq


def test_list_segments_sorts_numerically_and_ignores_others(tmp_path):
    for n in ("000000010.log", "000000002.log", "000000003.log.rw", "read.lock", "x.log", "000000001.log"):
        (tmp_path / n).write_bytes(b"")
    assert sg.list_segments(str(tmp_path)) == [(1, "000000001.log"), (2, "000000002.log"),
                                                (10, "000000010.log")]
    assert sg.segment_name(7) == "000000007.log"
    with pytest.raises(ValueError):
        sg.segment_name(10**9)


def _segment(*payloads, t=10**18) -> bytes:
    return sg.HEADER + b"".join(sg.encode_record(t + i, p) for i, p in enumerate(payloads))


def test_record_framing_errors_name_offset_and_kind():
    good = _segment(b"\x05" + ID, b"\x06" + ID)
    spans = list(sg.record_spans(good, "f"))
    assert spans == [(8, 24, 41, 45), (45, 61, 78, 82)]
    for cut in range(46, len(good)):
        with pytest.raises(CmdlogError) as e:
            list(sg.record_spans(good[:cut], "f"))
        assert (e.value.kind, e.value.offset) == (sg.TORN, 45)
        assert str(e.value).startswith("f: offset 45: torn record")
    flipped = bytearray(good)
    flipped[70] ^= 1
    with pytest.raises(CmdlogError) as e:
        list(sg.record_spans(bytes(flipped), "seg.log"))
    assert (e.value.kind, e.value.offset) == (sg.BAD_CRC, 45)
    assert "\n" not in str(e.value) and "seg.log: offset 45: crc mismatch" in str(e.value)
    bad_version = bytearray(good)
    bad_version[45] = 2
    with pytest.raises(CmdlogError) as e:
        list(sg.record_spans(bytes(bad_version), "f"))
    assert e.value.kind == sg.CORRUPT
    overflow = good + b"\x01" + bytes(14) + b"\xff" * 11
    with pytest.raises(CmdlogError) as e:
        list(sg.record_spans(overflow, "f"))
    assert (e.value.kind, e.value.offset) == (sg.CORRUPT, 82)


def test_non_minimal_size_varint_is_accepted_when_its_crc_matches():
    t = sg.encode_time(10**18)
    body = t + b"\x91\x80\x00" + b"\x05" + ID       # SIZE 17 in three bytes
    rec = body + sg.crc32c(body).to_bytes(4, "big")
    assert list(sg.record_spans(sg.HEADER + rec, "f")) == [(8, 26, 43, 47)]


def test_header_checks():
    sg.check_header(sg.HEADER, "f")
    for n in range(8):
        with pytest.raises(CmdlogError) as e:
            sg.check_header(sg.HEADER[:n], "f")
        assert e.value.kind == sg.TORN
    with pytest.raises(CmdlogError) as e:
        sg.check_header(b"wqwq\x00\x00\x00\x02", "f")
    assert e.value.kind == sg.BAD_HEADER and str(e.value).startswith("f: offset 0: invalid segment header")
    with pytest.raises(CmdlogError) as e:
        sg.check_header(b"xx", "f")
    assert e.value.kind == sg.BAD_HEADER


def test_iter_segment_streams_commands(tmp_path):
    p = tmp_path / "000000001.log"
    p.write_bytes(_segment(GOLDEN_ADD, b"\x03" + ID + b"\x00"))
    got = list(sg.iter_segment(str(p)))
    assert [(o, c.type) for o, _t, c in got] == [(8, 1), (8 + 15 + 1 + len(GOLDEN_ADD) + 4, 3)]
    assert got[0][1] == 10**18
    p.write_bytes(_segment(b"\x05" + ID + b"\xff"))
    with pytest.raises(CmdlogError, match="offset 8: trailing garbage") as e:
        list(sg.iter_segment(str(p)))
    assert e.value.path == str(p)
    p.write_bytes(b"")
    with pytest.raises(CmdlogError) as e:
        list(sg.iter_segment(str(p)))
    assert e.value.kind == sg.TORN and e.value.offset == 0


def test_valid_record_after_finds_resynchronisation_point():
    good = _segment(b"\x05" + ID, b"\x06" + ID, b"\x07" + ID)
    assert sg.valid_record_after(good, 8, len(good)) == 45
    assert sg.valid_record_after(good, 82, len(good)) is None
    assert sg.valid_record_after(memoryview(good), 8, len(good)) == 45
    assert sg.valid_record_after(good[:-3], 8, len(good) - 3) == 45      # chain ends in a torn record
    # a record embedded in a torn record's payload is not a resynchronisation point
    inner = sg.encode_record(10**18, b"\x05" + ID)
    torn = _segment(b"\x05" + ID, GOLDEN_ADD[:40] + inner + GOLDEN_ADD[40:])[:-30]
    assert sg.valid_record_after(torn, 45, len(torn)) is None


job_ids = st.binary(min_size=16, max_size=16)
times = st.integers(min_value=-(2**62), max_value=2**62)
commands = st.one_of(
    st.builds(JobCommand, st.sampled_from([sg.ADD, sg.SCHEDULE]), job_ids, st.binary(max_size=40),
              st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1), st.integers(-(2**31), 2**31 - 1),
              st.integers(0, 255), st.integers(0, 255), st.binary(max_size=300), times, times),
    st.builds(ResultCommand, st.sampled_from([sg.COMPLETE, sg.FAIL]), job_ids, st.binary(max_size=200)),
    st.builds(IdCommand, st.integers(sg.DELETE, sg.TIMEOUT_ATTEMPT), job_ids),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(commands, max_size=12), st.lists(times, min_size=12, max_size=12))
def test_roundtrip_and_independent_decoder_agree(cmds, rtimes):
    data = sg.HEADER + b"".join(sg.encode_record(t, sg.encode_command(c)) for c, t in zip(cmds, rtimes))
    got = [sg.decode_command(data, ps, pe) for _o, ps, pe, _e in sg.record_spans(data, "f")]
    assert got == cmds
    recs = indep.read_segment(data)
    assert [r["command"]["id"] for r in recs] == [c.id for c in cmds]
    assert indep.write_segment(recs) == data
    for r, t in zip(recs, rtimes):
        sec, nsec, off = r["time"]
        assert (sec - sg.GO_UNIX_OFFSET) * 10**9 + nsec == t and off == -1


def test_fsync_dir(tmp_path):
    sg.fsync_dir(str(tmp_path))
    with pytest.raises(OSError):
        sg.fsync_dir(os.path.join(str(tmp_path), "missing"))
