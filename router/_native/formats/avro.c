/* AvroConverter: pgrouter's JSON records as Avro records in the Confluent wire format, the C
 * twin of router.formats.avro.AvroFormat._convert_all_py for the plain records.
 *
 * AvroConverter() holds one plan per (schema_id, topic): the table layout
 * router.formats.avro._Table computed (its registry headers, each column's name as the envelope
 * spells it, its kind and parameter, its unchanged-TOAST datum, the key columns), given by
 * plan(...) once the registry ids are known. convert_all(records, fallback) converts a list of
 * (topic, key, value, headers) records and returns the list of converted ones; a record it declines
 * is given to fallback(record), which returns its conversion (a record, a list of records, or
 * None: skipped), as router.formats.avro.AvroFormat.convert does.
 *
 * The envelope is parsed from the JSON bytes as they are (no dicts): its members, the
 * source's and a row's in any order, each name once, rows by their columns' names (the
 * order of the layout is tried first), the rest as avro_values.c reads one value. Declined,
 * so that Python converts (and raises the precise error): a record without a plan (the first
 * of each table and topic, transaction metadata, messages), a key change (an update whose key
 * columns' JSON differs), a member or a value that is anything but the plain case of
 * avro_values.c, an unchanged-TOAST column that has a value in the row, malformed JSON.
 */
#include "avro_values.h"

#define WROTE_NULL(o) (OUT_LIT((o), "\x00") < 0 ? -1 : AV_OK)

/* ------------------------------------------------------------------------------------------
 * Objects and arrays of the envelope, member by member.
 */
typedef struct {
    const char *p, *end;
    int first;
} Cursor;

static int
open_token(Span t, char open, Cursor *c)
{
    if (t.p == NULL || t.n < 2 || t.p[0] != open)
        return 0;
    c->p = t.p + 1;
    c->end = t.p + t.n;
    c->first = 1;
    return 1;
}

/* the next member (key != NULL) or element: 1, 0 past the closing bracket, -1 malformed */
static int
next_item(Cursor *c, char close, Span *key, Span *value)
{
    const char *p = c->p, *end = c->end;
    if (p < end && *p == close) {
        c->p = p + 1;
        return 0;
    }
    if (!c->first && (p >= end || *p++ != ','))
        return -1;
    c->first = 0;
    if (key != NULL) {
        if (p >= end || *p != '"')
            return -1;
        key->p = p;
        if ((p = avro_skip_string(p, end)) == NULL || p >= end || *p != ':')
            return -1;
        key->n = p++ - key->p;
    }
    value->p = p;
    if ((p = avro_skip_value(p, end, 1)) == NULL)
        return -1;
    value->n = p - value->p;
    c->p = p;
    return 1;
}

/* The members of the object at p into slots by name (each name as msgspec writes the key;
 * the one after the last found is tried first): the end of the object, or NULL for an
 * unknown name, a name twice or malformed JSON. Absent members have p NULL. */
static const char *
members_at(const char *p, const char *end, const char *const *names, const Py_ssize_t *lens,
           Py_ssize_t count, Span *slots)
{
    Cursor c = {p + 1, end, 1};
    Span k, v;
    int r;
    if (p >= end || *p != '{')
        return NULL;
    memset(slots, 0, sizeof(Span) * count);
    Py_ssize_t next = 0;
    while ((r = next_item(&c, '}', &k, &v)) > 0) {
        Py_ssize_t j = next;
        if (j >= count || !span_is(k, names[j], lens[j]))
            for (j = 0; j < count && !span_is(k, names[j], lens[j]); j++)
                ;
        if (j == count || slots[j].p != NULL)
            return NULL;
        slots[j] = v;
        next = j + 1;
    }
    return r == 0 ? c.p : NULL;
}

/* members_at of a whole token */
static int
members(Span obj, const char *const *names, const Py_ssize_t *lens, Py_ssize_t count,
        Span *slots)
{
    return obj.p != NULL &&
           members_at(obj.p, obj.p + obj.n, names, lens, count, slots) == obj.p + obj.n;
}

static inline int
is_null(Span t)
{
    return t.p == NULL || SPAN_IS(t, "null");
}

/* the envelope's members and the source's, in router.formats.avro's order */
enum { E_OP, E_BEFORE, E_AFTER, E_SOURCE, E_TS_MS, E_TOAST, E_TRUNCATE, E_FIELDS };
static const char *const ENV_NAMES[E_FIELDS] = {
    "\"op\"", "\"before\"", "\"after\"", "\"source\"", "\"ts_ms\"", "\"unchanged_toast\"",
    "\"truncate\""};
enum { S_DB, S_SCHEMA_ID = 11, S_FIELDS };
static const char *const SOURCE_NAMES[S_FIELDS] = {
    "\"db\"", "\"schema\"", "\"table\"", "\"lsn\"", "\"commit_lsn\"", "\"seq\"", "\"xid\"",
    "\"commit_time\"", "\"origin\"", "\"origin_lsn\"", "\"route\"", "\"schema_id\""};
