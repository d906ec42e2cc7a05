"""The descriptor number of an SMC socket: one number for the socket's whole life, as a TCP
socket's, though what it must name changes with the mode (the TCP socket; the accept
queue's, the connect's or the connection's readiness descriptor; the TCP socket again
after a fallback).  :func:`reshow` moves the right file under it
(:func:`smcr.stack.descriptors.put_at`: epoll registrations move along).
"""

from __future__ import annotations

import _socket as _csocket
import os
import weakref

from smcr.socket.base import PlainSocket, SocketBase, c_family, c_gettimeout, c_proto, c_type
from smcr.stack.descriptors import put_at
from smcr.stack.readiness import Readiness


def readiness_now(sock: SocketBase) -> Readiness | None:
    """The readiness descriptor ``fileno()`` gives out now, if there is one."""
    if sock._mode == "LISTEN" and sock._queue is not None and sock._queue.pid == os.getpid():
        return sock._queue.readiness
    if sock._mode == "CONNECTING" and sock._connecting is not None:
        return sock._connecting.readiness
    if sock._mode == "SMCR" and sock._hc is not None:
        return sock._hc.readiness
    return None


def fileno(sock: SocketBase) -> int:
    """A descriptor for select/poll/selectors that follows recv/send readiness.

    One number for the socket's whole life, as a TCP socket's: what it names
    changes with the mode (the TCP socket; the accept queue's or the
    connection's readiness descriptor), moved under the number by
    :func:`reshow`, so that a selector or event loop that registered it
    before ``connect`` or ``listen`` keeps watching the right file."""
    if sock._gone:
        return -1
    if sock._shown >= 0:
        catch_up(sock)
        return sock._shown
    if sock._mode == "PLAIN" or sock._via_readiness:
        return PlainSocket.fileno(sock)
    readiness = app_readiness(sock)
    sock._shown = PlainSocket.fileno(sock) if readiness is None else readiness.fileno()
    queue_shown(sock, readiness)
    return sock._shown


def queue_shown(sock: SocketBase, readiness: Readiness | None) -> None:
    """``readiness`` was given a number of the program's: the accept queue's is brought
    up to date then (:meth:`AcceptQueue.show`)."""
    queue = sock._queue
    if readiness is not None and queue is not None and readiness is queue.readiness:
        queue.show()


def app_readiness(sock: SocketBase) -> Readiness | None:
    """The readiness descriptor the application's number names now (SMC-R mode: made
    on first use), or None where it names the TCP socket."""
    if sock._mode != "SMCR" or sock._calls is None:
        return readiness_now(sock)
    return sock._calls.check().readiness(sock._timeout is None)


def catch_up(sock: SocketBase) -> None:
    """The program's thread calls in: do the :func:`reshow` a background thread left
    due (a non-blocking connect settled to TCP in the watcher or runtime thread).

    Why not there: :func:`put_at` moves the program's epoll registrations of the
    number (read, unregister, ``dup2``, register), and a program's ``epoll_ctl`` of
    that number in between (tornado's and the tests' ``modify`` right after
    ``connect``) was lost (the events read before it came back) or failed with
    ``ENOENT``.  Meanwhile the number names the connect's readiness descriptor,
    which is ready (:meth:`Connecting._settle`), so the program wakes and calls
    in: ``getsockopt(SO_ERROR)``, ``send``/``recv``, ``fileno``."""
    if sock._reshow_due:
        sock._reshow_due = False
        try:  # (closed meanwhile)
            reshow(sock)
        except OSError:
            pass


def reshow(sock: SocketBase) -> None:
    """The mode changed: put under the number :func:`fileno` gave out (if it gave
    one) the file that follows the socket now (:func:`put_at`; epoll
    registrations move along).  A readiness descriptor takes the number and our
    TCP socket moves to a number of its own; back in TCP mode the TCP socket
    takes the number again (our socket object keeps its own, a duplicate)."""
    number = sock._shown
    if number < 0 or sock._gone:
        return
    readiness = app_readiness(sock)
    if readiness is None:
        if sock._shown_tcp is None and PlainSocket.fileno(sock) != number:
            for old in (sock._queue.readiness if sock._queue else None,
                        sock._connecting.readiness if sock._connecting else None,
                        sock._hc.readiness if sock._hc else None):  # fmt: skip
                if old is not None and old.app == number:
                    old.disown()  # (the number is the TCP socket's now)
            put_at(number, PlainSocket.fileno(sock))
            sock._shown_tcp = weakref.finalize(sock, close_number, number)
            sock._shown_tcp.atexit = False
        return
    if readiness.app == number:
        return
    if PlainSocket.fileno(sock) == number:  # the TCP socket moves off the number
        rebind(sock, os.dup(number))
    if sock._shown_tcp is not None:
        sock._shown_tcp.detach()
        sock._shown_tcp = None
    readiness.place(number)
    queue_shown(sock, readiness)


def rebind(sock: SocketBase, fd: int) -> None:
    """Make ``fd`` (a duplicate of the socket's TCP socket) the descriptor of the socket
    object itself, its blocking mode and timeout as they were; the old number is left
    to the caller (:func:`reshow` puts another file under it)."""
    timeout = c_gettimeout(sock)
    blocking = os.get_blocking(fd)
    kind = c_family(sock), c_type(sock), c_proto(sock)
    _csocket.socket.detach(sock)
    _csocket.socket.__init__(sock, *kind, fd)
    _csocket.socket.settimeout(sock, timeout)
    os.set_blocking(fd, blocking)  # (the runtime's duplicate shares the flag)


def close_number(number: int) -> None:
    """Close the application's number of a TCP socket (:func:`reshow`)."""
    try:
        os.close(number)
    except OSError:
        pass
