# C declarations for the compiled build of clock.py (setup.py, engine/compiled.py); the .py is
# the code, this file only declares.
from posix.time cimport clock_gettime, timespec, CLOCK_REALTIME

cdef bint COMPILED

cdef inline long long _c_now_ms() noexcept:
    """time.time_ns() // 1_000_000 without two Python calls, a module attribute lookup and a
    big-int division: CPython's time_ns reads the same CLOCK_REALTIME."""
    cdef timespec ts
    clock_gettime(CLOCK_REALTIME, &ts)
    return <long long>ts.tv_sec * 1000 + ts.tv_nsec // 1000000
