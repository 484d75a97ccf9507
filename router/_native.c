/* router._native: the per-change hot path of pgrouter in C, byte for byte what the Python
 * code computes.
 *
 * Rules this module keeps:
 *
 * - It is an accelerator, never the reference. Every function has a Python twin
 *   (router.pgoutput.reader.read_tuple, router.envelope.TableEncoder) and returns None
 *   where its input is anything but the plain case it was written for (malformed bytes,
 *   unchanged-TOAST values, binary values, numbers PostgreSQL did not print canonically...).
 *   The caller then runs the Python twin, which raises the precise error or handles the
 *   rare case. So errors, offsets and odd values have exactly one implementation.
 * - Output bytes equal msgspec's JSON encoding of the dicts the Python code builds: keys in
 *   order, no spaces, strings escaped as msgspec escapes them (control characters, '"'
 *   and '\\'; \b \t \n \f \r short, the others as \u00xx). tests/router/test_native.py
 *   compares the two on generated rows, every escaped character and every truncation.
 * - No I/O, no global state beyond the UNCHANGED_TOAST singleton given by configure().
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

static PyObject *unchanged_toast = NULL;
static Py_ssize_t max_columns = 1664;

/* ------------------------------------------------------------------------------------------
 * configure(unchanged_toast, max_columns, Insert, Update, Delete): router.pgoutput's
 * sentinel, column limit and message classes
 */
static PyObject *insert_type, *update_type, *delete_type;

static PyObject *
native_configure(PyObject *self, PyObject *args)
{
    PyObject *sentinel, *insert, *update, *delete;
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "OnOOO:configure", &sentinel, &limit, &insert, &update,
                          &delete))
        return NULL;
    Py_XSETREF(unchanged_toast, Py_NewRef(sentinel));
    Py_XSETREF(insert_type, Py_NewRef(insert));
    Py_XSETREF(update_type, Py_NewRef(update));
    Py_XSETREF(delete_type, Py_NewRef(delete));
    max_columns = limit;
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------------------------
 * read_tuple(data: bytes, pos: int) -> (tuple, int) | None
 *
 * TupleData: Int16 column count, then per column a kind byte ('t' text, 'n' NULL,
 * 'u' unchanged TOAST, 'b' binary) and, for 't'/'b', Int32 length + bytes.
 */
static inline uint32_t
be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* One TupleData at *pos. NULL with no exception set: not the plain case (fall back). */
static PyObject *
parse_tuple(const unsigned char *buf, Py_ssize_t end, Py_ssize_t *at)
{
    Py_ssize_t pos = *at;
    if (pos < 0 || pos > end - 2)
        return NULL;
    Py_ssize_t natts = ((Py_ssize_t)buf[pos] << 8) | buf[pos + 1];
    if (natts > max_columns)
        return NULL;
    pos += 2;
    PyObject *values = PyTuple_New(natts);
    if (values == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < natts; i++) {
        if (pos >= end)
            goto fallback;
        unsigned char kind = buf[pos];
        PyObject *v;
        if (kind == 't' || kind == 'b') {
            if (end - pos < 5)
                goto fallback;
            uint32_t size = be32(buf + pos + 1);
            Py_ssize_t start = pos + 5;
            if ((uint64_t)size > (uint64_t)(end - start))
                goto fallback;
            if (kind == 't') {
                v = PyUnicode_DecodeUTF8((const char *)buf + start, (Py_ssize_t)size, NULL);
                if (v == NULL) {
                    PyErr_Clear();
                    goto fallback;
                }
            }
            else {
                v = PyBytes_FromStringAndSize((const char *)buf + start, (Py_ssize_t)size);
                if (v == NULL)
                    goto error;
            }
            pos = start + (Py_ssize_t)size;
        }
        else if (kind == 'n') {
            v = Py_NewRef(Py_None);
            pos += 1;
        }
        else if (kind == 'u') {
            v = Py_NewRef(unchanged_toast);
            pos += 1;
        }
        else
            goto fallback;
        PyTuple_SET_ITEM(values, i, v);
    }
    *at = pos;
    /* only str, bytes, None and the sentinel: it can never be part of a cycle, so the
     * collector need not track it (CPython untracks such tuples itself, later) */
    PyObject_GC_UnTrack(values);
    return values;
fallback:
    Py_DECREF(values);
    return NULL;
error:
    Py_DECREF(values);
    return NULL;
}

static PyObject *
native_read_tuple(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "read_tuple(data, pos)");
        return NULL;
    }
    PyObject *data = args[0];
    if (!PyBytes_CheckExact(data) || unchanged_toast == NULL || !PyLong_CheckExact(args[1]))
        Py_RETURN_NONE;
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    if (pos == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    PyObject *values = parse_tuple((const unsigned char *)PyBytes_AS_STRING(data),
                                   PyBytes_GET_SIZE(data), &pos);
    if (values == NULL) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    PyObject *out = PyTuple_New(2);
    PyObject *end_pos = PyLong_FromSsize_t(pos);
    if (out == NULL || end_pos == NULL) {
        Py_XDECREF(out);
        Py_XDECREF(end_pos);
        Py_DECREF(values);
        return NULL;
    }
    PyTuple_SET_ITEM(out, 0, values);
    PyTuple_SET_ITEM(out, 1, end_pos);
    return out;
}

/* ------------------------------------------------------------------------------------------
 * decode_row(data: bytes) -> Insert | Update | Delete | None
 *
 * A whole Insert ('I'), Update ('U') or Delete ('D') message outside a stream block, as
 * router.pgoutput.decode builds it; None for any other message and for anything malformed
 * (the Python decoder then decodes it, or raises the precise error).
 */
