"""PartitionLog and CmdlogStorage: the seam mapping, replay, restart rollback,
torn tails and corruption, rotation and sync, locks, queue names, scheduled
jobs and workq max-attempts."""
from __future__ import annotations

import errno
import logging
import os
import threading
from collections import deque

import pytest

from lanner.storage.cmdlog import segment as sg
from lanner.storage.cmdlog.cmdlog import LANNER_TTR_MS, CmdlogStorage
from lanner.storage.cmdlog.partition import QUEUES_FILE, PartitionLog, open_partition_logs, partition_dir
from lanner.queues.item import QItem
from lanner.storage.cmdlog.segment import CmdlogError

from . import indep

DAY = 86_400_000


def records(d: str) -> list[dict]:
    out = []
    for _s, name in sg.list_segments(d):
        with open(os.path.join(d, name), "rb") as f:
            for r in indep.read_segment(f.read()):
                r["segment"] = name
                out.append(r)
    return out


def add(st: CmdlogStorage, clock, data: bytes, ttl: int | None = None, priority: int = 0) -> QItem:
    now = clock.now_ms()
    item = QItem(now, now + ttl if ttl is not None else 0, data, priority=priority)
    st.record_add(item)
    return item


def reopen(plog: PartitionLog, **kw) -> PartitionLog:
    plog.close()
    return PartitionLog(plog.dir, plog._clock, **kw)


def rollback(st: CmdlogStorage):
    """What PersistentQueue.replay does: open transactions back to the head,
    descending xid, one record_unremove each (Kestrel §5.9)."""
    state = st.replay(None)
    items = deque(state.items)
    for xid in sorted(state.open_transactions, reverse=True):
        item = state.open_transactions[xid]
        items.appendleft(item)
        st.record_unremove(item, xid)
        item.xid = 0
    return state, items


@pytest.fixture
def plog(tmp_path, clock):
    p = PartitionLog(str(tmp_path / "p"), clock)
    yield p
    p.close()


# ------------------------------------------------------------------ the mapping

def test_queue_operations_become_workq_commands(plog, clock):
    st = plog.storage_for("jobs.email")
    a = add(st, clock, b"hello", ttl=5000)
    clock.advance(7)
    b = add(st, clock, b"forever")
    c = add(st, clock, b"prio", ttl=10, priority=-3)
    st.record_open(a, 1)
    st.record_unremove(a, 1)
    st.record_open(a, 2)
    st.record_confirm(a, 2)
    st.record_remove(b)
    clock.advance(11)
    st.record_remove(c)                 # expired by now: logged as expire
    plog.flush()
    recs = records(plog.dir)
    kinds = [r["command"]["type"] for r in recs]
    assert kinds == [sg.ADD, sg.ADD, sg.ADD, sg.START_ATTEMPT, sg.TIMEOUT_ATTEMPT, sg.START_ATTEMPT,
                     sg.COMPLETE, sg.DELETE, sg.EXPIRE]
    ca, cb, cc = (r["command"] for r in recs[:3])
    assert ca["name"] == b"jobs.email" and ca["ttr"] == LANNER_TTR_MS == 60000 and ca["ttl"] == 5000
    assert (ca["priority"], ca["max_attempts"], ca["max_fails"], ca["payload"]) == (0, 0, 0, b"hello")
    assert ca["time"] == (0, 0, -1)                                   # Go's zero time
    assert ca["created"] == (1_700_000_000 + sg.GO_UNIX_OFFSET, 0, -1)
    assert ca["id"] == a.job_id and a.job_id[6] >> 4 == 4 and a.job_id[8] >> 6 == 2
    assert (cb["ttl"], cb["max_attempts"], cb["max_fails"]) == (2592000000, 0, 255)
    assert cc["priority"] == -3 and cc["ttl"] == 10
    assert recs[6]["command"]["result"] == b""
    assert len({a.job_id, b.job_id, c.job_id}) == 3
    assert recs[0]["time"] == (1_700_000_000 + sg.GO_UNIX_OFFSET, 0, -1)   # record time from the clock
    assert recs[-1]["time"][1] == 18_000_000


