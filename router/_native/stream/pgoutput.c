/* The slot side of router._native: psycopg2's read loop, TupleData and row messages, the
 * transaction assembler's short path. */
#include "../native.h"

/* ------------------------------------------------------------------------------------------
 * read_tuple(data: bytes, pos: int) -> (tuple, int) | None
 *
 * TupleData: Int16 column count, then per column a kind byte ('t' text, 'n' NULL,
 * 'u' unchanged TOAST, 'b' binary) and, for 't'/'b', Int32 length + bytes.
 */
/* One TupleData at *pos. NULL with no exception set: not the plain case (fall back). */
static PyObject *
parse_tuple(const unsigned char *buf, Py_ssize_t end, Py_ssize_t *at)
{
    Py_ssize_t pos = *at;
    if (pos < 0 || pos > end - 2)
        return NULL;
    Py_ssize_t natts = ((Py_ssize_t)buf[pos] << 8) | buf[pos + 1];
    if (natts > max_columns)
        return NULL;
    pos += 2;
    PyObject *values = PyTuple_New(natts);
    if (values == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < natts; i++) {
        if (pos >= end)
            goto fallback;
        unsigned char kind = buf[pos];
        PyObject *v;
        if (kind == 't' || kind == 'b') {
            if (end - pos < 5)
                goto fallback;
            uint32_t size = be32(buf + pos + 1);
            Py_ssize_t start = pos + 5;
            if ((uint64_t)size > (uint64_t)(end - start))
                goto fallback;
            if (kind == 't') {
                v = PyUnicode_DecodeUTF8((const char *)buf + start, (Py_ssize_t)size, NULL);
                if (v == NULL) {
                    PyErr_Clear();
                    goto fallback;
                }
            }
            else {
                v = PyBytes_FromStringAndSize((const char *)buf + start, (Py_ssize_t)size);
                if (v == NULL)
                    goto error;
            }
            pos = start + (Py_ssize_t)size;
        }
        else if (kind == 'n') {
            v = Py_NewRef(Py_None);
            pos += 1;
        }
        else if (kind == 'u') {
            v = Py_NewRef(unchanged_toast);
            pos += 1;
        }
        else
            goto fallback;
        PyTuple_SET_ITEM(values, i, v);
    }
    *at = pos;
    /* only str, bytes, None and the sentinel: it can never be part of a cycle, so the
     * collector need not track it (CPython untracks such tuples itself, later) */
    PyObject_GC_UnTrack(values);
    return values;
fallback:
    Py_DECREF(values);
    return NULL;
error:
    Py_DECREF(values);
    return NULL;
}

