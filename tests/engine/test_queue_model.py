"""PersistentQueue against a simple reference model, with restarts (hypothesis).

The storage under test is a parameter: `make_storage(path, name, clock, config)`
opens the queue's storage in directory `path` (fresh per example); calling it
again with the same arguments after `close()` must reopen what was written,
as a restart does.  Adding a backend (Journal, CmdlogStorage) is one entry in
STORAGE_FACTORIES.

`RecordingStorage` here is also the recording double the other queue and
collection tests use: it logs every call and keeps an op log ("the disk") that
its `replay` interprets with Kestrel's journal semantics (§6.3).
"""
from __future__ import annotations

import itertools
from collections import deque

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule, run_state_machine_as_test

from lanner.clock import FakeClock
from lanner.config import QueueConfig
from lanner.queues.item import QItem
from lanner.queues.queue import PersistentQueue
from lanner.storage.seam import ReplayState


class RecordingStorage:
    """Storage double: `calls` logs every seam call; `disk` is the durable op log."""

    can_read_behind = False
    in_read_behind = False
    logsize = 0
    rewrites = 0
    rotations = 0
    check_due = True            # the queue calls its before_add / after_remove (seam.py, point 3)

    def __init__(self, disk: list | None = None, sync_policy="never") -> None:
        self.disk = [] if disk is None else disk
        self.calls: list[tuple] = []
        self.sync_policy = sync_policy
        self.dirty = False
        self.flushes = 0
        self.syncs = 0
        self.closed = False
        self.erased = False

    def replay(self, config) -> ReplayState:
        self.calls.append(("replay",))
        return replay_log(self.disk)

    def _log(self, op: tuple, call: tuple) -> None:
        self.disk.append(op)
        self.calls.append(call)
        self.dirty = True

    def record_add(self, item: QItem) -> None:
        self._log(("add", item.add_time, item.expiry, item.data), ("add", item.data))

    def record_remove(self, item: QItem) -> None:
        self._log(("remove",), ("remove", item.data))

    def record_open(self, item: QItem, xid: int) -> None:
        self._log(("open", xid), ("open", item.data, xid))

    def record_unremove(self, item: QItem, xid: int) -> None:
        self._log(("unremove", xid), ("unremove", item.data, xid))

    def record_confirm(self, item: QItem, xid: int) -> None:
        self._log(("confirm", xid), ("confirm", item.data, xid))

    def before_add(self, view, config, now_ms: int) -> None:
        pass

    def after_remove(self, view, config, now_ms: int) -> None:
        pass

    def start_read_behind(self) -> None:
        raise AssertionError("cannot read behind")

    def fill_read_behind(self, max_bytes: int, now_ms: int) -> list[QItem]:
        raise AssertionError("cannot read behind")

    def flush(self) -> None:
        self.flushes += 1
        if self.sync_policy == "never":
            self.dirty = False

    def sync(self) -> None:
        self.syncs += 1
        self.dirty = False

    def close(self) -> None:
        self.closed = True

    def erase(self) -> None:
        self.erased = True
        self.disk.clear()

    def ops(self, *kinds: str) -> list[tuple]:
        """The logged calls, optionally only those of the given kinds."""
        return [c for c in self.calls if not kinds or c[0] in kinds]


def replay_log(disk: list) -> ReplayState:
    """Kestrel's replay (§6.3) of an op log: adds append, remove drops the head,
    open reserves the head under an xid, unremove puts it back at the head."""
    st = ReplayState()
    items: deque[QItem] = st.items
    for op in disk:
        kind = op[0]
        if kind == "add":
            items.append(QItem(op[1], op[2], op[3]))
            st.replayed_adds += 1
        elif kind == "remove":
            if items:
                items.popleft()
        elif kind == "open":
            if items:
                item = items.popleft()
                item.xid = op[1]
                st.open_transactions[op[1]] = item
            st.xid_counter = op[1]
        elif kind == "unremove":
            item = st.open_transactions.pop(op[1], None)
            if item is not None:
                item.xid = 0
                items.appendleft(item)
        elif kind == "confirm":
            st.open_transactions.pop(op[1], None)
    st.total_items = len(items)
    st.total_bytes = sum(len(i.data) for i in items)
    return st


