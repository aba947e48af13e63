"""Read-behind through a real `lanner serve` with a tiny max_memory_size: big items (read in
place, codec.py `Cursor._read_big`) and small ones come back in order with their bytes, over
memcache, raw sockets, across journal rotations."""
import pytest

from tests.helpers import recv_exact, recv_until, start_server

pytestmark = pytest.mark.integration


def test_big_and_small_items_come_back_in_order_from_read_behind(tmp_path):
    server = start_server(tmp_path, config='[default]\nmax_memory_size = "64KiB"\n')
    try:
        s = server.connect()
        items = []
        for k in range(12):
            data = (b"%03d" % k) * ((700 << 10) // 3 if k % 3 == 0 else 5)
            items.append(data)
            s.sendall(b"set rbq 0 0 %d\r\n" % len(data) + data + b"\r\n")
            assert recv_until(s, b"\r\n") == b"STORED\r\n"
        for data in items:
            s.sendall(b"get rbq\r\n")
            head = recv_until(s, b"\r\n")
            assert head.startswith(b"VALUE rbq 0 %d\r\n" % len(data))
            n = int(head.split(b"\r\n")[0].split()[-1])
            rest = head[head.index(b"\r\n") + 2:]
            body = rest + recv_exact(s, n + 7 - len(rest))
            assert body == data + b"\r\nEND\r\n"
        s.sendall(b"get rbq\r\n")
        assert recv_until(s, b"END\r\n") == b"END\r\n"
        s.close()
    finally:
        server.stop()
