/* Doorbells rung and drained without Python's socket machinery.
 *
 * Why: a round trip over the shm RNIC rings the peer's doorbell once and drains its own
 * once, each a one-byte non-blocking system call on a socket of a socket pair; an event
 * loop's message also rings the consumer's readiness descriptor by its name and drains it
 * (smcr.rdma.bells, smcr.stack.readiness).  Through
 * socket.send / socket.recv_into each also paid a method look-up, argument parsing, a
 * bytes or buffer export, and letting go of the GIL and taking it back around a call that
 * never blocks: about a twelfth of a blocking round trip's user time beside a busy
 * process.  Here the call is made as it is, the GIL held (it returns at once either way).
 *
 * The caller passes the socket object, not its number: a closed socket's descriptor is -1
 * (nothing is rung, nothing drained), where a number kept from before would name whatever
 * file took it next.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stddef.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>

/* The head of CPython's socket object (Modules/socketmodule.h, PySocketSockObject, the
 * same since Python 2): its descriptor first, -1 once closed.  Read where the object is a
 * _socket.socket (or a subclass: they only add fields after it), without the fileno()
 * call; anything else is asked for fileno(). */
typedef struct {
    PyObject_HEAD
    int sock_fd;
} socket_head;

static PyObject *str_fileno;
static PyTypeObject *socket_type;

/* The socket's descriptor (-1: closed), or -2 with an error set. */
static int descriptor(PyObject *sock) {
    if (PyObject_TypeCheck(sock, socket_type)) {
        int fd = ((socket_head *)sock)->sock_fd;
        return fd < 0 ? -1 : fd;
    }
    PyObject *number = PyObject_CallMethodNoArgs(sock, str_fileno);
    if (number == NULL)
        return -2;
    long fd = PyLong_AsLong(number);
    Py_DECREF(number);
    if (fd == -1 && PyErr_Occurred())
        return -2;
    if (fd < -1 || fd > 0x7fffffff) {
        PyErr_SetString(PyExc_ValueError, "fileno() out of range");
        return -2;
    }
    return (int)fd;
}

/* ring(sock) -> bool: one byte sent (MSG_NOSIGNAL | MSG_DONTWAIT); False where it did not
 * go: full (rung already: a wake-up is pending), closed, or a dead peer. */
static PyObject *ring(PyObject *self, PyObject *sock) {
    (void)self;
    int fd = descriptor(sock);
    if (fd == -2)
        return NULL;
    if (fd < 0)
        Py_RETURN_FALSE;
    static const char one = 1;
    ssize_t sent;
    do
        sent = send(fd, &one, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    while (sent < 0 && errno == EINTR);
    return PyBool_FromLong(sent == 1);
}

/* The most one drain reads (exported as DRAIN_MOST: smcr.rdma.doorbell's must be the same,
 * as its callers tell a full read, after which more may wait, by it). */
#define DRAIN_MOST 4096

/* drain(sock) -> int: the bytes read (MSG_DONTWAIT), up to DRAIN_MOST in one call, as one
 * recv_into of a buffer that size reads them; 0 where none waited or the socket is
 * closed. */
static PyObject *drain(PyObject *self, PyObject *sock) {
    (void)self;
    int fd = descriptor(sock);
    if (fd == -2)
        return NULL;
    if (fd < 0)
        return PyLong_FromLong(0);
    char sink[DRAIN_MOST];
    ssize_t got;
    do
        got = recv(fd, sink, sizeof sink, MSG_DONTWAIT);
    while (got < 0 && errno == EINTR);
    return PyLong_FromSsize_t(got > 0 ? got : 0);
}

/* The ring datagram "r" sent from sock to the size bytes of addr (MSG_DONTWAIT): 0 when it
 * went, else the errno (EAGAIN: the receiver's queue, or the sender's buffer, is full;
 * EBADF: sock closed); NULL with an error set where sock gives no descriptor.  What
 * ring_to and ring_rid send once each has made its address. */
static PyObject *send_ring(PyObject *sock, const struct sockaddr_un *addr, socklen_t size) {
    int fd = descriptor(sock);
    if (fd == -2)
        return NULL;
    if (fd < 0)
        return PyLong_FromLong(EBADF);
    ssize_t sent;
    do
        sent = sendto(fd, "r", 1, MSG_DONTWAIT, (const struct sockaddr *)addr, size);
    while (sent < 0 && errno == EINTR);
    return PyLong_FromLong(sent < 0 ? errno : 0);
}

/* ring_to(sock, name) -> int: one datagram "r" sent to the unix socket address name
 * (MSG_DONTWAIT), the address made as sock.sendto(b"r", MSG_DONTWAIT, name) makes it
 * (CPython's getsockaddrarg: an abstract name, with its leading NUL, or a path, followed by
 * a NUL not counted in the length): 0 when it went, else the errno (EAGAIN: the
 * receiver's queue, or the sender's buffer, is full; EBADF: sock closed). */
static PyObject *ring_to(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "ring_to takes a socket and a name");
        return NULL;
    }
    char *name;
    Py_ssize_t len;
    if (PyBytes_AsStringAndSize(args[1], &name, &len) < 0)
        return NULL;
    struct sockaddr_un addr;
    int abstract = len == 0 || name[0] == 0;
    if ((size_t)len > sizeof addr.sun_path - (abstract ? 0 : 1)) {
        PyErr_SetString(PyExc_OSError, "AF_UNIX path too long");
        return NULL;
    }
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    memcpy(addr.sun_path, name, (size_t)len);
    size_t size = offsetof(struct sockaddr_un, sun_path) + (size_t)len;
    return send_ring(args[0], &addr, (socklen_t)size);
}

