/* actors.kafka._producer: librdkafka's producer driven from C, for records that come packed
 * (router.snapshot.rows.RecordBlock: every record's key and value back to back in one bytes
 * object, three 64-bit offsets a record). The per-record work — headers, produce, delivery
 * report — runs without the interpreter lock and makes no Python object; Python sees one
 * call per batch and one report per batch (actors.kafka.native_producer).
 *
 * librdkafka is the library confluent-kafka already loaded into the process: load(path)
 * opens it by its path and looks up the few functions used here. Their declarations below
 * are librdkafka's public, stable C API (rdkafka.h: rd_kafka_message_t's layout and the
 * RD_KAFKA_VTYPE_* numbering have been fixed since 0.11; producev, headers since 0.11.4).
 *
 * Producer(conf: dict[str, str]): a producer of its own (rd_kafka_new), with the conf as
 * given; its log lines are dropped (failures reach the caller as delivery reports).
 *   produce(blocks, on_done) -> None | (err, reason, index): every record of the blocks
 *     (RecordBlock-like objects: topic, data, offsets, lsn_header, seq_name, first_seq)
 *     handed to librdkafka (values not copied: the call's report holds the blocks until
 *     every record is reported; keys and headers are copied), waiting for room when its queue
 *     is full. on_done(failure, count) is called once, from a thread serving delivery
 *     reports (poll, flush, or produce itself while it waits for room), when every record
 *     handed over is reported: failure None (all acknowledged) or (err, reason, topic, key,
 *     value) of the largest record that failed. A record librdkafka refuses at once (too
 *     large, a fatal producer error) stops the hand-over there and is returned: (err,
 *     reason, its index among all the blocks' records); on_done then reports failure too.
 *   poll(timeout) -> int, flush(timeout) -> int (records still queued), close().
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "../../router/_native/pyrefs.h"

/* ---- the librdkafka API used (rdkafka.h) ---------------------------------------------- */
typedef struct rd_kafka_s rd_kafka_t;
typedef struct rd_kafka_conf_s rd_kafka_conf_t;
typedef struct rd_kafka_topic_s rd_kafka_topic_t;
typedef struct rd_kafka_headers_s rd_kafka_headers_t;
typedef struct {
    int err;
    rd_kafka_topic_t *rkt;
    int32_t partition;
    void *payload;
    size_t len;
    void *key;
    size_t key_len;
    int64_t offset;
    void *_private;
} rd_kafka_message_t;

enum { V_END = 0, V_TOPIC = 1, V_VALUE = 4, V_KEY = 5, V_OPAQUE = 6, V_MSGFLAGS = 7,
       V_HEADERS = 10 };
enum { RD_KAFKA_PRODUCER = 0, MSG_F_NONE = 0, CONF_OK = 0 };
enum { ERR_QUEUE_FULL = -184, ERR_FATAL = -150 };

typedef void (*dr_cb_t)(rd_kafka_t *, const rd_kafka_message_t *, void *);
typedef void (*log_cb_t)(const rd_kafka_t *, int, const char *, const char *);

static struct {
    int loaded;
    rd_kafka_conf_t *(*conf_new)(void);
    int (*conf_set)(rd_kafka_conf_t *, const char *, const char *, char *, size_t);
    void (*conf_destroy)(rd_kafka_conf_t *);
    void (*conf_set_dr_msg_cb)(rd_kafka_conf_t *, dr_cb_t);
    void (*conf_set_log_cb)(rd_kafka_conf_t *, log_cb_t);
    rd_kafka_t *(*new_)(int, rd_kafka_conf_t *, char *, size_t);
    void (*destroy)(rd_kafka_t *);
    int (*producev)(rd_kafka_t *, ...);
    rd_kafka_headers_t *(*headers_new)(size_t);
    int (*header_add)(rd_kafka_headers_t *, const char *, ssize_t, const void *, ssize_t);
    void (*headers_destroy)(rd_kafka_headers_t *);
    int (*poll)(rd_kafka_t *, int);
    int (*flush)(rd_kafka_t *, int);
    int (*outq_len)(rd_kafka_t *);
    const char *(*err2str)(int);
    const char *(*topic_name)(const rd_kafka_topic_t *);
    int (*fatal_error)(rd_kafka_t *, char *, size_t);
    int (*purge)(rd_kafka_t *, int);
} R;

