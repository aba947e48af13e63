"""client_timeout through a real `lanner serve` (reference: finagle's read timeout): a connection
that sends nothing for that long is closed, a blocking get in progress included (its item is not
lost), while one that keeps sending stays open however long it lives."""
from __future__ import annotations

import socket
import time

import pytest

from tests.helpers import LAYOUTS, start_server, wait_for

TIMEOUT_MS = 1500


def closed(sock: socket.socket) -> bool:
    sock.settimeout(0.05)
    try:
        return sock.recv(4096) == b""
    except socket.timeout:
        return False
    except ConnectionResetError:
        return True


@pytest.mark.parametrize("layout", ["embedded", "dedicated"])
def test_idle_connections_close_and_busy_ones_stay(tmp_path, layout):
    srv = start_server(tmp_path, layout=layout, config=f"[server]\nclient_timeout = {TIMEOUT_MS}\n")
    try:
        idle = srv.connect()
        waiting = srv.connect()
        waiting.sendall(b"get q/t=60000\r\n")
        busy = srv.connect()
        started = time.monotonic()

        def still_busy() -> bool:
            busy.settimeout(10)
            busy.sendall(b"version\r\n")
            assert busy.recv(4096).startswith(b"VERSION")
            return closed(idle) and closed(waiting)

        assert wait_for(still_busy, timeout=30)
        assert time.monotonic() - started >= TIMEOUT_MS / 1000 * 0.9
        while time.monotonic() - started < 2.5 * TIMEOUT_MS / 1000:      # outlives the timeout
            still_busy()
        busy.sendall(b"set q 0 0 1\r\nx\r\n")
        assert busy.recv(4096) == b"STORED\r\n"
        busy.sendall(b"get q\r\n")                   # not taken by the closed waiter
        got = b""
        while not got.endswith(b"END\r\n"):
            got += busy.recv(4096)
        assert got == b"VALUE q 0 1\r\nx\r\nEND\r\n"
        for s in (idle, waiting, busy):
            s.close()
    finally:
        assert srv.stop() == 0
