"""The error catalogue of reference §1.7 and §2.1-2.2, row by row, against a real server: for each
bad request, the reply's keyword and whether the connection then closes are Kestrel's (deviation 1
lets Lanner add a reason after the keyword, and write `CLIENT_ERROR <reason>` where Kestrel closed
without a word).  The other server tests check most of these replies' first bytes; this file pins
the connection's state after each one, which is what a client's pool acts on."""
import os
import time

import pytest

from tests.server.conftest import Client

pytestmark = pytest.mark.integration

CLOSES, STAYS = True, False

# (request, the reply's first bytes, whether the server then closes the connection)
MEMCACHE = [
    # unknown commands, an empty line, the storage commands Kestrel does not implement
    (b"bogus\r\n", b"CLIENT_ERROR", CLOSES),
    (b"\r\n", b"CLIENT_ERROR", CLOSES),
    (b"   \r\n", b"CLIENT_ERROR", CLOSES),
    (b"incr q 1\r\n", b"CLIENT_ERROR", CLOSES),
    (b"decr q 1\r\n", b"CLIENT_ERROR", CLOSES),
    (b"touch q 1\r\n", b"CLIENT_ERROR", CLOSES),
    (b"roll q\r\n", b"CLIENT_ERROR", CLOSES),
    (b"add q 0 0 1\r\nx\r\n", b"CLIENT_ERROR", CLOSES),
    (b"replace q 0 0 1\r\nx\r\n", b"CLIENT_ERROR", CLOSES),
    (b"append q 0 0 1\r\nx\r\n", b"CLIENT_ERROR", CLOSES),
    (b"prepend q 0 0 1\r\nx\r\n", b"CLIENT_ERROR", CLOSES),
    (b"cas q 0 0 1 7\r\nx\r\n", b"CLIENT_ERROR", CLOSES),
    # get: forbidden option pairs and an empty name close; unknown options are ignored
    (b"get /open\r\n", b"CLIENT_ERROR", CLOSES),
    (b"get q/peek/open\r\n", b"CLIENT_ERROR", CLOSES),
    (b"get q/peek/close\r\n", b"CLIENT_ERROR", CLOSES),
    (b"get q/abort/open\r\n", b"CLIENT_ERROR", CLOSES),
    (b"get q/close/abort\r\n", b"CLIENT_ERROR", CLOSES),
    (b"get q/peek/abort\r\n", b"CLIENT_ERROR", CLOSES),
    (b"get q/OPEN\r\n", b"END\r\n", STAYS),
    (b"get q/T=5\r\n", b"END\r\n", STAYS),
    (b"get q/\r\n", b"END\r\n", STAYS),
    (b"get q/t=0\r\n", b"END\r\n", STAYS),
    (b"get q/t=-5\r\n", b"END\r\n", STAYS),
    # a missing argument: CLIENT_ERROR, the connection stays (Kestrel HEAD)
    (b"get\r\n", b"CLIENT_ERROR", STAYS),
    (b"delete\r\n", b"CLIENT_ERROR", STAYS),
    (b"flush\r\n", b"CLIENT_ERROR", STAYS),
    (b"confirm\r\n", b"CLIENT_ERROR", STAYS),
    (b"confirm q\r\n", b"CLIENT_ERROR", STAYS),
    # ... except inside monitor and flush_expired, whose work Kestrel ran in a future
    (b"monitor\r\n", b"CLIENT_ERROR", CLOSES),
    (b"monitor q\r\n", b"CLIENT_ERROR", CLOSES),
    (b"flush_expired\r\n", b"CLIENT_ERROR", CLOSES),
    # numbers: set's flags are the one bad number that keeps the connection
    (b"set q x 0 1\r\nx\r\n", b"CLIENT_ERROR", STAYS),
    (b"set q 4294967296 0 1\r\nx\r\n", b"CLIENT_ERROR", STAYS),
    (b"set q 0 x 1\r\nx\r\n", b"CLIENT_ERROR", CLOSES),
    (b"set q 0 0 x\r\n", b"CLIENT_ERROR", CLOSES),
    (b"set q 0 0 -1\r\n", b"CLIENT_ERROR", CLOSES),
    (b"set q 0 0\r\n", b"CLIENT_ERROR", CLOSES),
    (b"get q/t=abc\r\n", b"CLIENT_ERROR", CLOSES),
    (b"get q/t=\r\n", b"CLIENT_ERROR", CLOSES),
    (b"get q/t=2147483648\r\n", b"CLIENT_ERROR", CLOSES),
    (b"confirm q abc\r\n", b"CLIENT_ERROR", CLOSES),
    (b"monitor q x\r\n", b"CLIENT_ERROR", CLOSES),
    (b"monitor q 1 x\r\n", b"CLIENT_ERROR", CLOSES),
    # confirm beyond what is open: ERROR, and the connection stays
    (b"confirm q 0\r\n", b"ERROR\r\n", STAYS),
    (b"confirm q 1\r\n", b"ERROR\r\n", STAYS),
    # status names
    (b"status bogus\r\n", b"CLIENT_ERROR", CLOSES),
    (b"status down\r\n", b"CLIENT_ERROR", CLOSES),
    # illegal queue names in set and in a fetching get
    (b"set a.b 0 0 1\r\nx\r\n", b"CLIENT_ERROR", CLOSES),
    (b"set a~b 0 0 1\r\nx\r\n", b"CLIENT_ERROR", CLOSES),
    (b"get a~b\r\n", b"CLIENT_ERROR", CLOSES),
    (b"get a\\\\b\r\n", b"CLIENT_ERROR", CLOSES),
    (b"get a.b/open\r\n", b"CLIENT_ERROR", CLOSES),
    (b"get a.b/peek\r\n", b"CLIENT_ERROR", CLOSES),
    # the two bytes after a data block are not checked
    (b"set %(q)s 0 0 1\r\nxAB", b"STORED\r\n", STAYS),
    (b"quit\r\n", b"", CLOSES),
]

