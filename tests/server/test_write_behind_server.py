"""A real `lanner serve` with one worker (every queue is its): 8 MiB sets are written by the
worker's writer thread (storage/writer.py), and the protocol's rules hold around them."""
import pytest

from tests.helpers import recv_exact, recv_until, start_server

pytestmark = pytest.mark.integration

BIG = 8 << 20


def test_replies_keep_request_order_across_queues_with_a_big_write_in_flight(tmp_path):
    qp = str(tmp_path / "queues")
    big = bytes(range(256)) * (BIG // 256)
    h = start_server(tmp_path, workers=1, queue_path=qp)
    try:
        a, b = h.connect(), h.connect()
        # one write: an 8 MiB set on `big`, then small sets on another queue, pipelined
        a.sendall(b"set big 0 0 %d\r\n%s\r\nset small 0 0 1\r\n1\r\nset small 0 0 1\r\n2\r\n" % (BIG, big))
        b.sendall(b"set other 0 0 1\r\nb\r\n")                   # another connection meanwhile
        assert recv_until(b, b"\r\n") == b"STORED\r\n"
        assert recv_exact(a, 24) == b"STORED\r\nSTORED\r\nSTORED\r\n"   # in request order
        a.close()
        b.close()
    finally:
        assert h.stop() == 0
    h = start_server(tmp_path, workers=1, queue_path=qp)           # what was written behind is there
    try:
        c = h.connect()
        c.sendall(b"get big\r\nget small\r\nget small\r\nget other\r\n")
        want = b"VALUE big 0 %d\r\n%s\r\nEND\r\n" % (BIG, big)
        assert recv_exact(c, len(want)) == want
        assert recv_exact(c, 3 * 25) == b"".join(b"VALUE %s 0 1\r\n%s\r\nEND\r\n" % kv
                                               for kv in ((b"small", b"1"), (b"small", b"2"), (b"other", b"b")))
        c.close()
    finally:
        h.stop()
