"""Issue 2 (queue engine and Kestrel journals) rechecked on a real `lanner serve` after the
re-layout and the shard-per-core work: what the issue asks for that no other server test
pinned.  Every name rule on both line protocols, the config inheritance default -> queue ->
fanout child, `max_expire_sweep` capping a sweep, `sync_journal` as a period, and the restart
rollback order of reference §5.9 with the xid counter going on."""
from __future__ import annotations

import os
import signal
import struct
import time

import psutil
import pytest

from tests.helpers import start_server, wait_for
from tests.server.audit3 import ask, stats
from tests.server.test_storage_server import serve_until_exit

pytestmark = pytest.mark.integration

NOW = 1_700_000_000_000


def addx(data: bytes) -> bytes:
    return b"\x02" + struct.pack("<iqq", len(data) + 16, NOW, 0) + data


def xid_record(op: int, xid: int) -> bytes:
    return bytes([op]) + struct.pack("<i", xid)


def closed(s) -> bool:
    s.settimeout(10)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def every_file(root) -> set[str]:
    return {os.path.join(d, n) for d, _dirs, names in os.walk(root) for n in names}


def replay_then_read(tmp_path, name: bytes, journal: bytes, workers: int) -> tuple[bytes, list[bytes], bytes]:
    """Serve a queue_path holding `journal` as queue `name`; open and confirm one read, then
    drain the queue with plain gets, and stop: (the item opened, the items drained, the bytes
    the server appended to the journal)."""
    qp = tmp_path / "queues"
    qp.mkdir()
    (qp / name.decode()).write_bytes(journal)
    h = start_server(tmp_path, workers=workers, queue_path=str(qp))
    try:
        s = h.connect()
        opened = ask(s, b"get %s/open\r\n" % name, b"END\r\n").split(b"\r\n")[1]
        assert ask(s, b"get %s/close\r\n" % name, b"END\r\n") == b"END\r\n"
        rest = []
        while (r := ask(s, b"get %s\r\n" % name, b"END\r\n")) != b"END\r\n":
            rest.append(r.split(b"\r\n")[1])
        s.close()
    finally:
        assert h.stop() == 0
    data = (qp / name.decode()).read_bytes()
    assert data.startswith(journal)
    return opened, rest, data[len(journal):]


# issue 2: reject `/`, `\`, `.`, `~`, NUL and control bytes, empty names, names over 255 bytes
BAD_NAMES = [b"../up", b"a/b", b"a\\b", b"..", b".hidden", b"a.b", b"~x", b"a~~1", b"a\x00b",
             b"a\x01b", b"a\x1fb", b"a\x7fb", b"\xe9" * 200, b"x" * 256]


def test_no_name_can_address_a_file_outside_the_queue_directory(tmp_path):
    """Each refused name, on memcache `set` and text `put`, is a client error with the reason
    (then a close, as both protocols do for an illegal name), and no file appears anywhere
    under the server's directory."""
    h = start_server(tmp_path, workers=2, fronts=1)
    try:
        before = every_file(tmp_path)
        for name in BAD_NAMES:
            s = h.connect()
            reply = ask(s, b"set " + name + b" 0 0 1\r\nz\r\n")
            assert reply.startswith(b"CLIENT_ERROR Queue name"), (name, reply)
            assert closed(s), name
            s.close()
            t = h.connect(h.text_port)
            reply = ask(t, b"put " + name + b":\nz\n\n", b"\n")
            assert reply.startswith(b"-Queue name"), (name, reply)
            assert closed(t), name              # reference §2.1: an illegal name closes
            t.close()
        s = h.connect()
        assert ask(s, b"get /open\r\n").startswith(b"CLIENT_ERROR")      # the empty name
        s.close()
    finally:
        assert h.stop() == 0
    new = every_file(tmp_path) - before
    assert {os.path.relpath(f, h.queue_path) for f in new if f.startswith(h.queue_path)} <= {"ok"}, new
    assert all(f.startswith(h.queue_path) or f.endswith(".log") for f in new), new


