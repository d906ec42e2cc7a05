"""``SMCSocket``: a ``socket.socket`` (stream) that speaks SMC-R where the peer does.

Whether it may: discovery (:mod:`smcr.discovery`) says, per connection, whether
the peer offered SMC (the TCP option in its SYN or SYN-ACK, or a peer policy).
If not, the socket is plain TCP at once (reason ``0x03010000``) and the peer
never sees a CLC byte.  If so, the CLC handshake runs; after it a socket is in
one of two modes:

* ``SMCR``: data goes through the runtime (:mod:`smcr.stack`): ``send`` copies
  into the send buffer and the engine RDMA-WRITEs it into the peer's RMBE;
  ``recv`` copies out of our own RMBE.  The TCP connection stays open, idle;
  ``fileno()`` is a readiness descriptor of the runtime's.
* ``TCP``: fallback; every call goes to the TCP socket, after any bytes the
  peer sent behind its last CLC message (they are the application's).

Either way :meth:`SMCSocket.smc_info` tells how the socket is connected and the
local/peer decline codes (what ``smcss`` prints as ``<local>/<remote>``).

The socket is a subclass of ``socket.socket`` whose own descriptor is the TCP
socket (the runtime holds a duplicate of it, which outlives ours when the
application closes first).  Sockets of other families and types are plain
sockets (``PLAIN``), so ``smcr run`` can make every socket one of these.

Background work, as Linux's workers do it: a listening socket has an accept
queue (:class:`_AcceptQueue`) from ``listen`` on, whose handshakes run side by
side, driven by the process's watcher thread (:mod:`smcr.stack.watcher`) and
the runtime; ``accept`` takes what has finished.  A non-blocking ``connect``
returns ``EINPROGRESS`` and finishes the same way (:class:`_Connecting`).
Blocking ``connect`` runs its handshake in the caller's thread.

Closing.  ``close`` leaves what the send buffer still holds to the runtime,
which sends it and then the closing CDC, giving the peer ``close_wait_tx`` (2 s,
as Linux's ``smc_close_active``) after each read to take more; ``close`` returns
at once, as TCP's does.  With ``SO_LINGER`` on (kept on the TCP socket, where
``setsockopt`` passes it), ``close`` itself waits its linger time.  A linger
time of 0 is an abortive close: the send buffer is dropped and an abort CDC
sent, so the peer's reads end in ``ECONNRESET`` as after a TCP reset (the
runtime keeps the connection's RMB until the peer's closing CDC answers, as
Linux does: the peer may still be writing) -- Linux
SMC sends its ordinary close CDC there (an abort only when unread data remains)
and resets only the idle TCP connection, so its peer reads EOF; we follow what a
``socket.socket`` program asks for with that option.
``shutdown(SHUT_WR)`` sends the done-writing CDC after the send buffer's last
byte, however long that takes, as TCP sends its FIN after its data.

A socket in SMC-R mode that is garbage-collected unclosed is closed as
``close`` would: ``socket.socket``'s own finalizer warns (``ResourceWarning``)
and closes our descriptor, and a ``weakref.finalize`` (holding the runtime and
the connection, never the socket) hands the connection to the runtime.  The
collector may run in any thread, even one holding the runtime's lock, and must
not wait: the runtime's progress thread takes the connection
(:meth:`Stack.orphan`), waits for the send buffer without blocking anyone (the
linger time or ``close_wait_tx``: what Linux's kernel does after ``close``,
done here by the thread that owns progress), then sends the closing CDC.
Sockets still referenced at interpreter exit are left to the runtime's own
end at exit (``finalize.atexit`` is off).

After ``fork`` an SMC-R connection stays in the parent's runtime; a child that
the parent hands it to (the parent closes its copy, as a forking server does)
uses it through the parent (:mod:`smcr.forkrelay`).  Listening sockets work in
the child, and a forking parent's accept queues pause until it accepts again
(:meth:`_AcceptQueue.pause`).
"""

from __future__ import annotations

import _socket as _csocket
import contextlib
import errno
import functools
import io
import ipaddress
import os
import selectors
import socket as _socket
import stat
import struct
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from smcr import discovery, forkrelay
from smcr.core import FellBack, HandshakeCompleted
from smcr.core.connection import Connection
from smcr.diag import registry as _registry
from smcr.diag import start as _diag_start
from smcr.stack.counters import COUNTERS as _C
from smcr.stack.descriptors import put_at
from smcr.stack.executor import ring_read, ring_write
from smcr.stack.hostconn import HostConn
from smcr.stack.readiness import Readiness
from smcr.stack.runtime import Stack, default_buffer_size, get_stack
from smcr.stack.sockfast import METHODS as FAST_METHODS
from smcr.stack.sockfast import SocketFast
from smcr.stack.watcher import get_watcher
from smcr.wire.clc import uncompress_bufsize
from smcr.wire.decline import DeclineCode, describe

_DONTWAIT = int(_socket.MSG_DONTWAIT)
_PEEK = int(_socket.MSG_PEEK)
_WAITALL = int(_socket.MSG_WAITALL)
_PlainSocket = _socket.socket
"""``socket.socket`` as the standard library defines it (``smcr run`` replaces the
module's name with a class of its own; this stays the original)."""
_INET = (int(_socket.AF_INET), int(_socket.AF_INET6))
# the C type's own attribute getters: socket.socket's properties convert to enums
_c_family = _csocket.socket.family.__get__
_c_type = _csocket.socket.type.__get__
_c_proto = _csocket.socket.proto.__get__
_c_gettimeout = _csocket.socket.gettimeout
_OOB = int(_socket.MSG_OOB)
MAX_BUFFER = 16 << 20
PEER_READ_WAIT = 0.01
"""Seconds a blocking ``sendall`` waits for the peer to read before it copies into the
send buffer (see ``SMCSocket._send``)."""
_GATHER_JOIN = 65536
"""``sendmsg`` joins buffers up to this many bytes in all: one send (and CDC), not one each."""
_SENDFILE_CHUNK = 1 << 18
"""``sendfile`` reads this much at a time (the stdlib's send fallback: 8 KiB, one send each)."""


@dataclass(frozen=True, slots=True)
class SmcInfo:
    """How a socket is connected (``smcss`` columns)."""

    mode: str  # "SMCR", "TCP" or "INIT"
    local_code: int = 0
    peer_code: int = 0
    lgr_id: int = 0
    first_contact: bool = False
    state: str = "INIT"
    rmb_size: int = 0
    peer_rmb_size: int = 0
    version: int = 0  # SMC-R: the version agreed (1 or 2)

    @property
    def reason(self) -> str:
        """``<local>/<remote>`` in hex, as ``smcss`` prints fallback reasons."""
        return f"0x{self.local_code:08x}/0x{self.peer_code:08x}"


_INIT_INFO = SmcInfo("INIT")


def _bufsize(value: int) -> int:
    """SO_SNDBUF/SO_RCVBUF -> buffer size as Linux rounds it (16 KiB << n >= value)."""
    size = 16384
    while size < value and size < MAX_BUFFER:
        size <<= 1
    return uncompress_bufsize(size.bit_length() - 15)


