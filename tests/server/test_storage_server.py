"""What the server leaves on disk, and what it makes of files it finds there."""
import os
import re
import struct
import subprocess
import sys

import pytest

from tests.helpers import start_server
from tests.server.conftest import Client

pytestmark = pytest.mark.integration


def addx(data: bytes, add_time: int = 1_700_000_000_000, expiry: int = 0) -> bytes:
    return b"\x02" + struct.pack("<iqq", len(data) + 16, add_time, expiry) + data


def legacy_add(data: bytes) -> bytes:
    return b"\x00" + struct.pack("<ii", len(data) + 4, 0) + data


def test_kestrel_spool_is_served_and_torn_tail_truncated(tmp_path):
    qp = tmp_path / "queues"
    qp.mkdir()
    # an archived file with legacy records, then the current file with a torn tail
    (qp / "spool.100").write_bytes(legacy_add(b"old1") + legacy_add(b"old2") + b"\x01")
    (qp / "spool").write_bytes(addx(b"new1") + b"\x09\x01\x00\x00\x00" + addx(b"new2") + b"\x02\x15\x00")
    h = start_server(tmp_path, workers=1, fronts=1, queue_path=str(qp))
    try:
        c = Client(h.connect())
        got = []
        for _ in range(4):
            r = c.ask(b"get spool\r\n", b"END\r\n")
            got.append(r.split(b"\r\n")[1] if r != b"END\r\n" else None)
        # old1 was removed; the head (old2) was reserved at the crash: rolled back at restart (§5.9)
        assert got == [b"old2", b"new1", b"new2", None]
    finally:
        h.stop()
    size = os.path.getsize(qp / "spool")
    assert size > 0
    data = (qp / "spool").read_bytes()
    assert not data.endswith(b"\x02\x15\x00")


def test_journal_bytes_match_kestrel_examples(tmp_path):
    h = start_server(tmp_path, workers=1, fronts=1)
    try:
        c = Client(h.connect())
        assert c.ask(b"set jq 0 0 5\r\nhello\r\n") == b"STORED\r\n"
        assert c.ask(b"get jq/open\r\n", b"END\r\n").endswith(b"hello\r\nEND\r\n")
        assert c.ask(b"get jq/close\r\n", b"END\r\n") == b"END\r\n"
    finally:
        h.stop()
    data = open(os.path.join(h.queue_path, "jq"), "rb").read()
    assert len(data) == 26 + 5 + 5
    assert data[:5] == b"\x02\x15\x00\x00\x00" and data[21:26] == b"hello"
    assert data[26:] == b"\x09\x01\x00\x00\x00\x06\x01\x00\x00\x00"
    out = subprocess.run([sys.executable, "-m", "lanner.cli", "qdump", os.path.join(h.queue_path, "jq")],
                         capture_output=True, check=True).stdout.decode()
    assert "RSV 1" in out and "ACK 1" in out


def test_cmdlog_storage_is_checkable_by_the_tool(tmp_path):
    cfg = '[queues."email.send"]\nstorage = "cmdlog"\n'
    h = start_server(tmp_path, workers=1, fronts=1, config=cfg)
    try:
        c = Client(h.connect())
        assert c.ask(b"set email.send 0 0 3\r\nabc\r\n") == b"STORED\r\n"
        assert c.ask(b"set email.send 0 0 3\r\ndef\r\n") == b"STORED\r\n"
        assert c.ask(b"get email.send\r\n", b"END\r\n").endswith(b"abc\r\nEND\r\n")
    finally:
        h.stop()
    root = os.path.join(h.queue_path, "cmdlog")
    parts = [os.path.join(root, p) for p in os.listdir(root)]
    assert len(parts) == 1
    r = subprocess.run([sys.executable, "-m", "lanner.cli", "cmdlog", "check", parts[0]],
                       capture_output=True)
    assert r.returncode == 0, r.stdout + r.stderr
    h = start_server(tmp_path, workers=2, fronts=1, config=cfg)   # restart: the item is still there
    try:
        c = Client(h.connect())
        assert c.ask(b"get email.send\r\n", b"END\r\n").endswith(b"def\r\nEND\r\n")
    finally:
        h.stop()


def test_read_behind_with_cleaner_packs_keeps_order(tmp_path):
    """A backlog beyond max_memory_size while items flow through: the journal rotates, sets
    checkpoints, and the cleaner process packs them; every item still comes out in order."""
    cfg = '[default]\nmax_memory_size = "4KiB"\nmax_journal_size = "16KiB"\n'
    h = start_server(tmp_path, workers=1, fronts=1, config=cfg)
    nxt = 0

    def put(c):
        nonlocal nxt
        data = b"%05d" % nxt + b"x" * 251
        nxt += 1
        assert c.ask(b"set pk 0 0 %d\r\n%s\r\n" % (len(data), data)) == b"STORED\r\n"
    try:
        c = Client(h.connect())
        for _ in range(300):
            put(c)
        got = []
        for _ in range(1500):
            r = c.ask(b"get pk\r\n", b"END\r\n")
            got.append(int(r.split(b"\r\n")[1][:5]))
            put(c)
        while True:
            r = c.ask(b"get pk\r\n", b"END\r\n")
            if r == b"END\r\n":
                break
            got.append(int(r.split(b"\r\n")[1][:5]))
        assert got == list(range(nxt))
    finally:
        assert h.stop() == 0
    assert "cleaner: packed" in h.log()
    # A pack still under way at shutdown may leave its `~~` output behind (the cleaner stops
    # after the workers); the next replay deletes such temporaries, and the queue is intact.
    leftovers = [f for f in os.listdir(h.queue_path) if "~~" in f]
    assert all(f.startswith("pk~~") for f in leftovers), leftovers
    h = start_server(tmp_path, workers=1, fronts=1, config=cfg)
    try:
        c = Client(h.connect())
        assert c.ask(b"get pk\r\n", b"END\r\n") == b"END\r\n"
    finally:
        assert h.stop() == 0
    assert [f for f in os.listdir(h.queue_path) if "~~" in f] == []


