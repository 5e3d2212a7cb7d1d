/* zeromon_agent.hooks._ring: the hooks' queue of raw records, a ring of references (an optional build, setup.py).
 *
 * A hook queues a record's fields with one call, ring.push(kind, a, b, ...): the references go into slots made once,
 * and no tuple is made a record. A queue of tuples (collections.deque) holds each record as an object the garbage
 * collector counts: a pass's worth of records (thousands, held for the flush interval) is that many allocations on
 * the training thread's side of the collector's count, which sets off young collections on the training thread as
 * the queue grows (tests/bench/RESULTS.md, "The hooks' queue as a ring"). The ring is one object, whatever it holds.
 * The recorder takes the records as tuples (take), made on its own thread as it drains them.
 *
 * Every method is one C call that runs without letting go of the GIL: a push on the training thread and a take on
 * the recorder's never interleave. Full, a push drops the oldest record (a deque's maxlen) and counts it. What a
 * method lets go of is let go of last, once the ring is whole again (a field's destructor may run Python code, a
 * push among it); a reference that moves into a taken tuple leaves its slot at once (the garbage collector, which a
 * tuple's allocation may start, sees each reference once).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

typedef struct {
    PyObject_HEAD
    Py_ssize_t capacity;  /* records */
    Py_ssize_t width;     /* the most fields a record has */
    Py_ssize_t head;      /* the oldest record's index */
    Py_ssize_t size;      /* records held */
    Py_ssize_t dropped;   /* the oldest records a full ring let go of */
    Py_ssize_t refused;   /* pushes of no field or more than width: not queued */
    PyObject **slots;     /* capacity x width references (NULL past a record's fields) */
    unsigned char *lengths;  /* each record's fields */
} Ring;

static PyObject **
slot_of(Ring *ring, Py_ssize_t index)  /* index: 0 the oldest record */
{
    return ring->slots + ((ring->head + index) % ring->capacity) * ring->width;
}

/* The oldest record off the ring: its references moved into ``out`` (at least width of them), their count returned;
 * the caller lets go of them once the ring is whole. */
static Py_ssize_t
pop_oldest(Ring *ring, PyObject **out)
{
    PyObject **slot = ring->slots + ring->head * ring->width;
    Py_ssize_t n = ring->lengths[ring->head];
    for (Py_ssize_t i = 0; i < n; i++) {
        out[i] = slot[i];
        slot[i] = NULL;
    }
    ring->lengths[ring->head] = 0;
    ring->head = (ring->head + 1) % ring->capacity;
    ring->size--;
    return n;
}

static int
Ring_init(Ring *self, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"capacity", "width", NULL};
    Py_ssize_t capacity, width;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "nn", names, &capacity, &width)) return -1;
    if (capacity < 1 || width < 1 || width > 255) {
        PyErr_SetString(PyExc_ValueError, "Ring: capacity must be at least 1 and width 1 to 255");
        return -1;
    }
    if (self->slots != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Ring: made once");
        return -1;
    }
    self->slots = PyMem_Calloc((size_t)capacity * (size_t)width, sizeof(PyObject *));
    self->lengths = PyMem_Calloc((size_t)capacity, 1);
    if (self->slots == NULL || self->lengths == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->capacity = capacity;
    self->width = width;
    return 0;
}

static int
Ring_traverse(Ring *self, visitproc visit, void *arg)
{
    for (Py_ssize_t r = 0; r < self->size; r++) {
        PyObject **slot = slot_of(self, r);
        Py_ssize_t n = self->lengths[(self->head + r) % self->capacity];
        for (Py_ssize_t i = 0; i < n; i++) Py_VISIT(slot[i]);
    }
    return 0;
}

/* Every record off the ring, then let go of (as a deque's clear: what a destructor pushes meanwhile stays). */
static void
clear_all(Ring *self)
{
    Py_ssize_t size = self->size;
    if (size == 0) return;
    PyObject **held = PyMem_Malloc((size_t)size * (size_t)self->width * sizeof(PyObject *));
    if (held == NULL) {  /* no room to hold them aside: a record at a time */
        PyObject *dropped[255];
        while (self->size > 0) {
            Py_ssize_t n = pop_oldest(self, dropped);
            for (Py_ssize_t i = 0; i < n; i++) Py_DECREF(dropped[i]);
        }
        return;
    }
    Py_ssize_t count = 0;
    while (self->size > 0) count += pop_oldest(self, held + count);
    self->head = 0;
    for (Py_ssize_t i = 0; i < count; i++) Py_DECREF(held[i]);
    PyMem_Free(held);
}