static PyObject *
native_decode_row(PyObject *self, PyObject *data)
{
    if (!PyBytes_CheckExact(data) || insert_type == NULL || unchanged_toast == NULL)
        Py_RETURN_NONE;
    const unsigned char *buf = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t end = PyBytes_GET_SIZE(data);
    if (end < 6)
        Py_RETURN_NONE;
    unsigned char type = buf[0], action = buf[5];
    PyObject *before = NULL, *new = NULL, *relid = NULL, *msg = NULL;
    Py_ssize_t pos = 6;
    if (type == 'I') {
        if (action != 'N')
            Py_RETURN_NONE;
    }
    else if (type == 'U' || type == 'D') {
        if (action == 'K' || action == 'O') {
            before = parse_tuple(buf, end, &pos);
            if (before == NULL)
                goto done;
            if (type == 'U') {
                if (pos >= end || buf[pos] != 'N')
                    goto done;
                pos += 1;
            }
        }
        else if (type == 'D' || action != 'N')
            Py_RETURN_NONE;
    }
    else
        Py_RETURN_NONE;
    if (type != 'D') {
        new = parse_tuple(buf, end, &pos);
        if (new == NULL)
            goto done;
    }
    if (pos != end)
        goto done;
    relid = PyLong_FromUnsignedLong(be32(buf + 1));
    if (relid == NULL)
        goto done;
    PyObject *key = (before != NULL && action == 'K') ? before : Py_None;
    PyObject *old = (before != NULL && action == 'O') ? before : Py_None;
    if (type == 'I') {
        PyObject *args[] = {relid, new, Py_None};
        msg = PyObject_Vectorcall(insert_type, args, 3, NULL);
    }
    else if (type == 'U') {
        PyObject *args[] = {relid, key, old, new, Py_None};
        msg = PyObject_Vectorcall(update_type, args, 5, NULL);
    }
    else {
        PyObject *args[] = {relid, key, old, Py_None};
        msg = PyObject_Vectorcall(delete_type, args, 4, NULL);
    }
done:
    Py_XDECREF(before);
    Py_XDECREF(new);
    Py_XDECREF(relid);
    if (msg == NULL && !PyErr_Occurred())
        Py_RETURN_NONE;
    return msg;
}

/* ------------------------------------------------------------------------------------------
 * A growable output buffer: a stack area first, the heap when a record is larger.
 */
typedef struct {
    char *p;
    Py_ssize_t len, cap;
    int heap;
    char stack[4096];
} Out;

static void
out_init(Out *o)
{
    o->p = o->stack;
    o->len = 0;
    o->cap = sizeof(o->stack);
    o->heap = 0;
}

static void
out_free(Out *o)
{
    if (o->heap)
        PyMem_Free(o->p);
}

static int
out_grow(Out *o, Py_ssize_t need)
{
    Py_ssize_t cap = o->cap;
    while (cap - o->len < need)
        cap *= 2;
    char *p;
    if (o->heap)
        p = PyMem_Realloc(o->p, cap);
    else {
        p = PyMem_Malloc(cap);
        if (p != NULL)
            memcpy(p, o->p, o->len);
    }
    if (p == NULL) {
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

static int
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

static const char HEX[] = "0123456789abcdef";

/* A JSON string as msgspec writes it, from UTF-8 text. */
static int
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
        *w++ = '\\';
        switch (c) {
        case '"': *w++ = '"'; break;
        case '\\': *w++ = '\\'; break;
        case '\b': *w++ = 'b'; break;
        case '\t': *w++ = 't'; break;
        case '\n': *w++ = 'n'; break;
        case '\f': *w++ = 'f'; break;
        case '\r': *w++ = 'r'; break;
        default:
            *w++ = 'u';
            *w++ = '0';
            *w++ = '0';
            *w++ = HEX[c >> 4];
            *w++ = HEX[c & 15];
        }
    }
    memcpy(w, s + run, n - run);
    w += n - run;
    *w++ = '"';
    o->len = w - o->p;
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * RowCodec: the JSON of one relation layout's rows, keys and change records.
 */
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

static int
parse_indexes(PyObject *seq, Py_ssize_t width, Py_ssize_t **out, Py_ssize_t *count)
{
    PyObject *fast = PySequence_Fast(seq, "indexes must be a sequence");
    if (fast == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    Py_ssize_t *idx = PyMem_Malloc(sizeof(Py_ssize_t) * (n ? n : 1));
    if (idx == NULL) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t v = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(fast, i));
        if (v == -1 && PyErr_Occurred())
            goto bad;
        if (v < 0 || v >= width) {
            PyErr_SetString(PyExc_ValueError, "column index out of range");
            goto bad;
        }
        idx[i] = v;
    }
    Py_DECREF(fast);
    *out = idx;
    *count = n;
    return 0;
bad:
    Py_DECREF(fast);
    PyMem_Free(idx);
    return -1;
}

static int
check_names(PyObject *names, Py_ssize_t n, const char *what)
{
    if (!PyTuple_CheckExact(names) || PyTuple_GET_SIZE(names) != n) {
        PyErr_Format(PyExc_ValueError, "%s: a tuple of %zd bytes", what, n);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (!PyBytes_CheckExact(PyTuple_GET_ITEM(names, i))) {
            PyErr_Format(PyExc_TypeError, "%s: bytes expected", what);
            return -1;
        }
    return 0;
}

static int
copy_kinds(PyObject *kinds, Py_ssize_t n, char **out)
{
    if (!PyBytes_CheckExact(kinds) || PyBytes_GET_SIZE(kinds) != n) {
        PyErr_SetString(PyExc_ValueError, "kinds: one byte per column");
        return -1;
    }
    char *k = PyMem_Malloc(n ? n : 1);
    if (k == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(k, PyBytes_AS_STRING(kinds), n);
    for (Py_ssize_t i = 0; i < n; i++)
        if (k[i] < K_TEXT || k[i] > K_BOOL) {
            PyMem_Free(k);
            PyErr_SetString(PyExc_ValueError, "kinds: unknown kind");
            return -1;
        }
    *out = k;
    return 0;
}

static int
rowcodec_init(RowCodec *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"width", "pick", "names", "kinds", "key_pick", "key_names",
                             "key_kinds", "float_json", NULL};
    Py_ssize_t width;
    PyObject *pick, *names, *kinds, *key_pick, *key_names, *key_kinds, *float_json;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "nOOOOOOO:RowCodec", kwlist, &width, &pick,
                                     &names, &kinds, &key_pick, &key_names, &key_kinds,
                                     &float_json))
        return -1;
    if (self->pick != NULL) {
        PyErr_SetString(PyExc_TypeError, "RowCodec is initialised once");
        return -1;
    }
    if (width < 0 || !PyCallable_Check(float_json)) {
        PyErr_SetString(PyExc_ValueError, "RowCodec: bad width or float_json");
        return -1;
    }
    self->width = width;
    if (parse_indexes(pick, width, &self->pick, &self->n) < 0)
        return -1;
    if (parse_indexes(key_pick, width, &self->key_pick, &self->nkey) < 0)
        return -1;
    if (check_names(names, self->n, "names") < 0 ||
        check_names(key_names, self->nkey, "key_names") < 0)
        return -1;
    if (copy_kinds(kinds, self->n, &self->kinds) < 0 ||
        copy_kinds(key_kinds, self->nkey, &self->key_kinds) < 0)
        return -1;
    self->names = Py_NewRef(names);
    self->key_names = Py_NewRef(key_names);
    self->float_json = Py_NewRef(float_json);
    return 0;
}

