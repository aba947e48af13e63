"""packer.pack_files: exact output, equivalence with replay, bounded memory (reference §6.5, §6.7)."""
from __future__ import annotations

import logging
import os
import shutil
import struct
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given, settings, strategies as st

from lanner.config import UNBOUNDED_JOURNAL as UNBOUNDED
from lanner.storage.journal import packer as P
from lanner.clock import FakeClock
from lanner.queues.item import QItem
from lanner.storage.journal.codec import (JournalCorrupt, encode_add, encode_confirm, encode_continue, encode_open,
                                          encode_remove, encode_unremove)
from lanner.storage.journal.journal import Journal
from lanner.storage.journal.packer import pack_files

T = 1_700_000_000_000
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def addx(data, add=T, exp=0):
    return encode_add(QItem(add, exp, data))


def write(path, *chunks):
    with open(path, "wb") as f:
        f.write(b"".join(chunks))


def state_of(directory, now=T):
    """What a queue replaying `directory` holds: (queue items, open transactions)."""
    j = Journal(str(directory), "q", FakeClock(now))
    st = j.replay(UNBOUNDED)
    j.close()
    items = [(i.data, i.add_time, i.expiry) for i in st.items]
    opened = {x: (i.data, i.add_time, i.expiry) for x, i in st.open_transactions.items()}
    return items, opened


def test_pack_output_is_exact(tmp_path):
    write(tmp_path / "a", addx(b"one"), addx(b"two", exp=T + 9), addx(b"three"), encode_open(4), encode_open(7))
    write(tmp_path / "b", addx(b"four"), encode_remove(), addx(b"five"), encode_open(5), encode_unremove(5),
          encode_confirm(4))
    r = pack_files([str(tmp_path / "a"), str(tmp_path / "b")], str(tmp_path / "out"), now_ms=T)
    assert (tmp_path / "out").read_bytes() == (addx(b"two", exp=T + 9) + encode_open(7) + addx(b"four")
                                               + addx(b"five"))
    assert (r.items, r.bytes, r.open_xids, r.xid_counter) == (2, 8, [7], 5)
    assert r.in_bytes == (tmp_path / "a").stat().st_size + (tmp_path / "b").stat().st_size
    assert r.out_bytes == (tmp_path / "out").stat().st_size and r.broken == []
    assert not (tmp_path / "out.tmp").exists()


def test_open_transactions_come_first_in_ascending_xid_order(tmp_path):
    write(tmp_path / "a", addx(b"a"), addx(b"b"), addx(b"c"), encode_open(9), encode_open(3), encode_open(6),
          addx(b"d"))
    pack_files([str(tmp_path / "a")], str(tmp_path / "out"), now_ms=T)
    assert (tmp_path / "out").read_bytes() == (addx(b"b") + encode_open(3) + addx(b"c") + encode_open(6)
                                               + addx(b"a") + encode_open(9) + addx(b"d"))


def test_legacy_records_become_addx(tmp_path):
    legacy_add = b"\x00" + struct.pack("<ii", 4 + 3, 1000) + b"old"
    add_xid = b"\x07" + struct.pack("<I", 2) + addx(b"ax")[1:]
    write(tmp_path / "a", legacy_add, add_xid, struct.pack("<BI", 4, 40), b"\x03",
          encode_continue(0, QItem(T, 0, b"cont")))
    r = pack_files([str(tmp_path / "a")], str(tmp_path / "out"), now_ms=T + 1)
    # REMOVE_TENTATIVE reserved "old" under xid 0, which CONTINUE(0) then confirmed
    assert (tmp_path / "out").read_bytes() == addx(b"ax") + addx(b"cont")
    assert r.open_xids == [] and r.xid_counter == 0


def test_legacy_remove_tentative_can_take_the_next_free_xid_like_kestrels_qpack(tmp_path):
    write(tmp_path / "a", addx(b"a"), addx(b"b"), addx(b"c"), encode_open(2), struct.pack("<BI", 4, 1), b"\x03",
          encode_unremove(3), b"\x03")
    r = pack_files([str(tmp_path / "a")], str(tmp_path / "out"), now_ms=T, legacy_xids=True)
    # xid 2 is open, so after SAVE_XID 1 the legacy reserve takes 3; UNREMOVE 3 puts b back; next is 4
    assert (tmp_path / "out").read_bytes() == addx(b"a") + encode_open(2) + addx(b"b") + encode_open(4) \
        + addx(b"c")
    assert r.open_xids == [2, 4]
    pack_files([str(tmp_path / "a")], str(tmp_path / "out"), now_ms=T)       # the server's replay rule
    assert (tmp_path / "out").read_bytes() == addx(b"c") + encode_open(0) + addx(b"a") + encode_open(2)


def test_legacy_add_takes_the_pack_time(tmp_path):
    write(tmp_path / "a", b"\x00" + struct.pack("<ii", 4 + 1, 0) + b"z")
    pack_files([str(tmp_path / "a")], str(tmp_path / "out"), now_ms=T + 5)
    assert (tmp_path / "out").read_bytes() == addx(b"z", add=T + 5)


