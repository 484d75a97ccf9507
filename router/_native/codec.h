/* RowCodec (codec.c), shared with the recorders (recorder.c). */
#ifndef PGROUTER_NATIVE_CODEC_H
#define PGROUTER_NATIVE_CODEC_H

#include "native.h"

enum { K_TEXT = 0, K_INT = 1, K_FLOAT = 2, K_BOOL = 3 };

typedef struct {
    PyObject_HEAD
    Py_ssize_t width;     /* columns of the relation (length of every tuple) */
    Py_ssize_t n;         /* columns of a row object, in output order */
    Py_ssize_t *pick;     /* their indexes in the tuple */
    char *kinds;
    PyObject *names;      /* tuple of bytes: '"name":' */
    Py_ssize_t nkey;
    Py_ssize_t *key_pick;
    char *key_kinds;
    PyObject *key_names;  /* tuple of bytes: '"name":' */
    PyObject *float_json; /* float -> bytes, msgspec's encoding */
} RowCodec;

extern PyTypeObject RowCodecType;

/* 1 written, 0 not the plain case (the caller falls back to Python), -1 error */
#define FALLBACK 0

int encode_change(RowCodec *self, PyObject *op, PyObject *head, PyObject *mid, PyObject *tail,
                  PyObject *lsn_obj, PyObject *seq_obj, PyObject *old, PyObject *old_is_key_obj,
                  PyObject *new, PyObject **key, PyObject **value);

#endif
