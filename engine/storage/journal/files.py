"""The files of a queue's journal in the queue directory (reference §6.1), by name.

Files of queue `q`:

* `q`           the current journal; the writer appends here and nowhere else.
* `q.<ms>`      archived journals, replayed in NUMERIC order of <ms>, then `q`.
* `q~~<ms>`     temporary files; deleted when `q` is replayed.
* `q.<ms>.pack` a complete summary of every archive with a timestamp <= ms.
  Whenever archives are listed, older archives are deleted and the pack is
  renamed to `q.<ms>`.

Any other file in the queue directory stops start-up (`StrayFile`), as Kestrel's does;
directories (`cmdlog/`) are not journals.  Invariants kept with journal.py:

* Archive timestamps only grow: a new name is max(now, last + 1), created exclusively,
  bumped by 1 ms while taken.  A clock that steps back cannot reorder replay.
* A `.pack` file appears only by an atomic rename of a complete, fsynced file, so
  "delete every archive <= ts, then rename the pack" is safe to redo after a crash at
  any point.
* No path ever leaves the queue directory: queue names are asserted to hold no `/`,
  `.`, `~` or NUL before any path is built.
"""
from __future__ import annotations

import errno
import logging
import os
import re

from lanner.queues.names import validate_queue_name
from lanner.storage.journal.codec import (ADD_OPS, CHUNK, OP_CONFIRM_REMOVE, OP_CONTINUE, OP_REMOVE,
                                          OP_REMOVE_TENTATIVE, OP_REMOVE_TENTATIVE_XID, OP_UNREMOVE,
                                          Cursor, JournalCorrupt)

log = logging.getLogger(__name__)

_ARCHIVE_RE = re.compile(r"([0-9]+)(\.pack)?")


class JournalError(OSError):
    """An I/O failure on a journal file; `str()` names the file."""

    def __init__(self, path: str, reason: str, err: int | None = None) -> None:
        super().__init__(err or errno.EIO, f"{path}: {reason}")
        self.path = path
        self.reason = reason


class StrayFile(ValueError):
    """A file in the queue directory that is not a journal: Kestrel refuses to start on
    one, and so do we, naming it."""


class JournalReplayError(ValueError):
    """Replay refuses a journal it cannot read to the end (module docstring): one line
    naming the queue, the file, the offset and what to do."""


def check_name(name: str) -> None:
    assert name and not any(c in name for c in "/.~\0"), f"unsafe journal queue name {name!r}"


_STRAY = ("not a journal file (expected <queue>, <queue>.<epoch-ms> or <queue>.<epoch-ms>.pack); "
          "move it out of the queue path")


def parse_archive(name: str, fname: str) -> tuple[int, bool] | None:
    """(timestamp, is_pack) for `<name>.<ts>` / `<name>.<ts>.pack`; None if fname is
    not an archive of `name`.  Raises StrayFile for `<name>.<junk>`."""
    if not fname.startswith(name + "."):
        return None
    m = _ARCHIVE_RE.fullmatch(fname, len(name) + 1)
    if m is None:
        raise StrayFile(f"{fname}: {_STRAY}")
    return int(m.group(1)), m.group(2) is not None


def archived_files(queue_path: str, name: str, discard=None, listing: list[str] | None = None) -> list[str]:
    """Archive file names of `name` in replay order, after finishing any pack:
    a `<name>.<ts>.pack` deletes every archive with t <= ts, then becomes `<name>.<ts>`.
    `discard(path)` deletes instead of os.unlink (the worker's journals: off the loop).
    `listing`: the regular files of `name` known to be in the directory (`files_by_queue`),
    so opening one queue among thousands costs no listing of them all (issue 8)."""
    check_name(name)
    while True:
        entries = []
        for fname in os.listdir(queue_path) if listing is None else listing:
            p = parse_archive(name, fname)
            if p is not None and (listing is not None or os.path.isfile(os.path.join(queue_path, fname))):
                entries.append((p[0], p[1], fname))
        packs = sorted(e for e in entries if e[1])
        if not packs:
            entries.sort()
            return [e[2] for e in entries]
        ts, _, pack = packs[0]
        for t, is_pack, fname in entries:
            if not is_pack and t <= ts:
                log.info("queue %r: deleting packed file %s", name, fname)
                (discard or os.unlink)(os.path.join(queue_path, fname))
        os.rename(os.path.join(queue_path, pack), os.path.join(queue_path, f"{name}.{ts}"))
        if listing is not None:      # what the directory holds now, as a new listing would say
            listing = [f for t, is_pack, f in entries if f != pack and (is_pack or t > ts)]
            listing.append(f"{name}.{ts}")


