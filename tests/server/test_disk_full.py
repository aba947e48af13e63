"""A full disk, on a real small filesystem (tmpfs, else a loop image): what the client is told
is what the queue holds, now and after a restart (issue 11, defect 4).

The journal of queue `q` is kept at an exact multiple of 4 KiB (every record below is sized
for it), so once the filesystem is full every further journal write needs a new block and
fails with ENOSPC, reads included."""
import os
import re
import signal
import time

import pytest

from tests.helpers import start_server, wait_for
from tests.server.conftest import Client
from tests.server.test_expire_to_queue import gone
from tests.server.test_local import worker_procs
from tests.smallfs import small_fs

pytestmark = pytest.mark.integration

ADDX = 21                      # bytes of an ADDX record besides the data
BLOCK = 4096


@pytest.fixture
def fs(tmp_path, record_property):
    with small_fs(tmp_path, 1024) as f:
        if f is None:
            pytest.skip("cannot mount a tmpfs or a loop image here (needs root / CAP_SYS_ADMIN)")
        print(f"disk-full test on a {f.kind} at {f.path}")
        record_property("small_fs", f.kind)
        yield f


def item(i: int, size: int = BLOCK - ADDX) -> bytes:
    head = b"item-%03d-" % i
    return head + b"." * (size - len(head))


def setq(c: Client, q: bytes, data: bytes) -> bytes:
    return c.ask(b"set %s 0 0 %d\r\n%s\r\n" % (q, len(data), data))


def put_items(h, sizes: list[int]) -> Client:
    """Put item(i, size) into q for each size, each STORED; the client, for more."""
    c = Client(h.connect())
    for i, size in enumerate(sizes):
        assert setq(c, b"q", item(i, size)) == b"STORED\r\n"
    return c


def value_of(reply: bytes) -> bytes | None:
    if reply.startswith(b"VALUE"):
        return reply.split(b"\r\n")[1]
    return None


def queue_items(c: Client, q: str) -> int:
    out = c.ask(b"stats\r\n", b"END\r\n").decode()
    m = re.search(rf"STAT queue_{q}_items (\d+)", out)
    return int(m.group(1)) if m else 0


def drain(h, q: bytes) -> list[bytes]:
    c = Client(h.connect())
    out = []
    while True:
        r = c.ask(b"get %s\r\n" % q, b"END\r\n")
        v = value_of(r)
        if v is None:
            assert r == b"END\r\n", r
            c.close()
            return out
        out.append(v)


def test_refused_items_never_reach_readers_and_reads_fail_truthfully(tmp_path, fs):
    qp = os.path.join(fs.path, "queues")
    h = start_server(tmp_path, queue_path=qp)
    try:
        c = put_items(h, [BLOCK - ADDX] * 10)
        assert os.path.getsize(os.path.join(qp, "q")) == 10 * BLOCK
        filler = fs.fill()

        refused = b"refused-" + b"x" * 100
        r = setq(c, b"q", refused)
        assert r.startswith(b"SERVER_ERROR"), r
        assert b"No space left on device" in r
        assert qp.encode() not in r, "a reply must not name a server path"
        c = Client(h.connect())
        assert queue_items(c, "q") == 10, "a refused item must not be in the queue"

        # a read cannot be journaled either: the client is told so and the item stays
        for cmd in (b"get q\r\n", b"get q/open\r\n"):
            c = Client(h.connect())
            r = c.ask(cmd, b"\r\n")
            assert r.startswith(b"SERVER_ERROR"), (cmd, r)
            c = Client(h.connect())
            assert queue_items(c, "q") == 10
        assert c.ask(b"get q/peek\r\n", b"END\r\n") == b"VALUE q/peek 0 %d\r\n%s\r\nEND\r\n" % (
            len(item(0)), item(0))

        os.unlink(filler)                       # space comes back
        assert setq(c, b"q", b"after") == b"STORED\r\n"
        got = drain(h, b"q")
        assert got == [item(i) for i in range(10)] + [b"after"]
    finally:
        code = h.stop()
    assert code == 0, h.log()[-3000:]
    h = start_server(tmp_path, queue_path=qp)
    try:
        assert drain(h, b"q") == []             # every read above was journaled: nothing comes back
    finally:
        h.stop()


def test_sigterm_while_full_exits_nonzero_and_restart_serves_the_truth(tmp_path, fs):
    qp = os.path.join(fs.path, "queues")
    h = start_server(tmp_path, queue_path=qp)
    try:
        # the open read's 5-byte record brings the journal to an exact 40 KiB
        put_items(h, [BLOCK - ADDX] * 9 + [BLOCK - ADDX - 5])
        holder = Client(h.connect())
        assert value_of(holder.ask(b"get q/open\r\n", b"END\r\n")) == item(0)
        assert os.path.getsize(os.path.join(qp, "q")) == 10 * BLOCK
        fs.fill()

        holder.close()                          # its abort cannot be journaled
        c = Client(h.connect())
        r = c.ask(b"get q\r\n", b"\r\n")
        assert r.startswith(b"SERVER_ERROR"), r
        c = Client(h.connect())
        assert setq(c, b"q", b"refused").startswith(b"SERVER_ERROR")
    finally:
        code = h.stop()
    log = h.log()
    assert code != 0, "shutdown with an unwritable journal must not exit 0"
    assert "Traceback" not in log, log[-3000:]
    assert re.search(r"queue 'q'.*could not", log), log[-3000:]

    os.unlink(os.path.join(fs.path, "filler"))
    h = start_server(tmp_path, queue_path=qp)
    try:
        # the open read was never confirmed: it comes back first; nothing refused is there
        assert drain(h, b"q") == [item(0)] + [item(i) for i in range(1, 9)] + [item(9, BLOCK - ADDX - 5)]
    finally:
        assert h.stop() == 0


