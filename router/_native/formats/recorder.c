/* The router side of router._native beyond the codec: one route's records of a transaction
 * (Recorder), an outbox route's events (OutboxRecorder) and runs of them (record_run). */
#include "codec.h"

/* ------------------------------------------------------------------------------------------
 * Recorder(codec, topic, head, mid, tail, fallback, lsn_header, seq_name): one route's
 * records of one relation layout in one transaction.
 *
 * recorder(op, lsn, seq, old, old_is_key, new) -> (topic, key, value, headers) with
 * headers = [lsn_header, (seq_name, b"<seq>")] (None when lsn_header is None), encoded by
 * the codec, or by
 * fallback(op, lsn, seq, old, old_is_key, new) where the codec returns None for the change
 * (router.formats.envelope.TableEncoder.recorder). The record and its headers hold only atoms and
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
    unsigned long long seq = PyLong_AsUnsignedLongLong(args[2]); /* checked by encode_change */
    PyObject *headers = seq_headers(self->lsn_header, self->seq_name, seq);
    if (headers == NULL) {
        Py_DECREF(rec);
        return NULL;
    }
    PyTuple_SET_ITEM(rec, 3, headers);
    PyObject_GC_UnTrack(rec);
    return rec;
}

static int
check_lsn_header(PyObject *lsn_header)
{
    if (lsn_header != Py_None &&
        (!PyTuple_CheckExact(lsn_header) || PyTuple_GET_SIZE(lsn_header) != 2 ||
         !PyUnicode_CheckExact(PyTuple_GET_ITEM(lsn_header, 0)) ||
         !PyBytes_CheckExact(PyTuple_GET_ITEM(lsn_header, 1)))) {
        PyErr_SetString(PyExc_TypeError, "Recorder: lsn_header is a (str, bytes) pair");
        return -1;
    }
    return 0;
}

/* both recorders' fallback (callable) and lsn_header (None or a (str, bytes) pair) */
static int
check_fallback_lsn(const char *fallback_error, PyObject *fallback, PyObject *lsn_header)
{
    if (!PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_TypeError, fallback_error);
        return -1;
    }
    return check_lsn_header(lsn_header);
}

static int
recorder_init(Recorder *self, PyObject *args, PyObject *kwds)
{
    PyObject *codec, *topic, *head, *mid, *tail, *fallback, *lsn_header, *seq_name;
    if (!PyArg_ParseTuple(args, "O!USSSOOU:Recorder", &RowCodecType, &codec, &topic, &head,
                          &mid, &tail, &fallback, &lsn_header, &seq_name))
        return -1;
    if (check_fallback_lsn("Recorder: fallback must be callable", fallback, lsn_header) < 0)
        return -1;
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

/* rebind(mid, tail, lsn_header): the same route and layout for the next transaction (a
 * recorder is made once per topic of a TableEncoder, not once per transaction) */
static PyObject *
recorder_rebind(Recorder *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyBytes_CheckExact(args[0]) || !PyBytes_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "rebind(mid: bytes, tail: bytes, lsn_header)");
        return NULL;
    }
    if (check_lsn_header(args[2]) < 0)
        return NULL;
    Py_XSETREF(self->mid, Py_NewRef(args[0]));
    Py_XSETREF(self->tail, Py_NewRef(args[1]));
    Py_XSETREF(self->lsn_header, Py_NewRef(args[2]));
    Py_RETURN_NONE;
}

static PyMethodDef recorder_methods[] = {
    FASTCALL("rebind", recorder_rebind,
     "rebind(mid, tail, lsn_header): the next transaction's source fields and position "
     "header"),
    {NULL}};

/* The fallback is a closure over the TableEncoder that caches this Recorder: a cycle, so
 * the type takes part in garbage collection. */
static int
recorder_traverse(Recorder *self, visitproc visit, void *arg)
{
    VISIT_ALL((PyObject *)self->codec, self->fallback, self->lsn_header);
    return 0;
}

static int
recorder_clear(Recorder *self)
{
    Py_CLEAR(self->codec);
    CLEAR_ALL(&self->topic, &self->head, &self->mid, &self->tail, &self->fallback,
              &self->lsn_header, &self->seq_name);
    return 0;
}

