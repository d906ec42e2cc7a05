/* The RoCE RNIC's two per-packet loops in C: the runs of RDMA WRITE Middles that make up
 * all but two packets of a long WRITE (smcr.rdma.roce.fastpath).
 *
 * Why C: per packet the Python of these loops costs about a microsecond (slices, struct
 * packs, two CRC calls, a copy: ten C-API calls), more than the CRC and the copy
 * themselves (0.1 us each for 4 KiB); a 1 MiB WRITE is 256 packets at each end.  The
 * protocol stays in Python: these functions only do what fastpath.IcrcFlow's
 * place_middles and run_frames do, with the constants their caller worked out, and
 * tests/roce/test_loops.py checks them byte for byte against that Python.
 *
 * The CRC is zlib-ng's (the zlib_ng package smcr depends on exports zng_crc32), found
 * in that loaded module at import; without it this module does not import and the
 * Python loops run.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

typedef uint32_t (*crc32_fn)(uint32_t crc, const unsigned char *buf, uint32_t len);

static crc32_fn crc32_of;

#define U24 0xFFFFFFu
#define ACK_REQ 0x80000000u
#define MID_MAX 64

static inline uint64_t get_be64(const unsigned char *p) {
    return ((uint64_t)p[0] << 56) | ((uint64_t)p[1] << 48) | ((uint64_t)p[2] << 40) |
           ((uint64_t)p[3] << 32) | ((uint64_t)p[4] << 24) | ((uint64_t)p[5] << 16) |
           ((uint64_t)p[6] << 8) | (uint64_t)p[7];
}

static inline uint32_t get_be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline uint32_t get_le32(const unsigned char *p) {
    return ((uint32_t)p[3] << 24) | ((uint32_t)p[2] << 16) | ((uint32_t)p[1] << 8) | p[0];
}

static inline void put_be32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static inline void put_le32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

/* The part of a packet's masked header that varies within a run, as fastpath packs it
 * (_ID_MID_PSN, _PKEY_QP_PSN): a 16-bit field, fixed bytes, the PSN word. */
typedef struct {
    unsigned char bytes[2 + MID_MAX + 4];
    Py_ssize_t mid;
} Varying;

static int varying_init(Varying *v, PyObject *mid) {
    char *p;
    Py_ssize_t n;
    if (PyBytes_AsStringAndSize(mid, &p, &n) < 0)
        return -1;
    if (n > MID_MAX) {
        PyErr_SetString(PyExc_ValueError, "fixed header part too long");
        return -1;
    }
    memcpy(v->bytes + 2, p, (size_t)n);
    v->mid = n;
    return 0;
}

static inline uint32_t varying_crc(Varying *v, uint32_t pre, long ident, uint32_t word) {
    v->bytes[0] = (unsigned char)(ident >> 8);
    v->bytes[1] = (unsigned char)ident;
    put_be32(v->bytes + 2 + v->mid, word);
    return crc32_of(pre, v->bytes, (uint32_t)(2 + v->mid + 4));
}

static int int_args(PyObject *const *args, const int *which, int n, long long *out) {
    for (int i = 0; i < n; i++) {
        out[i] = PyLong_AsLongLong(args[which[i]]);
        if (out[i] == -1 && PyErr_Occurred())
            return -1;
    }
    return 0;
}

PyDoc_STRVAR(place_doc,
"place(view, off, end, seg, pre, mid, ident, step, want, psn, limit, target, toff)\n"
"-> (placed, ack_psn)\n\n"
"IcrcFlow.place_middles's loop: check the in-order WRITE Middles of seg bytes at\n"
"view[off:end] (BTH's first 8 bytes == want, PSN psn, psn+1..., ICRC continued from\n"
"pre over the varying part (ident, mid, PSN word) and the payload) and copy each\n"
"payload to target at toff, toff+pmtu...; stop before the first that is not such\n"
"and after limit.  ack_psn: PSN of the last with AckReq, or -1.");

static PyObject *place(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 13) {
        PyErr_SetString(PyExc_TypeError, "place() takes 13 arguments");
        return NULL;
    }
    static const int which[] = {1, 2, 3, 4, 6, 7, 9, 10, 12};
    long long a[9];
    if (int_args(args, which, 9, a) < 0)
        return NULL;
    Py_ssize_t off = (Py_ssize_t)a[0], end = (Py_ssize_t)a[1], seg = (Py_ssize_t)a[2];
    uint32_t pre = (uint32_t)a[3];
    long ident = (long)a[4], step = (long)a[5];
    uint32_t psn = (uint32_t)a[6];
    long long limit = a[7];
    Py_ssize_t toff = (Py_ssize_t)a[8];
    uint64_t want = PyLong_AsUnsignedLongLong(args[8]);
    if (want == (uint64_t)-1 && PyErr_Occurred())
        return NULL;
    Varying var;
    if (varying_init(&var, args[5]) < 0)
        return NULL;
    if (seg < 16 || off < 0 || toff < 0) {
        PyErr_SetString(PyExc_ValueError, "bad offsets");
        return NULL;
    }
    Py_buffer vb, tb;
    if (PyObject_GetBuffer(args[0], &vb, PyBUF_SIMPLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[11], &tb, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&vb);
        return NULL;
    }
    if (end > vb.len)
        end = vb.len;
    const unsigned char *v = vb.buf;
    unsigned char *t = tb.buf;
    Py_ssize_t pm = seg - 16;
    long long count = 0;
    long ack = -1;
    int overflow = 0;
    while (count < limit && off + seg <= end) {
        const unsigned char *p = v + off;
        uint32_t word = get_be32(p + 8);
        if (get_be64(p) != want || (word & U24) != psn)
            break;
        uint32_t crc = crc32_of(varying_crc(&var, pre, ident, word), p + 12, (uint32_t)pm);
        if (crc != get_le32(p + seg - 4))
            break;
        if (toff + pm > tb.len) {
            overflow = 1;
            break;
        }
        memcpy(t + toff, p + 12, (size_t)pm);
        if (word & ACK_REQ)
            ack = (long)psn;
        psn = (psn + 1) & U24;
        count++;
        off += seg;
        ident += step;
        toff += pm;
    }
    PyBuffer_Release(&tb);
    PyBuffer_Release(&vb);
    if (overflow) {
        PyErr_SetString(PyExc_ValueError, "payload beyond the target");
        return NULL;
    }
    return Py_BuildValue("(Ll)", count, ack);
}

