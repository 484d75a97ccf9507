/* The Avro fast lane (router.formats.avro in C): avro_values.c reads the JSON tokens of pgrouter's
 * envelope and writes one value as its Avro datum (router.formats.avro_types' converters and
 * writers); avro.c parses a record's envelope and writes its Avro key and value
 * (AvroConverter). */
#ifndef PGROUTER_NATIVE_AVRO_VALUES_H
#define PGROUTER_NATIVE_AVRO_VALUES_H

#include "json.h"

/* How a column's JSON value becomes its datum: router.formats.avro_types._Type.native gives each
 * column one of these (and a parameter: the scale of A_DECIMAL). A_OTHER is every type the
 * C leaves to Python (arrays...): a record with a non-null value there is declined. */
enum {
    A_OTHER = 0, A_LONG, A_FLOAT, A_DOUBLE, A_BOOL, A_STRING, A_BYTEA, A_DECIMAL, A_VSD,
    A_DATE, A_TS_LOCAL_MICROS, A_TS_LOCAL_MILLIS, A_TS_UTC_MICROS, A_TS_UTC_MILLIS,
    A_TIME_MICROS, A_TIME_MILLIS, A_KINDS
};

/* what avro_datum did: wrote the datum, found a value Avro's type cannot hold (the Python
 * converter's None: written as null), or declined (Python converts the record); -1 error */
enum { AV_DECLINE = 0, AV_OK = 1, AV_NONE = 2 };

/* A JSON token as it is in the record (p NULL: absent). */
typedef struct {
    const char *p;
    Py_ssize_t n;
} Span;

/* names are short: a loop beats memcmp's call */
static inline int
span_is(Span t, const char *lit, Py_ssize_t n)
{
    if (t.n != n)
        return 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (t.p[i] != lit[i])
            return 0;
    return 1;
}

#define SPAN_IS(t, lit) span_is((t), (lit), (Py_ssize_t)(sizeof(lit) - 1))

/* JSON tokens: the end of the token starting at p (checked against the JSON grammar), or
 * NULL when it is not one; escapes are checked where a string is unescaped. */
const char *avro_skip_string(const char *p, const char *end);
const char *avro_skip_value(const char *p, const char *end, int depth);

/* an integer token within int64 (1) or anything else (0) */
int avro_int64(Span t, int64_t *out);

/* the UTF-8 text of a string token, unescaped into tmp when it has escapes: 1, or 0 when it
 * is not a string token, not valid UTF-8 or has an escape msgspec would refuse */
int avro_string(Span t, Out *tmp, const char **s, Py_ssize_t *len);

/* Avro's long (zigzag varint) and bytes/string (length and the bytes) */
static inline int
avro_long(Out *o, int64_t v)
{
    if (o->cap - o->len < 10 && out_grow(o, 10) < 0)
        return -1;
    uint64_t z = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    char *w = o->p + o->len;
    while (z > 0x7F) {
        *w++ = (char)((z & 0x7F) | 0x80);
        z >>= 7;
    }
    *w++ = (char)z;
    o->len = w - o->p;
    return 0;
}

int avro_bytes(Out *o, const char *s, Py_ssize_t n);

/* one non-null JSON value of a column of `kind` as its datum: AV_OK, AV_NONE, AV_DECLINE or
 * -1 (error) */
int avro_datum(Out *o, Out *tmp, int kind, long param, Span t);

/* once, at module init: -1 (a Python error) when it fails */
int avro_values_setup(void);

/* whether avro_datum runs without the GIL: where the C library reads a float in the "C"
 * locale without Python (glibc's strtod_l); elsewhere floats are read by Python's own */
int avro_values_nogil(void);

#endif
