"""Read-behind through a real `lanner serve` with a tiny max_memory_size: big items (read in
place, codec.py `Cursor._read_big`) and small ones come back in order with their bytes, over
memcache, raw sockets, across journal rotations."""
import signal

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


def _stat(s, name: bytes) -> dict:
    s.sendall(b"stats\r\n")
    out = {}
    for line in recv_until(s, b"END\r\n").split(b"\r\n"):
        parts = line.split()
        if len(parts) == 3 and parts[1].startswith(b"queue_" + name + b"_"):
            out[parts[1][len(b"queue_" + name + b"_"):].decode()] = parts[2].decode()
    return out


def test_a_flushed_read_behind_queue_stays_empty_after_kill_9(tmp_path):
    """Issue 8: the flush drops what only the journal holds without reading it back; its
    records still say so, so kill -9 and a restart find only what was set after it."""
    config = '[default]\nmax_memory_size = "16KiB"\nsync_journal = "always"\n'
    server = start_server(tmp_path, config=config)
    try:
        s = server.connect()
        body = b"." * 1000
        s.sendall(b"".join(b"set fq 0 0 %d\r\n%s\r\n" % (len(body), body) for _ in range(300)))
        got = b""
        while got.count(b"STORED\r\n") < 300:
            got += s.recv(65536)
        assert got == b"STORED\r\n" * 300
        before = _stat(s, b"fq")
        assert before["items"] == "300" and int(before["mem_items"]) < 30
        s.sendall(b"flush fq\r\n")
        assert recv_until(s, b"\r\n") == b"END\r\n"          # Kestrel's reply to flush
        after = _stat(s, b"fq")
        assert (after["items"], after["bytes"], after["mem_items"]) == ("0", "0", "0")
        s.sendall(b"set fq 0 0 5\r\nafter\r\n")
        assert recv_until(s, b"\r\n") == b"STORED\r\n"
        s.close()
    finally:
        server.stop(signal.SIGKILL)
    server = start_server(tmp_path, config=config)
    try:
        s = server.connect()
        assert _stat(s, b"fq")["items"] == "1"
        s.sendall(b"get fq\r\n")
        assert recv_until(s, b"END\r\n") == b"VALUE fq 0 5\r\nafter\r\nEND\r\n"
        s.sendall(b"get fq\r\n")
        assert recv_until(s, b"END\r\n") == b"END\r\n"
        s.close()
    finally:
        server.stop()
