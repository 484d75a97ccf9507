/* copy_rows: rows of PostgreSQL's COPY text format (router.snapshot.core; its Python twin:
 * router.snapshot.core:copy_rows_py).
 *
 * copy_rows(data: bytes) -> list[tuple] | None: whole lines of ``COPY ... TO STDOUT`` output
 * (each ending with a newline; a last piece without one is a line too), each as a tuple of
 * str fields split at tabs, ``\N`` as None, the escapes \b \f \n \r \t \v \\ and a
 * backslash before any other character (that character) undone. None for what it leaves to
 * the twin: octal or hex escapes (COPY never writes them), bytes that are not UTF-8.
 */
#include "copytext.h"

/* one field's text: [p, p + n), has_escape when it holds a backslash; NULL with no error
 * set: decline */
/* str of [p, p + n): ASCII copied as is, else decoded (NULL, no error set: not UTF-8) */
static PyObject *
text(const char *p, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    while (i < n && (unsigned char)p[i] < 0x80)
        i++;
    if (i == n) {
        PyObject *s = PyUnicode_New(n, 127);
        if (s != NULL)
            memcpy(PyUnicode_DATA(s), p, n);
        return s;
    }
    PyObject *s = PyUnicode_DecodeUTF8(p, n, NULL);
    if (s == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
        PyErr_Clear();
    return s;
}

static PyObject *
field_text(const char *p, Py_ssize_t n, int has_escape, char *scratch)
{
    if (!has_escape)
        return text(p, n);
    if (n == 2 && p[0] == '\\' && p[1] == 'N') {
        Py_INCREF(Py_None);
        return Py_None;
    }
    Py_ssize_t o = copy_unescape(p, n, scratch);
    if (o < 0)
        return NULL;
    return text(scratch, o);
}

static PyObject *
copy_rows(PyObject *self, PyObject *arg)
{
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "copy_rows: bytes expected");
        return NULL;
    }
    const char *data = PyBytes_AS_STRING(arg);
    Py_ssize_t size = PyBytes_GET_SIZE(arg);
    PyObject *rows = PyList_New(0), *fields = NULL;
    char *scratch = PyMem_Malloc(size > 0 ? size : 1);
    if (rows == NULL || scratch == NULL)
        goto fail;
    Py_ssize_t pos = 0;
    while (pos < size) {
        const char *line = data + pos;
        const char *nl = memchr(line, '\n', size - pos);
        Py_ssize_t len = nl ? nl - line : size - pos;
        pos += len + (nl != NULL);
        Py_ssize_t nf = 1;
        for (const char *c = memchr(line, '\t', len); c != NULL;
             c = memchr(c + 1, '\t', line + len - c - 1))
            nf++;
        fields = PyTuple_New(nf);
        if (fields == NULL)
            goto fail;
        Py_ssize_t start = 0;
        for (Py_ssize_t k = 0; k < nf; k++) {
            const char *f = line + start;
            const char *tab = k + 1 < nf ? memchr(f, '\t', len - start) : NULL;
            Py_ssize_t flen = tab ? tab - f : len - start;
            PyObject *v = field_text(f, flen, memchr(f, '\\', flen) != NULL, scratch);
            if (v == NULL) {
                if (PyErr_Occurred())
                    goto fail;
                goto decline;
            }
            PyTuple_SET_ITEM(fields, k, v);
            start += flen + 1;
        }
        int bad = PyList_Append(rows, fields);
        Py_CLEAR(fields);
        if (bad < 0)
            goto fail;
    }
    PyMem_Free(scratch);
    return rows;
decline:
    PyMem_Free(scratch);
    Py_XDECREF(fields);
    Py_DECREF(rows);
    Py_RETURN_NONE;
fail:
    PyMem_Free(scratch);
    Py_XDECREF(fields);
    Py_XDECREF(rows);
    return NULL;
}

static PyMethodDef copytext_methods[] = {
    {"copy_rows", copy_rows, METH_O,
     "copy_rows(data) -> list[tuple] | None: rows of COPY text output (router.snapshot.core)"},
    {NULL}};

int
copytext_setup(PyObject *module)
{
    return PyModule_AddFunctions(module, copytext_methods);
}
