"""Replay, read-behind, rotation, rewrite and checkpoint packs of `Journal`, driven
through the storage seam by a small fake queue (reference §5.8, §5.9, §6.3-§6.5, §9.7)."""
from __future__ import annotations

import logging
import os
import struct
from collections import deque
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from lanner.config import QueueConfig
from lanner.clock import FakeClock
from lanner.queues.item import QItem
from lanner.storage.journal.codec import encode_add, encode_confirm, encode_open, encode_unremove, read_records
from lanner.storage.journal.files import archived_files
from lanner.storage.journal.journal import Journal
from lanner.storage.journal.replay import JournalReplayError
from lanner.storage.journal.packer import pack_files

T = 1_700_000_000_000


class FakeQueue:
    """The parts of PersistentQueue that talk to storage, in Kestrel's order:
    add = before_add, read-behind entry, append, record_add; remove = record,
    refill from read-behind, after_remove; restart = replay + rollback."""

    def __init__(self, storage, config, clock, name="q"):
        self.name = name
        self.storage = storage
        self.config = config
        self.clock = clock
        self.mem: deque[QItem] = deque()
        self.mem_bytes = 0
        self._length = 0
        self._bytes = 0
        self.opened: dict[int, QItem] = {}
        self.xid = 0

    # QueueView
    @property
    def length(self):
        return self._length

    @property
    def size_bytes(self):
        return self._bytes

    def memory_items(self):
        return iter(self.mem)

    def open_items(self):
        return self.opened

    def replay(self):
        st = self.storage.replay(self.config)
        self.mem = st.items
        self.mem_bytes = sum(len(i.data) for i in self.mem)
        self._length, self._bytes = st.total_items, st.total_bytes
        self.opened = dict(st.open_transactions)
        self.xid = st.xid_counter
        self.replayed = st
        for xid in sorted(self.opened, reverse=True):
            self.unremove(xid)
        return st

    def add(self, data: bytes, expiry=0):
        now = self.clock.now_ms()
        item = QItem(now, expiry, data)
        self.storage.before_add(self, self.config, now)
        if not self.storage.in_read_behind and self._bytes >= self.config.max_memory_size:
            self.storage.start_read_behind()
        if not self.storage.in_read_behind:
            self.mem.append(item)
            self.mem_bytes += len(data)
        self._length += 1
        self._bytes += len(data)
        self.storage.record_add(item)

    def _next_xid(self):
        self.xid += 1
        while self.xid == 0 or self.xid in self.opened:
            self.xid += 1
        return self.xid

    def remove(self, transactional=False):
        if not self.mem:
            return None
        item = self.mem.popleft()
        n = len(item.data)
        self.mem_bytes -= n
        self._length -= 1
        self._bytes -= n
        if transactional:
            item.xid = self._next_xid()
            self.opened[item.xid] = item
            self.storage.record_open(item, item.xid)
        else:
            self.storage.record_remove(item)
        self.fill()
        self.storage.after_remove(self, self.config, self.clock.now_ms())
        return item

    def fill(self):
        if self.storage.in_read_behind and self.mem_bytes < self.config.max_memory_size:
            for it in self.storage.fill_read_behind(self.config.max_memory_size - self.mem_bytes,
                                                    self.clock.now_ms()):
                self.mem.append(it)
                self.mem_bytes += len(it.data)

    def unremove(self, xid):
        item = self.opened.pop(xid)
        item.xid = 0
        self.mem.appendleft(item)
        self.mem_bytes += len(item.data)
        self._length += 1
        self._bytes += len(item.data)
        self.storage.record_unremove(item, xid)

    def confirm(self, xid):
        item = self.opened.pop(xid)
        self.storage.record_confirm(item, xid)

    def drain(self):
        out = []
        while (item := self.remove()) is not None:
            out.append(item.data)
        return out


def journal(tmp_path, clock, **kw):
    return Journal(str(tmp_path), "q", clock, **kw)


