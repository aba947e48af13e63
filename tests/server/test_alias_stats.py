"""Alias accounting is the collection's, in the server too (issue 12: it was written twice)."""
import pytest

from tests.helpers import start_server
from tests.server.conftest import Client

pytestmark = pytest.mark.integration


def test_alias_puts_are_counted_once_and_reported(tmp_path):
    cfg = '[aliases."everything"]\ndestinations = ["a", "b"]\n'
    h = start_server(tmp_path, workers=2, config=cfg)
    try:
        c = Client(h.connect())
        assert c.ask(b"set everything 0 0 3\r\nabc\r\n") == b"STORED\r\n"
        assert c.ask(b"set everything 0 0 2\r\nde\r\n") == b"STORED\r\n"
        stats = c.ask(b"stats\r\n", b"END\r\n")
        for line in (b"STAT queue_everything_put_items 2\r\n", b"STAT queue_everything_put_bytes 5\r\n",
                     b"STAT queue_everything_children a,b\r\n", b"STAT queue_a_items 2\r\n"):
            assert line in stats, stats
    finally:
        h.stop()
