# C types for the compiled build of journal.py (setup.py, engine/compiled.py); the .py is the
# code, this file only declares.  The fields are objects that interpreted code (the mixins, the
# syncer, the factory, tests) reads through member descriptors (_c_slot_fields), as the
# `__slots__` of the pure-Python build; the compiled methods read them as C struct fields.  Three
# are typed for record_* and flush (journal.py C_TYPED): the buffer (len, append in C), `_origin`
# (a mark is one C add) and `check_at` (a C compare); interpreted code reads them as getsets,
# off the request path (rotation, read-behind, write-behind).
cimport cython
from lanner.protocols.memcache_commands cimport _c_slot_fields
from lanner.queues.item cimport QItem

cdef bint COMPILED

cdef class JournalBase:
    pass

cdef class Journal(JournalBase):
    cdef public object _dir, _path, name, _clock, sync_policy, inline_pack, _owner, _listing
    cdef public object _fd, _gen, _opened, _base, _disk_size, _synced_size, writer
    cdef public object _inflight_n, _chain, _torn, _closed, _erased
    cdef public bytearray _pending
    cdef public long long _origin
    cdef public object _cursor, in_read_behind, _read_mark
    cdef public object check_due, rewrites, rotations, _archived_size, _last_ts
    # the mark whose record makes `check_due` true: compared with in C by every record_*
    cdef public long long check_at
    cdef public object _rewrites_allowed_at, checkpoint, _pack_outstanding, _rewrite_job
    cdef public object sync_gate, on_checkpoint

    # cpdef: a C call from the compiled queue holding a typed Journal (queue.pxd), the item's
    # fields struct reads (item.pxd); interpreted callers and Python subclasses' overrides see
    # the same methods
    @cython.locals(mark=cython.longlong, n=Py_ssize_t)
    cpdef record_add(self, QItem item)
    @cython.locals(mark=cython.longlong)
    cpdef record_remove(self, QItem item)
    @cython.locals(mark=cython.longlong)
    cpdef record_open(self, QItem item, xid)
