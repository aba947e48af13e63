"""Issue 11's fault-injection suite asks for "a client that sends 1M pipelined commands";
tests/server/test_flow_control.py pipelines 50,000 (its note said 300K).  Here a million, in
the default layout: every reply arrives, in order, and the process holding the connection
stays small."""
from __future__ import annotations

import threading

import pytest

from tests.helpers import start_server
from tests.server.conftest import Client
from tests.server.test_flow_control import peak_rss
from tests.server.test_issue3_recheck import holder

pytestmark = pytest.mark.integration

MiB = 1 << 20
PAIRS = 500_000                 # a set and a get each: 1M commands


def test_a_million_pipelined_commands_are_answered_in_full_and_in_order(tmp_path):
    h = start_server(tmp_path, workers=2)
    try:
        c = Client(h.connect())
        for _ in range(2):            # (the connection moves to the worker of `mp` first)
            assert c.ask(b"get mp\r\n", b"END\r\n") == b"END\r\n"
        proc = holder(h, c)
        before = peak_rss(proc)
        values = [b"%d" % i for i in range(PAIRS)]
        # each set's item taken by the next get: the queue stays short, so what the process
        # grows by is what it buffers, not items
        out = b"".join(b"set mp 0 0 %d\r\n%s\r\nget mp\r\n" % (len(v), v) for v in values)
        want = b"".join(b"STORED\r\nVALUE mp 0 %d\r\n%s\r\nEND\r\n" % (len(v), v) for v in values)
        c.sock.settimeout(120)
        sender = threading.Thread(target=c.sock.sendall, args=(out,), daemon=True)
        sender.start()
        got = c.recv_n(len(want), timeout=120)
        sender.join(10)
        assert len(got) == len(want), f"{len(got)} of {len(want)} reply bytes"
        assert got == want, "the replies differ from the commands' order"
        assert c.ask(b"get mp\r\n", b"END\r\n") == b"END\r\n"
        assert holder(h, c).pid == proc.pid
        growth = peak_rss(proc) - before
        print(f"1M pipelined commands: {proc.name()} peak RSS growth {growth / MiB:.1f} MiB")
        assert growth < 64 * MiB, f"{proc.name()} grew {growth / MiB:.1f} MiB"
    finally:
        assert h.stop() == 0