PyDoc_STRVAR(frames_doc,
"frames(out, data, off, pmtu, m, bth8, psn, index, every, pre, mid, ident, step) -> n\n\n"
"IcrcFlow.run_frames's loop, into one buffer: m WRITE Middles, packet i the 8 bytes\n"
"bth8, PSN word psn+i (AckReq when (index+i) % every == every-1), the pmtu bytes of\n"
"data at off+i*pmtu, and its ICRC (from pre over the varying part, ident+i*step, then\n"
"the payload).  Writes out[0:n], n = m * (pmtu + 16).");

static PyObject *frames(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 13) {
        PyErr_SetString(PyExc_TypeError, "frames() takes 13 arguments");
        return NULL;
    }
    static const int which[] = {2, 3, 4, 6, 7, 8, 9, 11, 12};
    long long a[9];
    if (int_args(args, which, 9, a) < 0)
        return NULL;
    Py_ssize_t off = (Py_ssize_t)a[0], pm = (Py_ssize_t)a[1], m = (Py_ssize_t)a[2];
    uint32_t psn = (uint32_t)a[3];
    long long index = a[4], every = a[5];
    uint32_t pre = (uint32_t)a[6];
    long ident = (long)a[7], step = (long)a[8];
    char *bth;
    Py_ssize_t bth_len;
    if (PyBytes_AsStringAndSize(args[5], &bth, &bth_len) < 0)
        return NULL;
    Varying var;
    if (varying_init(&var, args[10]) < 0)
        return NULL;
    if (bth_len != 8 || pm <= 0 || m < 0 || off < 0 || every <= 0 || index < 0) {
        PyErr_SetString(PyExc_ValueError, "bad run");
        return NULL;
    }
    Py_buffer ob, db;
    if (PyObject_GetBuffer(args[0], &ob, PyBUF_WRITABLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[1], &db, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&ob);
        return NULL;
    }
    Py_ssize_t seg = pm + 16;
    if (m * seg > ob.len || off + m * pm > db.len) {
        PyBuffer_Release(&db);
        PyBuffer_Release(&ob);
        PyErr_SetString(PyExc_ValueError, "run beyond its buffers");
        return NULL;
    }
    unsigned char *o = ob.buf;
    const unsigned char *d = db.buf;
    for (Py_ssize_t i = 0; i < m; i++) {
        unsigned char *p = o + i * seg;
        uint32_t word = index % every == every - 1 ? psn | ACK_REQ : psn;
        memcpy(p, bth, 8);
        put_be32(p + 8, word);
        memcpy(p + 12, d + off, (size_t)pm);
        uint32_t crc = crc32_of(varying_crc(&var, pre, ident, word), p + 12, (uint32_t)pm);
        put_le32(p + 12 + pm, crc);
        psn = (psn + 1) & U24;
        off += pm;
        index++;
        ident += step;
    }
    PyBuffer_Release(&db);
    PyBuffer_Release(&ob);
    return PyLong_FromSsize_t(m * seg);
}

static PyMethodDef methods[] = {
    {"place", (PyCFunction)(void (*)(void))place, METH_FASTCALL, place_doc},
    {"frames", (PyCFunction)(void (*)(void))frames, METH_FASTCALL, frames_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "smcr.rdma.roce._loops",
    "The RoCE RNIC's per-packet loops of WRITE Middles, in C (see fastpath).", -1, methods,
    NULL, NULL, NULL, NULL,
};

/* zng_crc32 of the loaded zlib_ng extension, checked on the standard check value. */
static int find_crc32(void) {
    PyObject *mod = PyImport_ImportModule("zlib_ng.zlib_ng");
    if (mod == NULL)
        return -1;
    PyObject *file = PyObject_GetAttrString(mod, "__file__");
    Py_DECREF(mod);
    if (file == NULL)
        return -1;
    const char *path = PyUnicode_AsUTF8(file);
    void *lib = path == NULL ? NULL : dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    Py_DECREF(file);
    if (path == NULL)
        return -1;
    crc32_of = lib == NULL ? NULL : (crc32_fn)dlsym(lib, "zng_crc32");
    if (crc32_of == NULL || crc32_of(0, (const unsigned char *)"123456789", 9) != 0xCBF43926u) {
        crc32_of = NULL;
        PyErr_SetString(PyExc_ImportError, "zlib_ng exports no usable zng_crc32");
        return -1;
    }
    return 0;
}

PyMODINIT_FUNC PyInit__loops(void) {
    if (find_crc32() < 0)
        return NULL;
    return PyModule_Create(&module);
}
