/* The per-connection fast lane, in C, on the compiled build's own objects.
 *
 * Why: per message the compiled Python of the data path spends most of its time in
 * CPython's object machinery (tuples from struct, boxed integers, calls through bound
 * methods), not in its own logic.  The lane does a message's common case in C, on the very
 * objects the engine keeps: mypyc lays out a native class as a C struct, and this file is
 * compiled against the header mypyc generates for the build it belongs to
 * (smcr.nativebuild), so it reads and writes their fields where the compiled code does.
 * There is one state, the engine's; the lane is only a shorter way through it.  Where a case
 * is not the common one the lane changes nothing and says so (-1), and the Python does it.
 *
 * What it does so far: take_run, the CDCs read in place from a QP's receive ring
 * (smcr.stack.inplace), each as LinkLayer.take_cdc and Connection.receive_cdc_fields would
 * take it when it carries no flag but "write blocked": the cursors moved, the link's last
 * receive noted, the connection touched, the slot's receive posted again; ring_take, the
 * same for an RNIC whose poll runs in C (a capsule of the RNIC layer's ring-taker ABI);
 * send_inline, a send's common case, posted through the RNIC's post for C callers;
 * send_now, the same send whole, from the socket's call to the ring (DataPath.try_send
 * and what it calls); read_fast, a read's common case (the bytes copied out, the consumer
 * cursor moved); follow, Readiness.follow's common case (a named descriptor read out:
 * drained, its consumer bell armed or taken back), which send_now and every caller of
 * Executor.update_readiness use; read_now, a non-blocking read whole, from the socket's
 * call to the readiness update (DataPath.try_read, take_news and what they call).
 * tests/stack/test_lane*.py run each against the Python it stands for.
 *
 * Integers: mypyc's tagged ints (CPyTagged): a short one is the value shifted left by
 * one, a long one a pointer with the low bit set.  The lane works on short ones only
 * (any long one: -1), and stores short ones.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <errno.h>
#include <sys/epoll.h>
#include <dlfcn.h>

#include "__native_internal_smcr_native.h" /* (the compiled functions' prototypes, and the structs) */
#include "../_locks.h"

typedef smcr___core___state___EngineStateObject StateObj;
typedef smcr___core___linkgroup___LinkObject LinkObj;
typedef smcr___core___linkgroup___LinkGroupObject GroupObj;
typedef smcr___core___connection___ConnectionObject ConnObj;
typedef smcr___core___connection___RmbObject RmbObj;

#define CDC_SIZE 44
#define CDC_TYPE 0xFE
#define WRITE_BLOCKED 0x80u /* ProducerFlags.WRITE_BLOCKED */
#define UPDATE_REQUESTED 0x10u /* ProducerFlags.CONSUMER_CURSOR_UPDATE_REQUESTED */
#define SIGNAL_EVERY 16      /* smcr.core.connection.SIGNAL_EVERY */
#define PFLAGS_MASK 0xF8u   /* the producer flags a CDC's receiver looks at */
#define SFLAGS_MASK 0xE0u   /* the connection state flags */
#define WRAP_LIMIT 65536
#define MAX_RING ((int64_t)1 << 40) /* a ring larger is not ours (RMBs go to 512 MiB) */
#define FLOAT_ERROR (-113.0)         /* mypyc's "undefined" double (CPY_FLOAT_ERROR) */

/* The classes whose instances the lane reads: bound once (bind), checked exactly. */
static PyTypeObject *state_type, *link_type, *group_type, *conn_type, *rmb_type;

/* The RNIC's post for C callers (smcr.rdma.shm.qp.POST_INLINE: _place.c's post_inline),
 * through a capsule bound once; its ABI, copied from there (the capsule's name says which):
 * -> whom to ring (>= 0: up to 2^34), -1 not its common case (nothing written, nothing
 *    changed), -2 an error (set; nothing written); whom | PLACED_ERROR: placed and its
 *    completion pushed, but the push met an error (set: raised once the stores are made and
 *    whom rung).  signaled: the SEND's WR id where it is signaled (the post pushes its
 *    completion), or NULL. */
typedef struct {
    const void *data;
    Py_ssize_t n;
    uint64_t addr;
} smcr_write;
typedef int64_t (*smcr_post_inline)(PyObject *qp, const smcr_write *writes, int count,
                                uint32_t rkey, const unsigned char *msg, Py_ssize_t size,
                                uint32_t wake, PyObject *signaled);
#define PLACED_ERROR ((int64_t)1 << 62)
#define POST_INLINE_NAME "smcr.rdma.shm._place.POST_INLINE.v4"
static smcr_post_inline poster;
static PyTypeObject *post_qp_type; /* the QP class the post serves (others: declined at once) */
static PyObject *str_append, *str_pop;

static inline int short_int(CPyTagged t) { return (t & 1) == 0; }
static inline int64_t untag(CPyTagged t) { return (int64_t)(Py_ssize_t)t >> 1; }
static inline CPyTagged tag(int64_t v) { return (CPyTagged)((Py_ssize_t)v << 1); }
static inline int fits(int64_t v) { return v >= -((int64_t)1 << 61) && v < ((int64_t)1 << 61); }

static inline uint32_t be16(const unsigned char *p) { return (uint32_t)p[0] << 8 | p[1]; }
static inline uint32_t be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* smcr.wire.cdc.sequence_before: (s16)(a - b) < 0 */
static inline int sequence_before(uint32_t a, uint32_t b) { return (int16_t)(uint16_t)(a - b) < 0; }

/* smcr.core.connection._advance: absolute moved forward to (wrap, count), or kept */
static inline int64_t advance(int64_t absolute, int64_t wrap, int64_t count, int64_t size) {
    int64_t span = size * WRAP_LIMIT;
    int64_t diff = (wrap * size + count - absolute) % span;
    if (diff < 0)
        diff += span;
    if (diff >= span / 2)
        diff -= span;
    return diff > 0 ? absolute + diff : absolute;
}

/* The cursor a CDC names for a ring of size bytes: moved from held, or held unchanged
 * where the CDC repeats it (Connection.receive_cdc_fields compares before advancing). */
static inline int64_t cursor(int64_t held, int64_t wrap, int64_t count, int64_t size) {
    if ((((held / size) & 0xFFFF) == wrap) && held % size == count)
        return held;
    return advance(held, wrap, count, size);
}

/* The compiled classes args[0..n), kept in *slots[i]: each must be exactly the struct of
 * sizes[i] (not an interpreted class of a pure-Python process, whose instances are no such
 * structs); otherwise a TypeError naming who, and nothing kept.  0, or -1. */
static int bind_classes(const char *who, PyObject *const *args, const Py_ssize_t *sizes,
                        PyTypeObject **const *slots, int n) {
    for (int i = 0; i < n; i++)
        if (!PyType_Check(args[i]) || ((PyTypeObject *)args[i])->tp_basicsize != sizes[i] ||
            ((PyTypeObject *)args[i])->tp_dictoffset != 0) {
            PyErr_Format(PyExc_TypeError, "%s: %R is not the compiled class the lane was "
                         "built for", who, args[i]);
            return -1;
        }
    for (int i = 0; i < n; i++) {
        Py_INCREF(args[i]);
        Py_XSETREF(*slots[i], (PyTypeObject *)args[i]);
    }
    return 0;
}

/* bind(EngineState, Link, LinkGroup, Connection, Rmb, post_inline, qp_class): the compiled
 * classes, and the RNIC's post for C callers (a capsule, or None: no send_inline then) with
 * the QP class it serves. */
static PyObject *bind(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "bind takes 5 classes, a capsule and a class");
        return NULL;
    }
    smcr_post_inline post = NULL;
    if (args[5] != Py_None) {
        if (!PyType_Check(args[6])) {
            PyErr_SetString(PyExc_TypeError, "bind: the post's QP class is not a class");
            return NULL;
        }
        post = (smcr_post_inline)PyCapsule_GetPointer(args[5], POST_INLINE_NAME);
        if (post == NULL)
            return NULL;
    }
    Py_ssize_t sizes[5] = {sizeof(StateObj), sizeof(LinkObj), sizeof(GroupObj), sizeof(ConnObj),
                           sizeof(RmbObj)};
    PyTypeObject **slots[5] = {&state_type, &link_type, &group_type, &conn_type, &rmb_type};
    if (bind_classes("bind", args, sizes, slots, 5) < 0)
        return NULL;
    poster = post;
    if (post != NULL) {
        Py_INCREF(args[6]);
        Py_XSETREF(post_qp_type, (PyTypeObject *)args[6]);
    }
    Py_RETURN_NONE;
}

/* One CDC's common case: 1 taken, 0 not the common case (nothing changed), -1 an error
 * (nothing changed either: the touch is the first change).  msg: the n bytes of the SEND,
 * copied out of the ring already (a peer writes there). */
static int take_one(StateObj *state, PyObject *qpn, const unsigned char *b, Py_ssize_t n,
                    double now) {
    /* (a time equal to mypyc's error value would read back as an unset attribute) */
    if (n != CDC_SIZE || b[0] != CDC_TYPE || b[1] != CDC_SIZE || now == FLOAT_ERROR ||
        state->_links == NULL || state->_touched == NULL)
        return 0;
    uint32_t pflags = b[24] & PFLAGS_MASK, sflags = b[25] & SFLAGS_MASK;
    if (sflags || (pflags & ~WRITE_BLOCKED))
        return 0;
    uint32_t seq = be16(b + 2), token = be32(b + 4);
    int64_t pwrap = be16(b + 10), pcount = be32(b + 12);
    int64_t cwrap = be16(b + 18), ccount = be32(b + 20);

    PyObject *link_obj = PyDict_GetItemWithError(state->_links, qpn); /* borrowed */
    if (link_obj == NULL)
        return PyErr_Occurred() ? -1 : 0;
    if (Py_TYPE(link_obj) != link_type)
        return 0;
    LinkObj *link = (LinkObj *)link_obj;
    if (link->_lgr == NULL || Py_TYPE(link->_lgr) != group_type)
        return 0;
    PyObject *conns = ((GroupObj *)link->_lgr)->_conns;
    if (conns == NULL || !PyDict_CheckExact(conns))
        return 0;
    PyObject *key = PyLong_FromUnsignedLong(token);
    if (key == NULL)
        return -1;
    PyObject *conn_obj = PyDict_GetItemWithError(conns, key); /* borrowed */
    Py_DECREF(key);
    if (conn_obj == NULL)
        return PyErr_Occurred() ? -1 : 0;
    if (Py_TYPE(conn_obj) != conn_type)
        return 0;
    ConnObj *c = (ConnObj *)conn_obj;
    if (c->_rmb == NULL || Py_TYPE(c->_rmb) != rmb_type || c->_echo_pending != 0)
        return 0;
    CPyTagged ts[] = {c->_id, c->_rx_seq, ((RmbObj *)c->_rmb)->_size, c->_peer_rmb_size,
                      c->_rx_prod, c->_rx_cons, c->_peer_cons, c->_tx_sent, c->_tx_app,
                      c->_peer_hold};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        if (!short_int(ts[i]))
            return 0;
    int64_t rx_seq = untag(c->_rx_seq), size = untag(((RmbObj *)c->_rmb)->_size);
    int64_t peer_size = untag(c->_peer_rmb_size), rx_prod = untag(c->_rx_prod);
    int64_t rx_cons = untag(c->_rx_cons), peer_cons = untag(c->_peer_cons);
    int64_t tx_sent = untag(c->_tx_sent), tx_app = untag(c->_tx_app);
    /* old sequence numbers, faults, a CLC Confirm still on its way: the Python's cases */
    if (sequence_before(seq, (uint32_t)rx_seq) || size <= 0 || peer_size <= 0 ||
        size > MAX_RING || peer_size > MAX_RING || pcount >= size || ccount >= peer_size ||
        rx_prod < 0 || peer_cons < 0)
        return 0;
    int64_t prod = cursor(rx_prod, pwrap, pcount, size);
    int64_t cons = cursor(peer_cons, cwrap, ccount, peer_size);
    if (prod - rx_cons > size || cons > tx_sent || !fits(prod) || !fits(cons))
        return 0;
    /* (a consumer cursor that moved ends the failover's hold: Connection.peer_hold) */
    int64_t hold = cons != peer_cons ? 1 : untag(c->_peer_hold);
    if (tx_app > tx_sent && peer_size - hold - (tx_sent - cons) > 0)
        return 0; /* bytes wait in the send buffer: the Python flushes */

    /* LinkLayer.take_cdc, then _apply_cdc's touch and receive_cdc_fields, as they would */
    PyObject *id = PyLong_FromSsize_t((Py_ssize_t)untag(c->_id));
    if (id == NULL)
        return -1;
    int added = PySet_Add(state->_touched, id);
    Py_DECREF(id);
    if (added < 0)
        return -1;
    link->_last_rx = now;
    Py_INCREF(Py_None);
    Py_XSETREF(link->_test_deadline, Py_None);
    c->_rx_seq = tag(seq);
    c->_unanswered = 0;
    c->_rx_prod = tag(prod);
    c->_peer_cons = tag(cons);
    c->_peer_hold = tag(hold);
    c->_peer_write_blocked = c->_peer_blocked_last = (pflags & WRITE_BLOCKED) != 0;
    return 1;
}

