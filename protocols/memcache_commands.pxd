# C types for the compiled build of memcache_commands.py (setup.py, engine/compiled.py); the .py
# is the code, this file only declares: the commands of nearly every request.
cimport cython
cdef class _Command:
    pass

cdef class GetKey(_Command):
    cdef public object raw, queue, timeout_ms, open, close, abort, peek

cdef class Get(_Command):
    cdef public object keys, plain

cdef class Set(_Command):
    cdef public object queue, flags, exptime, data, noreply

@cython.locals(k=GetKey, g=Get)
cpdef Get plain_get(str raw)
@cython.locals(s=Set)
cpdef Set new_set(str queue, object flags, object exptime, bint noreply)
