"""The compiled parser reads `set` and plain `get` lines in place (memcache.pxd, `_c_set_line`,
`_c_get_key`); every line must parse exactly as the general parse of memcache.py does, which is
what the pure-Python module runs.  Both are fed the same bytes and must yield the same commands."""
from __future__ import annotations

import importlib.util
import random

import pytest

from lanner.protocols import memcache as compiled_mc


def _pure_module():
    """memcache.py loaded from its source as a module of its own: COMPILED is False there."""
    spec = importlib.util.spec_from_file_location("lanner_memcache_pure", compiled_mc.__file__.split(".")[0] + ".py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


pure_mc = _pure_module()

EDGES = [
    b"set q 0 0 5", b"set q 0 0 5 noreply", b"set q 0 0 5 junk", b"set q 0 0 5 junk noreply",
    b"set q 0 0 5 ", b"set  q 0 0 5", b"set q 0  0 5", b"set q 0 0", b"set q 0 0 5 noreplyx",
    b"set q 0 0 5 Noreply", b"set q 0 0 05", b"set q 1 2 3", b"set q -1 0 5", b"set q 0 -1 5",
    b"set q 0 0 -5", b"set q 0 0 +5", b"set q 0 0 123456789", b"set q 0 0 1234567890",
    b"set q 4294967296 0 5", b"set q 0 999999999 5", b"set q 0 1000000000 5", b"set q\xe9 0 0 5",
    b"set q/x 0 0 5", b"set q 0 0 5\r", b"SET q 0 0 5", b"set q 0 0 a", b"set q x 0 5",
    b"set q 0 x 5", b"set a+b 0 0 5", b"set q 0 0 0", b"sets q 0 0 5",
    b"get q", b"get q/open", b"get q ", b"get  q", b"get q r", b"get ", b"get", b"GET q",
    b"get q\xe9", b"get q/t=10", b"gets q", b"get /",
]


def _commands(mod, data: bytes) -> list[str]:
    p = mod.MemcacheParser(item_limit={"big": 3}.get, stream_over=64)
    p.feed(data)
    out = []
    for _ in range(4):
        cmd = p.next()
        if cmd is None:
            break
        out.append(repr(cmd))
    out.append(repr(p.buffered))
    return out


def _random_line(rng: random.Random) -> bytes:
    tokens = [b"set", b"get", b"q", b"big", b"0", b"5", b"70", b"12", b"-3", b"noreply", b"x", b"",
              b"123456789", b"1234567890", b"q/open", b"\xff"]
    return b" ".join(rng.choice(tokens) for _ in range(rng.randint(1, 7)))


@pytest.mark.parametrize("line", EDGES)
def test_edge_lines_parse_as_the_general_parse_does(line):
    data = line + b"\r\nhello\r\nget q\r\n"
    assert _commands(compiled_mc, data) == _commands(pure_mc, data)


def test_random_lines_parse_as_the_general_parse_does():
    rng = random.Random(8)
    for _ in range(3000):
        line = _random_line(rng)
        if rng.random() < 0.5:
            line = b"set " + line if rng.random() < 0.7 else b"get " + line
        data = line + b"\r\nhello\r\nget q\r\n"
        assert _commands(compiled_mc, data) == _commands(pure_mc, data), line


def test_the_pure_module_is_not_compiled():
    """Else this file compares the compiled parser with itself."""
    assert pure_mc.COMPILED is False
    assert pure_mc.__file__.endswith(".py")


def test_value_heads_are_single_values_line_and_stay_bounded():
    from lanner.protocols import memcache_replies as mr
    mr.value_heads.clear()
    assert mr.value_heads["q/open", 5] + b"hello" + mr.END_TAIL == mr.single_value("q/open", b"hello")
    assert mr.value_heads["q\xe9", 0] == b"VALUE q\xe9 0 0\r\n"
    for i in range(5000):
        mr.value_heads["k%d" % i, i]
    assert len(mr.value_heads) <= 4096
    assert mr.value_heads["k4999", 4999] == b"VALUE k4999 0 4999\r\n"
