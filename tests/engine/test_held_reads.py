"""Held reads (queues/openreads.py, server/holding.py), in one process: a plain get for another
process's client stays an open read of the queue's own until that process says the reply was
written (OP_HELD), or dies (peer_down).  Requests go straight to `Worker.handle` from front
slot 0 (another process); replies are captured instead of published."""
from __future__ import annotations

import errno
import os
from array import array

import msgpack
import pytest

from lanner.clock import FakeClock
from lanner.config import Config, QueueConfig, ServerConfig
from lanner.ipc.messages import (OP_GET, OP_HELD, OP_SET, OP_TGET, R_DATA, R_EMPTY, R_ITEM, R_OK,
                                 R_SERVER_ERROR, RF_CLOSE, RF_HELD, pack_req)
from lanner.queues.collection import QueueCollection
from lanner.queues.waiters import Waiter
from lanner.storage.factory import StorageFactory
from lanner.storage.journal import journal as J
from lanner.storage.journal.codec import encode_open
from tests.engine.conftest import published, req

NOW = 1_795_000_000_000


@pytest.fixture
def clock():
    return FakeClock(NOW)


def collection(tmp_path, clock, **queue) -> QueueCollection:
    cfg = Config(server=ServerConfig(queue_path=str(tmp_path / "q")), default=QueueConfig(**queue))
    factory = StorageFactory(cfg, clock, 0, 1)
    coll = QueueCollection(cfg, clock, storage_factory=factory)
    factory.collection = coll
    coll.load()
    return coll


def datas(coll, name: str) -> list[bytes]:
    return [i.data for i in coll.queue(name).memory_items()]


def stat(coll, name: str) -> dict:
    return dict(coll.queue_stats(name))


# -- the queue --------------------------------------------------------------------------------

def test_a_held_read_is_not_a_clients_read(tmp_path, clock):
    """Stats count client reads only, no client can confirm or abort a held read, a client read
    gets an xid of its own, and open_transaction_timeout never recycles a held read."""
    coll = collection(tmp_path, clock, open_transaction_timeout=10)
    for d in (b"a", b"b"):
        coll.add("q", d)
    q, item = coll.remove_held("q")
    assert item.data == b"a" and item.xid and q.held_reads == 1
    st = stat(coll, "q")
    assert (st["items"], st["open_transactions"], st["transactions"]) == ("1", "0", "0")
    assert (coll.get_hits, coll.get_misses) == (1, 0)
    assert not coll.confirm_remove("q", item.xid) and not coll.unremove("q", item.xid)
    clock.advance(100)
    mine = coll.remove("q", transactional=True)
    assert mine.data == b"b" and mine.xid != item.xid
    assert q.open_items() == {item.xid: item, mine.xid: mine}
    coll.add("q", b"c")
    clock.advance(100)
    assert coll.remove("q").data == b"b"       # the client read timed out, not the held one
    assert q.held_reads == 1 and stat(coll, "q")["canceled_transactions"] == "1"
    assert q.abort_held(item.xid) and datas(coll, "q") == [b"a", b"c"]
    st = stat(coll, "q")
    assert (st["open_transactions"], st["canceled_transactions"]) == ("0", "1")   # uncounted
    coll.close()


@pytest.mark.parametrize("storage", ["journal", "cmdlog"])
def test_an_unconfirmed_held_read_is_replayed_into_its_queue(tmp_path, clock, storage):
    """The owner dies (or stops) before the front's confirm: replay rolls the held read back, in
    order ahead of the rest; a confirmed one stays gone."""
    coll = collection(tmp_path, clock, storage=storage)
    for d in (b"a", b"b", b"c", b"d"):
        coll.add("q", d)
    q, a = coll.remove_held("q")
    _, b = coll.remove_held("q")
    _, c = coll.remove_held("q")
    assert q.confirm_held(b.xid) and not q.confirm_held(b.xid)
    coll.close()
    coll = collection(tmp_path, clock, storage=storage)
    assert datas(coll, "q") == [b"a", b"c", b"d"] and coll.queue("q").held_reads == 0
    coll.close()


def test_a_journal_rewrite_carries_a_held_read(tmp_path, clock):
    """The queue empties and its journal is rewritten (§6.4) while a read is held: the rewrite
    keeps it open, so a restart still brings it back."""
    coll = collection(tmp_path, clock, default_journal_size=1024)
    coll.add("q", b"held")
    q, item = coll.remove_held("q")
    for i in range(20):
        coll.add("q", b"%02d" % i + b"." * 98)
    for i in range(20):
        assert coll.remove("q").data[:2] == b"%02d" % i
    assert q.storage.rewrites == 1
    coll.close()
    coll = collection(tmp_path, clock)
    assert datas(coll, "q") == [b"held"]
    coll.close()


def test_an_aborted_held_read_goes_back_to_the_head_and_wakes_a_waiter(tmp_path, clock):
    coll = collection(tmp_path, clock)
    coll.add("q", b"a")
    q, item = coll.remove_held("q")
    w = Waiter(key="w", queue="q", deadline_ms=None, peek=False, transactional=False)
    coll.wait(w)
    assert q.abort_held(item.xid) and not q.abort_held(item.xid)
    assert coll.woken == [w] and datas(coll, "q") == [b"a"]
    coll.close()


# -- the worker -------------------------------------------------------------------------------

replies = published         # (conn, status, flags, value, payload) per reply, taken


