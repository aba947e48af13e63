# C types for the compiled build of memcache.py (setup.py, engine/compiled.py); the .py is the
# code, this file only declares.  `MemcacheConn` is a C type deriving from conn.pxd's `Conn`, and
# its two hot handlers read what they read per request typed (plan step 4, perf/README.md stop
# 17): the front as front.pxd's `Front` (its fields C struct reads), the fused path's front as
# local.pxd's `LocalFront`, the counters as shm.pxd's `CounterSlot` (`incr` a C call) and the
# plain get as its C command types.  Compiled alone, over untyped references, the class lost
# (+1.3 %, stop 17): its work is reads of other objects.  No fields of its own.
cimport cython
from lanner.protocols.memcache_commands cimport Get, GetKey, Set
from lanner.ipc.shm cimport CounterSlot
from lanner.fronts.conn cimport Conn, WorkerBase, _c_entry
from lanner.fronts.front cimport Front
from lanner.server.local cimport LocalFront

cdef bint COMPILED

@cython.locals(word=cython.longlong, clear=cython.longlong)
cdef bint status_moved(Front f, st) except -1

cdef class MemcacheConn(Conn):
    @cython.locals(f=Front, lf=LocalFront, my=CounterSlot, s=Set, wk=WorkerBase, n=Py_ssize_t)
    cpdef store(self, cmd)
    @cython.locals(f=Front, lf=LocalFront, my=CounterSlot, k=GetKey, wk=WorkerBase, n=Py_ssize_t)
    cpdef on_get(self, Get cmd)
    cpdef dispatch(self, handlers, kind, cmd)
