"""What every module of the socket layer shares: the standard library's socket class and its
C getters, how a socket is connected (:class:`SmcInfo`), the registries of this process's
SMC sockets, and an SMC socket's state (:class:`SocketBase`: the layer's parts sit below
:class:`~smcr.socket.api.SMCSocket`, which subclasses it).
"""

from __future__ import annotations

import _socket as _csocket
import functools
import ipaddress
import os
import socket as _socket
import struct
import threading
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from smcr import plainsock
from smcr.stack.conn import METHODS, DataPath, SocketCalls
from smcr.stack.frames import release_frames
from smcr.stack.hostconn import HostConn
from smcr.stack.readiness import Readiness
from smcr.stack.runtime import Stack
from smcr.wire.clc import uncompress_bufsize

if TYPE_CHECKING:
    from smcr.socket.tcphold import TcpHold

PlainSocket = plainsock.PlainSocket
"""``socket.socket`` as the standard library defines it (:data:`smcr.plainsock.PlainSocket`)."""
INET = (int(_socket.AF_INET), int(_socket.AF_INET6))
# the C type's own attribute getters: socket.socket's properties convert to enums
c_family = _csocket.socket.family.__get__
c_type = _csocket.socket.type.__get__
c_proto = _csocket.socket.proto.__get__
c_gettimeout = _csocket.socket.gettimeout
DONTWAIT = int(_socket.MSG_DONTWAIT)
PEEK = int(_socket.MSG_PEEK)
WAITALL = int(_socket.MSG_WAITALL)
OOB = int(_socket.MSG_OOB)
MAX_BUFFER = 16 << 20
LINGER_ZERO = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() resets the connection


@dataclass(frozen=True, slots=True)
class SmcInfo:
    """How a socket is connected (``smcss`` columns), from :meth:`SMCSocket.smc_info`."""

    mode: str  # "SMCR", "TCP" or "INIT"
    """``SMCR`` (SMC-R), ``TCP`` (plain TCP: a fallback, or TCP from the start) or ``INIT``
    (not connected yet)."""
    local_code: int = 0
    """This end's decline code of a fallback (:class:`~smcr.DeclineCode`), 0 if none."""
    peer_code: int = 0
    """The peer's decline code of a fallback (its CLC Decline), 0 if none."""
    lgr_id: int = 0
    """SMC-R: the link group's id (per process)."""
    first_contact: bool = False
    """SMC-R: whether this connection made its link group (else it reused one)."""
    state: str = "INIT"
    """SMC-R: the connection state as Linux names it (``ACTIVE``, ``PEERCLW1``, ...)."""
    rmb_size: int = 0
    """SMC-R: bytes of this end's receive buffer (RMBE)."""
    peer_rmb_size: int = 0
    """SMC-R: bytes of the peer's receive buffer, what this end may write ahead."""
    version: int = 0
    """SMC-R: the version agreed (1 or 2)."""

    @property
    def reason(self) -> str:
        """``<local>/<remote>`` in hex, as ``smcss`` prints fallback reasons."""
        return f"0x{self.local_code:08x}/0x{self.peer_code:08x}"


INIT_INFO = SmcInfo("INIT")


_Method = TypeVar("_Method", bound=Callable[..., Any])


def lets_go_of_buffer(method: _Method) -> _Method:
    """A method that takes the caller's buffer (``send``, ``recv_into``, ...) whose error
    keeps no view of it (:func:`~smcr.stack.frames.release_frames`): as a call of
    ``socket.socket``'s, which is C, the buffer is free again once the call returned, the
    program may resize a ``bytearray`` even while it keeps the error."""

    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except OSError as exc:
            release_frames(exc)
            del args, kwargs
            raise

    return call  # type: ignore[return-value]


def bufsize(value: int) -> int:
    """SO_SNDBUF/SO_RCVBUF -> buffer size as Linux rounds it (16 KiB << n >= value)."""
    size = 16384
    while size < value and size < MAX_BUFFER:
        size <<= 1
    return uncompress_bufsize(size.bit_length() - 15)