static const char SOURCE_IS_LONG[S_FIELDS] = {0, 0, 0, 1, 1, 1, 1, 0, 0, 1, 0, 0};
static const char *const TRUNCATE_NAMES[2] = {"\"cascade\"", "\"restart_identity\""};
static Py_ssize_t ENV_LENS[E_FIELDS], SOURCE_LENS[S_FIELDS], TRUNCATE_LENS[2];

/* ------------------------------------------------------------------------------------------
 * A plan: one table layout on one topic (router.formats.avro._Table), made by AvroConverter.plan.
 */
typedef struct {
    PyObject_HEAD
    PyObject *topic;        /* str */
    const char *topic_p;    /* its UTF-8 */
    Py_ssize_t topic_n;
    PyObject *schema_id;    /* bytes: the id as the record spells it */
    PyObject *value_header; /* bytes: magic byte and registry id */
    PyObject *key_header;   /* bytes, or None when the table has no key columns */
    PyObject *names;        /* tuple of bytes: each column's name as a JSON string */
    PyObject *placeholders; /* tuple: each column's unchanged-TOAST datum (bytes) or None */
    Py_ssize_t n, nkey;
    const char **name_p, **key_name_p;
    Py_ssize_t *name_n, *key_name_n, *key_index;
    unsigned char *kinds;
    long *params;
    /* scratch for the record being converted: each column's token, the TOAST marks */
    Span *before, *after, *key;
    char *toast;
} Plan;

static void
plan_dealloc(Plan *self)
{
    CLEAR_ALL(&self->topic, &self->schema_id, &self->value_header, &self->key_header,
              &self->names, &self->placeholders);
    MEM_FREE_ALL(self->name_p, self->key_name_p, self->name_n, self->key_name_n, self->key_index,
                 self->kinds, self->params, self->before, self->after, self->key, self->toast);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject PlanType = {
    NATIVE_TYPE_HEAD("router._native.AvroPlan", Plan, Py_TPFLAGS_DEFAULT,
                "one table layout on one topic (AvroConverter.plan)"),
    .tp_dealloc = (destructor)plan_dealloc,
};

static int
check_tuple(PyObject *t, Py_ssize_t n, const char *what)
{
    if (PyTuple_CheckExact(t) && PyTuple_GET_SIZE(t) == n)
        return 0;
    PyErr_Format(PyExc_ValueError, "plan: %s must be a tuple of %zd", what, n);
    return -1;
}

static Plan *
plan_new(PyObject *schema_id, PyObject *topic, PyObject *value_header, PyObject *key_header,
         PyObject *names, PyObject *kinds, PyObject *params, PyObject *placeholders,
         PyObject *key_index)
{
    if (!PyUnicode_Check(schema_id) || !PyUnicode_CheckExact(topic) ||
        !PyBytes_CheckExact(value_header) || !(key_header == Py_None ||
                                               PyBytes_CheckExact(key_header)) ||
        !PyTuple_CheckExact(names) || !PyBytes_CheckExact(kinds) ||
        !PyTuple_CheckExact(key_index)) {
        PyErr_SetString(PyExc_TypeError, "plan(schema_id: str, topic: str, value_header: "
                        "bytes, key_header: bytes | None, names: tuple, kinds: bytes, "
                        "params: tuple, placeholders: tuple, key_index: tuple)");
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(names), nkey = PyTuple_GET_SIZE(key_index);
    if (PyBytes_GET_SIZE(kinds) != n || check_tuple(params, n, "params") < 0 ||
        check_tuple(placeholders, n, "placeholders") < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "plan: one kind per column");
        return NULL;
    }
    if ((key_header == Py_None) != (nkey == 0)) {
        PyErr_SetString(PyExc_ValueError, "plan: a key header exactly when there are keys");
        return NULL;
    }
    Plan *pl = PyObject_New(Plan, &PlanType);
    if (pl == NULL)
        return NULL;
    /* PyObject_New leaves the fields as they are: clear them for plan_dealloc */
    memset((char *)pl + sizeof(PyObject), 0, sizeof(Plan) - sizeof(PyObject));
    pl->n = n;
    pl->nkey = nkey;
    pl->topic = Py_NewRef(topic);
    if ((pl->topic_p = PyUnicode_AsUTF8AndSize(topic, &pl->topic_n)) == NULL)
        goto fail;
    pl->schema_id = PyUnicode_AsUTF8String(schema_id);
    pl->value_header = Py_NewRef(value_header);
    pl->key_header = Py_NewRef(key_header);
    pl->names = Py_NewRef(names);
    pl->placeholders = Py_NewRef(placeholders);
    Py_ssize_t m = n ? n : 1, mk = nkey ? nkey : 1;
    pl->name_p = PyMem_Calloc(m, sizeof(char *));
    pl->name_n = PyMem_Calloc(m, sizeof(Py_ssize_t));
    pl->key_name_p = PyMem_Calloc(mk, sizeof(char *));
    pl->key_name_n = PyMem_Calloc(mk, sizeof(Py_ssize_t));
    pl->key_index = PyMem_Calloc(mk, sizeof(Py_ssize_t));
    pl->kinds = PyMem_Calloc(m, 1);
    pl->params = PyMem_Calloc(m, sizeof(long));
    pl->before = PyMem_Calloc(m, sizeof(Span));
    pl->after = PyMem_Calloc(m, sizeof(Span));
    pl->key = PyMem_Calloc(mk, sizeof(Span));
    pl->toast = PyMem_Calloc(m, 1);
    if (pl->schema_id == NULL)
        goto fail;
    if (!pl->name_p || !pl->name_n || !pl->key_name_p || !pl->key_name_n || !pl->key_index ||
        !pl->kinds || !pl->params || !pl->before || !pl->after || !pl->key || !pl->toast) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *name = PyTuple_GET_ITEM(names, j), *ph = PyTuple_GET_ITEM(placeholders, j);
        unsigned char kind = (unsigned char)PyBytes_AS_STRING(kinds)[j];
        long param = PyLong_AsLong(PyTuple_GET_ITEM(params, j));
        if (param == -1 && PyErr_Occurred())
            goto fail;
        if (!PyBytes_CheckExact(name) || !(ph == Py_None || PyBytes_CheckExact(ph)) ||
            kind >= A_KINDS) {
            PyErr_SetString(PyExc_ValueError, "plan: names are bytes, placeholders bytes or "
                            "None, kinds known");
            goto fail;
        }
        pl->name_p[j] = PyBytes_AS_STRING(name);
        pl->name_n[j] = PyBytes_GET_SIZE(name);
        pl->kinds[j] = kind;
        pl->params[j] = param;
    }
    for (Py_ssize_t i = 0; i < nkey; i++) {
        Py_ssize_t j = PyLong_AsSsize_t(PyTuple_GET_ITEM(key_index, i));
        if (j == -1 && PyErr_Occurred())
            goto fail;
        if (j < 0 || j >= n) {
            PyErr_SetString(PyExc_ValueError, "plan: key index out of range");
            goto fail;
        }
        pl->key_index[i] = j;
        pl->key_name_p[i] = pl->name_p[j];
        pl->key_name_n[i] = pl->name_n[j];
    }
    return pl;
fail:
    Py_DECREF(pl);
    return NULL;
}

