# C types for the compiled build of memcache.py (setup.py, engine/compiled.py); the .py is the
# code, this file only declares.
cimport cython
from cpython.unicode cimport PyUnicode_DecodeLatin1
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.exc cimport PyErr_Occurred
from libc.string cimport memchr, memcmp
from lanner.protocols.stream cimport StreamParser, _c_slice, _c_byte, _c_ptr
from lanner.protocols.memcache_commands cimport plain_get, new_set, Set as _CSet

cdef bint COMPILED
cdef int _LINE, _DATA, _SKIP, _STOPPED, _BODY, BINARY_MAGIC

ctypedef struct _SetLine:       # what _c_hot_line read besides the name
    bint get                    # a plain get (else a set, with the fields below)
    long flags
    long exptime
    Py_ssize_t size
    bint noreply

@cython.locals(n=Py_ssize_t, v=long, c=int)
cpdef object parse_int(bytes tok)

cpdef bint _noreply(list toks, Py_ssize_t nargs)

@cython.locals(v=cython.longlong, overflow=int)
cdef inline bint _c_over(Py_ssize_t size, object bound) except -1:
    """bound is not None and size > bound"""
    if bound is None:
        return False
    v = PyLong_AsLongLongAndOverflow(bound, &overflow)
    if overflow:
        return overflow < 0             # beyond a C long long: under any size, or over none
    if v == -1 and PyErr_Occurred():
        raise TypeError("an item size bound must be an int, not %s" % type(bound).__name__)
    return size > v

cdef class MemcacheParser(StreamParser):
    cdef public object item_limit
    cdef public object stream_over
    cdef public Py_ssize_t _need
    cdef public object _set
    cdef public object _after

    @cython.locals(buf=object, state=int, pos=Py_ssize_t, need=Py_ssize_t, n=Py_ssize_t,
                   have=Py_ssize_t, cmd=object, set_=_CSet, piece=object, first=int,
                   i=Py_ssize_t, end=Py_ssize_t, name=str, sl=_SetLine)
    cpdef object next(self)
    @cython.locals(toks=list, word=bytes, key=bytes)
    cpdef object _line(self, bytes line)
    @cython.locals(size=object, exptime=object, flags=object, name=bytes, queue=str, noreply=bint)
    cpdef object _storage(self, bytes word, list toks)
    @cython.locals(limits=object, limit=object, over=object)
    cpdef object _set_cmd(self, str queue, object flags, object exptime, Py_ssize_t size, bint noreply)
    cpdef object _skip(self, Py_ssize_t n, object after)
    cpdef object _stop(self, object cmd)


# The two request lines of nearly every request, read in place in the parser's buffer
# (memcache.py's next calls _c_hot_line under COMPILED only): the parse in memcache.py `_line`
# cuts the line out, splits it into new bytes objects and parses each number from one.  Any
# other form answers None, and takes that parse.

cdef inline long _c_digits(const char* s, Py_ssize_t n) noexcept:
    """The value of 1 to 9 ASCII digits (parse_int's fast case), else -1."""
    cdef long v = 0
    cdef Py_ssize_t i
    if n < 1 or n > 9:
        return -1
    for i in range(n):
        if s[i] < 48 or s[i] > 57:
            return -1
        v = v * 10 + (s[i] - 48)
    return v

cdef inline object _c_hot_line(object buf, Py_ssize_t pos, Py_ssize_t end, _SetLine* out):
    """The line buf[pos:end] if it is `get <key>`, one key with no space and no `/`: the key
    (latin-1), out.get set; or `set <name> <flags> <exptime> <bytes>` and an optional
    ` noreply`, single spaces, each number 1 to 9 plain digits: the name (latin-1), its numbers
    in `out`.  Else None."""
    cdef const char* s = _c_ptr(buf) + pos
    cdef Py_ssize_t n = end - pos
    if n >= 5 and memcmp(s, b"get ", 4) == 0:
        if memchr(s + 4, 32, n - 4) != NULL or memchr(s + 4, 47, n - 4) != NULL:
            return None
        out.get = True
        return PyUnicode_DecodeLatin1(s + 4, n - 4, NULL)
    out.get = False
    return _c_set_line(s, n, out)

cdef inline object _c_set_line(const char* s, Py_ssize_t n, _SetLine* out):
    cdef Py_ssize_t starts[5]
    cdef Py_ssize_t ends[5]
    cdef Py_ssize_t i = 4, k = 0
    cdef const char* sp
    cdef long flags, exptime, size
    cdef bint noreply = False
    if n < 11 or memcmp(s, b"set ", 4) != 0:
        return None
    while k < 5:
        starts[k] = i
        sp = <const char*>memchr(s + i, 32, n - i) if i < n else NULL
        if sp == NULL:
            ends[k] = n
            i = n
            k += 1
            break
        ends[k] = sp - s
        i = ends[k] + 1
        k += 1
    if k == 5:
        if ends[4] != n:            # a last token: exactly `noreply`, else the general parse
            return None
        noreply = ends[3] == n - 8 and memcmp(s + starts[4], b"noreply", 7) == 0
        if not noreply:
            return None
        k = 4
    if k != 4 or ends[3] != (n if not noreply else n - 8):
        return None
    if ends[0] == starts[0]:
        return None
    flags = _c_digits(s + starts[1], ends[1] - starts[1])
    exptime = _c_digits(s + starts[2], ends[2] - starts[2])
    size = _c_digits(s + starts[3], ends[3] - starts[3])
    if flags < 0 or exptime < 0 or size < 0:
        return None
    out.flags = flags
    out.exptime = exptime
    out.size = size
    out.noreply = noreply
    return PyUnicode_DecodeLatin1(s + starts[0], ends[0] - starts[0], NULL)
