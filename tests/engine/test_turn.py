"""What a worker's turn pays for (issue 8, per-loop-turn costs), in-process: the timer is armed
when a deadline comes that is earlier than the armed one, never as a matter of course, and the
batch's end visits the storages its requests wrote, not every storage that is not yet synced."""
from __future__ import annotations

import asyncio
import errno
import os
import random
import threading
from collections import deque

import pytest

from lanner.config import QueueConfig, load_config
from lanner.ipc.messages import OP_SET, R_OK, pack_req, unpack_resp
from lanner.perf.hotloop import NullTransport, Rig
from lanner.protocols.memcache import Set
from lanner.queues.item import QItem
from lanner.server.commit import WRITE_BEHIND_BYTES
from lanner.server.shardloop import TURN_READS
from lanner.storage import writer as WR
from lanner.storage.journal import journal as J
from lanner.storage.journal.files import JournalError
from lanner.storage.journal.journal import Journal
from lanner.storage.writer import Writer


NO_DEADLINE = float("inf")      # the armed timer's deadline while none is armed (shardloop.py)


def req(conn, op, queue, payload=b"", n=1, a=0):
    q = queue.encode()
    return pack_req(conn, n, op, 0, len(q), a, 0) + q + payload


def statuses(w):
    out = [(unpack_resp(head, 0)[0], unpack_resp(head, 0)[2]) for _, head, _ in w.published]
    w.published.clear()
    return out


def journal_writes(monkeypatch) -> list:
    """The size of every journal write from now on."""
    writes = []
    real = J._write

    def write(fd, data):
        writes.append(len(data))
        return real(fd, data)
    monkeypatch.setattr(J, "_write", write)
    return writes


def counting(monkeypatch, obj, method: str) -> list:
    """Count the calls of `obj`'s `method`, one entry per call: patched on its class (a worker
    has slots, no dict), counting only `obj`'s; the loop and data_received both look it up
    through the instance."""
    calls = []
    real = getattr(type(obj), method)

    def counted(self, *args):
        if self is obj:
            calls.append(1)
        return real(self, *args)
    monkeypatch.setattr(type(obj), method, counted)
    return calls


class HoldingUring:
    """io_uring (storage/uring.py) as the syncer sees it, with no kernel behind it: fdatasyncs
    complete at once, except those of `path`, which complete when the test says (`release`).
    `calls` counts the fdatasyncs of `path` submitted."""

    def __init__(self, path):
        self.fd = os.eventfd(0, os.EFD_NONBLOCK)
        self.path = path
        self.held, self.done = [], []
        self.calls = 0
        self.inflight = 0

    def open(self):
        return True

    def submit(self, jobs):
        for token, fd, _datasync, _after in jobs:
            if os.path.samefile(f"/proc/self/fd/{fd}", self.path):
                self.calls += 1
                self.held.append((token, 0))
            else:
                self.done.append((token, 0))
        os.eventfd_write(self.fd, 1)
        return len(jobs), None

    def release(self):
        self.done += self.held
        self.held = []
        os.eventfd_write(self.fd, 1)

    def ready(self):
        return bool(self.done)

    def reap(self, wait=False):
        try:
            os.eventfd_read(self.fd)        # (as the real one: a signal is taken once)
        except BlockingIOError:
            pass
        if wait and not self.done:      # (a test that failed holding one: the teardown's close)
            self.release()
        out, self.done = self.done, []
        return out

    def close(self):
        os.close(self.fd)


def test_a_journal_is_fsynced_for_the_batches_that_wrote_it_not_for_every_turn(worker, tmp_path):
    """sync "always": while q's fdatasync is under way, batches that wrote only `other` (or
    nothing) fsync `other` alone.  (The batch's end used to list every journal not yet synced,
    so each of those batches submitted one more fdatasync of q, drained behind the first.)"""
    made = []
    w = worker(sync_journal="always",
               uring=lambda: made.append(HoldingUring(str(tmp_path / "queues" / "q"))) or made[0])
    uring = made[0]
    w.handle(0, req(1, OP_SET, "q", b"a"))
    w.finish_batch()                                  # round 1: q's fdatasync, held
    assert uring.calls == 1
    for n in range(2, 5):
        w.handle(0, req(n, OP_SET, "other", b"b", n=n))
        w.finish_batch()                              # a round of `other`
        w.finish_batch()                              # and a turn that wrote nothing
    assert statuses(w) == []                          # behind round 1, in order
    uring.release()
    w.wait_for_sync()
    assert statuses(w) == [(1, R_OK), (2, R_OK), (3, R_OK), (4, R_OK)]
    assert uring.calls == 1