def test_config_inherits_default_then_queue_then_fanout_child(tmp_path):
    """Reference §7.2: a queue's table resolves against `[default]`, a fanout child's against
    its resolved master, and a child without a table uses its master's config."""
    cfg = ('[default]\nmax_items = 5\n[queues."orders"]\nmax_item_size = 10\n'
           '[queues."orders+audit"]\nmax_items = 2\n')
    h = start_server(tmp_path, workers=2, config=cfg)
    try:
        s = h.connect()
        for child in (b"orders+audit", b"orders+copy"):
            assert ask(s, b"get %s\r\n" % child) == b"END\r\n"        # the children exist
        replies = [ask(s, b"set orders 0 0 5\r\nabcde\r\n") for _ in range(6)]
        assert replies == [b"STORED\r\n"] * 5 + [b"NOT_STORED\r\n"]     # default's max_items
        assert ask(s, b"get orders\r\n", b"END\r\n").endswith(b"abcde\r\nEND\r\n")
        assert ask(s, b"set orders 0 0 10\r\n0123456789\r\n") == b"STORED\r\n"   # inclusive
        assert ask(s, b"set orders 0 0 11\r\n0123456789a\r\n") == b"NOT_STORED\r\n"
        assert ask(s, b"set other 0 0 11\r\n0123456789a\r\n") == b"STORED\r\n"
        st = stats(s)
        assert st["queue_orders_items"] == "5"
        assert st["queue_orders+audit_items"] == "2"                   # its own max_items
        assert st["queue_orders+copy_items"] == "5"                    # its master's
        assert ask(s, b"set orders+audit 0 0 11\r\n0123456789a\r\n") == b"NOT_STORED\r\n"
        s.close()
    finally:
        assert h.stop() == 0


def test_max_expire_sweep_caps_every_sweep(tmp_path):
    """Five items expire together; with max_expire_sweep = 2 each `flush_expired` (a sweep)
    removes at most two of them."""
    h = start_server(tmp_path, workers=2, config="[default]\nmax_expire_sweep = 2\n")
    try:
        s = h.connect()
        at = int(time.time()) + 2                 # absolute: the five expire together
        for i in range(5):
            assert ask(s, b"set ex 0 %d 1\r\n%d\r\n" % (at, i)) == b"STORED\r\n"
        swept = []

        def some_expired() -> bool:
            n = int(ask(s, b"flush_expired ex\r\n"))
            if n:
                swept.append(n)
            return bool(n)
        assert wait_for(some_expired, 30)
        swept += [int(ask(s, b"flush_expired ex\r\n")) for _ in range(3)]
        assert swept == [2, 2, 1, 0], swept
        assert stats(s)["queue_ex_expired_items"] == "5"
        s.close()
    finally:
        assert h.stop() == 0


def test_sync_journal_as_a_period_fsyncs_on_its_timer(tmp_path):
    """`sync_journal = "50ms"`: the journal is fsynced on the period (stats `fsyncs` rises
    without waiting replies); "never" issues none."""
    for policy in ("50ms", "never"):
        (tmp_path / policy).mkdir()
        h = start_server(tmp_path / policy, workers=1, config=f'[default]\nsync_journal = "{policy}"\n')
        try:
            s = h.connect()
            assert ask(s, b"set p 0 0 5\r\nhello\r\n") == b"STORED\r\n"
            if policy == "never":
                assert ask(s, b"get p\r\n", b"END\r\n").endswith(b"hello\r\nEND\r\n")
                assert stats(s)["fsyncs"] == "0"
            else:
                assert wait_for(lambda: int(stats(s)["fsyncs"]) > 0, 10)
            s.close()
        finally:
            assert h.stop() == 0


def test_restart_rolls_back_open_reads_in_descending_xid_order_and_xids_go_on(tmp_path):
    """Reference §5.9: at start-up every read still open in the journal is rolled back, in
    descending xid order (an UNREMOVE appended for each), so the lowest xid is first again,
    ahead of the items never fetched; the next open read takes the xid after the last one in
    the journal, not 1."""
    old = (b"".join(addx(d) for d in (b"a", b"b", b"c", b"d", b"e"))
           + xid_record(9, 1) + xid_record(9, 2) + xid_record(9, 3) + xid_record(6, 2))
    opened, rest, appended = replay_then_read(tmp_path, b"r", old, workers=2)
    assert (opened, rest) == (b"a", [b"c", b"d", b"e"])
    assert appended.startswith(xid_record(5, 3) + xid_record(5, 1) + xid_record(9, 4) + xid_record(6, 4)), \
        appended.hex()


def journal_opcodes(path: str) -> set[int]:
    """The opcodes of a journal file, decoded independently of the server (reference §6.2)."""
    data = open(path, "rb").read()
    ops, i = set(), 0
    while i < len(data):
        op = data[i]
        ops.add(op)
        if op == 1:
            i += 1
        elif op == 2:
            (size,) = struct.unpack_from("<i", data, i + 1)
            assert size >= 16, (path, i)
            i += 5 + size
        elif op in (5, 6, 9):
            i += 5
        elif op == 8:
            (size,) = struct.unpack_from("<i", data, i + 5)
            i += 9 + size
        else:
            raise AssertionError(f"{path} at offset {i}: opcode {op}, which Kestrel never writes")
    assert i == len(data), f"{path}: a record runs past the end"
    return ops


