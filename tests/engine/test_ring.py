"""Shared-memory rings: framing, wrap-around, overflow, the sleep/wake and space
handshakes, crashed-peer resync, and real fork()ed producer/consumer pairs."""
from __future__ import annotations

import os
import select
import struct
import zlib
from collections import deque

import pytest
from hypothesis import given, settings, strategies as st

from lanner.ipc.mesh import duplex
from lanner.ipc.ring import HEADER_SIZE, SLEEP_SEQ, SLEEPING, TAIL, WAITING, Ring, RingError
from lanner.ipc.wake import WakeFd, clear_sleep_all, prepare_sleep_all
from tests.engine.forking import CHILD_TIMEOUT, child_result, in_child


@pytest.fixture
def wake():
    w = WakeFd.create()
    yield w
    w.close()


def drain(ring: Ring) -> list[bytes]:
    out = [bytes(m) for m in ring.read_batch(1 << 30)]
    ring.release()
    return out


def eventfd_count(fd: int) -> int:
    return WakeFd(fd).drain()


# -- creation ------------------------------------------------------------------------

@pytest.mark.parametrize("cap", [0, 32, 100, 3 << 10, 1 << 32])
def test_capacity_must_be_power_of_two_in_range(cap):
    with pytest.raises(ValueError, match="capacity"):
        Ring.create(cap)


def test_create_makes_a_nonblocking_inheritable_eventfd():
    r = Ring.create(1 << 10, name="q")
    assert r.capacity == 1024 and r.max_payload == 1020 and r.name == "q"
    assert os.get_blocking(r.wake_fd) is False
    assert os.get_inheritable(r.wake_fd) is True
    assert eventfd_count(r.wake_fd) == 0
    os.close(r.wake_fd)


def test_rings_share_a_wake_fd(wake):
    a = Ring.create(256, wake_fd=wake)
    b = Ring.create(256, wake_fd=wake.fd)
    assert a.wake_fd == b.wake_fd == wake.fd


# -- framing, publishing -------------------------------------------------------------

def test_records_are_invisible_until_published(wake):
    r = Ring.create(256, wake_fd=wake)
    assert r.write(b"one")
    assert r.write(bytearray(b"two"))
    assert r.unpublished
    assert r.read() is None and r.empty()
    assert r.publish() is False          # consumer not sleeping: no signal
    assert not r.unpublished
    assert drain(r) == [b"one", b"two"]
    assert r.read() is None and r.empty()


def test_payload_types_and_empty_payload(wake):
    r = Ring.create(256, wake_fd=wake)
    assert r.write(memoryview(b"abcdef")[1:4])
    assert r.write(b"")
    assert r.write_parts(b"head:", memoryview(b"body"))
    assert r.write_parts(b"", b"")
    r.publish()
    assert drain(r) == [b"bcd", b"", b"head:body", b""]


def test_records_are_8_byte_aligned_u32_len_payload(wake):
    r = Ring.create(256, wake_fd=wake)
    r.write(b"abc")
    r.write(b"12345")
    r.publish()
    data = bytes(r.buf[HEADER_SIZE:HEADER_SIZE + 24])
    assert struct.unpack_from("=I", data, 0)[0] == 3 and data[4:7] == b"abc"
    assert struct.unpack_from("=I", data, 8)[0] == 5 and data[12:17] == b"12345"
    assert r._hdr[TAIL] == 24


def test_read_offset_gives_zero_copy_access(wake):
    r = Ring.create(256, wake_fd=wake)
    r.write_parts(struct.pack("<IB", 7, 2), b"key")
    r.publish()
    off = r.read_offset()
    assert off > 0 and r.rec_len == 8
    assert struct.unpack_from("<IB", r.buf, off) == (7, 2)
    assert bytes(r.buf[off + 5:off + r.rec_len]) == b"key"
    assert r.read_offset() == -1


