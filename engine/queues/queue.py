"""One queue with Kestrel's semantics (reference §5): `PersistentQueue`.

A FIFO of `QItem`s plus the items reserved by open transactions, the limits
that refuse or discard adds, lazy expiry at the head, and the counters behind
the per-queue stats (§4.2).  Single-threaded: no locks, no asyncio; "now"
comes from the injected clock.  Everything durable goes through the storage
seam (storage.py), one `record_*` call per state change.

State and invariants:
* `_items` is the in-memory part of the queue, head first.  `_length` and
  `_bytes` count every queued item, including those a read-behind storage
  keeps on disk only (§5.8), and never the open transactions.  While
  `_length > 0`, `_items` is not empty (`_refill` pulls at least one item).
* `_open` maps xid -> reserved item, in the order the reads were opened, so
  its first key is the oldest open transaction (the one
  `open_transaction_timeout` recycles, §5.9).
* `_moving` maps xid -> an expired item moving to another worker's queue (`hold_moves`): an
  open read of the queue's own until `confirm_move`, so replay rolls it back to expire and move
  again (server/moves.py); storage sees it with the client reads (`open_items`), clients do not.
* `_held` maps xid -> an item a plain read handed to another process's client, open until that
  process wrote the reply (queues/openreads.py); like `_moving`, storage sees it, clients do not.
* The journal order equals the order of the in-memory changes: every mutation
  is recorded before the call returns, so replaying the records rebuilds
  exactly this state.
* Expiry is judged with the CURRENT `max_age`, measured from the item's add
  time (§5.2, §9 #22): the stored expiry was clamped at add time already, and
  a reload that shortens `max_age` expires old items retroactively.
* Waking a waiter only moves it to the owner's list (`on_wake`); the owner
  retries the fetch later in the same loop iteration (§5.10).
* Every recorded change also goes to the owner's undo log (`self.undo`, undo.py) when the
  storage is durable, so a batch whose write fails can be taken back (`revert`).  The "primary"
  change of an operation (the add, the item a read returns, the abort, the confirm) carries
  the owner's context; side effects (expiry sweeps, discards of a full queue) carry None.
"""
from __future__ import annotations

import logging
from collections import deque
from typing import Callable

from lanner.queues.dropbehind import drop_behind
from lanner.queues.limits import adopt_limits
from lanner.queues.openreads import OpenReads
from lanner.queues.item import QItem
from lanner.queues.undo import ADD, CONFIRM, HELD_OPEN, MOVE_CONFIRM, MOVE_OPEN, OPEN, REMOVE, UNREMOVE
from lanner.queues.waiters import Waiter, WaitList
from lanner.storage.journal.journal import Journal

log = logging.getLogger(__name__)

try:                            # COMPILED: as in memcache_commands.py (queue.pxd)
    import cython
    COMPILED = cython.compiled
except ImportError:             # pure Python without Cython installed
    COMPILED = False


#: The fields queue.pxd gives a C type: getsets for interpreted code, not member descriptors.
#: deque's own methods, called with the deque: the items' add and remove, compiled, as a call
#: of a method descriptor, not a method lookup per call (as fronts/conn.py's for `Conn.fast`)
_append = deque.append
_popleft = deque.popleft

C_TYPED = ("undo", "_length", "_bytes", "_mem_bytes", "total_items", "_floor", "_max_memory")


class PersistentQueueBase:
    """Empty, first: a C type in the compiled build (queue.pxd), whose first base must be one;
    the mixin after it stays a Python class."""
    __slots__ = ()


