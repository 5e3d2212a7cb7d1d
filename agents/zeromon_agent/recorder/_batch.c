/* zeromon_agent.recorder._batch: the columns of a pass's collectives, made in C (an optional build, setup.py).
 *
 * CollectiveRecords turns the hooks' raw tuples of a pass into the columns of their records, their live figures and
 * their step accounting. In Python that is a zip of every raw tuple and some twenty passes of map() over the columns,
 * each value a Python object made and read again; here a batch is checked in one pass and its columns made in a
 * second:
 *   sync_columns: gloo's synchronous collectives (finalize_sync_batch's);
 *   async_columns: finalize_pass's rows, async collectives at their wait and a GPU's launches (_finalize_rows').
 * The same values as the Python paths (tests/test_recorder_fast_path.py runs both); None where a batch is not taken
 * (the caller's Python path decides then).
 * Beside them, a pass's other loops of its collectives and steps, each with its Python path: account_sync and
 * count_ops (a batch's step accounting, CollectiveRecords._account_sync_run's; a step's bytes by op, _count_run's),
 * sequential_overlap (a step of calls one after another summed, step_acc._sequential_overlap_ns) and untrack (the
 * records handed to the live views let out of the garbage collector's lists, Outbox.release). A GPU-less pass's
 * phases, step boundaries and memory samples are _host.c's.
 */
#include "_columns.h"

static PyObject *zero;  /* 0, made once */

/* A raw collective's fields (hooks/state.py: RAW_COLLECTIVE's tuple). */
enum { SEQ = 1, API = 2, OP = 3, T0 = 4, T1 = 5, B_IN = 6, B_OUT = 7, DTYPE = 8, GROUP = 9, ASYNC = 10, PHASE = 12,
       STEP = 13, CUDA_AT = 14, CALLER = 16, RAW_FIELDS = 17 };
/* A call shape's fields (CollectiveRecords._shape): dtype name, group size, meaning, bytes, bus factor, array size. */
enum { SHAPE_FIELDS = 6 };
enum { OUT_SEQ, OUT_API, OUT_OP, OUT_PHASE, OUT_STEP, OUT_B_IN, OUT_B_OUT, OUT_DTYPE, OUT_GROUP_SIZE, OUT_MEANING,
       OUT_NBYTES, OUT_ISSUE, OUT_COMPLETE, OUT_BLOCKED, OUT_BUSBW, OUT_END, OUT_COLUMNS };

/* A collective's fields that its record takes as they are, into row i of ``columns``: its raw tuple's seq, api, op,
 * phase, step, bytes in and out (columns 0-6), its shape's dtype name and group size (7, 8), meaning and bytes
 * (``meaning_at``, ``nbytes_at``). */
static void
pass_fields(PyObject *columns, Py_ssize_t i, PyObject *raw, PyObject *shape, int meaning_at, int nbytes_at)
{
    static const int RAW_TAKEN[] = {SEQ, API, OP, PHASE, STEP, B_IN, B_OUT};
    const int from_shape[][2] = {{7, 0}, {8, 1}, {meaning_at, 2}, {nbytes_at, 3}};  /* (column, shape field) */
    for (int k = 0; k < 7; k++)
        PyList_SET_ITEM(PyTuple_GET_ITEM(columns, k), i, Py_NewRef(PyTuple_GET_ITEM(raw, RAW_TAKEN[k])));
    for (int k = 0; k < 4; k++)
        PyList_SET_ITEM(PyTuple_GET_ITEM(columns, from_shape[k][0]), i,
                        Py_NewRef(PyTuple_GET_ITEM(shape, from_shape[k][1])));
}

static const int KEY[] = {OP, PHASE, B_IN, B_OUT, DTYPE, GROUP, CALLER};  /* a call shape's key, in its order */

/* Whether two raw collectives' keys are equal as the shapes' dict compares them, told without a key made and hashed:
 * field by field the same object, or two exact ints or two exact strings of one value (nothing else is compared, and
 * no user code runs: a group or a caller of another type counts only as itself). */
static int
same_key(PyObject *a, PyObject *b)
{
    for (int k = 0; k < 7; k++) {
        PyObject *x = PyTuple_GET_ITEM(a, KEY[k]), *y = PyTuple_GET_ITEM(b, KEY[k]);
        if (x == y) continue;
        if (PyLong_CheckExact(x) && PyLong_CheckExact(y)) {
            if (PyObject_RichCompareBool(x, y, Py_EQ) != 1) return 0;
        } else if (!(PyUnicode_CheckExact(x) && PyUnicode_CheckExact(y) && PyUnicode_Compare(x, y) == 0)) {
            return 0;
        }
    }
    return 1;
}

/* The batch's call shapes, one a raw tuple (a new reference each), or NULL: an error set (from shape_of), or
 * none where a key cannot be hashed (*unhashable set). A call of the key of a call met earlier in the batch (the call
 * before it, or one of the last RECENT_KEYS keys looked up: a step's few shapes, met again each step) takes that
 * call's shape: the one the dict, or shape_of, gives its equal key. */
enum { RECENT_KEYS = 8 };
static PyObject **
shapes_of(PyObject **raw, Py_ssize_t n, PyObject *shapes, PyObject *shape_of, int *unhashable)
{
    PyObject **found = PyMem_Calloc(n ? n : 1, sizeof(PyObject *));
    if (found == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    Py_ssize_t recent[RECENT_KEYS];  /* rows whose key was looked up, the newest at (looked - 1) % RECENT_KEYS */
    int looked = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i > 0 && same_key(raw[i], raw[i - 1])) {
            found[i] = Py_NewRef(found[i - 1]);
            continue;
        }
        int r = 0, kept = looked < RECENT_KEYS ? looked : RECENT_KEYS;
        while (r < kept && !same_key(raw[i], raw[recent[r]])) r++;
        if (r < kept) {
            found[i] = Py_NewRef(found[recent[r]]);
            continue;
        }
        recent[looked++ % RECENT_KEYS] = i;
        PyObject *key = PyTuple_New(7);
        if (key == NULL) goto failed;
        for (int k = 0; k < 7; k++) {
            PyObject *field = PyTuple_GET_ITEM(raw[i], KEY[k]);
            Py_INCREF(field);
            PyTuple_SET_ITEM(key, k, field);
        }
        PyObject *shape = PyDict_GetItemWithError(shapes, key);
        if (shape != NULL) {
            Py_INCREF(shape);
        } else if (PyErr_Occurred()) {
            /* an unhashable group or caller: the caller goes item by item */
            if (PyErr_ExceptionMatches(PyExc_TypeError)) {
                PyErr_Clear();
                *unhashable = 1;
            }
            Py_DECREF(key);
            goto failed;
        } else {
            shape = PyObject_Call(shape_of, key, NULL);
        }
        Py_DECREF(key);
        if (shape == NULL) goto failed;
        if (!PyTuple_Check(shape) || PyTuple_GET_SIZE(shape) != SHAPE_FIELDS) {
            Py_DECREF(shape);
            PyErr_SetString(PyExc_TypeError, "a call shape is not a tuple of six");
            goto failed;
        }
        found[i] = shape;
    }
    return found;
