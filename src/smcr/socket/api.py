"""``SMCSocket``, the API class of the socket layer (the package's docstring says how it
works), and ``create_connection``/``create_server``.
"""

from __future__ import annotations

import _socket as _csocket
import errno
import io
import os
import socket as _socket
import weakref
from typing import Any, cast

from smcr import discovery
from smcr.diag import registry as _registry
from smcr.diag import start as _diag_start
from smcr.socket import connecting, handshake, linuxapi, messages, numbers, sharing
from smcr.socket.acceptq import AcceptQueue
from smcr.socket.base import (
    INET,
    INIT_INFO,
    OOB,
    PEEK,
    PlainSocket,
    SmcInfo,
    SocketBase,
    accept_queues,
    bufsize,
    c_family,
    c_gettimeout,
    c_proto,
    c_type,
    lets_go_of_buffer,
    linger,
    local_port,
    smc_sockets,
)
from smcr.socket.connecting import Connecting
from smcr.socket.fork import hand_over
from smcr.socket.sharing import Share, queue_of, share_of, shared_address
from smcr.stack.conn import METHODS
from smcr.stack.counters import COUNTERS as _C
from smcr.stack.runtime import default_buffer_size
from smcr.wire.decline import DeclineCode


class SMCSocket(SocketBase):
    """A stream socket that uses SMC-R when the peer does (the package's docstring).

    It is a ``socket.socket`` (a subclass) and a drop-in for a stream one: blocking,
    timeouts, non-blocking with ``BlockingIOError``, ``select``/``selectors``/asyncio on
    ``fileno()``, ``makefile``, ``MSG_PEEK``/``MSG_WAITALL``/``MSG_DONTWAIT``/``MSG_OOB``,
    ``shutdown``, ``sendmsg``/``recvmsg``, ``sendfile``, ``SO_LINGER``, ``dup``, ``detach``.
    Its own descriptor is the TCP socket; the methods that move bytes use the runtime
    instead in SMC-R mode.  Sockets of other families and types (``smcr run`` makes every
    socket one of these) and sockets made from a descriptor that is connected already are
    plain TCP.  Additions to ``socket.socket``: :meth:`smc_info`, :attr:`smc_mode`.
    """

    _queue: AcceptQueue | None = None  # listening: connections of its handshakes
    _connecting: Connecting | None = None  # a non-blocking connect in progress
    _share: Share | None = None  # SMC-R mode, held by several sockets (dup, detach)

    def __init__(self, family: int = -1, type: int = -1, proto: int = -1,
                 fileno: int | None = None, *, _accepted: bool = False) -> None:  # fmt: skip
        shown = None
        if fileno is None or _accepted:  # (a descriptor is taken as it comes, as the C type's)
            family, proto, shown = linuxapi.beneath(family, type, proto)  # AF_SMC, IPPROTO_SMC
        adopted = fileno is not None and not _accepted
        share = share_of(fileno) if fileno is not None and adopted else None
        queue = queue_of(fileno) if fileno is not None and adopted and not share else None
        if share is not None:  # fromfd()/socket(fileno=) of an SMC-R socket's fileno()
            family, type, proto = share.family, _socket.SOCK_STREAM, 0
        elif queue is not None:  # ... of a listening one's
            family, type, proto = queue.family, queue.type, queue.proto
        super().__init__(family, type, proto, fileno)
        self._shown_as = shown
        self._timeout: float | None = c_gettimeout(self)
        if share is not None:
            self._via_readiness = True
            sharing.join(self, share, borrowed=fileno == share.readiness_fd())
            if self._calls is not None and self._nonblocking_descriptor():
                self._calls.timeout = 0.0
            return
        self._mode = "INIT"
        self._info = INIT_INFO
        # 0: the RNIC's default (smcr.stack.runtime.default_buffer_size), without
        # opening an RNIC: which one is known only once the TCP connection has a
        # local address (smcr.stack.devices); SO_RCVBUF/SO_SNDBUF set them
        self._rmb_size = self.default_rmb_size
        self._sndbuf_size = self.default_sndbuf_size
        if queue is not None:
            sharing.listen_with(self, queue)
            return
        if not (c_family(self) in INET and c_type(self) == _socket.SOCK_STREAM
                and c_proto(self) in (0, _socket.IPPROTO_TCP)):
            self._mode = "PLAIN"  # AF_UNIX, UDP, ...: a socket.socket, nothing more
        elif fileno is not None and not _accepted:
            self._adopt()

    def _adopt(self) -> None:
        """A socket made from a descriptor: connected ones are TCP (whatever they were
        before, SMC cannot start in the middle of a stream), listening ones listen."""
        try:
            PlainSocket.getpeername(self)
        except OSError:
            if PlainSocket.getsockopt(self, _socket.SOL_SOCKET, _socket.SO_ACCEPTCONN):
                self._smc_ok = discovery.current().opt_in(self, local_port(self))
                self._mode = "LISTEN"
            return
        handshake.fall_back(self, int(DeclineCode.PEERNOSMC), 0, None)

    # ------------------------------------------------------------ plain attributes

    def __repr__(self) -> str:
        """``socket.socket``'s, with the mode: ``<smcr.socket.SMCSocket fd=5, family=2,
        type=1, proto=0, laddr=..., raddr=..., mode=SMCR>``; fd is the TCP socket's (the
        garbage collector may call this while a thread holds the runtime's lock, which
        ``fileno()`` of an SMC-R socket takes)."""
        cls = type(self)
        closed = getattr(self, "_closed", False)
        text = (f"<{cls.__module__}.{cls.__qualname__}{' [closed]' if closed else ''} "
                f"fd={_csocket.socket.fileno(self)}, family={self.family}, type={self.type}, "
                f"proto={self.proto}")  # fmt: skip
        if not closed:
            for name, get in (("laddr", PlainSocket.getsockname),
                              ("raddr", PlainSocket.getpeername)):  # fmt: skip
                try:
                    if address := get(self):
                        text += f", {name}={address}"
                except OSError:
                    pass
        return f"{text}, mode={self._mode}>"

    def listen(self, backlog: int = 128) -> None:
        """Listen: serves SMC and plain TCP clients."""
        if self._mode == "PLAIN":
            PlainSocket.listen(self, backlog)
            return
        if self._mode == "LISTEN" and self._via_readiness:
            return  # (made from a listener's number: the listening socket is that one's)
        self._smc_ok = discovery.current().opt_in(self, local_port(self))
        PlainSocket.listen(self, backlog)
        self._backlog = backlog
        if self._smc_ok:
            discovery.current().port_listens(PlainSocket.getsockname(self)[1])
        self._mode = "LISTEN"
        _registry.listening.add(self)  # seen by smcr ss (smcr.diag)
        _diag_start()
        if self._accept_queue() is not None:  # handshakes run from now on, as the kernel's do
            # its number now, while the process has one free: TCP's fileno() never fails,
            # and an event loop asks for it first when the process may be out of them
            self.fileno()

    def settimeout(self, value: float | None) -> None:
        """As ``socket.settimeout``."""
        if value is not None and value < 0:
            raise ValueError("Timeout value out of range")
        self._timeout = value
        if self._calls is not None:
            self._calls.timeout = value
        if self._mode in ("INIT", "TCP", "PLAIN") or (self._mode == "LISTEN"
                                                      and self._queue is None):
            PlainSocket.settimeout(self, value)
            return
        readiness = numbers.readiness_now(self)
        if readiness is not None:  # what fileno() gave out: its O_NONBLOCK as the socket's
            readiness.set_blocking(value is None)

    def gettimeout(self) -> float | None:
        """As ``socket.gettimeout``."""
        return self._timeout

    def setblocking(self, flag: bool) -> None:
        """As ``socket.setblocking``."""
        self.settimeout(None if flag else 0.0)

    def getblocking(self) -> bool:
        """As ``socket.getblocking``."""
        return self._timeout != 0.0

    def smc_info(self) -> SmcInfo:
        """How this socket is connected (what ``smcss`` shows of it): SMC-R with its link
        group, connection state and buffer sizes, or TCP with the decline codes that
        made it fall back (``smcr decline CODE`` explains one).

        >>> sock.smc_info()  # doctest: +SKIP
        SmcInfo(mode='SMCR', local_code=0, peer_code=0, lgr_id=1, first_contact=True,
                state='ACTIVE', rmb_size=4194304, peer_rmb_size=4194304, version=1)
        """
        calls = self._calls
        if self._mode == "SMCR" and calls is not None:
            info = self._info
            now = calls.path.info()
            if now is not None:
                return SmcInfo("SMCR", lgr_id=info.lgr_id, first_contact=info.first_contact,
                               state=now[0], rmb_size=now[1], peer_rmb_size=now[2],
                               version=info.version)  # fmt: skip
            return SmcInfo("SMCR", lgr_id=info.lgr_id, state="CLOSED", version=info.version)
        return self._info

    @property
    def smc_mode(self) -> str:
        """``INIT``, ``CONNECTING``, ``SMCR``, ``TCP`` (a fallback, or a TCP connection from
        the start), ``LISTEN`` or ``PLAIN`` (not a TCP stream socket)."""
        return self._mode

    @property
    def smc_listening(self) -> bool:
        """A listening socket whose clients may use SMC-R (discovery opted it in)."""
        return self._mode == "LISTEN" and self._smc_ok

    def smc_move(self) -> SMCSocket:
        """A new socket object that owns this one's connection from now on; this one is
        closed, as ``ssl.SSLContext.wrap_socket`` detaches the socket it wraps
        (:func:`sharing.move`)."""
        return cast(SMCSocket, sharing.move(self))

    @property
    def using_smc(self) -> bool:
        """Whether the connection runs over SMC-R (in a forked child: relayed by the
        parent, :mod:`smcr.socket.fork`)."""
        return self._mode == "SMCR" or self._relayed is not None

    def getsockname(self) -> Any:
        """As ``socket.getsockname`` (a forked child's relayed connection: the TCP one's)."""
        if self._relayed is not None:
            return self._relayed[0]
        if self._via_readiness and self._share is not None:
            return shared_address(self._share.addresses[0])
        return PlainSocket.getsockname(self._listening())

    def getpeername(self) -> Any:
        """As ``socket.getpeername`` (a forked child's relayed connection: the TCP one's)."""
        if self._relayed is not None:
            return self._relayed[1]
        if self._via_readiness and self._share is not None:
            return shared_address(self._share.addresses[1])
        return PlainSocket.getpeername(self)

    # ------------------------------------------------------------ options

    def setsockopt(self, level: int, optname: int, value: Any, *args: Any) -> None:
        """SO_SNDBUF/SO_RCVBUF size smcr's buffers (before connect); ``SOL_SMC`` options
        are ours (:func:`linuxapi.set_option`); the rest go to TCP."""
        if self._relayed is not None and level == _socket.IPPROTO_TCP:
            return  # (the TCP connection is the parent's: nothing to set here)
        if level == linuxapi.SOL_SMC and self._mode != "PLAIN":
            self._limit_hs = linuxapi.set_option(optname, value, args)
            if self._queue is not None:  # a listener: from now on, or no longer
                self._queue.limit_handshakes()
            return
        if level == _socket.SOL_SOCKET and optname == _socket.SO_RCVBUF:
            self._rmb_size = bufsize(int(value))
        elif level == _socket.SOL_SOCKET and optname == _socket.SO_SNDBUF:
            self._sndbuf_size = bufsize(int(value))
            calls = self._calls
            if self._mode == "SMCR" and calls is not None and not calls.forked:
                self._sndbuf_size = calls.check().limit_sndbuf(self._sndbuf_size)
        PlainSocket.setsockopt(self._listening(), level, optname, value, *args)
        if level == _socket.SOL_SOCKET and optname == _socket.SO_OOBINLINE and (
                self._calls is not None):  # fmt: skip
            self._calls.path.oob_inline = bool(PlainSocket.getsockopt(self, level, optname))
        if level == _socket.IPPROTO_TCP and value and self._mode == "SMCR":  # smcr stats
            if optname == _socket.TCP_CORK:
                _C.cork_cnt += 1
            elif optname == _socket.TCP_NODELAY:
                _C.ndly_cnt += 1

    def getsockopt(self, level: int, optname: int, *args: Any) -> Any:
        """SO_SNDBUF/SO_RCVBUF report smcr's buffer sizes; SO_ERROR the outcome of a
        non-blocking connect; the rest come from TCP."""
        if self._relayed is not None and level == _socket.IPPROTO_TCP:
            return 0 if not args else bytes(args[0])
        if level == linuxapi.SOL_SMC and self._mode != "PLAIN":
            return linuxapi.get_option(optname, self._limit_hs, args)
        if level == _socket.SOL_SOCKET and self._shown_as is not None and not args:
            if optname == _socket.SO_DOMAIN:
                return self._shown_as[0]
            if optname == _socket.SO_PROTOCOL:
                return self._shown_as[1]
        if level == _socket.SOL_SOCKET and optname == _socket.SO_ERROR and not args:
            # (no catch-up here: an event loop asks it while it still watches the number
            # for the connect, so that the move would carry that registration, whose
            # events only the instance's whole list tells; its next call moves the number,
            # once the loop has let go of it for the connect: numbers.catch_up)
            err = connecting.so_error(self)
            if err is not None:
                return err
        else:
            numbers.catch_up(self)
        if self._mode not in ("TCP", "PLAIN") and level == _socket.SOL_SOCKET and not args:
            if optname == _socket.SO_RCVBUF:
                return self._rmb_size or default_buffer_size()
            if optname == _socket.SO_SNDBUF:
                return self._sndbuf_size or default_buffer_size()
        return PlainSocket.getsockopt(self._listening(), level, optname, *args)

    # ------------------------------------------------------------ connecting

    def connect(self, address: Any) -> None:
        """TCP connect; if the peer offered SMC (:mod:`smcr.discovery`), the CLC
        handshake, falling back to TCP on a Decline; else plain TCP at once
        (:func:`smcr.socket.connecting.connect`).

        Non-blocking: raises ``BlockingIOError`` (``EINPROGRESS``) as
        ``socket.socket`` does; the TCP connect and the handshake finish in the
        background, and the descriptor of :meth:`fileno` turns writable when the
        socket is ready (``getsockopt(SO_ERROR)`` then says how it went).  Until
        then ``send``/``recv`` raise ``BlockingIOError``.
        """
        connecting.connect(self, address)


    def connect_ex(self, address: Any) -> int:
        """As ``connect``, returning an errno instead of raising."""
        try:
            self.connect(address)
        except OSError as exc:
            return exc.errno or errno.EIO
        return 0

    def accept(self) -> tuple[SMCSocket, Any]:
        """Accept a client: SMC-R if its SYN offered SMC (:mod:`smcr.discovery`), else
        plain TCP at once (reason ``PEERNOSMC``), its bytes untouched.

        Handshakes run in the background, each on its own (:class:`AcceptQueue`):
        ``accept`` returns connections in the order their handshakes end, and an
        idle or hostile client delays nobody else.  A client whose handshake fails
        without a fallback (malformed CLC, Linux ``-EPROTO``) is reset and never
        returned, as Linux's listen worker never hands such a socket to ``accept``.
        """
        if self._mode == "PLAIN":
            fd, addr = self._accept()
            return type(self)(self.family, self.type, self.proto, fileno=fd), addr
        queue = self._accept_queue()
        if queue is None:  # discovery is off: nothing but TCP can come
            fd, addr = self._accept()
            sock = type(self)(self.family, self.type, self.proto, fileno=fd)
            if _socket.getdefaulttimeout() is None and self._timeout:
                sock.setblocking(True)  # as socket.accept(): not the listener's timeout
            return sock, addr
        timeout = self._timeout
        if self._via_readiness and self._nonblocking_descriptor():
            timeout = 0.0
        taken, addr = queue.take(timeout, ACCEPT_HEADROOM)
        return cast(SMCSocket, taken), addr

    def _accept_queue(self) -> AcceptQueue | None:
        """The accept queue of a listener that may see SMC clients, from ``listen`` on (a
        forked child starts its own on first use; see :meth:`AcceptQueue.pause`)."""
        if self._mode != "LISTEN":
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        if not self._smc_ok:
            return None
        queue = self._queue
        if queue is None or queue.pid != os.getpid():
            if queue is not None:  # the parent's (forked): its number becomes ours
                queue.readiness.disown()
            queue = self._queue = AcceptQueue(self)
            queue.readiness.set_blocking(self._timeout is None)
            numbers.reshow(self)
            # dropped unclosed: the queue goes too; not at interpreter exit, where a
            # socket.socket's listener stays open under a daemon thread in accept (closing
            # it woke that thread with EBADF: a traceback at every such program's exit)
            self._queue_finalizer = weakref.finalize(self, queue.release)
            self._queue_finalizer.atexit = False
            accept_queues.add(queue)
        else:
            queue.resume()
        return queue

    # ------------------------------------------------------------ data

    @lets_go_of_buffer
    def send(self, data: Any, flags: int = 0) -> int:
        """Send (``smc_tx_sendmsg``, :meth:`DataPath.send`): straight into the peer's RMBE
        when nothing waits and the RNIC takes inline WRITEs, else by copying into the
        send buffer, which the engine RDMA-WRITEs from."""
        if self._mode != "SMCR" or self._calls is None:
            self._tcp_ok()
            return PlainSocket.send(self, data, flags)
        return self._calls.send(data, flags)

    @lets_go_of_buffer
    def sendall(self, data: Any, flags: int = 0) -> None:
        """Send everything (blocking, or raising where ``socket.sendall`` would)."""
        if self._mode != "SMCR" or self._calls is None:
            self._tcp_ok()
            PlainSocket.sendall(self, data, flags)
            return
        self._calls.sendall(data, flags)

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        """As ``socket.recv``."""
        if self._mode != "SMCR" or self._calls is None:
            return self._tcp_recv(bufsize, flags)
        if type(self).recv_into is not SMCSocket.recv_into:  # a subclass's own: it reads
            buf = bytearray(bufsize)
            n = self.recv_into(buf, bufsize, flags)
            del buf[n:]
            return bytes(buf)
        return self._calls.recv(bufsize, flags)

    @lets_go_of_buffer
    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        """Copy from our RMBE (``smc_rx_recvmsg``, :meth:`DataPath.recv_into`): MSG_PEEK,
        MSG_WAITALL, MSG_DONTWAIT, MSG_OOB as Linux handles them."""
        if self._mode != "SMCR" or self._calls is None:
            return self._tcp_recv_into(buffer, nbytes, flags)
        return self._calls.recv_into(buffer, nbytes, flags)

    @lets_go_of_buffer
    def sendmsg(self, buffers: Any, *args: Any) -> int:
        """``sendmsg(buffers[, ancdata[, flags[, address]]])`` (:func:`messages.sendmsg`
        over SMC-R: control messages raise ``EINVAL``)."""
        if self._mode != "SMCR" or self._calls is None:
            self._tcp_ok()
            return PlainSocket.sendmsg(self, buffers, *args)
        return messages.sendmsg(self._calls, self.family, buffers, args)

    def recvmsg(self, bufsize: int, ancbufsize: int = 0, flags: int = 0) -> tuple[
            bytes, list[tuple[int, int, bytes]], int, Any]:  # fmt: skip
        """As ``socket.recvmsg``: ``(data, [], msg_flags, None)`` over SMC-R (and for the bytes
        behind a fallback's last CLC message)."""
        if self._mode != "SMCR" and not self._prefix:
            self._tcp_ok()
            return PlainSocket.recvmsg(self, bufsize, ancbufsize, flags)
        return messages.recvmsg(self.recv, bufsize, ancbufsize, flags)

    @lets_go_of_buffer
    def recvmsg_into(self, buffers: Any, ancbufsize: int = 0, flags: int = 0) -> tuple[
            int, list[tuple[int, int, bytes]], int, Any]:  # fmt: skip
        """As ``socket.recvmsg_into``: fills ``buffers`` in order
        (:func:`messages.recvmsg_into`)."""
        if self._mode != "SMCR" and not self._prefix:
            self._tcp_ok()
            return PlainSocket.recvmsg_into(self, buffers, ancbufsize, flags)
        return messages.recvmsg_into(self.recv_into, buffers, ancbufsize, flags)

    def sendfile(self, file: Any, offset: int = 0, count: int | None = None) -> int:
        """As ``socket.sendfile`` (over SMC-R: :func:`messages.sendfile`, read and sent in
        chunks; TCP mode: ``os.sendfile``, zero copy)."""
        if self._mode != "SMCR" or self._calls is None:
            self._tcp_ok()
            return PlainSocket.sendfile(self, file, offset, count)
        return messages.sendfile(self._calls, file, offset, count)

    def _sendfile_use_sendfile(self, file: Any, offset: int = 0,
                               count: int | None = None) -> int:  # fmt: skip
        """The stdlib's ``os.sendfile`` path of ``sendfile`` (some code calls it by name):
        in SMC-R mode, ours (:meth:`sendfile`), as ``os.sendfile`` into our
        ``fileno()`` would write into the readiness descriptor."""
        if self._mode != "SMCR":
            return PlainSocket._sendfile_use_sendfile(self, file, offset, count)  # type: ignore[attr-defined,no-any-return]
        self._check_sendfile_params(file, offset, count)  # type: ignore[attr-defined]
        return self.sendfile(file, offset, count) if messages.sendfile_size(file) else 0

    # ------------------------------------------------------------ TCP mode

    def _tcp_ok(self) -> None:
        """Before a call goes to the kernel's TCP socket: not while connecting, and not
        before a Decline this client owes (:func:`handshake.pay_decline`)."""
        if self._mode == "CONNECTING":  # not a byte before SMC-R or TCP is settled
            raise BlockingIOError(errno.EAGAIN, os.strerror(errno.EAGAIN))
        if self._decline_owed:
            handshake.pay_decline(self)
        numbers.catch_up(self)
        if self._tcp_error:  # once, as the kernel tells a reset
            err, self._tcp_error = self._tcp_error, 0
            raise OSError(err, os.strerror(err))

    def _tcp_recv(self, bufsize: int, flags: int) -> bytes:
        if self._prefix and not flags & OOB:
            data = self._prefix[:bufsize]
            if not flags & PEEK:
                self._prefix = self._prefix[len(data):]
            return data
        self._tcp_ok()
        return PlainSocket.recv(self, bufsize, flags)

    def _tcp_recv_into(self, buffer: Any, nbytes: int, flags: int) -> int:
        out = memoryview(buffer).cast("B")
        want = nbytes or len(out)
        if self._prefix and not flags & OOB:
            data = self._tcp_recv(want, flags)
            out[: len(data)] = data
            return len(data)
        self._tcp_ok()
        return PlainSocket.recv_into(self, out, want, flags)

    # ------------------------------------------------------------ readiness, files

    def fileno(self) -> int:
        """A descriptor for select/poll/selectors that follows recv/send readiness: one
        number for the socket's whole life, as a TCP socket's (:func:`numbers.fileno`)."""
        if self._mode == "LISTEN" and not self._gone:
            self._accept_queue()  # (a forked parent's queue resumes: AcceptQueue.pause)
        return numbers.fileno(self)

    def makefile(self, mode: str = "r", buffering: int | None = None, *,
                 encoding: str | None = None, errors: str | None = None,
                 newline: str | None = None) -> Any:  # fmt: skip
        """As ``socket.makefile`` (the stdlib's own logic over this socket)."""
        if not set(mode) <= {"r", "w", "b"}:
            raise ValueError(f"invalid mode {mode!r} (only r, w, b allowed)")
        writing = "w" in mode
        reading = "r" in mode or not writing
        rawmode = ("r" if reading else "") + ("w" if writing else "")
        raw = _socket.SocketIO(self, rawmode)  # type: ignore[arg-type]
        self._io_refs += 1
        if buffering is None:
            buffering = -1
        if buffering < 0:
            buffering = io.DEFAULT_BUFFER_SIZE
        if buffering == 0:
            if "b" not in mode:
                raise ValueError("unbuffered streams must be binary")
            return raw
        buffer: io.BufferedIOBase
        if reading and writing:
            buffer = io.BufferedRWPair(raw, raw, buffering)
        elif reading:
            buffer = io.BufferedReader(raw, buffering)
        else:
            buffer = io.BufferedWriter(raw, buffering)
        if "b" in mode:
            return buffer
        text = io.TextIOWrapper(buffer, encoding, errors, newline)  # type: ignore[type-var]
        text.mode = mode  # type: ignore[misc]
        return text

    def _decref_socketios(self) -> None:
        if self._io_refs > 0:
            self._io_refs -= 1
        if self._closed and self._io_refs <= 0:
            self._close_now()

    # ------------------------------------------------------------ closing

    def shutdown(self, how: int) -> None:
        """SHUT_RD, SHUT_WR (done-writing CDC, then TCP FIN, as Linux), SHUT_RDWR."""
        if how not in (_socket.SHUT_RD, _socket.SHUT_WR, _socket.SHUT_RDWR):
            PlainSocket.shutdown(self, how)  # OverflowError, TypeError or EINVAL, as TCP's
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        if self._mode != "SMCR":
            self._tcp_ok()
            PlainSocket.shutdown(self, how)
            return
        assert self._calls is not None
        self._calls.check().shutdown(how)

    def close(self) -> None:
        """Close: drain the send buffer, closing CDC; TCP goes when CLOSED.

        Without ``SO_LINGER``, bytes still in the send buffer (the peer's RMBE is
        full) go in the background and ``close`` returns at once, as TCP's does
        (:meth:`Closing.close_later`: the peer gets ``close_wait_tx``, 2 s, Linux's
        ``SMC_MAX_STREAM_WAIT_TIMEOUT``, to read something, again after each read).
        With ``SO_LINGER`` on, ``close`` waits its linger time for them, as
        ``smc_close_active`` waits.  Then, within the same time, it waits for the
        peer to confirm the closing CDC (:func:`~smcr.stack.conn.cdcs_done`).  A
        linger time of 0 closes abortively (:meth:`Closing.abort`): the rest of the send buffer is
        dropped and the peer's reads end in ``ECONNRESET``, as after a TCP
        reset (Linux SMC sends a close CDC there; module docstring).

        As ``socket.close``: while files of :meth:`makefile` are open, the
        connection stays (``urllib`` closes the socket and reads the response
        from its file); the last file to close closes it.
        """
        self._closed = True
        if self._io_refs <= 0:
            self._close_now()

    def _close_now(self) -> None:
        if self._gone:
            return
        if self._parent_ends and self._mode == "SMCR" and hand_over(self):
            return  # a forked child goes on with it (smcr.socket.fork)
        self._gone = True
        calls = self._calls
        self._let_go_calls()
        if calls is not None and calls.forked:  # the parent's connection: only our descriptor
            if self._finalizer is not None:
                self._finalizer.detach()
            self._real_close()
            return
        if self._finalizer is not None:
            self._finalizer.detach()
        if self._share is not None and self._share.release():
            self._drop_descriptor()  # another socket (or a detached descriptor) holds it
            return
        queue = self._queue
        if (self._queue_finalizer is not None and self._queue_finalizer.detach()
                and queue is not None and queue.pid == os.getpid()):  # fmt: skip
            queue.release()  # (the last of the sockets listening with it closes it)
        if self._connecting is not None:
            self._connecting.close()
        if self._mode == "SMCR" and calls is not None:
            calls.path.close(linger(self))
        self._drop_descriptor()

    def detach(self) -> int:
        """As ``socket.detach``; in SMC-R mode the readiness descriptor, which a socket made
        from it (``socket.socket(fileno=...)``) holds the connection with
        (:func:`sharing.detach`)."""
        return sharing.detach(self)

    def dup(self) -> SMCSocket:
        """As ``socket.dup``: in SMC-R mode a second socket on the same connection (the
        last of them to close closes it; :func:`sharing.dup`)."""
        return sharing.dup(self)  # type: ignore[return-value]

    def recvfrom(self, bufsize: int, flags: int = 0) -> tuple[bytes, Any]:
        """As ``socket.recvfrom`` on a connected stream."""
        if self._mode != "SMCR" and not self._prefix:
            self._tcp_ok()
            return PlainSocket.recvfrom(self, bufsize, flags)
        return self.recv(bufsize, flags), None

    @lets_go_of_buffer
    def recvfrom_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> tuple[int, Any]:
        """As ``socket.recvfrom_into`` on a connected stream."""
        if self._mode != "SMCR" and not self._prefix:
            self._tcp_ok()
            return PlainSocket.recvfrom_into(self, buffer, nbytes, flags)
        return self.recv_into(buffer, nbytes, flags), None

    @lets_go_of_buffer
    def sendto(self, data: Any, *args: Any) -> int:
        """As ``socket.sendto``: a connected TCP socket ignores the address; so does SMC-R
        mode (``sendto(data[, flags], address)``)."""
        if self._mode != "SMCR":
            self._tcp_ok()
            return PlainSocket.sendto(self, data, *args)
        if len(args) not in (1, 2):
            raise TypeError(f"sendto() takes 2 or 3 arguments ({len(args) + 1} given)")
        return self.send(data, int(args[0]) if len(args) == 2 else 0)