class SMCSocket(_PlainSocket):
    """A stream socket that uses SMC-R when the peer does (module docstring).

    It is a ``socket.socket`` whose own descriptor is the TCP socket; the
    methods that move bytes use the runtime instead in SMC-R mode.  Sockets of
    other families and types (``smcr run`` makes every socket one of these) and
    sockets made from a descriptor that is connected already are plain TCP.
    """

    _debug = False  # smcr run -d
    default_rmb_size = 0
    """RMB size of new sockets (0: the RNIC's default); ``smcr run -r`` sets it."""
    default_sndbuf_size = 0
    """Send buffer size of new sockets (0: the RNIC's default); ``smcr run -t`` sets it."""

    # socket.socket's own private members (not in its type stubs)
    _io_refs: int
    _closed: bool
    if TYPE_CHECKING:
        def _accept(self) -> tuple[int, Any]: ...

    # per-socket state; most of it set only when the socket gets there, so these
    # class-level values are the defaults (a plain TCP socket costs little more than
    # a socket.socket to make)
    _hc: HostConn | None = None
    _stack: Stack | None = None
    _prefix = b""  # fallback: bytes the peer sent behind its last CLC message
    _info: SmcInfo
    _rd_shut = False
    _wr_shut = False
    _sent_late = False  # a send after the peer closed was taken (the next one fails)
    _share: _Share | None = None  # SMC-R mode, held by several sockets (dup, detach)
    _via_readiness = False  # made from the readiness descriptor of an SMC-R socket
    _borrowed_fd = False  # ... that very descriptor, which the connection owns
    _smc_ok = False  # listening: opted in to discovery (its children may use SMC)
    _queue: _AcceptQueue | None = None  # listening: connections of its handshakes
    _connecting: _Connecting | None = None  # a non-blocking connect in progress
    _connect_error = 0  # what getsockopt(SO_ERROR) says next (non-blocking connect)
    _reset_told = False  # SMC-R mode: SO_ERROR or a send reported the connection's reset
    _connect_failed = False  # TCP mode after a failed connect: a new connect may start over
    _oob: int | None = None  # an urgent byte taken out of the stream, unread
    _oob_read = -1  # position of the urgent byte read by recv(MSG_OOB)
    _gone = False  # closed for good (close(), and no makefile() file open)
    _forked = False  # SMC-R mode, inherited by a forked child: the parent's
    _parent_ends: list[_socket.socket] = []  # noqa: RUF012 - SMC-R mode: forked children's pairs
    _fork_ends: forkrelay.ForkEnds | None = None  # during a fork (smcr.forkrelay)
    _relayed: tuple[Any, Any] | None = None  # a forked child's: addresses of the connection
    _finalizer: weakref.finalize[Any, Any] | None = None  # SMC-R mode: _collected
    _shown = -1  # the number fileno() gave out, the socket's for life (_reshow); -1: none yet
    _shown_tcp: weakref.finalize[Any, Any] | None = None  # _shown is a TCP number of ours
    _reshow_due = False  # settled in a background thread: _reshow in the program's (_catch_up)
    _queue_finalizer: weakref.finalize[Any, Any] | None = None  # listening: the queue's
    _rlock: threading.Lock  # SMC-R mode: one reader and one writer at a time
    _wlock: threading.Lock

    def __init__(self, family: int = -1, type: int = -1, proto: int = -1,
                 fileno: int | None = None, *, _accepted: bool = False) -> None:  # fmt: skip
        share = _share_of(fileno) if fileno is not None and not _accepted else None
        if share is not None:  # fromfd()/socket(fileno=) of an SMC-R socket's fileno()
            family, type, proto = share.family, _socket.SOCK_STREAM, 0
        super().__init__(family, type, proto, fileno)
        self._timeout: float | None = _c_gettimeout(self)
        if share is not None:
            self._via_readiness = True
            self._join(share, borrowed=fileno == share.readiness_fd())
            return
        self._mode = "INIT"
        self._info = _INIT_INFO
        # 0: the RNIC's default (smcr.stack.runtime.default_buffer_size), without
        # opening an RNIC: which one is known only once the TCP connection has a
        # local address (smcr.stack.devices); SO_RCVBUF/SO_SNDBUF set them
        self._rmb_size = self.default_rmb_size
        self._sndbuf_size = self.default_sndbuf_size
        if not (_c_family(self) in _INET and _c_type(self) == _socket.SOCK_STREAM
                and _c_proto(self) in (0, _socket.IPPROTO_TCP)):
            self._mode = "PLAIN"  # AF_UNIX, UDP, ...: a socket.socket, nothing more
        elif fileno is not None and not _accepted:
            self._adopt()

    def _adopt(self) -> None:
        """A socket made from a descriptor: connected ones are TCP (whatever they were
        before, SMC cannot start in the middle of a stream), listening ones listen."""
        try:
            _PlainSocket.getpeername(self)
        except OSError:
            if _PlainSocket.getsockopt(self, _socket.SOL_SOCKET, _socket.SO_ACCEPTCONN):
                self._smc_ok = discovery.current().opt_in(self)
                self._mode = "LISTEN"
            return
        self._fall_back(int(DeclineCode.PEERNOSMC), 0, None)

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
            for name, get in (("laddr", _PlainSocket.getsockname),
                              ("raddr", _PlainSocket.getpeername)):  # fmt: skip
                with contextlib.suppress(OSError):
                    if address := get(self):
                        text += f", {name}={address}"
        return f"{text}, mode={self._mode}>"

    def listen(self, backlog: int = 128) -> None:
        """Listen: serves SMC and plain TCP clients."""
        if self._mode == "PLAIN":
            _PlainSocket.listen(self, backlog)
            return
        self._smc_ok = discovery.current().opt_in(self)
        _PlainSocket.listen(self, backlog)
        self._mode = "LISTEN"
        _registry.listening.add(self)  # seen by smcr ss (smcr.diag)
        _diag_start()
        self._accept_queue()  # handshakes run from now on, as the kernel's do

    def settimeout(self, value: float | None) -> None:
        """As ``socket.settimeout``."""
        if value is not None and value < 0:
            raise ValueError("Timeout value out of range")
        self._timeout = value
        if self._mode in ("INIT", "TCP", "PLAIN") or (self._mode == "LISTEN"
                                                      and self._queue is None):
            _PlainSocket.settimeout(self, value)
            return
        readiness = self._readiness()
        if readiness is not None:  # what fileno() gave out: its O_NONBLOCK as the socket's
            readiness.set_blocking(value is None)

    def _readiness(self) -> Readiness | None:
        """The readiness descriptor ``fileno()`` gives out now, if there is one."""
        if self._mode == "LISTEN" and self._queue is not None and self._queue.pid == os.getpid():
            return self._queue.readiness
        if self._mode == "CONNECTING" and self._connecting is not None:
            return self._connecting.readiness
        if self._mode == "SMCR" and self._hc is not None:
            return self._hc.readiness
        return None

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
        """How this socket is connected: mode, decline codes, link group, state."""
        if self._mode == "SMCR" and self._stack is not None and self._hc is not None:
            c = self._stack.engine_conn(self._hc)
            if c is not None:
                return SmcInfo("SMCR", lgr_id=self._info.lgr_id,
                               first_contact=self._info.first_contact, state=c.state.value,
                               rmb_size=c.rmb.size, peer_rmb_size=c.peer_rmb_size,
                               version=self._info.version)  # fmt: skip
            return SmcInfo("SMCR", lgr_id=self._info.lgr_id, state="CLOSED",
                           version=self._info.version)  # fmt: skip
        return self._info

    @property
    def using_smc(self) -> bool:
        """Whether the connection runs over SMC-R (in a forked child: relayed by the
        parent, :mod:`smcr.forkrelay`)."""
        return self._mode == "SMCR" or self._relayed is not None

    def getsockname(self) -> Any:
        """As ``socket.getsockname`` (a forked child's relayed connection: the TCP one's)."""
        if self._relayed is not None:
            return self._relayed[0]
        if self._via_readiness and self._share is not None:
            return _shared_address(self._share.addresses[0])
        return _PlainSocket.getsockname(self)

    def getpeername(self) -> Any:
        """As ``socket.getpeername`` (a forked child's relayed connection: the TCP one's)."""
        if self._relayed is not None:
            return self._relayed[1]
        if self._via_readiness and self._share is not None:
            return _shared_address(self._share.addresses[1])
        return _PlainSocket.getpeername(self)

    def _become_relayed(self, end: _socket.socket) -> None:
        """In a forked child: this SMC-R connection is used through the parent, over
        ``end`` (:mod:`smcr.forkrelay`), which becomes this socket's descriptor."""
        addresses: tuple[Any, Any] = ("", "")
        with contextlib.suppress(OSError):  # (a TCP connection already shut has no peer)
            addresses = (_PlainSocket.getsockname(self), _PlainSocket.getpeername(self))
        os.dup2(end.fileno(), _PlainSocket.fileno(self), inheritable=False)
        if self._shown >= 0 and self._shown != _PlainSocket.fileno(self):
            # the number the program has names the parent's readiness descriptor: the relay
            put_at(self._shown, end.fileno())
            self._shown_tcp = weakref.finalize(self, _close_number, self._shown)
            self._shown_tcp.atexit = False
        end.close()
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        self._relayed = addresses
        self._mode = "TCP"  # a stream like any other from here on
        self._unshadow_fast()
        self._hc = self._stack = None
        _PlainSocket.settimeout(self, self._timeout)

    # ------------------------------------------------------------ options

    def setsockopt(self, level: int, optname: int, value: Any, *args: Any) -> None:
        """SO_SNDBUF/SO_RCVBUF size smcr's buffers (before connect); the rest go to TCP."""
        if self._relayed is not None and level == _socket.IPPROTO_TCP:
            return  # (the TCP connection is the parent's: nothing to set here)
        if level == _socket.SOL_SOCKET and optname == _socket.SO_RCVBUF:
            self._rmb_size = _bufsize(int(value))
        elif level == _socket.SOL_SOCKET and optname == _socket.SO_SNDBUF:
            self._sndbuf_size = _bufsize(int(value))
            if self._mode == "SMCR" and not self._forked and self._hc is not None:
                self._limit_sndbuf()
        _PlainSocket.setsockopt(self, level, optname, value, *args)
        if level == _socket.IPPROTO_TCP and value and self._mode == "SMCR":  # smcr stats
            if optname == _socket.TCP_CORK:
                _C.cork_cnt += 1
            elif optname == _socket.TCP_NODELAY:
                _C.ndly_cnt += 1

    def _limit_sndbuf(self) -> None:
        """``SO_SNDBUF`` after the send buffer was allocated: what a send may have in flight
        from now on (as TCP's buffer shrinks; never beyond what was allocated)."""
        stack, hc = self._smc()
        with stack.lock:
            c = stack.engine_conn(hc)
            if c is not None:
                c.sndbuf_limit = self._sndbuf_size = min(self._sndbuf_size, c.sndbuf_size)
                stack.update_readiness(hc)

    def getsockopt(self, level: int, optname: int, *args: Any) -> Any:
        """SO_SNDBUF/SO_RCVBUF report smcr's buffer sizes; SO_ERROR the outcome of a
        non-blocking connect; the rest come from TCP."""
        if self._relayed is not None and level == _socket.IPPROTO_TCP:
            return 0 if not args else bytes(args[0])
        self._catch_up()
        if level == _socket.SOL_SOCKET and optname == _socket.SO_ERROR and not args:
            connecting = self._connecting
            if self._mode == "CONNECTING" and connecting is not None:
                err = connecting.so_error()
                self._catch_up()
                return err
            if self._connect_error:
                err, self._connect_error = self._connect_error, 0
                return err
            if self._mode == "SMCR" and not (self._forked or self._gone) and self._hc is not None:
                return self._pending_reset()
        if self._mode not in ("TCP", "PLAIN") and level == _socket.SOL_SOCKET and not args:
            if optname == _socket.SO_RCVBUF:
                return self._rmb_size or default_buffer_size()
            if optname == _socket.SO_SNDBUF:
                return self._sndbuf_size or default_buffer_size()
        return _PlainSocket.getsockopt(self, level, optname, *args)

    def _pending_reset(self) -> int:
        """``SO_ERROR`` of a connection in SMC-R mode: ECONNRESET once after it was reset
        (the peer's abort, its listener's close before accepting it, the link's end),
        as TCP reports a reset there once; else 0.  An event loop's non-blocking connect
        asks it when the socket is writable (tornado's does) and fails as over TCP."""
        # the TCP socket's own (an abortive close resets it too): taken, so it is told once
        tcp_err = int(_PlainSocket.getsockopt(self, _socket.SOL_SOCKET, _socket.SO_ERROR))
        if self._reset_told:
            return 0
        if not tcp_err:
            stack, hc = self._smc()
            with stack.lock:
                stack.process()
                c = stack.engine.conns.get(hc.conn_id)
                if c is None or not c.aborted or c.peer_finished:
                    return 0
        self._reset_told = True
        return tcp_err or errno.ECONNRESET

    # ------------------------------------------------------------ connecting

    def connect(self, address: Any) -> None:
        """TCP connect; if the peer offered SMC (:mod:`smcr.discovery`), the CLC
        handshake, falling back to TCP on a Decline; else plain TCP at once.

        Non-blocking: raises ``BlockingIOError`` (``EINPROGRESS``) as
        ``socket.socket`` does; the TCP connect and the handshake finish in the
        background, and the descriptor of :meth:`fileno` turns writable when the
        socket is ready (``getsockopt(SO_ERROR)`` then says how it went).  Until
        then ``send``/``recv`` raise ``BlockingIOError``.
        """
        self._catch_up()  # (before _again() below closes the readiness under the number)
        if self._mode == "CONNECTING":
            connecting = self._connecting
            if connecting is not None:
                try:
                    connecting.connect_again(address)
                finally:
                    self._catch_up()
            if self._mode == "CONNECTING":
                raise BlockingIOError(errno.EALREADY, os.strerror(errno.EALREADY))
            # settled meanwhile by the watcher thread: answer as the settled socket does
            # (EALREADY here would send the program to SO_ERROR, which takes the kernel's
            # error, and its next connect would meet ECONNABORTED instead of a new attempt)
        if self._mode == "TCP" and self._connect_failed:
            # as the kernel's socket after a failed connect: the next connect reports that
            # failure (here: if nobody read it from SO_ERROR), the one after starts anew
            err, self._connect_error = self._connect_error, 0
            if not err:  # the kernel's, when nobody read it (SO_ERROR)
                err = int(_PlainSocket.getsockopt(self, _socket.SOL_SOCKET, _socket.SO_ERROR))
            if err:
                _PlainSocket.connect_ex(self, address)  # (the kernel's: it forgets the attempt)
                raise OSError(err, os.strerror(err))
            self._again()
        if self._mode != "INIT":
            _PlainSocket.connect(self, address)  # the kernel's EISCONN (or a new connect)
            return
        smc_ok = discovery.current().opt_in(self)
        if not smc_ok:
            self._fall_back(int(DeclineCode.PEERNOSMC), 0)
            try:
                _PlainSocket.connect(self, address)
            except OSError as exc:
                self._connect_failed = not isinstance(exc, (BlockingIOError, InterruptedError))
                raise
            return
        if self._timeout == 0.0:
            err = _PlainSocket.connect_ex(self, address)
            if err not in (0, errno.EINPROGRESS):
                raise OSError(err, os.strerror(err))
            self._stack_here()
            self._connecting = _Connecting(self)
            self._mode = "CONNECTING"
            self._reshow()
            self._connecting.start()
            raise BlockingIOError(errno.EINPROGRESS, os.strerror(errno.EINPROGRESS))
        _PlainSocket.connect(self, address)
        if discovery.current().peer_offered(self, client=True):
            self._handshake(client=True)
        else:
            self._fall_back(int(DeclineCode.PEERNOSMC), 0)

    def _again(self) -> None:
        """Back to a socket that never connected, after a failed connect."""
        if self._connecting is not None:
            self._connecting.close()
            self._connecting = None
        self._mode = "INIT"
        self._info = _INIT_INFO
        self._connect_error = 0
        self._connect_failed = False
        _PlainSocket.settimeout(self, self._timeout)

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

        Handshakes run in the background, each on its own (:class:`_AcceptQueue`):
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
        return queue.take(self._timeout)

    def _accept_queue(self) -> _AcceptQueue | None:
        """The accept queue of a listener that may see SMC clients, from ``listen`` on (a
        forked child starts its own on first use; see :meth:`_AcceptQueue.pause`)."""
        if self._mode != "LISTEN":
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        if not self._smc_ok:
            return None
        queue = self._queue
        if queue is None or queue.pid != os.getpid():
            if queue is not None:  # the parent's (forked): its number becomes ours
                queue.readiness.disown()
            queue = self._queue = _AcceptQueue(self)
            queue.readiness.set_blocking(self._timeout is None)
            self._reshow()
            # dropped unclosed: the queue goes too; not at interpreter exit, where a
            # socket.socket's listener stays open under a daemon thread in accept (closing
            # it woke that thread with EBADF: a traceback at every such program's exit)
            self._queue_finalizer = weakref.finalize(self, queue.close)
            self._queue_finalizer.atexit = False
            _accept_queues.add(queue)
        else:
            queue.resume()
        return queue

    def _stack_here(self) -> None:
        """Find the runtime of this socket's local address in the calling thread: the
        handshake may start in the watcher thread, and a thread can be in another
        network namespace than the process (``setns`` is per thread), where this
        address has no RNIC."""
        with contextlib.suppress(OSError, ValueError):
            local_ip = self._local_ip()
            if not local_ip.is_unspecified:
                self._stack = get_stack(local_ip, self._scope_id())

    def _local_ip(self) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
        return _parse_ip(_PlainSocket.getsockname(self)[0])

    def _scope_id(self) -> int:
        """The interface index of a link-local IPv6 local address (0 otherwise)."""
        name = _PlainSocket.getsockname(self)
        return int(name[3]) if len(name) == 4 else 0

    def _handshake(self, client: bool) -> None:
        """The CLC handshake, waited for in this thread (blocking ``connect``).

        :raises ConnectionResetError: when it failed with no way back to TCP (the
            peer broke the CLC protocol): the TCP connection is reset.
        """
        stack, hc = self._start_handshake(client, None, polled=True)
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        with stack.lock:
            if not stack.wait(hc, lambda: hc.outcome is not None, deadline, spin=0.0):
                # the socket's timeout bounds connect() as a whole, as on TCP: the
                # handshake is given up (its TCP shut, so that it ends at once)
                hc.on_outcome = functools.partial(_abandon, stack)
                with contextlib.suppress(OSError):
                    hc.tcp.shutdown(_socket.SHUT_RDWR)
                self._hc = None
                raise TimeoutError("timed out")
        self._finish_handshake(stack, hc)
        self._reshow()  # (SMC-R: a number given out before connect names its readiness)
        if self._mode == "INIT":
            raise ConnectionResetError(errno.ECONNRESET, "SMC handshake failed: "
                                       f"{getattr(hc.outcome, 'reason', '')}")  # fmt: skip

    def _start_handshake(self, client: bool, on_outcome: Callable[[HostConn], None] | None,
                         polled: bool = False) -> tuple[Stack, HostConn]:  # fmt: skip
        """Start the CLC handshake; the runtime drives it (``on_outcome`` is called
        with its lock held when it ends, in whichever thread polled).

        :param polled: this thread waits for the outcome at once (:meth:`Stack.wait`),
            polling for it itself (:meth:`Stack.start_handshake`)."""
        _diag_start()  # this process answers smcr ss/stats from now on (smcr.diag)
        # the RNIC of this address (and, link-local, of this interface); found already
        # where the background work may run in another thread (see :meth:`_stack_here`)
        name = _PlainSocket.getsockname(self)  # (once: _local_ip and _scope_id in one)
        local_ip = _parse_ip(name[0])
        stack = self._stack = self._stack or get_stack(local_ip,
                                                       int(name[3]) if len(name) == 4 else 0)
        with stack.lock:
            # the runtime's own descriptor of the TCP socket: it outlives ours when the
            # application closes first (the closing CDCs, then the FIN)
            # (family, type and protocol given: none of the three system calls that
            # socket.socket makes to learn them from a bare descriptor)
            tcp = _PlainSocket(_c_family(self), _socket.SOCK_STREAM, _socket.IPPROTO_TCP,
                               os.dup(_PlainSocket.fileno(self)))  # fmt: skip
            hc = self._hc = stack.new_conn(tcp)
            hc.on_outcome = on_outcome
            stack.start_handshake(hc, client, local_ip, self._rmb_size,
                                  self._sndbuf_size, polled)  # fmt: skip
            if hc.outcome is not None and hc.on_outcome is not None:
                hc.on_outcome(hc)  # ended at once, and nobody took the news yet
        return stack, hc

    def _finish_handshake(self, stack: Stack, hc: HostConn) -> None:
        """Take the handshake's outcome: SMC-R, TCP fallback, or (mode stays INIT) a
        failure, after which the TCP connection is reset and closed."""
        outcome = hc.outcome
        hc.on_outcome = None
        server = not getattr(hc.handshake, "client", True)
        if isinstance(outcome, HandshakeCompleted):
            self._rmb_size, self._sndbuf_size = len(hc.rmb), len(hc.sndbuf)  # as allocated
            _C.smc_established(server, outcome.version, self._rmb_size,
                               self._sndbuf_size)  # fmt: skip
            self._info = SmcInfo("SMCR", lgr_id=outcome.lgr_id,
                                 first_contact=outcome.first_contact,
                                 version=outcome.version)  # fmt: skip
            # collected unclosed: close as close() would (the runtime holds the TCP
            # socket and the buffers; nothing else would ever let them go)
            self._finalizer = weakref.finalize(self, _collected, stack, hc, hc.tcp)
            self._finalizer.atexit = False  # at exit the runtime itself goes (module doc)
            self._rlock, self._wlock = threading.Lock(), threading.Lock()
            self._mode = "SMCR"
            self._shadow_fast(stack, hc)
            _smc_sockets.add(self)
            if self._debug:
                self._report()
            return
        trailing = hc.handshake.reader.trailing_data if hc.handshake is not None else b""
        self._hc = None
        hc.tcp.close()  # the runtime's descriptor: ours goes on (TCP) or is reset
        with contextlib.suppress(OSError):  # (closed meanwhile: nothing to restore)
            _PlainSocket.settimeout(self, self._timeout)  # the runtime made it non-blocking
        if isinstance(outcome, FellBack):
            self._prefix = trailing
            self._fall_back(outcome.local_code, outcome.peer_code, server)
            return
        _C.handshake_failed(server)
        with contextlib.suppress(OSError):  # a reset, as Linux ends a broken handshake
            _PlainSocket.setsockopt(self, _socket.SOL_SOCKET, _socket.SO_LINGER,
                                    struct.pack("ii", 1, 0))  # fmt: skip
        _PlainSocket.close(self)

    def _shadow_fast(self, stack: Stack, hc: HostConn) -> None:
        """Put the compiled common cases of the data calls (:mod:`smcr.stack.sockfast`)
        in this socket's dictionary, each where the class's method is ours (a subclass's
        own ``sendall``, ssl's for one, stays what is called)."""
        cls = type(self)
        fast = SocketFast(self, stack, hc, self._wlock, self._rlock, SMCSocket.sendall,
                          SMCSocket.send, SMCSocket.recv, SMCSocket.recv_into)  # fmt: skip
        for name in FAST_METHODS:
            if getattr(cls, name) is getattr(SMCSocket, name):
                setattr(self, name, getattr(fast, name))

    def _unshadow_fast(self) -> None:
        """The class's methods again (closed, or no longer SMC-R here): nothing of the
        connection stays referenced by a socket object that outlives it."""
        for name in FAST_METHODS:
            self.__dict__.pop(name, None)

    def _fall_back(self, local: int, peer: int, server: bool | None = False) -> None:
        """:param server: the role counted in ``smcr stats`` (None: not counted, a socket
            made from a connected descriptor)."""
        self._mode = "TCP"
        self._info = SmcInfo("TCP", local_code=local, peer_code=peer, state="ACTIVE")
        if server is not None:
            _C.fell_back(server, local, peer)
        _registry.fallbacks.add(self)  # seen by smcr ss (smcr.diag)
        _diag_start()
        if self._debug:
            self._report()

    def _report(self) -> None:
        """``smcr run -d``: one line per connection on standard error."""
        try:
            ends = f"{_PlainSocket.getsockname(self)} -> {_PlainSocket.getpeername(self)}"
        except OSError:
            ends = "(not connected)"
        how = (f"SMCR link group {self._info.lgr_id}" if self._mode == "SMCR"
               else f"TCP, reason {self._info.reason} ({describe(self._info.local_code)})")
        print(f"smcr run [{os.getpid()}]: {ends}: {how}", file=sys.stderr, flush=True)

    # ------------------------------------------------------------ SMC data path

    def _deadline(self, flags: int) -> float | None:
        if flags & _DONTWAIT or self._timeout == 0.0:
            return 0.0
        return None if self._timeout is None else time.monotonic() + self._timeout

    def _smc(self) -> tuple[Stack, HostConn]:
        if self._gone:
            raise OSError(errno.EBADF, "Bad file descriptor")
        if self._forked:
            raise OSError(errno.EOPNOTSUPP, "this SMC-R connection belongs to the process "
                          "that forked this one: it cannot be used here")  # fmt: skip
        assert self._stack is not None and self._hc is not None
        return self._stack, self._hc

    def _wait(self, stack: Stack, hc: HostConn, ready: Callable[[], bool], deadline: float
              | None) -> None:
        if deadline == 0.0:
            stack.process()
            if not ready():
                if hc.readiness is not None and hc.readiness.lost():
                    raise OSError(errno.EBADF, "Bad file descriptor")
                raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
            return
        if not stack.wait(hc, ready, deadline):
            raise TimeoutError("timed out")

    def send(self, data: Any, flags: int = 0) -> int:
        """Send (``smc_tx_sendmsg``): straight into the peer's RMBE when nothing waits
        and the RNIC takes inline WRITEs (one copy, as TCP makes one into the kernel),
        else by copying into the send buffer, which the engine RDMA-WRITEs from."""
        if self._mode != "SMCR":
            self._tcp_ok()
            return _PlainSocket.send(self, data, flags)
        view = memoryview(data)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        return self._send(view, int(flags)) if view else 0

    def _send(self, view: memoryview, flags: int, wait_peer: bool = False) -> int:
        """:meth:`send` of a non-empty byte view (SMC-R mode): the data path.

        :param wait_peer: (``sendall`` on a blocking socket) when the peer's RMBE is
            full and nothing waits in the send buffer, wait up to
            :data:`PEER_READ_WAIT` for the peer to read and then write inline,
            rather than copy into the send buffer and out of it again later: the
            caller blocks until all is taken anyway, and the copy saved is a third
            of the bytes' copying.  A peer that does not read by then gets the
            send buffer as before (two ends that both send before they read must
            not lose it).
        """
        _C.tx_pd[len(view).bit_length()] += 1  # smcr stats: one add (smcr.diag.counters)
        if flags & _OOB:
            _C.urg_data_cnt += 1
        stack, hc = self._smc()
        try:
            with self._wlock, stack.lock:
                c = stack.engine.conns.get(hc.conn_id)
                if c is None or c.reset_reason:
                    raise ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")
                if c.tx_flags or c.peer_closed or self._wr_shut:
                    if c.peer_closed and not (c.tx_flags or self._wr_shut or self._sent_late
                                              or c.aborted):  # fmt: skip
                        # as TCP takes the first send after the peer's close (the peer's
                        # kernel answers it with a reset): the bytes go nowhere
                        self._sent_late = True
                        return len(view)
                    if c.aborted and not c.tx_flags and not self._reset_told:
                        # the peer's abort is told once, as ECONNRESET, as after a TCP reset
                        # (and Linux: sk_stream_error turns its EPIPE into the pending error)
                        self._reset_told = True
                        raise ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")
                    raise BrokenPipeError(errno.EPIPE, "Broken pipe")
                if not flags & _OOB and (n := stack.send_fast(hc, c, view)) >= 0:
                    return n  # corked, or written inline (the common cases, compiled)
                inline = stack.max_inline and not flags & _OOB  # max_inline >= any buffer size
                room = c.direct_room() if inline else 0
                if not room:
                    # the peer's RMBE is full or bytes wait: take the consumer cursor updates
                    # that came meanwhile now (they flush the send buffer and reopen the inline
                    # path), not when the progress thread next looks
                    stack.process()
                    room = c.direct_room() if inline else 0
                    if not room and wait_peer and inline and c.tx_app == c.tx_sent:
                        self._wait_peer(stack, hc, c)
                        room = c.direct_room()
                if not room and c.sndbuf_space() <= 0:
                    self._wait_room(stack, hc, c, flags)
                    room = c.direct_room() if inline else 0
                n = 0
                if room:
                    size = len(view)
                    request = c.unanswered and not c.echo_pending and c.echo_wanted(size)
                    if size <= room:
                        stack.send_inline(c, view, request)
                        if stack.local_peer(hc, c):
                            stack.process()
                        if hc.readiness is not None:
                            stack.update_readiness(hc)
                        return size
                    stack.send_inline(c, view[:room], request)
                    n, view = room, view[room:]
                    if c.sndbuf_space() <= 0:
                        if hc.readiness is not None:
                            stack.update_readiness(hc)
                        return n
                return n + self._copy_in(stack, hc, c, view, flags)
        except (ConnectionResetError, BrokenPipeError):
            _left_blocked_at_exit(stack)
            raise

    def _wait_room(self, stack: Stack, hc: HostConn, c: Any, flags: int) -> None:
        _C.tx_buf_full_cnt += 1  # our send buffer is full (Linux rmb_tx.buf_full_cnt)
        def room() -> bool:
            return c.sndbuf_space() > 0 or bool(c.reset_reason) or c.peer_closed

        self._wait(stack, hc, room, self._deadline(flags))
        if c.reset_reason or c.peer_closed:
            raise ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")

    def _wait_peer(self, stack: Stack, hc: HostConn, c: Any) -> None:
        """Wait (at most :data:`PEER_READ_WAIT`) for room in the peer's RMBE."""
        def room() -> bool:
            return c.direct_room() > 0 or bool(c.reset_reason) or c.peer_closed

        stack.wait(hc, room, time.monotonic() + PEER_READ_WAIT)
        if c.reset_reason or c.peer_closed:
            raise ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")

    def _copy_in(self, stack: Stack, hc: HostConn, c: Any, view: memoryview, flags: int) -> int:
        """Copy what fits into the send buffer and let the engine RDMA-WRITE it."""
        n: int = min(len(view), c.sndbuf_space())
        ring_write(hc.sndbuf, c.tx_app, view[:n])
        stack.execute(stack.engine.data_written(hc.conn_id, n, 0.0, bool(flags & _OOB)))
        if stack.local_peer(hc, c):
            stack.process()
        if hc.readiness is not None:
            stack.update_readiness(hc)
        return n

    def sendall(self, data: Any, flags: int = 0) -> None:
        """Send everything (blocking, or raising where ``socket.sendall`` would)."""
        if self._mode != "SMCR":
            self._tcp_ok()
            _PlainSocket.sendall(self, data, flags)
            return
        view = memoryview(data)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        flags, send = int(flags), self._send
        wait_peer = self._timeout != 0.0 and not flags & (_DONTWAIT | _OOB)
        while view:
            n = send(view, flags, wait_peer)
            if n == len(view):
                return
            view = view[n:]

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        """As ``socket.recv``."""
        if self._mode != "SMCR":
            return self._tcp_recv(bufsize, flags)
        buf = bytearray(bufsize)
        n = self.recv_into(buf, bufsize, flags)
        del buf[n:]
        return bytes(buf)

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        """Copy from our RMBE (``smc_rx_recvmsg``): MSG_PEEK, MSG_WAITALL, MSG_DONTWAIT,
        MSG_OOB as Linux handles them."""
        if self._mode != "SMCR":
            return self._tcp_recv_into(buffer, nbytes, flags)
        flags = int(flags)  # socket.MSG_* are enums: one conversion, not one per test
        out = memoryview(buffer)
        if out.format != "B" or out.ndim != 1:
            out = out.cast("B")
        if nbytes < 0:
            raise ValueError("negative buffersize in recv_into")
        if nbytes > len(out):
            raise ValueError("buffer too small for requested bytes")
        want = nbytes or len(out)
        _C.rx_pd[want.bit_length()] += 1  # smcr stats: one add (smcr.diag.counters)
        if flags & _OOB:
            return self._recv_oob(out)
        stack, hc = self._smc()
        got = 0
        try:
            with self._rlock, stack.lock:
                c = stack.engine.conns.get(hc.conn_id)
                if c is None:
                    return 0
                part = out[:want] if want < len(out) else out
                if not flags & ~_WAITALL and (n := stack.recv_fast(hc, c, part, bool(flags))) >= 0:
                    return n  # the bytes were there (the common case, compiled)
                while got < want:
                    if c.rx_prod == c.rx_cons:
                        # after SHUT_RD what had arrived is still read, as Linux does
                        if c.peer_finished or self._rd_shut:
                            return got
                        if c.aborted:
                            if got:
                                return got
                            why = c.reset_reason or "peer aborted the connection"
                            raise ConnectionResetError(errno.ECONNRESET,
                                                       f"Connection reset by peer ({why})")
                        if c.peer_done or (got and not flags & _WAITALL):
                            return got
                        wcs = stack.cq.poll(64)  # news already there: no waiting machinery
                        if wcs:
                            stack.process(wcs)
                        else:
                            self._wait_data(stack, hc, c, flags)
                        continue
                    if not got and not flags & ~_WAITALL and (
                            n := stack.recv_fast(hc, c, part, bool(flags))) >= 0:
                        return n  # the bytes came while we waited: the compiled copy too
                    n = self._copy_out(stack, hc, c, out[got:want] if got or want < len(out)
                                       else out, flags)  # fmt: skip
                    if n == 0:
                        continue  # the urgent byte was taken out of the stream
                    got += n
                    if flags & _PEEK or not flags & _WAITALL:
                        break
                if stack.local_peer(hc, c):  # (a consumer cursor update, when one went)
                    stack.process()
                if hc.readiness is not None:
                    stack.update_readiness(hc)
        except ConnectionResetError:
            _left_blocked_at_exit(stack)
            raise
        return got

    def _wait_data(self, stack: Stack, hc: HostConn, c: Any, flags: int) -> None:
        def readable() -> bool:
            return c.rx_prod > c.rx_cons or c.peer_done or bool(c.reset_reason)

        self._wait(stack, hc, readable, self._deadline(flags))

    def _copy_out(self, stack: Stack, hc: HostConn, c: Any, out: memoryview, flags: int) -> int:
        """Copy up to ``len(out)`` bytes from the RMBE (stops at an urgent byte)."""
        cons = c.rx_cons
        avail = c.rx_prod - cons
        urg = c.urg_rx_pos
        if urg is not None and urg >= cons:
            if urg == cons:  # the urgent byte itself: out of band, skip it
                if self._oob_read != urg:
                    self._oob = hc.rmb[urg % c.rmb.size]
                c.urg_rx_pos = None
                stack.execute(stack.engine.data_consumed(hc.conn_id, 1, time.monotonic(), True))
                return 0
            avail = min(avail, urg - cons)
        n = min(avail, len(out))
        rmb = hc.rmb_mr.buf  # type: ignore[union-attr]
        size = len(rmb)
        if avail >= size:  # our RMB was full (Linux rmb_rx.buf_full_cnt)
            _C.rx_buf_full_cnt += 1
        ring_read(rmb, cons, out[:n])
        if not flags & _PEEK:
            actions: list[Any] = []
            c.consumed(n, actions)  # the engine's connection: no look-up per read
            if actions:
                stack.execute(actions)
        return int(n)

    def _recv_oob(self, out: memoryview) -> int:
        stack, hc = self._smc()
        with stack.lock:
            c = stack.engine_conn(hc)
            if (self._oob is None and c is not None and c.urg_rx_pos is not None
                    and c.urg_rx_pos != self._oob_read):  # fmt: skip
                self._oob_read = pos = c.urg_rx_pos
                self._oob = hc.rmb[pos % c.rmb.size]
            if self._oob is None:
                raise OSError(errno.EINVAL, "Invalid argument")
            out[0] = self._oob
            self._oob = None
            return 1

    # ------------------------------------------------------------ sendmsg, recvmsg, sendfile

    def sendmsg(self, buffers: Any, *args: Any) -> int:
        """``sendmsg(buffers[, ancdata[, flags[, address]]])``: the buffers' bytes in order.

        Over SMC-R a blocking socket sends everything (or, with a timeout, what went
        before it expired), a non-blocking one what fits, as the kernel's ``sendmsg``
        does.  Control messages cannot travel over SMC-R: any ``ancdata`` raises
        ``EINVAL``, TCP's error for a control message it cannot take (Linux SMC
        ignores them).  ``address`` is ignored, as by a connected TCP socket.
        """
        if self._mode != "SMCR":
            self._tcp_ok()
            return _PlainSocket.sendmsg(self, buffers, *args)
        if len(args) > 3:
            raise TypeError(f"sendmsg() takes at most 4 arguments ({len(args) + 1} given)")
        ancdata = list(args[0]) if args else []
        flags = args[1] if len(args) > 1 else 0
        if not isinstance(flags, int):
            raise TypeError(f"'{type(flags).__name__}' object cannot be interpreted as an integer")
        if len(args) > 2 and args[2] is not None and not isinstance(args[2], tuple):
            raise TypeError(f"{'AF_INET' if self.family == _socket.AF_INET else 'AF_INET6'} "
                            f"address must be tuple, not {type(args[2]).__name__}")  # fmt: skip
        views = [_byte_view(b) for b in buffers]
        for item in ancdata:  # checked as the C code checks them, then refused
            if not isinstance(item, tuple) or len(item) != 3:
                raise TypeError("[sendmsg() ancillary data items]() argument must be sequence "
                                "of length 3")  # fmt: skip
            level, kind, data = item
            if not isinstance(level, int) or not isinstance(kind, int):
                raise TypeError("an integer is required")
            _byte_view(data)
        if ancdata:
            raise OSError(errno.EINVAL, "control messages are not supported over SMC-R")
        size = sum(len(v) for v in views)
        if len(views) > 1 and size <= _GATHER_JOIN:
            views = [memoryview(b"".join(views))]  # one CDC for many small buffers
        total = 0
        for buffer in views:
            view = buffer
            while view:
                try:
                    n = self._send(view, flags)
                except (BlockingIOError, TimeoutError):
                    if total:
                        return total
                    raise
                total += n
                view = view[n:]
        return total

    def recvmsg(self, bufsize: int, ancbufsize: int = 0, flags: int = 0) -> tuple[
            bytes, list[tuple[int, int, bytes]], int, Any]:  # fmt: skip
        """As ``socket.recvmsg``: ``(data, [], msg_flags, None)`` (no control messages over
        SMC-R; no address on a connected stream); flags as :meth:`recv_into` takes them."""
        if self._mode != "SMCR" and not self._prefix:
            self._tcp_ok()
            return _PlainSocket.recvmsg(self, bufsize, ancbufsize, flags)
        if bufsize < 0:
            raise ValueError("negative buffer size in recvmsg()")
        if ancbufsize < 0:
            raise ValueError("invalid ancillary data buffer length")
        data = self.recv(bufsize, flags)
        return data, [], int(flags) & _OOB if data else 0, None

    def recvmsg_into(self, buffers: Any, ancbufsize: int = 0, flags: int = 0) -> tuple[
            int, list[tuple[int, int, bytes]], int, Any]:  # fmt: skip
        """As ``socket.recvmsg_into``: fills ``buffers`` in order; ``(nbytes, [], msg_flags,
        None)``.  One buffer is read into directly; several are filled one after
        another as far as bytes are there (the first waits as :meth:`recv_into`
        does, MSG_WAITALL waits for all), or from one copy for MSG_PEEK/MSG_OOB."""
        if self._mode != "SMCR" and not self._prefix:
            self._tcp_ok()
            return _PlainSocket.recvmsg_into(self, buffers, ancbufsize, flags)
        if ancbufsize < 0:
            raise ValueError("invalid ancillary data buffer length")
        flags = int(flags)
        views = [v for v in (_byte_view(b) for b in buffers) if v]
        got = 0
        if len(views) == 1:
            got = self.recv_into(views[0], 0, flags)
        elif views and flags & (_PEEK | _OOB):
            tmp = bytearray(sum(len(v) for v in views))
            n = self.recv_into(tmp, 0, flags)
            for view in views:
                part = min(n - got, len(view))
                view[:part] = tmp[got : got + part]
                got += part
        else:
            for view in views:
                try:
                    n = self.recv_into(view, 0, flags if not got or flags & _WAITALL
                                       else flags | _DONTWAIT)  # fmt: skip
                except OSError:
                    if got:  # what came is returned; the error shows on the next call
                        break
                    raise
                got += n
                if n < len(view):
                    break
        return got, [], flags & _OOB if got else 0, None

    def sendfile(self, file: Any, offset: int = 0, count: int | None = None) -> int:
        """As ``socket.sendfile``: ``count`` bytes (default: to EOF) of ``file`` from
        ``offset``; returns the bytes sent and leaves the file position behind them.

        ``fileno()`` of an SMC-R socket is a readiness descriptor, so
        ``os.sendfile`` cannot be used: the file is read in chunks into one
        buffer and sent from it (the stdlib's ``_sendfile_use_send``, with its
        checks).  Like ``os.sendfile`` it starts at ``offset`` even when that is 0
        and the file position is elsewhere (where the file can seek); a file that
        cannot seek (a pipe) is read from where it is, and not sought afterwards
        (the stdlib fails there).  TCP mode uses ``socket.sendfile``
        (``os.sendfile``, zero copy).
        """
        if self._mode != "SMCR":
            self._tcp_ok()
            return _PlainSocket.sendfile(self, file, offset, count)
        _C.sendfile_cnt += 1
        if "b" not in getattr(file, "mode", "b"):
            raise ValueError("file should be opened in binary mode")
        if count is not None:
            if not isinstance(count, int):
                raise TypeError(f"count must be a positive integer (got {count!r})")
            if count <= 0:
                raise ValueError(f"count must be a positive integer (got {count!r})")
        if self._timeout == 0.0:
            raise ValueError("non-blocking sockets are not supported")
        self._smc()  # EBADF when closed
        seekable = getattr(file, "seekable", None)
        seekable = seekable is not None and seekable()
        if offset or seekable:
            file.seek(offset)
        buf = bytearray(min(count, _SENDFILE_CHUNK) if count else _SENDFILE_CHUNK)
        chunk = memoryview(buf)
        readinto = getattr(file, "readinto", None)
        total = 0
        try:
            while count is None or total < count:
                want = len(buf) if count is None else min(len(buf), count - total)
                if readinto is not None:
                    n = readinto(chunk[:want])
                else:
                    data = file.read(want)
                    n = len(data)
                    chunk[:n] = data
                if not n:
                    break
                view = chunk[:n]
                while view:
                    sent = self._send(view, 0)
                    total += sent
                    view = view[sent:]
            return total
        finally:
            if total > 0 and seekable:
                file.seek(offset + total)

    def _sendfile_use_sendfile(self, file: Any, offset: int = 0,
                               count: int | None = None) -> int:  # fmt: skip
        """The stdlib's ``os.sendfile`` path of ``sendfile`` (some code calls it by name):
        in SMC-R mode, ours (:meth:`sendfile`), as ``os.sendfile`` into our
        ``fileno()`` would write into the readiness descriptor."""
        if self._mode != "SMCR":
            return _PlainSocket._sendfile_use_sendfile(self, file, offset, count)  # type: ignore[attr-defined,no-any-return]
        self._check_sendfile_params(file, offset, count)  # type: ignore[attr-defined]
        try:  # what os.sendfile refuses, this refuses too (the caller falls back)
            size = os.fstat(file.fileno()).st_size
        except (AttributeError, io.UnsupportedOperation, OSError) as err:
            raise _socket._GiveupOnSendfile(err) from err  # type: ignore[attr-defined]
        return self.sendfile(file, offset, count) if size else 0

    # ------------------------------------------------------------ TCP mode

    def _tcp_ok(self) -> None:
        """Before a call goes to the kernel's TCP socket: not while connecting."""
        if self._mode == "CONNECTING":  # not a byte before SMC-R or TCP is settled
            raise BlockingIOError(errno.EAGAIN, os.strerror(errno.EAGAIN))
        self._catch_up()

    def _tcp_recv(self, bufsize: int, flags: int) -> bytes:
        if self._prefix and not flags & _OOB:
            data = self._prefix[:bufsize]
            if not flags & _PEEK:
                self._prefix = self._prefix[len(data):]
            return data
        self._tcp_ok()
        return _PlainSocket.recv(self, bufsize, flags)

    def _tcp_recv_into(self, buffer: Any, nbytes: int, flags: int) -> int:
        out = memoryview(buffer).cast("B")
        want = nbytes or len(out)
        if self._prefix and not flags & _OOB:
            data = self._tcp_recv(want, flags)
            out[: len(data)] = data
            return len(data)
        self._tcp_ok()
        return _PlainSocket.recv_into(self, out, want, flags)

    # ------------------------------------------------------------ readiness, files

    def fileno(self) -> int:
        """A descriptor for select/poll/selectors that follows recv/send readiness.

        One number for the socket's whole life, as a TCP socket's: what it names
        changes with the mode (the TCP socket; the accept queue's or the
        connection's readiness descriptor), moved under the number by
        :meth:`_reshow`, so that a selector or event loop that registered it
        before ``connect`` or ``listen`` keeps watching the right file."""
        if self._gone:
            return -1
        if self._mode == "LISTEN":
            self._accept_queue()  # (a forked parent's queue resumes: _AcceptQueue.pause)
        if self._shown >= 0:
            self._catch_up()
            return self._shown
        if self._mode == "PLAIN" or self._via_readiness:
            return _PlainSocket.fileno(self)
        readiness = self._app_readiness()
        self._shown = _PlainSocket.fileno(self) if readiness is None else readiness.fileno()
        self._queue_shown(readiness)
        return self._shown

    def _queue_shown(self, readiness: Readiness | None) -> None:
        """``readiness`` was given a number of the program's: the accept queue's is brought
        up to date then (:meth:`_AcceptQueue.show`)."""
        queue = self._queue
        if readiness is not None and queue is not None and readiness is queue.readiness:
            queue.show()

    def _app_readiness(self) -> Readiness | None:
        """The readiness descriptor the application's number names now (SMC-R mode: made
        on first use), or None where it names the TCP socket."""
        if self._mode != "SMCR" or self._hc is None:
            return self._readiness()
        stack, hc = self._smc()
        with stack.lock:
            if hc.readiness is None:
                hc.readiness = Readiness()
                hc.readiness.set_blocking(self._timeout is None)
                stack.update_readiness(hc)
            return hc.readiness

    def _catch_up(self) -> None:
        """The program's thread calls in: do the :meth:`_reshow` a background thread left
        due (a non-blocking connect settled to TCP in the watcher or runtime thread).

        Why not there: :func:`put_at` moves the program's epoll registrations of the
        number (read, unregister, ``dup2``, register), and a program's ``epoll_ctl`` of
        that number in between (tornado's and the tests' ``modify`` right after
        ``connect``) was lost (the events read before it came back) or failed with
        ``ENOENT``.  Meanwhile the number names the connect's readiness descriptor,
        which is ready (:meth:`_Connecting._settle`), so the program wakes and calls
        in: ``getsockopt(SO_ERROR)``, ``send``/``recv``, ``fileno``."""
        if self._reshow_due:
            self._reshow_due = False
            with contextlib.suppress(OSError):  # (closed meanwhile)
                self._reshow()

    def _reshow(self) -> None:
        """The mode changed: put under the number :meth:`fileno` gave out (if it gave
        one) the file that follows the socket now (:func:`put_at`; epoll
        registrations move along).  A readiness descriptor takes the number and our
        TCP socket moves to a number of its own; back in TCP mode the TCP socket
        takes the number again (our socket object keeps its own, a duplicate)."""
        number = self._shown
        if number < 0 or self._gone:
            return
        readiness = self._app_readiness()
        if readiness is None:
            if self._shown_tcp is None and _PlainSocket.fileno(self) != number:
                for old in (self._queue.readiness if self._queue else None,
                            self._connecting.readiness if self._connecting else None,
                            self._hc.readiness if self._hc else None):  # fmt: skip
                    if old is not None and old.app == number:
                        old.disown()  # (the number is the TCP socket's now)
                put_at(number, _PlainSocket.fileno(self))
                self._shown_tcp = weakref.finalize(self, _close_number, number)
                self._shown_tcp.atexit = False
            return
        if readiness.app == number:
            return
        if _PlainSocket.fileno(self) == number:  # the TCP socket moves off the number
            _rebind(self, os.dup(number))
        if self._shown_tcp is not None:
            self._shown_tcp.detach()
            self._shown_tcp = None
        readiness.place(number)
        self._queue_shown(readiness)

    def _real_close(self) -> None:
        """socket.socket's, and the TCP socket's duplicate under the application's number
        (after a fallback: :meth:`_reshow`)."""
        if self._shown_tcp is not None:
            self._shown_tcp()  # (closes it, once)
            self._shown_tcp = None
        _PlainSocket._real_close(self)  # type: ignore[attr-defined]

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
            _PlainSocket.shutdown(self, how)  # OverflowError, TypeError or EINVAL, as TCP's
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        if self._mode != "SMCR":
            self._tcp_ok()
            _PlainSocket.shutdown(self, how)
            return
        stack, hc = self._smc()
        if how in (_socket.SHUT_RD, _socket.SHUT_RDWR):
            self._rd_shut = True
        if how in (_socket.SHUT_WR, _socket.SHUT_RDWR):
            self._wr_shut = True
            with stack.lock:  # the done-writing CDC follows the send buffer (Stack doc)
                stack.shutdown_write(hc)

    @staticmethod
    def _drain_tx(stack: Stack, hc: HostConn, deadline: float) -> None:
        """Wait (lock held) until ``deadline`` for the send buffer to go out."""
        c = stack.engine_conn(hc)
        if c is not None:
            stack.uncork(hc)  # (nothing follows: corked bytes go now)
            stack.wait(hc, lambda: c.tx_pending() == 0 or bool(c.reset_reason)
                       or c.peer_closed, deadline)  # fmt: skip

    def close(self) -> None:
        """Close: drain the send buffer, closing CDC; TCP goes when CLOSED.

        Without ``SO_LINGER``, bytes still in the send buffer (the peer's RMBE is
        full) go in the background and ``close`` returns at once, as TCP's does
        (:meth:`Stack.close_later`: the peer gets ``close_wait_tx``, 2 s, Linux's
        ``SMC_MAX_STREAM_WAIT_TIMEOUT``, to read something, again after each read).
        With ``SO_LINGER`` on, ``close`` waits its linger time for them, as
        ``smc_close_active`` waits.  Then, within the same time, it waits for the
        peer to confirm the closing CDC (:func:`_cdcs_done`).  A
        linger time of 0 closes abortively (:meth:`Stack.abort`): the rest of the send buffer is
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
        if self._parent_ends and self._mode == "SMCR" and forkrelay.hand_over(self):
            return  # a forked child goes on with it (smcr.forkrelay)
        self._gone = True
        self._unshadow_fast()
        if self._forked:  # the parent's connection: only our descriptor goes
            if self._finalizer is not None:
                self._finalizer.detach()
            self._real_close()
            return
        if self._finalizer is not None:
            self._finalizer.detach()
        if self._share is not None and self._share.release():
            self._drop_descriptor()  # another socket (or a detached descriptor) holds it
            return
        if self._queue is not None and self._queue.pid == os.getpid():
            self._queue.close()
        if self._connecting is not None:
            self._connecting.close()
        if self._mode == "SMCR" and self._stack is not None and self._hc is not None:
            stack, hc = self._stack, self._hc
            linger = _linger(self)
            with stack.lock:  # (one locked section: a close is on every connection's path)
                if linger == 0:
                    stack.abort(hc)
                elif linger is None and self._unsent(stack, hc):
                    stack.close_later(hc)  # the rest goes in the background, as TCP's
                else:
                    wait = stack.config.close_wait_tx if linger is None else linger
                    deadline = time.monotonic() + wait
                    self._drain_tx(stack, hc, deadline)
                    c = stack.engine_conn(hc)
                    stack.app_close(hc)
                    if c is not None:
                        stack.wait(hc, lambda: _cdcs_done(c), deadline)
                stack.drop_readiness(hc)
        self._drop_descriptor()

    @staticmethod
    def _unsent(stack: Stack, hc: HostConn) -> bool:
        """Whether bytes of the send buffer wait for the peer's room (lock held)."""
        stack.process()
        c = stack.engine_conn(hc)
        return c is not None and c.tx_pending() > 0 and not (c.reset_reason or c.peer_closed)

    def _drop_descriptor(self) -> None:
        """Close our descriptor (one we borrowed from the connection stays open)."""
        if self._borrowed_fd:
            _PlainSocket.detach(self)
        else:
            self._real_close()

    def detach(self) -> int:
        """As ``socket.detach``.  In SMC-R mode it returns what :meth:`fileno` returned
        (the readiness descriptor), and the connection waits for a socket made from it
        (``socket.socket(fileno=...)``); the bytes are in the runtime, not in a
        descriptor.  Not while connecting, nor for a listener whose queue runs."""
        if self._mode == "CONNECTING" or (self._mode == "LISTEN" and self._queue):
            raise OSError(errno.EOPNOTSUPP, "detach is not supported by an SMC-R socket")
        if self._mode != "SMCR" or self._gone:
            if self._shown_tcp is not None and not self._gone:  # (after a fallback)
                self._shown_tcp.detach()
                self._shown_tcp = None
                os.close(_PlainSocket.detach(self))
                return self._shown
            return _PlainSocket.detach(self)
        fd = self.fileno()
        share = self._shared()
        if not self._borrowed_fd or share.holders == 1:  # (a borrowed descriptor that
            share.detached.append(fd)  # others hold the connection for is theirs)
            _detached_shares.add(share)
        if self._finalizer is not None:
            self._finalizer.detach()
        share.release()
        self._gone = self._closed = True
        self._unshadow_fast()
        _smc_sockets.discard(self)
        self._drop_descriptor()
        return fd

    def _shared(self) -> _Share:
        """This socket's connection as something several sockets hold (made on the
        first ``dup``/``detach``; from then on the last one to close closes it)."""
        if self._share is None:
            assert self._stack is not None and self._hc is not None
            share = self._share = _Share(self)
            if self._finalizer is not None:
                self._finalizer.detach()
            self._finalizer = weakref.finalize(self, share.collected)
            self._finalizer.atexit = False
        return self._share

    def _join(self, share: _Share, borrowed: bool) -> None:
        """Become one more holder of ``share``'s connection (a new socket object)."""
        for name, value in share.state.items():
            setattr(self, name, value)
        self._share = share
        share.holders += 1
        self._borrowed_fd = borrowed
        self._finalizer = weakref.finalize(self, share.collected)
        self._finalizer.atexit = False
        self._shadow_fast(share.stack, share.hc)
        _smc_sockets.add(self)

    def _move(self) -> SMCSocket:
        """A new socket object that owns this one's connection from now on; this one is
        closed, as ``ssl.SSLContext.wrap_socket`` detaches the socket it wraps (the
        caller may close the original afterwards without touching the connection)."""
        new = type(self)(self.family, self.type, self.proto,
                         fileno=os.dup(_PlainSocket.fileno(self)), _accepted=True)  # fmt: skip
        for name, value in vars(self).items():
            if name not in ("_finalizer", "_queue_finalizer", "_shown_tcp", *FAST_METHODS):
                setattr(new, name, value)
        if new._mode == "SMCR" and self._stack is not None and self._hc is not None:
            new._shadow_fast(self._stack, self._hc)  # (this one's serve this one)
        if self._shown_tcp is not None:
            self._shown_tcp.detach()
            self._shown_tcp = None
            new._shown_tcp = weakref.finalize(new, _close_number, new._shown)
            new._shown_tcp.atexit = False
        queue = self._queue
        if queue is not None and self._queue_finalizer is not None:  # a listener's queue
            self._queue_finalizer.detach()
            self._queue_finalizer = None
            new._queue_finalizer = weakref.finalize(new, queue.close)
            new._queue_finalizer.atexit = False
            queue.listener = weakref.ref(new)
        if self._finalizer is not None and self._stack is not None and self._hc is not None:
            self._finalizer.detach()
            new._finalizer = weakref.finalize(new, _collected, self._stack, self._hc,
                                              self._hc.tcp)  # fmt: skip
            new._finalizer.atexit = False
        if self in _smc_sockets:
            _smc_sockets.discard(self)
            _smc_sockets.add(new)
        self._gone = self._closed = True
        self._unshadow_fast()
        self._finalizer = None
        self._real_close()
        return new

    def dup(self) -> SMCSocket:
        """As ``socket.dup``: in SMC-R mode a second socket on the same connection (the
        last of them to close closes it); not while connecting."""
        if self._mode == "CONNECTING":
            raise OSError(errno.EOPNOTSUPP, "dup is not supported while connecting")
        if self._mode == "SMCR" and not self._gone:
            share = self._shared()
            new = type(self)(self.family, self.type, self.proto,
                             fileno=os.dup(_PlainSocket.fileno(self)), _accepted=True)  # fmt: skip
            new._join(share, borrowed=False)
            new.settimeout(self.gettimeout())
            return new
        sock = type(self)(self.family, self.type, self.proto,
                          fileno=os.dup(_PlainSocket.fileno(self)))  # fmt: skip
        sock.settimeout(self.gettimeout())
        return sock

    def recvfrom(self, bufsize: int, flags: int = 0) -> tuple[bytes, Any]:
        """As ``socket.recvfrom`` on a connected stream."""
        if self._mode != "SMCR" and not self._prefix:
            self._tcp_ok()
            return _PlainSocket.recvfrom(self, bufsize, flags)
        return self.recv(bufsize, flags), None

    def recvfrom_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> tuple[int, Any]:
        """As ``socket.recvfrom_into`` on a connected stream."""
        if self._mode != "SMCR" and not self._prefix:
            self._tcp_ok()
            return _PlainSocket.recvfrom_into(self, buffer, nbytes, flags)
        return self.recv_into(buffer, nbytes, flags), None

    def sendto(self, data: Any, *args: Any) -> int:
        """As ``socket.sendto``: a connected TCP socket ignores the address; so does SMC-R
        mode (``sendto(data[, flags], address)``)."""
        if self._mode != "SMCR":
            self._tcp_ok()
            return _PlainSocket.sendto(self, data, *args)
        if len(args) not in (1, 2):
            raise TypeError(f"sendto() takes 2 or 3 arguments ({len(args) + 1} given)")
        return self.send(data, int(args[0]) if len(args) == 2 else 0)