failed:
    for (Py_ssize_t i = 0; i < n; i++) Py_XDECREF(found[i]);
    PyMem_Free(found);
    return NULL;
}

/* all_sync(items, kind, emitted) -> whether every raw record of ``items`` (a list of tuples) is a collective (its
 * kind ``kind``), synchronous (its async field false), on the host (its CUDA event None) and of a step after
 * ``emitted``: Recorder._all_sync's four passes over the queue in one. False for a record too short or a step that
 * does not compare; an error only where a field's truth or comparison raises. */
static PyObject *
all_sync(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *items, *kind, *emitted;
    if (!PyArg_ParseTuple(args, "O!OO:all_sync", &PyList_Type, &items, &kind, &emitted)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(items);
    if (n == 0) Py_RETURN_FALSE;  /* min() of nothing: Python's raises; the caller asks only of a queue with records */
    PyObject *last_step = NULL;  /* a step already found after ``emitted`` (the same object: no comparison again) */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) <= CUDA_AT) Py_RETURN_FALSE;
        PyObject *k = PyTuple_GET_ITEM(item, 0), *step = PyTuple_GET_ITEM(item, STEP);
        if (k != kind) {
            int same = PyObject_RichCompareBool(k, kind, Py_EQ);
            if (same < 0) return NULL;
            if (!same) Py_RETURN_FALSE;
        }
        if (PyTuple_GET_ITEM(item, CUDA_AT) != Py_None) Py_RETURN_FALSE;
        int is_async = PyObject_IsTrue(PyTuple_GET_ITEM(item, ASYNC));
        if (is_async < 0) return NULL;
        if (is_async) Py_RETURN_FALSE;
        if (step != last_step) {
            int after = PyObject_RichCompareBool(step, emitted, Py_GT);
            if (after < 0) return NULL;
            if (!after) Py_RETURN_FALSE;
            last_step = step;
        }
    }
    Py_RETURN_TRUE;
}

/* busbw_of(size, seconds, factor): event_bandwidth's busbw, ``size / seconds * factor`` as Python computes it, where
 * size > 0, else None (a new reference), or NULL with an error set; seconds > 0 and a factor that is not None are the
 * caller's to check. An exact int size of 64 bits and a float or exact int factor as in Python's float arithmetic: an
 * int made the nearest double (float_div's PyLong_AsDouble, ties to even, as the cast rounds), then one division and
 * one multiplication of doubles, the same value without two number objects made; any other type through Python's
 * operators. */
static PyObject *
busbw_of(PyObject *size, double seconds, PyObject *factor)
{
    if (PyLong_CheckExact(size) && (PyFloat_CheckExact(factor) || PyLong_CheckExact(factor))) {
        int64_t n = 0, k = 0;
        int converted = zm_int64(size, &n);
        if (converted == 1 && PyLong_CheckExact(factor)) converted = zm_int64(factor, &k);
        if (converted < 0) return NULL;
        if (converted == 1) {
            if (n <= 0) Py_RETURN_NONE;
            double f = PyFloat_CheckExact(factor) ? PyFloat_AS_DOUBLE(factor) : (double)k;
            return PyFloat_FromDouble((double)n / seconds * f);
        }
    }
    int positive = PyObject_RichCompareBool(size, zero, Py_GT);
    if (positive < 0) return NULL;
    if (!positive) Py_RETURN_NONE;
    PyObject *seconds_obj = PyFloat_FromDouble(seconds), *rate = NULL, *value = NULL;
    if (seconds_obj != NULL) rate = PyNumber_TrueDivide(size, seconds_obj);
    if (rate != NULL) value = PyNumber_Multiply(rate, factor);
    Py_XDECREF(seconds_obj);
    Py_XDECREF(rate);
    return value;
}

/* sync_columns(items, shapes, shape_of, offset, max_ns) -> columns or None
 *   items: a list of raw collectives (tuples); shapes: the dict of call shapes by key; shape_of(*key): a shape
 *   not in it; offset: perf_counter_ns to Unix ns; max_ns: a call at least this long is not taken.
 *   columns: (seq, api, op, phase, step, bytes_in, bytes_out, dtype name, group size, meaning, bytes, issue_ns,
 *   complete_ns, blocked_s, busbw, issue_ns + span_ns(blocked_s)), each a list of the batch's values.
 *   None: a batch finalize_sync_batch does not take (a field of another type, a call shorter than 0 or at least
 *   max_ns long, a time past 64 bits with the offset, a key that cannot be hashed). */
static PyObject *
sync_columns(PyObject *self, PyObject *args)
{
    PyObject *items, *shapes, *shape_of;
    long long offset, max_ns;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!O!OLL", &PyList_Type, &items, &PyDict_Type, &shapes, &shape_of, &offset, &max_ns))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(items);
    PyObject **raw = PySequence_Fast_ITEMS(items);
    /* First pass: the checks, nothing made. */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = raw[i];
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) < RAW_FIELDS) Py_RETURN_NONE;
        int64_t t0, t1, issue, complete;
        if (!PyLong_CheckExact(PyTuple_GET_ITEM(item, STEP)) || !PyLong_CheckExact(PyTuple_GET_ITEM(item, B_IN))
                || !PyLong_CheckExact(PyTuple_GET_ITEM(item, B_OUT)) || !PyLong_CheckExact(PyTuple_GET_ITEM(item, T0))
                || !PyLong_CheckExact(PyTuple_GET_ITEM(item, T1))
                || !PyUnicode_CheckExact(PyTuple_GET_ITEM(item, PHASE))
                || !as_int64(PyTuple_GET_ITEM(item, T0), &t0) || !as_int64(PyTuple_GET_ITEM(item, T1), &t1)
                || __builtin_add_overflow(t0, (int64_t)offset, &issue)
                || __builtin_add_overflow(t1, (int64_t)offset, &complete) || complete == INT64_MAX)
            Py_RETURN_NONE;
        if (t1 < t0 || t1 - t0 >= max_ns) Py_RETURN_NONE;  /* t1 - t0 fits: both fit with the offset added */
    }
    int unhashable = 0;
    PyObject **shape = shapes_of(raw, n, shapes, shape_of, &unhashable);
    if (shape == NULL) {
        if (unhashable) Py_RETURN_NONE;
        return NULL;
    }
    PyObject *columns = new_columns(OUT_COLUMNS, n);
    if (columns == NULL) goto done;
