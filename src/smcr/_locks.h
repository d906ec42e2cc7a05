/* A threading.Lock looked at, taken and given back in C, on the lock object itself
 * (smcr/_locks.c says why; included by the C files that take the runtime's locks).
 *
 * The lock object's layout is _threadmodule.c's lockobject of CPython 3.8-3.12: its
 * PyThread_type_lock, a sem_t * where thread_pthread.h uses semaphores (Linux).  Direct
 * calls are made only after smcr_locks_bind found smcr.locks' import check passed
 * (smcr.locks.C_CALLS); otherwise, and for any other object, the lock's own methods.
 */
#ifndef SMCR_LOCKS_H
#define SMCR_LOCKS_H

#include <Python.h>
#include <errno.h>
#include <semaphore.h>

typedef struct {
    PyObject_HEAD
    void *lock_lock;
    PyObject *in_weakreflist;
    char locked;
} smcr_lock_head;

/* _thread.LockType where direct calls are safe, or NULL (the methods are called). */
static PyTypeObject *smcr_lock_type;

/* Look up whether smcr.locks trusts the layout (a module's init calls this once, after
 * smcr._locks is importable): 0, or -1 (an error set).  Nothing direct where it does not. */
static inline int smcr_locks_bind(void) {
#if PY_VERSION_HEX < 0x030D0000
    PyObject *locks = PyImport_ImportModule("smcr.locks");
    if (locks == NULL)
        return -1;
    PyObject *calls = PyObject_GetAttrString(locks, "C_CALLS");
    Py_DECREF(locks);
    if (calls == NULL)
        return -1;
    int direct = calls != Py_None;
    Py_DECREF(calls);
    if (!direct)
        return 0;
    PyObject *thread = PyImport_ImportModule("_thread");
    if (thread == NULL)
        return -1;
    PyObject *t = PyObject_GetAttrString(thread, "LockType");
    Py_DECREF(thread);
    if (t == NULL)
        return -1;
    if (PyType_Check(t) && ((PyTypeObject *)t)->tp_basicsize == (Py_ssize_t)sizeof(smcr_lock_head))
        smcr_lock_type = (PyTypeObject *)t; /* (a reference kept for the process's life) */
    else
        Py_DECREF(t);
#endif
    return 0;
}

/* The lock's own method name(args...), its result dropped: 0, or -1 (an error set). */
static inline int smcr_lock_call(PyObject *lock, const char *name, PyObject *arg) {
    PyObject *r = arg == NULL ? PyObject_CallMethod(lock, name, NULL)
                              : PyObject_CallMethod(lock, name, "O", arg);
    if (r == NULL)
        return -1;
    int truth = PyObject_IsTrue(r);
    Py_DECREF(r);
    return truth;
}

/* lock.acquire(False): 1 taken, 0 held elsewhere, -1 an error set. */
static inline int smcr_lock_try(PyObject *lock) {
    if (smcr_lock_type != NULL && Py_TYPE(lock) == smcr_lock_type) {
        smcr_lock_head *h = (smcr_lock_head *)lock;
        if (sem_trywait((sem_t *)h->lock_lock) == 0) {
            h->locked = 1;
            return 1;
        }
        if (errno == EAGAIN)
            return 0;
    }
    return smcr_lock_call(lock, "acquire", Py_False);
}

/* lock.acquire(): 0, or -1 (an error set: a signal handler's exception).  A lock held
 * elsewhere is waited for by its own method (the GIL released, signals handled). */
static inline int smcr_lock_take(PyObject *lock) {
    if (smcr_lock_type != NULL && Py_TYPE(lock) == smcr_lock_type) {
        smcr_lock_head *h = (smcr_lock_head *)lock;
        if (sem_trywait((sem_t *)h->lock_lock) == 0) {
            h->locked = 1;
            return 0;
        }
    }
    return smcr_lock_call(lock, "acquire", NULL) < 0 ? -1 : 0;
}

/* lock.release(): 0, or -1 (an error set: the lock was not held). */
static inline int smcr_lock_give(PyObject *lock) {
    if (smcr_lock_type != NULL && Py_TYPE(lock) == smcr_lock_type) {
        smcr_lock_head *h = (smcr_lock_head *)lock;
        if (!h->locked) {
            PyErr_SetString(PyExc_RuntimeError, "release unlocked lock");
            return -1;
        }
        h->locked = 0;
        if (sem_post((sem_t *)h->lock_lock) == 0)
            return 0;
        h->locked = 1;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    return smcr_lock_call(lock, "release", NULL) < 0 ? -1 : 0;
}

/* lock.locked(): 1, 0, or -1 (an error set). */
static inline int smcr_lock_held(PyObject *lock) {
    if (smcr_lock_type != NULL && Py_TYPE(lock) == smcr_lock_type)
        return ((smcr_lock_head *)lock)->locked != 0;
    return smcr_lock_call(lock, "locked", NULL);
}

#endif
