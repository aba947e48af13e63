# C types for the compiled build of local.py (setup.py, engine/compiled.py); the .py is the code,
# this file only declares.  `LocalFront` is a C type deriving from front.pxd's `Front`, so the
# fused path of a memcache connection (memcache.pxd) reads its fields as C struct members, and
# `deliver` hands each reply to its connection by a C call (Conn.fast_reply, conn.pxd).
# Interpreted readers read the fields as member descriptors (local.py calls _c_slot_fields under
# COMPILED).
cimport cython
from lanner.protocols.memcache_commands cimport _c_slot_fields
from lanner.fronts.conn cimport Conn
from lanner.fronts.front cimport Front

cdef bint COMPILED

cdef class LocalFront(Front):
    cdef public object worker, local, first_slot, channels, streak, candidates, handoff_seq
    cdef public object receive_ends, inline_requests

    @cython.locals(conns=dict, c=Conn, n=Py_ssize_t)
    cpdef deliver(self, replies, src)
