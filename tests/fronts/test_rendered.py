"""Fused replies rendered as their requests run and released once per batch (fronts/rendered.py),
the hybrid way: a connection's first fused reply of a read and a batch is carried alone, a
second makes both one entry, later ones join it.  Every rule a reply carried alone kept still
holds: none leaves before its record is written (and fsynced under "always"); a failed write
or fsync fails exactly the requests it undid, in order, and the connection closes there; a
write behind holds only the replies from its first request on; replies leave in command order
across held batches, other connections and routed requests; latency and flow control count
every reply."""
from __future__ import annotations

import errno
import os
import threading
import time

from lanner.config import Config, ServerConfig
from lanner.fronts.counters import FRONT_COUNTERS
from lanner.ops import latency
from lanner.perf.hotloop import Rig
from lanner.perf.hotroute import RoutedRig, queue_of
from lanner.protocols import memcache_replies as mr
from lanner.server import commit
from lanner.server import worker as W
from lanner.storage.journal import journal as J
from tests.fronts.test_fused_gate import NeverFused
from tests.fronts.test_inline import Transport, out, rig  # noqa: F401 (a fixture)


def fails_for(path: str, real, err: int = errno.EIO):
    """`real` (os.write's or os.fsync's stand-in in journal.py), failing for the file `path`."""
    def call(fd, *args):
        if os.path.samefile(f"/proc/self/fd/{fd}", path):
            raise OSError(err, os.strerror(err))
        return real(fd, *args)
    return call


def counts(c, family: str) -> int:
    """How many latencies of `family` the connection's front observed."""
    words = c.front.my.words
    first = FRONT_COUNTERS.index(latency.COUNTERS[0])
    col = first + latency.FAMILIES.index(family) * (len(latency.BOUNDS) + 2)
    return sum(words[col:col + len(latency.BOUNDS) + 1])


def entry(e: tuple) -> list | None:
    """The rendered replies of the `fast` entry `e`, or None if it is a reply alone."""
    return e[3][0] if e[1] is None and e[3].__class__ is tuple else None


def wait_for(r, done) -> None:
    deadline = time.monotonic() + 10
    while not done():
        assert time.monotonic() < deadline, "timed out"
        r.turn()


def test_a_reads_first_two_replies_go_alone_and_a_third_makes_the_three_one_entry(rig):
    """One or two requests in a read: their replies are carried alone (the per-reply path,
    untouched).  A third in the same read: the three are one entry, in the first's place in
    the batch."""
    r = rig(conns=2)
    c = r.conns[0]
    w = r.worker
    c.data_received(b"set q 0 0 1\r\na\r\nset q 0 0 1\r\nb\r\n")
    assert [rep[2] for rep in w.replies] == [b"", b""] and [e[1] for e in c.fast] == [mr.STORED] * 2
    assert c.batch is None and c.batched == 0
    c.data_received(b"get q\r\nset q 0 0 1\r\nc\r\nget q\r\n")     # a new read: its own entry
    assert len(w.replies) == 3 and w.replies[2][2].__class__ is list
    assert len(c.fast) == 3 and entry(c.fast[2]) is w.replies[2][2] and c.batched == 2
    assert c.batch is w.replies[2][2]
    r.turn()
    assert out(c) == b"STORED\r\nSTORED\r\nVALUE q 0 1\r\na\r\nEND\r\nSTORED\r\n" \
        b"VALUE q 0 1\r\nb\r\nEND\r\n"
    assert not c.fast and c.batch is None and c.batched == 0
    assert (counts(c, "set"), counts(c, "get")) == (3, 2)


def test_a_connections_replies_of_a_batch_are_one_reply_and_count_each(rig):
    """Six fused requests from one read: one reply in the worker's batch, released at its end in
    order; flow control counted six replies in flight until then, latency observes six."""
    r = rig(conns=2)
    c = r.conns[0]
    c.data_received(b"set q 0 0 1\r\na\r\nget q\r\nget q\r\nset q 0 0 2\r\nbc\r\nset q 0 0 1\r\nd\r\n"
                    b"get q\r\n")
    w = r.worker
    assert len(w.replies) == 1 and len(c.fast) == 1 and c.batched == 5
    assert c.transport.written == []                      # not before the batch's write
    inflight = c.room()
    r.turn()
    assert out(c) == b"STORED\r\nVALUE q 0 1\r\na\r\nEND\r\nEND\r\nSTORED\r\nSTORED\r\n" \
        b"VALUE q 0 2\r\nbc\r\nEND\r\n"
    assert not c.fast and c.batch is None and c.batched == 0
    assert c.room() > inflight                            # six fewer in flight
    assert (counts(c, "set"), counts(c, "get")) == (3, 3)
    assert r.worker.front.inline_requests == 6