static PyObject *
load(PyObject *self, PyObject *arg)
{
    const char *path = PyUnicode_AsUTF8(arg);
    if (path == NULL)
        return NULL;
    if (R.loaded)
        Py_RETURN_NONE;
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        PyErr_Format(PyExc_OSError, "cannot open librdkafka at %s: %s", path, dlerror());
        return NULL;
    }
#define SYM(field, name)                                                                   \
    if ((*(void **)&R.field = dlsym(lib, name)) == NULL) {                                 \
        PyErr_Format(PyExc_OSError, "librdkafka at %s has no %s", path, name);             \
        return NULL;                                                                       \
    }
    SYM(conf_new, "rd_kafka_conf_new")
    SYM(conf_set, "rd_kafka_conf_set")
    SYM(conf_destroy, "rd_kafka_conf_destroy")
    SYM(conf_set_dr_msg_cb, "rd_kafka_conf_set_dr_msg_cb")
    SYM(conf_set_log_cb, "rd_kafka_conf_set_log_cb")
    SYM(new_, "rd_kafka_new")
    SYM(destroy, "rd_kafka_destroy")
    SYM(producev, "rd_kafka_producev")
    SYM(headers_new, "rd_kafka_headers_new")
    SYM(header_add, "rd_kafka_header_add")
    SYM(headers_destroy, "rd_kafka_headers_destroy")
    SYM(poll, "rd_kafka_poll")
    SYM(flush, "rd_kafka_flush")
    SYM(outq_len, "rd_kafka_outq_len")
    SYM(err2str, "rd_kafka_err2str")
    SYM(topic_name, "rd_kafka_topic_name")
    SYM(fatal_error, "rd_kafka_fatal_error")
    SYM(purge, "rd_kafka_purge")
#undef SYM
    R.loaded = 1; /* the library stays open for the process's life */
    Py_RETURN_NONE;
}

/* ---- one produce call's records in flight ---------------------------------------------- */
typedef struct {
    Py_ssize_t left;  /* reports awaited, plus one while the hand-over runs (atomic) */
    Py_ssize_t count; /* records handed over */
    pthread_mutex_t lock; /* the failure below */
    int err;
    char *reason, *topic, *key, *value; /* malloc'd copies; reason may stay NULL */
    size_t key_len, value_len;
    int failed_size_known;
    PyObject *on_done;
    PyObject *blocks; /* the values librdkafka points into, held until every report */
} Flight;

static void
flight_free(Flight *f)
{
    FREE_ALL(f->reason, f->topic, f->key, f->value);
    pthread_mutex_destroy(&f->lock);
    free(f);
}

static char *
dup_mem(const void *p, size_t n)
{
    char *c = malloc(n ? n : 1);
    if (c != NULL && n)
        memcpy(c, p, n);
    return c;
}

/* the first failure, then any larger failed record (the one a size limit names) */
static void
flight_fail(Flight *f, int err, const char *reason, const char *topic, const void *key,
            size_t key_len, const void *value, size_t value_len)
{
    pthread_mutex_lock(&f->lock);
    if (f->err == 0 || key_len + value_len > f->key_len + f->value_len) {
        free(f->reason);
        free(f->topic);
        free(f->key);
        free(f->value);
        f->err = err;
        f->reason = reason ? dup_mem(reason, strlen(reason) + 1) : NULL;
        f->topic = dup_mem(topic ? topic : "", topic ? strlen(topic) + 1 : 1);
        f->key = dup_mem(key, key_len);
        f->value = dup_mem(value, value_len);
        f->key_len = f->key ? key_len : 0;
        f->value_len = f->value ? value_len : 0;
    }
    pthread_mutex_unlock(&f->lock);
}

/* every report in: on_done(failure, count) with the interpreter lock, then freed. Called
 * by whichever thread brought ``left`` to zero, without the lock held. */
static void
flight_done(Flight *f)
{
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *failure;
    if (f->err == 0)
        failure = Py_NewRef(Py_None);
    else
        failure = Py_BuildValue("(isNy#y#)", f->err,
                                f->reason ? f->reason : R.err2str(f->err),
                                PyUnicode_DecodeUTF8(f->topic, strlen(f->topic), "replace"),
                                f->key ? f->key : "", (Py_ssize_t)f->key_len,
                                f->value ? f->value : "", (Py_ssize_t)f->value_len);
    PyObject *res = failure ? PyObject_CallFunction(f->on_done, "On", failure, f->count)
                            : NULL;
    if (res == NULL)
        PyErr_WriteUnraisable(f->on_done);
    Py_XDECREF(res);
    Py_XDECREF(failure);
    Py_DECREF(f->on_done);
    Py_DECREF(f->blocks);
    flight_free(f);
    PyGILState_Release(g);
}

