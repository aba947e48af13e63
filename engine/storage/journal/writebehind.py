"""A journal's writes behind the owner's loop (storage/writer.py): the buffer, or a big item's
own bytes, handed to the writer's thread, chained in order, and the jobs' results taken back
(`settle_write`).  Journal's base class (journal.py): the owner's thread only."""
from __future__ import annotations

from typing import Callable

from lanner.queues.item import QItem
from lanner.storage.journal.files import JournalError

WRITE_BEHIND_MAX = 256 << 20    # pending bytes, behind a write under way, that force a flush


class JournalWriteBehind:
    # What write-behind uses of the writer (journal.Journal sets these up):
    _path: str
    _fd: int
    _pending: bytearray
    _disk_size: int
    _inflight_n: int
    _chain: list
    _torn: bool
    writer: object
    _untear: Callable[[], None]
    _moved: Callable[[], None]
    __slots__ = ()              # Journal's

    def _add_behind(self, item: QItem, head: bytes) -> bool:
        """A big item's ADDX (or CONTINUE: `head`) goes to the writer's thread at once: the buffer and the record's
        head, then the item's own bytes (copying 8 MiB into the buffer was a sixth of the loop
        under a flood, issue 8).  Behind a write under way it is chained (the thread skips it
        if that one failed); `settle_write` takes them all.  Only with a writer and bytes that
        cannot change (`bytes`), up to WRITE_BEHIND_MAX under way; else the caller copies, as
        for any record.  True if the record went."""
        data = item.data
        if self.writer is None or self._fd < 0 or type(data) is not bytes or \
                self._inflight_n + len(data) > WRITE_BEHIND_MAX:
            return False
        return self._hand_over(head, data)      # (the ADDX's or CONTINUE's head)

    def write_behind(self) -> bool:
        """Hand the buffer to the writer's thread, chained behind the writes under way (written in
        order), up to WRITE_BEHIND_MAX under way; True if a write was started.  A small record
        behind a big write goes right after it, not with the next big item or once the flood
        pauses (issue 8, same-queue fairness: its reply waited 0.2-1.3 s)."""
        if not self._pending or self.writer is None or self._fd < 0 or \
                self._inflight_n >= WRITE_BEHIND_MAX:
            return False
        return self._hand_over(b"", None)

    def _hand_over(self, head: bytes, data: bytes | None) -> bool:
        """The buffer, then `head`, then `data` (a big item's own bytes) to the writer's thread,
        chained behind the jobs under way; False if a failed write's bytes cannot be cut back."""
        if self._torn:                # (only after a failed write: none is under way)
            try:
                self._untear()
            except JournalError:
                return False          # the owner's flush fails too and rolls back
        buf, self._pending = self._pending, bytearray()
        buf += head
        job = self.writer.submit(self._fd, buf, data, self._inflight)
        self._chain.append(job)
        self._inflight_n += job.size
        self._moved()
        return True

    @property
    def _inflight(self):
        """The newest WriteJob under way, if any (the thread writes a chain in order)."""
        chain = self._chain
        return chain[-1] if chain else None

    @property
    def write_done(self) -> bool:
        """No write under way, or the newest has finished, and with it every one before it
        (the thread writes in order): `settle_write` will not wait."""
        chain = self._chain
        return not chain or chain[-1].done.is_set()

    def settle_write(self, block: bool = True) -> None:
        """Take the results of the writes done (all of them, waiting, if `block`; else `written_mark`
        moves past each as it finishes, so a reply need not wait for big writes chained after its
        record): their bytes are the OS's now, or (one failed) the file is cut back to the end of
        the last good one, the records of it and of those after it go back to the front of the
        buffer, and JournalError is raised as from `flush`."""
        jobs = self._chain
        if not jobs:
            return
        if block:
            jobs[-1].wait()              # the newest: every earlier one is done too
        n = 0
        failed = False
        for job in jobs:
            if not job.done.is_set():
                break
            if job.error is not None:
                failed = True
                jobs[-1].wait()          # those after it are skipped (WriteJob.after): at once
                break
            n += 1
        for job in jobs[:n]:
            self._disk_size += job.size
            self._inflight_n -= job.size
        del jobs[:n]
        # (not a second look at `done`: the thread may have finished the first write left since
        # the loop's look, which would take a good write for the failed one)
        if not failed:
            return
        size, e = jobs[0].size, jobs[0].error
        back = bytearray().join(x for j in jobs for x in (j.buf, j.tail or b""))
        self._chain, self._inflight_n = [], 0
        self._moved()
        self._pending[:0] = back
        raise self._write_failed(size, e) from e

    def _write_failed(self, size: int, e: OSError) -> JournalError:
        """A write of `size` bytes failed (`e`): the file is cut back to `_disk_size` if it can be
        (else before the next write), and the error for the owner returned."""
        self._torn = True
        try:
            self._untear()
        except JournalError:
            pass
        return JournalError(self._path, f"write of {size} bytes failed: {e.strerror or e}", e.errno)