_accept_queues: weakref.WeakSet[_AcceptQueue] = weakref.WeakSet()
"""The accept queues of this process (see :meth:`_AcceptQueue.pause`)."""


_smc_sockets: weakref.WeakSet[SMCSocket] = weakref.WeakSet()
"""The sockets of this process in SMC-R mode (see :func:`_forked_child`)."""


def smc_socket_with_number(fd: int) -> SMCSocket | None:
    """The open socket of this process in SMC-R mode whose ``fileno()`` gave out ``fd``."""
    for sock in list(_smc_sockets):
        if sock._shown == fd and not sock._gone and sock._mode == "SMCR":
            return sock
    return None


def _forking() -> None:
    forkrelay.prepare(list(_smc_sockets))


def _forked_parent() -> None:
    for queue in list(_accept_queues):
        if queue.pid == os.getpid():
            queue.pause()
    forkrelay.after_in_parent(list(_smc_sockets))


def _forked_child() -> None:
    """In a forked child, the SMC-R connections of the parent are used through the
    parent (:mod:`smcr.forkrelay`): the runtime that drives them (its thread, its
    link groups) is not here, and driving them from two processes would corrupt
    both.  (TCP sockets, and listening SMC sockets, which start their own accept
    queue and runtime here, work as after any fork.)"""
    forkrelay.after_in_child(list(_smc_sockets))
    _smc_sockets.clear()