def test_broken_record_raises_and_writes_nothing(tmp_path):
    """A pack replaces its inputs: skipping what it cannot read would delete it for good."""
    write(tmp_path / "a", addx(b"a"), b"\x63", addx(b"not lost"))
    write(tmp_path / "b", addx(b"b"))
    with pytest.raises(JournalCorrupt, match="invalid opcode 99") as ei:
        pack_files([str(tmp_path / "a"), str(tmp_path / "b")], str(tmp_path / "out"), now_ms=T)
    assert (ei.value.file, ei.value.offset) == (str(tmp_path / "a"), 22)
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.tmp").exists()
    assert (tmp_path / "a").stat().st_size == 22 + 1 + 29      # inputs untouched


def test_torn_tail_of_the_last_file_is_left_out_only_when_allowed(tmp_path, caplog):
    write(tmp_path / "a", addx(b"a"))
    write(tmp_path / "b", addx(b"b"), b"\x02\x15")
    files = [str(tmp_path / "a"), str(tmp_path / "b")]
    with pytest.raises(JournalCorrupt):
        pack_files(files, str(tmp_path / "out"), now_ms=T)
    r = pack_files(files, str(tmp_path / "out"), now_ms=T, allow_torn_tail=True)
    assert (tmp_path / "out").read_bytes() == addx(b"a") + addx(b"b")
    assert r.broken == [(str(tmp_path / "b"), 22, "end of file inside a record")]
    write(tmp_path / "a", addx(b"a"), b"\x02\x15")           # torn, but not the last file
    with pytest.raises(JournalCorrupt):
        pack_files(files, str(tmp_path / "out"), now_ms=T, allow_torn_tail=True)


def test_checkpoint_snapshot_mismatch_is_logged_and_the_files_win(tmp_path, caplog):
    write(tmp_path / "a", addx(b"a"), encode_open(1))
    with caplog.at_level(logging.WARNING, logger="lanner.storage.journal.packer"):
        r = pack_files([str(tmp_path / "a")], str(tmp_path / "out"), open_xids_at_checkpoint=[1, 2], now_ms=T)
    assert r.open_xids == [1] and "open xids [1]" in caplog.text and "[1, 2]" in caplog.text
    caplog.clear()
    pack_files([str(tmp_path / "a")], str(tmp_path / "out"), open_xids_at_checkpoint=[1], now_ms=T)
    assert caplog.text == ""


def test_empty_input_packs_to_an_empty_file(tmp_path):
    write(tmp_path / "a", addx(b"a"), encode_remove())
    r = pack_files([str(tmp_path / "a")], str(tmp_path / "out"), now_ms=T)
    assert (tmp_path / "out").read_bytes() == b"" and r.items == 0


def test_progress_is_monotonic_and_complete(tmp_path, monkeypatch):
    monkeypatch.setattr(P, "CHUNK", 1000)
    write(tmp_path / "a", *[addx(b"x" * 100)] * 200)
    seen = []
    pack_files([str(tmp_path / "a")], str(tmp_path / "out"), progress=lambda d, t: seen.append((d, t)), now_ms=T)
    total = 2 * (tmp_path / "a").stat().st_size
    assert seen[-1] == (total, total)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen) and all(t == total for _, t in seen)


def test_loc_fifo_spills_and_keeps_order(tmp_path, monkeypatch):
    monkeypatch.setattr(P, "_FIFO_BLOCK", 16)
    f = P._LocFifo(str(tmp_path))
    expect = []
    n = 0
    for round_ in range(5):
        for _ in range(37 * (round_ + 1)):
            f.push(n)
            expect.append(n)
            n += 1
        for _ in range(23):
            assert f.pop() == expect.pop(0)
        assert len(f) == len(expect)
    while expect:
        assert f.pop() == expect.pop(0)
    assert len(f) == 0 and os.fstat(f._fd).st_size == 0      # emptied: the spill file starts over
    f.push(1 << 60)
    assert f.pop() == 1 << 60
    f.close()
    assert os.listdir(tmp_path) == []                        # the spill file was never visible


# ---------------------------------------------------------------- equivalence

xids = st.integers(1, 5)
ops = st.lists(st.one_of(
    st.tuples(st.just("add"), st.binary(max_size=12), st.integers(0, 3)),
    st.tuples(st.just("rem")),
    st.tuples(st.just("open"), xids),
    st.tuples(st.just("unremove"), xids),
    st.tuples(st.just("confirm"), xids),
    st.tuples(st.just("continue"), xids, st.binary(max_size=5)),
    st.tuples(st.just("save"), xids),
    st.tuples(st.just("legacy"), st.sampled_from(["add", "add_xid", "rsv"]), st.binary(max_size=5)),
), max_size=60)


