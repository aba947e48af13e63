"""fsync rounds overlap and finish in the order they started (storage/syncer.py)."""
import errno
import os
import select
import threading

import pytest

from lanner.storage.syncer import Syncer


class Medium:
    """A medium whose fsync returns when the test lets it (or fails with `error`)."""

    def __init__(self, name, error=None):
        self.name = name
        self.error = error
        self.go = threading.Event()
        self.started = threading.Event()
        self.syncs = 0

    def sync(self):
        self.started.set()
        assert self.go.wait(10)
        self.syncs += 1
        if self.error is not None:
            raise OSError(self.error, os.strerror(self.error))


@pytest.fixture
def syncer():
    r, w = os.pipe()
    s = Syncer(w, threads=4)
    s.notify_r = r
    yield s
    s.close()
    os.close(r)
    os.close(w)


def wait_notified(s):
    assert select.select([s.notify_r], [], [], 10)[0], "no round finished"
    os.read(s.notify_r, 64)


def test_a_later_round_that_finishes_first_waits_for_the_earlier(syncer):
    a, b = Medium("a"), Medium("b")
    first = syncer.start([a], ["reply 1"])
    second = syncer.start([b, b], ["reply 2"])          # a medium is fsynced once per round
    assert a.started.wait(10) and b.started.wait(10)    # both fsyncs are under way at once
    b.go.set()
    wait_notified(syncer)
    assert second.remaining == 0 and syncer.done_prefix() == []     # the first is not done yet
    a.go.set()
    wait_notified(syncer)
    assert syncer.done_prefix() == [first, second]
    assert len(syncer) == 0 and b.syncs == 1


def test_a_failed_fsync_is_reported_with_its_round(syncer):
    ok, bad = Medium("ok"), Medium("bad", errno.EIO)
    ok.go.set()
    bad.go.set()
    r = syncer.start([ok, bad], [])
    wait_notified(syncer)
    assert syncer.done_prefix() == [r]
    assert [(m.name, e.errno) for m, e in r.failed] == [("bad", errno.EIO)]


def test_a_round_with_nothing_to_fsync_finishes_after_the_ones_before(syncer):
    a = Medium("a")
    first = syncer.start([a], [])
    marker = syncer.start([], ["reply after"])
    wait_notified(syncer)
    assert syncer.done_prefix() == []
    a.go.set()
    wait_notified(syncer)
    assert syncer.done_prefix() == [first, marker]


def test_one_medium_is_never_fsynced_twice_at_once(syncer):
    """Linux reports a write-back error to one fsync only: rounds of one medium take turns, and
    the rounds that waited share the next fsync."""
    a = Medium("a")
    running = []
    real = a.sync

    def sync():
        running.append(1)
        assert len(running) == 1, "two fsyncs of one medium at once"
        try:
            real()
        finally:
            running.pop()
    a.sync = sync
    rounds = [syncer.start([a], [i]) for i in range(3)]
    assert a.started.wait(10)
    a.go.set()
    done = []
    while len(done) < 3:
        wait_notified(syncer)
        done += syncer.done_prefix()
    assert done == rounds and a.syncs == 2               # the 2nd and 3rd share one fsync
