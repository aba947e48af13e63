"""PersistentQueue: every rule of reference §5 that lives in one queue."""
from __future__ import annotations

import dataclasses

import pytest

from lanner.config import QueueConfig
from lanner.queues.item import QItem
from lanner.queues.queue import PersistentQueue
from lanner.storage.seam import MemoryStorage
from lanner.queues.waiters import Waiter

try:
    from .test_queue_model import RecordingStorage
except ImportError:          # tests/engine is not a package: pytest put its directory on sys.path
    from test_queue_model import RecordingStorage


def make(clock, storage=None, *, child=False, sink=None, woken=None, **cfg) -> PersistentQueue:
    q = PersistentQueue("q", QueueConfig(**cfg), storage if storage is not None else RecordingStorage(),
                        clock, is_fanout_child=child, expire_sink=sink,
                        on_wake=woken.append if woken is not None else None)
    q.replay()
    return q


def datas(q) -> list[bytes]:
    return [i.data for i in q.memory_items()]


def stat(q, key) -> str:
    return dict(q.stats())[key]


# -- adds and limits (§5.3) ----------------------------------------------------------------------
def test_fifo_and_records(clock):
    q = make(clock)
    assert q.add(b"a") and q.add(b"bc")
    assert (q.length, q.size_bytes) == (2, 3)
    assert q.remove().data == b"a"
    assert q.remove().data == b"bc"
    assert q.remove() is None
    assert q.storage.ops() == [("replay",), ("add", b"a"), ("add", b"bc"), ("remove", b"a"), ("remove", b"bc")]


def test_add_stamps_add_time_and_expiry(clock):
    q = make(clock)
    q.add(b"x", clock.now_ms() + 5000)
    q.add(b"y", None, add_time_ms=123)
    x, y = q.memory_items()
    assert (x.add_time, x.expiry) == (clock.now_ms(), clock.now_ms() + 5000)
    assert (y.add_time, y.expiry) == (123, 0)


def test_max_item_size_is_inclusive(clock):
    q = make(clock, max_item_size=4)
    assert q.add(b"1234")
    assert not q.add(b"12345")
    assert datas(q) == [b"1234"]


def test_max_size_allows_overshoot(clock):
    q = make(clock, max_size=510)
    assert q.add(b"a" * 256)
    assert q.add(b"b" * 256)          # 256 < 510 before counting: accepted, now 512 bytes
    assert not q.add(b"c" * 256)
    assert q.size_bytes == 512


def test_max_items_refuses(clock):
    q = make(clock, max_items=2)
    assert q.add(b"1") and q.add(b"2")
    assert not q.add(b"3")
    assert stat(q, "discarded") == "0"


def test_limits_follow_the_config_in_force_however_it_was_set(clock):
    """An add compares the limits only when the queue is near the lowest of them (`_floor`, kept
    per config): a reload, or a config set on the queue, moves that floor with the limits, and
    the limits' own values (the defaults, past one-digit ints, too) decide at the edge."""
    q = make(clock)
    assert q.add(b"1") and q.add(b"22")
    q.reload(dataclasses.replace(q.config, max_items=2))
    assert not q.add(b"3")
    q.config = dataclasses.replace(q.config, max_items=3, max_size=4)
    assert q.add(b"3")                  # 3 bytes before it: under max_size
    q.config = dataclasses.replace(q.config, max_items=10)
    assert not q.add(b"4")              # 4 bytes: full by size
    q.config = dataclasses.replace(q.config, max_size=2**40, max_item_size=2)
    assert not q.add(b"xyz") and q.add(b"xy")
    q.config = dataclasses.replace(q.config, max_item_size=2**40 + 1)
    assert q.add(b"z" * 3000)
    assert q.length == 5


def test_open_transactions_do_not_count_toward_limits(clock):
    q = make(clock, max_items=1)
    q.add(b"1")
    q.remove(transactional=True)
    assert q.add(b"2")


