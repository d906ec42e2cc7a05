"""An SMC-R socket's most frequent calls, compiled: ``sendall`` and ``send`` of bytes
that are corked or fit the peer's RMBE at once, ``recv`` and ``recv_into`` of bytes
that are there.

Why: :mod:`smcr.socket` cannot be compiled (``SMCSocket`` subclasses
``socket.socket``, and ``weakref.finalize`` needs ``__weakref__``), and for a 1 KiB
write its interpreted frames (``sendall``, ``_send``, ``_smc``, two locks) cost as
much as the rest of the send.  An SMC-R socket puts the bound methods of a
:class:`SocketFast` in its instance dictionary, where they shadow the class's, so a
program's ``sock.sendall(data)`` runs compiled code only.  Anything else -- flags, a
full RMBE, a closed, shut, forked or reset socket, data of another shape -- goes to
the class's method, which does everything as before; nothing is taken before it does.

The socket is held weakly: its dictionary holds this object, and a cycle would keep
a socket nobody references from being collected (and closed) at once.  The price: a
program that keeps only ``sock.sendall`` (not the socket) no longer keeps the socket
alive, as ``socket.socket``'s bound method does; once it is collected (and so closed)
the method fails as on a closed socket (EBADF).
"""

from __future__ import annotations

import errno
import os
import socket
import weakref
from collections.abc import Callable
from typing import Any

from smcr.stack.counters import COUNTERS
from smcr.stack.hostconn import HostConn
from smcr.stack.runtime import Stack

_SMCR = "SMCR"
_WAITALL = int(socket.MSG_WAITALL)
#: The socket methods a :class:`SocketFast` stands in for.
METHODS = ("sendall", "send", "recv", "recv_into")


