/* What the recorder's C modules share (_batch.c, _host.c): a Python integer as a 64-bit one, a tuple of columns for
 * the caller to fill, a run's values summed by key, a step's accumulator, and its fields read and set at their slots. */
#ifndef ZEROMON_RECORDER_COLUMNS_H
#define ZEROMON_RECORDER_COLUMNS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>

#include "_int64.h"    /* zeromon/model's: zm_int64 */
#include "_tracked.h"  /* zeromon/model's: zm_tracked, zm_untracked_if_atomic */

/* ``value`` (an int) as a 64-bit integer into *out: 1, or 0 (past 64 bits, or not an int; no exception set). */
static inline int
as_int64(PyObject *value, int64_t *out)
{
    int converted = zm_int64(value, out);
    if (converted < 0) PyErr_Clear();
    return converted == 1;
}

/* A slotted class's fields by name (a step's accumulator, StepAcc), read and set at their slots' offsets: what
 * PyObject_GetAttr and PyObject_SetAttr do there (the type's attribute look-up, its member descriptor's get or set),
 * without the look-up each time. ``type`` the class last seen (a reference kept, so that its address names it), its
 * fields' offsets, and whether every field is a plain object slot of a class that reads and sets attributes the
 * generic way (no __getattribute__, __getattr__ or __setattr__ of its own); where not, the fields go by name. */
#define SLOT_FIELDS_MAX 24
typedef struct {
    PyTypeObject *type;
    Py_ssize_t offsets[SLOT_FIELDS_MAX];
    int direct;
} SlotFields;

/* Whether ``obj``'s fields ``names`` (count of them) can be reached at their slots (``slots`` updated for its type). */
static inline int
slots_direct(SlotFields *slots, PyObject *obj, PyObject *const *names, int count)
{
    PyTypeObject *type = Py_TYPE(obj);
    if (slots->type == type) return slots->direct;
    Py_INCREF(type);
    Py_XSETREF(slots->type, type);
    slots->direct = count <= SLOT_FIELDS_MAX && type->tp_getattro == PyObject_GenericGetAttr
                    && type->tp_setattro == PyObject_GenericSetAttr;
    for (int f = 0; slots->direct && f < count; f++) {
        PyObject *descr = _PyType_Lookup(type, names[f]);  /* borrowed, no error set */
        PyMemberDef *member = descr != NULL && Py_IS_TYPE(descr, &PyMemberDescr_Type)
                              ? ((PyMemberDescrObject *)descr)->d_member : NULL;
        if (member == NULL || member->type != T_OBJECT_EX || (member->flags & READONLY)) slots->direct = 0;
        else slots->offsets[f] = member->offset;
    }
    return slots->direct;
}

/* getattr(obj, names[f]) (a new reference, or NULL with AttributeError), at its slot where ``slots`` can. */
static inline PyObject *
slot_get(SlotFields *slots, PyObject *obj, PyObject *const *names, int count, int f)
{
    if (slots_direct(slots, obj, names, count)) {
        PyObject *value = *(PyObject **)((char *)obj + slots->offsets[f]);
        if (value != NULL) return Py_NewRef(value);
    }
    return PyObject_GetAttr(obj, names[f]);  /* an unset slot's AttributeError, or no slot */
}

/* setattr(obj, names[f], value): 0, or -1 with an exception; at its slot where ``slots`` can. */
static inline int
slot_set(SlotFields *slots, PyObject *obj, PyObject *const *names, int count, int f, PyObject *value)
{
    if (slots_direct(slots, obj, names, count)) {
        Py_XSETREF(*(PyObject **)((char *)obj + slots->offsets[f]), Py_NewRef(value));
        return 0;
    }
    return PyObject_SetAttr(obj, names[f], value);
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
        while (i < n && !zm_tracked(items[i])) i++;
        if (i < n) all = 0;
        else if (PyObject_GC_IsTracked(column)) PyObject_GC_UnTrack(column);
    }
    if (all && PyObject_GC_IsTracked(columns)) PyObject_GC_UnTrack(columns);
}

/* ``dict[key] = dict.get(key, 0) + value``, as Python adds them: 0, or -1 with an exception. */
static inline int
dict_add(PyObject *dict, PyObject *key, PyObject *value)
{
    PyObject *held = PyDict_GetItemWithError(dict, key);  /* borrowed */
    if (held == NULL && PyErr_Occurred()) return -1;
    PyObject *zero = held == NULL ? PyLong_FromLong(0) : NULL;  /* a small int: CPython's own, not made */
    PyObject *sum = held != NULL || zero != NULL ? PyNumber_Add(held != NULL ? held : zero, value) : NULL;
    Py_XDECREF(zero);
    int set = sum != NULL ? PyDict_SetItem(dict, key, sum) : -1;
    Py_XDECREF(sum);
    return set;
}

/* A run's 64-bit values summed by key (a step's bytes by op, its nanoseconds by phase), for a dict of sums that Python
 * adds to one value at a time (``sums[key] = sums.get(key, 0) + value``): each key's sum added once, which is the same
 * where every key is an exact str, every value, sum and held sum an exact int (an int's additions are associative) and
 * keys are made in the order the run first names them. */
enum { KEY_SUMS_MAX = 8 };
typedef struct {
    PyObject *key[KEY_SUMS_MAX];  /* borrowed from the caller's run */
    int64_t sum[KEY_SUMS_MAX];
    int n;
} KeySums;

/* ``values[i]`` of ``keys[i]`` (i < n) added to ``sums`` (begun with n = 0): 1, or 0 where a key is not an exact str,
 * the run names more than KEY_SUMS_MAX keys or a sum passes 64 bits (then the caller adds one by one). */
static inline int
key_sums_add(KeySums *sums, PyObject *const *keys, const int64_t *values, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyUnicode_CheckExact(keys[i])) return 0;
        int k = 0;
        while (k < sums->n && sums->key[k] != keys[i] && PyUnicode_Compare(sums->key[k], keys[i]) != 0) k++;
        if (k == sums->n) {
            if (k == KEY_SUMS_MAX) return 0;
            sums->key[k] = keys[i];
            sums->sum[sums->n++] = 0;
        }
        if (__builtin_add_overflow(sums->sum[k], values[i], &sums->sum[k])) return 0;
    }
    return 1;
}

/* Each key's sum added to ``dict[key]`` (made where missing, in the run's order; what dict_add does, the sums held
 * looked up once for the check and the addition): 1; 0 where a sum the dict holds for one of them is not an exact int
 * (nothing changed: the caller adds one by one); -1 with an exception. */
static inline int
key_sums_into(PyObject *dict, const KeySums *sums)
{
    PyObject *held[KEY_SUMS_MAX];
    for (int k = 0; k < sums->n; k++) {
        held[k] = PyDict_GetItemWithError(dict, sums->key[k]);  /* borrowed: no code runs before its use below */
        if (held[k] == NULL && PyErr_Occurred()) return -1;
        if (held[k] != NULL && !PyLong_CheckExact(held[k])) return 0;
    }
    for (int k = 0; k < sums->n; k++) {
        PyObject *sum = PyLong_FromLongLong(sums->sum[k]);
        if (sum != NULL && held[k] != NULL) Py_SETREF(sum, PyNumber_Add(held[k], sum));
        if (sum == NULL || PyDict_SetItem(dict, sums->key[k], sum) < 0) {
            Py_XDECREF(sum);
            return -1;
        }
        Py_DECREF(sum);
    }
    return 1;
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