def test_discard_old_when_full(clock):
    q = make(clock, max_items=2, discard_old_when_full=True)
    for d in (b"1", b"2", b"3", b"4"):
        assert q.add(d)
    assert datas(q) == [b"3", b"4"]
    assert stat(q, "discarded") == "2"
    assert q.storage.ops("remove") == [("remove", b"1"), ("remove", b"2")]


def test_discard_with_zero_limit_refuses(clock):
    q = make(clock, max_items=0, discard_old_when_full=True)
    assert not q.add(b"x")


def test_discard_sweeps_expired_head_first_then_discards(clock):
    # Kestrel's _remove sweeps before taking the head: the expired item counts as
    # expired, and one live item is still discarded.
    q = make(clock, max_items=2, discard_old_when_full=True)
    q.add(b"old", clock.now_ms() + 10)
    q.add(b"live")
    clock.advance(11)
    assert q.add(b"new")
    assert datas(q) == [b"new"]
    assert (stat(q, "expired_items"), stat(q, "discarded")) == ("1", "1")


def test_full_check_runs_before_the_expiry_sweep(clock):
    q = make(clock, max_items=2)
    q.add(b"a", clock.now_ms() + 10)
    q.add(b"b", clock.now_ms() + 10)
    clock.advance(11)
    assert not q.add(b"c")              # full of expired items: still refused
    assert q.length == 2
    assert q.remove() is None           # a get sweeps them
    assert stat(q, "expired_items") == "2"
    assert q.add(b"c")


def test_add_sweeps_expired_head_before_appending(clock):
    q = make(clock)
    q.add(b"a", clock.now_ms() + 10)
    clock.advance(11)
    q.add(b"b")
    assert datas(q) == [b"b"]
    assert q.storage.ops("add", "remove")[-2:] == [("remove", b"a"), ("add", b"b")]


def test_fanout_only_master_stores_nothing(clock):
    q = make(clock, fanout_only=True)
    assert q.add(b"x")
    assert q.length == 0 and q.storage.ops("add") == []
    assert stat(q, "total_items") == "0"


def test_fanout_only_has_no_effect_on_a_child(clock):
    q = make(clock, child=True, fanout_only=True)
    assert q.add(b"x")
    assert datas(q) == [b"x"]


def test_fanout_only_still_refuses_oversized_items(clock):
    q = make(clock, fanout_only=True, max_item_size=1)
    assert not q.add(b"xx")


def test_count_total(clock):
    q = make(clock)
    q.add(b"a")
    q.add(b"b", count_total=False)
    assert stat(q, "total_items") == "1"
    assert q.length == 2


def test_closed_queue_refuses_everything(clock):
    q = make(clock)
    q.add(b"a")
    q.close()
    assert not q.add(b"b")
    assert q.remove() is None and q.peek() is None
    assert q.storage.closed


# -- expiry (§5.2) -------------------------------------------------------------------------------
def test_expired_only_strictly_after_expiry(clock):
    q = make(clock)
    q.add(b"a", clock.now_ms() + 100)
    clock.advance(100)
    assert q.peek().data == b"a"        # expiry == now: still alive
    clock.advance(1)
    assert q.peek() is None
    assert stat(q, "expired_items") == "1"


def test_max_age_clamps_stored_expiry(clock):
    q = make(clock, max_age=1000)
    now = clock.now_ms()
    q.add(b"none")
    q.add(b"later", now + 5000)
    q.add(b"sooner", now + 10)
    assert [i.expiry for i in q.memory_items()] == [now + 1000, now + 1000, now + 10]


def test_reload_shortening_max_age_expires_old_items(clock):
    q = make(clock, max_age=10_000)
    q.add(b"old")
    clock.advance(2000)
    q.add(b"young")
    q.reload(dataclasses.replace(q.config, max_age=1500))
    assert q.peek().data == b"young"      # re-clamped from add time: old is 2000 ms old
    assert stat(q, "expired_items") == "1"


def test_reload_adding_max_age_applies_to_items_without_expiry(clock):
    q = make(clock)
    q.add(b"forever")
    clock.advance(5000)
    q.reload(dataclasses.replace(q.config, max_age=1000))
    assert q.peek() is None