static void
rowcodec_dealloc(RowCodec *self)
{
    PyMem_Free(self->pick);
    PyMem_Free(self->kinds);
    PyMem_Free(self->key_pick);
    PyMem_Free(self->key_kinds);
    Py_XDECREF(self->names);
    Py_XDECREF(self->key_names);
    Py_XDECREF(self->float_json);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* 1 written, 0 not the plain case (caller falls back), -1 error */
#define FALLBACK 0

static int
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

static int
write_value(RowCodec *self, Out *o, char kind, PyObject *v)
{
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(v, &n);
    if (s == NULL) {
        PyErr_Clear(); /* e.g. lone surrogates: the Python path reports them */
        return FALLBACK;
    }
    switch (kind) {
    case K_TEXT:
        return out_json_str(o, s, n) < 0 ? -1 : 1;
    case K_INT:
        /* int(text) printed back is the text itself when PostgreSQL printed it canonically */
        if (!is_canonical_int(s, n))
            return FALLBACK;
        return out_write(o, s, n) < 0 ? -1 : 1;
    case K_BOOL:
        /* router.envelope._bool: "t" is true, anything else false */
        if (n == 1 && s[0] == 't')
            return OUT_LIT(o, "true") < 0 ? -1 : 1;
        return OUT_LIT(o, "false") < 0 ? -1 : 1;
    case K_FLOAT: {
        if ((n == 3 && memcmp(s, "NaN", 3) == 0) || (n == 8 && memcmp(s, "Infinity", 8) == 0) ||
            (n == 9 && memcmp(s, "-Infinity", 9) == 0))
            return out_json_str(o, s, n) < 0 ? -1 : 1;
        PyObject *f = PyFloat_FromString(v);
        if (f == NULL) {
            PyErr_Clear();
            return FALLBACK;
        }
        PyObject *b = PyObject_CallOneArg(self->float_json, f);
        Py_DECREF(f);
        if (b == NULL)
            return -1;
        int r = PyBytes_CheckExact(b) ? (out_bytes(o, b) < 0 ? -1 : 1) : FALLBACK;
        Py_DECREF(b);
        return r;
    }
    }
    return FALLBACK;
}

/* The row object of a tuple: every picked column, NULLs as null unless skip_nulls. */
static int
write_row(RowCodec *self, Out *o, PyObject *values, int skip_nulls)
{
    if (!PyTuple_CheckExact(values) || PyTuple_GET_SIZE(values) != self->width)
        return FALLBACK;
    if (OUT_LIT(o, "{") < 0)
        return -1;
    int first = 1;
    for (Py_ssize_t j = 0; j < self->n; j++) {
        PyObject *v = PyTuple_GET_ITEM(values, self->pick[j]);
        if (v == Py_None && skip_nulls)
            continue;
        if (!first && OUT_LIT(o, ",") < 0)
            return -1;
        first = 0;
        if (out_bytes(o, PyTuple_GET_ITEM(self->names, j)) < 0)
            return -1;
        if (v == Py_None) {
            if (OUT_LIT(o, "null") < 0)
                return -1;
            continue;
        }
        if (!PyUnicode_CheckExact(v))
            return FALLBACK; /* unchanged TOAST, binary */
        int r = write_value(self, o, self->kinds[j], v);
        if (r <= 0)
            return r;
    }
    return OUT_LIT(o, "}") < 0 ? -1 : 1;
}

/* The key object: key columns of the tuple, unchanged TOAST and NULL as null. */
static int
write_key(RowCodec *self, Out *o, PyObject *values)
{
    if (self->nkey == 0 || values == Py_None)
        return OUT_LIT(o, "null") < 0 ? -1 : 1;
    if (!PyTuple_CheckExact(values) || PyTuple_GET_SIZE(values) != self->width)
        return FALLBACK;
    if (OUT_LIT(o, "{") < 0)
        return -1;
    for (Py_ssize_t j = 0; j < self->nkey; j++) {
        if (j && OUT_LIT(o, ",") < 0)
            return -1;
        if (out_bytes(o, PyTuple_GET_ITEM(self->key_names, j)) < 0)
            return -1;
        PyObject *v = PyTuple_GET_ITEM(values, self->key_pick[j]);
        if (v == Py_None || v == unchanged_toast) {
            if (OUT_LIT(o, "null") < 0)
                return -1;
            continue;
        }
        if (!PyUnicode_CheckExact(v))
            return FALLBACK;
        int r = write_value(self, o, self->key_kinds[j], v);
        if (r <= 0)
            return r;
    }
    return OUT_LIT(o, "}") < 0 ? -1 : 1;
}

static PyObject *
finish(Out *o, int r)
{
    PyObject *res;
    if (r < 0)
        res = NULL;
    else if (r == FALLBACK)
        res = Py_NewRef(Py_None);
    else
        res = PyBytes_FromStringAndSize(o->p, o->len);
    out_free(o);
    return res;
}

static PyObject *
rowcodec_row(RowCodec *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "row(values, skip_nulls=False)");
        return NULL;
    }
    int skip = 0;
    if (nargs == 2 && (skip = PyObject_IsTrue(args[1])) < 0)
        return NULL;
    Out o;
    out_init(&o);
    return finish(&o, write_row(self, &o, args[0], skip));
}

static PyObject *
rowcodec_key(RowCodec *self, PyObject *values)
{
    Out o;
    out_init(&o);
    return finish(&o, write_key(self, &o, values));
}

/* The key and value of one change. op: the JSON of the op (bytes, e.g. b'"c"') or the op
 * itself (a str of ASCII letters). 1 done (*key, *value set), 0 not the plain case, -1 error.
 *
 * value = {"op":<op>,"before":<old row>,"after":<new row><head><lsn><mid><seq><tail>; the
 * three source parts are the envelope around lsn and seq, made by router.envelope (head per
 * table, mid and tail per transaction). Not the plain case: an unchanged-TOAST column in
 * the new row, binary values, anything else the Python path must encode. */