@functools.lru_cache(maxsize=256)
def parse_ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """A socket address's host as an address object (a link-local one without its scope),
    kept per text: asked at every connect and accept."""
    return ipaddress.ip_address(host.split("%", maxsplit=1)[0])


def local_port(sock: _socket.socket) -> int:
    """The TCP port ``sock`` is bound to (0: none yet, or no address)."""
    try:
        return int(PlainSocket.getsockname(sock)[1])
    except (OSError, IndexError, TypeError):
        return 0


def address_port(address: Any) -> int:
    """The port of a ``connect`` address (``(host, port)``, ``(host, port, flow, scope)``;
    0 for anything else: ``connect`` itself then says what is wrong)."""
    if isinstance(address, tuple) and len(address) >= 2 and isinstance(address[1], int):
        return address[1]
    return 0


def linger(tcp: _socket.socket) -> float | None:
    """``SO_LINGER`` of the TCP socket (``setsockopt`` passes it there, where Linux SMC copies
    it too): the linger time in seconds, or None when off (or the socket is gone)."""
    try:
        onoff, seconds = struct.unpack("ii", tcp.getsockopt(_socket.SOL_SOCKET,
                                                            _socket.SO_LINGER, 8))
    except OSError:
        return None
    return float(seconds) if onoff else None


class QueueLike(Protocol):
    """A listening socket's accept queue (:class:`~smcr.socket.acceptq.AcceptQueue`), as the
    parts below it see it."""

    pid: int
    readiness: Readiness
    listener: Any
    closed: bool
    holders: int
    cond: threading.Condition

    @property
    def sock(self) -> _socket.socket: ...  # the listening TCP socket
    @property
    def family(self) -> int: ...
    @property
    def type(self) -> int: ...
    @property
    def proto(self) -> int: ...

    def show(self) -> None: ...
    def close(self) -> None: ...
    def release(self) -> None: ...


class ConnectingLike(Protocol):
    """A non-blocking connect in progress (:class:`~smcr.socket.connecting.Connecting`), as
    the parts below it see it."""

    readiness: Readiness

    def close(self) -> None: ...
    def connect_again(self, address: Any) -> None: ...
    def so_error(self) -> int | None: ...


class ShareLike(Protocol):
    """A connection held by several sockets (:class:`~smcr.socket.sharing.Share`), as the
    parts below it see it."""

    addresses: tuple[Any, Any]

    def release(self) -> bool: ...