static int
Ring_clear(Ring *self)
{
    if (self->slots != NULL) clear_all(self);
    return 0;
}

static void
Ring_dealloc(Ring *self)
{
    PyObject_GC_UnTrack(self);
    Ring_clear(self);
    PyMem_Free(self->slots);
    PyMem_Free(self->lengths);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* push(*fields): the record queued; never raises (a hook's call). */
static PyObject *
Ring_push(Ring *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > self->width || self->slots == NULL) {
        self->refused++;
        Py_RETURN_NONE;
    }
    PyObject *dropped[255];
    Py_ssize_t n_dropped = 0;
    if (self->size == self->capacity) {  /* full: the oldest goes */
        n_dropped = pop_oldest(self, dropped);
        self->dropped++;
    }
    Py_ssize_t at = (self->head + self->size) % self->capacity;
    PyObject **slot = self->slots + at * self->width;
    for (Py_ssize_t i = 0; i < nargs; i++) {
        Py_INCREF(args[i]);
        slot[i] = args[i];
    }
    self->lengths[at] = (unsigned char)nargs;
    self->size++;
    for (Py_ssize_t i = 0; i < n_dropped; i++) Py_DECREF(dropped[i]);
    Py_RETURN_NONE;
}

/* append(record): push(*record), a tuple's fields (a deque's way, for the code that has the tuple). */
static PyObject *
Ring_append(Ring *self, PyObject *record)
{
    if (!PyTuple_Check(record)) {
        PyErr_SetString(PyExc_TypeError, "Ring.append takes a tuple");
        return NULL;
    }
    return Ring_push(self, &PyTuple_GET_ITEM(record, 0), PyTuple_GET_SIZE(record));
}

/* extend(records): append of each. */
static PyObject *
Ring_extend(Ring *self, PyObject *records)
{
    PyObject *iterator = PyObject_GetIter(records);
    if (iterator == NULL) return NULL;
    PyObject *record;
    while ((record = PyIter_Next(iterator)) != NULL) {
        PyObject *done = Ring_append(self, record);
        Py_DECREF(record);
        if (done == NULL) {
            Py_DECREF(iterator);
            return NULL;
        }
        Py_DECREF(done);
    }
    Py_DECREF(iterator);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* Record ``index`` (0 the oldest) as a new tuple; its references stay in the ring. */
static PyObject *
record_copy(Ring *self, Py_ssize_t index)
{
    PyObject **slot = slot_of(self, index);
    Py_ssize_t n = self->lengths[(self->head + index) % self->capacity];
    PyObject *tuple = PyTuple_New(n);
    if (tuple == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_INCREF(slot[i]);
        PyTuple_SET_ITEM(tuple, i, slot[i]);
    }
    return tuple;
}

/* take(): every record, oldest first, as tuples; the ring is then empty. */
static PyObject *
Ring_take(Ring *self, PyObject *Py_UNUSED(ignored))
{
    Py_ssize_t size = self->size;
    PyObject *out = PyList_New(size);
    if (out == NULL) return NULL;
    for (Py_ssize_t r = 0; r < size; r++) {
        Py_ssize_t at = (self->head + r) % self->capacity;
        PyObject **slot = self->slots + at * self->width;
        Py_ssize_t n = self->lengths[at];
        PyObject *tuple = PyTuple_New(n);
        if (tuple == NULL) {  /* nothing taken: the references go back to their slots, the tuples let go of */
            for (Py_ssize_t back = 0; back < r; back++) {
                PyObject *made = PyList_GET_ITEM(out, back);
                PyObject **slot_back = self->slots + ((self->head + back) % self->capacity) * self->width;
                for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(made); i++) {
                    slot_back[i] = PyTuple_GET_ITEM(made, i);
                    Py_INCREF(slot_back[i]);
                }
            }
            Py_DECREF(out);
            return NULL;
        }
        int atomic = 1;  /* no field the garbage collector tracks */
        for (Py_ssize_t i = 0; i < n; i++) {  /* the ring's references move into the tuple */
            PyTuple_SET_ITEM(tuple, i, slot[i]);
            if (PyObject_IS_GC(slot[i]) && PyObject_GC_IsTracked(slot[i])) atomic = 0;
            slot[i] = NULL;
        }
        /* What the collector does to such a tuple at its first look (CPython's _PyTuple_MaybeUntrack), now: a
         * pass's records are not walked by the young collections that the pass itself sets off. */
        if (atomic) PyObject_GC_UnTrack(tuple);
        PyList_SET_ITEM(out, r, tuple);
    }
    for (Py_ssize_t r = 0; r < size; r++) self->lengths[(self->head + r) % self->capacity] = 0;
    self->head = 0;
    self->size = 0;
    return out;
}

/* newest(n): the n newest records (fewer where fewer are queued), newest first, as tuples. */
static PyObject *
Ring_newest(Ring *self, PyObject *arg)
{
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n > self->size) n = self->size;
    if (n < 0) n = 0;
    PyObject *out = PyList_New(n);
    if (out == NULL) return NULL;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *tuple = record_copy(self, self->size - 1 - k);
        if (tuple == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, k, tuple);
    }
    return out;
}

