# C type for the compiled build of item.py (setup.py, engine/compiled.py); the .py is the code,
# this file only declares.  Every field is an object: interpreted code (the codec, read-behind,
# the cmdlog, the spark reader, tests) reads them through member descriptors (_c_slot_fields),
# as the `__slots__` of the pure-Python build; the compiled queue and journal (queue.pxd,
# journal.pxd) make and read them as C struct fields.
cimport cython
from lanner.protocols.memcache_commands cimport _c_slot_fields

cdef bint COMPILED

cdef class QItem:
    cdef public object add_time, expiry, data, xid, job_id, priority
