"""Past default_journal_size a journal is rewritten when its queue empties, and not before,
however many requests a queue that never empties serves in between (the rotation check then
waits for the empty queue, `check_due = WHEN_EMPTY`, instead of running per request: issue 8).
A real `lanner serve` (one worker), raw memcache sockets, Kestrel's stats."""
import os

import pytest

from tests.helpers import recv_exact, recv_until, start_server, wait_for

pytestmark = pytest.mark.integration

CONFIG = '[default]\ndefault_journal_size = "16KiB"\n'


def stats(s) -> dict[bytes, bytes]:
    s.sendall(b"stats\r\n")
    out = recv_until(s, b"END\r\n")
    return dict(line.split()[1:3] for line in out.split(b"\r\n") if line.startswith(b"STAT "))


def set_(s, data: bytes) -> None:
    s.sendall(b"set q 0 0 %d\r\n%s\r\n" % (len(data), data))
    assert recv_exact(s, 8) == b"STORED\r\n"


def get(s) -> bytes | None:
    s.sendall(b"get q\r\n")
    head = b""
    while not head.endswith(b"\r\n"):            # byte by byte: the body follows the line
        head += recv_exact(s, 1)
    if head == b"END\r\n":
        return None
    data = recv_exact(s, int(head.split()[3]) + 2)[:-2]
    assert recv_exact(s, 5) == b"END\r\n"
    return data


def test_a_journal_past_its_size_is_rewritten_when_the_queue_empties_and_not_before(tmp_path):
    h = start_server(tmp_path, config=CONFIG)
    try:
        s = h.connect()
        set_(s, b"first")
        for i in range(40):                  # 40 KB of records: past 16 KiB, never empty
            set_(s, b"%04d" % i * 256)
            assert get(s) == (b"first" if i == 0 else b"%04d" % (i - 1) * 256)
        st = stats(s)
        assert st[b"queue_q_journal_rewrites"] == b"0"
        assert int(st[b"queue_q_logsize"]) > 16 * 1024
        current = os.path.join(h.queue_path, "q")
        assert os.path.getsize(current) > 16 * 1024
        assert get(s) == b"0039" * 256          # the queue is empty now: the rewrite starts,
        assert os.path.getsize(current) == 0    # the current file archived before the reply

        def rewritten() -> bool:
            set_(s, b"after")                     # (the queue adopts a finished rewrite at its
            assert get(s) == b"after"             # next operation)
            return stats(s)[b"queue_q_journal_rewrites"] == b"1"
        assert wait_for(rewritten)
        assert int(stats(s)[b"queue_q_logsize"]) < 16 * 1024
        assert get(s) is None
        s.close()
    finally:
        h.stop()
