"""The thread engine of a syncer (storage/syncer.py): without io_uring (or with a test's fsync
functions), a few daemon threads call `medium.sync()`, which releases the GIL.

Apart from syncer.py because it is the one place that runs fsyncs off the owner's thread; the
rounds' bookkeeping (`_finish`) is shared with the io_uring engine and stays there.
"""
from __future__ import annotations

import logging
import threading

log = logging.getLogger("lanner.storage.syncer")     # the syncer's log, as before the split


class SyncThreads:
    """Syncer's fsync threads; the task queue and the thread list are the Syncer's."""

    def _spawn(self) -> None:
        if self._threads:
            return
        for i in range(self._nthreads):
            t = threading.Thread(target=self._run, name=f"{self._name}-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def _run(self) -> None:
        tasks = self._tasks
        while True:
            task = tasks.get()
            if task is None:
                return
            medium, rounds = task
            while rounds:           # the rounds that waited meanwhile: fsync again, at once
                error = None
                self.fsyncs += 1
                try:
                    medium.sync()
                except OSError as e:
                    log.error("fsync failed: %s", e)
                    error = e
                rounds = self._finish(medium, rounds, error)
