"""Unit tests of lanner.protocols.memcache beyond the case files: numbers, memory bounds, encoders."""
import pytest

from lanner.protocols import memcache as mc
from lanner.protocols import memcache_replies as mr
from lanner.protocols.memcache import (
    Get, GetKey, MemcacheParser, ProtocolError, Set, SetRefused, Version, parse_get_key, parse_int,
)


def parse_all(data: bytes, **kw) -> list:
    p = MemcacheParser(**kw)
    p.feed(data)
    return list(p.commands())


# ----------------------------------------------------------------------------- numbers

@pytest.mark.parametrize("tok, value", [
    (b"0", 0), (b"7", 7), (b"-7", -7), (b"+7", 7), (b"007", 7), (b"-0", 0),
    (b"2147483647", 2147483647), (b"-2147483648", -2147483648), (b"+2147483647", 2147483647),
    (b"0000000000012", 12),
])
def test_parse_int_accepts_java_parseint_forms(tok, value):
    assert parse_int(tok) == value


@pytest.mark.parametrize("tok", [
    b"", b"+", b"-", b"2147483648", b"-2147483649", b"99999999999999999999", b"1.0", b"1e3",
    b" 1", b"1 ", b"1_000", b"0x10", b"--1", b"+-1", b"\xd9\xa1", b"\xb2", b"abc", b"1a",
])
def test_parse_int_rejects_what_parseint_rejects(tok):
    assert parse_int(tok) is None


# ----------------------------------------------------------------------------- get keys

@pytest.mark.parametrize("line, plain", [
    (b"get q", ("q", "q")), (b"get q/", ("q/", "q")), (b"gets q", ("q", "q")), (b"get q/junk", ("q/junk", "q")),
    (b"get q/t=0", ("q/t=0", "q")),
    (b"get q/t=5", None), (b"get q/open", None), (b"get q/close", None), (b"get q/abort", None),
    (b"get q/peek", None), (b"get a b", None),
])
def test_get_names_its_one_plain_key(line, plain):
    """`Get.plain`, which the front's hot path asks instead of the key's options: the one key
    when it has none (whichever parser path made the command), else None."""
    (cmd,) = parse_all(line + b"\r\n")
    assert type(cmd) is Get
    got = None if cmd.plain is None else (cmd.plain.raw, cmd.plain.queue)
    assert got == plain
    assert Get(cmd.keys).plain is cmd.plain      # the constructor derives it the same way


def test_get_key_is_parsed_once_per_key_with_every_flag():
    key = parse_get_key("q/t=5/close/open/t=9/junk")
    assert key == GetKey("q/t=5/close/open/t=9/junk", "q", 9, open=True, close=True)


@pytest.mark.parametrize("opts", ["peek/open", "peek/close", "abort/open", "abort/close", "peek/abort",
                                  "open/abort", "close/peek", "abort/peek"])
def test_forbidden_combinations_close(opts):
    err = parse_get_key("q/" + opts)
    assert isinstance(err, ProtocolError) and err.close and err.reply.startswith(b"CLIENT_ERROR ")


@pytest.mark.parametrize("opts", ["open", "close", "abort", "peek", "close/open", "t=1/peek"])
def test_allowed_single_options(opts):
    assert isinstance(parse_get_key("q/" + opts), GetKey)


@pytest.mark.parametrize("line, want", [
    (b"get q", Get([GetKey("q", "q")])),
    (b"get q ", Get([GetKey("q", "q")])),                # trailing empty tokens vanish
    (b"get q  ", Get([GetKey("q", "q")])),
    (b"get  q", ProtocolError(mr.client_error("empty queue name"), True)),    # first key empty
    (b"get a  b", Get([GetKey("a", "a"), GetKey("b", "b")])),     # later empty keys are skipped
    (b"get a b", Get([GetKey("a", "a"), GetKey("b", "b")])),
    (b"get q/open", Get([GetKey("q/open", "q", open=True)])),
    (b"get q\t", Get([GetKey("q\t", "q\t")])),         # TAB is no separator
    (b"get \xe9", Get([GetKey("\xe9", "\xe9")])),
    (b"get ", ProtocolError(mr.client_error("get needs a queue name"), False)),
    (b"get /", ProtocolError(mr.client_error("missing queue name"), False)),
    (b"GET q", Get([GetKey("q", "q")])),
])
def test_a_get_line_parses_as_split_on_spaces_says(line, want):
    """The plain `get <key>` line skips the split (memcache.py `_line`); every line it must not
    take still goes the general way."""
    got = parse_all(line + b"\r\n")
    assert got == [want] and type(got[0]) is type(want)


