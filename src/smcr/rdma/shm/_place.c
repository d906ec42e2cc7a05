/* The shm RNIC's fused send in C: the checks and stores of ShmQp._post_writes_send's
 * common case (the data path's WRITEs and the CDC behind them) and of _notify's look at
 * the peer CQ's words.
 *
 * Why C: per message the Python of these steps costs a few microseconds (a tuple of the
 * peer's header, a list of targets, half a dozen struct packs and unpacks, slices, a lock
 * round trip for the fence), several times the copies and stores themselves.  The
 * protocol stays in Python: place_send does what the Python fast branch does, in the same
 * order, with the values its caller looked up (the peer MR of the WRITEs), and says -1
 * where that branch would hand over to the generic post (nothing written then);
 * look_peer does the stores and loads of _notify and says whom to ring, the ringing
 * itself (socket calls) staying with the caller.  tests/rdma/test_shm_place_c.py runs
 * both against each other.
 *
 * post_inline, for C callers (the stack's fast lane, through the capsule POST_INLINE), does
 * the whole common case on the QP object itself: the header mypyc generates for the build
 * gives the structs of the compiled classes (smcr.nativebuild.ON_MYPYC_HEADER), so it reads
 * and writes their fields where the compiled Python does (tests/stack/test_lane_send.py).
 * drain_in_place does the receive side's counterpart on a poll: the SENDs a requester
 * placed, taken where they lie by the receiver's C run (tests/stack/test_lane_drain.py).
 *
 * The peer's area is written by another process: everything read from it is checked
 * before use, as the Python does (a hostile peer gets a refusal, not a wild store).
 *
 * load_u32/load_u64/store_u32/store_u64/fence serve smcr.rdma.shm.words: a word of memory
 * another process shares, read or written in one call and one aligned access (the struct
 * unpack, or the pack and slice assignment, and the lock round trip for the fence, cost
 * the receive path's hooks a good part of their time).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <endian.h>
#include <stdint.h>
#include <string.h>

#include "__native_smcr_native.h"
#include "../../_locks.h"

#define PSN_MASK 0xFFFFFFu
#define REMOTE_WRITE 2u /* AccessFlag.REMOTE_WRITE */
#define QPS_RTR 2u
#define QPS_RTS 3u
#define AREA_HEADER_SIZE 64
#define OFF_ACCESS 4
#define OFF_PD 16
#define OFF_EPSN 28
#define OFF_POSTED 32
#define OFF_PRODUCED 40
#define SLOT_HEADER_SIZE 16
#define KIND_SEND 1u
#define ARM_SLEEPER 1u
#define ARM_STANDBY 2u

static inline uint32_t ld32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline uint64_t ld64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static inline void st32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }

static inline uint64_t packets(uint64_t n, uint64_t mtu) { return n ? (n + mtu - 1) / mtu : 1; }

/* place_send(area, table, view, data, data2, message, psn, produced, depth, slot_size, mtu,
 *            limit, iova, end, allowed, pd, mr_offset, seal, generation, addr, addr2)
 *   -> the next PSN, or -1: a check failed and nothing was written.
 *
 * area: the peer QP's receive area (writable); table: the peer's MR table; view: the peer
 * MR the WRITEs go to (writable), with its iova, end, allowed access, pd, table entry
 * offset, seal and generation as looked up; data at addr, then data2 at addr2 (None: one
 * WRITE; data None: none, the MR arguments unused); message: the SEND behind them.  psn,
 * produced: the requester's. */
/* The checks and stores of one fused send (place_send, post_inline): -1 where a check fails
 * (nothing written), else the next PSN.  a: the peer QP's receive area (alen bytes); t: the
 * peer's MR table; dst: the peer MR the WRITEs go to (vlen bytes, iova..end, allowed access,
 * pd, its table entry at mr_offset with seal and generation); d1 (n1 bytes) at addr, then d2
 * (n2) at addr2 (count 0, 1 or 2 of them); msg: the SEND behind them. */
static long place_core(unsigned char *a, uint64_t alen, const unsigned char *t, uint64_t tlen,
                       unsigned char *dst, uint64_t vlen, int count, const void *d1, uint64_t n1,
                       uint64_t addr, const void *d2, uint64_t n2, uint64_t addr2,
                       const void *msg, uint64_t size, uint64_t psn, uint64_t produced,
                       uint64_t depth, uint64_t slot_size, uint64_t mtu, uint64_t limit,
                       uint64_t iova, uint64_t end, uint64_t allowed, uint64_t pd,
                       uint64_t mr_offset, uint32_t seal, uint32_t generation) {
    if (!depth || !mtu || depth > alen || slot_size > alen)
        return -1;
    uint64_t idx = produced % depth;
    uint64_t lens_end = AREA_HEADER_SIZE + 4 * depth;
    uint64_t slot = lens_end + idx * (SLOT_HEADER_SIZE + slot_size);
    if (alen < AREA_HEADER_SIZE || lens_end > alen || size > alen ||
        slot + SLOT_HEADER_SIZE + size > alen)
        return -1;
    uint32_t state = ld32(a);
    if ((state != QPS_RTR && state != QPS_RTS) || ld32(a + OFF_EPSN) != psn ||
        ld64(a + OFF_POSTED) == produced || !(ld32(a + OFF_ACCESS) & REMOTE_WRITE) ||
        size > slot_size || size > ld32(a + AREA_HEADER_SIZE + 4 * idx))
        return -1;
    if (count) { /* the WRITEs' target, as the Python checks each WRITE (one peer MR) */
        if (count < 2)
            n2 = 0;
        if (n1 > limit || addr < iova || addr + n1 > end ||
            (count > 1 && (n2 > limit || addr2 < iova || addr2 + n2 > end)) ||
            !(allowed & REMOTE_WRITE) || pd != ld32(a + OFF_PD) || mr_offset + 8 > tlen ||
            mr_offset + 8 < mr_offset || ld32(t + mr_offset) != seal ||
            ld32(t + mr_offset + 4) != generation || end < iova || end - iova > vlen)
            return -1;
        memcpy(dst + (addr - iova), d1, n1);
        psn += packets(n1, mtu);
        if (count > 1) {
            memcpy(dst + (addr2 - iova), d2, n2);
            psn += packets(n2, mtu);
        }
    }
    memcpy(a + slot + SLOT_HEADER_SIZE, msg, size);
    psn = (psn + packets(size, mtu)) & PSN_MASK;
    uint32_t header[4] = {(uint32_t)size, KIND_SEND, 0, 0};
    memcpy(a + slot, header, sizeof header);
    /* produced after what it covers (a release store: the compiler keeps the order; x86
     * keeps stores in order), then the PSN the peer expects next */
    __atomic_store_n((uint64_t *)(a + OFF_PRODUCED), produced + 1, __ATOMIC_RELEASE);
    st32(a + OFF_EPSN, (uint32_t)psn);
    return (long)psn;
}

