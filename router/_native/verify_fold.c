/* verify_fold: a batch of a JSON-format topic's messages folded by ``pgrouter verify`` with
 * bucket digests (its Python twin: router.verify_digest:fold_batch_py, whose docstring holds
 * the rules).
 *
 * verify_fold(msgs, ends, rows, cut, buckets, tools) -> (read, after_cut, folded)
 *
 *   msgs     confluent-kafka Messages (error(), partition(), offset(), key(), value())
 *   ends     partition -> end offset: messages at or past it are not read
 *   rows     the fold's dict: key bytes -> (position, (names, digests))
 *   tools    (decode_change, decode_key, encode_key, layout_of, slow, row_py)
 *
 * A message is folded here only in the plain case: a change record ``c``/``r``/``u`` with a
 * key, a source, ``after``, no ``before`` and no ``unchanged_toast``, a key that decodes to
 * a dict. Anything else (and any error decoding it) goes to ``slow(key, value)``, the Python
 * feeder, which folds it or raises the precise error; values that are not JSON scalars get
 * their digests from ``row_py`` (router.verify_digest.row_digests_py).
 */
#include "native.h"

static PyObject *s_error, *s_partition, *s_offset, *s_key, *s_value, *s_op, *s_source,
    *s_after, *s_before, *s_toast, *s_lsn, *s_seq, *sixty_four;

#define FOLD_MAX_COLUMNS 1664

int
fold_setup(void)
{
    struct {
        PyObject **at;
        const char *name;
    } names[] = {{&s_error, "error"},   {&s_partition, "partition"},
                 {&s_offset, "offset"}, {&s_key, "key"},
                 {&s_value, "value"},   {&s_op, "op"},
                 {&s_source, "source"}, {&s_after, "after"},
                 {&s_before, "before"}, {&s_toast, "unchanged_toast"},
                 {&s_lsn, "commit_lsn"}, {&s_seq, "seq"}};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if ((*names[i].at = PyUnicode_InternFromString(names[i].name)) == NULL)
            return -1;
    sixty_four = PyLong_FromLong(64);
    return sixty_four == NULL ? -1 : 0;
}

/* a column layout: the names in the record's order (cols), sorted (names), the JSON of the
 * sorted names (head), and for each sorted name its index in the record (order) */
typedef struct {
    PyObject *cols, *names, *head;
    Py_ssize_t n;
    Py_ssize_t order[FOLD_MAX_COLUMNS];
} Layout;

static void
layout_clear(Layout *l)
{
    Py_CLEAR(l->cols);
    Py_CLEAR(l->names);
    Py_CLEAR(l->head);
    l->n = -1;
}

/* the dict's values in its layout's sorted order into out (1), not the plain case (0: more
 * columns than FOLD_MAX_COLUMNS, a layout_of that answers oddly), error (-1) */
static int
sorted_values(PyObject *d, Layout *l, PyObject *layout_of, PyObject **out)
{
    Py_ssize_t n = PyDict_GET_SIZE(d), pos = 0, j = 0;
    PyObject *k, *v, *vals[FOLD_MAX_COLUMNS];
    if (n > FOLD_MAX_COLUMNS)
        return 0;
    int same = l->n == n;
    while (PyDict_Next(d, &pos, &k, &v)) {
        vals[j] = v;
        if (same) {
            PyObject *c = PyTuple_GET_ITEM(l->cols, j);
            if (c != k && !(PyUnicode_CheckExact(k) && PyUnicode_Compare(c, k) == 0)) {
                if (PyErr_Occurred())
                    return -1;
                same = 0;
            }
        }
        j++;
    }
    if (!same) {
        layout_clear(l);
        PyObject *cols = PyTuple_New(n), *got = NULL;
        if (cols == NULL)
            return -1;
        pos = 0, j = 0;
        while (PyDict_Next(d, &pos, &k, &v))
            PyTuple_SET_ITEM(cols, j++, Py_NewRef(k));
        got = PyObject_CallOneArg(layout_of, cols);
        if (got == NULL) {
            Py_DECREF(cols);
            return -1;
        }
        if (!PyTuple_Check(got) || PyTuple_GET_SIZE(got) != 3 ||
            !PyTuple_Check(PyTuple_GET_ITEM(got, 2)) ||
            !PyBytes_Check(PyTuple_GET_ITEM(got, 1)) ||
            PyTuple_GET_SIZE(PyTuple_GET_ITEM(got, 2)) != n) {
            Py_DECREF(cols);
            Py_DECREF(got);
            return 0;
        }
        PyObject *order = PyTuple_GET_ITEM(got, 2);
        for (j = 0; j < n; j++) {
            Py_ssize_t o = PyLong_AsSsize_t(PyTuple_GET_ITEM(order, j));
            if (o < 0 || o >= n) {
                Py_DECREF(cols);
                Py_DECREF(got);
                if (PyErr_Occurred())
                    return -1;
                return 0;
            }
            l->order[j] = o;
        }
        l->cols = cols;
        l->names = Py_NewRef(PyTuple_GET_ITEM(got, 0));
        l->head = Py_NewRef(PyTuple_GET_ITEM(got, 1));
        l->n = n;
        Py_DECREF(got);
    }
    for (j = 0; j < n; j++)
        out[j] = vals[l->order[j]];
    return 1;
}

