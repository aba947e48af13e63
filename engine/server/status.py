"""Server status (reference §5.11): Up, WriteAvoid, ReadOnly, Quiescent, Down.

Every front and worker reads the status on every request, and any of them may
change it (the `status` command), rarely.  So the state is a tiny fixed block
that can sit in a shared `mmap` made by the supervisor before it forks, or in
a bytearray for stand-alone use, and every process keeps a ServerStatus over it.

Block layout (native byte order; the block never leaves this machine):

    offset  0  u64  seq          seqlock sequence: odd while a write is under way
    offset  8  u32  magic        BLOCK_MAGIC once initialised by create()
    offset 12  u8   reported     index into STATUSES: what `status` prints
    offset 13  u8   previous     index: what stays enforced until enforce_at
    offset 14  u16  (zero)
    offset 16  i64  enforce_at   monotonic ms at which `reported` becomes enforced; 0 = already

The grace period needs no timer: enforced() is `previous` while the clock is
before `enforce_at` and `reported` after it.  Time is the clock's monotonic()
in ms, which on Linux (CLOCK_MONOTONIC) is the same in every process and does
not jump with the wall clock.

Writers (set, set_down, create) serialise with `flock` on `<status_file>.lock`,
opened afresh for each change so that a descriptor inherited across fork never
lets two processes hold "the same" lock, plus a thread lock.  Under that lock
they rewrite the status file (temp file, fsync, rename) and then the block: seq
+1 (odd), payload, seq +1 (even).  Readers never lock: they read seq, skip when
it is odd, read the payload and keep it only if seq is unchanged.  seq is stored
through a native 'Q' memoryview (one aligned 8-byte store, atomic on x86-64 and
arm64), and CPython issues each buffer access from a separate C call, so the
stores are not reordered past each other in practice; x86-64 keeps stores in
program order (TSO).  A reader caches the decoded payload with its seq and
decodes again only when seq moves, so the per-request cost is one memoryview
read and a comparison (plus a clock read while a change is pending).

A writer killed between its two seq increments leaves seq odd.  A reader that
sees an odd seq for too long takes the lock (the dead writer's lock went with
its process) and repairs the block: it completes the sequence and, if the
payload is not valid, restores it from the status file.

The status file holds `<Name>\\n` for every accepted change except Down, which
is internal to shutdown and never persisted.  At start-up its first line is
read case-insensitively and applied at once, without grace; if it is missing,
unreadable or not a settable status, the configured default is used.
"""
from __future__ import annotations

import fcntl
import logging
import os
import struct
import threading
from contextlib import contextmanager
from typing import ClassVar, Iterator

log = logging.getLogger(__name__)

STATUSES = ("Up", "WriteAvoid", "ReadOnly", "Quiescent", "Down")   # least to most strict
UP, WRITE_AVOID, READ_ONLY, QUIESCENT, DOWN = range(5)

_SETTABLE = {name.lower(): i for i, name in enumerate(STATUSES) if i != DOWN}

BLOCK_MAGIC = 0x4C537431          # "LSt1"
_PAYLOAD = struct.Struct("=IBBHq")  # magic, reported, previous, pad, enforce_at
_SPINS = 100_000                  # odd-seq reads before assuming the writer died


class StatusError(Exception):
    """A refused status change; str() is Kestrel's message ("Unknown status." or "Status forbidden.")."""


def parse_status(name: str) -> int:
    """Index of a settable status named case-insensitively."""
    if not isinstance(name, str):
        raise StatusError("Unknown status.")
    key = name.strip().lower()
    if key == "down":
        raise StatusError("Status forbidden.")
    index = _SETTABLE.get(key)
    if index is None:
        raise StatusError("Unknown status.")
    return index


def read_status_file(path: str) -> str | None:
    """The canonical status stored in `path`, or None when it is missing,
    unreadable or not a settable status (Down is never stored, so it is refused too)."""
    try:
        with open(path, encoding="utf-8") as f:
            line = f.readline()
    except FileNotFoundError:
        log.info("no status stored at %s", path)
        return None
    except (OSError, UnicodeDecodeError) as e:
        log.error("unable to read stored status at %s: %s", path, e)
        return None
    index = _SETTABLE.get(line.strip().lower())
    if index is None:
        log.error("unable to parse stored status %r in %s", line.strip(), path)
        return None
    return STATUSES[index]


