"""The parsers read their buffer at an offset (stream.py, issue 8): taking a command no longer
deletes it from the front of a bytearray, and a read with nothing left before it is parsed in
place.  The outcomes must be exactly those of the old buffer work (tests/protocols/
old_buffers.py): every command, `buffered`, `stopped` and `unparsed()` after every feed, for
memcache (the compiled parser), text, admin HTTP and thrift, on edge cases and thousands of
random byte streams cut at random points."""
from __future__ import annotations

import random
import struct

import pytest

from lanner.protocols import admin as ad
from lanner.protocols import memcache as mc
from lanner.protocols import text as tx
from lanner.protocols import thrift as th
from tests.protocols.old_buffers import OldAdminParser, OldMemcacheParser, OldTextParser, OldThriftParser
from tests.protocols.test_thrift import call, f_bin_list, f_i32, f_str, frame

MC_WORDS = [b"get q", b"get q/open", b"get q/close", b"get a b", b"gets q", b"get ", b"set q 0 0 5",
            b"set q 0 0 70", b"set big 0 0 12", b"set q 1 2 3 noreply", b"set q 0 0 -1", b"set  q 0 0 5",
            b"append q 0 0 4", b"delete q", b"flush_all", b"version", b"stats", b"quit", b"confirm q 2",
            b"hello", b"x" * 40, b"\x80", b" ", b"", b"0123456789" * 8]
TX_WORDS = [b"put q:", b"get q", b"peek q", b"put big:", b"hello", b"x" * 30, b"y" * 90, b"", b"quit",
            b"confirm q 1", b"status", b"\xe9"]


def _cuts(rng: random.Random, data: bytes) -> list[bytes]:
    """`data` cut at random points: sometimes byte by byte, sometimes whole, mostly a few cuts."""
    kind = rng.random()
    if kind < 0.1:
        return [data[i:i + 1] for i in range(len(data))]
    if kind < 0.2:
        return [data]
    points = sorted(rng.sample(range(len(data) + 1), min(len(data) + 1, rng.randint(1, 8))))
    return [data[a:b] for a, b in zip([0] + points, points + [len(data)])]


def _run(parser, chunks, take=lambda p: p.next()) -> list:
    """What a front sees: after every feed, every command, then the parser's state."""
    out = []
    for chunk in chunks:
        parser.feed(chunk)
        while (cmd := take(parser)) is not None:
            out.append(repr(cmd))
        out.append(("buffered", parser.buffered, "stopped", parser.stopped,
                    "unparsed", parser.unparsed() if hasattr(parser, "unparsed") else None))
    return out


def _same(new, old, chunks) -> None:
    assert _run(new, chunks) == _run(old, chunks)


def _same_cut_anywhere(seed: int, runs: int, stream, new, old) -> None:
    """`runs` byte streams (`stream(rng)`), each cut at random points (`_cuts`), parse alike in a
    fresh parser of today (`new()`) and of old (`old()`)."""
    rng = random.Random(seed)
    for _ in range(runs):
        _same(new(), old(), _cuts(rng, stream(rng)))


# --------------------------------------------------------------------------- memcache

def _mc(cls):
    return cls(max_line=64, item_limit={"big": 10}.get, stream_over=100)


def _mc_stream(rng: random.Random) -> bytes:
    parts = []
    for _ in range(rng.randint(1, 12)):
        word = rng.choice(MC_WORDS)
        if word.startswith(b"set ") or word.startswith(b"append "):
            size = rng.choice([0, 5, 12, 70, 150, 300, int(word.split()[-1]) if word[-1:].isdigit() else 3])
            word = b" ".join(word.split()[:4] + [b"%d" % size]) + (b" noreply" if rng.random() < 0.2 else b"")
            parts.append(word + rng.choice([b"\r\n", b"\n"]) + bytes(rng.randrange(256) for _ in range(size))
                         + rng.choice([b"\r\n", b"xy", b""]))
        else:
            parts.append(word + rng.choice([b"\r\n", b"\n", b"\r\r\n", b""]))
    return b"".join(parts)


MC_EDGES = [
    b"get q\r\n", b"set q 0 0 5\r\nhello\r\nget q\r\n", b"set q 0 0 5\r\nhel", b"\x80get q\r\n",
    b"get " + b"q" * 70 + b"\r\n", b"get " + b"q" * 60 + b"\r\n", b"get " + b"q" * 59 + b"\r\r\n",
    b"get " + b"q" * 61 + b"\n", b"set big 0 0 20\r\n" + b"z" * 22 + b"get q\r\n",
    b"set q 0 0 250\r\n" + b"b" * 250 + b"\r\nget q\r\n", b"append q 0 0 3\r\nabc\r\nget q\r\n",
    b"quit\r\nget q\r\n", b"set q 0 0 2\r\nhello\r\n", b"\r\n", b"  \r\n", b"get q\r\nget r\n",
]


@pytest.mark.parametrize("data", MC_EDGES)
def test_memcache_edges_whole_and_byte_by_byte(data):
    for chunks in ([data], [data[i:i + 1] for i in range(len(data))]):
        _same(_mc(mc.MemcacheParser), _mc(OldMemcacheParser), chunks)


