"""`lanner qdump` / `lanner qpack` output (reference §6.7)."""
from __future__ import annotations

import io
import struct

import pytest

from lanner.clock import FakeClock
from lanner.queues.item import QItem
from lanner.storage.journal.codec import (encode_add, encode_confirm, encode_continue, encode_open, encode_remove,
                                          encode_unremove)
from lanner.tools.qtools import QDUMP_USAGE, QPACK_USAGE, duration_str, qdump_main, qpack_main

NOW = 1_700_000_000_000


def addx(data, exp=0):
    return encode_add(QItem(NOW - 5, exp, data))


@pytest.fixture
def journal_file(tmp_path):
    path = tmp_path / "q"
    path.write_bytes(b"".join([
        addx(b"hello"),                                     # 0
        addx(b"bye", exp=NOW + 9999),                       # 26
        addx(b"old", exp=NOW - 1),                          # 50
        encode_remove(),                                    # 74
        encode_open(1),                                     # 75
        b"\x07" + struct.pack("<I", 3) + addx(b"ax")[1:],   # 80  ADD_XID
        encode_confirm(1),                                  # 107
        struct.pack("<BI", 4, 7),                           # 112 SAVE_XID
        b"\x03",                                            # 117 legacy REMOVE_TENTATIVE
        encode_unremove(8),                                 # 118
        encode_continue(8, QItem(NOW, 0, b"cc")),           # 123
    ]))
    return str(path)


def run_qdump(*args):
    out, err = io.BytesIO(), io.StringIO()
    rc = qdump_main(list(args), clock=FakeClock(NOW), stdout=out, stderr=err)
    return rc, out.getvalue(), err.getvalue()


SUMMARY = b"\r" + b" " * 30 + b"\nJournal size: 150 bytes, with 11 operations.\n3 items totalling 7 bytes.\n"


def test_qdump_describes_every_record(journal_file):
    rc, out, err = run_qdump(journal_file)
    assert rc == 0 and err == ""
    assert out == (f"Queue: {journal_file}\n".encode() + b"".join(line + b"\n" for line in [
        b"00000000  ADD 5     ",
        b"0000001a  ADD 3      exp=9.seconds+999.milliseconds",
        b"00000032  ADD 3      expired",
        b"0000004a  REM",
        b"0000004b  RSV 1",
        b"00000050  ADD 2      xid=3",
        b"0000006b  ACK 1",
        b"00000070  XID 7",
        b"00000075  RSV 8",
        b"00000076  CAN 8",
        b"0000007b  CON 2     ",
    ]) + SUMMARY)


def test_qdump_quiet_prints_the_summary_only(journal_file):
    assert run_qdump("-q", journal_file) == (0, SUMMARY, "")


def test_qdump_d_adds_item_data(journal_file):
    rc, out, _ = run_qdump("-d", journal_file)
    lines = out.split(b"\n")
    assert lines[1:4] == [b"00000000  ADD 5     ", b"    hello", b"0000001a  ADD 3      exp=9.seconds+999.milliseconds"]
    assert b"0000007b  CON 2     \n    cc\n" in out


def test_qdump_raw_added_data_only(journal_file):
    assert run_qdump("-A", journal_file) == (0, b"hellobyeoldaxcc", "")


def test_qdump_queue_state_only(journal_file):
    assert run_qdump("-Q", journal_file) == (0, SUMMARY + b"old\nax\ncc\n", "")


def test_qdump_data_is_written_as_stored(tmp_path):
    (tmp_path / "q").write_bytes(addx(b"\xe9\xff\x00"))
    assert run_qdump("-A", str(tmp_path / "q"))[1] == b"\xe9\xff\x00"


def test_qdump_counts_open_transactions_in_the_summary(tmp_path):
    (tmp_path / "q").write_bytes(addx(b"abc") + addx(b"de") + encode_open(1))
    assert run_qdump("-q", str(tmp_path / "q"))[1].endswith(b"2 items totalling 5 bytes.\n")


