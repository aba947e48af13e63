"""The shortcuts the per-request path takes (issue 8, "stop 11"): each answers exactly what the
general code it skips would have answered."""
from __future__ import annotations

from dataclasses import replace

from lanner.clock import FakeClock
from lanner.config import Config, QueueConfig, ServerConfig
from lanner.ipc.messages import R_ITEM, pack_resp, resp_fields
from lanner.queues.collection import QueueCollection
from lanner.queues.undo import ADD, UndoLog
from lanner.storage.journal.journal import Journal


class Medium:
    """What UndoLog.trim asks of a byte stream."""

    def __init__(self, committed: int) -> None:
        self.committed_mark = committed


def entry(medium, mark: int) -> tuple:
    return (medium, mark, None, ADD, None, 0, None)


def test_trim_forgets_a_committed_one_medium_batch():
    a = Medium(100)
    log = UndoLog()
    log.entries = [entry(a, 10), entry(a, 20), entry(a, 30)]
    log.trim()
    assert log.entries == []


def test_trim_keeps_an_uncommitted_medium_between_two_committed_entries():
    # first and newest entries of one committed medium, another medium's unwritten record
    # between them: the one-medium shortcut must not forget it
    a, b = Medium(100), Medium(5)
    log = UndoLog()
    log.entries = [entry(a, 10), entry(b, 7), entry(a, 30)]
    log.trim()
    assert log.entries == [entry(b, 7)]


def test_trim_keeps_the_uncommitted_tail_of_one_medium():
    a = Medium(25)
    log = UndoLog()
    log.entries = [entry(a, 10), entry(a, 20), entry(a, 30)]
    log.trim()
    assert log.entries == [entry(a, 30)]


def test_in_read_behind_follows_the_journal_cursor(tmp_path):
    """A plain attribute now (asked on every add and remove): in and out of read-behind."""
    clock = FakeClock()
    coll = QueueCollection(Config(server=ServerConfig(queue_path=str(tmp_path)),
                                  default=QueueConfig(max_memory_size=100)), clock)
    try:
        for i in range(10):
            coll.add("q", b"%030d" % i)
        storage = coll.queue("q").storage
        assert storage.in_read_behind and storage._rb is not None
        got = [coll.remove("q").data for _ in range(10)]
        assert got == [b"%030d" % i for i in range(10)]
        assert not storage.in_read_behind and storage._rb is None
    finally:
        coll.close()


def test_a_local_reply_head_reads_as_a_packed_one():
    fields = (7, 9, R_ITEM, 0, 0, 0)
    assert resp_fields(fields) == fields
    assert resp_fields(pack_resp(*fields)) == fields


def test_an_added_item_is_a_qitem_with_its_defaults(tmp_path):
    """What PersistentQueue.add stores, once its now_ms is passed by position (the collection's
    call): the add time is the collection's clock reading, the expiry the client's, capped by
    max_age, and the workq fields keep their defaults."""
    from lanner.queues.item import QItem
    clock = FakeClock(1_700_000_000_000)
    coll = QueueCollection(Config(server=ServerConfig(queue_path=str(tmp_path)),
                                  default=QueueConfig(max_age=60_000)), clock)
    assert coll.add("q", b"abc", 1_700_000_030_000)
    item = coll.remove("q")
    assert type(item) is QItem
    assert item == QItem(1_700_000_000_000, 1_700_000_030_000, b"abc")
    assert (item.xid, item.job_id, item.priority) == (0, None, 0)


