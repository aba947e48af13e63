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
from lanner.storage.journal.packer import pack_files


class AlwaysChecked(Journal):
    """The queue calls its hooks on every operation, whatever the threshold says."""

    @property
    def check_due(self) -> bool:
        return True

    @check_due.setter
    def check_due(self, value: bool) -> None:
        pass


class Counted(Journal):
    checks = 0          # calls of the hooks
    rules = 0           # checks that went as far as Kestrel's rules (past every gate)

    def _check_rotate(self, view, config, now_ms: int = 0) -> None:
        self.checks += 1
        super()._check_rotate(view, config, now_ms)

    before_add = after_remove = _check_rotate

    def _compact(self, view, config, total: int, allowed: bool) -> bool:
        self.rules += 1
        return super()._compact(view, config, total, allowed)


def make(folder, cls, clock, cleaner=False, **cfg) -> PersistentQueue:
    """`cleaner`: checkpoint packs wait for `clean` (a server's cleaner) instead of running inline."""
    os.makedirs(folder, exist_ok=True)
    config = QueueConfig(**cfg)
    journal = cls(str(folder), "q", clock, inline_pack=not cleaner)
    q = PersistentQueue("q", config, journal, clock)
    q.replay()
    return q


def clean(q: PersistentQueue, asked: dict) -> None:
    """What a worker's tick and its cleaner do (storage/factory.py), one step at a time: the
    pack asked for at the last call is installed, or the next one asked for."""
    j = q.storage
    req = asked.pop(q, None)
    if req is not None:
        j.pack_done(pack_files(req.files, req.out_path, req.open_xids, now_ms=q.clock.now_ms()))
    else:
        req = j.pack_due()
        if req is not None:
            asked[q] = req


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
    # read-behind past max_journal_size: a backlog over max_memory_size whose files together pass
    # max_journal_size, checked when its bytes fall below max_memory_size, inside a compact delay
    # by the clock (and with max_journal_size under max_memory_size, so a compaction's own pack
    # passes it: the delay is most of the run)
    dict(max_memory_size=600, default_journal_size=900, max_journal_size=1500, min_journal_compact_delay=40),
    dict(max_memory_size=600, default_journal_size=900, max_journal_size=1500, min_journal_compact_delay=40,
         disable_aggressive_rewrites=True),
    dict(max_memory_size=3000, default_journal_size=5000, max_journal_size=1000, min_journal_compact_delay=30),
    dict(max_memory_size=3000, default_journal_size=700, max_journal_size=1000, min_journal_compact_delay=30),
    dict(max_memory_size=3000, default_journal_size=700, max_journal_size=1000, min_journal_compact_delay=30,
         disable_aggressive_rewrites=True),
    dict(max_memory_size=500, default_journal_size=2000, max_journal_size=3000, min_journal_compact_delay=None),
    # and with the checkpoint packs a cleaner's: both rewrites wait while one is under way
    dict(max_memory_size=600, default_journal_size=900, max_journal_size=1500, min_journal_compact_delay=40,
         cleaner=True),
    dict(max_memory_size=300, default_journal_size=250, max_journal_size=900, min_journal_compact_delay=None,
         disable_aggressive_rewrites=True, cleaner=True),
]

#: Steps of each phase of the sequence, and the share of adds in it: the queue grows past
#: max_memory_size and drains below it again, several times
PHASE, ADD_SHARE = 150, (0.55, 0.75, 0.3)


