/* A threading.Lock or RLock looked at, taken and given back in C, on the lock object itself
 * (smcr/_locks.c says why; included by the C files that take the runtime's locks).
 *
 * The lock objects' layouts are _threadmodule.c's lockobject and rlockobject of CPython
 * 3.8-3.12: their PyThread_type_lock, a sem_t * where thread_pthread.h uses semaphores
 * (Linux); an RLock's owner and count as its methods keep them.  Direct
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

typedef struct { /* _threadmodule.c's rlockobject */
    PyObject_HEAD
    void *rlock_lock;
    unsigned long rlock_owner;
    unsigned long rlock_count;
    PyObject *in_weakreflist;
} smcr_rlock_head;

/* _thread.LockType and _thread.RLock where direct calls are safe, or NULL (the methods). */
static PyTypeObject *smcr_lock_type, *smcr_rlock_type;
static PyObject *smcr_str_acquire, *smcr_str_release, *smcr_str_locked;

/* The method names, interned (0, or -1: an error set). */
static inline int smcr_locks_names(void) {
    if (smcr_str_acquire == NULL) {
        smcr_str_acquire = PyUnicode_InternFromString("acquire");
        smcr_str_release = PyUnicode_InternFromString("release");
        smcr_str_locked = PyUnicode_InternFromString("locked");
    }
    return smcr_str_acquire && smcr_str_release && smcr_str_locked ? 0 : -1;
}

/* _thread's lock types, each kept where its size is the layout's: 0, or -1 (an error). */
static inline int smcr_locks_types(void) {
#if PY_VERSION_HEX < 0x030D0000 && defined(__linux__) /* (3.13: PyMutex; elsewhere not sem_t) */
    PyObject *thread = PyImport_ImportModule("_thread");
    if (thread == NULL)
        return -1;
    PyObject *lock = PyObject_GetAttrString(thread, "LockType");
    PyObject *rlock = lock == NULL ? NULL : PyObject_GetAttrString(thread, "RLock");
    Py_DECREF(thread);
    if (rlock == NULL) {
        Py_XDECREF(lock);
        return -1;
    }
    /* (references kept for the process's life) */
    if (PyType_Check(lock) &&
        ((PyTypeObject *)lock)->tp_basicsize == (Py_ssize_t)sizeof(smcr_lock_head))
        smcr_lock_type = (PyTypeObject *)lock;
    else
        Py_DECREF(lock);
    if (PyType_Check(rlock) &&
        ((PyTypeObject *)rlock)->tp_basicsize == (Py_ssize_t)sizeof(smcr_rlock_head))
        smcr_rlock_type = (PyTypeObject *)rlock;
    else
        Py_DECREF(rlock);
#endif
    return 0;
}

/* For the C files that take the runtime's locks: direct calls only where smcr.locks' import
 * check passed (smcr.locks.C_CALLS); 0, or -1 (an error set). */
static inline int smcr_locks_bind(void) {
    if (smcr_locks_names() < 0)
        return -1;
    PyObject *locks = PyImport_ImportModule("smcr.locks");
    if (locks == NULL)
        return -1;
    PyObject *calls = PyObject_GetAttrString(locks, "C_CALLS");
    Py_DECREF(locks);
    if (calls == NULL)
        return -1;
    int direct = calls != Py_None;
    Py_DECREF(calls);
    return direct ? smcr_locks_types() : 0;
}

/* lock.name(arg) (arg NULL: no argument): the result's truth, or -1 (an error set). */
static inline int smcr_lock_call(PyObject *lock, PyObject *name, PyObject *arg) {
    PyObject *r = arg == NULL ? PyObject_CallMethodNoArgs(lock, name)
                              : PyObject_CallMethodOneArg(lock, name, arg);
    if (r == NULL)
        return -1;
    int truth = PyObject_IsTrue(r);
    Py_DECREF(r);
    return truth;
}

/* A free lock taken (1), or not (0: held, by another thread for an RLock), without a wait;
 * -1: not for here (another kind of object, a semaphore error, an RLock's count at its
 * limit), nothing set: the lock's own method decides. */
static inline int smcr_lock_grab(PyObject *lock) {
    PyTypeObject *t = Py_TYPE(lock);
    if (t == smcr_lock_type && t != NULL) {
        smcr_lock_head *h = (smcr_lock_head *)lock;
        if (sem_trywait((sem_t *)h->lock_lock) == 0) {
            h->locked = 1;
            return 1;
        }
        return errno == EAGAIN ? 0 : -1;
    }
    if (t == smcr_rlock_type && t != NULL) {
        smcr_rlock_head *h = (smcr_rlock_head *)lock;
        unsigned long me = PyThread_get_thread_ident();
        if (h->rlock_count > 0 && h->rlock_owner == me) {
            if (h->rlock_count + 1 == 0)
                return -1; /* (the method raises its OverflowError) */
            h->rlock_count++;
            return 1;
        }
        if (sem_trywait((sem_t *)h->rlock_lock) == 0) {
            h->rlock_owner = me;
            h->rlock_count = 1;
            return 1;
        }
        return errno == EAGAIN ? 0 : -1;
    }
    return -1;
}

/* lock.acquire(False): 1 taken, 0 held elsewhere, -1 an error set. */
static inline int smcr_lock_try(PyObject *lock) {
    int r = smcr_lock_grab(lock);
    return r >= 0 ? r : smcr_lock_call(lock, smcr_str_acquire, Py_False);
}

/* lock.acquire(): 0, or -1 (an error set: a signal handler's exception).  A lock held
 * elsewhere is waited for by its own method (the GIL released, signals handled). */
static inline int smcr_lock_take(PyObject *lock) {
    if (smcr_lock_grab(lock) == 1)
        return 0;
    return smcr_lock_call(lock, smcr_str_acquire, NULL) < 0 ? -1 : 0;
}

/* lock.release(): 0, or -1 (an error set: not held, or not by this thread for an RLock,
 * as release() says). */
static inline int smcr_lock_give(PyObject *lock) {
    PyTypeObject *t = Py_TYPE(lock);
    if (t == smcr_lock_type && t != NULL) {
        smcr_lock_head *h = (smcr_lock_head *)lock;
        if (!h->locked) {
            PyErr_SetString(PyExc_RuntimeError, "release unlocked lock");
            return -1;
        }
        h->locked = 0;
        sem_post((sem_t *)h->lock_lock); /* (fails only for a count at SEM_VALUE_MAX) */
        return 0;
    }
    if (t == smcr_rlock_type && t != NULL) {
        smcr_rlock_head *h = (smcr_rlock_head *)lock;
        if (h->rlock_count == 0 || h->rlock_owner != PyThread_get_thread_ident()) {
            PyErr_SetString(PyExc_RuntimeError, "cannot release un-acquired lock");
            return -1;
        }
        if (--h->rlock_count == 0) {
            h->rlock_owner = 0;
            sem_post((sem_t *)h->rlock_lock);
        }
        return 0;
    }
    return smcr_lock_call(lock, smcr_str_release, NULL) < 0 ? -1 : 0;
}

/* lock.locked() of a Lock: 1, 0, or -1 (an error set). */
static inline int smcr_lock_held(PyObject *lock) {
    if (Py_TYPE(lock) == smcr_lock_type && smcr_lock_type != NULL)
        return ((smcr_lock_head *)lock)->locked != 0;
    return smcr_lock_call(lock, smcr_str_locked, NULL);
}

#endif