ACCEPT_HEADROOM = 1
"""Descriptors ``accept`` wants free: the number of TCP's accept, and the readiness pair the
connection makes when the program first asks for its ``fileno()``.

``accept(2)`` takes a number before it looks at the queue, so a process with none free gets
EMFILE and the connection stays queued; ours was accepted in the background with descriptors
of its own, some of which a fallback gives back, so the program would otherwise be handed a
connection at its limit that TCP would have refused it (an event loop frees a reserved
descriptor then, accepts and closes the peer: Twisted's)."""


def smc_socket_with_number(fd: int) -> SMCSocket | None:
    """The open socket of this process in SMC-R mode whose ``fileno()`` gave out ``fd``."""
    for sock in list(smc_sockets):
        if sock._shown == fd and not sock._gone and sock._mode == "SMCR":
            return sock  # type: ignore[no-any-return]
    return None


def create_connection(address: tuple[str, int], timeout: float | None = None,
                      source_address: tuple[str, int] | None = None) -> SMCSocket:
    """Connect to ``address`` as ``socket.create_connection`` does, with SMC-R where the
    peer offers it: the TCP connection is made, and if both ends offered SMC (discovery:
    the TCP option, or a peer list) the CLC handshake follows within the same call and the
    socket is in SMC-R mode; otherwise it is plain TCP (:meth:`SMCSocket.smc_info` says
    which, and why).  The application uses it as a TCP socket either way.

    :param address: ``(host, port)``; every address ``getaddrinfo`` gives is tried in turn.
    :param timeout: seconds for the connect and the CLC handshake together (None: block).
    :param source_address: ``(host, port)`` to bind to first.
    :returns: the connected socket.
    :raises OSError: as ``socket.create_connection``: the last address's error.
    """
    host, port = address
    err: OSError | None = None
    for family, type_, proto, _, sa in _socket.getaddrinfo(host, port, 0, _socket.SOCK_STREAM):
        sock = SMCSocket(family, type_, proto)
        try:
            if timeout is not None:
                sock.settimeout(timeout)
            if source_address:
                sock.bind(source_address)
            sock.connect(sa)
            return sock
        except OSError as exc:
            err = exc
            sock.close()
    raise err if err is not None else OSError("getaddrinfo returns an empty list")


