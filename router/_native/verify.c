/* verify_row: the digests ``pgrouter verify`` keeps of one row of a JSON-format topic
 * (router.verify_digest; its Python twin: router.verify_digest:row_digests_py).
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
#include "native.h"

/* ------------------------------------------------------------------------------------------
 * MD5 (RFC 1321)
 */

static const uint32_t md5_k[64] = {
    0xd76aa478, 0xe8c7b756, 0x242070db, 0xc1bdceee, 0xf57c0faf, 0x4787c62a, 0xa8304613,
    0xfd469501, 0x698098d8, 0x8b44f7af, 0xffff5bb1, 0x895cd7be, 0x6b901122, 0xfd987193,
    0xa679438e, 0x49b40821, 0xf61e2562, 0xc040b340, 0x265e5a51, 0xe9b6c7aa, 0xd62f105d,
    0x02441453, 0xd8a1e681, 0xe7d3fbc8, 0x21e1cde6, 0xc33707d6, 0xf4d50d87, 0x455a14ed,
    0xa9e3e905, 0xfcefa3f8, 0x676f02d9, 0x8d2a4c8a, 0xfffa3942, 0x8771f681, 0x6d9d6122,
    0xfde5380c, 0xa4beea44, 0x4bdecfa9, 0xf6bb4b60, 0xbebfbc70, 0x289b7ec6, 0xeaa127fa,
    0xd4ef3085, 0x04881d05, 0xd9d4d039, 0xe6db99e5, 0x1fa27cf8, 0xc4ac5665, 0xf4292244,
    0x432aff97, 0xab9423a7, 0xfc93a039, 0x655b59c3, 0x8f0ccc92, 0xffeff47d, 0x85845dd1,
    0x6fa87e4f, 0xfe2ce6e0, 0xa3014314, 0x4e0811a1, 0xf7537e82, 0xbd3af235, 0x2ad7d2bb,
    0xeb86d391};

static const unsigned char md5_s[64] = {
    7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22,
    5, 9,  14, 20, 5, 9,  14, 20, 5, 9,  14, 20, 5, 9,  14, 20,
    4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23,
    6, 10, 15, 21, 6, 10, 15, 21, 6, 10, 15, 21, 6, 10, 15, 21};

void
md5_init(Md5 *m)
{
    m->h[0] = 0x67452301;
    m->h[1] = 0xefcdab89;
    m->h[2] = 0x98badcfe;
    m->h[3] = 0x10325476;
    m->len = 0;
    m->n = 0;
}

static void
md5_block(Md5 *m, const unsigned char *p)
{
    uint32_t w[16], a = m->h[0], b = m->h[1], c = m->h[2], d = m->h[3];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] | ((uint32_t)p[4 * i + 1] << 8) |
               ((uint32_t)p[4 * i + 2] << 16) | ((uint32_t)p[4 * i + 3] << 24);
    /* the 64 steps unrolled: step i takes word g(i), constant md5_k[i], shift md5_s[i] */
#define MD5_F(x, y, z) ((z) ^ ((x) & ((y) ^ (z))))
#define MD5_G(x, y, z) ((y) ^ ((z) & ((x) ^ (y))))
#define MD5_H(x, y, z) ((x) ^ (y) ^ (z))
#define MD5_I(x, y, z) ((y) ^ ((x) | ~(z)))
#define MD5_STEP(f, a, b, c, d, x, k, s)                                                    \
    (a) += f((b), (c), (d)) + (x) + (k);                                                    \
    (a) = ((a) << (s)) | ((a) >> (32 - (s)));                                               \
    (a) += (b);
#define MD5_ROUND(f, i, g0, g1, g2, g3)                                                     \
    MD5_STEP(f, a, b, c, d, w[g0], md5_k[i], md5_s[i])                                      \
    MD5_STEP(f, d, a, b, c, w[g1], md5_k[i + 1], md5_s[i + 1])                              \
    MD5_STEP(f, c, d, a, b, w[g2], md5_k[i + 2], md5_s[i + 2])                              \
    MD5_STEP(f, b, c, d, a, w[g3], md5_k[i + 3], md5_s[i + 3])
    MD5_ROUND(MD5_F, 0, 0, 1, 2, 3)
    MD5_ROUND(MD5_F, 4, 4, 5, 6, 7)
    MD5_ROUND(MD5_F, 8, 8, 9, 10, 11)
    MD5_ROUND(MD5_F, 12, 12, 13, 14, 15)
    MD5_ROUND(MD5_G, 16, 1, 6, 11, 0)
    MD5_ROUND(MD5_G, 20, 5, 10, 15, 4)
    MD5_ROUND(MD5_G, 24, 9, 14, 3, 8)
    MD5_ROUND(MD5_G, 28, 13, 2, 7, 12)
    MD5_ROUND(MD5_H, 32, 5, 8, 11, 14)
    MD5_ROUND(MD5_H, 36, 1, 4, 7, 10)
    MD5_ROUND(MD5_H, 40, 13, 0, 3, 6)
    MD5_ROUND(MD5_H, 44, 9, 12, 15, 2)
    MD5_ROUND(MD5_I, 48, 0, 7, 14, 5)
    MD5_ROUND(MD5_I, 52, 12, 3, 10, 1)
    MD5_ROUND(MD5_I, 56, 8, 15, 6, 13)
    MD5_ROUND(MD5_I, 60, 4, 11, 2, 9)
