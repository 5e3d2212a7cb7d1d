/* What the recorder's C modules share (_batch.c, _host.c): a Python integer as a 64-bit one, and a tuple of columns
 * for the caller to fill. */
#ifndef ZEROMON_RECORDER_COLUMNS_H
#define ZEROMON_RECORDER_COLUMNS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* ``value`` (an int) as a 64-bit integer into *out: 1, or 0 (past 64 bits, or not an int; no exception set). */
static inline int
as_int64(PyObject *value, int64_t *out)
{
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    *out = (int64_t)v;
    return 1;
}

/* A tuple of ``count`` new lists of n NULLs each, filled by the caller (PyList_SET_ITEM), or NULL. */
static inline PyObject *
new_columns(int count, Py_ssize_t n)
{
    PyObject *columns = PyTuple_New(count);
    if (columns == NULL) return NULL;
    for (int c = 0; c < count; c++) {
        PyObject *column = PyList_New(n);
        if (column == NULL) {
            Py_DECREF(columns);
            return NULL;
        }
        PyTuple_SET_ITEM(columns, c, column);
    }
    return columns;
}
#endif
