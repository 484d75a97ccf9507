/* The Kafka side of router._native: confluent-kafka's produce loop (hand_over) and the
 * delivery callback that counts a batch's acknowledgements (Tally). */
#include "../native.h"

/* ------------------------------------------------------------------------------------------
 * Tally(count, on_done, ticket): the delivery callback of one batch of records.
 *
 * Called as tally(err, msg) once per record from the Kafka client's thread (librdkafka's
 * delivery callback), or tally.ack(metadata) / tally.fail(exc) (kafka-python's). Calls
 * on_done(ticket, None, count) once when every record was acknowledged, or
 * on_done(ticket, err, 0) at the first failure (and nothing after that). A failure reported
 * with its record (tally(err, msg), librdkafka's) is held until every record of the batch is
 * reported; then on_done(ticket, err, 0, msg) names the largest record that failed (len(msg)),
 * so a batch the broker refused because of one record names that record. A Tally of count 0
 * (never made by the clients: they hand over at least one record) fires at its first call.
 */
typedef struct {
    PyObject_HEAD
    Py_ssize_t count, left, failed_size;
    int fired;
    PyObject *on_done, *ticket, *failed_err, *failed_msg;
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
    self->failed_size = -1;
    Py_CLEAR(self->failed_err);
    Py_CLEAR(self->failed_msg);
    Py_XSETREF(self->on_done, Py_NewRef(on_done));
    Py_XSETREF(self->ticket, Py_NewRef(ticket));
    return 0;
}

static int
tally_traverse(Tally *self, visitproc visit, void *arg)
{
    VISIT_ALL(self->on_done, self->ticket, self->failed_err, self->failed_msg);
    return 0;
}

static int
tally_clear(Tally *self)
{
    CLEAR_ALL(&self->on_done, &self->ticket, &self->failed_err, &self->failed_msg);
    return 0;
}

/* len(msg) (confluent-kafka's Message: the value's length); 0 for anything without one */
static Py_ssize_t
message_size(PyObject *msg)
{
    Py_ssize_t size = PyObject_Size(msg);
    if (size < 0) {
        if (!PyErr_ExceptionMatches(PyExc_TypeError))
            return -1;
        PyErr_Clear();
        return 0;
    }
    return size;
}

/* the final report: the largest failed record when one was held, else every record acked */
static PyObject *
tally_fire(Tally *self)
{
    self->fired = 1;
    if (self->failed_msg != NULL)
        return PyObject_CallFunction(self->on_done, "OOnO", self->ticket, self->failed_err,
                                     (Py_ssize_t)0, self->failed_msg);
    return PyObject_CallFunction(self->on_done, "OOn", self->ticket, Py_None, self->count);
}

static PyObject *
tally_call(Tally *self, PyObject *args, PyObject *kwds)
{
    PyObject *err = Py_None, *msg = Py_None;
    if (!PyArg_UnpackTuple(args, "Tally", 1, 2, &err, &msg))
        return NULL;
    if (self->fired || self->on_done == NULL)
        Py_RETURN_NONE;
    if (err != Py_None && msg == Py_None) {
        self->fired = 1;
        return PyObject_CallFunction(self->on_done, "OOn", self->ticket, err, (Py_ssize_t)0);
    }
    if (err != Py_None) { /* held: the largest failed record is reported at the end */
        Py_ssize_t size = message_size(msg);
        if (size < 0)
            return NULL;
        if (self->failed_msg == NULL || size > self->failed_size) {
            Py_XSETREF(self->failed_err, Py_NewRef(err));
            Py_XSETREF(self->failed_msg, Py_NewRef(msg));
            self->failed_size = size;
        }
    }
    if (--self->left > 0)
        Py_RETURN_NONE;
    return tally_fire(self);
}

/* kafka-python's future callbacks: ack(metadata) per acknowledged record, fail(exc) */
static PyObject *
tally_ack(Tally *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (self->fired || self->on_done == NULL)
        Py_RETURN_NONE;
    if (--self->left > 0)
        Py_RETURN_NONE;
    return tally_fire(self);
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
    FASTCALL("ack", tally_ack,
     "ack(*ignored): one record acknowledged"),
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
    NATIVE_TYPE("router._native.Tally", Tally, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
                "Tally(count, on_done, ticket): one batch's delivery callback"),
    .tp_traverse = (traverseproc)tally_traverse,
    .tp_clear = (inquiry)tally_clear,
    .tp_init = (initproc)tally_init,
    .tp_dealloc = native_gc_dealloc,
    .tp_call = (ternaryfunc)tally_call,
    .tp_methods = tally_methods,
    .tp_getset = tally_getset,
};

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

static PyMethodDef delivery_methods[] = {
    FASTCALL("hand_over", native_hand_over,
     "hand_over(produce, records, start, on_delivery) -> index of the first record not "
     "handed over (BufferError), len(records) when all were"),
    {NULL}};

int
delivery_setup(PyObject *module)
{
    if (PyType_Ready(&TallyType) < 0 ||
        PyModule_AddObjectRef(module, "Tally", (PyObject *)&TallyType) < 0)
        return -1;
    return PyModule_AddFunctions(module, delivery_methods);
}
