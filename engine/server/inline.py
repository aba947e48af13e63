"""The worker's side of the fused local path (fronts/inline.py): a whole-body set and a plain get
from one of the worker's own clients, run against the queue at once, without a request record.

It is its own object, and a C type in the compiled build (inline.pxd), because it is the link
between the connection and the queue on nearly every request of one queue's traffic: compiled
with typed references (the collection's queue dict a dict, a queue a PersistentQueue), its calls
into the queue are C calls (queue.pxd's cpdef `add`, `remove`) and its reads of the queue C
struct reads, where the interpreted Worker methods it replaces paid a Python frame each and the
queue's argument parsing.  The worker hands out its two bound methods under their old names
(`Worker.inline_set`, `inline_get`, set by `Worker.boot`), so the callers (MemcacheConn.store,
on_get) are unchanged.
"""
from __future__ import annotations

from lanner.clock import SystemClock
from lanner.ipc.messages import R_EMPTY, R_ITEM, R_NOT_STORED, R_OK

# COMPILED: as in memcache_commands.py (inline.pxd makes it a C constant in the compiled build,
# where clock.pxd's _c_now_ms exists)
try:
    import cython
    COMPILED = cython.compiled
except ImportError:             # pure Python without Cython installed
    COMPILED = False


class InlineOps:
    """OP_SET and a plain OP_GET as the worker's `execute` and `plain_get` run them, for a queue
    that exists, with QueueCollection.add's and remove's accounting done here; every other case
    (no such queue yet, fanout children, an autoflushing collection, sessions with open reads)
    goes through the collection or the worker, as before."""

    __slots__ = ("worker", "coll", "queues", "undo", "clock", "sessions")

    def __init__(self, worker, coll) -> None:
        self.worker = worker
        self.coll = coll
        # the collection's and worker's own objects, bound once: none of them is ever replaced
        self.queues = coll.queues
        self.undo = coll.undo
        self.clock = coll.clock
        self.sessions = worker.sessions

    def inline_set(self, src: int, conn: int, req: int, queue: str, expiry: int, data: bytes) -> bool | None:
        """A whole-body set (MemcacheConn.store, which scheduled the turn).  Returns whether it
        was stored, None if it failed (request_failed answered it)."""
        coll = self.coll
        self.undo.ctx = (src, conn, req)        # whose reply a rolled-back change must fail
        try:
            q = self.queues.get(queue)
            if q is None or q.children or coll.autoflush:
                ok = coll.add(queue, data, expiry or None)
            else:                       # QueueCollection.add, its common case
                clock = self.clock      # the system's read in C (clock.pxd); tests' stopped clocks, called
                now = _c_now_ms() if COMPILED and type(clock) is SystemClock else clock.now_ms()
                ok = q.add(data, expiry, now, now)      # (0 is never, as None is)
                if ok:
                    coll.total_items += 1
        except Exception as e:   # one bad request must not take the shard down
            self.worker.request_failed(src, conn, req, queue, e)
            return None
        # its head unpacked: the reply stays in this process (messages.resp_fields)
        self.worker.replies.append((src, (conn, req, R_OK if ok else R_NOT_STORED, 0, 0, 0), b""))
        return ok

    def inline_get(self, src: int, conn: int, req: int, queue: str) -> bytes | bool | None:
        """A plain `get q` (MemcacheConn.on_get, which scheduled the turn), while the worker has
        no sessions at all (so none holds an open read); else Waiting.plain_get.  Returns the
        value, False if none, None if another path answers (a reply rendered at once:
        rendered.py)."""
        if self.sessions:
            self.worker.plain_get(src, conn, req, queue)
            return None
        coll = self.coll
        self.undo.ctx = (src, conn, req)
        try:
            q = self.queues.get(queue)
            if q is None or coll.autoflush:
                item = coll.remove(queue)
            else:                       # QueueCollection.remove, its common case
                item = q.remove(False)
                if item is None:
                    coll.get_misses += 1
                else:
                    coll.get_hits += 1
        except Exception as e:   # one bad request must not take the shard down
            self.worker.request_failed(src, conn, req, queue, e)
            return None
        if item is None:
            self.worker.replies.append((src, (conn, req, R_EMPTY, 0, 0, 0), b""))
            return False
        data = item.data
        self.worker.replies.append((src, (conn, req, R_ITEM, 0, 0, 0), data))
        return data
