# C types for the compiled build of stream.py (setup.py, engine/compiled.py); the .py is the
# code, this file only declares.
cimport cython

cdef class StreamParser:
    cdef public Py_ssize_t max_line
    cdef public bytearray _buf
    cdef public Py_ssize_t _scan
    cdef public int _state

    @cython.locals(buf=bytearray, i=Py_ssize_t, end=Py_ssize_t)
    cpdef object _take_line(self)
