"""Shared counters and the shared status block, in one process and across fork()."""
from __future__ import annotations

import fcntl
import os
import select
import signal
import struct
import time

import pytest

from lanner.ipc import shm
from lanner.ipc.shm import ConfigEpoch, CounterBlock, IdBlocks, SharedBytes, SharedCounter
from tests.engine.forking import child_result, in_child




STATS = ("curr_connections", "total_connections", "bytes_read", "bytes_written")


def test_counter_block_validates():
    with pytest.raises(ValueError, match="slots"):
        CounterBlock.create(0, STATS)
    with pytest.raises(ValueError, match="unique"):
        CounterBlock.create(2, ("a", "a"))
    with pytest.raises(ValueError, match="unique"):
        CounterBlock.create(2, ())
    block = CounterBlock.create(2, STATS)
    with pytest.raises(IndexError, match="slot 2"):
        block.slot(2)
    with pytest.raises(KeyError, match="no counter 'nope'.*curr_connections"):
        block.total("nope")
    with pytest.raises(KeyError, match="no counter 4"):
        block.total(4)


def test_slots_are_cache_line_padded():
    assert CounterBlock.create(3, STATS).stride == 8
    assert CounterBlock.create(3, tuple(f"c{i}" for i in range(9))).stride == 16


def test_slots_sum_and_gauges():
    block = CounterBlock.create(3, STATS)
    cc, tc, br = (block.column(n) for n in STATS[:3])
    s0, s1, s2 = (block.slot(i) for i in range(3))
    for s in (s0, s1, s1, s2):
        s.incr(cc)
        s.incr(tc)
    s1.decr(cc)
    s2.incr(br, 1000)
    s0.words[br] += 24
    assert block.total("curr_connections") == 3
    assert block.total("total_connections") == 4 == block.total(tc)
    assert block.per_slot("bytes_read") == [24, 0, 1000]
    assert block.get(1, "curr_connections") == 1 and s1.get(cc) == 1
    assert block.totals() == {"curr_connections": 3, "total_connections": 4, "bytes_read": 1024,
                              "bytes_written": 0}


def test_cleared_slot_can_go_negative_and_others_are_untouched():
    block = CounterBlock.create(2, STATS)
    a, b = block.slot(0), block.slot(1)
    a.set(0, 5)
    b.set(0, 7)
    a.clear()
    a.decr(0)
    assert block.per_slot("curr_connections") == [-1, 7]


def bump(block: CounterBlock, slot: int, n: int) -> None:
    s = block.slot(slot)
    col = block.column("bytes_read")
    for _ in range(n):
        s.incr(col, 3)
        s.incr(0)
    s.decr(0, n)


def test_counters_are_shared_across_fork():
    block = CounterBlock.create(3, STATS)
    kids = [in_child(bump, block, i, 10_000) for i in (1, 2)]
    bump(block, 0, 10_000)
    for pid, rfd in kids:
        child_result(pid, rfd)
    assert block.per_slot("bytes_read") == [30_000] * 3
    assert block.total("curr_connections") == 0


def test_shared_bytes_roundtrip_and_version():
    sb = SharedBytes.create(16)
    assert sb.read() == b"" and sb.version == 0
    sb.write(b"up")
    assert sb.read() == b"up" and sb.version == 1
    sb.write(bytearray(b"quiescent"))
    sb.write(memoryview(b"readonly"))
    assert sb.read() == b"readonly" and sb.version == 3
    with pytest.raises(ValueError, match="17 bytes do not fit in 16"):
        sb.write(b"x" * 17)


def test_shared_bytes_reader_refuses_a_block_stuck_mid_write(monkeypatch):
    # fewer tries before the refusal: each past the 64th yields the CPU, and 100,000 yields
    # took 20 s on a loaded machine for a writer that is known to be gone
    monkeypatch.setattr(shm, "_MAX_READ_ATTEMPTS", 200)
    sb = SharedBytes.create(8)
    sb._hdr[0] = 1                          # a writer that died holding the sequence odd
    with pytest.raises(RuntimeError, match="mid-write"):
        sb.read()


def write_many(sb: SharedBytes, n: int) -> None:
    for i in range(n):
        sb.write(struct.pack("<Q", i) * (1 + i % 8))


def test_shared_bytes_readers_never_see_a_torn_write():
    sb = SharedBytes.create(64)
    pid, rfd = in_child(write_many, sb, 100_000)
    seen = 0
    while sb.version < 100_000 and not select.select([rfd], [], [], 0)[0]:
        data = sb.read()
        if data:
            i = struct.unpack_from("<Q", data)[0]
            assert data == struct.pack("<Q", i) * (1 + i % 8)
            assert i >= seen
            seen = i
    child_result(pid, rfd)
    assert sb.read() == struct.pack("<Q", 99_999) * 8


def test_close_unmaps():
    block = CounterBlock.create(1, STATS)
    block.close()
    with pytest.raises(ValueError):
        block.total("bytes_read")
    sb = SharedBytes.create(4)
    sb.close()
    with pytest.raises(ValueError):
        sb.read()


# -- SharedCounter / IdBlocks (thrift read ids, one server-wide sequence) ------------

def test_counter_starts_at_1_and_blocks_do_not_overlap():
    c = SharedCounter.create()
    a, b = IdBlocks(c, block=4), IdBlocks(c, block=4)
    assert [a.next(), a.next()] == [1, 2]
    assert [b.next() for _ in range(5)] == [5, 6, 7, 8, 9]
    assert [a.next(), a.next(), a.next()] == [3, 4, 13]
    assert c.value == 16
    c.close()


def _take_many(counter, n):
    ids = IdBlocks(counter, block=8)
    return [ids.next() for _ in range(n)]


def test_counter_shared_by_forked_processes_never_repeats():
    c = SharedCounter.create()
    kids = [in_child(_take_many, c, 3000) for _ in range(3)]
    mine = _take_many(c, 3000)
    got = [child_result(pid, fd) for pid, fd in kids] + [mine]
    flat = [i for ids in got for i in ids]
    assert len(flat) == len(set(flat)) == 12000
    assert all(ids == sorted(ids) for ids in got)
    c.close()


def test_a_process_killed_holding_the_counter_lock_does_not_wedge_it():
    c = SharedCounter.create()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                   # pragma: no cover - child
        fcntl.lockf(c.fd, fcntl.LOCK_EX)
        os.write(w, b"x")
        time.sleep(60)
        os._exit(0)
    assert os.read(r, 1) == b"x"                   # the child holds the lock
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    assert c.take(1) == 1                          # the kernel released it
    os.close(r)
    os.close(w)
    c.close()


def test_config_epoch_a_publish_leaves_every_other_view_behind_once():
    a = ConfigEpoch()
    b = a.for_child()
    assert not a.behind() and not b.behind()
    at = a.start()
    a.publish(at)                      # a read the file at `at` and it was valid
    assert not a.behind() and b.behind()
    b.loaded(b.start())
    assert not b.behind()


def test_config_epoch_a_bump_between_read_and_publish_makes_the_publisher_read_again():
    a = ConfigEpoch()
    b = a.for_child()
    at = a.start()                     # a reads the file ...
    b.publish(b.start())               # ... while b publishes a newer one
    a.publish(at)
    assert a.behind()                  # a may hold the older file: it must read once more
    assert b.behind()
