/* Short transactions in one step (router.stream.short_transactions.take_short in C). */
#include "../native.h"

static PyObject *empty_tuple, *no_aborts;

static inline uint64_t
be64(const unsigned char *p)
{
    return ((uint64_t)be32(p) << 32) | be32(p + 4);
}

/* ------------------------------------------------------------------------------------------
 * take_short(messages, start, relations, budget, events, Transaction, Changes, Change,
 *            overhead, value_overhead, max_rows) -> next
 *
 * From messages[start] on ((lsn, payload) pairs): every complete Begin, plain rows (at most
 * max_rows, their estimate within budget), Commit with the Begin's final LSN becomes
 * Transaction(xid, final_lsn, commit_lsn, end_lsn, commit_time, None, None, None,
 * Changes(changes, (), None, (), frozenset(), count), count) appended to events. Returns the
 * index of the first message not taken (a Begin whose transaction is not that plain case, or
 * anything else); the caller feeds it the long way.
 */
static PyObject *
native_take_short(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 11 || !PyList_CheckExact(args[0]) || !PyDict_CheckExact(args[2]) ||
        !PyList_CheckExact(args[4])) {
        PyErr_SetString(PyExc_TypeError, "take_short(messages: list, start, relations: dict, "
                                         "budget, events: list, Transaction, Changes, Change, "
                                         "overhead, value_overhead, max_rows)");
        return NULL;
    }
    PyObject *messages = args[0], *relations = args[2], *events = args[4];
    PyObject *txn_type = args[5], *changes_type = args[6], *change_type = args[7];
    Py_ssize_t i = PyLong_AsSsize_t(args[1]);
    long long budget = PyLong_AsLongLong(args[3]);
    Py_ssize_t overhead = PyLong_AsSsize_t(args[8]);
    Py_ssize_t value_overhead = PyLong_AsSsize_t(args[9]);
    Py_ssize_t max_rows = PyLong_AsSsize_t(args[10]);
    if (PyErr_Occurred())
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(messages);
    if (unchanged_toast == NULL)
        return PyLong_FromSsize_t(i);
    while (i < n) {
        PyObject *item = PyList_GET_ITEM(messages, i);
        if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 2)
            break;
        PyObject *begin = PyTuple_GET_ITEM(item, 1);
        if (!PyBytes_CheckExact(begin) || PyBytes_GET_SIZE(begin) != 21 ||
            PyBytes_AS_STRING(begin)[0] != 'B')
            break;
        const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(begin);
        uint64_t final_lsn = be64(b + 1);
        uint32_t xid = be32(b + 17);
        PyObject *changes = PyList_New(0);
        if (changes == NULL)
            return NULL;
        long long used = 0;
        Py_ssize_t j = i + 1, last = n < i + 1 + max_rows ? n : i + 1 + max_rows;
        for (; j < last; j++) {
            int r = take_row(PyList_GET_ITEM(messages, j), changes, relations, change_type,
                             overhead, value_overhead, &used);
            if (r < 0)
                goto error;
            if (r == 0)
                break;
        }
        if (j >= last || used > budget)
            goto stop;
        item = PyList_GET_ITEM(messages, j);
        if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 2)
            goto stop;
        PyObject *commit = PyTuple_GET_ITEM(item, 1);
        if (!PyBytes_CheckExact(commit) || PyBytes_GET_SIZE(commit) != 26 ||
            PyBytes_AS_STRING(commit)[0] != 'C')
            goto stop;
        const unsigned char *c = (const unsigned char *)PyBytes_AS_STRING(commit);
        uint64_t commit_lsn = be64(c + 2), end_lsn = be64(c + 10);
        int64_t commit_time = (int64_t)be64(c + 18);
        if (commit_lsn != final_lsn)
            goto stop;
        Py_ssize_t count = PyList_GET_SIZE(changes);
        PyObject *count_obj = PyLong_FromSsize_t(count);
        PyObject *xid_obj = PyLong_FromUnsignedLong(xid);
        PyObject *final_obj = PyLong_FromUnsignedLongLong(final_lsn);
        PyObject *commit_obj = PyLong_FromUnsignedLongLong(commit_lsn);
        PyObject *end_obj = PyLong_FromUnsignedLongLong(end_lsn);
        PyObject *time_obj = PyLong_FromLongLong(commit_time);
        PyObject *released = NULL, *txn = NULL;
        if (count_obj && xid_obj && final_obj && commit_obj && end_obj && time_obj) {
            PyObject *cargs[] = {changes, empty_tuple, Py_None, empty_tuple, no_aborts,
                                 count_obj};
            released = PyObject_Vectorcall(changes_type, cargs, 6, NULL);
            if (released != NULL) {
                PyObject *targs[] = {xid_obj, final_obj, commit_obj, end_obj, time_obj,
                                     Py_None, Py_None, Py_None, released, count_obj};
                txn = PyObject_Vectorcall(txn_type, targs, 10, NULL);
            }
        }
        Py_XDECREF(count_obj);
        Py_XDECREF(xid_obj);
        Py_XDECREF(final_obj);
        Py_XDECREF(commit_obj);
        Py_XDECREF(end_obj);
        Py_XDECREF(time_obj);
        Py_XDECREF(released);
        Py_DECREF(changes);
        if (txn == NULL)
            return NULL;
        int r = PyList_Append(events, txn);
        Py_DECREF(txn);
        if (r < 0)
            return NULL;
        i = j + 1;
        continue;
    stop:
        Py_DECREF(changes);
        break;
    error:
        Py_DECREF(changes);
        return NULL;
    }
    return PyLong_FromSsize_t(i);
}

static PyMethodDef short_methods[] = {
    FASTCALL("take_short", native_take_short,
     "take_short(messages, start, relations, budget, events, Transaction, Changes, Change, "
     "overhead, value_overhead, max_rows) -> next"),
    {NULL}};

int
short_setup(PyObject *module)
{
    empty_tuple = PyTuple_New(0);
    no_aborts = PyFrozenSet_New(NULL);
    if (!empty_tuple || !no_aborts)
        return -1;
    return PyModule_AddFunctions(module, short_methods);
}