/* ------------------------------------------------------------------------------------------
 * Writing one record.
 */

/* a column's ["null", T] from its token (absent: null) */
static int
write_field(Out *o, Out *tmp, int kind, long param, Span t)
{
    if (is_null(t))
        return OUT_LIT(o, "\x00") < 0 ? -1 : AV_OK;
    Py_ssize_t mark = o->len;
    if (OUT_LIT(o, "\x02") < 0)
        return -1;
    int r = avro_datum(o, tmp, kind, param, t);
    if (r == AV_NONE) {
        o->len = mark;
        return OUT_LIT(o, "\x00") < 0 ? -1 : AV_OK;
    }
    return r;
}

/* the optional row record (its columns' tokens in cols; toast: the columns to write as their
 * unchanged-TOAST placeholder, or NULL) */
static int
write_row(Out *o, Out *tmp, Plan *pl, const Span *cols, const char *toast)
{
    if (OUT_LIT(o, "\x02") < 0)
        return -1;
    for (Py_ssize_t j = 0; j < pl->n; j++) {
        int r;
        if (toast != NULL && toast[j]) {
            PyObject *ph = PyTuple_GET_ITEM(pl->placeholders, j);
            r = ph == Py_None ? OUT_LIT(o, "\x00")
                              : (OUT_LIT(o, "\x02") < 0 ? -1 : out_bytes(o, ph));
            r = r < 0 ? -1 : AV_OK;
        }
        else
            r = write_field(o, tmp, pl->kinds[j], pl->params[j], cols[j]);
        if (r != AV_OK)
            return r;
    }
    return AV_OK;
}

/* the unchanged-TOAST names: counted, checked to be strings and (with a row after) marked
 * in pl->toast; a column there that has a value in the row is declined */
static int
mark_toast(Plan *pl, Span toast, int has_after, Py_ssize_t *count)
{
    Cursor c;
    Span t;
    int r;
    memset(pl->toast, 0, pl->n ? pl->n : 1);
    *count = 0;
    if (!open_token(toast, '[', &c))
        return AV_DECLINE;
    while ((r = next_item(&c, ']', NULL, &t)) > 0) {
        if (t.p[0] != '"')
            return AV_DECLINE;
        ++*count;
        if (!has_after)
            continue;
        Py_ssize_t j = 0;
        while (j < pl->n && !span_is(t, pl->name_p[j], pl->name_n[j]))
            j++;
        if (j == pl->n || !is_null(pl->after[j]))
            return AV_DECLINE;
        pl->toast[j] = 1;
    }
    return r == 0 && c.p == c.end ? AV_OK : AV_DECLINE;
}

