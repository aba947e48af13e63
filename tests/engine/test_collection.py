"""QueueCollection: creation on reference, fanout, expire_to_queue, global stats,
load, delete, max_queue_age, waiters, sessions, aliases, durability hooks."""
from __future__ import annotations

import dataclasses
import os
import sys

import pytest

from lanner.queues.collection import QueueCollection
from lanner.config import Config, QueueConfig, ServerConfig
from lanner.queues.sessions import Session
from lanner.storage import factory as storage_factory
from lanner.storage.seam import MemoryStorage
from lanner.queues.waiters import Waiter

try:
    from .test_queue_model import RecordingStorage
except ImportError:          # tests/engine is not a package: pytest put its directory on sys.path
    from test_queue_model import RecordingStorage


class Factory:
    """Recording storages that survive a 'restart' (same disk per queue name)."""

    def __init__(self) -> None:
        self.disks: dict[str, list] = {}
        self.made: dict[str, RecordingStorage] = {}
        self.policies: dict[str, object] = {}

    def __call__(self, name, qc):
        st = RecordingStorage(self.disks.setdefault(name, []), sync_policy=qc.sync_journal)
        self.made[name] = st
        return st


def config(tmp_path, default=None, overrides=None, aliases=None) -> Config:
    return Config(server=ServerConfig(queue_path=str(tmp_path / "queues")),
                  default=default or QueueConfig(), queue_overrides=overrides or {},
                  aliases=aliases or {})


@pytest.fixture
def factory():
    return Factory()


@pytest.fixture
def make(tmp_path, clock, factory):
    def make(default=None, overrides=None, aliases=None, **kw) -> QueueCollection:
        kw.setdefault("storage_factory", factory)
        return QueueCollection(config(tmp_path, default, overrides, aliases), clock, **kw)
    return make


def datas(coll, name) -> list[bytes]:
    return [i.data for i in coll.queue(name, create=False).memory_items()]


# -- creation on reference (§5.1) ----------------------------------------------------------------
def test_adds_and_fetches_create_queues(make):
    c = make()
    c.add("a", b"x")
    c.remove("b")
    c.peek("c")
    c.remove("d", transactional=True)
    assert c.names() == ["a", "b", "c", "d"]
    assert c.stats()["queue_creates"] == 4


def test_other_operations_never_create(make):
    c = make()
    assert not c.confirm_remove("a", 1)
    assert not c.unremove("a", 1)
    c.flush("a")
    c.delete("a")
    assert c.flush_expired("a") == 0
    assert c.queue_stats("a") is None
    assert c.queue("a", create=False) is None
    assert c.names() == [] and c.stats()["queue_creates"] == 0


@pytest.mark.parametrize("name", ["a.b", "a/b", "a~b", "", "a\x01"])
def test_illegal_names_are_refused(make, name):
    c = make()
    with pytest.raises(ValueError, match="Queue name"):
        c.add(name, b"x")
    assert c.names() == []


def test_cmdlog_is_reserved_for_queues_that_may_keep_a_journal(make):
    with pytest.raises(ValueError, match="reserved"):
        make().add("cmdlog", b"x")
    with pytest.raises(ValueError, match="reserved"):     # a reload may turn its journal on
        make(default=QueueConfig(keep_journal=False)).add("cmdlog", b"x")
    assert make(default=QueueConfig(storage="cmdlog")).add("cmdlog", b"x")


def test_cmdlog_queues_may_contain_dots(make):
    c = make(default=QueueConfig(storage="cmdlog"))
    assert c.add("email.send", b"x")
    with pytest.raises(ValueError, match="illegal characters"):
        c.add("email/send", b"x")


def test_queue_outside_the_shard_is_refused(make):
    c = make(owns=lambda n: n != "theirs")
    with pytest.raises(ValueError, match="another worker"):
        c.add("theirs", b"x")


def test_queue_config_comes_from_the_config(make):
    c = make(overrides={"small": {"max_items": 1}})
    assert c.add("small", b"1") and not c.add("small", b"2")
    assert c.add("big", b"1") and c.add("big", b"2")