def restart(tmp_path, clock, q: FakeQueue, **kw) -> FakeQueue:
    q.storage.close()
    q2 = FakeQueue(journal(tmp_path, clock, **kw), q.config, clock)
    q2.replay()
    return q2


def write(path, *chunks):
    with open(path, "wb") as f:
        f.write(b"".join(chunks))


def addx(data, add=T, exp=0):
    return encode_add(QItem(add, exp, data))


def replay_files(tmp_path, clock, cfg=None):
    j = journal(tmp_path, clock)
    st = j.replay(cfg or QueueConfig())
    j.close()
    return st


# ---------------------------------------------------------------- replay and corruption (§6.3)

def test_torn_tail_of_current_file_is_truncated(tmp_path, clock, caplog):
    write(tmp_path / "q", addx(b"hello"), addx(b"world"), b"\x02\x15\x00")
    with caplog.at_level(logging.WARNING, logger="lanner.storage.journal.journal"):
        st = replay_files(tmp_path, clock)
    assert [i.data for i in st.items] == [b"hello", b"world"] and st.total_items == 2
    assert (tmp_path / "q").stat().st_size == 52
    assert "torn record" in caplog.text and "offset 52" in caplog.text and "truncating 3 bytes" in caplog.text
    assert str(tmp_path / "q") in caplog.text


def test_zero_filled_tail_is_a_torn_tail(tmp_path, clock):
    """What a filesystem that extended the file before the data landed leaves after a crash."""
    write(tmp_path / "q", addx(b"hello"), bytes(4096))
    st = replay_files(tmp_path, clock)
    assert [i.data for i in st.items] == [b"hello"] and (tmp_path / "q").stat().st_size == 26


def test_writer_appends_after_truncation(tmp_path, clock):
    write(tmp_path / "q", addx(b"a"), b"\x02\x15\x00\x00")
    q = FakeQueue(journal(tmp_path, clock), QueueConfig(), clock)
    q.replay()
    assert q.storage.logsize == 22
    q.add(b"b")
    q.storage.flush()
    q = restart(tmp_path, clock, q)
    assert q.drain() == [b"a", b"b"]


def records(n):
    return [addx(b"item%04d" % i) for i in range(n)]


@pytest.mark.parametrize("bad", [b"\x63", b"\x02\xff\xff\xff\xff", b"\x02\x05\x00\x00\x00"],
                         ids=["invalid opcode", "negative size", "size below 16"])
def test_corruption_before_the_end_refuses_replay_and_keeps_the_file(tmp_path, clock, bad):
    """Issue 11, defect 6: a broken record at record 500 of 1,000 used to truncate the file
    there.  Now replay stops, naming the file and the offset, and changes nothing."""
    recs = records(1000)
    recs[500] = bad + recs[500][len(bad):]
    write(tmp_path / "q", *recs)
    before = (tmp_path / "q").read_bytes()
    j = journal(tmp_path, clock)
    with pytest.raises(JournalReplayError) as ei:
        j.replay(QueueConfig())
    j.close()
    offset = 500 * len(recs[0])
    msg = str(ei.value)
    assert f"journal {tmp_path / 'q'} is corrupt at offset {offset} of {len(before)}" in msg
    assert "queue 'q'" in msg and f"truncate -s {offset}" in msg
    assert (tmp_path / "q").read_bytes() == before


def test_a_single_broken_byte_at_the_end_is_named_in_the_singular(tmp_path, clock, caplog):
    """An unknown opcode as the file's last byte is corruption, not a torn write: the refusal
    counts what a cut would drop, from the broken byte on, and reads as English ("1 byte")."""
    write(tmp_path / "q", addx(b"hello"), b"\x63")
    j = journal(tmp_path, clock)
    with pytest.raises(JournalReplayError) as ei:
        j.replay(QueueConfig())
    j.close()
    assert "rather than drop the 1 byte from there on" in str(ei.value)
    write(tmp_path / "q", addx(b"hello"), b"\x02\x15")
    with caplog.at_level(logging.WARNING, logger="lanner.storage.journal.journal"):
        replay_files(tmp_path, clock)
    assert "truncating 2 bytes" in caplog.text


