"""Big items through a real `lanner serve` (issue 8 P8's paths: replies written a slice per turn by
fronts/spill.py, the value sent from its own bytes, set bodies yielded as fed and assembled once,
journal records written from the item's bytes and chained on the writer thread): a client that
reads nothing for a while still gets every byte once, in order, and the close after them, while
another client is served meanwhile; items set in pipelined big sets replay byte for byte."""
from __future__ import annotations

import socket
import threading

import pytest

from tests.helpers import recv_exact, recv_until, start_server

pytestmark = pytest.mark.integration

MiB = 1 << 20


def item(n: int, size: int) -> bytes:
    """`size` bytes that differ from item to item and from place to place."""
    return (bytes([n]) * 7 + bytes(range(256)) * (size // 256 + 1))[:size]


def set_cmd(queue: str, data: bytes) -> bytes:
    return b"set %s 0 0 %d\r\n%s\r\n" % (queue.encode(), len(data), data)


def value(key: str, data: bytes) -> bytes:
    return b"VALUE %s 0 %d\r\n%s\r\nEND\r\n" % (key.encode(), len(data), data)


def test_big_replies_to_a_reader_that_waits_arrive_whole_in_order_then_the_close(tmp_path):
    server = start_server(tmp_path, workers=1)
    try:
        big = [item(1, 3 * MiB + 5), item(2, 5 * MiB)]
        setup = server.connect(timeout=30)
        setup.sendall(set_cmd("big", big[0]) + set_cmd("big", big[1]))
        assert recv_exact(setup, 16) == b"STORED\r\nSTORED\r\n"

        slow = server.connect(timeout=30)
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        slow.sendall(b"get big\r\nget big\r\nget none\r\nset s 0 0 1\r\nx\r\nget s\r\nquit\r\nget s\r\n")
        # while its 8 MB of replies wait in the server, another client is served
        other = server.connect(timeout=30)
        for i in range(20):
            other.sendall(b"set o 0 0 2\r\n%02d\r\nget o\r\n" % i)
            assert recv_until(other, b"END\r\n") == b"STORED\r\n" + value("o", b"%02d" % i)
        want = value("big", big[0]) + value("big", big[1]) + b"END\r\nSTORED\r\n" + value("s", b"x")
        got = bytearray()
        while True:
            chunk = slow.recv(256 << 10)
            if not chunk:
                break
            got += chunk
        assert len(got) == len(want) and bytes(got) == want     # and then EOF: the quit
    finally:
        server.stop()


def test_big_items_set_in_a_pipeline_replay_byte_for_byte(tmp_path):
    """Several big sets in one write: their ADDX records go to the writer thread from the items'
    own bytes, chained behind each other, small records between them; after a restart the
    queue replays exactly what was set."""
    server = start_server(tmp_path, workers=1)
    items = [item(i, (1 + i % 3) * MiB + i) for i in range(6)]
    try:
        c = server.connect(timeout=60)
        payload = b"".join(set_cmd("big", d) + set_cmd("small", b"s%d" % i) for i, d in enumerate(items))
        sender = threading.Thread(target=c.sendall, args=(payload,))
        sender.start()
        assert recv_exact(c, 8 * 2 * len(items)) == b"STORED\r\n" * 2 * len(items)
        sender.join()
        c.sendall(b"get big\r\n")
        assert recv_until(c, b"END\r\n") == value("big", items[0])
    finally:
        assert server.stop() == 0
    server = start_server(tmp_path, workers=1)
    try:
        c = server.connect(timeout=60)
        for d in items[1:]:
            c.sendall(b"get big\r\n")
            assert recv_until(c, b"END\r\n") == value("big", d)
        c.sendall(b"get big\r\nget small\r\n")
        assert recv_until(c, b"s0\r\nEND\r\n") == b"END\r\n" + value("small", b"s0")
    finally:
        server.stop()
