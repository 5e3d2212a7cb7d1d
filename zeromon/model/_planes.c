/* zeromon.model._planes: a compact segment's integer columns coded in one loop in C (an optional build).
 *
 * columnar.encode codes every value of every record a flush writes: each integer column's values (None as 0,
 * seconds as whole nanoseconds) less their base (the previous row's, or other fields' of the row), as byte
 * planes in the fewest bytes that hold them. In numpy that is a Python integer made a 64-bit value at 10-17 ns
 * each (array('q', list), np.fromiter and np.array all pay it), then a numpy call a step of the column
 * (tests/bench/RESULTS.md); here it is one pass over the list and one over the values. The same bytes as the
 * numpy path and the Python one (tests/test_recorder_fast_path.py draws segments and compares them);
 * OverflowError wherever those raise NotInArrays (a value or a difference past 64 bits), so that the caller
 * codes that column in Python's integers, as without this module.
 * Beside it, a column's nulls counted (nones), a segment's batches joined a field at a time (join_columns:
 * segments._joined), and three of the model's
 * per-record steps: types_fit and rows_fit (a record's types against its columns', a
 * run of records' fit: columnar.fits, fit_run) and make_record (a record made from its values, its slots set
 * directly: events.record_maker, default_maker).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "_int64.h"
#include "_tracked.h"

enum { BASE_NONE = 0, BASE_PREV = 1, BASE_ONE = 2, BASE_TWO = 3 };

/* A column's base values: ``n`` native 64-bit integers, as this module returned them. */
static const int64_t *
base_values(PyObject *obj, Py_ssize_t n)
{
    if (!PyBytes_Check(obj) || PyBytes_GET_SIZE(obj) != n * (Py_ssize_t)sizeof(int64_t)) {
        PyErr_SetString(PyExc_OverflowError, "a base column that is not in 64-bit values");
        return NULL;
    }
    return (const int64_t *)PyBytes_AS_STRING(obj);
}

static int
width_of(int64_t low, int64_t high)
{
    if (low >= -128 && high < 128) return 1;
    if (low >= -32768 && high < 32768) return 2;
    if (low >= -2147483648LL && high < 2147483648LL) return 4;
    return 8;
}

/* int_column(column, seconds, nullable, base, a, b) -> (values, planes)
 *   column: a list or tuple of ints (or bools), or of floats where ``seconds``; None where ``nullable`` (as 0)
 *   base: 0 the value, 1 less the previous row's, 2 less ``a``'s, 3 less (``a``'s - ``b``'s); a and b the
 *         ``values`` of earlier columns (or None)
 *   values: the column's integers, native 64-bit, as bytes (an ``a`` or ``b`` of a later column)
 *   planes: the coded values' planes (columnar._planes' bytes)
 * OverflowError where a value or a coded value is past 64 bits, or a base is not such values; TypeError for a
 * value of another type. */
