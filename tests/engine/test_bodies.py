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
