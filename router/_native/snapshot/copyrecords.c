/* copy_records: a snapshot's COPY text straight to one route's Kafka records, the per-row
 * work done in C without the interpreter lock (router.snapshot.rows; its Python twin:
 * router.snapshot.rows:copy_records_py).
 *
 * copy_records(data, codec, topic, head, mid, tail, lsn, first_seq, lsn_header, seq_name,
 *              packed=False)
 *   -> list[(topic, key, value, headers)] | (bytes, bytes) | None
 *
 * data: whole lines of ``COPY ... TO STDOUT`` output (as copy_rows takes them), every line
 * a row of the codec's relation (codec.width fields). The n-th row becomes what the
 * streaming Recorder(codec, topic, head, mid, tail, ..., lsn_header, seq_name) returns for
 * record("r", lsn, first_seq + n, None, False, row): the same value writer per kind
 * (codec.h's out_text_value), the same JSON strings (json.h), the same headers. None — the
 * whole batch to the Python path, which parses the rows and encodes them one by one — for
 * what it leaves to the twin: a float column (its JSON is msgspec's float repr, made in
 * Python; the caller decides per table up front and never sends such a table here), a line
 * with another number of fields, a non-canonical integer, escapes copy_rows declines, text
 * that is not UTF-8.
 *
 * The parsing and encoding of the whole batch run with the GIL released, into one buffer
 * and an array of offsets (two sessions' batches encode at once, beside the event loop's
 * thread); the bytes and tuples are made after it is taken again. With ``packed`` no record
 * object is made: the buffer and the offsets come back as two bytes objects — every
 * record's key and value back to back, and three native 64-bit integers a record (key
 * start, value start, end) — for a producer that reads them in C
 * (router.snapshot.rows.RecordBlock, actors/kafka/_producer.c).
 */
#include "../formats/codec.h"
#include "copytext.h"

typedef struct {
    const char *p;
    Py_ssize_t n;
} Span;

typedef struct {
    /* the codec's layout as plain C (read without the GIL; the codec and its name tuples
     * are immutable and kept alive by the caller's references) */
    Py_ssize_t width, n, nkey;
    const Py_ssize_t *pick, *key_pick;
    const char *kinds, *key_kinds;
    Span *names, *key_names;
    Span head, mid, tail;
    unsigned long long lsn, first_seq;
} Layout;

enum { DONE = 1, DECLINE = 0, NOMEM = -1 };

/* One line's fields into spans (text undone into scratch where escaped; NULL as p == NULL). */
static int
split_line(const Layout *l, const char *line, Py_ssize_t len, Span *f, char *scratch)
{
    Py_ssize_t start = 0, used = 0;
    if (l->width == 0)
        return len == 0 ? DONE : DECLINE;
    for (Py_ssize_t k = 0; k < l->width; k++) {
        if (start > len)
            return DECLINE; /* fewer fields */
        const char *p = line + start;
        const char *tab = memchr(p, '\t', len - start);
        Py_ssize_t n = tab ? tab - p : len - start;
        if ((tab == NULL) != (k + 1 == l->width))
            return DECLINE; /* fewer or more fields */
        start += n + 1;
        if (memchr(p, '\\', n) != NULL) {
            if (n == 2 && p[1] == 'N') {
                f[k].p = NULL;
                continue;
            }
            Py_ssize_t o = copy_unescape(p, n, scratch + used);
            if (o < 0)
                return DECLINE;
            p = scratch + used;
            n = o;
            used += o;
        }
        if (!utf8_valid((const unsigned char *)p, n))
            return DECLINE;
        f[k].p = p;
        f[k].n = n;
    }
    return DONE;
}

static int
write_span(Out *o, Span s)
{
    return out_write(o, s.p, s.n) < 0 ? NOMEM : DONE;
}

/* the members of n columns of the row f (each one's JSON name, the field it takes, its
 * kind), comma separated, appended to o */
static int
write_members(Out *o, const Span *f, Py_ssize_t n, const Span *names, const Py_ssize_t *pick,
              const char *kinds)
{
    for (Py_ssize_t j = 0; j < n; j++) {
        if ((j && OUT_LIT(o, ",") < 0) || write_span(o, names[j]) < 0)
            return NOMEM;
        Span v = f[pick[j]];
        int r = v.p == NULL ? (OUT_LIT(o, "null") < 0 ? NOMEM : DONE)
                            : out_text_value(o, kinds[j], v.p, v.n);
        if (r != DONE)
            return r;
    }
    return DONE;
}