def serve_until_exit(tmp_path, qp, *extra):
    """Run `lanner serve` that is expected to refuse start-up: (exit status, stderr).  A
    server that becomes ready instead is stopped at once: (None, its stderr)."""
    from tests.helpers import free_port
    with open(tmp_path / "serve.err", "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "lanner.cli", "serve", "--queue-path", str(qp),
                                 "--status-file", str(tmp_path / "st"), "--memcache-port", str(free_port()),
                                 "--text-port", "off", "--thrift-port", "off", "--admin-port", "off",
                                 "--workers", "1", "--fronts", "1", *extra],
                                stdout=subprocess.PIPE, stderr=err, cwd=tmp_path)
    ready = proc.stdout.readline().startswith(b"lanner ready")
    if ready:
        proc.terminate()
    code = proc.wait(60)
    proc.stdout.close()
    return (None if ready else code), (tmp_path / "serve.err").read_text()


def test_corrupt_record_mid_journal_stops_start_up_and_deletes_nothing(tmp_path):
    """Issue 11, defect 6: an invalid opcode at record 500 of 1,000 used to truncate the
    current journal there, deleting 500 good records.  Start-up must stop instead (exit 3),
    naming the file and the offset, and leave the file as it was."""
    qp = tmp_path / "queues"
    qp.mkdir()
    recs = [addx(b"item%04d" % i) for i in range(1000)]
    recs[500] = b"\xff" + recs[500][1:]
    (qp / "jobs").write_bytes(b"".join(recs))
    before = (qp / "jobs").read_bytes()
    code, err = serve_until_exit(tmp_path, qp)
    offset = 500 * len(recs[0])
    assert code == 3, err
    assert f"{qp / 'jobs'} is corrupt at offset {offset}" in err and "invalid opcode 255" in err
    reasons = [line for line in err.splitlines() if line.startswith("lanner:")]
    assert len(reasons) == 1 and reasons[0].count("queue 'jobs'") == 1, err
    assert (qp / "jobs").read_bytes() == before
    # the operator accepts the loss as the message says; the 500 records before the break serve
    os.truncate(qp / "jobs", offset)
    h = start_server(tmp_path, queue_path=str(qp))
    try:
        c = Client(h.connect())
        assert c.ask(b"get jobs/peek\r\n", b"END\r\n").endswith(b"item0000\r\nEND\r\n")
        stats = c.ask(b"stats\r\n", b"END\r\n")
        assert b"STAT queue_jobs_items 500\r\n" in stats
    finally:
        h.stop()


def test_queue_stored_in_the_command_log_is_never_served_empty_under_journal_config(tmp_path):
    """Issue 11, defect 9: once `storage = "cmdlog"`, served with the default config it was
    silently empty, and a name with a `.` stopped start-up without naming the queue."""
    qp = tmp_path / "queues"
    cfg = '[queues."jobs"]\nstorage = "cmdlog"\n[queues."email.send"]\nstorage = "cmdlog"\n'
    h = start_server(tmp_path, queue_path=str(qp), config=cfg)
    try:
        c = Client(h.connect())
        assert c.ask(b"set jobs 0 0 3\r\nabc\r\n") == b"STORED\r\n"
        assert c.ask(b"set email.send 0 0 3\r\ndef\r\n") == b"STORED\r\n"
    finally:
        assert h.stop() == 0
    code, err = serve_until_exit(tmp_path, qp)               # the default config: storage = "journal"
    assert code == 3, err
    assert re.search(r"queue '(jobs|email\.send)': 1 items are stored in the command log", err), err
    assert 'storage = "journal"' in err
    h = start_server(tmp_path, queue_path=str(qp), config=cfg)   # the setting back: all there
    try:
        c = Client(h.connect())
        assert c.ask(b"get jobs\r\n", b"END\r\n").endswith(b"abc\r\nEND\r\n")
        assert c.ask(b"get email.send\r\n", b"END\r\n").endswith(b"def\r\nEND\r\n")
    finally:
        h.stop()
    # both empty now: the default config serves `jobs` from a journal; `email.send` is gone
    code, err = serve_until_exit(tmp_path, qp)
    assert code is None, err


def test_journal_queue_is_never_served_empty_under_cmdlog_config(tmp_path):
    qp = tmp_path / "queues"
    h = start_server(tmp_path, queue_path=str(qp))
    try:
        c = Client(h.connect())
        assert c.ask(b"set jobs 0 0 3\r\nabc\r\n") == b"STORED\r\n"
    finally:
        assert h.stop() == 0
    code, err = serve_until_exit(tmp_path, qp, "--config", str(write_config(tmp_path, '[default]\nstorage = "cmdlog"\n')))
    assert code == 3 and "queue 'jobs': 1 items are stored in its journal" in err, err
    assert (qp / "jobs").stat().st_size > 0


def write_config(tmp_path, text):
    path = tmp_path / "switch.toml"
    path.write_text(text)
    return path
