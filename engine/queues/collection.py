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
  in the global total_items.  A target owned by another worker is reached
  through `expire_forward(target, data, now_ms)`; that worker calls
  `add_forwarded`.  Unlike Kestrel, which kept a reference to the target
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
other workers); `alias_add` is the stand-alone equivalent.
"""
from __future__ import annotations

import logging
import os
import re
from functools import partial
from typing import Callable

from lanner.clock import SYSTEM_CLOCK
from lanner.queues.item import QItem
from lanner.queues.names import CMDLOG_DIR, validate_queue_name
from lanner.queues.placement import partition_of
from lanner.queues.queue import PersistentQueue
from lanner.queues.sessions import Session
from lanner.storage.seam import MemoryStorage
from lanner.queues.waiters import TimerHeap, Waiter

log = logging.getLogger(__name__)

_ARCHIVE_SUFFIX = re.compile(r"\d+(\.pack)?")


class QueueCollection:
    def __init__(self, config, clock=SYSTEM_CLOCK, *,
                 storage_factory: Callable[[str, object], object] | None = None,
                 owns: Callable[[str], bool] | None = None,
                 expire_forward: Callable[[str, bytes, int], None] | None = None,
                 autoflush: bool = True) -> None:
        """`storage_factory(name, queue_config)` makes a queue's storage (default:
        a Journal, MemoryStorage when keep_journal is false, the partition's
        command log when storage is "cmdlog").  A factory that also has a
        `queue_names()` method reports the queues its storages hold, so `load`
        brings them up, and one with `forget(name)` hears of every delete.  `owns(name)`: the queues this collection serves
        (default all).  `autoflush`: hand records to the OS (and fsync per the
        queue's sync policy) at the end of every public call."""
        self.config = config
        self.clock = clock
        self.autoflush = autoflush
        self._factory = storage_factory or self._default_storage
        self._default_factory = storage_factory is None
        self._owns = owns
        self._expire_forward = expire_forward
        self._queues: dict[str, PersistentQueue] = {}
        self._children: dict[str, list[str]] = {}      # master name -> registered child names
        self._alias_counts: dict[str, list[int]] = {}  # alias -> [put_items, put_bytes]
        self._partition_logs: dict[int, object] = {}   # default cmdlog storage only
        self._last_sync: dict[object, float] = {}
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
        names = self._journal_names()
        names.extend(self._cmdlog_names())
        names = [n for n in dict.fromkeys(names) if self._owns is None or self._owns(n)]
        total = len(names)
        for i, name in enumerate(names, 1):
            if progress is not None:
                progress(name, i, total)
            if name not in self._queues:
                self._create(name)

    def _journal_names(self) -> list[str]:
        """Regular files in queue_path, `~~` temporaries dropped, the part
        before the first `.` kept.  Anything after that dot must be an archive
        timestamp (`<ms>` or `<ms>.pack`): Kestrel refuses to start on a stray
        file, and so do we, naming it."""
        path = self.queue_path
        try:
            entries = sorted(os.listdir(path))
        except FileNotFoundError:
            os.makedirs(path, exist_ok=True)
            return []
        names = []
        for fname in entries:
            full = os.path.join(path, fname)
            if "~~" in fname or not os.path.isfile(full):
                continue
            name, dot, rest = fname.partition(".")
            if dot and not _ARCHIVE_SUFFIX.fullmatch(rest):
                raise ValueError(f"{full}: not a journal file (expected <queue>, <queue>.<epoch-ms> "
                                 f"or <queue>.<epoch-ms>.pack); move it out of the queue path")
            try:
                validate_queue_name(name)
            except ValueError as e:
                raise ValueError(f"{full}: {e}") from None
            names.append(name)
        return names

    def _cmdlog_names(self) -> list[str]:
        names_of = getattr(self._factory, "queue_names", None)
        if names_of is not None:
            return list(names_of())
        if not self._default_factory or self._owns is not None:
            return []
        # Stand-alone with the default factory: this collection owns every partition.
        root = os.path.join(self.queue_path, CMDLOG_DIR)
        if not os.path.isdir(root):
            return []
        names = []
        for entry in sorted(os.listdir(root)):
            if entry.isdigit() and os.path.isdir(os.path.join(root, entry)):
                names.extend(self._partition_log(int(entry)).queue_names())
        return names

    # -- storage -------------------------------------------------------------------------------
    def _default_storage(self, name: str, qc):
        if not qc.keep_journal:
            if qc.storage == "journal":
                from lanner.storage.journal.journal import Journal
                Journal.erase_all(self.queue_path, name)    # §6.1: old files go
            return MemoryStorage()
        if qc.storage == "cmdlog":
            return self._partition_log(partition_of(name)).storage_for(name)
        from lanner.storage.journal.journal import Journal
        os.makedirs(self.queue_path, exist_ok=True)
        return Journal(self.queue_path, name, self.clock, qc.sync_journal)

    def _partition_log(self, partition: int):
        plog = self._partition_logs.get(partition)
        if plog is None:
            from lanner.storage.cmdlog.cmdlog import open_partition_logs
            plog = open_partition_logs(self.queue_path, [partition], self.clock, self.config.cmdlog)[partition]
            self._partition_logs[partition] = plog
        return plog

    # -- queues --------------------------------------------------------------------------------
    def queue(self, name: str, create: bool = True) -> PersistentQueue | None:
        """The queue called `name`, created on reference unless `create` is false.
        Raises ValueError (with the reason) for an illegal name."""
        q = self._queues.get(name)
        if q is not None or not create:
            return q
        return self._create(name)

    def _create(self, name: str) -> PersistentQueue:
        qc = self.config.queue_config(name)
        validate_queue_name(name, allow_dots=qc.storage == "cmdlog")
        if self._owns is not None and not self._owns(name):
            raise ValueError(f"queue {name!r} belongs to another worker")
        storage = self._factory(name, qc)
        plus = name.find("+")
        q = PersistentQueue(name, qc, storage, self.clock, is_fanout_child=plus >= 0,
                            on_wake=self.woken_append)
        q.touched = self._touched
        try:
            q.replay()
        except BaseException:
            storage.close()
            raise
        self._queues[name] = q
        self.queue_creates += 1
        log.debug("queue %r: created (%s storage, %d items after replay)", name, qc.storage, q.length)
        if plus >= 0:
            children = self._children.setdefault(name[:plus], [])
            if name not in children:
                children.append(name)
        else:
            q.children = self._children.setdefault(name, [])
        target = qc.expire_to_queue
        if target:
            q.expire_sink = partial(self._expire_into, target)
            if self._owns is None or self._owns(target):
                self.queue(target)          # looked up and created with the source (§5.2)
        return q

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
            queues = self._queues
            for child in children:
                cq = queues.get(child)
                if cq is not None and cq.add(data, expiry_ms, now):
                    self.total_items += 1
        ok = q.add(data, expiry_ms, now)
        if ok:
            self.total_items += 1
        if self.autoflush:
            self.flush_storages()
        return ok

    def add_forwarded(self, name: str, data: bytes, now_ms: int) -> bool:
        """An expire_to_queue move into `name`: no client expiry (the target's
        max_age applies), add time now, no fanout, no global total_items."""
        ok = self.queue(name).add(data, None, now_ms)
        if self.autoflush:
            self.flush_storages()
        return ok

    def _expire_into(self, target: str, data: bytes, now_ms: int) -> None:
        if self._owns is None or self._owns(target):
            self.queue(target).add(data, None, now_ms)
        elif self._expire_forward is not None:
            self._expire_forward(target, data, now_ms)
        else:
            log.error("cannot move an expired item to %r: no worker serves it here", target)

    def remove(self, name: str, transactional: bool = False) -> QItem | None:
        item = (self._queues.get(name) or self.queue(name)).remove(transactional)
        if item is None:
            self.get_misses += 1
        else:
            self.get_hits += 1
        if self.autoflush:
            self.flush_storages()
        return item

    def peek(self, name: str) -> QItem | None:
        item = (self._queues.get(name) or self.queue(name)).peek()
        if item is None:
            self.get_misses += 1
        else:
            self.get_hits += 1
        if self.autoflush:
            self.flush_storages()
        return item

    def unremove(self, name: str, xid: int) -> bool:
        q = self._queues.get(name)
        ok = q is not None and q.unremove(xid)
        if ok and self.autoflush:
            self.flush_storages()
        return ok

    def confirm_remove(self, name: str, xid: int) -> bool:
        q = self._queues.get(name)
        ok = q is not None and q.confirm_remove(xid)
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

    def delete(self, name: str) -> None:
        """Close the queue, erase its files, drop it and its stats (§5.5).  Its
        waiters are evicted into `woken` and answer empty."""
        q = self._queues.pop(name, None)
        if q is None:
            return
        q.destroy()
        self._last_sync.pop(q.storage, None)
        forget = getattr(self._factory, "forget", None)     # a factory that tracks its storages
        if forget is not None:
            forget(name)
        self.queue_deletes += 1
        log.debug("queue %r: deleted", name)
        plus = name.find("+")
        if plus >= 0:
            children = self._children.get(name[:plus])
            if children and name in children:
                children.remove(name)

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
            if max_age is not None and not q.memory_items() and now > q.created_ms + max_age:
                log.info("queue %r: expired after %d ms (max_queue_age)", name, now - q.created_ms)
                self.delete(name)
                self.queue_expires += 1
        if self.autoflush:
            self.flush_storages()
        return n

    # -- aliases (stand-alone use) -------------------------------------------------------------
    def alias_add(self, alias: str, data: bytes, expiry_ms: int | None = None) -> bool:
        """Write to every destination of `alias`, in order (§5.7): True only if
        all accepted; no destinations accepts everything."""
        dests = self.config.aliases.get(alias)
        if dests is None:
            raise ValueError(f"{alias!r} is not an alias")
        counts = self._alias_counts.setdefault(alias, [0, 0])
        counts[0] += 1
        counts[1] += len(data)
        ok = True
        for dest in dests:
            if not self.add(dest, data, expiry_ms):
                ok = False
        return ok

    def alias_stats(self, alias: str) -> list[tuple[str, str]] | None:
        dests = self.config.aliases.get(alias)
        if dests is None:
            return None
        items, nbytes = self._alias_counts.get(alias, (0, 0))
        return [("put_items", str(items)), ("put_bytes", str(nbytes)), ("children", ",".join(dests))]

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

    def dirty_storages(self) -> list:
        """Storages holding buffered or unsynced records, each once.  Only queues touched
        since the last call are visited; those still dirty (unsynced) stay on the list."""
        touched = self._touched
        if not touched:
            return []
        seen = {}
        still = [q for q in touched if not q.closed and q.storage.dirty]
        for q in still:
            seen[id(q.storage)] = q.storage
        touched.clear()
        touched.update(dict.fromkeys(still))
        return list(seen.values())

    def flush_storages(self) -> None:
        """Hand buffered records to the OS and fsync per each storage's sync
        policy: "always" at once; a period at the first call at least that long
        after the storage's previous sync.  Without a server loop nothing fires
        between calls, so records written last stay unsynced until the next
        call or `close`."""
        now = self.clock.monotonic()
        for st in self.dirty_storages():
            st.flush()
            policy = st.sync_policy
            if policy == "always":
                st.sync()
            elif isinstance(policy, int) and not isinstance(policy, bool):
                last = self._last_sync.get(st)
                if last is None or (now - last) * 1000.0 >= policy:
                    st.sync()
                    self._last_sync[st] = now

    def close(self) -> None:
        """Evict every waiter, flush and sync every storage."""
        if self.closed:
            return
        self.closed = True
        for q in self._queues.values():
            q.close()
        for plog in self._partition_logs.values():
            plog.close()
