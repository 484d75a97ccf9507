/* verify_fold: a batch of a JSON-format topic's messages folded by ``pgrouter verify`` with
 * bucket digests (its Python twin: router.verify_digest:fold_batch_py, whose docstring holds
 * the rules).
 *
 * verify_fold(msgs, ends, rows, cut, buckets, tools) -> (read, after_cut, folded)
 *
 *   msgs     confluent-kafka Messages (error(), partition(), offset(), key(), value())
 *   ends     partition -> end offset: messages at or past it are not read
 *   rows     the fold's dict: key bytes -> (position, (names, digests))
 *   tools    (decode_change, decode_key, encode_key, layout_of, slow, row_py): the twin's;
 *            this side calls only slow
 *
 * A message is folded here only in the plain case: a change record ``c``/``r``/``u`` whose
 * envelope and key verify_json.c takes apart (a key of scalars, without a float; a source;
 * ``after`` an object of scalars; no ``before``, no ``unchanged_toast``). Anything else goes
 * to ``slow(key, value)``, the Python feeder (msgspec), which folds it or raises the precise
 * error. Each column's digest is Python's hash of its text (a str's, computed from the bytes
 * when they are ASCII); keys, positions and rows are stored as the Python fold stores them.
 */
#include "native.h"

static PyObject *s_error, *s_partition, *s_offset, *s_key, *s_value, *sixty_four;



int
fold_setup(void)
{
    struct {
        PyObject **at;
        const char *name;
    } names[] = {{&s_error, "error"}, {&s_partition, "partition"}, {&s_offset, "offset"},
                 {&s_key, "key"},     {&s_value, "value"}};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if ((*names[i].at = PyUnicode_InternFromString(names[i].name)) == NULL)
            return -1;
    sixty_four = PyLong_FromLong(64);
    return sixty_four == NULL ? -1 : 0;
}

/* the layout of the last row: its names sorted, as a tuple and as JSON (head) */
typedef struct {
    PyObject *names, *head;
    char *joined; /* the sorted names, each followed by a NUL */
    size_t jlen;
} Layout;

static void
layout_clear(Layout *l)
{
    Py_CLEAR(l->names);
    Py_CLEAR(l->head);
    PyMem_Free(l->joined);
    l->joined = NULL;
    l->jlen = 0;
}

/* the layout of the sorted members (the cached one when their names are the same) */
static int
layout_for(Layout *l, Member **s, Py_ssize_t n)
{
    size_t jlen = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        jlen += s[i]->nlen + 1;
    if (l->names != NULL && jlen == l->jlen && PyTuple_GET_SIZE(l->names) == n) {
        size_t at = 0;
        Py_ssize_t i = 0;
        for (; i < n; i++) {
            if (memcmp(l->joined + at, s[i]->name, s[i]->nlen) || l->joined[at + s[i]->nlen])
                break;
            at += s[i]->nlen + 1;
        }
        if (i == n)
            return 0;
    }
    layout_clear(l);
    l->joined = PyMem_Malloc(jlen + 1);
    PyObject *names = PyTuple_New(n), *head = NULL;
    char *h = PyMem_Malloc(jlen * 1 + 3 * (size_t)n + 3);
    if (l->joined == NULL || names == NULL || h == NULL)
        goto fail;
    size_t at = 0, hl = 0;
    h[hl++] = '[';
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name = PyUnicode_DecodeUTF8(s[i]->name, (Py_ssize_t)s[i]->nlen, NULL);
        if (name == NULL)
            goto fail;
        PyTuple_SET_ITEM(names, i, name);
        memcpy(l->joined + at, s[i]->name, s[i]->nlen);
        at += s[i]->nlen;
        l->joined[at++] = 0;
        if (i)
            h[hl++] = ',';
        h[hl++] = '"';
        memcpy(h + hl, s[i]->name, s[i]->nlen);
        hl += s[i]->nlen;
        h[hl++] = '"';
    }
    h[hl++] = ']';
    head = PyBytes_FromStringAndSize(h, (Py_ssize_t)hl);
    PyMem_Free(h);
    h = NULL;
    if (head == NULL)
        goto fail;
    l->names = names;
    l->head = head;
    l->jlen = jlen;
    return 0;
