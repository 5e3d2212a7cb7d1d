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
 * Beside them, five of a pass's other loops, each with its Python path: host_phases (a run of a GPU-less pass's
 * phase changes, agent spans and memory samples: StepBook's host handlers, Recorder._on_memory), host_spans (their
 * closed phases' columns and step accounting, StepBook.finish_host_spans'), count_ops (a step's bytes by op,
 * CollectiveRecords._count_run's), sequential_overlap (a step of calls one after another summed,
 * step_acc._sequential_overlap_ns) and untrack (the records handed to the live views let out of the garbage
 * collector's lists, Outbox.release).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

static PyObject *zero;  /* 0, made once */

/* A raw collective's fields (hooks/state.py: RAW_COLLECTIVE's tuple). */
enum { SEQ = 1, API = 2, OP = 3, T0 = 4, T1 = 5, B_IN = 6, B_OUT = 7, DTYPE = 8, GROUP = 9, ASYNC = 10, PHASE = 12,
       STEP = 13, CALLER = 16, RAW_FIELDS = 17 };
/* A call shape's fields (CollectiveRecords._shape): dtype name, group size, meaning, bytes, bus factor, array size. */
enum { SHAPE_FIELDS = 6 };
enum { OUT_SEQ, OUT_API, OUT_OP, OUT_PHASE, OUT_STEP, OUT_B_IN, OUT_B_OUT, OUT_DTYPE, OUT_GROUP_SIZE, OUT_MEANING,
       OUT_NBYTES, OUT_ISSUE, OUT_COMPLETE, OUT_BLOCKED, OUT_BUSBW, OUT_END, OUT_COLUMNS };

static int
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
static PyObject *
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

/* The batch's call shapes, one a raw tuple (a new reference each), or NULL: an error set (from shape_of), or
 * none where a key cannot be hashed (*unhashable set). */
static PyObject **
shapes_of(PyObject **raw, Py_ssize_t n, PyObject *shapes, PyObject *shape_of, int *unhashable)
{
    PyObject **found = PyMem_Calloc(n ? n : 1, sizeof(PyObject *));
    if (found == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    static const int KEY[] = {OP, PHASE, B_IN, B_OUT, DTYPE, GROUP, CALLER};
    for (Py_ssize_t i = 0; i < n; i++) {
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
        if (blocked > 0 && factor != Py_None && PyObject_RichCompareBool(size, zero, Py_GT) == 1) {
            PyObject *rate = PyNumber_TrueDivide(size, seconds);
            busbw = rate != NULL ? PyNumber_Multiply(rate, factor) : NULL;
            Py_XDECREF(rate);
            if (busbw == NULL) goto failed_row;
        } else {
            if (PyErr_Occurred()) goto failed_row;
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
        if (busbw && (busbw = PyObject_RichCompareBool(size, zero, Py_GT)) < 0) goto failed;
        if (busbw) {
            PyObject *seconds = PyFloat_FromDouble(s), *rate = NULL, *value = NULL;
            if (seconds != NULL) rate = PyNumber_TrueDivide(size, seconds);
            if (rate != NULL) value = PyNumber_Multiply(rate, factor);
            Py_XDECREF(seconds);
            Py_XDECREF(rate);
            MADE(A_BUSBW, i, value);
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
    return columns;
failed:
    Py_XDECREF(columns);
    return NULL;
}

/* A run's memory samples (host_phases' ``memory``, or None): what Recorder._on_memory does with the agent's own samples
 * (its values a tuple of n_fields, its time an int), made of the run's records in order. */
typedef struct {
    long kind;             /* RAW_MEMORY */
    PyObject *samples;     /* list: each sample's values, (rank, step, phase, t + offset, *fields) */
    PyObject *peaks;       /* dict: step -> its highest level (allocated, else rss) among the run's samples, or None */
    PyObject *rank, *offset, *emitted, *peak_phases;  /* emitted: StepBook.emitted_through; peak_phases: a frozenset */
    Py_ssize_t n_fields, at_allocated, at_rss;  /* the two levels' places in the fields */
} MemoryRun;

/* memory: (kind, samples, peaks, rank, offset, n_fields, emitted, peak_phases, at_allocated, at_rss). 1, 0 (not a
 * tuple of that shape: no memory sample taken in C), or -1 with an exception. */
static int
memory_run(PyObject *memory, MemoryRun *run)
{
    if (memory == Py_None) return 0;
    if (!PyTuple_CheckExact(memory) || PyTuple_GET_SIZE(memory) != 10
            || !PyList_CheckExact(PyTuple_GET_ITEM(memory, 1)) || !PyDict_CheckExact(PyTuple_GET_ITEM(memory, 2))
            || !PyFrozenSet_CheckExact(PyTuple_GET_ITEM(memory, 7))) {
        PyErr_SetString(PyExc_TypeError, "host_phases' memory: (kind, samples, peaks, rank, offset, n_fields, "
                        "emitted, peak_phases, at_allocated, at_rss)");
        return -1;
    }
    run->kind = PyLong_AsLong(PyTuple_GET_ITEM(memory, 0));
    run->samples = PyTuple_GET_ITEM(memory, 1);
    run->peaks = PyTuple_GET_ITEM(memory, 2);
    run->rank = PyTuple_GET_ITEM(memory, 3);
    run->offset = PyTuple_GET_ITEM(memory, 4);
    run->n_fields = PyLong_AsSsize_t(PyTuple_GET_ITEM(memory, 5));
    run->emitted = PyTuple_GET_ITEM(memory, 6);
    run->peak_phases = PyTuple_GET_ITEM(memory, 7);
    run->at_allocated = PyLong_AsSsize_t(PyTuple_GET_ITEM(memory, 8));
    run->at_rss = PyLong_AsSsize_t(PyTuple_GET_ITEM(memory, 9));
    if (PyErr_Occurred()) return -1;
    if (run->at_allocated < 0 || run->at_allocated >= run->n_fields || run->at_rss < 0
            || run->at_rss >= run->n_fields) {
        PyErr_SetString(PyExc_ValueError, "host_phases' memory: a level's place outside the fields");
        return -1;
    }
    return 1;
}

/* A memory record (kind, phase, step, t, fields) of the agent's shape into run->samples and run->peaks: 1, 0 (of
 * another shape: the Python handler takes it), -1 with an exception. */
static int
memory_sample(MemoryRun *run, PyObject *item)
{
    if (PyTuple_GET_SIZE(item) != 5) return 0;
    PyObject *phase = PyTuple_GET_ITEM(item, 1), *step = PyTuple_GET_ITEM(item, 2), *t = PyTuple_GET_ITEM(item, 3);
    PyObject *fields = PyTuple_GET_ITEM(item, 4);
    if (!PyTuple_CheckExact(fields) || PyTuple_GET_SIZE(fields) != run->n_fields || !PyLong_CheckExact(t)
            || !PyLong_CheckExact(step)) {
        return 0;
    }
    PyObject *sample = PyTuple_New(4 + run->n_fields);
    if (sample == NULL) return -1;
    PyObject *t_ns = PyNumber_Add(t, run->offset);
    if (t_ns == NULL) {
        Py_DECREF(sample);
        return -1;
    }
    PyTuple_SET_ITEM(sample, 0, Py_NewRef(run->rank));
    PyTuple_SET_ITEM(sample, 1, Py_NewRef(step));
    PyTuple_SET_ITEM(sample, 2, Py_NewRef(phase));
    PyTuple_SET_ITEM(sample, 3, t_ns);
    for (Py_ssize_t i = 0; i < run->n_fields; i++) {
        PyTuple_SET_ITEM(sample, 4 + i, Py_NewRef(PyTuple_GET_ITEM(fields, i)));
    }
    int appended = PyList_Append(run->samples, sample);
    Py_DECREF(sample);
    if (appended < 0) return -1;
    /* The step's peak from the samples taken every step (not those of PEAK_PHASES), of a step not summarized. */
    int later = PyObject_RichCompareBool(step, run->emitted, Py_GT);
    if (later <= 0) return later < 0 ? -1 : 1;
    int peak_phase = PySet_Contains(run->peak_phases, phase);
    if (peak_phase != 0) return peak_phase < 0 ? -1 : 1;
    PyObject *level = PyTuple_GET_ITEM(fields, run->at_allocated);
    if (level == Py_None) level = PyTuple_GET_ITEM(fields, run->at_rss);
    PyObject *known = PyDict_GetItemWithError(run->peaks, step);  /* borrowed */
    if (known == NULL && PyErr_Occurred()) return -1;
    int higher = 1;
    if (known != NULL) {
        if (level == Py_None) return 1;
        if (known != Py_None && (higher = PyObject_RichCompareBool(level, known, Py_GT)) < 0) return -1;
    }
    return higher ? (PyDict_SetItem(run->peaks, step, level) < 0 ? -1 : 1) : 1;
}

/* host_phases(items, index, stop, phase, spans, agent, phase_kind, agent_kind, memory): StepBook's host handlers of a
 * run of phase changes and agent spans (_on_phase_host, _on_agent_host: a GPU-less run's boundaries), and of the
 * agent's memory samples (``memory``, or None: see memory_run), from items[index] on, up to ``stop`` or the first
 * record of another kind (or of an odd shape, which the Python handlers then take): each closed phase appended to
 * ``spans`` as (phase, step, start, end), ``agent`` the agent's phase name; each memory sample's values to its
 * samples, each step's highest level to its peaks (the caller writes and publishes them: Recorder._take_samples).
 * Returns (the index it stopped at, the current phase: (phase, start, step) or None), the same as the handlers one
 * record at a time (tests/test_recorder_fast_path.py). */
static PyObject *
host_phases(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 9 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[4])) {
        PyErr_SetString(PyExc_TypeError,
                        "host_phases(items, index, stop, phase, spans, agent, phase_kind, agent_kind, memory)");
        return NULL;
    }
    PyObject *items = args[0], *spans = args[4], *agent = args[5];
    Py_ssize_t index = PyLong_AsSsize_t(args[1]), stop = PyLong_AsSsize_t(args[2]);
    long phase_kind = PyLong_AsLong(args[6]), agent_kind = PyLong_AsLong(args[7]);
    if (PyErr_Occurred()) return NULL;
    MemoryRun memory;
    int with_memory = memory_run(args[8], &memory);
    if (with_memory < 0) return NULL;
    if (stop > PyList_GET_SIZE(items)) stop = PyList_GET_SIZE(items);
    PyObject *phase = Py_NewRef(args[3]);  /* owned: the current phase */
    for (; index < stop; index++) {
        PyObject *item = PyList_GET_ITEM(items, index);
        if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) < 4 || !PyLong_CheckExact(PyTuple_GET_ITEM(item, 0))) break;
        long kind = PyLong_AsLong(PyTuple_GET_ITEM(item, 0));
        if (kind == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            break;
        }
        if (with_memory && kind == memory.kind) {  /* (kind, phase, step, t, fields) */
            int taken = memory_sample(&memory, item);
            if (taken < 0) goto failed;
            if (!taken) break;
            continue;
        }
        int current = phase != Py_None;
        if (current && (!PyTuple_CheckExact(phase) || PyTuple_GET_SIZE(phase) != 3)) break;
        PyObject *made = NULL;
        if (kind == phase_kind) {  /* (kind, phase, t, step[, event]) */
            PyObject *t = PyTuple_GET_ITEM(item, 2);
            if (current) {
                int later = PyObject_RichCompareBool(t, PyTuple_GET_ITEM(phase, 1), Py_GT);
                if (later < 0) goto failed;
                if (later) {
                    PyObject *span = PyTuple_Pack(4, PyTuple_GET_ITEM(phase, 0), PyTuple_GET_ITEM(phase, 2),
                                                  PyTuple_GET_ITEM(phase, 1), t);
                    if (span == NULL || PyList_Append(spans, span) < 0) {
                        Py_XDECREF(span);
                        goto failed;
                    }
                    Py_DECREF(span);
                }
            }
            made = PyTuple_Pack(3, PyTuple_GET_ITEM(item, 1), t, PyTuple_GET_ITEM(item, 3));
        } else if (kind == agent_kind && PyTuple_GET_SIZE(item) == 5) {  /* (kind, step, t0, t1, phase) */
            if (!current) continue;  /* no phase to come back to: nothing */
            PyObject *t0 = PyTuple_GET_ITEM(item, 2), *t1 = PyTuple_GET_ITEM(item, 3);
            PyObject *name = PyTuple_GET_ITEM(phase, 0), *start = PyTuple_GET_ITEM(phase, 1);
            PyObject *step = PyTuple_GET_ITEM(phase, 2);
            int later = PyObject_RichCompareBool(t0, start, Py_GT);
            if (later < 0) goto failed;
            PyObject *before = later ? PyTuple_Pack(4, name, step, start, t0) : NULL;
            PyObject *own = PyTuple_Pack(4, agent, step, t0, t1);
            if ((later && before == NULL) || own == NULL || (before != NULL && PyList_Append(spans, before) < 0)
                    || PyList_Append(spans, own) < 0) {
                Py_XDECREF(before);
                Py_XDECREF(own);
                goto failed;
            }
            Py_XDECREF(before);
            Py_DECREF(own);
            made = PyTuple_Pack(3, name, t1, step);
        } else {
            break;
        }
        if (made == NULL) goto failed;
        Py_SETREF(phase, made);
    }
    PyObject *out = Py_BuildValue("nN", index, phase);
    return out;
failed:
    Py_DECREF(phase);
    return NULL;
}

/* host_spans(spans, offset, emitted, agent, acc): StepBook.finish_host_spans' columns and step accounting of a
 * GPU-less pass's closed phases (``spans``: (phase, step, start, end) tuples in perf_ns, in order). Returns (steps,
 * phases, starts, ends), each start and end on the Unix clock (+ ``offset``), and adds each run of one step's spans,
 * of a step after ``emitted``, into its accumulator (``acc(step)``, a StepAcc): each phase's nanoseconds, in order;
 * the agent's own spans (phase ``agent``) as (start, end); the earliest start. None, nothing done, where a span is
 * not of that shape or a value or a sum passes 64 bits: the Python loop then, the same
 * (tests/test_recorder_fast_path.py). */
static PyObject *
host_spans(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *spans, *offset_obj, *emitted_obj, *agent, *get_acc;
    if (!PyArg_ParseTuple(args, "O!OOUO:host_spans", &PyList_Type, &spans, &offset_obj, &emitted_obj, &agent,
                          &get_acc)) {
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(spans);
    int64_t offset, emitted;
    if (!as_int64(offset_obj, &offset) || !as_int64(emitted_obj, &emitted)) Py_RETURN_NONE;
    int64_t *values = PyMem_Malloc(sizeof(int64_t) * 3 * (size_t)(n > 0 ? n : 1));
    if (values == NULL) return PyErr_NoMemory();
    int64_t *steps = values, *starts = values + n, *ends = values + 2 * n;
    for (Py_ssize_t i = 0; i < n; i++) {  /* every span checked before anything is made or added */
        PyObject *span = PyList_GET_ITEM(spans, i);
        int64_t start, end;
        if (!PyTuple_CheckExact(span) || PyTuple_GET_SIZE(span) != 4 || !PyUnicode_CheckExact(PyTuple_GET_ITEM(span, 0))
                || !PyLong_CheckExact(PyTuple_GET_ITEM(span, 1)) || !PyLong_CheckExact(PyTuple_GET_ITEM(span, 2))
                || !PyLong_CheckExact(PyTuple_GET_ITEM(span, 3)) || !as_int64(PyTuple_GET_ITEM(span, 1), &steps[i])
                || !as_int64(PyTuple_GET_ITEM(span, 2), &start) || !as_int64(PyTuple_GET_ITEM(span, 3), &end)
                || __builtin_add_overflow(start, offset, &starts[i]) || __builtin_add_overflow(end, offset, &ends[i])
                || __builtin_sub_overflow(ends[i], starts[i], &end)) {
            PyMem_Free(values);
            Py_RETURN_NONE;
        }
    }
    PyObject *columns = new_columns(4, n);
    if (columns == NULL) goto failed;
    PyObject *step_column = PyTuple_GET_ITEM(columns, 0), *phase_column = PyTuple_GET_ITEM(columns, 1);
    PyObject *start_column = PyTuple_GET_ITEM(columns, 2), *end_column = PyTuple_GET_ITEM(columns, 3);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *span = PyList_GET_ITEM(spans, i);
        PyList_SET_ITEM(step_column, i, Py_NewRef(PyTuple_GET_ITEM(span, 1)));
        PyList_SET_ITEM(phase_column, i, Py_NewRef(PyTuple_GET_ITEM(span, 0)));
        PyObject *start = PyLong_FromLongLong(starts[i]), *end = PyLong_FromLongLong(ends[i]);
        PyList_SET_ITEM(start_column, i, start);  /* NULL where not made: the column is released whole */
        PyList_SET_ITEM(end_column, i, end);
        if (start == NULL || end == NULL) goto failed;
    }
    for (Py_ssize_t i = 0, j; i < n; i = j) {  /* each run of one step's spans */
        for (j = i + 1; j < n && steps[j] == steps[i]; j++) {
        }
        if (steps[i] <= emitted) continue;  /* summarized: no accounting */
        PyObject *acc = PyObject_CallOneArg(get_acc, PyList_GET_ITEM(step_column, i));
        if (acc == NULL) goto failed;
        PyObject *phase_ns = PyObject_GetAttrString(acc, "phase_ns"), *agent_spans = NULL, *known = NULL;
        if (phase_ns == NULL || !PyDict_CheckExact(phase_ns)) {
            if (phase_ns != NULL) PyErr_SetString(PyExc_TypeError, "host_spans: a phase_ns not a dict");
            goto failed_acc;
        }
        Py_ssize_t first = i;
        for (Py_ssize_t k = i; k < j; k++) {
            PyObject *phase = PyList_GET_ITEM(phase_column, k);
            PyObject *duration = PyLong_FromLongLong(ends[k] - starts[k]);
            if (duration == NULL) goto failed_acc;
            PyObject *sum = PyDict_GetItemWithError(phase_ns, phase);  /* borrowed */
            if (sum == NULL && PyErr_Occurred()) {
                Py_DECREF(duration);
                goto failed_acc;
            }
            sum = sum != NULL ? PyNumber_Add(sum, duration) : Py_NewRef(duration);
            Py_DECREF(duration);
            if (sum == NULL || PyDict_SetItem(phase_ns, phase, sum) < 0) {
                Py_XDECREF(sum);
                goto failed_acc;
            }
            Py_DECREF(sum);
            if (PyUnicode_Compare(phase, agent) == 0) {
                if (agent_spans == NULL && ((agent_spans = PyObject_GetAttrString(acc, "agent")) == NULL
                                            || !PyList_Check(agent_spans))) {
                    if (agent_spans != NULL) PyErr_SetString(PyExc_TypeError, "host_spans: an agent not a list");
                    goto failed_acc;
                }
                PyObject *pair = PyTuple_Pack(2, PyList_GET_ITEM(start_column, k), PyList_GET_ITEM(end_column, k));
                if (pair == NULL || PyList_Append(agent_spans, pair) < 0) {
                    Py_XDECREF(pair);
                    goto failed_acc;
                }
                Py_DECREF(pair);
            }
            if (starts[k] < starts[first]) first = k;
        }
        /* its earliest start: min() of the run's, the first of equal ones */
        if ((known = PyObject_GetAttrString(acc, "start_ns")) == NULL) goto failed_acc;
        PyObject *earliest = PyList_GET_ITEM(start_column, first);
        int earlier = known == Py_None ? 1 : PyObject_RichCompareBool(earliest, known, Py_LT);
        if (earlier < 0 || (earlier && PyObject_SetAttrString(acc, "start_ns", earliest) < 0)) goto failed_acc;
        Py_DECREF(known);
        Py_XDECREF(agent_spans);
        Py_DECREF(phase_ns);
        Py_DECREF(acc);
        continue;
    failed_acc:
        Py_XDECREF(known);
        Py_XDECREF(agent_spans);
        Py_XDECREF(phase_ns);
        Py_DECREF(acc);
        goto failed;
    }
    PyMem_Free(values);
    return columns;
failed:
    PyMem_Free(values);
    Py_XDECREF(columns);
    return NULL;
}

/* count_ops(by_op, ops, nbytes): CollectiveRecords._count_run's count of a run of one step's collectives by op: each
 * one's bytes added to by_op[op] in order (a key made at its first), as ``by_op[op] = by_op.get(op, 0) + size`` does
 * one by one. Returns the sum of ``nbytes``. */
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
    total = Py_NewRef(zero);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *op = PySequence_Fast_GET_ITEM(ops, i), *size = PySequence_Fast_GET_ITEM(nbytes, i);
        PyObject *known = PyDict_GetItemWithError(by_op, op);  /* borrowed */
        if (known == NULL && PyErr_Occurred()) goto failed;
        PyObject *sum = PyNumber_Add(known != NULL ? known : zero, size);
        if (sum == NULL || PyDict_SetItem(by_op, op, sum) < 0) {
            Py_XDECREF(sum);
            goto failed;
        }
        Py_DECREF(sum);
        Py_SETREF(total, PyNumber_Add(total, size));
        if (total == NULL) goto done;
    }
    goto done;