static int
write_string(Out *o, Out *tmp, Span t)
{
    const char *s;
    Py_ssize_t n;
    int r = avro_string(t, tmp, &s, &n);
    return r <= 0 ? r : (avro_bytes(o, s, n) < 0 ? -1 : AV_OK);
}

static int
write_opt_long(Out *o, Span t)
{
    int64_t v;
    if (is_null(t))
        return OUT_LIT(o, "\x00") < 0 ? -1 : AV_OK;
    if (!avro_int64(t, &v))
        return AV_DECLINE;
    return OUT_LIT(o, "\x02") < 0 || avro_long(o, v) < 0 ? -1 : AV_OK;
}

/* io.pgrouter.Source: db a string, the others optional strings and longs */
static int
write_source(Out *o, Out *tmp, const Span *src)
{
    for (int i = 0; i < S_FIELDS; i++) {
        int r;
        if (SOURCE_IS_LONG[i])
            r = write_opt_long(o, src[i]);
        else if (i == S_DB)
            r = write_string(o, tmp, src[i]);
        else if (is_null(src[i]))
            r = OUT_LIT(o, "\x00") < 0 ? -1 : AV_OK;
        else
            r = OUT_LIT(o, "\x02") < 0 ? -1 : write_string(o, tmp, src[i]);
        if (r != AV_OK)
            return r;
    }
    return AV_OK;
}

static int
write_toast(Out *o, Out *tmp, Span toast, Py_ssize_t count)
{
    Cursor c;
    Span t;
    if (!open_token(toast, '[', &c)) /* mark_toast read it */
        return AV_DECLINE;
    if (OUT_LIT(o, "\x02") < 0 || (count && avro_long(o, count) < 0))
        return -1;
    while (next_item(&c, ']', NULL, &t) > 0) {
        int r = write_string(o, tmp, t);
        if (r != AV_OK)
            return r;
    }
    return OUT_LIT(o, "\x00") < 0 ? -1 : AV_OK;
}

static int
write_truncate(Out *o, Span truncate)
{
    Span opts[2];
    if (is_null(truncate))
        return OUT_LIT(o, "\x00") < 0 ? -1 : AV_OK;
    if (!members(truncate, TRUNCATE_NAMES, TRUNCATE_LENS, 2, opts))
        return AV_DECLINE;
    char b[3] = {2, 0, 0};
    for (int i = 0; i < 2; i++) {
        if (SPAN_IS(opts[i], "true"))
            b[i + 1] = 1;
        else if (!is_null(opts[i]) && !SPAN_IS(opts[i], "false"))
            return AV_DECLINE;
    }
    return out_write(o, b, 3) < 0 ? -1 : AV_OK;
}

static int
same_token(Span a, Span b)
{
    if (is_null(a) || is_null(b))
        return is_null(a) && is_null(b);
    return a.n == b.n && memcmp(a.p, b.p, a.n) == 0;
}

/* ------------------------------------------------------------------------------------------
 * AvroConverter
 *
 * convert_all works in three steps. The records' parts are taken from their objects (with
 * the GIL); the records are converted into one buffer up to the first one declined, without
 * the GIL when there are at least NOGIL_MIN of them (the sink converts in its producing
 * thread, so the router's thread runs meanwhile); then their objects are made (with the
 * GIL), the declined record is given to fallback, and the steps repeat from the record after
 * it. Plans are found in a PlanIndex: a hash table of the plans, made anew under the GIL
 * after plan() changed them, which nothing changes while it is read without the GIL. One
 * call at a time converts (a plan's scratch is the record's): the others wait for the lock.
 */
#define NOGIL_MIN 64

typedef struct {
    Py_ssize_t refs; /* changed with the GIL held */
    Py_ssize_t n, mask;
    Plan **plans;      /* strong references */
    Py_ssize_t *slots; /* mask + 1 slots: an index into plans, or -1 */
} PlanIndex;

typedef struct {
    PyObject_HEAD
    PyObject *plans;       /* (schema_id, topic) -> Plan */
    PlanIndex *index;      /* the plans' index (NULL: made at the next call) */
    int dirty;             /* plan() changed the plans since the index was made */
    Plan *last;            /* the plan of the last record converted (a stream of one-record
                              calls finds it without a lookup) */
    PyThread_type_lock lock;
} AvroConverter;

static uint64_t
hash_two(const char *a, Py_ssize_t an, const char *b, Py_ssize_t bn)
{
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (Py_ssize_t i = 0; i < an; i++)
        h = (h ^ (unsigned char)a[i]) * 1099511628211ULL;
    h = (h ^ 0xFF) * 1099511628211ULL;
    for (Py_ssize_t i = 0; i < bn; i++)
        h = (h ^ (unsigned char)b[i]) * 1099511628211ULL;
    return h;
}

static void
index_release(PlanIndex *ix)
{
    if (ix == NULL || --ix->refs > 0)
        return;
    for (Py_ssize_t i = 0; i < ix->n; i++)
        Py_DECREF(ix->plans[i]);
    PyMem_Free(ix->plans);
    PyMem_Free(ix->slots);
    PyMem_Free(ix);
}

