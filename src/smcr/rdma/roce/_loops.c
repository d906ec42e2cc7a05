/* The RoCE RNIC's per-packet loops in C: the runs of RDMA WRITE Middles that make up all
 * but two packets of a long WRITE (smcr.rdma.roce.fastpath), every other packet's ICRC and
 * send, and the read of a flow socket.
 *
 * Why C: per packet the Python of these loops costs about a microsecond (slices, struct
 * packs, two CRC calls, a copy: ten C-API calls), more than the CRC and the copy
 * themselves (0.1 us each for 4 KiB); a 1 MiB WRITE is 256 packets at each end, and a
 * small message's round trip over RoCE is six packets (data, CDC, ACK each way), whose
 * masked headers, CRCs and sendmsg buffers were a quarter of its instructions in Python.
 * The protocol stays in Python: place checks and places what IcrcFlow.place_middles would,
 * sendrun sends what IcrcFlow.run_frames builds (then the buffers the caller adds), sendq
 * what IcrcFlow.frames builds, verify gives the CRC difference IcrcV4.verify starts its
 * ID recovery from, with the constants their caller worked out, and recvgro is
 * socket.recvmsg_into for the RNIC's reads; tests/roce/test_middle_runs.py and
 * test_c_send.py check them byte for byte against the Python.
 *
 * The CRC is zlib-ng's (the zlib_ng package smcr depends on exports zng_crc32), found
 * in that loaded module at import; without it this module does not import and the
 * Python loops run.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#ifndef SOL_UDP
#define SOL_UDP 17
#endif
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

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

/* The argument count of a METH_FASTCALL entry point: 0 with a TypeError unless it is want. */
static int nargs_ok(const char *name, Py_ssize_t nargs, Py_ssize_t want) {
    if (nargs == want)
        return 1;
    PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments", name, want);
    return 0;
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
    if (!nargs_ok("place", nargs, 13))
        return NULL;
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

/* One sendmsg of n_iov buffers to the packed socket address name, as UDP GSO segments of
 * gso bytes unless 0, retried on EINTR as socket.sendmsg does (PEP 475): the bytes sent,
 * or NULL with OSError set. */
static PyObject *send_iov(int fd, char *name, Py_ssize_t name_len, struct iovec *iov,
                          int n_iov, long long gso) {
    union {
        char buf[CMSG_SPACE(sizeof(uint16_t))];
        struct cmsghdr align;
    } control;
    struct msghdr msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_name = name;
    msg.msg_namelen = (socklen_t)name_len;
    msg.msg_iov = iov;
    msg.msg_iovlen = (size_t)n_iov;
    if (gso) {
        uint16_t size = (uint16_t)gso;
        memset(&control, 0, sizeof control);
        msg.msg_control = control.buf;
        msg.msg_controllen = sizeof control.buf;
        struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
        cm->cmsg_level = SOL_UDP;
        cm->cmsg_type = UDP_SEGMENT;
        cm->cmsg_len = CMSG_LEN(sizeof size);
        memcpy(CMSG_DATA(cm), &size, sizeof size);
    }
    ssize_t sent;
    int err;
    for (;;) {
        /* The GIL held: MSG_DONTWAIT returns at once (EAGAIN where the socket is full), and
         * a GIL let go for a call that never waits is taken by another thread of ours (the
         * progress thread, woken by a packet), which the caller then waits for: a hand-off
         * each way per send at 1,000 connections. */
        sent = sendmsg(fd, &msg, MSG_DONTWAIT);
        err = errno;
        if (sent >= 0 || err != EINTR)
            break;
        if (PyErr_CheckSignals() < 0)
            return NULL;
    }
    if (sent < 0) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromSsize_t(sent);
}

PyDoc_STRVAR(sendrun_doc,
"sendrun(fd, name, gso, scratch, data, off, pmtu, m, bth8, psn, index, every, pre, mid,\n"
"        ident, step, extra) -> bytes sent\n\n"
"IcrcFlow.run_frames's loop and the sendmsg after it, in one: m WRITE Middles, packet i\n"
"the 8 bytes bth8, PSN word psn+i (AckReq when (index+i) % every == every-1), the pmtu\n"
"bytes of data at off+i*pmtu, and its ICRC (from pre over the varying part, ident+i*step,\n"
"then the payload); then the buffers of extra.  One sendmsg to the socket address name\n"
"(packed), with UDP_SEGMENT gso unless gso is 0; the payloads go straight from data,\n"
"the headers and ICRCs from scratch (16 * m + 4 bytes).  OSError as socket.sendmsg.");

#define IOV_CAP 320

static PyObject *sendrun(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (!nargs_ok("sendrun", nargs, 17))
        return NULL;
    static const int which[] = {0, 2, 5, 6, 7, 9, 10, 11, 12, 14, 15};
    long long a[11];
    if (int_args(args, which, 11, a) < 0)
        return NULL;
    int fd = (int)a[0];
    long long gso = a[1];
    Py_ssize_t off = (Py_ssize_t)a[2], pm = (Py_ssize_t)a[3], m = (Py_ssize_t)a[4];
    uint32_t psn = (uint32_t)a[5];
    long long index = a[6], every = a[7];
    uint32_t pre = (uint32_t)a[8];
    long ident = (long)a[9], step = (long)a[10];
    char *name, *bth;
    Py_ssize_t name_len, bth_len;
    if (PyBytes_AsStringAndSize(args[1], &name, &name_len) < 0 ||
        PyBytes_AsStringAndSize(args[8], &bth, &bth_len) < 0)
        return NULL;
    Varying var;
    if (varying_init(&var, args[13]) < 0)
        return NULL;
    PyObject *extra = args[16];
    if (!PyList_Check(extra)) {
        PyErr_SetString(PyExc_TypeError, "extra must be a list");
        return NULL;
    }
    Py_ssize_t n_extra = PyList_GET_SIZE(extra);
    if (bth_len != 8 || pm <= 0 || m < 1 || off < 0 || every <= 0 || index < 0 || gso < 0 ||
        gso > 0xFFFF || 2 * m + 1 + n_extra > IOV_CAP) {
        PyErr_SetString(PyExc_ValueError, "bad run");
        return NULL;
    }
    Py_buffer sb, db, eb[IOV_CAP];
    if (PyObject_GetBuffer(args[3], &sb, PyBUF_WRITABLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[4], &db, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&sb);
        return NULL;
    }
    Py_ssize_t got = 0;
    PyObject *result = NULL;
    if (16 * m + 4 > sb.len || off + m * pm > db.len) {
        PyErr_SetString(PyExc_ValueError, "run beyond its buffers");
        goto done;
    }
    for (; got < n_extra; got++) {
        if (PyObject_GetBuffer(PyList_GET_ITEM(extra, got), &eb[got], PyBUF_SIMPLE) < 0)
            goto done;
    }
    struct iovec iov[IOV_CAP];
    int n_iov = 0;
    unsigned char *h = sb.buf;
    const unsigned char *d = db.buf;
    for (Py_ssize_t i = 0; i < m; i++) {
        /* slot i: the ICRC of packet i-1, then packet i's BTH (slot 0: the BTH alone) */
        unsigned char *slot = h + 16 * i;
        const unsigned char *payload = d + off + i * pm;
        uint32_t word = (index + i) % every == every - 1 ? psn | ACK_REQ : psn;
        memcpy(slot + 4, bth, 8);
        put_be32(slot + 12, word);
        uint32_t crc = crc32_of(varying_crc(&var, pre, ident, word), payload, (uint32_t)pm);
        put_le32(slot + 16, crc);
        iov[n_iov].iov_base = i ? slot : slot + 4;
        iov[n_iov++].iov_len = i ? 16 : 12;
        iov[n_iov].iov_base = (void *)payload;
        iov[n_iov++].iov_len = (size_t)pm;
        psn = (psn + 1) & U24;
        ident += step;
    }
    iov[n_iov].iov_base = h + 16 * m;
    iov[n_iov++].iov_len = 4;
    for (Py_ssize_t k = 0; k < n_extra; k++) {
        iov[n_iov].iov_base = eb[k].buf;
        iov[n_iov++].iov_len = (size_t)eb[k].len;
    }
    result = send_iov(fd, name, name_len, iov, n_iov, gso);
done:
    while (got > 0)
        PyBuffer_Release(&eb[--got]);
    PyBuffer_Release(&db);
    PyBuffer_Release(&sb);
    return result;
}

PyDoc_STRVAR(recvgro_doc,
"recvgro(fd, buffer) -> (n, seg)\n\n"
"One non-blocking recvmsg into buffer: n bytes, in datagrams of seg bytes (UDP GRO's\n"
"segment size; n when the kernel joined none); (-1, 0) when nothing is there (EAGAIN,\n"
"or EINTR once the signal handlers ran).  Why not socket.recvmsg_into: it makes an\n"
"address string and an ancillary list per read, and an exception each time the socket\n"
"is empty, which ends every drain of it.  Other errors raise OSError.");

static PyObject *recvgro(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (!nargs_ok("recvgro", nargs, 2))
        return NULL;
    long fd = PyLong_AsLong(args[0]);
    if (fd == -1 && PyErr_Occurred())
        return NULL;
    Py_buffer b;
    if (PyObject_GetBuffer(args[1], &b, PyBUF_WRITABLE) < 0)
        return NULL;
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } control;
    struct iovec iov = {b.buf, (size_t)b.len};
    struct msghdr msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.buf;
    msg.msg_controllen = sizeof control.buf;
    ssize_t n;
    int err;
    n = recvmsg((int)fd, &msg, MSG_DONTWAIT); /* the GIL held: as send_iov's sendmsg */
    err = errno;
    PyBuffer_Release(&b);
    if (n < 0) {
        if (err == EAGAIN || err == EWOULDBLOCK)
            return Py_BuildValue("(ii)", -1, 0);
        if (err == EINTR)
            return PyErr_CheckSignals() < 0 ? NULL : Py_BuildValue("(ii)", -1, 0);
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    long seg = 0;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm != NULL; cm = CMSG_NXTHDR(&msg, cm)) {
        if (cm->cmsg_level == SOL_UDP && cm->cmsg_type == UDP_GRO) {
            int size;
            memcpy(&size, CMSG_DATA(cm), sizeof size);
            seg = size;
        }
    }
    return Py_BuildValue("(nl)", (Py_ssize_t)n, seg > 0 ? seg : (long)n);
}

