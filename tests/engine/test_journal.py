"""Journal codec, reader, file set and writer (reference §6.1-§6.3, §6.6)."""
from __future__ import annotations

import errno
import logging
import os
import struct
import threading

import pytest

from lanner.config import QueueConfig
from lanner.storage.journal import codec, journal as J
from lanner.queues.item import QItem
from lanner.storage.journal.codec import (JournalCorrupt, Record, encode_add, encode_confirm, encode_continue,
                                          encode_open, encode_remove, encode_unremove, read_records)
from lanner.storage.journal.files import JournalError, StrayFile, archived_files, queue_names_in
from lanner.storage.journal.journal import Journal

T = 1_700_000_000_000


def write(path, *chunks) -> None:
    with open(path, "wb") as f:
        f.write(b"".join(chunks))


def addx(data: bytes, add=T, exp=0) -> bytes:
    return encode_add(QItem(add, exp, data))


def open_journal(tmp_path, clock, name="q", **kw) -> Journal:
    j = Journal(str(tmp_path), name, clock, **kw)
    j.replay(QueueConfig())
    return j


# ---------------------------------------------------------------- codec, byte-exact (§6.2)

def test_set_record_is_26_bytes_exactly():
    b = encode_add(QItem(T, 0, b"hello"))
    assert len(b) == 26
    assert b == b"\x02" + b"\x15\x00\x00\x00" + T.to_bytes(8, "little") + b"\x00" * 8 + b"hello"


def test_expiry_field_is_epoch_ms():
    b = encode_add(QItem(T, T + 10_000, b"hello"))
    assert b[13:21] == (T + 10_000).to_bytes(8, "little")


def test_xid_records_byte_exact():
    assert encode_remove() == b"\x01"
    assert encode_open(1) == bytes.fromhex("0901000000")
    assert encode_confirm(1) == bytes.fromhex("0601000000")
    assert encode_unremove(1) == bytes.fromhex("0501000000")


def test_continue_record_layout():
    b = encode_continue(7, QItem(T, 5, b"xy"))
    assert b == b"\x08" + (7).to_bytes(4, "little") + (18).to_bytes(4, "little") + T.to_bytes(8, "little") \
        + (5).to_bytes(8, "little") + b"xy"


def test_journal_writes_the_example_bytes(tmp_path, clock):
    j = open_journal(tmp_path, clock)
    item = QItem(T, 0, b"hello")
    j.record_add(item)
    j.record_remove(item)
    j.record_add(item)
    j.record_open(item, 1)
    j.record_confirm(item, 1)
    j.record_add(item)
    j.record_open(item, 2)
    j.record_unremove(item, 2)
    j.record_continue(3, QItem(T, 0, b"x"))
    j.flush()
    assert (tmp_path / "q").read_bytes() == (
        addx(b"hello") + b"\x01" + addx(b"hello") + bytes.fromhex("0901000000 0601000000")
        + addx(b"hello") + bytes.fromhex("0902000000 0502000000") + encode_continue(3, QItem(T, 0, b"x")))
    assert j.logsize == (tmp_path / "q").stat().st_size
    j.close()


def test_records_written_in_place_are_the_codec_bytes_across_growth_and_flushes(tmp_path, clock):
    """The compiled record_add / record_remove write into the buffer in place (journal.pxd
    _c_put_addx, _c_grow, growing it by doubling): byte for byte what the codec encodes, over
    sizes that make the buffer grow many times (past 64 KiB, where growth stops doubling), with
    flushes between batches, and for items whose fields are not plain ints or bytes (the
    codec's own path)."""
    j = open_journal(tmp_path, clock)
    want = []
    for batch in range(3):
        for i in range(200):
            item = QItem(T + i, (T + 10 * i) if i % 3 else 0, bytes([i & 0xFF]) * (i * 37 % 3000))
            j.record_add(item)
            want.append(encode_add(item))
            if i % 4 == 0:
                j.record_remove(item)
                want.append(b"\x01")
        odd = QItem(True, 2 ** 62, bytearray(b"odd"))      # a bool, a bytearray: the codec's path
        j.record_add(odd)
        want.append(encode_add(QItem(1, 2 ** 62, b"odd")))
        assert j.logsize == sum(map(len, want))
        j.flush()
        assert (tmp_path / "q").read_bytes() == b"".join(want)
    j.close()