fail:
    PyMem_Free(h);
    Py_XDECREF(names);
    PyMem_Free(l->joined);
    l->joined = NULL;
    if (!PyErr_Occurred())
        PyErr_NoMemory();
    return -1;
}

typedef struct {
    PyObject *rows;
    unsigned long long cut;
    long long buckets;
    Layout row;
    Flat after, key;
    Member *sorted[FOLD_MAX_COLUMNS], *ksorted[FOLD_MAX_COLUMNS];
} Fold;

/* msgspec's JSON of the key (router.verify.key_of: names sorted) as new bytes; None (a new
 * reference) when not the plain case (a float in the key) */
static PyObject *
key_bytes(Fold *f, Py_ssize_t n)
{
    Flat *k = &f->key;
    Buf b = {.len = 0, .cap = sizeof(b.stack)};
    b.p = b.stack;
    PyObject *out = NULL;
    if (buf_need(&b, 1) < 0)
        goto done;
    b.p[b.len++] = '{';
    for (Py_ssize_t i = 0; i < n; i++) {
        Member *m = f->ksorted[i];
        if (m->kind == 'f') {
            out = Py_NewRef(Py_None);
            goto done;
        }
        if (buf_need(&b, m->nlen + 8) < 0)
            goto done;
        if (i)
            b.p[b.len++] = ',';
        b.p[b.len++] = '"';
        memcpy(b.p + b.len, m->name, m->nlen);
        b.len += m->nlen;
        b.p[b.len++] = '"';
        b.p[b.len++] = ':';
        if (m->null) {
            memcpy(b.p + b.len, "null", 4);
            b.len += 4;
        } else if (m->kind == 's') {
            if (buf_string(&b, k->texts + m->start, (Py_ssize_t)m->len) < 0)
                goto done;
        } else {
            if (buf_need(&b, m->len) < 0)
                goto done;
            memcpy(b.p + b.len, k->texts + m->start, m->len);
            b.len += m->len;
        }
    }
    if (buf_need(&b, 1) < 0)
        goto done;
    b.p[b.len++] = '}';
    out = PyBytes_FromStringAndSize(b.p, (Py_ssize_t)b.len);
done:
    if (b.p != b.stack)
        PyMem_Free(b.p);
    return out;
}

static int
ascii(const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)p[i] >= 0x80)
            return 0;
    return 1;
}

/* Python's hash of a text (router.verify_digest.row_digests_py hashes the str) */
static Py_hash_t
text_hash(const char *p, size_t n)
{
    if (ascii(p, n))
        return _Py_HashBytes(p, (Py_ssize_t)n); /* a compact ASCII str hashes its bytes */
    PyObject *s = PyUnicode_DecodeUTF8(p, (Py_ssize_t)n, NULL);
    if (s == NULL)
        return -1;
    Py_hash_t h = PyObject_Hash(s);
    Py_DECREF(s);
    return h;
}

