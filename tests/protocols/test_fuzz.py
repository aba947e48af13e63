"""Property tests: arbitrary bytes never raise, never grow memory past the caps, and
fragmentation never changes the parse."""
from hypothesis import HealthCheck, given, settings, strategies as st

from lanner.protocols import memcache as mc
from lanner.protocols import text as tx

MC_TYPES = tuple(getattr(mc, n) for n in ("Get", "Set", "SetRefused", "Delete", "Flush", "FlushAll",
                                          "FlushExpired", "FlushAllExpired", "Stats", "DumpStats",
                                          "DumpConfig", "Monitor", "Confirm", "Status", "Version",
                                          "Reload", "Shutdown", "Quit", "ProtocolError"))
TX_TYPES = tuple(getattr(tx, n) for n in ("Put", "Get", "Peek", "Monitor", "Confirm", "Flush", "Delete",
                                          "Status", "Version", "Shutdown", "Quit", "Reply",
                                          "ProtocolError"))

MAX_LINE = 64
ITEM_LIMIT = 40

# Fragments that real requests are made of, so the fuzzer reaches deep states, plus raw bytes.
MC_WORDS = [b"get ", b"gets ", b"set ", b"SET ", b"add ", b"delete ", b"flush ", b"flush_all", b"monitor ",
            b"confirm ", b"status ", b"dump_stats ", b"quit", b"q", b"/open", b"/close", b"/abort", b"/peek",
            b"/t=", b"noreply", b" ", b"  ", b"0", b"5", b"-1", b"39", b"41", b"2147483648", b"\r\n",
            b"\n", b"\r", b"\t", b"hello", b"\x00", b"\xff"]
TX_WORDS = [b"put ", b"get ", b"peek ", b"monitor ", b"confirm ", b"status ", b"quit", b"q", b":", b" ",
            b"0", b"10", b"x", b"\n", b"\r\n", b"\r", b"\xe9", b"down", b"up"]


def stream(words):
    piece = st.one_of(st.sampled_from(words), st.binary(max_size=12))
    return st.lists(piece, max_size=60).map(b"".join)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    out, prev = [], 0
    for p in points + [len(data)]:
        out.append(data[prev:p])
        prev = p
    return out


def drive(parser, chunks, bound):
    out = []
    for c in chunks:
        parser.feed(c)
        for cmd in parser.commands():
            out.append(cmd)
        assert parser.buffered <= bound
    return out


def drive_three_ways(make_parser, data: bytes, cuts, bound: int) -> list:
    """The commands of `data` fed whole, in the given cuts and byte by byte, which must agree
    (a parser's output may not depend on how the bytes arrive)."""
    whole = drive(make_parser(), [data], bound + len(data))
    pieces = drive(make_parser(), split(data, cuts), bound + len(data))
    bytewise = drive(make_parser(), [data[i:i + 1] for i in range(len(data))], bound)
    assert whole == pieces == bytewise
    return whole


def mc_parser():
    return mc.MemcacheParser(max_line=MAX_LINE, item_limit=lambda q: ITEM_LIMIT)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream(MC_WORDS), st.lists(st.integers(0, 10_000), max_size=12))
def test_memcache_any_bytes(data, cuts):
    bound = max(MAX_LINE + 1, ITEM_LIMIT + 2)
    whole = drive_three_ways(mc_parser, data, cuts, bound)
    for cmd in whole:
        assert isinstance(cmd, MC_TYPES)
        if isinstance(cmd, mc.ProtocolError):
            assert cmd.reply.startswith(b"CLIENT_ERROR") and cmd.reply.endswith(b"\r\n")
            assert b"\n" not in cmd.reply[:-1] and b"\r" not in cmd.reply[:-2]
        if isinstance(cmd, mc.Set):
            assert len(cmd.data) <= ITEM_LIMIT
    closing = [i for i, c in enumerate(whole)
               if isinstance(c, (mc.Quit, mc.Shutdown)) or (isinstance(c, mc.ProtocolError) and c.close)]
    assert closing in ([], [len(whole) - 1])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream(TX_WORDS), st.lists(st.integers(0, 10_000), max_size=12))
def test_text_any_bytes(data, cuts):
    max_block = 100
    bound = MAX_LINE + 1 + max_block

    def parser():
        return tx.TextParser(max_line=MAX_LINE, max_block=max_block)

    whole = drive_three_ways(parser, data, cuts, bound)
    for cmd in whole:
        assert isinstance(cmd, TX_TYPES)
        if isinstance(cmd, (tx.Reply, tx.ProtocolError)):
            assert cmd.reply.startswith((b"-", b"+")) and cmd.reply.endswith(b"\n")
            assert b"\n" not in cmd.reply[:-1]
        if isinstance(cmd, tx.Put):
            assert cmd.items and all(cmd.items) and len(cmd.items) <= tx.MAX_PUT_BUFFER
    closing = [i for i, c in enumerate(whole) if isinstance(c, (tx.Quit, tx.ProtocolError))]
    assert closing in ([], [len(whole) - 1])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["q", "jobs", "\xe9"]), st.binary(max_size=50),
                          st.integers(-2**31, 2**31 - 1)), min_size=1, max_size=8))
def test_memcache_set_round_trip(items):
    wire = b"".join(b"set %s %d 0 %d\r\n%s\r\n" % (q.encode("latin-1"), flags, len(d), d)
                    for q, d, flags in items)
    p = mc.MemcacheParser()
    p.feed(wire)
    assert list(p.commands()) == [mc.Set(q, flags, 0, d) for q, d, flags in items]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=30).filter(lambda b: b"\n" not in b and b != b"\r"),
                min_size=1, max_size=20))
def test_text_put_round_trip(items):
    p = tx.TextParser()
    p.feed(b"put q:\r\n" + b"".join(i + b"\r\n" for i in items) + b"\r\n")
    assert list(p.commands()) == [tx.Put("q", None, items)]