os.register_at_fork(before=_forking, after_in_parent=_forked_parent,
                    after_in_child=_forked_child)  # fmt: skip


def _rebind(sock: SMCSocket, fd: int) -> None:
    """Make ``fd`` (a duplicate of the socket's TCP socket) the descriptor of the socket
    object itself, its blocking mode and timeout as they were; the old number is left
    to the caller (:meth:`SMCSocket._reshow` puts another file under it)."""
    timeout = _c_gettimeout(sock)
    blocking = os.get_blocking(fd)
    kind = _c_family(sock), _c_type(sock), _c_proto(sock)
    _csocket.socket.detach(sock)
    _csocket.socket.__init__(sock, *kind, fd)
    _csocket.socket.settimeout(sock, timeout)
    os.set_blocking(fd, blocking)  # (the runtime's duplicate shares the flag)


def _close_number(number: int) -> None:
    """Close the application's number of a TCP socket (:meth:`SMCSocket._reshow`)."""
    with contextlib.suppress(OSError):
        os.close(number)


def _left_blocked_at_exit(stack: Stack) -> None:
    """A daemon thread whose ``recv`` or ``send`` the links' end at exit would fail
    (:meth:`Stack.close_at_exit`) stays blocked instead, as in TCP's, until the process is
    gone; called with no lock held.  Other threads, and every thread before the exit,
    get the error."""
    if stack.exiting and threading.current_thread().daemon:
        threading.Event().wait()  # never set: the process ends around it


