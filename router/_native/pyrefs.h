/* What every C file of pgrouter writes for its objects' fields and types, written once:
 * router/_native's files include it through native.h, actors/kafka/_producer.c directly.
 *
 *   NATIVE_TYPE_HEAD  a type's first fields (name, struct, flags, doc)
 *   NATIVE_TYPE       the same for a type Python code makes (tp_new: PyType_GenericNew)
 *   CLEAR_ALL         Py_CLEAR on each field given (&self->a, &self->b, ...), in order
 *   VISIT_ALL         Py_VISIT on each reference given (a tp_traverse's body)
 *   MEM_FREE_ALL      PyMem_Free on each block given
 *   FREE_ALL          free() on each block given
 *   native_gc_dealloc a collected type's tp_dealloc: untrack, its tp_clear, free
 *   native_usage      0 when a function's arguments are right (ok), else TypeError(usage)
 *   native_pair       (a, b), taking both references
 *   FASTCALL          a METH_FASTCALL function's entry in a PyMethodDef table
 */
#ifndef PGROUTER_PYREFS_H
#define PGROUTER_PYREFS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>

#define NATIVE_TYPE_HEAD(name, ctype, flags, doc)                                            \
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = (name), .tp_basicsize = sizeof(ctype),         \
                                   .tp_flags = (flags), .tp_doc = (doc)
#define NATIVE_TYPE(name, ctype, flags, doc)                                                 \
    NATIVE_TYPE_HEAD(name, ctype, flags, doc), .tp_new = PyType_GenericNew

#define NATIVE_EACH_(type, list, ...)                                                        \
    type list##_[] = {__VA_ARGS__};                                                          \
    for (size_t list##_i = 0; list##_i < sizeof list##_ / sizeof list##_[0]; list##_i++)

#define CLEAR_ALL(...)                                                                       \
    do {                                                                                     \
        NATIVE_EACH_(PyObject **, clear, __VA_ARGS__) Py_CLEAR(*clear_[clear_i]);            \
    } while (0)

#define VISIT_ALL(...)                                                                       \
    do {                                                                                     \
        NATIVE_EACH_(PyObject *, visit, __VA_ARGS__) Py_VISIT(visit_[visit_i]);              \
    } while (0)

#define MEM_FREE_ALL(...)                                                                    \
    do {                                                                                     \
        NATIVE_EACH_(void *, mem, __VA_ARGS__) PyMem_Free(mem_[mem_i]);                      \
    } while (0)

#define FREE_ALL(...)                                                                        \
    do {                                                                                     \
        NATIVE_EACH_(void *, block, __VA_ARGS__) free(block_[block_i]);                      \
    } while (0)

static inline void
native_gc_dealloc(PyObject *self)
{
    PyObject_GC_UnTrack(self);
    Py_TYPE(self)->tp_clear(self);
    Py_TYPE(self)->tp_free(self);
}

static inline int
native_usage(int ok, const char *usage)
{
    if (ok)
        return 0;
    PyErr_SetString(PyExc_TypeError, usage);
    return -1;
}

/* (a, b), taking both references: also on failure, and when either is NULL (an exception
 * is set then), both are released and the answer is NULL */
static inline PyObject *
native_pair(PyObject *a, PyObject *b)
{
    PyObject *t = a != NULL && b != NULL ? PyTuple_New(2) : NULL;
    if (t == NULL) {
        Py_XDECREF(a);
        Py_XDECREF(b);
        return NULL;
    }
    PyTuple_SET_ITEM(t, 0, a);
    PyTuple_SET_ITEM(t, 1, b);
    return t;
}

#define FASTCALL(name, function, doc)                                                        \
    { (name), (PyCFunction)(void (*)(void))(function), METH_FASTCALL, (doc) }

#endif