/* take_cdc(state, qpn, area, off, n, now) -> 1 taken, -1 not the common case (unchanged)
 *
 * One CDC, as take_run takes each of a run (the tests hold it against the Python).
 *
 * state: the engine's EngineState; qpn: the QP the SEND came on (an int); area: its
 * receive ring; the SEND's n bytes at off; now: time.monotonic(). */
static PyObject *take_cdc(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "take_cdc takes 6 arguments");
        return NULL;
    }
    if (state_type == NULL || Py_TYPE(args[0]) != state_type)
        return PyLong_FromLong(-1);
    Py_ssize_t off = PyLong_AsSsize_t(args[3]);
    if (off == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t n = PyLong_AsSsize_t(args[4]);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    double now = PyFloat_AsDouble(args[5]);
    if (now == -1.0 && PyErr_Occurred())
        return NULL;
    if (n != CDC_SIZE || off < 0)
        return PyLong_FromLong(-1);
    Py_buffer view;
    if (PyObject_GetBuffer(args[2], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    unsigned char b[CDC_SIZE];
    int ok = view.len >= CDC_SIZE && off <= view.len - CDC_SIZE;
    if (ok)
        memcpy(b, (unsigned char *)view.buf + off, CDC_SIZE); /* read once: a peer writes there */
    PyBuffer_Release(&view);
    if (!ok)
        return PyLong_FromLong(-1);
    int r = take_one((StateObj *)args[0], args[1], b, CDC_SIZE, now);
    if (r < 0)
        return NULL;
    return PyLong_FromLong(r ? 1 : -1);
}

static inline uint32_t le32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* take_run's walk (and ring_take's): the CDC SENDs of a ring of len bytes at a that
 * take_one takes, from *consumed on (below produced), *consumed and *posted moved past
 * them (geometry checked by the caller).  An error stops the walk where it is (cleared:
 * the Python then meets that SEND itself, and its error). */
static void run_core(StateObj *state, PyObject *qpn, unsigned char *a, long long len,
                     long long lens, long long base, long long stride, long long depth,
                     long long slot_size, long long *consumed_at, long long produced,
                     long long *posted_at, double now) {
    if (depth <= 0 || lens < 0 || base < 0 || stride < 16 || slot_size < 0 ||
        *consumed_at < 0 || *posted_at < 0 || lens + 4 * depth > len ||
        base + depth * stride > len)
        return;
    long long consumed = *consumed_at, posted = *posted_at;
    unsigned char b[CDC_SIZE];
    while (consumed < produced) {
        long long off = base + (consumed % depth) * stride;
        uint32_t n = le32(a + off), kind = le32(a + off + 4);
        if (kind != 1 || n > slot_size || n != CDC_SIZE || off + 16 + n > len)
            break;
        memcpy(b, a + off + 16, CDC_SIZE); /* read once: a peer writes there */
        int r = take_one(state, qpn, b, CDC_SIZE, now);
        if (r <= 0) {
            if (r < 0)
                PyErr_Clear();
            break;
        }
        memcpy(a + lens + 4 * (posted % depth), a + lens + 4 * (consumed % depth), 4);
        posted++;
        consumed++;
    }
    *consumed_at = consumed;
    *posted_at = posted;
}

/* take_run(state, qpn, area, lens, base, stride, depth, slot_size, consumed, produced,
 *          posted, now) -> (consumed, posted)
 *
 * The SENDs of a receive ring from consumed on (below produced) that take_one takes, up to
 * the first it does not (or a malformed slot): each slot at base + (i % depth) * stride, a
 * 16-byte header (u32 length, u32 kind: 1 a SEND) then the bytes; each one taken leaves
 * its receive posted again behind the others (its length, the u32 at lens + 4 * (i %
 * depth), copied to lens + 4 * (posted % depth)).  The shm QP's _take_in_place describes
 * its ring so (smcr.rdma.base.QueuePair.set_receiver).  An error stops the run where it is
 * (the Python then meets that SEND itself, and its error). */
static PyObject *take_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 12) {
        PyErr_SetString(PyExc_TypeError, "take_run takes 12 arguments");
        return NULL;
    }
    long long v[8];
    for (int i = 0; i < 8; i++) {
        v[i] = PyLong_AsLongLong(args[3 + i]);
        if (v[i] == -1 && PyErr_Occurred())
            return NULL;
    }
    double now = PyFloat_AsDouble(args[11]);
    if (now == -1.0 && PyErr_Occurred())
        return NULL;
    long long lens = v[0], base = v[1], stride = v[2], depth = v[3], slot_size = v[4];
    long long consumed = v[5], produced = v[6], posted = v[7];
    if (state_type == NULL || Py_TYPE(args[0]) != state_type || depth <= 0 || lens < 0 ||
        base < 0 || stride < 16 || slot_size < 0 || consumed < 0 || posted < 0)
        return Py_BuildValue("(LL)", consumed, posted);
    Py_buffer view;
    if (PyObject_GetBuffer(args[2], &view, PyBUF_WRITABLE) < 0)
        return NULL;
    run_core((StateObj *)args[0], args[1], (unsigned char *)view.buf, (long long)view.len,
             lens, base, stride, depth, slot_size, &consumed, produced, &posted, now);
    PyBuffer_Release(&view);
    /* (should this fail -- no memory for two ints -- the CDCs taken are offered again and
     * applied twice: a repeated cursor moves nothing; accepted) */
    return Py_BuildValue("(LL)", consumed, posted);
}

/* ------------------------------------------------------------------ ring_take, for C callers
 *
 * InPlace.take_run for a provider whose poll runs in C (the shm RNIC's _place.c): the RNIC
 * layer's ring-taker ABI (smcr.rdma.base.RingTaker; a copy below, the capsule's name says
 * which), on the runtime's InPlace object itself: no tap watching (InPlace.take_run's
 * check), its engine's state, the time as time.monotonic() reads it, and the counts
 * InPlace.take_run keeps (its taken, the process's inplace_cnt). */

typedef smcr___stack___inplace___InPlaceObject InPlaceObj;
typedef smcr___stack___hostconn___TapsObject TapsObj;
typedef smcr___core___engine___EngineObject EngineObj;
typedef smcr___stack___counters___CountersObject CountersObj;

typedef long long (*smcr_ring_taker)(PyObject *ctx, long long qpn, unsigned char *area,
                                     long long len, long long lens, long long base,
                                     long long stride, long long depth, long long slot_size,
                                     long long *consumed, long long produced,
                                     long long *posted);
#define RING_TAKER_NAME "smcr.rdma.RING_TAKER.v1"

static PyTypeObject *inplace_type, *taps_type, *engine_type, *counters_type;
static PyObject *counters; /* smcr.stack.counters.COUNTERS */

static inline void count_up(CPyTagged *at, long long n) {
    if (short_int(*at) && fits(untag(*at) + n))
        *at = tag(untag(*at) + n);
}

static long long ring_take(PyObject *ctx, long long qpn, unsigned char *a, long long len,
                           long long lens, long long base, long long stride, long long depth,
                           long long slot_size, long long *consumed, long long produced,
                           long long *posted) {
    if (inplace_type == NULL || Py_TYPE(ctx) != inplace_type)
        return 0;
    InPlaceObj *ip = (InPlaceObj *)ctx;
    if (ip->_taps == NULL || Py_TYPE(ip->_taps) != taps_type ||
        ((TapsObj *)ip->_taps)->_tap != Py_None || ip->_engine == NULL ||
        Py_TYPE(ip->_engine) != engine_type)
        return 0; /* a tap shows every CDC as a receive */
    PyObject *state = ((EngineObj *)ip->_engine)->_state;
    if (state == NULL || Py_TYPE(state) != state_type || *consumed >= produced)
        return 0;
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0) /* (time.monotonic's clock) */
        return 0;
    double now = (double)((int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec) / 1e9; /* (its way) */
    PyObject *key = PyLong_FromLongLong(qpn);
    if (key == NULL) {
        PyErr_Clear();
        return 0;
    }
    long long start = *consumed;
    run_core((StateObj *)state, key, a, len, lens, base, stride, depth, slot_size, consumed,
             produced, posted, now);
    Py_DECREF(key);
    long long n = *consumed - start;
    if (n > 0) {
        count_up(&ip->_taken, n);
        count_up(&((CountersObj *)counters)->_inplace_cnt, n);
    }
    return n;
}

/* bind_taker(InPlace, Taps, Engine, Counters, COUNTERS) -> the capsule of ring_take (after
 * bind: it takes through the same classes). */
static PyObject *bind_taker(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "bind_taker takes 4 classes and an object");
        return NULL;
    }
    if (state_type == NULL) {
        PyErr_SetString(PyExc_TypeError, "bind_taker: the lane is not bound");
        return NULL;
    }
    if (Py_TYPE(args[4]) != (PyTypeObject *)args[3]) {
        PyErr_SetString(PyExc_TypeError, "bind_taker: the counters are not a Counters");
        return NULL;
    }
    Py_ssize_t sizes[4] = {sizeof(InPlaceObj), sizeof(TapsObj), sizeof(EngineObj),
                           sizeof(CountersObj)};
    PyTypeObject **slots[4] = {&inplace_type, &taps_type, &engine_type, &counters_type};
    if (bind_classes("bind_taker", args, sizes, slots, 4) < 0)
        return NULL;
    Py_INCREF(args[4]);
    Py_XSETREF(counters, args[4]);
    return PyCapsule_New((void *)(smcr_ring_taker)ring_take, RING_TAKER_NAME, NULL);
}

static inline void put16(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 8);
    p[1] = (unsigned char)v;
}
static inline void put32(unsigned char *p, uint32_t v) {
    put16(p, v >> 16);
    put16(p + 2, v & 0xFFFF);
}

/* A CDC the post placed (the stores made) whose completion's push met an error (set): whom
 * rung all the same (QueuePair.ring_after), so the peer sees the CDC, then the error raised
 * for the sender to meet. */
static PyObject *placed_with_error(PyObject *qp, int64_t whom) {
    if (whom) {
        PyObject *type, *value, *trace;
        PyErr_Fetch(&type, &value, &trace);
        PyObject *rung = PyObject_CallMethod(qp, "ring_after", "L", (long long)whom);
        if (rung == NULL)
            PyErr_WriteUnraisable(qp);
        Py_XDECREF(rung);
        PyErr_Restore(type, value, trace);
    }
    return NULL;
}

#define DECLINED (-1)
#define FAILED (-3)

/* send_inline's work on a buffer held by the caller: whom to ring (>= 0, PLACED_ERROR
 * included: see there), DECLINED (no error set) or FAILED (an error set). */
