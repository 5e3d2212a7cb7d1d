/* A Python int as a 64-bit integer, for zeromon's C modules (_planes.c beside this file; the agent's recorder and live
 * totals, whose builds have this folder on their include path: setup.py). */
#ifndef ZEROMON_INT64_H
#define ZEROMON_INT64_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* ``value`` as a 64-bit integer into *out: 1; 0 where it is an int past 64 bits (no exception set); -1, an exception
 * set, where it is not an int. On CPython 3.11 an exact int of up to three 30-bit digits (what a time in ns, a size or
 * a count is) is read from its digits here: PyLong_AsLongLongAndOverflow's checks and loop cost some twenty
 * instructions a value, and the recorder reads tens of values a collective (tests/bench/RESULTS.md). Any other value
 * goes through PyLong_AsLongLongAndOverflow: the same answer (tests/test_recorder_fast_path.py holds both). */
static inline int
zm_int64(PyObject *value, int64_t *out)
{
    int overflow = 0;
    long long v;
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000 && PYLONG_BITS_IN_DIGIT == 30 && !defined(Py_LIMITED_API)
    if (PyLong_CheckExact(value)) {
        const digit *d = ((PyLongObject *)value)->ob_digit;
        Py_ssize_t size = Py_SIZE(value);
        uint64_t magnitude;
        switch (size < 0 ? -size : size) {
        case 0:
            *out = 0;
            return 1;
        case 1:
            magnitude = d[0];
            break;
        case 2:
            magnitude = ((uint64_t)d[1] << 30) | d[0];
            break;
        case 3:
            if (d[2] >= 8) goto general;  /* 2^63 or more: past 64 bits, or -2^63 itself */
            magnitude = ((uint64_t)d[2] << 60) | ((uint64_t)d[1] << 30) | d[0];
            break;
        default:
            goto general;
        }
        *out = size < 0 ? -(int64_t)magnitude : (int64_t)magnitude;
        return 1;
    }
general:
#endif
    v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow) return 0;
    if (v == -1 && PyErr_Occurred()) return -1;
    *out = (int64_t)v;
    return 1;
}

#endif