# -- fanout (§5.6) -------------------------------------------------------------------------------
def test_fanout_child_gets_only_items_written_after_it_exists(make):
    c = make()
    c.add("a", b"before")
    c.remove("a+b")                          # creating the child registers it
    c.add("a", b"after")
    assert datas(c, "a") == [b"before", b"after"]
    assert datas(c, "a+b") == [b"after"]
    assert dict(c.queue_stats("a"))["children"] == "a+b"
    assert "children" not in dict(c.queue_stats("a+b"))


def test_child_registers_even_if_the_master_does_not_exist(make):
    c = make()
    c.peek("m+x")
    c.peek("m+y")
    c.add("m", b"1")
    assert datas(c, "m+x") == datas(c, "m+y") == [b"1"]
    assert dict(c.queue_stats("m"))["children"] == "m+x,m+y"


def test_fanout_reply_reflects_the_master_only(make):
    c = make(overrides={"a": {"max_items": 1}, "a+full": {"max_items": 0}, "a+ok": {"max_items": 9}})
    c.peek("a+full")
    c.peek("a+ok")
    assert c.add("a", b"1")                  # the full child does not fail the write
    assert not c.add("a", b"2")              # master full: refused, children still got it
    assert datas(c, "a+ok") == [b"1", b"2"]
    assert datas(c, "a+full") == []
    assert c.stats()["total_items"] == 3        # a+ok twice, a once


def test_total_items_counts_each_fanout_copy(make):
    c = make()
    c.peek("a+b")
    c.peek("a+c")
    c.add("a", b"x")
    assert c.stats()["total_items"] == 3
    c.add("a+b", b"direct")
    assert c.stats()["total_items"] == 4


def test_fanout_only_master_feeds_children_and_counts_once(make):
    c = make(overrides={"a": {"fanout_only": True}})
    c.peek("a+b")
    assert c.add("a", b"x")
    assert datas(c, "a") == [] and datas(c, "a+b") == [b"x"]
    assert c.stats()["total_items"] == 2


def test_deleting_master_keeps_children_and_their_registration(make):
    c = make()
    c.peek("a+b")
    c.add("a", b"1")
    c.delete("a")
    assert c.queue("a+b", create=False) is not None
    c.add("a", b"2")
    assert datas(c, "a+b") == [b"1", b"2"]
    assert dict(c.queue_stats("a"))["children"] == "a+b"


def test_deleting_child_unregisters_it(make):
    c = make()
    c.peek("a+b")
    c.delete("a+b")
    c.add("a", b"1")
    assert c.queue("a+b", create=False) is None
    assert "children" not in dict(c.queue_stats("a"))


def test_fanout_copies_share_add_time_and_expiry(make, clock):
    c = make(overrides={"a+short": {"max_age": 10}})
    c.peek("a+b")
    c.peek("a+short")
    exp = clock.now_ms() + 5000
    c.add("a", b"x", exp)
    a, b, short = (c.queue(n).memory_items()[0] for n in ("a", "a+b", "a+short"))
    assert a.add_time == b.add_time == short.add_time == clock.now_ms()
    assert a.expiry == b.expiry == exp
    assert short.expiry == clock.now_ms() + 10
    assert a is not b


# -- expire_to_queue (§5.2) ----------------------------------------------------------------------
def test_expire_to_queue_target_created_with_source(make):
    c = make(overrides={"src": {"expire_to_queue": "dead"}})
    c.peek("src")
    assert c.names() == ["src", "dead"]


