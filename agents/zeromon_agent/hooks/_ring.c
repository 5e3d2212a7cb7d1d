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
 * the recorder's never interleave. Full, a push drops the oldest record (a deque's maxlen) and counts it. A push that
 * fills the ring to a mark calls the reader's callback (call_when): the recorder wakes as its queue crowds. What a
 * method lets go of is let go of last, once the ring is whole again (a field's destructor may run Python code, a
 * push among it); what a method makes tuples of it first takes aside (Aside, below).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "_tracked.h"  /* zeromon/model's: zm_tracked, zm_untracked_if_atomic */

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
    Py_ssize_t mark;      /* a push that brings the ring to this many records calls ``crowded`` (0: none) */
    PyObject *crowded;    /* call_when's callable, or NULL */
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
    Py_VISIT(self->crowded);
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
    Py_CLEAR(self->crowded);
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

/* push(*fields): the record queued; never raises (a hook's call), but for a KeyboardInterrupt or SystemExit that
 * call_when's callback meets. */
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
    if (self->size == self->mark && n_dropped == 0 && self->crowded != NULL) {
        /* The ring has just filled to the mark: its reader told (call_when). An error of the call's is not the
         * training's (a lock already released, say); a KeyboardInterrupt or SystemExit met in it is. */
        PyObject *callback = self->crowded;
        Py_INCREF(callback);
        PyObject *result = PyObject_CallNoArgs(callback);
        Py_DECREF(callback);
        if (result == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_Exception)) return NULL;
            PyErr_Clear();
        }
        Py_XDECREF(result);
    }
    Py_RETURN_NONE;
}

/* call_when(size, callback): ``callback()`` called on the pushing thread each time a push brings the ring to
 * ``size`` records (a reader woken as its queue crowds, not looking every so often); ``callback`` None: never. */
static PyObject *
Ring_call_when(Ring *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "call_when(size, callback) takes two arguments");
        return NULL;
    }
    Py_ssize_t mark = PyLong_AsSsize_t(args[0]);
    if (mark == -1 && PyErr_Occurred()) return NULL;
    if (args[1] != Py_None && !PyCallable_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "call_when: the callback must be callable or None");
        return NULL;
    }
    PyObject *old = self->crowded;
    self->crowded = args[1] == Py_None ? NULL : Py_NewRef(args[1]);
    self->mark = self->crowded == NULL ? 0 : mark;
    Py_XDECREF(old);
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

/* Records held aside, out of the ring: their references (owned) and each one's count of them. A method that makes
 * tuples first takes what it needs aside with no allocation of Python's (PyMem's does not start the garbage
 * collector), then makes the tuples: a collection that an allocation starts may run a finalizer's Python code, and
 * with it another thread's push, which then finds a whole ring and changes nothing taken aside. */
typedef struct {
    PyObject **refs;
    unsigned char *lengths;
    Py_ssize_t count;  /* records */
} Aside;

static int
aside_alloc(Aside *aside, Ring *ring, Py_ssize_t count)
{
    aside->count = 0;
    aside->refs = PyMem_Malloc((size_t)(count ? count : 1) * (size_t)ring->width * sizeof(PyObject *));
    aside->lengths = PyMem_Malloc((size_t)(count ? count : 1));
    if (aside->refs == NULL || aside->lengths == NULL) {
        PyMem_Free(aside->refs);
        PyMem_Free(aside->lengths);
        PyErr_NoMemory();
        return 0;
    }
    return 1;
}

/* Record ``index`` (0 the oldest) added to ``aside``: its references copied (new ones), or moved (``move``: the
 * caller takes the records off the ring). */
static void
aside_add(Aside *aside, Ring *ring, Py_ssize_t index, int move)
{
    Py_ssize_t at = (ring->head + index) % ring->capacity;
    PyObject **slot = ring->slots + at * ring->width;
    Py_ssize_t n = ring->lengths[at];
    PyObject **to = aside->refs + aside->count * ring->width;
    for (Py_ssize_t i = 0; i < n; i++) {
        to[i] = slot[i];
        if (move) slot[i] = NULL;
        else Py_INCREF(to[i]);
    }
    if (move) ring->lengths[at] = 0;
    aside->lengths[aside->count++] = (unsigned char)n;
}

/* The records aside as a list of tuples, each tuple taking over its references; ``aside`` freed. A tuple whose
 * fields the garbage collector does not track is not tracked (CPython's _PyTuple_MaybeUntrack, at once); nor is the
 * list, where none of its tuples is: it then holds nothing the collector follows, and a young collection during the
 * pass that drains it (a pass's thousands of records) would walk every item to find that out, each time (the
 * recorder's instructions a collective: tests/bench/RESULTS.md). */
