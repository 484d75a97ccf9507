/* RowCodec: the JSON of one relation layout's rows, keys and change records (the C twin of
 * router.formats.envelope.TableEncoder._encode_py). */
#include "codec.h"
#include "json.h"

/* ------------------------------------------------------------------------------------------
 * RowCodec: the JSON of one relation layout's rows, keys and change records.
 */

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
    MEM_FREE_ALL(self->pick, self->kinds, self->key_pick, self->key_kinds);
    CLEAR_ALL(&self->names, &self->key_names, &self->float_json);
    Py_TYPE(self)->tp_free((PyObject *)self);
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
    if (kind != K_FLOAT)
        return out_text_value(o, kind, s, n);
    switch (kind) {
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
 * three source parts are the envelope around lsn and seq, made by router.formats.envelope (head per
 * table, mid and tail per transaction). Not the plain case: an unchanged-TOAST column in
 * the new row, binary values, anything else the Python path must encode. */
int
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
    return native_pair(key, value);
}

static PyMethodDef rowcodec_methods[] = {
    FASTCALL("row", rowcodec_row,
     "row(values, skip_nulls=False) -> bytes | None: the row object's JSON"),
    {"key", (PyCFunction)rowcodec_key, METH_O, "key(values) -> bytes | None: the key's JSON"},
    FASTCALL("change", rowcodec_change,
     "change(op, source_head, source_mid, source_tail, lsn, seq, old, old_is_key, new) "
     "-> (key, value) | None"),
    {NULL}};

PyTypeObject RowCodecType = {
    NATIVE_TYPE("router._native.RowCodec", RowCodec, Py_TPFLAGS_DEFAULT,
                "RowCodec(width, pick, names, kinds, key_pick, key_names, key_kinds, "
                "float_json)"),
    .tp_init = (initproc)rowcodec_init,
    .tp_dealloc = (destructor)rowcodec_dealloc,
    .tp_methods = rowcodec_methods,
};

int
codec_setup(PyObject *module)
{
    if (PyType_Ready(&RowCodecType) < 0)
        return -1;
    return PyModule_AddObjectRef(module, "RowCodec", (PyObject *)&RowCodecType);
}