def test_expired_items_move_to_target(make, clock):
    c = make(overrides={"src": {"expire_to_queue": "dead"}, "dead": {"max_age": 60_000}})
    c.peek("dead+child")
    c.add("src", b"x", clock.now_ms() + 10)
    total = c.stats()["total_items"]
    clock.advance(11)
    assert c.remove("src") is None
    moved = c.queue("dead").memory_items()[0]
    assert moved.data == b"x"
    assert moved.add_time == clock.now_ms()
    assert moved.expiry == clock.now_ms() + 60_000         # target's max_age, no client expiry
    assert datas(c, "dead+child") == []                    # target fanouts are not fed
    assert c.stats()["total_items"] == total                # not a new item globally
    assert dict(c.queue_stats("dead"))["total_items"] == "1"
    assert dict(c.queue_stats("src"))["expired_items"] == "1"


def test_reload_does_not_redirect_expire_to_queue(make, tmp_path, clock):
    c = make(overrides={"src": {"expire_to_queue": "one"}})
    c.add("src", b"x", clock.now_ms() + 1)
    c.reload(config(tmp_path, overrides={"src": {"expire_to_queue": "two"}}))
    assert c.queue("src").config.expire_to_queue == "two"
    clock.advance(2)
    c.flush_expired("src")
    assert datas(c, "one") == [b"x"]
    assert c.queue("two", create=False) is None


def test_deleted_target_is_recreated_by_the_next_move(make, clock):
    c = make(overrides={"src": {"expire_to_queue": "dead"}})
    c.add("src", b"x", clock.now_ms() + 1)
    c.delete("dead")
    clock.advance(2)
    assert c.flush_expired("src") == 1
    assert datas(c, "dead") == [b"x"]


def test_expire_to_a_queue_of_another_worker_is_forwarded(make, clock):
    sent = []
    c = make(overrides={"src": {"expire_to_queue": "far"}}, owns=lambda n: n != "far",
             expire_forward=lambda *a: sent.append(a))
    c.add("src", b"x", clock.now_ms() + 1)
    assert c.queue("far", create=False) is None             # not created here
    clock.advance(2)
    c.flush_all_expired()
    src = c.queue("src")
    assert sent == [("far", b"x", clock.now_ms(), src, 1)]
    assert src.moves_open == 1 and src.stats() == c.queue_stats("src")
    assert dict(src.stats())["open_transactions"] == "0"       # not a client's read
    assert c.confirm_move(src, 1) and src.moves_open == 0
    assert not c.confirm_move(src, 1)


def test_add_forwarded(make, clock):
    c = make(overrides={"t": {"max_age": 100}})
    c.peek("t+child")
    assert c.add_forwarded("t", b"x", clock.now_ms())
    item = c.queue("t").memory_items()[0]
    assert (item.add_time, item.expiry) == (clock.now_ms(), clock.now_ms() + 100)
    assert datas(c, "t+child") == []
    assert c.stats()["total_items"] == 0


# -- global stats (§4.3) -------------------------------------------------------------------------
def test_hits_and_misses(make):
    c = make()
    c.add("q", b"x")
    c.peek("q")
    c.remove("q")
    c.remove("q")
    c.peek("q")
    s = c.stats()
    assert (s["get_hits"], s["get_misses"]) == (2, 2)


def test_global_stats(make):
    c = make(overrides={"b": {"max_memory_size": 1000}})
    c.add("a", b"12345")
    c.add("b", b"1")
    c.remove("b", transactional=True)
    s = c.stats()
    assert s["curr_items"] == 1 and s["bytes"] == 5
    assert s["reserved_memory"] == 128 * 2**20 + 1000
    assert s["total_items"] == 2
    assert set(s) == {"total_items", "queue_creates", "queue_deletes", "queue_expires", "get_hits",
                      "get_misses", "curr_items", "bytes", "reserved_memory"}


def test_refused_add_is_not_counted(make):
    c = make(default=QueueConfig(max_item_size=1))
    assert not c.add("q", b"xx")
    assert c.stats()["total_items"] == 0