def test_a_value_too_big_to_render_goes_alone_between_two_entries(rig):
    """A get whose value is SPLICE_MIN or more is written as it is, alone: the entry before it
    closes, the requests after it open another, and the replies leave in command order."""
    r = rig(conns=2)
    c = r.conns[0]
    big = b"v" * mr.SPLICE_MIN
    c.data_received(b"set b 0 0 %d\r\n%s\r\n" % (len(big), big))
    r.turn()
    assert out(c) == b"STORED\r\n"
    c.data_received(b"set a 0 0 1\r\n1\r\nset a 0 0 1\r\n2\r\nset a 0 0 0\r\n\r\nget b\r\nget a\r\n"
                    b"get a\r\nget a\r\n")
    assert [entry(e) is None for e in c.fast] == [False, True, False] and c.batched == 4
    wait_for(r, lambda: not (c.fast or c.spill))          # (the big value goes in slices)
    assert out(c) == b"STORED\r\n" * 3 + b"VALUE b 0 %d\r\n%s\r\nEND\r\n" % (len(big), big) + \
        b"VALUE a 0 1\r\n1\r\nEND\r\nVALUE a 0 1\r\n2\r\nEND\r\nVALUE a 0 0\r\n\r\nEND\r\n"
    assert not c.fast and c.batched == 0


def test_a_batch_that_ended_takes_no_more_replies(rig, monkeypatch):
    """Under sync "always" an entry waits in an fsync round after its batch ended; commands of
    the same read taken after that (flow control held them back) open a new entry in the new
    batch, behind the first, and nothing leaves before its fsync."""
    monkeypatch.setattr(W, "open_uring", lambda: None)      # the fsync threads, which call J._fsync
    r = rig(conns=2, sync_journal="always")
    c = r.conns[0]
    gate = threading.Event()
    real = J._fsync

    def fsync(fd):
        assert gate.wait(10)
        real(fd)
    monkeypatch.setattr(J, "_fsync", fsync)
    try:
        c.data_received(b"set q 0 0 1\r\na\r\nset q 0 0 1\r\nb\r\nset q 0 0 1\r\nc\r\n")
        first = c.batch
        r.worker.finish_batch()                           # the batch ends: its round waits
        assert first is not None and entry(c.fast[0]) is first
        c.parser.feed(b"get q\r\nget q\r\nget q\r\n")     # (the same read's: t_in unchanged)
        c.pump()
        assert c.batch is not None and c.batch is not first and len(c.fast) == 2
        assert first == [mr.STORED, b"", b""] * 3         # nothing joined the first
        r.turn()
        assert c.transport.written == []                  # no reply before its fsync
    finally:
        gate.set()
    wait_for(r, lambda: not (c.fast or c.out))
    assert out(c) == b"STORED\r\n" * 3 + b"VALUE q 0 1\r\na\r\nEND\r\nVALUE q 0 1\r\nb\r\nEND\r\n" \
        b"VALUE q 0 1\r\nc\r\nEND\r\n"


def play_failed_write(r, monkeypatch, reads) -> bytes:
    c = r.conns[0]
    assert r.conns[1] is not c
    c.data_received(b"set a 0 0 1\r\n1\r\nset q 0 0 1\r\nx\r\n")
    r.turn()                                              # both journals exist
    monkeypatch.setattr(J, "_write", fails_for(os.path.join(r.config.server.queue_path, "q"), os.write,
                                               errno.ENOSPC))
    for data in reads:
        c.data_received(data)
    r.conns[1].data_received(b"set a 0 0 1\r\n4\r\n")
    r.turn()
    r.turn()
    monkeypatch.undo()
    return b"".join(c.transport.written), r.conns[1].transport.written


def general_path(tmp_path, monkeypatch, reads) -> bytes:
    """What the general path (no fused request, a Slot each) answers to `play_failed_write`."""
    folder = tmp_path / "general"
    cfg = Config(server=ServerConfig(queue_path=str(folder / "q"), status_file=str(folder / "status")))
    os.makedirs(cfg.server.queue_path)
    general = Rig(str(folder), 2, config=cfg, transport=Transport)
    try:
        general.worker.front.fused = NeverFused(general.worker.front)
        got = play_failed_write(general, monkeypatch, reads)[0]
        assert general.worker.front.inline_requests == 0
        return got
    finally:
        general.close()