def test_the_writer_emits_only_what_kestrels_writer_emits(tmp_path):
    """Rotation, read-behind, rewrites and checkpoint packs with reads open, then kill -9 of
    the supervisor mid-stream (its children follow): every file left in queue_path holds only opcodes 1, 2, 5, 6,
    8 and 9 (so Kestrel can read it), and a restart serves every item once, in order."""
    cfg = ('[default]\ndefault_journal_size = "4KiB"\nmax_memory_size = "8KiB"\n'
           'max_journal_size = "16KiB"\nmin_journal_compact_delay = "0s"\n')
    h = start_server(tmp_path, workers=2, config=cfg)
    got, nxt = [], 0
    try:
        a, b = h.connect(), h.connect()
        for rnd in range(30):
            for _ in range(30):
                data = b"%05d" % nxt + b"x" * 500
                nxt += 1
                assert ask(a, b"set rb 0 0 %d\r\n%s\r\n" % (len(data), data)) == b"STORED\r\n"
            for i in range(20):
                r = ask(b, b"get rb/close/open\r\n", b"END\r\n")
                if i % 7 == 0:
                    assert ask(b, b"get rb/abort\r\n", b"END\r\n") == b"END\r\n"
                elif r != b"END\r\n":
                    got.append(r.split(b"\r\n")[1][:5])
        opened = ask(b, b"get rb/close/open\r\n", b"END\r\n").split(b"\r\n")[1][:5]
        st = stats(a)
        assert int(st["queue_rb_journal_rotations"]) > 0 and int(st["queue_rb_journal_rewrites"]) > 0, st
    finally:
        children = psutil.Process(h.proc.pid).children(recursive=True)
        h.stop(signal.SIGKILL)
        _, alive = psutil.wait_procs(children, timeout=20)     # they follow their parent
        assert not alive, alive
    files = [f for f in os.listdir(h.queue_path) if f == "rb" or f.startswith("rb.")]
    assert len(files) > 1, files
    ops = set().union(*(journal_opcodes(os.path.join(h.queue_path, f)) for f in files))
    assert ops <= {1, 2, 5, 6, 8, 9} and {2, 9} <= ops, ops
    h = start_server(tmp_path, workers=1, config=cfg, queue_path=h.queue_path)
    try:
        s = h.connect()
        rest = []
        while (r := ask(s, b"get rb\r\n", b"END\r\n")) != b"END\r\n":
            rest.append(r.split(b"\r\n")[1][:5])
        s.close()
    finally:
        assert h.stop() == 0
    assert rest[0] == opened                      # the open read rolled back to the head
    assert got + rest == [b"%05d" % i for i in range(nxt)]


UNITS = '''[queues."u1"]
max_size = "512KiB"
max_item_size = "1KB"
max_memory_size = "16MiB"
max_journal_size = "1GB"
default_journal_size = "3MB"
max_age = "250ms"
min_journal_compact_delay = "1s"
max_queue_age = "5m"
open_transaction_timeout = "1h"
sync_journal = "100ms"
[queues."u2"]
max_size = 4096
max_age = 1500
max_item_size = "1GiB"
min_journal_compact_delay = "off"
max_queue_age = "1d"
sync_journal = "always"
'''


def test_config_sizes_durations_and_off_as_the_contract_spells_them(tmp_path):
    """contract.md: sizes in bytes or binary units (KB/MB/GB the same as KiB/MiB/GiB),
    durations in ms or with units, "off" for none, as the server resolved them (dump_config)."""
    h = start_server(tmp_path, workers=1, config=UNITS)
    try:
        s = h.connect()
        for q in (b"u1", b"u2"):
            assert ask(s, b"get %s\r\n" % q) == b"END\r\n"
        out = ask(s, b"dump_config\r\n", b"END\r\n").decode()
        s.close()
    finally:
        assert h.stop() == 0
    blocks = {b.split("'")[1]: dict(line.strip().split("=", 1) for line in b.splitlines()[1:] if "=" in line)
              for b in out.split("}") if "queue '" in b}
    assert {k: blocks["u1"][k] for k in ("max_size", "max_item_size", "max_memory_size", "max_journal_size",
                                         "default_journal_size", "max_age", "min_journal_compact_delay",
                                         "max_queue_age", "open_transaction_timeout", "sync_journal")} == {
        "max_size": "524288", "max_item_size": "1024", "max_memory_size": "16777216",
        "max_journal_size": "1073741824", "default_journal_size": "3145728", "max_age": "250",
        "min_journal_compact_delay": "1000", "max_queue_age": "300000",
        "open_transaction_timeout": "3600000", "sync_journal": "100"}
    assert {k: blocks["u2"][k] for k in ("max_size", "max_age", "max_item_size", "min_journal_compact_delay",
                                         "max_queue_age", "sync_journal", "max_memory_size")} == {
        "max_size": "4096", "max_age": "1500", "max_item_size": "1073741824",
        "min_journal_compact_delay": "off", "max_queue_age": "86400000", "sync_journal": "always",
        "max_memory_size": "134217728"}


