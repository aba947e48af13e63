"""The three ways a user stops `lanner serve` short of SIGTERM: the memcache `shutdown` command
(close, no bytes: reference §1.3), the text `shutdown` command (`+0\\n`: §2.2) and SIGINT
(contract.md: clean shutdown, exit status 0).  Each must exit 0 with what was stored kept."""
import signal

import pytest

from tests.helpers import start_server
from tests.server.conftest import Client

pytestmark = pytest.mark.integration


def _memcache(h):
    c = Client(h.connect())
    c.send(b"shutdown\r\n")
    assert c.is_closed(10), "shutdown must close the connection"
    assert c.buf == b"", "shutdown must close without writing a byte"


def _text(h):
    t = Client(h.connect(h.text_port))
    assert t.ask(b"shutdown\n", b"\n") == b"+0\n"


def _sigint(h):
    h.proc.send_signal(signal.SIGINT)


@pytest.mark.parametrize("stop", [_memcache, _text, _sigint], ids=["memcache", "text", "sigint"])
def test_shutdown_exits_0_and_keeps_the_items(tmp_path, stop):
    h = start_server(tmp_path)
    c = Client(h.connect())
    assert c.ask(b"set sd 0 0 3\r\nabc\r\n") == b"STORED\r\n"
    stop(h)
    try:
        assert h.proc.wait(30) == 0
    finally:
        h.stop()
    again = start_server(tmp_path)
    try:
        assert Client(again.connect()).ask(b"get sd\r\n", b"END\r\n") == b"VALUE sd 0 3\r\nabc\r\nEND\r\n"
    finally:
        assert again.stop() == 0
