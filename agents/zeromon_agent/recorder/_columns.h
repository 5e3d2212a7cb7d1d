/* What the recorder's C modules share (_batch.c, _host.c): a Python integer as a 64-bit one, a tuple of columns for
 * the caller to fill, and a step's accumulator. */
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

/* A kernel's columns, made and filled (a tuple of lists), let out of the garbage collector's lists where they hold
 * nothing it tracks: _batch.c's untrack rule (Outbox.release's, for what the live views keep), told here as the values
 * are in hand, each value's type looked at once, rather than walked again through each list's traverse at the pass's
 * end, where untrack now finds them untracked. A list that holds a tracked object (a user's) stays tracked, and the
 * tuple with it. */
static inline void
untrack_columns(PyObject *columns)
{
    int all = 1;
    for (Py_ssize_t c = 0; c < PyTuple_GET_SIZE(columns); c++) {
        PyObject *column = PyTuple_GET_ITEM(columns, c), **items = ((PyListObject *)column)->ob_item;
        Py_ssize_t n = PyList_GET_SIZE(column), i = 0;
        while (i < n && !(PyObject_IS_GC(items[i]) && PyObject_GC_IsTracked(items[i]))) i++;
        if (i < n) all = 0;
        else if (PyObject_GC_IsTracked(column)) PyObject_GC_UnTrack(column);
    }
    if (all && PyObject_GC_IsTracked(columns)) PyObject_GC_UnTrack(columns);
}

/* StepBook.acc(step): ``step``'s accumulator in ``accs`` (StepBook.accs, a dict), made by ``new_acc()`` at its first
 * record: a borrowed reference, or NULL with an exception. */
static inline PyObject *
step_acc(PyObject *accs, PyObject *new_acc, PyObject *step)
{
    PyObject *acc = PyDict_GetItemWithError(accs, step);
    if (acc != NULL || PyErr_Occurred()) return acc;
    acc = PyObject_CallNoArgs(new_acc);
    if (acc == NULL) return NULL;
    int set = PyDict_SetItem(accs, step, acc);
    Py_DECREF(acc);  /* the dict holds it */
    return set < 0 ? NULL : acc;
}
#endif