def test_broken_record_in_an_archive_refuses_replay(tmp_path, clock):
    write(tmp_path / "q.100", addx(b"a"), addx(b"b"), b"\x63\x01\x02", addx(b"not lost"))
    write(tmp_path / "q.200", b"\x01", addx(b"c"))
    write(tmp_path / "q", addx(b"d"))
    j = journal(tmp_path, clock)
    with pytest.raises(JournalReplayError, match=r"archived journal .*q\.100 is corrupt at offset 44"):
        j.replay(QueueConfig())
    j.close()
    assert (tmp_path / "q.100").stat().st_size == 44 + 3 + 29


def test_torn_archive_refuses_replay(tmp_path, clock):
    """Archives were complete when rotated: one that ends inside a record is damage, not a crash."""
    write(tmp_path / "q.100", addx(b"a"), b"\x02\x15")
    write(tmp_path / "q", addx(b"d"))
    j = journal(tmp_path, clock)
    with pytest.raises(JournalReplayError, match="q.100 is corrupt at offset 22"):
        j.replay(QueueConfig())
    j.close()


def test_unreadable_archive_refuses_replay(tmp_path, clock, monkeypatch):
    import lanner.storage.journal.replay as R
    write(tmp_path / "q.100", addx(b"a"))
    write(tmp_path / "q", addx(b"b"))
    real = R.Cursor

    def cursor(path, *a, **kw):
        if path.endswith("q.100"):
            raise PermissionError(13, "Permission denied")
        return real(path, *a, **kw)
    monkeypatch.setattr(R, "Cursor", cursor)
    j = journal(tmp_path, clock)
    with pytest.raises(JournalReplayError, match=r"cannot read journal .*q\.100 \(Permission denied\)"):
        j.replay(QueueConfig())
    j.close()


def test_legacy_opcodes(tmp_path, clock):
    legacy_add = b"\x00" + struct.pack("<ii", 4 + 3, 2_000_000_000) + b"old"
    add_xid = b"\x07" + struct.pack("<I", 77) + addx(b"ax")[1:]
    save_xid = struct.pack("<BI", 4, 40)
    write(tmp_path / "q", legacy_add, add_xid, addx(b"third"), save_xid, b"\x03")
    st = replay_files(tmp_path, clock)
    # REMOVE_TENTATIVE reserves the head under xid 0, and the counter becomes 0
    assert st.open_transactions == {0: QItem(clock.now_ms(), 2_000_000_000_000, b"old", xid=0)}
    assert [i.data for i in st.items] == [b"ax", b"third"]
    assert st.xid_counter == 0 and st.replayed_adds == 3 and st.total_items == 2
    assert st.items[0].xid == 0


def test_save_xid_sets_counter_and_unknown_xids_are_ignored(tmp_path, clock):
    write(tmp_path / "q", addx(b"a"), struct.pack("<BI", 4, 40), encode_unremove(5), encode_confirm(6), b"\x01",
          b"\x01", encode_open(9))
    st = replay_files(tmp_path, clock)
    assert st.xid_counter == 9 and st.total_items == 0 and st.open_transactions == {}


def test_continue_confirms_and_appends(tmp_path, clock):
    j = journal(tmp_path, clock)
    j.replay(QueueConfig())
    a = QItem(T, 0, b"a")
    j.record_add(a)
    j.record_open(a, 1)
    j.record_continue(1, QItem(T, 0, b"a2"))
    j.close()
    st = replay_files(tmp_path, clock)
    assert st.open_transactions == {} and [i.data for i in st.items] == [b"a2"] and st.replayed_adds == 2


def test_restart_rolls_back_open_transactions_lowest_xid_first(tmp_path, clock):
    q = FakeQueue(journal(tmp_path, clock), QueueConfig(), clock)
    q.replay()
    for d in (b"a", b"b", b"c", b"d"):
        q.add(d)
    x1 = q.remove(True).xid
    x2 = q.remove(True).xid
    q.confirm(x1)
    q.remove(True)
    q = restart(tmp_path, clock, q)
    assert sorted(q.replayed.open_transactions) == [2, 3] and q.replayed.xid_counter == 3
    assert q.xid == 3
    assert q.drain() == [b"b", b"c", b"d"]
    assert x2 == 2