def holding_worker(worker, tmp_path):
    made = []
    w = worker(sync_journal="always",
               uring=lambda: made.append(HoldingUring(str(tmp_path / "queues" / "q"))) or made[0])
    return w, made[0]


def test_batches_of_several_turns_behind_an_fsync_share_the_next_one(worker, tmp_path):
    """sync "always", one queue: the batches of the turns that came while q's fdatasync was under
    way all wait for the next one, one fdatasync for all (Syncer.join).  (Each used to start a
    round of its own, and the first one's fdatasync, drained behind the one under way, covered
    that batch alone: three fdatasyncs here instead of two.)"""
    w, uring = holding_worker(worker, tmp_path)
    w.handle(0, req(1, OP_SET, "q", b"a"))
    w.finish_batch()                                  # round 1: q's fdatasync, held
    for n in range(2, 5):
        w.handle(0, req(n, OP_SET, "q", b"b", n=n))
        w.finish_batch()
    assert uring.calls == 1 and len(w.syncer) == 2 and statuses(w) == []
    uring.release()
    w.finish_batch()                                  # the reap: one fdatasync for 2, 3 and 4
    assert statuses(w) == [(1, R_OK)] and uring.calls == 2
    uring.release()
    w.wait_for_sync()
    assert statuses(w) == [(2, R_OK), (3, R_OK), (4, R_OK)] and uring.calls == 2


def test_a_batch_that_ends_as_the_fsync_returns_rides_the_next_one(worker, tmp_path):
    """The batch of the turn in which q's fdatasync returned joins the rounds that waited before
    the reap starts their fdatasync, which then covers it too.  (It was reaped first, so the
    batch waited for one fdatasync more.)"""
    w, uring = holding_worker(worker, tmp_path)
    w.handle(0, req(1, OP_SET, "q", b"a"))
    w.finish_batch()                                  # round 1, held
    w.handle(0, req(2, OP_SET, "q", b"b", n=2))
    w.finish_batch()                                  # round 2 waits for it
    uring.release()                                   # returns during the next turn
    w.handle(0, req(3, OP_SET, "q", b"c", n=3))
    w.finish_batch()
    assert statuses(w) == [(1, R_OK)] and uring.calls == 2
    uring.release()
    w.wait_for_sync()
    assert statuses(w) == [(2, R_OK), (3, R_OK)] and uring.calls == 2


