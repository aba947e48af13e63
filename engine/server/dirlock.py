"""One server per data directory: an exclusive `flock` held for the server's life.

Two servers on one queue directory replay the same journals and both append to
them (issue 11: items delivered twice and acknowledged items lost).  So `lanner
serve` locks `<queue_path>/.lanner/server.lock` and `<status_file>.server.lock`
before it binds anything, and writes its pid into each after locking.  The lock is a BSD
`flock` on an open file description: the supervisor takes it and every child
inherits the descriptor through fork, so the lock lasts until the last process of
the server exits, and the kernel drops it whatever the way out (`kill -9`
included).  Nothing needs cleaning up after a crash: a stale file with a dead pid
is simply locked again.

The queue directory's lock lives in a subdirectory: journal and command-log
discovery look at regular files only, so it is never mistaken for a journal.  The
files stay after the server exits: unlinking a lock file races with a process
waiting to lock it, and a leftover is harmless.

Offline tools (`lanner qdump`/`qpack`, `lanner cmdlog`) call `live_holder` on the
directory they read and refuse a directory a running server holds unless told
`--ignore-lock`.
"""
from __future__ import annotations

import errno
import fcntl
import os

LOCK_DIR = ".lanner"
LOCK_NAME = "server.lock"
STATUS_LOCK_SUFFIX = ".server.lock"


class DirLocked(Exception):
    """Another live process holds the lock; str() is the one line for stderr."""

    def __init__(self, what: str, pid: int | None) -> None:
        self.pid = pid
        holder = f"pid {pid}" if pid else "a process whose pid is not recorded"
        super().__init__(f"{what} is in use by another lanner server ({holder}); stop it first")


class PathClash(Exception):
    """The status file would sit in the queue directory, where every file is read as a journal
    (the default status file `data/status` does with `--queue-path data`)."""


def queue_lock_path(queue_path: str) -> str:
    return os.path.join(queue_path, LOCK_DIR, LOCK_NAME)


def status_lock_path(status_file: str) -> str:
    return status_file + STATUS_LOCK_SUFFIX


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def acquire(path: str, what: str) -> int:
    """Lock `path` (created if missing) for this process and its children; return the
    descriptor, to keep open for the server's life.  Raises DirLocked naming `what`
    and the holder's pid."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        pid = _read_pid(fd)
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise DirLocked(what, pid) from None
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, b"%d\n" % os.getpid(), 0)
    os.set_inheritable(fd, True)
    return fd


def lock_server(queue_path: str, status_file: str) -> list[int]:
    """Both locks of a server, queue directory first.  Descriptors to keep open."""
    if os.path.realpath(os.path.dirname(os.path.abspath(status_file))) == os.path.realpath(queue_path):
        raise PathClash(f"status file {status_file} is inside the queue path {queue_path}, where "
                        "every file is read as a journal; give --status-file (status_file) a path "
                        "outside it")
    os.makedirs(os.path.join(queue_path, LOCK_DIR), exist_ok=True)
    fds = [acquire(queue_lock_path(queue_path), f"queue path {queue_path}")]
    try:
        os.makedirs(os.path.dirname(os.path.abspath(status_file)), exist_ok=True)
        fds.append(acquire(status_lock_path(status_file), f"status file {status_file}"))
    except BaseException:
        os.close(fds[0])
        raise
    return fds


def live_holder(directory: str, levels: int = 2) -> int | None:
    """The pid of a running server holding `directory` or one of its `levels` parents
    (a command-log partition lives two levels under the queue path), 0 when the holder
    is live but its pid unknown, None when no server holds it."""
    d = os.path.abspath(directory)
    for _ in range(levels + 1):
        path = queue_lock_path(d)
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            fd = -1
        if fd >= 0:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                pid = _read_pid(fd)
                return pid or 0
            finally:
                os.close(fd)            # also drops the shared lock we may have taken
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    return None


def refuse_live(paths, ignore_lock: bool) -> str | None:
    """For an offline tool: the one-line refusal when a running server holds the
    directory of any of `paths` (files or directories), else None."""
    if ignore_lock:
        return None
    seen = set()
    for p in paths:
        d = p if os.path.isdir(p) else os.path.dirname(os.path.abspath(p))
        if d in seen:
            continue
        seen.add(d)
        pid = live_holder(d)
        if pid is not None:
            holder = f"pid {pid}" if pid else "a running process"
            return (f"{d} is in use by a running lanner server ({holder}); stop it, or pass "
                    f"--ignore-lock to read files it may be writing")
    return None