def test_reserve_commit_shorter_than_reserved(wake):
    r = Ring.create(256, wake_fd=wake)
    off = r.reserve(100)
    assert off >= HEADER_SIZE
    struct.pack_into("<HH", r.buf, off, 1, 2)
    r.commit(4)
    off = r.reserve(3)
    r.buf[off:off + 3] = b"xyz"
    r.commit(3)
    r.publish()
    assert drain(r) == [struct.pack("<HH", 1, 2), b"xyz"]
    with pytest.raises(ValueError, match="commit"):
        r.commit(1)
    r.reserve(4)
    with pytest.raises(ValueError, match="commit"):
        r.commit(5)


def test_read_batch_limits_records(wake):
    r = Ring.create(1024, wake_fd=wake)
    for i in range(10):
        r.write(bytes([i]))
    r.publish()
    assert [bytes(m) for m in r.read_batch(4)] == [bytes([i]) for i in range(4)]
    assert [bytes(m) for m in r.read_batch(100)] == [bytes([i]) for i in range(4, 10)]
    r.release()


def test_oversized_payload_is_refused_by_name(wake):
    r = Ring.create(256, wake_fd=wake, name="f0>w1")
    with pytest.raises(ValueError, match=r"f0>w1.*253-byte payload"):
        r.write(b"x" * 253)
    with pytest.raises(ValueError, match="f0>w1"):
        r.send_parts(b"x" * 200, b"y" * 53)
    assert r.backlog == 0


def test_largest_payload_fits_at_any_position(wake):
    """A max-size record needs the whole data area: the wrap marker goes in on
    its own, and the record follows once the consumer has passed the marker."""
    r = Ring.create(256, wake_fd=wake)
    big = bytes(range(252))
    for prefix in (0, 1, 5, 13, 100, 243):
        r.write(b"p" * prefix)
        r.send(big)
        assert r.backlog == 1
        got = []
        for _ in range(3):
            r.publish()
            got += drain(r)
        assert got == [b"p" * prefix, big] and r.backlog == 0


def test_corrupt_length_raises_with_ring_and_position(wake):
    r = Ring.create(256, wake_fd=wake, name="bad")
    r.write(b"abcd")
    r.publish()
    struct.pack_into("=I", r.buf, HEADER_SIZE, 1000)
    with pytest.raises(RingError, match=r"ring bad: record length 1000 at position 0"):
        r.read_offset()


# -- wrap-around against a model -------------------------------------------------------

ops = st.lists(
    st.one_of(
        st.tuples(st.just("send"), st.integers(0, 120)),
        st.tuples(st.just("write"), st.integers(0, 120)),
        st.tuples(st.just("parts"), st.integers(0, 60), st.integers(0, 60)),
        st.tuples(st.just("reserve"), st.integers(0, 120), st.integers(0, 120)),
        st.tuples(st.just("publish")),
        st.tuples(st.just("read"), st.integers(1, 8)),
        st.tuples(st.just("release")),
    ),
    max_size=120,
)