static size_t
utf8_chars(const char *s, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

/* the digests of the scanned row (row_digests' layout: a hash per column, the key's bucket,
 * the row's digest) as new bytes */
static PyObject *
scanned_digests(Fold *f, Py_ssize_t n, Py_ssize_t nk)
{
    PyObject *out = PyBytes_FromStringAndSize(NULL, (n + 2) * 8);
    if (out == NULL)
        return NULL;
    int64_t *digests = (int64_t *)PyBytes_AS_STRING(out);
    Buf b = {.len = 0, .cap = sizeof(b.stack)}, k = {.len = 0, .cap = sizeof(k.stack)};
    b.p = b.stack;
    k.p = k.stack;
    for (Py_ssize_t i = 0; i < nk; i++) {
        Member *m = f->ksorted[i];
        if (buf_need(&k, m->len + 32) < 0)
            goto fail;
        if (i)
            k.p[k.len++] = ',';
        if (m->null) {
            k.p[k.len++] = '!';
            continue;
        }
        k.len += (size_t)sprintf(k.p + k.len, "%zu%c",
                                 utf8_chars(f->key.texts + m->start, m->len),
                                 m->kind == 's' ? ':' : '=');
        memcpy(k.p + k.len, f->key.texts + m->start, m->len);
        k.len += m->len;
    }
    if (buf_need(&b, 1) < 0)
        goto fail;
    b.p[b.len++] = '[';
    for (Py_ssize_t i = 0; i < n; i++) {
        Member *m = f->sorted[i];
        if (buf_need(&b, 5) < 0)
            goto fail;
        if (i)
            b.p[b.len++] = ',';
        if (m->null) {
            memcpy(b.p + b.len, "null", 4);
            b.len += 4;
            digests[i] = (int64_t)PyObject_Hash(Py_None);
            continue;
        }
        const char *t = f->after.texts + m->start;
        Py_hash_t h = text_hash(t, m->len);
        if (h == -1)
            goto fail;
        if (m->kind == 's') {
            if (buf_string(&b, t, (Py_ssize_t)m->len) < 0)
                goto fail;
        } else { /* an int, a bool, a float: its text bare, its JSON type in the digests */
            if (buf_need(&b, m->len) < 0)
                goto fail;
            memcpy(b.p + b.len, t, m->len);
            b.len += m->len;
            h ^= VERIFY_RAW_SALT;
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
    digests[n] = (int64_t)(((first >> 32) >> 4) % (uint64_t)f->buckets);
    md5_update(&row, PyBytes_AS_STRING(f->row.head), (size_t)PyBytes_GET_SIZE(f->row.head));
    md5_update(&row, b.p, b.len);
    digests[n + 1] = (int64_t)(md5_head64(&row) >> 4);
    if (b.p != b.stack)
        PyMem_Free(b.p);
    if (k.p != k.stack)
        PyMem_Free(k.p);
    return out;
fail:
    if (b.p != b.stack)
        PyMem_Free(b.p);
    if (k.p != k.stack)
        PyMem_Free(k.p);
    Py_DECREF(out);
    return NULL;
}

/* one message's key and value: folded (1), not the plain case or at or past the cut (0:
 * nothing done, the feeder folds it), error (-1) */
static int
fold_one(Fold *f, PyObject *kb, PyObject *vb)
{
    int res = 0, got;
    PyObject *k = NULL, *pos = NULL, *digests = NULL;
    if (kb == Py_None || !PyBytes_Check(kb) || !PyBytes_Check(vb))
        return 0;
    Envelope env;
    if (!envelope_scan(PyBytes_AS_STRING(vb), PyBytes_AS_STRING(vb) + PyBytes_GET_SIZE(vb),
                       &env))
        return 0; /* the slow way (msgspec) reads it */
    unsigned long long lsn = env.lsn, seq = env.seq;
    if ((got = flat_scan(&f->after, env.after, env.after_end)) <= 0)
        return got;
    if (lsn >= f->cut) /* past the verify point: the feeder tells a later write from damage */
        goto done;
    if ((got = flat_scan(&f->key, PyBytes_AS_STRING(kb),
                         PyBytes_AS_STRING(kb) + PyBytes_GET_SIZE(kb))) <= 0) {
        res = got;
        goto done;
    }
    Py_ssize_t n = f->after.n, nk = f->key.n;
    flat_sorted(&f->after, f->sorted);
    flat_sorted(&f->key, f->ksorted);
    if ((k = key_bytes(f, nk)) == NULL) {
        res = -1;
        goto done;
    }
    if (k == Py_None)
        goto done;
    /* from here on the message is folded (1) or an error (-1) */
    res = -1;
    PyObject *hi = PyLong_FromUnsignedLongLong(lsn), *lo = NULL, *shifted = NULL;
    if (hi != NULL && (shifted = PyNumber_Lshift(hi, sixty_four)) != NULL &&
        (lo = PyLong_FromUnsignedLongLong(seq)) != NULL)
        pos = PyNumber_Or(shifted, lo);
    Py_XDECREF(hi);
    Py_XDECREF(shifted);
    Py_XDECREF(lo);
    if (pos == NULL)
        goto done;
    PyObject *held = PyDict_GetItemWithError(f->rows, k);
    if (held == NULL && PyErr_Occurred())
        goto done;
    if (held != NULL && PyTuple_Check(held) && PyTuple_GET_SIZE(held) == 2) {
        int newer = PyObject_RichCompareBool(PyTuple_GET_ITEM(held, 0), pos, Py_GE);
        if (newer < 0)
            goto done;
        if (newer) {
            res = 1; /* a duplicate, or older than what the key holds */
            goto done;
        }
    }
    if (layout_for(&f->row, f->sorted, n) < 0)
        goto done;
    if ((digests = scanned_digests(f, n, nk)) == NULL)
        goto done;
    PyObject *row = PyTuple_Pack(2, f->row.names, digests);
    PyObject *value = row == NULL ? NULL : PyTuple_Pack(2, pos, row);
    Py_XDECREF(row);
    if (value == NULL)
        goto done;
    int bad = PyDict_SetItem(f->rows, k, value);
    Py_DECREF(value);
    if (!bad)
        res = 1;
done:
    Py_XDECREF(k);
    Py_XDECREF(pos);
    Py_XDECREF(digests);
    return res;
}

PyObject *
native_verify_fold(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6 || !PyList_Check(args[0]) || !PyDict_Check(args[1]) ||
        !PyDict_Check(args[2]) || !PyLong_Check(args[3]) || !PyLong_Check(args[4]) ||
        !PyTuple_Check(args[5]) || PyTuple_GET_SIZE(args[5]) != 6) {
        PyErr_SetString(PyExc_TypeError, "verify_fold(msgs: list, ends: dict, rows: dict, "
                                         "cut: int, buckets: int, tools: tuple of 6)");
        return NULL;
    }
    PyObject *tools = args[5], *slow = PyTuple_GET_ITEM(tools, 4);
    static Fold f; /* big (its members' arrays): one a call, under the GIL */
    f.rows = args[2];
    f.row.names = f.row.head = NULL;
    f.row.joined = NULL;
    f.row.jlen = 0;
    f.cut = PyLong_AsUnsignedLongLong(args[3]);
    f.buckets = PyLong_AsLongLong(args[4]);
    if (PyErr_Occurred())
        return NULL;
    if (f.buckets <= 0) {
        PyErr_SetString(PyExc_ValueError, "verify_fold: buckets must be positive");
        return NULL;
    }
    Py_ssize_t read = 0, after_cut = 0, folded = 0;
    PyObject *msgs = args[0], *ends = args[1];
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(msgs); i++) {
        PyObject *m = PyList_GET_ITEM(msgs, i), *kb = NULL, *vb = NULL;
        PyObject *err = PyObject_CallMethodNoArgs(m, s_error);
        if (err == NULL)
            goto fail;
        int skip = err != Py_None;
        Py_DECREF(err);
        if (skip)
            continue;
        PyObject *part = PyObject_CallMethodNoArgs(m, s_partition);
        if (part == NULL)
            goto fail;
        PyObject *end = PyDict_GetItemWithError(ends, part);
        Py_DECREF(part);
        if (end == NULL) {
            if (PyErr_Occurred())
                goto fail;
            continue;
        }
        Py_INCREF(end);
        PyObject *off = PyObject_CallMethodNoArgs(m, s_offset);
        int before_end = off == NULL ? -1 : PyObject_RichCompareBool(off, end, Py_LT);
        Py_XDECREF(off);
        Py_DECREF(end);
        if (before_end < 0)
            goto fail;
        if (!before_end)
            continue;
        read++;
        if ((kb = PyObject_CallMethodNoArgs(m, s_key)) == NULL ||
            (vb = PyObject_CallMethodNoArgs(m, s_value)) == NULL) {
            Py_XDECREF(kb);
            goto fail;
        }
        /* a tombstone with a key: the feeder's (it may remove the key's row) */
        int r = vb == Py_None ? (kb == Py_None ? 3 : 0) : fold_one(&f, kb, vb);
        if (r == 0) {
            PyObject *done = PyObject_CallFunctionObjArgs(slow, kb, vb, NULL);
            r = done == NULL ? -1 : 0;
            Py_XDECREF(done);
        }
        Py_DECREF(kb);
        Py_DECREF(vb);
        if (r < 0)
            goto fail;
        folded += r == 1;
        after_cut += r == 2;
    }
    layout_clear(&f.row);
    return Py_BuildValue("(nnn)", read, after_cut, folded);
fail:
    layout_clear(&f.row);
    return NULL;
}
