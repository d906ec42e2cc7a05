"""A non-blocking ``connect`` in progress: the TCP connect, then (if the peer offered SMC)
the handshake, finished in the background by the process's watcher thread
(:mod:`smcr.stack.watcher`) and the runtime, as Linux's ``smc_connect_work`` finishes it.
"""

from __future__ import annotations

import errno
import os
import selectors
import socket as _socket
import threading
from typing import Any, Final

from smcr import discovery
from smcr.diag import start as diag_start
from smcr.socket import acceptq, handshake, numbers
from smcr.socket.base import INIT_INFO, PlainSocket, SocketBase, address_port
from smcr.stack.hostconn import HostConn
from smcr.stack.readiness import Readiness
from smcr.stack.watcher import get_watcher
from smcr.wire.decline import DeclineCode

TCP_ESTABLISHED: Final = 1  # Linux's TCP_ESTABLISHED
TCP_SYN_SENT: Final = 2  # Linux's TCP_SYN_SENT, the state of a connect under way


def tcp_state(sock: SocketBase) -> int:
    """The TCP socket's state as Linux numbers it (``tcpi_state``, TCP_INFO's first
    byte): asks without taking the socket's pending error, as SO_ERROR would."""
    return PlainSocket.getsockopt(sock, _socket.IPPROTO_TCP, _socket.TCP_INFO, 1)[0]


def _established(sock: SocketBase) -> bool:
    """Whether the TCP connect has ended well (False if the socket cannot say)."""
    try:
        return tcp_state(sock) == TCP_ESTABLISHED
    except OSError:
        return False


