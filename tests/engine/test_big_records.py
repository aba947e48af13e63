"""A big item's ADDX is written from the item's own bytes by the writer thread, never copied into
the journal's buffer (journal.py `_add_behind`, issue 8 P8: the 8 MiB copy was a sixth of the
flood worker's loop); behind a write under way it is chained, not copied.  The file holds exactly
the bytes the copying path writes, replays to what was set, and a failed write puts back its
records and those chained after it.  In-process, the writer thread's writes injected."""
from __future__ import annotations

import errno
import os
import threading

import pytest

from lanner.config import QueueConfig
from lanner.queues.item import QItem
from lanner.storage import writer as W
from lanner.storage.journal.codec import encode_add, encode_continue
from lanner.storage.journal.files import JournalError
from lanner.storage.journal.journal import BIG_RECORD, Journal

T = 1_700_000_000_000
BIG1 = QItem(T, 0, b"a" * BIG_RECORD)
BIG2 = QItem(T + 1, T + 9_000, bytes(range(256)) * (BIG_RECORD // 256 + 3))
SMALL = QItem(T + 2, 0, b"small")


@pytest.fixture
def writes(monkeypatch):
    """The writer thread's writes: each buffer object it was handed, held at `gate` until the
    test opens it; `fail` makes the write calls whose number is in it fail with ENOSPC."""
    gate = threading.Event()
    seen: list = []
    fail: set[int] = set()

    def write(fd, view):
        assert gate.wait(10), "the test never opened the gate"
        seen.append(view.obj if isinstance(view, memoryview) else view)
        if len(seen) in fail:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return os.write(fd, view)
    monkeypatch.setattr(W, "_write", write)
    return gate, seen, fail


def opened(path, clock, writer=None) -> Journal:
    os.makedirs(path, exist_ok=True)
    j = Journal(str(path), "q", clock)
    j.replay(QueueConfig())
    j.writer = writer
    return j


def record_all(j: Journal) -> list[int]:
    """small add, big add, remove, big add (behind the first: chained), small add."""
    return [j.record_add(SMALL), j.record_add(BIG1), j.record_remove(SMALL), j.record_add(BIG2),
            j.record_add(SMALL)]


def copied(tmp_path, clock) -> bytes:
    """What the copying path (no writer) writes for the same records (once per test)."""
    j = opened(tmp_path / "copy", clock)
    record_all(j)
    j.close()
    return (tmp_path / "copy" / "q").read_bytes()


def test_big_items_are_written_from_their_own_bytes_same_bytes_as_the_copy(tmp_path, clock, writer, writes):
    gate, seen, _ = writes
    j = opened(tmp_path / "d", clock, writer)
    marks = record_all(j)
    assert len(j._chain) == 2                        # the second big item was chained, not buffered
    assert j.pending_bytes == 21 + 5                 # only the last small ADDX is buffered
    gate.set()
    j.settle_write()
    j.close()
    want = copied(tmp_path, clock)
    assert (tmp_path / "d" / "q").read_bytes() == want
    assert any(o is BIG1.data for o in seen) and any(o is BIG2.data for o in seen)
    big1 = 21 + len(BIG1.data)
    assert marks == [0, 26, 26 + big1, 27 + big1, 27 + big1 + 21 + len(BIG2.data)]
    j2 = opened(tmp_path / "d", clock)
    st = j2.replay(QueueConfig())
    j2.close()
    assert [(i.add_time, i.expiry, i.data) for i in st.items] == \
        [(i.add_time, i.expiry, i.data) for i in (BIG1, BIG2, SMALL)]


@pytest.mark.parametrize("failing", [1, 3], ids=["the first write", "the chained write"])
def test_a_failed_write_puts_back_its_records_and_the_chained_ones(tmp_path, clock, writer, writes, failing):
    """Write calls: 1 the first job's buffer (small ADDX + head), 2 BIG1's bytes, 3 the chained
    job's buffer (REMOVE + head), 4 BIG2's bytes.  Whatever fails, the file is cut back to the
    end of the last good job, the rest is buffered again, and a retry writes the same file as
    the copying path."""
    gate, seen, fail = writes
    want = copied(tmp_path, clock)
    j = opened(tmp_path / "d", clock, writer)
    record_all(j)
    fail.add(failing)
    gate.set()
    with pytest.raises(JournalError, match="No space left on device"):
        j.settle_write()
    good = 0 if failing == 1 else 26 + 21 + len(BIG1.data)
    assert os.path.getsize(tmp_path / "d" / "q") == good
    assert j.flushed_size == good and j.logsize == len(want)
    assert len(seen) == (1 if failing == 1 else 3)   # nothing was written behind the failure
    fail.clear()
    j.flush()
    j.close()
    assert (tmp_path / "d" / "q").read_bytes() == want


def test_a_rollback_into_a_chained_write_drops_it_and_what_follows(tmp_path, clock, writer, writes):
    gate, _, _ = writes
    j = opened(tmp_path / "d", clock, writer)
    marks = record_all(j)
    gate.set()
    j.rollback(marks[3])                             # the second big ADDX and the small one after it
    j.close()
    want = copied(tmp_path, clock)
    assert (tmp_path / "d" / "q").read_bytes() == want[:marks[3]]


def test_without_a_writer_or_for_a_mutable_body_the_record_is_copied(tmp_path, clock, writer):
    j = opened(tmp_path / "d", clock)
    j.record_add(BIG1)
    assert j.pending_bytes == 21 + len(BIG1.data) and not j._chain
    j.flush()
    j.writer = writer
    j.record_add(QItem(T, 0, bytearray(BIG1.data)))  # could change under the thread: copied
    assert j.pending_bytes == 21 + len(BIG1.data) and not j._chain
    j.close()


def test_a_write_is_done_before_its_write_out_which_runs_on_a_duplicate_fd(tmp_path, clock, writer, monkeypatch):
    """issue 8: waiting for the disk before saying the write was done made every reply behind a
    big record (a small set on the flood's own queue) wait for the disk; the owner may close
    its fd once told, so the write-out waits on a duplicate."""
    gate, entered, fds = threading.Event(), threading.Event(), []

    def sync_file_range(fd, off, n, flags):
        fds.append(fd)
        entered.set()
        assert gate.wait(10)
        return 0
    monkeypatch.setattr(W, "_sync_file_range", sync_file_range)
    j = opened(tmp_path / "d", clock, writer)
    j.record_add(BIG1)
    job = j._inflight
    assert entered.wait(10) and job.done.wait(5)     # done while the write-out is held
    own = j._fd
    j.settle_write()
    j.close()                                        # closes its fd under the write-out
    assert fds and fds[0] != own
    gate.set()
    writer.run(lambda: None).wait()
    assert (tmp_path / "d" / "q").read_bytes() == encode_add(BIG1)


def test_a_big_continue_is_written_from_the_item_own_bytes(tmp_path, clock, writer, writes):
    """CONTINUE (confirm + add of a big item) takes the ADDX's path: the item's `bytes` go to the
    thread as they are (they were copied into the buffer), and the file holds the same record."""
    gate, seen, _ = writes
    gate.set()
    j = opened(tmp_path / "j", clock, writer)
    j.record_continue(5, BIG2)
    j.settle_write()
    assert any(b is BIG2.data for b in seen)
    j.close()
    assert (tmp_path / "j" / "q").read_bytes() == encode_continue(5, BIG2)


def test_every_record_mark_is_where_its_bytes_land_through_behind_writes_failures_rollbacks_and_rotation(
        tmp_path, clock, writer, writes):
    """A record's mark is its byte's position in the queue's whole journal (archives first): the
    journal keeps the buffer's first mark (`_origin`) rather than adding up the file's base, its
    size and the bytes under way per record; whatever moves one of those, writes behind that
    finish or fail, a rollback, a rotation, the next record's mark is still the end of all the
    bytes before it."""
    gate, _, fail = writes
    j = opened(tmp_path / "d", clock, writer)

    def end() -> int:
        """Where the next record goes: every journal byte so far (archives, file, under way, buffer)."""
        archived = sum(os.path.getsize(tmp_path / "d" / n) for n in os.listdir(tmp_path / "d") if n != "q")
        return archived + j.logsize

    def check() -> None:
        want = end()
        assert j.record_remove(SMALL) == want
        assert j.record_add(SMALL) == want + 1
    check()
    assert j.write_behind()              # the buffer handed to the thread
    check()
    record_all(j)                        # two more writes behind, chained, under way
    check()
    fail.add(1)
    gate.set()
    with pytest.raises(JournalError):
        j.settle_write()                 # the file cut back, every record buffered again
    check()
    j.flush()
    check()
    mark = j.record_add(BIG1)            # behind again
    j.rollback(mark)
    check()
    j.flush()
    j._rotate(None, False)               # a new file: marks go on from the archive's end
    assert os.listdir(tmp_path / "d") != ["q"]
    check()
    j.record_add(BIG2)
    j.settle_write()
    check()
    j.close()
