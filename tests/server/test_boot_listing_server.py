"""A real server over a queue directory holding archives and a pack to finish (issue 8: the
worker lists the directory once and hands each queue its files): the items come back as
before, and thousands of queues created after start are each served."""
import os

from lanner.queues.item import QItem
from lanner.storage.journal.codec import encode_add
from tests.helpers import recv_until, start_server


def test_archives_at_start_replay_and_new_queues_are_served(tmp_path):
    qdir = tmp_path / "queues"
    qdir.mkdir()
    add = lambda d: encode_add(QItem(1_700_000_000_000, 0, d))     # noqa: E731
    (qdir / "q.100").write_bytes(add(b"A") + add(b"B"))
    (qdir / "q.200.pack").write_bytes(add(b"B"))        # summary of q.100: A was removed
    (qdir / "q.300").write_bytes(add(b"C"))
    (qdir / "q").write_bytes(add(b"D"))
    srv = start_server(tmp_path, workers=2)
    try:
        s = srv.connect(srv.memcache_port)
        n = 2000
        s.sendall(b"".join(b"set n%05d 0 0 1\r\nv\r\n" % i for i in range(n)))
        got = b""
        while got.count(b"STORED\r\n") < n:
            got += s.recv(65536)
        assert got == b"STORED\r\n" * n
        for want in (b"B", b"C", b"D"):
            s.sendall(b"get q\r\n")
            assert recv_until(s, b"END\r\n") == b"VALUE q 0 1\r\n" + want + b"\r\nEND\r\n"
        s.sendall(b"get n01999\r\n")
        assert recv_until(s, b"END\r\n") == b"VALUE n01999 0 1\r\nv\r\nEND\r\n"
        assert sorted(f for f in os.listdir(qdir) if f.startswith("q")) == ["q", "q.200", "q.300"]
    finally:
        assert srv.stop() == 0
