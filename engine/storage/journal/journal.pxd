# C types for the compiled build of journal.py (setup.py, engine/compiled.py); the .py is the
# code, this file only declares.  The fields are objects that interpreted code (the mixins, the
# syncer, the factory, tests) reads through member descriptors (_c_slot_fields), as the
# `__slots__` of the pure-Python build; the compiled methods read them as C struct fields.  Two
# are typed for record_* and flush (servegrind c=10 -0.5 %, c=1 and -r 32 unchanged): the buffer
# (len, append in C) and `_origin` (a mark is one C add); interpreted code reads them as
# getsets, off the request path (rotation, read-behind, write-behind).
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
    cdef public object check_due, check_at, rewrites, rotations, _archived_size, _last_ts
    cdef public object _rewrites_allowed_at, checkpoint, _pack_outstanding, _rewrite_job
    cdef public object sync_gate, on_checkpoint

    # cpdef: a C call from the compiled queue holding a typed Journal (queue.pxd), the item's
    # fields struct reads (item.pxd); interpreted callers and Python subclasses' overrides see
    # the same methods
    cpdef record_add(self, QItem item)
    cpdef record_remove(self, QItem item)
    cpdef record_open(self, QItem item, xid)