# -- storage backends under test ---------------------------------------------------------------
_DISKS: dict[tuple[str, str], list] = {}


def recording_storage(path, name, clock, config) -> RecordingStorage:
    return RecordingStorage(_DISKS.setdefault((str(path), name), []))


def journal_storage(path, name, clock, config):
    from lanner.storage.journal.journal import Journal
    return Journal(str(path), name, clock)


_PARTITION_LOGS: dict[str, object] = {}


def cmdlog_storage(path, name, clock, config):
    from lanner.storage.cmdlog.partition import open_partition_logs
    from lanner.queues.placement import partition_of
    release(path)                      # a restart: the old process's log is closed first
    p = partition_of(name)
    plog = _PARTITION_LOGS[str(path)] = open_partition_logs(str(path), [p], clock, None)[p]
    return plog.storage_for(name)


def release(path) -> None:
    """Close what a backend keeps open beyond the queue's storage (a partition log)."""
    plog = _PARTITION_LOGS.pop(str(path), None)
    if plog is not None:
        plog.close()


STORAGE_FACTORIES = {
    "recording": recording_storage,
    "journal": journal_storage,
    "cmdlog": cmdlog_storage,
}
REPLAY_DROPS_EXPIRED = {"cmdlog"}      # workq semantics: replay forgets jobs whose TTL passed


@pytest.fixture(params=sorted(STORAGE_FACTORIES))
def make_storage(request):
    factory = STORAGE_FACTORIES[request.param]
    factory.replay_drops_expired = request.param in REPLAY_DROPS_EXPIRED
    return factory


# -- the model ---------------------------------------------------------------------------------
MAX_ITEMS = 6
TTL = 1000        # ms; items added "with expiry" live this long
payloads = st.binary(min_size=0, max_size=12)