TEXT = [
    (b"get\n", b"-Queue name required.\n", STAYS),
    (b"peek\n", b"-Queue name required.\n", STAYS),
    (b"flush\n", b"-Queue name required.\n", STAYS),
    (b"delete\n", b"-Queue name required.\n", STAYS),
    (b"put:\n\n", b"-Queue name required.\n", STAYS),
    (b"put %(q)s x:\na\n\n", b"-Error parsing expiration time.\n", STAYS),
    (b"get %(q)s x\n", b"-Error parsing timeout.\n", STAYS),
    (b"peek %(q)s x\n", b"-Error parsing timeout.\n", STAYS),
    (b"monitor %(q)s\n", b"-Queue name & timeout required.\n", STAYS),
    (b"confirm %(q)s\n", b"-Queue name & count required.\n", STAYS),
    (b"confirm %(q)s 0\n", b"-Not that many transactions open.\n", STAYS),
    (b"confirm %(q)s 1\n", b"-Not that many transactions open.\n", STAYS),
    (b"status bogus\n", b"-Unknown status.\n", STAYS),
    (b"status down\n", b"-Status forbidden.\n", STAYS),
    (b"FOO bar\n", b"-Unknown command: foo\n", STAYS),
    (b"\n", b"-Unknown command: \n", STAYS),
    (b"flush_all\n", b"-Unknown command: flush_all\n", STAYS),
    (b"flush_expired %(q)s\n", b"-Unknown command: flush_expired\n", STAYS),
    (b"flush_all_expired\n", b"-Unknown command: flush_all_expired\n", STAYS),
    (b"roll %(q)s\n", b"-Unknown command: roll\n", STAYS),
    (b"reload\n", b"-Unknown command: reload\n", STAYS),
    (b"put %(q)s\n", b"+0\n", STAYS),
    # Kestrel's handler threw: the connection closes (Lanner may say why first, as `-<reason>`)
    (b"confirm %(q)s x\n", b"", CLOSES),
    (b"monitor %(q)s x\n", b"", CLOSES),
    (b"get a.b\n", b"", CLOSES),
    (b"put a/b:\nx\n\n", b"", CLOSES),
    (b"quit\n", b"", CLOSES),
]