static PlanIndex *
index_new(PyObject *plans)
{
    Py_ssize_t n = PyDict_GET_SIZE(plans), mask = 7;
    while (mask + 1 < 2 * n)
        mask = mask * 2 + 1;
    PlanIndex *ix = PyMem_Calloc(1, sizeof(PlanIndex));
    if (ix == NULL)
        return (PlanIndex *)PyErr_NoMemory();
    ix->refs = 1;
    ix->mask = mask;
    ix->plans = PyMem_Calloc(n ? n : 1, sizeof(Plan *));
    ix->slots = PyMem_Malloc((mask + 1) * sizeof(Py_ssize_t));
    if (ix->plans == NULL || ix->slots == NULL) {
        index_release(ix);
        return (PlanIndex *)PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i <= mask; i++)
        ix->slots[i] = -1;
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(plans, &pos, &k, &v)) {
        Plan *pl = (Plan *)v;
        uint64_t h = hash_two(PyBytes_AS_STRING(pl->schema_id), PyBytes_GET_SIZE(pl->schema_id),
                              pl->topic_p, pl->topic_n);
        Py_ssize_t s = (Py_ssize_t)(h & (uint64_t)mask);
        while (ix->slots[s] >= 0)
            s = (s + 1) & mask;
        ix->slots[s] = ix->n;
        ix->plans[ix->n++] = (Plan *)Py_NewRef(v);
    }
    return ix;
}

static int
plan_is(const Plan *pl, const char *sid, Py_ssize_t sn, const char *topic, Py_ssize_t tn)
{
    return pl->topic_n == tn && PyBytes_GET_SIZE(pl->schema_id) == sn &&
           memcmp(PyBytes_AS_STRING(pl->schema_id), sid, sn) == 0 &&
           memcmp(pl->topic_p, topic, tn) == 0;
}

/* the plan of (schema id, topic), or NULL (no GIL needed) */
static Plan *
index_find(const PlanIndex *ix, const char *sid, Py_ssize_t sn, const char *topic,
           Py_ssize_t tn)
{
    uint64_t h = hash_two(sid, sn, topic, tn);
    for (Py_ssize_t s = (Py_ssize_t)(h & (uint64_t)ix->mask); ix->slots[s] >= 0;
         s = (s + 1) & ix->mask) {
        Plan *pl = ix->plans[ix->slots[s]];
        if (plan_is(pl, sid, sn, topic, tn))
            return pl;
    }
    return NULL;
}

/* One record's parts, taken from its objects, and where its conversion is in the buffer. */
typedef struct {
    const char *topic, *value, *key; /* key NULL: None */
    Py_ssize_t topic_n, value_n, key_n;
    int plain;                       /* a (str, bytes | None, bytes, headers) tuple */
    Py_ssize_t key_at, key_len;      /* key_len -1: a null key */
    Py_ssize_t value_at, value_len;
} Job;

static void
take_parts(PyObject *item, Job *j)
{
    j->plain = 0;
    if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 4)
        return;
    PyObject *topic = PyTuple_GET_ITEM(item, 0), *key = PyTuple_GET_ITEM(item, 1),
             *value = PyTuple_GET_ITEM(item, 2);
    if (!PyUnicode_CheckExact(topic) || !PyBytes_CheckExact(value) ||
        !(key == Py_None || PyBytes_CheckExact(key)))
        return;
    if ((j->topic = PyUnicode_AsUTF8AndSize(topic, &j->topic_n)) == NULL) {
        PyErr_Clear(); /* not UTF-8: Python says what it is */
        return;
    }
    j->value = PyBytes_AS_STRING(value);
    j->value_n = PyBytes_GET_SIZE(value);
    j->key = key == Py_None ? NULL : PyBytes_AS_STRING(key);
    j->key_n = key == Py_None ? 0 : PyBytes_GET_SIZE(key);
    j->plain = 1;
}

/* The envelope's members (env) and its source's (src), in one pass over the record: its rows
 * are read as rows of `guess` (the plan of the record before) where they fit it, which
 * *rows_read says (1: before, 2: after). 1, or 0 (declined). */
