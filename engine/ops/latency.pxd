# C types for the compiled build of latency.py (setup.py, engine/compiled.py); the .py is the
# code, this file only declares.
cimport cython

cdef Py_ssize_t _NB, _STRIDE

cdef class Recorder:
    cdef long long[:] words
    cdef readonly Py_ssize_t base

    @cython.locals(col=Py_ssize_t, i=Py_ssize_t, bound=double, us=cython.longlong)
    cpdef observe(self, long family, double seconds)
    cpdef since(self, long family, double t0)

# The clock `since` reads once per reply, in C (latency.py calls it under COMPILED only):
# time.monotonic() from compiled code is a module attribute lookup and a Python call.
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC

cdef bint COMPILED

cdef inline double _c_monotonic() noexcept:
    """time.monotonic(): CPython reads the same CLOCK_MONOTONIC."""
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9
