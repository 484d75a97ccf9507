/* router._native's module: configure() and the shared state it sets (native.h). */
#include "native.h"

PyObject *unchanged_toast = NULL, *insert_type = NULL, *update_type = NULL, *delete_type = NULL;
Py_ssize_t max_columns = 1664;

/* ------------------------------------------------------------------------------------------
 * configure(unchanged_toast, max_columns, Insert, Update, Delete): router.pgoutput's
 * sentinel, column limit and message classes
 */

static PyObject *
native_configure(PyObject *self, PyObject *args)
{
    PyObject *sentinel, *insert, *update, *delete;
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "OnOOO:configure", &sentinel, &limit, &insert, &update,
                          &delete))
        return NULL;
    Py_XSETREF(unchanged_toast, Py_NewRef(sentinel));
    Py_XSETREF(insert_type, Py_NewRef(insert));
    Py_XSETREF(update_type, Py_NewRef(update));
    Py_XSETREF(delete_type, Py_NewRef(delete));
    max_columns = limit;
    Py_RETURN_NONE;
}


static PyMethodDef module_methods[] = {
    {"configure", native_configure, METH_VARARGS,
     "configure(unchanged_toast, max_columns, Insert, Update, Delete): router.pgoutput's"},
    FASTCALL("verify_row", native_verify_row,
     "verify_row(key, head, values, buckets) -> bytes | None: router.verify.digests's "
     "digests of one row"),
    FASTCALL("verify_fold", native_verify_fold,
     "verify_fold(msgs, ends, rows, cut, buckets, tools) -> (read, after_cut, folded): "
     "router.verify.digests.fold_batch_py, a batch of a JSON-format topic's messages folded"),
    FASTCALL("verify_copy", native_verify_copy,
     "verify_copy(data, keys, columns, head, buckets, acc) -> rows: "
     "router.verify.digests.copy_sums_py, COPY text rows' digests summed by bucket"),
    FASTCALL("verify_sums", native_verify_sums,
     "verify_sums(rows, buckets) -> dict | None: router.verify.digests.bucket_sums, a fold's "
     "rows summed by bucket"),
    {NULL}};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT, "router._native",
    "The per-change hot path in C (router/_native/); each function's Python twin runs "
    "wherever it returns None.",
    -1, module_methods};

PyMODINIT_FUNC
PyInit__native(void)
{
    PyObject *m = PyModule_Create(&native_module);
    if (m == NULL)
        return NULL;
    if (pgoutput_setup(m) < 0 || short_setup(m) < 0 || codec_setup(m) < 0 ||
        records_setup(m) < 0 || delivery_setup(m) < 0 || avro_setup(m) < 0 ||
        copytext_setup(m) < 0 || copyrecords_setup(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
