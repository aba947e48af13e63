# C types for the compiled build of conn.py (setup.py, engine/compiled.py); the .py is the code,
# this file only declares.  `Conn` is a C type so that its own methods read its fields as C
# struct members (perf/README.md, stop 17: "Compiling the whole request chain with C types");
# interpreted readers (the mixins, subclasses, fronts, tests) read the same fields as member
# descriptors (conn.py calls _c_slot_fields and _c_member_fields under COMPILED).
cimport cython
from lanner.protocols.memcache_commands cimport _c_slot_fields, _c_member_fields, T_PYSSIZET, T_DOUBLE
from lanner.ops.latency cimport Recorder, _c_monotonic
from lanner.ipc.shm cimport ConfigEpoch, CounterSlot
from lanner.protocols.memcache cimport MemcacheParser
from lanner.fronts.flow cimport room_for
from lanner.protocols.stream cimport _c_buffered
from cpython.dict cimport PyDict_GetItem
from cpython.ref cimport PyObject

cdef bint COMPILED
# compared with C ints per reply (fast_reply, flush_out): C constants, not module lookups
cdef long R_OK, R_ITEM, RF_HELD
cdef Py_ssize_t SMALL_REPLY, SPLICE_MIN, WRITE_CHUNK

# What a connection reads of its front per request: Front's first base (front.pxd), declared
# here because front.pxd cimports `Conn` (deliver's and flush_writes' C calls): conn.pxd
# cimporting `Front` would be a cycle at load.  A local typed FrontBase reads these as struct
# members; `my` and `latency` as their C types make `incr` and `since` C calls.
cdef class FrontBase:
    cdef public object epoch, my, latency, conns, idle, loop, write_pending, congested

# What a connection reads of its worker (a worker's own front's connections): Worker's first
# base (server/worker.py, a Python class), declared here for the same reason.
cdef class WorkerBase:
    cdef public object turn_scheduled, reads_left, closed_conns, replies, inline_set, inline_get

# table[key] of a dict subclass that fills its misses (__missing__): FusedQueues (store, on_get)
# and the VALUE lines (fast_reply).  A hit is a C lookup, where the subclass's [] goes through
# the generic mapping call; a miss takes the [] (and so __missing__) as before.
cdef inline object _c_entry(object table, object key):
    cdef PyObject* hit = PyDict_GetItem(table, key)
    if hit is NULL:
        return table[key]
    return <object>hit

cdef class ConnBase:
    pass

cdef class Conn(ConnBase):
    # Field order is memory layout (issue 8, c=1000: perf/README.md stop 23).  With a thousand
    # connections a connection's lines go cold between two of its requests, and each line a
    # request touches is a miss: the fields every request of the fused path reads or writes
    # come first, together (about 4 lines where they were spread over all 7), the rest after.
    # The numbers a request rewrites are C fields (TYPED in conn.py): a new int or float object
    # per request left the previous one, cold, to be read and freed.  `nslots` counts `slots`,
    # so the per-request "no slot queued" tests read this block, not the deque.
    cdef public object front, parser, out, fast, body, stopped, closing, paused_writing
    cdef public object blocked, held, spilled, wbusy, worker, batch, cur_fam, count_bytes
    cdef public double t_in
    cdef public Py_ssize_t next_req, id, idle_room, reply_size, nslots
    cdef public object handlers, transport, reading_paused, refuse_reads, refuse_writes
    cdef public object early, unwritten, touched, local_bit, batched
    # the rest: not read by a fused set or get
    cdef public object slots, parts, batch_of, spill, spill_queued, local, last_activity
    cdef public object adopted, moving, moved, held_slots

    @cython.locals(f=FrontBase, epoch=ConfigEpoch, my=CounterSlot, w=WorkerBase, mp=MemcacheParser)
    cpdef data_received(self, data)
    @cython.locals(room=Py_ssize_t, buffered=Py_ssize_t, mp=MemcacheParser)
    cpdef pump(self)
    cpdef dispatch(self, handlers, kind, cmd)
    @cython.locals(f=FrontBase)
    cpdef Py_ssize_t room(self) except -1
    cpdef update_reading(self)
    cpdef send_disconnects(self)
    @cython.locals(size=Py_ssize_t)
    cpdef note_reply(self, Py_ssize_t n)
    cpdef drain_slots(self)
    @cython.locals(out=list, n=Py_ssize_t, f=FrontBase, my=CounterSlot)
    cpdef flush_out(self)
    @cython.locals(out=list, n=Py_ssize_t, f=FrontBase, latency=Recorder, pending=set)
    cpdef fast_reply(self, long status, long flags, payload, value=*)