@pytest.mark.parametrize("toml, key", [
    ('[default]\nbogus = 1\n', "default.bogus: unknown key"),
    ('[default]\nmax_size = "12XB"\n', "default.max_size: expected a size"),
    ('[default]\nmax_age = "5 fortnights"\n', "default.max_age: expected a duration"),
    ('[queues."q"]\nsync_journal = "sometimes"\n', "queues.q.sync_journal: expected"),
    ('[cmdlog]\nsync = "never"\n', "cmdlog.sync: expected one of"),
    ('[cmdlog]\nbogus = 1\n', "cmdlog.bogus: unknown key"),
    ('[default]\nstorage = "sqlite"\n', "default.storage: expected one of"),
    ('[queues."a.b"]\nmax_items = 1\n', 'queues."a.b": Queue name contains illegal characters'),
    ('[default]\nkeep_journal = "yes"\n', "default.keep_journal: expected true or false"),
])
def test_a_bad_config_stops_start_up_with_one_line_naming_the_key(tmp_path, toml, key):
    (tmp_path / "bad.toml").write_text(toml)
    code, err = serve_until_exit(tmp_path, tmp_path / "queues", "--config", str(tmp_path / "bad.toml"))
    assert code == 1, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"lanner: {key}") and "bad.toml" in lines[0], err
    assert not (tmp_path / "queues").exists()


def test_legacy_opcodes_and_continue_replay_on_a_real_server(tmp_path):
    """Reference §6.2/§6.3 for the records Lanner never writes but must read: a legacy ADD (0,
    expiry in seconds), ADD_XID (7), SAVE_XID (4), the legacy REMOVE_TENTATIVE (3: the head
    reserved under xid 0), and CONTINUE (8: confirm and append).  The read left open under xid
    0 is rolled back to the head at start-up (its UNREMOVE appended) and the next open read
    takes the xid after the last one the journal named."""
    legacy_add = b"\x00" + struct.pack("<ii", 4 + 3, 2_000_000_000) + b"old"
    add_xid = b"\x07" + struct.pack("<i", 77) + addx(b"ax")[1:]
    cont = b"\x08" + struct.pack("<i", 1) + addx(b"ax2")[1:]
    old = (legacy_add + add_xid + addx(b"third") + struct.pack("<Bi", 4, 40) + b"\x03"
           + xid_record(9, 1) + cont)
    opened, rest, appended = replay_then_read(tmp_path, b"lg", old, workers=1)
    assert (opened, rest) == (b"old", [b"third", b"ax2"])
    assert appended == xid_record(5, 0) + xid_record(9, 2) + xid_record(6, 2) + b"\x01\x01", appended.hex()


def test_a_torn_tail_is_cut_and_logged_with_its_file_and_offset(tmp_path):
    """Deviation 7: a record torn at the end of the current file (a crash mid-write) is cut,
    and the log names the queue, the file and the offset; the items before it are served."""
    qp = tmp_path / "queues"
    qp.mkdir()
    (qp / "t").write_bytes(addx(b"one") + addx(b"two") + b"\x02\x15\x00")
    h = start_server(tmp_path, workers=2, queue_path=str(qp))
    try:
        s = h.connect()
        assert [ask(s, b"get t\r\n", b"END\r\n") for _ in range(3)] == \
            [b"VALUE t 0 3\r\none\r\nEND\r\n", b"VALUE t 0 3\r\ntwo\r\nEND\r\n", b"END\r\n"]
        s.close()
    finally:
        assert h.stop() == 0
    assert f"queue 't': torn record at the end of {qp / 't'}: offset 48" in h.log()
    assert (qp / "t").read_bytes()[:48] == addx(b"one") + addx(b"two")