def held(conf=(), abort=()):
    """The OP_HELD message a front sends: confirmed ids first, then aborted ones."""
    return pack_req(0, 0, OP_HELD, 0, 0, len(conf), 0) + array("q", [*conf, *abort]).tobytes()


def fill(w, *datas, queue="q"):
    for d in datas:
        w.handle(0, req(1, OP_SET, queue, payload=d))
    w.finish_batch()
    assert all(r[1] == R_OK for r in replies(w))


def gets(w, n, queue="q", conn=2):
    for i in range(n):
        w.handle(0, req(conn, OP_GET, queue, a=-1, n=i + 1))
    w.finish_batch()
    return replies(w)


def test_a_routed_plain_get_is_held_until_its_front_confirms(worker, tmp_path):
    """The reply carries RF_HELD and a hold id; the journal holds the item open until the front's
    OP_HELD confirms it (before: one REMOVE, and the item died with a front that had not
    written it); a confirm of an unknown or settled id does nothing."""
    w = worker()
    fill(w, b"a", b"b")
    path = tmp_path / "queues" / "q"
    size = os.path.getsize(path)
    (got,) = gets(w, 1)
    assert got[:3] == (2, R_ITEM, RF_HELD) and got[4] == b"a" and got[3] >> 32 == os.getpid()
    hid = got[3]
    with open(path, "rb") as f:
        assert f.read()[size:] == encode_open(1)
    q = w.coll.queue("q")
    assert q.held_reads == 1 and len(w.holding) == 1
    w.handle(0, held(conf=[hid, hid + 1]))
    w.handle(0, held(conf=[hid]))
    w.finish_batch()
    assert q.held_reads == 0 and len(w.holding) == 0 and replies(w) == []
    assert os.path.getsize(path) == size + 10       # REMOVE_TENTATIVE, CONFIRM_REMOVE
    assert (gets(w, 2)[1][1]) == R_EMPTY and datas(w.coll, "q") == []


def test_aborted_and_orphaned_held_reads_come_back_in_their_order(worker):
    """A front's aborts (connection gone) and a front's death (peer_down) put every held item
    back at the head of its queue, in the order they were read, ahead of the rest."""
    w = worker()
    fill(w, b"a", b"b", b"c", b"d", b"e")
    ids = [r[3] for r in gets(w, 4)]
    w.handle(0, held(conf=[ids[0]], abort=[ids[1], ids[2]]))
    w.finish_batch()
    assert datas(w.coll, "q") == [b"b", b"c", b"e"]
    w.peer_down(0)
    w.finish_batch()
    assert datas(w.coll, "q") == [b"d", b"b", b"c", b"e"] and len(w.holding) == 0
    assert stat(w.coll, "q")["canceled_transactions"] == "0"


def test_a_blocking_get_served_by_a_waiter_is_held(worker, clock):
    w = worker()
    w.handle(0, req(2, OP_GET, "q", a=5000))
    w.finish_batch()
    assert replies(w) == []
    fill(w, b"late")
    w.retry_woken()
    w.finish_batch()
    ((conn, status, flags, hid, data),) = replies(w)
    assert (conn, status, flags, data) == (2, R_ITEM, RF_HELD, b"late")
    w.peer_down(0)
    assert datas(w.coll, "q") == [b"late"]


def test_a_thrift_get_without_auto_abort_holds_its_items_under_one_id(worker):
    w = worker()
    fill(w, b"a", b"b", b"c")
    w.handle(0, req(3, OP_TGET, "q", a=0, b=2, payload=(0).to_bytes(8, "little")))
    w.finish_batch()
    ((_, status, flags, hid, payload),) = replies(w)
    assert (status, flags) == (R_DATA, RF_HELD) and msgpack.unpackb(payload) == [[b"a", 0], [b"b", 0]]
    w.handle(0, held(abort=[hid]))
    w.finish_batch()
    assert datas(w.coll, "q") == [b"a", b"b", b"c"]


def test_a_held_read_whose_record_is_lost_fails_its_reply_and_holds_nothing(worker, monkeypatch):
    w = worker()
    fill(w, b"a")

    def enospc(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(J, "_write", enospc)
    ((_, status, flags, value, _),) = gets(w, 1)
    assert (status, flags, value) == (R_SERVER_ERROR, RF_CLOSE, 0)
    assert len(w.holding) == 0 and w.coll.queue("q").held_reads == 0 and datas(w.coll, "q") == [b"a"]


def test_a_held_confirm_that_cannot_be_written_is_stranded_then_aborted(worker, monkeypatch, clock):
    """The confirm's record is lost (disk full): the read is held again with nobody to settle
    it, so the worker aborts it once writes succeed (the item is served again: at least once)."""
    w = worker()
    fill(w, b"a")
    (got,) = gets(w, 1)
    real = J._write
    monkeypatch.setattr(J, "_write", lambda fd, data: (_ for _ in ()).throw(
        OSError(errno.ENOSPC, "No space left on device")))
    w.handle(0, held(conf=[got[3]]))
    w.finish_batch()
    q = w.coll.queue("q")
    assert q.held_reads == 1 and w.coll.stranded == {"q": [1]}
    monkeypatch.setattr(J, "_write", real)
    clock.advance(2000)
    w.run_timers()
    w.finish_batch()
    assert q.held_reads == 0 and w.coll.stranded == {} and datas(w.coll, "q") == [b"a"]