def test_is_expired(clock):
    q = make(clock, max_age=100)
    now = clock.now_ms()
    assert not q.is_expired(QItem(now, 0, b""), now + 100)
    assert q.is_expired(QItem(now, 0, b""), now + 101)
    assert q.is_expired(QItem(now, now + 5, b""), now + 6)
    q.reload(QueueConfig())
    assert not q.is_expired(QItem(now, 0, b""), now + 10**9)


def test_sweep_stops_at_first_live_item(clock):
    q = make(clock)
    q.add(b"live")
    q.add(b"dead", clock.now_ms() + 1)
    clock.advance(10)
    assert q.discard_expired() == 0
    assert q.length == 2


def test_max_expire_sweep_caps_every_sweep(clock):
    q = make(clock, max_expire_sweep=2)
    for i in range(5):
        q.add(b"%d" % i, clock.now_ms() + 1)
    clock.advance(2)
    assert q.discard_expired() == 2
    assert q.discard_expired(limit=1) == 1
    # A remove sweeps at most 2 more, then takes the head even though it expired (HEAD semantics).
    assert q.remove() is None
    assert q.length == 0
    assert stat(q, "expired_items") == "5"
    q.add(b"a", clock.now_ms() + 1)
    q.add(b"b", clock.now_ms() + 1)
    q.add(b"c", clock.now_ms() + 1)
    clock.advance(2)
    assert q.remove().data == b"c"


def test_expire_to_queue_sink_gets_data_after_the_sweep(clock):
    moved = []
    q = make(clock, sink=lambda data, now, xid: moved.append((data, now, q.length)))
    q.add(b"a", clock.now_ms() + 1)
    q.add(b"b", clock.now_ms() + 1)
    q.add(b"c")
    clock.advance(5)
    assert q.discard_expired() == 2
    now = clock.now_ms()
    assert moved == [(b"a", now, 1), (b"b", now, 1)]
    assert stat(q, "expired_items") == "2"


def test_expire_sink_into_the_same_queue(clock):
    q = make(clock)
    q.expire_sink = lambda data, now, xid: q.add(data, None, now)
    q.add(b"a", clock.now_ms() + 1)
    clock.advance(5)
    q.add(b"b")
    assert datas(q) == [b"a", b"b"]
    assert q.memory_items()[0].add_time == clock.now_ms()


# -- removes, transactions (§5.9) ----------------------------------------------------------------
def test_transactional_remove_assigns_xids(clock):
    q = make(clock)
    for d in (b"a", b"b", b"c"):
        q.add(d)
    a = q.remove(transactional=True)
    b = q.remove(transactional=True)
    assert (a.xid, b.xid) == (1, 2)
    assert q.open_items() == {1: a, 2: b}
    assert q.confirm_remove(1)
    assert not q.confirm_remove(1)
    c = q.remove(transactional=True)
    assert c.xid == 3
    assert q.storage.ops("open", "confirm") == [("open", b"a", 1), ("open", b"b", 2),
                                                ("confirm", b"a", 1), ("open", b"c", 3)]


def test_unremove_puts_item_back_at_head_and_wakes_one(clock):
    woken = []
    q = make(clock, woken=woken)
    q.add(b"a")
    q.add(b"b")
    item = q.remove(transactional=True)
    w1, w2 = Waiter("k1", "q", None), Waiter("k2", "q", None)
    q.waiters.add(w1)
    q.waiters.add(w2)
    assert q.unremove(item.xid)
    assert datas(q) == [b"a", b"b"]
    assert item.xid == 0
    assert woken == [w1] and len(q.waiters) == 1
    assert stat(q, "canceled_transactions") == "1"
    assert q.storage.ops("unremove") == [("unremove", b"a", 1)]
    assert not q.unremove(1)


def test_transactions_counted_when_non_empty_even_if_expired(clock):
    q = make(clock)
    assert q.remove(transactional=True) is None
    assert stat(q, "transactions") == "0"
    q.add(b"a", clock.now_ms() + 1)
    clock.advance(2)
    assert q.remove(transactional=True) is None
    assert stat(q, "transactions") == "1"
    q.add(b"b")
    q.remove()                             # plain removes are not transactions
    assert stat(q, "transactions") == "1"