static PyObject *
int_column(PyObject *self, PyObject *args)
{
    PyObject *sequence, *a_obj, *b_obj;
    int seconds, nullable, base;
    (void)self;
    if (!PyArg_ParseTuple(args, "OppiOO", &sequence, &seconds, &nullable, &base, &a_obj, &b_obj))
        return NULL;
    PyObject *column = PySequence_Fast(sequence, "a column is a list or a tuple");
    if (column == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(column);
    PyObject **items = PySequence_Fast_ITEMS(column);
    const int64_t *a = NULL, *b = NULL;
    PyObject *values_obj = NULL, *planes_obj = NULL, *result = NULL;
    int64_t *values, *coded = NULL, low = 0, high = 0;
    unsigned char *planes;
    int width;
    if ((base == BASE_ONE || base == BASE_TWO) && (a = base_values(a_obj, n)) == NULL) goto done;
    if (base == BASE_TWO && (b = base_values(b_obj, n)) == NULL) goto done;
    if ((values_obj = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int64_t))) == NULL) goto done;
    values = (int64_t *)PyBytes_AS_STRING(values_obj);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = items[i];
        if (i > 0 && item == items[i - 1]) {  /* the row before's object (a rank, a step, a size): its value */
            values[i] = values[i - 1];
            continue;
        }
        if (item == Py_None) {
            if (!nullable) {
                PyErr_SetString(PyExc_TypeError, "None in a column that takes none");
                goto done;
            }
            values[i] = 0;
        } else if (seconds) {
            double v = PyFloat_AsDouble(item);
            if (v == -1.0 && PyErr_Occurred()) goto done;
            double ns = nearbyint(v * 1e9);  /* half to even, as np.rint and round() */
            if (!(ns >= -9223372036854775808.0 && ns < 9223372036854775808.0)) {
                PyErr_SetString(PyExc_OverflowError, "seconds past 64 bits of nanoseconds");
                goto done;
            }
            values[i] = (int64_t)ns;
        } else {
            if (!PyLong_Check(item)) {
                PyErr_SetString(PyExc_TypeError, "a column's value is not an integer");
                goto done;
            }
            int converted = zm_int64(item, &values[i]);
            if (converted == 0) {
                PyErr_SetString(PyExc_OverflowError, "a column's value does not fit in 64 bits");
                goto done;
            }
            if (converted < 0) goto done;
        }
    }
    coded = PyMem_Malloc((n ? n : 1) * sizeof(int64_t));
    if (coded == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t c, other;
        int wrapped = 0;
        switch (base) {
        case BASE_PREV:
            if (i == 0) c = values[0];
            else wrapped = __builtin_sub_overflow(values[i], values[i - 1], &c);
            break;
        case BASE_ONE:
            wrapped = __builtin_sub_overflow(values[i], a[i], &c);
            break;
        case BASE_TWO:
            wrapped = __builtin_sub_overflow(a[i], b[i], &other) || __builtin_sub_overflow(values[i], other, &c);
            break;
        default:
            c = values[i];
        }
        if (wrapped) {
            PyErr_SetString(PyExc_OverflowError, "a column's difference does not fit in 64 bits");
            goto done;
        }
        coded[i] = c;
        if (i == 0 || c < low) low = c;
        if (i == 0 || c > high) high = c;
    }
    width = width_of(low, high);
    if ((planes_obj = PyBytes_FromStringAndSize(NULL, 1 + width * n)) == NULL) goto done;
    planes = (unsigned char *)PyBytes_AS_STRING(planes_obj);
    planes[0] = (unsigned char)width;
    for (int plane = 0; plane < width; plane++) {
        unsigned char *row = planes + 1 + (Py_ssize_t)plane * n;
        int shift = 8 * plane;
        for (Py_ssize_t i = 0; i < n; i++)
            row[i] = (unsigned char)((uint64_t)coded[i] >> shift);
    }
    result = PyTuple_Pack(2, values_obj, planes_obj);
done:
    PyMem_Free(coded);
    Py_DECREF(column);
    Py_XDECREF(values_obj);
    Py_XDECREF(planes_obj);
    return result;
}

/* str_column(column) -> (table, planes)
 *   column: a list or tuple of hashable values (strings, None)
 *   table: its values in order of first appearance
 *   planes: the codes' planes where the table holds at most 128 values (one byte a code: zeros for one value),
 *           else None (the caller codes them: columnar._codes). */
static PyObject *
str_column(PyObject *self, PyObject *sequence)
{
    (void)self;
    PyObject *column = PySequence_Fast(sequence, "a column is a list or a tuple");
    if (column == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(column);
    PyObject **items = PySequence_Fast_ITEMS(column);
    PyObject *codes = PyDict_New(), *table = PyList_New(0), *planes_obj = NULL, *result = NULL;
    unsigned char *planes;
    if (codes == NULL || table == NULL) goto done;
    if ((planes_obj = PyBytes_FromStringAndSize(NULL, n + 1)) == NULL) goto done;
    planes = (unsigned char *)PyBytes_AS_STRING(planes_obj);
    planes[0] = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i > 0 && items[i] == items[i - 1]) {
            /* the object of the row before (a run of one device, dtype or phase): its code, no look-up. Where the
             * table ends past 128 values the planes are not returned, so a code past 127 copied here is not read. */
            planes[1 + i] = planes[i];
            continue;
        }
        /* one of the table's first values by identity (a column's few phases, ops or dtypes, each one object): its
         * code, as the dict gives it (a dict finds a key by identity first), without a hash and a look-up */
        Py_ssize_t k = 0, known = PyList_GET_SIZE(table) < 8 ? PyList_GET_SIZE(table) : 8;
        while (k < known && PyList_GET_ITEM(table, k) != items[i]) k++;
        if (k < known) {
            planes[1 + i] = (unsigned char)k;
            continue;
        }
        PyObject *code = PyDict_GetItemWithError(codes, items[i]);
        if (code == NULL) {
            if (PyErr_Occurred()) goto done;
            k = PyList_GET_SIZE(table);
            PyObject *value = PyLong_FromSsize_t(k);
            if (value == NULL) goto done;
            int failed = PyDict_SetItem(codes, items[i], value) < 0 || PyList_Append(table, items[i]) < 0;
            Py_DECREF(value);
            if (failed) goto done;
        } else {
            k = PyLong_AsSsize_t(code);
        }
        if (k < 128) planes[1 + i] = (unsigned char)k;
    }
    if (PyList_GET_SIZE(table) > 128) {
        Py_DECREF(planes_obj);
        planes_obj = Py_NewRef(Py_None);
    }
    result = PyTuple_Pack(2, table, planes_obj);