static PyTypeObject RecorderType = {
    NATIVE_TYPE("router._native.Recorder", Recorder,
                Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_HAVE_GC,
                "Recorder(codec, topic, head, mid, tail, fallback, lsn_header, seq_name)"),
    .tp_init = (initproc)recorder_init,
    .tp_dealloc = native_gc_dealloc,
    .tp_traverse = (traverseproc)recorder_traverse,
    .tp_clear = (inquiry)recorder_clear,
    .tp_call = PyVectorcall_Call,
    .tp_methods = recorder_methods,
    .tp_vectorcall_offset = offsetof(Recorder, vectorcall),
};

/* ------------------------------------------------------------------------------------------
 * OutboxRecorder(topics, one, key, payload, id, headers, lsn_header, seq_name, fallback):
 * the events of an outbox route's inserts (router.routing.outbox.PyOutboxRecorder, its twin).
 *
 * recorder(op, lsn, seq, old, old_is_key, row) -> (topic, key, value, headers) when row is a
 * tuple whose values at one, key, payload, id and the headers' indexes are str or None and
 * topics (a dict, the plan's remembered topics) holds row[one]: topic = topics[row[one]],
 * key, value = the UTF-8 of row[key], row[payload] (None for None), headers = [("id",
 * row[id]), (name, row[i]) for (name, i) in headers] then lsn_header and (seq_name,
 * b"<seq>") unless lsn_header is None. Anything else (a topic not remembered yet, a NULL
 * topic column, a text the codec cannot take) is fallback(op, lsn, seq, old, old_is_key,
 * row). The record and its headers hold only atoms: untracked by the collector, as the
 * Recorder's are (a stream of Python-made events spent a third of its time there).
 */
typedef struct {
    PyObject_HEAD
    PyObject *topics, *headers, *lsn_header, *seq_name, *fallback, *id_name;
    Py_ssize_t one, key, payload, id, width;
    vectorcallfunc vectorcall;
} OutboxRecorder;

/* the UTF-8 bytes of a str, None for None; NULL without an exception: not plain */
static PyObject *
text_bytes(PyObject *value)
{
    if (value == Py_None)
        return Py_NewRef(Py_None);
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(value, &n);
    if (s == NULL) {
        PyErr_Clear(); /* (lone surrogates) the fallback says what is wrong */
        return NULL;
    }
    return PyBytes_FromStringAndSize(s, n);
}

static PyObject *
outbox_headers(OutboxRecorder *self, PyObject *row, PyObject *seq)
{
    Py_ssize_t nh = PyTuple_GET_SIZE(self->headers), extra = self->lsn_header != Py_None;
    PyObject *headers = PyList_New(1 + nh + 2 * extra);
    if (headers == NULL)
        return NULL;
    for (Py_ssize_t h = -1; h < nh; h++) {
        PyObject *spec = h < 0 ? NULL : PyTuple_GET_ITEM(self->headers, h);
        PyObject *name = h < 0 ? self->id_name : PyTuple_GET_ITEM(spec, 0);
        Py_ssize_t at = h < 0 ? self->id : PyLong_AsSsize_t(PyTuple_GET_ITEM(spec, 1));
        PyObject *pair = native_pair(Py_NewRef(name), text_bytes(PyTuple_GET_ITEM(row, at)));
        if (pair == NULL) {
            Py_DECREF(headers);
            return NULL;
        }
        PyObject_GC_UnTrack(pair);
        PyList_SET_ITEM(headers, h + 1, pair);
    }
    if (extra) {
        unsigned long long n = PyLong_AsUnsignedLongLong(seq);
        PyObject *more = n == (unsigned long long)-1 && PyErr_Occurred()
                             ? NULL : seq_headers(self->lsn_header, self->seq_name, n);
        if (more == NULL) {
            Py_DECREF(headers);
            return NULL;
        }
        PyList_SET_ITEM(headers, 1 + nh, Py_NewRef(PyList_GET_ITEM(more, 0)));
        PyList_SET_ITEM(headers, 2 + nh, Py_NewRef(PyList_GET_ITEM(more, 1)));
        Py_DECREF(more);
    }
    PyObject_GC_UnTrack(headers);
    return headers;
}