static int64_t post_core(PyObject *c_obj, PyObject *qp, const Py_buffer *d, int request) {
    if (poster == NULL || conn_type == NULL || Py_TYPE(c_obj) != conn_type ||
        Py_TYPE(qp) != post_qp_type)
        return DECLINED;
    ConnObj *c = (ConnObj *)c_obj;
    if (c->_urg_tx_end != Py_None || c->_rmb == NULL || Py_TYPE(c->_rmb) != rmb_type ||
        c->_cdc_pending == NULL || c->_wr_ids == NULL)
        return DECLINED;
    CPyTagged ts[] = {c->_tx_sent, c->_tx_app, c->_tx_fin, c->_peer_cons, c->_peer_rmb_size,
                      c->_sndbuf_limit, c->_peer_vaddr, c->_peer_rkey, c->_seq, c->_rx_cons,
                      c->_rx_cons_sent, ((RmbObj *)c->_rmb)->_size, c->_peer_token,
                      c->_tx_flags, c->_unsignaled, c->_stats_write_blocked, c->_peer_hold};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        if (!short_int(ts[i]) || untag(ts[i]) < 0)
            return DECLINED;
    int64_t sent = untag(c->_tx_sent), rsize = untag(c->_peer_rmb_size);
    int64_t size = untag(((RmbObj *)c->_rmb)->_size), rx_cons = untag(c->_rx_cons);
    int64_t tx_fin = untag(c->_tx_fin), limit = untag(c->_sndbuf_limit);
    int64_t vaddr = untag(c->_peer_vaddr), rkey = untag(c->_peer_rkey);
    int64_t token = untag(c->_peer_token), unsignaled = untag(c->_unsignaled);
    if (rsize <= 0 || size <= 0 || rsize > UINT32_MAX || size > UINT32_MAX ||
        rkey > UINT32_MAX || token > UINT32_MAX || c->_tx_flags != 0 ||
        untag(c->_tx_app) != sent)
        return DECLINED;
    int64_t hold = untag(c->_peer_hold);
    request = request || hold == 0; /* (what we know of the peer's cursor may be old) */
    int64_t n = (int64_t)d->len, peer_free = rsize - hold - (sent - untag(c->_peer_cons));
    int64_t now_sent = sent + n;
    /* (items of more than a byte: len() counts them, not bytes) */
    if (d->itemsize != 1 || n <= 0 || n > peer_free || n > limit - (sent - tx_fin) ||
        !fits(now_sent))
        return DECLINED;
    smcr_write w[2];
    int64_t dst = sent % rsize, first = rsize - dst;
    int count = 1;
    w[0].data = d->buf;
    w[0].addr = (uint64_t)(vaddr + dst);
    w[0].n = (Py_ssize_t)(n <= first ? n : first);
    if (n > first) {
        count = 2;
        w[1].data = (const unsigned char *)d->buf + first;
        w[1].n = (Py_ssize_t)(n - first);
        w[1].addr = (uint64_t)vaddr;
    }
    uint32_t seq = (uint32_t)(untag(c->_seq) + 1) & 0xFFFF;
    unsigned char m[CDC_SIZE];
    memset(m, 0, sizeof m);
    m[0] = CDC_TYPE;
    m[1] = CDC_SIZE;
    put16(m + 2, seq);
    put32(m + 4, (uint32_t)token);
    put16(m + 10, (uint32_t)((now_sent / rsize) & 0xFFFF));
    put32(m + 12, (uint32_t)(now_sent % rsize));
    put16(m + 18, (uint32_t)((rx_cons / size) & 0xFFFF));
    put32(m + 20, (uint32_t)(rx_cons % size));
    int blocked = n == peer_free; /* the peer's RMBE is full now */
    m[24] = (unsigned char)((request ? UPDATE_REQUESTED : 0) | (blocked ? WRITE_BLOCKED : 0));
    /* _cdc's signaled (no state flags, no bytes waiting: checked above) */
    int signaled = unsignaled + 1 >= SIGNAL_EVERY || (now_sent - tx_fin) * 4 > limit || blocked;

    PyObject *pending = NULL, *wr_id = PyIter_Next(c->_wr_ids), *at = NULL;
    int64_t whom = DECLINED;
    if (wr_id == NULL)
        goto out;
    at = PyLong_FromLongLong((long long)now_sent);
    if (at == NULL)
        goto out;
    pending = PyTuple_Pack(3, wr_id, (PyObject *)c, at);
    if (pending == NULL)
        goto out;
    PyObject *r = PyObject_CallMethodOneArg(c->_cdc_pending, str_append, pending);
    if (r == NULL)
        goto out;
    Py_DECREF(r);
    whom = poster(qp, w, count, (uint32_t)rkey, m, CDC_SIZE, (uint32_t)token,
                  signaled ? wr_id : NULL);
    if (whom < 0) {
        /* taken back; nothing went: the Python posts it, or meets the post's error itself
         * (after write_inline, as the Python path always has) */
        PyErr_Clear();
        PyObject *back = PyObject_CallMethodNoArgs(c->_cdc_pending, str_pop);
        if (back != pending) /* (not possible: ours is the last, the GIL and lock held) */
            PyErr_WriteUnraisable(c->_cdc_pending);
        Py_XDECREF(back);
        PyErr_Clear();
        whom = DECLINED;
        goto out;
    }
    /* write_inline's and _cdc's stores (every old value a short int: nothing to release) */
    if (request)
        c->_echo_pending = 1;
    c->_tx_app = c->_tx_sent = tag(now_sent);
    c->_unanswered = 1;
    c->_seq = tag(seq);
    c->_rx_cons_sent = c->_rx_cons;
    c->_peer_wants_update = 0;
    c->_unsignaled = tag(signaled ? 0 : unsignaled + 1);
    if (blocked)
        c->_stats_write_blocked = tag(untag(c->_stats_write_blocked) + 1);
out:
    Py_XDECREF(pending);
    Py_XDECREF(at);
    Py_XDECREF(wr_id);
    if (whom == DECLINED && PyErr_Occurred())
        return FAILED;
    return whom;
}

/* send_inline(conn, qp, data, request) -> whom to ring (>= 0: QueuePair.ring_after), or -1:
 * not the common case, nothing sent and nothing changed (but a WR id drawn)
 *
 * Executor.send_inline's common case: Connection.write_inline and _cdc as they would, the
 * WRITEs and the CDC posted by the RNIC's post for C callers (bind), signaled where _cdc
 * signals (every SIGNAL_EVERY-th, one that fills the peer's RMBE and says write-blocked,
 * a quarter of the send buffer unconfirmed).  Declined: state flags (a closing
 * connection), urgent data, bytes waiting in the send buffer, more than fits, any long
 * int, and whatever the post declines (a tap or failures on the QP, its state, queued
 * work, the peer's state and MR checks).
 *
 * The CDC's pending entry is appended before the post (an allocation cannot fail after the
 * bytes went) and taken back if the post declines. */
static PyObject *send_inline(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "send_inline takes 4 arguments");
        return NULL;
    }
    int request = PyObject_IsTrue(args[3]);
    if (request < 0)
        return NULL;
    if (poster == NULL || conn_type == NULL || Py_TYPE(args[0]) != conn_type ||
        Py_TYPE(args[1]) != post_qp_type)
        return PyLong_FromLong(-1);
    Py_buffer d;
    if (PyObject_GetBuffer(args[2], &d, PyBUF_SIMPLE) < 0)
        return NULL;
    int64_t whom = post_core(args[0], args[1], &d, request);
    PyBuffer_Release(&d);
    if (whom == FAILED)
        return NULL;
    if (whom == DECLINED)
        return PyLong_FromLong(-1);
    if (whom & PLACED_ERROR)
        return placed_with_error(args[1], whom & ~PLACED_ERROR);
    return PyLong_FromLongLong(whom);
}

/* ---------------------------------------------------------------- a send, whole */

typedef smcr___stack___conn___DataPathObject DataPathObj;
typedef smcr___stack___executor___ExecutorObject ExecutorObj;
typedef smcr___stack___hostconn___HostConnObject HostConnObj;
typedef smcr___stack___wakeup___WakeupsObject WakeupsObj;
typedef smcr___rdma___shm___cq___ShmCompletionQueueObject CqObj;
typedef smcr___rdma___shm___qp___ShmQpObject ShmQpObj;
typedef smcr___rdma___shm___peer___PeerLinkObject PeerObj;

static PyTypeObject *datapath_type, *executor_type, *hostconn_type, *wakeups_type, *cq_type,
    *peer_type;
static PyObject *post_fallback; /* smcr.stack.executor.post_inline */
static PyObject *byte_view_fn;  /* smcr.stack.conn.byte_view */
static PyObject *ring_fn;       /* smcr.rdma._doorbell.ring, or NULL: the QP's ring_after */
static PyObject *ring_rid_fn;   /* smcr.rdma._doorbell.ring_rid, or NULL: the QP's ring_after */
static PyObject *ringers;       /* smcr.rdma.bells.RINGERS: the ringing socket, once made */
static PyObject *str_take_standby, *str_look_again,
    *str_dispatch_events, *str_send_ended, *str_ring_held, *str_sndbuf, *str_corked;

#define NOT_NOW (-2)
#define CLOSED_OR_ABORT 0x60u /* PEER_CONNECTION_CLOSED | PEER_CONNECTION_ABORT */
#define ARM_STANDBY 2         /* smcr.rdma.completion.ARM_STANDBY */

/* bind_sender(DataPath, Executor, HostConn, Wakeups, ShmCompletionQueue, PeerLink,
 * post_inline, byte_view, ring, ring_rid, ringers): the classes send_now reads (after bind
 * and bind_taker: it reads theirs too), the Python it hands a post the lane declines, the
 * doorbell's ring and a consumer bell's ring by name in C (None: the QP's ring_after rings),
 * and the list that holds the process's ringing socket once made (smcr.rdma.bells). */
static PyObject *bind_sender(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 11 || !PyList_CheckExact(args[10])) {
        PyErr_SetString(PyExc_TypeError, "bind_sender takes 6 classes, 4 functions and the "
                        "ringing socket's list");
        return NULL;
    }
    if (state_type == NULL || engine_type == NULL || counters == NULL) {
        PyErr_SetString(PyExc_TypeError, "bind_sender: bind and bind_taker first");
        return NULL;
    }
    Py_ssize_t sizes[6] = {sizeof(DataPathObj), sizeof(ExecutorObj), sizeof(HostConnObj),
                           sizeof(WakeupsObj), sizeof(CqObj), sizeof(PeerObj)};
    PyTypeObject **slots[6] = {&datapath_type, &executor_type, &hostconn_type, &wakeups_type,
                               &cq_type, &peer_type};
    if (bind_classes("bind_sender", args, sizes, slots, 6) < 0)
        return NULL;
    Py_INCREF(args[6]);
    Py_XSETREF(post_fallback, args[6]);
    Py_INCREF(args[7]);
    Py_XSETREF(byte_view_fn, args[7]);
    PyObject **fns[2] = {&ring_fn, &ring_rid_fn};
    for (int i = 0; i < 2; i++) {
        if (args[8 + i] == Py_None) {
            Py_CLEAR(*fns[i]);
        } else {
            Py_INCREF(args[8 + i]);
            Py_XSETREF(*fns[i], args[8 + i]);
        }
    }
    Py_INCREF(args[10]);
    Py_XSETREF(ringers, args[10]);
    Py_RETURN_NONE;
}

/* A consumer bell rung by name, as smcr.rdma.shm.send.ring_whom rings it: 1 when it went,
 * 0 when it did not (the doorbell whom names is rung instead), -1 with an error set, -2
 * where it is not rung here (no ringing socket made yet, no C ring, no prefix: the QP's
 * Python rings). */
static int ring_consumer(PeerObj *p, int64_t whom) {
    if (ring_rid_fn == NULL || ringers == NULL || PyList_GET_SIZE(ringers) < 1 ||
        p->_bells == NULL || !PyBytes_CheckExact(p->_bells) || PyBytes_GET_SIZE(p->_bells) < 1)
        return -2;
    PyObject *rid = PyLong_FromLongLong((long long)(whom >> 2));
    if (rid == NULL)
        return -1;
    PyObject *sock = PyList_GET_ITEM(ringers, 0);
    Py_INCREF(sock);
    PyObject *argv[3] = {sock, p->_bells, rid};
    PyObject *r = PyObject_Vectorcall(ring_rid_fn, argv, 3, NULL);
    Py_DECREF(sock);
    Py_DECREF(rid);
    if (r == NULL)
        return -1;
    long err = PyLong_AsLong(r);
    Py_DECREF(r);
    if (err == -1 && PyErr_Occurred())
        return -1;
    return err == 0;
}

/* ShmQp.ring_after(whom): the peer's doorbells rung here, and a consumer bell by name
 * (smcr.rdma.shm.send.ring_whom); the QP's Python where the C cannot.  0, or -1 (an error
 * set). */
