/* zeromon_agent.recorder._host: a GPU-less pass's host records in C (an optional build, setup.py).
 *
 * Without a GPU every boundary the hooks queue is a plain perf_ns, and a pass's control records are mostly a run of
 * phase changes, zeromon's own spans, step ends and starts and the agent's memory samples. Their handlers in Python
 * (StepBook's host handlers, Recorder._on_memory) run a call and a dozen bytecodes a record; here:
 *   host_phases: a run of them, its closed phases as (phase, step, start, end) tuples, each step boundary's Mark on
 *                its accumulator, the samples' values and each step's peak;
 *   host_spans: those closed phases' columns and each step's accounting (StepBook.finish_host_spans').
 * The same values as the Python paths (tests/test_recorder_fast_path.py runs both); where a record is of another
 * shape, or a value passes 64 bits, the Python handlers take it. The collectives' columns are _batch.c's.
 */
#include "_columns.h"

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
    /* out of the collector's lists where its values hold nothing it follows (a sample's: sizes, names, an empty or
     * walked {category: bytes}), as the live views' untrack would leave it at the pass's end, after a walk */
    int appended = PyList_Append(run->samples, zm_untracked_if_atomic(sample));
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

/* A run's step boundaries (host_phases' ``steps``, or None): StepBook's _on_step_start_host and _on_step_end_host's work
 * on a step's accumulator, made of the run's records in order. */
typedef struct {
    long start_kind, end_kind;  /* RAW_STEP_START, RAW_STEP_END */
    PyObject *accs, *new_acc;   /* StepBook.accs (step -> StepAcc) and what makes a step's first one */
    PyObject *mark, *clock;     /* Mark (its perf the one argument), time.perf_counter_ns */
} StepRun;

static PyObject *one;  /* 1, made once */
static PyObject *start_name, *end_name, *ended_name;  /* StepAcc's start, end, ended_at_perf (interned) */
static PyObject *phase_ns_name, *agent_name, *start_ns_name;  /* and phase_ns, agent, start_ns: host_spans' (interned) */

/* steps: (start_kind, end_kind, accs, new_acc, mark, clock). 1, 0 (None: no step boundary taken in C), or -1 with an
 * exception. */
static int
step_run(PyObject *steps, StepRun *run)
{
    if (steps == Py_None) return 0;
    if (!PyTuple_CheckExact(steps) || PyTuple_GET_SIZE(steps) != 6 || !PyDict_CheckExact(PyTuple_GET_ITEM(steps, 2))) {
        PyErr_SetString(PyExc_TypeError, "host_phases' steps: (start_kind, end_kind, accs, new_acc, mark, clock)");
        return -1;
    }
    run->start_kind = PyLong_AsLong(PyTuple_GET_ITEM(steps, 0));
    run->end_kind = PyLong_AsLong(PyTuple_GET_ITEM(steps, 1));
    run->accs = PyTuple_GET_ITEM(steps, 2);
    run->new_acc = PyTuple_GET_ITEM(steps, 3);
    run->mark = PyTuple_GET_ITEM(steps, 4);
    run->clock = PyTuple_GET_ITEM(steps, 5);
    return PyErr_Occurred() ? -1 : 1;
}

/* A step's boundary at ``t`` set on its accumulator (``name``: start or end; an end's ended_at_perf too): 0, or -1 with
 * an exception. */
static int
step_mark(StepRun *run, PyObject *step, PyObject *t, PyObject *name)
{
    PyObject *acc = step_acc(run->accs, run->new_acc, step);
    if (acc == NULL) return -1;
    PyObject *mark = PyObject_CallOneArg(run->mark, t);
    if (mark == NULL) return -1;
    int set = PyObject_SetAttr(acc, name, mark);
    Py_DECREF(mark);
    if (set < 0 || name != end_name) return set;
    PyObject *now = PyObject_CallNoArgs(run->clock);
    if (now == NULL) return -1;
    set = PyObject_SetAttr(acc, ended_name, now);
    Py_DECREF(now);
    return set;
}

/* The current phase (phase, start, step) closed at ``t``: (phase, step, start, t) appended to ``spans``. 0, or -1 with
 * an exception. */