static int
outbox_plain(OutboxRecorder *self, PyObject *row)
{
    if (!PyTuple_CheckExact(row) || PyTuple_GET_SIZE(row) < self->width)
        return 0;
    Py_ssize_t at[4] = {self->one, self->key, self->payload, self->id};
    for (int i = 0; i < 4; i++) {
        PyObject *v = PyTuple_GET_ITEM(row, at[i]);
        if (v != Py_None && !PyUnicode_CheckExact(v))
            return 0;
    }
    for (Py_ssize_t h = 0; h < PyTuple_GET_SIZE(self->headers); h++) {
        PyObject *v = PyTuple_GET_ITEM(
            row, PyLong_AsSsize_t(PyTuple_GET_ITEM(PyTuple_GET_ITEM(self->headers, h), 1)));
        if (v != Py_None && !PyUnicode_CheckExact(v))
            return 0;
    }
    return PyTuple_GET_ITEM(row, self->one) != Py_None;
}

static PyObject *
outbox_vectorcall(OutboxRecorder *self, PyObject *const *args, size_t nargsf,
                  PyObject *kwnames)
{
    if (PyVectorcall_NARGS(nargsf) != 6 || kwnames != NULL) {
        PyErr_SetString(PyExc_TypeError, "recorder(op, lsn, seq, old, old_is_key, row)");
        return NULL;
    }
    if (self->fallback == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "OutboxRecorder is not initialised");
        return NULL;
    }
    PyObject *row = args[5];
    if (!outbox_plain(self, row))
        return PyObject_Vectorcall(self->fallback, args, 6, NULL);
    PyObject *topic = PyDict_GetItemWithError(self->topics, PyTuple_GET_ITEM(row, self->one));
    if (topic == NULL) {
        if (PyErr_Occurred())
            return NULL;
        return PyObject_Vectorcall(self->fallback, args, 6, NULL);
    }
    Py_INCREF(topic);
    PyObject *key = text_bytes(PyTuple_GET_ITEM(row, self->key));
    PyObject *value = key ? text_bytes(PyTuple_GET_ITEM(row, self->payload)) : NULL;
    PyObject *headers = value ? outbox_headers(self, row, args[2]) : NULL;
    PyObject *rec = headers ? PyTuple_New(4) : NULL;
    if (rec == NULL) {
        Py_DECREF(topic);
        Py_XDECREF(key);
        Py_XDECREF(value);
        Py_XDECREF(headers);
        if (PyErr_Occurred())
            return NULL;
        return PyObject_Vectorcall(self->fallback, args, 6, NULL);
    }
    PyTuple_SET_ITEM(rec, 0, topic);
    PyTuple_SET_ITEM(rec, 1, key);
    PyTuple_SET_ITEM(rec, 2, value);
    PyTuple_SET_ITEM(rec, 3, headers);
    PyObject_GC_UnTrack(rec);
    return rec;
}

static int
outbox_init(OutboxRecorder *self, PyObject *args, PyObject *kwds)
{
    PyObject *topics, *headers, *lsn_header, *seq_name, *fallback;
    Py_ssize_t one, key, payload, id;
    if (!PyArg_ParseTuple(args, "O!nnnnO!OUO:OutboxRecorder", &PyDict_Type, &topics, &one,
                          &key, &payload, &id, &PyTuple_Type, &headers, &lsn_header,
                          &seq_name, &fallback))
        return -1;
    if (check_fallback_lsn("OutboxRecorder: fallback must be callable", fallback, lsn_header) <
        0)
        return -1;
    Py_ssize_t width = 0, at[4] = {one, key, payload, id};
    for (int i = 0; i < 4; i++) {
        if (at[i] < 0) {
            PyErr_SetString(PyExc_ValueError, "OutboxRecorder: a negative column index");
            return -1;
        }
        width = at[i] + 1 > width ? at[i] + 1 : width;
    }
    for (Py_ssize_t h = 0; h < PyTuple_GET_SIZE(headers); h++) {
        PyObject *spec = PyTuple_GET_ITEM(headers, h);
        Py_ssize_t i = -1;
        if (PyTuple_CheckExact(spec) && PyTuple_GET_SIZE(spec) == 2 &&
            PyUnicode_CheckExact(PyTuple_GET_ITEM(spec, 0)) &&
            PyLong_CheckExact(PyTuple_GET_ITEM(spec, 1)))
            i = PyLong_AsSsize_t(PyTuple_GET_ITEM(spec, 1));
        if (i < 0) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "OutboxRecorder: headers are (name, index)");
            return -1;
        }
        width = i + 1 > width ? i + 1 : width;
    }
    PyObject *id_name = PyUnicode_InternFromString("id");
    if (id_name == NULL)
        return -1;
    Py_XSETREF(self->id_name, id_name);
    Py_XSETREF(self->topics, Py_NewRef(topics));
    Py_XSETREF(self->headers, Py_NewRef(headers));
    Py_XSETREF(self->lsn_header, Py_NewRef(lsn_header));
    Py_XSETREF(self->seq_name, Py_NewRef(seq_name));
    Py_XSETREF(self->fallback, Py_NewRef(fallback));
    self->one = one, self->key = key, self->payload = payload, self->id = id;
    self->width = width;
    self->vectorcall = (vectorcallfunc)outbox_vectorcall;
    return 0;
}