/* place_send(area, table, view, data, data2, message, psn, produced, depth, slot_size, mtu,
 *            limit, iova, end, allowed, pd, mr_offset, seal, generation, addr, addr2)
 *   -> the next PSN, or -1: a check failed and nothing was written.
 *
 * area: the peer QP's receive area (writable); table: the peer's MR table; view: the peer
 * MR the WRITEs go to (writable), with its iova, end, allowed access, pd, table entry
 * offset, seal and generation as looked up; data at addr, then data2 at addr2 (None: one
 * WRITE; data None: none, the MR arguments unused); message: the SEND behind them.  psn,
 * produced: the requester's. */
static PyObject *place_send(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 21) {
        PyErr_SetString(PyExc_TypeError, "place_send takes 21 arguments");
        return NULL;
    }
    long long v[15];
    for (int i = 0; i < 15; i++) {
        v[i] = PyLong_AsLongLong(args[6 + i]);
        if (v[i] == -1 && PyErr_Occurred())
            return NULL;
    }
    for (int i = 0; i < 15; i++)
        if (v[i] < 0)
            return PyLong_FromLong(-1);

    long result = -1;
    Py_buffer area, table, view, data, data2, message;
    int have1 = args[3] != Py_None, have2 = have1 && args[4] != Py_None;
    if (PyObject_GetBuffer(args[0], &area, PyBUF_WRITABLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[1], &table, PyBUF_SIMPLE) < 0)
        goto fail_area;
    if (have1 && PyObject_GetBuffer(args[2], &view, PyBUF_WRITABLE) < 0)
        goto fail_table;
    if (have1 && PyObject_GetBuffer(args[3], &data, PyBUF_SIMPLE) < 0)
        goto fail_view;
    if (have2 && PyObject_GetBuffer(args[4], &data2, PyBUF_SIMPLE) < 0)
        goto fail_data;
    if (PyObject_GetBuffer(args[5], &message, PyBUF_SIMPLE) < 0)
        goto fail_data2;
    result = place_core(area.buf, (uint64_t)area.len, table.buf, (uint64_t)table.len,
                        have1 ? view.buf : NULL, have1 ? (uint64_t)view.len : 0,
                        have1 + have2, have1 ? data.buf : NULL, have1 ? (uint64_t)data.len : 0,
                        (uint64_t)v[13], have2 ? data2.buf : NULL,
                        have2 ? (uint64_t)data2.len : 0, (uint64_t)v[14], message.buf,
                        (uint64_t)message.len, (uint64_t)v[0], (uint64_t)v[1], (uint64_t)v[2],
                        (uint64_t)v[3], (uint64_t)v[4], (uint64_t)v[5], (uint64_t)v[6],
                        (uint64_t)v[7], (uint64_t)v[8], (uint64_t)v[9], (uint64_t)v[10],
                        (uint32_t)v[11], (uint32_t)v[12]);
    PyBuffer_Release(&message);
fail_data2:
    if (have2)
        PyBuffer_Release(&data2);
fail_data:
    if (have1)
        PyBuffer_Release(&data);
fail_view:
    if (have1)
        PyBuffer_Release(&view);
fail_table:
    PyBuffer_Release(&table);
fail_area:
    PyBuffer_Release(&area);
    if (PyErr_Occurred())
        return NULL;
    return PyLong_FromLong(result);
}

/* look_peer(notify, mark, wake, watches, watch_mask, bells) -> whom to ring
 *   0: nobody (the CQ is not armed: a poller is awake);
 *   1: the CQ's doorbell, 2: its standby doorbell (the arm word taken, by a compare and
 *   exchange: the door is that of the value taken);
 *   rid << 2 | 1 or 2: the consumer bell of readiness rid (its watch word cleared, the
 *   arm word left), or if that cannot be rung the doorbell the low bits name (the arm word
 *   still left: a ring beside an arm is a spurious wake-up at most).
 * After a SEND was placed: the peer QP's mark byte set, a full fence, the CQ's arm word
 * and, for a SEND keyed wake (0: none) while the CQ is armed for no application thread and
 * the peer rings by name (bells), the watch word of wake. */
/* look_peer's loads and stores on a notification segment n of len bytes (checked by the
 * caller: at least 4, mark within). */
