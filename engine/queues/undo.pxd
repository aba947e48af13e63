# C type for the compiled build of undo.py (setup.py, engine/compiled.py); the .py is the code,
# this file only declares.  The queue notes every recorded change here (queue.pxd: `undo` typed),
# and the fused path sets `ctx` per request (server/inline.pxd): C struct reads and writes, where
# a Python UndoLog cost a generic lookup each from compiled code.  `ctx` and `copies` are read
# by interpreted code (the worker, commit.py, moves.py) as member descriptors (_c_slot_fields);
# `entries`, a list, through Cython's getset (it checks the type), once per batch.
cimport cython
from lanner.protocols.memcache_commands cimport _c_slot_fields

cdef bint COMPILED

cdef class UndoLog:
    cdef public list entries
    cdef public object ctx, copies

# UndoLog.trim's one-medium check: a C loop over the entries (tuples: their first field a C read)
@cython.locals(e=tuple)
cdef bint _of_one(list entries, object medium) except -1
