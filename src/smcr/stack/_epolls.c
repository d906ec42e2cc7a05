/* The process's epoll instances, and whether one watches a descriptor, found with one
 * system call per descriptor and none of Python's machinery per descriptor.
 *
 * Why: smcr.stack.descriptors carries a program's epoll registrations of a descriptor
 * number over when another file takes the number (a non-blocking connect's readiness
 * descriptor, the TCP socket again after a fallback).  Finding the epoll instances means
 * looking at every descriptor of the process; in Python (os.listdir, then os.readlink of
 * each) that cost 4.5 us a descriptor, 6.8 ms a connect for an asyncio client with 500
 * connections open: its connects took 22 times TCP's time, nearly all of it there.  Here
 * each descriptor costs one epoll_ctl that asks it to forget a descriptor it never had
 * (ENOENT from an epoll instance, EINVAL from any other file, EBADF from a closed number:
 * no registration of the program's is touched), 0.15 us here, where an fstat cost 0.4
 * (the security module's look at each inode).  Whether an instance watches the number's
 * file is asked of the kernel (kcmp's KCMP_EPOLL_TFD: a walk of the instance's
 * registrations in the kernel, a few nanoseconds each), so that its whole registration
 * list (/proc/self/fdinfo: a formatted line per registration, hundreds in an event loop's
 * instance) is read only where it does.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define FD_DIR "/proc/self/fd"
#define EPOLL_LINK "anon_inode:[eventpoll]"
#define KCMP_EPOLL_TFD 7 /* linux/kcmp.h */

/* Whether fd names an epoll instance, asked with fstat and readlink (where no probe could
 * be made): an anonymous inode (no file type bits) whose link reads as one.  1, 0 for
 * another file, -1 for a closed number. */
static int looked_at(int fd) {
    struct stat st;
    if (fstat(fd, &st) < 0)
        return -1;
    if ((st.st_mode & S_IFMT) != 0)
        return 0;
    char path[48], link[sizeof EPOLL_LINK + 1];
    snprintf(path, sizeof path, FD_DIR "/%d", fd);
    ssize_t n = readlink(path, link, sizeof link - 1);
    if (n != (ssize_t)(sizeof EPOLL_LINK - 1))
        return 0;
    link[n] = '\0';
    return strcmp(link, EPOLL_LINK) == 0;
}

/* Whether fd names an epoll instance: 1, 0 for another file, -1 for a closed number.
 * probe: a descriptor of ours that no epoll instance watches (an eventfd made for the
 * look), which fd is asked to forget; -1: none, fstat and readlink look instead. */
static int is_epoll(int fd, int probe) {
    if (probe < 0)
        return looked_at(fd);
    if (epoll_ctl(fd, EPOLL_CTL_DEL, probe, NULL) == 0)
        return 1; /* (cannot be: nothing ever registered the probe) */
    return errno == ENOENT ? 1 : (errno == EBADF ? -1 : 0);
}

/* Found epoll descriptors, in a buffer that grows (the GIL let go meanwhile). */
typedef struct {
    int *fds;
    int count, room;
} found_t;

/* Note fd.  0, or -1 (out of memory). */
static int note(found_t *found, int fd) {
    if (found->count == found->room) {
        int room = found->room ? 2 * found->room : 16;
        int *more = realloc(found->fds, (size_t)room * sizeof *more);
        if (more == NULL)
            return -1;
        found->fds = more;
        found->room = room;
    }
    found->fds[found->count++] = fd;
    return 0;
}

/* The epoll descriptors from skip_below on among those /proc/self/fd lists (probe: as
 * is_epoll's).  0, or -1 (errno set). */
static int listed(found_t *found, int skip_below, int probe) {
    DIR *dir = opendir(FD_DIR);
    if (dir == NULL)
        return -1;
    int own = dirfd(dir), failed = 0;
    struct dirent *entry;
    while (!failed && (entry = readdir(dir)) != NULL) {
        if (entry->d_name[0] < '0' || entry->d_name[0] > '9')
            continue;
        int fd = atoi(entry->d_name);
        if (fd != own && fd >= skip_below && is_epoll(fd, probe) == 1)
            failed = note(found, fd) < 0;
    }
    closedir(dir);
    if (failed)
        errno = ENOMEM;
    return failed ? -1 : 0;
}