static int ring_peer(PyObject *qp, int64_t whom) {
    PyObject *peer = ((ShmQpObj *)qp)->__peer;
    if (peer == Py_None || whom <= 0)
        return 0;
    int in_c = ring_fn != NULL && peer != NULL && Py_TYPE(peer) == peer_type &&
               ((PeerObj *)peer)->_bell != NULL;
    if (in_c && whom > 3) {
        int went = ring_consumer((PeerObj *)peer, whom);
        if (went == -1)
            return -1;
        if (went == 1)
            return 0;
        in_c = went == 0; /* (not gone: its doorbell; -2: the Python rings) */
    }
    PyObject *r;
    if (in_c) {
        PeerObj *p = (PeerObj *)peer;
        PyObject *bell = (whom & 3) == ARM_STANDBY && p->_standby_bell != NULL &&
                                 p->_standby_bell != Py_None
                             ? p->_standby_bell
                             : p->_bell;
        r = PyObject_CallOneArg(ring_fn, bell);
    } else {
        r = PyObject_CallMethod(qp, "ring_after", "L", (long long)whom);
    }
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* obj.name(), its result dropped: 0, or -1 (an error set). */
static int call0(PyObject *obj, PyObject *name) {
    PyObject *r = PyObject_CallMethodNoArgs(obj, name);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* obj.name() while an error is pending (kept, unless the call raises its own, which wins,
 * as one raised in a finally clause does). */
static void call0_pending(PyObject *obj, PyObject *name) {
    PyObject *type, *value, *trace;
    PyErr_Fetch(&type, &value, &trace);
    if (call0(obj, name) < 0) {
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(trace);
        return;
    }
    PyErr_Restore(type, value, trace);
}

/* ShmCompletionQueue.take_standby and Executor.look_again, natively, once bind_waiter found
 * them (below); NULL before. */
static __typeof__(CPyDef_shm___cq___ShmCompletionQueue___take_standby) *take_standby_fn;
static __typeof__(CPyDef_executor___Executor___look_again) *look_again_fn;

/* ex.look_again() (ex an exact Executor: its own method, natively where bound): 0, or -1 (an
 * error set). */
static int look_again(ExecutorObj *ex) {
    if (look_again_fn != NULL)
        return look_again_fn((PyObject *)ex) == 2 ? -1 : 0;
    return call0((PyObject *)ex, str_look_again);
}

/* lock.release() while an error is pending (as call0_pending). */
static void give_pending(PyObject *lock) {
    PyObject *type, *value, *trace;
    PyErr_Fetch(&type, &value, &trace);
    if (smcr_lock_give(lock) < 0) {
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(trace);
        return;
    }
    PyErr_Restore(type, value, trace);
}

/* Connection.cork(n) on the struct: 1 (the bytes wait in the send buffer for the answer
 * asked for), 0 (not), -1 (a long int: not this call's case). */
static int corks(ConnObj *c, int64_t n) {
    CPyTagged ts[] = {c->_tx_sent, c->_tx_app, c->_tx_fin, c->_peer_cons, c->_peer_rmb_size,
                      c->_sndbuf_limit, c->_autocork, c->_peer_hold};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        if (!short_int(ts[i]))
            return -1;
    int64_t autocork = untag(c->_autocork), sent = untag(c->_tx_sent), app = untag(c->_tx_app);
    if (!c->_echo_pending || c->_urg_tx_end != Py_None || n * 4 > autocork)
        return 0;
    int64_t waiting = app - sent + n;
    return waiting <= autocork &&
           waiting <= untag(c->_peer_rmb_size) - untag(c->_peer_hold) -
                          (sent - untag(c->_peer_cons)) &&
           n <= untag(c->_sndbuf_limit) - (app - untag(c->_tx_fin));
}

/* Connection.direct_room on the struct: the bytes an inline send takes now (0 while any
 * wait in the send buffer or urgent data is pending), or -1 (a long int: not send_now's). */
static int64_t direct_room(ConnObj *c) {
    CPyTagged ts[] = {c->_tx_sent, c->_tx_app, c->_tx_fin, c->_peer_cons, c->_peer_rmb_size,
                      c->_sndbuf_limit, c->_peer_hold};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        if (!short_int(ts[i]))
            return -1;
    int64_t sent = untag(c->_tx_sent), hold = untag(c->_peer_hold);
    if (untag(c->_tx_app) != sent || c->_urg_tx_end != Py_None)
        return 0;
    int64_t room = untag(c->_sndbuf_limit) - (sent - untag(c->_tx_fin));
    int64_t peer_room = untag(c->_peer_rmb_size) - hold - (sent - untag(c->_peer_cons));
    room = peer_room < room ? peer_room : room;
    return room > 0 ? room : 0;
}

/* Whether the connection key names in conns may take n bytes now as send_now takes them:
 * known, and corked (Connection.cork) or all of them fitting inline (direct_room).  A
 * glance (no lock: send_now looks again under it); any doubt says no. */
static int glance_fits(PyObject *conns, PyObject *key, int64_t n) {
    PyObject *c_obj = PyDict_GetItemWithError(conns, key); /* borrowed */
    if (c_obj == NULL || Py_TYPE(c_obj) != conn_type) {
        PyErr_Clear();
        return 0;
    }
    ConnObj *c = (ConnObj *)c_obj;
    if (c->_echo_pending)
        return corks(c, n) == 1;
    return n <= direct_room(c);
}

/* smcr stats: list[n.bit_length()] += 1, a count of COUNTERS (0, or -1: an error set). */
static int count_in(PyObject *list, int64_t n) {
    int bits = 0;
    while (bits < 64 && (n >> bits))
        bits++;
    if (list == NULL || !PyList_CheckExact(list) || bits >= PyList_GET_SIZE(list))
        return 0;
    PyObject *old = PyList_GET_ITEM(list, bits);
    PyObject *one = PyLong_FromLong(1);
    if (one == NULL)
        return -1;
    PyObject *sum = PyNumber_Add(old, one);
    Py_DECREF(one);
    if (sum == NULL)
        return -1;
    PyList_SET_ITEM(list, bits, sum);
    Py_DECREF(old);
    return 0;
}

/* smcr stats: COUNTERS.tx_pd[n.bit_length()] += 1 (0, or -1: an error set). */
static int count_send(int64_t n) { return count_in(((CountersObj *)counters)->_tx_pd, n); }

/* smcr stats: COUNTERS.rx_pd[want.bit_length()] += 1, want the size a read asked for (0, or
 * -1: an error set). */
static int count_read(int64_t want) {
    return want < 0 ? 0 : count_in(((CountersObj *)counters)->_rx_pd, want);
}

/* send_fast's corking: the bytes copied into the send buffer at the application's cursor
 * (executor.ring_write), the cursor moved (Connection.corked), the executor told
 * (Executor.corked: the progress thread woken for the first corking).  0, or -1 (an error
 * set; nothing changed unless the executor's call failed). */
static int cork_now(ConnObj *c, HostConnObj *hc, ExecutorObj *ex, const Py_buffer *d) {
    PyObject *ring = PyObject_GetAttr((PyObject *)hc, str_sndbuf);
    if (ring == NULL)
        return -1;
    Py_buffer b;
    int got = PyObject_GetBuffer(ring, &b, PyBUF_WRITABLE);
    Py_DECREF(ring);
    if (got < 0)
        return -1;
    int64_t size = (int64_t)b.len, n = (int64_t)d->len, app = untag(c->_tx_app);
    if (size <= 0 || n > size) {
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_ValueError, "send buffer smaller than the corked bytes");
        return -1;
    }
    int64_t start = app % size;
    unsigned char *to = (unsigned char *)b.buf;
    const unsigned char *from = (const unsigned char *)d->buf;
    if (start + n <= size) {
        memcpy(to + start, from, (size_t)n);
    } else {
        memcpy(to + start, from, (size_t)(size - start));
        memcpy(to, from + (size - start), (size_t)(n - (size - start)));
    }
    PyBuffer_Release(&b);
    c->_tx_app = tag(app + n);
    if (ex->_corked_any) /* (Executor.corked does nothing more then) */
        return 0;
    PyObject *r = PyObject_CallMethodOneArg((PyObject *)ex, str_corked, (PyObject *)c);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* Executor.update_readiness in C (a read, whole: below). */
static int readiness_now(ExecutorObj *ex, HostConnObj *hc, PyObject *c_obj);

/* send_now(datapath, data) -> the bytes sent (all of data), or -2: not this call's case,
 * nothing done (DataPath.try_send runs as before).
 *
 * A send's common case in one call: DataPath.try_send, send_fast's inline branch,
 * Executor.send_inline and executor.post_inline, step by step as they run them (the
 * writer's lock looked at, the runtime's lock held throughout, the standby arm taken
 * where a read left it for the send, echo_wanted, the post by the lane, the ring, what the
 * CQ holds taken, the engine's events, Progress.send_ended, the stats count).  Its case:
 * a connection of the engine, open both ways, no urgent data, no corking, to a peer in
 * another runtime (not a local one: its completions are taken here), a runtime with
 * inline sends and one link, a bytes-like of single bytes that fits the peer's RMBE now.
 * Everything it checks is checked before its first change; a post the lane declines after
 * that goes to the Python's post (executor.post_inline), as the Python's own would. */
static PyObject *send_now(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "send_now takes 2 arguments");
        return NULL;
    }
    if (datapath_type == NULL || Py_TYPE(args[0]) != datapath_type || poster == NULL)
        return PyLong_FromLong(NOT_NOW);
    DataPathObj *dp = (DataPathObj *)args[0];
    if (dp->_wr_shut != 0 || dp->_ex == NULL || Py_TYPE(dp->_ex) != executor_type ||
        dp->_hc == NULL || Py_TYPE(dp->_hc) != hostconn_type || dp->_wlock == NULL ||
        dp->_progress == NULL)
        return PyLong_FromLong(NOT_NOW);
    ExecutorObj *ex = (ExecutorObj *)dp->_ex;
    HostConnObj *hc = (HostConnObj *)dp->_hc;
    if (ex->_keep_copy != 0 || !short_int(ex->_max_inline) || untag(ex->_max_inline) <= 0 ||
        hc->_local_peer != Py_False || !short_int(hc->_conn_id) || ex->_lock == NULL ||
        ex->_engine == NULL || Py_TYPE(ex->_engine) != engine_type || ex->_cq == NULL ||
        Py_TYPE(ex->_cq) != cq_type || ex->_wake == NULL || Py_TYPE(ex->_wake) != wakeups_type ||
        ex->_qps == NULL || !PyDict_CheckExact(ex->_qps))
        return PyLong_FromLong(NOT_NOW);
    PyObject *state_obj = ((EngineObj *)ex->_engine)->_state;
    if (state_obj == NULL || Py_TYPE(state_obj) != state_type)
        return PyLong_FromLong(NOT_NOW);
    StateObj *state = (StateObj *)state_obj;
    if (state->_conns == NULL || !PyDict_CheckExact(state->_conns) || state->_events == NULL)
        return PyLong_FromLong(NOT_NOW);
    Py_buffer d;
    if (PyObject_GetBuffer(args[1], &d, PyBUF_SIMPLE) < 0) {
        PyErr_Clear(); /* (the Python's byte_view says what is wrong with it) */
        return PyLong_FromLong(NOT_NOW);
    }
    int64_t n = (int64_t)d.len;
    if (n <= 0 || d.itemsize != 1) {
        PyBuffer_Release(&d);
        return PyLong_FromLong(NOT_NOW);
    }
    /* a glance, without the runtime's lock, at what sends most often elsewhere (corking under
     * an answer asked for, a peer's RMBE too full): not this call's, and looked at again
     * below under the lock when it is.  (A stream of small writes paid this call's
     * checks, then the Python's, at every write.) */
    PyObject *conn_key = PyLong_FromSsize_t((Py_ssize_t)untag(hc->_conn_id));
    if (conn_key == NULL) {
        PyBuffer_Release(&d);
        return NULL;
    }
    int held = glance_fits(state->_conns, conn_key, n) ? smcr_lock_held(dp->_wlock) : 1;
    if (held != 0) { /* not its case, or another thread sends (and may wait): its order */
        Py_DECREF(conn_key);
        PyBuffer_Release(&d);
        return held < 0 ? NULL : PyLong_FromLong(NOT_NOW);
    }
    PyObject *lock = ex->_lock, *progress = dp->_progress, *wlock = dp->_wlock;
    PyObject *cq = ex->_cq, *wake = ex->_wake, *c_obj = NULL, *qp = NULL;
    Py_INCREF(lock);
    Py_INCREF(progress);
    Py_INCREF(wlock);
    Py_INCREF(cq);
    Py_INCREF(wake);
    Py_INCREF(ex);
    int failed = 0, standby = 0;
    int64_t result = NOT_NOW;
    if (smcr_lock_take(lock) < 0) {
        failed = 1;
        goto done;
    }
    /* try_send's look at the connection, the runtime's lock held */
    c_obj = PyDict_GetItemWithError(state->_conns, conn_key); /* borrowed */
    if (c_obj == NULL) {
        failed = PyErr_Occurred() != NULL;
        goto unlock;
    }
    if (Py_TYPE(c_obj) != conn_type)
        goto unlock;
    Py_INCREF(c_obj);
    ConnObj *c = (ConnObj *)c_obj;
    if (c->_reset_reason == NULL || !PyUnicode_CheckExact(c->_reset_reason) ||
        PyUnicode_GET_LENGTH(c->_reset_reason) != 0 || c->_tx_flags != 0 ||
        !short_int(c->_rx_flags) || (untag(c->_rx_flags) & CLOSED_OR_ABORT) ||
        c->_echo_pending > 1 || c->_unanswered > 1 || c->_urg_tx_end != Py_None)
        goto unlock;
    held = smcr_lock_held(wlock); /* (a sender took it meanwhile: it may be waiting inside) */
    if (held != 0) {
        failed = held < 0;
        goto unlock;
    }
    /* send_fast: corked under the answer asked for (Connection.cork, corked, Executor.corked) */
    int cork = corks(c, n);
    if (cork < 0)
        goto unlock;
    if (cork) {
        if (cork_now(c, hc, ex, &d) < 0)
            failed = 1;
        else
            result = n;
        goto ended;
    }
    /* or inline: all of it fits now (Connection.direct_room) */
    if (!short_int(c->_qpn) || !short_int(c->_ask_skip) || n > direct_room(c))
        goto unlock;
    /* executor.post_inline's QP */
    PyObject *key = PyLong_FromSsize_t((Py_ssize_t)untag(c->_qpn));
    if (key == NULL) {
        failed = 1;
        goto unlock;
    }
    qp = PyDict_GetItemWithError(ex->_qps, key); /* borrowed */
    Py_DECREF(key);
    if (qp == NULL) {
        failed = PyErr_Occurred() != NULL;
        goto unlock;
    }
    if (Py_TYPE(qp) != post_qp_type) {
        qp = NULL;
        goto unlock;
    }
    Py_INCREF(qp);
    /* from here on the send is this call's */
    WakeupsObj *w = (WakeupsObj *)wake;
    if (w->_send_takes_standby == 1) { /* (Progress.send_ended says why) */
        w->_send_takes_standby = 0;
        if (take_standby_fn != NULL) { /* (cq_type's own, called natively: bind_waiter) */
            char taken = take_standby_fn(cq);
            if (taken == 2) {
                failed = 1;
                goto unlock;
            }
            standby = taken == 1;
        } else {
            PyObject *r = PyObject_CallMethodNoArgs(cq, str_take_standby);
            if (r == NULL) {
                failed = 1;
                goto unlock;
            }
            standby = r == Py_True;
            Py_DECREF(r);
        }
    }
    /* c.unanswered and not c.echo_pending and c.echo_wanted(n) */
    int request = 0;
    int64_t autocork = untag(c->_autocork);
    if (c->_unanswered && 0 < n * 4 && n * 4 <= autocork) {
        if (c->_ask_skip != 0)
            c->_ask_skip = tag(untag(c->_ask_skip) - 1);
        else
            request = 1;
    }
    CqObj *q = (CqObj *)cq;
    q->_poster_looks = 1; /* (a signaled CDC's completion: taken below, ringing nobody) */
    int64_t whom = post_core(c_obj, qp, &d, request);
    if (whom == DECLINED) { /* the Python's post: the lane again, then write_inline */
        PyObject *view = PyObject_CallOneArg(byte_view_fn, args[1]);
        PyObject *r = view == NULL ? NULL : PyObject_CallFunctionObjArgs(
            post_fallback, (PyObject *)ex, c_obj, view, request ? Py_True : Py_False, NULL);
        Py_XDECREF(view);
        if (r == NULL)
            goto post_failed;
        Py_DECREF(r);
    } else if (whom == FAILED) {
        goto post_failed;
    } else if (whom & PLACED_ERROR) {
        placed_with_error(qp, whom & ~PLACED_ERROR);
        goto post_failed;
    } else if (whom && ring_peer(qp, whom) < 0) {
        goto post_failed;
    }
    q->_poster_looks = 0;
    /* Executor.send_inline: what the CQ holds now, the engine's events */
    PyObject *wcs = q->__wcs;
    Py_ssize_t waiting = wcs == NULL ? 0 : PyObject_Length(wcs);
    if (waiting < 0 || (waiting > 0 && look_again(ex) < 0) ||
        (PyObject_Length(state->_events) > 0 &&
         call0((PyObject *)ex, str_dispatch_events) < 0)) {
        failed = 1;
        goto ended;
    }
    result = n;
    goto ended;
post_failed: /* Executor.send_inline's except clause */
    q->_poster_looks = 0;
    call0_pending(cq, str_ring_held);
    failed = 1;
ended: /* send_fast's finally clause, then its readiness update */
    if (standby) {
        if (failed)
            call0_pending(progress, str_send_ended);
        else if (call0(progress, str_send_ended) < 0)
            failed = 1;
    }
    if (!failed && hc->_readiness != NULL && hc->_readiness != Py_None) {
        /* Executor.update_readiness: the connection looked up again (the engine's events
         * may have released it) */
        PyObject *now = PyDict_GetItemWithError(state->_conns, conn_key); /* borrowed */
        Py_XINCREF(now);
        if (now == NULL && PyErr_Occurred())
            failed = 1;
        else if (readiness_now(ex, hc, now) < 0)
            failed = 1;
        Py_XDECREF(now);
    }
unlock:
    if (failed)
        give_pending(lock);
    else if (smcr_lock_give(lock) < 0)
        failed = 1;
done:
    PyBuffer_Release(&d);
    Py_XDECREF(qp);
    Py_XDECREF(c_obj);
    Py_DECREF(lock);
    Py_DECREF(progress);
    Py_DECREF(wlock);
    Py_DECREF(cq);
    Py_DECREF(wake);
    Py_DECREF(ex);
    Py_DECREF(conn_key);
    if (failed || (result > 0 && count_send(result) < 0))
        return NULL;
    return PyLong_FromLongLong(result);
}