/* The masked IP + UDP + BTH header a flow's ICRC starts with (fastpath's IPV4_MASKED or
 * IPV6_MASKED): a template of head_len bytes with the flow's constants, in which the
 * lengths, the IPv4 ID and the BTH fields are written per packet. */
#define HEAD_V4 40
#define HEAD_V6 60
#define HEAD_MAX HEAD_V6

static uint32_t icrc_seed; /* the CRC of the eight 0xFF bytes of the pseudo-LRH */

static inline void put_be16(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 8);
    p[1] = (unsigned char)v;
}

/* The CRC of the masked header of one packet: ulen is its UDP length, ident its IPv4 ID
 * (IPv6: unused), bth its first 12 bytes as sent (P_Key stays the template's). */
static uint32_t head_crc(const unsigned char *tmpl, Py_ssize_t head_len, long ulen,
                         long ident, const unsigned char *bth) {
    unsigned char h[HEAD_MAX];
    memcpy(h, tmpl, (size_t)head_len);
    if (head_len == HEAD_V4) {
        put_be16(h + 2, (uint32_t)(ulen + 20));
        put_be16(h + 4, (uint32_t)ident);
        put_be16(h + 24, (uint32_t)ulen);
    } else {
        put_be16(h + 4, (uint32_t)ulen);
        put_be16(h + 44, (uint32_t)ulen);
    }
    unsigned char *b = h + head_len - 12;
    b[0] = bth[0];
    b[1] = bth[1];
    b[4] = 0xFF; /* the reserved byte before DestQP is masked */
    memcpy(b + 5, bth + 5, 7);
    return crc32_of(icrc_seed, h, (uint32_t)head_len);
}

