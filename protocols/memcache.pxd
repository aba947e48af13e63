# C types for the compiled build of memcache.py (setup.py, engine/compiled.py); the .py is the
# code, this file only declares.
cimport cython
from cpython.unicode cimport PyUnicode_DecodeLatin1
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.exc cimport PyErr_Occurred
from cpython.unicode cimport PyUnicode_GET_LENGTH, PyUnicode_DATA
from cpython.ref cimport PyObject, _Py_REFCNT
from libc.string cimport memchr, memcmp
from lanner.protocols.stream cimport StreamParser, _c_slice, _c_byte, _c_ptr
from lanner.protocols.memcache_commands cimport plain_get, new_set, Set as _CSet, Get as _CGet, GetKey as _CGetKey

cdef bint COMPILED
cdef int _LINE, _DATA, _SKIP, _STOPPED, _BODY, BINARY_MAGIC
cdef Py_ssize_t SPARE_MAX

# The process's spares, shared by every connection's parser (_c_name, _c_plain_get, _c_new_set
# below; memcache.py sets them to None): the last name parsed, and the last plain Get and Set,
# reused once nothing else holds them.  A parser's own spares went cold between two requests of
# its connection (issue 8: with 1,000 connections ~4 of a request's misses in a simulated 1 MiB
# last level, perf/README.md stop 23); the process's are the ones the request before used.
cdef str _last_name
cdef _CGet _spare_get
cdef _CSet _spare_set

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
    # the compiled hot line's reuse (_c_name below): no Python field
    cdef str _name

    @cython.locals(buf=object, state=int, pos=Py_ssize_t, need=Py_ssize_t, n=Py_ssize_t,
                   have=Py_ssize_t, cmd=object, set_=_CSet, piece=object, first=int,
                   i=Py_ssize_t, end=Py_ssize_t, name=str, sl=_SetLine)
    cpdef object next(self)
    cpdef feed(self, data)
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

cdef inline object _c_hot_line(MemcacheParser p, object buf, Py_ssize_t pos, Py_ssize_t end,
                               _SetLine* out):
    """The line buf[pos:end] if it is `get <key>`, one key with no space and no `/`: the key
    (latin-1, _c_name), out.get set; or `set <name> <flags> <exptime> <bytes>` and an optional
    ` noreply`, single spaces, each number 1 to 9 plain digits: the name (latin-1), its numbers
    in `out`.  Else None."""
    cdef const char* s = _c_ptr(buf) + pos
    cdef Py_ssize_t n = end - pos
    if n >= 5 and memcmp(s, b"get ", 4) == 0:
        if memchr(s + 4, 32, n - 4) != NULL or memchr(s + 4, 47, n - 4) != NULL:
            return None
        out.get = True
        return _c_name(p, s + 4, n - 4)
    out.get = False
    return _c_set_line(p, s, n, out)

cdef inline str _c_name(MemcacheParser p, const char* s, Py_ssize_t n):
    """The name s[:n], latin-1: the process's last one when it is the same (clients mostly
    name a few queues again and again), else the connection's last one, else a new str, kept
    as both.  The same object again is no decode, and no hash computed again by every dict it
    is looked up in (the front's fused and valid names, the worker's queues, the item limits)."""
    global _last_name
    cdef str name = _last_name
    if name is not None and PyUnicode_GET_LENGTH(name) == n and \
            memcmp(PyUnicode_DATA(name), s, n) == 0:     # latin-1: one byte a character
        return name
    name = p._name
    if name is None or PyUnicode_GET_LENGTH(name) != n or memcmp(PyUnicode_DATA(name), s, n) != 0:
        name = PyUnicode_DecodeLatin1(s, n, NULL)
        p._name = name
    _last_name = name
    return name

cdef inline object _c_plain_get(str name):
    """plain_get(name), in the process's last plain Get when nothing else holds that Get, its
    list of keys or its key (reference counts 1, 1 and 2: the list and `plain`): no caller can
    tell it from a new one, and its three allocations and frees are saved (issue 8)."""
    global _spare_get
    cdef _CGet g = _spare_get
    cdef _CGetKey k
    cdef PyObject* keys
    if g is not None and _Py_REFCNT(<PyObject*>g) == 2:      # _spare_get and the local g
        keys = <PyObject*>g.keys
        if type(g.keys) is list and _Py_REFCNT(keys) == 1 and len(g.keys) == 1 and \
                type(g.plain) is _CGetKey and (<list>g.keys)[0] is g.plain and \
                _Py_REFCNT(<PyObject*>g.plain) == 2:
            k = g.plain
            k.raw = k.queue = name
            k.timeout_ms = None
            k.open = k.close = k.abort = k.peek = False
            return g
    g = plain_get(name)
    _spare_get = g
    return g

cdef inline object _c_new_set(str queue, object flags, object exptime,
                              bint noreply):
    """new_set(...), in the process's last Set when nothing else holds it (as _c_plain_get).
    `next` lets go of a Set whose body is bigger than SPARE_MAX (_c_drop_spare), so no big
    body stays alive after its item is gone."""
    global _spare_set
    cdef _CSet s = _spare_set
    if s is not None and _Py_REFCNT(<PyObject*>s) == 2:      # _spare_set and the local s
        s.queue = queue
        s.flags = flags
        s.exptime = exptime
        s.data = b""
        s.noreply = noreply
        return s
    s = new_set(queue, flags, exptime, noreply)
    _spare_set = s
    return s

cdef inline void _c_drop_spare(object s) noexcept:
    """`s` (a Set with a big body) is not kept as the spare Set."""
    global _spare_set
    if <object>_spare_set is s:
        _spare_set = None

cdef inline object _c_set_line(MemcacheParser p, const char* s, Py_ssize_t n, _SetLine* out):
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
    return _c_name(p, s + starts[0], ends[0] - starts[0])
