"""One SMC-R connection held by several socket objects, as dup'ed descriptors hold one kernel
socket: ``dup``, ``detach`` and a socket made from ``fileno()`` (``socket.fromfd``,
``socket.socket(fileno=...)``).  The last holder to close (or be collected) closes the
connection; a detached descriptor counts as a holder until a socket is made from it.
"""

from __future__ import annotations

import errno
import os
import stat
import weakref
from collections.abc import Callable
from typing import Any, cast

from smcr.socket.base import (
    PlainSocket,
    QueueLike,
    SocketBase,
    accept_queues,
    collected,
    new_socket,
    orphan,
    smc_sockets,
)
from smcr.socket.numbers import own_number
from smcr.stack.conn import METHODS, SocketCalls

HOLDER_OWN = frozenset({
    "_finalizer", "_queue_finalizer", "_share", "_borrowed_fd", "_via_readiness", "_shown",
    "_shown_tcp", "_closed", "_io_refs", "_gone", "_timeout", "_parent_ends", "_fork_ends",
    "_calls", "_tcp_hold", *METHODS})
"""A socket's own attributes, not a connection's: each holder has its own (its calls, with
its timeout, are :class:`~smcr.stack.conn.SocketCalls` of the one connection)."""


class Share:
    """One SMC-R connection held by several socket objects, as dup'ed descriptors hold one
    kernel socket: ``dup``, ``detach`` and a socket made from ``fileno()`` (``fromfd``).
    The last holder to close (or be collected) closes the connection; a detached
    descriptor counts as a holder until a socket is made from it."""

    def __init__(self, sock: SocketBase) -> None:
        assert sock._calls is not None and sock._hc is not None
        self.path = sock._calls.path
        self.hc = sock._hc
        self.family = sock.family
        self.holders = 1
        self.detached: list[int] = []  # descriptors detach() returned, not yet made sockets
        self.addresses = (address_of(sock, PlainSocket.getsockname),
                          address_of(sock, PlainSocket.getpeername))  # fmt: skip
        self.state = {k: v for k, v in vars(sock).items() if k not in HOLDER_OWN}
        """What a new holder takes over from the first (:func:`join`)."""
        self.state["_mode"] = "SMCR"

    def readiness_fd(self) -> int:
        readiness = self.hc.readiness
        return -1 if readiness is None else readiness.fileno()

    def release(self) -> bool:
        """A holder lets go: whether the connection is still held (by others)."""
        self.holders -= 1
        return self.holders > 0 or bool(self.detached)

    def collected(self, calls: SocketCalls | None) -> None:
        """A holder was garbage-collected unclosed (``weakref.finalize``): its calls fail with
        ``EBADF`` from now on; the connection closes when it was the last holder."""
        if calls is not None:
            calls.closed = True
        if not self.release():
            orphan(self.path)


detached_shares: set[Share] = set()
"""Connections whose descriptor ``detach`` gave out (see :class:`Share`)."""


def socket_file(fd: int) -> tuple[int, int] | None:
    """(device, inode) of the socket ``fd`` names (what its dups name too), or None for a
    descriptor that is not an open socket."""
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISSOCK(st.st_mode) else None


def share_of(fd: int) -> Share | None:
    """The SMC-R connection whose readiness descriptor ``fd`` is (or is a dup of), if any;
    a detached descriptor becomes the new socket's (no longer counted apart)."""
    key = socket_file(fd)
    if key is None:
        return None
    for share in list(detached_shares):
        if same_file(share.readiness_fd(), key):
            if fd in share.detached:
                share.detached.remove(fd)
            elif share.detached:
                share.detached.pop()
            if not share.detached:
                detached_shares.discard(share)
            return share
    for sock in list(smc_sockets):
        hc = sock._hc
        if hc is not None and hc.readiness is not None and hc.readiness.file == key:
            return shared(sock)
    return None


def queue_of(fd: int) -> QueueLike | None:
    """The accept queue of this process whose readiness descriptor ``fd`` is (or is a dup
    of): ``fd`` came from a listening socket's ``fileno()``."""
    key = socket_file(fd)
    if key is None:
        return None
    for queue in list(accept_queues):
        if queue.pid == os.getpid() and not queue.closed and queue.readiness.file == key:
            return cast(QueueLike, queue)
    return None


def listen_with(sock: SocketBase, queue: QueueLike) -> None:
    """``sock``, made from a listening socket's number (``fromfd``, ``dup``), listens with
    that socket's accept queue: its ``accept`` takes from it, its addresses and options
    are the listening TCP socket's, and the queue stays until its last holder closes."""
    sock._via_readiness = True
    sock._mode = "LISTEN"
    sock._smc_ok = True
    sock._queue = queue
    with queue.cond:
        queue.holders += 1
    sock._queue_finalizer = weakref.finalize(sock, queue.release)
    sock._queue_finalizer.atexit = False


def address_of(sock: SocketBase, get: Callable[[Any], Any]) -> Any:
    """The TCP connection's address (``getsockname``/``getpeername``), None once there is
    none: a connection that has ended is still dup'ed and detached, as a descriptor is."""
    try:
        return get(sock)
    except OSError:
        return None


def shared_address(address: Any) -> Any:
    """An address of :attr:`Share.addresses`, or ``ENOTCONN`` as the kernel's for none."""
    if address is None:
        raise OSError(errno.ENOTCONN, os.strerror(errno.ENOTCONN))
    return address