#define SET(c, i, value) PyList_SET_ITEM(PyTuple_GET_ITEM(columns, c), i, value)
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = raw[i], *s = shape[i];
        int64_t t0, t1;
        as_int64(PyTuple_GET_ITEM(item, T0), &t0);
        as_int64(PyTuple_GET_ITEM(item, T1), &t1);
        int64_t length = t1 - t0;
        double blocked = (double)length / 1e9;  /* seconds(): ns / 1e9, as int / float */
        pass_fields(columns, i, item, s, OUT_MEANING, OUT_NBYTES);
        PyObject *issue = PyLong_FromLongLong(t0 + offset), *complete = PyLong_FromLongLong(t1 + offset);
        PyObject *seconds = PyFloat_FromDouble(blocked);
        /* span_ns(blocked_s): int(blocked_s * 1e9), which truncates as the cast does */
        PyObject *end = PyLong_FromLongLong(t0 + offset + (int64_t)(blocked * 1e9));
        /* busbw: size / seconds * factor where seconds > 0, factor is not None and size > 0, else None */
        PyObject *factor = PyTuple_GET_ITEM(s, 4), *size = PyTuple_GET_ITEM(s, 5), *busbw = NULL;
        if (issue == NULL || complete == NULL || seconds == NULL || end == NULL) goto failed_row;
        if (blocked > 0 && factor != Py_None) {
            if ((busbw = busbw_of(size, blocked, factor)) == NULL) goto failed_row;
        } else {
            busbw = Py_NewRef(Py_None);
        }
        SET(OUT_ISSUE, i, issue);
        SET(OUT_COMPLETE, i, complete);
        SET(OUT_BLOCKED, i, seconds);
        SET(OUT_BUSBW, i, busbw);
        SET(OUT_END, i, end);
        continue;
    failed_row:
        Py_XDECREF(issue);
        Py_XDECREF(complete);
        Py_XDECREF(seconds);
        Py_XDECREF(end);
        Py_CLEAR(columns);
        goto done;
    }
#undef SET
    untrack_columns(columns);
done:
    for (Py_ssize_t i = 0; i < n; i++) Py_DECREF(shape[i]);
    PyMem_Free(shape);
    return columns;
}

/* finalize_pass's rows: (raw, blocked ns, the wait's perf ns, shape, completion perf ns or None, timing) */
enum { ROW_RAW, ROW_BLOCKED, ROW_WAIT, ROW_SHAPE, ROW_COMPLETION, ROW_TIMING, ROW_FIELDS };
enum { A_SEQ, A_API, A_OP, A_PHASE, A_STEP, A_B_IN, A_B_OUT, A_DTYPE, A_GROUP_SIZE, A_ASYNC, A_ISSUE, A_COMPLETE,
       A_BLOCKED, A_TIMING, A_MEANING, A_WAIT, A_ISSUE_S, A_NBYTES, A_DURATION, A_BUSBW, A_THREAD_BLOCKED, A_REACH,
       A_WAIT_END, A_ISSUE_END, A_COLUMNS };

/* pass_fields' layout: the raw fields, then the dtype name and group size, first in both kernels' columns */
_Static_assert(OUT_B_OUT == 6 && OUT_DTYPE == 7 && OUT_GROUP_SIZE == 8, "sync_columns' first columns");
_Static_assert(A_B_OUT == 6 && A_DTYPE == 7 && A_GROUP_SIZE == 8, "async_columns' first columns");

/* async_columns(rows, offset, launches, measured) -> columns or None
 *   rows: finalize_pass's rows (its plan's checks made: ints where the columns take them); offset: perf_counter_ns
 *   to Unix ns; launches: whether a row's timing is "launch" (a GPU's: its completion not known); measured: the
 *   timings whose duration is measured (MEASURED_TIMINGS).
 *   columns: seq, api, op, phase, step, bytes_in, bytes_out, dtype name, group size, async, issue_ns, complete_ns,
 *   blocked_s, timing, meaning, wait_ns, issue_s (a record's fields), bytes, duration, busbw, the thread's time
 *   blocked (the live totals'), and the step accounting's reach, wait end and issue end (_finalize_rows' names).
 *   None where a time is not a 64-bit integer with the offset added: the Python path takes the rows. */
static PyObject *
async_columns(PyObject *self, PyObject *args)
{
    PyObject *rows, *measured, *columns = NULL;
    long long offset;
    int launches;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!LpO", &PyList_Type, &rows, &offset, &launches, &measured)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(rows);
    /* First pass: the checks. */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *row = PyList_GET_ITEM(rows, i), *raw, *shape, *completion;
        int64_t t0, t1, wait, blocked_ns, c, sum;
        if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) != ROW_FIELDS) Py_RETURN_NONE;
        raw = PyTuple_GET_ITEM(row, ROW_RAW);
        shape = PyTuple_GET_ITEM(row, ROW_SHAPE);
        completion = PyTuple_GET_ITEM(row, ROW_COMPLETION);
        if (!PyTuple_Check(raw) || PyTuple_GET_SIZE(raw) < RAW_FIELDS || !PyTuple_Check(shape)
                || PyTuple_GET_SIZE(shape) != SHAPE_FIELDS
                || !PyLong_CheckExact(PyTuple_GET_ITEM(raw, T0)) || !as_int64(PyTuple_GET_ITEM(raw, T0), &t0)
                || !PyLong_CheckExact(PyTuple_GET_ITEM(raw, T1)) || !as_int64(PyTuple_GET_ITEM(raw, T1), &t1)
                || !PyLong_CheckExact(PyTuple_GET_ITEM(row, ROW_WAIT))
                || !as_int64(PyTuple_GET_ITEM(row, ROW_WAIT), &wait)
                || !PyLong_CheckExact(PyTuple_GET_ITEM(row, ROW_BLOCKED))
                || !as_int64(PyTuple_GET_ITEM(row, ROW_BLOCKED), &blocked_ns)
                || __builtin_add_overflow(t0, (int64_t)offset, &sum)
                || __builtin_add_overflow(wait, (int64_t)offset, &sum)
                || __builtin_add_overflow(sum, blocked_ns, &sum) || __builtin_sub_overflow(t1, t0, &sum)
                || __builtin_add_overflow(t0 + (int64_t)offset, sum, &sum)
                || t1 < t0 || blocked_ns < 0 || blocked_ns >= (1LL << 50) || t1 - t0 >= (1LL << 50))
            Py_RETURN_NONE;
        if (completion != Py_None && (!PyLong_CheckExact(completion) || !as_int64(completion, &c)
                                      || __builtin_add_overflow(c, (int64_t)offset, &sum)
                                      || __builtin_sub_overflow(c, t0, &sum)))
            Py_RETURN_NONE;
        if (completion == Py_None && !launches) Py_RETURN_NONE;  /* only a launch's completion is not known */
    }
    if ((columns = new_columns(A_COLUMNS, n)) == NULL) return NULL;