@settings(max_examples=150, deadline=None)
@given(ops, st.sampled_from([64, 128, 256]))
def test_ring_matches_a_fifo_model(script, cap):
    """Odd sizes, wrap markers, full rings and overflow in any interleaving keep
    FIFO order, never show unpublished records, and never lose a message."""
    r = Ring.create(cap)
    counter = 0
    written: deque[bytes] = deque()      # in the ring (or overflow), not yet published
    published: deque[bytes] = deque()    # visible to the consumer
    overflow_model: deque[bytes] = deque()
    read_unreleased = 0

    def payload(n):
        nonlocal counter
        counter += 1
        return bytes((counter + i) & 0xFF for i in range(n))

    for op in script:
        kind = op[0]
        if kind in ("send", "parts"):
            p = payload(op[1] + (op[2] if kind == "parts" else 0))
            if len(p) > r.max_payload:
                with pytest.raises(ValueError):
                    r.send(p)
                continue
            if kind == "send":
                r.send(p)
            else:
                r.send_parts(p[:op[1]], memoryview(p)[op[1]:])
            assert r.backlog >= len(overflow_model)
            if r.backlog > len(overflow_model):
                overflow_model.append(p)
            else:
                written.append(p)
        elif kind == "write":
            p = payload(op[1])
            if len(p) > r.max_payload:
                with pytest.raises(ValueError):
                    r.write(p)
                continue
            if r.write(p):
                assert not overflow_model
                written.append(p)
        elif kind == "reserve":
            n, actual = op[1], min(op[1], op[2])
            if n > r.max_payload:
                with pytest.raises(ValueError):
                    r.reserve(n)
                continue
            off = r.reserve(n)
            if off < 0:
                continue
            p = payload(actual)
            r.buf[off:off + actual] = p
            r.commit(actual)
            written.append(p)
        elif kind == "publish":
            before = r.backlog
            r.publish()
            moved = before - r.backlog
            for _ in range(moved):
                written.append(overflow_model.popleft())
            published.extend(written)
            written.clear()
            assert r.backlog == len(overflow_model)
        elif kind == "read":
            for m in [bytes(m) for m in r.read_batch(op[1])]:
                assert m == published.popleft()
                read_unreleased += 1
        else:
            r.release()
            read_unreleased = 0
        assert r._hdr[TAIL] - r._hdr[0] <= cap
    # Everything still comes out, in order, once the consumer keeps up.
    rest = list(published) + list(written) + list(overflow_model)
    got = []
    for _ in range(len(rest) + 2):
        r.publish()
        got += drain(r)
    assert got == rest and r.backlog == 0
    r.close()
    os.close(r.wake_fd)


# -- full ring, overflow ---------------------------------------------------------------

def test_full_ring_overflow_keeps_order(wake):
    r = Ring.create(128, wake_fd=wake)
    msgs = [b"%03d" % i + b"." * 20 for i in range(20)]   # 24 B payload -> 32 B records
    for m in msgs:
        r.send(m)
    assert r.backlog == 16                                # 4 records fill 128 B
    assert r.write(b"late") is False                      # cannot overtake the backlog
    assert r.reserve(1) == -1
    r.publish()
    got = drain(r)
    while r.backlog:
        r.publish()
        got += drain(r)
    r.publish()
    got += drain(r)
    assert got == msgs
    assert r.write(b"late")


def test_space_wakeup_when_consumer_frees_room():
    fw, ww = WakeFd.create(), WakeFd.create()
    req, resp = duplex(128, fw, ww, name="f0:w0")
    assert (req.wake_fd, req.space_fd, resp.wake_fd, resp.space_fd) == (ww.fd, fw.fd, fw.fd, ww.fd)
    for i in range(6):
        req.send(bytes([i]) * 24)
    req.publish()
    assert req.backlog == 2 and req._hdr[WAITING] == 1
    assert fw.drain() == 0
    got = [bytes(m) for m in req.read_batch(1)]
    req.release()                                          # frees 32 B: producer is told
    assert req.space_signals == 1 and req._hdr[WAITING] == 0
    assert fw.drain() == 1
    req.publish()                                          # its loop retries the backlog
    assert req.backlog == 1 and req._hdr[WAITING] == 1
    got += drain(req)
    assert fw.drain() == 1
    req.publish()
    assert req.backlog == 0 and req._hdr[WAITING] == 0
    got += drain(req)
    assert fw.drain() == 0                                 # not waiting: no signal
    assert got == [bytes([i]) * 24 for i in range(6)]
    for w in (fw, ww):
        w.close()


def test_overflow_without_space_fd_never_signals(wake):
    r = Ring.create(64, wake_fd=wake)
    for i in range(4):
        r.send(bytes(20))
    r.publish()
    assert r.backlog == 2 and r._hdr[WAITING] == 0
    drain(r)
    assert r.space_signals == 0


# -- sleep / wake ----------------------------------------------------------------------