def journal_files(queue_path: str, name: str) -> list[str]:
    """Every journal file of the queue in replay order (names, current last if present)."""
    files = archived_files(queue_path, name)
    if os.path.isfile(os.path.join(queue_path, name)):
        files.append(name)
    return files


def stored_items(queue_path: str, name: str) -> int | None:
    """Items (queued or open) the journal files of `name` hold, read without changing them
    (no replay, no truncation); None if a file cannot be read to its end."""
    queued = 0
    opened: set[int] = set()
    try:
        files = journal_files(queue_path, name)
    except OSError:
        return None
    for fname in files:
        try:
            cur = Cursor(os.path.join(queue_path, fname), fname, items=False)
        except OSError:
            return None
        try:
            while True:
                try:
                    r = cur.read(0)
                except JournalCorrupt as e:
                    if e.torn and fname == files[-1]:
                        break
                    return None
                if r is None:
                    break
                op = r[0]
                if op in ADD_OPS:
                    if op == OP_CONTINUE:
                        opened.discard(r[2])
                    queued += 1
                elif op == OP_REMOVE or op == OP_REMOVE_TENTATIVE or op == OP_REMOVE_TENTATIVE_XID:
                    if queued:
                        queued -= 1
                        if op != OP_REMOVE:
                            opened.add(r[2])
                elif op == OP_UNREMOVE:
                    if r[2] in opened:
                        opened.discard(r[2])
                        queued += 1
                elif op == OP_CONFIRM_REMOVE:
                    opened.discard(r[2])
        finally:
            cur.close()
    return queued + len(opened)


def queue_names_in(queue_path: str) -> list[str]:
    """Names of the queues whose journals are in `queue_path` (start-up listing, §5.1),
    sorted: regular files only (directories such as `cmdlog/` are not journals), `~~`
    temporaries ignored, name = the part before the first `.`, after which only an
    archive suffix (`<ms>` or `<ms>.pack`) may follow.  Any other file, or a name that is
    not a legal journal queue name, raises StrayFile naming it."""
    names = set()
    with os.scandir(queue_path) as it:
        for entry in it:
            if "~~" in entry.name or not entry.is_file():
                continue
            name, dot, rest = entry.name.partition(".")
            if dot and not _ARCHIVE_RE.fullmatch(rest):
                raise StrayFile(f"{entry.path}: {_STRAY}")
            try:
                validate_queue_name(name)
            except ValueError as e:
                raise StrayFile(f"{entry.path}: {e}") from None
            names.add(name)
    return sorted(names)


def files_by_queue(queue_path: str) -> dict[str, list[str]]:
    """One listing of `queue_path` for a worker's start (storage/factory.py): the regular
    files under each name they could belong to, i.e. the part before the first `.` (the
    journal and its archives, and any `<name>.<junk>` that archived_files calls a stray)
    and the part before the first `~~` (temporaries).  Raises FileNotFoundError."""
    out: dict[str, list[str]] = {}
    with os.scandir(queue_path) as it:
        for entry in it:
            if not entry.is_file():
                continue
            fname = entry.name
            key = fname.partition(".")[0]
            out.setdefault(key, []).append(fname)
            tmp = fname.partition("~~")[0]
            if tmp != fname and tmp != key:
                out.setdefault(tmp, []).append(fname)
    return out


def zeros_from(path: str, offset: int) -> bool:
    """True if every byte of `path` from `offset` on is zero."""
    with open(path, "rb") as f:
        f.seek(offset)
        while True:
            chunk = f.read(CHUNK)
            if not chunk:
                return True
            if chunk.count(0) != len(chunk):
                return False


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def erase_files(queue_path: str, name: str, listing: list[str] | None = None) -> None:
    """Delete every journal file of `name` (`keep_journal = false`, delete); `listing` as
    for archived_files."""
    check_name(name)
    if listing is None:
        try:
            listing = os.listdir(queue_path)
        except FileNotFoundError:
            return
    for fname in listing:
        if fname == name or fname.startswith(name + ".") or fname.startswith(name + "~~"):
            path = os.path.join(queue_path, fname)
            if os.path.isfile(path):
                os.unlink(path)


def write_all(fd: int, buf, path: str, write=os.write) -> int:
    """Write all of `buf` (short writes continued); JournalError names `path`.  `write` is
    the writer's own hook when it has one (tests inject failures there)."""
    total = len(buf)
    done = 0
    with memoryview(buf) as view:
        while done < total:
            try:
                n = write(fd, view[done:])
            except OSError as e:
                raise JournalError(path, f"write failed: {e.strerror or e}", e.errno) from e
            if n <= 0:
                raise JournalError(path, "write returned 0")
            done += n
    return total


def unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