# -- delete and flush (§5.5) ---------------------------------------------------------------------
def test_delete_erases_wakes_waiters_and_resets_stats(make, factory):
    c = make()
    c.add("q", b"x")
    item = c.remove("q", transactional=True)
    w = Waiter("k", "q", None)
    c.wait(w)
    st = factory.made["q"]
    c.delete("q")
    assert st.closed and st.erased
    assert c.woken == [w] and w.evicted
    assert c.queue("q", create=False) is None
    assert not c.confirm_remove("q", item.xid)               # silent, does not re-create
    assert c.queue("q", create=False) is None
    c.add("q", b"y")
    assert dict(c.queue_stats("q"))["total_items"] == "1"
    s = c.stats()
    assert (s["queue_creates"], s["queue_deletes"]) == (2, 1)


def test_flush_all_and_flush_all_expired(make, clock):
    c = make()
    c.add("a", b"1", clock.now_ms() + 1)
    c.add("b", b"2", clock.now_ms() + 1)
    c.add("b", b"3")
    clock.advance(2)
    assert c.flush_all_expired() == 2
    c.flush_all()
    assert c.stats()["curr_items"] == 0
    assert dict(c.queue_stats("a"))["total_flushes"] == "1"


# -- max_queue_age (§5.4) ------------------------------------------------------------------------
def test_max_queue_age_deletes_on_the_timer_tick(make, clock):
    c = make(default=QueueConfig(max_queue_age=1000))
    c.peek("idle")
    c.add("busy", b"x")
    c.add("open", b"x")
    c.remove("open", transactional=True)                     # open reads do not keep it alive
    c.add("stale", b"x", clock.now_ms() + 500)
    clock.advance(1000)
    assert c.expire_queues() == 1                             # stale's item is swept...
    assert sorted(c.names()) == ["busy", "idle", "open", "stale"]      # ...but not strictly past yet
    clock.advance(1)
    assert c.expire_queues() == 0
    assert c.names() == ["busy"]
    s = c.stats()
    assert (s["queue_expires"], s["queue_deletes"]) == (3, 3)


def test_queues_loaded_at_start_use_start_time(make, factory, clock):
    c = make(default=QueueConfig(max_queue_age=1000))
    c.peek("q")
    clock.advance(5000)
    c2 = make(default=QueueConfig(max_queue_age=1000))
    c2.queue("q")
    c2.expire_queues()
    assert c2.names() == ["q"]


# -- load (§5.1 start-up) ------------------------------------------------------------------------
def touch(path, name, data=b""):
    with open(os.path.join(path, name), "wb") as f:
        f.write(data)


def test_load_lists_journal_files(make, tmp_path, factory):
    qp = tmp_path / "queues"
    qp.mkdir()
    for name in ("q", "q.1234", "q.99.pack", "r~~123", "a+b", "s.5"):
        touch(qp, name)
    (qp / "cmdlog").mkdir()
    (qp / "dir.1").mkdir()
    seen = []
    c = make()
    c.load(progress=lambda *a: seen.append(a))
    assert sorted(c.names()) == ["a+b", "q", "s"]
    assert seen == [("a+b", 1, 3), ("q", 2, 3), ("s", 3, 3)]
    assert c.stats()["queue_creates"] == 3
    c.add("a", b"x")
    assert datas(c, "a+b") == [b"x"]                          # loaded children register


def test_load_refuses_a_stray_file_naming_it(make, tmp_path):
    qp = tmp_path / "queues"
    qp.mkdir()
    touch(qp, "foo.txt")
    with pytest.raises(ValueError, match=r"foo\.txt"):
        make().load()


def test_load_refuses_an_illegal_file_name(make, tmp_path):
    qp = tmp_path / "queues"
    qp.mkdir()
    touch(qp, "bad\x01name")
    with pytest.raises(ValueError, match="bad\x01name"):
        make().load()


def test_load_creates_a_missing_queue_path(make, tmp_path):
    make().load()
    assert (tmp_path / "queues").is_dir()


def test_load_keeps_owned_names_only(make, tmp_path):
    qp = tmp_path / "queues"
    qp.mkdir()
    for name in ("mine", "theirs"):
        touch(qp, name)
    c = make(owns=lambda n: n != "theirs")
    c.load()
    assert c.names() == ["mine"]