#define SET(c, i, value) PyList_SET_ITEM(PyTuple_GET_ITEM(columns, c), i, value)
#define PASS(c, i, value) do { PyObject *v_ = (value); Py_INCREF(v_); SET(c, i, v_); } while (0)
#define MADE(c, i, value) do { PyObject *v_ = (value); if (v_ == NULL) goto failed; SET(c, i, v_); } while (0)
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *row = PyList_GET_ITEM(rows, i), *raw = PyTuple_GET_ITEM(row, ROW_RAW);
        PyObject *shape = PyTuple_GET_ITEM(row, ROW_SHAPE), *completion = PyTuple_GET_ITEM(row, ROW_COMPLETION);
        PyObject *timing = PyTuple_GET_ITEM(row, ROW_TIMING), *factor = PyTuple_GET_ITEM(shape, 4);
        PyObject *size = PyTuple_GET_ITEM(shape, 5);
        int64_t t0, t1, wait, blocked_ns, c = 0;
        as_int64(PyTuple_GET_ITEM(raw, T0), &t0);
        as_int64(PyTuple_GET_ITEM(raw, T1), &t1);
        as_int64(PyTuple_GET_ITEM(row, ROW_WAIT), &wait);
        as_int64(PyTuple_GET_ITEM(row, ROW_BLOCKED), &blocked_ns);
        int known = completion != Py_None;
        if (known) as_int64(completion, &c);
        int is_async = PyObject_IsTrue(PyTuple_GET_ITEM(raw, ASYNC));
        if (is_async < 0) goto failed;
        int64_t issue = t0 + offset;
        double blocked = (double)blocked_ns / 1e9, issue_s = (double)(t1 - t0) / 1e9;
        pass_fields(columns, i, raw, shape, A_MEANING, A_NBYTES);
        PASS(A_ASYNC, i, is_async ? Py_True : Py_False);
        MADE(A_ISSUE, i, PyLong_FromLongLong(issue));
        if (known) MADE(A_COMPLETE, i, PyLong_FromLongLong(c + offset));
        else PASS(A_COMPLETE, i, Py_None);
        MADE(A_BLOCKED, i, PyFloat_FromDouble(blocked));
        PASS(A_TIMING, i, timing);
        MADE(A_WAIT, i, PyLong_FromLongLong(wait + offset));
        MADE(A_ISSUE_S, i, PyFloat_FromDouble(issue_s));
        /* the duration where the completion is known: max(0.0, s) */
        double s = known ? (double)(c - t0) / 1e9 : 0.0;
        if (known) MADE(A_DURATION, i, PyFloat_FromDouble(s > 0.0 ? s : 0.0));
        else PASS(A_DURATION, i, Py_None);
        /* busbw: size / s * factor where s is known and > 0, the timing measured, a factor and size > 0 */
        int busbw = known && s > 0 && factor != Py_None;
        if (busbw && (busbw = PySequence_Contains(measured, timing)) < 0) goto failed;
        if (busbw) {
            MADE(A_BUSBW, i, busbw_of(size, s, factor));
        } else {
            PASS(A_BUSBW, i, Py_None);
        }
        MADE(A_THREAD_BLOCKED, i, PyFloat_FromDouble(is_async && issue_s > 0 ? blocked + issue_s : blocked));
        if (known) MADE(A_REACH, i, PyLong_FromLongLong(c + offset > issue ? c + offset : issue));
        else PASS(A_REACH, i, Py_None);
        MADE(A_WAIT_END, i, PyLong_FromLongLong(wait + offset + (int64_t)(blocked * 1e9)));
        MADE(A_ISSUE_END, i, PyLong_FromLongLong(is_async ? issue + (int64_t)(issue_s * 1e9) : issue));
    }
#undef SET
#undef PASS
#undef MADE
    untrack_columns(columns);
    return columns;
failed:
    Py_XDECREF(columns);
    return NULL;
}

/* The run's bytes by op added to by_op once an op (key_sums_add, key_sums_into), a chunk of sizes at a time: where
 * every size is an exact int of 64 bits, and their total. The total into *total: 1; 0 where a value is not of those
 * types (nothing changed: the loop then); -1 with an exception. */
static int
add_ops_summed(PyObject *by_op, PyObject *const *ops, PyObject *const *nbytes, Py_ssize_t n, PyObject **total)
{
    enum { CHUNK = 256 };
    int64_t size[CHUNK], all = 0;
    KeySums sums = {.n = 0};
    for (Py_ssize_t start = 0; start < n; start += CHUNK) {
        Py_ssize_t m = n - start < CHUNK ? n - start : CHUNK;
        for (Py_ssize_t i = 0; i < m; i++) {
            PyObject *value = nbytes[start + i];
            if (!PyLong_CheckExact(value) || !as_int64(value, &size[i]) || __builtin_add_overflow(all, size[i], &all))
                return 0;
        }
        if (!key_sums_add(&sums, ops + start, size, m)) return 0;
    }
    int added = key_sums_into(by_op, &sums);
    if (added <= 0) return added;
    return (*total = PyLong_FromLongLong(all)) != NULL ? 1 : -1;
}

/* Each of ops[0:n]'s bytes (nbytes[0:n]) added to by_op[op] in order (a key made at its first), as ``by_op[op] =
 * by_op.get(op, 0) + size`` does one by one: their sum, or NULL with an exception. Summed in C first
 * (add_ops_summed) where the values let it. */
static PyObject *
add_ops(PyObject *by_op, PyObject *const *ops, PyObject *const *nbytes, Py_ssize_t n)
{
    PyObject *total = NULL;
    int summed = add_ops_summed(by_op, ops, nbytes, n, &total);
    if (summed != 0) return summed > 0 ? total : NULL;
    total = Py_NewRef(zero);
    for (Py_ssize_t i = 0; i < n && total != NULL; i++) {
        if (dict_add(by_op, ops[i], nbytes[i]) < 0) Py_CLEAR(total);
        else Py_SETREF(total, PyNumber_Add(total, nbytes[i]));
    }
    return total;
}

/* count_ops(by_op, ops, nbytes): CollectiveRecords._count_run's count of a run of one step's collectives by op
 * (add_ops). Returns the sum of ``nbytes``. */
static PyObject *
count_ops(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *by_op, *ops_obj, *nbytes_obj;
    if (!PyArg_ParseTuple(args, "O!OO:count_ops", &PyDict_Type, &by_op, &ops_obj, &nbytes_obj)) return NULL;
    PyObject *ops = PySequence_Fast(ops_obj, "count_ops: ops not a sequence");
    PyObject *nbytes = ops != NULL ? PySequence_Fast(nbytes_obj, "count_ops: nbytes not a sequence") : NULL;
    PyObject *total = NULL;
    if (nbytes == NULL) goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(ops);
    if (PySequence_Fast_GET_SIZE(nbytes) != n) {
        PyErr_SetString(PyExc_ValueError, "count_ops: ops and nbytes of other lengths");
        goto done;
    }
    total = add_ops(by_op, PySequence_Fast_ITEMS(ops), PySequence_Fast_ITEMS(nbytes), n);
done:
    Py_XDECREF(ops);
    Py_XDECREF(nbytes);
    return total;
}

/* A StepAcc's attributes account_sync reads and sets (interned at import), in this order. */
enum { ACC_COLLECTIVES, ACC_COMM_BYTES, ACC_BY_OP, ACC_INTERVALS, ACC_BLOCKED, ACC_OVERLAP_KNOWN, ACC_BLOCKED_S,
       ACC_RUN_ISSUE, ACC_RUN_COMPLETE, ACC_RUN_END, ACC_RUN_BLOCKED, ACC_RUN_BLOCKED_N, ACC_FIELDS };
static const char *acc_field_names[ACC_FIELDS] = {
    "collectives", "comm_bytes", "by_op", "intervals", "blocked", "overlap_known", "blocked_s", "run_issue",
    "run_complete", "run_end", "run_blocked", "run_blocked_n"};
static PyObject *acc_names[ACC_FIELDS];
static SlotFields acc_slots;  /* account_sync's StepAcc fields at their slots */

/* One run of one step's collectives, rows [i, j) of the columns, into its accumulator ``acc`` as
 * CollectiveRecords._account_sync_run does: 1 done, 0 left alone (nothing changed: an attribute or value of another
 * type, a value past 64 bits, or a run that folds its intervals or drops its blocked ones, which the Python method
 * does), -1 with an exception. */
