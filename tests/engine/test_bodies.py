"""Streamed set bodies (ipc/bodies.py) are assembled with one copy at most (issue 8: copying
8 MiB bodies took a quarter of the flood worker's loop), and never keep a view of a buffer
their sender reuses."""
from __future__ import annotations

from lanner.ipc.bodies import Bodies
from lanner.protocols import memcache_replies as mr


def test_a_body_in_one_bytes_piece_is_not_copied():
    b = Bodies()
    body = b"x" * (1 << 20)
    b.begin(0, 1, 2, "q", 0, len(body), 0)
    queue, data, expiry, flags = b.more(0, 1, 2, body)
    assert data is body and (queue, expiry, flags) == ("q", 0, 0) and len(b) == 0


def test_pieces_from_a_reused_buffer_are_copied_as_they_come():
    b = Bodies()
    b.begin(0, 1, 2, "q", 5, 8, 3)
    buf = bytearray(b"abcd")
    assert b.more(0, 1, 2, memoryview(buf)) is None
    buf[:] = b"zzzz"                      # the ring / input buffer is reused
    assert b.more(0, 1, 2, bytearray(b"efgh")) == ("q", b"abcdefgh", 5, 3)


def test_a_last_piece_past_the_size_is_cut():
    b = Bodies()
    b.begin(0, 1, 2, "q", 0, 5, 0)
    assert b.more(0, 1, 2, b"abc") is None
    assert b.more(0, 1, 2, b"defgh") == ("q", b"abcde", 0, 0)


def test_dropped_bodies_ignore_later_pieces():
    b = Bodies()
    b.begin(0, 1, 2, "q", 0, 5, 0)
    b.drop(0, 1)
    assert b.more(0, 1, 2, b"abcde") is None and len(b) == 0


def test_single_value_is_value_block_then_end():
    assert mr.single_value("q/open", b"hi") == mr.value_block("q/open", b"hi") + mr.END


def test_a_streamed_body_is_held_once_while_it_arrives():
    """Each piece is copied into the body as it comes and then let go, and the finished body is
    that copy (issue 8: the pieces kept to the end and joined there held the body twice and
    copied 8 MiB in one go on the owner's loop)."""
    import tracemalloc     # (only here: it slows every allocation while tracing)
    size, piece = 8 << 20, 64 << 10
    b = Bodies()
    b.begin(0, 1, 2, "q", 0, size, 0)
    tracemalloc.start()
    try:
        out = None
        for i in range(size // piece):
            out = b.more(0, 1, 2, bytes([i % 256]) * piece)     # the sender drops each piece
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert out is not None and len(out[1]) == size and type(out[1]) is bytes
    assert out[1][:piece] == b"\0" * piece and out[1][-piece:] == bytes([(size // piece - 1) % 256]) * piece
    assert peak < size * 1.3, peak


def test_pieces_are_assembled_in_order():
    b = Bodies()
    body = bytes(range(256)) * 1000
    b.begin(0, 1, 2, "q", 7, len(body), 1)
    cuts = [0, 1, 300, 70_000, 70_001, 200_000, len(body) + 10]
    got = None
    for lo, hi in zip(cuts, cuts[1:]):
        got = b.more(0, 1, 2, memoryview((body + b"\r\nxx")[lo:hi]))
    assert got == ("q", body, 7, 1) and len(b) == 0
