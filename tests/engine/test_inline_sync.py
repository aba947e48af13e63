"""The one fsync of a lone round runs on the owner's thread at its turn's end, not through the
ring (storage/syncer.py `sync_inline`, server/shardloop.py `end_turn`): the real io_uring and
real files, os.fdatasync watched."""
import errno
import os
import select
import threading
from types import SimpleNamespace

import pytest

from lanner.config import load_config
from lanner.perf.hotloop import Rig
from lanner.server import commit
from lanner.queues.item import QItem
from lanner.storage import gather as gather_module
from lanner.storage import syncer as syncer_module
from lanner.storage.journal.journal import Journal
from lanner.storage.syncer import INLINE_SKIP, Syncer
from lanner.storage.uring import open_uring
from tests.engine.test_syncer import Clock, Config, KernelMedium


@pytest.fixture
def ring():
    """An inline Syncer on the real io_uring (Linux x86-64)."""
    r, w = os.pipe()
    s = Syncer(w, uring=open_uring(), inline=lambda: True)
    yield s
    s.close()
    os.close(r)
    os.close(w)


@pytest.fixture
def journal(tmp_path):
    j = Journal(str(tmp_path), "q", Clock(), sync_policy="always")
    j.replay(Config())
    yield j
    j.close()


@pytest.fixture
def fdatasyncs(monkeypatch):
    """(thread id, fd) of every os.fdatasync, which still runs."""
    calls, real = [], os.fdatasync

    def watched(fd):
        calls.append((threading.get_ident(), fd))
        real(fd)
    monkeypatch.setattr(os, "fdatasync", watched)
    return calls


def write(j, n=1):
    for _ in range(n):
        j.record_add(QItem(0, 0, b"x" * 100))
    j.flush()


def test_a_lone_rounds_fdatasync_waits_for_the_owner_and_runs_on_its_thread(ring, journal, fdatasyncs):
    write(journal)
    r = ring.start([journal], [1])
    assert ring.inline_due and ring.uring.inflight == 0 and r.remaining == 1      # nothing submitted
    assert journal.durable_mark < journal.written_mark
    ring.sync_inline()
    assert [t for t, _ in fdatasyncs] == [threading.get_ident()]
    assert ring.done_prefix() == [r] and not r.failed and journal.durable_mark == journal.written_mark
    assert ring.fsyncs == 1 and not ring.inline_due and ring.uring.inflight == 0


def test_a_failed_inline_fdatasync_fails_its_round_and_the_next_until_cleared(ring):
    r, w = os.pipe()                                 # fdatasync of a pipe: EINVAL
    try:
        m = KernelMedium(r)
        first = ring.start([m], [1])
        ring.sync_inline()
        assert ring.done_prefix() == [first] and [e.errno for _, e in first.failed] == [errno.EINVAL]
        second = ring.start([m], [2])                # the bytes may be gone: no fsync, failed at once
        assert not ring.inline_due and ring.done_prefix() == [second]
        assert [e.errno for _, e in second.failed] == [errno.EINVAL]
        ring.clear(m)
        m.written = 2
        ring.start([m], [3])
        assert ring.inline_due
    finally:
        os.close(r)
        os.close(w)


def test_fsyncs_of_several_files_or_behind_one_under_way_go_through_the_ring(ring, tmp_path):
    a, b = (Journal(str(tmp_path), name, Clock(), sync_policy="always") for name in ("a", "b"))
    try:
        for j in (a, b):
            j.replay(Config())
            write(j)
        both = ring.start([a, b], [1])
        assert not ring.inline_due and ring.uring.inflight == 2
        while ring.rounds:
            select.select([ring.fd], [], [], 10)
            ring.poll()
            ring.done_prefix()
        assert not both.failed and ring.uring.inflight == 0
    finally:
        a.close()
        b.close()


def test_a_gathers_timer_is_removed_before_the_fdatasync_it_held_runs_inline(ring, journal, fdatasyncs,
                                                                           monkeypatch):
    monkeypatch.setattr(gather_module, "GATHER_MIN_S", 0.0)     # (a fast disk gathers too)
    write(journal)
    ring.start([journal], [1, 2])
    ring.sync_inline()                               # two replies left: the next fdatasync is held
    assert ring.done_prefix() and "held for a gather" in ring.state()
    ring.arm_due()
    assert ring.uring.inflight == 1                  # the timer
    write(journal)
    second = ring.start([journal], [3])
    assert not ring.inline_due                       # one of the two back: still held
    write(journal)
    assert ring.join([journal], [4]) and ring.inline_due
    ring.sync_inline()                               # both back: the removal, then the fdatasync
    assert len(fdatasyncs) == 2 and ring.done_prefix() == [second] and second.replies == [3, 4]
    while ring.uring.inflight:                       # the timer's and its removal's completions
        assert select.select([ring.fd], [], [], 10)[0]
        ring.poll()
    assert journal.durable_mark == journal.written_mark
    assert ring.timer_due and ring.uring.inflight == 0      # a new gather, for 3 and 4, not armed