static void
flight_release(Flight *f, Py_ssize_t n)
{
    if (__atomic_sub_fetch(&f->left, n, __ATOMIC_ACQ_REL) == 0)
        flight_done(f);
}

static void
on_report(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    Flight *f = m->_private;
    if (f == NULL)
        return;
    if (m->err)
        flight_fail(f, m->err, NULL, R.topic_name(m->rkt), m->key, m->key_len, m->payload,
                    m->len);
    flight_release(f, 1);
}

static void
no_log(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
}

/* ---- Producer ---------------------------------------------------------------------------- */
typedef struct {
    PyObject_HEAD
    rd_kafka_t *rk;
} Producer;

static int
producer_init(Producer *self, PyObject *args, PyObject *kwds)
{
    PyObject *conf;
    char errstr[512];
    if (!PyArg_ParseTuple(args, "O!:Producer", &PyDict_Type, &conf))
        return -1;
    if (!R.loaded) {
        PyErr_SetString(PyExc_RuntimeError, "Producer: librdkafka is not loaded (load)");
        return -1;
    }
    if (self->rk != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Producer: already made");
        return -1;
    }
    rd_kafka_conf_t *c = R.conf_new();
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    while (PyDict_Next(conf, &pos, &k, &v)) {
        const char *name = PyUnicode_AsUTF8(k), *value = PyUnicode_AsUTF8(v);
        if (name == NULL || value == NULL) {
            R.conf_destroy(c);
            return -1;
        }
        if (R.conf_set(c, name, value, errstr, sizeof(errstr)) != CONF_OK) {
            R.conf_destroy(c);
            PyErr_Format(PyExc_ValueError, "%s", errstr);
            return -1;
        }
    }
    R.conf_set_dr_msg_cb(c, on_report);
    R.conf_set_log_cb(c, no_log);
    self->rk = R.new_(RD_KAFKA_PRODUCER, c, errstr, sizeof(errstr));
    if (self->rk == NULL) {
        R.conf_destroy(c);
        PyErr_Format(PyExc_ValueError, "%s", errstr);
        return -1;
    }
    return 0;
}

static int
ready(Producer *self)
{
    if (self->rk == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Producer is closed");
        return 0;
    }
    return 1;
}

/* what produce reads of one block, taken with the interpreter lock */
typedef struct {
    const char *topic, *data, *lsn_name, *lsn_value, *seq_name;
    const int64_t *at;
    Py_ssize_t rows, lsn_len;
    unsigned long long first_seq;
} Block;

static int
block_of(PyObject *obj, Block *b)
{
    PyObject *topic = NULL, *data = NULL, *offsets = NULL, *lsn = NULL, *seq = NULL,
             *first = NULL;
    int ok = 0;
    topic = PyObject_GetAttrString(obj, "topic");
    data = topic ? PyObject_GetAttrString(obj, "data") : NULL;
    offsets = data ? PyObject_GetAttrString(obj, "offsets") : NULL;
    lsn = offsets ? PyObject_GetAttrString(obj, "lsn_header") : NULL;
    seq = lsn ? PyObject_GetAttrString(obj, "seq_name") : NULL;
    first = seq ? PyObject_GetAttrString(obj, "first_seq") : NULL;
    if (first == NULL)
        goto done;
    if (!PyUnicode_CheckExact(topic) || !PyBytes_CheckExact(data) ||
        !PyBytes_CheckExact(offsets) || PyBytes_GET_SIZE(offsets) % 24 ||
        !PyUnicode_CheckExact(seq)) {
        PyErr_SetString(PyExc_TypeError, "produce: a block is (topic: str, data: bytes, "
                        "offsets: bytes, lsn_header, seq_name: str, first_seq: int)");
        goto done;
    }
    /* the strings live as long as their objects, which the block holds */
    b->topic = PyUnicode_AsUTF8(topic);
    b->seq_name = b->topic ? PyUnicode_AsUTF8(seq) : NULL;
    if (b->seq_name == NULL)
        goto done;
    b->data = PyBytes_AS_STRING(data);
    b->at = (const int64_t *)PyBytes_AS_STRING(offsets);
    b->rows = PyBytes_GET_SIZE(offsets) / 24;
    b->first_seq = PyLong_AsUnsignedLongLong(first);
    if (PyErr_Occurred())
        goto done;
    b->lsn_name = b->lsn_value = NULL;
    b->lsn_len = 0;
    if (lsn != Py_None) {
        if (!PyTuple_CheckExact(lsn) || PyTuple_GET_SIZE(lsn) != 2 ||
            !PyUnicode_CheckExact(PyTuple_GET_ITEM(lsn, 0)) ||
            !PyBytes_CheckExact(PyTuple_GET_ITEM(lsn, 1))) {
            PyErr_SetString(PyExc_TypeError, "produce: lsn_header is a (str, bytes) pair");
            goto done;
        }
        b->lsn_name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(lsn, 0));
        if (b->lsn_name == NULL)
            goto done;
        b->lsn_value = PyBytes_AS_STRING(PyTuple_GET_ITEM(lsn, 1));
        b->lsn_len = PyBytes_GET_SIZE(PyTuple_GET_ITEM(lsn, 1));
    }
    for (Py_ssize_t i = 0; i < b->rows; i++) {
        const int64_t *a = b->at + 3 * i;
        if (a[0] < 0 || a[0] > a[1] || a[1] > a[2] || a[2] > PyBytes_GET_SIZE(data)) {
            PyErr_SetString(PyExc_ValueError, "produce: a block's offsets leave its data");
            goto done;
        }
    }
    ok = 1;