/* epoll_fds() -> list[int]: this process's descriptors that name epoll instances.
 *
 * The numbers are walked from 0 until as many open ones were seen as the kernel counts
 * (the size of /proc/self/fd, Linux 6.2 on), each asked by is_epoll; where the kernel
 * gives no count, or the walk goes far past it without finding them all (descriptors
 * closed meanwhile by another thread), the directory's listing says which of the rest are
 * open. */
static PyObject *epoll_fds(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    found_t found = {NULL, 0, 0};
    int failed = 0, walked_to = 0, done = 0;
    Py_BEGIN_ALLOW_THREADS
    int probe = eventfd(0, EFD_CLOEXEC); /* (-1, out of descriptors: fstat looks) */
    struct stat dir;
    if (stat(FD_DIR, &dir) == 0 && dir.st_size > 0) {
        long count = (long)dir.st_size, seen = 0, bound = 2 * count + 1024;
        int fd = 0;
        for (; seen < count && fd < bound && !failed; fd++) {
            int kind = is_epoll(fd, probe);
            seen += kind >= 0;
            if (kind == 1)
                failed = note(&found, fd) < 0;
        }
        walked_to = fd;
        done = seen >= count;
        if (failed)
            errno = ENOMEM;
    }
    if (!done && !failed)
        failed = listed(&found, walked_to, probe) < 0;
    if (probe >= 0) {
        int err = errno;
        close(probe);
        errno = err;
    }
    Py_END_ALLOW_THREADS
    PyObject *out = NULL;
    if (failed) {
        if (errno == ENOMEM)
            PyErr_NoMemory();
        else
            PyErr_SetFromErrnoWithFilename(PyExc_OSError, FD_DIR);
    } else if ((out = PyList_New(found.count)) != NULL) {
        for (int i = 0; i < found.count; i++) {
            PyObject *number = PyLong_FromLong(found.fds[i]);
            if (number == NULL) {
                Py_CLEAR(out);
                break;
            }
            PyList_SET_ITEM(out, i, number);
        }
    }
    free(found.fds);
    return out;
}

#define MOST 4096 /* registrations under one number looked at (kcmp's offsets) */

/* watches(epfd, number) -> 1 where the epoll instance epfd has a registration of the file
 * number names under number, 0 where it has none (none under number, or only of other
 * files: registrations left from files the number named before), -1 where the kernel
 * cannot say (no kcmp: a kernel without CONFIG_KCMP, a seccomp filter, ptrace denied). */
static PyObject *watches(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "watches takes 2 arguments");
        return NULL;
    }
    long epfd = PyLong_AsLong(args[0]), number = PyLong_AsLong(args[1]);
    if ((epfd == -1 || number == -1) && PyErr_Occurred())
        return NULL;
    if (epfd < 0 || number < 0 || epfd > INT32_MAX || number > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "descriptor out of range");
        return NULL;
    }
    pid_t pid = getpid();
    /* each registration under the number in turn (toff: its rank among them) */
    for (uint32_t toff = 0; toff < MOST; toff++) {
        struct {
            uint32_t efd, tfd, toff;
        } slot = {(uint32_t)epfd, (uint32_t)number, toff};
        long r = syscall(SYS_kcmp, pid, pid, KCMP_EPOLL_TFD, (unsigned long)number,
                         (unsigned long)&slot);
        if (r == 0)
            return PyLong_FromLong(1);
        if (r < 0)
            /* ENOENT: no more under the number; else (EBADF, EINVAL: closed, or no epoll
             * now; ENOSYS, EPERM) unknown */
            return PyLong_FromLong(errno == ENOENT ? 0 : -1);
    }
    return PyLong_FromLong(-1);
}

static PyMethodDef methods[] = {
    {"epoll_fds", epoll_fds, METH_NOARGS, "This process's epoll descriptors."},
    {"watches", (PyCFunction)(void (*)(void))watches, METH_FASTCALL,
     "Whether an epoll instance watches a descriptor's file under its number."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "smcr.stack._epolls",
    "This process's epoll instances, found in C (smcr.stack.descriptors).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__epolls(void) { return PyModule_Create(&module); }
