# C type for the compiled build of inline.py (setup.py, engine/compiled.py); the .py is the code,
# this file only declares.  The references the two methods follow per request are typed: the
# queue dict and the sessions a `dict` (a C lookup, a C size), a queue a PersistentQueue (its
# cpdef `add` and `remove` C calls, `children` a struct read).  The methods are cpdef: a C call
# for a compiled caller that types its reference, the bound method the worker hands out for the
# others.
cimport cython
from lanner.fronts.conn cimport WorkerBase
from lanner.queues.item cimport QItem
from lanner.clock cimport _c_now_ms
from lanner.queues.queue cimport CollectionBase, PersistentQueue
from lanner.queues.undo cimport UndoLog

cdef bint COMPILED

cdef class InlineOps:
    cdef public WorkerBase worker     # `replies`, per request: a struct read (conn.pxd)
    cdef public CollectionBase coll   # `autoflush` and the counts, per request: struct fields (queue.pxd)
    cdef public object clock
    cdef public UndoLog undo      # `ctx` set per request: a struct write (undo.pxd)
    cdef public dict queues, sessions

    @cython.locals(q=PersistentQueue)
    cpdef inline_set(self, src, conn, req, queue, expiry, data)
    @cython.locals(q=PersistentQueue, item=QItem)
    cpdef inline_get(self, src, conn, req, queue)