static int
encode_change(RowCodec *self, PyObject *op, PyObject *head, PyObject *mid, PyObject *tail,
              PyObject *lsn_obj, PyObject *seq_obj, PyObject *old, PyObject *old_is_key_obj,
              PyObject *new, PyObject **key, PyObject **value)
{
    const char *op_s;
    Py_ssize_t op_n;
    int op_quoted;
    if (PyBytes_CheckExact(op)) {
        op_s = PyBytes_AS_STRING(op);
        op_n = PyBytes_GET_SIZE(op);
        op_quoted = 1;
    }
    else if (PyUnicode_CheckExact(op) && PyUnicode_IS_ASCII(op)) {
        op_s = (const char *)PyUnicode_DATA(op);
        op_n = PyUnicode_GET_LENGTH(op);
        op_quoted = 0;
        for (Py_ssize_t i = 0; i < op_n; i++)
            if (!((op_s[i] >= 'a' && op_s[i] <= 'z') || (op_s[i] >= 'A' && op_s[i] <= 'Z')))
                return FALLBACK;
    }
    else
        return FALLBACK;
    if (!PyBytes_CheckExact(head) || !PyBytes_CheckExact(mid) || !PyBytes_CheckExact(tail)) {
        PyErr_SetString(PyExc_TypeError, "change: source parts are bytes");
        return -1;
    }
    unsigned long long lsn = PyLong_AsUnsignedLongLong(lsn_obj);
    if (lsn == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    unsigned long long seq = PyLong_AsUnsignedLongLong(seq_obj);
    if (seq == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    int old_is_key = PyObject_IsTrue(old_is_key_obj);
    if (old_is_key < 0)
        return -1;

    Out k, o;
    out_init(&k);
    out_init(&o);
    int r = write_key(self, &k, new != Py_None ? new : old);
    if (r <= 0)
        goto done;
    r = -1;
    if (OUT_LIT(&o, "{\"op\":") < 0)
        goto done;
    if (op_quoted ? out_write(&o, op_s, op_n) < 0
                  : (OUT_LIT(&o, "\"") < 0 || out_write(&o, op_s, op_n) < 0 ||
                     OUT_LIT(&o, "\"") < 0))
        goto done;
    if (OUT_LIT(&o, ",\"before\":") < 0)
        goto done;
    r = old == Py_None ? (OUT_LIT(&o, "null") < 0 ? -1 : 1) : write_row(self, &o, old, old_is_key);
    if (r <= 0)
        goto done;
    r = -1;
    if (OUT_LIT(&o, ",\"after\":") < 0)
        goto done;
    r = new == Py_None ? (OUT_LIT(&o, "null") < 0 ? -1 : 1) : write_row(self, &o, new, 0);
    if (r <= 0)
        goto done;
    r = -1;
    if (out_bytes(&o, head) < 0 || out_u64(&o, lsn) < 0 || out_bytes(&o, mid) < 0 ||
        out_u64(&o, seq) < 0 || out_bytes(&o, tail) < 0)
        goto done;
    *key = PyBytes_FromStringAndSize(k.p, k.len);
    if (*key == NULL)
        goto done;
    *value = PyBytes_FromStringAndSize(o.p, o.len);
    if (*value == NULL) {
        Py_CLEAR(*key);
        goto done;
    }
    r = 1;
done:
    out_free(&k);
    out_free(&o);
    return r;
}

/* change(op, source_head, source_mid, source_tail, lsn, seq, old, old_is_key, new)
 *   -> (key, value) | None */
static PyObject *
rowcodec_change(RowCodec *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError,
                        "change(op, source_head, source_mid, source_tail, lsn, seq, old, "
                        "old_is_key, new)");
        return NULL;
    }
    PyObject *key = NULL, *value = NULL;
    int r = encode_change(self, args[0], args[1], args[2], args[3], args[4], args[5], args[6],
                          args[7], args[8], &key, &value);
    if (r < 0)
        return NULL;
    if (r == FALLBACK)
        Py_RETURN_NONE;
    PyObject *pair = PyTuple_New(2);
    if (pair == NULL) {
        Py_DECREF(key);
        Py_DECREF(value);
        return NULL;
    }
    PyTuple_SET_ITEM(pair, 0, key);
    PyTuple_SET_ITEM(pair, 1, value);
    return pair;
}

static PyMethodDef rowcodec_methods[] = {
    {"row", (PyCFunction)(void (*)(void))rowcodec_row, METH_FASTCALL,
     "row(values, skip_nulls=False) -> bytes | None: the row object's JSON"},
    {"key", (PyCFunction)rowcodec_key, METH_O, "key(values) -> bytes | None: the key's JSON"},
    {"change", (PyCFunction)(void (*)(void))rowcodec_change, METH_FASTCALL,
     "change(op, source_head, source_mid, source_tail, lsn, seq, old, old_is_key, new) "
     "-> (key, value) | None"},
    {NULL}};

static PyTypeObject RowCodecType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "router._native.RowCodec",
    .tp_basicsize = sizeof(RowCodec),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "RowCodec(width, pick, names, kinds, key_pick, key_names, key_kinds, float_json)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)rowcodec_init,
    .tp_dealloc = (destructor)rowcodec_dealloc,
    .tp_methods = rowcodec_methods,
};

/* ------------------------------------------------------------------------------------------
 * Recorder(codec, topic, head, mid, tail, fallback, lsn_header, seq_name): one route's
 * records of one relation layout in one transaction.
 *
 * recorder(op, lsn, seq, old, old_is_key, new) -> (topic, key, value, headers) with
 * headers = [lsn_header, (seq_name, b"<seq>")] (None when lsn_header is None), encoded by
 * the codec, or by
 * fallback(op, lsn, seq, old, old_is_key, new) where the codec returns None for the change
 * (router.envelope.TableEncoder.recorder). The record and its headers hold only atoms and
 * are never part of a cycle, so they are not tracked by the garbage collector: a stream of
 * records then costs the collector nothing.
 */
typedef struct {
    PyObject_HEAD
    RowCodec *codec;
    PyObject *topic, *head, *mid, *tail, *fallback, *lsn_header, *seq_name;
    vectorcallfunc vectorcall;
} Recorder;

