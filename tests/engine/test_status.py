"""engine/status.py: §5.11 statuses, persistence, start-up, grace period, shared block."""
from __future__ import annotations

import mmap
import os
import struct

import pytest

from lanner.clock import FakeClock
from lanner.server.status import STATUSES, ServerStatus, StatusError

BLOCKS = {  # enforced status -> (blocks reads, blocks writes), §5.11 table
    "Up": (False, False), "WriteAvoid": (False, False), "ReadOnly": (False, True),
    "Quiescent": (True, True), "Down": (True, True),
}


@pytest.fixture
def status_file(tmp_path):
    return str(tmp_path / "state" / "status")


def make(status_file, clock, grace_ms=0, default="Up", buf=None):
    buf = bytearray(ServerStatus.SIZE) if buf is None else buf
    return ServerStatus.create(buf, status_file, default, clock, grace_ms)


def read(path):
    with open(path) as f:
        return f.read()


def test_status_order_and_size():
    assert STATUSES == ("Up", "WriteAvoid", "ReadOnly", "Quiescent", "Down")
    assert ServerStatus.SIZE == 24


@pytest.mark.parametrize("name", ["Up", "WriteAvoid", "ReadOnly", "Quiescent"])
def test_blocking_table(status_file, clock, name):
    s = make(status_file, clock)
    assert s.set(name)
    assert (s.reported(), s.enforced()) == (name, name)
    assert (s.blocks_reads(), s.blocks_writes()) == BLOCKS[name]


def test_down_blocks_everything_and_is_not_persisted(status_file, clock):
    s = make(status_file, clock)
    s.set("readonly")
    s.set_down()
    assert (s.reported(), s.enforced()) == ("Down", "Down")
    assert (s.blocks_reads(), s.blocks_writes()) == BLOCKS["Down"]
    assert read(status_file) == "ReadOnly\n"


@pytest.mark.parametrize("name, canonical", [
    ("readOnly", "ReadOnly"), ("QuIeScEnT", "Quiescent"), ("UP", "Up"), ("writeavoid", "WriteAvoid"),
    ("READONLY", "ReadOnly"),
])
def test_names_are_case_insensitive(status_file, clock, name, canonical):
    s = make(status_file, clock)
    assert s.set(name)
    assert s.reported() == canonical
    assert read(status_file) == canonical + "\n"


@pytest.mark.parametrize("name, message", [
    ("down", "Status forbidden."), ("DOWN", "Status forbidden."), ("sideways", "Unknown status."),
    ("", "Unknown status."), ("read only", "Unknown status."),
])
def test_refused_names(status_file, clock, name, message):
    s = make(status_file, clock)
    with pytest.raises(StatusError) as e:
        s.set(name)
    assert str(e.value) == message
    assert s.reported() == "Up"
    assert not os.path.exists(status_file)


def test_every_accepted_change_is_persisted_with_parent_dirs(tmp_path, clock):
    path = str(tmp_path / "a" / "b" / "status")
    s = make(path, clock)
    assert not os.path.exists(path)          # start-up does not write the file
    for name in ("ReadOnly", "Up", "Quiescent", "WriteAvoid"):
        assert s.set(name)
        assert read(path) == name + "\n"
    assert sorted(os.listdir(tmp_path / "a" / "b")) == ["status", "status.lock"]   # no temp file left


# ----------------------------------------------------------------------------- start-up

@pytest.mark.parametrize("content, expected", [
    ("ReadOnly\n", "ReadOnly"), ("readonly\n", "ReadOnly"), ("QUIESCENT", "Quiescent"),
    ("WriteAvoid\nignored second line\n", "WriteAvoid"), ("up\r\n", "Up"),
    ("garbage\n", "WriteAvoid"), ("", "WriteAvoid"), ("Down\n", "WriteAvoid"), ("\nReadOnly\n", "WriteAvoid"),
])
def test_startup_reads_the_first_line(status_file, clock, content, expected):
    os.makedirs(os.path.dirname(status_file))
    with open(status_file, "wb") as f:
        f.write(content.encode())
    s = make(status_file, clock, grace_ms=10_000, default="writeavoid")
    assert (s.reported(), s.enforced()) == (expected, expected)    # immediate, no grace
    with open(status_file, "rb") as f:
        assert f.read() == content.encode()                          # start-up never rewrites it


def test_startup_missing_file_uses_default(status_file, clock):
    s = make(status_file, clock, grace_ms=10_000, default="Quiescent")
    assert (s.reported(), s.enforced(), s.blocks_reads()) == ("Quiescent", "Quiescent", True)