def test_pack_file_beside_archives_is_installed_at_replay(tmp_path, clock):
    write(tmp_path / "q.100", addx(b"stale"))
    write(tmp_path / "q.200.pack", addx(b"p1"), addx(b"p2"))
    write(tmp_path / "q.300", b"\x01", addx(b"x"))
    write(tmp_path / "q", addx(b"y"))
    st = replay_files(tmp_path, clock)
    assert sorted(os.listdir(tmp_path)) == ["q", "q.200", "q.300"]
    assert [i.data for i in st.items] == [b"p2", b"x", b"y"]


def test_progress_callback(tmp_path, clock, monkeypatch):
    import lanner.storage.journal.replay as R
    monkeypatch.setattr(R, "PROGRESS_STEP", 100)
    write(tmp_path / "q.1", *[addx(b"x" * 50)] * 4)
    write(tmp_path / "q", *[addx(b"y" * 50)] * 4)
    j = journal(tmp_path, clock)
    seen = []
    j.replay(QueueConfig(), progress=lambda done, total: seen.append((done, total)))
    assert seen[-1] == (568, 568) and len(seen) >= 4
    assert all(a <= b for (a, _), (b, _) in zip(seen, seen[1:]))


# ---------------------------------------------------------------- rotation and rewrite (§6.4)

def test_rotate_logs_worked_example(tmp_path, clock):
    """ServerSpec "rotate logs": maxJournalSize 16 KiB, 8192-byte items."""
    cfg = QueueConfig(max_journal_size=16 * 1024)
    q = FakeQueue(journal(tmp_path, clock), cfg, clock)
    q.replay()
    q.add(b"x" * 8192)
    assert q.storage.logsize == 8213
    q.remove()
    assert q.storage.logsize == 8214
    q.add(b"y" * 8192)
    assert q.storage.logsize == 16427
    q.remove()
    q.storage.flush()
    assert q.storage.logsize == 0 and q.storage.rewrites == 1
    assert os.listdir(tmp_path) == ["q"] and (tmp_path / "q").stat().st_size == 0


def test_empty_queue_rewrite_rule_runs_on_add_too(tmp_path, clock):
    """§9 #35: an add into an empty queue with a big journal compacts it first."""
    cfg = QueueConfig(default_journal_size=100, min_journal_compact_delay=None)
    q = FakeQueue(journal(tmp_path, clock), cfg, clock)
    q.replay()
    q.add(b"a" * 70)
    q.confirm(q.remove(True).xid)       # confirms run no check
    assert q.storage.rewrites == 0 and q.storage.logsize == 101
    q.add(b"b")
    q.storage.flush()
    assert q.storage.rewrites == 1 and (tmp_path / "q").stat().st_size == 22


def test_rewrite_writes_open_transactions_descending_then_queue(tmp_path, clock):
    cfg = QueueConfig(max_journal_size=150)
    q = FakeQueue(journal(tmp_path, clock), cfg, clock)
    q.replay()
    for d in (b"a", b"b", b"c", b"d"):
        q.add(d)
    q.remove(True)
    q.remove(True)
    q.add(b"e" * 60)
    assert q.storage.rewrites == 0
    q.remove()                        # c: journal is now > 150 bytes
    assert q.storage.rewrites == 1
    q.storage.flush()
    recs = [(r.opcode, r.item.data if r.item else r.xid) for _, r in read_records(str(tmp_path / "q"))]
    assert recs == [(2, b"b"), (9, 2), (2, b"a"), (9, 1), (2, b"d"), (2, b"e" * 60)]
    assert os.listdir(tmp_path) == ["q"]


