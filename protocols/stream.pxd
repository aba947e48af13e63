# C types for the compiled build of stream.py (setup.py, engine/compiled.py); the .py is the
# code, this file only declares.
cimport cython

cdef class StreamParser:
    cdef public Py_ssize_t max_line
    cdef public object _buf         # bytes (a read taken in place) or bytearray (stream.py)
    cdef public Py_ssize_t _pos
    cdef public Py_ssize_t _scan
    cdef public int _state

    cpdef _reset(self)
    @cython.locals(pos=Py_ssize_t)
    cpdef _append(self, object data)
    cpdef _consumed(self, Py_ssize_t pos)
    @cython.locals(pos=Py_ssize_t, i=Py_ssize_t, n=Py_ssize_t)
    cpdef Py_ssize_t _line_end(self) except -3
    cpdef int _before(self, Py_ssize_t i) except -2
    @cython.locals(pos=Py_ssize_t, i=Py_ssize_t, end=Py_ssize_t)
    cpdef object _take_line(self)

cpdef object joined(object buf, Py_ssize_t pos, object data)

# The buffer operations of every request, in C (stream.py, memcache.py call them under COMPILED
# only): the Python expressions beside them copy a slice twice, index through the generic
# object protocol and parse method arguments.  `buf` is what `_buf` holds: bytes or bytearray.
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_FromStringAndSize
from libc.string cimport memchr

cdef extern from "Python.h":
    Py_ssize_t Py_SIZE(object o)
    bint PyBytes_CheckExact(object o)

cdef bint COMPILED

cdef inline const char* _c_ptr(object buf) noexcept:
    return PyBytes_AS_STRING(buf) if PyBytes_CheckExact(buf) else PyByteArray_AS_STRING(buf)

cdef inline Py_ssize_t _c_find(object buf, Py_ssize_t start, int byte) noexcept:
    """buf.find(bytes((byte,)), start)"""
    cdef const char* s = _c_ptr(buf)
    cdef Py_ssize_t n = Py_SIZE(buf)
    if start >= n:
        return -1
    cdef const void* p = memchr(s + start, byte, n - start)
    return -1 if p == NULL else <const char*>p - s

cdef inline int _c_byte(object buf, Py_ssize_t i) noexcept:
    """buf[i], 0 <= i < len(buf)"""
    return <unsigned char>_c_ptr(buf)[i]

cdef inline bytes _c_slice(object buf, Py_ssize_t start, Py_ssize_t n):
    """bytes(buf[start:start + n]), within the buffer"""
    return PyBytes_FromStringAndSize(_c_ptr(buf) + start, n)

cdef inline Py_ssize_t _c_buffered(StreamParser p) noexcept:
    """p.buffered (bytes held, not yet parsed): two field reads, where len() of the object field
    is a generic call (Conn.pump asks twice per read)"""
    return Py_SIZE(p._buf) - p._pos

cdef inline bytearray _c_tail(object buf, Py_ssize_t start):
    """bytearray(buf[start:]), 0 <= start <= len(buf)"""
    return PyByteArray_FromStringAndSize(_c_ptr(buf) + start, Py_SIZE(buf) - start)
