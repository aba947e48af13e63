"""Data on disk wins (issue 11, defect 9): a queue whose items are stored in the other
storage than its configuration names is refused, naming the queue and the setting."""
from __future__ import annotations

import os

import pytest

from lanner.config import CmdlogConfig, Config, QueueConfig, ServerConfig
from lanner.queues.collection import QueueCollection
from lanner.storage.factory import StorageMismatch


def make(tmp_path, clock, **default):
    cfg = Config(server=ServerConfig(queue_path=str(tmp_path / "queues")),
                 default=QueueConfig(**default), cmdlog=CmdlogConfig(sync="os"))
    return QueueCollection(cfg, clock)


@pytest.mark.parametrize("then", [dict(), dict(keep_journal=False)], ids=["journal", "memory"])
def test_cmdlog_items_refuse_another_home(tmp_path, clock, then):
    with make(tmp_path, clock, storage="cmdlog") as coll:
        coll.add("jobs", b"a")
        coll.add("mail.send", b"b")
    with make(tmp_path, clock, **then) as coll:
        with pytest.raises(StorageMismatch, match=r"queue 'jobs': 1 items are stored in the command log"):
            coll.queue("jobs")
        with pytest.raises(StorageMismatch, match=r"queue 'mail.send': 1 items .*"
                                                  + ("keep_journal = false" if then else 'storage = "journal"')):
            coll.queue("mail.send")
        with pytest.raises(StorageMismatch, match=r"queue '(jobs|mail\.send)': 1 items are stored"):
            coll.load()
    with make(tmp_path, clock, storage="cmdlog") as coll:     # untouched: all still there
        coll.load()
        assert coll.remove("jobs").data == b"a" and coll.remove("mail.send").data == b"b"


def test_empty_cmdlog_queue_moves_quietly(tmp_path, clock):
    with make(tmp_path, clock, storage="cmdlog") as coll:
        coll.add("jobs", b"a")
        coll.add("mail.send", b"b")
        coll.remove("jobs")
        coll.remove("mail.send")
    with make(tmp_path, clock) as coll:
        coll.load()
        assert coll.names() == ["jobs"]                       # a journal queue now; mail.send cannot be one
        coll.add("jobs", b"c")
    with make(tmp_path, clock, storage="cmdlog") as coll:     # and back: the journal holds an item now
        with pytest.raises(StorageMismatch, match="queue 'jobs': 1 items are stored in its journal"):
            coll.load()


def test_empty_journal_moves_to_the_command_log(tmp_path, clock):
    with make(tmp_path, clock) as coll:
        coll.add("jobs", b"a")
        coll.remove("jobs")
    with make(tmp_path, clock, storage="cmdlog") as coll:
        coll.load()
        coll.add("jobs", b"b")
        assert not os.path.exists(tmp_path / "queues" / "jobs")
    with make(tmp_path, clock, storage="cmdlog") as coll:
        coll.load()
        assert coll.remove("jobs").data == b"b"


def test_open_reads_count_as_stored(tmp_path, clock):
    with make(tmp_path, clock) as coll:
        coll.add("jobs", b"a")
        coll.remove("jobs", transactional=True)
    with make(tmp_path, clock, storage="cmdlog") as coll:
        with pytest.raises(StorageMismatch, match="1 items are stored in its journal"):
            coll.load()
