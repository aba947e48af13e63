"""Unit tests of lanner.protocols.text beyond the case files: the put-block quirks, bounds, encoders."""
import pytest

from lanner.protocols import text as tx
from lanner.protocols.text import Get, ProtocolError, Put, Reply, TextParser


def parse_all(data: bytes, **kw) -> list:
    p = TextParser(**kw)
    p.feed(data)
    return list(p.commands())


def test_1024_items_then_the_empty_line_is_a_normal_block():
    items = [b"i%d" % i for i in range(1024)]
    got = parse_all(b"put q:\n" + b"\n".join(items) + b"\n\nget q\n")
    assert got == [Put("q", None, items), Get("q")]


def test_the_1025th_line_ends_the_block_and_is_discarded():
    items = [b"i%d" % i for i in range(1024)]
    got = parse_all(b"put q:\n" + b"\n".join(items) + b"\nlost\nget q\n")
    assert got == [Put("q", None, items), Get("q")]


def test_after_the_1025th_line_the_rest_of_a_long_block_is_read_as_commands():
    items = [b"i%d" % i for i in range(1030)]
    got = parse_all(b"put q:\n" + b"\n".join(items) + b"\n\n")
    assert got[0] == Put("q", None, items[:1024])
    assert got[1:] == [Reply(b"-Unknown command: i%d\n" % i) for i in range(1025, 1030)] + [
        Reply(b"-Unknown command: \n")]


@pytest.mark.parametrize("limits, within, over, reply", [
    ({"max_block": 10}, b"put q:\n12345\n12345\n", b"1\n", b"-Put block larger than 10 bytes.\n"),
    ({"max_line": 8}, b"get qqqq\r", b"q", b"-Line longer than 8 bytes.\n"),
])
def test_caps_close(limits, within, over, reply):
    """Up to a cap the parser waits for more; one byte over, it closes with the cap's error
    and holds nothing more."""
    p = TextParser(**limits)
    p.feed(within)
    assert p.next() is None
    p.feed(over)
    assert p.next() == ProtocolError(reply, True)
    assert p.stopped and p.buffered == 0


def test_buffered_counts_items_held_in_an_open_block():
    p = TextParser()
    p.feed(b"put q:\nabcdef\nxy")
    assert p.next() is None
    assert p.buffered == 6 + 2


def test_line_cap_applies_to_item_lines():
    p = TextParser(max_line=8)
    p.feed(b"put q:\n" + b"x" * 9 + b"\n\n")
    assert p.next().close


def test_line_exactly_at_the_cap_is_accepted():
    assert parse_all(b"get 1234\n", max_line=8) == [Get("1234")]
    assert parse_all(b"get 1234\r\n", max_line=8) == [Get("1234")]
    p = TextParser(max_line=8)
    for b in b"get 1234\r\n":
        p.feed(bytes([b]))
        assert not p.stopped
    assert p.next() == Get("1234")


def test_bytewise_long_item_is_linear():
    p = TextParser()
    data = b"put q:\n" + b"z" * 200_000 + b"\n\n"
    for i in range(len(data)):
        p.feed(data[i:i + 1])
    assert p.next() == Put("q", None, [b"z" * 200_000])


def test_quit_drops_later_input():
    p = TextParser()
    p.feed(b"quit\nget q\n")
    assert isinstance(p.next(), tx.Quit)
    p.feed(b"get r\n")
    assert p.next() is None and p.buffered == 0


def test_encoders():
    assert tx.item(b"hello") == b":hello\n"
    assert tx.item(b"") == b":\n"
    assert tx.NONE == b"*\n"
    assert tx.count(0) == b"+0\n" and tx.count(1024) == b"+1024\n"
    assert tx.error("Not that many transactions open.") == b"-Not that many transactions open.\n"
    assert tx.error("Unknown command: \xe9") == b"-Unknown command: ?\n"
    assert tx.string("UP") == b":UP\n"
    assert tx.string("lanner 0.1.0") == b":lanner 0.1.0\n"


@pytest.mark.parametrize("msg", ["a\nb", "x\n"])
def test_encoders_never_emit_an_inner_lf(msg):
    assert tx.error(msg).count(b"\n") == 1 and tx.string(msg).count(b"\n") == 1