def test_xids_after_rewrite_restart(tmp_path, clock):
    """§9 #34: with open transactions the counter comes back as the smallest open
    xid; with none, xids restart at 1."""
    cfg = QueueConfig(min_journal_compact_delay=None)
    q = FakeQueue(journal(tmp_path, clock), cfg, clock)
    q.replay()
    for d in (b"a", b"b", b"c", b"d", b"e"):
        q.add(d)
    for _ in range(4):
        q.remove(True)                  # xids 1..4
    q.confirm(1)
    q.confirm(3)
    q.config = replace(q.config, max_journal_size=100)
    q.add(b"z" * 80)                    # 140 bytes > 100: rewrite first
    assert q.storage.rewrites == 1
    q = restart(tmp_path, clock, q)
    assert q.replayed.xid_counter == 2 and sorted(q.replayed.open_transactions) == [2, 4]
    assert q.drain() == [b"b", b"d", b"e", b"z" * 80]      # rewriting as it empties
    assert q.storage.logsize == 0
    q = restart(tmp_path, clock, q)
    assert q.replayed.xid_counter == 0
    q.add(b"n")
    assert q.remove(True).xid == 1


def test_compaction_is_rate_limited_by_min_journal_compact_delay(tmp_path):
    clock = FakeClock(T)
    cfg = QueueConfig(max_journal_size=100, min_journal_compact_delay=60_000)
    q = FakeQueue(journal(tmp_path, clock), cfg, clock)
    q.replay()
    q.add(b"a" * 60)
    q.add(b"b" * 60)
    assert q.storage.rewrites == 0
    q.add(b"c" * 60)                    # 162 bytes > 100 and everything in memory
    assert q.storage.rewrites == 1
    for _ in range(3):
        q.add(b"c" * 60)
    assert q.storage.rewrites == 1
    clock.advance(60_000)
    q.add(b"d")
    assert q.storage.rewrites == 2


def test_rotation_when_current_file_exceeds_max_memory_size(tmp_path, clock):
    cfg = QueueConfig(max_memory_size=100, max_journal_size=1 << 20)
    q = FakeQueue(journal(tmp_path, clock), cfg, clock)
    q.replay()
    for i in range(6):
        q.add(b"%d" % i * 40)
        clock.advance(1)
    j = q.storage
    assert j.rotations == 2 and len(archived_files(str(tmp_path), "q")) == 2
    assert j.archived_size == 4 * 61 and j.logsize == 2 * 61
    assert j.in_read_behind
    q.storage.flush()
    q2 = restart(tmp_path, clock, q)
    assert q2.drain() == [b"%d" % i * 40 for i in range(6)]


def test_disable_aggressive_rewrites(tmp_path, clock):
    cfg = QueueConfig(default_journal_size=100, max_memory_size=1000, disable_aggressive_rewrites=True,
              min_journal_compact_delay=60_000)
    q = FakeQueue(journal(tmp_path, clock), cfg, clock)
    q.replay()
    q.add(b"a" * 50)
    q.add(b"b" * 50)
    q.remove(True)
    q.remove(True)                    # empty and >= 100: rule 1 rewrites the two open items...
    assert q.storage.rewrites == 1 and q.storage.logsize == 2 * 76
    q.add(b"c")                       # ...but that left >= 100 / 2, so rule 1 is now rate-limited
    q.remove()
    assert q.storage.rewrites == 1 and q.storage.logsize == 2 * 76 + 23
    q.config = replace(q.config, max_memory_size=150)
    q.add(b"d")                       # rule 3 rewrites the empty queue, and still rotates
    assert q.storage.rewrites == 2 and q.storage.rotations == 1
    assert q.storage.logsize == 22 and q.storage.archived_size == 2 * 76
    q.storage.flush()
    q = restart(tmp_path, clock, q)
    assert q.drain() == [b"a" * 50, b"b" * 50, b"d"]


# ---------------------------------------------------------------- read-behind (§5.8)

def behind_by_12(tmp_path, clock) -> FakeQueue:
    """maxMemorySize 1 KB and twenty 128-byte items: items 0-7 in memory, 8 onward not."""
    q = FakeQueue(journal(tmp_path, clock), QueueConfig(max_memory_size=1024), clock)
    q.replay()
    for i in range(20):
        q.add(bytes([i]) * 128)
    return q


