/* A threading.Lock taken and given back without Python's method machinery, when free.
 *
 * Why: the runtime's lock, a connection's reader and writer locks, a CQ's lock and a QP's
 * state lock (an RLock) are taken and given back several times per message.  On CPython 3.11 each lock.acquire()
 * looks the method up, builds an argument tuple, parses it with keywords, and reads the
 * monotonic clock even for a lock that is free (thread_pthread.h computes the deadline of
 * a semaphore wait before it tries, whatever the timeout): about a tenth of a blocking
 * round trip's user time beside a busy process.  Here a free lock is taken by one
 * sem_trywait and given back by one sem_post (an RLock's owner and count kept as its
 * methods keep them), as the lock object's own methods do, on
 * the lock object itself: Python code and a threading.Condition over the lock see it
 * held or free as before.  A lock held elsewhere is waited for by its own acquire() (the
 * GIL released, signals handled as Python handles them).
 *
 * smcr.locks checks at import that a lock taken here is held for Python's acquire and one
 * given back here is free for it, and uses the methods otherwise; the C files that take
 * the runtime's locks themselves (_lane.c, _place.c) use these calls only after that
 * check passed (_locks.h).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "_locks.h"

static PyObject *take(PyObject *self, PyObject *lock) {
    (void)self;
    if (smcr_lock_take(lock) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *try_take(PyObject *self, PyObject *lock) {
    (void)self;
    int r = smcr_lock_try(lock);
    if (r < 0)
        return NULL;
    return PyBool_FromLong(r);
}

static PyObject *give(PyObject *self, PyObject *lock) {
    (void)self;
    if (smcr_lock_give(lock) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"take", take, METH_O, "lock.acquire(), without the method call where the lock is free."},
    {"try_take", try_take, METH_O, "lock.acquire(False), without the method call."},
    {"give", give, METH_O, "lock.release(), without the method call."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "smcr._locks",
    "A threading.Lock taken and given back without Python's method machinery.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__locks(void) {
    /* (not smcr_locks_bind: smcr.locks, which it asks, checks this module's calls) */
    if (smcr_locks_names() < 0 || smcr_locks_types() < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "DIRECT", smcr_lock_type != NULL) < 0 ||
        PyModule_AddIntConstant(m, "DIRECT_RLOCK", smcr_rlock_type != NULL) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
