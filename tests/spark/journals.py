"""Journal spools for the Spark tests, written by the engine itself, and the oracle:
the server's own replay (Journal + PersistentQueue) of a copy, drained with remove()."""
from __future__ import annotations

import os
import shutil
import struct

from lanner.clock import FakeClock
from lanner.config import QueueConfig
from lanner.queues.queue import PersistentQueue
from lanner.storage.journal.files import archived_files
from lanner.storage.journal.journal import Journal
from lanner.storage.journal.replay import JournalReplayError
from lanner.storage.journal.packer import pack_files

T0 = 1_700_000_000_000


def open_queue(spool: str, name: str, clock, **cfg) -> PersistentQueue:
    qc = QueueConfig(**cfg)
    q = PersistentQueue(name, qc, Journal(spool, name, clock, inline_pack=True), clock)
    q.replay()
    return q


def close(q: PersistentQueue) -> None:
    q.storage.close()


def payload(name: str, i: int, size: int = 100) -> bytes:
    head = f"{name}:{i}:".encode()
    return head + bytes((i + k) % 251 for k in range(size - len(head)))


def build_spool(spool: str, clock: FakeClock) -> None:
    """Queues exercising every replay rule the items mode must match:

    plain   adds and plain removes
    rot     rotation, read-behind, checkpoints and installed packs (tiny limits), with
            reads opened and confirmed/aborted along the way
    packed  archives plus a `.pack` file the server has not installed yet (a crash
            between writing the pack and renaming it)
    torn    a torn record at the end of the current file
    broken  an undecodable record in an archive: the server refuses to start on it (issue
            11, defect 6); the Spark reader reads up to the break, which is what the
            server serves once the operator cuts the file there
    tx      open reads left at the end (they roll back to the head, lowest xid first),
            aborts and confirms, and items that expire
    """
    os.makedirs(spool, exist_ok=True)

    q = open_queue(spool, "plain", clock)
    for i in range(20):
        q.add(payload("plain", i))
    for _ in range(5):
        q.remove()
    close(q)

    q = open_queue(spool, "rot", clock, max_memory_size=1500, max_journal_size=4000,
                   default_journal_size=3000, min_journal_compact_delay=None)
    n = 0
    for rnd in range(12):
        for _ in range(15):
            q.add(payload("rot", n))
            n += 1
            clock.advance(1)
        for k in range(8):
            item = q.remove(transactional=(k % 3 == 0))
            if item is not None and item.xid:
                if k % 2:
                    q.unremove(item.xid)
                else:
                    q.confirm_remove(item.xid)
            clock.advance(1)
    q.remove(transactional=True)                 # left open at the end
    close(q)

    q = open_queue(spool, "packed", clock, max_memory_size=800, max_journal_size=1 << 30)
    for i in range(40):
        q.add(payload("packed", i))
        clock.advance(1)
        if i % 4 == 3:
            q.remove()
    close(q)
    archives = archived_files(spool, "packed")
    assert len(archives) >= 3, archives
    covered = archives[:2]
    ts = int(covered[-1].split(".")[1])
    pack_files([os.path.join(spool, a) for a in covered], os.path.join(spool, f"packed.{ts}.pack"))

    q = open_queue(spool, "torn", clock)
    for i in range(10):
        q.add(payload("torn", i))
    q.remove()
    close(q)
    with open(os.path.join(spool, "torn"), "ab") as f:
        f.write(struct.pack("<Bi", 2, 116) + b"half a rec")

    q = open_queue(spool, "broken", clock, max_memory_size=600)
    for i in range(25):
        q.add(payload("broken", i))
        clock.advance(1)
    close(q)
    first = os.path.join(spool, archived_files(spool, "broken")[0])
    size = os.path.getsize(first)
    with open(first, "r+b") as f:                 # an invalid opcode in the middle
        f.seek(size // 2 - (size // 2) % 121)
        f.write(b"\xee")

    q = open_queue(spool, "tx", clock)
    now = clock.now_ms()
    for i in range(30):
        exp = now + 5_000 if i % 5 == 1 else (now - 1 if i % 7 == 3 else 0)
        q.add(payload("tx", i), expiry_ms=exp or None)
    held = []
    for k in range(10):
        item = q.remove(transactional=True)
        if k in (2, 5):
            q.unremove(item.xid)
        elif k in (3, 7):
            q.confirm_remove(item.xid)
        else:
            held.append(item.xid)                # open at EOF
    close(q)

    write_legacy(os.path.join(spool, "legacy"), clock.now_ms())
    clock.advance(10_000)                        # the 5 s items have expired by now


def write_legacy(path: str, now_ms: int) -> None:
    """Every opcode the reader accepts, legacy ones included, written by hand."""
    def addx(op, xid, data, exp=0):
        body = struct.pack("<iqq", len(data) + 16, now_ms - 5, exp) + data
        return bytes((op,)) + (struct.pack("<I", xid) if op != 2 else b"") + body
    recs = [
        struct.pack("<Bii", 0, 4 + 1, 0) + b"a",          # ADD (legacy): add time = replay time
        struct.pack("<Bii", 0, 4 + 1, 2_000_000_000) + b"b",
        addx(2, 0, b"c"),
        b"\x03",                                          # REMOVE_TENTATIVE: a under xid 0
        struct.pack("<BI", 4, 10),                         # SAVE_XID
        addx(7, 11, b"d"),                                 # ADD_XID
        struct.pack("<BI", 9, 12),                         # REMOVE_TENTATIVE_XID: b
        addx(8, 12, b"e"),                                 # CONTINUE: confirm b, add e
        struct.pack("<BI", 9, 13),                         # c
        struct.pack("<BI", 5, 13),                         # UNREMOVE: c back to the head
        b"\x01",                                          # REMOVE: c
        struct.pack("<BI", 9, 14), struct.pack("<BI", 6, 14),   # d reserved, then confirmed
        addx(2, 0, b"f", now_ms - 1),                      # already expired
        addx(2, 0, b"g"),
    ]
    with open(path, "wb") as f:
        f.write(b"".join(recs))


def server_items(spool: str, name: str, now_ms: int, tmp: str, cut: bool = True) -> list[tuple[int, int, bytes]]:
    """What the server serves after a restart on a copy of the spool: replay, roll
    back the open reads, then remove() until empty (expired items are skipped as
    the server skips them).  (add_time, expiry, data) per item."""
    copy = os.path.join(tmp, f"oracle-{name}-{len(os.listdir(tmp))}")
    shutil.copytree(spool, copy)
    clock = FakeClock(now_ms)
    try:
        q = open_queue(copy, name, clock)
    except JournalReplayError as e:       # refused: serve what the cut its message suggests leaves
        if not cut:
            shutil.rmtree(copy)
            raise
        os.truncate(e.file, e.offset)
        q = open_queue(copy, name, clock)
    out = []
    while True:
        item = q.remove()
        if item is None:
            break
        out.append((item.add_time, item.expiry, bytes(item.data)))
    close(q)
    shutil.rmtree(copy)
    return out
