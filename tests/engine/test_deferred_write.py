"""Under sync "always", the records of the turns that come while a journal's fdatasync is under
way (or held for a gather) are written once, just before the next fdatasync of that journal
(Syncer.defer, `_issue`), not once per turn: that fdatasync could not cover them anyway.  The
commit rule is unchanged (no reply before the fdatasync that covers its record), and a write
that fails there fails exactly the requests whose records it carried, as a failed fdatasync
would."""
from __future__ import annotations

import errno
import os

from lanner.ipc.messages import OP_GET, OP_SET, R_ITEM, R_OK, R_SERVER_ERROR, RF_CLOSE
from lanner.storage.journal import journal as J
from tests.engine.conftest import published
from tests.engine.test_turn import HoldingUring, journal_writes, req


class SizedUring(HoldingUring):
    """HoldingUring that notes the journal file's size at each fdatasync of it submitted."""

    def __init__(self, path):
        super().__init__(path)
        self.sizes = []

    def submit(self, jobs):
        for _token, fd, _datasync, _after in jobs:
            if os.path.samefile(f"/proc/self/fd/{fd}", self.path):
                self.sizes.append(os.fstat(fd).st_size)
        return super().submit(jobs)


def always_worker(worker, tmp_path):
    made = []
    w = worker(sync_journal="always",
               uring=lambda: made.append(SizedUring(str(tmp_path / "queues" / "q"))) or made[0])
    return w, made[0]


def replies(w):
    """(conn, status, flags, payload) of each reply published, taken."""
    return [(conn, status, flags, payload) for conn, status, flags, _, payload in published(w)]


def statuses(w):
    return [(conn, status) for conn, status, _flags, _payload in replies(w)]


def test_turns_behind_an_fsync_under_way_are_written_once_just_before_the_next_one(worker, tmp_path,
                                                                                      monkeypatch):
    """Three turns' sets while q's first fdatasync is under way: the file does not grow until
    that one returns; then one write carries all three, before the fdatasync that covers them
    is submitted, and their replies leave after it.  (Each turn used to write its own.)"""
    w, uring = always_worker(worker, tmp_path)
    path = tmp_path / "queues" / "q"
    writes = journal_writes(monkeypatch)
    w.handle(0, req(1, OP_SET, "q", b"a"))
    w.finish_batch()                                  # round 1: written, its fdatasync held
    first = os.path.getsize(path)
    assert uring.calls == 1 and uring.sizes == [first] and len(writes) == 1
    for n in range(2, 5):
        w.handle(0, req(n, OP_SET, "q", b"b", n=n))
        w.finish_batch()
    assert os.path.getsize(path) == first and len(writes) == 1 and statuses(w) == []
    uring.release()
    w.finish_batch()                                  # the reap: one write, then one fdatasync
    assert statuses(w) == [(1, R_OK)]
    assert len(writes) == 2 and uring.calls == 2 and uring.sizes[1] == os.path.getsize(path) > first
    uring.release()
    w.wait_for_sync()
    assert statuses(w) == [(2, R_OK), (3, R_OK), (4, R_OK)]


def test_a_get_of_an_item_whose_add_is_not_yet_written_is_answered_after_both_are_durable(
        worker, tmp_path):
    """A set and then a get of that item while the fdatasync before them is under way: neither
    record is written yet; the get finds the item, and both replies leave after the fdatasync
    that covers both records."""
    w, uring = always_worker(worker, tmp_path)
    path = tmp_path / "queues" / "q"
    w.handle(0, req(1, OP_SET, "q", b"a"))
    w.finish_batch()
    first = os.path.getsize(path)
    w.handle(0, req(2, OP_SET, "q", b"new", n=2))
    w.finish_batch()
    w.handle(0, req(3, OP_GET, "q", n=3))
    w.finish_batch()
    assert os.path.getsize(path) == first
    uring.release()
    w.finish_batch()
    assert statuses(w) == [(1, R_OK)]
    uring.release()
    w.wait_for_sync()
    got = replies(w)
    assert [(c, s) for c, s, _, _ in got] == [(2, R_OK), (3, R_ITEM)] and got[1][3] == b"a"
    assert os.path.getsize(path) == uring.sizes[-1]


def test_a_failed_write_before_the_fsync_fails_exactly_the_requests_it_carried(worker, tmp_path,
                                                                              monkeypatch):
    """The deferred write fails (ENOSPC): the round's requests get SERVER_ERROR (the connection
    closes), their changes are undone, and no fdatasync is issued for them; the request that the
    fdatasync before had made durable keeps its STORED and its item; the journal takes writes
    again afterwards."""
    w, uring = always_worker(worker, tmp_path)
    w.handle(0, req(1, OP_SET, "q", b"kept"))
    w.finish_batch()
    for n in (2, 3):
        w.handle(0, req(n, OP_SET, "q", b"lost", n=n))
        w.finish_batch()
    real = J._write

    def enospc(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(J, "_write", enospc)
    uring.release()
    w.finish_batch()                                  # the reap: the write fails
    got = replies(w)
    assert [(c, s) for c, s, _, _ in got[:1]] == [(1, R_OK)]
    for conn, status, flags, why in got[1:]:
        assert (status, flags) == (R_SERVER_ERROR, RF_CLOSE) and b"No space left" in why
    assert sorted(c for c, _, _, _ in got[1:]) == [2, 3]
    assert uring.calls == 1
    assert [i.data for i in w.coll.queue("q").memory_items()] == [b"kept"]
    monkeypatch.setattr(J, "_write", real)
    w.handle(0, req(4, OP_SET, "q", b"again", n=4))
    w.finish_batch()
    uring.release()
    w.wait_for_sync()
    assert statuses(w) == [(4, R_OK)]
    assert [i.data for i in w.coll.queue("q").memory_items()] == [b"kept", b"again"]
