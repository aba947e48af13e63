# C declarations for the compiled build of flow.py (setup.py, engine/compiled.py); the .py is the
# code, this file only declares.  `room_for` is a C function so that Conn (conn.pxd cimports it)
# calls it as one: a Python call from compiled code cost ~2.5k instructions per
# `Conn.note_reply`, paid on each new connection's first ~32 replies (perf/README.md, stop 22).
cimport cython

@cython.locals(k=Py_ssize_t, by_size=Py_ssize_t)
cpdef Py_ssize_t room_for(Py_ssize_t n, Py_ssize_t free, Py_ssize_t size) noexcept
