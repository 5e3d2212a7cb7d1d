/* What Python's garbage collector follows, for zeromon's C modules (the agent's recorder and its hooks' ring, whose
 * builds have this folder on their include path: setup.py). */
#ifndef ZEROMON_TRACKED_H
#define ZEROMON_TRACKED_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Whether the collector follows ``obj``: a container it tracks (numbers, strings and untracked tuples are not). */
static inline int
zm_tracked(PyObject *obj)
{
    return PyObject_IS_GC(obj) && PyObject_GC_IsTracked(obj);
}

/* ``tuple`` (a new reference, or NULL; returned as given) out of the collector's lists where none of its items is
 * tracked: what the collector's first look at it would do (CPython's _PyTuple_MaybeUntrack), done as it is made or
 * taken, so that no young collection walks it first. A pass's phase spans and phases, and a memory sample's values,
 * are such tuples (names, steps, times, sizes). */
static inline PyObject *
zm_untracked_if_atomic(PyObject *tuple)
{
    if (tuple == NULL) return NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(tuple); i++) {
        if (zm_tracked(PyTuple_GET_ITEM(tuple, i))) return tuple;
    }
    PyObject_GC_UnTrack(tuple);
    return tuple;
}

#endif