def stats_of(c: Client) -> dict[str, str]:
    out = c.ask(b"stats\r\n", b"END\r\n").decode()
    return dict(re.findall(r"STAT (\S+) (\S+)\r\n", out))


def test_a_refused_set_counts_in_no_item_figure_only_in_cmd_set(tmp_path, fs):
    """total_items (global and per queue), items and bytes count what the queues hold: a set
    answered SERVER_ERROR added nothing, nor did its fanout copy.  cmd_set counts attempts
    that passed the status check (§4.3, NOT_STORED included), so it counts this one too."""
    qp = os.path.join(fs.path, "queues")
    h = start_server(tmp_path, queue_path=qp)
    try:
        c = put_items(h, [BLOCK - ADDX] * 10)
        assert c.ask(b"get q+copy\r\n") == b"END\r\n"       # a fanout child, empty journal
        before = stats_of(c)
        assert before["total_items"] == "10" and before["cmd_set"] == "10"
        fs.fill()
        r = setq(c, b"q", b"refused-" + b"x" * 100)
        assert r.startswith(b"SERVER_ERROR"), r
        after = stats_of(Client(h.connect()))
        assert after["cmd_set"] == "11"                      # the attempt
        for key in ("total_items", "curr_items", "bytes", "queue_q_total_items", "queue_q_items",
                    "queue_q_bytes", "queue_q+copy_total_items", "queue_q+copy_items"):
            assert after[key] == before[key], (key, before[key], after[key])   # main: total_items 12
    finally:
        h.stop()


def test_a_refused_set_leaves_no_fanout_copy(tmp_path, fs):
    """The child's journal has room left in its last block and takes the copy; the master's is
    full and refuses the set.  The client is told SERVER_ERROR, so no queue may hold the item:
    before, the child kept its copy and served it (and a retry put a second one there)."""
    qp = os.path.join(fs.path, "queues")
    h = start_server(tmp_path, queue_path=qp)
    try:
        c = Client(h.connect())
        assert c.ask(b"get q+copy\r\n") == b"END\r\n"       # the fanout child, registered
        for i in range(10):
            assert setq(c, b"q", item(i)) == b"STORED\r\n"
        assert setq(c, b"q+copy", b"pad") == b"STORED\r\n"    # the child's last block has room
        assert os.path.getsize(os.path.join(qp, "q")) == 10 * BLOCK
        fs.fill()
        r = setq(c, b"q", b"refused")
        assert r.startswith(b"SERVER_ERROR"), r
        st = stats_of(Client(h.connect()))
        assert (st["queue_q+copy_items"], st["queue_q_items"]) == ("11", "10")
        os.unlink(os.path.join(fs.path, "filler"))
        assert drain(h, b"q+copy") == [item(i) for i in range(10)] + [b"pad"]
        assert drain(h, b"q") == [item(i) for i in range(10)]
    finally:
        code = h.stop()
    assert code == 0, h.log()[-3000:]
    h = start_server(tmp_path, queue_path=qp)
    try:
        assert drain(h, b"q+copy") == [] and drain(h, b"q") == []
    finally:
        assert h.stop() == 0


def test_an_item_moved_within_a_worker_whose_add_failed_survives_kill_9(tmp_path, fs):
    """expire_to_queue from `src` into `dst`, both on the one worker.  The disk is full: the
    source's record of the move fits in its journal's last block, the target's add does not and
    is rolled back.  The worker is then killed (kill -9) before the move could be made again:
    the item must still be somewhere after the restart, and reach `dst`.  Before, the source
    had logged a plain remove and the retry lived only in the worker's memory: it was lost."""
    qp = os.path.join(fs.path, "queues")
    h = start_server(tmp_path, queue_path=qp, config='[queues.src]\nexpire_to_queue = "dst"\n'
                                                     'max_age = "100ms"\n')
    try:
        c = Client(h.connect())
        for i in range(3):
            assert setq(c, b"dst", item(i)) == b"STORED\r\n"
        assert os.path.getsize(os.path.join(qp, "dst")) == 3 * BLOCK     # whole blocks
        assert setq(c, b"src", b"moving") == b"STORED\r\n"              # room left in its block
        filler = fs.fill()
        time.sleep(0.2)                           # the item's max_age runs out
        assert c.ask(b"get src\r\n", b"END\r\n") == b"END\r\n"          # the sweep moves it
        assert queue_items(Client(h.connect()), "dst") == 3             # its add was rolled back
        [worker] = worker_procs(h)
        h.proc.send_signal(signal.SIGSTOP)        # no replacement until the disk has room again
        try:
            worker.send_signal(signal.SIGKILL)
            assert wait_for(lambda: gone(worker)), h.log()
            os.unlink(filler)
        finally:
            h.proc.send_signal(signal.SIGCONT)
        assert wait_for(lambda: h.log().count("worker 0 ready") >= 2, timeout=20), h.log()
        c = Client(h.connect())
        assert c.ask(b"get src\r\n", b"END\r\n") == b"END\r\n"          # (moves what came back)
        assert drain(h, b"dst") == [item(i) for i in range(3)] + [b"moving"]   # main: no "moving"
    finally:
        assert h.stop() == 0, h.log()[-3000:]
