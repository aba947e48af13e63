"""Reference §6 (journal files, records, replay, rewrite) and §5.11's shutdown rule, checked on
what a real `lanner serve` leaves in `queue_path` (conformance audit, part 2)."""
from __future__ import annotations

import os
import struct

import pytest

from tests.helpers import recv_until, start_server, wait_for

pytestmark = pytest.mark.integration

NOW = 1_700_000_000_000


def addx(data: bytes, add_time: int = NOW, expiry: int = 0) -> bytes:
    return b"\x02" + struct.pack("<iqq", len(data) + 16, add_time, expiry) + data


def xid_record(op: int, xid: int) -> bytes:
    return bytes([op]) + struct.pack("<i", xid)


def ask(s, line: bytes, end: bytes = b"\r\n") -> bytes:
    s.sendall(line)
    return recv_until(s, end)


def get(s, key: bytes) -> bytes | None:
    r = ask(s, b"get %s\r\n" % key, b"END\r\n")
    return None if r == b"END\r\n" else r.split(b"\r\n")[1]


def stats(s) -> dict[bytes, bytes]:
    out = ask(s, b"stats\r\n", b"END\r\n")
    return dict(line.split()[1:3] for line in out.split(b"\r\n") if line.startswith(b"STAT "))


def files(qp) -> dict[str, int]:
    """The queue directory's files and sizes; one the server removes between the listing and
    the size (an archive being adopted) is left out, as a later look would not see it."""
    out = {}
    for f in os.listdir(qp):
        if f == ".lanner":
            continue
        try:
            out[f] = os.path.getsize(os.path.join(qp, f))
        except FileNotFoundError:
            pass
    return out


def test_rotate_logs_example_leaves_one_empty_file_with_no_further_operation(tmp_path):
    """§6.4's worked example (ServerSpec "rotate logs"): the fourth operation rewrites the
    journal of the empty queue, and then `queue_path` holds one 0-byte `rl` and the stats count
    the rewrite, without another request to that queue (the rewrite used to be adopted only at
    the queue's next operation: an idle queue kept its archive and `.pack` beside an empty
    current file, and `journal_rewrites` stayed 0)."""
    h = start_server(tmp_path, config='[default]\nmax_journal_size = "16KiB"\n')
    try:
        s = h.connect()
        item = b"x" * 8192
        sizes = []
        for _ in range(2):
            assert ask(s, b"set rl 0 0 8192\r\n%s\r\n" % item) == b"STORED\r\n"
            sizes.append(int(stats(s)[b"queue_rl_logsize"]))
            assert get(s, b"rl") == item
        assert sizes == [8213, 16427]
        assert wait_for(lambda: files(h.queue_path) == {"rl": 0}, 10), files(h.queue_path)
        st = stats(s)
        assert (st[b"queue_rl_journal_rewrites"], st[b"queue_rl_logsize"]) == (b"1", b"0")
        s.close()
    finally:
        h.stop()


@pytest.mark.parametrize("status", ["readonly", "quiescent"])
def test_shutdown_under_a_blocking_status_compacts_each_empty_queue(tmp_path, status):
    """§5.11: with ReadOnly or Quiescent enforced at shutdown, each empty queue's journal is
    rewritten on close: 0 bytes with no open reads, an open read as ADDX + RSV; a queue with
    items is left as it is."""
    h = start_server(tmp_path, workers=2)
    try:
        s = h.connect()
        for q in (b"drained", b"full", b"reading"):
            for _ in range(3):
                assert ask(s, b"set %s 0 0 3\r\nabc\r\n" % q) == b"STORED\r\n"
        for _ in range(3):
            assert get(s, b"drained") == b"abc"
        assert get(s, b"reading") == get(s, b"reading") == b"abc"
        assert ask(s, b"get reading/open\r\n", b"END\r\n") == b"VALUE reading/open 0 3\r\nabc\r\nEND\r\n"
        before = files(h.queue_path)
        assert ask(s, b"status %s\r\n" % status.encode()) == b"END\r\n"
        assert h.stop() == 0
    finally:
        h.stop()
    after = files(h.queue_path)
    assert after == {"drained": 0, "full": before["full"], "reading": 21 + 3 + 5}
    data = open(os.path.join(h.queue_path, "reading"), "rb").read()
    assert data[0] == 2 and data[21:24] == b"abc" and data[24:] == xid_record(9, 1)