done:
    Py_XDECREF(topic);
    Py_XDECREF(data);
    Py_XDECREF(offsets);
    Py_XDECREF(lsn);
    Py_XDECREF(seq);
    Py_XDECREF(first);
    return ok;
}

static PyObject *
producer_produce(Producer *self, PyObject *args)
{
    PyObject *blocks, *on_done;
    if (!PyArg_ParseTuple(args, "O!O:produce", &PyList_Type, &blocks, &on_done) ||
        !ready(self))
        return NULL;
    Py_ssize_t nb = PyList_GET_SIZE(blocks);
    Block *bs = PyMem_Calloc(nb ? nb : 1, sizeof(Block));
    if (bs == NULL)
        return PyErr_NoMemory();
    Py_INCREF(blocks); /* its items, and so the bytes read below, live through the call */
    for (Py_ssize_t j = 0; j < nb; j++)
        if (!block_of(PyList_GET_ITEM(blocks, j), &bs[j])) {
            PyMem_Free(bs);
            Py_DECREF(blocks);
            return NULL;
        }
    Flight *f = calloc(1, sizeof(Flight));
    PyObject *held = f ? PyList_AsTuple(blocks) : NULL; /* a list could be emptied */
    if (held == NULL) {
        free(f);
        PyMem_Free(bs);
        Py_DECREF(blocks);
        return f ? NULL : PyErr_NoMemory();
    }
    pthread_mutex_init(&f->lock, NULL);
    f->left = 1;
    f->on_done = Py_NewRef(on_done);
    f->blocks = held;
    rd_kafka_t *rk = self->rk;
    int err = 0;
    char reason[512] = "";
    Py_ssize_t index = 0;
    Py_BEGIN_ALLOW_THREADS
    if (R.fatal_error(rk, reason, sizeof(reason)) != 0)
        err = ERR_FATAL;
    for (Py_ssize_t j = 0; j < nb && !err; j++) {
        const Block *b = &bs[j];
        for (Py_ssize_t i = 0; i < b->rows; i++, index++) {
            const int64_t *a = b->at + 3 * i;
            const char *key = b->data + a[0], *value = b->data + a[1];
            size_t key_len = a[1] - a[0], value_len = a[2] - a[1];
            rd_kafka_headers_t *h = NULL;
            if (b->lsn_name != NULL) {
                char digits[24];
                int n = snprintf(digits, sizeof(digits), "%llu",
                                 b->first_seq + (unsigned long long)i);
                h = R.headers_new(2);
                R.header_add(h, b->lsn_name, -1, b->lsn_value, b->lsn_len);
                R.header_add(h, b->seq_name, -1, digits, n);
            }
            __atomic_add_fetch(&f->left, 1, __ATOMIC_ACQ_REL);
            for (;;) {
                err = h ? R.producev(rk, V_TOPIC, b->topic, V_VALUE, value, value_len, V_KEY,
                                     key, key_len, V_MSGFLAGS, MSG_F_NONE, V_OPAQUE, f,
                                     V_HEADERS, h, V_END)
                        : R.producev(rk, V_TOPIC, b->topic, V_VALUE, value, value_len, V_KEY,
                                     key, key_len, V_MSGFLAGS, MSG_F_NONE, V_OPAQUE, f,
                                     V_END);
                if (err != ERR_QUEUE_FULL)
                    break;
                R.poll(rk, 10); /* room comes with delivery reports: serve them */
            }
            if (err) {
                if (h != NULL)
                    R.headers_destroy(h); /* not taken by a refused produce */
                if (err == ERR_FATAL)
                    R.fatal_error(rk, reason, sizeof(reason));
                flight_fail(f, err, reason[0] ? reason : NULL, b->topic, key, key_len,
                            value, value_len);
                __atomic_sub_fetch(&f->left, 1, __ATOMIC_ACQ_REL);
                break;
            }
            f->count++;
        }
    }
    if (err && !reason[0])
        snprintf(reason, sizeof(reason), "%s", R.err2str(err));
    flight_release(f, 1);
    Py_END_ALLOW_THREADS
    PyMem_Free(bs);
    Py_DECREF(blocks);
    if (err)
        return Py_BuildValue("(isn)", err, reason, index);
    Py_RETURN_NONE;
}