class SocketBase(PlainSocket):
    """An SMC socket's state: what :class:`~smcr.socket.api.SMCSocket` (the API class, which
    subclasses this) and the socket layer's parts (handshake, descriptor number, connect,
    accept queue, sharing, fork) read and write.

    Most of it is set only when the socket gets there, so these class-level values are
    the defaults (a plain TCP socket costs little more than a ``socket.socket`` to make).
    """

    _debug = False  # smcr run -d
    default_rmb_size = 0
    """RMB size of new sockets (0: the RNIC's default); ``smcr run -r`` sets it."""
    default_sndbuf_size = 0
    """Send buffer size of new sockets (0: the RNIC's default); ``smcr run -t`` sets it."""
    own_calls: ClassVar[dict[str, Any]] = {}
    """The API class's data methods by name (:data:`smcr.stack.conn.METHODS`), which
    :meth:`_shadow_fast` stands in for."""

    # socket.socket's own private members (not in its type stubs)
    _io_refs: int
    _closed: bool
    if TYPE_CHECKING:
        def _accept(self) -> tuple[int, Any]: ...

    _mode: str
    _timeout: float | None
    _rmb_size: int
    _sndbuf_size: int
    _hc: HostConn | None = None
    _stack: Stack | None = None
    _prefix = b""  # fallback: bytes the peer sent behind its last CLC message
    _info: SmcInfo
    _calls: SocketCalls | None = None  # SMC-R mode: this socket's hold on the connection
    _share: ShareLike | None = None  # SMC-R mode, held by several sockets (dup, detach)
    _via_readiness = False  # made from the readiness descriptor of an SMC-R socket
    _borrowed_fd = False  # ... that very descriptor, which the connection owns
    _smc_ok = False  # listening: opted in to discovery (its children may use SMC)
    _queue: QueueLike | None = None  # listening: connections of its handshakes
    _connecting: ConnectingLike | None = None  # a non-blocking connect in progress
    _connect_error = 0  # what getsockopt(SO_ERROR) says next (non-blocking connect)
    _connect_failed = False  # TCP mode after a failed connect: a new connect may start over
    _tcp_error = 0  # the kernel's error a CLC read took from the TCP socket: _tcp_ok tells it
    _decline_owed = False  # fell back while connecting: the Decline goes first (pay_decline)
    _gone = False  # closed for good (close(), and no makefile() file open)
    _parent_ends: list[_socket.socket] = []  # noqa: RUF012 - SMC-R mode: forked children's pairs
    _fork_ends: Any = None  # during a fork (smcr.socket.fork.ForkEnds)
    _relayed: tuple[Any, Any] | None = None  # a forked child's: addresses of the connection
    _finalizer: weakref.finalize[Any, Any] | None = None  # SMC-R mode: collected
    _shown = -1  # the number fileno() gave out, the socket's for life (reshow); -1: none yet
    _shown_tcp: weakref.finalize[Any, Any] | None = None  # _shown is a TCP number of ours
    _reshow_due = False  # settled in a background thread: reshow in the program's (catch_up)
    _queue_finalizer: weakref.finalize[Any, Any] | None = None  # listening: the queue's
    _tcp_hold: TcpHold | None = None  # our TCP descriptor is the runtime's too (tcphold)

    _shown_as: tuple[int, int] | None = None  # (family, proto) made with (linuxapi), if not TCP's
    _limit_hs = 0  # SOL_SMC SMC_LIMIT_HS
    _backlog = 128  # what listen() was given

    @property
    def family(self) -> int:  # type: ignore[override]  # (AF_SMC is no AddressFamily)
        """As ``socket.socket``'s, or ``AF_SMC`` for a socket made so (:mod:`.linuxapi`)."""
        shown = self._shown_as
        return PlainSocket.family.fget(self) if shown is None else shown[0]  # type: ignore[attr-defined]

    @property
    def proto(self) -> int:
        """As ``socket.socket``'s, or the SMC protocol a socket was made with
        (``SMCPROTO_SMC6``, ``IPPROTO_SMC``)."""
        shown = self._shown_as
        return c_proto(self) if shown is None else shown[1]

    def _listening(self) -> _socket.socket:
        """Where TCP's own calls go (addresses, options): this socket, or, for one made
        from a listening socket's number, the listening TCP socket."""
        queue = self._queue
        if self._mode == "LISTEN" and self._via_readiness and queue is not None:
            return queue.sock
        return self

    def _nonblocking_descriptor(self) -> bool:
        """A socket made from a descriptor with ``O_NONBLOCK`` and no timeout of its own
        (``socket.fromfd`` of a non-blocking socket: ``gettimeout()`` says None): its calls
        return at once, as the kernel's do on that descriptor, whose flag the socket it
        came from shares."""
        return self._timeout is None and not os.get_blocking(PlainSocket.fileno(self))

    def _real_close(self) -> None:
        """socket.socket's, and the TCP socket's duplicate under the application's number
        (after a fallback: :func:`~smcr.socket.numbers.reshow`).  A descriptor the runtime
        holds too is only let go of (:mod:`smcr.socket.tcphold`)."""
        if self._shown_tcp is not None:
            self._shown_tcp()  # (closes it, once)
            self._shown_tcp = None
        self._let_go_tcp()
        PlainSocket._real_close(self)  # type: ignore[attr-defined]

    def _let_go_tcp(self) -> None:
        """Detach our TCP descriptor if the runtime holds it too; closed here only if the
        runtime let go of it first."""
        hold, self._tcp_hold = self._tcp_hold, None
        if hold is not None:
            fd = PlainSocket.detach(self)
            if fd >= 0 and hold.app_lets_go():
                os.close(fd)

    def __del__(self) -> None:
        """As ``socket.socket``'s finalizer: warn of an unclosed socket and close its
        descriptor, except one the runtime holds too, which is only let go of."""
        if self._tcp_hold is not None and PlainSocket.fileno(self) >= 0:
            try:
                warnings.warn(f"unclosed {self!r}", ResourceWarning, stacklevel=1, source=self)
            except Exception:  # (at interpreter exit, say: the descriptor goes all the same)
                pass
            try:
                self._let_go_tcp()
            except Exception:  # (a finalizer must not raise; at exit, modules may be gone)
                pass
        PlainSocket.__del__(self)  # type: ignore[attr-defined]  # (the C type's finalizer)

    def _let_go_calls(self) -> None:
        """This socket no longer uses the connection (closed, detached, moved on): its calls
        fail with ``EBADF`` from now on, and its dictionary holds none of them."""
        if self._calls is not None:
            self._calls.closed = True
        self._unshadow_fast()

    def _drop_descriptor(self) -> None:
        """Close our descriptor (one we borrowed from the connection stays open)."""
        if self._borrowed_fd:
            PlainSocket.detach(self)
        else:
            self._real_close()

    def _shadow_fast(self) -> None:
        """Put the compiled data calls of this socket's hold on the connection
        (:class:`~smcr.stack.conn.SocketCalls`) in this socket's dictionary, each where
        the class's method is the API class's (a subclass's own ``sendall``, ssl's for one,
        stays what is called; ``recv`` too where a subclass has its own ``recv_into``,
        which ours would not call)."""
        calls = self._calls
        assert calls is not None
        names = _SHADOWED.get(type(self))
        if names is None:  # (once per class: every connection of it would ask the same)
            cls, own = type(self), self.own_calls
            names = _SHADOWED[cls] = tuple(
                name for name in METHODS if getattr(cls, name) is own[name]
                and (name != "recv" or cls.recv_into is own["recv_into"]))  # fmt: skip
        for name in names:
            setattr(self, name, getattr(calls, name))

    def _unshadow_fast(self) -> None:
        """The class's methods again (closed, or no longer SMC-R here): nothing of the
        connection stays referenced by a socket object that outlives it."""
        for name in METHODS:
            self.__dict__.pop(name, None)


