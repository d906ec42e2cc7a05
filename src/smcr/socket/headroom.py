"""Whether a process has descriptor numbers to spare, found without holding any: an SMC-R
connection needs descriptors a TCP connection does not (its readiness descriptor), so a
handshake starts, and a listener takes a connection in the background, only with some
free (:mod:`smcr.socket.handshake`, :mod:`smcr.socket.acceptq`).
"""

from __future__ import annotations

import fcntl
import os
import resource


def descriptor_shortage(fd: int, count: int) -> OSError | None:
    """Why ``count`` descriptor numbers are not free now (EMFILE, ENFILE...), or None when
    they are (found by duplicating ``fd``, an open descriptor, and closing the copies at
    once)."""
    taken: list[int] = []
    try:
        for _ in range(count):
            taken.append(os.dup(fd))
    except OSError as exc:
        return exc
    finally:
        for copy in taken:
            os.close(copy)
    return None


def descriptors_free(fd: int, count: int) -> bool:
    """Whether ``count`` descriptor numbers are free, probed from another thread than the
    program's without taking any number it could be about to reuse: the copies of ``fd``
    go to the top ``count`` numbers below the limit (``F_DUPFD``), which are free only if
    at least ``count`` are.  A probe that took the lowest free numbers held, for a moment,
    the very number an event loop had just freed to accept and close a peer (its reserved
    descriptor), whose reopening then failed with EMFILE (Twisted's
    ``test_closePeerOnEMFILE``, about one run in five)."""
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if limit == resource.RLIM_INFINITY or limit <= count:
        return descriptor_shortage(fd, count) is None
    taken: list[int] = []
    try:
        for _ in range(count):
            taken.append(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, limit - count))
    except OSError:
        return False
    finally:
        for copy in taken:
            os.close(copy)
    return True
