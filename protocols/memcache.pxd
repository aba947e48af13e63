# C types for the compiled build of memcache.py (setup.py, engine/compiled.py); the .py is the
# code, this file only declares.
cimport cython
from lanner.protocols.stream cimport StreamParser, _c_head
from lanner.protocols.memcache_commands cimport plain_get, new_set

cdef bint COMPILED
cdef int _LINE, _DATA, _SKIP, _STOPPED, _BODY

@cython.locals(n=Py_ssize_t, v=long, c=int)
cpdef object parse_int(bytes tok)

cpdef bint _noreply(list toks, Py_ssize_t nargs)

cdef class MemcacheParser(StreamParser):
    cdef public object item_limit
    cdef public object stream_over
    cdef public Py_ssize_t _need
    cdef public object _set
    cdef public object _after
    cdef public object _direct

    @cython.locals(buf=bytearray, state=int, need=Py_ssize_t, n=Py_ssize_t, cmd=object)
    cpdef object next(self)
    @cython.locals(toks=list, word=bytes, raw=str, key=bytes)
    cpdef object _line(self, bytes line)
    @cython.locals(size=object, exptime=object, flags=object, name=bytes, queue=str, noreply=bint)
    cpdef object _storage(self, bytes word, list toks)
    cpdef object _skip(self, Py_ssize_t n, object after)
    cpdef object _stop(self, object cmd)
