"""A descriptor whose readability and writability follow an SMC-R connection.

``fileno()`` of an SMC socket in SMC-R mode is one end of a unix socket pair that the
runtime makes readable (a byte is waiting) and writable (the other end drained) to
follow the connection, so that ``select``, ``poll``, ``epoll``, ``selectors`` and asyncio
watch it as they would a TCP socket.
"""

from __future__ import annotations

import os
import socket
from typing import Final

from smcr import plainsock
from smcr.stack.descriptors import put_at

_DONTWAIT: Final = socket.MSG_DONTWAIT
_FILL: Final = bytes(65536)
"""More than the not-writable fill takes (``a``'s send buffer is the smallest the kernel
allows): one non-blocking send of it stops short, which says the queue is full."""
_DRAIN: Final = 65536
"""A read of the fill (a few KiB): one that comes back short has emptied the queue."""
_DRAIN_READABLE: Final = 64
"""A read of the readable byte (one per change to readable)."""


class Readiness:
    """A descriptor whose readability/writability the runtime sets (see module doc).

    Readable: one byte waits in ``a``.  Not writable: ``a`` has filled the other
    end's queue; writable again once ``b`` is drained.
    """

    def __init__(self) -> None:
        self.a, self.b = plainsock.nonblocking_pair()
        self.a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1024)
        self.readable = False
        self.writable = True
        st = os.fstat(self.a.fileno())
        self.file = (st.st_dev, st.st_ino)
        """(device, inode) of the descriptor's file: whether a number names it."""
        self.app = -1
        """The application's number for ``a``'s file (:meth:`fileno`), -1 before it asks."""

    def lost(self) -> bool:
        """Whether the application's descriptor was closed under us (``os.close`` of
        what ``fileno()`` gave) or now names another file: a socket's would-block path
        asks, so that its call fails with ``EBADF`` as one on the closed descriptor of
        a TCP socket does (one ``fstat``, only where the call would block anyway)."""
        return self.app >= 0 and not self._names_ours(self.app)

    def _names_ours(self, number: int) -> bool:
        try:
            st = os.fstat(number)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self.file

    def set_blocking(self, blocking: bool) -> None:
        """Give the application's descriptor the socket's blocking mode (``O_NONBLOCK``),
        for programs that look at the flag of what ``fileno()`` returned; the runtime's
        own reads and writes of it never block either way."""
        try:
            os.set_blocking(self.a.fileno(), blocking)
        except OSError:
            pass

    def fileno(self) -> int:
        """The application's descriptor: a number of its own for ``a``'s file, apart from
        the one the runtime reads and writes, so that a program that closes what it was
        given (``os.close(sock.fileno())``) never has the runtime write into whatever
        file takes that number next."""
        if self.app < 0:
            self.app = os.dup(self.a.fileno())
        return self.app

    def place(self, number: int) -> None:
        """Give the application this descriptor under ``number`` from now on (whatever it
        named before goes: :func:`smcr.stack.descriptors.put_at`)."""
        put_at(number, self.a.fileno())
        if self.app >= 0 and self.app != number:
            try:
                os.close(self.app)
            except OSError:
                pass
        self.app = number

    def disown(self) -> None:
        """The application's number names another file now (the socket's TCP socket):
        :meth:`close` leaves it alone."""
        self.app = -1

    def set(self, readable: bool, writable: bool) -> None:
        """Make the descriptor's readiness match (syscalls only on a change).

        Writability first: a connect that settles turns writable before readable, so
        a program waiting for ``EPOLLOUT`` never sees ``EPOLLIN`` alone meanwhile (a
        loop that counts wakeups, or one that reads on ``EPOLLIN`` only, took such an
        in-between state for the socket's: the thread setting it may wait for the GIL
        while the program polls and spins)."""
        # (each loop ends on a short count, not on EAGAIN: an exception per change, each
        # message's readable -> unreadable among them, cost more than its system call)
        if writable != self.writable:
            self.writable = writable
            if writable:
                try:
                    while len(self.b.recv(_DRAIN, _DONTWAIT)) == _DRAIN:
                        pass
                except OSError:
                    pass
            else:
                try:
                    while self.a.send(_FILL, _DONTWAIT) == len(_FILL):
                        pass
                except OSError:
                    pass
        if readable != self.readable:
            self.readable = readable
            if readable:
                try:
                    self.b.send(b"r", _DONTWAIT)
                except OSError:
                    pass
            else:
                try:
                    while len(self.a.recv(_DRAIN_READABLE, _DONTWAIT)) == _DRAIN_READABLE:
                        pass
                except OSError:
                    pass

    def fail(self) -> None:
        """Ready for good, as a TCP socket whose connect failed: readable, writable, and
        ``EPOLLERR``/``EPOLLHUP`` in poll (a program waiting for either wakes as over TCP).

        How: ``b`` goes while it holds unread bytes of ``a``'s (the not-writable fill),
        and Linux then gives ``a`` the error ``ECONNRESET`` (``unix_release_sock``) and
        both shutdowns; ``b``'s queue freed makes ``a`` writable.  Later :meth:`set`
        calls change nothing (``b`` is closed: their sends and drains fail quietly)."""
        if self.writable:
            self.set(self.readable, False)  # (``b`` must hold unread bytes)
        try:
            self.b.close()  # (one change: all of a's events at once)
        except OSError:
            pass
        self.readable = self.writable = True

    def close(self) -> None:
        """Release both ends (the application's end may have been closed under us by a
        program that closes the descriptors it was given)."""
        for end in (self.a, self.b):
            try:
                end.close()
            except OSError:
                pass
        app, self.app = self.app, -1
        if app >= 0 and self._names_ours(app):  # (not a number closed and taken since)
            try:
                os.close(app)
            except OSError:
                pass