/* smcr.core.connection.SOCK_MIN_SNDBUF_HALF: Connection.consumed's floor */
#define SOCK_MIN_SNDBUF_HALF 2304

/* read_fast's steps on buffers had already (ring: the RMB's bytes; out: where they go):
 * n copied out and consumed, or -1 (nothing changed). */
static int64_t read_core(ConnObj *c, const Py_buffer *ring, const Py_buffer *out, int waitall) {
    if (c->_rmb == NULL || Py_TYPE(c->_rmb) != rmb_type || c->_urg_rx_pos != Py_None ||
        c->_peer_wants_update != 0 || c->_peer_write_blocked > 1)
        return -1;
    CPyTagged ts[] = {c->_rx_prod, c->_rx_cons, c->_rx_cons_sent, ((RmbObj *)c->_rmb)->_size};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        if (!short_int(ts[i]))
            return -1;
    int64_t prod = untag(c->_rx_prod), cons = untag(c->_rx_cons);
    int64_t sent = untag(c->_rx_cons_sent), size = untag(((RmbObj *)c->_rmb)->_size);
    int64_t avail = prod - cons;
    if (size <= 0 || size > MAX_RING || avail <= 0 || avail >= size || cons < 0)
        return -1;
    int64_t n = out->len < avail ? out->len : avail;
    int64_t unconfirmed = cons + n - sent, peer_free = size - (prod - sent);
    int64_t floor = size / 10 > SOCK_MIN_SNDBUF_HALF ? size / 10 : SOCK_MIN_SNDBUF_HALF;
    int update = unconfirmed > floor && (peer_free <= size / 2 || c->_peer_write_blocked);
    if (ring->len != size || out->len == 0 || (waitall && avail < out->len) || update ||
        !fits(cons + n))
        return -1;
    int64_t start = cons % size;
    unsigned char *from = (unsigned char *)ring->buf, *to = (unsigned char *)out->buf;
    if (start + n <= size) {
        memcpy(to, from + start, (size_t)n);
    } else {
        memcpy(to, from + start, (size_t)(size - start));
        memcpy(to + (size - start), from, (size_t)(n - (size - start)));
    }
    c->_rx_cons = tag(cons + n);
    return n;
}

/* read_fast(c, rmb, out, waitall) -> n copied out and consumed, or -1 (nothing changed)
 *
 * DataPath.recv_fast's common case on the engine's Connection c: bytes there, fewer than
 * the RMBE holds (a full one is counted by the general path), no urgent byte, and with
 * waitall all of out there; n = min(len(out), bytes there) are copied from the RMB (rmb:
 * its buffer, as many bytes as the Rmb's size; the cursors wrap around it) and the
 * consumer cursor moves, as executor.ring_read and Connection.consumed do, where consumed
 * would send no consumer cursor update.  Where it would (or anything is not the common
 * case) -1: the Python does it all.  What follows a read (a local peer's completions, the
 * readiness descriptor) stays the caller's. */
static PyObject *read_fast(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "read_fast takes 4 arguments");
        return NULL;
    }
    if (conn_type == NULL || Py_TYPE(args[0]) != conn_type)
        return PyLong_FromLong(-1);
    int waitall = PyObject_IsTrue(args[3]);
    if (waitall < 0)
        return NULL;
    /* (a buffer that cannot be had so, say a view with strides: the Python's, as before) */
    Py_buffer ring, out;
    if (PyObject_GetBuffer(args[1], &ring, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        return PyLong_FromLong(-1);
    }
    if (PyObject_GetBuffer(args[2], &out, PyBUF_WRITABLE) < 0) {
        PyErr_Clear();
        PyBuffer_Release(&ring);
        return PyLong_FromLong(-1);
    }
    int64_t n = read_core((ConnObj *)args[0], &ring, &out, waitall);
    PyBuffer_Release(&out);
    PyBuffer_Release(&ring);
    return PyLong_FromLongLong(n);
}

/* ---------------------------------------------------------------- a read, whole */

typedef smcr___stack___readiness___ReadinessObject ReadinessObj;
typedef smcr___rdma___bells___WatchSlotObject SlotObj;

static PyTypeObject *readiness_type, *slot_type;
static PyObject *closed_state; /* smcr.core.close.SmcState.CLOSED */
static PyObject *drain_fn;     /* smcr.rdma._doorbell.drain */
static PyObject *str_follow, *str_buf, *str_poll, *str_process, *str_check, *str_unchecked,
    *str_add, *str_queued, *str_ring_self;
static PyObject *poll_most; /* 64: the most completions a look takes (Executor.look) */

/* bind_reader(Readiness, WatchSlot, SmcState.CLOSED, drain): the classes follow reads (after
 * bind; read_now reads bind_sender's too, and declines until they are bound), the state a
 * connection is done in, and the doorbell's drain in C. */
static PyObject *bind_reader(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "bind_reader takes 2 classes, a state and a function");
        return NULL;
    }
    if (conn_type == NULL) {
        PyErr_SetString(PyExc_TypeError, "bind_reader: bind first");
        return NULL;
    }
    Py_ssize_t sizes[2] = {sizeof(ReadinessObj), sizeof(SlotObj)};
    PyTypeObject **slots[2] = {&readiness_type, &slot_type};
    if (bind_classes("bind_reader", args, sizes, slots, 2) < 0)
        return NULL;
    Py_INCREF(args[2]);
    Py_XSETREF(closed_state, args[2]);
    Py_INCREF(args[3]);
    Py_XSETREF(drain_fn, args[3]);
    Py_RETURN_NONE;
}

#define NOT_HERE (-1)
#define FOLLOW_ERROR (-2)

/* r.name() for a readiness descriptor, its answer's truth: 1 or 0, or -1 (an error set). */
static int ask(PyObject *r, PyObject *name) {
    PyObject *answer = PyObject_CallMethodNoArgs(r, name);
    if (answer == NULL)
        return -1;
    int yes = PyObject_IsTrue(answer);
    Py_DECREF(answer);
    return yes;
}

/* A watch word's value as the Python stores it (little-endian: smcr.rdma.stores.store_u32). */
static inline uint32_t word_of(uint32_t v) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    return __builtin_bswap32(v);
#else
    return v;
#endif
}

/* WatchSlot.take on its word w: the arm taken back (by a compare and exchange, so that a
 * requester's take between a load and a store cannot go unseen); 1 where a requester had
 * taken it (it rang: its datagram went or is on its way), 0 where it was still there. */
