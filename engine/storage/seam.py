"""The storage seam: the one small interface between a queue and where its items live.

A `PersistentQueue` (queue.py) keeps its semantics (limits, expiry, open
transactions, waiters, stats) and tells its storage what happened, one call per
state change.  Two backends sit behind this seam, chosen per queue by the
`storage` config key:

* `journal.Journal`: Kestrel's per-queue journal files (reference §6);
* `cmdlog.CmdlogStorage`: a queue's view of its partition's workq command log.

`MemoryStorage` below keeps nothing (and is what `keep_journal = false` uses).

Call protocol, as the queue uses it:

1. `replay(config)` once, before anything else: rebuild the queue's state from
   disk and return a `ReplayState`.  The queue then rolls back every open
   transaction left in it (reference §5.9: descending xid order, each through
   `record_unremove`), so that reserved items come back first.
2. Every state change, after the in-memory change and before the reply:
   `record_add`, `record_remove` (the head item leaves for good: plain get,
   expiry, discard, flush), `record_open` (reserved under xid),
   `record_unremove`, `record_confirm`.  An expired item moving to another
   worker's queue is an open read too (server/moves.py), recorded through
   `record_move_open` where a storage has it (a command log: its replay must keep
   the expired job) and `record_open` otherwise.
3. `before_add(view)` runs before an add is recorded and `after_remove(view)`
   after a remove that returned an item; that is where a journal rotates,
   rewrites or checkpoints (§6.4).  `view` is the queue (see `QueueView`).
   The queue calls them only while the storage's `check_due` is true: a storage
   whose hooks have nothing to do until its records grow (a journal below its
   size limits) clears it and sets it again itself (a record reaching the limit);
   the queue sets it on a reload (new limits).  Per request those were two calls.
   `check_due` may also be a number of bytes: the queue calls them only while its bytes are
   below it.  A journal whose rules left before its next size limit need an empty queue sets
   `WHEN_EMPTY` (1: no bytes), one whose compacting rewrite needs the queue under
   max_memory_size sets that (a backlog read behind).  `EVERY_TIME` is above any queue's bytes:
   the hooks run at every operation, but first look at the clock (a journal inside
   min_journal_compact_delay).
4. Read-behind (§5.8): when `in_read_behind` is true the queue keeps only a
   prefix of its items in memory and asks `fill_read_behind(max_bytes, now)` for
   more after every removal.  Storages that cannot read behind return False from
   `can_read_behind` and the queue keeps everything in memory.  A flush ends
   read-behind with `drop_behind(n)`: the `n` items not in memory are recorded
   removed without being read (it returns (mark, token), or None when not in
   read-behind); `undrop_behind(token)` takes that back (point 6).
5. Durability: record_* calls buffer and never raise for I/O; each returns the
   position ("mark") in `medium` where its record starts (None for a storage that
   keeps nothing).  `flush()` hands buffered bytes to the OS (one write per
   batch: after it returns, the data survives `kill -9` of the process);
   `sync()` makes them durable (fsync).  `sync_policy` tells the owner which of
   "never", "always" or a period in ms the queue asked for.  The owner (a worker,
   or the collection in stand-alone use) decides when to call them.
6. When a flush or sync fails, the owner rolls back (queues/undo.py): every
   change recorded at or after `medium.written_mark` (a failed write) or
   `medium.durable_mark` (a failed fsync under "always") is undone in the
   queue, `undo_record(kind, item, xid)` lets the storage fix its own
   bookkeeping, and `medium.rollback(mark)` drops those records (buffered bytes,
   and bytes written but not made durable).  `medium.committed_mark` is where
   records stop being revocable: written, or fsynced when the policy is "always".
   `medium` is the byte stream the marks count: the storage itself, or what
   several storages share (a command-log partition).
7. `close()` flushes and syncs (raising if it cannot); `erase()` deletes every
   record of the queue (raising, with nothing changed, if it cannot).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Iterable, Protocol

from lanner.queues.item import QItem


@dataclass
class ReplayState:
    """What replay rebuilt.  `items` holds the in-memory part of the queue in
    order; when `read_behind` is true more items (`total_items - len(items)`,
    `total_bytes - sum(len)` of them) wait on disk and come back through
    `fill_read_behind`."""

    items: deque[QItem] = field(default_factory=deque)
    total_items: int = 0          # queue length including items not in memory
    total_bytes: int = 0
    open_transactions: dict[int, QItem] = field(default_factory=dict)   # xid -> item
    xid_counter: int = 0          # last xid seen; the next xid is counter + 1
    read_behind: bool = False
    replayed_adds: int = 0        # ADD-type records applied: feeds the queue's total_items stat


class QueueView(Protocol):
    """What a storage may read of its queue when deciding to rotate or rewrite."""

    name: str

    @property
    def length(self) -> int: ...           # items queued (excludes open transactions)

    @property
    def size_bytes(self) -> int: ...       # bytes of those items

    def memory_items(self) -> Iterable[QItem]: ...       # in-memory items, head first

    def open_items(self) -> dict[int, QItem]: ...       # xid -> reserved item


class Medium(Protocol):
    """A byte stream records go into; marks are positions in it and only grow."""

    @property
    def written_mark(self) -> int: ...     # end of what the OS has (start of the buffer)
    @property
    def durable_mark(self) -> int: ...     # end of what is fsynced
    @property
    def committed_mark(self) -> int: ...   # durable under sync "always", else written
    def rollback(self, mark: int) -> None: ...


#: `check_due` of a storage whose hooks have something to do only while the queue holds no bytes
#: (point 3); truthy, and not `True`, so a queue asks no more than before while it is False.
WHEN_EMPTY = 1
#: `check_due` above every queue's bytes (point 3): the hooks run at every operation, and decide
#: themselves (by the clock) whether there is more to do; `True` again once records reach a limit.
EVERY_TIME = float("inf")


class QueueStorage(Protocol):
    sync_policy: str | int      # "never" | "always" | period in ms
    medium: Medium | None

    def replay(self, config) -> ReplayState: ...
    def record_add(self, item: QItem) -> int | None: ...
    def record_remove(self, item: QItem) -> int | None: ...
    def record_open(self, item: QItem, xid: int) -> int | None: ...
    def record_unremove(self, item: QItem, xid: int) -> int | None: ...
    def record_confirm(self, item: QItem, xid: int) -> int | None: ...
    def undo_record(self, kind: int, item: QItem, xid: int) -> None: ...
    def before_add(self, view: QueueView, config, now_ms: int) -> None: ...
    def after_remove(self, view: QueueView, config, now_ms: int) -> None: ...
    check_due: bool | int | float    # whether the queue calls the two above, or below how many bytes (point 3)

    @property
    def can_read_behind(self) -> bool: ...
    @property
    def in_read_behind(self) -> bool: ...
    def start_read_behind(self) -> None: ...
    def fill_read_behind(self, max_bytes: int, now_ms: int) -> list[QItem]: ...
    def drop_behind(self, n: int) -> tuple[int | None, object] | None: ...
    def undrop_behind(self, token) -> None: ...
    def read_back(self, mark: int) -> bool: ...   # read-behind returned the record at `mark`

    @property
    def dirty(self) -> bool: ...           # has buffered or unsynced records
    def flush(self) -> None: ...
    def sync(self) -> None: ...
    def close(self) -> None: ...
    def erase(self) -> None: ...

    # stats
    @property
    def logsize(self) -> int: ...          # current journal file size (0 if none)
    rewrites: int
    rotations: int


class MemoryStorage:
    """Keeps nothing: the backend of `keep_journal = false` and of unit tests."""

    sync_policy = "never"
    medium = None
    can_read_behind = False
    in_read_behind = False
    dirty = False
    check_due = False           # its hooks never have anything to do
    logsize = 0
    rewrites = 0
    rotations = 0

    def replay(self, config) -> ReplayState:
        return ReplayState()

    def record_add(self, item: QItem) -> None:
        return None

    def record_remove(self, item: QItem) -> None:
        return None

    def record_open(self, item: QItem, xid: int) -> None:
        return None

    def record_unremove(self, item: QItem, xid: int) -> None:
        return None

    def record_confirm(self, item: QItem, xid: int) -> None:
        return None

    def undo_record(self, kind: int, item: QItem, xid: int) -> None:
        pass

    def before_add(self, view, config, now_ms: int) -> None:
        self.check_due = False

    def after_remove(self, view, config, now_ms: int) -> None:
        self.check_due = False

    def start_read_behind(self) -> None:
        raise RuntimeError("memory storage cannot read behind")

    def fill_read_behind(self, max_bytes: int, now_ms: int) -> list[QItem]:
        return []

    def drop_behind(self, n: int) -> None:
        return None

    def undrop_behind(self, token) -> None:
        raise RuntimeError("memory storage cannot read behind")

    def read_back(self, mark: int) -> bool:
        return False

    def flush(self) -> None:
        pass

    def sync(self) -> None:
        pass

    def close(self) -> None:
        pass

    def erase(self) -> None:
        pass