static PyObject *
native_read_tuple(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (native_usage(nargs == 2, "read_tuple(data, pos)") < 0)
        return NULL;
    PyObject *data = args[0];
    if (!PyBytes_CheckExact(data) || unchanged_toast == NULL || !PyLong_CheckExact(args[1]))
        Py_RETURN_NONE;
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    if (pos == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    PyObject *values = parse_tuple((const unsigned char *)PyBytes_AS_STRING(data),
                                   PyBytes_GET_SIZE(data), &pos);
    if (values == NULL) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    return native_pair(values, PyLong_FromSsize_t(pos));
}

/* ------------------------------------------------------------------------------------------
 * decode_row(data: bytes) -> Insert | Update | Delete | None
 *
 * A whole Insert ('I'), Update ('U') or Delete ('D') message outside a stream block, as
 * router.pgoutput.decode builds it; None for any other message and for anything malformed
 * (the Python decoder then decodes it, or raises the precise error).
 */
static PyObject *
native_decode_row(PyObject *self, PyObject *data)
{
    if (!PyBytes_CheckExact(data) || insert_type == NULL || unchanged_toast == NULL)
        Py_RETURN_NONE;
    const unsigned char *buf = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t end = PyBytes_GET_SIZE(data);
    if (end < 6)
        Py_RETURN_NONE;
    unsigned char type = buf[0], action = buf[5];
    PyObject *before = NULL, *new = NULL, *relid = NULL, *msg = NULL;
    Py_ssize_t pos = 6;
    if (type == 'I') {
        if (action != 'N')
            Py_RETURN_NONE;
    }
    else if (type == 'U' || type == 'D') {
        if (action == 'K' || action == 'O') {
            before = parse_tuple(buf, end, &pos);
            if (before == NULL)
                goto done;
            if (type == 'U') {
                if (pos >= end || buf[pos] != 'N')
                    goto done;
                pos += 1;
            }
        }
        else if (type == 'D' || action != 'N')
            Py_RETURN_NONE;
    }
    else
        Py_RETURN_NONE;
    if (type != 'D') {
        new = parse_tuple(buf, end, &pos);
        if (new == NULL)
            goto done;
    }
    if (pos != end)
        goto done;
    relid = PyLong_FromUnsignedLong(be32(buf + 1));
    if (relid == NULL)
        goto done;
    PyObject *key = (before != NULL && action == 'K') ? before : Py_None;
    PyObject *old = (before != NULL && action == 'O') ? before : Py_None;
    if (type == 'I') {
        PyObject *args[] = {relid, new, Py_None};
        msg = PyObject_Vectorcall(insert_type, args, 3, NULL);
    }
    else if (type == 'U') {
        PyObject *args[] = {relid, key, old, new, Py_None};
        msg = PyObject_Vectorcall(update_type, args, 5, NULL);
    }
    else {
        PyObject *args[] = {relid, key, old, Py_None};
        msg = PyObject_Vectorcall(delete_type, args, 4, NULL);
    }
done:
    Py_XDECREF(before);
    Py_XDECREF(new);
    Py_XDECREF(relid);
    if (msg == NULL && !PyErr_Occurred())
        Py_RETURN_NONE;
    return msg;
}

/* ------------------------------------------------------------------------------------------
 * feed_rows(messages, start, changes, relations, Change, overhead, value_overhead, budget)
 *     -> (next, bytes, count)
 *
 * The transaction assembler's short path (router.stream.transactions.feed_batch) in C: from
 * messages[start] on ((lsn, payload) pairs), every plain Insert/Update/Delete of a known
 * relation becomes Change(op, lsn, relation, old, old_is_key, new) appended to ``changes``,
 * counted as overhead + len(payload) + value_overhead per value bytes. Stops before the first message that is anything
 * else (the caller decodes it the long way) and after the change that takes the bytes past
 * ``budget`` (the caller spills). Only for use inside Begin ... Commit outside a stream block,
 * unless the optional ninth argument ``skip`` is 4: the messages are then streamed ones (the
 * Int32 subtransaction xid after the type byte), as a streamed transaction's spill keeps them
 * (router.stream.changes).
 */
static PyObject *op_insert, *op_update, *op_delete;

/* One plain row message (lsn, data) of a known relation as a Change appended to ``changes``:
 * 1 (with *used += its estimate), 0 when it is not the plain case (nothing appended, no
 * exception), -1 on error. Shared by feed_rows and take_short (short.c). */
static int take_row_at(PyObject *item, PyObject *changes, PyObject *relations,
                       PyObject *change_type, Py_ssize_t overhead, Py_ssize_t value_overhead,
                       long long *used, Py_ssize_t skip);

int
take_row(PyObject *item, PyObject *changes, PyObject *relations, PyObject *change_type,
         Py_ssize_t overhead, Py_ssize_t value_overhead, long long *used)
{
    return take_row_at(item, changes, relations, change_type, overhead, value_overhead, used, 0);
}

/* take_row of a message whose relation id starts ``skip`` bytes later (4: a streamed one) */
static int
take_row_at(PyObject *item, PyObject *changes, PyObject *relations, PyObject *change_type,
            Py_ssize_t overhead, Py_ssize_t value_overhead, long long *used, Py_ssize_t skip)
{
    if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 2)
        return 0;
    PyObject *lsn = PyTuple_GET_ITEM(item, 0), *data = PyTuple_GET_ITEM(item, 1);
    if (!PyBytes_CheckExact(data))
        return 0;
    const unsigned char *buf = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t end = PyBytes_GET_SIZE(data);
    if (end < 6 + skip)
        return 0;
    unsigned char type = buf[0], action = buf[5 + skip];
    PyObject *op;
    if (type == 'I' && action == 'N')
        op = op_insert;
    else if (type == 'U' && (action == 'N' || action == 'K' || action == 'O'))
        op = op_update;
    else if (type == 'D' && (action == 'K' || action == 'O'))
        op = op_delete;
    else
        return 0;
    PyObject *relid = PyLong_FromUnsignedLong(be32(buf + 1 + skip));
    if (relid == NULL)
        return -1;
    PyObject *rel = PyDict_GetItemWithError(relations, relid);
    Py_DECREF(relid);
    if (rel == NULL)
        return PyErr_Occurred() ? -1 : 0; /* unknown relation: the long way reports it */
    Py_ssize_t pos = 6 + skip;
    PyObject *before = NULL, *new = NULL;
    if (action != 'N') {
        before = parse_tuple(buf, end, &pos);
        if (before == NULL)
            goto stop;
        if (type == 'U') {
            if (pos >= end || buf[pos] != 'N')
                goto stop;
            pos += 1;
        }
    }
    if (type != 'D') {
        new = parse_tuple(buf, end, &pos);
        if (new == NULL)
            goto stop;
    }
    if (pos != end)
        goto stop;
    Py_ssize_t values = (before ? PyTuple_GET_SIZE(before) : 0) +
                        (new ? PyTuple_GET_SIZE(new) : 0);
    PyObject *call[] = {op, lsn, rel, before ? before : Py_None,
                        action == 'K' ? Py_True : Py_False, new ? new : Py_None};
    PyObject *change = PyObject_Vectorcall(change_type, call, 6, NULL);
    Py_XDECREF(before);
    Py_XDECREF(new);
    if (change == NULL)
        return -1;
    int r = PyList_Append(changes, change);
    Py_DECREF(change);
    if (r < 0)
        return -1;
    *used += overhead + end + value_overhead * values;
    return 1;
stop:
    Py_XDECREF(before);
    Py_XDECREF(new);
    return PyErr_Occurred() ? -1 : 0;
}

