"""The runtime's own sockets made from descriptors (doorbells, readiness descriptors, a peer's
bell, the shm RNIC's accepted rendezvous connections), with the standard library's socket
class.

Under ``smcr run`` the ``socket`` module's ``socket`` is smcr's class (:mod:`smcr.run`),
which makes every socket built from a descriptor an SMC socket, as a program's
``socket.fromfd`` of an SMC socket's ``fileno()`` must be; ``socket.socketpair()`` builds
its pairs, and ``accept`` its connections, that way too.  Each socket the runtime made for
itself then went through the SMC socket's constructor, which looks the descriptor up among
the process's SMC connections and listeners (a ``stat`` and a walk of them).  These sockets
are never the program's.
"""

from __future__ import annotations

import _socket
import ctypes
import os
import socket


def _plain_class() -> type[socket.socket]:
    cls: type[socket.socket] = getattr(socket.socket, "_smcr_plain", socket.socket)
    return cls


def socketpair(family: int = socket.AF_UNIX,
               kind: int = socket.SOCK_STREAM) -> tuple[socket.socket, socket.socket]:  # fmt: skip
    """A connected pair, as ``socket.socketpair()`` outside ``smcr run``."""
    cls = _plain_class()
    a, b = _socket.socketpair(family, kind, 0)
    return cls(family, kind, 0, a.detach()), cls(family, kind, 0, b.detach())


def nonblocking_pair() -> tuple[_socket.socket, _socket.socket]:
    """A connected unix stream pair, both ends non-blocking, as the C socket type: one
    system call (``socketpair`` with ``SOCK_NONBLOCK``), where ``socket.socketpair()`` and
    two ``setblocking`` cost five (wrapping each end in ``socket.socket`` asks the kernel for
    its name, and ``setblocking`` is an ``ioctl`` each): what a connection's readiness
    descriptor costs every connection."""
    return _socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK, 0)


def from_descriptor(fd: int) -> socket.socket:
    """The socket of descriptor ``fd``, as ``socket.socket(fileno=fd)`` outside ``smcr run``."""
    return _plain_class()(fileno=fd)


def accept(listener: socket.socket) -> socket.socket:
    """The next connection of ``listener``, as its ``accept()`` outside ``smcr run``."""
    fd, _addr = listener._accept()  # type: ignore[attr-defined]
    conn = from_descriptor(fd)
    if socket.getdefaulttimeout() is None and listener.gettimeout():
        conn.setblocking(True)
    return conn


def datagram() -> _socket.socket:
    """A non-blocking unix datagram socket (readiness descriptors, bells)."""
    return _socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK)


class _Unspec(ctypes.Structure):
    _fields_ = [("family", ctypes.c_ushort), ("data", ctypes.c_char * 14)]


def disconnect(sock: _socket.socket) -> None:
    """Undo a datagram socket's ``connect`` (``connect`` to ``AF_UNSPEC``, which Python's
    ``connect`` cannot name): it takes datagrams from anyone again.

    :raises OSError: as ``connect(2)`` fails."""
    libc = ctypes.CDLL(None, use_errno=True)
    unspec = _Unspec(socket.AF_UNSPEC)
    if libc.connect(sock.fileno(), ctypes.byref(unspec), ctypes.sizeof(unspec)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