def test_publish_signals_only_a_sleeping_consumer(wake):
    r = Ring.create(256, wake_fd=wake)
    for _ in range(5):
        r.write(b"m")
        assert r.publish() is False
        drain(r)
    assert r.signals == 0 and wake.drain() == 0
    assert r.prepare_sleep() is True and r._hdr[SLEEPING] == 1
    r.write(b"wake up")
    assert r.publish() is True and r.signals == 1
    assert wake.wait(0) is True
    r.clear_sleep()
    assert wake.drain() == 1
    assert drain(r) == [b"wake up"]
    r.write(b"x")
    r.publish()
    assert r.signals == 1 and wake.drain() == 0


def test_one_signal_per_sleep_however_often_the_producer_publishes(wake):
    r = Ring.create(256, wake_fd=wake)
    assert r.prepare_sleep()
    for i in range(5):                     # the consumer has not woken up yet
        r.write(b"m")
        assert r.publish() is (i == 0)
    assert r.signals == 1 and wake.drain() == 1
    r.clear_sleep()
    assert len(drain(r)) == 5
    assert r.prepare_sleep()               # the next sleep is signalled again
    r.write(b"m")
    assert r.publish() is True and r.signals == 2


def test_publish_with_nothing_new_does_not_signal(wake):
    r = Ring.create(256, wake_fd=wake)
    assert r.prepare_sleep()
    assert r.publish() is False and r.signals == 0


def test_prepare_sleep_refuses_when_data_is_pending(wake):
    r = Ring.create(256, wake_fd=wake)
    r.write(b"a")
    r.publish()
    assert r.prepare_sleep() is False and r._hdr[SLEEPING] == 0
    assert drain(r) == [b"a"]
    assert r.prepare_sleep() is True


def test_prepare_sleep_releases_what_was_read(wake):
    r = Ring.create(64, wake_fd=wake)
    r.write(bytes(50))
    r.publish()
    assert r.read() is not None
    assert r.prepare_sleep() is True
    assert r.write(bytes(50))             # the consumer's release made room


def test_prepare_sleep_all_with_one_fd(wake):
    rings = [Ring.create(128, wake_fd=wake) for _ in range(3)]
    assert prepare_sleep_all(rings)
    assert all(r._hdr[SLEEPING] == 1 for r in rings)           # each ring's first sleep
    rings[1].write(b"z")
    assert rings[1].publish() is True
    assert wake.wait(0)
    clear_sleep_all(rings)
    assert all(r._hdr[SLEEPING] == 0 for r in rings)
    wake.drain()
    assert prepare_sleep_all(rings) is False
    assert all(r._hdr[SLEEPING] == 0 for r in rings)
    assert drain(rings[1]) == [b"z"]


def test_wakefd_wait_times_out_and_drain_is_nonblocking(wake):
    assert wake.wait(0) is False
    assert wake.drain() == 0
    wake.signal()
    wake.signal()
    assert wake.wait(0) is True
    assert wake.drain() == 2 and wake.wait(0) is False


# -- crashed peers -------------------------------------------------------------------

def test_resync_consumer_discards_what_the_dead_one_left(wake):
    r = Ring.create(256, wake_fd=wake)
    r.write(b"for the dead")
    r.publish()
    r.prepare_sleep()                      # it died asleep
    r._signalled = r._hdr[SLEEPING]        # ... and the survivor had signalled that sleep
    fresh = Ring(r._mm, r.capacity, r.wake_fd, None, "copy")   # a replacement's inherited view
    fresh.resync_consumer()
    assert fresh._hdr[SLEEPING] == 0 and fresh.read() is None
    assert fresh.prepare_sleep()           # the replacement's first sleep gets a new number
    r.write(b"new")                        # the survivor keeps producing as before
    assert r.publish() is True
    fresh.clear_sleep()
    assert drain(fresh) == [b"new"]


