"""expire_to_queue moves to another worker's queue, held open in the source queue's journal
(server/moves.py): what the source's storage does with them, in one process, with real
journal files.  The move leaves through `expire_forward` (the worker's `forward_add`); the
target's acknowledgement is `confirm_move`."""
from __future__ import annotations

import errno
import logging
import socket

import pytest

from lanner.clock import FakeClock
from lanner.config import Config, QueueConfig, ServerConfig
from lanner.ipc import control
from lanner.queues.collection import QueueCollection
from lanner.storage.factory import StorageFactory
from lanner.storage.journal import journal as J
from lanner.storage.cmdlog.replay import Replayer, replay_directory
from lanner.storage.journal.packer import pack_files

NOW = 1_795_000_000_000


class Source:
    """A worker's collection that owns every queue but "far", the target of "src" (and of
    "big"); what it forwards is in `sent`, as (target, data, now, source queue, xid)."""

    def __init__(self, tmp_path, clock, cleaner=None, **src) -> None:
        self.cfg = Config(server=ServerConfig(queue_path=str(tmp_path / "q")), default=QueueConfig(),
                          queue_overrides={"src": {"expire_to_queue": "far", **src},
                                           "big": {"expire_to_queue": "far", "max_memory_size": 1024,
                                                   "max_journal_size": 4096}},
                          aliases={})
        self.sent: list[tuple] = []
        self.factory = StorageFactory(self.cfg, clock, 0, 1, cleaner_sock=cleaner)
        self.coll = QueueCollection(self.cfg, clock, storage_factory=self.factory, owns=lambda n: n != "far",
                                    expire_forward=lambda *a: self.sent.append(a))
        self.factory.collection = self.coll
        self.coll.load()

    def datas(self, name: str) -> list[bytes]:
        return [i.data for i in self.coll.queue(name).memory_items()]


@pytest.fixture
def clock():
    return FakeClock(NOW)


def expire_one(s: Source, clock, name: str = "src", data: bytes = b"moving") -> tuple:
    """Add `data` to `name` expiring at once, sweep it: returns what was forwarded."""
    s.coll.add(name, data, clock.now_ms() + 1)
    clock.advance(2)
    assert s.coll.flush_all_expired() == 1
    return s.sent.pop()


@pytest.mark.parametrize("storage", ["journal", "cmdlog"])
def test_an_open_move_is_replayed_into_its_source_and_moved_again(tmp_path, clock, storage):
    """The source stops (or dies) before the target acknowledged: its storage holds the item as
    an open read, replay puts it back and the next sweep moves it again.  Before, the sweep
    logged a plain remove and the item was gone from the source's journal; a command log kept
    the read open, but its replay drops a job past its TTL, as this one is."""
    s = Source(tmp_path, clock, storage=storage)
    target, data, _, q, xid = expire_one(s, clock)
    assert (target, data, q.moves_open) == ("far", b"moving", 1) and xid
    s.coll.close()
    clock.advance(1000)

    s = Source(tmp_path, clock, storage=storage)
    q = s.coll.queue("src")
    assert q.length == 1 and q.moves_open == 0          # rolled back into the queue
    assert s.coll.flush_all_expired() == 1              # still expired: it moves again
    target, data, _, source, xid = s.sent.pop()
    assert (target, data, source) == ("far", b"moving", q)
    assert s.coll.confirm_move(q, xid)                  # the target acknowledged it this time
    s.coll.close()

    s = Source(tmp_path, clock, storage=storage)
    assert s.coll.queue("src").length == 0
    assert s.coll.flush_all_expired() == 0 and s.sent == []
    s.coll.close()


def test_an_open_move_is_not_a_clients_read(tmp_path, clock):
    """Stats count client reads only, no client can read, confirm or abort the moving item, and
    client reads get xids of their own."""
    s = Source(tmp_path, clock)
    *_, q, xid = expire_one(s, clock)
    s.coll.add("src", b"next")
    st = dict(s.coll.queue_stats("src"))
    assert (st["items"], st["open_transactions"], st["expired_items"]) == ("1", "0", "1")
    assert not s.coll.confirm_remove("src", xid) and not s.coll.unremove("src", xid)
    item = s.coll.remove("src", transactional=True)
    assert item.data == b"next" and item.xid != xid
    assert s.coll.remove("src", transactional=True) is None
    assert dict(s.coll.queue_stats("src"))["open_transactions"] == "1"
    assert q.moves_open == 1
    s.coll.close()