/* The multiplier that scrambles a readiness descriptor's rid into its name (exported as
 * SCRAMBLE: smcr.rdma.doorbell's must be the same, since a consumer binds the name its
 * Python makes and a producer here rings the name this makes). */
#define SCRAMBLE 0x9E3779B1u

/* ring_rid(sock, prefix, rid) -> int: ring_to(sock, name) where name is prefix followed by
 * (rid * SCRAMBLE) mod 2**32 in eight lower-case hex digits (smcr.rdma.doorbell.bell_name),
 * made here in the address itself: no name object per ring.  The prefix is an abstract
 * name's start (a leading NUL). */
static PyObject *ring_rid(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "ring_rid takes a socket, a prefix and a rid");
        return NULL;
    }
    char *prefix;
    Py_ssize_t len;
    if (PyBytes_AsStringAndSize(args[1], &prefix, &len) < 0)
        return NULL;
    struct sockaddr_un addr;
    if (len < 1 || prefix[0] != 0 || (size_t)len + 8 > sizeof addr.sun_path) {
        PyErr_SetString(PyExc_ValueError, "ring_rid needs an abstract name's prefix");
        return NULL;
    }
    unsigned long long rid = PyLong_AsUnsignedLongLongMask(args[2]);
    if (rid == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    memcpy(addr.sun_path, prefix, (size_t)len);
    static const char digits[] = "0123456789abcdef";
    unsigned int scrambled = (unsigned int)(rid * SCRAMBLE);
    for (int i = 7; i >= 0; i--, scrambled >>= 4)
        addr.sun_path[len + i] = digits[scrambled & 15];
    size_t size = offsetof(struct sockaddr_un, sun_path) + (size_t)len + 8;
    return send_ring(args[0], &addr, (socklen_t)size);
}

/* queued(sock) -> bool: whether a datagram (or a byte) waits, taking nothing (MSG_PEEK). */
static PyObject *queued(PyObject *self, PyObject *sock) {
    (void)self;
    int fd = descriptor(sock);
    if (fd == -2)
        return NULL;
    if (fd < 0)
        Py_RETURN_FALSE;
    char one;
    ssize_t got;
    do
        got = recv(fd, &one, 1, MSG_DONTWAIT | MSG_PEEK);
    while (got < 0 && errno == EINTR);
    return PyBool_FromLong(got >= 0);
}

/* The most descriptors one ready() reports (the rest stay ready: the next look reports them). */
#define READY_MOST 256

