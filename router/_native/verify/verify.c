/* verify_row: the digests ``pgrouter verify`` keeps of one row of a JSON-format topic
 * (router.verify.digests; its Python twin: router.verify.digests:row_digests_py).
 *
 * verify_row(key, head, values, buckets) -> bytes | None: the texts of the key's values
 * and of the row's (str as they are, int in decimal, bool true/false, None NULL, float ``#``
 * and the hex of its big-endian float8), then (native int64 each) the hash of each row
 * value's text (XOR VERIFY_RAW_SALT when it is not a str), the key's bucket (the md5 of the
 * key's text, its first 28 bits, modulo buckets) and the row's digest (the md5 of the key's
 * text, head and the JSON array of the values, strings quoted, the others' texts bare, its
 * first 60 bits). The JSON type is in both: "24" and 24 differ. None for any other value
 * (the twin renders it).
 */
#include "verify.h"

static PyObject *str_true, *str_false;

static int
plain(PyObject *v)
{
    return PyUnicode_CheckExact(v) || v == Py_None || PyBool_Check(v) || PyLong_CheckExact(v) ||
           PyFloat_CheckExact(v);
}

/* the text of a value other than None (new reference) */
static PyObject *
text_of(PyObject *v)
{
    if (PyUnicode_CheckExact(v))
        return Py_NewRef(v);
    if (PyBool_Check(v)) {
        PyObject **text = v == Py_True ? &str_true : &str_false;
        if (*text == NULL) /* interned once */
            *text = PyUnicode_InternFromString(v == Py_True ? "true" : "false");
        return Py_XNewRef(*text);
    }
    if (PyLong_CheckExact(v))
        return PyObject_Str(v);
    char hexed[17];
    float_text(hexed, PyFloat_AS_DOUBLE(v));
    return PyUnicode_FromStringAndSize(hexed, 17);
}

/* a value's text into the key's text (``key``) or the row's array (``row``, its digest in
 * ``*digest``): 0; -1 error; 1 surrogates (the twin raises) */
static int
value_part(PyObject *v, int first, Buf *key, Buf *row, int64_t *digest)
{
    if (v == Py_None) {
        if (row != NULL)
            *digest = (int64_t)PyObject_Hash(v);
        return key != NULL ? key_part(key, first, NULL, 0, 1, 0)
                           : row_part(row, first, NULL, 0, 1, 0);
    }
    PyObject *text = text_of(v);
    if (text == NULL)
        return -1;
    Py_ssize_t tlen;
    const char *t = PyUnicode_AsUTF8AndSize(text, &tlen);
    int str = PyUnicode_CheckExact(v), res;
    if (t == NULL) {
        res = PyErr_ExceptionMatches(PyExc_UnicodeError) ? (PyErr_Clear(), 1) : -1;
    } else if (key != NULL) {
        res = key_part(key, first, t, (size_t)tlen, 0, str);
    } else {
        Py_hash_t h = PyObject_Hash(text);
        res = h == -1 ? -1 : row_part(row, first, t, (size_t)tlen, 0, str);
        *digest = (int64_t)(str ? h : h ^ VERIFY_RAW_SALT);
    }
    Py_DECREF(text);
    return res;
}

/* the digests of a row (key values and row values each in their names' order): new bytes,
 * Py_None (new reference) when declined (a value that is not a JSON scalar, surrogates: the
 * twin renders it or raises), NULL on error */
static PyObject *
row_digests(PyObject *const *key, Py_ssize_t nk, const char *head, Py_ssize_t headlen,
            PyObject *const *values, Py_ssize_t n, long long buckets)
{
    for (Py_ssize_t i = 0; i < nk; i++)
        if (!plain(key[i]))
            Py_RETURN_NONE; /* not a JSON scalar: the twin renders it */
    for (Py_ssize_t i = 0; i < n; i++)
        if (!plain(values[i]))
            Py_RETURN_NONE;
    Digests d;
    if (digests_start(&d, n) < 0)
        return NULL;
    int res = 0;
    for (Py_ssize_t i = 0; i < nk && !res; i++)
        res = value_part(key[i], i == 0, &d.key, NULL, NULL);
    for (Py_ssize_t i = 0; i < n && !res; i++)
        res = value_part(values[i], i == 0, NULL, &d.row, &d.digests[i]);
    return digests_finish(&d, res, head, (size_t)headlen, (uint64_t)buckets);
}

