"""A request bigger than the queue takes is refused as soon as its size is known, not after the
server buffered it whole (text put items: protocols/text.py; thrift put frames: protocols/thrift.py
`_check_put`).  Real `lanner serve`, raw sockets."""
import struct

import pytest

from lanner.perf.thrift_client import KestrelThrift
from tests.helpers import recv_exact, recv_until, start_server

pytestmark = pytest.mark.integration

CONFIG = '[queues."small"]\nmax_item_size = "1KiB"\n[queues."tiny"]\nmax_item_size = "1KiB"\n'


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    h = start_server(tmp_path_factory.mktemp("big-requests"), config=CONFIG, thrift=True)
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


def put_frame_head(queue: bytes, item_size: int) -> bytes:
    """The start of a framed strict-binary `put(queue, [one item of item_size bytes])` call: the
    frame length it announces, the header, the queue, the list and the item's length."""
    body = struct.pack(">I", 0x80010001) + struct.pack(">i", 3) + b"put" + struct.pack(">i", 7)
    body += b"\x0b\x00\x01" + struct.pack(">i", len(queue)) + queue
    body += b"\x0f\x00\x02\x0b" + struct.pack(">i", 1) + struct.pack(">i", item_size)
    total = len(body) + item_size + 1                       # + the item, then T_STOP
    return struct.pack(">i", total) + body


def test_a_thrift_put_frame_with_an_item_over_max_item_size_is_refused_before_it_arrives(server):
    s = server.connect(server.thrift_port)
    s.sendall(put_frame_head(b"tiny", 32 << 20) + b"z" * (64 << 10))   # announces 32 MiB
    size = struct.unpack(">i", recv_exact(s, 4))[0]
    reply = recv_exact(s, size)                              # answered with 64 KiB of it sent
    assert b"larger than max_item_size (1024) of queue 'tiny'" in reply
    s.settimeout(10)
    assert s.recv(1) == b""                                   # and closed
    s.close()
    c = KestrelThrift("127.0.0.1", server.thrift_port)       # the server serves others as before
    try:
        assert c.put("tiny", [b"a" * 1024, b"b"]) == 2
        assert [i.data for i in c.get("tiny", 10)] == [b"a" * 1024, b"b"]
    finally:
        c.close()