def test_lanner_segments_reencode_byte_for_byte_with_an_independent_codec(tmp_path, clock):
    plog = PartitionLog(str(tmp_path / "p"), clock, segment_size=700)
    st = plog.storage_for("q")
    items = [add(st, clock, bytes([i]) * (i * 13), ttl=None if i % 3 else 1000 + i, priority=i % 2)
             for i in range(20)]
    for i, it in enumerate(items[:10]):
        clock.advance(3)
        st.record_open(it, i + 1) if i % 2 else st.record_remove(it)
    plog.close()
    names = sg.list_segments(plog.dir)
    assert len(names) > 2
    for _s, n in names:
        data = open(os.path.join(plog.dir, n), "rb").read()
        assert indep.write_segment(indep.read_segment(data)) == data


def test_replay_restores_items_opens_and_expiry(plog, clock):
    st = plog.storage_for("q")
    a = add(st, clock, b"a", ttl=1000)
    b = add(st, clock, b"b")
    far = add(st, clock, b"far", ttl=60 * DAY)           # beyond workq's 30 days: real TTL kept
    past = QItem(clock.now_ms(), clock.now_ms() - 5, b"past")
    st.record_add(past)                                   # TTL written as 1 ms
    d = add(st, clock, b"d")
    st.record_open(b, 1)
    st.record_open(d, 2)
    added = clock.now_ms()
    clock.advance(2)
    plog = reopen(plog)
    state = plog.storage_for("q").replay(None)
    assert [(i.data, i.expiry) for i in state.items] == [(b"a", a.expiry), (b"far", far.expiry)]
    assert {x: (i.data, i.xid, i.expiry) for x, i in state.open_transactions.items()} == {
        1: (b"b", 1, 0), 2: (b"d", 2, 0)}
    assert state.xid_counter == 2 and state.total_items == 2 and state.total_bytes == 4
    assert state.replayed_adds == 4                     # the 1 ms item expired: skipped
    assert all(i.add_time == added for i in state.items)
    # 40 days later: expiring items are gone, never-expiring ones stay (not workq's 30-day cut)
    clock.advance(40 * DAY)
    plog = reopen(plog)
    state = plog.storage_for("q").replay(None)
    assert [i.data for i in state.items] == [b"far"]
    assert [i.data for i in state.open_transactions.values()] == [b"b", b"d"]
    clock.advance(21 * DAY)
    plog = reopen(plog)
    assert [i.data for i in plog.storage_for("q").replay(None).items] == []
    plog.close()


def test_restart_rollback_keeps_kestrel_order_across_restarts(plog, clock):
    st = plog.storage_for("q")
    items = [add(st, clock, b"%d" % i) for i in range(6)]
    st.record_open(items[0], 1)
    st.record_open(items[1], 2)
    st.record_open(items[2], 3)
    st.record_unremove(items[1], 2)          # abort: back to the head
    st.record_open(items[1], 4)              # leased again, after 0 and 2
    st.record_unremove(items[2], 3)          # head now: 2, 3, 4, 5
    plog = reopen(plog)
    st = plog.storage_for("q")
    state, order = rollback(st)
    assert [i.data for i in state.open_transactions.values()] == [b"0", b"1"]   # lease order
    assert [i.data for i in order] == [b"0", b"1", b"2", b"3", b"4", b"5"]
    for _ in range(2):                        # a restart right after the rollback changes nothing
        plog = reopen(plog)
        state = plog.storage_for("q").replay(None)
        assert [i.data for i in state.items] == [b"0", b"1", b"2", b"3", b"4", b"5"]
        assert state.open_transactions == {}
    plog.close()


def test_aborts_put_items_at_the_head_most_recent_first(plog, clock):
    st = plog.storage_for("q")
    x, y, a, b = (add(st, clock, n) for n in (b"x", b"y", b"a", b"b"))
    st.record_open(x, 1)
    st.record_open(y, 2)
    st.record_unremove(x, 1)                 # live queue: x a b
    st.record_unremove(y, 2)                 # live queue: y x a b
    plog = reopen(plog)
    assert [i.data for i in plog.storage_for("q").replay(None).items] == [b"y", b"x", b"a", b"b"]
    plog.close()


