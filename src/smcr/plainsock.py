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
import errno
import math
import os
import select
import socket
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    PlainSocket = socket.socket
else:
    PlainSocket = getattr(socket.socket, "_smcr_plain", socket.socket)
"""``socket.socket`` as the standard library defines it (``smcr run`` replaces the
module's name with a class of its own, which names the original ``_smcr_plain``: this
module may be imported after that, with the first TCP socket)."""


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


ACCEPT_PAUSE: Final = 0.1
"""Seconds a runtime listener is left unwatched after its ``accept`` failed (``EMFILE``,
``ENFILE``, ``ENOBUFS``...): it stays readable while nothing can be accepted, and a
level-triggered watch on it would spin its thread at a whole CPU (asyncio's servers
pause the same way)."""


def accept(listener: socket.socket) -> socket.socket:
    """The next connection of ``listener``, as its ``accept()`` outside ``smcr run``."""
    fd, _addr = listener._accept()  # type: ignore[attr-defined]
    conn = from_descriptor(fd)
    if socket.getdefaulttimeout() is None and listener.gettimeout():
        conn.setblocking(True)
    return conn


def ready(fd: int | _socket.socket, write: bool = False, timeout: float | None = 0.0) -> bool:
    """Whether ``fd`` is readable (``write``: writable) within ``timeout`` seconds (None:
    however long it takes), as ``select.select`` would say, for any descriptor number:
    ``select`` refuses those of 1,024 and more (``FD_SETSIZE``), which a process with a few
    hundred connections reaches.  An error or hang-up counts as ``select`` counts it.

    :raises OSError: ``EBADF``, ``fd`` is not open (as from ``select``).
    :raises ValueError: ``fd`` is negative (a closed socket's)."""
    number = fd if isinstance(fd, int) else fd.fileno()
    if number < 0:
        raise ValueError(f"file descriptor cannot be a negative integer ({number})")
    poller = select.poll()
    poller.register(number, select.POLLOUT if write else select.POLLIN)
    # poll counts milliseconds: rounded up, or a wait shorter than one would spin
    wait = -1 if timeout is None else math.ceil(max(timeout, 0.0) * 1000)
    events = poller.poll(wait)
    if not events:
        return False
    mask = events[0][1]
    if mask & select.POLLNVAL:
        raise OSError(errno.EBADF, os.strerror(errno.EBADF))
    return bool(mask & (_WRITE_SET if write else _READ_SET))


_READ_SET: Final = select.POLLIN | select.POLLHUP | select.POLLERR
"""What ``select`` counts as readable (Linux's ``POLLIN_SET``, less its aliases)."""
_WRITE_SET: Final = select.POLLOUT | select.POLLERR
"""What ``select`` counts as writable (``POLLOUT_SET``)."""


def datagram() -> _socket.socket:
    """A non-blocking unix datagram socket (readiness descriptors, bells)."""
    return _socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK)


_SO_SNDBUFFORCE = 32  # (Linux; CAP_NET_ADMIN)
WIDE_SEND_BUFFER = 1 << 22
"""A ringing socket's send buffer, where the kernel allows it: each unread datagram counts
against it (4 MiB: about 5,000)."""


def widen_send_buffer(sock: _socket.socket) -> None:
    """Give a socket that rings others (one-byte datagrams left unread a while) the send
    buffer :data:`WIDE_SEND_BUFFER`, past the system's limit where we may."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, _SO_SNDBUFFORCE, WIDE_SEND_BUFFER)
    except OSError:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, WIDE_SEND_BUFFER)


class _Unspec(ctypes.Structure):
    _fields_ = [("family", ctypes.c_ushort), ("data", ctypes.c_char * 14)]


_CONNECT: list[Any] = []
"""libc's ``connect`` and an ``AF_UNSPEC`` address for it (found on first use)."""


def disconnect(sock: _socket.socket) -> None:
    """Undo a datagram socket's ``connect`` (``connect`` to ``AF_UNSPEC``, which Python's
    ``connect`` cannot name): it takes datagrams from anyone again.  (A named readiness
    descriptor does this each time it turns writable: libc's function is looked up once.)

    :raises OSError: as ``connect(2)`` fails."""
    if not _CONNECT:
        unspec = _Unspec(socket.AF_UNSPEC)
        _CONNECT.extend((ctypes.CDLL(None, use_errno=True).connect, ctypes.byref(unspec),
                         ctypes.sizeof(unspec), unspec))  # fmt: skip
    connect, address, size, _ = _CONNECT
    if connect(sock.fileno(), address, size) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