static PyObject *
Ring_clear_method(Ring *self, PyObject *Py_UNUSED(ignored))
{
    clear_all(self);
    Py_RETURN_NONE;
}

static Py_ssize_t
Ring_length(Ring *self)
{
    return self->size;
}

static PyObject *
Ring_item(Ring *self, Py_ssize_t index)
{
    if (index < 0 || index >= self->size) {
        PyErr_SetString(PyExc_IndexError, "Ring index out of range");
        return NULL;
    }
    return record_copy(self, index);
}

static PyMethodDef Ring_methods[] = {
    {"push", (PyCFunction)(void (*)(void))Ring_push, METH_FASTCALL, "push(*fields): queue a record (never raises)."},
    {"append", (PyCFunction)Ring_append, METH_O, "append(record): push(*record)."},
    {"extend", (PyCFunction)Ring_extend, METH_O, "extend(records): append(record) of each."},
    {"take", (PyCFunction)Ring_take, METH_NOARGS, "take(): every record, oldest first, as tuples; then empty."},
    {"newest", (PyCFunction)Ring_newest, METH_O, "newest(n): the n newest records, newest first, as tuples."},
    {"clear", (PyCFunction)Ring_clear_method, METH_NOARGS, "clear(): let go of every record."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Ring_members[] = {
    {"capacity", T_PYSSIZET, offsetof(Ring, capacity), READONLY, "the most records held"},
    {"width", T_PYSSIZET, offsetof(Ring, width), READONLY, "the most fields a record has"},
    {"dropped", T_PYSSIZET, offsetof(Ring, dropped), READONLY, "the oldest records a full ring let go of"},
    {"refused", T_PYSSIZET, offsetof(Ring, refused), READONLY, "pushes of no field or too many"},
    {NULL, 0, 0, 0, NULL},
};

static PySequenceMethods Ring_sequence = {
    .sq_length = (lenfunc)Ring_length,
    .sq_item = (ssizeargfunc)Ring_item,
};

static PyTypeObject RingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "zeromon_agent.hooks._ring.Ring",
    .tp_doc = "Ring(capacity, width): the hooks' queue of raw records, a ring of references.",
    .tp_basicsize = sizeof(Ring),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Ring_init,
    .tp_dealloc = (destructor)Ring_dealloc,
    .tp_traverse = (traverseproc)Ring_traverse,
    .tp_clear = (inquiry)Ring_clear,
    .tp_methods = Ring_methods,
    .tp_members = Ring_members,
    .tp_as_sequence = &Ring_sequence,
};

static struct PyModuleDef ring_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "zeromon_agent.hooks._ring",
    .m_doc = "The hooks' queue of raw records, in C.",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__ring(void)
{
    if (PyType_Ready(&RingType) < 0) return NULL;
    PyObject *module = PyModule_Create(&ring_module);
    if (module == NULL) return NULL;
    Py_INCREF(&RingType);
    if (PyModule_AddObject(module, "Ring", (PyObject *)&RingType) < 0) {
        Py_DECREF(&RingType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