class ServerStatus:
    """One process's handle on the shared status block."""

    SIZE: ClassVar[int] = 8 + _PAYLOAD.size

    __slots__ = ("_mv", "seq", "_file", "_lock_path", "_clock", "_grace", "_tlock", "_cache", "clear")

    def __init__(self, buf, status_file: str, clock, grace_ms: int = 0) -> None:
        mv = memoryview(buf).cast("B")
        if mv.readonly:
            raise ValueError("status block must be writable")
        if len(mv) < self.SIZE:
            raise ValueError(f"status block needs {self.SIZE} bytes, got {len(mv)}")
        self._mv = mv[: self.SIZE]
        self.seq = self._mv[:8].cast("Q")
        self._file = os.fspath(status_file)
        self._lock_path = self._file + ".lock"
        self._clock = clock
        self._grace = int(grace_ms)
        self._tlock = threading.Lock()
        # (seq, reported, previous, enforce_at) as last decoded; one tuple so that
        # a thread never sees half of an update.  seq -1: nothing decoded yet.
        self._cache: tuple[int, int, int, int] = (-1, UP, UP, 0)
        # The seq word's value while it blocks neither reads nor writes (no stricter change in
        # its grace period), else -1: a request's check is `seq[0] != clear` and, only when it
        # differs, blocks_reads/blocks_writes (a Python call per request, ~750 instructions,
        # for what is nearly always "Up").  Kept by `_note`, wherever `_cache` is set.
        self.clear = -1

    @classmethod
    def create(cls, buf, status_file: str, default_status: str, clock, grace_ms: int = 0) -> "ServerStatus":
        """Start-up: initialise the block from the status file (or `default_status`), with no grace."""
        index = _SETTABLE.get(str(default_status).strip().lower())
        if index is None:
            raise ValueError(f"default status {default_status!r} is not one of Up, WriteAvoid, ReadOnly, Quiescent")
        status = cls(buf, status_file, clock, grace_ms)
        stored = read_status_file(status.status_file)
        if stored is not None:
            index = _SETTABLE[stored.lower()]
        with status._locked():
            status._store(index, index, 0)
        log.info("server status %s%s", STATUSES[index], "" if stored else " (default)")
        return status

    @property
    def status_file(self) -> str:
        return self._file

    # ---------------------------------------------------------------- readers

    def _refresh(self) -> tuple[int, int, int, int]:
        """The payload, decoded again if seq moved since the cached copy (seqlock read side)."""
        seq = self.seq
        for _ in range(_SPINS):
            s1 = seq[0]
            cache = self._cache
            if s1 == cache[0]:
                return cache
            if s1 & 1:
                continue
            magic, rep, prev, _pad, at = _PAYLOAD.unpack_from(self._mv, 8)
            if seq[0] != s1:
                continue
            if magic != BLOCK_MAGIC or rep > DOWN or prev > DOWN:
                raise RuntimeError(f"server status block for {self._file} is not initialised "
                                   "(ServerStatus.create must run first)")
            cache = self._cache = (s1, rep, prev, at)
            self._note(cache)
            return cache
        with self._locked():        # repairs a block left odd by a dead writer
            pass
        return self._refresh()

    def _now(self) -> int:
        return round(self._clock.monotonic() * 1000)

    def _enforced_index(self) -> int:
        cache = self._cache
        if self.seq[0] != cache[0]:
            cache = self._refresh()
        at = cache[3]
        if at and self._now() < at:
            return cache[2]
        return cache[1]

    def reported(self) -> str:
        """What `status` prints: the latest accepted status, even during its grace period."""
        cache = self._cache
        if self.seq[0] != cache[0]:
            cache = self._refresh()
        return STATUSES[cache[1]]

    def enforced(self) -> str:
        """What blocks requests now: the previous status until a stricter change's grace ends."""
        return STATUSES[self._enforced_index()]

    # Asked for a request whose `seq[0] != clear` (the fronts test that first): the cached
    # status answers when it is current and no stricter change is in its grace period.
    def blocks_reads(self) -> bool:
        cache = self._cache
        if self.seq[0] == cache[0] and not cache[3]:
            return cache[1] >= QUIESCENT
        return self._enforced_index() >= QUIESCENT

    def blocks_writes(self) -> bool:
        cache = self._cache
        if self.seq[0] == cache[0] and not cache[3]:
            return cache[1] >= READ_ONLY
        return self._enforced_index() >= READ_ONLY

    # ---------------------------------------------------------------- writers

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with self._tlock:
            directory = os.path.dirname(self._lock_path)
            if directory:
                os.makedirs(directory, exist_ok=True)
            fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                self._repair()
                yield
            finally:
                os.close(fd)        # releases the flock

    def _repair(self) -> None:
        """Under the lock, finish the update of a writer that died half-way."""
        s = self.seq[0]
        if not s & 1:
            return
        magic, rep, prev, _pad, at = _PAYLOAD.unpack_from(self._mv, 8)
        if magic == BLOCK_MAGIC and rep <= DOWN and prev <= DOWN:
            log.error("status block for %s was left mid-update by a dead process; keeping %s",
                      self._file, STATUSES[rep])
            self.seq[0] = s + 1
            return
        name = read_status_file(self._file) or "Up"
        log.error("status block for %s was torn by a dead process; restoring %s from the file",
                  self._file, name)
        index = _SETTABLE[name.lower()]
        _PAYLOAD.pack_into(self._mv, 8, BLOCK_MAGIC, index, index, 0, 0)
        self.seq[0] = s + 1

    def _store(self, rep: int, prev: int, at: int) -> None:
        """Seqlock write side; the caller holds the lock, so seq is even here."""
        seq = self.seq
        s = seq[0]
        seq[0] = s + 1
        _PAYLOAD.pack_into(self._mv, 8, BLOCK_MAGIC, rep, prev, 0, at)
        seq[0] = s + 2
        self._cache = (s + 2, rep, prev, at)
        self._note(self._cache)

    def _note(self, cache: tuple[int, int, int, int]) -> None:
        """`clear` for the payload just decoded or stored."""
        self.clear = cache[0] if not cache[3] and cache[1] < READ_ONLY else -1

    def _load(self) -> tuple[int, int, int]:
        """The current payload; only under the lock, when no write can be under way."""
        magic, rep, prev, _pad, at = _PAYLOAD.unpack_from(self._mv, 8)
        if magic != BLOCK_MAGIC:
            raise RuntimeError(f"server status block for {self._file} is not initialised "
                               "(ServerStatus.create must run first)")
        return rep, prev, at

    def set(self, name: str) -> bool:
        """Apply a status change asked for by a client (§5.11).

        Returns False when the change is silently ignored because a stricter
        change is still in its grace period and `name` is not looser than the
        reported status.  Accepted changes are persisted before they are
        published; a failure to write the file is logged, as Kestrel does, and
        the change still applies.
        """
        new = parse_status(name)
        with self._locked():
            rep, prev, at = self._load()
            now = self._now()
            pending = bool(at) and now < at
            if pending and new >= rep:
                log.warning("status change from %s to %s ignored: change to %s still pending",
                            STATUSES[rep], STATUSES[new], STATUSES[rep])
                return False
            if new > rep and self._grace > 0:
                state = (new, rep, now + self._grace)   # not pending here, so rep is enforced
            else:
                state = (new, new, 0)                   # looser, equal or no grace: at once
            self._persist(STATUSES[new])
            self._store(*state)
        log.info("switched to status %s (previously %s)%s", STATUSES[new], STATUSES[rep],
                 f"; enforced in {self._grace} ms" if state[2] else "")
        return True

    def set_down(self) -> None:
        """Shutdown: Down at once, cancelling any pending change, never persisted."""
        with self._locked():
            self._store(DOWN, DOWN, 0)
        log.info("switched to status Down")

    def _persist(self, name: str) -> None:
        path = self._file
        directory = os.path.dirname(path) or "."
        tmp = f"{path}.tmp.{os.getpid()}"
        try:
            os.makedirs(directory, exist_ok=True)
            with open(tmp, "w", encoding="ascii") as f:
                f.write(name + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError as e:
            log.error("unable to store status %s in %s: %s", name, path, e)
            try:
                os.unlink(tmp)
            except OSError:
                pass

    def close(self) -> None:
        """Release the views on the buffer (an mmap cannot close while they exist)."""
        self.seq.release()
        self._mv.release()