# ---------------------------------------------------------------- reader

def test_reader_decodes_every_opcode(tmp_path):
    legacy_add = b"\x00" + struct.pack("<ii", 4 + 3, 100) + b"old"
    add_xid = b"\x07" + struct.pack("<I", 9) + addx(b"ax")[1:]
    write(tmp_path / "f", legacy_add, b"\x01", addx(b"hi", exp=T + 5), b"\x03", struct.pack("<BI", 4, 40),
          encode_unremove(2), encode_confirm(3), add_xid, encode_continue(4, QItem(T, 0, b"c")), encode_open(5))
    recs = list(read_records(str(tmp_path / "f"), now_ms=42))
    assert [r.opcode for _, r in recs] == list(range(10))
    assert recs[0] == (0, Record(0, QItem(42, 100_000, b"old"), 0))
    assert recs[1] == (12, Record(1, None, 0))
    assert recs[2][1].item == QItem(T, T + 5, b"hi")
    assert recs[3][1] == Record(3, None, 0)
    assert recs[4][1] == Record(4, None, 40)
    assert recs[5][1].xid == 2 and recs[6][1].xid == 3
    assert recs[7][1] == Record(7, QItem(T, 0, b"ax"), 9)
    assert recs[8][1] == Record(8, QItem(T, 0, b"c"), 4)
    assert recs[9][1] == Record(9, None, 5)
    offsets = [o for o, _ in recs]
    assert offsets == sorted(offsets) and offsets[-1] == (tmp_path / "f").stat().st_size - 5


def test_reader_handles_items_bigger_than_a_chunk(tmp_path, monkeypatch):
    monkeypatch.setattr(codec, "CHUNK", 64)
    big = bytes(range(256)) * 10
    write(tmp_path / "f", addx(b"a"), addx(big), b"\x01", addx(b"z" * 63))
    recs = [r for _, r in read_records(str(tmp_path / "f"))]
    assert [r.item.data for r in recs if r.item] == [b"a", big, b"z" * 63]


def test_a_readers_buffers_stay_under_one_mib(tmp_path):
    """Read-behind reads with this reader in the worker that holds `max_memory_size` of items:
    its buffers add to the server's peak (issue 8), so it reads codec.CHUNK (256 KiB) at a time.
    With 1 MiB chunks it held 3 MiB at once (a chunk, the next, and the two joined).  8 MiB
    of 1 KiB items, each dropped once read."""
    import tracemalloc
    write(tmp_path / "f", *[addx(b"%08d" % i + b"y" * 1016) for i in range(8192)])
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        n = sum(1 for _ in read_records(str(tmp_path / "f")))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert n == 8192
    assert peak < 1 << 20, f"reading allocated up to {peak / 2**20:.1f} MiB at once"


@pytest.mark.parametrize("tail, offset_in_tail, reason", [
    (b"\x0a", 0, "invalid opcode 10"),
    (b"\x63\x00", 0, "invalid opcode 99"),
    (b"\x02\x15\x00", 0, "end of file inside a record"),
    (addx(b"hello")[:-1], 0, "end of file inside a record"),
    (b"\x09\x01\x00", 0, "end of file inside a record"),
    (b"\x02" + struct.pack("<i", 3) + b"abc", 0, "ADDX body of 3 bytes (< 16)"),
    (b"\x02" + struct.pack("<i", -5), 0, "negative size -5"),
    (b"\x08" + struct.pack("<Ii", 1, -1), 0, "negative size -1"),
    (b"\x00" + struct.pack("<i", 2) + b"ab", 0, "ADD body of 2 bytes (< 4)"),
])
def test_reader_reports_corruption_with_file_and_offset(tmp_path, tail, offset_in_tail, reason):
    good = addx(b"one") + b"\x01"
    write(tmp_path / "f", good, tail)
    seen = []
    with pytest.raises(JournalCorrupt) as ei:
        for off, rec in read_records(str(tmp_path / "f")):
            seen.append(rec.opcode)
    assert seen == [2, 1]
    e = ei.value
    assert e.file == str(tmp_path / "f") and e.offset == len(good) + offset_in_tail
    assert reason in e.reason and str(tmp_path / "f") in str(e) and str(len(good)) in str(e)