static PyObject *
native_feed_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if ((nargs != 8 && nargs != 9) || !PyList_CheckExact(args[0]) ||
        !PyList_CheckExact(args[2]) || !PyDict_CheckExact(args[3])) {
        PyErr_SetString(PyExc_TypeError, "feed_rows(messages: list, start, changes: list, "
                                         "relations: dict, Change, overhead, value_overhead, "
                                         "budget[, skip: 0 or 4])");
        return NULL;
    }
    Py_ssize_t skip = nargs == 9 ? PyLong_AsSsize_t(args[8]) : 0;
    if (skip != 0 && skip != 4) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "feed_rows: skip is 0 or 4");
        return NULL;
    }
    PyObject *messages = args[0], *changes = args[2], *relations = args[3], *change_type = args[4];
    Py_ssize_t i = PyLong_AsSsize_t(args[1]);
    Py_ssize_t overhead = PyLong_AsSsize_t(args[5]);
    Py_ssize_t value_overhead = PyLong_AsSsize_t(args[6]);
    long long budget = PyLong_AsLongLong(args[7]);
    if (PyErr_Occurred())
        return NULL;
    long long used = 0;
    Py_ssize_t count = 0, n = PyList_GET_SIZE(messages);
    if (unchanged_toast == NULL)
        i = n;
    for (; i < n && used <= budget; i++) {
        int r = take_row_at(PyList_GET_ITEM(messages, i), changes, relations, change_type,
                            overhead, value_overhead, &used, skip);
        if (r < 0)
            return NULL;
        if (r == 0)
            break;
        count++;
    }
    return Py_BuildValue("(nLn)", i, used, count);
}