class Connecting:
    """A non-blocking ``connect`` in progress: the TCP connect, then (if the peer
    offered SMC) the handshake, finished by the watcher thread and the runtime.

    ``readiness`` is the socket's descriptor meanwhile: writable (and readable)
    once the socket is settled.  On SMC-R it becomes the connection's own
    readiness descriptor, so a selector that registered it keeps working.
    """

    def __init__(self, sock: SocketBase, named: bool = False) -> None:
        """:param named: the readiness descriptor is a named one (one descriptor, rung by
            the peer once established: :mod:`smcr.stack.readiness`), as where no listener
            of this process takes the connection; else a socket pair."""
        self.sock = sock
        self.readiness = Readiness(named=named)
        self.readiness.set(False, False)
        self.fd = -1  # the TCP socket's (start(): after numbers.reshow moved it)
        self.closed = False
        self.tcp_done = False  # the TCP connect's outcome is taken (watcher or SO_ERROR)
        self.lock = threading.Lock()

    def so_error(self) -> int | None:
        """``getsockopt(SO_ERROR)`` while connecting: a failed TCP connect's error at once
        (asyncio and others watch the TCP descriptor they saw before ``connect``);
        0 while the TCP connect or the handshake goes on; None if the socket settled
        since the caller saw it connecting (the settled socket's answer is the one)."""
        with self.lock:
            if self.closed:
                return 0
            if self.tcp_done:
                return 0 if self.sock._mode == "CONNECTING" else None
            err = int(PlainSocket.getsockopt(self.sock, _socket.SOL_SOCKET, _socket.SO_ERROR))
            if err:
                self._tcp_over()
                self._settle("TCP", 0, failed=True)
            return err

    def connect_again(self, address: Any) -> None:
        """``connect`` while connecting: the kernel's answer while the TCP connect is not
        settled here (``EALREADY``; or its failure, reported and forgotten, as the
        kernel's next ``connect`` after a failed one does)."""
        with self.lock:
            if self.tcp_done or self.closed:
                return
            err = PlainSocket.connect_ex(self.sock, address)
            if err in (0, errno.EALREADY, errno.EINPROGRESS, errno.EISCONN):
                return
            self._tcp_over()
            self._settle("TCP", 0, failed=True)
        raise OSError(err, os.strerror(err))

    def _tcp_over(self) -> None:
        """The TCP connect's outcome is taken (lock held): nothing to watch for any more."""
        self.tcp_done = True
        get_watcher().unwatch(self.fd)

    def start(self, established: bool, offered: bool) -> None:
        """Watch for the TCP connect's end; or, when it has ended already (``established``:
        over loopback the kernel completes it before ``connect`` returns, and ``offered``
        says whether the peer offered SMC), go on in this thread: the handshake starts at
        once, with no hop to the watcher thread and back."""
        self.fd = PlainSocket.fileno(self.sock)
        if established:
            self.tcp_done = True
            self._go_on(offered)
            return
        get_watcher().watch(self.fd, selectors.EVENT_WRITE, self._connected)

    def _connected(self) -> None:
        """The TCP connect ended (watcher thread): settle the mode or start the handshake.
        A call for an event that was not this connect's (:mod:`smcr.stack.watcher`)
        finds the TCP socket still connecting and leaves it so."""
        sock = self.sock
        with self.lock:
            if self.closed or self.tcp_done:
                return
            try:
                PlainSocket.getpeername(sock)
            except OSError:
                if tcp_state(sock) == TCP_SYN_SENT:
                    return
                # failed: its error stays the kernel's (SO_ERROR, EPOLLERR on the number
                # the application has, which names the TCP socket again), as on TCP
                self._tcp_over()
                self._settle("TCP", 0, failed=True)
                return
            self._tcp_over()
        self._go_on(discovery.current().peer_offered(sock, client=True))

    def _go_on(self, offered: bool) -> None:
        """The TCP connect succeeded: the handshake if the peer ``offered`` SMC, else TCP."""
        sock = self.sock
        if offered:
            try:
                handshake.start_handshake(sock, True, self._handshake_ended)
            except OSError as e:  # (no descriptor left for the runtime's hold, say)
                declined = handshake.decline_instead(sock, e)
                with self.lock:
                    if not self.closed:
                        self._settle("TCP", 0 if declined else (e.errno or errno.EIO),
                                     failed=not declined)  # fmt: skip
        else:
            handshake.fall_back(sock, int(DeclineCode.PEERNOSMC), 0)
            with self.lock:
                if not self.closed:
                    self._settle("TCP", 0)

    def _handshake_ended(self, hc: HostConn) -> None:
        """The runtime's news (its lock held)."""
        sock = self.sock
        assert sock._stack is not None
        if self.closed:  # the application closed the socket meanwhile: nobody wants it
            handshake.abandon(sock._stack, hc)
            return
        handshake.finish_handshake(sock, sock._stack, hc)
        if sock._mode == "SMCR":
            sock._stack.adopt_readiness(hc, self.readiness)
            sock._stack.readiness_watched()
            sock._connecting = None  # the descriptor now belongs to the connection
            return
        err = 0 if sock._mode == "TCP" else handshake.failure_errno(hc)
        with self.lock:
            if not self.closed:
                self._settle("TCP", err)

    def _settle(self, mode: str, err: int, failed: bool = False) -> None:
        """Settle to TCP (connect failed, peer without SMC, handshake declined or failed):
        the program's number names the TCP socket again, moved there by the program's
        next call (:func:`smcr.socket.numbers.catch_up`; a fallback already set the
        mode TCP).
        Until then the readiness descriptor under it says what the TCP socket says:
        writable (and readable, so that a program waiting to read calls in too), and
        after a failure with ``EPOLLERR``/``EPOLLHUP`` as well (:meth:`Readiness.fail`)."""
        sock = self.sock
        sock._connect_error = err
        if mode == "TCP" and sock._mode in ("CONNECTING", "INIT", "TCP"):
            sock._mode = "TCP"
            sock._connect_failed = failed or bool(err)
            sock._reshow_due = True
        if failed or err:
            self.readiness.fail()
        else:
            self.readiness.set(True, True)

    def close(self) -> None:
        """The socket closes: stop watching (the descriptor goes with it)."""
        with self.lock:
            if not self.closed:
                self.closed = True
                get_watcher().unwatch(self.fd)
                self.readiness.close()


