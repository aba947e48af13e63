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


# The commands' fields as Python reads them (memcache_commands.py calls _c_slot_fields under
# COMPILED only).  Cython makes a `cdef public object` field a getset descriptor, which
# CPython 3.11 does not specialise: every `cmd.queue` of a front's handler went through the
# generic attribute lookup and the getter (~245 instructions, perf/README.md stop 14).  A member
# descriptor of type T_OBJECT_EX over the same field is what a `__slots__` entry is, read by
# LOAD_ATTR_SLOT (~20); Cython's own code reads and writes the field in C as before.
from cpython.ref cimport PyObject
from cpython.mem cimport PyMem_RawMalloc
from libc.string cimport strcpy

cdef extern from "structmember.h":
    ctypedef struct PyMemberDef:
        const char* name
        int type
        Py_ssize_t offset
        int flags
        const char* doc
    enum: T_OBJECT_EX
    enum: T_PYSSIZET
    enum: T_DOUBLE

cdef extern from "Python.h":
    ctypedef struct PyTypeObject:
        PyObject* tp_dict
    object PyDescr_NewMember(PyTypeObject* t, PyMemberDef* m)
    void PyType_Modified(PyTypeObject* t)
    int PyDict_SetItem(PyObject* d, object k, object v) except -1

cdef bint COMPILED

@cython.locals(i=Py_ssize_t, j=Py_ssize_t, nwords=Py_ssize_t)
cdef inline int _c_member_fields(type cls, tuple names, int kind) except -1:
    """Each field of `names` read and written through a member descriptor (above) of type
    `kind`: T_OBJECT_EX for object fields, T_PYSSIZET or T_DOUBLE for C fields (`cdef public
    Py_ssize_t` or `double`, conn.pxd), which Cython gives getsets too, and which a member
    descriptor reads and writes where the value lies, as an int or float.  Its offset in the C
    struct is found by storing a marker in it (Cython cannot take a field's address): an
    object, or a number through Cython's own setter; the PyMemberDef and its name live as long
    as the type (allocated once, never freed).  An object field is never NULL (Cython stores
    None first) unless deleted, which nothing does."""
    cdef object obj = cls.__new__(cls)
    cdef Py_ssize_t* words = <Py_ssize_t*><PyObject*>obj
    cdef double* reals = <double*><PyObject*>obj
    cdef PyMemberDef* defs
    cdef object marker
    cdef Py_ssize_t imark = 0x5EED0C0FFEE
    cdef double dmark = -1.0e-301
    cdef bytes bname
    cdef char* cname
    if kind != T_OBJECT_EX and kind != T_PYSSIZET and kind != T_DOUBLE:
        raise ValueError("%s: member type %d is not an object, Py_ssize_t or double" % (cls.__name__, kind))
    defs = <PyMemberDef*>PyMem_RawMalloc(len(names) * sizeof(PyMemberDef))
    if defs == NULL:
        raise MemoryError()
    nwords = cls.__basicsize__ // sizeof(PyObject*)
    for j in range(len(names)):
        if kind == T_OBJECT_EX:
            marker = object()
            imark = <Py_ssize_t><PyObject*>marker
        elif kind == T_PYSSIZET:
            marker = imark
        else:
            marker = dmark
        setattr(obj, names[j], marker)
        for i in range(2, nwords):              # past the refcount and the type
            if (reals[i] == dmark) if kind == T_DOUBLE else (words[i] == imark):
                break
        else:
            raise RuntimeError("%s.%s: field not found" % (cls.__name__, names[j]))
        if kind != T_OBJECT_EX:
            setattr(obj, names[j], 0)           # the next field's marker is the same number
        bname = names[j].encode()
        cname = <char*>PyMem_RawMalloc(len(bname) + 1)
        if cname == NULL:
            raise MemoryError()
        strcpy(cname, bname)
        defs[j].name = cname
        defs[j].type = kind
        defs[j].offset = i * sizeof(PyObject*)
        defs[j].flags = 0
        defs[j].doc = NULL
        PyDict_SetItem((<PyTypeObject*>cls).tp_dict, names[j],
                       PyDescr_NewMember(<PyTypeObject*>cls, &defs[j]))
    PyType_Modified(<PyTypeObject*>cls)
    return 0

cdef inline int _c_slot_fields(type cls, tuple names) except -1:
    """Each object field of `names` read and written through a member descriptor."""
    return _c_member_fields(cls, names, T_OBJECT_EX)