class SocketFast:
    """The common cases of one SMC-R socket's data calls (module docstring).

    :param sock: the socket (held weakly).
    :param slow_sendall: the class's ``sendall`` (and so on): the general path,
        called with the socket as its first argument.
    """

    def __init__(self, sock: Any, stack: Stack, hc: HostConn, wlock: Any, rlock: Any,
                 slow_sendall: Callable[..., None], slow_send: Callable[..., int],
                 slow_recv: Callable[..., bytes],
                 slow_recv_into: Callable[..., int]) -> None:  # fmt: skip
        self.sock_ref = weakref.ref(sock)
        self.stack = stack
        self.hc = hc
        self.wlock = wlock
        self.rlock = rlock
        self.slow_sendall = slow_sendall
        self.slow_send = slow_send
        self.slow_recv = slow_recv
        self.slow_recv_into = slow_recv_into

    def _open(self, sock: Any) -> bool:
        """The socket is an SMC-R socket of this process, open (the general path's
        checks before it looks at the connection)."""
        return sock._mode == _SMCR and not sock._gone and not sock._forked

    def _gone(self) -> OSError:
        """The error of a call whose socket was collected (module docstring)."""
        return OSError(errno.EBADF, os.strerror(errno.EBADF))

    def _sent(self, view: memoryview) -> int:
        """``view`` taken in one of :meth:`Stack.send_fast`'s cases (corked, written
        inline, copied into the send buffer), or -1 (the general path's first case)."""
        stack, hc = self.stack, self.hc
        if self.wlock.locked():  # another thread sends (and may wait): keep its order
            return -1
        with stack.lock:
            c = stack.engine.conns.get(hc.conn_id)
            if (c is None or c.reset_reason or c.tx_flags or c.peer_closed
                    or self.wlock.locked()):  # fmt: skip
                return -1  # (a sender took the lock meanwhile: it may be waiting inside)
            n = stack.send_fast(hc, c, view)
        if n > 0:
            COUNTERS.tx_pd[n.bit_length()] += 1
        return n

    def _sent_all(self, sock: Any, data: Any, flags: int) -> int:
        """All of ``data`` taken by :meth:`_sent` (its length), or 0: the general path's
        turn (:meth:`Stack.send_fast` takes all or nothing)."""
        if flags or not self._open(sock) or sock._wr_shut:
            return 0
        view = memoryview(data)
        if view.format != "B" or view.ndim != 1 or not view:
            return 0
        return max(self._sent(view), 0)

    def sendall(self, data: Any, flags: int = 0) -> None:
        """``socket.sendall``."""
        sock = self.sock_ref()
        if sock is None:
            raise self._gone()
        if not self._sent_all(sock, data, flags):
            self.slow_sendall(sock, data, flags)

    def send(self, data: Any, flags: int = 0) -> int:
        """``socket.send``."""
        sock = self.sock_ref()
        if sock is None:
            raise self._gone()
        n = self._sent_all(sock, data, flags)
        if n:
            return n
        result: int = self.slow_send(sock, data, flags)
        return result

    def _read(self, out: memoryview, want: int) -> int:
        """Bytes that are there copied into ``out``, or -1 (the general path's first case);
        ``want``: the size asked for (``smcr stats`` counts requests by it)."""
        stack, hc = self.stack, self.hc
        if self.rlock.locked():  # another thread reads (and may wait): keep its order
            return -1
        with stack.lock:
            c = stack.engine.conns.get(hc.conn_id)
            if c is None or self.rlock.locked():
                return -1
            n = stack.recv_fast(hc, c, out, False)
        if n > 0:
            COUNTERS.rx_pd[want.bit_length()] += 1
        return n

    def _read_waiting(self, sock: Any, out: memoryview, waitall: bool) -> int:
        """A blocking read that waits for its bytes (``waitall``: all of ``out``), compiled
        from the call to the copy: the thread that waited is the one that answers, and a
        round trip is two of these.  Only for a blocking socket without a timeout, with no
        other reader, on a connection whose bytes can all come (no EOF, reset or urgent
        byte, and with ``waitall`` fewer than the RMBE holds); -1 for anything else, then
        or after the wait (the general path takes over, and looks at everything again)."""
        stack, hc, rlock = self.stack, self.hc, self.rlock
        if sock._timeout is not None or sock._rd_shut or not rlock.acquire(False):
            return -1
        try:
            with stack.lock:
                c = stack.engine.conns.get(hc.conn_id)
                if c is None or (waitall and len(out) >= len(hc.rmb)):
                    return -1
                need = len(out) if waitall else 1

                def ready() -> bool:
                    return (c.rx_prod - c.rx_cons >= need or c.peer_done or bool(c.reset_reason)
                            or c.urg_rx_pos is not None)  # fmt: skip

                if not ready():
                    stack.wait(hc, ready, None)
                n = stack.recv_fast(hc, c, out, waitall)
        finally:
            rlock.release()
        if n > 0:
            COUNTERS.rx_pd[len(out).bit_length()] += 1
        return n

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        """``socket.recv_into``."""
        sock = self.sock_ref()
        if sock is None:
            raise self._gone()
        if (not flags or flags == _WAITALL) and nbytes >= 0 and self._open(sock):
            out = memoryview(buffer)
            if out.format == "B" and out.ndim == 1 and nbytes <= len(out):
                if nbytes and nbytes < len(out):
                    out = out[:nbytes]
                if len(out):
                    n = -1 if flags else self._read(out, len(out))
                    if n <= 0:
                        n = self._read_waiting(sock, out, bool(flags))
                    if n > 0:
                        return n
        result: int = self.slow_recv_into(sock, buffer, nbytes, flags)
        return result

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        """``socket.recv``: a buffer the size of what is there, not of ``bufsize``."""
        sock = self.sock_ref()
        if sock is None:
            raise self._gone()
        if not flags and bufsize > 0 and self._open(sock):
            c = self.stack.engine.conns.get(self.hc.conn_id)
            if c is not None:
                avail = c.rx_prod - c.rx_cons  # (a glance: _read looks again, locked)
                if avail > 0:
                    buf = bytearray(min(avail, bufsize))
                    n = self._read(memoryview(buf), bufsize)
                    if n > 0:
                        if n < len(buf):
                            del buf[n:]
                        return bytes(buf)
        result: bytes = self.slow_recv(sock, bufsize, flags)
        return result