static PyObject *
recorder_vectorcall(Recorder *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 6 || kwnames != NULL) {
        PyErr_SetString(PyExc_TypeError, "recorder(op, lsn, seq, old, old_is_key, new)");
        return NULL;
    }
    if (self->codec == NULL || self->fallback == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Recorder is not initialised");
        return NULL;
    }
    PyObject *key = NULL, *value = NULL;
    int r = encode_change(self->codec, args[0], self->head, self->mid, self->tail, args[1],
                          args[2], args[3], args[4], args[5], &key, &value);
    if (r < 0)
        return NULL;
    if (r == FALLBACK)
        return PyObject_Vectorcall(self->fallback, args, 6, NULL);
    PyObject *rec = PyTuple_New(4);
    if (rec == NULL) {
        Py_DECREF(key);
        Py_DECREF(value);
        return NULL;
    }
    PyTuple_SET_ITEM(rec, 0, Py_NewRef(self->topic));
    PyTuple_SET_ITEM(rec, 1, key);
    PyTuple_SET_ITEM(rec, 2, value);
    if (self->lsn_header == Py_None) {
        PyTuple_SET_ITEM(rec, 3, Py_NewRef(Py_None));
        PyObject_GC_UnTrack(rec);
        return rec;
    }
    char digits[24];
    unsigned long long seq = PyLong_AsUnsignedLongLong(args[2]); /* checked by encode_change */
    int n = snprintf(digits, sizeof(digits), "%llu", seq);
    PyObject *headers = PyList_New(2), *seq_header = PyTuple_New(2);
    PyObject *seq_bytes = PyBytes_FromStringAndSize(digits, n);
    if (headers == NULL || seq_header == NULL || seq_bytes == NULL) {
        Py_XDECREF(headers);
        Py_XDECREF(seq_header);
        Py_XDECREF(seq_bytes);
        Py_DECREF(rec);
        return NULL;
    }
    PyTuple_SET_ITEM(seq_header, 0, Py_NewRef(self->seq_name));
    PyTuple_SET_ITEM(seq_header, 1, seq_bytes);
    PyList_SET_ITEM(headers, 0, Py_NewRef(self->lsn_header));
    PyList_SET_ITEM(headers, 1, seq_header);
    PyTuple_SET_ITEM(rec, 3, headers);
    PyObject_GC_UnTrack(seq_header);
    PyObject_GC_UnTrack(headers);
    PyObject_GC_UnTrack(rec);
    return rec;
}

static int
recorder_init(Recorder *self, PyObject *args, PyObject *kwds)
{
    PyObject *codec, *topic, *head, *mid, *tail, *fallback, *lsn_header, *seq_name;
    if (!PyArg_ParseTuple(args, "O!USSSOOU:Recorder", &RowCodecType, &codec, &topic, &head,
                          &mid, &tail, &fallback, &lsn_header, &seq_name))
        return -1;
    if (!PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_TypeError, "Recorder: fallback must be callable");
        return -1;
    }
    if (lsn_header != Py_None &&
        (!PyTuple_CheckExact(lsn_header) || PyTuple_GET_SIZE(lsn_header) != 2 ||
         !PyUnicode_CheckExact(PyTuple_GET_ITEM(lsn_header, 0)) ||
         !PyBytes_CheckExact(PyTuple_GET_ITEM(lsn_header, 1)))) {
        PyErr_SetString(PyExc_TypeError, "Recorder: lsn_header is a (str, bytes) pair");
        return -1;
    }
    Py_XSETREF(self->codec, (RowCodec *)Py_NewRef(codec));
    Py_XSETREF(self->topic, Py_NewRef(topic));
    Py_XSETREF(self->head, Py_NewRef(head));
    Py_XSETREF(self->mid, Py_NewRef(mid));
    Py_XSETREF(self->tail, Py_NewRef(tail));
    Py_XSETREF(self->fallback, Py_NewRef(fallback));
    Py_XSETREF(self->lsn_header, Py_NewRef(lsn_header));
    Py_XSETREF(self->seq_name, Py_NewRef(seq_name));
    self->vectorcall = (vectorcallfunc)recorder_vectorcall;
    return 0;
}

/* The fallback is a closure over the TableEncoder that caches this Recorder: a cycle, so
 * the type takes part in garbage collection. */
static int
recorder_traverse(Recorder *self, visitproc visit, void *arg)
{
    Py_VISIT(self->codec);
    Py_VISIT(self->fallback);
    Py_VISIT(self->lsn_header);
    return 0;
}

static int
recorder_clear(Recorder *self)
{
    Py_CLEAR(self->codec);
    Py_CLEAR(self->topic);
    Py_CLEAR(self->head);
    Py_CLEAR(self->mid);
    Py_CLEAR(self->tail);
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->lsn_header);
    Py_CLEAR(self->seq_name);
    return 0;
}

static void
recorder_dealloc(Recorder *self)
{
    PyObject_GC_UnTrack(self);
    recorder_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject RecorderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "router._native.Recorder",
    .tp_basicsize = sizeof(Recorder),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Recorder(codec, topic, head, mid, tail, fallback, lsn_header, seq_name)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)recorder_init,
    .tp_dealloc = (destructor)recorder_dealloc,
    .tp_traverse = (traverseproc)recorder_traverse,
    .tp_clear = (inquiry)recorder_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Recorder, vectorcall),
};

/* ------------------------------------------------------------------------------------------
 * Tally(count, on_done, ticket): the delivery callback of one batch of records.
 *
 * Called as tally(err, msg) once per record from the Kafka client's thread (librdkafka's
 * delivery callback), or tally.ack(metadata) / tally.fail(exc) (kafka-python's). Calls
 * on_done(ticket, None, count) once when every record was acknowledged, or
 * on_done(ticket, err, 0) at the first failure (and nothing after that). A Tally of count 0
 * (never made by the clients: they hand over at least one record) fires at its first call.
 */
typedef struct {
    PyObject_HEAD
    Py_ssize_t count, left;
    int fired;
    PyObject *on_done, *ticket;
} Tally;

static int
tally_init(Tally *self, PyObject *args, PyObject *kwds)
{
    Py_ssize_t count;
    PyObject *on_done, *ticket;
    if (!PyArg_ParseTuple(args, "nOO:Tally", &count, &on_done, &ticket))
        return -1;
    if (count < 0) {
        PyErr_SetString(PyExc_ValueError, "Tally: negative count");
        return -1;
    }
    self->count = self->left = count;
    self->fired = 0;
    Py_XSETREF(self->on_done, Py_NewRef(on_done));
    Py_XSETREF(self->ticket, Py_NewRef(ticket));
    return 0;
}