def test_empty_file_is_a_valid_journal(tmp_path):
    write(tmp_path / "f")
    assert list(read_records(str(tmp_path / "f"))) == []


# ---------------------------------------------------------------- file set (§6.1)

def test_archives_sort_numerically(tmp_path):
    for n in ("q.99", "q.100", "q.1000", "q.5", "q", "qq.1", "q+f.3"):
        write(tmp_path / n)
    assert archived_files(str(tmp_path), "q") == ["q.5", "q.99", "q.100", "q.1000"]


def test_pack_file_replaces_older_archives(tmp_path):
    for n in ("q.100", "q.200.pack", "q.300", "q"):
        write(tmp_path / n, n.encode())
    assert archived_files(str(tmp_path), "q") == ["q.200", "q.300"]
    assert sorted(os.listdir(tmp_path)) == ["q", "q.200", "q.300"]
    assert (tmp_path / "q.200").read_bytes() == b"q.200.pack"


def test_pack_with_same_timestamp_as_an_archive_wins(tmp_path):
    write(tmp_path / "q.200", b"old")
    write(tmp_path / "q.200.pack", b"new")
    write(tmp_path / "q.250.pack", b"newer")
    assert archived_files(str(tmp_path), "q") == ["q.250"]
    assert (tmp_path / "q.250").read_bytes() == b"newer"


def test_stray_archive_suffix_is_an_error_naming_the_file(tmp_path):
    write(tmp_path / "q.12x")
    with pytest.raises(StrayFile, match=r"q\.12x"):
        archived_files(str(tmp_path), "q")


def test_queue_names_in(tmp_path):
    for n in ("a", "a.100", "b.200.pack", "c~~123", "d", "d.1", "d.2"):
        write(tmp_path / n)
    (tmp_path / "cmdlog").mkdir()
    (tmp_path / "e.5").mkdir()
    assert queue_names_in(str(tmp_path)) == ["a", "b", "d"]


@pytest.mark.parametrize("stray", ["a.bak", "a.100.old", "a.", ".hidden", "a.pack"])
def test_queue_names_in_rejects_stray_files(tmp_path, stray):
    write(tmp_path / "a")
    write(tmp_path / stray)
    with pytest.raises(StrayFile) as ei:
        queue_names_in(str(tmp_path))
    assert stray in str(ei.value)


@pytest.mark.parametrize("bad", ["", "a/b", "..", "a.b", "a~b", "a\0"])
def test_names_that_could_escape_the_directory_are_refused(tmp_path, clock, bad):
    with pytest.raises(AssertionError):
        Journal(str(tmp_path), bad, clock)
    with pytest.raises(AssertionError):
        Journal.erase_all(str(tmp_path), bad)


def test_replay_deletes_temp_files_and_creates_the_current_file(tmp_path, clock):
    write(tmp_path / "q~~123", b"junk")
    write(tmp_path / "q~~124.tmp", b"junk")
    write(tmp_path / "qq~~1", b"other queue")
    j = open_journal(tmp_path, clock)
    assert sorted(os.listdir(tmp_path)) == ["q", "qq~~1"]
    assert (tmp_path / "q").stat().st_size == 0
    j.close()


