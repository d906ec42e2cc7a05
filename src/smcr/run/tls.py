"""TLS over SMC-R for ``smcr run``: ``SSLContext.wrap_socket`` of an SMC socket.

The ``ssl`` module's own socket reads and writes the descriptor in C, which
for an SMC-R connection would be the idle TCP socket beneath it.  So a socket
in SMC-R mode (and a listening SMC socket, whose connections may be) is
wrapped by :class:`SmcTlsSocket` instead: the TLS engine is an
``ssl.SSLObject`` between two memory buffers, and the records go through the
SMC socket's ``send``/``recv``, i.e. by RDMA WRITE.  It is an
``ssl.SSLSocket`` (``isinstance`` holds) with that class's methods and
semantics: blocking, timeouts, non-blocking sockets raising
``SSLWantReadError``/``SSLWantWriteError``, ``unwrap``, ``makefile``,
ragged EOFs.  Sockets in TCP mode get the ``ssl`` module's own socket.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket as _socket
import ssl
from typing import Any

from smcr.socket import PlainSocket as _PlainSocket
from smcr.socket import SMCSocket, lets_go_of_buffer, smc_socket_with_number

_HEADER = 5
"""Bytes of a TLS record header (type, version, length): the length is its last two."""
_WRITE_PIECE = 16 << 10
"""Plaintext bytes per ``SSLObject.write`` (one record, as OpenSSL cuts them): what a
non-blocking ``write`` takes or leaves, record by record (:meth:`SmcTlsSocket.write`)."""


def wrap_smc(sock: Any, server_side: bool, do_handshake_on_connect: bool,
             suppress_ragged_eofs: bool, server_hostname: str | None, context: Any,
             session: Any) -> SmcTlsSocket | None:  # fmt: skip
    """What ``SSLContext.wrap_socket`` returns for ``sock`` under ``smcr run``
    (:func:`smcr.run.patches.patch_ssl`) if it is an SMC socket in SMC-R mode or a
    listening one; None if the ``ssl`` module's own socket is to wrap it."""
    inner = _smc_socket_of(sock)
    if inner is not None and (inner.smc_mode == "SMCR" or inner.smc_listening):
        return SmcTlsSocket.wrap(inner, server_side, do_handshake_on_connect,
                                 suppress_ragged_eofs, server_hostname, context, session)
    return None


def _smc_socket_of(sock: Any) -> SMCSocket | None:
    """The SMC socket that ``wrap_socket`` is given: ``sock`` itself, or the one behind an
    object that stands in for it (CPython's asyncio tests wrap theirs in a class that
    passes every call on), found by its ``fileno()``: ssl's own socket would read and
    write that number, a readiness descriptor in SMC-R mode."""
    if isinstance(sock, SMCSocket):
        return sock
    try:
        fd = sock.fileno()
    except (AttributeError, OSError):
        return None
    return smc_socket_with_number(fd) if isinstance(fd, int) and fd >= 0 else None


def _eof_in_violation() -> ssl.SSLEOFError:
    """What ``ssl`` raises from ``read`` or ``write`` when the TCP connection beneath
    was reset: CPython calls ``SSL_read_ex``/``SSL_write_ex``, whose failure returns 0,
    and ``_ssl.c`` reports a system-call error with that return value as this EOF,
    not as ``ConnectionResetError`` (a reset in ``do_handshake``, which returns -1,
    stays an ``OSError``).  A reader with ``suppress_ragged_eofs`` gets ``b""``: a
    peer that closes with our TLS 1.3 session tickets unread aborts the connection
    (TCP sends a reset there too), and a server must see the end of its client, not
    an error."""
    error = ssl.SSLEOFError(ssl.SSL_ERROR_EOF, "EOF occurred in violation of protocol")
    error.library = None  # type: ignore[assignment]
    error.reason = None  # type: ignore[assignment]
    return error