static int
account_run(PyObject *acc, PyObject *const *columns[6], Py_ssize_t i, Py_ssize_t j, Py_ssize_t limit)
{
    PyObject *const *ops = columns[0], *const *nbytes = columns[1], *const *issue = columns[2];
    PyObject *const *complete = columns[3], *const *blocked = columns[4], *const *ends = columns[5];
    PyObject *field[ACC_FIELDS] = {NULL};
    int done = -1;
    for (int f = 0; f < ACC_FIELDS; f++) {
        if ((field[f] = slot_get(&acc_slots, acc, acc_names, ACC_FIELDS, f)) == NULL) goto out;
    }
    done = 0;
    static const int lists[] = {ACC_INTERVALS, ACC_BLOCKED, ACC_RUN_ISSUE, ACC_RUN_COMPLETE, ACC_RUN_END,
                                ACC_RUN_BLOCKED};
    for (size_t f = 0; f < sizeof lists / sizeof lists[0]; f++) {
        if (!PyList_CheckExact(field[lists[f]])) goto out;
    }
    if (!PyDict_CheckExact(field[ACC_BY_OP]) || !PyFloat_CheckExact(field[ACC_BLOCKED_S])
            || !PyLong_CheckExact(field[ACC_RUN_BLOCKED_N])) {
        goto out;
    }
    Py_ssize_t k = j - i;
    if (PyList_GET_SIZE(field[ACC_INTERVALS]) + PyList_GET_SIZE(field[ACC_RUN_ISSUE]) + k > limit) goto out;
    /* blocked_s: add_blocked's sum, in order (a zero adds 0.0: the same double); the blocked intervals each counts */
    double blocked_s = PyFloat_AS_DOUBLE(field[ACC_BLOCKED_S]);
    Py_ssize_t nonzero = 0;
    for (Py_ssize_t r = i; r < j; r++) {
        int64_t start, end, length;
        if (!PyLong_CheckExact(issue[r]) || !PyLong_CheckExact(ends[r]) || !PyFloat_CheckExact(blocked[r])
                || !as_int64(issue[r], &start) || !as_int64(ends[r], &end) || __builtin_sub_overflow(end, start, &length)
                || (length > ((int64_t)1 << 53) || length < -((int64_t)1 << 53))) {  /* a double holds it exactly */
            goto out;
        }
        blocked_s += (double)length / 1e9;
        nonzero += PyFloat_AS_DOUBLE(blocked[r]) != 0.0;
    }
    int known = PyObject_IsTrue(field[ACC_OVERLAP_KNOWN]);
    if (known < 0) {
        done = -1;
        goto out;
    }
    Py_ssize_t run_blocked_n = 0;
    if (known) {
        run_blocked_n = PyLong_AsSsize_t(field[ACC_RUN_BLOCKED_N]);
        if (run_blocked_n == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            goto out;
        }
        if (PyList_GET_SIZE(field[ACC_BLOCKED]) + run_blocked_n + nonzero > limit) goto out;
    }
    /* Checked: now the accounting, as the Python method's. */
    done = -1;
    PyObject *count = PyLong_FromSsize_t(k), *sum = NULL;
    if (count != NULL) sum = PyNumber_Add(field[ACC_COLLECTIVES], count);
    Py_XDECREF(count);
    if (sum == NULL || slot_set(&acc_slots, acc, acc_names, ACC_FIELDS, ACC_COLLECTIVES, sum) < 0) {
        Py_XDECREF(sum);
        goto out;
    }
    Py_DECREF(sum);
    PyObject *total = add_ops(field[ACC_BY_OP], ops + i, nbytes + i, k);
    sum = total != NULL ? PyNumber_Add(field[ACC_COMM_BYTES], total) : NULL;
    Py_XDECREF(total);
    if (sum == NULL || slot_set(&acc_slots, acc, acc_names, ACC_FIELDS, ACC_COMM_BYTES, sum) < 0) {
        Py_XDECREF(sum);
        goto out;
    }
    Py_DECREF(sum);
    for (Py_ssize_t r = i; r < j; r++) {
        if (PyList_Append(field[ACC_RUN_ISSUE], issue[r]) < 0 || PyList_Append(field[ACC_RUN_COMPLETE], complete[r]) < 0
                || PyList_Append(field[ACC_RUN_END], ends[r]) < 0 || PyList_Append(field[ACC_RUN_BLOCKED], blocked[r]) < 0) {
            goto out;
        }
    }
    sum = PyFloat_FromDouble(blocked_s);
    if (sum == NULL || slot_set(&acc_slots, acc, acc_names, ACC_FIELDS, ACC_BLOCKED_S, sum) < 0) {
        Py_XDECREF(sum);
        goto out;
    }
    Py_DECREF(sum);
    if (known) {
        sum = PyLong_FromSsize_t(run_blocked_n + nonzero);
        if (sum == NULL || slot_set(&acc_slots, acc, acc_names, ACC_FIELDS, ACC_RUN_BLOCKED_N, sum) < 0) {
            Py_XDECREF(sum);
            goto out;
        }
        Py_DECREF(sum);
    }
    done = 1;
out:
    for (int f = 0; f < ACC_FIELDS; f++) Py_XDECREF(field[f]);
    return done;
}

/* account_sync(steps, ops, nbytes, issue, complete, blocked, ends, accs, new_acc, limit): finalize_sync_batch's step
 * accounting, each run of one step's collectives in turn into its accumulator (accs[step], made by new_acc() at its
 * first record) as CollectiveRecords._account_sync_run does (account_run; ``limit``: MAX_STEP_INTERVALS). Returns the
 * row it stopped at, the first of a run it left alone (len(steps) where it took them all): the caller's Python loop
 * takes that run and the rest. */
static PyObject *
account_sync(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *given[7], *accs, *new_acc;
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "OOOOOOOO!On:account_sync", &given[0], &given[1], &given[2], &given[3], &given[4],
                          &given[5], &given[6], &PyDict_Type, &accs, &new_acc, &limit)) {
        return NULL;
    }
    PyObject *fast[7] = {NULL};
    PyObject *const *columns[6];
    Py_ssize_t n = -1, i = 0;
    PyObject *result = NULL;
    for (int c = 0; c < 7; c++) {
        if ((fast[c] = PySequence_Fast(given[c], "account_sync: a column not a sequence")) == NULL) goto done;
        if (n >= 0 && PySequence_Fast_GET_SIZE(fast[c]) != n) {
            PyErr_SetString(PyExc_ValueError, "account_sync: columns of other lengths");
            goto done;
        }
        n = PySequence_Fast_GET_SIZE(fast[c]);
        if (c) columns[c - 1] = PySequence_Fast_ITEMS(fast[c]);
    }
    PyObject *const *steps = PySequence_Fast_ITEMS(fast[0]);
    for (Py_ssize_t j; i < n; i = j) {
        for (j = i + 1; j < n; j++) {  /* itertools.groupby's runs: equal steps */
            int same = PyObject_RichCompareBool(steps[j], steps[i], Py_EQ);
            if (same < 0) goto done;
            if (!same) break;
        }
        PyObject *acc = step_acc(accs, new_acc, steps[i]);  /* borrowed */
        if (acc == NULL) goto done;
        int taken = account_run(acc, columns, i, j, limit);
        if (taken < 0) goto done;
        if (!taken) break;
    }
    result = PyLong_FromSsize_t(i);