def test_a_failed_write_cuts_the_batch_at_the_first_request_it_undid(rig, tmp_path, monkeypatch):
    """Requests on three queues in one read, q's journal write fails: the replies before q's
    set leave, that set is answered SERVER_ERROR and the connection closes; what the other
    queues wrote stays, and another connection's batch is untouched.  The general path (no
    fused request, a Slot each) answers the same."""
    reads = [b"get b\r\nset a 0 0 1\r\n2\r\nget a\r\nset q 0 0 1\r\ny\r\nset a 0 0 1\r\n3\r\nget q\r\n"]
    fused = rig(conns=2)
    got, other = play_failed_write(fused, monkeypatch, reads)
    want = b"STORED\r\nSTORED\r\nEND\r\nSTORED\r\nVALUE a 0 1\r\n1\r\nEND\r\nSERVER_ERROR "
    assert got.startswith(want) and got.count(b"\r\n") == want.count(b"\r\n") + 1, got
    assert b"No space left on device" in got and fused.conns[0].transport.closed
    assert other == [b"STORED\r\n"]
    assert fused.worker.front.inline_requests == 9
    coll = fused.worker.coll
    assert [i.data for i in coll.queue("a").memory_items()] == [b"2", b"3", b"4"]
    assert [i.data for i in coll.queue("q").memory_items()] == [b"x"]
    assert general_path(tmp_path, monkeypatch, reads) == got


def test_a_failed_write_of_a_batch_with_lone_replies_and_entries(rig, tmp_path, monkeypatch):
    """One batch, three reads of a connection: a lone set on a (its reply carried alone), an
    entry (a get, q's set), then a lone set on a again.  q's write fails: a's set is answered,
    the entry is cut at q's set, SERVER_ERROR, the connection closes, and the last set's reply
    is not written (it comes after the close), as the general path answers."""
    reads = [b"set a 0 0 1\r\n2\r\n", b"get a\r\nset q 0 0 1\r\ny\r\n", b"set a 0 0 1\r\n3\r\n"]
    fused = rig(conns=2)
    c = fused.conns[0]
    got, other = play_failed_write(fused, monkeypatch, reads)
    want = b"STORED\r\nSTORED\r\nSTORED\r\nVALUE a 0 1\r\n1\r\nEND\r\nSERVER_ERROR "
    assert got.startswith(want) and got.count(b"\r\n") == want.count(b"\r\n") + 1, got
    assert c.transport.closed and other == [b"STORED\r\n"]
    assert fused.worker.front.inline_requests == 7     # (the other connection's set too)
    assert general_path(tmp_path, monkeypatch, reads) == got


def test_a_failed_write_of_a_lone_reply_before_an_entry(rig, tmp_path, monkeypatch):
    """The lone reply fails (q's set, alone in its read) and an entry of the same batch follows
    it: SERVER_ERROR, the connection closes, and the entry's replies are not written."""
    reads = [b"set q 0 0 1\r\ny\r\n", b"set a 0 0 1\r\n2\r\nget a\r\n"]
    fused = rig(conns=2)
    got, other = play_failed_write(fused, monkeypatch, reads)
    want = b"STORED\r\nSTORED\r\nSERVER_ERROR "
    assert got.startswith(want) and got.count(b"\r\n") == want.count(b"\r\n") + 1, got
    assert fused.conns[0].transport.closed and other == [b"STORED\r\n"]
    assert general_path(tmp_path, monkeypatch, reads) == got


def test_a_failed_fsync_cuts_the_held_batches_it_undid(rig, monkeypatch):
    """Under sync "always" a connection's batches wait in fsync rounds; q's fsync fails: the
    batch cut at its first request on q, the later batch of the same connection dropped (it
    closed), another connection's batch on another queue answered."""
    monkeypatch.setattr(W, "open_uring", lambda: None)      # the fsync threads, which call J._fsync
    r = rig(conns=2, sync_journal="always")
    c, d = r.conns
    c.data_received(b"set a 0 0 1\r\n1\r\nset q 0 0 1\r\nx\r\n")
    d.data_received(b"set b 0 0 1\r\n5\r\n")
    r.turn()
    wait_for(r, lambda: c.transport.written and d.transport.written)
    assert out(c) == b"STORED\r\nSTORED\r\n" and out(d) == b"STORED\r\n"
    gate = threading.Event()
    failing = fails_for(os.path.join(r.config.server.queue_path, "q"), os.fsync)

    def fsync(fd):
        assert gate.wait(10)
        failing(fd)
    monkeypatch.setattr(J, "_fsync", fsync)
    c.data_received(b"get a\r\nset a 0 0 1\r\n2\r\nget q\r\nset a 0 0 1\r\n3\r\n")
    r.turn()
    c.data_received(b"set a 0 0 1\r\n4\r\nset a 0 0 1\r\n5\r\n")
    d.data_received(b"set b 0 0 1\r\n6\r\n")
    r.turn()
    assert c.transport.written == [] and d.transport.written == []     # no reply before its fsync
    gate.set()
    wait_for(r, lambda: c.transport.closed and d.transport.written)
    got = out(c)
    assert got.startswith(b"VALUE a 0 1\r\n1\r\nEND\r\nSTORED\r\nSERVER_ERROR ") and \
        got.endswith(b"\r\n") and got.count(b"\r\n") == 5, got
    assert out(d) == b"STORED\r\n"
    assert [i.data for i in r.worker.coll.queue("q").memory_items()] == [b"x"]     # the get undone
    assert [i.data for i in r.worker.coll.queue("b").memory_items()] == [b"5", b"6"]