#undef MD5_ROUND
#undef MD5_STEP
#undef MD5_F
#undef MD5_G
#undef MD5_H
#undef MD5_I
    m->h[0] += a;
    m->h[1] += b;
    m->h[2] += c;
    m->h[3] += d;
}

void
md5_update(Md5 *m, const void *data, size_t n)
{
    const unsigned char *p = data;
    m->len += n;
    if (m->n) {
        size_t take = 64 - m->n < n ? 64 - m->n : n;
        memcpy(m->buf + m->n, p, take);
        m->n += take;
        p += take;
        n -= take;
        if (m->n < 64)
            return;
        md5_block(m, m->buf);
        m->n = 0;
    }
    for (; n >= 64; p += 64, n -= 64)
        md5_block(m, p);
    memcpy(m->buf, p, n);
    m->n = n;
}

/* the first 8 bytes of the digest, big-endian (md5's words are little-endian) */
uint64_t
md5_head64(Md5 *m)
{
    uint64_t bits = m->len * 8;
    unsigned char pad[72] = {0x80};
    size_t padn = (m->n < 56 ? 56 - m->n : 120 - m->n);
    unsigned char len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (unsigned char)(bits >> (8 * i));
    md5_update(m, pad, padn);
    md5_update(m, len, 8);
    uint64_t out = 0;
    for (int w = 0; w < 2; w++)
        for (int i = 0; i < 4; i++)
            out = (out << 8) | ((m->h[w] >> (8 * i)) & 0xff);
    return out;
}

/* ------------------------------------------------------------------------------------------
 * the JSON array of the texts, as msgspec writes it
 */

int
buf_need(Buf *b, size_t more)
{
    if (b->len + more <= b->cap)
        return 0;
    size_t cap = b->cap * 2;
    while (cap < b->len + more)
        cap *= 2;
    char *p = PyMem_Malloc(cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(p, b->p, b->len);
    if (b->p != b->stack)
        PyMem_Free(b->p);
    b->p = p;
    b->cap = cap;
    return 0;
}

int
buf_string(Buf *b, const char *s, Py_ssize_t n)
{
    if (buf_need(b, (size_t)n * 6 + 2) < 0)
        return -1;
    b->len = (size_t)(json_quote(b->p + b->len, s, (size_t)n) - b->p);
    return 0;
}

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
    if (PyBool_Check(v))
        return Py_NewRef(v == Py_True ? str_true : str_false);
    if (PyLong_CheckExact(v))
        return PyObject_Str(v);
    double d = PyFloat_AS_DOUBLE(v);
    unsigned char raw[8];
    char hexed[17] = {'#'}; /* never an int's text */
    static const char hex[] = "0123456789abcdef";
    memcpy(raw, &d, 8);
    for (int j = 0; j < 8; j++) { /* big-endian: struct.pack(">d") */
        unsigned char c = raw[PY_LITTLE_ENDIAN ? 7 - j : j];
        hexed[1 + 2 * j] = hex[c >> 4];
        hexed[2 + 2 * j] = hex[c & 15];
    }
    return PyUnicode_FromStringAndSize(hexed, 17);
}

/* the key's text (router.verify_digest.key_text): ``length:text`` of each str, ``length=text``
 * of the other values, ``!`` for None, joined by ``,`` (0; -1 error; 1 surrogates: the twin
 * raises) */
