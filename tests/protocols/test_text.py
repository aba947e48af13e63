"""Unit tests of lanner.protocols.text beyond the case files: the put-block quirks, bounds, encoders."""
import pytest
from hypothesis import given, settings, strategies as st

from lanner.protocols import text as tx
from lanner.protocols.oversized import Oversized
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


# ----------------------------------------------------------------------------- items dropped as they arrive


def fed(data: bytes, cuts, **kw) -> tuple[list, int]:
    """(commands, the most `buffered` ever was) feeding `data` cut before each offset in `cuts`."""
    p = TextParser(**kw)
    out, peak, pos = [], 0, 0
    for end in sorted(set(cuts) | {len(data)}):
        p.feed(data[pos:end])
        pos = end
        peak = max(peak, p.buffered)
        out.extend(p.commands())
        peak = max(peak, p.buffered)
    return out, peak


def test_an_item_line_over_the_put_bound_is_dropped_as_it_arrives():
    data = b"put q:\nok1\n" + b"x" * 5000 + b"\r\nok2\n\nget q\n"
    for cuts in (range(0, len(data), 100), range(len(data)), [12, 13]):
        got, peak = fed(data, cuts, item_limit={"q": 100}.get, skip_over=64)
        assert got == [Put("q", None, [b"ok1", Oversized(5000), b"ok2"]), Get("q")]
        if list(cuts) != [12, 13]:          # the bound (+ its CR), one piece fed, b"ok1": never the line
            assert peak <= 101 + 100 + 3
    # arriving whole it is measured all the same
    assert parse_all(data, item_limit={"q": 100}.get, skip_over=64) == got
    assert parse_all(data)[0] == Put("q", None, [b"ok1", b"x" * 5000, b"ok2"])


@pytest.mark.parametrize("line, crlf", [(b"x" * 40, False), (b"x" * 40, True), (b"x" * 41, False),
                                        (b"x" * 41, True), (b"x" * 39 + b"\r", True)])
def test_a_dropped_line_is_held_to_the_same_line_cap(line, crlf):
    data = b"put q:\n" + line + (b"\r\n" if crlf else b"\n") + b"\n"
    want = parse_all(data, max_line=40)
    for cuts in (range(len(data)), [8, 20]):
        got, _ = fed(data, cuts, max_line=40, item_limit=lambda q: 1, skip_over=2)
        assert got == [Put("q", None, [Oversized(len(want[0].items[0]))])] if type(want[0]) is Put \
            else got == want


def test_a_block_no_put_reads_drops_every_long_line():
    asked = []

    def limit(q):
        asked.append(q)
        return 1 << 40
    data = b"get q:\n" + b"y" * 300 + b"\n\nput:\n" + b"z" * 300 + b"\n\n"
    got, peak = fed(data, range(0, len(data), 10), item_limit=limit, skip_over=16)
    assert got == parse_all(data) == [Get("q"), Reply(b"-Queue name required.\n")]
    assert peak <= 16 + 2 + 10 and asked == []


LINES = st.lists(st.tuples(st.integers(0, 45), st.booleans()), max_size=6)
BLOCKS = st.lists(st.one_of(
    st.tuples(st.sampled_from([b"put q:", b"PUT q 10:", b"put r:", b"put q x:", b"put:", b"get q:"]),
              LINES),
    st.tuples(st.sampled_from([b"get q", b"status", b""]), st.just([])),
), max_size=5)


@settings(max_examples=300, deadline=None)
@given(blocks=BLOCKS, cuts=st.lists(st.integers(0, 600), max_size=15))
def test_any_blocks_cut_anywhere_parse_as_they_do_whole(blocks, cuts):
    """With a bound, a put's item longer than it (and than skip_over) is an Oversized; the rest,
    errors and line, block and 1024-item rules included, is what the parser without one gives."""
    data = b""
    for i, (head, lines) in enumerate(blocks):
        data += head + b"\n"
        for j, (n, cr) in enumerate(lines):
            data += bytes([97 + (i + j) % 26]) * n + (b"\r\n" if cr else b"\n")
        if head.endswith(b":"):
            data += b"\n"
    kw = {"max_line": 40, "max_block": 100}
    want = []
    for cmd in parse_all(data, **kw):
        if type(cmd) is Put:
            bound = max(8, {"q": 12, "r": 30}[cmd.queue])
            cmd = Put(cmd.queue, cmd.expiry_ms, [Oversized(len(i)) if len(i) > bound else i for i in cmd.items])
        want.append(cmd)
    got, _ = fed(data, [c % (len(data) + 1) for c in cuts], item_limit={"q": 12, "r": 30}.get,
                 skip_over=8, **kw)
    assert got == want