def test_xids_skip_open_ones_and_wrap(clock):
    storage = RecordingStorage([("add", 0, 0, b"x"), ("open", 0x7FFFFFFE)])
    q = make(clock, storage)               # restart rolls xid 0x7FFFFFFE back; counter stays
    q.add(b"y")
    q.add(b"z")
    assert q.remove(transactional=True).xid == 0x7FFFFFFF
    assert q.remove(transactional=True).xid == 1
    assert q.remove(transactional=True).xid == 2


def test_next_xid_skips_xids_still_open(clock):
    q = make(clock)
    for d in (b"a", b"b", b"c"):
        q.add(d)
    first = q.remove(transactional=True)
    q._xid = 0                             # as after a rewrite left the counter behind an open xid
    assert q.remove(transactional=True).xid == first.xid + 1


def test_open_transaction_timeout_recycles_one_per_remove(clock):
    q = make(clock, open_transaction_timeout=1000)
    for d in (b"a", b"b", b"c", b"d"):
        q.add(d)
    xid_a = q.remove(transactional=True).xid
    xid_b = q.remove(transactional=True).xid
    clock.advance(1000)
    assert q.remove().data == b"c"         # deadline == now: not yet timed out
    clock.advance(1)
    assert q.remove().data == b"a"         # the oldest is aborted and redelivered
    assert sorted(q.open_items()) == [xid_b]
    assert stat(q, "canceled_transactions") == "1"
    assert not q.confirm_remove(xid_a)     # the original holder's confirm is a no-op
    again = q.remove(transactional=True)   # b's turn now: one per remove
    assert again.data == b"b" and again.xid not in (xid_a, xid_b)
    assert stat(q, "canceled_transactions") == "2"
    assert q.remove().data == b"d"
    assert q.remove() is None


def test_open_transaction_timeout_does_nothing_on_an_empty_queue(clock):
    q = make(clock, open_transaction_timeout=10)
    q.add(b"a")
    a = q.remove(transactional=True)
    clock.advance(100)
    assert q.remove() is None
    assert q.open_items() == {a.xid: a}
    q.add(b"b")
    assert q.remove().data == b"a"


def test_open_transaction_timeout_records_abort_then_remove(clock):
    q = make(clock, open_transaction_timeout=10)
    q.add(b"a")
    q.add(b"b")
    q.remove(transactional=True)
    clock.advance(11)
    assert q.remove(transactional=True).data == b"a"
    assert q.storage.ops("open", "unremove")[-3:] == [("open", b"a", 1), ("unremove", b"a", 1),
                                                      ("open", b"a", 2)]


def test_restart_rolls_back_in_descending_xid_order(clock):
    disk = [("add", 1, 0, b"a"), ("add", 2, 0, b"b"), ("add", 3, 0, b"c"), ("add", 4, 0, b"d"),
            ("open", 1), ("open", 2), ("open", 3), ("confirm", 2)]
    storage = RecordingStorage(disk)
    q = make(clock, storage)
    assert storage.ops("unremove") == [("unremove", b"c", 3), ("unremove", b"a", 1)]
    assert datas(q) == [b"a", b"c", b"d"]
    assert q.open_items() == {}
    assert (stat(q, "total_items"), stat(q, "canceled_transactions")) == ("4", "0")
    assert q.remove(transactional=True).xid == 4     # counter continues from the journal
    # A second restart sees the same queue.
    q2 = make(clock, RecordingStorage(disk))
    assert datas(q2) == [b"a", b"c", b"d"] and q2.open_items() == {}


def test_confirm_and_abort_of_unknown_xid_are_ignored(clock):
    q = make(clock)
    assert not q.confirm_remove(9) and not q.unremove(9)
    assert q.storage.ops("confirm", "unremove") == []


