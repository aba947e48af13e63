"""Large journal writes off the owner's loop (issue 8, P8: a flood of 8 MiB items on one queue
must not stall small requests on the other queues of the worker).

A write of megabytes spends milliseconds to tens of milliseconds in the kernel (copying, and the
dirty-page throttling that makes a writer wait for the disk); on the loop, every other queue
waits as long.  The owner hands such a buffer to this thread instead (`Journal.write_behind`)
and goes on serving; os.write releases the GIL.  The thread only writes the bytes it was given
to the fd it was given, in order of submission, and says how it went: the stream's state (sizes,
marks, rollback) stays the owner's, who settles the job when it is done (`Journal.settle_write`),
and who never touches the buffer or closes the fd while the job is under way.

When a job's bytes are written (the OS has them: all the commit rule asks before a reply) the
job is done and the thread writes one byte to `notify_w`, which wakes the owner's loop.  Then,
before it takes the next job, the thread waits until the kernel has written those pages to the
disk (sync_file_range: write-out only, no metadata, not a durability promise; that is still
fsync's job), on a duplicate of the fd, since the owner may close its own once told.  Without
that wait a flood leaves hundreds of MB dirty, and the kernel's dirty-page throttling then
pauses every writer of the process, the loop's small journal writes too, and the loop's later
rename of the file at rotation or unlink of a packed file waits for all of it.  Waiting here
makes the flood, and only the flood, go at the disk's pace; waiting before the job is done made
every reply behind a big record (a small set on the flood's own queue) wait for the disk too
(issue 8: p50 140 ms, now about 1 ms).  A small write queued meanwhile (the records of small
items chained behind a big one, `Journal.write_behind`) goes before that wait: its replies wait
for it, and it adds too little to the dirty pages to matter.  Python's os module has no sync_file_range, so it is
called through ctypes (which releases the GIL); without it (not Linux) the thread only writes.

`run` takes other slow file work that the owner must see finished before it goes on with what
depends on it (a journal rewrite's write, fsyncs and renames, compaction.py): the owner keeps the
returned `CallJob` and adopts its outcome once `done` is set; `call` takes work nobody waits for
(unlinks).  Both run on a second thread, so no journal write waits behind them.
"""
from __future__ import annotations

import ctypes
import errno
import logging
import os
import threading
from queue import Empty, SimpleQueue

log = logging.getLogger(__name__)

# The thread's write, looked up at call time so tests can inject failures (ENOSPC, EIO).
_write = os.write

#: A write of fewer bytes (and no big item) may go before the write-out wait of the one before.
SMALL_WRITE = 256 << 10

# sync_file_range(2) flags: wait for write-out under way, start it, wait for it.
_WRITE_OUT = 1 | 2 | 4
# (looked up at call time, so tests can hold it)
try:
    _sync_file_range = ctypes.CDLL(None, use_errno=True).sync_file_range
    _sync_file_range.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    _sync_file_range.restype = ctypes.c_int
except (AttributeError, OSError):
    _sync_file_range = None


class WriteJob:
    """One buffer, then `tail` if any (a big item's own bytes: the journal does not copy them
    into its buffer), to append to one fd; `error` is the OSError it ended with, if any.  A job
    submitted `after` another of the same file is skipped with that one's error if it failed:
    nothing may land behind a failed write, which its owner cuts back (journal.py)."""
    __slots__ = ("fd", "buf", "tail", "after", "size", "done", "error")

    def __init__(self, fd: int, buf: bytearray, tail: bytes | None = None,
                 after: WriteJob | None = None) -> None:
        self.fd = fd
        self.buf = buf
        self.tail = tail
        self.after = after
        self.size = len(buf) + (len(tail) if tail is not None else 0)
        self.done = threading.Event()
        self.error: OSError | None = None

    def wait(self) -> None:
        self.done.wait()


class CallJob:
    """`fn(*args)` to run on the thread; `error` is the OSError it raised, if any."""
    __slots__ = ("fn", "args", "done", "error")

    def __init__(self, fn, args) -> None:
        self.fn = fn
        self.args = args
        self.done = threading.Event()
        self.error: OSError | None = None

    def wait(self) -> None:
        self.done.wait()


