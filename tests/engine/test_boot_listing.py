"""Opening a journal queue lists the queue directory once per worker, not once per queue
(issue 8): the storage factory lists it at the first journal it opens and hands each name
the files found then (storage/factory.py `_listing`, files.files_by_queue)."""
from __future__ import annotations

import os

import pytest

from lanner.config import Config, QueueConfig, ServerConfig
from lanner.queues.collection import QueueCollection
from lanner.queues.item import QItem
from lanner.storage.factory import StorageFactory
from lanner.storage.journal.codec import encode_add, encode_remove
from lanner.storage.journal.files import StrayFile

T = 1_700_000_000_000


def config(tmp_path, **qc) -> Config:
    return Config(server=ServerConfig(queue_path=str(tmp_path / "queues")), default=QueueConfig(**qc))


def add(data: bytes) -> bytes:
    return encode_add(QItem(T, 0, data))


def put(path, *records: bytes) -> None:
    with open(path, "wb") as f:
        f.write(b"".join(records))


def drain(coll, name) -> list[bytes]:
    out = []
    while (item := coll.remove(name)) is not None:
        out.append(item.data)
    return out


@pytest.fixture
def listings(monkeypatch):
    """Counts the listings of any directory (os.listdir and os.scandir)."""
    count = [0]
    real_listdir, real_scandir = os.listdir, os.scandir

    def listdir(*a):
        count[0] += 1
        return real_listdir(*a)

    def scandir(*a):
        count[0] += 1
        return real_scandir(*a)
    monkeypatch.setattr(os, "listdir", listdir)
    monkeypatch.setattr(os, "scandir", scandir)
    return count


def test_creating_1000_queues_lists_the_directory_a_constant_number_of_times(tmp_path, clock, listings):
    qdir = tmp_path / "queues"
    qdir.mkdir()
    for i in range(200):                      # queues already there at start, one with an archive
        put(qdir / f"old{i}", add(b"x"))
    put(qdir / "old0.100", add(b"a"))
    with QueueCollection(config(tmp_path), clock) as coll:
        coll.load()
        assert coll.queue("old0").length == 2
        before = listings[0]
        for i in range(1000):
            assert coll.add(f"new{i}", b"v")
        assert listings[0] - before <= 2, f"{listings[0] - before} listings for 1000 new queues"
        assert coll.queue("new999").length == 1
    assert len(os.listdir(qdir)) == 1201


def test_archives_and_a_pack_found_at_start_are_replayed_as_before(tmp_path, clock):
    qdir = tmp_path / "queues"
    qdir.mkdir()
    put(qdir / "q.100", add(b"A"), add(b"B"))
    put(qdir / "q.200.pack", add(b"B"))       # summary of q.100 (A was removed)
    put(qdir / "q.300", add(b"C"))
    put(qdir / "q", add(b"D"))
    put(qdir / "q~~123", b"junk")             # a temporary: deleted at replay
    put(qdir / "qq.50", add(b"other"))        # another queue whose name starts with "q"
    put(qdir / "qq")
    with QueueCollection(config(tmp_path), clock) as coll:
        coll.load()
        assert sorted(os.listdir(qdir)) == ["q", "q.200", "q.300", "qq", "qq.50"]
        assert (qdir / "q.200").read_bytes() == add(b"B")
        assert drain(coll, "q") == [b"B", b"C", b"D"]
        assert drain(coll, "qq") == [b"other"]


def test_a_stray_archive_of_a_queue_created_after_start_is_still_named(tmp_path, clock):
    qdir = tmp_path / "queues"
    qdir.mkdir()
    put(qdir / "a")
    with QueueCollection(config(tmp_path), clock) as coll:
        coll.load()
        # appears before "b" is first opened, but after the start-up listing: like any
        # file of a queue nobody opened, it is not looked at (no listing per new queue)...
        put(qdir / "b.1", add(b"late"))
        assert coll.queue("b").length == 0
        coll.delete("b")
        # ...while a name opened since start is listed afresh, strays and all
        put(qdir / "b.12x")
        with pytest.raises(ValueError, match=r"b\.12x"):
            coll.queue("b")


def test_a_stray_file_found_at_start_stops_the_queue_naming_it(tmp_path, clock):
    qdir = tmp_path / "queues"
    qdir.mkdir()
    put(qdir / "a")
    put(qdir / "b.12x")
    factory = StorageFactory(config(tmp_path), clock)
    factory(name="a", qc=QueueConfig()).replay(QueueConfig())
    with pytest.raises(StrayFile, match=r"b\.12x"):
        factory("b", QueueConfig()).replay(QueueConfig())


def test_a_queue_deleted_and_created_again_reads_no_stale_archives(tmp_path, clock):
    qdir = tmp_path / "queues"
    qdir.mkdir()
    put(qdir / "a.100", add(b"old1"))
    put(qdir / "a", add(b"old2"))
    with QueueCollection(config(tmp_path), clock) as coll:
        coll.load()
        assert coll.queue("a").length == 2
        coll.delete("a")
        assert not os.path.exists(qdir / "a.100")
        assert coll.add("a", b"new")
        assert drain(coll, "a") == [b"new"]
    with QueueCollection(config(tmp_path), clock) as coll:
        coll.load()
        assert coll.queue("a").length == 0


def test_a_queue_opened_since_start_is_listed_again_when_reopened(tmp_path, clock):
    """Its own rotations and packs change its files: a second open must see them."""
    qdir = tmp_path / "queues"
    qdir.mkdir()
    put(qdir / "z")
    factory = StorageFactory(config(tmp_path), clock)
    qc = QueueConfig()
    j = factory("c", qc)                    # new since start: no archives, no listing
    j.replay(qc)
    j.close()
    factory.forget("c")
    put(qdir / "c.100", add(b"X"), add(b"Y"))     # as its rotation and a pack would leave them
    put(qdir / "c.100.pack", add(b"Y"))
    put(qdir / "c", encode_remove())
    j = factory("c", qc)
    st = j.replay(qc)
    assert st.total_items == 0 and sorted(os.listdir(qdir)) == ["c", "c.100", "z"]
    j.close()


def test_keep_journal_false_erases_the_files_found_at_start(tmp_path, clock):
    qdir = tmp_path / "queues"
    qdir.mkdir()
    put(qdir / "m.100", add(b"x"))
    put(qdir / "m", add(b"y"))
    put(qdir / "mm", add(b"y"))
    with QueueCollection(config(tmp_path, keep_journal=False), clock) as coll:
        coll.load()
        assert coll.queue("m").length == 0
        assert sorted(os.listdir(qdir)) == []
