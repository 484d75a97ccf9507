/* What every record of a transaction shares (router.formats.envelope.TableEncoder._use_tx in C). */
#include "../native.h"

/* days since 1970-01-01 -> civil date (proleptic Gregorian; H. Hinnant's algorithm) */
static void
civil_from_days(long long z, long long *y, unsigned *m, unsigned *d)
{
    z += 719468;
    long long era = (z >= 0 ? z : z - 146096) / 146097;
    unsigned doe = (unsigned)(z - era * 146097);
    unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    long long yy = (long long)yoe + era * 400;
    unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    unsigned mp = (5 * doy + 2) / 153;
    *d = doy - (153 * mp + 2) / 5 + 1;
    *m = mp < 10 ? mp + 3 : mp - 9;
    *y = yy + (*m <= 2);
}

static long long
floor_div(long long a, long long b)
{
    long long q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

#define PG_EPOCH_DAYS 10957LL           /* 1970-01-01 .. 2000-01-01 */
#define PG_EPOCH_UNIX_US 946684800000000LL
/* beyond a few thousand years either way the Python code decides (years 1-9999, infinities) */
#define TIME_LIMIT (4000000LL * 86400LL * 1000000LL)

/* ------------------------------------------------------------------------------------------
 * tx_bits(commit_lsn, xid, commit_time, origin, origin_lsn, route_part) -> (mid, tail) | None
 *
 * mid  = b',"commit_lsn":<commit_lsn>,"seq":'
 * tail = b',"xid":<xid>,"commit_time":"<ISO>","origin":null,"origin_lsn":<n|null>'
 *        + route_part + b'},"ts_ms":<ms>}'
 * exactly as TableEncoder._use_tx builds them; None (the Python code runs) for an origin,
 * a commit time outside years 1-9999, or anything not a plain int.
 */
static PyObject *
native_tx_bits(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6 || !PyBytes_CheckExact(args[5])) {
        PyErr_SetString(PyExc_TypeError, "tx_bits(commit_lsn, xid, commit_time, origin, "
                                         "origin_lsn, route_part: bytes)");
        return NULL;
    }
    if (args[3] != Py_None || !PyLong_CheckExact(args[0]) || !PyLong_CheckExact(args[1]) ||
        !PyLong_CheckExact(args[2]) || (args[4] != Py_None && !PyLong_CheckExact(args[4])))
        Py_RETURN_NONE;
    unsigned long long commit_lsn = PyLong_AsUnsignedLongLong(args[0]);
    unsigned long long xid = PyLong_AsUnsignedLongLong(args[1]);
    long long us = PyLong_AsLongLong(args[2]);
    unsigned long long origin_lsn = args[4] == Py_None ? 0 : PyLong_AsUnsignedLongLong(args[4]);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (us > TIME_LIMIT || us < -TIME_LIMIT)
        Py_RETURN_NONE;
    long long secs = floor_div(us, 1000000), frac = us - secs * 1000000;
    long long days = floor_div(secs, 86400), sod = secs - days * 86400;
    long long year;
    unsigned month, day;
    civil_from_days(days + PG_EPOCH_DAYS, &year, &month, &day);
    if (year < 1 || year > 9999)
        Py_RETURN_NONE;
    long long ts_ms = floor_div(us + PG_EPOCH_UNIX_US, 1000);
    char mid[64], tail[256];
    int nmid = snprintf(mid, sizeof(mid), ",\"commit_lsn\":%llu,\"seq\":", commit_lsn);
    char olsn[24];
    if (args[4] == Py_None)
        strcpy(olsn, "null");
    else
        snprintf(olsn, sizeof(olsn), "%llu", origin_lsn);
    int nhead = snprintf(tail, sizeof(tail),
                         ",\"xid\":%llu,\"commit_time\":\"%04lld-%02u-%02uT%02lld:%02lld:%02lld."
                         "%06lld+00:00\",\"origin\":null,\"origin_lsn\":%s",
                         xid, year, month, day, sod / 3600, (sod / 60) % 60, sod % 60, frac,
                         olsn);
    char end[40];
    int nend = snprintf(end, sizeof(end), "},\"ts_ms\":%lld}", ts_ms);
    Py_ssize_t nroute = PyBytes_GET_SIZE(args[5]);
    PyObject *tail_obj = PyBytes_FromStringAndSize(NULL, nhead + nroute + nend);
    if (tail_obj == NULL)
        return NULL;
    char *out = PyBytes_AS_STRING(tail_obj);
    memcpy(out, tail, nhead);
    memcpy(out + nhead, PyBytes_AS_STRING(args[5]), nroute);
    memcpy(out + nhead + nroute, end, nend);
    PyObject *mid_obj = PyBytes_FromStringAndSize(mid, nmid);
    if (mid_obj == NULL) {
        Py_DECREF(tail_obj);
        return NULL;
    }
    return Py_BuildValue("(NN)", mid_obj, tail_obj);
}

static PyMethodDef tx_methods[] = {
    FASTCALL("tx_bits", native_tx_bits,
     "tx_bits(commit_lsn, xid, commit_time, origin, origin_lsn, route_part) -> (mid, tail) "
     "| None"),
    {NULL}};

int
tx_setup(PyObject *module)
{
    return PyModule_AddFunctions(module, tx_methods);
}