def test_a_rewrite_carries_an_open_move(tmp_path, clock):
    """The queue empties and its journal is rewritten (§6.4) while a move is open: the dump
    keeps it open, so a restart still brings it back."""
    s = Source(tmp_path, clock, default_journal_size=1024)
    *_, q, xid = expire_one(s, clock)
    for i in range(20):
        s.coll.add("src", b"%02d" % i + b"." * 98)
    for i in range(20):
        assert s.coll.remove("src").data[:2] == b"%02d" % i
    assert q.storage.rewrites == 1
    s.coll.close()

    s = Source(tmp_path, clock)
    assert s.datas("src") == [b"moving"]
    s.coll.close()


def test_a_checkpoint_pack_carries_an_open_move(tmp_path, clock, caplog):
    """A move opened before a checkpoint: the checkpoint's snapshot of open reads includes it
    (the cleaner's pack would otherwise warn that the files disagree) and the pack keeps it
    open."""
    mine, cleaner = socket.socketpair()
    s = Source(tmp_path, clock, cleaner=mine)
    *_, q, xid = expire_one(s, clock, "big")
    for i in range(200):
        s.coll.add("big", b"%03d" % i + b"." * 197)
    big = q.storage
    assert big.medium.checkpoint is not None and big.medium.checkpoint.open_xids == [xid]
    for i in range(60):                             # the reader leaves the checkpoint's files
        assert s.coll.remove("big").data[:3] == b"%03d" % i
    clock.advance(100)
    s.factory.tick(clock.now_ms())
    [req] = control.Reader(cleaner).read()
    with caplog.at_level(logging.WARNING):
        result = pack_files(req["files"], req["out"], req["open_xids"], now_ms=clock.now_ms())
    assert result.open_xids == [xid] and "the files win" not in caplog.text
    s.factory.on_cleaner_reply({"cmd": "packed", "id": req["id"], "ok": True, "out_path": result.out_path})
    assert big.medium.checkpoint is None
    s.coll.close()
    mine.close()
    cleaner.close()

    s = Source(tmp_path, clock)
    assert s.datas("big")[0] == b"moving" and s.coll.queue("big").length == 141
    assert s.coll.remove("big").data[:3] == b"060"     # the sweep moves it again
    assert [m[1] for m in s.sent] == [b"moving"]
    s.coll.close()


def no_job_left(q) -> bool:
    """For a command-log queue: its partition's log, replayed as if nothing had expired yet,
    leaves no job (every add it wrote was deleted or completed); True for a journal."""
    if q.medium is q.storage:
        return True
    r = Replayer(0)
    replay_directory(q.medium.dir, r)
    return not r.jobs


def gone_after_a_restart(s, q, tmp_path, clock, storage: str) -> None:
    """Close source `s`: no job is left in `q`'s log, and a restart finds `src` empty."""
    s.coll.close()
    assert no_job_left(q)
    s = Source(tmp_path, clock, storage=storage)
    assert s.coll.queue("src").length == 0
    s.coll.close()