static int
parse_envelope(Span whole, Plan *guess, Span *env, Span *src, int *rows_read)
{
    const char *p = whole.p, *end = whole.p + whole.n;
    Span k;
    memset(env, 0, sizeof(Span) * E_FIELDS);
    *rows_read = 0;
    if (p >= end || *p++ != '{' || p >= end)
        return 0;
    if (*p == '}')
        return 0; /* {}: no op */
    for (;;) {
        if (*p != '"')
            return 0;
        k.p = p;
        if ((p = avro_skip_string(p, end)) == NULL || p >= end || *p != ':')
            return 0;
        k.n = p++ - k.p;
        int j = 0;
        while (j < E_FIELDS && !span_is(k, ENV_NAMES[j], ENV_LENS[j]))
            j++;
        if (j == E_FIELDS || env[j].p != NULL)
            return 0;
        const char *q = NULL;
        if (j == E_SOURCE) {
            if ((q = members_at(p, end, SOURCE_NAMES, SOURCE_LENS, S_FIELDS, src)) == NULL)
                return 0;
        }
        else if ((j == E_BEFORE || j == E_AFTER) && guess != NULL && p < end && *p == '{') {
            q = members_at(p, end, guess->name_p, guess->name_n, guess->n,
                           j == E_BEFORE ? guess->before : guess->after);
            if (q != NULL)
                *rows_read |= j == E_BEFORE ? 1 : 2;
        }
        if (q == NULL && (q = avro_skip_value(p, end, 1)) == NULL)
            return 0;
        env[j].p = p;
        env[j].n = q - p;
        p = q;
        if (p >= end)
            return 0;
        if (*p == '}')
            return p + 1 == end && env[E_SOURCE].p != NULL;
        if (*p++ != ',' || p >= end)
            return 0;
    }
}

/* the record's Avro key into o (j->key_len -1: a null key) */
static int
write_key(Plan *pl, Job *j, Out *o, Out *tmp)
{
    j->key_len = -1;
    if (j->key == NULL)
        return AV_OK;
    Span ks = {j->key, j->key_n};
    if (SPAN_IS(ks, "null"))
        return AV_OK;
    if (pl->nkey == 0 || !members(ks, pl->key_name_p, pl->key_name_n, pl->nkey, pl->key))
        return AV_DECLINE;
    j->key_at = o->len;
    if (out_bytes(o, pl->key_header) < 0)
        return -1;
    for (Py_ssize_t i = 0; i < pl->nkey; i++) {
        Py_ssize_t c = pl->key_index[i];
        if (is_null(pl->key[i]))
            return AV_DECLINE; /* a key field cannot be null: Python says so */
        int r = avro_datum(o, tmp, pl->kinds[c], pl->params[c], pl->key[i]);
        if (r != AV_OK)
            return r == AV_NONE ? AV_DECLINE : r;
    }
    j->key_len = o->len - j->key_at;
    return AV_OK;
}

/* one record into o (its key, then its value): AV_OK, AV_DECLINE or -1 (no memory); reads
 * no Python object that can change, so it runs without the GIL */
static int
convert_job(const PlanIndex *ix, Plan **last, Job *j, Out *o, Out *tmp)
{
    if (!j->plain)
        return AV_DECLINE;
    Span env[E_FIELDS], src[S_FIELDS];
    Span whole = {j->value, j->value_n};
    Plan *guess = *last;
    int rows_read;
    if (!parse_envelope(whole, guess, env, src, &rows_read) || env[E_OP].p == NULL)
        return AV_DECLINE;
    Span sid = src[S_SCHEMA_ID];
    if (sid.p == NULL || sid.n < 3 || sid.p[0] != '"' || memchr(sid.p, '\\', sid.n) != NULL)
        return AV_DECLINE; /* no schema_id: a message (or an error Python reports) */
    Plan *pl = guess;
    if (pl == NULL || !plan_is(pl, sid.p + 1, sid.n - 2, j->topic, j->topic_n)) {
        if ((pl = index_find(ix, sid.p + 1, sid.n - 2, j->topic, j->topic_n)) == NULL)
            return AV_DECLINE; /* the first record of its table and topic */
        *last = pl;
        rows_read = 0;
    }

    int has_before = !is_null(env[E_BEFORE]), has_after = !is_null(env[E_AFTER]);
    int has_toast = !is_null(env[E_TOAST]);
    if ((has_before && !(rows_read & 1) &&
         !members(env[E_BEFORE], pl->name_p, pl->name_n, pl->n, pl->before)) ||
        (has_after && !(rows_read & 2) &&
         !members(env[E_AFTER], pl->name_p, pl->name_n, pl->n, pl->after)))
        return AV_DECLINE;
    if (SPAN_IS(env[E_OP], "\"u\"") && has_before && pl->nkey) {
        /* a key change is two records (a delete and a create): Python writes them */
        if (!has_after)
            return AV_DECLINE;
        for (Py_ssize_t i = 0; i < pl->nkey; i++)
            if (!same_token(pl->before[pl->key_index[i]], pl->after[pl->key_index[i]]))
                return AV_DECLINE;
    }
    Py_ssize_t toast_count = 0;
    int r;
    if (has_toast && (r = mark_toast(pl, env[E_TOAST], has_after, &toast_count)) != AV_OK)
        return r;

    Py_ssize_t mark = o->len;
    r = write_key(pl, j, o, tmp);
    j->value_at = o->len;
    if (r == AV_OK)
        r = out_bytes(o, pl->value_header) < 0 ? -1 : AV_OK;
    if (r == AV_OK)
        r = has_before ? write_row(o, tmp, pl, pl->before, NULL) : WROTE_NULL(o);
    if (r == AV_OK)
        r = has_after ? write_row(o, tmp, pl, pl->after, has_toast ? pl->toast : NULL)
                      : WROTE_NULL(o);
    if (r == AV_OK)
        r = write_source(o, tmp, src);
    if (r == AV_OK)
        r = write_string(o, tmp, env[E_OP]);
    if (r == AV_OK)
        r = write_opt_long(o, env[E_TS_MS]);
    if (r == AV_OK)
        r = has_toast ? write_toast(o, tmp, env[E_TOAST], toast_count) : WROTE_NULL(o);
    if (r == AV_OK)
        r = write_truncate(o, env[E_TRUNCATE]);
    if (r == AV_OK)
        r = WROTE_NULL(o); /* key_change: null but in a key change's two records */
    if (r != AV_OK) {
        o->len = mark;
        return r;
    }
    j->value_len = o->len - j->value_at;
    return AV_OK;
}

