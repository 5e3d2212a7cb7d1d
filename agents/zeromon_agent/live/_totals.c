/* zeromon_agent.live._totals: the live totals' count of the collectives handed to them, in C (an optional build,
 * setup.py).
 *
 * LiveTotals counts the collectives a pass hands it when its totals are read (a scrape) or when 4,096 wait: for each,
 * its (op, meaning)'s calls, bytes, time blocked, timed calls, seconds and duration bucket, and its op's recent bus
 * bandwidth. In Python that is a loop of some twenty bytecodes a collective; here the rows are read in one pass into
 * sums by key, and each key's totals are then set once. The same values as the Python loop (LiveTotals._count_rows;
 * tests/test_recorder_fast_path.py runs both): each float is added in the rows' order to the total it had, as
 * Python's += does, keys and windows are made in the order their first row comes.
 *
 * count() returns False, having changed nothing, where the rows are not all of the types it takes (an exact str op
 * and meaning, an int byte count within 64 bits, a float time blocked, None or a float duration and bandwidth), where
 * an existing total is not as LiveTotals makes it, or where they hold more than MAX_KEYS keys: the caller's Python
 * loop counts them then.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "_int64.h"  /* zeromon/model's: zm_int64 */

enum { MAX_KEYS = 64, MAX_BOUNDS = 64, ROW_FIELDS = 6 };

typedef struct {
    PyObject *op, *meaning;  /* borrowed from the rows, which the caller's list keeps alive */
    PyObject *totals;        /* new reference: the key's totals, made here where it had none yet (fresh) */
    int fresh;
    int64_t calls, bytes, timed;
    double blocked_s, seconds;  /* the totals' own, each row's added in order */
    int64_t buckets[MAX_BOUNDS + 1];
} Key;

typedef struct {
    PyObject *op;       /* borrowed */
    PyObject *samples;  /* new reference: the op's bandwidths, in order */
} Window;

typedef struct {
    PyObject *collectives, *make_totals;
    double bounds[MAX_BOUNDS];
    Py_ssize_t nbounds;
    Key keys[MAX_KEYS];
    Py_ssize_t nkeys, last;
    Window windows[MAX_KEYS];
    Py_ssize_t nwindows;
} Count;

static void
count_clear(Count *c)
{
    for (Py_ssize_t i = 0; i < c->nkeys; i++) Py_XDECREF(c->keys[i].totals);
    for (Py_ssize_t i = 0; i < c->nwindows; i++) Py_XDECREF(c->windows[i].samples);
    c->nkeys = c->nwindows = 0;
}

/* A float attribute of ``obj`` (1), or 0 where it is missing or not an exact float (no error set). */
static int
float_attr(PyObject *obj, const char *name, double *out)
{
    PyObject *value = PyObject_GetAttrString(obj, name);
    if (value == NULL) {
        PyErr_Clear();
        return 0;
    }
    int ok = PyFloat_CheckExact(value);
    if (ok) *out = PyFloat_AS_DOUBLE(value);
    Py_DECREF(value);
    return ok;
}

/* An existing total that the sums can be added to: float times, a list of buckets of the bounds' length. */
static int
totals_fit(Count *c, Key *key)
{
    if (!float_attr(key->totals, "blocked_s", &key->blocked_s) || !float_attr(key->totals, "seconds", &key->seconds)) {
        return 0;
    }
    PyObject *buckets = PyObject_GetAttrString(key->totals, "buckets");
    if (buckets == NULL) {
        PyErr_Clear();
        return 0;
    }
    int ok = PyList_CheckExact(buckets) && PyList_GET_SIZE(buckets) == c->nbounds + 1;
    Py_DECREF(buckets);
    return ok;
}

/* The key of (op, meaning): its index, -1 where there are too many or a total does not fit, -2 on an error. A key
 * the totals lack gets its totals made (LiveTotals' make_totals), to be put in at the commit. */
static Py_ssize_t
key_of(Count *c, PyObject *op, PyObject *meaning)
{
    if (c->last >= 0 && c->keys[c->last].op == op && c->keys[c->last].meaning == meaning) return c->last;
    for (Py_ssize_t i = 0; i < c->nkeys; i++) {
        Key *key = &c->keys[i];
        int same = key->op == op || PyUnicode_Compare(key->op, op) == 0;
        if (same && (key->meaning == meaning || PyUnicode_Compare(key->meaning, meaning) == 0)) {
            return c->last = i;
        }
    }
    if (c->nkeys == MAX_KEYS) return -1;
    Key *key = &c->keys[c->nkeys];
    memset(key, 0, sizeof(Key));
    key->op = op;
    key->meaning = meaning;
    PyObject *pair = PyTuple_Pack(2, op, meaning);
    if (pair == NULL) return -2;
    key->totals = PyDict_GetItemWithError(c->collectives, pair);
    Py_DECREF(pair);
    if (key->totals == NULL && PyErr_Occurred()) return -2;
    Py_XINCREF(key->totals);
    if (key->totals == NULL) {  /* made now, put in the totals only once every row is counted */
        if ((key->totals = PyObject_CallNoArgs(c->make_totals)) == NULL) return -2;
        key->fresh = 1;
    }
    c->nkeys++;
    if (!totals_fit(c, key)) return -1;
    return c->last = c->nkeys - 1;
}

