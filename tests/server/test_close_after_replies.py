"""Issue 11, defect 2, against a real server: when a command closes the connection, every reply
earned before it is written first, in order, then its error line, then the close."""
from __future__ import annotations

import pytest

from tests.server.conftest import Client

pytestmark = pytest.mark.integration


def read_to_eof(c: Client, timeout: float = 10.0) -> bytes:
    c.sock.settimeout(timeout)
    out = c.buf
    c.buf = b""
    while True:
        chunk = c.sock.recv(65536)
        if not chunk:
            return out
        out += chunk


def test_get_then_bad_option_writes_the_value_then_the_error(mc):
    c = mc()
    assert c.ask(b"set d2jobs 0 0 5\r\nhello\r\n") == b"STORED\r\n"
    c.send(b"get d2jobs\r\nget d2jobs/t=abc\r\n")          # one packet
    assert read_to_eof(c) == (b"VALUE d2jobs 0 5\r\nhello\r\nEND\r\n"
                              b"CLIENT_ERROR bad t= value: t=abc\r\n")
    # the item was handed out: it is gone from the queue
    assert mc().ask(b"get d2jobs\r\n") == b"END\r\n"


def test_set_then_illegal_name_writes_stored_then_the_error(mc):
    c = mc()
    c.send(b"set d2q 0 0 1\r\na\r\nset d2/b 0 0 1\r\nb\r\n")
    out = read_to_eof(c)
    assert out.startswith(b"STORED\r\nCLIENT_ERROR Queue name contains illegal characters"), out
    assert out.count(b"\r\n") == 2
    assert mc().ask(b"get d2q\r\n", b"END\r\n") == b"VALUE d2q 0 1\r\na\r\nEND\r\n"


def test_bad_data_chunk_writes_stored_then_the_error(mc):
    """Checklist 15: 3 bytes declared, 5 sent; the first 3 are stored, the rest is a bad line."""
    c = mc()
    c.send(b"set d2chunk 0 0 3\r\nhello\r\n")
    assert read_to_eof(c) == b"STORED\r\nCLIENT_ERROR empty command line\r\n"
    assert mc().ask(b"get d2chunk\r\n", b"END\r\n") == b"VALUE d2chunk 0 3\r\nhel\r\nEND\r\n"


def test_pipeline_then_quit_answers_everything_first(mc):
    c = mc()
    c.send(b"set d2p 0 0 1\r\nx\r\nget d2p\r\nget d2p\r\nquit\r\n")
    assert read_to_eof(c) == b"STORED\r\nVALUE d2p 0 1\r\nx\r\nEND\r\nEND\r\n"


def test_text_put_then_illegal_name(mc, server):
    c = mc(server.text_port)
    c.send(b"put d2t:\nx\n\nget d2/t\n")
    out = read_to_eof(c)
    assert out.startswith(b"+1\n-Queue name contains illegal characters"), out


def test_nothing_after_a_worker_decided_close_is_executed(mc):
    """`get q/open` twice (the default maxOpenTransactions is 1): the second answers ERROR and
    closes, rolling the first back.  A plain `get` pipelined behind it must not run: its item
    would be removed from the queue and its VALUE thrown away with the connection."""
    setup = mc()
    for item in (b"a", b"b", b"c"):
        assert setup.ask(b"set d2w 0 0 1\r\n" + item + b"\r\n") == b"STORED\r\n"
    c = mc()
    c.send(b"get d2w/open\r\nget d2w/open\r\nget d2w\r\n")
    assert read_to_eof(c) == b"VALUE d2w/open 0 1\r\na\r\nEND\r\nERROR\r\n"
    check = mc()
    for item in (b"a", b"b", b"c"):
        assert check.ask(b"get d2w\r\n", b"END\r\n") == b"VALUE d2w 0 1\r\n" + item + b"\r\nEND\r\n"