def test_peek_does_not_remove(clock):
    q = make(clock)
    q.add(b"a")
    assert q.peek().data == b"a"
    assert q.peek().data == b"a"
    assert q.length == 1 and q.storage.ops("remove") == []


def test_flush_leaves_open_transactions(clock):
    q = make(clock)
    for d in (b"a", b"b", b"c"):
        q.add(d)
    a = q.remove(transactional=True)
    q.flush()
    assert q.length == 0
    assert q.storage.ops("remove") == [("remove", b"b"), ("remove", b"c")]
    assert stat(q, "total_flushes") == "1"
    assert q.unremove(a.xid)
    assert datas(q) == [b"a"]


# -- read-behind (§5.8) --------------------------------------------------------------------------
class ReadBehindStorage(RecordingStorage):
    """Keeps the items added during read-behind 'on disk' and hands them back in order."""

    can_read_behind = True

    def __init__(self) -> None:
        super().__init__()
        self.in_read_behind = False
        self.behind: list[QItem] = []
        self.fills: list[int] = []

    def start_read_behind(self) -> None:
        self.in_read_behind = True

    def record_add(self, item: QItem) -> None:
        super().record_add(item)
        if self.in_read_behind:
            self.behind.append(QItem(item.add_time, item.expiry, item.data))

    def fill_read_behind(self, max_bytes: int, now_ms: int) -> list[QItem]:
        self.fills.append(max_bytes)
        out, n = [], 0
        while self.behind and n < max_bytes:
            item = self.behind.pop(0)
            out.append(item)
            n += len(item.data)
        if not self.behind:
            self.in_read_behind = False
        return out

    def drop_behind(self, n: int):
        """A flush: the items 'on disk' go unread, each recorded as a plain remove."""
        if not self.in_read_behind:
            return None
        assert n == len(self.behind)
        for item in self.behind:
            self.record_remove(item)
        self.behind = []
        self.in_read_behind = False
        return None, None


def test_read_behind_keeps_a_prefix_in_memory(clock):
    q = make(clock, ReadBehindStorage(), max_memory_size=1024)
    for i in range(12):
        assert q.add(bytes([i]) * 128)
    assert (q.length, q.size_bytes) == (12, 12 * 128)
    assert (stat(q, "mem_items"), stat(q, "mem_bytes")) == ("8", "1024")
    assert q.storage.in_read_behind
    got = [q.remove().data[0] for _ in range(12)]
    assert got == list(range(12))
    assert not q.storage.in_read_behind
    assert q.remove() is None


def test_read_behind_refills_after_every_removal(clock):
    q = make(clock, ReadBehindStorage(), max_memory_size=256)
    for i in range(4):
        q.add(bytes([i]) * 128)
    assert stat(q, "mem_items") == "2"
    q.remove()
    assert (stat(q, "mem_items"), q.storage.fills) == ("2", [128])
    q.flush()
    assert q.length == 0 and not q.storage.in_read_behind


def test_flush_in_read_behind_reads_nothing_back(clock):
    """Issue 8: the items only the storage holds are recorded removed without being read."""
    q = make(clock, ReadBehindStorage(), max_memory_size=256)
    for i in range(8):
        q.add(bytes([i]) * 128)
    assert (stat(q, "mem_items"), len(q.storage.behind)) == ("2", 6)
    q.flush()
    assert q.storage.fills == []
    assert (q.length, q.size_bytes, stat(q, "mem_bytes")) == (0, 0, "0") and not q.storage.in_read_behind
    # every item recorded removed once (the unread ones first: a journal's removes are counts)
    removed = sorted(c[1] for c in q.storage.calls if c[0] == "remove")
    assert removed == [bytes([i]) * 128 for i in range(8)]
    assert stat(q, "total_flushes") == "1"


def test_read_behind_keeps_at_least_the_head_in_memory(clock):
    q = make(clock, ReadBehindStorage(), max_memory_size=0)
    q.add(b"a")
    q.add(b"b")
    assert (stat(q, "mem_items"), stat(q, "items")) == ("1", "2")
    assert q.peek().data == b"a"
    assert q.remove().data == b"a"
    assert q.remove().data == b"b"
    assert q.remove() is None


