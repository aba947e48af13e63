"""The queues one process serves: `QueueCollection` (Kestrel's QueueCollection).

Stand-alone use needs nothing else:

    from lanner.queues.collection import QueueCollection
    from lanner.config import load_config
    with QueueCollection(load_config("lanner.toml")) as queues:
        queues.load()                      # bring up every queue found on disk
        queues.add("jobs", b"resize 42")
        item = queues.remove("jobs")       # QItem or None

In the server each worker process holds one, restricted by `owns(name)` to its
shard (placement.py), with `autoflush=False` because the worker batches writes
and fsyncs itself (group commit).

Rules kept here rather than in a queue (reference §4.3, §5):
* Creation on reference (§5.1): `add`, `remove`, `peek`, `wait` and `queue()`
  create a queue; confirm/abort, flush, delete, flush_expired and stats never do.
  Names are validated on creation; queues stored in a command log may contain
  `.` (workq job names), journal-stored ones may not (it separates the
  timestamp in journal file names).
* Fanout (§5.6): a child `a+b` registers with master `a` when the child object
  is created (by reference or at load), whether or not `a` exists.  A write to
  `a` first copies into every registered child, then adds to `a`; the reply is
  `a`'s result.  Deleting `a` keeps the registrations; deleting `a+b` drops it.
* expire_to_queue (§5.2): the target NAME is bound when the source queue is
  created (and the target created then, if this collection owns it); a reload
  does not redirect.  Moved items are added without client expiry, with add
  time now, without feeding the target's fanout children and without counting
  in the global total_items.  Given `expire_forward(target, data, now_ms, source,
  xid)` (a worker's), every move goes through it, into this collection's queues
  too: the owner of the target calls `add_forwarded`, and the source queue keeps
  the item as an open move (xid) in its journal until the owner calls
  `confirm_move(source, xid)` once the target's add is written (server/moves.py);
  a source deleted meanwhile keeps its storage until then (queues/deletes.py).  Unlike Kestrel, which kept a reference to the target
  object, a deleted target is re-created by the next move instead of
  swallowing it.
* Global counters (§4.3): total_items +1 per accepted add into a real queue
  (each fanout copy counts, replay and expiry moves do not), queue_creates
  (including queues loaded at start-up), queue_deletes, queue_expires,
  get_hits / get_misses per remove or peek result.
* Waiters: queues wake waiters into `self.woken` (the owner drains it and
  retries each fetch, re-adding losers with `wait`); deadlines live in
  `self.timers`.

Aliases are expanded by the server's fronts (their destinations may live in
other workers); `alias_add` is the stand-alone equivalent.  Their accounting
(`put_items`, `put_bytes`) is kept here for both: `count_alias_put`, `alias_stats`.

Write failures (disk full, I/O errors): `rollback`, `strand` and `abort_stranded` are
its base class's (queues/failures.py).
"""
from __future__ import annotations

import logging
import os
from functools import partial
from typing import Callable

from lanner.clock import SYSTEM_CLOCK
from lanner.queues.aliases import AliasCounts
from lanner.queues.item import QItem
from lanner.queues.names import validate_queue_name
from lanner.queues.queue import CollectionBase, PersistentQueue
from lanner.queues.sessions import Session
from lanner.queues.deletes import Deletes
from lanner.queues.failures import WriteFailures
from lanner.queues.forwarding import Forwarding
from lanner.queues.undo import UndoLog
from lanner.storage.factory import StorageFactory, StorageMismatch
from lanner.storage.sync import SyncSchedule, sync_all
from lanner.storage.journal.files import queue_names_in
from lanner.storage.journal.journal import Journal
from lanner.queues.waiters import TimerHeap, Waiter

log = logging.getLogger(__name__)