def test_read_behind_example(tmp_path, clock):
    """maxMemorySize 1 KB, 128-byte items: items 0-7 in memory, 8 onward not."""
    q = behind_by_12(tmp_path, clock)
    assert len(q.mem) == 8 and q.mem_bytes == 1024 and q.length == 20 and q.storage.in_read_behind
    assert q.remove().data == bytes([0]) * 128
    assert len(q.mem) == 8 and q.mem[-1].data == bytes([8]) * 128
    assert q.drain() == [bytes([i]) * 128 for i in range(1, 20)]
    assert not q.storage.in_read_behind


def test_replay_comes_up_in_read_behind(tmp_path, clock):
    q = behind_by_12(tmp_path, clock)
    for _ in range(3):
        q.remove()
    q.storage.flush()
    q = restart(tmp_path, clock, q)
    st = q.replayed
    assert st.read_behind and st.total_items == 17 and st.total_bytes == 17 * 128
    assert [i.data[0] for i in st.items] == list(range(3, 11))
    assert q.drain() == [bytes([i]) * 128 for i in range(3, 20)]


def test_replay_with_removes_while_in_read_behind(tmp_path, clock):
    """Removes in the journal after read-behind started refill memory from the
    reader, which follows the replay and leaves read-behind when it catches up."""
    write(tmp_path / "q", *[addx(bytes([i]) * 10) for i in range(5)], b"\x01" * 4, addx(b"late"))
    st = replay_files(tmp_path, clock, QueueConfig(max_memory_size=20))
    assert not st.read_behind
    assert [i.data for i in st.items] == [bytes([4]) * 10, b"late"]


def test_unremove_during_replay_in_read_behind_goes_to_memory(tmp_path, clock):
    write(tmp_path / "q", addx(b"a" * 10), encode_open(1), addx(b"b" * 10), addx(b"c" * 10), addx(b"d" * 10),
          encode_unremove(1))
    st = replay_files(tmp_path, clock, QueueConfig(max_memory_size=15))
    assert st.read_behind and [i.data for i in st.items] == [b"a" * 10, b"b" * 10, b"c" * 10]
    assert st.total_items == 4 and st.total_bytes == 40


def test_read_behind_across_rotations_and_checkpoint_pack(tmp_path, clock):
    cfg = QueueConfig(max_memory_size=200, max_journal_size=600, min_journal_compact_delay=None)
    q = FakeQueue(journal(tmp_path, clock), cfg, clock)
    q.replay()
    sent = [b"%03d" % i * 10 for i in range(40)]
    for d in sent:
        q.add(d)
        clock.advance(1)
    j = q.storage
    assert j.in_read_behind and j.rotations >= 4 and j.checkpoint is not None
    files_before = archived_files(str(tmp_path), "q")
    got = [q.remove().data for _ in range(10)]
    assert got == sent[:10]
    assert j.checkpoint is None                      # the reader left the checkpoint file: packed inline
    assert archived_files(str(tmp_path), "q") != files_before
    q.storage.flush()
    q2 = restart(tmp_path, clock, q)
    assert q2.drain() == sent[10:]
    assert not q2.storage.in_read_behind