def new_socket(cls: type[SocketBase], family: int, kind: int, proto: int, fileno: int,
               accepted: bool = True) -> SocketBase:  # fmt: skip
    """A socket object of class ``cls`` (the API class, or ``smcr run``'s) over descriptor
    ``fileno``: ``accepted`` as ``accept`` and ``dup`` make one (the state comes from its
    maker), else as ``socket.socket(fileno=...)`` adopts a descriptor."""
    make: Callable[..., SocketBase] = cls
    if accepted:
        return make(family, kind, proto, fileno=fileno, _accepted=True)
    return make(family, kind, proto, fileno=fileno)


_SHADOWED: dict[type, tuple[str, ...]] = {}
"""The data calls :meth:`SocketBase._shadow_fast` puts in a socket's dictionary, by class
(a few classes, which live as long as the program: a weak dictionary's look-up would cost
more than what it saves)."""

smc_sockets: weakref.WeakSet[Any] = weakref.WeakSet()
"""The sockets of this process in SMC-R mode (see :mod:`smcr.socket.fork`)."""
accept_queues: weakref.WeakSet[Any] = weakref.WeakSet()
"""The accept queues of this process (see :meth:`AcceptQueue.pause`)."""


def collected(calls: SocketCalls) -> None:
    """An SMC-R mode socket was garbage-collected unclosed (``weakref.finalize``; it holds the
    socket's calls, never the socket object): a call kept from it fails with ``EBADF``
    from now on, as on a closed socket, and the connection closes as ``close()`` would.

    The socket's own finalizer (``socket.socket``'s) has warned and closed its descriptor;
    the connection goes to the runtime (:meth:`DataPath.orphan`): the collector may run in
    any thread, even one that holds the runtime's lock, so nothing here takes that lock or
    waits.
    """
    calls.closed = True
    orphan(calls.path)


def orphan(path: DataPath) -> None:
    """The runtime closes the connection of sockets that are all gone (module docstring of
    :func:`collected`)."""
    path.orphan(linger(path.hc.tcp))
