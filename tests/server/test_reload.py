"""Issue 11, defect 8 and issue 12's reload bug, against a real server: `reload` of a bad file
answers an error naming the key (never the file's path) and keeps the old config everywhere;
a file that is not TOML, or not a file at all, is an error, not a hang; connections opened
before a reload follow the new queue settings."""
from __future__ import annotations

import os
import signal

import psutil
import pytest

from tests.helpers import start_server
from tests.server.conftest import Client

pytestmark = pytest.mark.integration

CONFIG = "[default]\nmax_item_size = 10\n"


@pytest.fixture
def server(tmp_path):
    h = start_server(tmp_path, workers=2, fronts=2, config=CONFIG)
    yield h
    h.stop()


def config_path(server) -> str:
    return server.args[server.args.index("--config") + 1]


def client(server) -> Client:
    return Client(server.connect())


def set20(c: Client) -> bytes:
    return c.ask(b"set r 0 0 20\r\n" + b"x" * 20 + b"\r\n")


def test_a_connection_opened_before_reload_follows_the_new_max_item_size(server):
    old = client(server)
    assert set20(old) == b"NOT_STORED\r\n"
    with open(config_path(server), "w") as f:
        f.write("[default]\nmax_item_size = 100\n")
    assert client(server).ask(b"reload\r\n") == b"Reloaded config.\r\n"
    assert set20(old) == b"STORED\r\n"            # main: NOT_STORED until reconnecting
    assert set20(client(server)) == b"STORED\r\n"


@pytest.mark.parametrize("content, reason", [
    (b"[default]\nmax_item_size = 100\nbogus_key = 1\n", b"default.bogus_key: unknown key"),
    (b"[queues.r]\nmax_itemsize = 100\n", b"queues.r.max_itemsize: unknown key"),
    (b"this is not toml {{{\n", b"invalid TOML"),
    (bytes(range(256)) * 8, b"invalid TOML: not UTF-8"),
    (b'[default]\nmax_item_size = 100\nexpire_to_queue = "dead.letters"\n', b"default.expire_to_queue: Queue"),
])
def test_a_bad_file_is_an_error_naming_the_key_and_changes_nothing(server, content, reason):
    c = client(server)
    with open(config_path(server), "wb") as f:
        f.write(content)
    reply = c.ask(b"reload\r\n")
    assert reply.startswith(b"SERVER_ERROR reload failed: " + reason), reply
    assert reply.endswith(b"\r\n") and reply.count(b"\r\n") == 1
    assert os.path.dirname(config_path(server)).encode() not in reply     # no server path
    assert c.ask(b"version\r\n").startswith(b"VERSION ")      # the connection stays open
    # the old config is in force everywhere: fronts (the parser's item limit) and workers
    for _ in range(4):
        assert set20(client(server)) == b"NOT_STORED\r\n"
    assert "reload failed" in server.log()


def test_a_config_path_that_is_not_a_regular_file_does_not_hang(server):
    path = config_path(server)
    os.unlink(path)
    os.mkfifo(path)                   # opening a FIFO for reading blocks until a writer comes
    c = client(server)
    reply = c.ask(b"reload\r\n")
    assert reply == b"SERVER_ERROR reload failed: the config file is not a regular file\r\n"
    assert set20(client(server)) == b"NOT_STORED\r\n"


def front_pid_of(server, sock) -> int:
    """The pid of the server process holding the other end of client socket `sock`."""
    here = sock.getsockname()
    for child in psutil.Process(server.proc.pid).children():
        for c in child.net_connections(kind="tcp"):
            if c.raddr and tuple(c.raddr) == here:
                return child.pid
    raise AssertionError(f"no server process holds the connection from {here}")


def test_reloaded_means_every_front_applies_the_new_config_to_the_next_request(server):
    """The reply waits for no relay by the supervisor: stopped, it relays nothing, and still
    every connection on every front (dedicated or a worker's) follows the new limit."""
    olds = [client(server) for _ in range(16)]
    for c in olds:
        assert c.ask(b"version\r\n").startswith(b"VERSION ")    # accepted by its front
    asker = client(server)
    assert asker.ask(b"version\r\n").startswith(b"VERSION ")
    pids = {front_pid_of(server, c.sock) for c in olds}
    assert pids - {front_pid_of(server, asker.sock)}, "every connection landed on one front"
    with open(config_path(server), "w") as f:
        f.write("[default]\nmax_item_size = 100\n")
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        assert asker.ask(b"reload\r\n") == b"Reloaded config.\r\n"
        # main: NOT_STORED on the fronts the stopped supervisor has not told yet
        assert [set20(c) for c in olds] == [b"STORED\r\n"] * len(olds)
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)


def test_reload_replaces_aliases_reclamps_max_age_and_keeps_expire_targets(tmp_path):
    """Reference §5.7 (reload replaces the alias set), §5.2 and §7.2 (the current max_age is
    re-applied at every check, so a shorter one expires old items, a fanout child inheriting
    it; an expire_to_queue target already bound does not move)."""
    h = start_server(tmp_path, workers=2, config='[aliases."al"]\ndestinations = ["d1"]\n'
                                                 '[queues."src"]\nexpire_to_queue = "dst1"\n')
    try:
        c = client(h)
        for q in (b"al", b"old", b"par", b"par+ch"):
            assert c.ask(b"set %s 0 0 1\r\nx\r\n" % q) == b"STORED\r\n"
        assert c.ask(b"get src\r\n") == b"END\r\n"               # src exists: its target is bound
        with open(config_path(h), "w") as f:
            f.write('[aliases."al2"]\ndestinations = ["d2"]\n[queues."src"]\nexpire_to_queue = "dst2"\n'
                    '[queues."old"]\nmax_age = "1ms"\n[queues."par"]\nmax_age = "1ms"\n')
        assert c.ask(b"reload\r\n") == b"Reloaded config.\r\n"
        assert c.ask(b"set al 0 0 1\r\ny\r\n") == b"STORED\r\n"  # al is a queue now
        assert c.ask(b"set al2 0 0 1\r\nz\r\n") == b"STORED\r\n"
        assert c.ask(b"get al\r\n", b"END\r\n") == b"VALUE al 0 1\r\ny\r\nEND\r\n"
        assert c.ask(b"get d2\r\n", b"END\r\n") == b"VALUE d2 0 1\r\nz\r\nEND\r\n"
        assert c.ask(b"get d1\r\n", b"END\r\n") == b"VALUE d1 0 1\r\nx\r\nEND\r\n"
        assert c.ask(b"get d1\r\n", b"END\r\n") == b"END\r\n"
        for q in (b"old", b"par", b"par+ch"):                    # stored before, expired by the reload
            assert c.ask(b"get %s\r\n" % q, b"END\r\n") == b"END\r\n", q
        assert c.ask(b"set src 0 -1 1\r\ne\r\n") == b"STORED\r\n"
        assert c.ask(b"get src\r\n", b"END\r\n") == b"END\r\n"
        assert c.ask(b"get dst2\r\n", b"END\r\n") == b"END\r\n"
        assert c.ask(b"get dst1\r\n", b"END\r\n") == b"VALUE dst1 0 1\r\ne\r\nEND\r\n"
    finally:
        assert h.stop() == 0
