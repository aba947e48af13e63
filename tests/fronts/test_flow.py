"""Flow control and streamed set bodies, in process (issue 11, defect 5): a connection whose
client does not read stops taking commands and stops reading once its unsent replies reach the
budget, and resumes when they drain; a large set body goes to the worker in pieces."""
from __future__ import annotations

import pytest

from lanner.config import Config
from lanner.fronts.conn import INPUT_LIMIT, MAX_INFLIGHT, REPLY_BUDGET
from lanner.ipc import messages as m
from lanner.protocols.memcache import STREAM_PIECE
from tests.fronts.harness import READ_SIZE, Rig


@pytest.fixture
def rig(tmp_path):
    r = Rig(tmp_path)
    yield r
    r.close()


def unsent(c) -> int:
    """Bytes the server holds for this client: the transport's buffer, the spill behind it and
    the held replies."""
    return c.transport.get_write_buffer_size() + c.conn.spilled + c.conn.held


def read_replies(rig, c, n: int, terminator: bytes = b"END\r\n") -> bytes:
    """Read until n terminators arrived, turning the rig between reads.  Each read's bytes are
    searched once (counting over all that arrived, hundreds of MB of big replies a slice at a
    time, took minutes)."""
    got = bytearray()
    seen = 0
    pos = 0                  # where the search goes on: past the last terminator found
    for _ in range(100_000):
        got += c.read()
        while (i := got.find(terminator, pos)) >= 0:
            seen += 1
            pos = i + len(terminator)
        if seen >= n:
            return bytes(got)
        pos = max(pos, len(got) - len(terminator) + 1)
        rig.run()
    raise AssertionError(f"only {seen} of {n} replies arrived")


REPLY = b"VALUE pk/peek 0 100\r\n" + b"x" * 100 + b"\r\nEND\r\n"


def test_a_client_that_never_reads_is_bounded_then_served_in_full(rig):
    n = 200_000
    rig.worker().queues["pk"].append(b"x" * 100)
    c = rig.connect()
    c.send(b"get pk/peek\r\n" * n)                   # 2.6 MB of commands, 25 MB of replies
    rig.run()
    assert c.transport.writing_paused and not c.transport.reading
    assert unsent(c) <= REPLY_BUDGET + 2 * len(REPLY)
    assert len(c.conn.slots) <= MAX_INFLIGHT
    assert c.conn.parser.buffered <= INPUT_LIMIT + READ_SIZE
    assert len(c.transport.inbox) > n * 13 // 2     # most commands are still with the client
    taken = len(rig.worker().seen)
    rig.run()
    assert len(rig.worker().seen) == taken           # stalled, not spinning
    got = read_replies(rig, c, n)
    assert got == REPLY * n
    assert c.transport.max_unread <= REPLY_BUDGET + 2 * len(REPLY)
    assert c.transport.reading and not c.conn.slots


def test_another_connection_is_served_while_one_does_not_read(rig):
    rig.worker().queues["pk"].append(b"x" * 100)
    flood = rig.connect()
    flood.send(b"get pk/peek\r\n" * 100_000)
    rig.run()
    other = rig.connect()
    assert other.ask(b"get other\r\n") == b"END\r\n"
    assert other.ask(b"set other 0 0 1\r\nz\r\n") == b"STORED\r\n"


def test_large_replies_are_bounded_by_their_size_not_only_their_count(rig):
    item = b"y" * (256 << 10)
    rig.worker().queues["big"].append(item)
    c = rig.connect()
    c.send(b"get big/peek\r\n" * 200)              # 50 MB of replies if nothing held back
    rig.run()
    assert unsent(c) <= REPLY_BUDGET + 2 * len(item)
    assert len(rig.worker().seen) <= 20
    got = read_replies(rig, c, 200)
    assert got.count(item) == 200
    assert c.transport.max_unread <= REPLY_BUDGET + 2 * len(item)


def test_a_first_write_of_big_gets_is_bounded_by_the_first_estimate(rig):
    """Nothing is known of a new connection's replies, so flow control takes its first commands
    against a pessimistic estimate (REPLY_BUDGET // 16 a reply: Conn.__init__), not the small
    replies most connections get: a first write of gets of an 8 MiB item takes 16 of them, not
    MAX_INFLIGHT (8 GiB of replies), and once their sizes are known one at a time."""
    item = b"z" * (8 << 20)
    rig.worker().queues["huge"].append(item)
    c = rig.connect()
    c.send(b"get huge/peek\r\n" * 40)
    assert len(c.conn.slots) == 16 == REPLY_BUDGET // c.conn.reply_size
    got = read_replies(rig, c, 40)
    assert got.count(item) == 40
    assert c.transport.max_unread <= REPLY_BUDGET + 16 * len(item)     # the first 16, no more
    assert c.conn.room() == 1                                           # the estimate knows now