def test_resync_consumer_can_keep_unread_records(wake):
    r = Ring.create(256, wake_fd=wake)
    r.write(b"keep")
    r.publish()
    r.resync_consumer(discard=False)
    assert drain(r) == [b"keep"]


def test_resync_producer_continues_at_the_published_tail(wake):
    r = Ring.create(128, wake_fd=wake)
    r.write(b"published")
    r.publish()
    r.write(b"lost with the producer")
    r.send(bytes(100))                    # its overflow dies with it too
    r._hdr[WAITING] = 1
    r.resync_producer()
    assert r.backlog == 0 and r._hdr[WAITING] == 0 and not r.unpublished
    r.write(b"from the replacement")
    r.publish()
    assert drain(r) == [b"published", b"from the replacement"]


def test_drop_backlog_forgets_what_a_dead_consumer_was_owed(wake):
    """A surviving producer whose consumer died: nothing it had not published reaches the
    replacement consumer, neither unpublished records nor overflow."""
    space = WakeFd.create()
    r = Ring.create(128, wake_fd=wake, space_fd=space)
    r.write(b"published before the death")
    r.publish()
    r.write(b"written, not published")
    r.send(bytes(100))                     # does not fit: overflow
    r.publish()                            # arms producer_waiting for the overflow
    assert r.backlog == 1 and r._hdr[WAITING] == 1
    assert r.drop_backlog() == 1
    assert r.backlog == 0 and not r.unpublished and r._hdr[WAITING] == 0
    fresh = Ring(r._mm, r.capacity, r.wake_fd, None, "replacement")
    fresh.resync_consumer(discard=True)    # the replacement consumer, forked after the drop
    assert r.publish() is False            # nothing stale left to publish
    r.write(b"for the replacement")
    r.publish()
    assert drain(fresh) == [b"for the replacement"]
    space.close()


def test_sleep_all_with_flag_sleep_and_one_fence(wake):
    a, b = Ring.create(128, wake_fd=wake), Ring.create(128, wake_fd=wake)
    assert prepare_sleep_all([a, b])
    assert a._hdr[SLEEPING] and b._hdr[SLEEPING]
    clear_sleep_all([a, b])
    b.write(b"x")
    b.publish()
    assert not prepare_sleep_all([a, b])    # data arrived: no flag stays set
    assert a._hdr[SLEEPING] == 0 and b._hdr[SLEEPING] == 0


def test_reset_zeroes_everything(wake):
    r = Ring.create(128, wake_fd=wake)
    for _ in range(10):
        r.write(bytes(30))
        r.publish()
        drain(r)
    r.send(bytes(10))
    r._hdr[SLEEPING] = 1
    r.reset()
    assert [r._hdr[i] for i in (0, TAIL, SLEEPING, WAITING)] == [0, 0, 0, 0]
    assert r.backlog == 0 and r.read() is None
    r.write(b"again")
    r.publish()
    assert drain(r) == [b"again"]


def test_close_unmaps(wake):
    r = Ring.create(128, wake_fd=wake)
    r.close()
    with pytest.raises(ValueError):
        r.write(b"x")


# -- across fork() -------------------------------------------------------------------



REC = struct.Struct("<QI")


def produce(ring: Ring, count: int, batch: int) -> int:
    """Sequence-numbered records of 12..75 bytes; returns their crc32."""
    crc = 0
    pad = bytes(range(64))
    for i in range(count):
        head = REC.pack(i, i * 2654435761 & 0xFFFFFFFF)
        body = pad[:i % 64]
        ring.send_parts(head, body)
        crc = zlib.crc32(body, zlib.crc32(head, crc))
        if i % batch == batch - 1:
            ring.publish()
    ring.publish()
    while ring.backlog:                    # only with space_fd; the fd wakes us
        assert select.select([ring.space_fd], [], [], CHILD_TIMEOUT)[0], "no space wakeup"
        WakeFd(ring.space_fd).drain()
        ring.publish()
    return crc


