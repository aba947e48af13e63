"""Hot-path cost of the protocol parsers (pytest-benchmark).

Run: python -m pytest perf/bench_protocols.py --benchmark-enable -p no:randomly
Each benchmark feeds one request and drains the parser, as a front does per request;
the batched variants show the per-request cost when 100 pipelined requests arrive in one read.
"""
from lanner.protocols import memcache as mc
from lanner.protocols import memcache_replies as mr
from lanner.protocols import text as tx

SET64 = b"set q 0 0 64\r\n" + b"x" * 64 + b"\r\n"
GET = b"get q\r\n"
GET_OPEN = b"get q/t=1000/open\r\n"


def _one(parser, data):
    def run():
        parser.feed(data)
        return parser.next()
    return run


def _batch(parser_factory, data, n=100):
    blob = data * n

    def run():
        p = parser_factory()
        p.feed(blob)
        return sum(1 for _ in p.commands())
    return run


def test_memcache_set_64(benchmark):
    cmd = benchmark(_one(mc.MemcacheParser(), SET64))
    assert cmd == mc.Set("q", 0, 0, b"x" * 64)


def test_memcache_get(benchmark):
    cmd = benchmark(_one(mc.MemcacheParser(), GET))
    assert cmd == mc.Get([mc.GetKey("q", "q")])


def test_memcache_get_open_timeout(benchmark):
    cmd = benchmark(_one(mc.MemcacheParser(), GET_OPEN))
    assert cmd.keys[0].open and cmd.keys[0].timeout_ms == 1000


def test_memcache_set_64_pipelined_x100(benchmark):
    assert benchmark(_batch(mc.MemcacheParser, SET64)) == 100


def test_memcache_get_pipelined_x100(benchmark):
    assert benchmark(_batch(mc.MemcacheParser, GET)) == 100


def test_memcache_value_block_64(benchmark):
    data = b"x" * 64
    assert benchmark(mr.value_block, "q", data).startswith(b"VALUE q 0 64\r\n")


def test_text_get(benchmark):
    assert benchmark(_one(tx.TextParser(), b"get q\n")) == tx.Get("q")


def test_text_put_one_item_64(benchmark):
    cmd = benchmark(_one(tx.TextParser(), b"put q:\n" + b"x" * 64 + b"\n\n"))
    assert cmd == tx.Put("q", None, [b"x" * 64])
