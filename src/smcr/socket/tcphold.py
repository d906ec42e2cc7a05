"""One descriptor of an SMC-R connection's TCP socket, held by the program's socket object
and by the runtime at once.

Both need the TCP socket: the program's object for TCP's own calls (addresses, options,
``SO_ERROR``), the runtime for the CLC handshake, the TCP connection's end (a reset or
FIN from the peer) and, after the program's ``close``, the closing CDCs and then the FIN.
Either may let go first.  Each holding its own descriptor (a ``dup``) cost every
connection a descriptor, and at thousands of connections descriptors are what runs out
(``RLIMIT_NOFILE``).  So they share one: each side's socket object lets go of the number
without closing it (``detach``), and the side that lets go last closes it.

Garbage collection counts as letting go, on both sides: ``socket.socket``'s own finalizer
would close the number under the other side, so the objects here detach first (the
program's in :meth:`smcr.socket.base.SocketBase.__del__`, which also warns as that
finalizer does).

In a forked child both objects are copies of the parent's: the runtime's never closes the
number there (the child may have closed it and reused it, or put a relay's end under it:
:mod:`smcr.socket.fork`), the program's closes it as a descriptor of its own.
"""

from __future__ import annotations

import os
import socket
import threading

from smcr.plainsock import PlainSocket


class TcpHold:
    """Who holds one TCP descriptor: the program's socket object, the runtime, or both."""

    __slots__ = ("app", "fd", "lock", "pid", "runtime")

    def __init__(self, fd: int, app: bool) -> None:
        self.lock = threading.Lock()
        self.pid = os.getpid()
        self.fd = fd
        self.app = app
        """The program's socket object holds the number too (see :meth:`join`)."""
        self.runtime = True

    def join(self) -> bool:
        """The program's socket object takes the runtime's number as its own (it gave its
        first one out as the number of a readiness descriptor): whether it may, that is,
        whether the runtime still holds it."""
        with self.lock:
            if not self.runtime or self.pid != os.getpid():
                return False
            self.app = True
            return True

    def app_lets_go(self) -> bool:
        """The program's socket object has let go of the number: whether it must close it
        (the runtime had let go already, or this is a forked child's copy)."""
        with self.lock:
            if self.pid != os.getpid():
                return True
            self.app = False
            return not self.runtime

    def runtime_lets_go(self) -> bool:
        """The runtime has let go of the number: whether it must close it (the program's
        object had let go already; never in a forked child)."""
        with self.lock:
            if self.pid != os.getpid():
                return False
            self.runtime = False
            return not self.app

    @property
    def shared(self) -> bool:
        """Both hold it (the program's number must then not be put under another file)."""
        return self.app and self.runtime and self.pid == os.getpid()


class RuntimeTcp(PlainSocket):
    """The runtime's socket object of a TCP socket whose number a :class:`TcpHold` shares:
    closing (or collecting) it closes the number only if the program's object let go."""

    hold: TcpHold

    def close(self) -> None:
        fd = self.detach()
        if fd >= 0 and self.hold.runtime_lets_go():
            os.close(fd)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # (a finalizer must not raise; at exit, modules may be gone)
            pass


def runtime_tcp(family: int, hold: TcpHold) -> RuntimeTcp:
    """The runtime's object over ``hold``'s descriptor (family, type and protocol given: none of the
    three system calls that ``socket.socket`` makes to learn them from a bare
    descriptor)."""
    tcp = RuntimeTcp(family, socket.SOCK_STREAM, socket.IPPROTO_TCP, hold.fd)
    tcp.hold = hold
    return tcp
