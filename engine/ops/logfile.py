"""`--log-file` / `server.log_file`, reopened on SIGUSR1 for logrotate.

`install(path, level)` runs in the supervisor before any fork and puts a
`ReopeningFileHandler` on the root logger.  Every process inherits it.  The
handler keeps the generation it opened at and compares it, on each record, with
a generation word in anonymous shared memory (made here, before the forks).
SIGUSR1 reaches the supervisor only (`kill -USR1 <main pid>`, as the unit file's
logrotate note says); it calls `request_reopen()`, which bumps the word and
reopens at once, and every other process reopens the path at its next record.
A process that logs nothing keeps the old file open until it next logs.

The check costs one read of a shared word per record; no signal has to reach
the workers and fronts, and their code does not change.
"""
from __future__ import annotations

import logging
import mmap

FORMAT = "%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s"

_gen: memoryview | None = None


def _shared_generation() -> memoryview:
    global _gen
    if _gen is None:
        _gen = memoryview(mmap.mmap(-1, 8, flags=mmap.MAP_SHARED)).cast("Q")
    return _gen


class ReopeningFileHandler(logging.FileHandler):
    """A FileHandler that reopens its file when the shared generation moves."""

    def __init__(self, path: str) -> None:
        self.gen = _shared_generation()
        self.seen = self.gen[0]
        super().__init__(path, mode="a", encoding="utf-8", delay=False)

    def emit(self, record: logging.LogRecord) -> None:
        g = self.gen[0]
        if g != self.seen:
            self.seen = g
            self._reopen()
        super().emit(record)

    def _reopen(self) -> None:
        if self.stream is not None:
            try:
                self.stream.close()
            except OSError:
                pass
        self.stream = self._open()


def install(path: str, level: int) -> ReopeningFileHandler:
    """Log to `path` (appending; created if missing) instead of stderr."""
    h = ReopeningFileHandler(path)
    h.setFormatter(logging.Formatter(FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(h)
    root.setLevel(level)
    return h


def request_reopen() -> None:
    """SIGUSR1 in the supervisor: every process reopens its log file at its next record."""
    gen = _shared_generation()
    gen[0] += 1
    for h in logging.getLogger().handlers:
        if isinstance(h, ReopeningFileHandler):
            h.acquire()
            try:
                h.seen = gen[0]
                h._reopen()
            finally:
                h.release()