def _cdcs_done(c: Connection) -> bool:
    """Whether every CDC of ``c`` completed (or the connection is gone): what ``close``
    waits for after its closing CDC, as Linux's ``smc_close_wait_tx_pends``.

    Why: over RoCE a posted WRITE or CDC is not yet delivered (the window, the
    peer's ACK); a process that exits right after ``close`` takes its QP, and
    with it what is still unsent, along (the kernel keeps Linux's link alive
    instead).  The closing CDC is signaled, so its completion confirms all the
    connection's bytes and CDCs before it.  A peer that closed reads no more:
    nothing to wait for (it may be gone already, and would never confirm).
    """
    return c.aborted or c.peer_closed or not any(entry[1] is c for entry in c.cdc_pending)


@functools.lru_cache(maxsize=256)
def _parse_ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """A socket address's host as an address object (a link-local one without its scope),
    kept per text: asked at every connect and accept."""
    return ipaddress.ip_address(host.split("%", maxsplit=1)[0])


def _byte_view(data: Any) -> memoryview:
    """A flat unsigned-byte view of a bytes-like object (TypeError for anything else)."""
    view = memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def _linger(tcp: _socket.socket) -> float | None:
    """``SO_LINGER`` of the TCP socket (``setsockopt`` passes it there, where Linux SMC copies
    it too): the linger time in seconds, or None when off (or the socket is gone)."""
    try:
        onoff, seconds = struct.unpack("ii", tcp.getsockopt(_socket.SOL_SOCKET,
                                                            _socket.SO_LINGER, 8))
    except OSError:
        return None
    return float(seconds) if onoff else None