def test_the_compiled_clocks_read_what_the_time_module_reads():
    """SystemClock.now_ms and Recorder.since read the clock in C where compiled (clock.pxd,
    latency.pxd): the same clocks as time.time_ns and time.monotonic."""
    import time

    from lanner.clock import SYSTEM_CLOCK
    from lanner.ipc.shm import CounterBlock
    from lanner.ops import latency

    before = time.time_ns() // 1_000_000
    now = SYSTEM_CLOCK.now_ms()
    assert before <= now <= time.time_ns() // 1_000_000
    block = CounterBlock.create(1, latency.COUNTERS)
    rec = latency.Recorder(block.slot(0), 0)
    get = latency.FAMILIES.index("get")
    rec.since(get, time.monotonic() - 0.003)         # 3 ms ago: the (0.0025, 0.005] bucket
    col = get * (len(latency.BOUNDS) + 2)
    words = list(block.slot(0).words)
    assert words[col + latency.BOUNDS.index(0.005)] == 1
    assert 3000 <= words[col + len(latency.BOUNDS) + 1] < 1_000_000


class CountingClock(FakeClock):
    """A FakeClock that counts its readings."""

    __slots__ = ("reads",)

    def __init__(self, now_ms: int = 1_700_000_000_000) -> None:
        super().__init__(now_ms)
        self.reads = 0

    def now_ms(self) -> int:
        self.reads += 1
        return super().now_ms()


def test_a_plain_remove_reads_no_clock_and_one_that_needs_it_reads_it_once():
    """PersistentQueue.remove reads the clock only for what needs it (a head that may have
    expired, a deadline, read-behind, a storage check), and then once: an expiry is judged
    against that one reading, as before."""
    from lanner.queues.queue import PersistentQueue
    from lanner.storage.seam import MemoryStorage

    def queue(clock, **cfg):
        q = PersistentQueue("q", QueueConfig(**cfg), MemoryStorage(), clock)
        q.replay()
        return q

    clock = CountingClock()
    q = queue(clock)
    assert q.add(b"a") and q.add(b"b", clock.now_ms() + 10)
    clock.reads = 0
    assert q.remove().data == b"a"
    assert clock.reads == 0                     # never-expiring head, nothing else due
    clock.advance(11)
    assert q.remove() is None and clock.reads == 1      # its expiry judged on one reading
    assert dict(q.stats())["expired_items"] == "1"

    clock = CountingClock()
    q = queue(clock, open_transaction_timeout=1000, max_age=60_000)
    assert q.add(b"x")
    clock.reads = 0
    item = q.remove(transactional=True)
    assert item.data == b"x" and clock.reads == 1       # max_age and the deadline: one reading
    assert q._open_deadline == {item.xid: clock.now_ms() + 1000}


class RecordingJournal(Journal):
    """A Journal whose record_* a Python subclass overrides (as tests' watched journals do): the
    compiled queue calls them along a typed reference (queue.pxd), and must still reach these."""

    __slots__ = ("seen",)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seen = []

    def record_add(self, item):
        self.seen.append(("add", item.data))
        return super().record_add(item)

    def record_remove(self, item):
        self.seen.append(("remove", item.data))
        return super().record_remove(item)

    def record_open(self, item, xid):
        self.seen.append(("open", item.data, xid))
        return super().record_open(item, xid)


def run_steps(q, clock) -> tuple[list, bool]:
    """Adds, plain and transactional removes, expiry, and (for a journal) read-behind and back:
    what a client sees step by step, and whether the queue went into read-behind."""
    seen = []
    for i in range(12):
        seen.append(q.add(b"%02d" % i * 10, clock.now_ms() + 5 if i == 3 else None, None, clock.now_ms()))
    seen.append((q.length, q.size_bytes))
    behind = q.memory_bytes < q.size_bytes
    clock.advance(10)                           # item 3 expires
    for transactional in (False, True, False, True, False):
        item = q.remove(transactional)
        seen.append((item.data, item.xid))
    seen.append([i.data for _ in range(7) if (i := q.remove()) is not None])
    seen.append(q.remove())
    seen.append((q.length, q.size_bytes, q.memory_bytes, sorted(q.open_items()), dict(q.stats())["expired_items"]))
    return seen, behind