def consume(ring: Ring, count: int) -> tuple[int, int]:
    """Read `count` records, checking sequence; sleeps on the eventfd when empty.
    Returns (crc32, number of sleeps)."""
    crc = 0
    expect = 0
    sleeps = 0
    buf = ring.buf
    unpack = REC.unpack_from
    wake = WakeFd(ring.wake_fd)
    while expect < count:
        off = ring.read_offset()
        if off < 0:
            if ring.prepare_sleep():
                sleeps += 1
                assert wake.wait(CHILD_TIMEOUT), f"no wakeup at record {expect}"
                ring.clear_sleep()
                wake.drain()
            continue
        n = ring.rec_len
        seq, check = unpack(buf, off)
        if seq != expect or check != seq * 2654435761 & 0xFFFFFFFF or n != 12 + seq % 64:
            raise AssertionError(f"record {expect}: got seq {seq} len {n}")
        crc = zlib.crc32(buf[off:off + n], crc)
        expect += 1
        if expect % 64 == 0:
            ring.release()
    ring.release()
    return crc, sleeps


def test_fork_parent_produces_child_consumes_1m_in_order():
    """A million small records through a 64 KiB ring: order, content, checksum,
    with the consumer sleeping whenever it catches up and the producer waiting
    for space whenever the ring is full."""
    count = 1_000_000
    pw, cw = WakeFd.create(), WakeFd.create()
    ring = Ring.create(1 << 16, wake_fd=cw, space_fd=pw, name="p>c")
    pid, rfd = in_child(consume, ring, count)
    crc = produce(ring, count, 16)
    child_crc, sleeps = child_result(pid, rfd)
    assert child_crc == crc
    assert sleeps <= ring._hdr[SLEEP_SEQ]
    assert ring.signals <= ring._hdr[SLEEP_SEQ]    # at most one signal per flagged sleep
    for w in (pw, cw):
        w.close()


def test_fork_child_produces_parent_consumes():
    count = 200_000
    pw, cw = WakeFd.create(), WakeFd.create()
    ring = Ring.create(1 << 12, wake_fd=cw, space_fd=pw, name="c>p")
    pid, rfd = in_child(produce, ring, count, 16)
    crc, _ = consume(ring, count)
    assert child_result(pid, rfd) == crc
    for w in (pw, cw):
        w.close()


def sleeping_consumer(ring: Ring, ready_w: int) -> tuple[list[bytes], int]:
    """Sleep in select on the eventfd until the parent publishes, then, awake,
    read a burst the parent sends without signalling."""
    wake = WakeFd(ring.wake_fd)
    assert ring.prepare_sleep()
    os.write(ready_w, b"S")                            # "I am asleep"
    assert wake.wait(CHILD_TIMEOUT), "not woken"
    ring.clear_sleep()
    woken_by = wake.drain()
    got = drain(ring)
    os.write(ready_w, b"A")                            # "awake, not sleeping"
    while len(got) < 101:                              # busy consumer: polls, never sleeps
        got += drain(ring)
    return got, woken_by


def test_fork_sleep_wake_handshake():
    cw = WakeFd.create()
    ring = Ring.create(1 << 12, wake_fd=cw, name="sleepy")
    ready_r, ready_w = os.pipe()
    pid, rfd = in_child(sleeping_consumer, ring, ready_w)
    assert os.read(ready_r, 1) == b"S"
    ring.write(b"first")
    assert ring.publish() is True                      # the child was asleep: one eventfd write
    assert os.read(ready_r, 1) == b"A"
    for i in range(100):
        ring.write(b"%d" % i)
        assert ring.publish() is False                 # the child is awake: no syscall
    got, woken_by = child_result(pid, rfd)
    assert got == [b"first"] + [b"%d" % i for i in range(100)]
    assert woken_by == 1 and ring.signals == 1
    for fd in (ready_r, ready_w):
        os.close(fd)
    cw.close()