/* an attribute's value as an unsigned 64-bit integer, None as 0 (0; 1 not the plain case) */
static int
u64_of(PyObject *obj, PyObject *name, unsigned long long *out)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL)
        return PyErr_Clear(), 1;
    if (v == Py_None) {
        *out = 0;
    } else if (PyLong_CheckExact(v)) {
        *out = PyLong_AsUnsignedLongLong(v);
        if (PyErr_Occurred()) {
            Py_DECREF(v);
            return PyErr_Clear(), 1;
        }
    } else {
        Py_DECREF(v);
        return 1;
    }
    Py_DECREF(v);
    return 0;
}

typedef struct {
    PyObject *rows, *decode_change, *decode_key, *encode_key, *layout_of, *row_py;
    unsigned long long cut;
    long long buckets;
    Layout row, key;
} Fold;

/* one message's key and value: folded (1), at or past the cut (2), not the plain case (0:
 * nothing done), error (-1) */
static int
fold_one(Fold *f, PyObject *kb, PyObject *vb)
{
    int res = 0;
    PyObject *c = NULL, *op = NULL, *src = NULL, *after = NULL, *before = NULL, *toast = NULL,
             *key = NULL, *k = NULL, *pos = NULL, *digests = NULL;
    if (kb == Py_None)
        return 0;
    c = PyObject_CallOneArg(f->decode_change, vb);
    if (c == NULL)
        return PyErr_Clear(), 0; /* the slow way decodes it again and says why */
    if ((op = PyObject_GetAttr(c, s_op)) == NULL || (src = PyObject_GetAttr(c, s_source)) == NULL ||
        (after = PyObject_GetAttr(c, s_after)) == NULL ||
        (before = PyObject_GetAttr(c, s_before)) == NULL ||
        (toast = PyObject_GetAttr(c, s_toast)) == NULL) {
        PyErr_Clear();
        goto done;
    }
    if (!PyUnicode_CheckExact(op) || PyUnicode_GET_LENGTH(op) != 1)
        goto done;
    Py_UCS4 o = PyUnicode_READ_CHAR(op, 0);
    if ((o != 'c' && o != 'r' && o != 'u') || src == Py_None || !PyDict_CheckExact(after) ||
        before != Py_None)
        goto done;
    int t = PyObject_IsTrue(toast);
    if (t != 0) {
        if (t < 0)
            PyErr_Clear();
        goto done;
    }
    unsigned long long lsn, seq;
    if (u64_of(src, s_lsn, &lsn) || u64_of(src, s_seq, &seq))
        goto done;
    if (lsn >= f->cut) {
        res = 2;
        goto done;
    }
    key = PyObject_CallOneArg(f->decode_key, kb);
    if (key == NULL) {
        PyErr_Clear();
        goto done;
    }
    if (!PyDict_CheckExact(key))
        goto done;
    PyObject *vals[FOLD_MAX_COLUMNS], *kvals[FOLD_MAX_COLUMNS];
    int got = sorted_values(after, &f->row, f->layout_of, vals);
    if (got <= 0) {
        res = got;
        goto done;
    }
    got = sorted_values(key, &f->key, f->layout_of, kvals);
    if (got <= 0) {
        res = got;
        goto done;
    }
    /* from here on the message is folded (1) or an error (-1) */
    res = -1;
    if ((k = PyObject_CallOneArg(f->encode_key, key)) == NULL)
        goto done;
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
    Py_ssize_t n = f->row.n, nk = f->key.n;
    digests = row_digests(kvals, nk, PyBytes_AS_STRING(f->row.head),
                          PyBytes_GET_SIZE(f->row.head), vals, n, f->buckets);
    if (digests == Py_None) { /* a value that is not a JSON scalar: the twin renders it */
        Py_DECREF(digests);
        PyObject *kt = PyTuple_New(nk), *vt = PyTuple_New(n), *nb = NULL;
        if (kt != NULL && vt != NULL && (nb = PyLong_FromLongLong(f->buckets)) != NULL) {
            for (Py_ssize_t i = 0; i < nk; i++)
                PyTuple_SET_ITEM(kt, i, Py_NewRef(kvals[i]));
            for (Py_ssize_t i = 0; i < n; i++)
                PyTuple_SET_ITEM(vt, i, Py_NewRef(vals[i]));
            digests = PyObject_CallFunctionObjArgs(f->row_py, kt, f->row.head, vt, nb, NULL);
        } else {
            digests = NULL;
        }
        Py_XDECREF(kt);
        Py_XDECREF(vt);
        Py_XDECREF(nb);
    }
    if (digests == NULL)
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
    Py_XDECREF(c);
    Py_XDECREF(op);
    Py_XDECREF(src);
    Py_XDECREF(after);
    Py_XDECREF(before);
    Py_XDECREF(toast);
    Py_XDECREF(key);
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
    Fold f = {.rows = args[2],
              .decode_change = PyTuple_GET_ITEM(tools, 0),
              .decode_key = PyTuple_GET_ITEM(tools, 1),
              .encode_key = PyTuple_GET_ITEM(tools, 2),
              .layout_of = PyTuple_GET_ITEM(tools, 3),
              .row_py = PyTuple_GET_ITEM(tools, 5)};
    f.row.n = f.key.n = -1;
    f.row.cols = f.row.names = f.row.head = f.key.cols = f.key.names = f.key.head = NULL;
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
        int r = vb == Py_None ? 3 : fold_one(&f, kb, vb);
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
    layout_clear(&f.key);
    return Py_BuildValue("(nnn)", read, after_cut, folded);
fail:
    layout_clear(&f.row);
    layout_clear(&f.key);
    return NULL;
}