def test_load_asks_the_factory_for_its_queue_names(make, tmp_path, factory):
    factory.queue_names = lambda: ["email.send", "jobs"]
    c = make(default=QueueConfig(storage="cmdlog"))
    c.load()
    assert c.names() == ["email.send", "jobs"]


def test_load_replays_and_rolls_back(make, factory):
    factory.queue_names = lambda: list(factory.disks)
    c = make()
    c.add("q", b"a")
    c.add("q", b"b")
    c.remove("q", transactional=True)
    c.close()
    c2 = make()
    c2.load()
    assert datas(c2, "q") == [b"a", b"b"]


def test_failed_replay_closes_storage_and_registers_nothing(make):
    class Broken(RecordingStorage):
        def replay(self, config):
            raise ValueError("q: corrupt at offset 7")

    made = []

    def factory(name, qc):
        made.append(Broken())
        return made[-1]

    c = make(storage_factory=factory)
    with pytest.raises(ValueError, match="offset 7"):
        c.add("q", b"x")
    assert made[0].closed and c.names() == []


# -- waiters (§5.10) -----------------------------------------------------------------------------
def two_waiting(c, deadline1, deadline2):
    """Two waiters parked on "q", the first one oldest."""
    w1, w2 = Waiter("1", "q", deadline1), Waiter("2", "q", deadline2)
    c.wait(w1)
    c.wait(w2)
    return w1, w2


def test_add_wakes_the_oldest_waiter_into_woken(make, clock):
    c = make()
    w1, w2 = two_waiting(c, clock.now_ms() + 100, clock.now_ms() + 100)
    assert dict(c.queue_stats("q"))["waiters"] == "2"
    c.add("q", b"x")
    assert c.woken == [w1]
    assert dict(c.queue_stats("q"))["waiters"] == "1"


def test_woken_list_may_be_swapped_by_the_owner(make):
    c = make()
    w1, w2 = two_waiting(c, None, None)
    c.add("q", b"x")
    drained, c.woken = c.woken, []
    c.add("q", b"y")
    assert drained == [w1] and c.woken == [w2]


def test_loser_rejoins_at_the_tail_with_its_deadline(make, clock):
    c = make()
    w1, w2 = two_waiting(c, clock.now_ms() + 100, clock.now_ms() + 200)
    c.add("q", b"x")
    assert c.remove("q").data == b"x"            # another client wins the race
    (w,) = c.woken
    c.woken = []
    assert c.remove("q") is None                  # the woken waiter's retry finds nothing
    c.wait(w)
    c.add("q", b"y")
    assert c.woken == [w2]
    clock.advance(100)
    assert c.timers.pop_due(clock.now_ms()) == [w1]
    c.cancel_wait(w1)
    assert dict(c.queue_stats("q"))["waiters"] == "0"


def test_peek_waiter_consumes_the_wake_up(make):
    c = make()
    p, g = Waiter("p", "q", None, peek=True), Waiter("g", "q", None)
    c.wait(p)
    c.wait(g)
    c.add("q", b"x")
    assert c.woken == [p]                          # g stays asleep although an item is there
    assert c.peek("q").data == b"x"


def test_unremove_wakes_one_waiter(make):
    c = make()
    c.add("q", b"x")
    item = c.remove("q", transactional=True)
    w = Waiter("w", "q", None)
    c.wait(w)
    assert c.unremove("q", item.xid)
    assert c.woken == [w]


def test_expire_waiters_and_cancel(make, clock):
    c = make()
    now = clock.now_ms()
    w1, w2, w3 = Waiter("1", "q", now + 10), Waiter("2", "q", now + 20), Waiter("3", "q", None)
    for w in (w1, w2, w3):
        c.wait(w)
    c.cancel_wait(w2)
    assert c.timers.next_deadline() == now + 10
    clock.advance(50)
    assert c.expire_waiters() == [w1]
    assert w1.cancelled
    assert dict(c.queue_stats("q"))["waiters"] == "1"
    c.add("q", b"x")
    assert c.woken == [w3]