# ------------------------------------------------------------------ corruption

def _filled(tmp_path, clock, n=5, segment_size=10**6) -> PartitionLog:
    plog = PartitionLog(str(tmp_path / "p"), clock, segment_size=segment_size)
    st = plog.storage_for("q")
    for i in range(n):
        add(st, clock, b"item%d" % i)
    plog.close()
    return plog


def test_torn_tail_of_newest_segment_is_truncated_with_a_warning(tmp_path, clock, caplog):
    plog = _filled(tmp_path, clock)
    path = os.path.join(plog.dir, "000000001.log")
    good = os.path.getsize(path)
    whole = open(path, "rb").read()
    last = records(plog.dir)[-1]["offset"]
    for cut in (good + 1, good + 14, good + 16, good + 40):
        with open(path, "ab") as f:
            f.write(whole[last:last + cut - good])
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="lanner.storage.cmdlog.cmdlog"):
            p2 = PartitionLog(plog.dir, clock)
        assert os.path.getsize(path) == good
        assert [i.data for i in p2.storage_for("q").replay(None).items] == [b"item%d" % i for i in range(5)]
        msg = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
        assert path in msg and f"offset {good}" in msg
        p2.close()
    with open(path, "ab") as f:
        f.write(b"\n")                       # workq refuses a stray newline; we cut it
    PartitionLog(plog.dir, clock).close()
    assert os.path.getsize(path) == good


def test_crc_mismatch_in_the_middle_refuses_start_up(tmp_path, clock):
    plog = _filled(tmp_path, clock)
    path = os.path.join(plog.dir, "000000001.log")
    recs = records(plog.dir)
    data = bytearray(open(path, "rb").read())
    data[recs[2]["offset"] + 30] ^= 0x40
    open(path, "wb").write(bytes(data))
    with pytest.raises(CmdlogError) as e:
        PartitionLog(plog.dir, clock)
    assert e.value.kind == sg.BAD_CRC and e.value.path == path and e.value.offset == recs[2]["offset"]
    assert str(e.value) == f"{path}: offset {recs[2]['offset']}: " + e.value.reason and "\n" not in str(e.value)
    assert os.path.getsize(path) == len(data)           # nothing repaired
    # and the lock was released: a fixed log opens
    data[recs[2]["offset"] + 30] ^= 0x40
    open(path, "wb").write(bytes(data))
    PartitionLog(plog.dir, clock).close()


def test_crc_mismatch_in_the_last_record_is_not_repaired(tmp_path, clock):
    plog = _filled(tmp_path, clock)
    path = os.path.join(plog.dir, "000000001.log")
    data = bytearray(open(path, "rb").read())
    data[-1] ^= 1
    open(path, "wb").write(bytes(data))
    with pytest.raises(CmdlogError, match="crc mismatch"):
        PartitionLog(plog.dir, clock)


def test_break_followed_by_valid_records_is_not_a_torn_tail(tmp_path, clock):
    plog = _filled(tmp_path, clock)
    path = os.path.join(plog.dir, "000000001.log")
    recs = records(plog.dir)
    data = bytearray(open(path, "rb").read())
    data[recs[1]["offset"] + 15] = 0xFF                  # SIZE now runs far past the end
    data[recs[1]["offset"] + 16] = 0x7F
    open(path, "wb").write(bytes(data))
    with pytest.raises(CmdlogError) as e:
        PartitionLog(plog.dir, clock)
    assert e.value.kind == sg.TORN and e.value.offset == recs[1]["offset"]
    assert os.path.getsize(path) == len(data)


