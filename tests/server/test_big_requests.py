"""A request bigger than the queue takes is refused as soon as its size is known, not after the
server buffered it whole (text put items: protocols/text.py).  Real `lanner serve`, raw sockets."""
import pytest

from tests.helpers import recv_until, start_server

pytestmark = pytest.mark.integration

CONFIG = '[queues."small"]\nmax_item_size = "1KiB"\n'


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    h = start_server(tmp_path_factory.mktemp("big-requests"), config=CONFIG)
    yield h
    h.stop()


def test_a_text_put_item_over_max_item_size_is_refused_before_it_is_all_sent(server):
    s = server.connect(server.text_port)
    s.sendall(b"put small:\nok\n" + b"x" * (64 << 10))        # the item's line goes on and on
    got = recv_until(s, b"\n")                                # answered without its end
    assert got == b"-Item larger than 1024 bytes (max_item_size of queue 'small').\n"
    assert s.recv(1) == b""                                   # and closed
    s.close()
    t = server.connect(server.text_port)                     # the server serves others as before
    t.sendall(b"put small:\n" + b"y" * 1024 + b"\n\nget small\n")
    got = recv_until(t, b"\n")
    if got == b"+1\n":
        got += recv_until(t, b"\n")
    assert got == b"+1\n:" + b"y" * 1024 + b"\n"
    t.close()
