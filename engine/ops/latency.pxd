# C types for the compiled build of latency.py (setup.py, engine/compiled.py); the .py is the
# code, this file only declares.
cimport cython

cdef Py_ssize_t _NB, _STRIDE

cdef class Recorder:
    cdef long long[:] words
    cdef readonly Py_ssize_t base

    @cython.locals(col=Py_ssize_t, i=Py_ssize_t, bound=double, us=cython.longlong)
    cpdef observe(self, long family, double seconds, long long n=*)
    cpdef since(self, long family, double t0)
    cpdef since_n(self, long family, double t0, long long n)

# The clock `since` reads once per reply, in C (latency.py calls it under COMPILED only):
# time.monotonic() from compiled code is a module attribute lookup and a Python call.
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC

cdef bint COMPILED

cdef inline double _c_monotonic() noexcept:
    """time.monotonic(): CPython reads the same CLOCK_MONOTONIC."""
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


# The bucket of an observation, in C (latency.py's observe calls it under COMPILED only): the
# loop over the BOUNDS tuple took a float object and its value per bound passed.  The same
# bounds as BOUNDS (latency.py checks the two agree when it is loaded).
cdef extern from *:
    """
    static const double lanner_latency_bounds[16] = {
        0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
        1.0, 2.5, 5.0, 10.0};
    """
    const double lanner_latency_bounds[16]

cdef inline Py_ssize_t _c_bucket(double seconds) noexcept:
    """bisect_left(BOUNDS, seconds): the first bound not below `seconds`, 16 (+Inf) past all."""
    cdef Py_ssize_t i = 0
    while i < 16 and seconds > lanner_latency_bounds[i]:
        i += 1
    return i

cdef inline double _c_bound(Py_ssize_t i) noexcept:
    return lanner_latency_bounds[i]
