"""Which modules setup.py compiles with Cython (pure-Python mode: the same .py files, no second
copy of the logic).  Each earned its place by a measured gain in CPU per request
(perf/README.md, "Compiled hot path"); a module that tests monkeypatch, or whose classes must stay
plain Python (async code, classes tests patch), stays out.  A C type can still be subclassed in
Python (tests subclass Conn where they would have patched it).

`LANNER_REQUIRE_COMPILED=1` makes tests/test_compiled.py fail when any of them was loaded from
its .py file, i.e. when the build silently fell back to pure Python."""

HOT_MODULES = (
    "lanner.protocols.stream",       # with stream.pxd: the parsers' buffer and state as C fields
    "lanner.protocols.memcache",     # with memcache.pxd: MemcacheParser a C type, next() typed
    "lanner.protocols.memcache_commands",    # with its .pxd: GetKey, Get, Set C types
    "lanner.ops.latency",            # with latency.pxd: Recorder.observe on a typed memoryview
    "lanner.ipc.shm",                # with shm.pxd: CounterSlot.incr/decr on a typed memoryview
    "lanner.fronts.conn",            # with conn.pxd: Conn a C type, its own fields C struct reads
    "lanner.clock",                  # no .pxd: SystemClock.now_ms, once per request, a C call
                                     # instead of a Python frame
)