def test_erase_all_deletes_only_that_queue(tmp_path):
    for n in ("q", "q.1", "q.2.pack", "q~~3", "q2", "q+fan", "q+fan.4", "r"):
        write(tmp_path / n)
    Journal.erase_all(str(tmp_path), "q")
    assert sorted(os.listdir(tmp_path)) == ["q+fan", "q+fan.4", "q2", "r"]
    Journal.erase_all(str(tmp_path / "missing"), "q")


def test_erase_deletes_every_file(tmp_path, clock):
    write(tmp_path / "q.5", addx(b"a"))
    write(tmp_path / "other")
    j = open_journal(tmp_path, clock)
    j.record_add(QItem(T, 0, b"b"))
    j.erase()
    assert os.listdir(tmp_path) == ["other"]


# ---------------------------------------------------------------- rotation names

class View:
    name = "q"

    def __init__(self, items=(), opened=None):
        self.items = list(items)
        self.opened = dict(opened or {})

    @property
    def length(self):
        return len(self.items)

    @property
    def size_bytes(self):
        return sum(len(i.data) for i in self.items)

    def memory_items(self):
        return iter(self.items)

    def open_items(self):
        return self.opened


def test_rotation_names_use_epoch_ms_and_skip_taken_names(tmp_path, clock):
    j = open_journal(tmp_path, clock)
    now = clock.now_ms()
    write(tmp_path / f"q.{now}")         # taken by someone (an older archive)
    cfg = QueueConfig(max_memory_size=10)
    j.record_add(QItem(now, 0, b"x" * 20))
    j.before_add(View([QItem(now, 0, b"x" * 20)]), cfg, now)
    assert j.rotations == 1
    assert sorted(os.listdir(tmp_path)) == ["q", f"q.{now}", f"q.{now + 1}"]
    assert (tmp_path / f"q.{now + 1}").stat().st_size == 41
    assert j.logsize == 0


def test_rotation_names_never_go_backwards(tmp_path, clock):
    write(tmp_path / f"q.{T + 5000}", addx(b"a"))
    j = open_journal(tmp_path, clock)          # clock is at T, older than the archive
    j.record_add(QItem(T, 0, b"x" * 20))
    j.before_add(View([QItem(T, 0, b"a"), QItem(T, 0, b"x" * 20)]), QueueConfig(max_memory_size=10), T)
    assert archived_files(str(tmp_path), "q") == [f"q.{T + 5000}", f"q.{T + 5001}"]


@pytest.mark.parametrize("policy, fsynced", [("always", True), ("never", False), (100, False)])
def test_a_fresh_file_is_in_the_directory_on_disk_before_records_go_into_it(tmp_path, clock, monkeypatch,
                                                                           policy, fsynced):
    """Under "always" a reply promises that a power cut keeps its record, and the group commit's
    fdatasync of the file (storage/syncer.py) does not cover its name: the new `q` a rotation makes,
    and a new queue's first file, have their directory fsynced when they are made, while empty."""
    seen = []

    def fsync_dir(path):
        seen.append((path, sorted(os.listdir(path)), os.path.getsize(tmp_path / "q")))
    monkeypatch.setattr(J, "fsync_dir", fsync_dir)
    write(tmp_path / "q")
    j = open_journal(tmp_path, clock, sync_policy=policy)
    assert seen == []                                                   # it was there already
    now = clock.now_ms()
    j.record_add(QItem(now, 0, b"x" * 20))
    j.before_add(View([QItem(now, 0, b"x" * 20)]), QueueConfig(max_memory_size=10), now)
    assert j.rotations == 1
    assert seen == ([(str(tmp_path), ["q", f"q.{now}"], 0)] if fsynced else [])
    seen.clear()
    open_journal(tmp_path, clock, name="new", sync_policy=policy).close()
    assert [p for p, _, _ in seen] == ([str(tmp_path)] if fsynced else [])


# ---------------------------------------------------------------- writer, durability, failures (§6.6)