def test_a_write_behind_holds_only_the_replies_from_its_first_request_on(rig, monkeypatch):
    """A read with a small set, a set big enough for the writer's thread, and a small set: the
    first one's reply leaves with its batch, as it would have alone (the entry is parted
    before the big set), the other two wait for that write; another connection's batch of the
    same turn leaves at once."""
    monkeypatch.setattr(commit, "WRITE_BEHIND_BYTES", 4096)
    r = rig(conns=2)
    c, d = r.conns
    gate = threading.Event()

    big_path = os.path.join(r.config.server.queue_path, "big")

    def write(fd, data):
        if os.path.samefile(f"/proc/self/fd/{fd}", big_path):    # (the writer's thread)
            assert gate.wait(10)
        return os.write(fd, data)
    monkeypatch.setattr(J, "_write", write)
    big = b"z" * 5000
    c.data_received(b"set s 0 0 1\r\n1\r\nset big 0 0 %d\r\n%s\r\nset s 0 0 1\r\n2\r\n" % (len(big), big))
    assert c.batched == 2
    d.data_received(b"set s 0 0 1\r\n3\r\nget s\r\n")
    r.turn()
    assert out(d) == b"STORED\r\nVALUE s 0 1\r\n1\r\nEND\r\n"
    if r.worker.write_held:             # (Journal.write_behind may decline: then it was written)
        assert out(c) == b"STORED\r\n" and c.batched == 1 and len(c.fast) == 1
    gate.set()
    wait_for(r, lambda: not (c.fast or c.out))
    assert out(c) in (b"STORED\r\n" * 2, b"STORED\r\n" * 3)
    assert c.batched == 0 and (counts(c, "set"), counts(c, "get")) == (4, 1)     # (d's too)


def test_rendered_and_routed_replies_leave_in_command_order(tmp_path):
    """A client of worker 1 using a queue of its own worker and one of worker 0 (its gets held
    reads there): the local replies, released with worker 1's batch before the routed reply
    comes back, wait for it; every held read is settled.  The local gets behind the routed one
    are not fused: held reads of worker 1, since the routed reply might close the connection
    (issue 11, defect 2: tests/server/test_issue11_recheck.py)."""
    rig = RoutedRig(str(tmp_path), 1, home=1, transport=Transport)
    try:
        here, there = queue_of(1).encode(), queue_of(0).encode()
        [c] = rig.conns
        c.data_received(b"set %s 0 0 1\r\nr\r\nset %s 0 0 1\r\nl\r\n" % (there, here))
        for _ in range(3):
            rig.spin(rig.home)
            rig.spin(rig.workers[0])
        assert out(c) == b"STORED\r\nSTORED\r\n"
        c.data_received(b"set %s 0 0 1\r\nm\r\nget %s\r\nget %s\r\nget %s\r\nget %s\r\n" % (
            here, there, here, here, here))
        rig.spin(rig.home)                  # worker 1's batch: its rendered replies released
        assert out(c) == b"STORED\r\n"
        assert len(c.fast) == 1 and c.nslots == 3                       # behind the routed get
        assert len(rig.home.holding) == 2                   # its two items held, not removed
        for _ in range(3):
            rig.home.front.settles.on_timer()
            rig.spin(rig.workers[0])
            rig.spin(rig.home)
        assert out(c) == b"VALUE %s 0 1\r\nr\r\nEND\r\nVALUE %s 0 1\r\nl\r\nEND\r\nVALUE %s 0 1\r\nm\r\nEND\r\n" % (
            there, here, here) + b"END\r\n"
        assert not c.fast and not c.early and c.batched == 0 and c.nslots == 0
        assert [len(w.holding) for w in rig.workers] == [0, 0]
    finally:
        rig.close()