class _Share:
    """One SMC-R connection held by several socket objects, as dup'ed descriptors hold one
    kernel socket: ``dup``, ``detach`` and a socket made from ``fileno()`` (``fromfd``).
    The last holder to close (or be collected) closes the connection; a detached
    descriptor counts as a holder until a socket is made from it."""

    def __init__(self, sock: SMCSocket) -> None:
        assert sock._stack is not None and sock._hc is not None
        self.stack, self.hc = sock._stack, sock._hc
        self.family = sock.family
        self.holders = 1
        self.detached: list[int] = []  # descriptors detach() returned, not yet made sockets
        self.addresses = (_address_of(sock, _PlainSocket.getsockname),
                          _address_of(sock, _PlainSocket.getpeername))  # fmt: skip
        skip = {"_finalizer", "_queue_finalizer", "_share", "_borrowed_fd", "_via_readiness",
                "_shown", "_shown_tcp",
                "_closed", "_io_refs", "_gone", "_timeout", "_parent_ends", "_fork_ends",
                *FAST_METHODS}  # (each holder gets its own: SMCSocket._shadow_fast)
        self.state = {k: v for k, v in vars(sock).items() if k not in skip}
        self.state["_mode"] = "SMCR"

    def readiness_fd(self) -> int:
        readiness = self.hc.readiness
        return -1 if readiness is None else readiness.fileno()

    def release(self) -> bool:
        """A holder lets go: whether the connection is still held (by others)."""
        self.holders -= 1
        return self.holders > 0 or bool(self.detached)

    def collected(self) -> None:
        """A holder was garbage-collected unclosed (``weakref.finalize``)."""
        if not self.release():
            _collected(self.stack, self.hc, self.hc.tcp)


