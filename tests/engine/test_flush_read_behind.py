"""`flush` of a queue in read-behind (issue 8): the items only the journal holds go without
being read back, the journal stays right across a restart, and a flush whose records are lost
is undone whole (the items come back in order)."""
from __future__ import annotations

import errno
import os

import pytest

from lanner.ipc.messages import OP_FLUSH, OP_SET, R_OK, pack_req, unpack_resp
from lanner.storage.journal import codec
from lanner.storage.journal import journal as J

N = 500


def req(conn, op, queue, payload=b"", n=1):
    q = queue.encode()
    return pack_req(conn, n, op, 0, len(q), 0, 0) + q + payload


def statuses(w):
    out = [unpack_resp(head, 0)[2] for _, head, _ in w.published]
    w.published.clear()
    return out


def enospc(fd, data):
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.fixture
def disk_reads(monkeypatch):
    """Counts the records the journals read back (read-behind's reader, `Cursor.read`)."""
    count = [0]
    real = codec.Cursor.read

    def read(self, *a, **kw):
        count[0] += 1
        return real(self, *a, **kw)

    monkeypatch.setattr(codec.Cursor, "read", read)
    return count


def filled(worker):
    w = worker(max_memory_size=2048)
    for i in range(N):
        w.handle(0, req(1, OP_SET, "q", b"%04d" % i + b"." * 96, n=i + 1))
    w.finish_batch()
    assert set(statuses(w)) == {R_OK}
    q = w.coll.queue("q")
    assert q.storage.in_read_behind and q.length == N and len(q.memory_items()) < 30
    return w, q


def test_flush_reads_nothing_back_and_survives_a_restart(worker, disk_reads):
    w, q = filled(worker)
    disk_reads[0] = 0
    w.handle(0, req(2, OP_FLUSH, "q"))
    w.finish_batch()
    assert statuses(w) == [R_OK]
    assert disk_reads[0] == 0
    stats = dict(q.stats())
    assert (stats["items"], stats["bytes"], stats["mem_items"], stats["mem_bytes"]) == ("0", "0", "0", "0")
    assert not q.storage.in_read_behind and stats["total_flushes"] == "1"
    w.handle(0, req(3, OP_SET, "q", b"after"))
    w.finish_batch()
    assert w.shutdown() == 0

    w2 = worker(max_memory_size=2048)                # replay: the flushed items stay gone
    q2 = w2.coll.queue("q")
    assert (q2.length, q2.size_bytes) == (1, 5)
    assert w2.coll.remove("q").data == b"after" and w2.coll.remove("q") is None


def test_a_flush_whose_records_are_lost_is_undone_whole(worker, monkeypatch):
    w, q = filled(worker)
    before = (q.length, q.size_bytes)
    monkeypatch.setattr(J, "_write", enospc)
    w.handle(0, req(2, OP_FLUSH, "q"))
    w.finish_batch()
    assert statuses(w) != [R_OK]
    assert (q.length, q.size_bytes) == before and q.storage.in_read_behind
    monkeypatch.setattr(J, "_write", os.write)
    got = []
    while (item := w.coll.remove("q")) is not None:
        got.append(item.data[:4])
    assert got == [b"%04d" % i for i in range(N)]
    assert q.length == 0 and q.size_bytes == 0