done:
    for (int c = 0; c < 7; c++) Py_XDECREF(fast[c]);
    return result;
}

/* sequential_overlap(issue, complete, ends, agent, start_ns, end_ns): step_acc._sequential_overlap_ns in C, the
 * summary of a step whose synchronous collectives are all in its batched columns (StepAcc.run_issue, run_complete,
 * run_end; agent: the agent's spans, (start, end) pairs): None where the calls are not one after another inside the
 * window clear of the agent's spans, else (the collectives' union, (computation, overlap, exposed)) in ns, the same
 * integers as the Python function (tests/test_recorder_fast_path.py). False where a value is not a 64-bit integer,
 * a pair not a pair, or a sum would overflow: the caller takes the Python function then. */
typedef struct {
    int64_t start, end;
} Pair;

static int
pair_order(const void *a, const void *b)
{
    const Pair *x = (const Pair *)a, *y = (const Pair *)b;
    if (x->start != y->start) return x->start < y->start ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

/* sequential_overlap's sums of a step's calls (``issue``, ``complete``, ``ends``: lists of as many) and the agent's
 * spans (``agent``: a list of pairs) in the window [start, end): 1 with out = {union, computation, overlap, exposed},
 * 0 where the calls are not one after another inside the window clear of the agent's spans (None), -1 where a value
 * is not a 64-bit integer, a pair not a pair, or a sum would overflow (False), -2 with an exception. */
static int
sequential_sums(PyObject *issue, PyObject *complete, PyObject *ends, PyObject *agent, int64_t start, int64_t end,
                int64_t out[4])
{
    Py_ssize_t n = PyList_GET_SIZE(issue), m = PyList_GET_SIZE(agent);
    if (n == 0 || PyList_GET_SIZE(complete) != n || PyList_GET_SIZE(ends) != n) return -1;
    int64_t *values = PyMem_Malloc(sizeof(int64_t) * 3 * (size_t)n);
    Pair *spans = PyMem_Malloc(sizeof(Pair) * (size_t)(m > 0 ? m : 1));
    int result = -1;
    if (values == NULL || spans == NULL) {
        PyMem_Free(values);
        PyMem_Free(spans);
        PyErr_NoMemory();
        return -2;
    }
    int64_t *is = values, *co = values + n, *en = values + 2 * n;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!as_int64(PyList_GET_ITEM(issue, i), &is[i]) || !as_int64(PyList_GET_ITEM(complete, i), &co[i])
                || !as_int64(PyList_GET_ITEM(ends, i), &en[i])) {
            goto done;
        }
    }
    for (Py_ssize_t k = 0; k < m; k++) {
        PyObject *span = PyList_GET_ITEM(agent, k);
        if (!PyTuple_CheckExact(span) || PyTuple_GET_SIZE(span) != 2 || !as_int64(PyTuple_GET_ITEM(span, 0), &spans[k].start)
                || !as_int64(PyTuple_GET_ITEM(span, 1), &spans[k].end)) {
            goto done;
        }
    }
    result = 0;  /* from here on: not one after another, unless every check passes */
    if (is[0] < start || co[n - 1] > end) goto done;
    for (Py_ssize_t i = 0; i + 1 < n; i++) {
        if (is[i + 1] < co[i]) goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (en[i] > co[i]) goto done;
    }
    for (Py_ssize_t k = 0; k < m; k++) {  /* the first call that ends after the span starts starts at or after its end */
        Py_ssize_t lo = 0, hi = n;  /* bisect_right(complete, a0), as Python's: the same index whatever the order */
        while (lo < hi) {
            Py_ssize_t mid = (lo + hi) / 2;
            if (spans[k].start < co[mid]) hi = mid;
            else lo = mid + 1;
        }
        if (spans[k].end > spans[k].start && lo < n && is[lo] < spans[k].end) goto done;
    }
    result = -1;  /* the sums: False where one would overflow */
    int64_t comm = 0, blocked = 0, agent_ns = 0, step = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t c, b;
        if (__builtin_sub_overflow(co[i], is[i], &c) || __builtin_sub_overflow(en[i], is[i], &b)
                || __builtin_add_overflow(comm, c, &comm) || __builtin_add_overflow(blocked, b, &blocked)) {
            goto done;
        }
    }
    if (m > 0) {  /* zeromon.analysis.step_overlap.union_in: the spans' union inside [start, end), sorted */
        qsort(spans, (size_t)m, sizeof(Pair), pair_order);
        int64_t cur_start = start, cur_end = start;
        for (Py_ssize_t k = 0; k < m; k++) {
            int64_t a0 = spans[k].start < start ? start : spans[k].start;
            int64_t a1 = spans[k].end > end ? end : spans[k].end;
            if (a1 <= a0) continue;
            if (a0 <= cur_end) {
                if (a1 > cur_end) cur_end = a1;
            } else {
                if (__builtin_add_overflow(agent_ns, cur_end - cur_start, &agent_ns)) goto done;
                cur_start = a0;
                cur_end = a1;
            }
        }
        if (__builtin_add_overflow(agent_ns, cur_end - cur_start, &agent_ns)) goto done;
    }
    int64_t busy, comp, overlap;
    if (__builtin_sub_overflow(end, start, &step) || __builtin_add_overflow(blocked, agent_ns, &busy)
            || __builtin_sub_overflow(step, busy, &comp) || __builtin_sub_overflow(comm, blocked, &overlap)) {
        goto done;
    }
    out[0] = comm;
    out[1] = comp;
    out[2] = overlap;
    out[3] = blocked;
    result = 1;
done:
    PyMem_Free(values);
    PyMem_Free(spans);
    return result;
}

static PyObject *
sequential_overlap(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *issue, *complete, *ends, *agent, *start_obj, *end_obj;
    if (!PyArg_ParseTuple(args, "O!O!O!O!OO:sequential_overlap", &PyList_Type, &issue, &PyList_Type, &complete,
                          &PyList_Type, &ends, &PyList_Type, &agent, &start_obj, &end_obj)) {
        return NULL;
    }
    int64_t start, end, sums[4];
    if (!as_int64(start_obj, &start) || !as_int64(end_obj, &end)) Py_RETURN_FALSE;
    switch (sequential_sums(issue, complete, ends, agent, start, end, sums)) {
    case 1:
        return Py_BuildValue("L(LLL)", (long long)sums[0], (long long)sums[1], (long long)sums[2], (long long)sums[3]);
    case 0:
        Py_RETURN_NONE;
    case -1:
        Py_RETURN_FALSE;
    default:
        return NULL;
    }
}

