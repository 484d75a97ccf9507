/* RowCodec (codec.c), shared with the recorders (recorder.c). */
#ifndef PGROUTER_NATIVE_CODEC_H
#define PGROUTER_NATIVE_CODEC_H

#include "../native.h"
#include "json.h"

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

/* A column value's JSON from its text (UTF-8, [s, s + n)) for the kinds that need no Python:
 * K_TEXT a string, K_INT the text itself when PostgreSQL printed it canonically (int(text)
 * printed back), K_BOOL router.formats.envelope._bool ("t" true, anything else false). 1 written,
 * FALLBACK (K_FLOAT, a non-canonical integer: the caller's Python path), -1 no memory. Pure
 * C: the streaming codec (codec.c) and the snapshot's COPY text records (copyrecords.c,
 * which runs it without the GIL) write values with it. */
static inline int
is_canonical_int(const char *s, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    if (n > 0 && s[0] == '-')
        i = 1;
    if (i == n || n - i > 20)
        return 0;
    if (s[i] == '0' && (n - i > 1 || i == 1))
        return 0; /* leading zero, or "-0" */
    for (; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return 0;
    return 1;
}

static inline int
out_text_value(Out *o, char kind, const char *s, Py_ssize_t n)
{
    switch (kind) {
    case K_TEXT:
        return out_json_str(o, s, n) < 0 ? -1 : 1;
    case K_INT:
        if (!is_canonical_int(s, n))
            return FALLBACK;
        return out_write(o, s, n) < 0 ? -1 : 1;
    case K_BOOL:
        if (n == 1 && s[0] == 't')
            return OUT_LIT(o, "true") < 0 ? -1 : 1;
        return OUT_LIT(o, "false") < 0 ? -1 : 1;
    }
    return FALLBACK;
}

int encode_change(RowCodec *self, PyObject *op, PyObject *head, PyObject *mid, PyObject *tail,
                  PyObject *lsn_obj, PyObject *seq_obj, PyObject *old, PyObject *old_is_key_obj,
                  PyObject *new, PyObject **key, PyObject **value);

#endif
