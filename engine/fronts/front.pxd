# C types for the compiled build of front.py (setup.py, engine/compiled.py); the .py is the code,
# this file only declares.  `Front` is a C type so that the compiled connection handlers
# (memcache.pxd types the front they read as one) read its fields as C struct members, where
# interpreted code cannot specialise a read of another object's field from C (perf/README.md,
# stop 17: "Compiling the whole request chain with C types", plan step 4).  Interpreted readers
# (the mixins, conn.py's def methods, the other protocols, tests) read the same fields as member
# descriptors (front.py calls _c_slot_fields under COMPILED).  Fields are objects: interpreted
# code reads most of them per request.
cimport cython
from lanner.protocols.memcache_commands cimport _c_slot_fields
from lanner.fronts.conn cimport Conn, FrontBase

cdef bint COMPILED

cdef class Front(FrontBase):        # FrontBase: the fields a connection reads (conn.pxd)
    cdef public object index, config, status, counters, req_rings, resp_rings, nworkers, wake_fd
    cdef public object control, listeners, started_at, clock, next_conn, dirty_rings
    cdef public object flush_scheduled, down_workers, ctl_reader, servers, stopping, spills
    cdef public object ring_waiters, asm, live_req, live_resp, valid_names, item_limits, owners
    cdef public object settles, fused, routes
    # the status block's seq word (server/status.py `seq`), read in C by the memcache handlers
    # per request (memcache.pxd); compiled only (front.py sets it under COMPILED: not a slot)
    cdef const unsigned long long[:] status_seq

    @cython.locals(conns=dict, c=Conn)
    cpdef drain_responses(self)
    @cython.locals(pending=set, c=Conn)
    cpdef flush_writes(self)
