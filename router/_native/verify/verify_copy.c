/* verify_copy: the source side of ``pgrouter verify``'s bucket digests computed from the rows
 * of ``COPY (SELECT <the columns' texts>) TO STDOUT`` (its Python twin:
 * router.verify.digests:copy_sums_py, whose docstring holds the rules), summed by bucket.
 *
 * verify_copy(data, keys, kinds, head, buckets, acc) -> rows
 *
 *   data     whole lines of COPY text output, each ending with a newline
 *   keys     the indexes of the key's fields, in the order of their names
 *   kinds    one byte a field: ``s`` a string (quoted in the row's JSON, ``length:text`` in
 *            the key's text), ``r`` a JSON number or boolean, whose field is the text the
 *            topic side renders (bare in the row's JSON, ``length=text`` in the key's)
 *   head     the JSON array of the column names (sorted), as the topic side's
 *   acc      a bytearray of buckets * 24 bytes: per bucket its row count (int64) and the sum
 *            of its rows' digests (128 bits, the low 64 first), native byte order
 *
 * The work runs without the GIL (the topic's fold runs meanwhile in another thread).
 */
#include "verify.h"

static void
put_utf8(Buf *b, unsigned v) /* room for 2 bytes was made */
{
    if (v < 0x80) {
        b->p[b->len++] = (char)v;
    } else {
        b->p[b->len++] = (char)(0xC0 | (v >> 6));
        b->p[b->len++] = (char)(0x80 | (v & 0x3F));
    }
}

/* a field's text, unescaped as router.snapshot.core._unescape does, into out */
static int
unescape(Buf *out, const char *s, size_t n)
{
    if (buf_need(out, n * 2) < 0)
        return -1;
    for (size_t i = 0; i < n;) {
        char c = s[i];
        if (c != '\\' || i + 1 >= n) {
            out->p[out->len++] = c;
            i++;
            continue;
        }
        char x = s[i + 1];
        const char *plain = strchr("bfnrtv\\", x);
        if (x && plain) {
            static const char to[] = "\b\f\n\r\t\v\\";
            out->p[out->len++] = to[plain - "bfnrtv\\"];
            i += 2;
        } else if (x >= '0' && x <= '7') {
            size_t j = i + 1;
            unsigned v = 0;
            while (j < n && j < i + 4 && s[j] >= '0' && s[j] <= '7')
                v = v * 8 + (unsigned)(s[j++] - '0');
            put_utf8(out, v);
            i = j;
        } else if (x == 'x' && i + 2 < n && hex_value(s[i + 2]) >= 0) {
            size_t j = i + 2;
            unsigned v = 0;
            while (j < n && j < i + 4 && hex_value(s[j]) >= 0)
                v = v * 16 + (unsigned)hex_value(s[j++]);
            put_utf8(out, v);
            i = j;
        } else {
            out->p[out->len++] = x;
            i += 2;
        }
    }
    return 0;
}

#define COPY_MAX_FIELDS 1664