def test_wait_with_a_past_deadline_fires_at_the_next_pop(make, clock):
    c = make()
    w = Waiter("w", "q", clock.now_ms())
    c.wait(w)
    assert c.timers.pop_due(clock.now_ms()) == [w]


def test_cancel_wait_on_a_deleted_queue(make):
    c = make()
    w = Waiter("w", "q", None)
    c.wait(w)
    c.delete("q")
    c.cancel_wait(w)
    assert w.cancelled and not w.queued


def test_wake_one_passes_a_wake_up_on(make):
    c = make()
    w1, w2 = two_waiting(c, None, None)
    c.add("q", b"x")
    c.woken = []                  # w1's client had gone
    assert c.wake_one("q") is w2 and c.woken == [w2]
    assert c.wake_one("nope") is None
    c.remove("q")
    c.wait(Waiter("3", "q", None))
    assert c.wake_one("q") is None                # nothing to hand out


# -- sessions (§1.5) -----------------------------------------------------------------------------
def test_disconnect_aborts_so_the_last_opened_comes_first(make):
    c = make()
    for d in (b"a", b"b", b"c"):
        c.add("q", d)
    s = Session("conn")
    for _ in range(2):
        s.add_open("q", c.remove("q", transactional=True).xid)
    c.add("other", b"o")
    s.add_open("other", c.remove("other", transactional=True).xid)
    assert c.abort_session(s) == 3
    assert datas(c, "q") == [b"b", b"a", b"c"]
    assert datas(c, "other") == [b"o"]
    assert s.all_open() == []
    assert dict(c.queue_stats("q"))["canceled_transactions"] == "2"


def test_confirm_is_all_or_nothing_through_a_session(make):
    c = make()
    s = Session("conn")
    for d in (b"a", b"b"):
        c.add("q", d)
        s.add_open("q", c.remove("q", transactional=True).xid)
    assert s.pop_oldest_n("q", 3) is None
    assert dict(c.queue_stats("q"))["open_transactions"] == "2"
    for xid in s.pop_oldest_n("q", 2):
        assert c.confirm_remove("q", xid)
    assert dict(c.queue_stats("q"))["open_transactions"] == "0"


def test_abort_session_after_delete_is_silent(make):
    c = make()
    c.add("q", b"a")
    s = Session("conn")
    s.add_open("q", c.remove("q", transactional=True).xid)
    c.delete("q")
    assert c.abort_session(s) == 0
    assert c.queue("q", create=False) is None


# -- aliases (§5.7, stand-alone) -----------------------------------------------------------------
def test_alias_add_writes_every_destination(make):
    c = make(aliases={"all": ("a", "b", "c"), "none": ()}, overrides={"b": {"max_items": 0}})
    assert not c.alias_add("all", b"xy")          # b refused: false, but a and c got it
    assert datas(c, "a") == datas(c, "c") == [b"xy"]
    assert c.alias_add("none", b"z")
    assert c.alias_stats("all") == [("put_items", "1"), ("put_bytes", "2"), ("children", "a,b,c")]
    assert c.alias_stats("none") == [("put_items", "1"), ("put_bytes", "1"), ("children", "")]
    assert c.alias_stats("a") is None
    with pytest.raises(ValueError, match="not an alias"):
        c.alias_add("a", b"x")


def test_alias_destination_may_be_a_fanout_master(make):
    c = make(aliases={"al": ("m",)})
    c.peek("m+c")
    assert c.alias_add("al", b"x")
    assert datas(c, "m+c") == [b"x"]


# -- reload, durability, close -------------------------------------------------------------------
def test_reload_applies_new_limits_and_sync_policy(make, tmp_path, factory):
    c = make()
    c.add("q", b"1")
    c.reload(config(tmp_path, default=QueueConfig(max_items=1, sync_journal="always")))
    assert not c.add("q", b"2")
    assert factory.made["q"].sync_policy == "always"
    assert c.config.default.max_items == 1