static int
tally_traverse(Tally *self, visitproc visit, void *arg)
{
    Py_VISIT(self->on_done);
    Py_VISIT(self->ticket);
    return 0;
}

static int
tally_clear(Tally *self)
{
    Py_CLEAR(self->on_done);
    Py_CLEAR(self->ticket);
    return 0;
}

static void
tally_dealloc(Tally *self)
{
    PyObject_GC_UnTrack(self);
    tally_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
tally_call(Tally *self, PyObject *args, PyObject *kwds)
{
    PyObject *err = Py_None, *msg = Py_None;
    if (!PyArg_UnpackTuple(args, "Tally", 1, 2, &err, &msg))
        return NULL;
    if (self->fired || self->on_done == NULL)
        Py_RETURN_NONE;
    if (err != Py_None) {
        self->fired = 1;
        return PyObject_CallFunction(self->on_done, "OOn", self->ticket, err, (Py_ssize_t)0);
    }
    if (--self->left > 0)
        Py_RETURN_NONE;
    self->fired = 1;
    return PyObject_CallFunction(self->on_done, "OOn", self->ticket, Py_None, self->count);
}

/* kafka-python's future callbacks: ack(metadata) per acknowledged record, fail(exc) */
static PyObject *
tally_ack(Tally *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (self->fired || self->on_done == NULL)
        Py_RETURN_NONE;
    if (--self->left > 0)
        Py_RETURN_NONE;
    self->fired = 1;
    return PyObject_CallFunction(self->on_done, "OOn", self->ticket, Py_None, self->count);
}

static PyObject *
tally_fail(Tally *self, PyObject *err)
{
    if (self->fired || self->on_done == NULL)
        Py_RETURN_NONE;
    self->fired = 1;
    return PyObject_CallFunction(self->on_done, "OOn", self->ticket, err, (Py_ssize_t)0);
}

static PyMethodDef tally_methods[] = {
    {"ack", (PyCFunction)(void (*)(void))tally_ack, METH_FASTCALL,
     "ack(*ignored): one record acknowledged"},
    {"fail", (PyCFunction)tally_fail, METH_O, "fail(error): a record failed"},
    {NULL}};

static PyObject *
tally_get_left(Tally *self, void *closure)
{
    return PyLong_FromSsize_t(self->left);
}

static PyGetSetDef tally_getset[] = {
    {"left", (getter)tally_get_left, NULL, "records not acknowledged yet", NULL},
    {NULL}};

static PyTypeObject TallyType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "router._native.Tally",
    .tp_basicsize = sizeof(Tally),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)tally_traverse,
    .tp_clear = (inquiry)tally_clear,
    .tp_doc = "Tally(count, on_done, ticket): one batch's delivery callback",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)tally_init,
    .tp_dealloc = (destructor)tally_dealloc,
    .tp_call = (ternaryfunc)tally_call,
    .tp_methods = tally_methods,
    .tp_getset = tally_getset,
};

/* ------------------------------------------------------------------------------------------
 * feed_rows(messages, start, changes, relations, Change, overhead, budget)
 *     -> (next, bytes, count)
 *
 * The transaction assembler's short path (router.transactions.feed_batch) in C: from
 * messages[start] on ((lsn, payload) pairs), every plain Insert/Update/Delete of a known
 * relation becomes Change(op, lsn, relation, old, old_is_key, new) appended to ``changes``,
 * counted as overhead + len(payload) bytes. Stops before the first message that is anything
 * else (the caller decodes it the long way) and after the change that takes the bytes past
 * ``budget`` (the caller spills). Only for use inside Begin ... Commit outside a stream block.
 */
static PyObject *op_insert, *op_update, *op_delete;

static PyObject *
native_feed_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[2]) ||
        !PyDict_CheckExact(args[3])) {
        PyErr_SetString(PyExc_TypeError, "feed_rows(messages: list, start, changes: list, "
                                         "relations: dict, Change, overhead, budget)");
        return NULL;
    }
    PyObject *messages = args[0], *changes = args[2], *relations = args[3], *change_type = args[4];
    Py_ssize_t i = PyLong_AsSsize_t(args[1]);
    Py_ssize_t overhead = PyLong_AsSsize_t(args[5]);
    long long budget = PyLong_AsLongLong(args[6]);
    if (PyErr_Occurred())
        return NULL;
    long long used = 0;
    Py_ssize_t count = 0, n = PyList_GET_SIZE(messages);
    if (unchanged_toast == NULL)
        i = n;
    for (; i < n && used <= budget; i++) {
        PyObject *item = PyList_GET_ITEM(messages, i);
        if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 2)
            break;
        PyObject *lsn = PyTuple_GET_ITEM(item, 0), *data = PyTuple_GET_ITEM(item, 1);
        if (!PyBytes_CheckExact(data))
            break;
        const unsigned char *buf = (const unsigned char *)PyBytes_AS_STRING(data);
        Py_ssize_t end = PyBytes_GET_SIZE(data);
        if (end < 6)
            break;
        unsigned char type = buf[0], action = buf[5];
        PyObject *op;
        if (type == 'I' && action == 'N')
            op = op_insert;
        else if (type == 'U' && (action == 'N' || action == 'K' || action == 'O'))
            op = op_update;
        else if (type == 'D' && (action == 'K' || action == 'O'))
            op = op_delete;
        else
            break;
        PyObject *relid = PyLong_FromUnsignedLong(be32(buf + 1));
        if (relid == NULL)
            return NULL;
        PyObject *rel = PyDict_GetItemWithError(relations, relid);
        Py_DECREF(relid);
        if (rel == NULL) {
            if (PyErr_Occurred())
                return NULL;
            break; /* unknown relation: the long way reports it */
        }
        Py_ssize_t pos = 6;
        PyObject *before = NULL, *new = NULL;
        if (action != 'N') {
            before = parse_tuple(buf, end, &pos);
            if (before == NULL)
                goto stop;
            if (type == 'U') {
                if (pos >= end || buf[pos] != 'N')
                    goto stop;
                pos += 1;
            }
        }
        if (type != 'D') {
            new = parse_tuple(buf, end, &pos);
            if (new == NULL)
                goto stop;
        }
        if (pos != end)
            goto stop;
        PyObject *call[] = {op, lsn, rel, before ? before : Py_None,
                            action == 'K' ? Py_True : Py_False, new ? new : Py_None};
        PyObject *change = PyObject_Vectorcall(change_type, call, 6, NULL);
        Py_XDECREF(before);
        Py_XDECREF(new);
        if (change == NULL)
            return NULL;
        int r = PyList_Append(changes, change);
        Py_DECREF(change);
        if (r < 0)
            return NULL;
        used += overhead + end;
        count++;
        continue;
    stop:
        Py_XDECREF(before);
        Py_XDECREF(new);
        if (PyErr_Occurred())
            return NULL;
        break;
    }
    return Py_BuildValue("(nLn)", i, used, count);
}