PyObject *
native_verify_row(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (native_usage(nargs == 4 && PyTuple_Check(args[0]) && PyBytes_Check(args[1]) &&
                         PyTuple_Check(args[2]) && PyLong_Check(args[3]),
                     "verify_row(key: tuple, head: bytes, values: tuple, buckets: int)") < 0)
        return NULL;
    long long buckets = PyLong_AsLongLong(args[3]);
    if (buckets <= 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "verify_row: buckets must be positive");
        return NULL;
    }
    return row_digests(((PyTupleObject *)args[0])->ob_item, PyTuple_GET_SIZE(args[0]),
                       PyBytes_AS_STRING(args[1]), PyBytes_GET_SIZE(args[1]),
                       ((PyTupleObject *)args[2])->ob_item, PyTuple_GET_SIZE(args[2]),
                       buckets);
}

/* verify_sums(rows, buckets) -> {bucket: [rows, digest sum | None]} | None: the bucket sums
 * of a fold's rows (router.verify.digests:bucket_sums, its twin, holds the rules): each
 * value a (names, digests) tuple whose digests end with the key's bucket and the row's
 * digest (native int64 each); a row whose digest is MISSING (-1) makes its bucket's sum None.
 * None (nothing computed) when a value is not of that shape or a bucket not below
 * ``buckets``: the twin sums them. */
typedef struct {
    int64_t rows;
    int missing;
    unsigned __int128 sum;
} Sum;

static PyObject *
sums_dict(const Sum *acc, long long buckets)
{
    PyObject *out = PyDict_New();
    for (long long b = 0; out != NULL && b < buckets; b++) {
        if (!acc[b].rows)
            continue;
        PyObject *n = PyLong_FromLongLong(acc[b].rows), *h = NULL, *pair = NULL, *key = NULL;
        if (acc[b].missing) {
            h = Py_NewRef(Py_None);
        } else {
            unsigned char raw[16]; /* the 128-bit sum, little-endian */
            for (int i = 0; i < 16; i++)
                raw[i] = (unsigned char)(acc[b].sum >> (8 * i));
            h = _PyLong_FromByteArray(raw, 16, 1, 0);
        }
        if (n != NULL && h != NULL)
            pair = PyList_New(2);
        if (pair != NULL) {
            PyList_SET_ITEM(pair, 0, n);
            PyList_SET_ITEM(pair, 1, h);
            n = h = NULL;
            key = PyLong_FromLongLong(b);
        }
        if (key == NULL || PyDict_SetItem(out, key, pair) < 0)
            Py_CLEAR(out);
        Py_XDECREF(n);
        Py_XDECREF(h);
        Py_XDECREF(pair);
        Py_XDECREF(key);
    }
    return out;
}

PyObject *
native_verify_sums(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyDict_Check(args[0]) || !PyLong_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "verify_sums(rows: dict, buckets: int)");
        return NULL;
    }
    long long buckets = PyLong_AsLongLong(args[1]);
    if (buckets <= 0 || buckets > (1 << 24)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "verify_sums: buckets from 1 to 2**24");
        return NULL;
    }
    Sum *acc = PyMem_Calloc((size_t)buckets, sizeof(Sum));
    if (acc == NULL)
        return PyErr_NoMemory();
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(args[0], &pos, &k, &v)) {
        PyObject *digests;
        if (!PyTuple_CheckExact(v) || PyTuple_GET_SIZE(v) != 2 ||
            !PyBytes_CheckExact(digests = PyTuple_GET_ITEM(v, 1)) ||
            PyBytes_GET_SIZE(digests) < 16) {
            PyMem_Free(acc);
            Py_RETURN_NONE;
        }
        int64_t b, h;
        const char *tail = PyBytes_AS_STRING(digests) + PyBytes_GET_SIZE(digests) - 16;
        memcpy(&b, tail, 8);
        memcpy(&h, tail + 8, 8);
        if (b < 0 || b >= buckets || h < -1) { /* digests are never negative but MISSING */
            PyMem_Free(acc);
            Py_RETURN_NONE;
        }
        acc[b].rows++;
        if (h == -1) /* router.verify.fold.MISSING */
            acc[b].missing = 1;
        else
            acc[b].sum += (unsigned __int128)(uint64_t)h;
    }
    PyObject *out = sums_dict(acc, buckets);
    PyMem_Free(acc);
    return out;
}
