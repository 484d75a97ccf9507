/* verify_fold: a batch of a JSON-format topic's messages folded by ``pgrouter verify`` with
 * bucket digests (its Python twin: router.verify.digests:fold_batch_py, whose docstring holds
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
#include "verify.h"

/* the layout of the last row: its names sorted, as a tuple and as JSON (head) */
typedef struct {
    PyObject *names, *head;
    char *joined; /* the sorted names, each followed by a NUL */
    size_t jlen;
} Layout;

static void
layout_clear(Layout *l)
{
    CLEAR_ALL(&l->names, &l->head);
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

/* msgspec's JSON of the key (router.verify.fold.key_of: names sorted) as new bytes (``kb``
 * itself when it is already that JSON, as the router writes it); None (a new reference) when
 * not the plain case (a float in the key) */
static PyObject *
key_bytes(Fold *f, Py_ssize_t n, PyObject *kb)
{
    Buf b;
    buf_init(&b, 0);
    PyObject *out = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        Member *m = f->ksorted[i];
        if (m->kind == 'f') {
            out = Py_NewRef(Py_None);
            goto done;
        }
        if (buf_need(&b, m->nlen + 4) < 0)
            goto done;
        b.p[b.len++] = i ? ',' : '{';
        b.p[b.len++] = '"';
        memcpy(b.p + b.len, m->name, m->nlen);
        b.len += m->nlen;
        b.p[b.len++] = '"';
        b.p[b.len++] = ':';
        if (json_value(&b, f->key.texts.p + m->start, m->len, m->null, m->kind == 's') < 0)
            goto done;
    }
    if (buf_need(&b, 2) < 0)
        goto done;
    if (n == 0)
        b.p[b.len++] = '{';
    b.p[b.len++] = '}';
    if (PyBytes_CheckExact(kb) && (size_t)PyBytes_GET_SIZE(kb) == b.len &&
        memcmp(PyBytes_AS_STRING(kb), b.p, b.len) == 0)
        out = Py_NewRef(kb);
    else
        out = PyBytes_FromStringAndSize(b.p, (Py_ssize_t)b.len);
done:
    buf_free(&b);
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

/* Python's hash of a text (router.verify.digests.row_digests_py hashes the str) */
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

/* the digests of the scanned row (verify_row's layout: a hash per column, the key's bucket,
 * the row's digest) as new bytes */
static PyObject *
scanned_digests(Fold *f, Py_ssize_t n, Py_ssize_t nk)
{
    Digests d;
    if (digests_start(&d, n) < 0)
        return NULL;
    int bad = 0;
    for (Py_ssize_t i = 0; i < nk && !bad; i++) {
        Member *m = f->ksorted[i];
        bad = key_part(&d.key, i == 0, f->key.texts.p + m->start, m->len, m->null,
                       m->kind == 's');
    }
    for (Py_ssize_t i = 0; i < n && !bad; i++) {
        Member *m = f->sorted[i];
        const char *t = f->after.texts.p + m->start;
        Py_hash_t h = m->null ? PyObject_Hash(Py_None) : text_hash(t, m->len);
        /* an int, a bool, a float: its JSON type in the digests */
        d.digests[i] = (int64_t)(m->null || m->kind == 's' ? h : h ^ VERIFY_RAW_SALT);
        bad = h == -1 ? -1 : row_part(&d.row, i == 0, t, m->len, m->null, m->kind == 's');
    }
    return digests_finish(&d, bad, PyBytes_AS_STRING(f->row.head),
                          (size_t)PyBytes_GET_SIZE(f->row.head), (uint64_t)f->buckets);
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
    if ((k = key_bytes(f, nk, kb)) == NULL) {
        res = -1;
        goto done;
    }
    if (k == Py_None)
        goto done;
    /* from here on the message is folded (1) or an error (-1) */
    res = -1;
    unsigned char bytes[16]; /* (lsn << 64) | seq, little-endian */
    for (int i = 0; i < 8; i++) {
        bytes[i] = (unsigned char)(seq >> (8 * i));
        bytes[8 + i] = (unsigned char)(lsn >> (8 * i));
    }
    pos = _PyLong_FromByteArray(bytes, 16, 1, 0);
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

/* a message type's methods, looked up once a batch (not once a message) */
typedef struct {
    PyTypeObject *type;
    PyObject *error, *partition, *offset, *key, *value;
} Methods;

static void
methods_clear(Methods *c)
{
    CLEAR_ALL(&c->error, &c->partition, &c->offset, &c->key, &c->value);
    c->type = NULL;
}

static int
methods_of(Methods *c, PyTypeObject *type)
{
    methods_clear(c);
    PyObject **at[] = {&c->error, &c->partition, &c->offset, &c->key, &c->value};
    const char *names[] = {"error", "partition", "offset", "key", "value"};
    for (int i = 0; i < 5; i++)
        if ((*at[i] = PyObject_GetAttrString((PyObject *)type, names[i])) == NULL)
            return methods_clear(c), -1;
    c->type = type;
    return 0;
}

/* m.<method>() through the type's descriptor */
static inline PyObject *
call(PyObject *method, PyObject *m)
{
    return PyObject_Vectorcall(method, &m, 1, NULL);
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
    Methods calls = {NULL};
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(msgs); i++) {
        PyObject *m = PyList_GET_ITEM(msgs, i), *kb = NULL, *vb = NULL;
        if (Py_TYPE(m) != calls.type && methods_of(&calls, Py_TYPE(m)) < 0)
            goto fail;
        PyObject *err = call(calls.error, m);
        if (err == NULL)
            goto fail;
        int skip = err != Py_None;
        Py_DECREF(err);
        if (skip)
            continue;
        PyObject *part = call(calls.partition, m);
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
        PyObject *off = call(calls.offset, m);
        int before_end = off == NULL ? -1 : PyObject_RichCompareBool(off, end, Py_LT);
        Py_XDECREF(off);
        Py_DECREF(end);
        if (before_end < 0)
            goto fail;
        if (!before_end)
            continue;
        read++;
        if ((kb = call(calls.key, m)) == NULL || (vb = call(calls.value, m)) == NULL) {
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
    methods_clear(&calls);
    layout_clear(&f.row);
    return Py_BuildValue("(nnn)", read, after_cut, folded);
fail:
    methods_clear(&calls);
    layout_clear(&f.row);
    return NULL;
}