static int take_back(SlotObj *slot, uint32_t *w, uint32_t rid) {
    slot->_armed = 0;
    uint32_t mine = word_of(rid);
    if (__atomic_compare_exchange_n(w, &mine, 0u, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
        return 0;
    slot->_rung = tag(untag(slot->_rung) + 1);
    return 1;
}

/* Readiness.follow(c) on the structs, where it is a named descriptor's common case: c a
 * Connection whose readiness changes at most in readability (bytes came, or a read took
 * them), the descriptor named (a rid), not failed, its bell a WatchSlot or None; the steps
 * of set and _set_named: turning readable, the bell taken back and the peer's ring trusted
 * where it rang (checked now, later or by the reader that took the news, as the descriptor
 * says), else a datagram of its own; turning unreadable, the datagram drained; the bell
 * armed or taken back as quiet and writable and not readable says; and follow's answer.
 * 1 or 0 (whether the caller must look at the CQ: Executor.look_again), NOT_HERE (not its
 * case: nothing changed) or FOLLOW_ERROR (an error set: a call's, with what it changed
 * before, as the Python's would leave it). */
static int follow_core(PyObject *r_obj, PyObject *c_obj) {
    if (readiness_type == NULL || Py_TYPE(r_obj) != readiness_type || c_obj == NULL ||
        Py_TYPE(c_obj) != conn_type || drain_fn == NULL || counters == NULL)
        return NOT_HERE;
    ReadinessObj *r = (ReadinessObj *)r_obj;
    ConnObj *c = (ConnObj *)c_obj;
    if (!short_int(r->_rid) || untag(r->_rid) == 0 || r->_failed != 0 || r->_a == NULL ||
        r->_peer == NULL || r->_later == NULL || r->_readable > 1 || r->_writable > 1 ||
        r->_looks > 1 || r->_defer_check > 1)
        return NOT_HERE;
    CPyTagged ts[] = {c->_rx_prod, c->_rx_cons, c->_sndbuf_limit, c->_tx_app, c->_tx_fin,
                      c->_tx_sent, c->_tx_flags, c->_rx_flags};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        if (!short_int(ts[i]))
            return NOT_HERE;
    if (c->_reset_reason == NULL || !PyUnicode_CheckExact(c->_reset_reason) ||
        c->_state == NULL)
        return NOT_HERE;
    int reset = PyUnicode_GET_LENGTH(c->_reset_reason) != 0;
    int done = untag(c->_rx_flags) != 0 || c->_state == closed_state; /* peer_done */
    int readable = untag(c->_rx_prod) - untag(c->_rx_cons) > 0 || done || reset;
    int writable = untag(c->_sndbuf_limit) - (untag(c->_tx_app) - untag(c->_tx_fin)) > 0 ||
                   c->_tx_flags != 0 || reset;
    int quiet = c->_tx_app == c->_tx_sent && c->_tx_flags == 0;
    if (writable != r->_writable)
        return NOT_HERE;
    int turns = readable != r->_readable;
    /* the bell's word, where it is looked at: had before the first change */
    PyObject *bell = r->_bell;
    SlotObj *slot = NULL;
    Py_buffer word;
    int arm = quiet && writable && !readable, touch = 0;
    if (bell != NULL && bell != Py_None) {
        if (Py_TYPE(bell) != slot_type)
            return NOT_HERE;
        slot = (SlotObj *)bell;
        if (slot->_armed > 1)
            return NOT_HERE;
        /* (turning readable takes an armed bell back; then no arm: it is readable) */
        touch = turns && readable ? slot->_armed : arm != slot->_armed;
        if (touch) {
            CountersObj *counts = (CountersObj *)counters;
            if (!short_int(slot->_offset) || !short_int(slot->_rid) ||
                !short_int(slot->_rung) || !fits(untag(slot->_rung) + 1) ||
                !short_int(counts->_bell_cnt) || !fits(untag(counts->_bell_cnt) + 1) ||
                slot->_notify == NULL)
                return NOT_HERE;
            /* (a closed segment, its mmap's ValueError: the Python's, which knows it closed) */
            if (PyObject_GetBuffer(slot->_notify, &word, PyBUF_WRITABLE) < 0) {
                PyErr_Clear();
                return NOT_HERE;
            }
            int64_t at = untag(slot->_offset);
            if (at < 0 || at % 4 || at + 4 > (int64_t)word.len) {
                PyBuffer_Release(&word);
                return NOT_HERE;
            }
        }
    }
    /* from here on the update is this call's */
    uint32_t *w = touch ? (uint32_t *)((unsigned char *)word.buf + untag(slot->_offset)) : NULL;
    uint32_t rid = touch ? (uint32_t)untag(slot->_rid) : 0;
    int failed = 0, rang = 0;
    if (turns && readable) {
        r->_readable = 1;
        if (touch) { /* WatchSlot.take: a requester that took the arm rang */
            rang = take_back(slot, w, rid);
            PyBuffer_Release(&word); /* (before the calls below: they may close it) */
            touch = 0;
        }
        /* rung by the peer already (it took the arm), unless its datagram never came, or
         * cannot come (connected to the full peer: only it may send) */
        int trusted = 0;
        if (rang && r->_peer == Py_None) {
            CountersObj *counts = (CountersObj *)counters;
            counts->_bell_cnt = tag(untag(counts->_bell_cnt) + 1);
            if (r->_defer_check || r->_later != Py_None) {
                r->_unchecked = 1;
                trusted = 1;
                if (!r->_defer_check) {
                    PyObject *added = PyObject_CallMethodOneArg(r->_later, str_add, r_obj);
                    failed = added == NULL;
                    Py_XDECREF(added);
                }
            } else {
                trusted = ask(r_obj, str_queued);
                failed = trusted < 0;
            }
        }
        if (!failed && !trusted)
            failed = ask(r_obj, str_ring_self) < 0;
    } else {
        if (turns) {
            r->_readable = 0;
            r->_unchecked = 0; /* (the drain takes the datagram, come or not) */
            PyObject *got = PyObject_CallOneArg(drain_fn, r->_a);
            failed = got == NULL;
            Py_XDECREF(got);
        }
        if (touch && !failed) {
            if (arm) { /* WatchSlot.arm: the caller looks at the CQ after */
                __atomic_store_n(w, word_of(rid), __ATOMIC_SEQ_CST);
                slot->_armed = 1;
                r->_looks = 1;
            } else if (take_back(slot, w, rid)) {
                r->_looks = 1; /* (a peer rang: its message waits for a look) */
            }
        }
    }
    if (touch)
        PyBuffer_Release(&word);
    if (failed)
        return FOLLOW_ERROR;
    int looks = r->_looks;
    r->_looks = 0;
    return looks;
}

/* follow(readiness, c) -> 1 or 0 (Readiness.follow's answer, the update made), or -1: not
 * its case, nothing changed (Readiness.follow does it). */
static PyObject *follow(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "follow takes 2 arguments");
        return NULL;
    }
    int looks = follow_core(args[0], args[1] == Py_None ? NULL : args[1]);
    if (looks == FOLLOW_ERROR)
        return NULL;
    return PyLong_FromLong(looks);
}

/* Executor.update_readiness(hc) with the runtime's lock held: the connection's descriptor
 * followed (follow_core, else Readiness.follow), the CQ looked at again where it says so.
 * 0, or -1 (an error set). */
static int readiness_now(ExecutorObj *ex, HostConnObj *hc, PyObject *c_obj) {
    PyObject *r = hc->_readiness;
    if (r == NULL || r == Py_None)
        return 0;
    Py_INCREF(r);
    int looks = follow_core(r, c_obj);
    if (looks == NOT_HERE) {
        PyObject *answer = PyObject_CallMethodOneArg(r, str_follow, c_obj ? c_obj : Py_None);
        looks = answer == NULL ? FOLLOW_ERROR : PyObject_IsTrue(answer);
        Py_XDECREF(answer);
        if (looks < 0)
            looks = FOLLOW_ERROR;
    }
    Py_DECREF(r);
    if (looks == FOLLOW_ERROR)
        return -1;
    return looks ? look_again(ex) : 0;
}

/* DataPath.take_news with the runtime's lock held: what the CQ holds taken, the readiness
 * descriptor's checks deferred meanwhile (news_taken makes them).  0, or -1 (an error set). */
static int take_news(ExecutorObj *ex, HostConnObj *hc) {
    PyObject *wcs = PyObject_CallMethodOneArg(ex->_cq, str_poll, poll_most);
    if (wcs == NULL)
        return -1;
    int some = PyObject_IsTrue(wcs);
    PyObject *r = hc->_readiness;
    int deferred = some > 0 && r != NULL && Py_TYPE(r) == readiness_type;
    if (deferred) { /* (kept: the news may drop the connection's descriptor) */
        Py_INCREF(r);
        ((ReadinessObj *)r)->_defer_check = 1;
    }
    PyObject *done = some > 0 ? PyObject_CallMethodOneArg((PyObject *)ex, str_process, wcs)
                              : (some < 0 ? NULL : Py_NewRef(Py_None));
    if (deferred) {
        ((ReadinessObj *)r)->_defer_check = 0;
        Py_DECREF(r);
    }
    Py_DECREF(wcs);
    Py_XDECREF(done);
    return done == NULL ? -1 : 0;
}

/* DataPath.news_taken with the runtime's lock held: the check take_news deferred, where the
 * descriptor is still unchecked.  0, or -1 (an error set). */
static int news_taken(HostConnObj *hc) {
    PyObject *r = hc->_readiness;
    if (r == NULL || r == Py_None)
        return 0;
    if (Py_TYPE(r) == readiness_type && !((ReadinessObj *)r)->_unchecked)
        return 0;
    Py_INCREF(r);
    int ret = 0;
    PyObject *unchecked = PyObject_GetAttr(r, str_unchecked);
    int due = unchecked == NULL ? -1 : PyObject_IsTrue(unchecked);
    Py_XDECREF(unchecked);
    if (due < 0)
        ret = -1;
    else if (due)
        ret = call0(r, str_check);
    Py_DECREF(r);
    return ret;
}

#define NOTHING_THERE (-3)

/* read_now(datapath, out, want, news) -> the bytes read into out (> 0), or where out is None
 * (recv) a bytes of them, made the size of what is there up to want; -2: not this call's
 * case, nothing read (DataPath.try_read runs as before: the CQ's news may have been taken
 * meanwhile), or -3: no bytes there even after the CQ's news was taken (news true: the
 * caller's general path says why, or would block).
 *
 * A read's common case in one call: DataPath.try_read, recv_fast's lane branch and
 * Executor.update_readiness, step by step as they run them (the reader's lock looked at,
 * the runtime's lock held throughout, the bytes copied out and consumed as read_fast does,
 * the standby arm left for the next send, the descriptor followed, the stats count); with
 * news (a non-blocking socket's read) and no bytes there yet, what the CQ holds is taken
 * first, as take_news, the read and news_taken take it (an event loop's read after the
 * peer's ring finds the ring's message there, not yet taken).  Its case: a connection of
 * the engine to a peer in another runtime (a local one's completions are taken at the
 * read), with bytes there that read_fast takes. */