static PyObject *
aside_tuples(Aside *aside, Ring *ring)
{
    PyObject *out = PyList_New(aside->count);
    Py_ssize_t r = 0, tracked = 0;
    if (out != NULL) {
        for (; r < aside->count; r++) {
            PyObject **refs = aside->refs + r * ring->width;
            Py_ssize_t n = aside->lengths[r];
            PyObject *tuple = PyTuple_New(n);
            if (tuple == NULL) break;
            int atomic = 1;
            for (Py_ssize_t i = 0; i < n; i++) {
                PyTuple_SET_ITEM(tuple, i, refs[i]);
                if (zm_tracked(refs[i])) {
                    if (PyTuple_CheckExact(refs[i])) {
                        zm_untracked_if_atomic(refs[i]);  /* a memory sample's values, made on the training thread */
                    }
                    if (PyObject_GC_IsTracked(refs[i])) atomic = 0;
                }
            }
            if (atomic) PyObject_GC_UnTrack(tuple);
            else tracked++;
            PyList_SET_ITEM(out, r, tuple);
        }
        if (r == aside->count && tracked == 0) PyObject_GC_UnTrack(out);
    }
    if (out == NULL || r < aside->count) {  /* no memory: what is left aside is let go of, and the list */
        for (Py_ssize_t rest = r; rest < aside->count; rest++) {
            for (Py_ssize_t i = 0; i < aside->lengths[rest]; i++) Py_DECREF(aside->refs[rest * ring->width + i]);
        }
        Py_XDECREF(out);
        out = NULL;
    }
    PyMem_Free(aside->refs);
    PyMem_Free(aside->lengths);
    return out;
}

/* take(): every record, oldest first, as tuples; the ring is then empty (what a push adds meanwhile stays). Out of
 * memory, the records taken are lost, counted as dropped. */
static PyObject *
Ring_take(Ring *self, PyObject *Py_UNUSED(ignored))
{
    Aside aside;
    Py_ssize_t size = self->size;
    if (!aside_alloc(&aside, self, size)) return NULL;
    for (Py_ssize_t r = 0; r < size; r++) aside_add(&aside, self, r, 1);
    self->head = 0;
    self->size = 0;
    PyObject *out = aside_tuples(&aside, self);
    if (out == NULL) self->dropped += size;
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
    Aside aside;
    if (!aside_alloc(&aside, self, n)) return NULL;
    for (Py_ssize_t k = 0; k < n; k++) aside_add(&aside, self, self->size - 1 - k, 0);
    return aside_tuples(&aside, self);
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
    Aside aside;
    if (!aside_alloc(&aside, self, 1)) return NULL;
    aside_add(&aside, self, index, 0);
    PyObject *records = aside_tuples(&aside, self);
    if (records == NULL) return NULL;
    PyObject *record = PyList_GET_ITEM(records, 0);
    Py_INCREF(record);
    Py_DECREF(records);
    return record;
}

static PyMethodDef Ring_methods[] = {
    {"push", (PyCFunction)(void (*)(void))Ring_push, METH_FASTCALL, "push(*fields): queue a record (never raises)."},
    {"append", (PyCFunction)Ring_append, METH_O, "append(record): push(*record)."},
    {"extend", (PyCFunction)Ring_extend, METH_O, "extend(records): append(record) of each."},
    {"take", (PyCFunction)Ring_take, METH_NOARGS, "take(): every record, oldest first, as tuples; then empty."},
    {"newest", (PyCFunction)Ring_newest, METH_O, "newest(n): the n newest records, newest first, as tuples."},
    {"clear", (PyCFunction)Ring_clear_method, METH_NOARGS, "clear(): let go of every record."},
    {"call_when", (PyCFunction)(void (*)(void))Ring_call_when, METH_FASTCALL,
     "call_when(size, callback): callback() each time a push brings the ring to size records (None: never)."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Ring_members[] = {
    {"capacity", T_PYSSIZET, offsetof(Ring, capacity), READONLY, "the most records held"},
    {"width", T_PYSSIZET, offsetof(Ring, width), READONLY, "the most fields a record has"},
    {"dropped", T_PYSSIZET, offsetof(Ring, dropped), READONLY, "the oldest records a full ring let go of"},
    {"refused", T_PYSSIZET, offsetof(Ring, refused), READONLY, "pushes of no field or too many"},
    {"crowded", T_OBJECT, offsetof(Ring, crowded), READONLY, "call_when's callback, or None"},
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
