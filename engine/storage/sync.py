"""When written records are made durable: the sync policy, in one place.

Every byte stream records go into (a journal, a command-log partition: a storage's
`medium`) has a `sync_policy`, from `sync_journal` or `[cmdlog] sync`:

* "never": the owner writes the buffer to the OS at the end of every batch (it survives
  `kill -9` of the process, not a power cut); fsync only at close and rotation.
* "always": replies wait until what they depend on is fsynced (the worker's group
  commit; the collection fsyncs inline).
* a period in ms: written every batch; fsynced no later than that long after the first
  write that left it unsynced (the owner asks `due` on its timer; the collection, which
  has no timer, at its next call).

The owner writes, then calls `written(medium, now)`: True means fsync before replying.
"""
from __future__ import annotations

import logging

log = logging.getLogger(__name__)


class SyncSchedule:
    __slots__ = ("_due",)

    def __init__(self) -> None:
        self._due: dict[object, int] = {}        # medium -> epoch ms its periodic fsync is due

    def __len__(self) -> int:
        """Periodic fsyncs scheduled (an owner with a timer re-arms it when this grows)."""
        return len(self._due)

    def written(self, medium, now_ms: int) -> bool:
        """`medium` has just been written: True if its replies must wait for an fsync."""
        policy = medium.sync_policy
        if policy == "always":
            return True
        if policy != "never" and medium not in self._due:
            self._due[medium] = now_ms + policy
        return False

    def due(self, now_ms: int) -> list:
        """The media whose periodic fsync is due, taken off the schedule."""
        due = [m for m, t in self._due.items() if t <= now_ms]
        for m in due:
            del self._due[m]
        return due

    def next_deadline(self) -> int | None:
        return min(self._due.values()) if self._due else None

    def forget(self, medium) -> None:
        self._due.pop(medium, None)


def sync_all(media) -> None:
    """fsync each of `media`, logging failures (a periodic fsync: its replies are sent)."""
    for m in media:
        try:
            m.sync()
        except OSError as e:
            log.error("fsync failed: %s", e)