static long long look_core(unsigned char *n, long long len, long long mark, long long wake,
                           long long watches, long long mask, int bells) {
    long long result = 0;
    if (mark)
        __atomic_store_n(n + mark, (unsigned char)1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    uint32_t target = __atomic_load_n((uint32_t *)n, __ATOMIC_RELAXED);
    if (target) {
        long long door = target == ARM_STANDBY ? 2 : 1;
        if (wake && target != ARM_SLEEPER && bells && watches >= 0) {
            long long at = watches + 4 * (wake & mask);
            if (at + 4 <= len) {
                uint32_t rid = __atomic_load_n((uint32_t *)(n + at), __ATOMIC_RELAXED);
                if (rid) {
                    __atomic_store_n((uint32_t *)(n + at), 0u, __ATOMIC_RELAXED);
                    result = ((long long)rid << 2) | door;
                }
            }
        }
        if (!result) {
            /* taken only as the value read, atomically: a plain store of 0 after the load
             * erased an arm the consumer made between the two (its poller's 1 over the 2 of
             * the standby it took back), and rang the door of the old one: the poller slept
             * on, its news in the queue, until a timeout. */
            uint32_t seen = target;
            while (seen && !__atomic_compare_exchange_n((uint32_t *)n, &seen, 0u, 0,
                                                        __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
                ;
            result = !seen ? 0 : seen == ARM_STANDBY ? 2 : 1;
        }
    }
    return result;
}

/* The word of `width` bytes at offset args[1] of the buffer args[0] (flags: PyBUF_SIMPLE to
 * read, PyBUF_WRITABLE to write): 0 and *at set, the view held; -1 with an error (a closed
 * mmap's ValueError, as struct's unpack_from gives; ValueError for an offset outside). */
static int word_at(PyObject *const *args, Py_ssize_t width, int flags, Py_buffer *view,
                   unsigned char **at) {
    Py_ssize_t off = PyLong_AsSsize_t(args[1]);
    if (off == -1 && PyErr_Occurred())
        return -1;
    if (PyObject_GetBuffer(args[0], view, flags) < 0)
        return -1;
    if (off < 0 || off > view->len - width) {
        PyErr_Format(PyExc_ValueError, "a %zd-byte word at %zd is outside %zd bytes", width,
                     off, view->len);
        PyBuffer_Release(view);
        return -1;
    }
    *at = (unsigned char *)view->buf + off;
    return 0;
}

static int word_args(Py_ssize_t nargs, Py_ssize_t want, const char *name) {
    if (nargs == want)
        return 0;
    PyErr_Format(PyExc_TypeError, "%s takes %zd arguments", name, want);
    return -1;
}

/* The little-endian word of `width` bytes (4 or 8) at args[1] of args[0], read in one load
 * where aligned. */
static PyObject *load_word(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t width,
                           const char *name) {
    Py_buffer view;
    unsigned char *p;
    if (word_args(nargs, 2, name) < 0 || word_at(args, width, PyBUF_SIMPLE, &view, &p) < 0)
        return NULL;
    uint64_t v;
    if (width == 4) {
        uint32_t w;
        if (((uintptr_t)p & 3) == 0)
            w = __atomic_load_n((const uint32_t *)p, __ATOMIC_RELAXED);
        else
            memcpy(&w, p, 4);
        v = le32toh(w);
    } else {
        if (((uintptr_t)p & 7) == 0)
            v = __atomic_load_n((const uint64_t *)p, __ATOMIC_RELAXED);
        else
            memcpy(&v, p, 8);
        v = le64toh(v);
    }
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLongLong(v);
}

/* args[2] written as the little-endian word of `width` bytes (4 or 8) at args[1] of args[0],
 * in one store where aligned (a reader sees the old value or the new, never a mix). */
static PyObject *store_word(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t width,
                            const char *name) {
    if (word_args(nargs, 3, name) < 0)
        return NULL;
    unsigned long long value = PyLong_AsUnsignedLongLong(args[2]);
    if (value == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    if (width == 4 && value > 0xFFFFFFFFull) {
        PyErr_SetString(PyExc_OverflowError, "a u32 is at most 0xFFFFFFFF");
        return NULL;
    }
    Py_buffer view;
    unsigned char *p;
    if (word_at(args, width, PyBUF_WRITABLE, &view, &p) < 0)
        return NULL;
    if (width == 4) {
        uint32_t w = htole32((uint32_t)value);
        if (((uintptr_t)p & 3) == 0)
            __atomic_store_n((uint32_t *)p, w, __ATOMIC_RELAXED);
        else
            memcpy(p, &w, 4);
    } else {
        uint64_t w = htole64((uint64_t)value);
        if (((uintptr_t)p & 7) == 0)
            __atomic_store_n((uint64_t *)p, w, __ATOMIC_RELAXED);
        else
            memcpy(p, &w, 8);
    }
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

static PyObject *load_u32(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    return load_word(args, nargs, 4, "load_u32");
}

static PyObject *load_u64(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    return load_word(args, nargs, 8, "load_u64");
}

static PyObject *store_u32(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    return store_word(args, nargs, 4, "store_u32");
}

static PyObject *store_u64(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    return store_word(args, nargs, 8, "store_u64");
}

/* fence(): a full memory barrier */
static PyObject *full_fence(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    (void)args;
    if (word_args(nargs, 0, "fence") < 0)
        return NULL;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    Py_RETURN_NONE;
}

static PyObject *look_peer(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "look_peer takes 6 arguments");
        return NULL;
    }
    long long mark = PyLong_AsLongLong(args[1]), wake = PyLong_AsLongLong(args[2]);
    long long watches = PyLong_AsLongLong(args[3]), mask = PyLong_AsLongLong(args[4]);
    if (PyErr_Occurred())
        return NULL;
    int bells = PyObject_IsTrue(args[5]);
    if (bells < 0)
        return NULL;
    Py_buffer notify;
    if (PyObject_GetBuffer(args[0], &notify, PyBUF_WRITABLE) < 0)
        return NULL;
    long long len = (long long)notify.len;
    if (len < 4 || mark < 0 || mark >= len) {
        PyBuffer_Release(&notify);
        PyErr_SetString(PyExc_ValueError, "notification segment too short");
        return NULL;
    }
    long long result = look_core(notify.buf, len, mark, wake, watches, mask, bells);
    PyBuffer_Release(&notify);
    return PyLong_FromLongLong(result);
}

/* ------------------------------------------------------------- post_inline, for the lane
 *
 * ShmQp._post_writes_send's common case on the QP object itself, for C callers (the stack's
 * fast lane, smcr.stack._lane): reached through the capsule POST_INLINE once bind() named the
 * compiled classes.  It reads and writes the QP's fields where the compiled Python does
 * (the struct layouts of the header mypyc generates for the build), under the QP's state
 * lock (taken without waiting: held elsewhere, the caller's Python does the post).  The
 * ringing stays with the caller (socket calls): it gets whom to ring, as look_peer says. */

typedef smcr___rdma___shm___qp___ShmQpObject QpObj;
typedef smcr___rdma___shm___peer___PeerLinkObject PeerObj;
typedef smcr___rdma___shm___peer___RemoteMrObject MrObj;
typedef smcr___rdma___verbs___QpAttrObject AttrObj;

/* The capsule's ABI (a copy of it is in smcr/stack/_lane.c; the capsule's name says which). */
typedef struct {
    const void *data;
    Py_ssize_t n;
    uint64_t addr;
} smcr_write;
/* -> whom to ring (>= 0: look_peer's value, a rid of 32 bits shifted left by two), -1 not
 *    the common case (nothing written, nothing changed), -2 an error (set; nothing written);
 *    whom | PLACED_ERROR: placed and its completion pushed, but the push met an error (set,
 *    for the caller to raise once it has made its own stores and rung whom).
 * signaled: the SEND's WR id where it is signaled (its completion pushed once placed), or
 * NULL. */
typedef int64_t (*smcr_post_inline)(PyObject *qp, const smcr_write *writes, int count,
                                uint32_t rkey, const unsigned char *msg, Py_ssize_t size,
                                uint32_t wake, PyObject *signaled);
#define PLACED_ERROR ((int64_t)1 << 62)
#define POST_INLINE_NAME "smcr.rdma.shm._place.POST_INLINE.v4"

static PyTypeObject *qp_type, *peer_type, *mr_type, *attr_type;
static PyObject *rts_state;                /* QpState.RTS */
static long long watches_at, watch_mask;   /* smcr.rdma.bells.WATCHES, WATCH_MASK */
static PyObject *sent_signaled;            /* smcr.rdma.shm.send.sent_signaled */

static inline int short_int(CPyTagged t) { return (t & 1) == 0; }
static inline int64_t untag(CPyTagged t) { return (int64_t)(Py_ssize_t)t >> 1; }
static inline CPyTagged tag(int64_t v) { return (CPyTagged)((Py_ssize_t)v << 1); }

/* Whether every tagged int is a short one, not negative. */
static int all_short(const CPyTagged *ts, size_t count) {
    for (size_t i = 0; i < count; i++)
        if (!short_int(ts[i]) || untag(ts[i]) < 0)
            return 0;
    return 1;
}

/* A placed signaled SEND's completion (send.sent_signaled), the state lock held: 1, or 0
 * with an error set that the push met.  The bytes went, so the completion must not be lost
 * (a write-blocked sender waits for it): a push that fails (memory; an exception a signal
 * handler raised) is made once more with the error set aside, then the error restored. */
static int push_completion(QpObj *qp, PyObject *wr_id, Py_ssize_t size) {
    PyObject *done = PyObject_CallFunction(sent_signaled, "OOn", (PyObject *)qp, wr_id, size);
    if (done != NULL) {
        Py_DECREF(done);
        return 1;
    }
    PyObject *type, *value, *trace;
    PyErr_Fetch(&type, &value, &trace);
    done = PyObject_CallFunction(sent_signaled, "OOn", (PyObject *)qp, wr_id, size);
    if (done == NULL) /* (lost after all: nothing left to try) */
        PyErr_WriteUnraisable(sent_signaled);
    Py_XDECREF(done);
    PyErr_Restore(type, value, trace);
    return 0;
}

/* The placing, the lock held and the QP looked at: -1, -2 or whom (post_inline). */
static int64_t post_locked(QpObj *qp, const smcr_write *w, int count, uint32_t rkey,
                       const unsigned char *msg, Py_ssize_t size, uint32_t wake,
                       PyObject *signaled) {
    PyObject *attr_obj = qp->_attr, *peer_obj = qp->__peer;
    if (attr_obj == NULL || Py_TYPE(attr_obj) != attr_type || peer_obj == NULL ||
        Py_TYPE(peer_obj) != peer_type || qp->__sq == NULL || qp->__timer != Py_None)
        return -1;
    AttrObj *attr = (AttrObj *)attr_obj;
    PeerObj *peer = (PeerObj *)peer_obj;
    if (attr->_qp_state != rts_state)
        return -1;
    Py_ssize_t queued = PyObject_Length(qp->__sq);
    if (queued != 0)
        return queued < 0 ? -2 : -1;
    CPyTagged ts[] = {qp->__produced, qp->__next_psn, qp->__mtu, qp->__max_inline,
                      qp->__retry_left, qp->__rnr_left, attr->_retry_cnt, attr->_rnr_retry,
                      peer->_depth, peer->_slot_size, peer->_mark};
    if (!all_short(ts, sizeof ts / sizeof ts[0]) || peer->_area == NULL ||
        peer->_table == NULL || peer->_mrs == NULL || !PyDict_CheckExact(peer->_mrs) ||
        peer->_notify == NULL || peer->_bells == NULL || !PyBytes_CheckExact(peer->_bells) ||
        count < 0 || count > 2 || size < 0)
        return -1;
    MrObj *mr = NULL;
    if (count) {
        PyObject *key = PyLong_FromUnsignedLong(rkey);
        if (key == NULL)
            return -2;
        PyObject *found = PyDict_GetItemWithError(peer->_mrs, key); /* borrowed */
        Py_DECREF(key);
        if (found == NULL)
            return PyErr_Occurred() ? -2 : -1;
        if (Py_TYPE(found) != mr_type)
            return -1;
        mr = (MrObj *)found;
        CPyTagged ms[] = {mr->_iova, mr->_end, mr->_allowed, mr->_pd, mr->_offset, mr->_seal,
                          mr->_generation};
        if (!all_short(ms, sizeof ms / sizeof ms[0]) || mr->_view == NULL)
            return -1;
        for (int i = 0; i < count; i++)
            if (w[i].n < 0 || w[i].addr >= ((uint64_t)1 << 62))
                return -1;
    }
    int64_t result = -2;
    Py_buffer area, table, view;
    if (PyObject_GetBuffer(peer->_area, &area, PyBUF_WRITABLE) < 0)
        return -2;
    if (PyObject_GetBuffer(peer->_table, &table, PyBUF_SIMPLE) < 0)
        goto release_area;
    if (mr != NULL && PyObject_GetBuffer(mr->_view, &view, PyBUF_WRITABLE) < 0)
        goto release_table;
    long psn = place_core(
        area.buf, (uint64_t)area.len, table.buf, (uint64_t)table.len,
        mr != NULL ? view.buf : NULL, mr != NULL ? (uint64_t)view.len : 0, count,
        count ? w[0].data : NULL, count ? (uint64_t)w[0].n : 0, count ? w[0].addr : 0,
        count > 1 ? w[1].data : NULL, count > 1 ? (uint64_t)w[1].n : 0,
        count > 1 ? w[1].addr : 0, msg, (uint64_t)size, (uint64_t)untag(qp->__next_psn),
        (uint64_t)untag(qp->__produced), (uint64_t)untag(peer->_depth),
        (uint64_t)untag(peer->_slot_size), (uint64_t)untag(qp->__mtu),
        (uint64_t)untag(qp->__max_inline), mr != NULL ? (uint64_t)untag(mr->_iova) : 0,
        mr != NULL ? (uint64_t)untag(mr->_end) : 0,
        mr != NULL ? (uint64_t)untag(mr->_allowed) : 0,
        mr != NULL ? (uint64_t)untag(mr->_pd) : 0, mr != NULL ? (uint64_t)untag(mr->_offset) : 0,
        mr != NULL ? (uint32_t)untag(mr->_seal) : 0,
        mr != NULL ? (uint32_t)untag(mr->_generation) : 0);
    if (psn < 0) {
        result = -1;
    } else { /* _place_in_c's stores after place_send, then send.notify's look */
        qp->__produced = tag(untag(qp->__produced) + 1);
        qp->__next_psn = tag(psn);
        qp->__retry_left = attr->_retry_cnt;
        qp->__rnr_left = attr->_rnr_retry;
        result = 1; /* no notification segment: the CQ's doorbell (send.notify) */
        if (peer->_notify != Py_None) {
            Py_buffer notify;
            if (PyObject_GetBuffer(peer->_notify, &notify, PyBUF_WRITABLE) < 0) {
                /* placed: the peer polls it in time; say so without an error */
                PyErr_Clear();
            } else {
                long long len = (long long)notify.len, mark = untag(peer->_mark);
                if (len >= 4 && mark < len)
                    result = look_core(notify.buf, len, mark, wake, watches_at,
                                            watch_mask, PyBytes_GET_SIZE(peer->_bells) > 0);
                PyBuffer_Release(&notify);
            }
        }
        if (signaled != NULL && !push_completion(qp, signaled, size))
            result |= PLACED_ERROR;
    }
    if (mr != NULL)
        PyBuffer_Release(&view);
release_table:
    PyBuffer_Release(&table);
release_area:
    PyBuffer_Release(&area);
    return result;
}

/* lock.release(), an error pending or not: kept as it was (the release runs, error or
 * not); a release that fails (never for a lock held here) is reported as unraisable. */
static void give_keeping_error(PyObject *lock) {
    PyObject *type, *value, *trace;
    PyErr_Fetch(&type, &value, &trace);
    if (smcr_lock_give(lock) < 0)
        PyErr_WriteUnraisable(lock);
    PyErr_Restore(type, value, trace);
}

static int64_t post_inline(PyObject *qp_obj, const smcr_write *writes, int count, uint32_t rkey,
                       const unsigned char *msg, Py_ssize_t size, uint32_t wake,
                       PyObject *signaled) {
    if (qp_type == NULL || sent_signaled == NULL || Py_TYPE(qp_obj) != qp_type)
        return -1;
    QpObj *qp = (QpObj *)qp_obj;
    if (qp->_hooks != Py_None || qp->_sq_sig_all != 0 || qp->__state_lock == NULL)
        return -1;
    int held = smcr_lock_try(qp->__state_lock);
    if (held < 0)
        return -2;
    if (!held)
        return -1; /* another thread posts or changes the state: the Python waits its turn */
    int64_t result = post_locked(qp, writes, count, rkey, msg, size, wake, signaled);
    give_keeping_error(qp->__state_lock);
    return result;
}

/* ------------------------------------------------------------- drain_in_place, for polls
 *
 * ShmQp._drain's in-place case (_take_in_place) where the QP's receiver has a C form
 * (QueuePair.set_receiver's c_run, the stack's ring_take): the SENDs a requester placed, taken
 * where they lie by one call to it, as the Python's run would, then those it leaves offered
 * to the receiver one by one, as _take_in_place offers them; the QP's counts, the posted
 * word, and the CQ's one TAKEN_IN_PLACE stand-in, as the Python makes them.  Under the QP's
 * receive lock, only within its receive CQ's poll by this thread and with nothing but
 * successful sends' completions waiting in that CQ (CompletionQueue.only_sends_wait: the
 * others made before come first), never past the receives posted.  What the receiver
 * refuses, and every case that is not this one, is the Python's delivery. */

typedef smcr___rdma___completion___CompletionQueueObject CqObj;
typedef smcr___rdma___verbs___WorkCompletionObject WcObj;

/* The RNIC layer's ring-taker ABI (smcr.rdma.base.RingTaker; a copy is in
 * smcr/stack/_lane.c, which provides one; the capsule's name says which). */
typedef long long (*smcr_ring_taker)(PyObject *ctx, long long qpn, unsigned char *area,
                                     long long len, long long lens, long long base,
                                     long long stride, long long depth, long long slot_size,
                                     long long *consumed, long long produced,
                                     long long *posted);
#define RING_TAKER_NAME "smcr.rdma.RING_TAKER.v1"

static PyTypeObject *cq_type;       /* CompletionQueue (a QP's receive CQ is one) */
static PyTypeObject *wc_type;       /* WorkCompletion */
static PyObject *taken_in_place;    /* TAKEN_IN_PLACE */
static PyObject *str_append;

/* The QP's counts and posted word after a run, and the stand-in pushed as push_many(...,
 * notify=False) pushes it (nothing armed is rung, and nothing but the queue and its overrun
 * count changes: an append, atomic under the GIL, needs no CQ lock): 0, or -1 with an
 * error set (the append's). */
static int took(QpObj *qp, CqObj *cq, unsigned char *a, long long consumed, long long posted) {
    qp->__consumed = tag(consumed);
    qp->__posted = tag(posted);
    uint64_t word = htole64((uint64_t)posted);
    __atomic_store_n((uint64_t *)(a + OFF_POSTED), word, __ATOMIC_RELEASE);
    PyObject *r = PyObject_CallMethodOneArg(cq->__wcs, str_append, taken_in_place);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    Py_ssize_t queued = PyObject_Length(cq->__wcs);
    if (queued < 0)
        return -1;
    if (short_int(cq->_depth) && short_int(cq->_overruns) && queued > untag(cq->_depth))
        cq->_overruns = tag(untag(cq->_overruns) + 1);
    return 0;
}

/* The run a capsule holds, or NULL (none, or another ABI's; no error set).  The last one
 * met is kept (and its capsule, so that its address names no other object). */
static smcr_ring_taker ring_taker_of(PyObject *capsule) {
    static PyObject *known;
    static smcr_ring_taker known_run;
    if (capsule == known)
        return known_run;
    if (!PyCapsule_IsValid(capsule, RING_TAKER_NAME))
        return NULL;
    smcr_ring_taker run = (smcr_ring_taker)PyCapsule_GetPointer(capsule, RING_TAKER_NAME);
    Py_INCREF(capsule);
    Py_XSETREF(known, capsule);
    known_run = run;
    return run;
}

/* The requester's produced count in a receive ring's header at a (its release store). */
static inline uint64_t produced_of(const unsigned char *a) {
    return le64toh(__atomic_load_n((const uint64_t *)(a + OFF_PRODUCED), __ATOMIC_ACQUIRE));
}

/* The most waiting completions sends_only looks at (more: as if one were not a send's). */
#define SENDS_LOOKED 16 /* smcr.rdma.completion.SENDS_LOOKED */
#define WC_RECV_BIT 128 /* WcOpcode.RECV's bit: a receive queue's completion */

/* CompletionQueue.only_sends_wait on the n completions waiting in wcs (a deque): whether
 * each is a WorkCompletion of a send queue's WR (opcode without the RECV bit) that
 * succeeded.  1 or 0; -1 with an error set. */
static int sends_only(PyObject *wcs, Py_ssize_t n) {
    if (wc_type == NULL || n > SENDS_LOOKED)
        return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *wc = PySequence_GetItem(wcs, i);
        if (wc == NULL)
            return -1;
        int send = 0;
        if (Py_TYPE(wc) == wc_type) {
            WcObj *w = (WcObj *)wc;
            send = w->_opcode != NULL && PyLong_Check(w->_opcode) && w->_status != NULL &&
                   PyLong_Check(w->_status);
            if (send) {
                long opcode = PyLong_AsLong(w->_opcode), status = PyLong_AsLong(w->_status);
                if ((opcode == -1 || status == -1) && PyErr_Occurred()) {
                    Py_DECREF(wc);
                    return -1;
                }
                send = opcode >= 0 && !(opcode & WC_RECV_BIT) && status == 0;
            }
        }
        Py_DECREF(wc);
        if (!send)
            return 0;
    }
    return 1;
}

/* drain_in_place's answers (smcr.rdma.shm.qp: NOT_IN_C, DRAINED, OFFERED). */
#define NOT_IN_C 0 /* not its case, nothing done: the Python's _drain does it all */
#define DRAINED 1  /* nothing left (all taken, or nothing there) */
#define OFFERED 2  /* taken what the receiver takes; the rest is for the delivery */

/* Under the receive lock, the ring's buffer held: NOT_IN_C, DRAINED or OFFERED, or -1 an
 * error (set).  The receiver, the CQ and the run's context are held (owned) across the
 * calls that may run Python code. */
static int drain_locked(QpObj *qp, unsigned char *a, long long len) {
    PyObject *cq_obj = qp->_recv_cq, *receiver = qp->_receiver, *ctx = qp->_c_taker_ctx;
    if (qp->__fatal_recv != Py_None || qp->__rq == NULL || cq_obj == NULL ||
        !PyObject_TypeCheck(cq_obj, cq_type) || receiver == NULL || receiver == Py_None ||
        qp->_c_taker == NULL || ctx == NULL || qp->__view == NULL)
        return NOT_IN_C;
    smcr_ring_taker run = ring_taker_of(qp->_c_taker);
    CqObj *cq = (CqObj *)cq_obj;
    CPyTagged ts[] = {qp->__consumed, qp->__posted, qp->__depth, qp->__slot_base,
                      qp->__slot_stride, qp->__slot_size, qp->_qp_num};
    if (run == NULL || !all_short(ts, sizeof ts / sizeof ts[0]) || cq->__wcs == NULL)
        return NOT_IN_C;
    Py_ssize_t waiting = PyObject_Length(cq->__wcs), posted_rq = PyObject_Length(qp->__rq);
    if (waiting < 0 || posted_rq < 0)
        return -1;
    if (waiting) { /* (completions made before come first, but for successful sends') */
        int sends = sends_only(cq->__wcs, waiting);
        if (sends <= 0)
            return sends < 0 ? -1 : NOT_IN_C;
    }
    long long consumed = untag(qp->__consumed), posted = untag(qp->__posted);
    long long produced = (long long)produced_of(a);
    if (produced < 0) /* (a count past 2^63: only a hostile requester's; the Python's) */
        return NOT_IN_C;
    if (produced <= consumed)
        return DRAINED;
    long long limit = produced < consumed + posted_rq ? produced : consumed + posted_rq;
    long long start = consumed, base = untag(qp->__slot_base);
    long long stride = untag(qp->__slot_stride), depth = untag(qp->__depth);
    long long slot_size = untag(qp->__slot_size), qpn = untag(qp->_qp_num);
    if (depth <= 0 || stride < SLOT_HEADER_SIZE || base < AREA_HEADER_SIZE + 4 * depth ||
        base + depth * stride > len)
        return NOT_IN_C;
    Py_INCREF(cq_obj);
    Py_INCREF(receiver);
    Py_INCREF(ctx);
    PyObject *view = qp->__view;
    Py_INCREF(view);
    run(ctx, qpn, a, len, AREA_HEADER_SIZE, base, stride, depth, slot_size, &consumed, limit,
        &posted);
    /* those the run left, offered one by one to the receiver, as _take_in_place does (a
     * receiver that fails on a SEND took it: it is not offered again) */
    int failed = 0;
    while (consumed < limit && !failed) {
        long long off = base + (consumed % depth) * stride;
        long long n = (long long)le32toh(ld32(a + off));
        if (le32toh(ld32(a + off + 4)) != KIND_SEND || n > slot_size)
            break;
        PyObject *r = PyObject_CallFunction(receiver, "LOLL", qpn, view,
                                            off + SLOT_HEADER_SIZE, n);
        int yes = r == NULL ? -1 : PyObject_IsTrue(r);
        Py_XDECREF(r);
        if (yes == 0)
            break;
        failed = yes < 0;
        memcpy(a + AREA_HEADER_SIZE + 4 * (posted % depth),
               a + AREA_HEADER_SIZE + 4 * (consumed % depth), 4);
        posted++;
        consumed++;
    }
    int result = consumed >= produced ? DRAINED : OFFERED;
    if (consumed != start) {
        PyObject *type, *value, *trace; /* (a receiver's error raised after the stores) */
        PyErr_Fetch(&type, &value, &trace);
        if (took(qp, cq, a, consumed, posted) < 0) {
            if (failed)
                PyErr_WriteUnraisable(cq_obj);
            else
                result = -1;
        }
        if (failed) {
            PyErr_Restore(type, value, trace);
            result = -1;
        }
    }
    Py_DECREF(view);
    Py_DECREF(ctx);
    Py_DECREF(receiver);
    Py_DECREF(cq_obj);
    return result;
}

/* drain_in_place(qp) -> NOT_IN_C, DRAINED or OFFERED (above).  The ring's buffer is taken
 * under the receive lock, which ShmQp.destroy takes to close it. */
static PyObject *drain_in_place(PyObject *self, PyObject *qp_obj) {
    (void)self;
    if (qp_type == NULL || cq_type == NULL || Py_TYPE(qp_obj) != qp_type)
        return PyLong_FromLong(NOT_IN_C);
    QpObj *qp = (QpObj *)qp_obj;
    PyObject *cq_obj = qp->_recv_cq;
    if (qp->_receiver == NULL || qp->_receiver == Py_None || qp->__area == NULL ||
        qp->__rq_lock == NULL || !short_int(qp->__consumed) || cq_obj == NULL ||
        !PyObject_TypeCheck(cq_obj, cq_type) || !short_int(((CqObj *)cq_obj)->_polling) ||
        (uint64_t)untag(((CqObj *)cq_obj)->_polling) != (uint64_t)PyThread_get_thread_ident())
        return PyLong_FromLong(NOT_IN_C); /* (only within the CQ's poll, by this thread) */
    Py_buffer area;
    if (PyObject_GetBuffer(qp->__area, &area, PyBUF_WRITABLE) < 0) {
        PyErr_Clear(); /* (closed: the QP is going, the Python sees it) */
        return PyLong_FromLong(NOT_IN_C);
    }
    /* (nothing new: the common look, answered before the lock, as the Python does) */
    long long produced =
        area.len < AREA_HEADER_SIZE ? -1 : (long long)produced_of((unsigned char *)area.buf);
    PyBuffer_Release(&area);
    if (produced == untag(qp->__consumed))
        return PyLong_FromLong(DRAINED);
    PyObject *lock = qp->__rq_lock;
    Py_INCREF(lock);
    if (smcr_lock_take(lock) < 0) {
        Py_DECREF(lock);
        return NULL;
    }
    int r = NOT_IN_C;
    if (qp->__area != NULL && PyObject_GetBuffer(qp->__area, &area, PyBUF_WRITABLE) == 0) {
        if (area.len >= AREA_HEADER_SIZE)
            r = drain_locked(qp, (unsigned char *)area.buf, (long long)area.len);
        PyBuffer_Release(&area);
    } else {
        PyErr_Clear(); /* (closed meanwhile) */
    }
    give_keeping_error(lock);
    Py_DECREF(lock);
    if (r < 0)
        return NULL;
    return PyLong_FromLong(r);
}

/* ------------------------------------------------------------- a CQ's look at a QP
 *
 * What a shm CQ's poll and has_news call for each QP (ShmCompletionQueue.set_peek's run and
 * peek, bound with functools.partial to one exact ShmQp): through the generic call of a
 * bound method, each look cost an argument parse and two more calls to reach the C. */

static PyObject *str__drain;

/* drain_hook(qp): the QP's progress hook, ShmQp._drain() as a poll calls it: drain_in_place
 * first, and where that did not leave the ring empty, the Python's _drain told its answer
 * (_drain(False, answer): what the receiver refused is not offered to it again). */
static PyObject *drain_hook(PyObject *self, PyObject *qp_obj) {
    PyObject *r = drain_in_place(self, qp_obj);
    if (r == NULL)
        return NULL;
    if (PyLong_AsLong(r) == DRAINED) {
        Py_DECREF(r);
        Py_RETURN_NONE;
    }
    PyObject *args[3] = {qp_obj, Py_False, r};
    PyObject *done = PyObject_VectorcallMethod(str__drain, args, 3, NULL);
    Py_DECREF(r);
    return done;
}

/* sends_waiting(qp): smcr.rdma.shm.qp.sends_waiting for an exact ShmQp (TypeError for
 * another object): receives posted, no failed receive pending, and the requester's count
 * past ours; False for a closed ring. */
static PyObject *sends_waiting(PyObject *self, PyObject *qp_obj) {
    (void)self;
    if (qp_type == NULL || Py_TYPE(qp_obj) != qp_type) {
        PyErr_SetString(PyExc_TypeError, "sends_waiting: not a ShmQp");
        return NULL;
    }
    QpObj *qp = (QpObj *)qp_obj;
    if (qp->__rq == NULL || qp->__fatal_recv != Py_None || qp->__area == NULL ||
        !short_int(qp->__consumed))
        Py_RETURN_FALSE;
    Py_ssize_t posted = PyObject_Length(qp->__rq);
    if (posted <= 0) {
        if (posted < 0)
            return NULL;
        Py_RETURN_FALSE;
    }
    Py_buffer area;
    if (PyObject_GetBuffer(qp->__area, &area, PyBUF_SIMPLE) < 0) {
        PyErr_Clear(); /* (closed: the QP is going) */
        Py_RETURN_FALSE;
    }
    int more = 0;
    if (area.len >= AREA_HEADER_SIZE)
        more = produced_of((unsigned char *)area.buf) > (uint64_t)untag(qp->__consumed);
    PyBuffer_Release(&area);
    return PyBool_FromLong(more);
}

/* 0 where cls is the compiled class whose struct is size bytes, else -1 with a TypeError
 * naming who.  (A class may allow interpreted subclasses: mypyc then puts a __dict__ and a
 * weakref slot behind the struct of its compiled subclasses; an interpreted class is far
 * smaller.) */
static int compiled_as(const char *who, PyObject *cls, Py_ssize_t size) {
    PyTypeObject *t = (PyTypeObject *)cls;
    if (PyType_Check(cls) && t->tp_basicsize >= size &&
        t->tp_basicsize <= size + 2 * (Py_ssize_t)sizeof(void *) &&
        (t->tp_dictoffset == 0 || t->tp_dictoffset >= size))
        return 0;
    PyErr_Format(PyExc_TypeError, "%s: %R is not the compiled class _place was built for", who,
                 cls);
    return -1;
}

/* bind_drain(CompletionQueue, TAKEN_IN_PLACE, WorkCompletion): what drain_in_place reads
 * (after bind). */
static PyObject *bind_drain(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "bind_drain takes 3 arguments");
        return NULL;
    }
    if (qp_type == NULL) {
        PyErr_SetString(PyExc_TypeError, "bind_drain: _place is not bound");
        return NULL;
    }
    if (compiled_as("bind_drain", args[0], sizeof(CqObj)) < 0 ||
        compiled_as("bind_drain", args[2], sizeof(WcObj)) < 0)
        return NULL;
    Py_INCREF(args[2]);
    Py_XSETREF(wc_type, (PyTypeObject *)args[2]);
    Py_INCREF(args[0]);
    Py_XSETREF(cq_type, (PyTypeObject *)args[0]);
    Py_INCREF(args[1]);
    Py_XSETREF(taken_in_place, args[1]);
    Py_RETURN_NONE;
}

