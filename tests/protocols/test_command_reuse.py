"""What the compiled memcache parser saves per request without a caller seeing it (issue 8,
memcache.pxd `_c_name`, `_c_plain_get`, `_c_new_set`; memcache_commands.pxd `_c_slot_fields`):
the same name again is the same str, a plain Get or Set nobody holds any more is made again in
place, and the hot commands' fields read as `__slots__` fields.  Pure Python makes every
command new; every check here holds in both builds."""
from __future__ import annotations

import importlib
import sys

import pytest

from lanner.protocols import memcache as mc
from lanner.protocols import memcache_commands as mcc

COMPILED = not importlib.import_module("lanner.protocols.memcache").__file__.endswith(".py")
PLAIN = dict(timeout_ms=None, open=False, close=False, abort=False, peek=False)


def one(p: mc.MemcacheParser, data: bytes):
    p.feed(data)
    cmd = p.next()
    assert cmd is not None
    return cmd


def test_a_command_still_held_is_never_changed_by_the_next_parse():
    """Each held command keeps its own fields, whatever the parser reuses."""
    p = mc.MemcacheParser()
    held = [one(p, b"get a\r\n"), one(p, b"get b\r\n"), one(p, b"set a 1 2 3\r\nxyz\r\n"),
            one(p, b"set b 4 5 2\r\nuv\r\n"), one(p, b"get a\r\n")]
    assert held == [mc.Get([mc.GetKey("a", "a")]), mc.Get([mc.GetKey("b", "b")]),
                    mc.Set("a", 1, 2, b"xyz"), mc.Set("b", 4, 5, b"uv"), mc.Get([mc.GetKey("a", "a")])]
    assert len({id(c) for c in held}) == len(held)


def test_a_get_no_one_holds_comes_back_with_every_field_of_the_new_one():
    """A caller changed the key's options and dropped the command (or only held on to the key's
    list or the key): the next plain get is still exactly `plain_get(name)`."""
    p = mc.MemcacheParser()
    cmd = one(p, b"get a\r\n")
    k = cmd.plain
    k.open = k.close = k.abort = k.peek = True
    k.timeout_ms = 5
    k.raw = "junk"
    del cmd, k
    again = one(p, b"get b\r\n")
    assert again == mc.Get([mc.GetKey("b", "b")]) and again.plain is again.keys[0]
    assert {f: getattr(again.plain, f) for f in PLAIN} == PLAIN
    keys = again.keys
    del again
    third = one(p, b"get c\r\n")
    assert third.keys is not keys and keys == [mc.GetKey("b", "b")]     # the list was held
    key = third.plain
    del third
    fourth = one(p, b"get d\r\n")
    assert fourth.plain is not key and key == mc.GetKey("c", "c")        # the key was held
    assert fourth == mc.Get([mc.GetKey("d", "d")])


def test_a_set_no_one_holds_comes_back_with_every_field_of_the_new_one():
    p = mc.MemcacheParser()
    cmd = one(p, b"set a 1 2 3 noreply\r\nxyz\r\n")
    assert cmd == mc.Set("a", 1, 2, b"xyz", True)
    del cmd
    assert one(p, b"set bb 0 0 2\r\nuv\r\n") == mc.Set("bb", 0, 0, b"uv", False)
    # a set whose body has not come yet: fields read, data empty until it comes
    p.feed(b"set c 7 8 4\r\nab")
    assert p.next() is None
    p.feed(b"cd\r\n")
    assert p.next() == mc.Set("c", 7, 8, b"abcd", False)


def test_a_big_body_is_not_held_by_the_parser_after_its_set():
    """The Set kept for reuse would keep its last body alive: one over SPARE_MAX (4 KiB) is let
    go; a small one may stay until the next set."""
    p = mc.MemcacheParser()
    cmd = one(p, b"set a 0 0 8192\r\n%s\r\n" % (b"x" * 8192))
    data = cmd.data
    del cmd
    assert sys.getrefcount(data) == 2           # `data` and the call's argument: nobody else
    cmd = one(p, b"set a 0 0 2\r\nab\r\n")
    small = cmd.data
    del cmd
    assert one(p, b"set a 0 0 2\r\ncd\r\n").data == b"cd" and small == b"ab"


def test_the_same_name_again_is_the_same_str():
    """No decode and no hash computed again by every dict it is looked up in."""
    p = mc.MemcacheParser()
    a = one(p, b"set hot 0 0 1\r\nx\r\n").queue
    b = one(p, b"get hot\r\n").plain.queue
    c = one(p, b"get h\xe9t\r\n").plain.queue
    d = one(p, b"get h\xe9t\r\n").plain.raw
    assert (a, b, c, d) == ("hot", "hot", "h\xe9t", "h\xe9t")
    if COMPILED:
        assert a is b and c is d


def test_every_connections_parser_reuses_the_processs_last_get_set_and_name():
    """The spares are the process's, not a parser's: with a thousand connections a parser's own
    were cold by its connection's next request (perf/README.md stop 23).  Two parsers, as two
    connections: the second reuses what the first parsed, once nobody holds it."""
    p, q = mc.MemcacheParser(), mc.MemcacheParser()
    get = one(p, b"get hot\r\n")
    name, got = get.plain.queue, id(get)
    del get
    again = one(q, b"get hot\r\n")
    assert again == mc.Get([mc.GetKey("hot", "hot")])
    s = one(p, b"set hot 1 2 3\r\nabc\r\n")
    made = id(s)
    del s
    s2 = one(q, b"set cold 0 0 1\r\nx\r\n")
    assert s2 == mc.Set("cold", 0, 0, b"x")
    if COMPILED:
        assert id(again) == got and again.plain.queue is name and id(s2) == made
    held = one(p, b"get hot\r\n")              # `again` is still held: a new one
    assert held is not again and held == again
    assert one(q, b"get cold\r\n").plain.queue == "cold" == s2.queue


@pytest.mark.skipif(not COMPILED, reason="the compiled build's fields")
@pytest.mark.parametrize("cls, names", [(mcc.GetKey, mcc.GetKey.FIELDS), (mcc.Get, ("keys", "plain")),
                                        (mcc.Set, mcc.Set.FIELDS)])
def test_the_hot_commands_fields_are_member_descriptors(cls, names):
    """What LOAD_ATTR specialises (a getset descriptor it does not): each reads and writes its
    own field of the C struct."""
    for n in names:
        assert type(cls.__dict__[n]).__name__ == "member_descriptor", n
    obj = cls.__new__(cls)
    for i, n in enumerate(names):
        setattr(obj, n, ("v", i))
    assert [getattr(obj, n) for n in names] == [("v", i) for i in range(len(names))]