def test_a_set_and_a_get_after_it_in_one_buffer_each_parse_whole():
    """The C helpers cut the buffer's head (stream.pxd): the body, then the next line."""
    body = bytes(range(256)) * 4 + b"\n\r"
    got = parse_all(b"set q 0 0 %d\r\n%s\r\nget q\r\nget r\n" % (len(body), body))
    assert got == [Set("q", 0, 0, body), Get([GetKey("q", "q")]), Get([GetKey("r", "r")])]


# ----------------------------------------------------------------------------- data blocks

def test_set_data_is_a_bytes_copy_not_a_view_of_the_buffer():
    p = MemcacheParser()
    p.feed(b"set q 0 0 3\r\nabc\r\nset q 0 0 3\r\nxyz\r\n")
    a, b = p.next(), p.next()
    assert (a.data, b.data) == (b"abc", b"xyz") and type(a.data) is bytes


def test_short_data_swallows_the_next_command_like_kestrel():
    # A client that under-declares desynchronises itself; the parser does not guess.
    got = parse_all(b"set q 0 0 2\r\nhello\r\nget q\r\n")
    assert got[0] == Set("q", 0, 0, b"he")
    assert isinstance(got[1], ProtocolError) and got[1].close  # "llo" is an unknown command


def test_large_accepted_item_arrives_whole():
    data = bytes(range(256)) * 4096
    p = MemcacheParser()
    p.feed(b"set big 0 0 %d\r\n" % len(data))
    for i in range(0, len(data), 65536):
        assert p.next() is None
        p.feed(data[i:i + 65536])
    p.feed(b"\r\n")
    assert p.next() == Set("big", 0, 0, data)


# ----------------------------------------------------------------------------- item_limit

def limit_10(queue):
    return {"small": 10, "open": None}.get(queue, 1 << 30)


def test_set_within_limit_is_accepted_inclusive():
    got = parse_all(b"set small 0 0 10\r\n0123456789\r\n", item_limit=limit_10)
    assert got == [Set("small", 0, 0, b"0123456789")]


def test_set_over_limit_is_refused_before_its_data_arrives():
    p = MemcacheParser(item_limit=limit_10)
    p.feed(b"set small 0 0 11\r\n")
    assert p.next() == SetRefused("small", 11, False)
    p.feed(b"0123456789A\r\nversion\r\n")
    assert list(p.commands()) == [Version()]


def test_refused_set_honours_noreply():
    got = parse_all(b"set small 0 0 11 noreply\r\n0123456789A\r\nversion\r\n", item_limit=limit_10)
    assert got == [SetRefused("small", 11, True), Version()]


def test_item_limit_none_result_means_unlimited():
    got = parse_all(b"set open 0 0 20\r\n" + b"x" * 20 + b"\r\n", item_limit=limit_10)
    assert got == [Set("open", 0, 0, b"x" * 20)]


def test_item_limit_is_asked_with_the_decoded_queue_name():
    asked = []
    parse_all(b"set \xe9 0 0 1\r\nx\r\n", item_limit=lambda q: asked.append(q))
    assert asked == ["\xe9"]


def test_item_limit_not_consulted_when_the_line_already_failed():
    asked = []
    got = parse_all(b"set q x 0 1\r\nx\r\n", item_limit=lambda q: asked.append(q))
    assert asked == [] and got[0].close is False


@pytest.mark.parametrize("chunk", [1, 7, 4096, 65536])
def test_oversize_set_streams_through_without_buffering(chunk):
    size = 10 << 20
    p = MemcacheParser(item_limit=lambda q: 1024)
    p.feed(b"set q 0 0 %d\r\n" % size)
    assert p.next() == SetRefused("q", size, False)
    payload = b"z" * chunk
    sent, peak = 0, 0
    while sent < size:
        n = min(chunk, size - sent)
        p.feed(payload[:n])
        sent += n
        peak = max(peak, p.buffered)
        if chunk <= 7 and sent > 4096:  # byte-wise feeding of 10 MiB: check the start, then jump
            p.feed(b"z" * (size - sent))
            sent = size
    assert peak == 0
    p.feed(b"\r\nget q\r\n")
    assert p.next() == Get([GetKey("q", "q")])
    assert p.buffered == 0


def test_oversize_skip_when_the_data_comes_with_the_line():
    p = MemcacheParser(item_limit=lambda q: 4)
    p.feed(b"set q 0 0 8\r\n12345678\r\nget q\r\n")
    assert list(p.commands()) == [SetRefused("q", 8, False), Get([GetKey("q", "q")])]


def test_skip_of_failed_storage_command_does_not_buffer():
    p = MemcacheParser()
    p.feed(b"append q 0 0 %d\r\n" % (5 << 20))
    assert p.next() is None
    for _ in range(80):
        p.feed(b"a" * 65536)
        assert p.next() is None and p.buffered == 0
    p.feed(b"\r\n")
    err = p.next()
    assert isinstance(err, ProtocolError) and err.close and p.stopped