def encode(op) -> bytes:
    kind = op[0]
    if kind == "add":
        return addx(op[1], add=T + op[2], exp=(T + 99) if op[2] == 3 else 0)
    if kind == "rem":
        return encode_remove()
    if kind == "open":
        return encode_open(op[1])
    if kind == "unremove":
        return encode_unremove(op[1])
    if kind == "confirm":
        return encode_confirm(op[1])
    if kind == "continue":
        return encode_continue(op[1], QItem(T, 0, op[2]))
    if kind == "save":
        return struct.pack("<BI", 4, op[1])
    sub, data = op[1], op[2]
    if sub == "add":
        return b"\x00" + struct.pack("<ii", 4 + len(data), 7) + data
    if sub == "add_xid":
        return b"\x07" + struct.pack("<I", 3) + addx(data)[1:]
    return b"\x03"


@settings(max_examples=120, deadline=None)
@given(ops=ops, cuts=st.lists(st.integers(0, 60), max_size=4), split=st.integers(0, 5))
def test_pack_of_a_prefix_then_the_rest_replays_to_the_same_state(tmp_path_factory, ops, cuts, split):
    """The checkpoint-pack guarantee: pack(files[:k]) + files[k:] == files."""
    base = tmp_path_factory.mktemp("eq")
    orig, packed = base / "orig", base / "packed"
    orig.mkdir()
    packed.mkdir()
    bounds = sorted({min(c, len(ops)) for c in cuts} | {0, len(ops)})
    chunks = [b"".join(encode(o) for o in ops[a:b]) for a, b in zip(bounds, bounds[1:])] or [b""]
    names = [f"q.{100 + i}" for i in range(len(chunks) - 1)] + ["q"]
    for name, data in zip(names, chunks):
        write(orig / name, data)
    k = min(split, len(names) - 1)                 # archives 0..k-1 get packed
    if k:
        r = pack_files([str(orig / n) for n in names[:k]], str(packed / names[k - 1]), now_ms=T)
        assert r.broken == []
    for name in names[k:]:
        shutil.copy(orig / name, packed / name)
    assert state_of(packed) == state_of(orig)
    whole = base / "whole"                          # the qpack case: every file, current included
    whole.mkdir()
    pack_files([str(orig / n) for n in names], str(whole / "q.1"), now_ms=T)
    write(whole / "q")
    assert state_of(whole) == state_of(orig)


# ---------------------------------------------------------------- memory bound

GEN = """
import os, struct, sys
sys.path.insert(0, {root!r})
from lanner.storage.journal.codec import encode_add, encode_remove, encode_open, encode_confirm
from lanner.queues.item import QItem
path, target = sys.argv[1], int(sys.argv[2])
block = bytearray()
n = 0
while len(block) < (1 << 20):
    for i in range(3):
        block += encode_add(QItem(1, 0, (b"%08d" % n) * 8))
        n += 1
    block += encode_remove()
    block += encode_open((n % 50) + 1)
    block += encode_confirm((n % 50) + 1)
with open(path, "wb") as f:
    for _ in range(target // len(block) + 1):
        f.write(block)
"""

# Peak RSS from VmHWM: ru_maxrss would report the (big) pytest parent's peak, since
# Linux carries it across fork and exec.
PACK = """
import sys, time
sys.path.insert(0, {root!r})
from lanner.storage.journal.packer import pack_files
t = time.monotonic()
r = pack_files([sys.argv[1]], sys.argv[2], now_ms=1)
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(hwm, r.items, r.in_bytes, r.out_bytes, time.monotonic() - t)
"""


@pytest.mark.slow
def test_packing_200_mb_stays_under_64_mib_rss(tmp_path):
    src, out = str(tmp_path / "q.1"), str(tmp_path / "q.1.packed")
    subprocess.run([sys.executable, "-c", textwrap.dedent(GEN.format(root=ROOT)), src, str(200 << 20)], check=True)
    size = os.path.getsize(src)
    assert size >= 200 << 20
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(PACK.format(root=ROOT)), src, out],
                         check=True, capture_output=True, text=True)
    maxrss_kb, items, in_bytes, out_bytes, secs = res.stdout.split()
    assert int(in_bytes) == size and int(out_bytes) == os.path.getsize(out)
    # 2.4M items of 64 bytes go in, one in three survives
    assert int(items) > 700_000 and int(out_bytes) > 60 << 20
    assert int(maxrss_kb) < 64 * 1024, f"packing {size >> 20} MiB peaked at {int(maxrss_kb) >> 10} MiB RSS"


def test_a_packs_buffers_stay_under_one_mib(tmp_path):
    """A pack runs in a child the cleaner forks while the worker holds `max_memory_size` of
    items: whatever the pack allocates adds to the server's peak (issue 8, `perf memory`), so
    its read and write buffers are codec.CHUNK, 256 KiB (with 1 MiB chunks it allocated 3.2 MiB
    at once: one chunk joined to the next).  8 MiB of 1 KiB items in, half of them read."""
    import tracemalloc
    records = []
    for i in range(8192):
        records.append(addx(b"%08d" % i + b"x" * 1016))
        if i % 2:
            records.append(encode_remove())
    write(tmp_path / "a", *records)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        r = pack_files([str(tmp_path / "a")], str(tmp_path / "out"), now_ms=T)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert r.items == 4096 and r.out_bytes == (tmp_path / "out").stat().st_size
    assert peak < 1 << 20, f"the pack allocated up to {peak / 2**20:.1f} MiB at once"