class QueueCollection(CollectionBase, WriteFailures, Deletes, Forwarding):
    # Slots, not a dict: the worker looks it up per request (test_hot_layout.py); "autoflush",
    # "total_items", "get_hits", "get_misses": CollectionBase's (queue.py).
    __slots__ = ("config", "clock", "_factory", "_owns", "_expire_forward", "_queues", "queues",
                 "_parked", "_children", "_alias_counts", "sync_schedule", "undo", "stranded", "woken",
                 "_touched", "timers", "closed", "queue_creates", "queue_deletes",
                 "queue_expires")

    def __init__(self, config, clock=SYSTEM_CLOCK, *,
                 storage_factory: Callable[[str, object], object] | None = None,
                 owns: Callable[[str], bool] | None = None,
                 expire_forward: Callable[[str, bytes, int, object, int], None] | None = None,
                 autoflush: bool = True) -> None:
        """`storage_factory(name, queue_config)` makes a queue's storage (default: a
        storage.factory.StorageFactory over every partition, the one that decides
        between journal, command log and memory).  A factory that also has
        `queue_names()` reports the queues its storages hold, so `load` brings them up;
        `check_home(name, qc)` vets a queue before it is made, `forget(name)` hears of
        every delete and `close()` is called by `close`.  `owns(name)`: the queues this
        collection serves (default all).  `autoflush`: hand records to the OS (and fsync
        per the queue's sync policy) at the end of every public call."""
        self.config = config
        self.clock = clock
        self.autoflush = autoflush
        self._factory = storage_factory if storage_factory is not None else StorageFactory(config, clock)
        self._owns = owns
        self._expire_forward = expire_forward
        self._queues: dict[str, PersistentQueue] = {}
        # read-only for others: the worker's fused set/get look a queue up here (worker.py)
        self.queues = self._queues
        self._parked: dict[str, PersistentQueue] = {}   # deleted, moves still open (`_park`)
        self._children: dict[str, list[str]] = {}      # master name -> registered child names
        self._alias_counts = AliasCounts()
        self.sync_schedule = SyncSchedule()           # periodic fsyncs (storage/sync.py)
        self.undo = UndoLog()
        self.stranded: dict[str, list[int]] = {}       # queue -> xids whose confirm/abort was undone
        self.woken: list[Waiter] = []
        self._touched: dict[PersistentQueue, None] = {}   # queues that may hold unflushed records, in order
        self.timers = TimerHeap()
        self.closed = False
        self.total_items = 0
        self.queue_creates = 0
        self.queue_deletes = 0
        self.queue_expires = 0
        self.get_hits = 0
        self.get_misses = 0

    def __enter__(self) -> "QueueCollection":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def queue_path(self) -> str:
        return self.config.server.queue_path

    # -- start-up ------------------------------------------------------------------------------
    def load(self, progress: Callable[[str, int, int], None] | None = None) -> None:
        """Create and replay every queue found under queue_path that this
        collection owns: journal files (§5.1 "Startup") and command-log queues."""
        journal = self._journal_names()
        names = journal + self._cmdlog_names()
        names = [n for n in dict.fromkeys(names) if self._owns is None or self._owns(n)]
        total = len(names)
        for i, name in enumerate(names, 1):
            if progress is not None:
                progress(name, i, total)
            if name in self._queues:
                continue
            try:
                self._create(name)
            except StorageMismatch:
                raise
            except ValueError as e:
                if name not in journal:
                    # an empty command-log queue (check_home dropped it) that its new
                    # setting cannot name: nothing is stored, nothing to serve
                    log.warning("queue %r: not loaded: %s", name, e)
                    continue
                prefix = f"queue {name!r}: "         # a replay error names its queue already
                raise ValueError(str(e) if str(e).startswith(prefix) else prefix + str(e)) from None

    def _journal_names(self) -> list[str]:
        """Queues with journal files in queue_path (made if missing); a stray file stops
        start-up naming it, as Kestrel's does (journal.queue_names_in)."""
        try:
            return queue_names_in(self.queue_path)
        except FileNotFoundError:
            os.makedirs(self.queue_path, exist_ok=True)
            return []

    def _cmdlog_names(self) -> list[str]:
        names_of = getattr(self._factory, "queue_names", None)
        return list(names_of()) if names_of is not None else []

    # -- storage -------------------------------------------------------------------------------
    def _check_home(self, name: str, qc) -> None:
        check = getattr(self._factory, "check_home", None)
        if check is not None:
            check(name, qc)

    # -- queues --------------------------------------------------------------------------------
    def queue(self, name: str, create: bool = True) -> PersistentQueue | None:
        """The queue called `name`, created on reference unless `create` is false.
        Raises ValueError (with the reason) for an illegal name."""
        q = self._queues.get(name)
        if q is not None or not create:
            return q
        return self._create(name)

    def _create(self, name: str) -> PersistentQueue:
        q = self._parked.pop(name, None)
        if q is not None:           # deleted, its moves still open: the same queue, empty
            q.reload(self.config.queue_config(name))
            self._queues[name] = q
            self.queue_creates += 1
            self._register_child(name)
            return q
        qc = self.config.queue_config(name)
        validate_queue_name(name, allow_dots=True)      # no path in it: safe to look for its files
        self._check_home(name, qc)                      # its items are not stored elsewhere
        validate_queue_name(name, allow_dots=qc.storage == "cmdlog")
        if self._owns is not None and not self._owns(name):
            raise ValueError(f"queue {name!r} belongs to another worker")
        storage = self._factory(name, qc)
        plus = name.find("+")
        q = PersistentQueue(name, qc, storage, self.clock, is_fanout_child=plus >= 0,
                            on_wake=self.woken_append)
        q.touched = self._touched
        if getattr(storage, "medium", None) is not None:
            q.undo = self.undo
        try:
            q.replay()
        except BaseException:
            storage.close()
            raise
        self._queues[name] = q
        self.queue_creates += 1
        log.debug("queue %r: created (%s storage, %d items after replay)", name, qc.storage, q.length)
        if plus >= 0:
            self._register_child(name)
        else:
            q.children = self._children.setdefault(name, [])
        target = qc.expire_to_queue
        if target:
            q.expire_sink = partial(self._expire_into, target, q)
            if self._owns is None or self._owns(target):
                self.queue(target)          # looked up and created with the source (§5.2)
            if self._expire_forward is not None:
                q.hold_moves = True
        return q

    def _register_child(self, name: str) -> None:
        """Fanout child `name` (a+b) registers with its master (§5.6)."""
        children = self._children.setdefault(name[:name.find("+")], [])
        if name not in children:
            children.append(name)

    def evict_waiters(self) -> None:
        """The server is stopping: every blocked fetcher is woken to answer empty now, while its
        reply can still reach its client (reference §5.10: shutdown wakes all waiters)."""
        for q in self._queues.values():
            self.woken.extend(q.waiters.wake_all())

    def woken_append(self, w: Waiter) -> None:
        # Looked up on every call: the owner swaps `self.woken` for a fresh list when draining.
        self.woken.append(w)

    def names(self) -> list[str]:
        return list(self._queues)

    # -- the operations ------------------------------------------------------------------------
    def add(self, name: str, data: bytes, expiry_ms: int | None = None) -> bool:
        """Add to `name` (expiry: absolute epoch ms, None/0 = never); a master's
        registered fanout children get their copies first (§5.6)."""
        q = self._queues.get(name) or self.queue(name)
        now = self.clock.now_ms()
        children = self._children.get(name)
        if children:
            return self._add_fanout(q, children, data, expiry_ms, now)
        ok = q.add(data, expiry_ms, now, now)
        if ok:
            self.total_items += 1
        if self.autoflush:
            self.flush_storages()
        return ok

    def remove(self, name: str, transactional: bool = False) -> QItem | None:
        item = (self._queues.get(name) or self.queue(name)).remove(transactional)
        if item is None:                    # _counted, inline on the hot path
            self.get_misses += 1
        else:
            self.get_hits += 1
        if self.autoflush:
            self.flush_storages()
        return item

    def remove_held(self, name: str) -> tuple[PersistentQueue, QItem | None]:
        """A plain read whose reply another process writes (server/holding.py): the item stays
        the queue's own open read until its `confirm_held` or `abort_held` (queues/openreads.py).
        Counted as `remove` counts it."""
        q = self._queues.get(name) or self.queue(name)
        return q, self._counted(q.remove_held())

    def peek(self, name: str) -> QItem | None:
        return self._counted((self._queues.get(name) or self.queue(name)).peek())

    def _counted(self, item: QItem | None) -> QItem | None:
        """A read's hit or miss goes into the global stats; stand-alone use flushes at once."""
        if item is None:
            self.get_misses += 1
        else:
            self.get_hits += 1
        if self.autoflush:
            self.flush_storages()
        return item

    def unremove(self, name: str, xid: int) -> bool:
        return self._settle(name, xid, confirm=False)

    def confirm_remove(self, name: str, xid: int) -> bool:
        return self._settle(name, xid, confirm=True)

    def _settle(self, name: str, xid: int, confirm: bool) -> bool:
        """Finish an open read either way; False if the queue or the read is unknown."""
        q = self._queues.get(name)
        ok = q is not None and (q.confirm_remove(xid) if confirm else q.unremove(xid))
        if ok and self.autoflush:
            self.flush_storages()
        return ok

    def abort_session(self, session: Session) -> int:
        """A connection went away: abort every open read it holds, oldest first
        per queue (so the most recently opened item ends up first, §1.5)."""
        n = 0
        queues = self._queues
        for name, xid in session.all_open():
            q = queues.get(name)
            if q is not None and q.unremove(xid):
                n += 1
        session.clear()
        if n and self.autoflush:
            self.flush_storages()
        return n

    def flush(self, name: str) -> None:
        q = self._queues.get(name)
        if q is not None:
            log.debug("queue %r: flushed (%d items dropped)", name, q.length)
            q.flush()
            if self.autoflush:
                self.flush_storages()

    def flush_expired(self, name: str) -> int:
        q = self._queues.get(name)
        if q is None:
            return 0
        n = q.discard_expired()
        if n and self.autoflush:
            self.flush_storages()
        return n

    def flush_all(self) -> None:
        for q in list(self._queues.values()):
            q.flush()
        if self.autoflush:
            self.flush_storages()

    def flush_all_expired(self) -> int:
        n = sum(q.discard_expired() for q in list(self._queues.values()) if not q.closed)
        if n and self.autoflush:
            self.flush_storages()
        return n

    def expire_queues(self) -> int:
        """The expiration-timer tick (§5.4): sweep expired items off every queue,
        then delete each queue past max_queue_age whose memory list is empty.
        Returns the number of items expired."""
        n = sum(q.discard_expired() for q in list(self._queues.values()) if not q.closed)
        now = self.clock.now_ms()
        for name, q in list(self._queues.items()):
            max_age = q.config.max_queue_age
            if max_age is not None and not q.memory_items() and not q.moves_open and \
                    now > q.created_ms + max_age:
                log.info("queue %r: expired after %d ms (max_queue_age)", name, now - q.created_ms)
                self.delete(name)
                self.queue_expires += 1
        if self.autoflush:
            self.flush_storages()
        return n

    # -- aliases --------------------------------------------------------------------------------
    def alias_add(self, alias: str, data: bytes, expiry_ms: int | None = None) -> bool:
        """Write to every destination of `alias`, in order (§5.7): True only if
        all accepted; no destinations accepts everything."""
        dests = self.config.aliases.get(alias)
        if dests is None:
            raise ValueError(f"{alias!r} is not an alias")
        self.count_alias_put(alias, 1, len(data))
        ok = True
        for dest in dests:
            if not self.add(dest, data, expiry_ms):
                ok = False
        return ok

    def count_alias_put(self, alias: str, items: int, nbytes: int) -> None:
        """A write to `alias` (the server's fronts report theirs to the alias's worker)."""
        self._alias_counts.count(alias, items, nbytes)

    def alias_stats(self, alias: str) -> list[tuple[str, str]] | None:
        """The stats of an alias (§4.1), None if `alias` is not one."""
        dests = self.config.aliases.get(alias)
        return None if dests is None else self._alias_counts.stats(alias, dests)

    # -- waiters -------------------------------------------------------------------------------
    def wait(self, waiter: Waiter) -> None:
        """Park `waiter` at the tail of its queue's wait list (creating the queue),
        with a timer at its deadline.  Also how a woken waiter that found nothing
        rejoins (§5.10); a deadline already past fires at the next `pop_due`."""
        if waiter.cancelled or waiter.queued:
            return
        q = self._queues.get(waiter.queue) or self.queue(waiter.queue)
        if q.closed:                       # shutting down: nothing will ever wake it
            waiter.cancelled = True
            return
        q.waiters.add(waiter)
        if waiter.deadline_ms is not None:
            self.timers.push(waiter.deadline_ms, waiter)

    def cancel_wait(self, waiter: Waiter) -> None:
        q = self._queues.get(waiter.queue)
        if q is not None:
            q.waiters.cancel(waiter)
        else:
            waiter.queued = False
            waiter.cancelled = True

    def expire_waiters(self, now_ms: int | None = None) -> list[Waiter]:
        """Waiters whose deadline has passed, withdrawn from their lists: answer them empty."""
        due = self.timers.pop_due(self.clock.now_ms() if now_ms is None else now_ms)
        for w in due:
            self.cancel_wait(w)
        return due

    def wake_one(self, name: str) -> Waiter | None:
        """Pass a wake-up on (its waiter's client had gone) to the next waiter of `name`."""
        q = self._queues.get(name)
        if q is None or not q.length:
            return None
        w = q.waiters.wake_one()
        if w is not None:
            self.woken.append(w)
        return w

    # -- stats ---------------------------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        queues = self._queues.values()
        return {
            "total_items": self.total_items,
            "queue_creates": self.queue_creates,
            "queue_deletes": self.queue_deletes,
            "queue_expires": self.queue_expires,
            "get_hits": self.get_hits,
            "get_misses": self.get_misses,
            "curr_items": sum(q.length for q in queues),
            "bytes": sum(q.size_bytes for q in queues),
            "reserved_memory": sum(q.config.max_memory_size for q in queues),
        }

    def queue_stats(self, name: str) -> list[tuple[str, str]] | None:
        q = self._queues.get(name)
        return q.stats() if q is not None else None

    # -- configuration, durability, shutdown ---------------------------------------------------
    def reload(self, config) -> None:
        """Apply new queue settings to every existing queue (§7.2); expire_to_queue
        bindings, storage kinds and keep_journal stay as the queue was created."""
        self.config = config
        for name, q in self._queues.items():
            old, new = q.config, config.queue_config(name)
            if old.keep_journal and old.storage == "journal" and new.sync_journal != old.sync_journal:
                q.storage.sync_policy = new.sync_journal
            q.reload(new)

    def dirty_storages(self):
        """The byte streams (each storage's `medium`: a journal, a command-log partition
        that many queues share) of the queues that recorded something since the last call and
        hold buffered or unsynced records, each once.  Only those queues are visited; with
        none, nothing is allocated.  A caller that leaves records buffered (a write under way)
        keeps the storage to come back to itself."""
        touched = self._touched
        if not touched:
            return ()
        if len(touched) == 1:                  # the common turn: one queue
            q = touched.popitem()[0]
            st = q.storage
            # A journal under sync "never" is listed without asking `dirty` (a property's
            # frame, per turn: issue 8, c=1): clean, it is nothing to its writer (Journal.flush
            # returns at once, and no fsync is scheduled for that policy).
            if q.closed or not (st.__class__ is Journal and st.sync_policy == "never" or st.dirty):
                return ()
            return (q.medium or st,)
        seen = {}
        for q in touched:
            if not q.closed and q.storage.dirty:
                m = q.medium or q.storage
                seen[id(m)] = m
        touched.clear()
        return seen.values()

    def flush_storages(self) -> None:
        """Hand buffered records to the OS and fsync per the sync policy (storage/sync.py):
        "always" at once; a period at the first call after it has passed since the write
        that left the records unsynced (with no server loop nothing fires between calls;
        `close` syncs everything).  A storage that cannot write (or fsync, under "always")
        is rolled back and the first such error raised."""
        now = self.clock.now_ms()
        schedule = self.sync_schedule
        error = None
        for st in self.dirty_storages():
            try:
                st.flush()
            except OSError as e:
                log.error("%s", e)
                self.rollback(st)
                error = error or e
                continue
            if schedule.written(st, now):
                try:
                    st.sync()
                except OSError as e:
                    log.error("%s", e)
                    self.rollback(st, unsynced=True)
                    error = error or e
        sync_all(schedule.due(now))
        self.undo.trim()
        if error is not None:
            raise error

    def rewrite_empty_journals(self) -> None:
        """Graceful shutdown under ReadOnly or Quiescent (reference §5.11): each empty queue's
        journal is compacted before it is closed (command logs and memory queues have no such
        rule)."""
        for q in self._queues.values():
            rewrite = getattr(q.storage, "rewrite_when_empty", None)
            if rewrite is not None:         # (it skips a queue that holds items)
                rewrite(q)

    def close(self) -> None:
        """Evict every waiter, flush and sync every storage.  Every storage is closed even if
        some fail; then `CloseError` lists those that could not be written or synced."""
        if self.closed:
            return
        self.closed = True
        failures = []
        for name, q in (*self._queues.items(), *self._parked.items()):
            try:
                q.close()
            except OSError as e:
                failures.append((name, e))
        close = getattr(self._factory, "close", None)
        if close is not None:
            try:
                close()
            except OSError as e:
                failures.append(("command logs", e))
        if failures:
            raise CloseError(failures)


class CloseError(OSError):
    """Storages that could not be flushed or fsynced at close: `failures` is a list of
    (queue name or partition directory, error)."""

    def __init__(self, failures: list[tuple[str, OSError]]) -> None:
        super().__init__("; ".join(f"{name!r}: {e}" for name, e in failures))
        self.failures = failures
