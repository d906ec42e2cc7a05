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
from smcr.socket.tcphold import RuntimeTcp
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
    if readiness is not None:
        sock._shown = readiness.fileno()
    elif sock._tcp_hold is not None and sock._tcp_hold.shared:
        # (a blocking connect's handshake, asked from another thread): the runtime holds
        # our descriptor too, so the program gets a number of its own, which a readiness
        # descriptor may take over (reshow) without closing the runtime's
        sock._shown = os.dup(PlainSocket.fileno(sock))
        own_number(sock, sock._shown)
    else:
        sock._shown = PlainSocket.fileno(sock)
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
            own_number(sock, number)
        return
    if readiness.app == number:
        return
    if PlainSocket.fileno(sock) == number:  # the TCP socket moves off the number
        moved_tcp(sock, number)
    if sock._shown_tcp is not None:
        sock._shown_tcp.detach()
        sock._shown_tcp = None
    readiness.place(number)
    queue_shown(sock, readiness)


def moved_tcp(sock: SocketBase, number: int) -> None:
    """Our TCP socket leaves the program's ``number`` (a readiness descriptor takes it): to
    the runtime's own descriptor of it, which we hold too from now on
    (:mod:`smcr.socket.tcphold`), or, where the runtime has none (any more), a new one."""
    hc = sock._hc
    tcp = hc.tcp if hc is not None else None
    hold = tcp.hold if isinstance(tcp, RuntimeTcp) else None
    if hold is not None and hold.fd != number and hold.join():
        rebind(sock, hold.fd)
        sock._tcp_hold = hold
    else:
        rebind(sock, os.dup(number))


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
    os.set_blocking(fd, blocking)  # (the runtime's descriptor of it shares the flag)


def own_number(sock: SocketBase, number: int) -> None:
    """``number``, the program's, names a file of the socket's own that is not the socket
    object's descriptor (a duplicate of its TCP socket, a forked child's relay end): it is
    closed with the socket (:meth:`SocketBase._real_close`), or when the socket is
    collected."""
    sock._shown_tcp = weakref.finalize(sock, close_number, number)
    sock._shown_tcp.atexit = False


def close_number(number: int) -> None:
    """Close the application's number of a TCP socket (:func:`reshow`)."""
    try:
        os.close(number)
    except OSError:
        pass