# ----------------------------------------------------------------------------- line cap

def test_line_cap_without_lf_stops_the_parser():
    p = MemcacheParser(max_line=64)
    p.feed(b"get " + b"q" * 60 + b"\r")
    assert p.next() is None
    p.feed(b"q")
    err = p.next()
    assert err == ProtocolError(b"CLIENT_ERROR line longer than 64 bytes\r\n", True)
    assert p.stopped and p.buffered == 0
    p.feed(b"\r\nget q\r\n")
    assert p.next() is None and p.buffered == 0


def test_line_cap_with_lf_in_the_same_chunk():
    p = MemcacheParser(max_line=16)
    p.feed(b"get " + b"q" * 40 + b"\r\n")
    assert p.next().close


def test_line_exactly_at_the_cap_is_accepted():
    p = MemcacheParser(max_line=16)
    p.feed(b"get " + b"q" * 12 + b"\n")
    assert p.next() == Get([GetKey("q" * 12, "q" * 12)])
    p.feed(b"get " + b"q" * 12 + b"\r")
    assert p.next() is None
    p.feed(b"\n")
    assert p.next() == Get([GetKey("q" * 12, "q" * 12)])
    p.feed(b"get " + b"q" * 13 + b"\n")
    assert p.next().close


def test_bytewise_long_line_is_linear():
    # 200 KB fed one byte at a time must not rescan the buffer each time (would be ~20 G steps).
    p = MemcacheParser()
    line = b"get " + b"q" * 200_000 + b"\r\n"
    for i in range(len(line)):
        p.feed(line[i:i + 1])
        if i % 1000 == 0:
            assert p.next() is None
    assert isinstance(p.next(), Get)


def test_default_line_cap_is_one_mib():
    p = MemcacheParser()
    p.feed(b"x" * ((1 << 20) + 2))
    assert p.next().close


# ----------------------------------------------------------------------------- encoders

def test_value_block():
    assert mr.value_block("q/t=10/open", b"hello") == b"VALUE q/t=10/open 0 5\r\nhello\r\n"
    assert mr.value_block("\xe9", b"") == b"VALUE \xe9 0 0\r\n\r\n"


def test_constants():
    assert (mr.END, mr.STORED, mr.NOT_STORED, mr.DELETED, mr.ERROR) == (
        b"END\r\n", b"STORED\r\n", b"NOT_STORED\r\n", b"DELETED\r\n", b"ERROR\r\n")
    assert mr.CLIENT_ERROR == b"CLIENT_ERROR\r\n" and mr.SERVER_ERROR == b"SERVER_ERROR\r\n"
    assert mr.FLUSHED_ALL == b"Flushed all queues.\r\n" and mr.RELOADED == b"Reloaded config.\r\n"


def test_error_encoders():
    assert mr.client_error() == b"CLIENT_ERROR\r\n"
    assert mr.client_error("bad t= value") == b"CLIENT_ERROR bad t= value\r\n"
    assert mr.server_error() == b"SERVER_ERROR\r\n"
    assert mr.server_error("reads are blocked") == b"SERVER_ERROR reads are blocked\r\n"
    assert mr.client_error("a\r\nb") == b"CLIENT_ERROR a\\r\\nb\r\n"
    assert mr.client_error("\u20ac") == b"CLIENT_ERROR \\u20ac\r\n"


def test_line_encoders():
    assert mr.count_line(3) == b"3\r\n"
    assert mr.version_line("lanner 0.1.0") == b"VERSION lanner 0.1.0\r\n"
    assert mr.status_line("readonly") == b"READONLY\r\n"


def test_unknown_command_reason_is_short_and_printable():
    err = parse_all(b"\x01" * 500 + b"\r\n")[0]
    assert err.reply.startswith(b"CLIENT_ERROR unknown command: \\x01") and len(err.reply) < 300
    assert b"\n" not in err.reply[:-1]


QUEUE_KEYS = ["items", "bytes", "total_items", "logsize", "expired_items", "mem_items", "mem_bytes",
              "age", "discarded", "waiters", "open_transactions", "transactions",
              "canceled_transactions", "total_flushes", "journal_rewrites", "journal_rotations"]


def test_encode_stats_matches_the_reference_example():
    glob = [("uptime", 3), ("time", 1700000000), ("version", "v"), ("curr_items", 1)]
    q = [(k, 0) for k in QUEUE_KEYS]
    out = mr.encode_stats(glob, [("q", q)])
    lines = out.split(b"\r\n")
    assert lines[:4] == [b"STAT uptime 3", b"STAT time 1700000000", b"STAT version v", b"STAT curr_items 1"]
    assert lines[4] == b"STAT queue_q_items 0" and lines[19] == b"STAT queue_q_journal_rotations 0"
    assert out.endswith(b"STAT queue_q_journal_rotations 0\r\nEND\r\n")


