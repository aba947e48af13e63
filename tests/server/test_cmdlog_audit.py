"""workq-cmdlog.md as a real `lanner serve` with `storage = "cmdlog"` leaves it on disk, and
what start-up makes of torn and corrupt segments (conformance audit, part 2): the layout and
rotation of §1.1/§3.1, the commands a queue operation writes (docs/formats.md), the torn-tail
policy of checklist item 9 and the refusals of §2.6."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.helpers import recv_until, start_server
from tests.server.test_storage_server import serve_until_exit

pytestmark = pytest.mark.integration

CONFIG = '[default]\nstorage = "cmdlog"\n[cmdlog]\nsegment_size = 200\nsync = "always"\n'
HEADER = bytes.fromhex("7771777100000001")


def ask(s, line: bytes, end: bytes = b"\r\n") -> bytes:
    s.sendall(line)
    return recv_until(s, end)


def partition(qp) -> str:
    root = os.path.join(qp, "cmdlog")
    dirs = [os.path.join(root, d) for d in os.listdir(root)]
    assert len(dirs) == 1, dirs
    return dirs[0]


def lanner(*args):
    r = subprocess.run([sys.executable, "-m", "lanner.cli", *args], capture_output=True, text=True,
                       timeout=60)
    return r.returncode, r.stdout, r.stderr


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A command log written by a real server (then stopped), copied by each test."""
    tmp = tmp_path_factory.mktemp("cmdlog-audit")
    h = start_server(tmp, config=CONFIG)
    try:
        s = h.connect()
        for _ in range(4):
            assert ask(s, b"set jobs 0 0 5\r\nhello\r\n") == b"STORED\r\n"
        assert ask(s, b"get jobs\r\n", b"END\r\n") == b"VALUE jobs 0 5\r\nhello\r\nEND\r\n"
        assert ask(s, b"get jobs/open\r\n", b"END\r\n").endswith(b"hello\r\nEND\r\n")
        assert ask(s, b"get jobs/close\r\n", b"END\r\n") == b"END\r\n"
        assert ask(s, b"get jobs/open\r\n", b"END\r\n").endswith(b"hello\r\nEND\r\n")
        assert ask(s, b"get jobs/abort\r\n", b"END\r\n") == b"END\r\n"
        s.close()
    finally:
        assert h.stop() == 0
    return tmp, h.queue_path


def copy_of(written, tmp_path) -> str:
    qp = str(tmp_path / "queues")
    shutil.copytree(written[1], qp)
    return qp


def test_segments_locks_rotation_and_the_commands_written(written):
    d = partition(written[1])
    names = sorted(os.listdir(d))
    assert names == ["000000001.log", "000000002.log", "000000003.log", "append.lock",
                     "lanner-queues.json", "read.lock"]
    assert os.path.getsize(os.path.join(d, "append.lock")) == os.path.getsize(os.path.join(d, "read.lock")) == 0
    # a segment rotates before the append that finds it at or past segment_size (200): three
    # 90-byte adds make 278 bytes, four records 210, and the rest follow in the third
    sizes = [os.path.getsize(os.path.join(d, n)) for n in names[:3]]
    assert sizes == [8 + 3 * 90, 8 + 90 + 3 * 37 + 1, 8 + 2 * 37]
    for n in names[:3]:
        with open(os.path.join(d, n), "rb") as f:
            assert f.read(8) == HEADER
    code, out, err = lanner("cmdlog", "dump", "--json", d)
    assert code == 0, err
    cmds = [json.loads(line)["command"] for line in out.splitlines()]
    # an add per set; a plain get deletes its job; an open read is a start-attempt, its close
    # a complete, its abort a timeout-attempt (docs/formats.md)
    assert [c["cmd"] for c in cmds] == ["add"] * 4 + ["delete", "start-attempt", "complete",
                                                      "start-attempt", "timeout-attempt"]
    assert {c["name"] for c in cmds[:4]} == {"jobs"}
    ids = [c["id"] for c in cmds]
    assert ids[4] == ids[0] and ids[5] == ids[6] == ids[1] and ids[7] == ids[8] == ids[2]
    code, out, _ = lanner("cmdlog", "check", d)
    assert code == 0 and out.startswith("ok: ") and "2 live jobs" in out


def test_a_torn_tail_of_the_newest_segment_is_cut_and_a_torn_header_rewritten(written, tmp_path):
    qp = copy_of(written, tmp_path)
    d = partition(qp)
    newest = os.path.join(d, "000000003.log")
    os.truncate(newest, os.path.getsize(newest) - 3)          # the timeout-attempt torn
    h = start_server(tmp_path, config=CONFIG, queue_path=qp)
    try:
        s = h.connect()
        # the abort's record is gone: its read is open again and rolls back at start-up
        got = [ask(s, b"get jobs\r\n", b"END\r\n") for _ in range(3)]
        assert got == [b"VALUE jobs 0 5\r\nhello\r\nEND\r\n"] * 2 + [b"END\r\n"]
        s.close()
    finally:
        h.stop()
    assert f"{newest}: offset 45: torn record at the end of the newest segment: truncated 34 bytes" \
        in h.log()
    # a newest segment shorter than its header (a crash while it was created) gets one
    empty = os.path.join(d, "000000099.log")
    open(empty, "wb").close()
    h = start_server(tmp_path, config=CONFIG, queue_path=qp)
    h.stop()
    with open(empty, "rb") as f:
        assert f.read() == HEADER
    assert f"{empty}: the newest segment ends inside its header (0 of 8 bytes" in h.log()


@pytest.mark.parametrize("segment, change, reason", [
    ("000000002.log", ("flip", 50), "offset 8: crc mismatch"),
    ("000000003.log", ("flip", 60), "offset 45: crc mismatch"),       # the last record: not torn
    ("000000002.log", ("cut", 3), "offset 172: torn record"),         # torn, not the newest
    ("000000002.log", ("flip", 2), "offset 0: invalid segment header"),
])
def test_corruption_refuses_start_up_naming_segment_and_offset(written, tmp_path, segment, change, reason):
    qp = copy_of(written, tmp_path)
    path = os.path.join(partition(qp), segment)
    data = bytearray(open(path, "rb").read())
    kind, n = change
    if kind == "flip":
        data[n] ^= 1
    else:
        del data[-n:]
    with open(path, "wb") as f:
        f.write(data)
    with open(tmp_path / "lanner.toml", "w") as f:
        f.write(CONFIG)
    code, err = serve_until_exit(tmp_path, qp, "--config", str(tmp_path / "lanner.toml"))
    assert code == 3, err
    reasons = [line for line in err.splitlines() if line.startswith("lanner:")]
    assert len(reasons) == 1 and f"{path}: {reason}" in reasons[0], err
    assert open(path, "rb").read() == bytes(data)


def test_files_not_named_like_segments_are_ignored_and_left_alone(written, tmp_path):
    qp = copy_of(written, tmp_path)
    d = partition(qp)
    junk = ("0000001.log", "0000000002.log", "foo.log", "000000003.LOG", "000000002.notlog.log",
            "00000001")
    for n in junk:
        with open(os.path.join(d, n), "wb") as f:
            f.write(b"not a segment")
    h = start_server(tmp_path, config=CONFIG, queue_path=qp)
    try:
        s = h.connect()
        assert ask(s, b"get jobs\r\n", b"END\r\n") == b"VALUE jobs 0 5\r\nhello\r\nEND\r\n"
        s.close()
    finally:
        h.stop()
    for n in junk:
        with open(os.path.join(d, n), "rb") as f:
            assert f.read() == b"not a segment"
