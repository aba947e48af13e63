"""The storage factory's timer (issue 8): with a cleaner, `tick` looks only at the journals that
set a checkpoint (they register themselves), not at every journal of the worker ten times a
second; and it asks for no wake-up at all when nothing is to be packed."""
import socket

import pytest

from lanner.clock import FakeClock
from lanner.config import Config, QueueConfig, ServerConfig
from lanner.ipc import control
from lanner.queues.collection import QueueCollection
from lanner.storage import factory as storage_factory
from lanner.storage.factory import StorageFactory
from lanner.storage.journal.journal import Journal
from lanner.storage.journal.packer import pack_files

NOW = 1_795_000_000_000
SMALL = {"max_memory_size": 1024, "max_journal_size": 4096}


CHECKPOINT = Journal.checkpoint          # the journal's field (a descriptor)


class WatchedJournal(Journal):
    """A journal that notes, by queue, every read of its `checkpoint` (what a walk over all
    journals has to look at) in the list `seen` the test gives it.  A subclass, not a patch: in
    the compiled build Journal is a C type, which cannot be patched."""
    __slots__ = ()
    seen: list[str] = []

    @property
    def checkpoint(self):
        self.seen.append(self.name)
        return CHECKPOINT.__get__(self, Journal)

    @checkpoint.setter
    def checkpoint(self, value) -> None:
        CHECKPOINT.__set__(self, value)


@pytest.fixture
def reads(monkeypatch):
    """The reads of every journal's `checkpoint`, by queue: the factory makes WatchedJournals."""
    seen: list[str] = []
    monkeypatch.setattr(WatchedJournal, "seen", seen)
    monkeypatch.setattr(storage_factory, "Journal", WatchedJournal)
    return seen


def with_cleaner(tmp_path):
    """A worker's storage as the server makes it: a factory with a cleaner socket (the other
    end returned), its collection, queue "big" small enough to rotate and set checkpoints."""
    clock = FakeClock(NOW)
    cfg = Config(server=ServerConfig(queue_path=str(tmp_path / "q")), default=QueueConfig(),
                 queue_overrides={"big": dict(SMALL)}, aliases={})
    mine, cleaner = socket.socketpair()
    factory = StorageFactory(cfg, clock, 0, 1, cleaner_sock=mine)
    coll = QueueCollection(cfg, clock, storage_factory=factory)
    factory.collection = coll
    return clock, factory, coll, mine, cleaner


def test_tick_visits_only_journals_with_a_checkpoint(tmp_path, reads):
    clock, factory, coll, mine, cleaner = with_cleaner(tmp_path)
    for i in range(300):
        coll.add(f"idle{i}", b"x")
    assert factory.next_deadlines() == []          # nothing to pack: no 100 ms wake-ups
    for i in range(200):
        coll.add("big", b"%03d" % i + b"." * 197)
    big = coll.queue("big").storage
    assert big.medium.checkpoint is not None        # rotations past max_journal_size set one
    assert factory.next_deadlines()

    del reads[:]
    clock.advance(100)
    factory.tick(clock.now_ms())
    assert set(reads) == {"big"}                    # not one step per idle queue

    for i in range(60):                             # the reader leaves the checkpoint's files
        assert coll.remove("big").data[:3] == b"%03d" % i
    clock.advance(100)
    factory.tick(clock.now_ms())
    reader = control.Reader(cleaner)
    msgs = reader.read()
    assert [m["cmd"] for m in msgs] == ["pack"]
    req = msgs[0]
    result = pack_files(req["files"], req["out"], req["open_xids"], now_ms=clock.now_ms())
    factory.on_cleaner_reply({"cmd": "packed", "id": req["id"], "ok": True, "out_path": result.out_path})
    assert big.medium.checkpoint is None
    clock.advance(100)
    factory.tick(clock.now_ms())
    assert factory.next_deadlines() == []           # packed: the journal left the set
    del reads[:]
    clock.advance(100)
    factory.tick(clock.now_ms())
    assert reads == []
    for i in range(60, 200):
        assert coll.remove("big").data[:3] == b"%03d" % i
    assert coll.remove("big") is None
    coll.close()
    mine.close()
    cleaner.close()


def test_a_checkpoint_announces_the_tick_to_the_worker(tmp_path):
    """The worker re-arms its timer only for deadlines that announce themselves: a journal that
    sets a checkpoint tells it (`on_deadline`), or its pack waited for the next heartbeat and a
    short-lived server stopped before its cleaner ever packed (tests/server/test_storage_server.py
    `test_read_behind_with_cleaner_packs_keeps_order` failed that way)."""
    clock, factory, coll, mine, cleaner = with_cleaner(tmp_path)
    announced: list[int] = []
    factory.on_deadline = announced.append
    coll.add("idle", b"x")
    assert announced == []
    for i in range(200):
        coll.add("big", b"%03d" % i + b"." * 197)
    assert coll.queue("big").storage.medium.checkpoint is not None
    assert announced and announced[0] <= min(factory.next_deadlines())
    coll.close()
    mine.close()
    cleaner.close()
