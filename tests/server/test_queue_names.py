"""Issue 11, defect 7, against a real server: names that passed validation but failed on disk
are refused up front with CLIENT_ERROR and the reason, and no reply ever carries a server path."""
from __future__ import annotations

import os

import pytest

from lanner.queues.names import MAX_FILE_NAME_BYTES
from tests.helpers import start_server
from tests.server.conftest import Client

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("names")
    # a tiny default journal size: an emptied queue rewrites its journal at once, which writes
    # the `~~<ms>` temporary and the `.<ms>.pack` file (the longest names Lanner makes)
    h = start_server(tmp, workers=2, fronts=1, config='[default]\ndefault_journal_size = "1KiB"\n')
    yield h
    h.stop()


def ask_and_close(server, data: bytes) -> bytes:
    c = Client(server.connect())
    c.send(data)
    c.sock.settimeout(10)
    out = b""
    while True:
        chunk = c.sock.recv(65536)
        if not chunk:
            break
        out += chunk
    c.close()
    return out


def no_path(server, reply: bytes) -> None:
    for p in (server.queue_path, os.path.dirname(server.queue_path), os.path.realpath(server.queue_path)):
        assert p.encode() not in reply, reply


#: the longest names a queue may have (test_the_longest_legal_names_take_every_journal_file)
LONGEST = [b"y" * MAX_FILE_NAME_BYTES, b"\xe9" * (MAX_FILE_NAME_BYTES // 2)]


def of_queue(f: str, name: bytes) -> bool:
    """Whether `f` in the queue directory is one of queue `name`'s files: its journal, an
    archive or pack `name.<ms>...`, a rewrite's temporary `name~~<ms>`."""
    q = name.decode("latin-1")
    return f == q or f.startswith(q + ".") or f.startswith(q + "~~")


@pytest.mark.parametrize("name", [
    b"\xe9" * 128,                           # 256 bytes on disk: main answered ENAMETOOLONG + path
    b"\xe9" * 255,
    b"x" * (MAX_FILE_NAME_BYTES + 1),        # 237-255 ASCII: main created them, never rotated
    b"x" * 255,
])
def test_names_too_long_for_the_disk_are_client_errors(server, name):
    reply = ask_and_close(server, b"set " + name + b" 0 0 1\r\na\r\n")
    assert reply.startswith(b"CLIENT_ERROR Queue name is too long for a journal file name"), reply
    no_path(server, reply)
    # (the module's server: the longest legal names' files are there if their test ran first)
    assert not [f for f in os.listdir(server.queue_path) if (f.startswith("xxxx") or "\xe9" in f)
                and not any(of_queue(f, legal) for legal in LONGEST)]


def test_cmdlog_is_a_client_error_not_an_internal_error(server):
    reply = ask_and_close(server, b"set cmdlog 0 0 1\r\na\r\n")
    assert reply.startswith(b"CLIENT_ERROR Queue name 'cmdlog' is reserved"), reply
    no_path(server, reply)
    reply = ask_and_close(server, b"get cmdlog\r\n")
    assert reply.startswith(b"CLIENT_ERROR Queue name 'cmdlog' is reserved"), reply
    assert "Traceback" not in server.log()


@pytest.mark.parametrize("name", LONGEST)
def test_the_longest_legal_names_take_every_journal_file(server, name):
    c = Client(server.connect())
    for i in range(40):                      # 40 x 100 bytes: past the 1 KiB journal size
        assert c.ask(b"set " + name + b" 0 0 100\r\n" + b"%100d" % i + b"\r\n") == b"STORED\r\n"
    for i in range(40):
        assert c.ask(b"get " + name + b"\r\n", b"END\r\n").endswith(b"%100d\r\nEND\r\n" % i)
    assert c.ask(b"get " + name + b"\r\n") == b"END\r\n"          # emptied: the journal is rewritten
    c.close()
    log = server.log()
    assert "File name too long" not in log and "rewrite skipped" not in log
    on_disk = os.fsencode(name.decode("latin-1"))
    assert any(os.fsencode(f).startswith(on_disk) for f in os.listdir(server.queue_path))


def test_an_os_error_reply_names_the_queue_and_the_errno_not_the_path(server):
    os.mkdir(os.path.join(server.queue_path, "leaky"))     # the journal cannot be a directory
    reply = ask_and_close(server, b"set leaky 0 0 1\r\na\r\n")
    assert reply == b"SERVER_ERROR Is a directory (queue 'leaky')\r\n", reply
    assert "leaky" in server.log()                          # the log still says which file