def test_after_a_slow_inline_fdatasync_the_next_ones_go_through_the_ring(ring, journal, monkeypatch):
    ticks = iter(range(10**6))                       # 1 s per look at the clock: every fsync is slow
    monkeypatch.setattr(syncer_module, "time", SimpleNamespace(monotonic=lambda: float(next(ticks))))
    write(journal)
    first = ring.start([journal], [1])
    ring.sync_inline()
    assert ring.done_prefix() == [first]
    write(journal)
    ring.start([journal], [2])
    assert not ring.inline_due and ring.uring.inflight == 1 and ring._inline_skip == INLINE_SKIP - 1


def always_rig(tmp_path, conns):
    (tmp_path / "lanner.toml").write_text('[default]\nsync_journal = "always"\n')
    config = load_config(str(tmp_path / "lanner.toml"), {"queue_path": str(tmp_path / "q"),
                                                         "status_file": str(tmp_path / "status")})
    return Rig(str(tmp_path), conns, config=config)


def test_the_loop_runs_the_fdatasync_itself_when_every_client_waits_for_it(tmp_path, monkeypatch):
    """The worker's two connections each set under "always" in one turn: the loop writes the
    record, runs the fdatasync itself (nobody is left to send anything meanwhile) and answers
    both in that turn; neither reply was written before the fdatasync."""
    rig = always_rig(tmp_path, 2)
    try:
        written = [c.transport.written for c in rig.conns]
        before = []
        real = os.fdatasync

        def watched(fd):
            before.append([list(w) for w in written])
            real(fd)
        monkeypatch.setattr(os, "fdatasync", watched)
        for c in rig.conns:
            c.data_received(b"set q 0 0 1\r\nx\r\n")
        rig.turn()
        assert before == [[[], []]]
        assert written == [[b"STORED\r\n"], [b"STORED\r\n"]] and not rig.worker.sync_inflight
        syncer = rig.worker.syncer                   # in the ring: the next one's gather timer only
        assert syncer.fsyncs == 1 and syncer.uring.inflight == 1 and "held for a gather" in syncer.state()
    finally:
        rig.close()


def test_with_a_client_not_waiting_the_fdatasync_goes_through_the_ring(tmp_path, monkeypatch):
    """One of the two connections sets, the other is idle and could send during the fdatasync:
    it goes through io_uring and the loop stays free to serve it."""
    rig = always_rig(tmp_path, 2)
    try:
        calls = []
        monkeypatch.setattr(os, "fdatasync", lambda fd: calls.append(fd))
        rig.conns[0].data_received(b"set q 0 0 1\r\nx\r\n")
        rig.turn()
        w = rig.worker
        assert calls == []              # not the loop's own fdatasync: io_uring's
        if w.sync_inflight:             # (a loaded box can finish it within that same turn)
            assert w.syncer.uring.inflight == 1 and rig.conns[0].transport.written == []
        while w.sync_inflight:
            assert select.select([w.syncer.fd], [], [], 10)[0]
            w.on_uring_readable()
            rig.turn()
        assert rig.conns[0].transport.written == [b"STORED\r\n"]
    finally:
        rig.close()


def test_a_round_of_more_replies_than_inline_max_goes_through_the_ring(tmp_path, monkeypatch):
    """Every client waits, but the round is bigger than INLINE_MAX_REPLIES: io_uring."""
    monkeypatch.setattr(commit, "INLINE_MAX_REPLIES", 1)
    rig = always_rig(tmp_path, 2)
    try:
        calls = []
        monkeypatch.setattr(os, "fdatasync", lambda fd: calls.append(fd))
        for c in rig.conns:
            c.data_received(b"set q 0 0 1\r\nx\r\n")
        rig.turn()
        w = rig.worker
        assert calls == []              # not the loop's own fdatasync: io_uring's
        if w.sync_inflight:             # (a loaded box can finish it within that same turn)
            assert w.syncer.uring.inflight == 1
            assert [c.transport.written for c in rig.conns] == [[], []]
        while w.sync_inflight:
            assert select.select([w.syncer.fd], [], [], 10)[0]
            w.on_uring_readable()
            rig.turn()
        assert [c.transport.written for c in rig.conns] == [[b"STORED\r\n"], [b"STORED\r\n"]]
    finally:
        rig.close()