/* bind(ShmQp, PeerLink, RemoteMr, QpAttr, QpState.RTS, WATCHES, WATCH_MASK, sent_signaled):
 * the compiled classes post_inline reads, checked to be the header's structs, and what it
 * calls to complete a signaled SEND. */
static PyObject *bind(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "bind takes 8 arguments");
        return NULL;
    }
    if (!PyCallable_Check(args[7])) {
        PyErr_SetString(PyExc_TypeError, "bind: sent_signaled is not callable");
        return NULL;
    }
    Py_ssize_t sizes[4] = {sizeof(QpObj), sizeof(PeerObj), sizeof(MrObj), sizeof(AttrObj)};
    for (int i = 0; i < 4; i++)
        if (compiled_as("bind", args[i], sizes[i]) < 0)
            return NULL;
    long long at = PyLong_AsLongLong(args[5]), mask = PyLong_AsLongLong(args[6]);
    if (PyErr_Occurred())
        return NULL;
    PyTypeObject **slots[4] = {&qp_type, &peer_type, &mr_type, &attr_type};
    for (int i = 0; i < 4; i++) {
        Py_INCREF(args[i]);
        Py_XSETREF(*slots[i], (PyTypeObject *)args[i]);
    }
    Py_INCREF(args[4]);
    Py_XSETREF(rts_state, args[4]);
    watches_at = at;
    watch_mask = mask;
    Py_INCREF(args[7]);
    Py_XSETREF(sent_signaled, args[7]);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"place_send", (PyCFunction)(void (*)(void))place_send, METH_FASTCALL,
     "The checks and stores of the shm fused send's common case (module doc)."},
    {"look_peer", (PyCFunction)(void (*)(void))look_peer, METH_FASTCALL,
     "After a SEND: the peer QP's mark, a fence, whom to ring (module doc)."},
    {"bind", (PyCFunction)(void (*)(void))bind, METH_FASTCALL,
     "The compiled classes post_inline reads (its comment)."},
    {"drain_in_place", (PyCFunction)drain_in_place, METH_O,
     "ShmQp._drain's in-place case through the receiver's C run (its comment)."},
    {"drain_hook", (PyCFunction)drain_hook, METH_O,
     "ShmQp._drain() as a poll calls it: drain_in_place, then the Python where needed."},
    {"sends_waiting", (PyCFunction)sends_waiting, METH_O,
     "smcr.rdma.shm.qp.sends_waiting for an exact ShmQp."},
    {"bind_drain", (PyCFunction)(void (*)(void))bind_drain, METH_FASTCALL,
     "What drain_in_place reads: the CQ and completion classes, the stand-in (its comment)."},
    {"load_u32", (PyCFunction)(void (*)(void))load_u32, METH_FASTCALL,
     "load_u32(buf, offset): the little-endian u32 there, in one aligned load."},
    {"load_u64", (PyCFunction)(void (*)(void))load_u64, METH_FASTCALL,
     "load_u64(buf, offset): the little-endian u64 there, in one aligned load."},
    {"store_u32", (PyCFunction)(void (*)(void))store_u32, METH_FASTCALL,
     "store_u32(buf, offset, value): a little-endian u32 written in one aligned store."},
    {"store_u64", (PyCFunction)(void (*)(void))store_u64, METH_FASTCALL,
     "store_u64(buf, offset, value): a little-endian u64 written in one aligned store."},
    {"fence", (PyCFunction)(void (*)(void))full_fence, METH_FASTCALL,
     "fence(): a full memory barrier."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_place",
    "The shm RNIC's fused send in C (see the source's head).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__place(void) {
    str_append = PyUnicode_InternFromString("append");
    str__drain = PyUnicode_InternFromString("_drain");
    if (str_append == NULL || str__drain == NULL || smcr_locks_bind() < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    PyObject *capsule = PyCapsule_New((void *)post_inline, POST_INLINE_NAME, NULL);
    if (capsule == NULL || PyModule_AddObject(m, "POST_INLINE", capsule) < 0) {
        Py_XDECREF(capsule);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