def test_torn_record_or_bad_header_in_an_older_segment_is_fatal(tmp_path, clock):
    plog = _filled(tmp_path, clock, n=9, segment_size=200)
    segs = sg.list_segments(plog.dir)
    assert len(segs) >= 3
    first = os.path.join(plog.dir, segs[0][1])
    data = open(first, "rb").read()
    open(first, "wb").write(data[:-3])
    with pytest.raises(CmdlogError) as e:
        PartitionLog(plog.dir, clock)
    assert e.value.kind == sg.TORN and e.value.path == first
    open(first, "wb").write(b"wqwq\x00\x00\x00\x02" + data[8:])
    with pytest.raises(CmdlogError) as e:
        PartitionLog(plog.dir, clock)
    assert (e.value.kind, e.value.path, e.value.offset) == (sg.BAD_HEADER, first, 0)


def test_newest_segment_with_a_torn_header_is_repaired(tmp_path, clock):
    plog = _filled(tmp_path, clock)
    newest = os.path.join(plog.dir, "000000002.log")
    for prefix in (b"", b"wq", sg.HEADER[:7]):
        open(newest, "wb").write(prefix)
        p2 = PartitionLog(plog.dir, clock)
        assert open(newest, "rb").read() == sg.HEADER
        st = p2.storage_for("q")
        assert len(st.replay(None).items) == 5
        add(st, clock, b"more")
        p2.close()
        assert records(plog.dir)[-1]["segment"] == "000000002.log"
        p3 = PartitionLog(plog.dir, clock)
        assert len(p3.storage_for("q").replay(None).items) == 6
        p3.storage_for("q").record_remove(QItem(0, 0, b"", job_id=records(plog.dir)[-1]["command"]["id"]))
        p3.close()
    open(newest, "wb").write(b"garbage!")
    with pytest.raises(CmdlogError, match="invalid segment header"):
        PartitionLog(plog.dir, clock)


def test_duplicate_live_job_is_fatal(tmp_path, clock):
    d = str(tmp_path / "p")
    plog = PartitionLog(d, clock)
    cmd = sg.JobCommand(sg.ADD, b"\x11" * 16, b"q", 60000, 60000, 0, 0, 0, b"x", sg.ZERO_TIME_NS,
                        clock.now_ms() * 10**6)
    plog.append_command(cmd)
    plog.append_command(cmd)
    plog.close()
    with pytest.raises(CmdlogError) as e:
        PartitionLog(d, clock)
    assert e.value.kind == sg.REPLAY and "duplicate job 11111111-1111-1111-1111-111111111111" in str(e.value)


# ------------------------------------------------------------------ files, rotation, sync

def test_config_validation(tmp_path, clock):
    with pytest.raises(ValueError, match="segment_size"):
        PartitionLog(str(tmp_path / "a"), clock, segment_size=8)
    with pytest.raises(ValueError, match="sync"):
        PartitionLog(str(tmp_path / "b"), clock, sync_policy="sometimes")
    with pytest.raises(ValueError, match="sync_interval"):
        PartitionLog(str(tmp_path / "c"), clock, sync_policy="interval", sync_interval_ms=0)
    PartitionLog(str(tmp_path / "d"), clock, segment_size=9, sync_policy="os", sync_interval_ms=0).close()


def test_append_lock_is_exclusive(plog, clock):
    with pytest.raises(CmdlogError) as e:
        PartitionLog(plog.dir, clock)
    assert e.value.kind == sg.LOCKED and e.value.path.endswith("append.lock")


def test_files_in_the_directory(plog, clock):
    assert sorted(os.listdir(plog.dir)) == ["append.lock", "read.lock"]       # no segment until needed
    st = plog.storage_for("q")
    assert sorted(os.listdir(plog.dir)) == ["append.lock", QUEUES_FILE, "read.lock"]
    add(st, clock, b"x")
    assert sorted(os.listdir(plog.dir)) == ["000000001.log", "append.lock", QUEUES_FILE, "read.lock"]
    for junk in ("000000001.log.rw", "0000001.log", "notes.txt"):
        open(os.path.join(plog.dir, junk), "wb").write(b"junk")
    plog2 = reopen(plog)
    assert [i.data for i in plog2.storage_for("q").replay(None).items] == [b"x"]
    plog2.close()