/* A StepAcc's attributes summarize_host reads (interned at import), in this order. */
enum { SUM_DEVICE_UNTIMED, SUM_OVERLAP_KNOWN, SUM_ON_STREAM, SUM_COMPUTE, SUM_RUN_ISSUE, SUM_INTERVALS, SUM_BLOCKED,
       SUM_COL_ISSUE, SUM_COL_BLOCKED_START, SUM_RUN_COMPLETE, SUM_RUN_END, SUM_AGENT, SUM_PHASE_NS, SUM_COLLECTIVES,
       SUM_COMM_BYTES, SUM_BY_OP, SUM_BLOCKED_S, SUM_PEAK_MEMORY, SUM_FIELDS };
static const char *sum_field_names[SUM_FIELDS] = {
    "device_untimed", "overlap_known", "on_stream", "compute", "run_issue", "intervals", "blocked", "col_issue",
    "col_blocked_start", "run_complete", "run_end", "agent", "phase_ns", "collectives", "comm_bytes", "by_op",
    "blocked_s", "peak_memory"};
static PyObject *sum_names[SUM_FIELDS];
static SlotFields sum_slots;  /* summarize_host's StepAcc fields at their slots */
static PyObject *ns_per_s;  /* 1e9, made once */

/* round(value, 9) of an exact float, as float.__round__ makes it: the double nearest to the value's exact decimal
 * rounded half-even to 9 places (dtoa's digits read back). Where value * 1e9, a double within half an ulp of the exact
 * product, lies more than 4 ulps from a half-integer, the exact product rounds to the same integer k (no tie), and
 * k / 1e9, one division of two exact doubles rounded to nearest, is that double: no string made. Any other value
 * (near a tie, past 2^52 nanoseconds, not finite) goes to float.__round__ itself. */
static PyObject *
round_ns(PyObject *value)
{
    double product = PyFloat_AS_DOUBLE(value) * 1e9;
    if (isfinite(product) && fabs(product) < 4503599627370496.0) {
        double k = nearbyint(product), ulp = nextafter(fabs(product), INFINITY) - fabs(product);
        if (0.5 - fabs(product - k) > 4.0 * ulp) return PyFloat_FromDouble(k / 1e9);
    }
    return PyObject_CallMethod(value, "__round__", "i", 9);
}

/* A phase's whole nanoseconds in seconds, ``ns / 1e9`` as Python divides an int by a float: an exact int of 64 bits
 * made the nearest double (PyLong_AsDouble's conversion, ties to even, as the cast rounds), one division; any other
 * value by Python's operator. */
static PyObject *
ns_seconds(PyObject *ns)
{
    if (PyLong_CheckExact(ns)) {
        int64_t v;
        int converted = zm_int64(ns, &v);
        if (converted < 0) return NULL;
        if (converted == 1) return PyFloat_FromDouble((double)v / 1e9);
    }
    return PyNumber_TrueDivide(ns, ns_per_s);
}

/* summarize_host(acc, rank, step, start_ns, end_ns): step_acc.summarize's values of a step whose synchronous
 * collectives are all in its batched columns, one after another inside its window on the host (the case
 * _communication sums with _sequential_overlap_ns): (rank, step, start_ns, end_ns, phase_s, collectives, comm_bytes,
 * by_op, comm_union_s, blocked_s, peak_memory, comp_s, overlap_s, exposed_comm_s), StepSummary's fields, the same
 * values as the Python function (tests/test_recorder_fast_path.py). None for any other step (or an attribute of
 * another type, a value past 64 bits): the caller's Python path. */
static PyObject *
summarize_host(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* a step's call, once a step: its arguments taken as given, and its values packed, with none of PyArg_ParseTuple's
     * or Py_BuildValue's format reading (some 2,000 instructions a step between them) */
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "summarize_host() takes 5 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *acc = args[0], *rank = args[1], *step = args[2], *start_obj = args[3], *end_obj = args[4];
    PyObject *field[SUM_FIELDS] = {NULL}, *result = NULL, *phase_s = NULL, *by_op = NULL, *blocked_s = NULL;
    for (int f = 0; f < SUM_FIELDS; f++) {
        if ((field[f] = slot_get(&sum_slots, acc, sum_names, SUM_FIELDS, f)) == NULL) goto done;
    }
    int64_t start, end, sums[4];
    if (!as_int64(start_obj, &start) || !as_int64(end_obj, &end) || end <= start) goto none;
    static const int lists[] = {SUM_COMPUTE, SUM_RUN_ISSUE, SUM_INTERVALS, SUM_BLOCKED, SUM_COL_ISSUE,
                                SUM_COL_BLOCKED_START, SUM_RUN_COMPLETE, SUM_RUN_END, SUM_AGENT};
    for (size_t f = 0; f < sizeof lists / sizeof lists[0]; f++) {
        if (!PyList_CheckExact(field[lists[f]])) goto none;
    }
    if (!PyDict_CheckExact(field[SUM_PHASE_NS]) || !PyDict_CheckExact(field[SUM_BY_OP])
            || !PyFloat_CheckExact(field[SUM_BLOCKED_S])) {
        goto none;
    }
    int untimed = PyObject_IsTrue(field[SUM_DEVICE_UNTIMED]), known = PyObject_IsTrue(field[SUM_OVERLAP_KNOWN]);
    int on_stream = PyObject_IsTrue(field[SUM_ON_STREAM]);
    if (untimed < 0 || known < 0 || on_stream < 0) goto done;
    /* _communication's host case with every collective in the batched columns */
    if (untimed || !known || (on_stream && PyList_GET_SIZE(field[SUM_COMPUTE]) > 0)
            || PyList_GET_SIZE(field[SUM_RUN_ISSUE]) == 0 || PyList_GET_SIZE(field[SUM_INTERVALS]) > 0
            || PyList_GET_SIZE(field[SUM_BLOCKED]) > 0 || PyList_GET_SIZE(field[SUM_COL_ISSUE]) > 0
            || PyList_GET_SIZE(field[SUM_COL_BLOCKED_START]) > 0) {
        goto none;
    }
    int summed = sequential_sums(field[SUM_RUN_ISSUE], field[SUM_RUN_COMPLETE], field[SUM_RUN_END], field[SUM_AGENT],
                                 start, end, sums);
    if (summed == -2) goto done;
    if (summed != 1) goto none;
    int64_t comm_ns;  /* overlap + exposed, as the Python path adds them */
    if (__builtin_add_overflow(sums[2], sums[3], &comm_ns)) goto none;
    /* phase_s: each phase's nanoseconds / 1e9, in the dict's order; by_op a copy; blocked_s round(, 9) */
    if ((phase_s = PyDict_New()) == NULL) goto done;
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(field[SUM_PHASE_NS], &pos, &key, &value)) {
        PyObject *seconds = ns_seconds(value);
        if (seconds == NULL || PyDict_SetItem(phase_s, key, seconds) < 0) {
            Py_XDECREF(seconds);
            goto done;
        }
        Py_DECREF(seconds);
    }
    if ((by_op = PyDict_Copy(field[SUM_BY_OP])) == NULL) goto done;
    if ((blocked_s = round_ns(field[SUM_BLOCKED_S])) == NULL) goto done;
    PyObject *comm_s = PyFloat_FromDouble((double)comm_ns / 1e9), *comp_s = PyFloat_FromDouble((double)sums[1] / 1e9);
    PyObject *overlap_s = PyFloat_FromDouble((double)sums[2] / 1e9);
    PyObject *exposed_s = PyFloat_FromDouble((double)sums[3] / 1e9);
    if (comm_s != NULL && comp_s != NULL && overlap_s != NULL && exposed_s != NULL) {
        result = PyTuple_Pack(14, rank, step, start_obj, end_obj, phase_s, field[SUM_COLLECTIVES], field[SUM_COMM_BYTES],
                              by_op, comm_s, blocked_s, field[SUM_PEAK_MEMORY], comp_s, overlap_s, exposed_s);
    }
    Py_XDECREF(comm_s);
    Py_XDECREF(comp_s);
    Py_XDECREF(overlap_s);
    Py_XDECREF(exposed_s);
    goto done;