@pytest.mark.parametrize("cfg", CONFIGS)
def test_rotations_rewrites_and_checkpoints_fall_where_a_check_per_operation_puts_them(tmp_path, cfg):
    clock = FakeClock()
    fast = make(tmp_path / "a", Journal, clock, **cfg)
    slow = make(tmp_path / "b", AlwaysChecked, clock, **cfg)
    rng = random.Random(12)
    seen = set()
    asked = {}
    for step in range(1500):
        r = rng.random()
        adds = ADD_SHARE[step // PHASE % len(ADD_SHARE)]
        for q in (fast, slow):
            rng_state = rng.getstate()
            if r < adds:
                q.add(b"x" * rng.choice((1, 10, 40, 120)))
            elif r < adds + (1 - adds) * 0.78:
                q.remove()
            elif r < adds + (1 - adds) * 0.89:
                item = q.remove(transactional=True)
                if item is not None:
                    q.confirm_remove(item.xid) if rng.random() < 0.5 else q.unremove(item.xid)
            elif r < adds + (1 - adds) * 0.93:
                q.flush()                   # in read-behind: drop_behind's removes, unread
            elif r < adds + (1 - adds) * 0.97:
                clean(q, asked)
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


def test_a_backlog_read_behind_past_max_journal_size_is_checked_when_its_bytes_fall_below_max_memory_size(tmp_path):
    """A backlog over max_memory_size whose files together pass max_journal_size: no rule can
    match until the current file passes max_memory_size (a rotation) or the queue's bytes fall
    below it (the compacting rewrite), so the check waits for one of those instead of running
    per add and remove (a 1 GiB backlog paid ~6k instructions a request, issue 8)."""
    clock = FakeClock()
    cfg = dict(max_memory_size=2000, default_journal_size=1 << 20, max_journal_size=3000,
               min_journal_compact_delay=None)
    fast = make(tmp_path / "a", Counted, clock, **cfg)
    slow = make(tmp_path / "b", AlwaysChecked, clock, **cfg)
    for q in (fast, slow):
        for i in range(60):
            q.add(b"%03d" % i * 33)         # 6 KB: read behind, rotated, past 3000 bytes of files
    assert fast.storage.in_read_behind and fast.storage.logsize + fast.storage.archived_size > 3000
    checks, rules = fast.storage.checks, fast.storage.rules
    for i in range(200):
        for q in (fast, slow):
            q.add(b"%03d" % i * 33)
            q.remove()
    rotations = fast.storage.rotations
    assert rotations == slow.storage.rotations > 5
    assert fast.storage.checks - checks <= 2 * rotations + 2     # 400 operations: 400 on main
    assert fast.storage.rules - rules <= 2 * rotations + 2      # the rotation, the next operation
    assert fast.storage.rewrites == slow.storage.rewrites == 0
    while slow.size_bytes >= 2000:
        for q in (fast, slow):
            q.remove()
        assert state(fast)[:2] == state(slow)[:2] and state(fast)[3:] == state(slow)[3:]
    assert fast.storage.rewrites == slow.storage.rewrites == 1   # at the remove that went below


def test_inside_min_journal_compact_delay_a_queue_is_checked_by_the_clock_not_per_operation(tmp_path):
    """After a compacting rewrite whose own pack is past max_journal_size, no rule can match
    until the delay passes, the queue empties or the current file passes max_memory_size: the
    hooks then only read the clock, and the rewrite falls at the first operation past the
    delay, as with the whole check per operation."""
    clock = FakeClock()
    cfg = dict(max_memory_size=1 << 20, default_journal_size=1 << 20, max_journal_size=1000,
               min_journal_compact_delay=1000)
    fast = make(tmp_path / "a", Counted, clock, **cfg)
    slow = make(tmp_path / "b", AlwaysChecked, clock, **cfg)
    for q in (fast, slow):
        for i in range(20):
            q.add(b"%03d" % i * 33)          # 2.4 KB of records: compacted once past 1000 bytes
    assert fast.storage.rewrites == slow.storage.rewrites == 1
    rules = fast.storage.rules
    for i in range(200):
        for q in (fast, slow):
            q.add(b"%03d" % i * 33)
            q.remove()
        clock.advance(4)                    # 800 ms: inside the delay
    assert fast.storage.rules - rules <= 2          # 400 operations: 400 on main
    assert fast.storage.rewrites == slow.storage.rewrites == 1
    clock.advance(200)
    for q in (fast, slow):
        q.add(b"after")
    assert fast.storage.rewrites == slow.storage.rewrites == 2   # at the first operation past it
    assert state(fast)[:2] == state(slow)[:2] and state(fast)[3:] == state(slow)[3:]