static int
key_text(Buf *b, PyObject *const *key, Py_ssize_t nk)
{
    for (Py_ssize_t i = 0; i < nk; i++) {
        PyObject *v = key[i];
        if (buf_need(b, 32) < 0)
            return -1;
        if (i)
            b->p[b->len++] = ',';
        if (v == Py_None) {
            b->p[b->len++] = '!';
            continue;
        }
        PyObject *text = text_of(v);
        if (text == NULL)
            return -1;
        Py_ssize_t tlen;
        const char *t = PyUnicode_AsUTF8AndSize(text, &tlen);
        if (t == NULL) {
            Py_DECREF(text);
            return PyErr_ExceptionMatches(PyExc_UnicodeError) ? (PyErr_Clear(), 1) : -1;
        }
        b->len += (size_t)sprintf(b->p + b->len, "%zd%c", PyUnicode_GET_LENGTH(text),
                                  PyUnicode_CheckExact(v) ? ':' : '=');
        int bad = buf_need(b, (size_t)tlen) < 0;
        if (!bad) {
            memcpy(b->p + b->len, t, (size_t)tlen);
            b->len += (size_t)tlen;
        }
        Py_DECREF(text);
        if (bad)
            return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * verify_row
 */

/* the digests of a row (key values and row values each in their names' order): new bytes,
 * Py_None (new reference) when declined (a value that is not a JSON scalar, surrogates: the
 * twin renders it or raises), NULL on error */
PyObject *
row_digests(PyObject *const *key, Py_ssize_t nk, const char *head, Py_ssize_t headlen,
            PyObject *const *values, Py_ssize_t n, long long buckets)
{
    for (Py_ssize_t i = 0; i < nk; i++)
        if (!plain(key[i]))
            Py_RETURN_NONE; /* not a JSON scalar: the twin renders it */
    for (Py_ssize_t i = 0; i < n; i++)
        if (!plain(values[i]))
            Py_RETURN_NONE;
    PyObject *out = PyBytes_FromStringAndSize(NULL, (n + 2) * 8);
    if (out == NULL)
        return NULL;
    int64_t *digests = (int64_t *)PyBytes_AS_STRING(out);
    Buf b = {.len = 0, .cap = sizeof(b.stack)}, k = {.len = 0, .cap = sizeof(k.stack)};
    b.p = b.stack;
    k.p = k.stack;
    int declined = key_text(&k, key, nk);
    if (declined)
        goto done;
    b.p[b.len++] = '[';
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = values[i];
        if (i) {
            if (buf_need(&b, 1) < 0)
                goto fail;
            b.p[b.len++] = ',';
        }
        if (v == Py_None) {
            if (buf_need(&b, 4) < 0)
                goto fail;
            memcpy(b.p + b.len, "null", 4);
            b.len += 4;
            digests[i] = (int64_t)PyObject_Hash(v);
            continue;
        }
        PyObject *text = text_of(v);
        if (text == NULL)
            goto fail;
        Py_ssize_t tlen;
        const char *t = PyUnicode_AsUTF8AndSize(text, &tlen);
        Py_hash_t h = t == NULL ? -1 : PyObject_Hash(text);
        int str = PyUnicode_CheckExact(v), bad = t == NULL || h == -1;
        if (!bad && str)
            bad = buf_string(&b, t, tlen) < 0;
        else if (!bad) { /* an int, a bool, a float: its text bare, as JSON has it */
            bad = buf_need(&b, (size_t)tlen) < 0;
            if (!bad) {
                memcpy(b.p + b.len, t, (size_t)tlen);
                b.len += (size_t)tlen;
            }
            h ^= VERIFY_RAW_SALT;
        }
        Py_DECREF(text);
        if (bad) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeError))
                goto fail;
            PyErr_Clear(); /* surrogates: the twin raises */
            declined = 1;
            goto done;
        }
        digests[i] = (int64_t)h;
    }
    if (buf_need(&b, 1) < 0)
        goto fail;
    b.p[b.len++] = ']';
    Md5 kmd5, row;
    md5_init(&kmd5);
    md5_update(&kmd5, k.p, k.len);
    row = kmd5;
    uint64_t first = md5_head64(&kmd5);
    digests[n] = (int64_t)(((first >> 32) >> 4) % (uint64_t)buckets);
    md5_update(&row, head, (size_t)headlen);
    md5_update(&row, b.p, b.len);
    digests[n + 1] = (int64_t)(md5_head64(&row) >> 4);
done:
    if (b.p != b.stack)
        PyMem_Free(b.p);
    if (k.p != k.stack)
        PyMem_Free(k.p);
    if (declined < 0)
        goto fail_freed;
    if (declined) {
        Py_DECREF(out);
        Py_RETURN_NONE;
    }
    return out;
fail:
    if (b.p != b.stack)
        PyMem_Free(b.p);
    if (k.p != k.stack)
        PyMem_Free(k.p);
fail_freed:
    Py_DECREF(out);
    return NULL;
}

static PyObject *
native_verify_row(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyTuple_Check(args[0]) || !PyBytes_Check(args[1]) ||
        !PyTuple_Check(args[2]) || !PyLong_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "verify_row(key: tuple, head: bytes, values: tuple, "
                                         "buckets: int)");
        return NULL;
    }
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

static PyMethodDef verify_methods[] = {
    {"verify_row", (PyCFunction)(void (*)(void))native_verify_row, METH_FASTCALL,
     "verify_row(key, head, values, buckets) -> bytes | None: router.verify_digest's "
     "digests of one row"},
    {"verify_fold", (PyCFunction)(void (*)(void))native_verify_fold, METH_FASTCALL,
     "verify_fold(msgs, ends, rows, cut, buckets, tools) -> (read, after_cut, folded): "
     "router.verify_digest.fold_batch_py, a batch of a JSON-format topic's messages folded"},
    {"verify_copy", (PyCFunction)(void (*)(void))native_verify_copy, METH_FASTCALL,
     "verify_copy(data, keys, columns, head, buckets, acc) -> rows: "
     "router.verify_digest.copy_sums_py, COPY text rows' digests summed by bucket"},
    {NULL}};

int
verify_setup(PyObject *module)
{
    str_true = PyUnicode_InternFromString("true");
    str_false = PyUnicode_InternFromString("false");
    if (str_true == NULL || str_false == NULL || fold_setup() < 0)
        return -1;
    return PyModule_AddFunctions(module, verify_methods);
}