static int head_of(PyObject *obj, const unsigned char **p, Py_ssize_t *n) {
    if (PyBytes_AsStringAndSize(obj, (char **)p, n) < 0)
        return -1;
    if (*n != HEAD_V4 && *n != HEAD_V6) {
        PyErr_SetString(PyExc_ValueError, "a masked header template is 40 or 60 bytes");
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(verify_doc,
"verify(view, off, n, head, ident) -> difference\n\n"
"IcrcFlow.verify's CRC: the ICRC of the n-byte packet at view[off:] (BTH through ICRC)\n"
"computed with IPv4 ID ident (IPv4 only) from the flow's masked header template head,\n"
"XOR the ICRC the packet carries: 0 when it is right.  With ident 0, a non-zero\n"
"difference is what ID recovery (IcrcFlow.judge) starts from.");

static PyObject *verify(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (!nargs_ok("verify", nargs, 5))
        return NULL;
    long ident = PyLong_AsLong(args[4]);
    if (ident == -1 && PyErr_Occurred())
        return NULL;
    if (ident < 0 || ident > 0xFFFF) {
        PyErr_SetString(PyExc_ValueError, "an IPv4 ID is 16 bits");
        return NULL;
    }
    Py_ssize_t off = PyLong_AsSsize_t(args[1]);
    if (off == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t n = PyLong_AsSsize_t(args[2]);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    const unsigned char *tmpl;
    Py_ssize_t head_len;
    if (head_of(args[3], &tmpl, &head_len) < 0)
        return NULL;
    Py_buffer vb;
    if (PyObject_GetBuffer(args[0], &vb, PyBUF_SIMPLE) < 0)
        return NULL;
    if (off < 0 || n < 16 || off + n > vb.len) {
        PyBuffer_Release(&vb);
        PyErr_SetString(PyExc_ValueError, "packet beyond the buffer");
        return NULL;
    }
    const unsigned char *p = (const unsigned char *)vb.buf + off;
    uint32_t crc = head_crc(tmpl, head_len, (long)n + 8, ident, p);
    if (n > 16)
        crc = crc32_of(crc, p + 12, (uint32_t)(n - 16));
    uint32_t found = get_le32(p + n - 4);
    PyBuffer_Release(&vb);
    return PyLong_FromUnsignedLong(crc ^ found);
}

PyDoc_STRVAR(sendq_doc,
"sendq(fd, name, gso, head, queue, start, end, dest_qp, id_base) -> bytes sent\n\n"
"IcrcFlow.frames and the sendmsg after it, in one: the packets queue[start:end], each\n"
"(opcode, b1, psn_word, ext_headers, payload), with BTH (P_Key 0xFFFF, DestQP dest_qp),\n"
"extension headers, payload, pad and ICRC (from the masked header template head, IPv4\n"
"ID id_base + k for the k-th), sent with one sendmsg to the packed socket address name,\n"
"UDP_SEGMENT gso unless gso is 0.  Payloads go straight from their buffers.  OSError as\n"
"socket.sendmsg; ValueError or TypeError before anything is sent for a malformed entry.");

#define SENDQ_MAX 64
#define EXT_MAX 32

static PyObject *sendq(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (!nargs_ok("sendq", nargs, 9))
        return NULL;
    static const int which[] = {0, 2, 5, 6, 7, 8};
    long long a[6];
    if (int_args(args, which, 6, a) < 0)
        return NULL;
    int fd = (int)a[0];
    long long gso = a[1];
    Py_ssize_t start = (Py_ssize_t)a[2], end = (Py_ssize_t)a[3];
    uint32_t dest_qp = (uint32_t)a[4];
    long id_base = (long)a[5];
    char *name;
    Py_ssize_t name_len;
    if (PyBytes_AsStringAndSize(args[1], &name, &name_len) < 0)
        return NULL;
    const unsigned char *tmpl;
    Py_ssize_t head_len;
    if (head_of(args[3], &tmpl, &head_len) < 0)
        return NULL;
    PyObject *queue = args[4];
    if (!PyList_Check(queue)) {
        PyErr_SetString(PyExc_TypeError, "queue must be a list");
        return NULL;
    }
    Py_ssize_t m = end - start;
    if (start < 0 || m < 1 || m > SENDQ_MAX || end > PyList_GET_SIZE(queue) || gso < 0 ||
        gso > 0xFFFF) {
        PyErr_SetString(PyExc_ValueError, "bad packet range");
        return NULL;
    }
    unsigned char heads[SENDQ_MAX][12 + EXT_MAX];
    unsigned char tails[SENDQ_MAX][8];
    Py_buffer pb[SENDQ_MAX];
    struct iovec iov[3 * SENDQ_MAX];
    int n_iov = 0;
    Py_ssize_t got = 0;
    PyObject *result = NULL;
    static const unsigned char zeros[4] = {0, 0, 0, 0};
    for (Py_ssize_t k = 0; k < m; k++) {
        PyObject *item = PyList_GET_ITEM(queue, start + k);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 5) {
            PyErr_SetString(PyExc_TypeError, "a queued packet is a 5-tuple");
            goto done;
        }
        long opcode = PyLong_AsLong(PyTuple_GET_ITEM(item, 0));
        long b1 = PyLong_AsLong(PyTuple_GET_ITEM(item, 1));
        unsigned long word = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(item, 2));
        if (PyErr_Occurred())
            goto done;
        char *ext;
        Py_ssize_t ext_len;
        if (PyBytes_AsStringAndSize(PyTuple_GET_ITEM(item, 3), &ext, &ext_len) < 0)
            goto done;
        if (opcode < 0 || opcode > 0xFF || b1 < 0 || b1 > 0xFF || word > 0xFFFFFFFFul ||
            ext_len > EXT_MAX) {
            PyErr_SetString(PyExc_ValueError, "a queued packet's header is out of range");
            goto done;
        }
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(item, 4), &pb[got], PyBUF_SIMPLE) < 0)
            goto done;
        got++;
        unsigned char *h = heads[k];
        h[0] = (unsigned char)opcode;
        h[1] = (unsigned char)b1;
        h[2] = h[3] = 0xFF;
        put_be32(h + 4, dest_qp);
        put_be32(h + 8, (uint32_t)word);
        memcpy(h + 12, ext, (size_t)ext_len);
        Py_ssize_t pad = (b1 >> 4) & 3, plen = pb[k].len;
        long ulen = (long)(24 + ext_len + plen + pad);
        uint32_t crc = head_crc(tmpl, head_len, ulen, id_base + (long)k, h);
        if (ext_len)
            crc = crc32_of(crc, h + 12, (uint32_t)ext_len);
        if (plen)
            crc = crc32_of(crc, pb[k].buf, (uint32_t)plen);
        if (pad)
            crc = crc32_of(crc, zeros, (uint32_t)pad);
        memset(tails[k], 0, 4);
        put_le32(tails[k] + pad, crc);
        iov[n_iov].iov_base = h;
        iov[n_iov++].iov_len = (size_t)(12 + ext_len);
        if (plen) {
            iov[n_iov].iov_base = pb[k].buf;
            iov[n_iov++].iov_len = (size_t)plen;
        }
        iov[n_iov].iov_base = tails[k];
        iov[n_iov++].iov_len = (size_t)(pad + 4);
    }
    result = send_iov(fd, name, name_len, iov, n_iov, gso);
done:
    while (got > 0)
        PyBuffer_Release(&pb[--got]);
    return result;
}

static PyMethodDef methods[] = {
    {"place", (PyCFunction)(void (*)(void))place, METH_FASTCALL, place_doc},
    {"sendrun", (PyCFunction)(void (*)(void))sendrun, METH_FASTCALL, sendrun_doc},
    {"recvgro", (PyCFunction)(void (*)(void))recvgro, METH_FASTCALL, recvgro_doc},
    {"verify", (PyCFunction)(void (*)(void))verify, METH_FASTCALL, verify_doc},
    {"sendq", (PyCFunction)(void (*)(void))sendq, METH_FASTCALL, sendq_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "smcr.rdma.roce._loops",
    "The RoCE RNIC's per-packet loops, in C (see fastpath).", -1, methods,
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
    static const unsigned char lrh[8] = {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};
    icrc_seed = crc32_of(0, lrh, 8);
    return PyModule_Create(&module);
}
