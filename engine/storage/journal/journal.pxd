# C types for the compiled build of journal.py (setup.py, engine/compiled.py); the .py is the
# code, this file only declares.  The fields are objects that interpreted code (the mixins, the
# syncer, the factory, tests) reads through member descriptors (_c_slot_fields), as the
# `__slots__` of the pure-Python build; the compiled methods read them as C struct fields.  Three
# are typed for record_* and flush (journal.py C_TYPED): the buffer (len, append in C), `_origin`
# (a mark is one C add) and `check_at` (a C compare); interpreted code reads them as getsets,
# off the request path (rotation, read-behind, write-behind).
cimport cython
from libc.string cimport memcpy
from lanner.protocols.memcache_commands cimport _c_slot_fields
from lanner.queues.item cimport QItem

cdef bint COMPILED

# The write buffer's C side (journal.py calls these under COMPILED only): a record is written
# into the bytearray in place, where `p += pack_addx(...)` then `p += data` built a bytes head
# and grew the buffer twice, each growth a realloc and a copy of all it held (CPython grows a
# bytearray by an eighth; the batch's flush empties it, so every turn regrew it from nothing).
cdef extern from "Python.h":
    ctypedef struct PyByteArrayObject:
        Py_ssize_t ob_alloc
        char* ob_bytes
        char* ob_start
    int PyByteArray_Resize(object ba, Py_ssize_t size) except -1
    char* PyByteArray_AS_STRING(object ba)
    Py_ssize_t PyByteArray_GET_SIZE(object ba)
    char* PyBytes_AS_STRING(object b)

cdef inline char* _c_grow(bytearray p, Py_ssize_t n) except NULL:
    """`n` more bytes at the end of `p`, to be written through the pointer returned.  A growth
    past the allocation doubles it (by 64 KiB at most), so a turn's records cost a realloc or
    two, not one each; CPython keeps an allocation while the size stays over half of it."""
    cdef Py_ssize_t size = PyByteArray_GET_SIZE(p)
    cdef Py_ssize_t want = size + n
    cdef PyByteArrayObject* b = <PyByteArrayObject*>p
    if want + (b.ob_start - b.ob_bytes) + 1 > b.ob_alloc:
        PyByteArray_Resize(p, want + (want if want < 65536 else 65536))
    PyByteArray_Resize(p, want)
    return PyByteArray_AS_STRING(p) + size

cdef inline void _c_le(char* w, long long v, int nbytes):
    cdef int i
    for i in range(nbytes):
        w[i] = <char>((v >> (8 * i)) & 0xFF)

cdef inline int _c_put_addx(bytearray p, bytes data, long long add_time, long long expiry) except -1:
    """An ADDX record, as codec.pack_addx's head (`<Biqq`: opcode 2, len + 16, add time,
    expiry) and the data (a bytes below BIG_RECORD: journal.py checks)."""
    cdef Py_ssize_t n = len(data)
    cdef char* w = _c_grow(p, 21 + n)
    w[0] = 2
    _c_le(w + 1, n + 16, 4)
    _c_le(w + 5, add_time, 8)
    _c_le(w + 13, expiry, 8)
    memcpy(w + 21, PyBytes_AS_STRING(data), n)
    return 0

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