def test_pack_due_and_pack_done_for_the_cleaner(tmp_path, clock):
    cfg = QueueConfig(max_memory_size=200, max_journal_size=600, min_journal_compact_delay=None)
    q = FakeQueue(journal(tmp_path, clock, inline_pack=False), cfg, clock)
    q.replay()
    sent = [b"%03d" % i * 10 for i in range(40)]
    for d in sent:
        q.add(d)
        clock.advance(1)
    x = q.remove(True).xid
    j = q.storage
    assert j.checkpoint is not None and j.pack_due() is None   # the reader is inside the checkpointed files
    removed = 1
    while (req := j.pack_due()) is None:
        assert q.remove().data == sent[removed]
        removed += 1
        assert removed < 40
    assert j.pack_due() is None                      # one at a time
    # the checkpoint was taken before xid x was opened: its RSV is in a later file
    assert req.files[-1].endswith(os.sep + req.checkpoint_file) and req.open_xids == []
    assert os.path.basename(req.out_path).startswith("q~~")
    for _ in range(3):                               # the live writer goes on meanwhile
        q.add(b"more")
        q.remove()
    q.confirm(x)
    result = pack_files(req.files, req.out_path, req.open_xids, now_ms=clock.now_ms())
    assert result.open_xids == [] and result.items > 0
    j.pack_done(result)
    names = archived_files(str(tmp_path), "q")
    assert names[0] == req.checkpoint_file and not any("~~" in n for n in os.listdir(tmp_path))
    assert j.checkpoint is None
    q.storage.flush()
    q2 = restart(tmp_path, clock, q)
    assert q2.drain() == sent[removed + 3:] + [b"more"] * 3


def test_failed_pack_is_asked_for_again(tmp_path, clock):
    cfg = QueueConfig(max_memory_size=10 ** 6, max_journal_size=300, min_journal_compact_delay=60_000)
    q = FakeQueue(journal(tmp_path, clock, inline_pack=False), cfg, clock)
    q.replay()
    q.add(b"a" * 200)
    q.add(b"b" * 200)                  # compaction (then rate-limited)
    q.config = replace(q.config, max_memory_size=100)          # now rotations happen and set a checkpoint
    q.add(b"c" * 200)
    assert q.storage.checkpoint is not None
    req = q.storage.pack_due()
    assert req is not None and os.path.exists(req.out_path)
    q.storage.pack_done(None)
    assert not os.path.exists(req.out_path) and q.storage.checkpoint is not None
    req = q.storage.pack_due()
    q.storage.pack_done(pack_files(req.files, req.out_path, req.open_xids, now_ms=T))
    assert q.storage.checkpoint is None
    q.storage.flush()
    assert restart(tmp_path, clock, q).drain() == [b"a" * 200, b"b" * 200, b"c" * 200]


def test_rewrite_waits_for_an_outstanding_pack(tmp_path, clock):
    cfg = QueueConfig(max_memory_size=100, max_journal_size=300, min_journal_compact_delay=None)
    q = FakeQueue(journal(tmp_path, clock, inline_pack=False), cfg, clock)
    q.replay()
    q.config = replace(q.config, max_memory_size=10 ** 6)
    q.add(b"a" * 150)
    q.add(b"b" * 150)
    q.config = replace(q.config, max_memory_size=100)
    q.add(b"c" * 150)                  # rotation with checkpoint (bytes >= max memory: no rewrite)
    req = q.storage.pack_due()
    assert req is not None
    q.config = replace(q.config, max_memory_size=10 ** 6)
    q.add(b"d")                        # rule 2 would rewrite now, but a pack is in flight
    assert q.storage.rewrites == 0
    q.storage.pack_done(pack_files(req.files, req.out_path, now_ms=T))
    q.add(b"e")                        # c, d, e are still only on disk: no rewrite from memory
    assert q.storage.rewrites == 0 and q.storage.in_read_behind
    assert q.remove().data == b"a" * 150   # memory refills, read-behind ends, rule 2 rewrites
    assert q.storage.rewrites == 1 and not q.storage.in_read_behind
    assert os.listdir(tmp_path) == ["q"]
    q.storage.flush()
    assert restart(tmp_path, clock, q).drain() == [b"b" * 150, b"c" * 150, b"d", b"e"]


def test_erase_with_outstanding_pack_drops_the_result(tmp_path, clock):
    cfg = QueueConfig(max_memory_size=50, max_journal_size=100, min_journal_compact_delay=60_000)
    q = FakeQueue(journal(tmp_path, clock, inline_pack=False), cfg, clock)
    q.replay()
    q.config = replace(q.config, max_memory_size=10 ** 6)
    q.add(b"a" * 80)
    q.add(b"b" * 80)                   # compacting rewrite, then rate-limited
    q.config = replace(q.config, max_memory_size=50)
    q.add(b"c" * 80)
    req = q.storage.pack_due()
    result = pack_files(req.files, req.out_path, now_ms=T)
    q.storage.erase()
    q.storage.pack_done(result)
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------- model-based: read-behind == no read-behind