none:
    result = Py_NewRef(Py_None);
done:
    for (int f = 0; f < SUM_FIELDS; f++) Py_XDECREF(field[f]);
    Py_XDECREF(phase_s);
    Py_XDECREF(by_op);
    Py_XDECREF(blocked_s);
    return result;
}

/* untrack(objects, kinds): what the garbage collector need not walk, let out of its lists (CPython's own rule for
 * tuples and dicts, _PyTuple_MaybeUntrack, made for the recorder's records). An object whose references are all to
 * objects the collector does not track cannot be in a reference cycle, so the collector has nothing to find in it:
 * CPython untracks a tuple or a dict of numbers and strings so (a tuple at its first collection, a dict when made),
 * never a list nor an instance of a class. The records a pass hands to the live views (step summaries, memory
 * samples' values, a batch's columns) are such objects and live for seconds to minutes: tracked, every young and
 * middle collection of every thread walks them (the training thread's too), and each one promoted brings the next
 * full collection nearer.
 * Each of ``objects`` that is an exact tuple, list or dict, or of one of the classes ``kinds`` names exactly (the
 * records' frozen classes: an instance that could later be given a reference to itself is not the caller's to
 * name), is untracked where everything it refers to is untracked, or is an exact list, tuple or dict that this makes
 * untracked in turn (two levels down: a batch's columns); anything else it refers to (a user's object) keeps it
 * tracked. The type of an instance, which its traverse visits, does not count. Returns how many of ``objects`` it
 * untracked. Untracking frees nothing and changes no reference count: an untracked object that later comes to refer
 * to a tracked one (a batch's rows made at a read) keeps that one alive for as long as it is alive itself, as any
 * reference does; only a cycle through it would be missed, which nothing the recorder hands over can make. */
static int
is_container(PyObject *obj)
{
    return PyList_CheckExact(obj) || PyTuple_CheckExact(obj) || PyDict_CheckExact(obj);
}

typedef struct {
    PyObject *owner;
    int depth;
} UntrackVisit;

static int untrack_one(PyObject *obj, int depth);

static int
untrack_visit(PyObject *ref, void *arg)
{
    UntrackVisit *visit = (UntrackVisit *)arg;
    if (ref == NULL || ref == (PyObject *)Py_TYPE(visit->owner)) return 0;
    if (!zm_tracked(ref)) return 0;
    if (visit->depth > 0 && is_container(ref) && untrack_one(ref, visit->depth - 1)) {
        return 0;
    }
    return 1;  /* a tracked reference: stop, the owner stays tracked */
}

/* 1 where ``obj`` is untracked now (it was, or everything it refers to is), else 0. */
static int
untrack_one(PyObject *obj, int depth)
{
    if (!zm_tracked(obj)) return 1;
    if (PyType_Check(obj)) return 0;
    traverseproc traverse = Py_TYPE(obj)->tp_traverse;
    if (traverse == NULL) return 0;
    UntrackVisit visit = {obj, depth};
    if (traverse(obj, untrack_visit, &visit) != 0) return 0;
    PyObject_GC_UnTrack(obj);
    return 1;
}

static PyObject *
untrack(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *objects, *kinds;
    if (!PyArg_ParseTuple(args, "OO!:untrack", &objects, &PyTuple_Type, &kinds)) return NULL;
    PyObject *seq = PySequence_Fast(objects, "untrack() takes a sequence of objects");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), done = 0, named = PyTuple_GET_SIZE(kinds);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *obj = items[i];
        if (!zm_tracked(obj)) continue;
        int allowed = is_container(obj);
        for (Py_ssize_t k = 0; !allowed && k < named; k++) {
            allowed = (PyObject *)Py_TYPE(obj) == PyTuple_GET_ITEM(kinds, k);
        }
        if (allowed) done += untrack_one(obj, 2);
    }
    Py_DECREF(seq);
    return PyLong_FromSsize_t(done);
}

static PyMethodDef methods[] = {
    {"async_columns", async_columns, METH_VARARGS,
     "async_columns(rows, offset, launches, measured) -> finalize_pass's rows as columns, or None."},
    {"sync_columns", sync_columns, METH_VARARGS,
     "sync_columns(items, shapes, shape_of, offset, max_ns) -> a synchronous batch's columns, or None."},
    {"all_sync", all_sync, METH_VARARGS,
     "all_sync(items, kind, emitted) -> whether every record is a synchronous host collective of a step after emitted."},
    {"account_sync", account_sync, METH_VARARGS,
     "account_sync(steps, ops, nbytes, issue, complete, blocked, ends, accs, new_acc, limit) -> the row it stopped at: "
     "finalize_sync_batch's step accounting, a run of one step's collectives at a time."},
    {"count_ops", count_ops, METH_VARARGS,
     "count_ops(by_op, ops, nbytes) -> sum(nbytes): each collective's bytes added to by_op[op], in order."},
    {"summarize_host", (PyCFunction)(void (*)(void))summarize_host, METH_FASTCALL,
     "summarize_host(acc, rank, step, start_ns, end_ns) -> a sequential host step's summary values, or None."},
    {"sequential_overlap", sequential_overlap, METH_VARARGS,
     "sequential_overlap(issue, complete, ends, agent, start_ns, end_ns) -> _sequential_overlap_ns's result, or "
     "False where the values do not fit 64 bits (the Python function then)."},
    {"untrack", untrack, METH_VARARGS,
     "untrack(objects, kinds) -> how many of objects (exact tuples, lists and dicts, and instances of the classes "
     "kinds names) the garbage collector no longer tracks: those that refer to nothing it tracks, exact lists, "
     "tuples and dicts two levels down made so first."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "zeromon_agent.recorder._batch",
    "The columns of a pass's collectives made in C (finalize_sync_batch's and finalize_pass's optional fast path).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__batch(void)
{
    if (zero == NULL && (zero = PyLong_FromLong(0)) == NULL) return NULL;
    for (int f = 0; f < ACC_FIELDS; f++) {
        if (acc_names[f] == NULL && (acc_names[f] = PyUnicode_InternFromString(acc_field_names[f])) == NULL) return NULL;
    }
    for (int f = 0; f < SUM_FIELDS; f++) {
        if (sum_names[f] == NULL && (sum_names[f] = PyUnicode_InternFromString(sum_field_names[f])) == NULL) return NULL;
    }
    if (ns_per_s == NULL && (ns_per_s = PyFloat_FromDouble(1e9)) == NULL) return NULL;
    return PyModule_Create(&module);
}