static int
close_phase(PyObject *spans, PyObject *phase, PyObject *t)
{
    PyObject *span = zm_untracked_if_atomic(PyTuple_Pack(4, PyTuple_GET_ITEM(phase, 0), PyTuple_GET_ITEM(phase, 2),
                                                      PyTuple_GET_ITEM(phase, 1), t));
    int appended = span != NULL ? PyList_Append(spans, span) : -1;
    Py_XDECREF(span);
    return appended;
}

/* host_phases(items, index, stop, phase, spans, agent, phase_kind, agent_kind, memory, steps): StepBook's host handlers
 * of a run of phase changes and agent spans (_on_phase_host, _on_agent_host: a GPU-less run's boundaries), of its
 * step boundaries (``steps``, or None: see step_run; _on_step_start_host, _on_step_end_host) and of the agent's memory
 * samples (``memory``, or None: see memory_run), from items[index] on, up to ``stop`` or the first record of another
 * kind (or of an odd shape, which the Python handlers then take): each closed phase appended to ``spans`` as (phase,
 * step, start, end), ``agent`` the agent's phase name; each step boundary a Mark on its step's accumulator; each
 * memory sample's values to its samples, each step's highest level to its peaks (the caller writes and publishes
 * them: Recorder._take_samples). Returns (the index it stopped at, the current phase: (phase, start, step) or None),
 * the same as the handlers one record at a time (tests/test_recorder_fast_path.py). */