_detached_shares: set[_Share] = set()
"""Connections whose descriptor ``detach`` gave out (see :class:`_Share`)."""


def _share_of(fd: int) -> _Share | None:
    """The SMC-R connection whose readiness descriptor ``fd`` is (or is a dup of), if any;
    a detached descriptor becomes the new socket's (no longer counted apart)."""
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    if not stat.S_ISSOCK(st.st_mode):
        return None
    key = (st.st_dev, st.st_ino)
    for share in list(_detached_shares):
        if _same_file(share.readiness_fd(), key):
            if fd in share.detached:
                share.detached.remove(fd)
            elif share.detached:
                share.detached.pop()
            if not share.detached:
                _detached_shares.discard(share)
            return share
    for sock in list(_smc_sockets):
        hc = sock._hc
        if hc is not None and hc.readiness is not None and hc.readiness.file == key:
            return sock._shared()
    return None


def _address_of(sock: SMCSocket, get: Callable[[Any], Any]) -> Any:
    """The TCP connection's address (``getsockname``/``getpeername``), None once there is
    none: a connection that has ended is still dup'ed and detached, as a descriptor is."""
    try:
        return get(sock)
    except OSError:
        return None


def _shared_address(address: Any) -> Any:
    """An address of :attr:`_Share.addresses`, or ``ENOTCONN`` as the kernel's for none."""
    if address is None:
        raise OSError(errno.ENOTCONN, os.strerror(errno.ENOTCONN))
    return address


def _same_file(fd: int, key: tuple[int, int]) -> bool:
    try:
        st = os.fstat(fd)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == key


def _collected(stack: Stack, hc: HostConn, tcp: _socket.socket) -> None:
    """An SMC-R mode :class:`SMCSocket` was garbage-collected unclosed (``weakref.finalize``;
    it holds the runtime, the connection and the TCP socket, never the socket object).

    The socket's own finalizer (``socket.socket``'s) has warned and closed its
    descriptor; this hands the connection to the runtime (:meth:`Stack.orphan`):
    the collector may run in any thread, even one that holds the runtime's lock,
    so nothing here takes that lock or waits.
    """
    stack.orphan(hc, _linger(tcp))


MAX_QUEUED = 4096
"""Connections an accept queue holds (handshakes included) before it leaves the rest to
the kernel: a bound for floods (each SMC-R one holds an RMB and a send buffer)."""