class Writer:
    """One thread that writes jobs in the order they came."""

    def __init__(self, notify_w: int, name: str = "writer") -> None:
        self.notify_w = notify_w
        self._jobs: SimpleQueue = SimpleQueue()
        self._thread: threading.Thread | None = None
        self._name = name
        self._files: Writer | None = None      # `call` and `run` jobs: a thread of their own

    def submit(self, fd: int, buf: bytearray, tail: bytes | None = None,
               after: WriteJob | None = None) -> WriteJob:
        job = WriteJob(fd, buf, tail, after)
        self._start()
        self._jobs.put(job)
        return job

    def call(self, fn, *args) -> None:
        """Run `fn(*args)` on the file-work thread after the `call`s and `run`s before it (an
        unlink); an OSError is logged."""
        files = self._file_thread()
        files._start()
        files._jobs.put((fn, args))

    def run(self, fn, *args) -> CallJob:
        """Run `fn(*args)` on the file-work thread after the `call`s and `run`s before it; the
        owner waits for or polls the returned job (`done`, `error`)."""
        job = CallJob(fn, args)
        files = self._file_thread()
        files._start()
        files._jobs.put(job)
        return job

    def _file_thread(self) -> Writer:
        """File work (unlinks of packed archives, a rewrite's fsyncs) has a thread of its own:
        those take 0.1-0.5 s under a flood, and on the write thread every journal write behind
        them waited as long (issue 8, same-queue fairness).  None of it depends on a write
        still queued: the owner starts it with none under way for the file it touches."""
        if self._files is None:
            self._files = Writer(self.notify_w, self._name + "-files")
        return self._files

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Stop the threads after the jobs already submitted (shutdown, tests)."""
        if self._files is not None:
            self._files.close()
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        jobs = self._jobs
        out = -1              # a dup of the fd of the last big write, whose write-out is due
        while True:
            if out >= 0:
                try:
                    job = jobs.get_nowait()
                except Empty:
                    job = _WRITE_OUT_DUE
                if not _small(job):               # a small write goes first: its reply waits
                    _sync_file_range(out, 0, 0, _WRITE_OUT)    # (a hint: its failure changes nothing)
                    os.close(out)
                    out = -1
                if job is _WRITE_OUT_DUE:
                    continue
            else:
                job = jobs.get()
            if job is None:
                return
            if type(job) is tuple:
                fn, args = job
                try:
                    fn(*args)
                except OSError as e:
                    log.error("%s", e)
                continue
            if type(job) is CallJob:
                try:
                    job.fn(*job.args)
                except OSError as e:
                    job.error = e
                job.done.set()
                os.write(self.notify_w, b"w")
                continue
            after, job.after = job.after, None      # (no chain of references to old jobs)
            try:
                if after is not None and after.error is not None:
                    raise after.error
                write_all(job.fd, job.buf, 0, _write)
                if job.tail is not None:
                    write_all(job.fd, job.tail, 0, _write)
            except OSError as e:
                job.error = e
            if out < 0 and job.error is None and _sync_file_range is not None and not _small(job):
                out = os.dup(job.fd)        # the owner may close its fd once told
            job.done.set()
            os.write(self.notify_w, b"w")


_WRITE_OUT_DUE = object()       # (`_run`: nothing queued, the write-out wait is next)


def _small(job) -> bool:
    """A write that need not wait for the write-out of the big one before it: a few records
    of small items (a reply waits for them), too few bytes to feed the dirty-page throttling."""
    return type(job) is WriteJob and job.tail is None and job.size < SMALL_WRITE


def write_all(fd: int, buf: bytearray | bytes, done: int, write) -> None:
    """Write `buf[done:]` whole with `write` (os.write, or a module's test seam), however short
    each write is.  The journal's inline flush and this thread both finish writes this way."""
    total = len(buf)
    with memoryview(buf) as view:
        while done < total:
            n = write(fd, view[done:])
            if n <= 0:
                raise OSError(errno.EIO, "write returned 0")
            done += n
