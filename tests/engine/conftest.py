"""Fixtures shared by the in-process storage and worker tests."""
import os
import socket

import pytest

from lanner.config import Config, QueueConfig, ServerConfig
from lanner.ipc.messages import pack_req, unpack_resp
from lanner.server import worker as W
from lanner.server.worker import Worker
from lanner.storage.writer import Writer


@pytest.fixture
def writer():
    """A worker's writer thread (storage/writer.py) whose wake-ups go into a pipe nobody reads."""
    r, w = os.pipe()
    wr = Writer(w)
    yield wr
    wr.close()
    os.close(r)
    os.close(w)


class Status:
    def blocks_reads(self) -> bool:
        return False

    def blocks_writes(self) -> bool:
        return False


class CapturingWorker(Worker):
    """Keeps the replies it would publish in `published` (a test's worker: a subclass without
    slots has a dict)."""

    def boot(self) -> None:
        self.published = []
        super().boot()

    def publish(self, replies) -> None:
        self.published.extend(replies)


@pytest.fixture
def worker(tmp_path, clock, monkeypatch):
    """A booted worker without a loop: requests go to `handle`, replies are captured in
    `published` instead of being published."""
    made = []

    def make(uring=W.open_uring, **default):
        """`uring`: what makes the syncer's io_uring (storage/uring.py); None for its fsync threads,
        which call the journal's `_fsync` that tests inject."""
        cfg = Config(server=ServerConfig(queue_path=str(tmp_path / "queues")), default=QueueConfig(**default))
        a, b = socket.socketpair()
        monkeypatch.setattr(W, "open_uring", uring or (lambda: None))
        w = CapturingWorker(0, 1, cfg, Status(), [None], [None], -1, a, None, clock=clock, nfronts=1)
        w.boot()
        made.append((w, a, b))
        return w
    yield make
    for w, a, b in made:
        if not w.coll.closed:
            w.coll.close()
        w.release()
        a.close()
        b.close()


def req(conn, op, queue, flags=0, a=0, b=0, payload=b"", n=1):
    """A request record as a front puts it in a worker's ring (ipc/messages.py)."""
    q = queue.encode()
    return pack_req(conn, n, op, flags, len(q), a, b) + q + payload


def published(w) -> list[tuple]:
    """(conn, status, flags, value, payload) of each reply `w` published, oldest first, taken
    (the tests' workers capture their replies in `published` instead of sending them)."""
    out = []
    for _, head, payload in w.published:
        conn, _req, status, flags, _, value = unpack_resp(head, 0)
        out.append((conn, status, flags, value, bytes(payload)))
    w.published.clear()
    return out