def test_a_journal_its_python_subclass_and_a_command_log_give_one_queue_state(tmp_path):
    """The typed path (the storage a Journal: C calls of its record_* and struct reads of its
    flags), a Python subclass overriding record_* (the same calls must reach the override), and
    the Python path of every other storage (a workq command log) serve the same steps alike,
    and the journal and its subclass write the same bytes."""
    from lanner.queues.queue import PersistentQueue
    from lanner.storage.journal.journal import Journal
    clock = FakeClock(1_700_000_000_000)
    config = QueueConfig(max_memory_size=60)           # a journal reads behind from the 4th item on
    runs, files = [], []
    for kind in (Journal, RecordingJournal):
        storage = kind(str(tmp_path / kind.__name__), "q", clock)
        q = PersistentQueue("q", config, storage, clock)
        q.replay()
        runs.append(run_steps(q, clock))
        q.close()
        files.append((tmp_path / kind.__name__ / "q").read_bytes())
        clock.advance(-10)
    assert runs[0] == runs[1] and runs[0][1] and files[0] == files[1]
    assert storage.seen[:13] == [("add", b"%02d" % i * 10) for i in range(12)] + [("remove", b"00" * 10)]
    assert ("open", b"01" * 10, 1) in storage.seen

    coll = QueueCollection(Config(server=ServerConfig(queue_path=str(tmp_path / "cmdlog")),
                                  default=replace(config, storage="cmdlog")), clock)
    try:
        q = coll.queue("q")
        assert not isinstance(q.storage, Journal)
        logged = run_steps(q, clock)
    finally:
        coll.close()
    assert logged == (runs[0][0], False)        # (a command log keeps every item in memory)


def test_the_limits_a_queue_keeps_follow_a_config_set_between_requests(tmp_path):
    """add and remove read max_age, max_memory_size and fanout_only from copies the queue keeps
    (queues/limits.py): a config set on the queue, or a reload, is in force at the very next
    request, an add or a remove alike."""
    from lanner.queues.queue import PersistentQueue
    from lanner.storage.journal.journal import Journal
    clock = FakeClock(1_700_000_000_000)
    q = PersistentQueue("q", QueueConfig(), Journal(str(tmp_path), "q", clock), clock)
    q.replay()
    try:
        assert q.add(b"a") and q.add(b"b")
        clock.advance(1000)
        q.config = replace(q.config, max_age=500)       # a remove next: expires both by age
        assert q.remove() is None and dict(q.stats())["expired_items"] == "2"
        q.reload(replace(q.config, max_age=None, fanout_only=True))
        assert q.add(b"c") and q.length == 0            # a fanout-only master keeps nothing
        q.config = replace(q.config, fanout_only=False, max_memory_size=2)
        assert q.add(b"dd") and q.add(b"ee") and q.storage.in_read_behind
        assert q.memory_bytes == 2 and q.remove().data == b"dd" and q.remove().data == b"ee"
    finally:
        q.close()


def test_a_qitem_keeps_the_dataclass_surface_in_either_build():
    """QItem is written out (a C type compiled, item.pxd) where it was a slots dataclass: the
    same constructor, defaults, equality by value, repr, len, match and no hash."""
    import pytest
    from lanner.queues.item import QItem
    a = QItem(5, 0, b"abc")
    b = QItem(add_time=5, expiry=0, data=b"abc", xid=0, job_id=None, priority=0)
    assert a == b and not a != b and a != QItem(5, 0, b"abc", 1) and a != (5, 0, b"abc", 0, None, 0)
    assert repr(QItem(1, 2, b"x", 3, b"j", 4)) == "QItem(add_time=1, expiry=2, data=b'x', xid=3, job_id=b'j', priority=4)"
    assert len(a) == 3 and (a.xid, a.job_id, a.priority) == (0, None, 0)
    with pytest.raises(TypeError):
        hash(a)
    with pytest.raises(AttributeError):
        a.other = 1
    match QItem(1, 2, b"y", priority=7):
        case QItem(add, exp, data, xid, job, prio):
            assert (add, exp, data, xid, job, prio) == (1, 2, b"y", 0, None, 7)
    a.xid = 9
    assert a == QItem(5, 0, b"abc", 9)