/* key and value of one row appended to o */
static int
write_record(const Layout *l, Out *o, const Span *f, unsigned long long seq,
             Py_ssize_t *value_at)
{
    int r;
    if (l->nkey == 0) {
        if (OUT_LIT(o, "null") < 0)
            return NOMEM;
    }
    else {
        if (OUT_LIT(o, "{") < 0)
            return NOMEM;
        r = write_members(o, f, l->nkey, l->key_names, l->key_pick, l->key_kinds);
        if (r != DONE)
            return r;
        if (OUT_LIT(o, "}") < 0)
            return NOMEM;
    }
    *value_at = o->len;
    if (OUT_LIT(o, "{\"op\":\"r\",\"before\":null,\"after\":{") < 0)
        return NOMEM;
    r = write_members(o, f, l->n, l->names, l->pick, l->kinds);
    if (r != DONE)
        return r;
    if (OUT_LIT(o, "}") < 0 || write_span(o, l->head) < 0 || out_u64(o, l->lsn) < 0 ||
        write_span(o, l->mid) < 0 || out_u64(o, seq) < 0 || write_span(o, l->tail) < 0)
        return NOMEM;
    return DONE;
}

/* every line of [data, data + size): records into o, (key start, value start, end) per row
 * into *at (grown); the rows' number into *rows. Runs without the GIL: raw allocator only. */
static int
encode_all(const Layout *l, const char *data, Py_ssize_t size, Out *o, Py_ssize_t **at,
           Py_ssize_t *rows)
{
    Span *f = PyMem_RawMalloc(sizeof(Span) * (l->width ? l->width : 1));
    char *scratch = PyMem_RawMalloc(size > 0 ? size : 1);
    Py_ssize_t cap = 0, n = 0;
    int r = NOMEM;
    if (f == NULL || scratch == NULL)
        goto done;
    for (Py_ssize_t pos = 0; pos < size; n++) {
        const char *line = data + pos;
        const char *nl = memchr(line, '\n', size - pos);
        Py_ssize_t len = nl ? nl - line : size - pos;
        pos += len + (nl != NULL);
        if (n == cap) {
            cap = cap ? cap * 2 : 1024;
            Py_ssize_t *grown = PyMem_RawRealloc(*at, sizeof(Py_ssize_t) * 3 * cap);
            if (grown == NULL) {
                r = NOMEM;
                goto done;
            }
            *at = grown;
        }
        (*at)[3 * n] = o->len;
        r = split_line(l, line, len, f, scratch);
        if (r == DONE)
            r = write_record(l, o, f, l->first_seq + (unsigned long long)n, &(*at)[3 * n + 1]);
        if (r != DONE)
            goto done;
        (*at)[3 * n + 2] = o->len;
    }
    r = DONE;
done:
    *rows = n;
    PyMem_RawFree(f);
    PyMem_RawFree(scratch);
    return r;
}

static Span *
spans_of(PyObject *names, Py_ssize_t n)
{
    Span *s = PyMem_Malloc(sizeof(Span) * (n ? n : 1));
    if (s == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *b = PyTuple_GET_ITEM(names, j); /* bytes: checked by RowCodec's init */
        s[j].p = PyBytes_AS_STRING(b);
        s[j].n = PyBytes_GET_SIZE(b);
    }
    return s;
}

static Span
span_of(PyObject *b)
{
    Span s = {PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b)};
    return s;
}

/* the record tuples of the encoded rows, as Recorder makes them */
static PyObject *
build(const Out *o, const Py_ssize_t *at, Py_ssize_t rows, PyObject *topic,
      PyObject *lsn_header, PyObject *seq_name, unsigned long long first_seq)
{
    PyObject *list = PyList_New(rows);
    if (list == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < rows; i++) {
        PyObject *rec = PyTuple_New(4);
        if (rec == NULL)
            goto fail;
        PyList_SET_ITEM(list, i, rec);
        PyObject *key = PyBytes_FromStringAndSize(o->p + at[3 * i], at[3 * i + 1] - at[3 * i]);
        if (key == NULL)
            goto fail;
        PyTuple_SET_ITEM(rec, 1, key);
        PyObject *value = PyBytes_FromStringAndSize(o->p + at[3 * i + 1],
                                                    at[3 * i + 2] - at[3 * i + 1]);
        if (value == NULL)
            goto fail;
        PyTuple_SET_ITEM(rec, 2, value);
        PyTuple_SET_ITEM(rec, 0, Py_NewRef(topic));
        if (lsn_header == Py_None) {
            PyTuple_SET_ITEM(rec, 3, Py_NewRef(Py_None));
            PyObject_GC_UnTrack(rec);
            continue;
        }
        PyObject *headers = seq_headers(lsn_header, seq_name,
                                        first_seq + (unsigned long long)i);
        if (headers == NULL)
            goto fail;
        PyTuple_SET_ITEM(rec, 3, headers);
        PyObject_GC_UnTrack(rec);
    }
    return list;
fail:
    Py_DECREF(list); /* unset items are NULL: a tuple or list frees them as such */
    return NULL;
}