done:
    Py_DECREF(column);
    Py_XDECREF(codes);
    Py_XDECREF(table);
    Py_XDECREF(planes_obj);
    return result;
}

/* Whether each value of ``values`` (a tuple) is of a type its field accepts (``accepted``, checked by the caller: a
 * tuple of as many tuples of types): 1, 0, or -1 with an exception. */
static int
values_fit(PyObject *values, PyObject *accepted)
{
    Py_ssize_t n = PyTuple_GET_SIZE(values);
    if (PyTuple_GET_SIZE(accepted) != n) return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *types = PyTuple_GET_ITEM(accepted, i);
        if (!PyTuple_Check(types)) {
            PyErr_SetString(PyExc_TypeError, "each field's accepted types as a tuple");
            return -1;
        }
        PyObject *type = (PyObject *)Py_TYPE(PyTuple_GET_ITEM(values, i));
        Py_ssize_t k = 0, m = PyTuple_GET_SIZE(types);
        while (k < m && PyTuple_GET_ITEM(types, k) != type) k++;
        if (k == m) return 0;
    }
    return 1;
}

/* rows_fit(rows, start, stop, accepted, maps) -> the index of the first of rows[start:stop] (a list of tuples) that
 * does not go into the columns, or stop where all do: columnar.fits' check of a run of rows for a spec with no
 * seconds column (``accepted``: each field's types, as types_fit takes them; ``maps``: a tuple of (index, names) for
 * each "map" field, the dict there empty or of keys among the frozenset ``names`` and values exactly int). */
static PyObject *
rows_fit(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *rows, *accepted, *maps;
    Py_ssize_t start, stop;
    if (!PyArg_ParseTuple(args, "O!nnO!O!:rows_fit", &PyList_Type, &rows, &start, &stop, &PyTuple_Type, &accepted,
                          &PyTuple_Type, &maps)) {
        return NULL;
    }
    Py_ssize_t n_maps = PyTuple_GET_SIZE(maps);
    for (Py_ssize_t k = 0; k < n_maps; k++) {
        PyObject *pair = PyTuple_GET_ITEM(maps, k);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 || !PyLong_Check(PyTuple_GET_ITEM(pair, 0))
                || !PyFrozenSet_Check(PyTuple_GET_ITEM(pair, 1))) {
            PyErr_SetString(PyExc_TypeError, "rows_fit: maps as (index, frozenset of names) pairs");
            return NULL;
        }
    }
    if (start < 0) start = 0;
    if (stop > PyList_GET_SIZE(rows)) stop = PyList_GET_SIZE(rows);
    Py_ssize_t i = start;
    for (; i < stop; i++) {
        PyObject *row = PyList_GET_ITEM(rows, i);
        if (!PyTuple_CheckExact(row)) break;
        int fit = values_fit(row, accepted);
        if (fit < 0) return NULL;
        for (Py_ssize_t k = 0; fit && k < n_maps; k++) {
            PyObject *pair = PyTuple_GET_ITEM(maps, k), *names = PyTuple_GET_ITEM(pair, 1);
            Py_ssize_t at = PyLong_AsSsize_t(PyTuple_GET_ITEM(pair, 0));
            if (at < 0 || at >= PyTuple_GET_SIZE(row)) {
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_IndexError, "rows_fit: a map's index outside the row");
                return NULL;
            }
            PyObject *mapping = PyTuple_GET_ITEM(row, at), *key, *value;
            if (!PyDict_Check(mapping)) {  /* the accepted types said so: a dict, or the caller's spec does not */
                fit = 0;
                break;
            }
            Py_ssize_t pos = 0;
            while (fit && PyDict_Next(mapping, &pos, &key, &value)) {
                if (!PyLong_CheckExact(value)) {
                    fit = 0;
                } else if ((fit = PySet_Contains(names, key)) < 0) {
                    return NULL;
                }
            }
        }
        if (!fit) break;
    }
    return PyLong_FromSsize_t(i);
}

