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

# The buffer operations of every request, in C (stream.py and memcache.py call them under
# COMPILED only): the Python expressions beside them copy a slice twice and parse
# method arguments.
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from libc.string cimport memchr

cdef bint COMPILED

cdef inline Py_ssize_t _c_find(bytearray buf, Py_ssize_t start, int byte) noexcept:
    """buf.find(bytes((byte,)), start)"""
    cdef char* s = PyByteArray_AS_STRING(buf)
    cdef Py_ssize_t n = PyByteArray_GET_SIZE(buf)
    if start >= n:
        return -1
    cdef void* p = memchr(s + start, byte, n - start)
    return -1 if p == NULL else <char*>p - s

cdef inline bytes _c_head(bytearray buf, Py_ssize_t n):
    """bytes(buf[:n]), 0 <= n <= len(buf)"""
    return PyBytes_FromStringAndSize(PyByteArray_AS_STRING(buf), n)