def test_a_blocked_pipeline_stops_reading_at_the_input_limit(rig):
    w = rig.worker()
    w.hold = True                                   # the blocking get waits at its worker
    c = rig.connect()
    c.send(b"get empty/t=60000\r\n" + b"get empty\r\n" * 100_000)
    rig.run()
    assert c.conn.blocked is not None
    assert not c.transport.reading
    assert c.conn.parser.buffered <= INPUT_LIMIT + READ_SIZE
    assert len(w.seen) == 1                          # nothing after the blocking get was taken
    w.hold = False
    w.release()
    assert read_replies(rig, c, 100_001) == b"END\r\n" * 100_001


# ----------------------------------------------------------------------------- streamed sets

def test_a_large_set_body_reaches_the_worker_in_pieces_as_it_arrives(rig):
    body = bytes(range(256)) * 4096                 # 1 MiB
    c = rig.connect()
    w = rig.worker()
    c.send(b"set big 0 0 %d\r\n" % len(body))
    sent = 0
    for i in range(0, len(body), 100_000):
        c.send(body[i:i + 100_000])
        sent += len(body[i:i + 100_000])
        rig.run()
        pieces = [r for r in w.seen if r.op == m.OP_SET_DATA]
        assert sum(len(r.payload) for r in pieces) >= sent - STREAM_PIECE
        assert c.conn.parser.buffered < STREAM_PIECE + 100_000
    head = [r for r in w.seen if r.op == m.OP_SET]
    assert len(head) == 1 and head[0].flags & m.F_STREAM and head[0].b == len(body)
    assert c.ask(b"\r\nget big\r\n") == b"STORED\r\nVALUE big 0 %d\r\n%s\r\nEND\r\n" % (len(body), body)
    assert max(len(r.payload) for r in w.seen) <= len(body) // 4


def test_a_streamed_body_waits_for_room_in_the_ring_instead_of_piling_up(rig):
    """A worker that does not read: the ring (1 MiB) fills, the front keeps at most a little
    overflow, stops reading the client, and carries on when the worker reads again."""
    w = rig.worker()
    w.asleep = True
    body = b"r" * (8 << 20)
    c = rig.connect()
    c.send(b"set slow 0 0 %d\r\n" % len(body) + body + b"\r\n")
    rig.run()
    assert rig.front.req_rings[0].backlog <= 2
    assert not c.transport.reading
    assert len(c.transport.inbox) > len(body) - (2 << 20)
    w.asleep = False
    rig.run()
    assert c.read() == b"STORED\r\n"
    assert w.queues["slow"][0] == body


def test_a_streamed_set_to_an_alias_goes_to_every_destination(tmp_path):
    rig = Rig(tmp_path, nworkers=2, config=Config(aliases={"al": ("d1", "d2", "d3")}))
    body = b"z" * 200_000
    c = rig.connect()
    assert c.ask(b"set al 0 0 %d\r\n%s\r\n" % (len(body), body)) == b"STORED\r\n"
    stored = [q for w in rig.workers for name, q in w.queues.items() if name.startswith("d")]
    assert sorted(len(q) for q in stored) == [1, 1, 1]
    assert all(q[0] == body for q in stored)
    rig.close()


def test_a_streamed_noreply_set_answers_nothing(rig):
    body = b"n" * 100_000
    c = rig.connect()
    assert c.ask(b"set nr 0 0 %d noreply\r\n%s\r\nget nr/peek\r\n" % (len(body), body)) == \
        b"VALUE nr/peek 0 %d\r\n%s\r\nEND\r\n" % (len(body), body)


def test_a_client_that_leaves_mid_body_leaves_nothing_behind(rig):
    c = rig.connect()
    c.send(b"set gone 0 0 1000000\r\n" + b"g" * 300_000)
    rig.run()
    w = rig.worker()
    assert len(w.bodies) == 1
    c.transport.hang_up()
    rig.run()
    assert len(w.bodies) == 0 and not w.queues["gone"]


def test_a_set_over_max_item_size_is_refused_without_buffering(tmp_path):
    from lanner.config import QueueConfig
    rig = Rig(tmp_path, config=Config(default=QueueConfig(max_item_size=1000)))
    c = rig.connect()
    c.send(b"set small 0 0 5000000\r\n")
    for _ in range(20):
        c.send(b"s" * 250_000)
        rig.run()
        assert c.conn.parser.buffered == 0
    assert c.ask(b"\r\nget small\r\n") == b"NOT_STORED\r\nEND\r\n"
    assert not [r for r in rig.worker().seen if r.op in (m.OP_SET, m.OP_SET_DATA)]
    rig.close()


def test_noreply_commands_stop_at_a_lagging_worker(rig):
    """noreply sets take no slot, so the per-connection budget does not bound them: the request
    ring's overflow does.  A worker that does not read: the ring fills, the overflow stays small,
    the connection stops reading; when the worker reads again every item arrives, in order."""
    w = rig.worker()
    w.asleep = True
    n = 100_000
    c = rig.connect()
    c.send(b"".join(b"set nr 0 0 %d noreply\r\n%d\r\n" % (len(b"%d" % i), i) for i in range(n)))
    rig.run()
    assert rig.front.req_rings[0].backlog <= 64 + 4096
    assert not c.transport.reading
    w.asleep = False
    rig.run()
    assert list(w.queues["nr"]) == [b"%d" % i for i in range(n)]
    assert c.transport.reading and c.read() == b""