/* poll(timeout): the events served; flush(timeout): the records still queued after it */
static PyObject *
producer_wait(Producer *self, PyObject *arg, int flush)
{
    double timeout = PyFloat_AsDouble(arg);
    if ((timeout == -1.0 && PyErr_Occurred()) || !ready(self))
        return NULL;
    int n;
    Py_BEGIN_ALLOW_THREADS
    if (flush) {
        R.flush(self->rk, timeout < 0 ? -1 : (int)(timeout * 1000));
        n = R.outq_len(self->rk);
    }
    else
        n = R.poll(self->rk, (int)(timeout * 1000));
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(n);
}

static PyObject *
producer_poll(Producer *self, PyObject *arg)
{
    return producer_wait(self, arg, 0);
}

static PyObject *
producer_flush(Producer *self, PyObject *arg)
{
    return producer_wait(self, arg, 1);
}

/* What is still queued or in flight is purged (reported as failed), then the producer is
 * destroyed: nothing of it lands after close returns. Flush first to keep it; no other
 * thread may be using the producer. */
static PyObject *
producer_close(Producer *self, PyObject *unused)
{
    rd_kafka_t *rk = self->rk;
    self->rk = NULL;
    if (rk != NULL) {
        Py_BEGIN_ALLOW_THREADS
        R.purge(rk, 0x1 | 0x2); /* RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT */
        R.flush(rk, 1000);      /* the purged records' reports */
        R.destroy(rk);
        Py_END_ALLOW_THREADS
    }
    Py_RETURN_NONE;
}

static void
producer_dealloc(Producer *self)
{
    if (self->rk != NULL) {
        rd_kafka_t *rk = self->rk;
        self->rk = NULL;
        Py_BEGIN_ALLOW_THREADS
        R.destroy(rk);
        Py_END_ALLOW_THREADS
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef producer_methods[] = {
    {"produce", (PyCFunction)producer_produce, METH_VARARGS,
     "produce(blocks, on_done) -> None | (err, reason, index)"},
    {"poll", (PyCFunction)producer_poll, METH_O, "poll(timeout) -> events served"},
    {"flush", (PyCFunction)producer_flush, METH_O, "flush(timeout) -> records still queued"},
    {"close", (PyCFunction)producer_close, METH_NOARGS,
     "close(): what is not acknowledged yet is purged (flush first)"},
    {NULL}};

static PyTypeObject ProducerType = {
    NATIVE_TYPE("actors.kafka._producer.Producer", Producer, Py_TPFLAGS_DEFAULT,
                "Producer(conf): librdkafka's producer for packed record blocks"),
    .tp_init = (initproc)producer_init,
    .tp_dealloc = (destructor)producer_dealloc,
    .tp_methods = producer_methods,
};

static PyMethodDef module_methods[] = {
    {"load", load, METH_O, "load(path): librdkafka's shared library, by its path"},
    {NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "actors.kafka._producer",
                                    "librdkafka's producer for packed record blocks", -1,
                                    module_methods};

PyMODINIT_FUNC
PyInit__producer(void)
{
    if (PyType_Ready(&ProducerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Producer", (PyObject *)&ProducerType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