def write_fails(monkeypatch, q) -> None:
    """Every write of `q`'s storage fails (disk full) until monkeypatch.undo()."""
    def enospc(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")
    if q.medium is q.storage:
        monkeypatch.setattr(J, "_write", enospc)
    else:                                   # a command log's partition
        monkeypatch.setattr(q.medium, "_write", enospc)


@pytest.mark.parametrize("storage", ["journal", "cmdlog"])
def test_a_move_whose_open_record_is_lost_goes_back_to_its_source(tmp_path, clock, monkeypatch, storage):
    """The source's write of the open move fails: the item is back at the head of the source
    (moved again by a later sweep: at least once), and the target's late acknowledgement
    confirms nothing.  The storage's own bookkeeping is back too: the later move and its
    confirm leave nothing after a restart."""
    s = Source(tmp_path, clock, storage=storage)
    s.coll.add("src", b"moving", clock.now_ms() + 1)
    clock.advance(2)
    q = s.coll.queue("src")
    write_fails(monkeypatch, q)
    with pytest.raises(OSError):
        s.coll.flush_all_expired()
    monkeypatch.undo()
    *_, source, xid = s.sent.pop()
    assert source is q and q.length == 1 and q.moves_open == 0
    assert not s.coll.confirm_move(q, xid)
    assert s.coll.flush_all_expired() == 1
    *_, data, _, _, xid = s.sent.pop()
    assert data == b"moving" and s.coll.confirm_move(q, xid)
    gone_after_a_restart(s, q, tmp_path, clock, storage)


@pytest.mark.parametrize("storage", ["journal", "cmdlog"])
def test_a_move_whose_confirm_is_lost_is_confirmed_again(tmp_path, clock, monkeypatch, storage):
    """The write of a move's confirm fails: the move is open again and stranded, and the retry
    of stranded reads writes the confirm (the target has the item: no second move)."""
    s = Source(tmp_path, clock, storage=storage)
    *_, q, xid = expire_one(s, clock)
    write_fails(monkeypatch, q)
    with pytest.raises(OSError):
        s.coll.confirm_move(q, xid)
    monkeypatch.undo()
    assert q.moves_open == 1 and s.coll.stranded == {"src": [xid]}
    assert s.coll.abort_stranded() == 1
    assert q.moves_open == 0 and q.length == 0
    gone_after_a_restart(s, q, tmp_path, clock, storage)


# -- deleting a source queue with open moves (queues/deletes.py) ----------------------------------
@pytest.mark.parametrize("storage", ["journal", "cmdlog"])
def test_a_deleted_source_keeps_its_open_moves_until_they_are_confirmed(tmp_path, clock, storage):
    """`delete src` while its expired item is on its way to `far`: the queue goes from every
    view, but its storage keeps the move open, so a restart before the target acknowledged it
    brings the item back (and it moves).  Before, the delete erased the journal: the item was
    only in the worker's memory, and lost with it."""
    s = Source(tmp_path, clock, storage=storage)
    *_, q, xid = expire_one(s, clock, data=b"moving")
    s.coll.add("src", b"queued")                        # deleted with the queue
    s.coll.delete("src")
    assert "src" not in s.coll.names() and s.coll.queue_stats("src") is None
    assert s.coll.stats()["queue_deletes"] == 1
    s.coll.close()                                     # (as a kill -9 would: never confirmed)

    s = Source(tmp_path, clock, storage=storage)
    assert s.datas("src") == [b"moving"]                # main: [] (the journal was erased)
    assert s.coll.flush_all_expired() == 1
    *_, q, xid = s.sent.pop()
    assert s.coll.confirm_move(q, xid)
    s.coll.close()


def test_a_deleted_source_is_erased_once_its_last_move_is_confirmed(tmp_path, clock):
    s = Source(tmp_path, clock)
    moves = [expire_one(s, clock, data=b"m%d" % i) for i in range(2)]
    s.coll.delete("src")
    path = tmp_path / "q" / "src"
    assert path.exists()
    assert s.coll.confirm_move(moves[0][3], moves[0][4]) and path.exists()
    assert s.coll.confirm_move(moves[1][3], moves[1][4])
    assert not path.exists() and "src" not in s.coll.names()
    s.coll.close()
    s = Source(tmp_path, clock)
    assert "src" not in s.coll.names()
    s.coll.close()


def test_a_deleted_source_named_again_is_the_same_queue_empty(tmp_path, clock):
    """Named before its moves are confirmed, the deleted queue comes back empty, with fresh
    figures, on the same storage (a second one on the same files would corrupt them)."""
    s = Source(tmp_path, clock)
    *_, q, xid = expire_one(s, clock, data=b"moving")
    s.coll.add("src", b"dropped")
    s.coll.delete("src")
    s.coll.add("src", b"new")
    assert s.coll.queue("src") is q and s.datas("src") == [b"new"]
    st = dict(s.coll.queue_stats("src"))
    assert (st["items"], st["total_items"], st["expired_items"]) == ("1", "1", "0")
    assert s.coll.confirm_move(q, xid)
    s.coll.close()
    s = Source(tmp_path, clock)
    assert s.datas("src") == [b"new"]
    s.coll.close()
