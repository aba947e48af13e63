"""Issue 12's user-visible promises, rechecked on a real `lanner serve` in the default layout
(two workers that serve clients, no dedicated front), where the hot path now runs inline:
the reload bug stays fixed on inline and routed requests alike, `storage = "cmdlog"` with
`keep_journal = false` keeps the queue in memory in the server too, the binary protocol is
refused with `CLIENT_ERROR` and a close, and a queue created at runtime says so in the log."""
from __future__ import annotations

import os

import pytest

from lanner.queues.placement import worker_of
from tests.helpers import start_server
from tests.server.conftest import Client

pytestmark = pytest.mark.integration

WORKERS = 2


def one_queue_per_worker(prefix: str) -> list[str]:
    """A queue name owned by each worker, so that one connection runs requests inline on its
    own worker and routed to the other (and is never handed off: it uses both)."""
    found: dict[int, str] = {}
    i = 0
    while len(found) < WORKERS:
        name = f"{prefix}{i}"
        found.setdefault(worker_of(name, WORKERS), name)
        i += 1
    return [found[w] for w in range(WORKERS)]


def ask_each(server, command: bytes, queues: list[str], expect: bytes) -> None:
    """`command % queue` for each queue on one connection, each answered `expect`."""
    c = Client(server.connect())
    try:
        for q in queues:
            assert c.ask(command % q.encode()) == expect, q
    finally:
        c.close()


def test_connections_on_every_worker_follow_a_reloaded_max_item_size(tmp_path):
    server = start_server(tmp_path, workers=WORKERS, config="[default]\nmax_item_size = 10\n")
    try:
        queues = one_queue_per_worker("r")
        # enough connections that SO_REUSEPORT gives each worker some (each keeps its socket:
        # a connection using both workers' queues is never handed off)
        olds = [Client(server.connect()) for _ in range(8)]
        body = b"x" * 20
        for c in olds:
            for q in queues:
                assert c.ask(b"set %s 0 0 20\r\n%s\r\n" % (q.encode(), body)) == b"NOT_STORED\r\n"
        text = Client(server.connect(server.text_port))
        refused = text.ask(b"put %s:\n%s\n\n" % (queues[0].encode(), body), b"\n")
        assert refused == b"+0\n", refused
        with open(server.args[server.args.index("--config") + 1], "w") as f:
            f.write("[default]\nmax_item_size = 100\n")
        assert Client(server.connect()).ask(b"reload\r\n") == b"Reloaded config.\r\n"
        for c in olds:
            for q in queues:
                assert c.ask(b"set %s 0 0 20\r\n%s\r\n" % (q.encode(), body)) == b"STORED\r\n", q
        assert text.ask(b"put %s:\n%s\n\n" % (queues[1].encode(), body), b"\n") == b"+1\n"
        for c in (*olds, text):
            c.close()
    finally:
        assert server.stop() == 0


def test_cmdlog_storage_without_keep_journal_is_memory_in_the_server(tmp_path):
    """Issue 12: library use got memory storage while the server got a command log."""
    config = '[default]\nstorage = "cmdlog"\nkeep_journal = false\n'
    server = start_server(tmp_path, workers=WORKERS, config=config)
    try:
        ask_each(server, b"set %s 0 0 2\r\nhi\r\n", one_queue_per_worker("m"), b"STORED\r\n")
    finally:
        assert server.stop() == 0
    files = [os.path.join(d, f) for d, _, fs in os.walk(server.queue_path) for f in fs]
    assert [os.path.relpath(f, server.queue_path) for f in files] == [os.path.join(".lanner", "server.lock")]
    again = start_server(tmp_path, workers=WORKERS, config=config, queue_path=server.queue_path)
    try:                                                 # memory: gone with the restart
        ask_each(again, b"get %s\r\n", one_queue_per_worker("m"), b"END\r\n")
    finally:
        assert again.stop() == 0


def test_a_binary_protocol_request_gets_client_error_and_a_close(tmp_path):
    server = start_server(tmp_path, workers=WORKERS)
    try:
        for _ in range(4):                       # on whichever worker the connection lands
            c = Client(server.connect())
            # a binary `get` of key "abc": magic 0x80, opcode 0, key length 3, body length 3
            c.send(bytes([0x80, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 3]) + bytes(12) + b"abc")
            reply = c.recv_until(b"\r\n")
            assert reply.startswith(b"CLIENT_ERROR ") and b"binary protocol" in reply, reply
            assert c.is_closed()
            c.close()
    finally:
        assert server.stop() == 0


def test_a_queue_created_at_runtime_logs_new_queue(tmp_path):
    server = start_server(tmp_path, workers=WORKERS)
    try:
        ask_each(server, b"set %s 0 0 1\r\nx\r\n", one_queue_per_worker("fresh"), b"STORED\r\n")
    finally:
        assert server.stop() == 0
    log = server.log()
    for q in one_queue_per_worker("fresh"):
        assert f"queue '{q}': new queue" in log, log[-3000:]
        assert f"queue '{q}': replayed" not in log