class _AcceptQueue:
    """The connections of a listening socket whose handshakes have ended (Linux's
    ``smc_tcp_listen_work`` and accept queue).

    The process's watcher thread (:mod:`smcr.stack.watcher`) accepts from the
    kernel as clients come, also while the application is busy elsewhere: a
    client whose SYN did not offer SMC is queued at once as TCP; one that did
    gets its handshake started, which the runtime drives, and is queued when it
    ends.  The listen backlog is not a limit here: a client whose TCP connection
    the kernel completed has sent its Proposal and waits for an answer, and would
    fail at the CLC timeout if its handshake waited for the application (Linux
    enforces the backlog on SYNs instead, which we cannot reach); up to
    :data:`MAX_QUEUED` connections wait here or in handshakes, beyond that the
    kernel holds them.  :meth:`fileno` is readable while one waits (``select``
    on a listening socket, asyncio's ``sock_accept``).
    """

    def __init__(self, listener: SMCSocket) -> None:
        self.pid = os.getpid()
        # our own descriptor of the listening socket (non-blocking; the listener's
        # timeout applies to take()): nothing here keeps the listener object alive,
        # so one dropped unclosed is collected, and its finalizer closes this too
        self.sock = _PlainSocket(fileno=os.dup(_PlainSocket.fileno(listener)))
        self.sock.setblocking(False)
        self.fd = self.sock.fileno()
        self.family, self.type, self.proto = listener.family, listener.type, listener.proto
        self.cls = type(listener)  # (smcr run's socket class: its settings too)
        self.listener = weakref.ref(listener)  # its buffer sizes, set after listen() too
        listener._stack_here()  # bound to one address: its runtime (SMCSocket._stack_here)
        self.stack = listener._stack
        self.polled: Stack | None = self.stack
        """The runtime :meth:`_poll` polls: the listener's, or on a wildcard address the
        one of its latest handshake."""
        self.backlog = MAX_QUEUED
        self.ready: deque[tuple[SMCSocket, Any]] = deque()
        self.pending = 0
        self.error: OSError | None = None
        self.cond = threading.Condition()
        self.readiness = Readiness()
        self.readiness.set(False, False)
        self.closed = False
        self.watching = False
        self.paused = False
        self.takers = 0
        """Threads in :meth:`take` that poll the runtime (:meth:`_poll`)."""
        self._watch()

    def fileno(self) -> int:
        """Readable while a connection (or an error) waits for ``accept``."""
        number = self.readiness.fileno()
        self.show()
        return number

    def show(self) -> None:
        """The program has a number for the readiness descriptor now (:meth:`fileno`,
        :meth:`SMCSocket._reshow`): bring it up to date.  Until then :meth:`_changed`
        leaves it alone: a program that only calls ``accept`` saves the three system
        calls per connection of making it readable and unreadable again."""
        with self.cond:
            self.readiness.set(bool(self.ready) or self.error is not None, False)

    def _watch(self) -> None:
        self.watching = True
        get_watcher().watch(self.fd, selectors.EVENT_READ, self._on_readable)

    def pause(self) -> None:
        """This process forked (:func:`_forked_parent`): stop taking connections from the
        kernel until this process asks for one again (``accept``, ``fileno``).

        A preforked server's parent listens and forks children that accept; were it
        to go on accepting in the background, its children would see none.  Meanwhile
        a connection the kernel holds makes :meth:`fileno` readable once, so that a
        parent that does accept (asyncio, a forking server) wakes and resumes.
        """
        with self.cond:
            if self.closed or self.paused:
                return
            self.paused = True
            self.watching = False
            get_watcher().watch(self.fd, selectors.EVENT_READ, self._on_readable_paused)

    def _on_readable_paused(self) -> None:
        with self.cond:
            if self.paused and not self.closed:
                get_watcher().unwatch(self.fd)
                self.readiness.set(True, False)

    def resume(self) -> None:
        """The process wants connections (again): take them from the kernel."""
        with self.cond:
            if self.paused and not self.closed:
                self.paused = False
                self._changed()
                self._watch()

    def _on_readable(self) -> None:
        """Accept what the kernel has (watcher thread)."""
        while True:
            with self.cond:
                if self.closed:
                    return
                if len(self.ready) + self.pending >= self.backlog:
                    self.watching = False  # full: take() watches again
                    get_watcher().unwatch(self.fd)
                    return
            try:
                fd, addr = self.sock._accept()  # type: ignore[attr-defined]
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:  # EMFILE, ENOBUFS...: accept() raises it
                with self.cond:
                    if not self.closed:
                        self.error = exc
                        self.watching = False
                        get_watcher().unwatch(self.fd)
                        self._changed()
                return
            self._admit(fd, addr)

    def _admit(self, fd: int, addr: Any) -> None:
        sock = self.cls(self.family, self.type, self.proto, fileno=fd, _accepted=True)
        sock._stack = self.stack
        listener = self.listener()
        if listener is not None:
            sock._rmb_size, sock._sndbuf_size = listener._rmb_size, listener._sndbuf_size
        if not discovery.current().peer_offered(sock, client=False):
            sock._fall_back(int(DeclineCode.PEERNOSMC), 0, True)
            with self.cond:
                self.ready.append((sock, addr))
                self._changed()
            return
        with self.cond:
            self.pending += 1
        try:
            sock._start_handshake(False, lambda hc: self._handshake_ended(sock, addr, hc))
        except Exception:
            with self.cond:
                self.pending -= 1
            sock.close()
            raise
        if self.stack is None:  # (a wildcard address: the runtime its clients came to)
            with self.cond:
                self.polled = sock._stack

    def _handshake_ended(self, sock: SMCSocket, addr: Any, hc: HostConn) -> None:
        """The runtime's news (its lock held): queue the socket, or drop a failed one."""
        assert sock._stack is not None
        sock._finish_handshake(sock._stack, hc)
        with self.cond:
            self.pending -= 1
            if sock._mode == "INIT":  # failed and reset: never seen by the application
                if not self.watching and not self.closed:
                    self._watch()
                return
            if self.closed:
                self.ready.append((sock, addr))  # closed with the rest, outside the lock
            else:
                self.ready.append((sock, addr))
                self._changed()
        if self.closed:  # (this runs under the runtime's lock, which close() takes)
            threading.Thread(target=self._close_ready, name="smcr-close", daemon=True).start()

    def _changed(self) -> None:
        """Wake ``take`` and the descriptor (cond held)."""
        self.cond.notify_all()
        self._wake_taker()
        if self.readiness.app >= 0:  # (else: show() when the program asks for it)
            self.readiness.set(bool(self.ready) or self.error is not None, False)

    def _wake_taker(self) -> None:
        """A thread in :meth:`take` that polls the runtime looks again (cond held)."""
        if self.takers and self.polled is not None:
            self.polled.wake_poller()

    def take(self, timeout: float | None) -> tuple[SMCSocket, Any]:
        """The next connection: ``BlockingIOError`` when none waits and ``timeout`` is 0,
        ``TimeoutError`` when none came in time, an accept error of the kernel's."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self.resume()
        with self.cond:
            while not self.ready and self.error is None:
                if self.closed:
                    raise OSError(errno.EBADF, "Bad file descriptor")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    if timeout == 0.0:
                        raise BlockingIOError(errno.EAGAIN, os.strerror(errno.EAGAIN))
                    raise TimeoutError("timed out")
                if not self._poll(deadline) and not (self.ready or self.error or self.closed):
                    self.cond.wait(left)  # (news came meanwhile: cond was released)
            if self.error is not None and not self.ready:
                error, self.error = self.error, None
                self._changed()
                self._watch()
                raise error
            item = self.ready.popleft()
            self._changed()
            if not self.watching:
                self._watch()
        item[0].settimeout(_socket.getdefaulttimeout())  # as socket.accept() leaves it
        return item

    def _poll(self, deadline: float | None) -> bool:
        """Wait in :meth:`take` by polling the runtime (cond held, released meanwhile), as a
        thread blocked in ``recv`` does (:meth:`Stack.poll_until`): the handshakes'
        last CLC message is read, and the connection queued, in the thread that takes
        it, and the CDCs that close earlier connections are taken here too, instead of
        each waking the progress thread, which then wakes this one.

        :returns: False when it did not poll (another application thread does, or no
            runtime is known yet: a listener on a wildcard address before its first
            handshake); the caller waits on ``cond`` then.  Waking it is
            :meth:`_wake_taker`'s: a handshake of another runtime (RoCE, a wildcard
            address) rings this one's doorbell when it ends.
        """
        stack = self.polled
        if stack is None:
            return False

        def ready() -> bool:
            return bool(self.ready) or self.error is not None or self.closed
        self.takers += 1
        self.cond.release()
        try:
            with stack.lock:
                return stack.poll_until(ready, deadline)
        finally:
            self.cond.acquire()
            self.takers -= 1

    def _close_ready(self) -> None:
        """Reset the connections nobody accepted, as a TCP listener's close resets its
        queue's (the client's next call, or ``getsockopt(SO_ERROR)``, says ECONNRESET):
        an abortive close (``SO_LINGER`` 0; SMC-R: the abort CDC)."""
        with self.cond:
            left, self.ready = list(self.ready), deque()
        for sock, _addr in left:
            with contextlib.suppress(OSError):
                sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()

    def close(self) -> None:
        """The listener closes: connections nobody accepted are closed (Linux resets
        them); handshakes still running close theirs when they end."""
        with self.cond:
            if self.closed:  # (again, from the listener's finalizer: the descriptor's
                return  # number may be another socket's by now)
            self.closed = True
            if self.watching or self.paused:
                get_watcher().unwatch(self.fd)
            self.watching = False
            self.cond.notify_all()
            self._wake_taker()
        self._close_ready()
        self.readiness.close()
        self.sock.close()


class _Connecting:
    """A non-blocking ``connect`` in progress: the TCP connect, then (if the peer
    offered SMC) the handshake, finished by the watcher thread and the runtime.

    ``readiness`` is the socket's descriptor meanwhile: writable (and readable)
    once the socket is settled.  On SMC-R it becomes the connection's own
    readiness descriptor, so a selector that registered it keeps working.
    """

    def __init__(self, sock: SMCSocket) -> None:
        self.sock = sock
        self.readiness = Readiness()
        self.readiness.set(False, False)
        self.fd = -1  # the TCP socket's (start(): after SMCSocket._reshow moved it)
        self.closed = False
        self.tcp_done = False  # the TCP connect's outcome is taken (watcher or SO_ERROR)
        self.lock = threading.Lock()

    def so_error(self) -> int:
        """``getsockopt(SO_ERROR)`` while connecting: a failed TCP connect's error at once
        (asyncio and others watch the TCP descriptor they saw before ``connect``);
        0 while the TCP connect or the handshake goes on."""
        with self.lock:
            if self.tcp_done or self.closed:
                return 0
            err = int(_PlainSocket.getsockopt(self.sock, _socket.SOL_SOCKET, _socket.SO_ERROR))
            if err:
                self.tcp_done = True
                get_watcher().unwatch(self.fd)
                self._settle("TCP", 0, failed=True)
            return err

    def connect_again(self, address: Any) -> None:
        """``connect`` while connecting: the kernel's answer while the TCP connect is not
        settled here (``EALREADY``; or its failure, reported and forgotten, as the
        kernel's next ``connect`` after a failed one does)."""
        with self.lock:
            if self.tcp_done or self.closed:
                return
            err = _PlainSocket.connect_ex(self.sock, address)
            if err in (0, errno.EALREADY, errno.EINPROGRESS, errno.EISCONN):
                return
            self.tcp_done = True
            get_watcher().unwatch(self.fd)
            self._settle("TCP", 0, failed=True)
        raise OSError(err, os.strerror(err))

    def start(self) -> None:
        """Watch for the TCP connect's end."""
        self.fd = _PlainSocket.fileno(self.sock)
        get_watcher().watch(self.fd, selectors.EVENT_WRITE, self._connected)

    def _connected(self) -> None:
        """The TCP connect ended (watcher thread): settle the mode or start the handshake."""
        get_watcher().unwatch(self.fd)
        sock = self.sock
        with self.lock:
            if self.closed or self.tcp_done:
                return
            self.tcp_done = True
            try:
                _PlainSocket.getpeername(sock)
            except OSError:
                # failed: its error stays the kernel's (SO_ERROR, EPOLLERR on the number
                # the application has, which names the TCP socket again), as on TCP
                self._settle("TCP", 0, failed=True)
                return
        if discovery.current().peer_offered(sock, client=True):
            sock._start_handshake(True, self._handshake_ended)
        else:
            sock._fall_back(int(DeclineCode.PEERNOSMC), 0)
            with self.lock:
                if not self.closed:
                    self._settle("TCP", 0)

    def _handshake_ended(self, hc: HostConn) -> None:
        """The runtime's news (its lock held)."""
        sock = self.sock
        assert sock._stack is not None
        if self.closed:  # the application closed the socket meanwhile: nobody wants it
            _abandon(sock._stack, hc)
            return
        sock._finish_handshake(sock._stack, hc)
        if sock._mode == "SMCR":
            hc.readiness = self.readiness
            sock._stack.update_readiness(hc)
            sock._connecting = None  # the descriptor now belongs to the connection
            return
        with self.lock:
            if not self.closed:
                self._settle("TCP", 0 if sock._mode == "TCP" else errno.ECONNRESET)

    def _settle(self, mode: str, err: int, failed: bool = False) -> None:
        """Settle to TCP (connect failed, peer without SMC, handshake declined or failed):
        the program's number names the TCP socket again, moved there by the program's
        next call (:meth:`SMCSocket._catch_up`; a fallback already set the mode TCP).
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


def _abandon(stack: Stack, hc: HostConn) -> None:
    """A handshake nobody waits for any more has ended (runtime's lock held): a
    connection it made is aborted, a fallback's TCP socket closed."""
    hc.on_outcome = None
    if isinstance(hc.outcome, HandshakeCompleted):
        stack.abort(hc)
    else:
        with contextlib.suppress(OSError):
            hc.tcp.close()


def create_connection(address: tuple[str, int], timeout: float | None = None,
                      source_address: tuple[str, int] | None = None) -> SMCSocket:
    """As ``socket.create_connection``, returning an :class:`SMCSocket`."""
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
    """As ``socket.create_server``, returning a listening :class:`SMCSocket`."""
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