def test_encode_stats_alias_and_children():
    out = mr.encode_stats([("uptime", 1)], [("a", [("put_items", 2), ("put_bytes", 9), ("children", "x,y")])])
    assert out == (b"STAT uptime 1\r\nSTAT queue_a_put_items 2\r\nSTAT queue_a_put_bytes 9\r\n"
                   b"STAT queue_a_children x,y\r\nEND\r\n")


def test_encode_stats_with_nothing():
    assert mr.encode_stats([], []) == b"\r\nEND\r\n"


def test_encode_dump_stats():
    out = mr.encode_dump_stats([("q", [("items", 1), ("bytes", 5)]), ("r", [("items", 0)])])
    assert out == (b"queue 'q' {\r\n  items=1\r\n  bytes=5\r\n}\r\n"
                   b"queue 'r' {\r\n  items=0\r\n}\r\nEND\r\n")


def test_encode_dump_stats_unknown_name_gives_a_two_space_line():
    expected = b"queue 'x' {\r\n  \r\n}\r\nEND\r\n"
    assert mr.encode_dump_stats([("x", None)]) == expected
    assert mr.encode_dump_stats([("x", [])]) == expected


def test_encode_dump_stats_with_no_queues_has_the_leading_crlf():
    assert mr.encode_dump_stats([]) == b"\r\nEND\r\n"


def test_encode_dump_config():
    out = mr.encode_dump_config([("q", [("max_items", 10), ("keep_journal", "true")]), ("e", [])])
    assert out == (b"queue 'q' {\r\n  max_items=10\r\n  keep_journal=true\r\n}\r\n"
                   b"queue 'e' {\r\n}\r\nEND\r\n")
    assert mr.encode_dump_config([]) == b"END\r\n"


def test_high_byte_queue_names_round_trip_through_encoders():
    name = b"\xe9\xff".decode("latin-1")
    assert mr.encode_dump_stats([(name, [("items", 0)])]).startswith(b"queue '\xe9\xff' {")
    assert b"STAT queue_\xe9\xff_items 0" in mr.encode_stats([], [(name, [("items", 0)])])


def test_binary_protocol_request_is_refused_and_closes():
    # a binary GET of key "q": magic 0x80, opcode 0, key length 1, ... (the 24-byte header)
    header = bytes([0x80, 0x00, 0x00, 0x01]) + bytes(4) + (1).to_bytes(4, "big") + bytes(12)
    (cmd,) = parse_all(header + b"q")
    assert type(cmd) is ProtocolError and cmd.close
    assert cmd.reply.startswith(b"CLIENT_ERROR ") and b"binary protocol" in cmd.reply


def test_binary_magic_only_counts_at_the_start_of_a_command():
    p = MemcacheParser()
    p.feed(b"set q 0 0 1\r\n\x80\r\nversion\r\n")
    cmds = list(p.commands())
    assert type(cmds[0]) is Set and cmds[0].data == b"\x80"
    assert type(cmds[1]) is Version


def test_a_streamed_body_fed_while_nothing_is_buffered_is_yielded_as_fed():
    """issue 8: copying each piece into the parser's buffer and out again was two copies of
    every 8 MiB body on the loop; bytes fed with nothing buffered are the piece itself."""
    p = mc.MemcacheParser(stream_over=1024)
    size = 3 * mc.STREAM_PIECE
    p.feed(b"set big 0 0 %d\r\n" % size)
    assert isinstance(p.next(), mc.SetHead)
    first = bytes(range(256)) * (mc.STREAM_PIECE // 256)
    p.feed(first)
    piece = p.next()
    assert piece.data is first and not piece.last and p.next() is None
    rest = b"r" * (2 * mc.STREAM_PIECE) + b"\r\nget big\r\n"     # the body's end and what follows
    p.feed(rest)
    piece = p.next()
    assert piece.data == rest[:2 * mc.STREAM_PIECE] and piece.last
    cmd = p.next()
    assert type(cmd) is mc.Get and cmd.keys[0].queue == "big" and p.next() is None


def test_a_piece_held_as_fed_keeps_its_place_before_later_bytes():
    p = mc.MemcacheParser(stream_over=1024)
    size = 2 * mc.STREAM_PIECE + 5
    p.feed(b"set big 0 0 %d\r\n" % size)
    p.next()
    a, b = b"a" * mc.STREAM_PIECE, b"b" * (mc.STREAM_PIECE + 5) + b"\r\n"
    p.feed(a)
    p.feed(b)                          # before the front took the first piece
    got = b""
    while (cmd := p.next()) is not None:
        got += cmd.data
    assert got == a + b[:-2] and p.buffered == 0
