# C types for the compiled build of shm.py (setup.py, engine/compiled.py); the .py is the
# code, this file only declares.  CounterSlot: the fronts count every request into it;
# ConfigEpoch: a connection asks `behind()` on every read (Conn.data_received, conn.pxd), a C
# call on its fields where a Python class's were two generic attribute reads from C.
cdef class CounterSlot:
    cdef readonly object words
    cdef long long[:] _row
    cdef Py_ssize_t _base
    cdef readonly dict index

    cpdef incr(self, Py_ssize_t index, long long n=*)
    cpdef decr(self, Py_ssize_t index, long long n=*)

cdef class ConfigEpoch:
    cdef public object counter, word, seen

    cpdef bint behind(self) except -1
