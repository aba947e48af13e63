# C types for the compiled build of shm.py (setup.py, engine/compiled.py); the .py is the
# code, this file only declares.  Only CounterSlot: the fronts count every request into it.
cdef class CounterSlot:
    cdef readonly object words
    cdef long long[:] _row
    cdef Py_ssize_t _base
    cdef readonly dict index

    cpdef incr(self, Py_ssize_t index, long long n=*)
    cpdef decr(self, Py_ssize_t index, long long n=*)