def test_qdump_each_file_on_its_own_and_says_which_summary_is_whose(tmp_path, journal_file):
    (tmp_path / "empty").write_bytes(b"")
    empty = str(tmp_path / "empty")
    rc, out, err = run_qdump("-q", journal_file, empty)
    assert rc == 0
    assert out == (f"Queue: {journal_file}\n".encode() + SUMMARY + f"Queue: {empty}\n".encode() +
                   b"\r" + b" " * 30 + b"\nJournal size: 0 bytes, with 0 operations.\n0 items totalling 0 bytes.\n")
    assert err == f"warning: {empty} is empty\n"
    assert run_qdump("-q", journal_file)[1] == SUMMARY        # one file: Kestrel's output exactly


def test_qdump_usage(journal_file):
    assert run_qdump() == (2, b"", QDUMP_USAGE)
    assert run_qdump("--help", journal_file) == (0, QDUMP_USAGE.encode(), "")
    assert run_qdump("-x", journal_file)[0] == 2
    assert b"usage: lanner qdump" in QDUMP_USAGE.encode()


def test_qdump_of_what_is_not_a_journal_exits_1(tmp_path):
    from lanner.storage.cmdlog.segment import HEADER
    (tmp_path / "000000001.log").write_bytes(HEADER)
    (tmp_path / "notes.txt").write_bytes(b"hello\n")
    rc, out, err = run_qdump("-q", str(tmp_path), str(tmp_path / "000000001.log"), str(tmp_path / "notes.txt"))
    assert rc == 1
    assert err.splitlines() == [
        f"Can't open journal file: {tmp_path} (not a regular file)",
        f"Not a journal file: {tmp_path / '000000001.log'} is a workq command-log segment; "
        "use `lanner cmdlog dump <its directory>`",
        f"warning: {tmp_path / 'notes.txt'}: not named like a journal (<queue>, <queue>.<ms>, <queue>.<ms>.pack)",
        f"Exception reading journal file: {tmp_path / 'notes.txt'}",
        f"{tmp_path / 'notes.txt'} at offset 0: invalid opcode 104"]


def test_qdump_warns_about_a_file_not_named_like_a_journal(tmp_path):
    (tmp_path / "append.lock").write_bytes(b"")
    rc, _, err = run_qdump("-q", str(tmp_path / "append.lock"))
    assert rc == 0 and "not named like a journal" in err and "is empty" in err
    for name in ("jobs", "jobs.1700000000000", "jobs.1700000000000.pack", "jobs~~1700000000000"):
        (tmp_path / name).write_bytes(addx(b"x"))
        assert run_qdump("-q", str(tmp_path / name))[2] == ""


def test_qdump_corrupt_record(tmp_path):
    path = str(tmp_path / "q")
    (tmp_path / "q").write_bytes(addx(b"hello") + b"\x63")
    rc, out, err = run_qdump(path)
    assert rc == 1
    assert out == f"Queue: {path}\n00000000  ADD 5     \n".encode()
    assert err == f"Exception reading journal file: {path}\n{path} at offset 26: invalid opcode 99\n"


def test_qdump_missing_file_goes_on_with_the_next(tmp_path, journal_file):
    rc, out, err = run_qdump("-q", str(tmp_path / "nope"), journal_file)
    assert rc == 1 and err == f"Can't open journal file: {tmp_path / 'nope'}\n"
    assert out == f"Queue: {tmp_path / 'nope'}\nQueue: {journal_file}\n".encode() + SUMMARY


@pytest.mark.parametrize("ms, text", [
    (0, "0.seconds"), (999, "999.milliseconds"), (60_000, "1.minutes"), (9_999, "9.seconds+999.milliseconds"),
    (90_061_001, "1.days+1.hours+1.minutes+1.seconds+1.milliseconds"), (3_600_000 * 50, "2.days+2.hours"),
])
def test_durations_read_like_twitter_util(ms, text):
    assert duration_str(ms) == text


# ---------------------------------------------------------------- qpack