/* jobs[from:n] converted into o up to the first that is not: its index (n: all), its
 * outcome in *status */
static Py_ssize_t
convert_jobs(const PlanIndex *ix, Plan **last, Job *jobs, Py_ssize_t from, Py_ssize_t n,
             Out *o, Out *tmp, int *status)
{
    Py_ssize_t i = from;
    *status = AV_OK;
    for (; i < n; i++)
        if ((*status = convert_job(ix, last, &jobs[i], o, tmp)) != AV_OK)
            break;
    return i;
}

/* the converted record of job j as (topic, key, value, headers) */
static PyObject *
converted(PyObject *item, const Job *j, const Out *o)
{
    PyObject *key = j->key_len < 0 ? Py_NewRef(Py_None)
                                   : PyBytes_FromStringAndSize(o->p + j->key_at, j->key_len);
    if (key == NULL)
        return NULL;
    PyObject *bytes = PyBytes_FromStringAndSize(o->p + j->value_at, j->value_len);
    PyObject *result = bytes == NULL ? NULL : PyTuple_New(4);
    if (result == NULL) {
        Py_DECREF(key);
        Py_XDECREF(bytes);
        return NULL;
    }
    PyObject *headers = PyTuple_GET_ITEM(item, 3);
    PyTuple_SET_ITEM(result, 0, Py_NewRef(PyTuple_GET_ITEM(item, 0)));
    PyTuple_SET_ITEM(result, 1, key);
    PyTuple_SET_ITEM(result, 2, bytes);
    PyTuple_SET_ITEM(result, 3, Py_NewRef(headers));
    if (headers == Py_None || !PyObject_GC_IsTracked(headers))
        /* atoms only, as the recorders' records (recorder.c): never part of a cycle, so the
         * collector need not look at the records a sink holds until Kafka has them */
        PyObject_GC_UnTrack(result);
    return result;
}

static int
extend_with(PyObject *out, PyObject *converted)
{
    if (converted == Py_None)
        return 0;
    if (!PyList_CheckExact(converted))
        return PyList_Append(out, converted);
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(converted); i++)
        if (PyList_Append(out, PyList_GET_ITEM(converted, i)) < 0)
            return -1;
    return 0;
}

static void
lock_converter(AvroConverter *self)
{
    if (!PyThread_acquire_lock(self->lock, NOWAIT_LOCK)) {
        Py_BEGIN_ALLOW_THREADS
        PyThread_acquire_lock(self->lock, WAIT_LOCK);
        Py_END_ALLOW_THREADS
    }
}