class QueueMachine(RuleBasedStateMachine):
    make_storage = None
    base_path = None
    replay_drops_expired = False     # workq semantics: a command log forgets expired jobs at replay
    counter = itertools.count()

    @initialize(discard=st.booleans(), max_age=st.sampled_from([None, 1500, 5000]), tiny=st.booleans())
    def setup(self, discard, max_age, tiny):
        self.path = self.base_path / f"ex{next(self.counter)}"
        self.path.mkdir()
        self.clock = FakeClock()
        # Tiny sizes make a journal read behind, rotate and rewrite all the time.
        sizes = dict(max_memory_size=20, max_journal_size=200, default_journal_size=50,
                     min_journal_compact_delay=None) if tiny else {}
        self.config = QueueConfig(max_items=MAX_ITEMS, discard_old_when_full=discard, max_age=max_age,
                                  **sizes)
        self.queue = self.open_queue()
        self.items: deque[tuple[bytes, int, int]] = deque()   # (data, add_time, stored expiry)
        self.open: dict[int, tuple[bytes, int, int]] = {}
        self.expired = 0
        self.discarded = 0

    def open_queue(self) -> PersistentQueue:
        storage = self.make_storage(self.path, "q", self.clock, self.config)
        q = PersistentQueue("q", self.config, storage, self.clock)
        q.replay()
        return q

    def model_expired(self, entry, now) -> bool:
        _, add_time, expiry = entry
        if self.config.max_age is not None:
            cap = add_time + self.config.max_age
            expiry = cap if not expiry or cap < expiry else expiry
        return expiry != 0 and expiry < now

    def sweep(self) -> None:
        now = self.clock.now_ms()
        while self.items and self.model_expired(self.items[0], now):
            self.items.popleft()
            self.expired += 1

    @rule(data=payloads, with_expiry=st.booleans())
    def add(self, data, with_expiry):
        now = self.clock.now_ms()
        expiry = now + TTL if with_expiry else 0
        ok = self.queue.add(data, expiry or None)
        full = len(self.items) >= MAX_ITEMS
        if full and not self.config.discard_old_when_full:
            assert not ok
            return
        assert ok
        while len(self.items) >= MAX_ITEMS:
            self.sweep()
            if self.items:
                self.items.popleft()
                self.discarded += 1
        self.sweep()
        stored = expiry
        if self.config.max_age is not None:
            cap = now + self.config.max_age
            stored = cap if not stored or cap < stored else stored
        self.items.append((data, now, stored))

    @rule(transactional=st.booleans())
    def remove(self, transactional):
        had = bool(self.items)
        if had:
            self.sweep()
        item = self.queue.remove(transactional)
        if not self.items:
            assert item is None
            return
        data, _, _ = self.items.popleft()
        assert item is not None and item.data == data
        if transactional:
            assert item.xid not in self.open
            self.open[item.xid] = (item.data, item.add_time, item.expiry)

    @rule()
    def peek(self):
        if self.items:
            self.sweep()
        item = self.queue.peek()
        if self.items:
            assert item is not None and item.data == self.items[0][0]
        else:
            assert item is None

    @precondition(lambda self: self.open)
    @rule(pick=st.integers(0, 1000))
    def confirm(self, pick):
        xid = sorted(self.open)[pick % len(self.open)]
        assert self.queue.confirm_remove(xid)
        del self.open[xid]

    @precondition(lambda self: self.open)
    @rule(pick=st.integers(0, 1000))
    def abort(self, pick):
        xid = sorted(self.open)[pick % len(self.open)]
        assert self.queue.unremove(xid)
        self.items.appendleft(self.open.pop(xid))

    @rule(xid=st.integers(1, 50))
    def confirm_unknown(self, xid):
        if xid not in self.open:
            assert not self.queue.confirm_remove(xid)
            assert not self.queue.unremove(xid)

    @rule()
    def flush(self):
        self.queue.flush()
        self.items.clear()

    @rule(ms=st.one_of(st.sampled_from([500, 1000, 1500]), st.integers(1, 2500)))
    def advance(self, ms):
        self.clock.advance(ms)

    @rule()
    def expire(self):
        n = self.queue.discard_expired()
        before = self.expired
        if self.items:
            self.sweep()
        assert n == self.expired - before

    @rule()
    def restart(self):
        self.queue.close()
        self.queue = self.open_queue()
        # Every open read comes back at the head, lowest xid first (§5.9).
        for xid in sorted(self.open, reverse=True):
            self.items.appendleft(self.open[xid])
        self.open.clear()
        self.expired = self.discarded = 0
        if self.replay_drops_expired:
            now = self.clock.now_ms()
            self.items = deque(e for e in self.items if not (e[2] and e[2] < now))

    @invariant()
    def same_state(self):
        q = self.queue
        assert q.length == len(self.items)
        assert q.size_bytes == sum(len(d) for d, _, _ in self.items)
        model = [d for d, _, _ in self.items]
        mem = [i.data for i in q.memory_items()]
        assert mem == model[:len(mem)]            # read-behind keeps a prefix in memory
        assert bool(mem) == bool(model)
        if not q.storage.in_read_behind:
            assert mem == model
        assert sorted(q.open_items()) == sorted(self.open)
        assert q.expired_items == self.expired
        assert q.discarded == self.discarded

    def teardown(self):
        self.queue.close()
        release(self.path)


def test_queue_matches_model(make_storage, tmp_path):
    class Machine(QueueMachine):
        pass
    Machine.make_storage = staticmethod(make_storage)
    Machine.replay_drops_expired = make_storage.replay_drops_expired
    Machine.base_path = tmp_path
    run_state_machine_as_test(
        Machine,
        settings=settings(max_examples=120, stateful_step_count=40, deadline=None,
                          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                 HealthCheck.too_slow]))