static PyObject *read_now(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "read_now takes 4 arguments");
        return NULL;
    }
    if (datapath_type == NULL || Py_TYPE(args[0]) != datapath_type || readiness_type == NULL)
        return PyLong_FromLong(NOT_NOW);
    DataPathObj *dp = (DataPathObj *)args[0];
    int news = PyObject_IsTrue(args[3]);
    if (news < 0)
        return NULL;
    if (dp->_ex == NULL || Py_TYPE(dp->_ex) != executor_type || dp->_hc == NULL ||
        Py_TYPE(dp->_hc) != hostconn_type || dp->_rlock == NULL || !PyLong_CheckExact(args[2]))
        return PyLong_FromLong(NOT_NOW);
    int overflow = 0; /* (the size asked for, counted once the bytes are read: a C integer) */
    long long want = PyLong_AsLongLongAndOverflow(args[2], &overflow);
    if (overflow || (want == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return PyLong_FromLong(NOT_NOW);
    }
    ExecutorObj *ex = (ExecutorObj *)dp->_ex;
    HostConnObj *hc = (HostConnObj *)dp->_hc;
    if (hc->_local_peer != Py_False || !short_int(hc->_conn_id) || hc->_rmb_mr == NULL ||
        ex->_lock == NULL || ex->_engine == NULL || Py_TYPE(ex->_engine) != engine_type ||
        ex->_wake == NULL || Py_TYPE(ex->_wake) != wakeups_type || ex->_cq == NULL)
        return PyLong_FromLong(NOT_NOW);
    PyObject *state_obj = ((EngineObj *)ex->_engine)->_state;
    if (state_obj == NULL || Py_TYPE(state_obj) != state_type ||
        ((StateObj *)state_obj)->_conns == NULL ||
        !PyDict_CheckExact(((StateObj *)state_obj)->_conns))
        return PyLong_FromLong(NOT_NOW);
    int held = smcr_lock_held(dp->_rlock);
    if (held != 0) /* another thread reads (and may wait): its order */
        return held < 0 ? NULL : PyLong_FromLong(NOT_NOW);
    Py_buffer out, ring;
    int making = args[1] == Py_None; /* (recv: bytes the size of what is there, made below) */
    PyObject *made = NULL;
    if (making) {
        if (want <= 0)
            return PyLong_FromLong(NOT_NOW);
        out.buf = NULL;
        out.len = 0;
    } else if (PyObject_GetBuffer(args[1], &out, PyBUF_WRITABLE) < 0) {
        PyErr_Clear(); /* (the Python's byte_view says what is wrong with it) */
        return PyLong_FromLong(NOT_NOW);
    }
    PyObject *buf = PyObject_GetAttr(hc->_rmb_mr, str_buf); /* HostConn.rmb */
    if (buf == NULL || PyObject_GetBuffer(buf, &ring, PyBUF_SIMPLE) < 0) {
        Py_XDECREF(buf);
        PyErr_Clear();
        if (!making)
            PyBuffer_Release(&out);
        return PyLong_FromLong(NOT_NOW);
    }
    Py_DECREF(buf);
    PyObject *key = PyLong_FromSsize_t((Py_ssize_t)untag(hc->_conn_id));
    if (key == NULL) {
        PyBuffer_Release(&ring);
        if (!making)
            PyBuffer_Release(&out);
        return NULL;
    }
    PyObject *lock = ex->_lock, *conns = ((StateObj *)state_obj)->_conns, *c_obj = NULL;
    Py_INCREF(lock);
    Py_INCREF(ex);
    Py_INCREF(hc);
    Py_INCREF(conns);
    int failed = 0, took = 0, empty_after = 0;
    int64_t n = NOT_NOW;
    if (smcr_lock_take(lock) < 0) {
        failed = 1;
        goto done;
    }
    for (;;) {
        c_obj = PyDict_GetItemWithError(conns, key); /* borrowed */
        if (c_obj == NULL) {
            failed = PyErr_Occurred() != NULL;
            goto unlock;
        }
        Py_INCREF(c_obj);
        held = smcr_lock_held(dp->_rlock); /* (a reader took it meanwhile) */
        if (held != 0 || Py_TYPE(c_obj) != conn_type) {
            failed = held < 0;
            goto unlock;
        }
        ConnObj *c = (ConnObj *)c_obj;
        if (making && made == NULL && short_int(c->_rx_prod) && short_int(c->_rx_cons) &&
            untag(c->_rx_prod) > untag(c->_rx_cons)) {
            int64_t avail = untag(c->_rx_prod) - untag(c->_rx_cons);
            made = PyBytes_FromStringAndSize(NULL, avail < want ? avail : want);
            if (made == NULL) {
                failed = 1;
                goto unlock;
            }
            out.buf = PyBytes_AS_STRING(made);
            out.len = PyBytes_GET_SIZE(made);
        }
        n = making && made == NULL ? -1 : read_core(c, &ring, &out, 0);
        if (n > 0)
            break;
        int empty = short_int(c->_rx_prod) && short_int(c->_rx_cons) &&
                    untag(c->_rx_prod) == untag(c->_rx_cons);
        n = NOT_NOW;
        empty_after = took && empty;
        if (!news || took || !empty)
            goto unlock;
        took = 1;
        Py_CLEAR(c_obj);
        if (take_news(ex, hc) < 0) {
            failed = 1;
            goto unlock;
        }
    }
    ((WakeupsObj *)ex->_wake)->_send_takes_standby = 1; /* (Progress.send_ended) */
    if (readiness_now(ex, hc, c_obj) < 0)
        failed = 1;
unlock:
    if (took) { /* (news_taken runs as the Python's finally clause runs it) */
        if (!failed) {
            failed = news_taken(hc) < 0;
        } else {
            PyObject *type, *value, *trace;
            PyErr_Fetch(&type, &value, &trace);
            if (news_taken(hc) < 0) { /* (its own error wins, as in a finally clause) */
                Py_XDECREF(type);
                Py_XDECREF(value);
                Py_XDECREF(trace);
            } else {
                PyErr_Restore(type, value, trace);
            }
        }
        if (n == NOT_NOW && !failed && empty_after)
            n = NOTHING_THERE;
    }
    if (failed)
        give_pending(lock);
    else if (smcr_lock_give(lock) < 0)
        failed = 1;
done:
    PyBuffer_Release(&ring);
    if (!making)
        PyBuffer_Release(&out);
    Py_XDECREF(c_obj);
    Py_DECREF(lock);
    Py_DECREF(ex);
    Py_DECREF(hc);
    Py_DECREF(conns);
    Py_DECREF(key);
    if (failed || (n > 0 && count_read((int64_t)want) < 0)) {
        Py_XDECREF(made);
        return NULL;
    }
    if (n > 0 && making) {
        if (n < PyBytes_GET_SIZE(made) && _PyBytes_Resize(&made, (Py_ssize_t)n) < 0)
            return NULL;
        return made; /* (the bytes read, made for them) */
    }
    Py_XDECREF(made);
    return PyLong_FromLongLong(n);
}


/* ---------------------------------------------------------------- a blocking read's wait */

typedef smcr___stack___progress___ProgressObject ProgressObj;
typedef smcr___stack___spin___SpinPolicyObject SpinObj;
typedef smcr___stack___readiness___DeferredChecksObject ChecksObj;
typedef smcr___stack___trim___IdleTrimObject TrimObj;

static PyTypeObject *progress_type, *spin_type, *checks_type, *trim_type;
static PyObject *str_app;    /* Wakeups.poller's value while an application thread polls */
static PyObject *spin_most;  /* smcr.stack.progress.SPIN, a float */
static double longest_sleep; /* smcr.stack.progress.LONGEST_SLEEP */
static PyObject *str_woke, *str_kick_progress, *str_park_at_exit;

/* The compiled methods the wait calls, natively (found by name in mypyc's shared library at
 * bind_waiter; their types are the prototypes this build's header gives them, so a change of
 * signature fails the build rather than the call).  Each is the method of the exact class
 * wait_readable checks for: no override to dispatch to. */
static __typeof__(CPyDef_connection___Connection___readable) *readable_fn;
static __typeof__(CPyDef_spin___SpinPolicy___allowance) *allowance_fn;
static __typeof__(CPyDef_completion___CompletionQueue___poll) *cq_poll_fn;
static __typeof__(CPyDef_executor___Executor___process) *process_fn;
static __typeof__(CPyDef_engine___Engine___get_timer) *get_timer_fn;
static __typeof__(CPyDef_progress___Progress____hand_back) *hand_back_fn;
static __typeof__(CPyDef_completion___CompletionQueue___arming) *arming_fn;
static __typeof__(CPyDef_shm___cq___ShmCompletionQueue___req_notify) *req_notify_fn;
static __typeof__(CPyDef_shm___cq___ShmCompletionQueue___take_arm) *take_arm_fn;

#define ARM_SLEEPER 1 /* smcr.rdma.completion.ARM_SLEEPER */
#define NATIVE_FNS 11
#define MAX_EVENTS 8  /* a poller sleeps on the CQ, its bell and the handshakes' two epolls */

/* One compiled function of the shared library handle: its address, or NULL (an error set). */
static void *native_fn(void *lib, const char *name) {
    void *fn = dlsym(lib, name);
    if (fn == NULL)
        PyErr_Format(PyExc_TypeError, "bind_waiter: %s is not in the compiled library", name);
    return fn;
}

/* bind_waiter(Progress, SpinPolicy, DeferredChecks, IdleTrim, "app", SPIN, LONGEST_SLEEP,
 * library): the classes wait_readable reads (after bind_sender and bind_reader: it reads
 * theirs too), the constants of the Python it stands for, and the path of mypyc's shared
 * library (loaded already), whose methods it calls. */
static PyObject *bind_waiter(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 8 || !PyUnicode_CheckExact(args[4]) || !PyFloat_CheckExact(args[5]) ||
        !PyFloat_CheckExact(args[6]) || !PyUnicode_Check(args[7])) {
        PyErr_SetString(PyExc_TypeError, "bind_waiter takes 4 classes, a str, two floats and "
                        "a path");
        return NULL;
    }
    if (datapath_type == NULL || readiness_type == NULL || conn_type == NULL) {
        PyErr_SetString(PyExc_TypeError, "bind_waiter: bind_sender and bind_reader first");
        return NULL;
    }
    const char *path = PyUnicode_AsUTF8(args[7]);
    if (path == NULL)
        return NULL;
    void *lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD); /* (a reference: kept, as the module is) */
    if (lib == NULL) {
        PyErr_Format(PyExc_TypeError, "bind_waiter: %s is not loaded", path);
        return NULL;
    }
    void *fns[NATIVE_FNS] = {
        native_fn(lib, "CPyDef_connection___Connection___readable"),
        native_fn(lib, "CPyDef_spin___SpinPolicy___allowance"),
        native_fn(lib, "CPyDef_completion___CompletionQueue___poll"),
        native_fn(lib, "CPyDef_executor___Executor___process"),
        native_fn(lib, "CPyDef_engine___Engine___get_timer"),
        native_fn(lib, "CPyDef_progress___Progress____hand_back"),
        native_fn(lib, "CPyDef_shm___cq___ShmCompletionQueue___take_standby"),
        native_fn(lib, "CPyDef_completion___CompletionQueue___arming"),
        native_fn(lib, "CPyDef_shm___cq___ShmCompletionQueue___req_notify"),
        native_fn(lib, "CPyDef_shm___cq___ShmCompletionQueue___take_arm"),
        native_fn(lib, "CPyDef_executor___Executor___look_again"),
    };
    for (int i = 0; i < NATIVE_FNS; i++)
        if (fns[i] == NULL)
            return NULL;
    Py_ssize_t sizes[4] = {sizeof(ProgressObj), sizeof(SpinObj), sizeof(ChecksObj),
                           sizeof(TrimObj)};
    PyTypeObject **slots[4] = {&progress_type, &spin_type, &checks_type, &trim_type};
    if (bind_classes("bind_waiter", args, sizes, slots, 4) < 0)
        return NULL;
    readable_fn = (__typeof__(readable_fn))fns[0];
    allowance_fn = (__typeof__(allowance_fn))fns[1];
    cq_poll_fn = (__typeof__(cq_poll_fn))fns[2];
    process_fn = (__typeof__(process_fn))fns[3];
    get_timer_fn = (__typeof__(get_timer_fn))fns[4];
    hand_back_fn = (__typeof__(hand_back_fn))fns[5];
    take_standby_fn = (__typeof__(take_standby_fn))fns[6];
    arming_fn = (__typeof__(arming_fn))fns[7];
    req_notify_fn = (__typeof__(req_notify_fn))fns[8];
    take_arm_fn = (__typeof__(take_arm_fn))fns[9];
    look_again_fn = (__typeof__(look_again_fn))fns[10];
    Py_INCREF(args[4]);
    Py_XSETREF(str_app, args[4]);
    Py_INCREF(args[5]);
    Py_XSETREF(spin_most, args[5]);
    longest_sleep = PyFloat_AS_DOUBLE(args[6]);
    Py_RETURN_NONE;
}