/* convert_all(records, fallback) -> list */
static PyObject *
converter_convert_all(AvroConverter *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (native_usage(nargs == 2, "convert_all(records, fallback)") < 0)
        return NULL;
    /* a tuple of its own: the records stay alive (and in place) while converted without
     * the GIL */
    PyObject *items = PySequence_Tuple(args[0]);
    if (items == NULL) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "records must be a sequence");
        }
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(items);
    PyObject *out = PyList_New(0);
    Job *jobs = PyMem_RawMalloc((n ? n : 1) * sizeof(Job));
    if (out == NULL || jobs == NULL) {
        if (jobs == NULL)
            PyErr_NoMemory();
        Py_XDECREF(out);
        PyMem_RawFree(jobs);
        Py_DECREF(items);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        take_parts(PyTuple_GET_ITEM(items, i), &jobs[i]);
    lock_converter(self);
    Out o, tmp;
    out_init(&o);
    out_init(&tmp);
    o.quiet = tmp.quiet = 1;
    Plan *held = (Plan *)Py_XNewRef(self->last), *last = held;
    for (Py_ssize_t i = 0; i < n;) {
        if (self->index == NULL || self->dirty) {
            PlanIndex *ix = index_new(self->plans);
            if (ix == NULL) {
                Py_CLEAR(out);
                break;
            }
            index_release(self->index);
            self->index = ix;
            self->dirty = 0;
            last = NULL; /* may be a plan replaced since */
        }
        PlanIndex *ix = self->index;
        ix->refs++;
        int status;
        Py_ssize_t stop;
        o.len = 0;
        if (n - i >= NOGIL_MIN && avro_values_nogil()) {
            Py_BEGIN_ALLOW_THREADS
            stop = convert_jobs(ix, &last, jobs, i, n, &o, &tmp, &status);
            Py_END_ALLOW_THREADS
        }
        else
            stop = convert_jobs(ix, &last, jobs, i, n, &o, &tmp, &status);
        for (Py_ssize_t k = i; k < stop && out != NULL; k++) {
            PyObject *rec = converted(PyTuple_GET_ITEM(items, k), &jobs[k], &o);
            if (rec == NULL || PyList_Append(out, rec) < 0)
                Py_CLEAR(out);
            Py_XDECREF(rec);
        }
        if (out != NULL && stop < n) {
            if (status < 0) {
                PyErr_NoMemory();
                Py_CLEAR(out);
            }
            else {
                PyObject *item = PyTuple_GET_ITEM(items, stop);
                PyObject *fb = PyObject_CallOneArg(args[1], item);
                if (fb == NULL || extend_with(out, fb) < 0)
                    Py_CLEAR(out);
                Py_XDECREF(fb);
            }
        }
        if (out == NULL) {
            index_release(ix);
            break;
        }
        if (self->dirty) /* fallback made a plan: the next records look for it */
            last = NULL;
        index_release(ix);
        i = stop + 1;
    }
    if (out != NULL && !self->dirty && last != self->last)
        Py_XSETREF(self->last, (Plan *)Py_XNewRef(last));
    Py_XDECREF(held);
    PyThread_release_lock(self->lock);
    out_free(&o);
    out_free(&tmp);
    PyMem_RawFree(jobs);
    Py_DECREF(items);
    return out;
}

/* plan(schema_id, topic, value_header, key_header, names, kinds, params, placeholders,
 *      key_index) */
static PyObject *
converter_plan(AvroConverter *self, PyObject *args)
{
    PyObject *a[9];
    if (!PyArg_UnpackTuple(args, "plan", 9, 9, &a[0], &a[1], &a[2], &a[3], &a[4], &a[5], &a[6],
                           &a[7], &a[8]))
        return NULL;
    Plan *pl = plan_new(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8]);
    if (pl == NULL)
        return NULL;
    PyObject *key = PyTuple_Pack(2, a[0], a[1]);
    int r = key == NULL ? -1 : PyDict_SetItem(self->plans, key, (PyObject *)pl);
    Py_XDECREF(key);
    Py_DECREF(pl);
    Py_CLEAR(self->last); /* found in plans again, the new one if it replaced it */
    self->dirty = 1;
    if (r < 0)
        return NULL;
    Py_RETURN_NONE;
}

static int
converter_init(AvroConverter *self, PyObject *args, PyObject *kwds)
{
    if (!PyArg_ParseTuple(args, ":AvroConverter") || (kwds && PyDict_GET_SIZE(kwds))) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "AvroConverter() takes no arguments");
        return -1;
    }
    if (self->plans == NULL && (self->plans = PyDict_New()) == NULL)
        return -1;
    if (self->lock == NULL && (self->lock = PyThread_allocate_lock()) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void
converter_dealloc(AvroConverter *self)
{
    Py_XDECREF(self->plans);
    Py_XDECREF(self->last);
    index_release(self->index);
    if (self->lock != NULL)
        PyThread_free_lock(self->lock);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef converter_methods[] = {
    FASTCALL("convert_all", converter_convert_all,
     "convert_all(records, fallback) -> list: the records in Avro; fallback(record) converts "
     "each record this declines"),
    {"plan", (PyCFunction)converter_plan, METH_VARARGS,
     "plan(schema_id, topic, value_header, key_header, names, kinds, params, placeholders, "
     "key_index): a table layout on a topic (router.formats.avro._Table.native_plan)"},
    {NULL}};

static PyTypeObject AvroConverterType = {
    NATIVE_TYPE("router._native.AvroConverter", AvroConverter, Py_TPFLAGS_DEFAULT,
                "AvroConverter(): router.formats.avro.AvroFormat's conversion of plain "
                "records"),
    .tp_init = (initproc)converter_init,
    .tp_dealloc = (destructor)converter_dealloc,
    .tp_methods = converter_methods,
};

int
avro_setup(PyObject *module)
{
    for (int i = 0; i < E_FIELDS; i++)
        ENV_LENS[i] = (Py_ssize_t)strlen(ENV_NAMES[i]);
    for (int i = 0; i < S_FIELDS; i++)
        SOURCE_LENS[i] = (Py_ssize_t)strlen(SOURCE_NAMES[i]);
    for (int i = 0; i < 2; i++)
        TRUNCATE_LENS[i] = (Py_ssize_t)strlen(TRUNCATE_NAMES[i]);
    if (avro_values_setup() < 0 || PyType_Ready(&PlanType) < 0 ||
        PyType_Ready(&AvroConverterType) < 0)
        return -1;
    return PyModule_AddObjectRef(module, "AvroConverter", (PyObject *)&AvroConverterType);
}
