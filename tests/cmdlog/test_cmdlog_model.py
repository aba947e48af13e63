"""Property: random queue operations on CmdlogStorage, with restarts at random
points, tiny segments (constant rotation) and cleaner passes beside the live
appender, always replay to what a simple Kestrel-style model holds.

The model is the queue's own bookkeeping: a FIFO of items where an aborted
read goes back to the head, open reads by xid, and at restart every item whose
expiry has passed disappears (replay skips expired adds) and the remaining
open reads are rolled back to the head in their original order (§5.9)."""
from __future__ import annotations

import os
import tempfile
from collections import deque

from hypothesis import HealthCheck, given, settings, strategies as st

from engine.clock import FakeClock
from engine.cmdlog import PartitionLog
from engine.item import QItem
from engine.rewrite import rewrite_segments

QUEUES = ["jobs", "mail.out+fan"]
OPS = ["add", "add", "add", "add", "get", "open", "open", "open", "abort", "abort", "abort", "confirm",
       "flush_queue", "erase", "advance", "flush", "restart", "restart", "rewrite"]


class Harness:
    def __init__(self, directory: str, clock: FakeClock, segment_size: int) -> None:
        self.dir = directory
        self.clock = clock
        self.segment_size = segment_size
        self.plog = PartitionLog(directory, clock, segment_size=segment_size)
        self.queues: dict[str, dict] = {}          # name -> {"st", "ready", "opens", "xid"}
        self.serial = 0

    def queue(self, name: str) -> dict:
        q = self.queues.get(name)
        if q is None:
            st = self.plog.storage_for(name)
            state = st.replay(None)
            assert not state.items and not state.open_transactions
            q = self.queues[name] = {"st": st, "ready": deque(), "opens": {}, "xid": state.xid_counter}
        return q

    def restart(self) -> None:
        self.plog.close()
        now = self.clock.now_ms()
        self.plog = PartitionLog(self.dir, self.clock, segment_size=self.segment_size)
        assert self.plog.queue_names() == sorted(self.queues)
        for name, q in self.queues.items():
            alive = [i for i in q["ready"] if not (i.expiry and i.expiry < now)]
            opens = [q["opens"][x] for x in sorted(q["opens"])]
            opens = [i for i in opens if not (i.expiry and i.expiry < now)]
            st = self.plog.storage_for(name)
            state = st.replay(None)
            view = lambda items: [(i.data, i.add_time, i.expiry) for i in items]      # noqa: E731
            assert view(state.items) == view(alive), name
            assert [state.open_transactions[x].xid for x in sorted(state.open_transactions)] == list(
                range(1, len(opens) + 1))
            assert view(state.open_transactions[x] for x in sorted(state.open_transactions)) == view(opens), name
            assert state.xid_counter == len(opens) and state.total_items == len(alive)
            ready = deque(state.items)
            for xid in sorted(state.open_transactions, reverse=True):
                item = state.open_transactions[xid]
                ready.appendleft(item)
                st.record_unremove(item, xid)
                item.xid = 0
            q.update(st=st, ready=ready, opens={}, xid=state.xid_counter)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_operations_replay_to_the_model(data):
    clock = FakeClock(1_800_000_000_000)
    with tempfile.TemporaryDirectory() as root:
        h = Harness(os.path.join(root, "p"), clock, data.draw(st.integers(120, 900), label="segment_size"))
        try:
            for _ in range(data.draw(st.integers(1, 70), label="steps")):
                op = data.draw(st.sampled_from(OPS))
                name = data.draw(st.sampled_from(QUEUES))
                if op == "add":
                    q = h.queue(name)
                    h.serial += 1
                    ttl = data.draw(st.sampled_from([None, None, 1, 50, 2_000]))
                    now = clock.now_ms()
                    item = QItem(now, 0 if ttl is None else now + ttl, b"%s-%d" % (name.encode(), h.serial)
                                 + b"." * data.draw(st.integers(0, 40)))
                    q["st"].record_add(item)
                    q["ready"].append(item)
                elif op == "get":
                    q = h.queue(name)
                    if q["ready"]:
                        q["st"].record_remove(q["ready"].popleft())
                elif op == "open":
                    q = h.queue(name)
                    if q["ready"]:
                        item = q["ready"].popleft()
                        q["xid"] += 1
                        item.xid = q["xid"]
                        q["opens"][item.xid] = item
                        q["st"].record_open(item, item.xid)
                elif op in ("abort", "confirm"):
                    q = h.queue(name)
                    if q["opens"]:
                        xid = data.draw(st.sampled_from(sorted(q["opens"])))
                        item = q["opens"].pop(xid)
                        if op == "abort":
                            q["ready"].appendleft(item)
                            q["st"].record_unremove(item, xid)
                        else:
                            q["st"].record_confirm(item, xid)
                        item.xid = 0
                elif op == "flush_queue":
                    q = h.queue(name)
                    while q["ready"]:
                        q["st"].record_remove(q["ready"].popleft())
                elif op == "erase":
                    if name in h.queues:
                        h.queues.pop(name)["st"].erase()
                elif op == "advance":
                    clock.advance(data.draw(st.integers(0, 3_000)))
                elif op == "flush":
                    h.plog.flush()
                elif op == "restart":
                    h.restart()
                elif op == "rewrite":
                    h.plog.flush()
                    rewrite_segments(h.dir, clock)
            h.restart()
        finally:
            h.plog.close()