def create_server(address: tuple[str, int] | tuple[str, int, int, int], *,
                  family: int = _socket.AF_INET,
                  backlog: int | None = None, reuse_port: bool = False) -> SMCSocket:
    """A listening socket on ``address``, as ``socket.create_server``, serving SMC-R and
    plain TCP clients alike: each client whose connection offered SMC runs the CLC
    handshake in the background from ``listen`` on, side by side with the others, and
    ``accept`` returns connections as their handshakes end (in SMC-R mode, or TCP with
    the reason of the fallback); a slow or silent client delays nobody.

    :param address: ``(host, port)``, or ``(host, port, flowinfo, scope_id)`` for IPv6.
    :param family: ``AF_INET`` or ``AF_INET6``.
    :param backlog: the listen backlog (default 128).
    :param reuse_port: set ``SO_REUSEPORT`` (``SO_REUSEADDR`` is always set).
    :returns: the listening socket.
    :raises OSError: from ``bind`` or ``listen``.
    """
    sock = SMCSocket(family, _socket.SOCK_STREAM)
    try:
        sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEPORT, 1)
        sock.bind(address)
        sock.listen(128 if backlog is None else backlog)
    except OSError:
        sock.close()
        raise
    return sock


SocketBase.own_calls = {name: getattr(SMCSocket, name) for name in METHODS}
SMCSocket.__module__ = "smcr.socket"  # its public home (repr, pickling of errors, docs)