/* ------------------------------------------------------------------------------------------
 * drain(read_message, max_messages, max_bytes) -> (batch, exhausted)
 *
 * The slot reader's inner loop: calls read_message() (psycopg2's ReplicationCursor) until it
 * returns None (exhausted = True) or the batch holds max_messages messages or max_bytes
 * payload bytes; batch is a list of (data_start, payload) pairs.
 */
static PyObject *str_payload, *str_data_start;

static PyObject *
native_drain(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "drain(read_message, max_messages, max_bytes)");
        return NULL;
    }
    PyObject *read = args[0];
    Py_ssize_t max_messages = PyLong_AsSsize_t(args[1]);
    Py_ssize_t max_bytes = PyLong_AsSsize_t(args[2]);
    if (PyErr_Occurred())
        return NULL;
    PyObject *batch = PyList_New(0);
    if (batch == NULL)
        return NULL;
    Py_ssize_t size = 0;
    int exhausted = 0;
    while (PyList_GET_SIZE(batch) < max_messages && size < max_bytes) {
        PyObject *msg = PyObject_CallNoArgs(read);
        if (msg == NULL)
            goto error;
        if (msg == Py_None) {
            Py_DECREF(msg);
            exhausted = 1;
            break;
        }
        PyObject *payload = PyObject_GetAttr(msg, str_payload);
        PyObject *start = payload ? PyObject_GetAttr(msg, str_data_start) : NULL;
        Py_DECREF(msg);
        if (start == NULL) {
            Py_XDECREF(payload);
            goto error;
        }
        Py_ssize_t len = PyBytes_Check(payload) ? PyBytes_GET_SIZE(payload)
                                                : PyObject_Length(payload);
        if (len < 0) {
            Py_DECREF(start);
            Py_DECREF(payload);
            goto error;
        }
        size += len;
        PyObject *pair = PyTuple_Pack(2, start, payload);
        Py_DECREF(start);
        Py_DECREF(payload);
        if (pair == NULL)
            goto error;
        if (PyLong_CheckExact(start) && PyBytes_CheckExact(payload))
            PyObject_GC_UnTrack(pair); /* atoms only: never in a cycle */
        int r = PyList_Append(batch, pair);
        Py_DECREF(pair);
        if (r < 0)
            goto error;
    }
    return Py_BuildValue("(NO)", batch, exhausted ? Py_True : Py_False);
error:
    Py_DECREF(batch);
    return NULL;
}

/* ------------------------------------------------------------------------------------------
 * record_run(changes, i, relation, ops, kinds, seq, records, limit) -> (next, seq)
 *
 * The router's direct path (router.routing._record_run_py): from changes[i] on, while the
 * change's relation is ``relation`` and ``ops`` (op -> tuple of recorders, or None) has
 * recorders for its op, each recorder's record(kinds[op], lsn, seq, old, old_is_key, new)
 * is appended to ``records`` and seq counts up; stops after the change that fills records to
 * ``limit``.
 */
static PyObject *str_relation, *str_op, *str_lsn, *str_old, *str_old_is_key, *str_new;

static PyObject *
native_record_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8 || !PyList_CheckExact(args[0]) || !PyDict_CheckExact(args[3]) ||
        !PyDict_CheckExact(args[4]) || !PyList_CheckExact(args[6])) {
        PyErr_SetString(PyExc_TypeError, "record_run(changes: list, i, relation, ops: dict, "
                                         "kinds: dict, seq, records: list, limit)");
        return NULL;
    }
    PyObject *changes = args[0], *rel = args[2], *ops = args[3], *kinds = args[4];
    PyObject *records = args[6];
    Py_ssize_t i = PyLong_AsSsize_t(args[1]);
    Py_ssize_t limit = PyLong_AsSsize_t(args[7]);
    Py_ssize_t seq_n = PyLong_AsSsize_t(args[5]);
    if (PyErr_Occurred())
        return NULL;
    PyObject *seq = NULL;
    for (; i < PyList_GET_SIZE(changes); ) {
        PyObject *change = PyList_GET_ITEM(changes, i);
        PyObject *crel = PyObject_GetAttr(change, str_relation);
        if (crel == NULL)
            goto error;
        Py_DECREF(crel); /* only its identity matters; the change keeps it alive */
        if (crel != rel)
            break;
        PyObject *op = PyObject_GetAttr(change, str_op);
        if (op == NULL)
            goto error;
        PyObject *recorders = PyDict_GetItemWithError(ops, op);
        PyObject *kind = recorders ? PyDict_GetItemWithError(kinds, op) : NULL;
        Py_DECREF(op);
        if (recorders == NULL || recorders == Py_None || kind == NULL) {
            if (PyErr_Occurred())
                goto error;
            break;
        }
        if (!PyTuple_CheckExact(recorders)) {
            PyErr_SetString(PyExc_TypeError, "record_run: recorders are a tuple");
            goto error;
        }
        if (PyTuple_GET_SIZE(recorders)) {
            seq = PyLong_FromSsize_t(seq_n);
            if (seq == NULL)
                goto error;
            /* a recorder's fallback runs Python code: hold what is borrowed */
            Py_INCREF(recorders);
            Py_INCREF(kind);
            PyObject *call[6] = {kind, NULL, seq, NULL, NULL, NULL};
            call[1] = PyObject_GetAttr(change, str_lsn);
            call[3] = call[1] ? PyObject_GetAttr(change, str_old) : NULL;
            call[4] = call[3] ? PyObject_GetAttr(change, str_old_is_key) : NULL;
            call[5] = call[4] ? PyObject_GetAttr(change, str_new) : NULL;
            int failed = call[5] == NULL;
            for (Py_ssize_t r = 0; !failed && r < PyTuple_GET_SIZE(recorders); r++) {
                PyObject *rec = PyObject_Vectorcall(PyTuple_GET_ITEM(recorders, r), call, 6,
                                                    NULL);
                failed = rec == NULL || PyList_Append(records, rec) < 0;
                Py_XDECREF(rec);
            }
            Py_XDECREF(call[1]);
            Py_XDECREF(call[3]);
            Py_XDECREF(call[4]);
            Py_XDECREF(call[5]);
            Py_CLEAR(seq);
            Py_DECREF(recorders);
            Py_DECREF(kind);
            if (failed)
                goto error;
        }
        seq_n++;
        i++;
        if (PyList_GET_SIZE(records) >= limit)
            break;
    }
    return Py_BuildValue("(nn)", i, seq_n);
