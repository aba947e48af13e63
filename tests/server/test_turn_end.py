"""A worker's one connection ends the turn in data_received, not in a loop callback
(fronts/conn.py, server/shardloop.py; issue 8, per-turn costs).  Through a real `lanner serve`
with one worker: replies keep command order closed-loop and pipelined, a second connection that
joins is served beside the first, and an acknowledged set survives kill -9 of the worker right
after its STORED (its record reached the OS before the reply left)."""
from __future__ import annotations

import signal

from tests.helpers import start_server, wait_for
from tests.server.conftest import Client
from tests.server.test_local import worker_procs
from tests.server.test_processes import drain


def test_one_connection_in_order_beside_a_second_and_durable_across_kill_9(tmp_path):
    h = start_server(tmp_path, workers=1)
    try:
        c = Client(h.connect())
        for i in range(50):                              # closed loop: a turn per request
            assert c.ask(b"set q 0 0 2\r\n%02d\r\n" % i) == b"STORED\r\n"
            if i % 2:
                assert c.ask(b"get q\r\n", b"END\r\n") == b"VALUE q 0 2\r\n%02d\r\nEND\r\n" % (i // 2)
        c.send(b"set q 0 0 1\r\na\r\nget q\r\nset q 0 0 1\r\nb\r\nget q/peek\r\n")   # one write
        assert c.recv_until(b"END\r\n") == b"STORED\r\nVALUE q 0 2\r\n25\r\nEND\r\n"
        assert c.recv_until(b"END\r\n") == b"STORED\r\nVALUE q/peek 0 2\r\n26\r\nEND\r\n"
        d = Client(h.connect())                          # two connections: turns end in the loop
        d.send(b"set r 0 0 1\r\nx\r\n")
        assert c.ask(b"set r 0 0 1\r\ny\r\n") == b"STORED\r\n"
        assert d.recv_until(b"\r\n") == b"STORED\r\n"
        assert sorted(drain(d, b"r")) == [b"x", b"y"]
        d.sock.close()
        assert wait_for(lambda: c.ask(b"stats\r\n", b"END\r\n").count(b"STAT curr_connections 1\r\n") == 1)
        assert c.ask(b"set q 0 0 4\r\nlast\r\n") == b"STORED\r\n"
        [w0] = worker_procs(h)
        w0.send_signal(signal.SIGKILL)
        assert c.is_closed()
        assert wait_for(lambda: any(p.pid != w0.pid for p in worker_procs(h)))
        e = Client(h.connect())
        left = drain(e, b"q")
        assert left[-3:] == [b"a", b"b", b"last"] and len(left) == 27, left
    finally:
        h.stop()