def same_file(fd: int, key: tuple[int, int]) -> bool:
    try:
        st = os.fstat(fd)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == key


def detach(sock: SocketBase) -> int:
    """As ``socket.detach``.  In SMC-R mode it returns what :meth:`fileno` returned
    (the readiness descriptor), and the connection waits for a socket made from it
    (``socket.socket(fileno=...)``); the bytes are in the runtime, not in a
    descriptor.  Not while connecting, nor for a listener whose queue runs."""
    if sock._mode == "CONNECTING" or (sock._mode == "LISTEN" and sock._queue):
        raise OSError(errno.EOPNOTSUPP, "detach is not supported by an SMC-R socket")
    if sock._mode != "SMCR" or sock._gone:
        if sock._shown_tcp is not None and not sock._gone:  # (after a fallback)
            sock._shown_tcp.detach()
            sock._shown_tcp = None
            os.close(PlainSocket.detach(sock))
            return sock._shown
        return PlainSocket.detach(sock)
    fd = sock.fileno()
    share = shared(sock)
    if not sock._borrowed_fd or share.holders == 1:  # (a borrowed descriptor that
        share.detached.append(fd)  # others hold the connection for is theirs)
        detached_shares.add(share)
    if sock._finalizer is not None:
        sock._finalizer.detach()
    share.release()
    sock._gone = sock._closed = True
    sock._let_go_calls()
    smc_sockets.discard(sock)
    sock._drop_descriptor()
    return fd


def shared(sock: SocketBase) -> Share:
    """This socket's connection as something several sockets hold (made on the
    first ``dup``/``detach``; from then on the last one to close closes it)."""
    if sock._share is None:
        share = sock._share = Share(sock)
        if sock._finalizer is not None:
            sock._finalizer.detach()
        sock._finalizer = weakref.finalize(sock, share.collected, sock._calls)
        sock._finalizer.atexit = False
        return share
    assert isinstance(sock._share, Share)
    return sock._share


def join(sock: SocketBase, share: Share, borrowed: bool) -> None:
    """Become one more holder of ``share``'s connection (a new socket object)."""
    for name, value in share.state.items():
        setattr(sock, name, value)
    sock._share = share
    share.holders += 1
    sock._borrowed_fd = borrowed
    sock._calls = SocketCalls(share.path, sock._timeout)
    sock._finalizer = weakref.finalize(sock, share.collected, sock._calls)
    sock._finalizer.atexit = False
    sock._shadow_fast()
    smc_sockets.add(sock)


def move(sock: SocketBase) -> SocketBase:
    """A new socket object that owns this one's connection from now on; this one is
    closed, as ``ssl.SSLContext.wrap_socket`` detaches the socket it wraps (the
    caller may close the original afterwards without touching the connection)."""
    # the descriptor itself moves (one the runtime holds too stays held so)
    hold, sock._tcp_hold = sock._tcp_hold, None
    new = new_socket(type(sock), sock.family, sock.type, sock.proto, PlainSocket.detach(sock))
    new._tcp_hold = hold
    for name, value in vars(sock).items():
        if name not in ("_finalizer", "_queue_finalizer", "_shown_tcp", "_calls", "_tcp_hold",
                        *METHODS):  # fmt: skip
            setattr(new, name, value)
    calls = sock._calls
    new_calls = None
    if calls is not None:  # the new socket's own hold on the connection
        new._calls = new_calls = SocketCalls(calls.path, calls.timeout)
        if new._mode == "SMCR":
            new._shadow_fast()
    if sock._shown_tcp is not None:
        sock._shown_tcp.detach()
        sock._shown_tcp = None
        own_number(new, new._shown)
    queue = sock._queue
    if queue is not None and sock._queue_finalizer is not None:  # a listener's queue
        sock._queue_finalizer.detach()
        sock._queue_finalizer = None
        new._queue_finalizer = weakref.finalize(new, queue.release)
        new._queue_finalizer.atexit = False
        queue.listener = weakref.ref(new)
    if sock._finalizer is not None and new_calls is not None:
        sock._finalizer.detach()
        new._finalizer = weakref.finalize(new, collected, new_calls)
        new._finalizer.atexit = False
    if sock in smc_sockets:
        smc_sockets.discard(sock)
        smc_sockets.add(new)
    sock._gone = sock._closed = True
    sock._let_go_calls()
    sock._finalizer = None
    sock._real_close()
    return new


def dup(sock: SocketBase) -> SocketBase:
    """As ``socket.dup``: in SMC-R mode a second socket on the same connection (the
    last of them to close closes it); not while connecting."""
    if sock._mode == "CONNECTING":
        raise OSError(errno.EOPNOTSUPP, "dup is not supported while connecting")
    if sock._mode == "SMCR" and not sock._gone:
        share = shared(sock)
        new = new_socket(type(sock), sock.family, sock.type, sock.proto,
                         os.dup(PlainSocket.fileno(sock)))  # fmt: skip
        join(new, share, borrowed=False)
        new.settimeout(sock.gettimeout())
        return new
    queue = sock._queue
    listening = sock._mode == "LISTEN" and queue is not None and queue.pid == os.getpid()
    # a listener's number names its accept queue's readiness: a socket made from a dup of
    # it listens with that queue (queue_of), as a dup'ed descriptor names one listener
    fd = os.dup(sock.fileno() if listening else PlainSocket.fileno(sock))
    new = new_socket(type(sock), sock.family, sock.type, sock.proto, fd, accepted=False)
    new.settimeout(sock.gettimeout())
    return new
