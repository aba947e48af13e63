"""Read-behind of a journal (reference §5.8): once a queue outgrows max_memory_size its new
items stay on disk and a cursor reads them back into memory as the head drains.

`JournalReadBehind` is a base class of `Journal` (journal.py) and nothing else, split out as
compaction.py is: the half of one object that reads its own files back.  What it uses of the
writer is declared below.
"""
from __future__ import annotations

import logging
import os
from typing import Callable

from lanner.queues.item import QItem
from lanner.storage.journal.codec import ADD_OPS, Cursor, JournalCorrupt
from lanner.storage.journal.files import archived_files, parse_archive

log = logging.getLogger(__name__)


class JournalReadBehind:
    # What read-behind uses of the writer (journal.Journal sets these up):
    name: str
    _dir: str
    _path: str
    _base: int
    _disk_size: int
    _pending: bytearray
    _chain: list
    _rb: Cursor | None
    _read_mark: int
    checkpoint: object
    _flush_quietly: Callable[[], bool]
    _maybe_inline_pack: Callable[[], None]
    __slots__ = ()              # Journal's

    def start_read_behind(self) -> None:
        """Read-behind starts where the next record will be written, so the buffer must be
        written first; if it cannot be, the queue stays in memory for now."""
        if self._rb is not None or not self._flush_quietly():
            return
        self._rb = Cursor(self._path, self.name, self._disk_size)
        log.info("queue %r: dropping to read-behind at %s:%d", self.name, self.name, self._disk_size)

    def fill_read_behind(self, max_bytes: int, now_ms: int) -> list[QItem]:
        """Items from the reader until their bytes reach `max_bytes` (the last may
        overshoot) or the reader catches up with the writer (leaving read-behind)."""
        rb = self._rb
        out: list[QItem] = []
        if rb is None:
            return out
        got = 0
        while got < max_bytes:
            if rb.name == self.name:
                if rb.pos >= self._disk_size:
                    if self._pending or self._chain:
                        if self._flush_quietly():
                            continue
                        break                 # the owner's flush fails too and rolls back
                    self._leave_read_behind()
                    break
                limit = self._disk_size
            else:
                limit = -1
            try:
                r = rb.read(now_ms, limit)
            except JournalCorrupt as e:
                log.error("queue %r: read-behind hit a broken record in %s at offset %d (%s); "
                          "DATA MAY HAVE BEEN LOST! Skipping the rest of that file.",
                          self.name, e.file, e.offset, e.reason)
                if rb.name == self.name:
                    self._leave_read_behind()
                    break
                r = None
            if r is None:
                if rb.name == self.name:
                    self._leave_read_behind()
                    break
                left = rb.name
                nxt = self._file_after(left)
                rb.close()
                rb = self._rb = Cursor(os.path.join(self._dir, nxt), nxt)
                log.info("queue %r: read-behind moves from %s to %s", self.name, left, nxt)
                if self.checkpoint is not None and self.checkpoint.file == left:
                    self._maybe_inline_pack()
                continue
            if r[0] in ADD_OPS:
                out.append(r[1])
                got += len(r[1].data)
        return out

    def read_back(self, mark: int) -> bool:
        """Whether read-behind has returned the record at `mark` (a copy of its item is in the
        queue's memory): a rollback of that record must take the copy out too (Queue.revert)."""
        rb = self._rb
        if rb is not None:
            return rb.name == self.name and mark < self._base + rb.pos
        return mark < self._read_mark

    def _leave_read_behind(self) -> None:
        rb = self._rb
        if rb is not None:
            if rb.name == self.name:        # what it read stays in memory (read_back)
                self._read_mark = self._base + rb.pos
            rb.close()
            self._rb = None
            log.info("queue %r: coming out of read-behind", self.name)

    def _file_after(self, fname: str) -> str:
        ts = parse_archive(self.name, fname)[0]
        for a in archived_files(self._dir, self.name):
            if parse_archive(self.name, a)[0] > ts:
                return a
        return self.name