def test_memcache_random_streams_cut_anywhere():
    _same_cut_anywhere(13, 3000, _mc_stream, lambda: _mc(mc.MemcacheParser), lambda: _mc(OldMemcacheParser))


def test_memcache_big_streamed_bodies_cut_anywhere():
    """Bodies over STREAM_PIECE: a read that is all body is yielded as fed, otherwise cut."""
    rng = random.Random(14)
    piece = mc.STREAM_PIECE
    for _ in range(40):
        size = rng.choice([piece, piece + 1, 2 * piece + 5, 3 * piece])
        body = bytes(rng.randrange(256) for _ in range(64)) * (size // 64) + b"t" * (size % 64)
        data = b"set s 0 0 %d\r\n%s\r\nget s\r\nset q 0 0 3\r\nabc\r\n" % (size, body)
        cuts = sorted(rng.sample(range(len(data)), rng.randint(1, 6)))
        chunks = [data[a:b] for a, b in zip([0] + cuts, cuts + [len(data)])]
        new, old = mc.MemcacheParser(stream_over=1024), OldMemcacheParser(stream_over=1024)
        _same(new, old, chunks)


# --------------------------------------------------------------------------- text

def _tx(cls):
    return cls(max_line=80, max_block=400, item_limit=lambda q: 40 if q == "big" else 1000, skip_over=20)


def _tx_stream(rng: random.Random) -> bytes:
    return b"".join(rng.choice(TX_WORDS) + rng.choice([b"\r\n", b"\n", b"\r\r\n"])
                    for _ in range(rng.randint(1, 14)))


def test_text_random_streams_cut_anywhere():
    _same_cut_anywhere(15, 3000, _tx_stream, lambda: _tx(tx.TextParser), lambda: _tx(OldTextParser))


def test_text_dropped_item_lines_cut_anywhere():
    """An item line over its put's bound is dropped as it arrives (text.py `_take_item`)."""
    def stream(rng: random.Random) -> bytes:
        item = b"i" * rng.choice([19, 21, 39, 41, 79, 81, 200])
        return b"put big:\r\n%s%s\r\n\r\nget q\r\n" % (item, rng.choice([b"\r", b""]))
    _same_cut_anywhere(16, 500, stream, lambda: _tx(tx.TextParser), lambda: _tx(OldTextParser))


# --------------------------------------------------------------------------- admin HTTP

AD_REQUESTS = [b"GET /stats.json HTTP/1.1\r\n\r\n", b"GET /x HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello",
               b"\r\n\r\nGET / HTTP/1.1\n\n", b"GET /a HTTP/1.0\r\n\r\n", b"BAD\r\n\r\n",
               b"GET /" + b"p" * 120 + b" HTTP/1.1\r\n\r\n", b"\n", b"GET /z HTTP/1.1\r\nConnection: close\r\n\r\n"]


def test_admin_random_streams_cut_anywhere():
    _same_cut_anywhere(17, 2000, lambda rng: b"".join(rng.choice(AD_REQUESTS) for _ in range(rng.randint(1, 6))),
                       lambda: ad.AdminParser(max_head=100, max_body=50),
                       lambda: OldAdminParser(max_head=100, max_body=50))


# --------------------------------------------------------------------------- thrift

def _th_frames(rng: random.Random) -> bytes:
    out = []
    for _ in range(rng.randint(1, 6)):
        kind = rng.random()
        if kind < 0.4:
            items = [b"v" * rng.choice([1, 10, 60, 130]) for _ in range(rng.randint(0, 4))]
            out.append(call("put", f_str(1, "q"), f_bin_list(2, items), f_i32(3, 0), seqid=rng.randint(1, 9)))
        elif kind < 0.7:
            out.append(call("get", f_str(1, "q"), f_i32(2, 3), seqid=rng.randint(1, 9)))
        elif kind < 0.8:
            out.append(frame(b"\x00\x00\x00\x07garbage"))
        elif kind < 0.9:
            out.append(struct.pack(">i", rng.choice([-1, 1 << 30])))
        else:
            out.append(call("nosuchmethod", seqid=2))
    return b"".join(out)


def test_thrift_random_frames_cut_anywhere():
    rng = random.Random(18)
    for _ in range(1500):
        data = _th_frames(rng)
        chunks = _cuts(rng, data)
        _same(th.ThriftParser(max_frame=1 << 16), OldThriftParser(max_frame=1 << 16), chunks)
        # a put frame decoded as it arrives (thrift_put.py) takes its bytes from the buffer
        bound = lambda q: 50     # noqa: E731
        new = th.ThriftParser(item_limit=bound, stream_over=40)
        old = OldThriftParser(item_limit=bound, stream_over=40)
        assert _run(new, chunks, _thrift_held) == _run(old, chunks, _thrift_held)


def _thrift_held(p):
    """next(), and how many bytes the parser holds after it (its memory bound)."""
    cmd = p.next()
    return None if cmd is None else (cmd, p.held)
