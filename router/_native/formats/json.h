/* Output buffers and JSON as msgspec writes it, for codec.c
 * (and the buffer for avro.c); inline, so a file that uses part of it warns of nothing. */
#ifndef PGROUTER_NATIVE_JSON_H
#define PGROUTER_NATIVE_JSON_H

#include "../native.h"

/* ------------------------------------------------------------------------------------------
 * A growable output buffer: a stack area first, the heap when a record is larger.
 */
typedef struct {
    char *p;
    Py_ssize_t len, cap;
    int heap;
    int quiet; /* a failed allocation sets no Python error (written without the GIL) */
    char stack[4096];
} Out;

static inline void
out_init(Out *o)
{
    o->p = o->stack;
    o->len = 0;
    o->cap = sizeof(o->stack);
    o->heap = 0;
    o->quiet = 0;
}

static inline void
out_free(Out *o)
{
    if (o->heap)
        PyMem_RawFree(o->p);
}

static inline int
out_grow(Out *o, Py_ssize_t need)
{
    Py_ssize_t cap = o->cap;
    while (cap - o->len < need)
        cap *= 2;
    char *p;
    /* the raw allocator: a buffer may grow in a thread that released the GIL */
    if (o->heap)
        p = PyMem_RawRealloc(o->p, cap);
    else {
        p = PyMem_RawMalloc(cap);
        if (p != NULL)
            memcpy(p, o->p, o->len);
    }
    if (p == NULL) {
        if (!o->quiet)
            PyErr_NoMemory();
        return -1;
    }
    o->p = p;
    o->cap = cap;
    o->heap = 1;
    return 0;
}

static inline int
out_write(Out *o, const char *s, Py_ssize_t n)
{
    if (o->cap - o->len < n && out_grow(o, n) < 0)
        return -1;
    memcpy(o->p + o->len, s, n);
    o->len += n;
    return 0;
}

#define OUT_LIT(o, s) out_write((o), (s), (Py_ssize_t)(sizeof(s) - 1))

static inline int
out_bytes(Out *o, PyObject *b)
{
    return out_write(o, PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b));
}

static inline int
out_u64(Out *o, unsigned long long v)
{
    char tmp[24];
    int n = 0;
    do {
        tmp[sizeof(tmp) - 1 - n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    return out_write(o, tmp + sizeof(tmp) - n, n);
}

/* A JSON string as msgspec writes it, from UTF-8 text. */
static inline int
out_json_str(Out *o, const char *s, Py_ssize_t n)
{
    /* worst case: every byte becomes \u00xx */
    if (o->cap - o->len < n * 6 + 2 && out_grow(o, n * 6 + 2) < 0)
        return -1;
    char *w = o->p + o->len;
    *w++ = '"';
    Py_ssize_t run = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        memcpy(w, s + run, i - run);
        w += i - run;
        run = i + 1;
        w = json_escape(w, c);
    }
    memcpy(w, s + run, n - run);
    w += n - run;
    *w++ = '"';
    o->len = w - o->p;
    return 0;
}

#endif
