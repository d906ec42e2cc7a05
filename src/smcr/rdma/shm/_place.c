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
 * The peer's area is written by another process: everything read from it is checked
 * before use, as the Python does (a hostile peer gets a refusal, not a wild store).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

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
    uint64_t psn = (uint64_t)v[0], produced = (uint64_t)v[1], depth = (uint64_t)v[2];
    uint64_t slot_size = (uint64_t)v[3], mtu = (uint64_t)v[4], limit = (uint64_t)v[5];
    uint64_t iova = (uint64_t)v[6], end = (uint64_t)v[7], allowed = (uint64_t)v[8];
    uint64_t pd = (uint64_t)v[9], mr_offset = (uint64_t)v[10];
    uint32_t seal = (uint32_t)v[11], generation = (uint32_t)v[12];
    uint64_t addr = (uint64_t)v[13], addr2 = (uint64_t)v[14];
    if (!depth || !mtu || v[0] < 0 || v[1] < 0 || v[6] < 0 || v[13] < 0 || v[14] < 0)
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

    unsigned char *a = (unsigned char *)area.buf;
    uint64_t alen = (uint64_t)area.len, size = (uint64_t)message.len;
    uint64_t idx = produced % depth;
    uint64_t lens_end = AREA_HEADER_SIZE + 4 * depth;
    uint64_t slot = lens_end + idx * (SLOT_HEADER_SIZE + slot_size);
    if (alen < AREA_HEADER_SIZE || lens_end > alen || slot + SLOT_HEADER_SIZE + size > alen)
        goto done;
    uint32_t state = ld32(a);
    if ((state != QPS_RTR && state != QPS_RTS) || ld32(a + OFF_EPSN) != psn ||
        ld64(a + OFF_POSTED) == produced || !(ld32(a + OFF_ACCESS) & REMOTE_WRITE) ||
        size > slot_size || size > ld32(a + AREA_HEADER_SIZE + 4 * idx))
        goto done;
    if (have1) { /* the WRITEs' target, as the Python checks each WRITE (one peer MR) */
        uint64_t n1 = (uint64_t)data.len, n2 = have2 ? (uint64_t)data2.len : 0;
        const unsigned char *t = (const unsigned char *)table.buf;
        if (n1 > limit || addr < iova || addr + n1 > end ||
            (have2 && (n2 > limit || addr2 < iova || addr2 + n2 > end)) ||
            !(allowed & REMOTE_WRITE) || pd != ld32(a + OFF_PD) ||
            mr_offset + 8 > (uint64_t)table.len || ld32(t + mr_offset) != seal ||
            ld32(t + mr_offset + 4) != generation || end < iova ||
            end - iova > (uint64_t)view.len)
            goto done;
        unsigned char *dst = (unsigned char *)view.buf;
        memcpy(dst + (addr - iova), data.buf, n1);
        psn += packets(n1, mtu);
        if (have2) {
            memcpy(dst + (addr2 - iova), data2.buf, n2);
            psn += packets(n2, mtu);
        }
    }
    memcpy(a + slot + SLOT_HEADER_SIZE, message.buf, size);
    psn = (psn + packets(size, mtu)) & PSN_MASK;
    uint32_t header[4] = {(uint32_t)size, KIND_SEND, 0, 0};
    memcpy(a + slot, header, sizeof header);
    /* produced after what it covers (a release store: the compiler keeps the order; x86
     * keeps stores in order), then the PSN the peer expects next */
    __atomic_store_n((uint64_t *)(a + OFF_PRODUCED), produced + 1, __ATOMIC_RELEASE);
    st32(a + OFF_EPSN, (uint32_t)psn);
    result = (long)psn;
done:
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
 *   1: the CQ's doorbell, 2: its standby doorbell (the arm word cleared);
 *   rid << 2 | 1 or 2: the consumer bell of readiness rid (its watch word cleared, the
 *   arm word left), or if that cannot be rung the doorbell the low bits name (the caller
 *   then clears the arm word).
 * After a SEND was placed: the peer QP's mark byte set, a full fence, the CQ's arm word
 * and, for a SEND keyed wake (0: none) while the CQ is armed for no application thread and
 * the peer rings by name (bells), the watch word of wake. */
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
    unsigned char *n = (unsigned char *)notify.buf;
    long long len = (long long)notify.len, result = 0;
    if (len < 4 || mark < 0 || mark >= len) {
        PyBuffer_Release(&notify);
        PyErr_SetString(PyExc_ValueError, "notification segment too short");
        return NULL;
    }
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
            __atomic_store_n((uint32_t *)n, 0u, __ATOMIC_RELAXED);
            result = door;
        }
    }
    PyBuffer_Release(&notify);
    return PyLong_FromLongLong(result);
}

static PyMethodDef methods[] = {
    {"place_send", (PyCFunction)(void (*)(void))place_send, METH_FASTCALL,
     "The checks and stores of the shm fused send's common case (module doc)."},
    {"look_peer", (PyCFunction)(void (*)(void))look_peer, METH_FASTCALL,
     "After a SEND: the peer QP's mark, a fence, whom to ring (module doc)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_place",
    "The shm RNIC's fused send in C (see the source's head).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__place(void) { return PyModule_Create(&module); }