def test_rotation_fsyncs_old_segment_and_directory(tmp_path, clock, monkeypatch):
    synced = []
    real = os.fsync

    def spy(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    plog = PartitionLog(str(tmp_path / "p"), clock, segment_size=300)
    st = plog.storage_for("q")
    d = os.path.realpath(plog.dir)
    synced.clear()
    add(st, clock, b"a" * 30)                # creates 000000001.log: directory fsynced
    assert synced == [d]
    rec = plog.logsize - 8                   # one record's size (buffered)
    assert rec == 15 + 1 + (17 + 2 + 3 + 5 + 1 + 1 + 2 + 1 + 30 + 30) + 4   # TIME SIZE payload CRC
    add(st, clock, b"b" * 30)                # 8 + 113 < 300
    add(st, clock, b"c" * 30)                # 8 + 226 < 300
    assert synced == [d]
    add(st, clock, b"d" * 30)                # 8 + 339 >= 300: rotate first
    assert synced == [d, os.path.join(d, "000000001.log"), d]
    assert plog.rotations == 1 and st.rotations == 1
    plog.close()
    assert [os.path.getsize(os.path.join(plog.dir, n)) for _s, n in sg.list_segments(plog.dir)] == [
        8 + 3 * rec, 8 + rec]


def test_flush_is_one_write_and_failures_are_cut_back(plog, clock):
    st = plog.storage_for("q")
    add(st, clock, b"first")
    plog.flush()
    path = os.path.join(plog.dir, "000000001.log")
    good = os.path.getsize(path)
    calls = []
    real = os.write

    def counting(fd, data):
        calls.append(len(data))
        return real(fd, data)

    plog._write = counting
    for i in range(100):
        add(st, clock, b"x%d" % i)
    assert plog.dirty and not calls
    plog.flush()
    assert len(calls) == 1 and not plog._buf
    good = os.path.getsize(path)

    def short_then_enospc(fd, data):
        if not calls or calls[-1] != "short":
            calls.append("short")
            return real(fd, bytes(data[:7]))
        raise OSError(errno.ENOSPC, "No space left on device")

    plog._write = short_then_enospc
    add(st, clock, b"lost?")
    with pytest.raises(CmdlogError) as e:
        plog.flush()
    assert e.value.kind == sg.IO and e.value.path == path and "No space left" in str(e.value)
    assert os.path.getsize(path) == good                 # the 7 bytes were cut back
    plog._write = real
    plog.flush()                                          # retried from the kept buffer
    plog = reopen(plog)
    items = plog.storage_for("q").replay(None).items
    assert [i.data for i in items][-1] == b"lost?" and len(items) == 102
    plog.close()


def test_sync_dirty_and_helper_threads(tmp_path, clock):
    plog = PartitionLog(str(tmp_path / "p"), clock, sync_policy="always")
    st = plog.storage_for("q")
    assert st.sync_policy == "always" and not st.dirty
    add(st, clock, b"x")
    assert st.dirty and not plog.pending_fsync
    plog.flush()
    assert plog.dirty and plog.pending_fsync
    st.sync()
    assert not plog.dirty
    add(st, clock, b"y")
    plog.flush()
    add(st, clock, b"z")                                  # the owner keeps appending meanwhile
    t = threading.Thread(target=plog.sync)                # a helper thread: fsyncs what was flushed
    t.start()
    t.join()
    assert not plog.pending_fsync and plog.dirty          # z is still buffered
    plog.flush()
    t = threading.Thread(target=plog.sync)                # a helper thread: fsyncs what was flushed
    t.start()
    t.join()
    assert not plog.dirty
    assert st.logsize == os.path.getsize(os.path.join(plog.dir, "000000001.log"))
    plog.close()
    assert PartitionLog(plog.dir, clock, sync_policy="os").storage_for("q").sync_policy == "never"


def test_sync_from_a_thread_while_the_owner_rotates(tmp_path, clock):
    plog = PartitionLog(str(tmp_path / "p"), clock, segment_size=300)
    st = plog.storage_for("q")
    stop = threading.Event()
    errors = []

    def syncer():
        while not stop.is_set():
            try:
                plog.sync()
            except Exception as e:       # noqa: BLE001 - the test reports it
                errors.append(e)

    t = threading.Thread(target=syncer)
    t.start()
    try:
        for i in range(400):
            add(st, clock, b"%05d" % i)
            if i % 7 == 0:
                plog.flush()
    finally:
        stop.set()
        t.join()
    assert not errors
    plog = reopen(plog)
    assert [i.data for i in plog.storage_for("q").replay(None).items] == [b"%05d" % i for i in range(400)]
    plog.close()


def test_closed_log_refuses_appends(plog, clock):
    st = plog.storage_for("q")
    plog.close()
    st.close()                                            # harmless after the partition closed
    with pytest.raises(CmdlogError, match="closed"):
        add(st, clock, b"x")


def test_open_partition_logs_layout_and_config(tmp_path, clock):
    from lanner.config import CmdlogConfig
    logs = open_partition_logs(str(tmp_path), [3, 17], clock, CmdlogConfig(segment_size=4096, sync="always"))
    assert set(logs) == {3, 17}
    assert logs[3].dir == partition_dir(str(tmp_path), 3) == os.path.join(str(tmp_path), "cmdlog", "3")
    assert logs[17].segment_size == 4096 and logs[17].storage_for("x").sync_policy == "always"
    for p in logs.values():
        p.close()
    logs = open_partition_logs(str(tmp_path), [5], clock, {"sync": "interval", "sync_interval": 250})
    assert logs[5].storage_for("y").sync_policy == 250
    logs[5].close()
    held = PartitionLog(partition_dir(str(tmp_path), 9), clock)
    with pytest.raises(CmdlogError):
        open_partition_logs(str(tmp_path), [8, 9], clock)
    held.close()
    open_partition_logs(str(tmp_path), [8], clock)[8].close()      # 8 was released on the failure


# ------------------------------------------------------------------ queues

def test_queue_names_survive_even_when_empty_and_erase_forgets(plog, clock):
    a = plog.storage_for("alpha")
    plog.storage_for("empty")
    b = plog.storage_for("beta+child")
    x = add(a, clock, b"x")
    add(a, clock, b"y")
    add(b, clock, b"z")
    a.record_open(x, 1)
    plog = reopen(plog)
    assert plog.queue_names() == ["alpha", "beta+child", "empty"]
    a = plog.storage_for("alpha")
    assert a.live_jobs == 2
    a.erase()
    assert plog.queue_names() == ["beta+child", "empty"]
    plog = reopen(plog)
    assert plog.queue_names() == ["beta+child", "empty"]
    st = plog.storage_for("alpha").replay(None)           # referenced again: a fresh, empty queue
    assert st.items == deque() and st.open_transactions == {}
    assert plog.queue_names() == ["alpha", "beta+child", "empty"]
    assert [i.data for i in plog.storage_for("beta+child").replay(None).items] == [b"z"]
    plog.close()


def test_workq_log_without_queue_file_lists_every_replayed_name(tmp_path, clock):
    d = str(tmp_path / "p")
    plog = PartitionLog(d, clock)
    now_ns = clock.now_ms() * 10**6
    for i, name in enumerate((b"done", b"live")):
        plog.append_command(sg.JobCommand(sg.ADD, bytes([i + 1]) * 16, name, 1, 60000, 0, 0, 0, b"", sg.ZERO_TIME_NS,
                                          now_ns))
    plog.append_command(sg.ResultCommand(sg.COMPLETE, b"\x01" * 16, b"r"))
    plog.append_command(sg.JobCommand(sg.ADD, b"\x09" * 16, b"old", 1, 1, 0, 0, 0, b"", sg.ZERO_TIME_NS, 0))
    plog.close()
    assert not os.path.exists(os.path.join(d, QUEUES_FILE))
    plog = PartitionLog(d, clock)
    assert plog.queue_names() == ["done", "live"]         # "old" was skipped (expired)
    assert os.path.exists(os.path.join(d, QUEUES_FILE))
    assert plog.storage_for("done").replay(None).replayed_adds == 1
    plog.close()


def test_scheduled_jobs_are_handed_over_when_due(plog, clock):
    now_ns = clock.now_ms() * 10**6
    for i, delay in enumerate((5000, 1000, 1000)):
        plog.append_command(sg.JobCommand(sg.SCHEDULE, bytes([0x40 + i]) * 16, b"later", 60000, 60000, i, 0, 0,
                                          b"s%d" % i, now_ns + delay * 10**6, now_ns))
    plog = reopen(plog)
    st = plog.storage_for("later")
    assert st.replay(None).items == deque() and st.live_jobs == 3
    assert plog.scheduled_count() == 3 and plog.scheduled_count("later") == 3
    assert plog.next_due() == clock.now_ms() + 1000
    assert plog.due_items(clock.now_ms() + 999) == []
    due = plog.due_items(clock.now_ms() + 1000)
    assert [(q, i.data, i.priority, i.expiry) for q, i in due] == [
        ("later", b"s1", 1, clock.now_ms() + 61000), ("later", b"s2", 2, clock.now_ms() + 61000)]
    assert plog.next_due() == clock.now_ms() + 5000
    plog.flush()
    size = st.logsize
    st.record_add(due[0][1])                              # the queue re-adds it: nothing written
    assert st.logsize == size and due[0][1].job_id == bytes([0x41]) * 16
    st.record_open(due[1][1], 1)                          # or just serves it
    clock.advance(1000)
    plog = reopen(plog)
    st = plog.storage_for("later")
    state = st.replay(None)
    assert [i.data for i in state.items] == [b"s1"] and [i.data for i in state.open_transactions.values()] == [b"s2"]
    assert plog.next_due() == clock.now_ms() + 4000
    st.erase()                                            # deletes the scheduled one too
    assert plog.next_due() is None
    plog = reopen(plog)
    assert plog.storage_for("later").live_jobs == 0 and plog.scheduled_count() == 0
    plog.close()


def test_workq_job_at_max_attempts_is_relogged_instead_of_failed(plog, clock):
    now_ns = clock.now_ms() * 10**6
    jid = b"\x00" * 6 + b"\x40\x00\x80" + b"\x00" * 6 + b"\x01"
    plog.append_command(sg.JobCommand(sg.ADD, jid, b"w", 1000, 60000, 7, 2, 0, b"job", sg.ZERO_TIME_NS, now_ns))
    plog = reopen(plog)
    st = plog.storage_for("w")
    state, _ = rollback(st)
    item = state.items[0]
    assert (item.data, item.priority, item.expiry) == (b"job", 7, clock.now_ms() + 60000)
    st.record_open(item, 1)
    st.record_unremove(item, 1)                           # attempt 1 of 2: a plain timeout-attempt
    assert item.job_id == jid
    st.record_open(item, 2)
    st.record_unremove(item, 2)                           # attempt 2 of 2: workq would FAIL it
    assert item.job_id != jid
    plog.flush()
    tail = [r["command"] for r in records(plog.dir)[-2:]]
    assert tail[0] == {"type": sg.DELETE, "id": jid}
    assert tail[1]["type"] == sg.ADD and tail[1]["id"] == item.job_id and tail[1]["max_attempts"] == 2
    assert (tail[1]["ttr"], tail[1]["priority"], tail[1]["created"]) == (1000, 7, indep.go_time(sg.encode_time(now_ns)))
    plog = reopen(plog)
    st = plog.storage_for("w")
    state, _ = rollback(st)
    assert [(i.data, i.job_id) for i in state.items] == [(b"job", item.job_id)]
    item = state.items[0]
    st.record_open(item, 1)                               # attempts restarted at 0
    st.record_unremove(item, 1)
    assert item.job_id == state.items[0].job_id
    plog.close()
