"""A write or fsync that fails is rolled back (queues/undo.py): memory returns to what is on
disk, the lost records are dropped (never retried later as if acknowledged), and a restart
replays exactly the state the caller was told about."""
from __future__ import annotations

import errno
import os

import pytest

from lanner.config import CmdlogConfig, Config, QueueConfig, ServerConfig
from lanner.queues.collection import QueueCollection
from lanner.queues.undo import ADD, MOVE, OPEN, REMOVE
from lanner.storage.journal import journal as J


def enospc(fd, data):
    raise OSError(errno.ENOSPC, "No space left on device")


def eio(fd):
    raise OSError(errno.EIO, "Input/output error")


def make(tmp_path, clock, **default):
    cfg = Config(server=ServerConfig(queue_path=str(tmp_path / "queues")),
                 default=QueueConfig(**default), cmdlog=CmdlogConfig(sync="os"))
    return QueueCollection(cfg, clock)


def datas(coll, name):
    q = coll.queue(name)
    return [i.data for i in q.memory_items()]


def restart(coll, tmp_path, clock, **default):
    coll.close()
    return make(tmp_path, clock, **default)


def test_refused_add_is_not_in_the_queue_and_never_written_later(tmp_path, clock, monkeypatch):
    coll = make(tmp_path, clock)
    coll.add("q", b"a")
    monkeypatch.setattr(J, "_write", enospc)
    with pytest.raises(OSError) as ei:
        coll.add("q", b"refused")
    assert ei.value.errno == errno.ENOSPC
    assert datas(coll, "q") == [b"a"] and coll.queue("q").length == 1
    monkeypatch.setattr(J, "_write", os.write)
    coll.add("q", b"b")                           # space is back: the refused record is gone
    assert datas(coll, "q") == [b"a", b"b"]
    coll = restart(coll, tmp_path, clock)
    assert [coll.remove("q").data for _ in range(2)] == [b"a", b"b"] and coll.remove("q") is None


@pytest.mark.parametrize("transactional", [False, True])
def test_a_read_that_cannot_be_written_takes_nothing(tmp_path, clock, monkeypatch, transactional):
    coll = make(tmp_path, clock)
    coll.add("q", b"a")
    coll.add("q", b"b")
    monkeypatch.setattr(J, "_write", enospc)
    with pytest.raises(OSError):
        coll.remove("q", transactional=transactional)
    q = coll.queue("q")
    assert datas(coll, "q") == [b"a", b"b"] and not q.open_items()
    monkeypatch.setattr(J, "_write", os.write)
    item = coll.remove("q", transactional=transactional)
    assert item.data == b"a"
    coll = restart(coll, tmp_path, clock)
    # a plain read that was written is gone for good; an open read never confirmed comes back
    assert datas(coll, "q") == ([b"a", b"b"] if transactional else [b"b"])


def test_read_outcomes_after_restart(tmp_path, clock, monkeypatch):
    coll = make(tmp_path, clock)
    for d in (b"a", b"b", b"c"):
        coll.add("q", d)
    assert coll.remove("q").data == b"a"                      # written: gone
    monkeypatch.setattr(J, "_write", enospc)
    with pytest.raises(OSError):
        coll.remove("q")                                      # not written: b stays
    monkeypatch.setattr(J, "_write", os.write)
    coll = restart(coll, tmp_path, clock)
    assert [coll.remove("q").data for _ in range(2)] == [b"b", b"c"]


@pytest.mark.parametrize("op", ["confirm", "abort"])
def test_a_confirm_or_abort_that_cannot_be_written_leaves_the_read_open(tmp_path, clock, monkeypatch, op):
    coll = make(tmp_path, clock)
    coll.add("q", b"a")
    item = coll.remove("q", transactional=True)
    monkeypatch.setattr(J, "_write", enospc)
    call = coll.confirm_remove if op == "confirm" else coll.unremove
    with pytest.raises(OSError):
        call("q", item.xid)
    q = coll.queue("q")
    assert list(q.open_items()) == [item.xid] and q.length == 0
    monkeypatch.setattr(J, "_write", os.write)
    assert call("q", item.xid)                               # the caller may simply try again
    coll = restart(coll, tmp_path, clock)
    assert datas(coll, "q") == ([] if op == "confirm" else [b"a"])


def test_a_failed_fsync_under_always_cuts_the_file_back(tmp_path, clock, monkeypatch):
    coll = make(tmp_path, clock, sync_journal="always")
    coll.add("q", b"a")
    size = os.path.getsize(tmp_path / "queues" / "q")
    monkeypatch.setattr(J, "_fsync", eio)
    with pytest.raises(OSError) as ei:
        coll.add("q", b"not durable")
    assert ei.value.errno == errno.EIO
    assert os.path.getsize(tmp_path / "queues" / "q") == size
    assert datas(coll, "q") == [b"a"]
    monkeypatch.setattr(J, "_fsync", os.fsync)
    coll.add("q", b"b")
    coll = restart(coll, tmp_path, clock)
    assert [coll.remove("q").data for _ in range(2)] == [b"a", b"b"]


