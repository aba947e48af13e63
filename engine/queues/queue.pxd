# C types for the compiled build of queue.py (setup.py, engine/compiled.py); the .py is the code,
# this file only declares.  Every field is an object: interpreted code (the mixins, the collection,
# the fronts, tests) reads them through member descriptors (_c_slot_fields), as the `__slots__`
# of the pure-Python build; the compiled methods read them as C struct fields.
cimport cython
from lanner.protocols.memcache_commands cimport _c_slot_fields
from lanner.queues.item cimport QItem
from lanner.queues.undo cimport UndoLog
from lanner.storage.journal.journal cimport Journal

cdef bint COMPILED

cdef class PersistentQueueBase:
    pass

# QueueCollection's first base (collection.py, queue.py): what the fused path (server/inline.pxd)
# reads and counts of the collection per request, struct fields
cdef class CollectionBase:
    cdef public object autoflush, total_items, get_hits, get_misses

cdef class PersistentQueue(PersistentQueueBase):
    cdef public object name, config, storage, clock, is_fanout_child, expire_sink, hold_moves
    cdef public object on_wake, touched, medium, closed, created_ms, waiters, children
    cdef public UndoLog undo      # (a getset, as C_TYPED: a member would take any type)
    cdef public object _items, _limits_of, _open
    # C integers: the counts add and remove compare and move per request (C compares and adds,
    # not PyObject_RichCompare / PyNumber_InPlaceAdd), and the limits they are compared with;
    # interpreted code (dropbehind.py, stats, tests) reads them as getsets (queue.py C_TYPED)
    cdef public long long _length, _bytes, _mem_bytes, total_items, _floor, _max_memory
    # what add and remove read of the config per request (adopt_limits), C reads not generic ones
    cdef public object _max_age, _fanout_only
    cdef public object _open_deadline, _moving, _held, _xid, _last_removed_add_time
    cdef public object expired_items, discarded, transactions, canceled_transactions
    cdef public object total_flushes

    # cpdef: a C call from a compiled caller holding a typed PersistentQueue (server/inline.pxd,
    # the fused path's set and get); interpreted callers see the same methods.  The item is a C
    # type (item.pxd), and so is the storage when it is a Journal (its cpdef record_*, journal.pxd)
    @cython.locals(item=QItem, head=QItem, journal=Journal, n=Py_ssize_t)
    cpdef bint add(self, data, expiry_ms=*, add_time_ms=*, now_ms=*, bint count_total=*) except -1
    @cython.locals(item=QItem, head=QItem, journal=Journal, n=Py_ssize_t)
    cpdef remove(self, transactional=*)