class SmcTlsSocket(ssl.SSLSocket):
    """An ``ssl.SSLSocket`` whose TLS records travel over an SMC socket (module doc)."""

    _inner: SMCSocket
    _tls: ssl.SSLObject | None
    _incoming: ssl.MemoryBIO
    _outgoing: ssl.MemoryBIO
    _unsent: bytes
    _unsent_plain: int
    _header: bytes
    _record_left: int
    # SSLSocket's plain attributes (set by its _create; not in its type stubs)
    do_handshake_on_connect: bool
    suppress_ragged_eofs: bool
    _closed: bool

    @property
    def _sslobj(self) -> ssl.SSLObject | None:
        """ssl's own name for the TLS state, which programs look at to tell whether a
        socket still speaks TLS (an ``asyncore`` server sends its close_notify only
        then): ours (None before the handshake can start and after ``unwrap``)."""
        return self._tls

    @_sslobj.setter
    def _sslobj(self, tls: ssl.SSLObject | None) -> None:
        self._tls = tls

    @classmethod
    def wrap(cls, inner: SMCSocket, server_side: bool, do_handshake_on_connect: bool,
             suppress_ragged_eofs: bool, server_hostname: str | None, context: ssl.SSLContext,
             session: ssl.SSLSession | None) -> SmcTlsSocket:  # fmt: skip
        """What ``SSLContext.wrap_socket(inner, ...)`` returns for an SMC socket."""
        if server_side and server_hostname:
            raise ValueError("server_hostname can only be specified in client mode")
        if session is not None and server_side:
            raise ValueError("session can only be specified in client mode")
        if context.check_hostname and not server_hostname and not server_side:
            raise ValueError("check_hostname requires server_hostname")
        inner = inner.smc_move()  # ours now; the caller's object is closed, as ssl detaches it
        self = cls.__new__(cls, inner.family, inner.type, inner.proto)  # type: ignore[call-arg]
        # our own descriptor of the TCP socket (addresses, options); the bytes go via inner
        _PlainSocket.__init__(self, inner.family, inner.type, inner.proto,
                              os.dup(_PlainSocket.fileno(inner)))  # fmt: skip
        self._inner = inner
        self._context = context
        self._session = session
        self.server_side = server_side
        self.server_hostname = context._encode_hostname(server_hostname)  # type: ignore[attr-defined]
        self.do_handshake_on_connect = do_handshake_on_connect
        self.suppress_ragged_eofs = suppress_ragged_eofs
        self._incoming, self._outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._unsent = b""  # records the SMC socket did not take yet
        self._unsent_plain = 0  # plaintext bytes of a write() whose record is in _unsent
        self._header = b""  # the part of a record header read so far
        self._record_left = 0  # bytes of the current record not read yet
        self._tls = None
        if inner.smc_mode == "SMCR" and not self._still_connected():
            return self  # (as ssl's socket: not connected, every call says so)
        if inner.smc_mode == "SMCR":
            self._tls = context.wrap_bio(self._incoming, self._outgoing, server_side,
                                         server_hostname, session=session)  # fmt: skip
            if do_handshake_on_connect:
                try:
                    if inner.gettimeout() == 0.0:
                        raise ValueError("do_handshake_on_connect should not be specified "
                                         "for non-blocking sockets")  # fmt: skip
                    self.do_handshake()
                except BaseException:
                    self.close()  # as ssl does: a socket whose handshake failed is closed
                    raise
        return self

    def _still_connected(self) -> bool:
        """Whether the connection is still there to wrap, as ``ssl.SSLSocket._create``
        asks (``getpeername``): a peer that reset it before the handshake leaves it
        unconnected, and bytes it sent before its reset end the wrap with ssl's
        "Closed before TLS handshake with data in recv buffer" (they must not pass
        for the peer's TLS, and OpenSSL would read them as a bad record instead).

        :raises ssl.SSLError: that error (the socket is closed, as ssl closes it).
        :raises OSError: the read's error, as ssl raises it (``ECONNRESET``).
        """
        try:
            self._inner.getpeername()
        except OSError as exc:
            if exc.errno != errno.ENOTCONN:
                raise
        else:
            return True
        try:
            data = self._inner.recv(1, _socket.MSG_DONTWAIT)
        except OSError as exc:
            if exc.errno not in (errno.ENOTCONN, errno.EINVAL):
                self.close()
                raise
            data = b""
        if data:
            self.close()
            reason = "Closed before TLS handshake with data in recv buffer."
            error = ssl.SSLError(errno.ENOTCONN, reason)
            error.reason = reason  # (the attributes _ssl.c gives its errors)
            error.library = None  # type: ignore[assignment]
            raise error
        return False

    # ------------------------------------------------------------ the record pump

    def _pump(self, op: str, *args: Any) -> Any:
        """Run one SSLObject call, moving records to and from the SMC socket until it
        completes; on a non-blocking socket raise what ``ssl`` raises there.

        The records a ``read`` makes are sent as far as the socket takes them (the rest
        with the next call): a read never raises ``SSLWantWriteError``, which event
        loops do not expect there.  A ``write`` sends its own (:meth:`write`).
        """
        tls = self._engine()
        quiet = op == "read"
        while True:
            try:
                result = getattr(tls, op)(*args)
            except ssl.SSLWantReadError:
                self._flush(quiet)
                self._fill()
                continue
            except ssl.SSLWantWriteError:
                self._flush()
                continue
            except ssl.SSLError:
                self._send_alert()
                raise
            if op != "write":
                self._flush(quiet)
            return result

    def _send_alert(self) -> None:
        """After a TLS error: send the alert the engine made for the peer (OpenSSL over
        TCP writes it to the socket before it returns the error; kept in the memory BIO,
        the peer saw only the connection end and told the wrong story, or none)."""
        with contextlib.suppress(OSError):
            self._flush(quiet=True)

    def _engine(self) -> ssl.SSLObject:
        if self._tls is None:
            raise ValueError("SSL object not connected" if not self._closed
                             else "I/O operation on closed SSL socket")  # fmt: skip
        return self._tls

    def _flush(self, quiet: bool = False) -> None:
        """Send the records the TLS engine produced, keeping what a non-blocking send
        could not take (``SSLWantWriteError``, unless ``quiet``) for the next call."""
        data = self._unsent + self._outgoing.read()
        self._unsent = b""
        view = memoryview(data)
        while view:
            try:
                n = self._inner.send(view)
            except BlockingIOError:
                self._unsent = bytes(view)
                if quiet:
                    return
                raise ssl.SSLWantWriteError(ssl.SSL_ERROR_WANT_WRITE,
                                            "The operation did not complete (write)") from None
            view = view[n:]

    def _fill(self) -> None:
        """Receive records for the TLS engine (EOF goes to it as such), never past the
        end of the record it reads: OpenSSL over a TCP socket reads a header, then its
        record, and what comes after stays in the socket, where readiness (select,
        poll, an event loop) sees it.  Read ahead into the memory buffer, it would be
        seen by nobody: an event loop that stops reading once it has what it wanted
        would wait for a readable event that never comes."""
        want = self._record_left or _HEADER - len(self._header)
        try:
            data = self._inner.recv(want)
        except BlockingIOError:
            raise ssl.SSLWantReadError(ssl.SSL_ERROR_WANT_READ,
                                       "The operation did not complete (read)") from None
        if not data:
            self._incoming.write_eof()
            return
        self._incoming.write(data)
        if self._record_left:
            self._record_left -= len(data)
            return
        self._header += data
        if len(self._header) == _HEADER:
            self._record_left = int.from_bytes(self._header[3:], "big")
            self._header = b""

    # ------------------------------------------------------------ SSLSocket's API

    @property
    def context(self) -> ssl.SSLContext:
        return self._context

    @context.setter
    def context(self, ctx: ssl.SSLContext) -> None:
        self._context = ctx
        if self._tls is not None:
            self._tls.context = ctx

    @property
    def session(self) -> ssl.SSLSession | None:
        return self._tls.session if self._tls is not None else self._session

    @session.setter
    def session(self, session: ssl.SSLSession | None) -> None:
        self._session = session
        if self._tls is not None:
            self._tls.session = session

    @property
    def session_reused(self) -> bool | None:
        return self._tls.session_reused if self._tls is not None else None

    def smc_info(self) -> Any:
        """How the SMC socket beneath is connected."""
        return self._inner.smc_info()

    def fileno(self) -> int:
        """The SMC socket's descriptor (readable when records came)."""
        return self._inner.fileno()

    def settimeout(self, value: float | None) -> None:
        self._inner.settimeout(value)

    def gettimeout(self) -> float | None:
        return self._inner.gettimeout()

    def setblocking(self, flag: bool) -> None:
        self._inner.setblocking(flag)

    def getblocking(self) -> bool:
        return self._inner.getblocking()

    def do_handshake(self, block: bool = False) -> None:
        self._check_connected()
        self._pump("do_handshake")

    def _check_connected(self) -> None:
        if self._tls is None:
            raise OSError(errno.ENOTCONN, os.strerror(errno.ENOTCONN))

    @lets_go_of_buffer
    def read(self, len: int = 1024, buffer: Any = None) -> Any:
        try:
            try:
                if buffer is not None:
                    return self._pump("read", len, buffer)
                return self._pump("read", len)
            except ConnectionError:
                raise _eof_in_violation() from None
        except ssl.SSLError as exc:
            if exc.args[0] == ssl.SSL_ERROR_EOF and self.suppress_ragged_eofs:
                return 0 if buffer is not None else b""
            raise

    @lets_go_of_buffer
    def write(self, data: Any) -> int:
        """Encrypt and send all of ``data``, or raise ``SSLWantWriteError`` (non-blocking
        socket, full send buffer) and take the rest when called again with the same
        data, as ``SSL_write`` does: the records made so far wait in ``_unsent``, and
        the plaintext they hold counts as taken by the retry.  (Returning on
        ``SSLWantWriteError`` after the engine took the data, the caller sent it twice;
        raising only once every record went, nothing would send the last ones when
        the caller had nothing more to write.)"""
        tls = self._engine()
        view = memoryview(data).cast("B")
        done, self._unsent_plain = min(self._unsent_plain, len(view)), 0
        try:
            self._flush()  # what an earlier call left, first
            while done < len(view):
                piece = view[done : done + _WRITE_PIECE]
                while True:
                    try:
                        tls.write(piece)
                        break
                    except ssl.SSLWantReadError:  # handshake or renegotiation first
                        self._flush()
                        self._fill()
                    except ssl.SSLError:
                        self._send_alert()
                        raise
                done += len(piece)
                self._flush()
        except ssl.SSLWantWriteError:
            self._unsent_plain = done
            raise
        except ConnectionError:
            raise _eof_in_violation() from None
        return len(view)

    def _raw(self) -> SMCSocket | None:
        """The SMC socket itself when there is no TLS on it (after ``shutdown``, or never
        connected): ssl's socket then reads and writes its descriptor's bytes as they
        are, and so does this one (``_closed``: the ``ssl`` module's error instead)."""
        return self._inner if self._tls is None and not self._closed else None

    def recv(self, buflen: int = 1024, flags: int = 0) -> bytes:
        if (raw := self._raw()) is not None:
            return raw.recv(buflen, flags)
        if flags:
            raise ValueError(f"non-zero flags not allowed in calls to recv() on {type(self)}")
        return bytes(self.read(buflen))

    @lets_go_of_buffer
    def recv_into(self, buffer: Any, nbytes: int | None = None, flags: int = 0) -> int:
        if (raw := self._raw()) is not None:
            return raw.recv_into(buffer, nbytes or 0, flags)
        if flags:
            raise ValueError(f"non-zero flags not allowed in calls to recv_into() on "
                             f"{type(self)}")  # fmt: skip
        if nbytes is None or nbytes == 0:
            nbytes = memoryview(buffer).nbytes if buffer is not None else 1024
        return int(self.read(nbytes, buffer))

    def recvfrom(self, buflen: int = 1024, flags: int = 0) -> tuple[bytes, Any]:
        raise ValueError(f"recvfrom not allowed on instances of {type(self)}")

    def recvfrom_into(self, buffer: Any, nbytes: int | None = None,
                      flags: int = 0) -> tuple[int, Any]:  # fmt: skip
        raise ValueError(f"recvfrom_into not allowed on instances of {type(self)}")

    @lets_go_of_buffer
    def send(self, data: Any, flags: int = 0) -> int:
        if (raw := self._raw()) is not None:
            return raw.send(data, flags)
        if flags:
            raise ValueError(f"non-zero flags not allowed in calls to send() on {type(self)}")
        return self.write(data)

    @lets_go_of_buffer
    def sendall(self, data: Any, flags: int = 0) -> None:
        if (raw := self._raw()) is not None:
            raw.sendall(data, flags)
            return
        if flags:
            raise ValueError(f"non-zero flags not allowed in calls to sendall() on "
                             f"{type(self)}")  # fmt: skip
        view = memoryview(data).cast("B")
        while view:
            view = view[self.write(view) :]

    def sendfile(self, file: Any, offset: int = 0, count: int | None = None) -> int:
        return int(self._sendfile_use_send(file, offset, count))  # type: ignore[attr-defined]

    def pending(self) -> int:
        return self._tls.pending() if self._tls is not None else 0

    def getpeercert(self, binary_form: bool = False) -> Any:
        self._check_connected()
        assert self._tls is not None
        return self._tls.getpeercert(binary_form)

    def selected_npn_protocol(self) -> str | None:
        return None

    def selected_alpn_protocol(self) -> str | None:
        return self._tls.selected_alpn_protocol() if self._tls is not None else None

    def cipher(self) -> tuple[str, str, int] | None:
        return self._tls.cipher() if self._tls is not None else None

    def shared_ciphers(self) -> list[tuple[str, str, int]] | None:
        return self._tls.shared_ciphers() if self._tls is not None else None

    def compression(self) -> str | None:
        return self._tls.compression() if self._tls is not None else None

    def version(self) -> str | None:
        return self._tls.version() if self._tls is not None else None

    def get_channel_binding(self, cb_type: str = "tls-unique") -> bytes | None:
        return self._tls.get_channel_binding(cb_type) if self._tls is not None else None

    def verify_client_post_handshake(self) -> None:
        self._check_connected()
        assert self._tls is not None
        self._tls.verify_client_post_handshake()

    def unwrap(self) -> SmcTlsSocket:
        """Shut TLS down (``SSLSocket.unwrap``): this socket carries on in clear text over
        the SMC socket beneath (:meth:`_raw`), as ssl's own does over TCP; ``ValueError``
        when it has no TLS (never had, or unwrapped already)."""
        if self._tls is None:
            raise ValueError(f"No SSL wrapper around {self}")
        self._pump("unwrap")
        self._tls = None
        return self

    def shutdown(self, how: int) -> None:
        self._tls = None
        self._inner.shutdown(how)

    def connect(self, addr: Any) -> None:
        raise ValueError("attempt to connect already-connected SSLSocket!")

    def connect_ex(self, addr: Any) -> int:
        raise ValueError("attempt to connect already-connected SSLSocket!")

    def accept(self) -> tuple[ssl.SSLSocket, Any]:
        """A listening SMC socket's next connection, wrapped in TLS (server side)."""
        conn, addr = self._inner.accept()
        wrapped = self.context.wrap_socket(conn, server_side=True,
                                           do_handshake_on_connect=self.do_handshake_on_connect,
                                           suppress_ragged_eofs=self.suppress_ragged_eofs)
        return wrapped, addr

    def listen(self, backlog: int = 128) -> None:
        self._inner.listen(backlog)

    def dup(self) -> SmcTlsSocket:
        raise NotImplementedError(f"Can't dup() {type(self).__name__} instances")

    def detach(self) -> int:
        raise OSError(errno.EOPNOTSUPP, "detach is not supported by a TLS socket over SMC-R")

    def _real_close(self) -> None:
        self._tls = None
        self._inner.close()
        _PlainSocket._real_close(self)  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return f"<smcr.SmcTlsSocket over {self._inner!r}>"