def test_records_are_buffered_until_flush(tmp_path, clock):
    j = open_journal(tmp_path, clock)
    assert not j.dirty
    j.record_add(QItem(T, 0, b"hello"))
    assert j.dirty and j.logsize == 26 and j.flushed_size == 0
    assert (tmp_path / "q").stat().st_size == 0
    j.flush()
    assert (tmp_path / "q").stat().st_size == 26 and j.flushed_size == 26
    assert not j.dirty            # policy "never": unsynced data is not the owner's business


def test_sync_policy_always_stays_dirty_until_synced(tmp_path, clock, monkeypatch):
    calls = []
    monkeypatch.setattr(J, "_fsync", lambda fd: calls.append(fd))
    j = open_journal(tmp_path, clock, sync_policy="always")
    j.record_add(QItem(T, 0, b"hello"))
    j.flush()
    assert j.dirty
    j.sync()
    assert not j.dirty and len(calls) == 1
    j.sync()
    assert len(calls) == 1        # nothing new to sync


def test_sync_from_another_thread_only_syncs_flushed_bytes(tmp_path, clock, monkeypatch):
    synced = []
    monkeypatch.setattr(J, "_fsync", lambda fd: synced.append(os.fstat(fd).st_size))
    j = open_journal(tmp_path, clock, sync_policy=100)
    j.record_add(QItem(T, 0, b"hello"))
    j.flush()
    j.record_remove(None)                    # pending, owned by the main thread
    t = threading.Thread(target=j.sync)
    t.start()
    t.join()
    assert synced == [26]
    assert j.logsize == 27 and j.flushed_size == 26 and j.dirty
    j.sync()
    assert synced == [26, 27] and not j.dirty