error:
    return NULL;
}

/* ------------------------------------------------------------------------------------------
 * hand_over(produce, records, start, on_delivery) -> int
 *
 * Calls confluent-kafka's Producer.produce for records[start:] ((topic, key, value, headers)
 * tuples) with positional arguments only (its keyword parsing costs more than the rest of
 * the call): produce(topic, value, key, -1, on_delivery) without headers,
 * produce(topic, value, key, -1, on_delivery, None, 0, headers) with them (its positional
 * order is topic, value, key, partition, callback, on_delivery, timestamp, headers; -1: the
 * partitioner chooses; 0: timestamp now). Stops at the first BufferError (the client's local queue is
 * full) and returns the index of the record that was not handed over, len(records) when all
 * were; any other exception propagates. The loop is the sink's per-record work, so it runs
 * in C.
 */
static PyObject *partition_ua = NULL, *timestamp_now = NULL;

static PyObject *
native_hand_over(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyList_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "hand_over(produce, records: list, start, on_delivery)");
        return NULL;
    }
    PyObject *produce = args[0], *records = args[1], *on_delivery = args[3];
    Py_ssize_t i = PyLong_AsSsize_t(args[2]);
    if (i == -1 && PyErr_Occurred())
        return NULL;
    if (i < 0) {
        PyErr_SetString(PyExc_ValueError, "hand_over: negative start");
        return NULL;
    }
    if (partition_ua == NULL) {
        partition_ua = PyLong_FromLong(-1);
        timestamp_now = PyLong_FromLong(0);
        if (partition_ua == NULL || timestamp_now == NULL)
            return NULL;
    }
    for (; i < PyList_GET_SIZE(records); i++) {
        PyObject *rec = PyList_GET_ITEM(records, i);
        if (!PyTuple_CheckExact(rec) || PyTuple_GET_SIZE(rec) != 4) {
            PyErr_SetString(PyExc_TypeError, "a record is a (topic, key, value, headers) tuple");
            return NULL;
        }
        PyObject *headers = PyTuple_GET_ITEM(rec, 3);
        PyObject *call[] = {PyTuple_GET_ITEM(rec, 0), PyTuple_GET_ITEM(rec, 2),
                            PyTuple_GET_ITEM(rec, 1), partition_ua, on_delivery, Py_None,
                            timestamp_now, headers};
        Py_INCREF(rec); /* produce may run Python code that drops the list's reference */
        PyObject *r = PyObject_Vectorcall(produce, call, headers == Py_None ? 5 : 8, NULL);
        Py_DECREF(rec);
        if (r == NULL) {
            if (PyErr_ExceptionMatches(PyExc_BufferError)) {
                PyErr_Clear();
                break;
            }
            return NULL;
        }
        Py_DECREF(r);
    }
    return PyLong_FromSsize_t(i < PyList_GET_SIZE(records) ? i : PyList_GET_SIZE(records));
}

/* ------------------------------------------------------------------------------------------ */

static PyMethodDef native_methods[] = {
    {"configure", native_configure, METH_VARARGS,
     "configure(unchanged_toast, max_columns, Insert, Update, Delete): router.pgoutput's"},
    {"hand_over", (PyCFunction)(void (*)(void))native_hand_over, METH_FASTCALL,
     "hand_over(produce, records, start, on_delivery) -> index of the first record not "
     "handed over (BufferError), len(records) when all were"},
    {"record_run", (PyCFunction)(void (*)(void))native_record_run, METH_FASTCALL,
     "record_run(changes, i, relation, ops, kinds, seq, records, limit) -> (next, seq)"},
    {"feed_rows", (PyCFunction)(void (*)(void))native_feed_rows, METH_FASTCALL,
     "feed_rows(messages, start, changes, relations, Change, overhead, budget) -> "
     "(next, bytes, count)"},
    {"drain", (PyCFunction)(void (*)(void))native_drain, METH_FASTCALL,
     "drain(read_message, max_messages, max_bytes) -> (batch, exhausted)"},
    {"decode_row", (PyCFunction)native_decode_row, METH_O,
     "decode_row(data) -> Insert | Update | Delete | None (None: use the Python decoder)"},
    {"read_tuple", (PyCFunction)(void (*)(void))native_read_tuple, METH_FASTCALL,
     "read_tuple(data, pos) -> (tuple, end) | None (None: use the Python reader)"},
    {NULL}};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT, "router._native",
    "The per-change hot path in C; router.pgoutput.reader and router.envelope fall back to "
    "their Python code wherever it returns None.",
    -1, native_methods};

PyMODINIT_FUNC
PyInit__native(void)
{
    if (PyType_Ready(&RowCodecType) < 0 || PyType_Ready(&TallyType) < 0 ||
        PyType_Ready(&RecorderType) < 0)
        return NULL;
    op_insert = PyUnicode_InternFromString("insert");
    op_update = PyUnicode_InternFromString("update");
    op_delete = PyUnicode_InternFromString("delete");
    str_relation = PyUnicode_InternFromString("relation");
    str_op = PyUnicode_InternFromString("op");
    str_lsn = PyUnicode_InternFromString("lsn");
    str_old = PyUnicode_InternFromString("old");
    str_old_is_key = PyUnicode_InternFromString("old_is_key");
    str_new = PyUnicode_InternFromString("new");
    if (!str_relation || !str_op || !str_lsn || !str_old || !str_old_is_key || !str_new)
        return NULL;
    str_payload = PyUnicode_InternFromString("payload");
    str_data_start = PyUnicode_InternFromString("data_start");
    if (!op_insert || !op_update || !op_delete || !str_payload || !str_data_start)
        return NULL;
    PyObject *m = PyModule_Create(&native_module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "RowCodec", (PyObject *)&RowCodecType) < 0 ||
        PyModule_AddObjectRef(m, "Tally", (PyObject *)&TallyType) < 0 ||
        PyModule_AddObjectRef(m, "Recorder", (PyObject *)&RecorderType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