/* types_fit(values, accepted): whether values (a tuple) has one value a field, each of a type its field accepts
 * exactly (accepted: a tuple of a tuple of types a field): columnar.fits' check of a record's types, one pass and no
 * tuple of types made and hashed (the Python path's), a record at a time. */
static PyObject *
types_fit(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *values, *accepted;
    if (!PyArg_ParseTuple(args, "O!O!:types_fit", &PyTuple_Type, &values, &PyTuple_Type, &accepted)) return NULL;
    int fit = values_fit(values, accepted);
    if (fit < 0) return NULL;
    return PyBool_FromLong(fit);
}

/* nones(column) -> how many of the column's values are None (a list or a tuple): list.count(None) told by identity,
 * a pointer's comparison a value, where count compares each value that is not None with None through Python's
 * comparison (its NotImplemented both ways, then identity): columnar.encode asks it of every nullable column a
 * flush writes. */
static PyObject *
nones(PyObject *Py_UNUSED(module), PyObject *sequence)
{
    PyObject *column = PySequence_Fast(sequence, "a column is a list or a tuple");
    if (column == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(column), count = 0;
    PyObject **items = PySequence_Fast_ITEMS(column);
    for (Py_ssize_t i = 0; i < n; i++) count += items[i] == Py_None;
    Py_DECREF(column);
    return PyLong_FromSsize_t(count);
}

/* join_columns(chunks) -> columns: a kind's batches (each a sequence of its fields, each field a list or tuple of as
 * many values as the batch's first) as one list a field of all their values, in order: segments._joined's
 * join, each value's reference taken once into a list made at its length (itertools.chain's is an iterator's
 * step and a list's growth a value). ValueError where the batches' fields are not as many, or a batch's fields
 * not of its first's length (zip(strict=True)'s); TypeError for a field that is not a list or tuple. */
static PyObject *
join_columns(PyObject *Py_UNUSED(module), PyObject *chunks_obj)
{
    PyObject *chunks = PySequence_Fast(chunks_obj, "the batches are a list or a tuple");
    if (chunks == NULL) return NULL;
    Py_ssize_t n_chunks = PySequence_Fast_GET_SIZE(chunks), fields = -1, total = 0;
    PyObject **chunk_items = PySequence_Fast_ITEMS(chunks);
    PyObject *batches = PyList_New(n_chunks);  /* each batch as a list or tuple of its fields */
    PyObject *out = NULL;
    if (batches == NULL) goto done;
    for (Py_ssize_t c = 0; c < n_chunks; c++) {
        PyObject *batch = PySequence_Fast(chunk_items[c], "a batch is a list or a tuple of its fields");
        if (batch == NULL) goto done;
        PyList_SET_ITEM(batches, c, batch);
        Py_ssize_t k = PySequence_Fast_GET_SIZE(batch);
        if (fields >= 0 && k != fields) {
            PyErr_SetString(PyExc_ValueError, "the batches' fields are not as many");
            goto done;
        }
        fields = k;
        PyObject **field = PySequence_Fast_ITEMS(batch);
        Py_ssize_t rows = -1;
        for (Py_ssize_t f = 0; f < k; f++) {
            if (!PyList_Check(field[f]) && !PyTuple_Check(field[f])) {
                PyErr_SetString(PyExc_TypeError, "a batch's field is a list or a tuple");
                goto done;
            }
            Py_ssize_t m = PySequence_Fast_GET_SIZE(field[f]);
            if (rows >= 0 && m != rows) {
                PyErr_SetString(PyExc_ValueError, "a batch's fields are not of one length");
                goto done;
            }
            rows = m;
        }
        total += rows > 0 ? rows : 0;
    }
    out = PyList_New(fields > 0 ? fields : 0);
    if (out == NULL) goto done;
    for (Py_ssize_t f = 0; f < fields; f++) {
        PyObject *joined = PyList_New(total);
        if (joined == NULL) { Py_CLEAR(out); goto done; }
        PyList_SET_ITEM(out, f, joined);
        PyObject **to = ((PyListObject *)joined)->ob_item;
        for (Py_ssize_t c = 0; c < n_chunks; c++) {
            PyObject *field = PySequence_Fast_ITEMS(PyList_GET_ITEM(batches, c))[f];
            Py_ssize_t m = PySequence_Fast_GET_SIZE(field);
            PyObject **from = PySequence_Fast_ITEMS(field);
            for (Py_ssize_t i = 0; i < m; i++) {
                Py_INCREF(from[i]);
                *to++ = from[i];
            }
        }
    }
done:
    Py_XDECREF(batches);
    Py_DECREF(chunks);
    return out;
}

/* make_record(cls, slots, values): events.record_maker's record: a new instance of ``cls`` (object.__new__'s) with
 * each of its slots (``slots``: a tuple of cls's member descriptors, in field order) set to the value in the same place
 * of ``values`` (a sequence of as many), as each descriptor's __set__ does (a frozen class's __setattr__ is not
 * called), out of the garbage collector's lists where none of the values is an object it follows. TypeError, nothing
 * made, where the values are not as many ("<class> takes <n> values") or a slot is not a plain object slot of cls. */
static PyObject *
make_record(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyType_Check(args[0]) || !PyTuple_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "make_record(cls, slots, values)");
        return NULL;
    }
    PyTypeObject *cls = (PyTypeObject *)args[0];
    PyObject *slots = args[1];
    Py_ssize_t n = PyTuple_GET_SIZE(slots);
    PyObject *values = PySequence_Fast(args[2], "make_record: values not a sequence");
    if (values == NULL) return NULL;
    if (PySequence_Fast_GET_SIZE(values) != n) {
        PyObject *name = PyObject_GetAttrString((PyObject *)cls, "__name__");
        if (name != NULL) PyErr_Format(PyExc_TypeError, "%U takes %zd values", name, n);
        Py_XDECREF(name);
        Py_DECREF(values);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *slot = PyTuple_GET_ITEM(slots, i);
        if (!Py_IS_TYPE(slot, &PyMemberDescr_Type) || ((PyMemberDescrObject *)slot)->d_member->type != T_OBJECT_EX
                || (((PyMemberDescrObject *)slot)->d_member->flags & READONLY)
                || !PyType_IsSubtype(cls, PyDescr_TYPE(slot))) {
            PyErr_SetString(PyExc_TypeError, "make_record: a slot that is not a plain object slot of the class");
            Py_DECREF(values);
            return NULL;
        }
    }
    PyObject *record = cls->tp_alloc(cls, 0);
    if (record == NULL) {
        Py_DECREF(values);
        return NULL;
    }
    int tracked = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyMemberDef *member = ((PyMemberDescrObject *)PyTuple_GET_ITEM(slots, i))->d_member;
        PyObject **place = (PyObject **)((char *)record + member->offset);
        PyObject *value = PySequence_Fast_GET_ITEM(values, i);
        Py_XSETREF(*place, Py_NewRef(value));
        tracked |= zm_tracked(value);
    }
    Py_DECREF(values);
    /* A frozen record whose values hold nothing the collector follows (a step's summary: numbers, strings, dicts of
     * them) cannot be part of a cycle: out of its lists as it is made, as the live views' untrack would leave it
     * at the pass's end, after a walk (its class, which its traverse visits, does not count there either). */
    if (!tracked && PyObject_GC_IsTracked(record)) PyObject_GC_UnTrack(record);
    return record;
}

static PyMethodDef methods[] = {
    {"str_column", str_column, METH_O,
     "str_column(column) -> (table, planes): a string column as codes into its table (planes None past 128)."},
    {"int_column", int_column, METH_VARARGS,
     "int_column(column, seconds, nullable, base, a, b) -> (values, planes): a column coded as planes."},
    {"types_fit", types_fit, METH_VARARGS,
     "types_fit(values, accepted) -> whether each value's type is one its field accepts (columnar.fits)."},
    {"rows_fit", rows_fit, METH_VARARGS,
     "rows_fit(rows, start, stop, accepted, maps) -> the first of rows[start:stop] that does not fit, else stop."},
    {"nones", nones, METH_O, "nones(column) -> how many of its values are None (list.count(None), by identity)."},
    {"join_columns", join_columns, METH_O,
     "join_columns(chunks) -> each field's values of all the batches, in order, one list a field (segments._joined)."},
    {"make_record", (PyCFunction)(void (*)(void))make_record, METH_FASTCALL,
     "make_record(cls, slots, values) -> a new cls with its slots set to values (events.record_maker's)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "zeromon.model._planes",
    "A compact segment's integer columns coded in C (columnar.encode's optional fast path).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__planes(void)
{
    return PyModule_Create(&module);
}