def test_memory_storage_never_reads_behind(clock):
    q = make(clock, MemoryStorage(), max_memory_size=10)
    for _ in range(5):
        q.add(b"x" * 10)
    assert stat(q, "mem_items") == "5"


# -- stats (§4.2) --------------------------------------------------------------------------------
KEYS = ["items", "bytes", "total_items", "logsize", "expired_items", "mem_items", "mem_bytes", "age",
        "discarded", "waiters", "open_transactions", "transactions", "canceled_transactions",
        "total_flushes", "journal_rewrites", "journal_rotations"]


def test_stats_keys_in_order(clock):
    q = make(clock)
    assert [k for k, _ in q.stats()] == KEYS
    q.children = ["q+a", "q+b"]
    assert q.stats()[-1] == ("children", "q+a,q+b")
    assert [k for k, _ in q.stats()] == KEYS + ["children"]


def test_stats_values(clock):
    q = make(clock)
    q.add(b"hello")
    q.add(b"abc")
    q.remove(transactional=True)
    q.waiters.add(Waiter("k", "q", None))
    s = dict(q.stats())
    assert s["items"] == "1" and s["bytes"] == "3" and s["total_items"] == "2"
    assert s["mem_items"] == "1" and s["mem_bytes"] == "3"
    assert s["open_transactions"] == "1" and s["transactions"] == "1" and s["waiters"] == "1"
    assert s["logsize"] == "0" and s["journal_rewrites"] == "0" and s["journal_rotations"] == "0"


def test_age_is_zero_until_first_remove_then_age_of_last_removed(clock):
    q = make(clock)
    q.add(b"a")
    clock.advance(500)
    q.add(b"b")
    clock.advance(1000)
    assert stat(q, "age") == "0"           # deviation 6: not "now - epoch"
    q.remove()                             # removes a, added 1500 ms ago
    clock.advance(200)
    assert stat(q, "age") == "1700"
    q.remove()
    assert stat(q, "age") == "0"           # bytes == 0


def test_age_is_zero_for_zero_length_items(clock):
    q = make(clock)
    q.add(b"")
    q.add(b"")
    clock.advance(10)
    q.remove()
    assert stat(q, "age") == "0"


# -- life cycle ----------------------------------------------------------------------------------
def test_close_evicts_waiters_and_destroy_erases(clock):
    woken = []
    q = make(clock, woken=woken)
    w = Waiter("k", "q", None)
    q.waiters.add(w)
    q.destroy()
    assert woken == [w] and w.evicted and len(q.waiters) == 0
    assert q.storage.closed and q.storage.erased
    q.close()                              # idempotent
    assert woken == [w]


def test_add_wakes_exactly_one_waiter(clock):
    woken = []
    q = make(clock, woken=woken)
    ws = [Waiter(i, "q", None) for i in range(3)]
    for w in ws:
        q.waiters.add(w)
    q.add(b"a")
    assert woken == [ws[0]]
    q.add(b"b")
    assert woken == ws[:2]
    assert len(q.waiters) == 1


def test_queue_view_protocol(clock):
    q = make(clock)
    q.add(b"ab")
    item = q.remove(transactional=True)
    q.add(b"c")
    assert (q.length, q.size_bytes, q.memory_bytes) == (1, 1, 1)
    assert list(q.memory_items())[0].data == b"c"
    assert q.open_items() == {item.xid: item}


def test_before_add_and_after_remove_hooks(clock):
    seen = []

    class Hooked(RecordingStorage):
        def before_add(self, view, config, now_ms):
            seen.append(("before_add", view.length, now_ms))

        def after_remove(self, view, config, now_ms):
            seen.append(("after_remove", view.length, now_ms))

    q = make(clock, Hooked())
    now = clock.now_ms()
    q.add(b"a")
    q.remove()
    assert q.remove() is None              # nothing returned: no hook
    assert seen == [("before_add", 0, now), ("after_remove", 0, now)]