def test_autoflush_flushes_and_syncs_per_policy(make, factory, clock):
    c = make(overrides={"always": {"sync_journal": "always"}, "period": {"sync_journal": 1000}})
    c.add("never", b"x")
    c.add("always", b"x")
    c.add("period", b"x")
    never, always, period = (factory.made[n] for n in ("never", "always", "period"))
    assert (never.flushes, never.syncs) == (1, 0)
    assert (always.flushes, always.syncs) == (1, 1)
    assert period.syncs == 0                       # due a period after the first unsynced write
    clock.advance(999)
    c.add("period", b"y")
    assert period.syncs == 0
    clock.advance(1)
    c.add("period", b"z")
    assert period.syncs == 1
    c.add("period", b"w")                          # the next one is due a period later
    assert period.syncs == 1


def test_no_autoflush_leaves_batching_to_the_owner(make, factory):
    c = make(autoflush=False)
    c.add("a", b"x")
    c.add("b", b"x")
    assert factory.made["a"].flushes == 0
    assert list(c.dirty_storages()) == [factory.made["a"], factory.made["b"]]
    assert list(c.dirty_storages()) == []          # each batch's end is told what it wrote once
    factory.made["a"].flush()
    c.add("a", b"y")
    c.peek("b")                                    # visited, still dirty: listed again
    assert list(c.dirty_storages()) == [factory.made["a"], factory.made["b"]]
    factory.made["a"].flush()
    c.peek("a")                                    # visited, nothing to write
    assert list(c.dirty_storages()) == []


def test_dirty_storages_lists_a_shared_storage_once(make):
    shared = RecordingStorage()
    c = make(storage_factory=lambda name, qc: shared, autoflush=False)
    c.add("a", b"x")
    c.add("b", b"y")
    assert list(c.dirty_storages()) == [shared]


def test_close_evicts_waiters_and_closes_storages(make, factory):
    with make() as c:
        w = Waiter("w", "q", None)
        c.wait(w)
    assert factory.made["q"].closed and w.evicted and c.woken == [w]
    late = Waiter("late", "q", None)
    c.wait(late)                                   # a retry after close does not park again
    assert late.cancelled and dict(c.queue_stats("q"))["waiters"] == "0"
    c.close()


def test_delete_tells_the_factory(make, factory):
    forgotten = []
    factory.forget = forgotten.append
    c = make()
    c.add("q", b"x")
    c.delete("q")
    c.delete("q")
    assert forgotten == ["q"]


# -- the default storage factory -----------------------------------------------------------------
@pytest.fixture
def fake_backends(monkeypatch):
    """Stand-ins for the journal and command-log backends of the storage factory that log how
    they are called."""
    calls = []

    class Journal(RecordingStorage):
        def __init__(self, queue_path, name, clock, sync_policy="never", inline_pack=True, listing=None):
            super().__init__(sync_policy=sync_policy)
            calls.append(("Journal", queue_path, name, sync_policy))

        @staticmethod
        def erase_all(queue_path, name, listing=None):
            calls.append(("erase_all", queue_path, name))

    class PartitionLog:
        def __init__(self, p):
            self.p = p

        def storage_for(self, name):
            calls.append(("storage_for", self.p, name))
            return RecordingStorage()

        def queue_names(self):
            return ["from.cmdlog"] if self.p == 3 else []

        def live_count(self, name):
            return 0

        def close(self):
            calls.append(("close_log", self.p))

    def open_partition_logs(queue_path, partitions, clock, cfg):
        calls.append(("open", queue_path, list(partitions)))
        return {p: PartitionLog(p) for p in partitions}

    monkeypatch.setattr(storage_factory, "Journal", Journal)
    monkeypatch.setattr(storage_factory, "open_partition_logs", open_partition_logs)
    return calls


def test_default_factory_uses_journals(tmp_path, clock, fake_backends):
    c = QueueCollection(config(tmp_path, overrides={"s": {"sync_journal": 50}}), clock)
    c.add("q", b"x")
    c.add("s", b"x")
    qp = str(tmp_path / "queues")
    assert fake_backends == [("Journal", qp, "q", "never"), ("Journal", qp, "s", 50)]