/* ready(ep) -> list[int]: the descriptors the epoll object ep (select.epoll, or anything
 * with a fileno()) reports ready now, epoll_wait with a timeout of 0, the GIL held.  Why:
 * select.epoll.poll(0) lets the GIL go around a call that never waits, and a thread of
 * ours that wants it (the progress thread, the application's) takes it, for the caller to
 * wait until it is given back: the RoCE CQ's look at its QP sockets, at every poll. */
static PyObject *ready(PyObject *self, PyObject *ep) {
    (void)self;
    int fd = descriptor(ep);
    if (fd == -2)
        return NULL;
    if (fd < 0) {
        PyErr_SetString(PyExc_ValueError, "I/O operation on closed epoll object");
        return NULL;
    }
    struct epoll_event events[READY_MOST];
    int n;
    for (;;) {
        n = epoll_wait(fd, events, READY_MOST, 0);
        if (n >= 0 || errno != EINTR)
            break;
        if (PyErr_CheckSignals() < 0)
            return NULL;
    }
    if (n < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (int i = 0; i < n; i++) {
        PyObject *number = PyLong_FromLong(events[i].data.fd);
        if (number == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, number);
    }
    return out;
}

static PyMethodDef methods[] = {
    {"ring", ring, METH_O, "Ring a doorbell socket: one byte, never blocking; whether it went."},
    {"drain", drain, METH_O, "Drain a doorbell socket, never blocking; the bytes read."},
    {"ring_to", (PyCFunction)(void (*)(void))ring_to, METH_FASTCALL,
     "Send a ring datagram to a unix socket name, never blocking; 0 or the errno."},
    {"ring_rid", (PyCFunction)(void (*)(void))ring_rid, METH_FASTCALL,
     "Send a ring datagram to the readiness descriptor named by a prefix and a rid."},
    {"queued", queued, METH_O, "Whether something waits on a socket (MSG_PEEK, no wait)."},
    {"ready", ready, METH_O, "The descriptors an epoll object reports ready now (no wait)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "smcr.rdma._doorbell",
    "Doorbells rung and drained in C (see the source's comment).", -1, methods,
};

PyMODINIT_FUNC PyInit__doorbell(void) {
    str_fileno = PyUnicode_InternFromString("fileno");
    if (str_fileno == NULL)
        return NULL;
    PyObject *sockets = PyImport_ImportModule("_socket");
    if (sockets == NULL)
        return NULL;
    PyObject *type = PyObject_GetAttrString(sockets, "socket");
    Py_DECREF(sockets);
    if (type == NULL)
        return NULL;
    if (!PyType_Check(type) || ((PyTypeObject *)type)->tp_basicsize < (Py_ssize_t)sizeof(socket_head)) {
        Py_DECREF(type);
        PyErr_SetString(PyExc_ImportError, "_socket.socket is not the type this build reads");
        return NULL;
    }
    /* the layout checked once on a socket of our own: its head's number is fileno()'s */
    PyObject *probe = PyObject_CallFunction(type, "ii", AF_UNIX, SOCK_DGRAM);
    if (probe == NULL) {
        Py_DECREF(type);
        return NULL;
    }
    PyObject *number = PyObject_CallMethodNoArgs(probe, str_fileno);
    long fd = number != NULL ? PyLong_AsLong(number) : -2;
    Py_XDECREF(number);
    int same = fd >= 0 && ((socket_head *)probe)->sock_fd == fd;
    PyObject *closed = PyObject_CallMethod(probe, "close", NULL);
    Py_XDECREF(closed);
    Py_DECREF(probe);
    if (PyErr_Occurred() || !same) {
        Py_DECREF(type);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ImportError, "_socket.socket is not laid out as this build reads");
        return NULL;
    }
    socket_type = (PyTypeObject *)type;
    PyObject *made = PyModule_Create(&module);
    if (made != NULL && (PyModule_AddIntConstant(made, "DRAIN_MOST", DRAIN_MOST) < 0
                         || PyModule_AddIntConstant(made, "SCRAMBLE", SCRAMBLE) < 0))
        Py_CLEAR(made);
    return made;
}
