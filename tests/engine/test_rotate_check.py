"""The journal's rotation check runs only once its records reach the nearest limit (Journal
`check_due` / `check_at`, seam.py point 3) instead of twice per request; it must still rotate,
rewrite and checkpoint at exactly the operation where a check on every operation would.  Each
test runs one sequence of operations on two queues over real journals: one as built, one whose
journal is checked before every add and after every remove (the rule before the threshold)."""
from __future__ import annotations

import os
import random

import pytest

from lanner.clock import FakeClock
from lanner.config import QueueConfig
from lanner.queues.queue import PersistentQueue
from lanner.storage.journal.journal import Journal


class AlwaysChecked(Journal):
    """The queue calls its hooks on every operation, whatever the threshold says."""

    @property
    def check_due(self) -> bool:
        return True

    @check_due.setter
    def check_due(self, value: bool) -> None:
        pass


class Counted(Journal):
    checks = 0

    def _check_rotate(self, view, config, now_ms: int = 0) -> None:
        self.checks += 1
        super()._check_rotate(view, config, now_ms)

    before_add = after_remove = _check_rotate


def make(folder, cls, clock, **cfg) -> PersistentQueue:
    os.makedirs(folder, exist_ok=True)
    config = QueueConfig(**cfg)
    journal = cls(str(folder), "q", clock)
    q = PersistentQueue("q", config, journal, clock)
    q.replay()
    return q


def state(q: PersistentQueue) -> tuple:
    j = q.storage
    return (j.rotations, j.rewrites, sorted(os.listdir(j._dir)), j.logsize, q.length,
            j.checkpoint.file if j.checkpoint else None)


CONFIGS = [
    dict(max_memory_size=300, default_journal_size=1000, max_journal_size=2500),
    dict(max_memory_size=2000, default_journal_size=400, max_journal_size=100_000),
    dict(max_memory_size=200, default_journal_size=5000, max_journal_size=900, disable_aggressive_rewrites=True),
    # past default_journal_size long before the other limits (`check_due` = WHEN_EMPTY)
    dict(max_memory_size=20_000, default_journal_size=300, max_journal_size=60_000),
    dict(max_memory_size=20_000, default_journal_size=300, max_journal_size=60_000,
         disable_aggressive_rewrites=True, min_journal_compact_delay=50),
]


@pytest.mark.parametrize("cfg", CONFIGS)
def test_rotations_rewrites_and_checkpoints_fall_where_a_check_per_operation_puts_them(tmp_path, cfg):
    clock = FakeClock()
    fast = make(tmp_path / "a", Journal, clock, **cfg)
    slow = make(tmp_path / "b", AlwaysChecked, clock, **cfg)
    rng = random.Random(12)
    seen = set()
    for step in range(1500):
        r = rng.random()
        for q in (fast, slow):
            rng_state = rng.getstate()
            if r < 0.55:
                q.add(b"x" * rng.choice((1, 10, 40, 120)))
            elif r < 0.9:
                q.remove()
            elif r < 0.95:
                item = q.remove(transactional=True)
                if item is not None:
                    q.confirm_remove(item.xid) if rng.random() < 0.5 else q.unremove(item.xid)
            elif r < 0.97:
                q.flush()                   # in read-behind: drop_behind's removes, unread
            else:
                q.storage.flush()
            rng.setstate(rng_state)
        rng.random()
        clock.advance(1)
        assert state(fast)[:2] == state(slow)[:2] and state(fast)[3:] == state(slow)[3:], step
        seen.add(state(fast)[:2])
    assert len(seen) > 3          # the sequence did rotate or rewrite, several times


def test_a_small_queue_is_checked_once_not_per_operation(tmp_path):
    clock = FakeClock()
    q = make(tmp_path, Counted, clock, max_memory_size=1 << 20)
    q.add(b"first")
    first = q.storage.checks
    for _ in range(200):
        q.add(b"x" * 100)
        q.remove()
    assert q.storage.checks == first       # 400 operations, all far below every limit


def test_a_reload_to_lower_limits_checks_at_the_next_operation(tmp_path):
    clock = FakeClock()
    fast = make(tmp_path / "a", Journal, clock, max_memory_size=1 << 20)
    slow = make(tmp_path / "b", AlwaysChecked, clock, max_memory_size=1 << 20)
    for q in (fast, slow):
        for _ in range(20):
            q.add(b"x" * 100)
        q.reload(QueueConfig(max_memory_size=500, default_journal_size=1 << 30))
        q.add(b"y")                          # the journal is past the new max_memory_size
    assert fast.storage.rotations == slow.storage.rotations == 1


@pytest.mark.parametrize("aggressive", [True, False])
def test_past_default_journal_size_a_queue_is_checked_when_it_empties_not_per_operation(tmp_path, aggressive):
    """Once the journal passes default_journal_size, only the empty queue's rewrite can match
    until the next limit: the check runs when the queue empties, not at every add and remove
    (a 1 KiB set/get passed 16 MiB within seconds and then paid ~2 µs a request, issue 8)."""
    clock = FakeClock()
    cfg = dict(max_memory_size=1 << 20, default_journal_size=1000,
               disable_aggressive_rewrites=not aggressive, min_journal_compact_delay=None)
    fast = make(tmp_path / "a", Counted, clock, **cfg)
    slow = make(tmp_path / "b", AlwaysChecked, clock, **cfg)
    for q in (fast, slow):
        for _ in range(20):
            q.add(b"x" * 100)              # 20 items, 2.4 KB of records: past 1000 bytes
    before = fast.storage.checks
    for _ in range(200):
        for q in (fast, slow):
            q.add(b"y" * 100)
            q.remove()
    assert fast.storage.checks - before <= 2          # 400 operations on a queue never empty
    assert fast.storage.rewrites == slow.storage.rewrites == 0
    for q in (fast, slow):
        while q.remove() is not None:
            pass
    assert fast.storage.rewrites == slow.storage.rewrites == 1     # at the remove that emptied it
    assert state(fast)[3:] == state(slow)[3:]
    for q in (fast, slow):
        q.add(b"z")                        # and below the limit again after the rewrite
        q.remove()
    assert state(fast)[:2] == state(slow)[:2] and state(fast)[3:] == state(slow)[3:]