static PyObject *
copy_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if ((nargs != 10 && nargs != 11) || !PyBytes_CheckExact(args[0]) ||
        !PyObject_TypeCheck(args[1], &RowCodecType) || !PyUnicode_CheckExact(args[2]) ||
        !PyBytes_CheckExact(args[3]) || !PyBytes_CheckExact(args[4]) ||
        !PyBytes_CheckExact(args[5]) || !PyUnicode_CheckExact(args[9])) {
        PyErr_SetString(PyExc_TypeError,
                        "copy_records(data: bytes, codec: RowCodec, topic: str, head: bytes, "
                        "mid: bytes, tail: bytes, lsn, first_seq, lsn_header, seq_name: str, "
                        "packed=False)");
        return NULL;
    }
    int packed = nargs == 11 ? PyObject_IsTrue(args[10]) : 0;
    if (packed < 0)
        return NULL;
    PyObject *data = args[0], *lsn_header = args[8];
    RowCodec *codec = (RowCodec *)args[1];
    if (lsn_header != Py_None &&
        (!PyTuple_CheckExact(lsn_header) || PyTuple_GET_SIZE(lsn_header) != 2)) {
        PyErr_SetString(PyExc_TypeError, "copy_records: lsn_header is a (str, bytes) pair");
        return NULL;
    }
    Layout l = {codec->width, codec->n, codec->nkey, codec->pick, codec->key_pick,
                codec->kinds, codec->key_kinds, NULL, NULL, span_of(args[3]),
                span_of(args[4]), span_of(args[5]), 0, 0};
    if (codec->pick == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "copy_records: RowCodec is not initialised");
        return NULL;
    }
    l.lsn = PyLong_AsUnsignedLongLong(args[6]);
    if (PyErr_Occurred())
        return NULL;
    l.first_seq = PyLong_AsUnsignedLongLong(args[7]);
    if (PyErr_Occurred())
        return NULL;
    if (memchr(l.kinds, K_FLOAT, l.n) != NULL || memchr(l.key_kinds, K_FLOAT, l.nkey) != NULL)
        Py_RETURN_NONE;
    l.names = spans_of(codec->names, l.n);
    l.key_names = l.names ? spans_of(codec->key_names, l.nkey) : NULL;
    if (l.key_names == NULL) {
        PyMem_Free(l.names);
        return NULL;
    }
    Out o;
    out_init(&o);
    o.quiet = 1;
    Py_ssize_t *at = NULL, rows = 0;
    int r;
    Py_INCREF(data); /* held while the GIL is released */
    Py_BEGIN_ALLOW_THREADS
    r = encode_all(&l, PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data), &o, &at, &rows);
    Py_END_ALLOW_THREADS
    Py_DECREF(data);
    PyObject *res;
    if (r == NOMEM)
        res = PyErr_NoMemory();
    else if (r == DECLINE)
        res = Py_NewRef(Py_None);
    else if (packed) {
        Py_BUILD_ASSERT(sizeof(Py_ssize_t) == 8);
        /* y# makes None of a NULL pointer: an empty batch has neither */
        res = Py_BuildValue("(y#y#)", o.p ? o.p : "", o.len, at ? (const char *)at : "",
                            (Py_ssize_t)(sizeof(Py_ssize_t) * 3 * rows));
    }
    else {
        /* the records hold only atoms and are untracked as they are made: a collection
         * triggered by making a batch of them (one in 700 allocations) finds nothing to do */
        int collecting = PyGC_Disable();
        res = build(&o, at, rows, args[2], lsn_header, args[9], l.first_seq);
        if (collecting)
            PyGC_Enable();
    }
    PyMem_RawFree(at);
    out_free(&o);
    PyMem_Free(l.names);
    PyMem_Free(l.key_names);
    return res;
}

static PyMethodDef copyrecords_methods[] = {
    FASTCALL("copy_records", copy_records,
     "copy_records(data, codec, topic, head, mid, tail, lsn, first_seq, lsn_header, "
     "seq_name, packed=False) -> list[record] | (bytes, bytes) | None: a snapshot's COPY "
     "text as one route's records (packed: their bytes and offsets), encoded without the "
     "GIL (router.snapshot.rows)"),
    {NULL}};

int
copyrecords_setup(PyObject *module)
{
    return PyModule_AddFunctions(module, copyrecords_methods);
}