static PyObject *
host_phases(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 10 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[4])) {
        PyErr_SetString(PyExc_TypeError,
                        "host_phases(items, index, stop, phase, spans, agent, phase_kind, agent_kind, memory, steps)");
        return NULL;
    }
    PyObject *items = args[0], *spans = args[4], *agent = args[5];
    Py_ssize_t index = PyLong_AsSsize_t(args[1]), stop = PyLong_AsSsize_t(args[2]);
    long phase_kind = PyLong_AsLong(args[6]), agent_kind = PyLong_AsLong(args[7]);
    if (PyErr_Occurred()) return NULL;
    MemoryRun memory;
    int with_memory = memory_run(args[8], &memory);
    if (with_memory < 0) return NULL;
    StepRun steps;
    int with_steps = step_run(args[9], &steps);
    if (with_steps < 0) return NULL;
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
                if (later && close_phase(spans, phase, t) < 0) goto failed;
            }
            made = zm_untracked_if_atomic(PyTuple_Pack(3, PyTuple_GET_ITEM(item, 1), t, PyTuple_GET_ITEM(item, 3)));
        } else if (kind == agent_kind && PyTuple_GET_SIZE(item) == 5) {  /* (kind, step, t0, t1, phase) */
            if (!current) continue;  /* no phase to come back to: nothing */
            PyObject *t0 = PyTuple_GET_ITEM(item, 2), *t1 = PyTuple_GET_ITEM(item, 3);
            PyObject *name = PyTuple_GET_ITEM(phase, 0), *start = PyTuple_GET_ITEM(phase, 1);
            PyObject *step = PyTuple_GET_ITEM(phase, 2);
            int later = PyObject_RichCompareBool(t0, start, Py_GT);
            if (later < 0) goto failed;
            PyObject *before = later ? zm_untracked_if_atomic(PyTuple_Pack(4, name, step, start, t0)) : NULL;
            PyObject *own = zm_untracked_if_atomic(PyTuple_Pack(4, agent, step, t0, t1));
            if ((later && before == NULL) || own == NULL || (before != NULL && PyList_Append(spans, before) < 0)
                    || PyList_Append(spans, own) < 0) {
                Py_XDECREF(before);
                Py_XDECREF(own);
                goto failed;
            }
            Py_XDECREF(before);
            Py_DECREF(own);
            made = zm_untracked_if_atomic(PyTuple_Pack(3, name, t1, step));
        } else if (with_steps && (kind == steps.start_kind || kind == steps.end_kind) && PyTuple_GET_SIZE(item) == 5) {
            /* a start (kind, step, t, event, phase), an end (kind, step, t, event, explicit) */
            PyObject *step = PyTuple_GET_ITEM(item, 1), *t = PyTuple_GET_ITEM(item, 2), *last = PyTuple_GET_ITEM(item, 4);
            int start = kind == steps.start_kind, close = current;
            if (close && (close = PyObject_RichCompareBool(t, PyTuple_GET_ITEM(phase, 1), Py_GT)) < 0) goto failed;
            if (close && start) {  /* a gap inside the step is none */
                close = PyObject_RichCompareBool(PyTuple_GET_ITEM(phase, 2), step, Py_NE);
                if (close < 0) goto failed;
            }
            if (close && close_phase(spans, phase, t) < 0) goto failed;
            if (start) {
                made = zm_untracked_if_atomic(PyTuple_Pack(3, last, t, step));
            } else {  /* the next step starts where this one ends, but after zeromon_agent.step()'s explicit end */
                int explicit = PyObject_IsTrue(last);
                if (explicit < 0) goto failed;
                if (current && !explicit) {
                    PyObject *next = PyNumber_Add(step, one);
                    made = next != NULL ? zm_untracked_if_atomic(PyTuple_Pack(3, PyTuple_GET_ITEM(phase, 0), t, next))
                                        : NULL;
                    Py_XDECREF(next);
                } else {
                    made = Py_NewRef(Py_None);
                }
            }
            if (made == NULL) goto failed;
            Py_SETREF(phase, made);
            if (step_mark(&steps, step, t, start ? start_name : end_name) < 0) goto failed;
            continue;
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

/* host_spans(spans, offset, emitted, agent, accs, new_acc): StepBook.finish_host_spans' columns and step accounting of a
 * GPU-less pass's closed phases (``spans``: (phase, step, start, end) tuples in perf_ns, in order). Returns (steps,
 * phases, starts, ends), each start and end on the Unix clock (+ ``offset``), and adds each run of one step's spans,
 * of a step after ``emitted``, into its accumulator (step_acc: a StepAcc): each phase's nanoseconds, in order;
 * the agent's own spans (phase ``agent``) as (start, end); the earliest start. None, nothing done, where a span is
 * not of that shape or a value or a sum passes 64 bits: the Python loop then, the same
 * (tests/test_recorder_fast_path.py). */
static PyObject *
host_spans(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *spans, *offset_obj, *emitted_obj, *agent, *accs, *new_acc;
    if (!PyArg_ParseTuple(args, "O!OOUO!O:host_spans", &PyList_Type, &spans, &offset_obj, &emitted_obj, &agent,
                          &PyDict_Type, &accs, &new_acc)) {
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(spans);
    int64_t offset, emitted;
    if (!as_int64(offset_obj, &offset) || !as_int64(emitted_obj, &emitted)) Py_RETURN_NONE;
    int64_t *values = PyMem_Malloc(sizeof(int64_t) * 4 * (size_t)(n > 0 ? n : 1));
    if (values == NULL) return PyErr_NoMemory();
    int64_t *steps = values, *starts = values + n, *ends = values + 2 * n, *durations = values + 3 * n;
    for (Py_ssize_t i = 0; i < n; i++) {  /* every span checked before anything is made or added */
        PyObject *span = PyList_GET_ITEM(spans, i);
        int64_t start, end;
        if (!PyTuple_CheckExact(span) || PyTuple_GET_SIZE(span) != 4 || !PyUnicode_CheckExact(PyTuple_GET_ITEM(span, 0))
                || !PyLong_CheckExact(PyTuple_GET_ITEM(span, 1)) || !PyLong_CheckExact(PyTuple_GET_ITEM(span, 2))
                || !PyLong_CheckExact(PyTuple_GET_ITEM(span, 3)) || !as_int64(PyTuple_GET_ITEM(span, 1), &steps[i])
                || !as_int64(PyTuple_GET_ITEM(span, 2), &start) || !as_int64(PyTuple_GET_ITEM(span, 3), &end)
                || __builtin_add_overflow(start, offset, &starts[i]) || __builtin_add_overflow(end, offset, &ends[i])
                || __builtin_sub_overflow(ends[i], starts[i], &durations[i])) {
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
        PyObject *acc = Py_XNewRef(step_acc(accs, new_acc, PyList_GET_ITEM(step_column, i)));  /* owned here */
        if (acc == NULL) goto failed;
        PyObject *phase_ns = PyObject_GetAttr(acc, phase_ns_name), *agent_spans = NULL, *known = NULL;
        if (phase_ns == NULL || !PyDict_CheckExact(phase_ns)) {
            if (phase_ns != NULL) PyErr_SetString(PyExc_TypeError, "host_spans: a phase_ns not a dict");
            goto failed_acc;
        }
        /* the run's time by phase: each phase's sum added once where the values let it, else span by span */
        KeySums sums = {.n = 0};
        int summed = key_sums_add(&sums, PySequence_Fast_ITEMS(phase_column) + i, durations + i, j - i);
        if (summed && (summed = key_sums_into(phase_ns, &sums)) < 0) goto failed_acc;
        Py_ssize_t first = i;
        for (Py_ssize_t k = i; k < j; k++) {
            PyObject *phase = PyList_GET_ITEM(phase_column, k);
            if (!summed) {
                PyObject *duration = PyLong_FromLongLong(durations[k]);
                int added = duration != NULL ? dict_add(phase_ns, phase, duration) : -1;
                Py_XDECREF(duration);
                if (added < 0) goto failed_acc;
            }
            if (PyUnicode_Compare(phase, agent) == 0) {
                if (agent_spans == NULL && ((agent_spans = PyObject_GetAttr(acc, agent_name)) == NULL
                                            || !PyList_Check(agent_spans))) {
                    if (agent_spans != NULL) PyErr_SetString(PyExc_TypeError, "host_spans: an agent not a list");
                    goto failed_acc;
                }
                PyObject *pair = zm_untracked_if_atomic(PyTuple_Pack(2, PyList_GET_ITEM(start_column, k),
                                                                  PyList_GET_ITEM(end_column, k)));
                if (pair == NULL || PyList_Append(agent_spans, pair) < 0) {
                    Py_XDECREF(pair);
                    goto failed_acc;
                }
                Py_DECREF(pair);
            }
            if (starts[k] < starts[first]) first = k;
        }
        /* its earliest start: min() of the run's, the first of equal ones */
        if ((known = PyObject_GetAttr(acc, start_ns_name)) == NULL) goto failed_acc;
        PyObject *earliest = PyList_GET_ITEM(start_column, first);
        int earlier = known == Py_None ? 1 : PyObject_RichCompareBool(earliest, known, Py_LT);
        if (earlier < 0 || (earlier && PyObject_SetAttr(acc, start_ns_name, earliest) < 0)) goto failed_acc;
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
    untrack_columns(columns);
    return columns;
failed:
    PyMem_Free(values);
    Py_XDECREF(columns);
    return NULL;
}

static PyMethodDef methods[] = {
    {"host_phases", (PyCFunction)(void (*)(void))host_phases, METH_FASTCALL,
     "host_phases(items, index, stop, phase, spans, agent, phase_kind, agent_kind, memory, steps) -> (index, phase): a "
     "run of phase changes, agent spans, step boundaries and memory samples, StepBook's host handlers and "
     "Recorder._on_memory's."},
    {"host_spans", host_spans, METH_VARARGS,
     "host_spans(spans, offset, emitted, agent, accs, new_acc) -> (steps, phases, starts, ends): finish_host_spans' "
     "columns, "
     "each run of a step's spans added into its accumulator; None where the Python loop takes them."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "zeromon_agent.recorder._host",
    "A GPU-less pass's phase changes, step boundaries and memory samples, and its closed phases' columns, in C.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__host(void)
{
    if (one == NULL && (one = PyLong_FromLong(1)) == NULL) return NULL;
    if (start_name == NULL && (start_name = PyUnicode_InternFromString("start")) == NULL) return NULL;
    if (end_name == NULL && (end_name = PyUnicode_InternFromString("end")) == NULL) return NULL;
    if (ended_name == NULL && (ended_name = PyUnicode_InternFromString("ended_at_perf")) == NULL) return NULL;
    if (phase_ns_name == NULL && (phase_ns_name = PyUnicode_InternFromString("phase_ns")) == NULL) return NULL;
    if (agent_name == NULL && (agent_name = PyUnicode_InternFromString("agent")) == NULL) return NULL;
    if (start_ns_name == NULL && (start_ns_name = PyUnicode_InternFromString("start_ns")) == NULL) return NULL;
    return PyModule_Create(&module);
}
