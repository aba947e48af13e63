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
