"""Replaying a queue's journal files into its state (reference §6.3, §5.8).

One stream over the archives then the current file; read-behind is entered once the
queue's bytes reach max_memory_size, after which a second reader follows behind replay
and supplies the in-memory part (Kestrel's fillReadBehind).

A broken record is handled by one rule (issue 11, defect 6): only a torn tail is
repaired, that is the current file ending inside its last record (a crash during a
write) or in zero bytes (a filesystem that grew the file before the data reached it);
it is truncated, logged with file, offset and bytes cut.  A broken record anywhere else
(an invalid opcode, a bad size, a torn or unreadable archive) stops replay with
`JournalReplayError` naming the queue, file and offset, and start-up fails (exit 3):
the files are left exactly as they are, because with no checksum in Kestrel's format
nothing after the break can be trusted or skipped to.
"""
from __future__ import annotations

import logging
import os
from collections import deque
from typing import Callable

from lanner.storage.journal.codec import ADD_OPS, Cursor, JournalCorrupt
from lanner.storage.journal.files import zeros_from
from lanner.storage.seam import ReplayState

log = logging.getLogger(__name__)

PROGRESS_STEP = 16 << 20        # replay progress callback granularity


class JournalReplayError(ValueError):
    """Replay refuses a journal it cannot read to the end (module docstring): one line
    naming the queue, the file, the offset and what to do; also as attributes (`offset`
    is None for a file that cannot be opened)."""

    def __init__(self, message: str, queue: str, file: str, offset: int | None) -> None:
        super().__init__(message)
        self.queue = queue
        self.file = file
        self.offset = offset


def replay_files(directory: str, name: str, files: list[str], sizes: list[int], now: int,
                 max_mem: int, progress: Callable[[int, int], None] | None = None
                 ) -> tuple[ReplayState, Cursor | None]:
    """Replay `files` (names in `directory`, replay order, the current file last) into a
    ReplayState, and the read-behind reader positioned where memory ends (None when
    everything fits).  Truncates a torn tail of the current file; raises
    JournalReplayError on anything else broken."""
    total = sum(sizes)
    next_report = PROGRESS_STEP
    st = ReplayState()
    mem = st.items
    open_tx = st.open_transactions
    mem_bytes = length = nbytes = adds = 0
    xid_counter = 0
    rb: Cursor | None = None
    done_before = 0
    last = len(files) - 1
    for idx, fname in enumerate(files):
        path = os.path.join(directory, fname)
        try:
            cur = Cursor(path, fname)
        except OSError as e:
            raise JournalReplayError(f"queue {name!r}: cannot read journal {path} "
                                     f"({e.strerror}); refusing to start without it", name, path, None) from None
        read = cur.read
        try:
            while True:
                try:
                    r = read(now)
                except JournalCorrupt as e:
                    _broken(name, e, idx == last)
                    break
                if r is None:
                    break
                op = r[0]
                if op == 2 or op == 8 or op == 0 or op == 7:
                    if op == 8:
                        open_tx.pop(r[2], None)
                    item = r[1]
                    n = len(item.data)
                    adds += 1
                    length += 1
                    nbytes += n
                    if rb is None:
                        mem.append(item)
                        mem_bytes += n
                        if nbytes >= max_mem:
                            log.info("queue %r: replay drops to read-behind at %s:%d", name, fname, cur.pos)
                            rb = Cursor(path, fname, cur.pos)
                elif op == 1 or op == 9 or op == 3:
                    if op != 1:
                        xid_counter = r[2]
                    if mem:
                        item = mem.popleft()
                        n = len(item.data)
                        mem_bytes -= n
                        length -= 1
                        nbytes -= n
                        if op != 1:
                            item.xid = r[2]
                            open_tx[r[2]] = item
                        if rb is not None and mem_bytes < max_mem:
                            rb, got = _fill(directory, rb, files, fname, cur.pos, max_mem - mem_bytes, mem, now)
                            mem_bytes += got
                elif op == 5:
                    item = open_tx.pop(r[2], None)
                    if item is not None:
                        item.xid = 0
                        n = len(item.data)
                        mem.appendleft(item)
                        length += 1
                        nbytes += n
                        mem_bytes += n
                elif op == 6:
                    open_tx.pop(r[2], None)
                else:                           # 4 SAVE_XID
                    xid_counter = r[2]
                if progress is not None and done_before + cur.pos >= next_report:
                    progress(done_before + cur.pos, total)
                    next_report = done_before + cur.pos + PROGRESS_STEP
        finally:
            cur.close()
        done_before += sizes[idx]
    if progress is not None:
        progress(total, total)
    if rb is not None:
        rb.drop_buffer()       # the current file may have been truncated under it
    st.total_items = length
    st.total_bytes = nbytes
    st.xid_counter = xid_counter
    st.read_behind = rb is not None
    st.replayed_adds = adds
    return st, rb


def _broken(name: str, e: JournalCorrupt, is_current: bool) -> None:
    """Truncate a torn tail of the current file; refuse anything else (module docstring)."""
    size = os.path.getsize(e.file)
    if is_current and (e.torn or zeros_from(e.file, e.offset)):
        log.warning("queue %r: torn record at the end of %s: offset %d (%s); truncating %s "
                    "(a write that never completed)", name, e.file, e.offset, e.reason, _bytes(size - e.offset))
        os.truncate(e.file, e.offset)
        return
    where = "" if is_current else "archived "
    raise JournalReplayError(
        f"queue {name!r}: {where}journal {e.file} is corrupt at offset {e.offset} of {size} "
        f"({e.reason}); refusing to start rather than drop the {_bytes(size - e.offset)} from there on. "
        f"Keep a copy of the file, then either cut it there to accept that loss "
        f"(truncate -s {e.offset} {e.file}) or move the queue's files out of the queue path",
        name, e.file, e.offset)


def _bytes(n: int) -> str:
    return f"{n} byte" if n == 1 else f"{n} bytes"


def _fill(directory: str, rb: Cursor, files: list[str], lim_name: str, lim_pos: int, want: int,
          mem: deque, now: int) -> tuple[Cursor | None, int]:
    """Kestrel's fillReadBehind while replaying: the reader follows the replay
    position and leaves read-behind when it reaches it."""
    got = 0
    while got < want:
        if rb.name == lim_name and rb.pos >= lim_pos:
            rb.close()
            return None, got
        r = rb.read(now)                  # replay read these bytes already: they decode
        if r is None:
            nxt = files[files.index(rb.name) + 1]
            rb.close()
            rb = Cursor(os.path.join(directory, nxt), nxt)
            continue
        if r[0] in ADD_OPS:
            mem.append(r[1])
            got += len(r[1].data)
    return rb, got