def run_qpack(*args):
    out, err = io.StringIO(), io.StringIO()
    rc = qpack_main(list(args), clock=FakeClock(NOW), stdout=out, stderr=err)
    return rc, out.getvalue(), err.getvalue()


def test_qpack_writes_one_compact_journal(tmp_path, journal_file):
    (tmp_path / "q.2").write_bytes(encode_remove() + addx(b"tail") + encode_open(4))
    new = str(tmp_path / "packed")
    rc, out, err = run_qpack("-f", new, journal_file, str(tmp_path / "q.2"))
    # journal_file leaves old, ax, cc; then REM takes old and RSV 4 takes ax
    expected = addx(b"ax") + encode_open(4) + encode_add(QItem(NOW, 0, b"cc")) + addx(b"tail")
    assert (tmp_path / "packed").read_bytes() == expected
    assert rc == 0 and err == ""
    assert out == ("Packing journals...\n\rWriting new journal..." + " " * 40 + "\n\r" + " " * 40 + "\n"
                   f"Done. New journal size: {len(expected)}\n")


def test_qpack_quiet_flag_is_accepted(tmp_path, journal_file):
    rc, out, _ = run_qpack("-q", "-f", str(tmp_path / "p"), journal_file)
    assert rc == 0 and out.endswith("Done. New journal size: 70\n")


def test_qpack_usage(tmp_path, journal_file):
    assert run_qpack() == (2, "", "lanner qpack: no new file (-f NEWFILE)\n" + QPACK_USAGE)
    assert run_qpack(journal_file) == (2, "", "lanner qpack: no new file (-f NEWFILE)\n" + QPACK_USAGE)
    assert run_qpack("-f", str(tmp_path / "p")) == (2, "", "lanner qpack: no journal files to pack\n" + QPACK_USAGE)
    assert run_qpack(journal_file, "-f")[0] == 2
    assert run_qpack("--help") == (0, QPACK_USAGE, "")
    assert not (tmp_path / "p").exists()


def test_qpack_does_not_overwrite_without_force(tmp_path, journal_file):
    new = tmp_path / "p"
    new.write_bytes(b"precious")
    rc, out, err = run_qpack("-f", str(new), journal_file)
    assert rc == 1 and out == "" and err == f"lanner qpack: {new} exists; use --force to overwrite it\n"
    assert new.read_bytes() == b"precious"
    rc, out, err = run_qpack("--force", "-f", str(new), journal_file)
    assert rc == 0 and out.endswith("Done. New journal size: 70\n") and new.stat().st_size == 70
    rc, _, err = run_qpack("--force", "-f", journal_file, journal_file)
    assert rc == 1 and "is one of the journals to pack" in err


def test_qpack_leaves_out_a_torn_tail_with_a_warning(tmp_path):
    (tmp_path / "q").write_bytes(addx(b"a") + b"\x02\x15")
    rc, out, err = run_qpack("-f", str(tmp_path / "p"), str(tmp_path / "q"))
    assert rc == 0 and out.endswith("Done. New journal size: 22\n")
    assert err == (f"warning: {tmp_path / 'q'} at offset 22: end of file inside a record (a torn write): "
                   "that record is left out\n")


def test_qpack_refuses_a_broken_record_and_writes_nothing(tmp_path):
    (tmp_path / "q").write_bytes(addx(b"a") + b"\x63" + addx(b"b"))
    rc, out, err = run_qpack("-f", str(tmp_path / "p"), str(tmp_path / "q"))
    assert rc == 1 and not (tmp_path / "p").exists()
    assert err == (f"Exception reading journal file: {tmp_path / 'q'}\n"
                   f"{tmp_path / 'q'} at offset 22: invalid opcode 99\nNothing written.\n")


def test_qpack_missing_input(tmp_path):
    rc, out, err = run_qpack("-f", str(tmp_path / "p"), str(tmp_path / "nope"))
    assert rc == 1 and out == "" and err == f"Can't open journal file: {tmp_path / 'nope'}\n"