failed:
    Py_CLEAR(total);
done:
    Py_XDECREF(ops);
    Py_XDECREF(nbytes);
    return total;
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

static PyObject *
sequential_overlap(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *issue, *complete, *ends, *agent, *start_obj, *end_obj;
    if (!PyArg_ParseTuple(args, "O!O!O!O!OO:sequential_overlap", &PyList_Type, &issue, &PyList_Type, &complete,
                          &PyList_Type, &ends, &PyList_Type, &agent, &start_obj, &end_obj)) {
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(issue), m = PyList_GET_SIZE(agent);
    int64_t start, end;
    if (n == 0 || PyList_GET_SIZE(complete) != n || PyList_GET_SIZE(ends) != n || !as_int64(start_obj, &start)
            || !as_int64(end_obj, &end)) {
        Py_RETURN_FALSE;
    }
    int64_t *values = PyMem_Malloc(sizeof(int64_t) * 3 * (size_t)n);
    Pair *spans = PyMem_Malloc(sizeof(Pair) * (size_t)(m > 0 ? m : 1));
    PyObject *result = Py_False;
    if (values == NULL || spans == NULL) {
        PyMem_Free(values);
        PyMem_Free(spans);
        return PyErr_NoMemory();
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
    result = Py_None;  /* from here on: not one after another, unless every check passes */
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
    result = Py_False;  /* the sums: False where one would overflow */
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
    PyMem_Free(values);
    PyMem_Free(spans);
    return Py_BuildValue("L(LLL)", (long long)comm, (long long)comp, (long long)overlap, (long long)blocked);
done:
    PyMem_Free(values);
    PyMem_Free(spans);
    return Py_NewRef(result);
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
    if (!PyObject_IS_GC(ref) || !PyObject_GC_IsTracked(ref)) return 0;
    if (visit->depth > 0 && is_container(ref) && untrack_one(ref, visit->depth - 1)) {
        return 0;
    }
    return 1;  /* a tracked reference: stop, the owner stays tracked */
}

/* 1 where ``obj`` is untracked now (it was, or everything it refers to is), else 0. */
static int
untrack_one(PyObject *obj, int depth)
{
    if (!PyObject_IS_GC(obj) || !PyObject_GC_IsTracked(obj)) return 1;
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
        if (!PyObject_IS_GC(obj) || !PyObject_GC_IsTracked(obj)) continue;
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
    {"host_phases", (PyCFunction)(void (*)(void))host_phases, METH_FASTCALL,
     "host_phases(items, index, stop, phase, spans, agent, phase_kind, agent_kind, memory) -> (index, phase): a run "
     "of phase changes, agent spans and memory samples, StepBook's host handlers and Recorder._on_memory's."},
    {"host_spans", host_spans, METH_VARARGS,
     "host_spans(spans, offset, emitted, agent, acc) -> (steps, phases, starts, ends): finish_host_spans' columns, "
     "each run of a step's spans added into its accumulator; None where the Python loop takes them."},
    {"count_ops", count_ops, METH_VARARGS,
     "count_ops(by_op, ops, nbytes) -> sum(nbytes): each collective's bytes added to by_op[op], in order."},
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
    return PyModule_Create(&module);
}