def test_a_write_behind_leaves_the_records_behind_it_to_the_batch_that_takes_it(worker, monkeypatch,
                                                                                  tmp_path):
    """Records that come in while a journal's write is under way (the writer thread) go out
    chained behind it, and their replies leave once that chain is taken, by a batch's end in
    which no request touched the queue, none before."""
    w = worker(uring=None)
    gate = threading.Event()
    real = WR._write

    def write(fd, data):
        assert gate.wait(10)
        return real(fd, data)
    monkeypatch.setattr(WR, "_write", write)
    big = b"x" * (WRITE_BEHIND_BYTES // 2 + 1)
    w.handle(0, req(1, OP_SET, "q", big))
    w.handle(0, req(2, OP_SET, "q", big, n=2))
    w.finish_batch()                                  # written behind, held at the gate
    assert w.writing and statuses(w) == []
    w.handle(0, req(3, OP_SET, "q", b"small", n=3))
    w.finish_batch()                                  # chained behind the write under way
    assert statuses(w) == []
    gate.set()
    w.settle_writes(block=True)
    w.finish_batch()                                  # nothing touched q in this turn
    assert statuses(w) == [(1, R_OK), (2, R_OK), (3, R_OK)]
    assert not w.coll.queue("q").storage.dirty
    assert [i.data for i in w.coll.queue("q").memory_items()][-1] == b"small"


def test_turns_that_add_no_deadline_do_not_arm_the_timer(tmp_path, monkeypatch):
    """A turn ends with a look at the timer only if one of its requests added a deadline earlier
    than the armed one (it used to compute the earliest deadline of everything whenever no
    timer was armed, i.e. on every turn of a worker with nothing timed)."""
    rig = Rig(str(tmp_path), 1)
    try:
        w = rig.worker
        arms = counting(monkeypatch, w, "arm_timer")
        c = rig.conns[0]
        c.data_received(b"get q\r\n")
        rig.turn()                                    # the first turn looks (as `run` does)
        arms.clear()
        for i in range(50):
            c.data_received(b"set q 0 0 1\r\nx\r\n" if i % 2 == 0 else b"get q\r\n")
            rig.turn()
        assert arms == []
        assert b"".join(c.transport.written).count(b"VALUE q 0 1\r\nx\r\nEND") == 25
        assert w.timer is None and w.timer_ms == NO_DEADLINE
    finally:
        rig.close()


def test_a_deadline_earlier_than_the_armed_timer_re_arms_it_and_a_later_one_does_not(tmp_path):
    rig = Rig(str(tmp_path), 3)
    try:
        w = rig.worker
        a, b, c = rig.conns
        a.data_received(b"get q/t=5000\r\n")
        rig.turn()
        first = w.timer_ms
        assert first != NO_DEADLINE and w.timer is not None
        b.data_received(b"get q/t=10000\r\n")        # later: the armed timer stays
        rig.turn()
        assert w.timer_ms == first
        # earlier: re-armed for it (300 ms, not 1: a 1 ms timer could fire inside the turn, and
        # the check below then saw no timer armed at all)
        c.data_received(b"get r/t=300\r\n")
        rig.turn()
        assert w.timer_ms < first
        loop = w.loop
        deadline = loop.time() + 5
        while not c.transport.written and loop.time() < deadline:
            loop.run_until_complete(asyncio.sleep(0.005))
        assert b"".join(c.transport.written) == b"END\r\n"         # the 300 ms get, on time
        assert not a.transport.written and not b.transport.written
        while w.turn_scheduled:                 # the turn the timer scheduled, if still to come
            rig.turn()
        assert w.timer_ms == first                                  # back to the 5 s one
    finally:
        rig.close()


class JournalAtWrite(NullTransport):
    """A client's transport that records, at each reply write, how many bytes the queue's
    journal file held then (the commit rule: a reply leaves after its records reached the OS)."""

    def __init__(self, folder: str) -> None:
        super().__init__()
        self.folder = folder
        self.journal_sizes: list[int] = []

    def write(self, data: bytes) -> None:
        self.journal_sizes.append(os.path.getsize(os.path.join(self.folder, "q")))
        super().write(data)


def test_the_one_connection_ends_its_turn_in_data_received_journal_first(tmp_path, monkeypatch):
    """A worker with one connection: nobody else's requests can join the batch, so the turn
    ends as data_received returns, with no loop callback scheduled for it (issue 8, per turn),
    and still writes the journal before the reply."""
    rig = Rig(str(tmp_path), 1, transport=lambda: JournalAtWrite(str(tmp_path / "q")))
    try:
        w = rig.worker
        c = rig.conns[0]
        ends = counting(monkeypatch, w, "end_quiet_turn")
        c.data_received(b"set q 0 0 3\r\nabc\r\n")
        assert b"".join(c.transport.written) == b"STORED\r\n"     # before the loop turned
        assert c.transport.journal_sizes[0] > 3                    # the record was written first
        assert ends == [1] and not w.turn_scheduled
        rig.turn()
        assert ends == [1]                                          # no call_soon turn behind it
        c.data_received(b"get q\r\nget q\r\n")
        assert b"".join(c.transport.written) == b"STORED\r\nVALUE q 0 3\r\nabc\r\nEND\r\nEND\r\n"
        assert ends == [1, 1]
    finally:
        rig.close()


def test_two_connections_share_the_turn_and_its_one_journal_write(tmp_path, monkeypatch):
    """With two connections the turn still ends in the loop, after both were read: one journal
    write for both sets, then both replies."""
    rig = Rig(str(tmp_path), 2)
    try:
        writes = journal_writes(monkeypatch)
        a, b = rig.conns
        a.data_received(b"set q 0 0 1\r\nx\r\n")
        b.data_received(b"set q 0 0 1\r\ny\r\n")
        assert not a.transport.written and not b.transport.written and rig.worker.turn_scheduled
        rig.turn()
        assert len(writes) == 1
        assert a.transport.written == [b"STORED\r\n"] and b.transport.written == [b"STORED\r\n"]
    finally:
        rig.close()


def test_a_turn_ended_in_data_received_ends_even_when_a_command_raises(tmp_path):
    """An exception out of the connection's pump (a bug) still ends the turn it began: the
    request taken before it is answered, and the next bytes start a turn of their own."""
    rig = Rig(str(tmp_path), 1)
    try:
        w = rig.worker
        c = rig.conns[0]
        handlers = c.handlers
        real = handlers[Set]

        def store(conn, cmd):
            real(conn, cmd)
            raise RuntimeError("a handler bug")
        c.handlers = {**handlers, Set: store}
        with pytest.raises(RuntimeError):
            c.data_received(b"set q 0 0 1\r\nx\r\n")
        assert not w.turn_scheduled
        c.handlers = handlers           # the protocol's table again
        c.data_received(b"get q\r\n")
        assert b"".join(c.transport.written) == b"STORED\r\nVALUE q 0 1\r\nx\r\nEND\r\n"
    finally:
        rig.close()


@pytest.mark.parametrize("policy, behind", [("never", True), ("always", False)])
def test_a_big_buffer_goes_behind_except_under_sync_always(tmp_path, clock, policy, behind):
    """Journal.flush at a batch's end for one journal: a buffer of `behind` bytes or more
    goes to the writer's thread, unless the replies wait for an fsync anyway ("always")."""
    j = Journal(str(tmp_path), "q", clock, sync_policy=policy)
    j.replay(QueueConfig())
    notify_r, notify_w = os.pipe()
    writer = Writer(notify_w)
    try:
        j.record_add(QItem(1, 0, b"x" * 100))
        assert j.flush(writer, 50) is behind
        if behind:
            j.settle_write()
        assert os.path.getsize(tmp_path / "q") > 100 and not j.pending_bytes
        j.record_add(QItem(2, 0, b"y"))
        assert j.flush(writer, 50) is False                   # small: written inline
        assert j.written_mark == j.logsize
    finally:
        j.close()
        writer.close()
        os.close(notify_r)
        os.close(notify_w)


def test_a_failed_inline_write_keeps_the_records_and_cuts_the_file_back(tmp_path, clock, monkeypatch):
    """A batch end's inline write (`flush` with `behind`) that fails: JournalError, the records
    stay buffered, and the next write (after the file was cut back) carries them."""
    j = Journal(str(tmp_path), "q", clock)
    j.replay(QueueConfig())
    try:
        j.record_add(QItem(1, 0, b"a"))
        assert j.flush(None, 1 << 20) is False
        size = os.path.getsize(tmp_path / "q")

        def torn(fd, data):
            os.write(fd, bytes(data[:3]))
            raise OSError(errno.ENOSPC, "No space left on device")
        monkeypatch.setattr(J, "_write", torn)
        j.record_add(QItem(2, 0, b"b"))
        with pytest.raises(JournalError, match="No space left"):
            j.flush(None, 1 << 20)
        assert os.path.getsize(tmp_path / "q") == size and j.pending_bytes > 0
        monkeypatch.setattr(J, "_write", os.write)
        assert j.flush(None, 1 << 20) is False
        assert os.path.getsize(tmp_path / "q") > size and not j.pending_bytes
    finally:
        j.close()


def test_a_loop_iteration_ends_the_batch_every_turn_reads_connections(tmp_path, monkeypatch):
    """Many connections ready at once (issue 8, 100 -> 1000 connections): after TURN_READS of
    them were read, their batch ends there and then, journal first, their replies written;
    the iteration reads on into a new batch, which the scheduled turn ends.  (One batch of
    all of them touched each connection twice, a thousand connections apart, out of cache.)"""
    n = TURN_READS + 6
    folder = tmp_path / "q"
    rig = Rig(str(tmp_path), n, transport=lambda: JournalAtWrite(str(folder)))
    try:
        writes = journal_writes(monkeypatch)
        w = rig.worker
        ends = counting(monkeypatch, w, "end_turn")
        for i, c in enumerate(rig.conns):
            c.data_received(b"set q 0 0 1\r\n%c\r\n" % (65 + i % 26))
            if i == TURN_READS - 2:
                assert writes == [] and not any(c.transport.written for c in rig.conns)
        first, rest = rig.conns[:TURN_READS], rig.conns[TURN_READS:]
        assert len(writes) == 1 and ends == [1] and w.turn_scheduled
        assert all(c.transport.written == [b"STORED\r\n"] for c in first)
        assert all(c.transport.journal_sizes[0] > 0 for c in first)     # the record went first
        assert not any(c.transport.written for c in rest)
        rig.turn()
        assert len(writes) == 2 and ends == [1, 1]
        assert all(c.transport.written == [b"STORED\r\n"] for c in rest)
        assert [i.data for i in w.coll.queue("q").memory_items()] == \
            [b"%c" % (65 + i % 26) for i in range(n)]                   # in the order read
    finally:
        rig.close()


def test_cut_batches_keep_every_reply_and_the_queue_order(tmp_path):
    """3 * TURN_READS + 5 connections, each iteration every one sends a set or a get of one
    queue (a random mix, some pipelining both), for 12 iterations: every reply is what a FIFO
    fed in read order answers, however the iterations' batches were cut."""
    rnd = random.Random(8)
    n = 3 * TURN_READS + 5
    rig = Rig(str(tmp_path), n)
    try:
        model = deque()
        want = [[] for _ in range(n)]
        seq = 0
        for _ in range(12):
            for i, c in enumerate(rig.conns):
                chunk = b""
                for op in rnd.choice(("s", "g", "sg", "gs", "ss")):
                    if op == "s":
                        seq += 1
                        value = b"%d" % seq
                        chunk += b"set q 0 0 %d\r\n%s\r\n" % (len(value), value)
                        model.append(value)
                        want[i].append(b"STORED\r\n")
                    else:
                        chunk += b"get q\r\n"
                        want[i].append(b"VALUE q 0 %d\r\n%s\r\nEND\r\n" % (len(model[0]), model[0])
                                       if model else b"END\r\n")
                        if model:
                            model.popleft()
                c.data_received(chunk)
            rig.turn()
        for i, c in enumerate(rig.conns):
            assert b"".join(c.transport.written) == b"".join(want[i]), i
    finally:
        rig.close()


def test_under_sync_always_a_cut_batch_still_waits_for_its_fsync(tmp_path, monkeypatch):
    """The commit rule across a cut: the first TURN_READS sets' batch ends at once, but under
    sync "always" their STORED leaves only after the fsync, which the loop reports.  The
    fdatasync is held until the test has looked (HoldingUring): a fast disk could return a real
    one within the cut, and finish_batch then rightly sends those STORED at once (as
    test_quiet_turn's hold, 4749227; seen failing so under load)."""
    from lanner.server import worker as W
    (tmp_path / "lanner.toml").write_text('[default]\nsync_journal = "always"\n')
    config = load_config(str(tmp_path / "lanner.toml"), {"queue_path": str(tmp_path / "q"),
                                                         "status_file": str(tmp_path / "status")})
    made = []
    monkeypatch.setattr(W, "open_uring", lambda: made.append(HoldingUring(str(tmp_path / "q" / "q"))) or made[0])
    n = TURN_READS + 3
    rig = Rig(str(tmp_path), n, config=config)
    try:
        w = rig.worker
        for c in rig.conns:
            c.data_received(b"set q 0 0 1\r\nx\r\n")
        assert not any(c.transport.written for c in rig.conns)
        assert w.syncer.rounds                         # the cut batch's fsync is under way
        [uring] = made
        loop = w.loop
        deadline = loop.time() + 10
        while not all(c.transport.written for c in rig.conns) and loop.time() < deadline:
            uring.release()                            # this round's, then the next one's
            loop.run_until_complete(asyncio.sleep(0.002))
        assert all(c.transport.written == [b"STORED\r\n"] for c in rig.conns)
    finally:
        made[0].release()
        rig.close()


class SilentUring(HoldingUring):
    """A held fdatasync returns without an eventfd signal, as the kernel may do when it keeps the
    completion on its overflow list (storage/uring.py `_overflowed`)."""

    def release(self):
        self.done += self.held
        self.held = []


def test_an_fsync_that_returned_without_a_wake_up_is_answered_at_the_heartbeat(tmp_path, monkeypatch):
    """Nothing wakes the loop for such a completion, and a closed-loop client sends nothing
    more: the heartbeat (commit.py `check_sync`) takes it, and the STORED leaves in the turn it
    schedules, as after a wake-up.  Before, the reply waited for ever; and taken without that
    turn, it would sit in the connection's buffer."""
    from lanner.server import worker as W
    (tmp_path / "lanner.toml").write_text('[default]\nsync_journal = "always"\n')
    config = load_config(str(tmp_path / "lanner.toml"), {"queue_path": str(tmp_path / "q"),
                                                         "status_file": str(tmp_path / "status")})
    made = []
    monkeypatch.setattr(W, "open_uring", lambda: made.append(SilentUring(str(tmp_path / "q" / "q"))) or made[0])
    rig = Rig(str(tmp_path), 1, config=config)
    try:
        w, c = rig.worker, rig.conns[0]
        c.data_received(b"set q 0 0 1\r\nx\r\n")
        rig.turn()
        [uring] = made
        assert uring.calls == 1 and c.transport.written == []
        uring.release()
        rig.turn()
        assert c.transport.written == []                  # no wake-up, no turn, no reply
        w.on_beat_timer()
        rig.turn()
        assert c.transport.written == [b"STORED\r\n"]
    finally:
        rig.close()
