"""kill -9 of a worker while its journal rewrites run on the writer thread (issue 8: the rewrite's
fsyncs and renames left the loop; compaction.py `_rewrite`) loses nothing: an item held open
over many rewrites and the item stored just after the last rewrite started both come back.

A real `lanner serve` (one worker), raw memcache sockets.  default_journal_size is 64 KiB so
an emptying get of a 32 KiB item starts a rewrite; the kill follows the set that comes right
behind such a get, while that rewrite's fsyncs are most likely still under way."""
import signal

import pytest

from tests.faults.test_front_restart import pid_named
from tests.helpers import recv_exact, recv_until, start_server, wait_for

pytestmark = pytest.mark.integration

CONFIG = '[default]\ndefault_journal_size = "64KiB"\n'
ROUNDS = 3
BIG = b"x" * 32768


def set_(s, data: bytes) -> None:
    s.sendall(b"set q 0 0 %d\r\n%s\r\n" % (len(data), data))
    assert recv_exact(s, 8) == b"STORED\r\n"


def get(s, key: bytes = b"q") -> bytes | None:
    s.sendall(b"get " + key + b"\r\n")
    head = b""
    while not head.endswith(b"\r\n"):            # byte by byte: the body follows the line
        head += recv_exact(s, 1)
    if head == b"END\r\n":
        return None
    n = int(head.split()[3])
    data = recv_exact(s, n + 2)[:-2]
    assert recv_exact(s, 5) == b"END\r\n"
    return data


def rewrites(s) -> int:
    s.sendall(b"stats\r\n")
    out = recv_until(s, b"END\r\n")
    for line in out.split(b"\r\n"):
        if line.startswith(b"STAT queue_q_journal_rewrites "):
            return int(line.split()[2])
    return 0


def connect_when_up(h):
    """A connection to the restarted worker (the old one's listener is gone with it)."""
    box = []

    def up():
        try:
            s = h.connect(timeout=5)
            s.sendall(b"version\r\n")
            if recv_until(s, b"\r\n").startswith(b"VERSION"):
                box.append(s)
                return True
            s.close()
        except OSError:
            pass
        return False
    assert wait_for(up, 20), "the worker did not come back"
    return box[0]


def test_kill_9_during_rewrites_loses_nothing(tmp_path):
    h = start_server(tmp_path, workers=1, config=CONFIG)
    try:
        for rnd in range(ROUNDS):
            c = h.connect() if rnd == 0 else connect_when_up(h)
            opener = h.connect()
            held = b"open-%d" % rnd
            set_(c, held)
            opener.sendall(b"get q/open\r\n")
            assert held in recv_until(opener, b"END\r\n")
            before = rewrites(c)

            def cycle() -> bool:
                """An emptying get starts a rewrite (once the one before it is adopted)."""
                set_(c, BIG)
                assert get(c) == BIG
                return rewrites(c) >= before + 3
            assert wait_for(cycle, 30), "the journal was not rewritten"
            last = b"last-%d" % rnd
            set_(c, last)                      # behind the rewrite the last get started
            victim = pid_named(h, "lanner-w0")
            victim.send_signal(signal.SIGKILL)
            c.close()
            opener.close()
            assert wait_for(lambda: (p := pid_named(h, "lanner-w0")) is not None and p.pid != victim.pid, 20)
            c = connect_when_up(h)
            got = sorted(x for x in (get(c), get(c), get(c)) if x is not None)
            assert got == sorted([held, last]), f"round {rnd}: after kill -9 the queue held {got}"
            c.close()
    finally:
        h.stop()
