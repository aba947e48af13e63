"""Which modules setup.py compiles with Cython (pure-Python mode: the same .py files, no second
copy of the logic).  Each earned its place by a measured gain in CPU per request
(perf/README.md, "Compiled hot path"); a module whose classes must stay plain Python (async
code, classes tests monkeypatch: a C type cannot be patched) stays out.  Tests may still patch a
compiled module's globals (journal.py's `_write`: Cython reads them from the module at call
time) and subclass its C types in Python (test_factory_tick's WatchedJournal,
test_client_timeout's Watched connection).

`LANNER_REQUIRE_COMPILED=1` makes tests/test_compiled.py fail when any of them was loaded from
its .py file, i.e. when the build silently fell back to pure Python."""

HOT_MODULES = (
    "lanner.protocols.stream",       # with stream.pxd: the parsers' buffer and state as C fields
    "lanner.protocols.memcache",     # with memcache.pxd: MemcacheParser a C type, next() typed
    "lanner.protocols.memcache_commands",    # with its .pxd: GetKey, Get, Set C types
    "lanner.ops.latency",            # with latency.pxd: Recorder.observe on a typed memoryview
    "lanner.ipc.shm",                # with shm.pxd: CounterSlot.incr/decr on a typed memoryview
    "lanner.fronts.flow",            # with flow.pxd: room_for a C function, Conn's C call
    "lanner.fronts.conn",            # with conn.pxd: Conn a C type, its own fields C struct reads
    "lanner.fronts.slots",           # no .pxd: the reply queue's Slot, Part and requests (thrift,
                                     # blocking gets ...), compiled as they were inside conn.py
    "lanner.fronts.front",           # with front.pxd: Front a C type, read as one by memcache.pxd
    "lanner.server.local",           # with local.pxd: LocalFront a C type (the fused path's front)
    "lanner.fronts.memcache",        # with memcache.pxd: MemcacheConn a C type, store/on_get typed
    "lanner.fronts.memcache_outcomes",   # no .pxd: set_fused/get1_fused, once per reply
    "lanner.queues.item",            # with item.pxd: QItem a C type (an add: a C allocation, struct stores)
    "lanner.queues.undo",            # with undo.pxd: UndoLog a C type (the queue notes, the fused path sets ctx)
    "lanner.queues.queue",           # with queue.pxd: PersistentQueue a C type (add, remove)
    "lanner.storage.journal.journal",    # with journal.pxd: Journal a C type (record_*, flush)
    "lanner.server.inline",          # with inline.pxd: the worker's fused set and get, C calls
                                     # into the queue along typed references
    "lanner.clock",                  # no .pxd: SystemClock.now_ms, once per request, a C call
                                     # instead of a Python frame
)