static inline double monotonic(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Wakeups.poller == "app" (1), == "bg" (2), None (0), -1 (an error set). */
static int poller_is(WakeupsObj *wake) {
    PyObject *p = wake->_poller;
    if (p == NULL || p == Py_None)
        return 0;
    if (!PyUnicode_Check(p))
        return 1; /* (not ours to judge: the Python's wait) */
    if (p == str_app || PyUnicode_Compare(p, str_app) == 0)
        return 1;
    return PyErr_Occurred() ? -1 : 2;
}

/* A due time of the deferred checks or the idle trim (their float, 0 for none), or -1.0
 * where the object is not the class bound (the wait is then not this case). */
static double due_of(PyObject *obj, PyTypeObject *type) {
    if (obj == NULL || Py_TYPE(obj) != type)
        return -1.0;
    double due = type == checks_type ? ((ChecksObj *)obj)->_due : ((TrimObj *)obj)->_due;
    return due == FLOAT_ERROR ? -1.0 : due;
}

/* How long the poller may sleep (Progress._sleep_on_cq's limit, no deadline of its own): the
 * engine's timer, the deferred checks' and the idle trim's due times, at most LONGEST_SLEEP.
 * Milliseconds (rounded up, as select.epoll.poll does), or -1 (an error set). */
static int sleep_ms(ExecutorObj *ex) {
    double timer = 0.0; /* (0: none) */
    PyObject *t = get_timer_fn(ex->_engine);
    if (t == NULL)
        return -1;
    if (t != Py_None) {
        timer = PyFloat_AsDouble(t);
        if (timer == -1.0 && PyErr_Occurred()) {
            Py_DECREF(t);
            return -1;
        }
    }
    Py_DECREF(t);
    double dues[2] = {due_of(ex->_checks, checks_type), due_of(ex->_trim, trim_type)};
    for (int i = 0; i < 2; i++)
        if (dues[i] > 0.0 && (timer == 0.0 || dues[i] < timer))
            timer = dues[i];
    double limit = longest_sleep;
    if (timer != 0.0) {
        double left = timer - monotonic();
        limit = left < limit ? (left > 0.0 ? left : 0.0) : limit;
        if (limit == 0.0)
            ex->_timer_check = 0.0; /* due now: process() must run the timers */
    }
    double ms = limit * 1000.0;
    int whole = (int)ms;
    return whole + (ms > (double)whole);
}

/* One round of Progress._app_poll with _sleep_on_cq's no-spin case, for the calling
 * application thread (the runtime's lock held; the caller made it the poller): armed, looked
 * at, asleep on the pollers' epoll descriptor with the lock and the GIL let go where nothing
 * came, the news processed.  0, or -1 (an error set; the lock held again). */
static int poll_round(ProgressObj *pr, ExecutorObj *ex, CqObj *cq, int epfd, int cq_fd) {
    /* (the methods of the exact class checked: take_standby, arming, req_notify, take_arm) */
    if (take_standby_fn((PyObject *)cq) == 2 || arming_fn((PyObject *)cq) == 2 ||
        req_notify_fn((PyObject *)cq, tag(ARM_SLEEPER)) == 2)
        return -1;
    PyObject *wcs = cq_poll_fn((PyObject *)cq, tag(64)); /* (Executor.look's most) */
    if (wcs == NULL)
        return -1;
    int some = PyObject_IsTrue(wcs);
    if (some < 0 || (some && take_arm_fn((PyObject *)cq) == CPY_INT_TAG)) {
        Py_DECREF(wcs);
        return -1;
    }
    if (!some) {
        int ms = sleep_ms(ex);
        if (ms < 0) {
            Py_DECREF(wcs);
            return -1;
        }
        struct epoll_event events[MAX_EVENTS];
        int n, err = 0;
        if (smcr_lock_give(ex->_lock) < 0) {
            Py_DECREF(wcs);
            return -1;
        }
        Py_BEGIN_ALLOW_THREADS
        n = epoll_wait(epfd, events, MAX_EVENTS, ms);
        err = errno;
        Py_END_ALLOW_THREADS
        if (smcr_lock_take(ex->_lock) < 0) {
            Py_DECREF(wcs);
            return -1;
        }
        if (n < 0) {
            if (err != EINTR) {
                errno = err;
                PyErr_SetFromErrno(PyExc_OSError);
                Py_DECREF(wcs);
                return -1;
            }
            if (PyErr_CheckSignals() < 0) { /* (a handler's exception, as the poll's) */
                Py_DECREF(wcs);
                return -1;
            }
            n = 0;
        }
        for (int i = 0; i < n; i++) {
            if (events[i].data.fd == cq_fd)
                continue; /* (edge-triggered: nothing to drain) */
            PyObject *fd = PyLong_FromLong(events[i].data.fd);
            PyObject *r = fd == NULL ? NULL
                : PyObject_CallMethodObjArgs((PyObject *)pr, str_woke, fd, Py_False, NULL);
            Py_XDECREF(fd);
            if (r == NULL) {
                Py_DECREF(wcs);
                return -1;
            }
            Py_DECREF(r);
        }
    }
    char done = process_fn((PyObject *)ex, wcs);
    Py_DECREF(wcs);
    return done == 2 ? -1 : 0; /* (2: mypyc's error value of a function returning None) */
}

/* c.readable(need): 1, 0, or -1 (an error set). */
static int readable(PyObject *c, CPyTagged need) {
    char yes = readable_fn(c, need);
    return yes == 2 ? -1 : yes;
}

/* wait_readable(datapath, c, need) -> True once c.readable(need), the wait done in C; False
 * where it is not its case (Progress.wait then waits, from where this left it).
 *
 * Progress.wait for a blocking read (DataPath.read_waiting: the reader's lock and the
 * runtime's held, no deadline) where no spin is allowed (a crowded host, SMCR_SPIN_US=0, or
 * pauses after spins that found nothing), on an shm CQ whose signals are edges: each round
 * as _app_poll and _sleep_on_cq take it (the poller's role, the standby's arm taken, the
 * doorbell drained every DRAIN_EVERY arms, armed for the sleeper and looked at once more,
 * the arm taken back if that look found news, else asleep on the pollers' epoll descriptor
 * until news or the next timer, with the lock and the GIL let go; what woke it other than
 * the CQ handled by Progress.woke; the news processed; the role given up), then
 * Progress._hand_back and, at exit, _park_at_exit.  Another application thread polling, a
 * spin allowed, or anything not its case: False at the start of a round, nothing of it
 * done.  Why in C: the Python's rounds cost a blocked reader about two microseconds of CPU
 * per message in calls, boxed floats and lists, which a busy host's round trip pays at both
 * ends (its CPU is the round trip's time there). */
static PyObject *wait_readable(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "wait_readable takes 3 arguments");
        return NULL;
    }
    if (progress_type == NULL || datapath_type == NULL || Py_TYPE(args[0]) != datapath_type ||
        Py_TYPE(args[1]) != conn_type || !PyLong_CheckExact(args[2]))
        Py_RETURN_FALSE;
    DataPathObj *dp = (DataPathObj *)args[0];
    PyObject *c = args[1];
    int overflow = 0;
    long long need_value = PyLong_AsLongLongAndOverflow(args[2], &overflow);
    if (overflow || need_value < 0 || !fits((int64_t)need_value))
        Py_RETURN_FALSE;
    CPyTagged need = tag((int64_t)need_value);
    if (dp->_ex == NULL || Py_TYPE(dp->_ex) != executor_type || dp->_progress == NULL ||
        Py_TYPE(dp->_progress) != progress_type || dp->_hc == NULL)
        Py_RETURN_FALSE;
    ExecutorObj *ex = (ExecutorObj *)dp->_ex;
    ProgressObj *pr = (ProgressObj *)dp->_progress;
    if (pr->_ex != (PyObject *)ex || ex->_wake == NULL || Py_TYPE(ex->_wake) != wakeups_type ||
        ex->_cq == NULL || Py_TYPE(ex->_cq) != cq_type || ex->_lock == NULL ||
        ex->_engine == NULL || Py_TYPE(ex->_engine) != engine_type || pr->_spin == NULL ||
        Py_TYPE(pr->_spin) != spin_type ||
        !short_int(pr->_sleep_app_fd) || !short_int(pr->__cq_fd) ||
        due_of(ex->_checks, checks_type) < 0.0 || due_of(ex->_trim, trim_type) < 0.0)
        Py_RETURN_FALSE;
    CqObj *cq = (CqObj *)ex->_cq;
    WakeupsObj *wake = (WakeupsObj *)ex->_wake;
    unsigned long ident = PyThread_get_thread_ident();
    if (cq->_edge_signals != 1 || cq->_pollers_receive != 0 || !short_int(wake->_waiting) ||
        (int64_t)ident < 0 || !fits((int64_t)ident))
        Py_RETURN_FALSE;
    int epfd = (int)untag(pr->_sleep_app_fd), cq_fd = (int)untag(pr->__cq_fd);
    double began = 0.0, most = PyFloat_AS_DOUBLE(spin_most);
    int ready = 0, failed = 0;
    Py_INCREF(ex);
    Py_INCREF(pr);
    Py_INCREF(cq);
    Py_INCREF(wake);
    Py_INCREF(c);
    for (;;) {
        ready = readable(c, need);
        if (ready != 0) {
            failed = ready < 0;
            break;
        }
        int who = poller_is(wake);
        if (who != 0 && who != 2) { /* another application thread polls: the Python waits */
            failed = who < 0;
            break;
        }
        if (most > 0.0) { /* (SPIN 0: no spin ever, and no policy asked) */
            double allowed = allowance_fn(pr->_spin, most, wake->_waiting);
            if (allowed != 0.0) { /* (a spin: the Python's) */
                failed = allowed == FLOAT_ERROR && PyErr_Occurred() != NULL;
                break;
            }
        }
        if (began == 0.0)
            began = monotonic();
        if (who == 2 && call0(ex->_wake, str_kick_progress) < 0) {
            failed = 1;
            break;
        }
        Py_INCREF(str_app);
        Py_XSETREF(wake->_poller, str_app);
        wake->_poller_ident = tag((int64_t)ident);
        int bad = poll_round(pr, ex, cq, epfd, cq_fd);
        Py_INCREF(Py_None); /* (the role given up, whatever happened: _app_poll's finally) */
        Py_XSETREF(wake->_poller, Py_None);
        wake->_app_polled = monotonic();
        if (bad) {
            failed = 1;
            break;
        }
    }
    if (!failed && ready == 1 && began != 0.0 && hand_back_fn((PyObject *)pr, began) == 2)
        failed = 1; /* (else the Python's wait hands back) */
    if (!failed && ready == 1 && pr->_exiting == 1) {
        PyObject *r = PyObject_CallMethodOneArg((PyObject *)pr, str_park_at_exit, dp->_hc);
        if (r == NULL)
            failed = 1;
        Py_XDECREF(r);
    }
    Py_DECREF(ex);
    Py_DECREF(pr);
    Py_DECREF(cq);
    Py_DECREF(wake);
    Py_DECREF(c);
    if (failed)
        return NULL;
    return PyBool_FromLong(ready == 1);
}

static PyMethodDef methods[] = {
    {"bind", (PyCFunction)(void (*)(void))bind, METH_FASTCALL,
     "The compiled classes the lane reads (module doc)."},
    {"take_cdc", (PyCFunction)(void (*)(void))take_cdc, METH_FASTCALL,
     "A CDC read in place, its common case (module doc)."},
    {"take_run", (PyCFunction)(void (*)(void))take_run, METH_FASTCALL,
     "The CDCs of a receive ring that take_cdc would take, in one call (module doc)."},
    {"send_inline", (PyCFunction)(void (*)(void))send_inline, METH_FASTCALL,
     "A send's WRITEs and CDC, its common case, posted in one call (module doc)."},
    {"bind_taker", (PyCFunction)(void (*)(void))bind_taker, METH_FASTCALL,
     "The runtime's classes ring_take reads; its capsule (see there)."},
    {"bind_sender", (PyCFunction)(void (*)(void))bind_sender, METH_FASTCALL,
     "The runtime's classes send_now reads (see there)."},
    {"send_now", (PyCFunction)(void (*)(void))send_now, METH_FASTCALL,
     "A send's common case, whole: the lock, the post, the ring (see there)."},
    {"read_fast", (PyCFunction)(void (*)(void))read_fast, METH_FASTCALL,
     "A read's common case: bytes copied out of the RMB and consumed (see there)."},
    {"bind_reader", (PyCFunction)(void (*)(void))bind_reader, METH_FASTCALL,
     "The runtime's classes follow and read_now read (see there)."},
    {"follow", (PyCFunction)(void (*)(void))follow, METH_FASTCALL,
     "Readiness.follow's common case (see there)."},
    {"read_now", (PyCFunction)(void (*)(void))read_now, METH_FASTCALL,
     "A read's common case, whole: the lock, the bytes, the readiness (see there)."},
    {"bind_waiter", (PyCFunction)(void (*)(void))bind_waiter, METH_FASTCALL,
     "Bind the classes, constants and compiled methods wait_readable uses."},
    {"wait_readable", (PyCFunction)(void (*)(void))wait_readable, METH_FASTCALL,
     "A blocking read's wait without spinning, in C (see there)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_lane",
    "The per-connection fast lane in C (see the source's head).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__lane(void) {
    str_append = PyUnicode_InternFromString("append");
    str_pop = PyUnicode_InternFromString("pop");
    str_take_standby = PyUnicode_InternFromString("take_standby");
    str_look_again = PyUnicode_InternFromString("look_again");
    str_dispatch_events = PyUnicode_InternFromString("_dispatch_events");
    str_send_ended = PyUnicode_InternFromString("send_ended");
    str_ring_held = PyUnicode_InternFromString("ring_held");
    str_sndbuf = PyUnicode_InternFromString("sndbuf");
    str_corked = PyUnicode_InternFromString("corked");
    str_follow = PyUnicode_InternFromString("follow");
    str_buf = PyUnicode_InternFromString("buf");
    str_poll = PyUnicode_InternFromString("poll");
    str_process = PyUnicode_InternFromString("process");
    str_check = PyUnicode_InternFromString("check");
    str_unchecked = PyUnicode_InternFromString("unchecked");
    str_add = PyUnicode_InternFromString("add");
    str_queued = PyUnicode_InternFromString("_queued");
    str_ring_self = PyUnicode_InternFromString("_ring_self");
    poll_most = PyLong_FromLong(64);
    str_park_at_exit = PyUnicode_InternFromString("_park_at_exit");
    str_woke = PyUnicode_InternFromString("woke");
    str_kick_progress = PyUnicode_InternFromString("kick_progress");
    if (str_park_at_exit == NULL || str_woke == NULL || str_kick_progress == NULL)
        return NULL;
    if (str_add == NULL || str_queued == NULL || str_ring_self == NULL)
        return NULL;
    if (str_follow == NULL || str_buf == NULL || str_poll == NULL || str_process == NULL ||
        str_check == NULL || str_unchecked == NULL || poll_most == NULL)
        return NULL;
    if (str_sndbuf == NULL || str_corked == NULL)
        return NULL;
    if (str_append == NULL || str_pop == NULL || str_take_standby == NULL || str_look_again == NULL ||
        str_dispatch_events == NULL || str_send_ended == NULL || str_ring_held == NULL)
        return NULL;
    if (smcr_locks_bind() < 0)
        return NULL;
    return PyModule_Create(&module);
}