def test_default_factory_without_keep_journal_erases_old_files(tmp_path, clock, fake_backends):
    c = QueueCollection(config(tmp_path, default=QueueConfig(keep_journal=False)), clock)
    c.add("q", b"x")
    assert isinstance(c.queue("q").storage, MemoryStorage)
    assert fake_backends == [("erase_all", str(tmp_path / "queues"), "q")]


@pytest.mark.parametrize("server", [False, True], ids=["library", "worker"])
def test_keep_journal_false_means_memory_for_cmdlog_queues_too(tmp_path, clock, fake_backends, server):
    """Issue 12: the two factories disagreed (the library used memory, the server a command
    log).  There is one now, and keep_journal = false means memory for both."""
    cfg = config(tmp_path, default=QueueConfig(keep_journal=False, storage="cmdlog"))
    factory = storage_factory.StorageFactory(cfg, clock, 0, 2) if server else None
    c = QueueCollection(cfg, clock, storage_factory=factory)
    c.add("email.send", b"x")
    assert isinstance(c.queue("email.send").storage, MemoryStorage)
    assert fake_backends == []                     # no journal erased, no command log opened


def test_default_factory_opens_cmdlog_partitions_lazily(tmp_path, clock, fake_backends):
    from lanner.queues.placement import partition_of
    qp = tmp_path / "queues"
    (qp / "cmdlog" / "3").mkdir(parents=True)
    (qp / "cmdlog" / "notes").mkdir()
    c = QueueCollection(config(tmp_path, default=QueueConfig(storage="cmdlog")), clock)
    c.load()
    assert c.names() == ["from.cmdlog"]
    c.add("jobs", b"x")
    p = partition_of("jobs")
    assert ("open", str(qp), [3]) in fake_backends
    assert ("storage_for", p, "jobs") in fake_backends
    c.add("jobs", b"y")
    assert sum(1 for e in fake_backends if e[0] == "open" and e[2] == [p]) == 1
    c.close()
    assert ("close_log", 3) in fake_backends


def test_max_queue_age_tick_sweeps_items_before_judging_emptiness(make, clock):
    c = make(default=QueueConfig(max_queue_age=100))
    c.add("q", b"x", clock.now_ms() + 50)
    clock.advance(200)
    assert c.expire_queues() == 1
    assert c.names() == []


# -- with the real backends ----------------------------------------------------------------------
def test_journal_round_trip_through_restart(tmp_path, clock):
    cfg = config(tmp_path)
    with QueueCollection(cfg, clock) as c:
        for d in (b"a", b"b", b"c"):
            c.add("jobs", d)
        c.remove("jobs", transactional=True)
        c.remove("jobs", transactional=True)
        c.peek("jobs+audit")
    assert sorted(os.listdir(tmp_path / "queues")) == ["jobs", "jobs+audit"]
    with QueueCollection(cfg, clock) as c:
        c.load()
        assert sorted(c.names()) == ["jobs", "jobs+audit"]
        assert [c.remove("jobs").data for _ in range(3)] == [b"a", b"b", b"c"]
        c.add("jobs", b"d")
        assert c.remove("jobs+audit").data == b"d"
        c.delete("jobs")
    assert os.listdir(tmp_path / "queues") == ["jobs+audit"]


def test_cmdlog_round_trip_through_restart(tmp_path, clock):
    cfg = config(tmp_path, default=QueueConfig(storage="cmdlog"))
    with QueueCollection(cfg, clock) as c:
        c.add("email.send", b"hello")
        c.add("email.send", b"world")
        c.remove("email.send", transactional=True)
        c.peek("empty.queue")
    with QueueCollection(cfg, clock) as c:
        c.load()
        assert sorted(c.names()) == ["email.send", "empty.queue"]
        assert c.remove("email.send").data == b"hello"
        assert c.remove("email.send").data == b"world"