static int
outbox_traverse(OutboxRecorder *self, visitproc visit, void *arg)
{
    VISIT_ALL(self->topics, self->headers, self->lsn_header, self->fallback);
    return 0;
}

static int
outbox_clear(OutboxRecorder *self)
{
    CLEAR_ALL(&self->topics, &self->headers, &self->lsn_header, &self->seq_name,
              &self->fallback, &self->id_name);
    return 0;
}

static PyTypeObject OutboxRecorderType = {
    NATIVE_TYPE("router._native.OutboxRecorder", OutboxRecorder,
                Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_HAVE_GC,
                "OutboxRecorder(topics, one, key, payload, id, headers, lsn_header, "
                "seq_name, fallback)"),
    .tp_init = (initproc)outbox_init,
    .tp_dealloc = native_gc_dealloc,
    .tp_traverse = (traverseproc)outbox_traverse,
    .tp_clear = (inquiry)outbox_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(OutboxRecorder, vectorcall),
};

/* ------------------------------------------------------------------------------------------
 * record_run(changes, i, relation, ops, kinds, seq, records, limit) -> (next, seq)
 *
 * The router's direct path (router.routing.change_router._record_run_py): from changes[i] on, while
 * the change's relation is ``relation`` and ``ops`` (op -> tuple of recorders, or None) has
 * recorders for its op, each recorder's record(kinds[op], lsn, seq, old, old_is_key, new)
 * is appended to ``records`` and seq counts up; stops after the change that fills records to
 * ``limit``.
 */
static PyObject *str_relation, *str_op, *str_lsn, *str_old, *str_old_is_key, *str_new;

static PyObject *
native_record_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (native_usage(nargs == 8 && PyList_CheckExact(args[0]) && PyDict_CheckExact(args[3]) &&
                         PyDict_CheckExact(args[4]) && PyList_CheckExact(args[6]),
                     "record_run(changes: list, i, relation, ops: dict, kinds: dict, seq, "
                     "records: list, limit)") < 0)
        return NULL;
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

static PyMethodDef records_methods[] = {
    FASTCALL("record_run", native_record_run,
     "record_run(changes, i, relation, ops, kinds, seq, records, limit) -> (next, seq)"),
    {NULL}};

int
records_setup(PyObject *module)
{
    if (PyType_Ready(&RecorderType) < 0 || PyType_Ready(&OutboxRecorderType) < 0)
        return -1;
    str_relation = PyUnicode_InternFromString("relation");
    str_op = PyUnicode_InternFromString("op");
    str_lsn = PyUnicode_InternFromString("lsn");
    str_old = PyUnicode_InternFromString("old");
    str_old_is_key = PyUnicode_InternFromString("old_is_key");
    str_new = PyUnicode_InternFromString("new");
    if (!str_relation || !str_op || !str_lsn || !str_old || !str_old_is_key || !str_new)
        return -1;
    if (PyModule_AddObjectRef(module, "Recorder", (PyObject *)&RecorderType) < 0 ||
        PyModule_AddObjectRef(module, "OutboxRecorder", (PyObject *)&OutboxRecorderType) < 0)
        return -1;
    if (tx_setup(module) < 0)
        return -1;
    return PyModule_AddFunctions(module, records_methods);
}