def connect(sock: SocketBase, address: Any) -> None:
    """``SMCSocket.connect``: TCP connect; if the peer offered SMC (:mod:`smcr.discovery`),
    the CLC handshake, falling back to TCP on a Decline; else plain TCP at once.  A
    non-blocking socket gets a :class:`Connecting` and ``EINPROGRESS``."""
    numbers.catch_up(sock)  # (before start_over() below closes the readiness under the number)
    if sock._mode == "CONNECTING":
        connecting = sock._connecting
        if connecting is not None:
            try:
                connecting.connect_again(address)
            finally:
                numbers.catch_up(sock)
        if sock._mode == "CONNECTING":
            raise BlockingIOError(errno.EALREADY, os.strerror(errno.EALREADY))
        # settled meanwhile by the watcher thread: answer as the settled socket does
        # (EALREADY here would send the program to SO_ERROR, which takes the kernel's
        # error, and its next connect would meet ECONNABORTED instead of a new attempt)
    if sock._mode == "TCP" and sock._connect_failed:
        # as the kernel's socket after a failed connect: the next connect reports that
        # failure (here: if nobody read it from SO_ERROR), the one after starts anew
        err, sock._connect_error = sock._connect_error, 0
        if not err:  # the kernel's, when nobody read it (SO_ERROR)
            err = int(PlainSocket.getsockopt(sock, _socket.SOL_SOCKET, _socket.SO_ERROR))
        if err:
            PlainSocket.connect_ex(sock, address)  # (the kernel's: it forgets the attempt)
            raise OSError(err, os.strerror(err))
        start_over(sock)
    if sock._mode != "INIT":
        PlainSocket.connect(sock, address)  # the kernel's EISCONN (or a new connect)
        return
    # the process's first connection opens its smcr ss/stats endpoint before the SYN, not
    # once the peer has answered it: a peer that speaks no SMC waited for that (its
    # imports, a thread) before the first byte came, 1.9 ms on this kind of machine
    diag_start()
    smc_ok = discovery.current().opt_in(sock, address_port(address))
    if not smc_ok:
        handshake.fall_back(sock, int(DeclineCode.PEERNOSMC), 0)
        try:
            PlainSocket.connect(sock, address)
        except OSError as exc:
            sock._connect_failed = not isinstance(exc, (BlockingIOError, InterruptedError))
            raise
        return
    if sock._timeout == 0.0:
        # a listener of this process takes its end in this thread, before our handshake
        # (only here: a blocking connect may wait, and the listener would wait with it)
        local = acceptq.local_connect_begins(address)
        try:
            err = PlainSocket.connect_ex(sock, address)
        finally:
            if local:
                acceptq.local_connect_ends(local, _established(sock))
        if err not in (0, errno.EINPROGRESS):
            raise OSError(err, os.strerror(err))
        established = _established(sock)
        offered = established and discovery.current().peer_offered(sock, client=True)
        if established and not offered and not local:
            # the peer answered without SMC before connect returned (loopback, say): TCP at
            # once, the number the TCP socket's throughout, as under the kernel's connect
            # (no readiness descriptor put under it and taken away again: each move looks
            # at every descriptor of the process, and at an event loop's registrations)
            handshake.fall_back(sock, int(DeclineCode.PEERNOSMC), 0)
            if err == 0:
                return
            raise BlockingIOError(errno.EINPROGRESS, os.strerror(errno.EINPROGRESS))
        try:
            handshake.stack_here(sock)
            sock._connecting = Connecting(sock, named=not local)
        except OSError as exc:
            if exc.errno not in handshake.OUT_OF_RESOURCES:
                raise
            # no descriptor for the connect's machinery: TCP, as the kernel's connect needs
            # none; the server hears why once the connection is there (pay_decline)
            handshake.fall_back(sock, int(DeclineCode.MEM), 0)
            sock._decline_owed = True
            raise BlockingIOError(errno.EINPROGRESS, os.strerror(errno.EINPROGRESS)) from None
        sock._mode = "CONNECTING"
        numbers.reshow(sock)
        sock._connecting.start(established, offered)
        raise BlockingIOError(errno.EINPROGRESS, os.strerror(errno.EINPROGRESS))
    PlainSocket.connect(sock, address)
    if discovery.current().peer_offered(sock, client=True):
        handshake.handshake(sock, client=True)
    else:
        handshake.fall_back(sock, int(DeclineCode.PEERNOSMC), 0)

def so_error(sock: SocketBase) -> int | None:
    """``getsockopt(SO_ERROR)`` where smcr knows better than the TCP socket: a non-blocking
    connect's outcome, an error a CLC read took from the kernel, an SMC-R connection's
    pending reset (each told once); None where the TCP socket's own answer is the one."""
    connecting = sock._connecting
    if sock._mode == "CONNECTING" and connecting is not None:
        err = connecting.so_error()
        numbers.catch_up(sock)
        if err is not None:
            return err
    if sock._connect_error:
        err, sock._connect_error = sock._connect_error, 0
        return err
    if sock._tcp_error:
        err, sock._tcp_error = sock._tcp_error, 0
        return err
    calls = sock._calls
    if sock._mode == "SMCR" and calls is not None and not (calls.forked or sock._gone):
        # the TCP socket's own error too (an abortive close resets it): taken, so that a
        # reset is told once
        tcp_err = int(PlainSocket.getsockopt(sock, _socket.SOL_SOCKET, _socket.SO_ERROR))
        return calls.path.pending_reset(tcp_err)
    return None


def start_over(sock: SocketBase) -> None:
    """Back to a socket that never connected, after a failed connect."""
    if sock._connecting is not None:
        sock._connecting.close()
        sock._connecting = None
    sock._mode = "INIT"
    sock._info = INIT_INFO
    sock._connect_error = 0
    sock._connect_failed = False
    PlainSocket.settimeout(sock, sock._timeout)
