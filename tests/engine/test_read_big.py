"""Read-behind (and replay) of big records: their data is read in place into the item's own
`bytes` (codec.py `Cursor._read_big`), not grown chunk by chunk and sliced out (issue 8: 8 MiB
items read on the flood worker's loop).  Order and content must be exactly the records', across
files, next to small records and CONTINUEs; a record the file ends inside is still torn."""
from __future__ import annotations

import os

import pytest

from lanner.queues.item import QItem
from lanner.storage.journal import codec
from lanner.storage.journal.codec import BIG_READ, Cursor, JournalCorrupt, encode_add, encode_continue
from tests.engine.test_journal import T, open_journal


def big(tag: int, n: int = BIG_READ + 12345) -> bytes:
    return bytes((tag + i) % 251 for i in range(256)) * (n // 256) + bytes([tag]) * (n % 256)


def test_read_behind_gives_big_and_small_items_in_order_with_their_bytes(tmp_path, clock, monkeypatch):
    calls = []
    real = os.preadv
    monkeypatch.setattr(codec.os, "preadv", lambda fd, bufs, off: calls.append(off) or real(fd, bufs, off))
    j = open_journal(tmp_path, clock)
    j.record_add(QItem(T, 0, b"head"))
    j.start_read_behind()
    want = [big(1), b"s1", big(2, 3 << 20), b"s2", b"", big(3)]
    for k, data in enumerate(want):
        j.record_add(QItem(T + k, T + 99_000 if k == 2 else 0, data))
        if k == 3:
            j.record_remove(QItem(T, 0, b"head"))       # records that are no items are skipped
    got = []
    while j.in_read_behind:
        got += j.fill_read_behind(1, T)
    assert [i.data for i in got] == want
    assert [i.add_time for i in got] == [T + k for k in range(len(want))]
    assert got[2].expiry == T + 99_000 and all(type(i.data) is bytes for i in got)
    assert calls                         # the 3 MiB one (the others fit in a read chunk), in place


def test_a_big_continue_is_read_with_its_xid_and_a_torn_big_record_is_torn(tmp_path):
    path = tmp_path / "f"
    item = QItem(T, 0, big(7))
    path.write_bytes(encode_add(QItem(T, 0, b"x")) + encode_continue(42, item) + encode_add(QItem(T, 0, big(8)))[:-1])
    cur = Cursor(str(path), "f")
    try:
        assert cur.read(T)[1].data == b"x"
        op, got, xid, _ = cur.read(T)
        assert (op, xid, got.data) == (8, 42, item.data)
        with pytest.raises(JournalCorrupt) as e:
            cur.read(T)
        assert e.value.torn
    finally:
        cur.close()