class PersistentQueue(PersistentQueueBase, OpenReads):
    # Slots, not a dict: its lookups per add and remove stay specialised (test_hot_layout.py).
    __slots__ = ("name", "config", "storage", "clock", "is_fanout_child", "expire_sink", "hold_moves",
                 "on_wake", "touched", "undo", "medium", "closed", "created_ms", "waiters", "children",
                 "_items", "_length", "_bytes", "_mem_bytes", "_limits_of", "_floor", "_max_age",
                 "_max_memory", "_fanout_only", "_open", "_open_deadline", "_moving", "_held",
                 "_xid", "_last_removed_add_time", "total_items", "expired_items", "discarded",
                 "transactions", "canceled_transactions", "total_flushes")

    def __init__(self, name: str, config, storage, clock, *, is_fanout_child: bool = False,
                 expire_sink: Callable[[bytes, int, int], None] | None = None,
                 on_wake: Callable[[Waiter], None] | None = None) -> None:
        """`expire_sink(data, now_ms, xid)` receives expired items when the queue was created with
        `expire_to_queue` set (the collection binds the target at creation, §5.2); `xid` is 0, or
        with `hold_moves` the open move's, for the owner to `confirm_move` once the target has
        it.  `on_wake(waiter)` receives every waiter this queue wakes."""
        self.name = name
        self.config = config
        self.storage = storage
        self.clock = clock
        self.is_fanout_child, self.expire_sink, self.on_wake = is_fanout_child, expire_sink, on_wake
        self.hold_moves = False    # expired items leave as open moves (set by the collection)
        # The owner's set of queues whose storage may hold unflushed records: every entry
        # point that can write a record adds the queue, so the owner's batch flush visits
        # only those instead of every queue it has.
        self.touched: dict | None = None
        # The owner's UndoLog (undo.py), set by the collection for durable storages, and the
        # byte stream this queue's records go into (`storage.medium`), looked up once.
        self.undo = None
        self.medium = getattr(storage, "medium", None)
        self.closed = False
        self.created_ms = clock.now_ms()
        self.waiters = WaitList()
        self.children: list[str] = []      # fanout children, maintained by the collection
        self._items: deque[QItem] = deque()
        self._length = self._bytes = self._mem_bytes = 0
        adopt_limits(self, config)     # `_floor`, `_max_age`, ... of `_limits_of`
        self._open: dict[int, QItem] = {}
        self._open_deadline: dict[int, int] = {}   # xid -> ms, only under open_transaction_timeout
        self._moving: dict[int, QItem] = {}        # xid -> expired item whose move is not confirmed
        self._held: dict[int, QItem] = {}          # xid -> item whose reply is not written yet
        self._xid = 0
        self._last_removed_add_time: int | None = None
        self.total_items = 0
        self.expired_items = 0
        self.discarded = 0
        self.transactions = self.canceled_transactions = 0
        self.total_flushes = 0

    # -- the QueueView a storage reads -------------------------------------------------------
    @property
    def length(self) -> int:
        return self._length

    @property
    def size_bytes(self) -> int:
        return self._bytes

    @property
    def memory_bytes(self) -> int:
        return self._mem_bytes

    def memory_items(self) -> deque[QItem]:
        """The in-memory items, head first (live view: do not mutate)."""
        return self._items

    def open_items(self) -> dict[int, QItem]:
        """xid -> reserved item, open moves included (a live view or a copy: do not mutate)."""
        if self._moving or self._held:
            return {**self._open, **self._moving, **self._held}
        return self._open

    @property
    def moves_open(self) -> int:
        """Expired items sent to another worker's queue and not yet confirmed there."""
        return len(self._moving)

    # -- start-up -----------------------------------------------------------------------------
    def replay(self) -> None:
        """Rebuild from storage, then roll back every open transaction (§5.9).

        Rollback runs in DESCENDING xid order, each item going to the head, so
        the lowest xid ends up first and reserved items come back ahead of the
        never-fetched ones in their original order.  It counts no stats."""
        if self.touched is not None:
            self.touched[self] = None
        st = self.storage.replay(self.config)
        items = st.items if isinstance(st.items, deque) else deque(st.items)
        self._items = items
        self._mem_bytes = sum(len(i.data) for i in items)
        self._length = st.total_items
        self._bytes = st.total_bytes
        self._xid = st.xid_counter
        self.total_items = st.replayed_adds
        self._open = {}
        self._open_deadline = {}
        self._moving = {}       # an open move of the last run is among the rollbacks below
        self._held = {}
        record = self.storage.record_unremove
        for xid in sorted(st.open_transactions, reverse=True):
            item = st.open_transactions[xid]
            self._push_head(item)
            self._log(record(item, xid), UNREMOVE, item, xid, False)
            item.xid = 0

    # -- adds ----------------------------------------------------------------------------------
    def add(self, data: bytes, expiry_ms: int | None = None, add_time_ms: int | None = None,
            now_ms: int | None = None, *, count_total: bool = True) -> bool:
        """Append an item; False when refused (§5.3).  `expiry_ms` is absolute epoch ms, None
        or 0 for never.  `count_total`: whether the add counts in this queue's `total_items` stat
        (every kind of add does by default).  `now_ms`: the caller's clock reading, if it has
        one (one per request), by position (a call with a keyword is not specialised)."""
        if self.touched is not None:
            self.touched[self] = None
        config = self.config
        if config is not self._limits_of:
            adopt_limits(self, config)
        floor = self._floor                 # its compares are specialised, the limits' are not
        n = len(data)
        if self.closed or (n >= floor and n > config.max_item_size):
            return False
        if self._fanout_only and not self.is_fanout_child:
            return True
        now = self.clock.now_ms() if now_ms is None else now_ms
        # "Full" is judged before the expiry sweep of this add (§5.3, §9 #21).
        if (self._length >= floor or self._bytes >= floor) and not self._room_for_one(config, now):
            return False
        expiry = expiry_ms or 0
        max_age = self._max_age
        if max_age is not None:
            cap = now + max_age
            if not expiry or cap < expiry:
                expiry = cap
        # QItem(...) without its __init__ (a C allocation and struct stores compiled, item.pxd);
        # every field is stored (test_hot_path: the item equals QItem(add_time, expiry, data))
        item = QItem.__new__(QItem)
        item.add_time = now if add_time_ms is None else add_time_ms
        item.expiry = expiry
        item.data = data
        item.xid = 0
        item.job_id = None
        item.priority = 0
        storage = self.storage
        # a Journal's record_* and flags: C calls and struct reads (queue.pxd); others' Python ones
        journal = storage if isinstance(storage, Journal) else None
        due = storage.check_due if journal is None else journal.check_due
        if due and (due is True or self._bytes < due):
            storage.before_add(self, config, now)
        if self._bytes >= self._max_memory and storage.can_read_behind and not storage.in_read_behind:
            log.info("queue %r: dropping to read-behind at %d bytes", self.name, self._bytes)
            storage.start_read_behind()
        items = self._items
        head = items[0] if items else None
        if head is not None and (max_age is not None or head.expiry):    # it may have expired
            self.discard_expired(now)
        mark = storage.record_add(item) if journal is None else journal.record_add(item)
        undo = self.undo
        if undo is not None and mark is not None:
            undo.entries.append((self.medium, mark, self, ADD, item, 0, undo.ctx))
        self._length += 1
        self._bytes += n
        if not (storage.in_read_behind if journal is None else journal.in_read_behind):
            _append(self._items, item)      # (the unbound method: see _append)
            self._mem_bytes += n
        elif not self._items:
            self._refill(now)              # tiny max_memory_size: keep the head in memory
        if count_total:
            self.total_items += 1
        if self.waiters.live:
            self._wake_one()
        return True

    def _room_for_one(self, config, now: int) -> bool:
        """Whether an add may go on: the queue under max_items and max_size, or made so by
        discarding its oldest items (discard_old_when_full)."""
        while self._length >= config.max_items or self._bytes >= config.max_size:
            if not config.discard_old_when_full:
                return False
            self.discard_expired(now)          # Kestrel's _remove sweeps before it takes the head
            if not self._items:
                # limits of 0: nothing left to discard
                return not (self._length >= config.max_items or self._bytes >= config.max_size)
            item = self._pop_head()
            self._last_removed_add_time = item.add_time
            self._log(self.storage.record_remove(item), REMOVE, item, 0, False)
            self._refill(now)
            self.discarded += 1
        return True

    def admit(self, item: QItem) -> None:
        """Take in an item its storage already holds and has just released (a workq job whose
        scheduled time came): no limits, nothing recorded, one waiter woken."""
        n = len(item.data)
        self._length += 1
        self._bytes += n
        self._items.append(item)
        self._mem_bytes += n
        if self.waiters:
            self._wake_one()

    # -- removes -------------------------------------------------------------------------------
    def remove(self, transactional: bool = False) -> QItem | None:
        """Take the head item (reserved under a fresh `item.xid` when transactional).  The clock
        is read once, and only when something needs it (a deadline, an expiry, read-behind, a
        storage check): a plain remove from a queue whose items never expire needs none."""
        if self.touched is not None:
            self.touched[self] = None
        if self.closed or not self._length:
            return None
        now = None
        config = self.config
        if config is not self._limits_of:
            adopt_limits(self, config)
        if transactional:
            self.transactions += 1     # counted even if the head turns out expired (§4.2)
        if self._open_deadline and config.open_transaction_timeout is not None:
            now = self.clock.now_ms()
            self._recycle_timed_out(now)
        items = self._items
        head = items[0] if items else None
        if head is not None and (self._max_age is not None or head.expiry):
            if now is None:
                now = self.clock.now_ms()
            self.discard_expired(now)
        if not items:
            return None
        item = _popleft(items)              # _pop_head, inline on the hot path (_append)
        n = len(item.data)
        self._mem_bytes -= n
        self._bytes -= n
        self._length -= 1
        self._last_removed_add_time = item.add_time
        storage = self.storage
        journal = storage if isinstance(storage, Journal) else None     # (add)
        if transactional:
            xid = self._next_xid()
            item.xid = xid
            self._open[xid] = item
            timeout = config.open_transaction_timeout
            if timeout is not None:
                if now is None:
                    now = self.clock.now_ms()
                self._open_deadline[xid] = now + timeout
            mark = storage.record_open(item, xid) if journal is None else journal.record_open(item, xid)
            kind = OPEN
        else:
            mark = storage.record_remove(item) if journal is None else journal.record_remove(item)
            kind = REMOVE
        undo = self.undo
        if undo is not None and mark is not None:
            undo.entries.append((self.medium, mark, self, kind, item, xid if transactional else 0, undo.ctx))
        if storage.in_read_behind if journal is None else journal.in_read_behind:
            if now is None:
                now = self.clock.now_ms()
            self._refill(now)
        due = storage.check_due if journal is None else journal.check_due
        if due and (due is True or self._bytes < due):     # (seam.py, point 3)
            storage.after_remove(self, config, self.clock.now_ms() if now is None else now)
        return item

    def peek(self) -> QItem | None:
        if self.touched is not None:
            self.touched[self] = None
        if self.closed or not self._length:
            return None
        self.discard_expired()
        return self._items[0] if self._items else None

    def flush(self) -> None:
        """Remove every queued item, each recorded as a plain remove; open
        transactions stay and can still be aborted back (§5.5)."""
        if self.touched is not None:
            self.touched[self] = None
        if self.closed:
            return
        now = self.clock.now_ms()
        storage = self.storage
        config = self.config
        if storage.in_read_behind:
            drop_behind(self)            # first: popping the rest must not read any back
        while self._items:
            item = self._pop_head()
            self._last_removed_add_time = item.add_time
            self._log(storage.record_remove(item), REMOVE, item)
            self._refill(now)
            storage.after_remove(self, config, now)
        self.total_flushes += 1

    # -- expiry --------------------------------------------------------------------------------
    def is_expired(self, item: QItem, now: int) -> bool:
        expiry = item.expiry
        max_age = self.config.max_age
        if max_age is not None:
            cap = item.add_time + max_age
            if not expiry or cap < expiry:
                expiry = cap
        return expiry != 0 and expiry < now

    def discard_expired(self, now: int | None = None, limit: int | None = None) -> int:
        """Sweep expired items off the head, at most `max_expire_sweep` (and
        `limit`) of them; stops at the first live item (§5.2).  Returns the count."""
        if self.touched is not None:
            self.touched[self] = None
        items = self._items
        if not items:
            return 0
        if now is None:
            now = self.clock.now_ms()
        cap = self.config.max_expire_sweep
        if limit is not None and limit < cap:
            cap = limit
        sink = self.expire_sink
        moved: list[tuple[bytes, int]] = []
        n = 0
        storage = self.storage
        record = storage.record_remove
        hold = self.hold_moves and sink is not None
        if hold:
            record_move = getattr(storage, "record_move_open", storage.record_open)
        is_expired = self.is_expired
        while n < cap and items and is_expired(items[0], now):
            item = self._pop_head()
            if hold:        # an open move: the journal keeps the item until it is confirmed
                xid = self._next_xid()
                item.xid = xid
                self._moving[xid] = item
                self._log(record_move(item, xid), MOVE_OPEN, item, xid, False)
                moved.append((item.data, xid))
            else:
                self._log(record(item), REMOVE, item, 0, False)
                if sink is not None:
                    moved.append((item.data, 0))
            self._refill(now)
            n += 1
        self.expired_items += n
        # Moves run after the sweep, as Kestrel's do (outside its lock), so a
        # target that is this very queue sees a consistent state.
        for data, xid in moved:
            sink(data, now, xid)
        return n

    def confirm_move(self, xid: int) -> bool:
        """The target of open move `xid` has the item; False if no such move is open."""
        if self.touched is not None:
            self.touched[self] = None
        item = self._moving.pop(xid, None) if not self.closed else None
        if item is None:
            return False
        self._log(self.storage.record_confirm(item, xid), MOVE_CONFIRM, item, xid, False)
        return True

    # -- life cycle ----------------------------------------------------------------------------
    def reload(self, config) -> None:
        """New limits take effect at once; the expire_to_queue binding does not change."""
        self.config = config
        self.storage.check_due = True          # its hooks' limits may have moved (seam.py, point 3)

    def close(self) -> None:
        """Stop serving: every waiter is evicted (answers empty); storage flushed and synced."""
        if self.closed:
            return
        self.closed = True
        on_wake = self.on_wake
        for w in self.waiters.wake_all():
            if on_wake is not None:
                on_wake(w)
        self.storage.close()

    def destroy(self) -> None:
        """`delete`: erase every record of the queue, then close.  An erase that fails (a
        command log that cannot write its deletes) raises and leaves the queue serving."""
        self.storage.erase()
        self.close()

    # -- stats ---------------------------------------------------------------------------------
    def age_ms(self, now: int) -> int:
        """Deviation 6: 0 until the first remove from this queue object, and 0 when empty."""
        last = self._last_removed_add_time
        if self._bytes == 0 or last is None:
            return 0
        return max(0, now - last)

    def stats(self) -> list[tuple[str, str]]:
        """Per-queue stats in the exact order of §4.1."""
        storage = self.storage
        out = [
            ("items", str(self._length)),
            ("bytes", str(self._bytes)),
            ("total_items", str(self.total_items)),
            ("logsize", str(storage.logsize)),
            ("expired_items", str(self.expired_items)),
            ("mem_items", str(len(self._items))),
            ("mem_bytes", str(self._mem_bytes)),
            ("age", str(self.age_ms(self.clock.now_ms()))),
            ("discarded", str(self.discarded)),
            ("waiters", str(len(self.waiters))),
            ("open_transactions", str(len(self._open))),
            ("transactions", str(self.transactions)),
            ("canceled_transactions", str(self.canceled_transactions)),
            ("total_flushes", str(self.total_flushes)),
            ("journal_rewrites", str(storage.rewrites)),
            ("journal_rotations", str(storage.rotations)),
        ]
        if self.children:
            out.append(("children", ",".join(self.children)))
        return out

    # -- rollback (undo.py) ------------------------------------------------------------------
    def _log(self, mark: int | None, kind: int, item: QItem, xid: int = 0, primary: bool = True) -> None:
        """Note a recorded change in the owner's undo log (`mark`: where its record starts)."""
        undo = self.undo
        if undo is not None and mark is not None:
            undo.entries.append((self.medium, mark, self, kind, item, xid, undo.ctx if primary else None))

    def revert(self, kind: int, item: QItem, xid: int, mark: int | None = None) -> None:
        """Take back one recorded change whose record (at `mark`) was lost.  The owner calls
        this newest change first, so the queue is exactly as that change left it: an added
        item is the last one, a removed or aborted one is at the head."""
        n = len(item.data)
        if kind == ADD:
            items = self._items
            if items and items[-1] is item:
                items.pop()
                self._mem_bytes -= n
            elif items and mark is not None and self.storage.read_back(mark):
                # Added in read-behind, and read back from the file (the journal wrote its buffer
                # early to do so) as another object: that copy is the last item, as the original
                # would be (records after it were undone first).
                items.pop()
                self._mem_bytes -= n
            # else it was counted only, waiting on disk for read-behind, beyond its reader
            self._length -= 1
            self._bytes -= n
            self.total_items -= 1
        elif kind == REMOVE:
            self._push_head(item)
        elif kind == OPEN:
            self._open.pop(xid, None)
            self._open_deadline.pop(xid, None)
            item.xid = 0
            self._push_head(item)
        elif kind == UNREMOVE:
            if self._items and self._items[0] is item:
                self._pop_head()
            item.xid = xid
            self._open[xid] = item
            timeout = self.config.open_transaction_timeout
            if timeout is not None:
                self._open_deadline[xid] = self.clock.now_ms() + timeout
            if self.canceled_transactions:       # (replay's rollbacks are not counted)
                self.canceled_transactions -= 1
        elif kind == CONFIRM:
            item.xid = xid
            self._open[xid] = item
        elif kind == MOVE_OPEN:
            self._moving.pop(xid, None)
            item.xid = 0
            self._push_head(item)
        elif kind == MOVE_CONFIRM:
            item.xid = xid
            self._moving[xid] = item
        elif kind >= HELD_OPEN:
            kind = self.revert_held(kind, item, xid)
        self.storage.undo_record(kind, item, xid)

    # -- internals -----------------------------------------------------------------------------
    def _pop_head(self) -> QItem:
        item = self._items.popleft()
        n = len(item.data)
        self._mem_bytes -= n
        self._bytes -= n
        self._length -= 1
        return item

    def _push_head(self, item: QItem) -> None:
        n = len(item.data)
        self._items.appendleft(item)
        self._mem_bytes += n
        self._bytes += n
        self._length += 1

    def _refill(self, now: int) -> None:
        """Read-behind (§5.8): pull items from storage while memory is under
        max_memory_size, and always at least one while the queue is not empty."""
        storage = self.storage
        if not storage.in_read_behind:
            return
        limit = self.config.max_memory_size
        items = self._items
        while storage.in_read_behind and (self._mem_bytes < limit or not items):
            got = storage.fill_read_behind(max(limit - self._mem_bytes, 1), now)
            if not got:
                break
            for item in got:
                items.append(item)
                self._mem_bytes += len(item.data)

    def _wake_one(self) -> None:
        w = self.waiters.wake_one()
        if w is not None and self.on_wake is not None:
            self.on_wake(w)

    def __repr__(self) -> str:
        return f"<PersistentQueue {self.name!r} items={self._length} open={len(self._open)}>"


class CollectionBase:
    """What the fused path (server/inline.py) reads and counts of the collection per request
    (QueueCollection's first base, collection.py): in the compiled build a C type declared in
    queue.pxd, so InlineOps reads and writes these as struct fields, not by generic lookups of a
    Python object's slots (an attribute read and a write per request).  Slots, set by
    QueueCollection.__init__; here, not in collection.py, because that module is not compiled."""
    __slots__ = ("autoflush", "total_items", "get_hits", "get_misses")


if COMPILED:
    # interpreted readers (the mixin, the collection, tests) read the fields as member
    # descriptors, LOAD_ATTR_SLOT, not Cython's getsets (memcache_commands.pxd)
    _c_slot_fields(PersistentQueue, tuple(n for n in PersistentQueue.__slots__ if n not in C_TYPED))
    _c_slot_fields(CollectionBase, CollectionBase.__slots__)