/* ------------------------------------------------------------------------------------------
 * drain(read_message, max_messages, max_bytes) -> (batch, exhausted)
 *
 * The slot reader's inner loop: calls read_message() (psycopg2's ReplicationCursor) until it
 * returns None (exhausted = True) or the batch holds max_messages messages or max_bytes
 * payload bytes; batch is a list of (data_start, payload) pairs.
 */
static PyObject *str_payload, *str_data_start;

static PyObject *
native_drain(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (native_usage(nargs == 3, "drain(read_message, max_messages, max_bytes)") < 0)
        return NULL;
    PyObject *read = args[0];
    Py_ssize_t max_messages = PyLong_AsSsize_t(args[1]);
    Py_ssize_t max_bytes = PyLong_AsSsize_t(args[2]);
    if (PyErr_Occurred())
        return NULL;
    PyObject *batch = PyList_New(0);
    if (batch == NULL)
        return NULL;
    Py_ssize_t size = 0;
    int exhausted = 0;
    while (PyList_GET_SIZE(batch) < max_messages && size < max_bytes) {
        PyObject *msg = PyObject_CallNoArgs(read);
        if (msg == NULL)
            goto error;
        if (msg == Py_None) {
            Py_DECREF(msg);
            exhausted = 1;
            break;
        }
        PyObject *payload = PyObject_GetAttr(msg, str_payload);
        PyObject *start = payload ? PyObject_GetAttr(msg, str_data_start) : NULL;
        Py_DECREF(msg);
        if (start == NULL) {
            Py_XDECREF(payload);
            goto error;
        }
        Py_ssize_t len = PyBytes_Check(payload) ? PyBytes_GET_SIZE(payload)
                                                : PyObject_Length(payload);
        if (len < 0) {
            Py_DECREF(start);
            Py_DECREF(payload);
            goto error;
        }
        size += len;
        PyObject *pair = PyTuple_Pack(2, start, payload);
        Py_DECREF(start);
        Py_DECREF(payload);
        if (pair == NULL)
            goto error;
        if (PyLong_CheckExact(start) && PyBytes_CheckExact(payload))
            PyObject_GC_UnTrack(pair); /* atoms only: never in a cycle */
        int r = PyList_Append(batch, pair);
        Py_DECREF(pair);
        if (r < 0)
            goto error;
    }
    return Py_BuildValue("(NO)", batch, exhausted ? Py_True : Py_False);
error:
    Py_DECREF(batch);
    return NULL;
}

static PyMethodDef pgoutput_methods[] = {
    FASTCALL("read_tuple", native_read_tuple,
     "read_tuple(data, pos) -> (tuple, end) | None (None: use the Python reader)"),
    {"decode_row", (PyCFunction)native_decode_row, METH_O,
     "decode_row(data) -> Insert | Update | Delete | None (None: use the Python decoder)"},
    FASTCALL("feed_rows", native_feed_rows,
     "feed_rows(messages, start, changes, relations, Change, overhead, value_overhead, "
     "budget[, skip]) -> "
     "(next, bytes, count)"),
    FASTCALL("drain", native_drain,
     "drain(read_message, max_messages, max_bytes) -> (batch, exhausted)"),
    {NULL}};

int
pgoutput_setup(PyObject *module)
{
    op_insert = PyUnicode_InternFromString("insert");
    op_update = PyUnicode_InternFromString("update");
    op_delete = PyUnicode_InternFromString("delete");
    str_payload = PyUnicode_InternFromString("payload");
    str_data_start = PyUnicode_InternFromString("data_start");
    if (!op_insert || !op_update || !op_delete || !str_payload || !str_data_start)
        return -1;
    return PyModule_AddFunctions(module, pgoutput_methods);
}