def _qname() -> bytes:
    return b"ec%d" % time.monotonic_ns()


def _read_to_eof(c: Client, timeout: float = 10.0) -> bytes | None:
    """Everything the server writes before it closes, or None if it keeps the connection."""
    c.sock.settimeout(timeout)
    out, c.buf = c.buf, b""
    try:
        while chunk := c.sock.recv(65536):
            out += chunk
    except (ConnectionResetError, BrokenPipeError):
        pass
    except TimeoutError:
        return None
    return out


def _check(c: Client, probe: bytes, probe_reply: bytes, request: bytes, first: bytes, closes: bool,
           eol: bytes) -> None:
    c.send(request)
    if closes:
        out = _read_to_eof(c)
        assert out is not None, f"{request!r} must close the connection"
        assert out == first or (first and out.startswith(first) and out.count(eol) == 1) or \
            (not first and (out == b"" or out.startswith(b"-") and out.count(eol) == 1)), (request, out)
        return
    assert c.recv_until(eol).startswith(first), request
    assert c.ask(probe, eol).startswith(probe_reply), f"{request!r} must keep the connection"


@pytest.mark.parametrize("request_, first, closes", MEMCACHE, ids=[r[0].decode()[:30] for r in MEMCACHE])
def test_memcache_reply_and_connection_state(mc, request_, first, closes):
    q = _qname()
    _check(mc(), b"version\r\n", b"VERSION ", request_.replace(b"%(q)s", q), first, closes, b"\r\n")


@pytest.mark.parametrize("request_, first, closes", TEXT, ids=[r[0].decode()[:30] for r in TEXT])
def test_text_reply_and_connection_state(mc, server, request_, first, closes):
    q = _qname()
    _check(mc(server.text_port), b"version\n", b":", request_.replace(b"%(q)s", q), first, closes, b"\n")


@pytest.mark.parametrize("request_", [b"set %(q)s x 0 1\r\nx\r\n", b"set %(q)s 0 x 1\r\nx\r\n",
                                      b"get %(q)s/close\r\n", b"get %(q)s/abort\r\n",
                                      b"delete %(q)s\r\n", b"flush %(q)s\r\n", b"flush_expired %(q)s\r\n",
                                      b"confirm %(q)s 1\r\n", b"dump_stats %(q)s\r\n"])
def test_refused_and_non_creating_requests_create_no_queue(mc, request_):
    """Reference §1.3 (bad flags: "the queue is not created") and §5.1 (what never creates)."""
    q = _qname()
    c = mc()
    c.send(request_.replace(b"%(q)s", q))
    c.recv_until(b"\r\n")                  # the reply, or EOF: the request has been handled
    watcher = mc()
    assert watcher.ask(b"dump_stats %s\r\n" % q, b"END\r\n") == b"queue '%s' {\r\n  \r\n}\r\nEND\r\n" % q


@pytest.mark.parametrize("request_", [b"get a.b/close\r\n", b"get a~b/abort\r\n"])
def test_close_or_abort_only_get_of_an_illegal_name_answers_end(server, mc, request_):
    """Reference §1.4 (`q/close` and `q/abort` answer END whether or not anything was open, with no
    fetch) and §5.1 (the name is refused when a queue would be created; close and abort create
    none): END, the connection kept, and no file of that name."""
    c = mc()
    assert c.ask(request_) == b"END\r\n"
    assert c.ask(b"version\r\n").startswith(b"VERSION ")
    name = request_[4:].split(b"/")[0].decode()
    assert not [f for f in os.listdir(server.queue_path) if f.startswith(name)]
    fetch = mc()                # a fetch of the same name is still refused
    assert fetch.ask(b"get %s/open\r\n" % name.encode()).startswith(b"CLIENT_ERROR")