/* rows summed (>= 0); -1 out of memory; -2 a line of another number of fields */
static Py_ssize_t
sum_rows(const char *data, size_t size, const Py_ssize_t *keys, Py_ssize_t nkeys,
         const char *kinds, Py_ssize_t columns, const char *head, size_t headlen,
         uint64_t buckets,
         unsigned char *acc)
{
    Buf texts, key, json;
    buf_init(&texts, 1);
    buf_init(&key, 1);
    buf_init(&json, 1);
    size_t start[COPY_MAX_FIELDS], len[COPY_MAX_FIELDS];
    signed char null[COPY_MAX_FIELDS];
    Py_ssize_t rows = 0, res = -1;
    const char *p = data, *end = data + size;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        if (nl == NULL)
            nl = end;
        texts.len = key.len = json.len = 0;
        Py_ssize_t f = 0;
        const char *q = p;
        for (;;) {
            const char *tab = memchr(q, '\t', (size_t)(nl - q));
            const char *fe = tab ? tab : nl;
            if (f >= columns) {
                res = -2;
                goto out;
            }
            size_t n = (size_t)(fe - q);
            null[f] = n == 2 && q[0] == '\\' && q[1] == 'N';
            start[f] = texts.len;
            if (!null[f]) {
                if (memchr(q, '\\', n) == NULL) {
                    if (buf_need(&texts, n) < 0)
                        goto out;
                    memcpy(texts.p + texts.len, q, n);
                    texts.len += n;
                } else if (unescape(&texts, q, n) < 0) {
                    goto out;
                }
            }
            len[f] = texts.len - start[f];
            f++;
            if (tab == NULL)
                break;
            q = tab + 1;
        }
        if (f != columns) {
            res = -2;
            goto out;
        }
        for (Py_ssize_t i = 0; i < nkeys; i++) {
            Py_ssize_t k = keys[i];
            if (key_part(&key, i == 0, texts.p + start[k], len[k], null[k], kinds[k] == 's') < 0)
                goto out;
        }
        for (Py_ssize_t i = 0; i < columns; i++)
            if (row_part(&json, i == 0, texts.p + start[i], len[i], null[i], kinds[i] == 's') < 0)
                goto out;
        if (row_close(&json, columns == 0) < 0)
            goto out;
        int64_t bucket, digest;
        digest_tail(&key, head, headlen, &json, buckets, &bucket, &digest);
        unsigned char *a = acc + bucket * 24;
        int64_t count;
        uint64_t lo, hi;
        memcpy(&count, a, 8);
        memcpy(&lo, a + 8, 8);
        memcpy(&hi, a + 16, 8);
        count++;
        lo += (uint64_t)digest;
        hi += lo < (uint64_t)digest;
        memcpy(a, &count, 8);
        memcpy(a + 8, &lo, 8);
        memcpy(a + 16, &hi, 8);
        rows++;
        p = nl + 1;
    }
    res = rows;
out:
    buf_free(&texts);
    buf_free(&key);
    buf_free(&json);
    return res;
}

PyObject *
native_verify_copy(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6 || !PyBytes_Check(args[0]) || !PyTuple_Check(args[1]) ||
        !PyBytes_Check(args[2]) || !PyBytes_Check(args[3]) || !PyLong_Check(args[4]) ||
        !PyByteArray_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError, "verify_copy(data: bytes, keys: tuple, kinds: bytes, "
                                         "head: bytes, buckets: int, acc: bytearray)");
        return NULL;
    }
    Py_ssize_t columns = PyBytes_GET_SIZE(args[2]), nkeys = PyTuple_GET_SIZE(args[1]);
    long long buckets = PyLong_AsLongLong(args[4]);
    if (PyErr_Occurred())
        return NULL;
    if (buckets <= 0 || columns < 1 || columns > COPY_MAX_FIELDS ||
        PyByteArray_GET_SIZE(args[5]) != buckets * 24) {
        PyErr_SetString(PyExc_ValueError, "verify_copy: buckets must be positive, columns "
                                          "from 1 to 1664, acc of buckets * 24 bytes");
        return NULL;
    }
    Py_ssize_t keys[COPY_MAX_FIELDS];
    if (nkeys > COPY_MAX_FIELDS) {
        PyErr_SetString(PyExc_ValueError, "verify_copy: too many keys");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nkeys; i++) {
        keys[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(args[1], i));
        if (keys[i] < 0 || keys[i] >= columns) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "verify_copy: a key index out of range");
            return NULL;
        }
    }
    PyObject *data = args[0], *head = args[3], *acc = args[5], *kinds = args[2];
    Py_INCREF(data);
    Py_INCREF(head);
    Py_INCREF(acc);
    Py_INCREF(kinds);
    Py_ssize_t rows;
    Py_BEGIN_ALLOW_THREADS
    rows = sum_rows(PyBytes_AS_STRING(data), (size_t)PyBytes_GET_SIZE(data), keys, nkeys,
                    PyBytes_AS_STRING(kinds), columns, PyBytes_AS_STRING(head), (size_t)PyBytes_GET_SIZE(head),
                    (uint64_t)buckets, (unsigned char *)PyByteArray_AS_STRING(acc));
    Py_END_ALLOW_THREADS
    Py_DECREF(data);
    Py_DECREF(head);
    Py_DECREF(acc);
    Py_DECREF(kinds);
    if (rows == -1)
        return PyErr_NoMemory();
    if (rows == -2) {
        PyErr_Format(PyExc_ValueError, "verify_copy: a row without %zd fields", columns);
        return NULL;
    }
    return PyLong_FromSsize_t(rows);
}
