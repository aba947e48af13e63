"""Property: random queue operations on CmdlogStorage, with restarts at random
points, tiny segments (constant rotation) and cleaner passes beside the live
appender, always replay to what a simple Kestrel-style model holds.

The model is the queue's own bookkeeping: a FIFO of items where an aborted
read goes back to the head, open reads by xid, and at restart every item whose
expiry has passed disappears (replay skips expired adds) and the remaining
open reads are rolled back to the head in their original order (§5.9)."""
from __future__ import annotations

import os
import shutil
import tempfile
from collections import deque

from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from lanner.clock import FakeClock
from lanner.storage.cmdlog.partition import PartitionLog
from lanner.storage.cmdlog.replay import Replayer, replay_directory
from lanner.queues.item import QItem
from lanner.storage.cmdlog.rewrite import rewrite_segments

QUEUES = st.sampled_from(["jobs", "jobs", "jobs", "mail.out+fan"])


def _view(items) -> list[tuple]:
    return [(i.data, i.add_time, i.expiry) for i in items]


class CmdlogModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp()
        self.dir = os.path.join(self.root, "p")
        self.clock = FakeClock(1_800_000_000_000)
        self.queues: dict[str, dict] = {}          # name -> {"st", "ready", "opens", "xid"}
        self.serial = 0
        self.plog: PartitionLog | None = None
        self._fsync = os.fsync
        os.fsync = lambda fd: None                 # durability is not what this property checks

    @initialize(segment_size=st.integers(120, 900))
    def open_log(self, segment_size):
        self.segment_size = segment_size
        self.plog = PartitionLog(self.dir, self.clock, segment_size=segment_size)

    def teardown(self) -> None:
        try:
            if self.plog is not None:
                self.restart()
                self.plog.close()
        finally:
            os.fsync = self._fsync
            shutil.rmtree(self.root, ignore_errors=True)

    def queue(self, name: str) -> dict:
        q = self.queues.get(name)
        if q is None:
            st_ = self.plog.storage_for(name)
            state = st_.replay(None)
            assert not state.items and not state.open_transactions
            q = self.queues[name] = {"st": st_, "ready": deque(), "opens": {}, "xid": state.xid_counter}
        return q

    @rule(name=QUEUES, count=st.integers(1, 4), ttl=st.sampled_from([None, None, 1, 50, 2_000]),
          pad=st.integers(0, 40))
    def add(self, name, count, ttl, pad):
        q = self.queue(name)
        for _ in range(count):
            self.serial += 1
            now = self.clock.now_ms()
            item = QItem(now, 0 if ttl is None else now + ttl,
                         b"%s-%d" % (name.encode(), self.serial) + b"." * pad)
            q["st"].record_add(item)
            q["ready"].append(item)

    @rule(name=QUEUES, roll=st.integers(0, 2))
    def get(self, name, roll):
        q = self.queue(name)
        if q["ready"] and roll == 0:
            q["st"].record_remove(q["ready"].popleft())

    @rule(name=QUEUES, count=st.integers(1, 3))
    def open(self, name, count):
        q = self.queue(name)
        for _ in range(count):
            if not q["ready"]:
                break
            item = q["ready"].popleft()
            q["xid"] += 1
            item.xid = q["xid"]
            q["opens"][item.xid] = item
            q["st"].record_open(item, item.xid)

    @rule(name=QUEUES, picks=st.lists(st.tuples(st.integers(0, 5), st.booleans()), min_size=1, max_size=3))
    def close_reads(self, name, picks):
        """Confirm (True) or abort (False) open reads, several in a chosen order."""
        q = self.queue(name)
        for pick, confirm in picks:
            if not q["opens"]:
                break
            xids = sorted(q["opens"])
            xid = xids[pick % len(xids)]
            item = q["opens"].pop(xid)
            if confirm:
                q["st"].record_confirm(item, xid)
            else:
                q["ready"].appendleft(item)
                q["st"].record_unremove(item, xid)
            item.xid = 0

    @rule(name=QUEUES, roll=st.integers(0, 4))
    def flush_queue(self, name, roll):
        q = self.queue(name)
        while q["ready"] and roll == 0:
            q["st"].record_remove(q["ready"].popleft())

    @rule(name=QUEUES, roll=st.integers(0, 4))
    def erase(self, name, roll):
        if roll == 0 and name in self.queues:          # rarer than the other rules
            self.queues.pop(name)["st"].erase()

    @rule(ms=st.integers(0, 3_000))
    def advance(self, ms):
        self.clock.advance(ms)

    @rule()
    def flush(self):
        self.plog.flush()

    @rule()
    def rewrite(self):
        self.plog.flush()
        rewrite_segments(self.dir, self.clock)

    def expected(self, q: dict, now: int) -> tuple[list[QItem], list[QItem]]:
        """What replay at `now` must rebuild: unexpired queued items in order,
        unexpired open reads in xid order."""
        alive = [i for i in q["ready"] if not (i.expiry and i.expiry < now)]
        opens = [q["opens"][x] for x in sorted(q["opens"])]
        return alive, [i for i in opens if not (i.expiry and i.expiry < now)]

    @precondition(lambda self: self.plog is not None)
    @invariant()
    def log_replays_to_the_model(self):
        """After every step: the flushed log, replayed read-only, holds exactly the model."""
        self.plog.flush()
        now = self.clock.now_ms()
        r = Replayer(now * 1_000_000)
        replay_directory(self.dir, r)
        jobs = r.queue_jobs()
        for name, q in self.queues.items():
            alive, opens = self.expected(q, now)
            ready, leased, scheduled = jobs.pop(name.encode(), ([], [], []))
            assert [j.cmd.id for j in ready] == [i.job_id for i in alive], name
            assert [j.cmd.id for j in leased] == [i.job_id for i in opens], name
            assert scheduled == []
        assert jobs == {}

    @precondition(lambda self: self.plog is not None)
    @rule(roll=st.integers(0, 2))
    def maybe_restart(self, roll):
        if roll == 0:                                   # rarer, so open reads live a while
            self.restart()

    def restart(self):
        self.plog.close()
        now = self.clock.now_ms()
        self.plog = PartitionLog(self.dir, self.clock, segment_size=self.segment_size)
        assert self.plog.queue_names() == sorted(self.queues)
        for name, q in self.queues.items():
            alive, opens = self.expected(q, now)
            st_ = self.plog.storage_for(name)
            state = st_.replay(None)
            assert _view(state.items) == _view(alive), name
            xids = sorted(state.open_transactions)
            assert xids == list(range(1, len(opens) + 1))
            assert [state.open_transactions[x].xid for x in xids] == xids
            assert _view(state.open_transactions[x] for x in xids) == _view(opens), name
            assert state.xid_counter == len(opens) and state.total_items == len(alive)
            ready = deque(state.items)
            for xid in reversed(xids):
                item = state.open_transactions[xid]
                ready.appendleft(item)
                st_.record_unremove(item, xid)
                item.xid = 0
            q.update(st=st_, ready=ready, opens={}, xid=state.xid_counter)


CmdlogModel.TestCase.settings = settings(
    max_examples=250, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
test_random_operations_replay_to_the_model = CmdlogModel.TestCase