/* bisect.bisect_left(bounds, x): the same comparisons, a[mid] < x. */
static Py_ssize_t
bucket_of(const Count *c, double x)
{
    Py_ssize_t lo = 0, hi = c->nbounds;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (c->bounds[mid] < x) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* One row's values added to the sums: 1, 0 where they do not fit, -1 on an error. */
static int
add_row(Count *c, PyObject *op, PyObject *meaning, PyObject *nbytes, PyObject *blocked, PyObject *duration,
        PyObject *busbw)
{
    if (!PyUnicode_CheckExact(op) || !PyUnicode_CheckExact(meaning) || !PyLong_CheckExact(nbytes)
        || !PyFloat_CheckExact(blocked) || (duration != Py_None && !PyFloat_CheckExact(duration))
        || (busbw != Py_None && !PyFloat_CheckExact(busbw))) {
        return 0;
    }
    int64_t size;
    int converted = zm_int64(nbytes, &size);
    if (converted <= 0) return converted;
    Py_ssize_t index = key_of(c, op, meaning);
    if (index < 0) return index == -2 ? -1 : 0;
    Key *key = &c->keys[index];
    key->calls++;
    if (__builtin_add_overflow(key->bytes, (int64_t)size, &key->bytes)) return 0;
    key->blocked_s += PyFloat_AS_DOUBLE(blocked);
    if (duration != Py_None) {
        double seconds = PyFloat_AS_DOUBLE(duration);
        key->timed++;
        key->seconds += seconds;
        key->buckets[bucket_of(c, seconds)]++;
    }
    if (busbw != Py_None) {
        Window *window = NULL;
        for (Py_ssize_t i = 0; i < c->nwindows && window == NULL; i++) {
            if (c->windows[i].op == op || PyUnicode_Compare(c->windows[i].op, op) == 0) window = &c->windows[i];
        }
        if (window == NULL) {
            if (c->nwindows == MAX_KEYS) return 0;
            window = &c->windows[c->nwindows];
            if ((window->samples = PyList_New(0)) == NULL) return -1;
            window->op = op;
            c->nwindows++;
        }
        if (PyList_Append(window->samples, busbw) < 0) return -1;
    }
    return 1;
}

/* An item of the uncounted list: a row (a 6-tuple) or a batch's columns (a list of 6 sequences of equal length). */
static int
add_item(Count *c, PyObject *item)
{
    if (PyTuple_CheckExact(item)) {
        if (PyTuple_GET_SIZE(item) != ROW_FIELDS) return 0;
        PyObject **f = PySequence_Fast_ITEMS(item);
        return add_row(c, f[0], f[1], f[2], f[3], f[4], f[5]);
    }
    if (!PyList_CheckExact(item) || PyList_GET_SIZE(item) != ROW_FIELDS) return 0;
    PyObject *columns[ROW_FIELDS] = {NULL};
    int result = 1;
    Py_ssize_t n = -1;
    for (int k = 0; k < ROW_FIELDS && result == 1; k++) {
        PyObject *column = PyList_GET_ITEM(item, k);
        if (!PyList_CheckExact(column) && !PyTuple_CheckExact(column)) result = 0;
        else if (n >= 0 && PySequence_Fast_GET_SIZE(column) != n) result = 0;
        else {
            n = PySequence_Fast_GET_SIZE(column);
            columns[k] = column;
        }
    }
    for (Py_ssize_t i = 0; i < n && result == 1; i++) {
        result = add_row(c, PySequence_Fast_GET_ITEM(columns[0], i), PySequence_Fast_GET_ITEM(columns[1], i),
                         PySequence_Fast_GET_ITEM(columns[2], i), PySequence_Fast_GET_ITEM(columns[3], i),
                         PySequence_Fast_GET_ITEM(columns[4], i), PySequence_Fast_GET_ITEM(columns[5], i));
    }
    return result;
}

/* ``obj.name += amount`` for an int attribute. */
static int
add_to_int(PyObject *obj, const char *name, int64_t amount)
{
    if (amount == 0) return 0;
    PyObject *old = PyObject_GetAttrString(obj, name);
    if (old == NULL) return -1;
    PyObject *add = PyLong_FromLongLong(amount);
    PyObject *new = add == NULL ? NULL : PyNumber_Add(old, add);
    Py_DECREF(old);
    Py_XDECREF(add);
    if (new == NULL) return -1;
    int status = PyObject_SetAttrString(obj, name, new);
    Py_DECREF(new);
    return status;
}

static int
set_float(PyObject *obj, const char *name, double value)
{
    PyObject *number = PyFloat_FromDouble(value);
    if (number == NULL) return -1;
    int status = PyObject_SetAttrString(obj, name, number);
    Py_DECREF(number);
    return status;
}

/* The sums into the totals and windows, keys and windows made in the order their first row came. */
static int
commit(Count *c, PyObject *windows, PyObject *make_window)
{
    for (Py_ssize_t i = 0; i < c->nkeys; i++) {
        Key *key = &c->keys[i];
        if (key->fresh) {
            PyObject *pair = PyTuple_Pack(2, key->op, key->meaning);
            int status = pair == NULL ? -1 : PyDict_SetItem(c->collectives, pair, key->totals);
            Py_XDECREF(pair);
            if (status < 0) return -1;
        }
        PyObject *totals = key->totals;
        if (add_to_int(totals, "calls", key->calls) < 0 || add_to_int(totals, "bytes", key->bytes) < 0
            || set_float(totals, "blocked_s", key->blocked_s) < 0) {
            return -1;
        }
        if (key->timed == 0) continue;
        if (add_to_int(totals, "timed_calls", key->timed) < 0 || set_float(totals, "seconds", key->seconds) < 0) {
            return -1;
        }
        PyObject *buckets = PyObject_GetAttrString(totals, "buckets");
        if (buckets == NULL) return -1;
        for (Py_ssize_t b = 0; b <= c->nbounds && PyList_GET_SIZE(buckets) > b; b++) {
            if (key->buckets[b] == 0) continue;
            PyObject *add = PyLong_FromLongLong(key->buckets[b]);
            PyObject *sum = add == NULL ? NULL : PyNumber_Add(PyList_GET_ITEM(buckets, b), add);
            Py_XDECREF(add);
            if (sum == NULL) {
                Py_DECREF(buckets);
                return -1;
            }
            PyList_SetItem(buckets, b, sum);  /* steals sum */
        }
        Py_DECREF(buckets);
    }
    for (Py_ssize_t i = 0; i < c->nwindows; i++) {
        Window *w = &c->windows[i];
        PyObject *window = PyDict_GetItemWithError(windows, w->op);  /* borrowed */
        if (window == NULL) {
            if (PyErr_Occurred() || (window = PyObject_CallNoArgs(make_window)) == NULL) return -1;
            int status = PyDict_SetItem(windows, w->op, window);
            Py_DECREF(window);  /* the dict holds it */
            if (status < 0) return -1;
        }
        PyObject *done = PyObject_CallMethod(window, "extend", "O", w->samples);
        if (done == NULL) return -1;
        Py_DECREF(done);
    }
    return 0;
}

static PyObject *
count(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *uncounted, *collectives, *windows, *make_totals, *make_window, *bounds;
    if (!PyArg_ParseTuple(args, "O!O!O!OOO:count", &PyList_Type, &uncounted, &PyDict_Type, &collectives,
                          &PyDict_Type, &windows, &make_totals, &make_window, &bounds)) {
        return NULL;
    }
    if (!PyTuple_CheckExact(bounds) || PyTuple_GET_SIZE(bounds) > MAX_BOUNDS) Py_RETURN_FALSE;
    Count *c = PyMem_Calloc(1, sizeof(Count));
    if (c == NULL) return PyErr_NoMemory();
    c->collectives = collectives;
    c->make_totals = make_totals;
    c->last = -1;
    c->nbounds = PyTuple_GET_SIZE(bounds);
    int result = 1;
    for (Py_ssize_t i = 0; i < c->nbounds && result == 1; i++) {
        PyObject *bound = PyTuple_GET_ITEM(bounds, i);
        if (!PyFloat_CheckExact(bound)) result = 0;
        else c->bounds[i] = PyFloat_AS_DOUBLE(bound);
    }
    Py_ssize_t n = PyList_GET_SIZE(uncounted);
    for (Py_ssize_t i = 0; i < n && result == 1; i++) {
        result = add_item(c, PyList_GET_ITEM(uncounted, i));
    }
    if (result == 1 && commit(c, windows, make_window) < 0) result = -1;
    count_clear(c);
    PyMem_Free(c);
    if (result < 0) return NULL;
    return PyBool_FromLong(result);
}

static PyMethodDef methods[] = {
    {"count", count, METH_VARARGS,
     "count(uncounted, collectives, windows, make_totals, make_window, bounds) -> True once the rows and columns "
     "of uncounted are counted into collectives and windows as LiveTotals' loop counts them; False, nothing "
     "changed, where they are not of the types this takes (the Python loop then)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "zeromon_agent.live._totals",
    "The live totals' count of a pass's collectives in C (LiveTotals' optional fast path).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__totals(void)
{
    return PyModule_Create(&module);
}