def test_write_failure_keeps_records_pending_and_file_unchanged(tmp_path, clock, monkeypatch):
    j = open_journal(tmp_path, clock)
    j.record_add(QItem(T, 0, b"first"))
    j.flush()

    def enospc(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(J, "_write", enospc)
    j.record_add(QItem(T, 0, b"second"))
    with pytest.raises(JournalError) as ei:
        j.flush()
    assert isinstance(ei.value, OSError) and ei.value.errno == errno.ENOSPC
    assert str(tmp_path / "q") in str(ei.value)
    assert (tmp_path / "q").stat().st_size == 26 and j.flushed_size == 26 and j.dirty
    monkeypatch.setattr(J, "_write", os.write)
    j.flush()
    assert [r.item.data for _, r in read_records(str(tmp_path / "q"))] == [b"first", b"second"]


def test_torn_write_is_truncated_away(tmp_path, clock, monkeypatch):
    j = open_journal(tmp_path, clock)
    j.record_add(QItem(T, 0, b"first"))
    j.flush()
    state = {"n": 0}

    def half_then_fail(fd, data):
        state["n"] += 1
        if state["n"] == 1:
            return os.write(fd, bytes(data[:7]))     # a short write...
        raise OSError(errno.EIO, "I/O error")           # ...then the disk gives up
    monkeypatch.setattr(J, "_write", half_then_fail)
    j.record_add(QItem(T, 0, b"second"))
    j.record_remove(None)
    with pytest.raises(JournalError):
        j.flush()
    assert (tmp_path / "q").stat().st_size == 26          # no torn record left on disk
    monkeypatch.setattr(J, "_write", os.write)
    j.flush()
    assert [r.opcode for _, r in read_records(str(tmp_path / "q"))] == [2, 2, 1]


def test_short_writes_are_completed(tmp_path, clock, monkeypatch):
    monkeypatch.setattr(J, "_write", lambda fd, data: os.write(fd, bytes(data[:3])))
    j = open_journal(tmp_path, clock)
    for i in range(5):
        j.record_add(QItem(T, 0, b"item%d" % i))
    j.flush()
    assert [r.item.data for _, r in read_records(str(tmp_path / "q"))] == [b"item%d" % i for i in range(5)]


def test_fsync_failure_names_the_file(tmp_path, clock, monkeypatch):
    def eio(fd):
        raise OSError(errno.EIO, "Input/output error")
    j = open_journal(tmp_path, clock, sync_policy="always")
    j.record_add(QItem(T, 0, b"x"))
    monkeypatch.setattr(J, "_fsync", eio)
    with pytest.raises(JournalError, match="fsync failed") as ei:
        j.sync()
    assert str(tmp_path / "q") in str(ei.value) and j.dirty


def test_big_batches_flush_themselves(tmp_path, clock, monkeypatch):
    monkeypatch.setattr(J, "AUTOFLUSH", 100)
    j = open_journal(tmp_path, clock)
    for _ in range(5):
        j.record_add(QItem(T, 0, b"y" * 30))
    assert j.flushed_size == 204 and j.logsize == 255


def test_close_flushes_and_syncs(tmp_path, clock, monkeypatch):
    calls = []
    monkeypatch.setattr(J, "_fsync", lambda fd: calls.append(fd))
    j = open_journal(tmp_path, clock)
    j.record_add(QItem(T, 0, b"x"))
    j.close()
    j.close()
    assert (tmp_path / "q").stat().st_size == 22 and len(calls) == 1


def test_rewrite_that_cannot_write_is_skipped_and_logged(tmp_path, clock, monkeypatch, caplog):
    j = open_journal(tmp_path, clock)
    item = QItem(T, 0, b"z" * 100)
    for _ in range(3):
        j.record_add(item)
        j.record_remove(item)
    j.flush()
    written = []

    def fail_big(fd, data):
        if os.fstat(fd).st_size == 0 and fd != j._fd:
            raise OSError(errno.ENOSPC, "No space left on device")
        written.append(len(data))
        return os.write(fd, data)
    monkeypatch.setattr(J, "_write", fail_big)
    with caplog.at_level(logging.ERROR, logger="lanner.storage.journal.journal"):
        j.after_remove(View([item]), QueueConfig(max_journal_size=100), T)
    # the current file was archived before the dump failed: it stays, nothing is lost
    assert j.rewrites == 0 and "rewrite stopped half way" in caplog.text
    assert sorted(os.listdir(tmp_path)) == ["q", f"q.{T + 1}"] and j.archived_size == 3 * 122
    j.record_add(item)                          # the journal still works
    j.flush()
    assert j.logsize == 122 - 1


def test_start_read_behind_flushes_first(tmp_path, clock):
    j = open_journal(tmp_path, clock)
    j.record_add(QItem(T, 0, b"a"))
    j.start_read_behind()
    assert j.in_read_behind and j.flushed_size == 22
    j.record_add(QItem(T, 0, b"b"))
    assert [i.data for i in j.fill_read_behind(100, T)] == [b"b"]
    assert not j.in_read_behind and j.flushed_size == 44
    assert j.fill_read_behind(100, T) == []


def test_a_failed_fsync_still_counts_after_a_rollback_cut_the_file_back(tmp_path, clock):
    """A group-commit fsync under way when a failed write rolls the journal back: its EIO must
    still reach the round (it used to be dropped as if the file had been switched, and the
    round's replies left as durable).  A file let go (rotation, close) still drops it: it was
    fsynced before it went."""
    j = open_journal(tmp_path, clock, sync_policy="always")
    try:
        j.record_add(QItem(T, 0, b"first"))
        j.flush()
        fd, token, _ = j.sync_target()           # the round's fsync starts
        mark = j.record_add(QItem(T, 0, b"second"))
        j.flush()
        j.rollback(mark)                         # a later batch's failure cuts "second" off
        err = j.sync_done(token, OSError(errno.EIO, "Input/output error"))
        assert isinstance(err, JournalError) and err.errno == errno.EIO and "q" in str(err)
        j.record_add(QItem(T, 0, b"third"))
        j.flush()
        fd, token, _ = j.sync_target()
    finally:
        j.close()                                # its file let go (fsynced first), as rotation does
    assert j.sync_done(token, OSError(errno.EIO, "Input/output error")) is None