class JournalMachine(RuleBasedStateMachine):
    """Random adds/removes/transactions/restarts against a plain model, with tiny
    limits so that read-behind, rotations, checkpoints, packs and rewrites all
    happen; the queue must behave as if everything were in memory."""

    def __init__(self):
        super().__init__()
        import tempfile
        self.dir = tempfile.mkdtemp(prefix="lanner-jm-")
        self.clock = FakeClock(T)
        self.cfg = QueueConfig(max_memory_size=120, max_journal_size=500, default_journal_size=300,
                       min_journal_compact_delay=300)
        self.inline = True
        self.q = FakeQueue(Journal(self.dir, "q", self.clock, inline_pack=self.inline), self.cfg, self.clock)
        self.q.replay()
        self.model: deque[bytes] = deque()
        self.opened: dict[int, bytes] = {}
        self.n = 0

    def teardown(self):
        import shutil
        self.q.storage.close()
        shutil.rmtree(self.dir)

    @rule(size=st.integers(0, 50))
    def add(self, size):
        self.n += 1
        data = b"%d:" % self.n + b"x" * size if size else b""
        self.q.add(data)
        self.model.append(data)

    @rule(transactional=st.booleans())
    def remove(self, transactional):
        item = self.q.remove(transactional)
        if not self.model:
            assert item is None
            return
        assert item is not None and item.data == self.model.popleft()
        if transactional:
            self.opened[item.xid] = item.data

    @precondition(lambda self: self.opened)
    @rule(abort=st.booleans(), pick=st.integers(0, 10))
    def finish(self, abort, pick):
        xid = sorted(self.opened)[pick % len(self.opened)]
        data = self.opened.pop(xid)
        if abort:
            self.q.unremove(xid)
            self.model.appendleft(data)
        else:
            self.q.confirm(xid)

    @rule(ms=st.integers(0, 30))
    def tick(self, ms):
        self.clock.advance(ms)

    @rule()
    def pack_for_cleaner(self):
        j = self.q.storage
        req = j.pack_due()
        if req is not None:
            j.pack_done(pack_files(req.files, req.out_path, req.open_xids, now_ms=self.clock.now_ms()))

    @rule(inline=st.booleans())
    def restart(self, inline):
        j = self.q.storage
        j.close()
        self.q = FakeQueue(Journal(self.dir, "q", self.clock, inline_pack=inline), self.cfg, self.clock)
        self.q.replay()
        for xid in sorted(self.opened, reverse=True):
            self.model.appendleft(self.opened.pop(xid))

    @invariant()
    def counts_match(self):
        assert self.q.length == len(self.model)
        assert self.q.size_bytes == sum(map(len, self.model))
        assert {x: i.data for x, i in self.q.opened.items()} == self.opened
        assert [i.data for i in self.q.mem] == list(self.model)[:len(self.q.mem)]
        if not self.q.storage.in_read_behind:
            assert len(self.q.mem) == len(self.model)


TestJournalMachine = JournalMachine.TestCase
TestJournalMachine.settings = settings(max_examples=80, stateful_step_count=60, deadline=None,
                                       suppress_health_check=[HealthCheck.too_slow])


def test_a_new_queue_says_it_is_new(tmp_path, clock, caplog):
    """Issue 12: creating a queue at runtime used to log `replayed 1 files, 0 bytes`."""
    with caplog.at_level(logging.INFO, logger="lanner.storage.journal.journal"):
        replay_files(tmp_path, clock)
    assert f"queue 'q': new queue, journal {tmp_path / 'q'} created" in caplog.text
    assert "replayed" not in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="lanner.storage.journal.journal"):
        replay_files(tmp_path, clock)
    assert "queue 'q': replayed 1 files, 0 bytes: 0 items" in caplog.text