def test_startup_unreadable_or_undecodable_file_uses_default(tmp_path, clock):
    as_dir = tmp_path / "dir_status"
    as_dir.mkdir()
    assert make(str(as_dir), clock, default="ReadOnly").reported() == "ReadOnly"
    binary = tmp_path / "bin_status"
    binary.write_bytes(b"\xff\xfe\x00Up\n")
    assert make(str(binary), clock, default="Quiescent").reported() == "Quiescent"


def test_bad_default_status(status_file, clock):
    with pytest.raises(ValueError):
        make(status_file, clock, default="down")


def test_restart_restores_the_persisted_status(status_file, clock):
    s = make(status_file, clock, grace_ms=5000)
    s.set("readonly")                        # reported and persisted at once, enforced later
    assert s.enforced() == "Up"
    s2 = make(status_file, clock, grace_ms=5000)
    assert (s2.reported(), s2.enforced()) == ("ReadOnly", "ReadOnly")


# ----------------------------------------------------------------------------- grace period

def test_grace_zero_is_immediate(status_file, clock):
    s = make(status_file, clock, grace_ms=0)
    assert s.set("quiescent")
    assert s.enforced() == "Quiescent" and s.blocks_reads()
    assert s.set("readonly")                 # no pending change: anything goes
    assert s.set("quiescent")
    assert s.enforced() == "Quiescent"


def test_stricter_change_is_reported_at_once_and_enforced_after_grace(status_file, clock):
    s = make(status_file, clock, grace_ms=1000)
    assert s.set("readonly")
    assert s.reported() == "ReadOnly" and read(status_file) == "ReadOnly\n"
    assert s.enforced() == "Up" and not s.blocks_writes()
    clock.advance(999)
    assert s.enforced() == "Up"
    clock.advance(1)
    assert s.enforced() == "ReadOnly" and s.blocks_writes() and not s.blocks_reads()


def test_while_pending_not_looser_requests_are_ignored(status_file, clock):
    s = make(status_file, clock, grace_ms=1000)
    assert s.set("readonly")
    clock.advance(500)
    assert s.set("quiescent") is False       # stricter: ignored
    assert s.set("readonly") is False        # same: ignored
    assert s.reported() == "ReadOnly" and read(status_file) == "ReadOnly\n"
    clock.advance(500)                       # the original deadline still holds
    assert s.enforced() == "ReadOnly"
    assert s.set("quiescent")                # no longer pending: accepted, with its own grace
    assert (s.reported(), s.enforced()) == ("Quiescent", "ReadOnly")
    clock.advance(1000)
    assert s.enforced() == "Quiescent"


def test_looser_change_applies_at_once_and_cancels_pending(status_file, clock):
    s = make(status_file, clock, grace_ms=1000)
    assert s.set("quiescent")
    assert s.set("writeavoid")               # looser than reported Quiescent
    assert (s.reported(), s.enforced()) == ("WriteAvoid", "WriteAvoid")
    assert read(status_file) == "WriteAvoid\n"
    clock.advance(5000)
    assert s.enforced() == "WriteAvoid"      # the cancelled Quiescent never arrives


def test_looser_than_pending_but_stricter_than_enforced_applies_at_once(status_file, clock):
    s = make(status_file, clock, grace_ms=1000)
    s.set("quiescent")                       # pending; Up enforced
    assert s.set("readonly")                 # looser than Quiescent: Kestrel enforces it immediately
    assert (s.reported(), s.enforced()) == ("ReadOnly", "ReadOnly")


def test_looser_change_from_enforced_status_is_immediate(status_file, clock):
    s = make(status_file, clock, grace_ms=1000, default="Quiescent")
    assert s.set("up")
    assert (s.reported(), s.enforced()) == ("Up", "Up")


def test_same_status_without_pending_is_accepted(status_file, clock):
    s = make(status_file, clock, grace_ms=1000, default="ReadOnly")
    assert s.set("ReadOnly")
    assert s.enforced() == "ReadOnly" and read(status_file) == "ReadOnly\n"


def test_set_down_cancels_pending(status_file, clock):
    s = make(status_file, clock, grace_ms=1000)
    s.set("readonly")
    s.set_down()
    assert (s.reported(), s.enforced()) == ("Down", "Down")
    assert read(status_file) == "ReadOnly\n"


# ----------------------------------------------------------------------------- sharing

def test_two_objects_over_one_bytearray_see_each_others_changes(status_file, clock):
    buf = bytearray(ServerStatus.SIZE)
    a = make(status_file, clock, grace_ms=1000, buf=buf)
    b = ServerStatus(buf, status_file, clock, grace_ms=1000)
    assert b.reported() == "Up"
    assert a.set("readonly")
    assert (b.reported(), b.enforced()) == ("ReadOnly", "Up")
    assert b.set("quiescent") is False       # a's change is pending for b too
    clock.advance(1000)
    assert b.blocks_writes() and a.blocks_writes()
    assert b.set("up")
    assert (a.reported(), a.enforced()) == ("Up", "Up")
    b.set_down()
    assert a.enforced() == "Down"