def test_a_batch_that_fails_is_undone_newest_first(tmp_path, clock, monkeypatch):
    """The worker's case: several requests per write.  An item added and handed out in the
    same failed batch is in neither state afterwards; each change names its request."""
    coll = QueueCollection(make(tmp_path, clock).config, clock, autoflush=False)
    coll.add("q", b"old")
    coll.flush_storages()
    undo = coll.undo
    undo.ctx = "set"
    coll.add("q", b"new")
    undo.ctx = "get1"
    first = coll.remove("q", transactional=True)
    undo.ctx = "get2"
    second = coll.remove("q")
    assert (first.data, second.data) == (b"old", b"new")
    monkeypatch.setattr(J, "_write", enospc)
    st = coll.queue("q").storage
    with pytest.raises(OSError):
        st.flush()
    undone = coll.rollback(st)
    assert [(u.ctx, u.kind, u.item.data) for u in undone] == [
        ("get2", REMOVE, b"new"), ("get1", OPEN, b"old"), ("set", ADD, b"new")]
    q = coll.queue("q")
    assert datas(coll, "q") == [b"old"] and not q.open_items() and not st.dirty
    monkeypatch.setattr(J, "_write", os.write)
    coll = restart(coll, tmp_path, clock)
    assert datas(coll, "q") == [b"old"]


def test_rollback_in_read_behind(tmp_path, clock, monkeypatch):
    coll = make(tmp_path, clock, max_memory_size=10)
    for i in range(5):
        coll.add("q", b"item%d" % i)                        # 5 bytes each: read-behind after two
    q = coll.queue("q")
    assert q.storage.in_read_behind
    monkeypatch.setattr(J, "_write", enospc)
    with pytest.raises(OSError):
        coll.add("q", b"refused")
    with pytest.raises(OSError):
        coll.remove("q")
    assert q.length == 5
    monkeypatch.setattr(J, "_write", os.write)
    got = [coll.remove("q").data for _ in range(5)]
    assert got == [b"item%d" % i for i in range(5)] and coll.remove("q") is None


def test_cmdlog_partition_rolls_back_every_queue_in_it(tmp_path, clock, monkeypatch):
    coll = make(tmp_path, clock, storage="cmdlog")
    coll.add("a", b"a1")
    q = coll.queue("a")
    plog = q.storage.medium
    # another queue of the same partition
    from lanner.queues.placement import partition_of
    other = next(n for n in (f"b{i}" for i in range(10_000)) if partition_of(n) == partition_of("a"))
    coll.add(other, b"x1")
    coll.autoflush = False
    coll.add("a", b"a2")
    coll.add(other, b"x2")
    coll.remove("a")

    def fail(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(plog, "_write", fail)
    with pytest.raises(OSError):
        coll.flush_storages()
    assert datas(coll, "a") == [b"a1"] and datas(coll, other) == [b"x1"]
    monkeypatch.setattr(plog, "_write", os.write)
    coll.autoflush = True
    coll.add("a", b"a3")
    coll = restart(coll, tmp_path, clock, storage="cmdlog")
    assert datas(coll, "a") == [b"a1", b"a3"] and datas(coll, other) == [b"x1"]


def test_a_rollback_takes_back_the_global_total_items_of_adds_and_fanout_copies_not_moves(
        tmp_path, clock, monkeypatch):
    """total_items counts successful adds, each fanout copy too, expire_to_queue moves never
    (reference §4.3): an add that is rolled back was not successful, a move never counted."""
    cfg = Config(server=ServerConfig(queue_path=str(tmp_path / "queues")),
                 queue_overrides={"src": {"expire_to_queue": "dead", "max_age": 1000}},
                 cmdlog=CmdlogConfig(sync="os"))
    coll = QueueCollection(cfg, clock, autoflush=False)
    coll.queue("q+copy")
    coll.add("src", b"old")
    coll.flush_storages()
    assert coll.stats()["total_items"] == 1
    undo = coll.undo
    undo.ctx = "set"
    coll.add("q", b"new")                         # 2: the master and its copy
    clock.advance(2000)
    undo.ctx = "get"
    assert coll.remove("src") is None              # the sweep moves "old" into dead: not counted
    assert [i.data for i in coll.queue("dead").memory_items()] == [b"old"]
    assert coll.stats()["total_items"] == 3
    monkeypatch.setattr(J, "_write", enospc)
    undone = []
    for name in ("q", "dead", "src"):                 # (q's rollback takes its copy in q+copy too)
        st = coll.queue(name).storage
        with pytest.raises(OSError):
            st.flush()
        undone += coll.rollback(st)
    assert coll.stats()["total_items"] == 1        # main: 3, nothing taken back
    assert [(u.queue, u.ctx) for u in undone if u.kind == ADD] == [
        ("q", "set"), ("q+copy", None), ("dead", MOVE)]      # a move is nobody's request
    assert [q.total_items for q in map(coll.queue, ("q", "q+copy", "dead"))] == [0, 0, 0]