def test_shutdown_while_up_rewrites_nothing(tmp_path):
    h = start_server(tmp_path)
    try:
        s = h.connect()
        assert ask(s, b"set drained 0 0 3\r\nabc\r\n") == b"STORED\r\n"
        assert get(s, b"drained") == b"abc"
        assert h.stop() == 0
    finally:
        h.stop()
    assert files(h.queue_path) == {"drained": 24 + 1}


def test_records_of_a_get_an_abort_and_a_restart_with_an_open_read(tmp_path):
    """§6.2 example 3 (a plain get appends `01`, an abort `05 xid`), §6.3 (a restart rolls an
    open read back and appends its UNREMOVE), §9.7 #37 (a get of a new queue makes a 0-byte
    journal)."""
    h = start_server(tmp_path)
    try:
        s = h.connect()
        assert get(s, b"fresh") is None
        for data in (b"one", b"two", b"three"):
            assert ask(s, b"set q 0 0 %d\r\n%s\r\n" % (len(data), data)) == b"STORED\r\n"
        assert get(s, b"q") == b"one"
        assert ask(s, b"get q/open\r\n", b"END\r\n").endswith(b"two\r\nEND\r\n")
        assert ask(s, b"get q/abort\r\n", b"END\r\n") == b"END\r\n"
        assert ask(s, b"get q/open\r\n", b"END\r\n").endswith(b"two\r\nEND\r\n")
        s.close()          # the server may roll this one back itself; stop it either way
        h.stop()
    finally:
        h.stop()
    qp = h.queue_path
    assert os.path.getsize(os.path.join(qp, "fresh")) == 0
    data = open(os.path.join(qp, "q"), "rb").read()
    tail = data[24 + 24 + 26:]
    assert tail[:11] == b"\x01" + xid_record(9, 1) + xid_record(5, 1)


def test_a_kestrel_spool_is_listed_and_replayed_as_kestrel_did(tmp_path):
    """§6.1: archives replay in numeric timestamp order (`s.99` before `s.100`) then the
    current file; `~~` temporaries are deleted at replay; a `.pack` replaces the archives at
    or before its timestamp and takes their name; `keep_journal = false` deletes a queue's old
    files and writes none.  §6.3: an open read left in the files comes back at the head, and
    its UNREMOVE is appended."""
    qp = tmp_path / "queues"
    qp.mkdir()
    (qp / "s.99").write_bytes(addx(b"first"))
    (qp / "s.100").write_bytes(addx(b"second"))
    (qp / "s").write_bytes(addx(b"third"))
    (qp / "s~~5").write_bytes(b"junk")
    (qp / "p.100").write_bytes(addx(b"a"))
    (qp / "p.200.pack").write_bytes(addx(b"b"))
    (qp / "p.300").write_bytes(addx(b"c"))
    (qp / "p").write_bytes(addx(b"d"))
    (qp / "o").write_bytes(addx(b"x") + addx(b"y") + xid_record(9, 1))
    (qp / "mem").write_bytes(addx(b"gone"))
    (qp / "mem.5").write_bytes(b"\x01")
    h = start_server(tmp_path, queue_path=str(qp), config='[queues."mem"]\nkeep_journal = false\n')
    try:
        s = h.connect()
        assert [get(s, b"s") for _ in range(4)] == [b"first", b"second", b"third", None]
        assert [get(s, b"p") for _ in range(4)] == [b"b", b"c", b"d", None]
        assert [get(s, b"o") for _ in range(3)] == [b"x", b"y", None]
        assert get(s, b"mem") is None
        assert ask(s, b"set mem 0 0 1\r\nm\r\n") == b"STORED\r\n"
        listing = files(qp)
        assert "s~~5" not in listing and "p.100" not in listing and "p.200.pack" not in listing
        assert "p.200" in listing and not any(f.startswith("mem") for f in listing)
        s.close()
    finally:
        h.stop()
    o = (qp / "o").read_bytes()
    assert o.startswith(addx(b"x") + addx(b"y") + xid_record(9, 1) + xid_record(5, 1))