def test_uninitialised_block_is_reported(status_file, clock):
    s = ServerStatus(bytearray(ServerStatus.SIZE), status_file, clock)
    with pytest.raises(RuntimeError, match="not initialised"):
        s.reported()
    with pytest.raises(RuntimeError, match="not initialised"):
        s.set("up")


def test_buffer_checks(status_file, clock):
    with pytest.raises(ValueError):
        ServerStatus(bytearray(ServerStatus.SIZE - 1), status_file, clock)
    with pytest.raises(ValueError):
        ServerStatus(bytes(ServerStatus.SIZE), status_file, clock)


def test_block_larger_than_size_is_fine(status_file, clock):
    buf = bytearray(4096)
    s = make(status_file, clock, buf=buf)
    s.set("readonly")
    assert ServerStatus(buf, status_file, clock).reported() == "ReadOnly"
    assert buf[ServerStatus.SIZE:] == bytes(4096 - ServerStatus.SIZE)


def test_reader_repairs_a_block_left_mid_write_by_a_dead_writer(status_file, clock):
    buf = bytearray(ServerStatus.SIZE)
    a = make(status_file, clock, buf=buf)
    a.set("readonly")
    seq = struct.unpack_from("=Q", buf, 0)[0]
    struct.pack_into("=Q", buf, 0, seq + 1)             # a writer died between its two increments
    b = ServerStatus(buf, status_file, clock)
    assert b.reported() == "ReadOnly"
    assert struct.unpack_from("=Q", buf, 0)[0] % 2 == 0
    assert b.set("up") and a.reported() == "Up"


def test_torn_payload_is_restored_from_the_file(status_file, clock):
    buf = bytearray(ServerStatus.SIZE)
    a = make(status_file, clock, buf=buf)
    a.set("quiescent")
    seq = struct.unpack_from("=Q", buf, 0)[0]
    buf[8:ServerStatus.SIZE] = b"\xee" * (ServerStatus.SIZE - 8)
    struct.pack_into("=Q", buf, 0, seq + 1)
    b = ServerStatus(buf, status_file, clock)
    assert (b.reported(), b.enforced()) == ("Quiescent", "Quiescent")


def test_persist_failure_is_logged_and_the_change_still_applies(tmp_path, clock, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    path = str(tmp_path / "status")
    s = make(path, clock)
    os.mkdir(path)                       # the status file's path is now a directory: rename fails
    assert s.set("readonly")
    assert s.reported() == "ReadOnly"
    assert any("unable to store status" in r.getMessage() for r in caplog.records)
    assert [n for n in os.listdir(tmp_path) if ".tmp." in n] == []


def test_shared_mmap_across_fork(status_file):
    """The supervisor's layout: an anonymous shared mmap made before fork; a child
    changes the status and the parent sees it without any message."""
    clock = FakeClock()
    block = mmap.mmap(-1, mmap.PAGESIZE)
    parent = make(status_file, clock, grace_ms=0, buf=block)
    pid = os.fork()
    if pid == 0:                              # child
        code = 1
        try:
            child = ServerStatus(block, status_file, clock)
            if child.reported() == "Up":
                for _ in range(50):
                    child.set("readonly")
                    child.set("up")
                child.set("quiescent")
                code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert (parent.reported(), parent.enforced(), parent.blocks_reads()) == ("Quiescent", "Quiescent", True)
    assert read(status_file) == "Quiescent\n"
    parent.close()
    block.close()


def test_concurrent_writers_and_lock_free_reader(status_file):
    """Two writer processes race through the flock while this process reads
    without locking; every read decodes to a real status and the file and the
    block agree at the end."""
    clock = FakeClock()
    block = mmap.mmap(-1, mmap.PAGESIZE)
    reader = make(status_file, clock, buf=block)
    pids = []
    for names in (("readonly", "writeavoid"), ("quiescent", "up")):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                w = ServerStatus(block, status_file, clock)
                for i in range(60):
                    w.set(names[i % 2])
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    seen = set()
    live = set(pids)
    while live:
        seen.add(reader.reported())
        assert reader.enforced() in STATUSES
        for pid in list(live):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                assert os.waitstatus_to_exitcode(status) == 0
                live.discard(pid)
    assert seen <= set(STATUSES[:4])
    assert read(status_file) == reader.reported() + "\n"
    assert struct.unpack_from("=Q", block, 0)[0] == 2 * (1 + 120)   # create + 120 sets, two bumps each
    reader.close()
    block.close()
