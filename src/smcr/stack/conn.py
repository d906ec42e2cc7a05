"""One SMC-R connection's data path: send, receive, wait, readiness, shutdown and close, as
the socket layer (:mod:`smcr.socket`) and the transparent mode use them (Linux ``smc_tx.c``
``smc_tx_sendmsg``, ``smc_rx.c`` ``smc_rx_recvmsg``, ``smc_close.c`` ``smc_close_active``).

Two objects:

* :class:`DataPath`, one per connection: its runtime's parts, the engine's record of it,
  the reader's and the writer's locks, the shutdown and urgent-data state.  Every call
  takes the runtime's lock itself; the socket layer never touches the engine, the CQ or
  the handshake.
* :class:`SocketCalls`, one per socket object that holds the connection (``dup`` and
  ``socket.fromfd`` make several): its timeout, whether it is closed or was inherited
  by a forked child, and the four data calls of a program (``sendall``, ``send``,
  ``recv``, ``recv_into``) with their arguments as ``socket.socket`` takes them.  The
  socket puts these bound methods in its instance dictionary, so that a program's
  ``sock.sendall(data)`` runs compiled code only (this module is compiled;
  :mod:`smcr.socket` cannot be: ``SMCSocket`` subclasses ``socket.socket``).

The common cases go first, without the reader's or writer's lock (it is only looked at: a
thread that holds it may be waiting inside, and its order is kept): a send that is
corked, or fits the peer's RMBE at once (inline, :meth:`Executor.send_inline`), or on RNICs
without inline sends (RoCE) fits the send buffer; a read of bytes that are there.  A
blocking read that must wait waits and copies here too (a round trip is two of them).
Anything else -- flags, a full RMBE, a shut or reset connection, a timeout -- takes the
general path, which holds the lock of its direction throughout.

A program that keeps only ``sock.sendall`` (not the socket) does not keep the socket
alive: once it is collected (and so closed) the method fails as on a closed socket
(``EBADF``).
"""

from __future__ import annotations

import errno
import os
import socket
import threading
from collections.abc import Callable
from typing import Any, Final

from smcr import exits
from smcr.bound import memview, monotonic
from smcr.core import Action
from smcr.core.connection import Connection
from smcr.locks import give, take, try_take
from smcr.stack import inplace, reader, sender, waiter
from smcr.stack.counters import COUNTERS
from smcr.stack.executor import ring_read, ring_write
from smcr.stack.frames import release_frames
from smcr.stack.hostconn import HostConn
from smcr.stack.readiness import Readiness
from smcr.stack.runtime import Stack

_DONTWAIT: Final = int(socket.MSG_DONTWAIT)
_PEEK: Final = int(socket.MSG_PEEK)
_WAITALL: Final = int(socket.MSG_WAITALL)
_OOB: Final = int(socket.MSG_OOB)
SENDS_PER_PROCESS: Final = 4
"""On RNICs without inline sends (RoCE), :meth:`DataPath.send_fast` takes the news (ACKs,
the peer's cursors) every this many sends, or sooner when the send buffer runs short: one
look for several ACKs, which arrive one per message."""
PEER_READ_WAIT: Final = 0.01
"""Seconds a blocking ``sendall`` waits for the peer to read before it copies into the
send buffer (see :meth:`DataPath.send`)."""


class DataPath:
    """The data path of one SMC-R connection (module docstring)."""

    def __init__(self, stack: Stack, hc: HostConn) -> None:
        self.stack = stack
        self.ex = stack.ex
        self.progress = stack.progress
        self.hc = hc
        self.rlock = threading.Lock()  # one reader and one writer at a time
        self.wlock = threading.Lock()
        self.rd_shut = False
        self.wr_shut = False
        self.sent_late = False  # a send after the peer closed was taken (the next one fails)
        self.reset_told = False  # SO_ERROR, a send or a read reported the connection's reset
        self.oob = -1  # an urgent byte taken out of the stream, unread (-1: none)
        self.oob_read = -1  # position of the urgent byte read by recv(MSG_OOB)
        self.oob_inline = False
        """``SO_OOBINLINE``: the urgent byte stays in the stream (Linux ``SOCK_URGINLINE``)."""
        self.general_reads = 0
        """Reads that took the general path (:meth:`recv_into`), not a common case's."""

    def conn(self) -> Connection | None:
        """The engine's record of the connection (None once released)."""
        return self.ex.engine.conns.get(self.hc.conn_id)

    def take_news(self) -> None:
        """Take what the CQ holds now: a non-blocking read that finds no bytes yet may have
        been woken by the message itself (its consumer bell), which nobody took yet.  The
        caller reads at once, then calls :meth:`news_taken`: the descriptor turned
        readable by the peer's ring meanwhile is checked for the ring's datagram only if
        the read leaves it readable (a read that takes everything drains it anyway: one
        system call less a message)."""
        ex = self.ex
        with ex.lock:
            wcs = ex.cq.poll(64)
            if wcs:
                r = self.hc.readiness
                if r is None:
                    ex.process(wcs)
                    return
                r.defer_check = True
                try:
                    ex.process(wcs)
                finally:
                    r.defer_check = False

    def news_taken(self) -> None:
        """After the read that followed :meth:`take_news`: the check it deferred."""
        r = self.hc.readiness
        if r is not None and r.unchecked:
            with self.ex.lock:
                r.check()

    # ================================================================ sending

    def send(self, view: memoryview, flags: int, timeout: float | None,
             wait_peer: bool = False) -> int:  # fmt: skip
        """Send some of a non-empty byte view (``smc_tx_sendmsg``): straight into the peer's
        RMBE when nothing waits and the RNIC takes inline WRITEs (one copy, as TCP makes
        one into the kernel), else by copying into the send buffer, which the engine
        RDMA-WRITEs from.

        :param wait_peer: (``sendall`` on a blocking socket) when the peer's RMBE is
            full and nothing waits in the send buffer, wait up to
            :data:`PEER_READ_WAIT` for the peer to read and then write inline,
            rather than copy into the send buffer and out of it again later: the
            caller blocks until all is taken anyway, and the copy saved is a third
            of the bytes' copying.  A peer that does not read by then gets the
            send buffer as before (two ends that both send before they read must
            not lose it).
        :returns: the bytes taken.
        """
        COUNTERS.tx_pd[len(view).bit_length()] += 1  # smcr stats: one add
        if flags & _OOB:
            COUNTERS.urg_data_cnt += 1
        ex, hc = self.ex, self.hc
        try:
            with self.wlock, ex.lock:
                c = ex.engine.conns.get(hc.conn_id)
                if c is None or c.reset_reason:
                    raise ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")
                if c.tx_flags or c.peer_closed or self.wr_shut:
                    return self._send_after_close(c, len(view))
                if not flags & _OOB and (n := self.send_fast(c, view)) >= 0:
                    return n  # corked, or written inline (the common cases)
                inline = ex.max_inline and not flags & _OOB  # max_inline >= any buffer size
                room = c.direct_room() if inline else 0
                if not room:
                    # the peer's RMBE is full or bytes wait: take the consumer cursor updates
                    # that came meanwhile now (they flush the send buffer and reopen the inline
                    # path), not when the progress thread next looks
                    ex.process()
                    room = c.direct_room() if inline else 0
                    if not room and wait_peer and inline and c.tx_app == c.tx_sent:
                        self._wait_peer(c)
                        room = c.direct_room()
                if not room and c.sndbuf_space() <= 0:
                    self._wait_room(c, flags, timeout)
                    room = c.direct_room() if inline else 0
                n = 0
                if room:
                    size = len(view)
                    request = c.unanswered and not c.echo_pending and c.echo_wanted(size)
                    if size <= room:
                        ex.send_inline(c, view, request)
                        self._after_send(c)
                        return size
                    ex.send_inline(c, view[:room], request)
                    n, view = room, view[room:]
                    if c.sends_ended():  # (its completions took the peer's close or abort)
                        return n  # (the next send meets it)
                    if c.sndbuf_space() <= 0:
                        if hc.readiness is not None:
                            ex.update_readiness(hc)
                        return n
                return n + self._copy_in(c, view, flags)
        except (ConnectionResetError, BrokenPipeError):
            left_blocked_at_exit(self.stack)
            raise

    def _send_after_close(self, c: Connection, size: int) -> int:
        """A send when our side or the peer's has closed (lock held): the first after the
        peer's close is taken as far as the send buffer has room, as TCP takes what its
        socket buffer holds (the peer's kernel answers it with a reset: the bytes go
        nowhere), so a large write fails as over TCP rather than seem delivered; the
        peer's abort is told once, as ECONNRESET, as after a TCP reset (Linux:
        ``sk_stream_error`` turns its EPIPE into the pending error); else EPIPE."""
        if c.peer_closed and not (c.tx_flags or self.wr_shut or self.sent_late or c.aborted):
            self.sent_late = True
            if (room := c.sndbuf_space()) > 0:
                return min(size, room)
        if c.aborted and not c.tx_flags and not self.reset_told:
            self.reset_told = True
            raise ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    def send_fast(self, c: Connection, data: memoryview) -> int:
        """A send's common cases in one step (lock held; no urgent data): corked into the
        send buffer (:meth:`Connection.cork` says so: the peer's answer flushes it),
        RDMA-written inline when all of it fits now (:meth:`Executor.send_inline`), or, on
        RNICs without inline sends (RoCE), copied into the send buffer when all of it
        fits there, after the news that came meanwhile (:meth:`Executor.process`:
        acknowledgements and the peer's cursors free room), as the general path does.

        :returns: the bytes taken (all of ``data``), or -1 when no case applies (the
            general path then waits, copies or splits).
        """
        ex, hc = self.ex, self.hc
        n = len(data)
        if c.echo_pending and c.cork(n):
            ring_write(hc.sndbuf, c.tx_app, data)
            c.corked(n)
            ex.corked(c)
        elif ex.max_inline:
            if not 0 < n <= c.direct_room():
                return -1
            local = ex.local_peer(hc, c)
            armed = ex.cq.take_arm() if local else 0
            standby = False
            wake = ex.wake
            if wake.send_takes_standby and not local:  # (Progress.send_ended says why)
                wake.send_takes_standby = False
                standby = ex.cq.take_standby()
            try:
                ex.send_inline(c, data, c.unanswered and not c.echo_pending and c.echo_wanted(n))
            finally:
                if local:
                    ex.local_end(armed)
                elif standby:
                    self.progress.send_ended()
        else:
            ex.sends_unprocessed += 1
            if ex.sends_unprocessed >= SENDS_PER_PROCESS or c.sndbuf_space() < 4 * n:
                ex.sends_unprocessed = 0
                ex.process()
                # (this thread took the news itself: the progress thread stands by meanwhile,
                # rather than wake for each acknowledgement only to find it taken, and take
                # the GIL and the lock from this thread to do so)
                ex.wake.app_looked = monotonic()
            if (not 0 < n <= c.sndbuf_space() or c.tx_flags or c.peer_closed or c.reset_reason
                    or c.urg_tx_end is not None):  # fmt: skip
                return -1  # (what process() took may have ended it: the general path says so)
            ring_write(hc.sndbuf, c.tx_app, data)
            actions: list[Action] = []
            c.written(n, actions)
            local = ex.local_peer(hc, c)
            armed = local and ex.cq.take_arm()
            try:
                if actions:
                    ex.execute(actions)
            finally:
                if local:
                    ex.local_end(armed)
        if hc.readiness is not None:
            ex.update_readiness(hc)
        return n

    def try_send(self, view: memoryview) -> int:
        """All of a non-empty ``view`` taken by :meth:`send_fast`, or -1 (the general path's
        turn): without the writer's lock, which is only looked at (a thread that holds it
        may be waiting inside: its order is kept)."""
        wlock = self.wlock
        if wlock.locked() or self.wr_shut:
            return -1
        ex = self.ex
        with ex.lock:
            c = ex.engine.conns.get(self.hc.conn_id)
            if (c is None or c.reset_reason or c.tx_flags or c.peer_closed
                    or wlock.locked()):  # fmt: skip
                return -1  # (a sender took the lock meanwhile: it may be waiting inside)
            n = self.send_fast(c, view)
        if n > 0:
            COUNTERS.tx_pd[n.bit_length()] += 1
        return n

    def _after_send(self, c: Connection) -> None:
        """After a send (lock held): a local peer takes it at once; readiness updated."""
        ex, hc = self.ex, self.hc
        if ex.local_peer(hc, c):
            ex.process()
        if hc.readiness is not None:
            ex.update_readiness(hc)

    def _wait_room(self, c: Connection, flags: int, timeout: float | None) -> None:
        COUNTERS.tx_buf_full_cnt += 1  # our send buffer is full (Linux rmb_tx.buf_full_cnt)

        def room() -> bool:
            return c.sndbuf_space() > 0 or bool(c.reset_reason) or c.peer_closed

        self._wait(room, deadline_of(flags, timeout))
        if c.reset_reason or c.peer_closed:
            raise ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")

    def _wait_peer(self, c: Connection) -> None:
        """Wait (at most :data:`PEER_READ_WAIT`) for room in the peer's RMBE."""
        def room() -> bool:
            return c.direct_room() > 0 or bool(c.reset_reason) or c.peer_closed

        self.progress.wait(self.hc, room, monotonic() + PEER_READ_WAIT)
        if c.reset_reason or c.peer_closed:
            raise ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")

    def _copy_in(self, c: Connection, view: memoryview, flags: int) -> int:
        """Copy what fits into the send buffer and let the engine RDMA-WRITE it."""
        ex, hc = self.ex, self.hc
        n = min(len(view), c.sndbuf_space())
        ring_write(hc.sndbuf, c.tx_app, view[:n])
        ex.execute(ex.engine.data_written(hc.conn_id, n, 0.0, bool(flags & _OOB)))
        self._after_send(c)
        return n

    def _wait(self, ready: Callable[[], bool], deadline: float | None) -> None:
        """Wait for ``ready()`` (lock held): ``BlockingIOError`` at once for a deadline of 0
        (``EBADF`` when the program closed the descriptor it was given), ``TimeoutError``
        after the deadline."""
        if deadline == 0.0:
            ex = self.ex
            ex.process()
            if not ready():
                readiness = self.hc.readiness
                if readiness is not None:
                    if readiness.lost():
                        raise OSError(errno.EBADF, "Bad file descriptor")
                    if readiness.settle():  # (a datagram for news taken before)
                        ex.look_again()
                        if ready():
                            return
                raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
            return
        if not self.progress.wait(self.hc, ready, deadline):
            raise TimeoutError("timed out")

    # ================================================================ receiving

    def recv_fast(self, c: Connection, out: memoryview, waitall: bool) -> int:
        """A read's common case in one step (lock held): bytes are there, no urgent byte
        among them, the RMBE not full (a full one is counted by the general path), and
        with ``waitall`` all of ``out`` there: copy them out and consume them (the
        consumer cursor update goes when due, :meth:`Connection.consumed`).

        :returns: the bytes copied, or -1 when the case does not apply (the general path
            then waits, stops at the urgent byte, or reads in pieces).
        """
        ex, hc = self.ex, self.hc
        rmb = hc.rmb
        read_fast = inplace.READ_FAST
        if read_fast is not None and (got := read_fast(c, rmb, out, waitall)) > 0:
            # (the lane's: the bytes copied out and consumed, no cursor update due)
            n = int(got)
            ex.wake.send_takes_standby = True
            if ex.local_peer(hc, c):
                ex.local_end(0)
            if hc.readiness is not None:
                ex.update_readiness(hc)
            return n
        cons = c.rx_cons
        avail = c.rx_prod - cons
        size = len(rmb)
        n = len(out)
        if (avail <= 0 or avail >= size or not n or c.urg_rx_pos is not None
                or (waitall and avail < n)):  # fmt: skip
            return -1
        n = min(n, avail)
        ring_read(rmb, cons, out[:n])
        ex.wake.send_takes_standby = True  # (a send after a read: Progress.send_ended)
        actions: list[Action] = []
        c.consumed(n, actions)
        if ex.local_peer(hc, c):  # (a consumer cursor update, when one went)
            armed = bool(actions) and ex.cq.take_arm()
            try:
                if actions:
                    ex.execute(actions)
            finally:
                ex.local_end(armed)
        elif actions:
            ex.execute(actions)
        if hc.readiness is not None:
            ex.update_readiness(hc)
        return n

    def try_read(self, out: memoryview, want: int) -> int:
        """Bytes that are there copied into ``out``, or -1 (the general path's turn); without
        the reader's lock, which is only looked at.  ``want``: the size asked for (``smcr
        stats`` counts requests by it)."""
        rlock = self.rlock
        if rlock.locked():  # another thread reads (and may wait): keep its order
            return -1
        ex = self.ex
        with ex.lock:
            c = ex.engine.conns.get(self.hc.conn_id)
            if c is None or rlock.locked():
                return -1
            n = self.recv_fast(c, out, False)
        if n > 0:
            COUNTERS.rx_pd[want.bit_length()] += 1
        return n

    def read_waiting(self, out: memoryview, waitall: bool) -> int:
        """A blocking read (no timeout) that waits for its bytes (``waitall``: all of ``out``):
        the thread that waited is the one that answers, and a round trip is two of these.
        Only with no other reader, on a connection whose bytes can all come (no EOF, reset
        or urgent byte, and with ``waitall`` fewer than the RMBE holds); -1 for anything
        else, then or after the wait (the general path takes over, and looks again)."""
        ex, hc, rlock = self.ex, self.hc, self.rlock
        if self.rd_shut or not try_take(rlock):
            return -1
        try:
            take(ex.lock)
            try:
                c = ex.engine.conns.get(hc.conn_id)
                if c is None or (waitall and len(out) >= len(hc.rmb)):
                    return -1
                need = len(out) if waitall else 1
                if not c.readable(need) and not ((w := waiter.WAIT_READABLE) and w(self, c, need)):
                    self.progress.wait(hc, lambda: c.readable(need), None)
                n = self.recv_fast(c, out, waitall)
            finally:
                give(ex.lock)
        finally:
            give(rlock)
        if n > 0:
            COUNTERS.rx_pd[len(out).bit_length()] += 1
        return n

    def recv_into(self, out: memoryview, want: int, flags: int, timeout: float | None) -> int:
        """Copy up to ``want`` bytes from our RMBE into ``out`` (``smc_rx_recvmsg``):
        MSG_PEEK, MSG_WAITALL, MSG_DONTWAIT, MSG_OOB as Linux handles them."""
        COUNTERS.rx_pd[want.bit_length()] += 1  # smcr stats: one add
        self.general_reads += 1
        if flags & _OOB:
            return self.recv_oob(out)
        ex, hc = self.ex, self.hc
        got = 0
        try:
            with self.rlock, ex.lock:
                c = ex.engine.conns.get(hc.conn_id)
                if c is None:
                    return 0
                part = out[:want] if want < len(out) else out
                if not flags & ~_WAITALL and (n := self.recv_fast(c, part, bool(flags))) >= 0:
                    return n  # the bytes were there (the common case)
                while got < want:
                    if c.rx_prod == c.rx_cons:
                        # after SHUT_RD what had arrived is still read, as Linux does
                        if c.peer_finished or self.rd_shut:
                            return got
                        if c.aborted:
                            if got or self.reset_told:  # told once, then the end (TCP's)
                                return got
                            self.reset_told = True
                            why = c.reset_reason or "peer aborted the connection"
                            raise ConnectionResetError(errno.ECONNRESET,
                                                       f"Connection reset by peer ({why})")
                        if c.peer_done or (got and not flags & _WAITALL):
                            return got
                        wcs = ex.look()  # news already there: no waiting machinery
                        if wcs:
                            ex.process(wcs)
                        else:
                            self._wait_data(c, flags, timeout)
                        continue
                    if not got and not flags & ~_WAITALL and (
                            n := self.recv_fast(c, part, bool(flags))) >= 0:
                        return n  # the bytes came while we waited
                    n = self._copy_out(c, out[got:want] if got or want < len(out) else out,
                                       flags)  # fmt: skip
                    if n == 0:
                        continue  # the urgent byte was taken out of the stream
                    got += n
                    if flags & _PEEK or not flags & _WAITALL:
                        break
                if ex.local_peer(hc, c):  # (a consumer cursor update, when one went)
                    ex.process()
                if hc.readiness is not None:
                    ex.update_readiness(hc)
        except ConnectionResetError:
            left_blocked_at_exit(self.stack)
            raise
        return got

    def _wait_data(self, c: Connection, flags: int, timeout: float | None) -> None:
        def readable() -> bool:
            return c.rx_prod > c.rx_cons or c.peer_done or bool(c.reset_reason)

        self._wait(readable, deadline_of(flags, timeout))

    def _copy_out(self, c: Connection, out: memoryview, flags: int) -> int:
        """Copy up to ``len(out)`` bytes from the RMBE (stops at an urgent byte)."""
        ex, hc = self.ex, self.hc
        cons = c.rx_cons
        avail = c.rx_prod - cons
        urg = c.urg_rx_pos
        force = False  # the consumer cursor goes at once (an urgent byte was read)
        if urg is not None and urg >= cons:
            if urg > cons:
                avail = min(avail, urg - cons)  # a read stops at the mark, as TCP's
            elif not self.oob_inline:  # the urgent byte itself: out of band, skip it
                if self.oob_read != urg:
                    self.oob = hc.rmb[urg % c.rmb.size]
                c.urg_rx_pos = None
                ex.execute(ex.engine.data_consumed(hc.conn_id, 1, monotonic(), True))
                return 0
            elif not flags & _PEEK:  # SO_OOBINLINE: read in the stream from the mark on
                c.urg_rx_pos = None
                force = True
        n = min(avail, len(out))
        rmb = hc.rmb
        if avail >= len(rmb):  # our RMB was full (Linux rmb_rx.buf_full_cnt)
            COUNTERS.rx_buf_full_cnt += 1
        ring_read(rmb, cons, out[:n])
        if not flags & _PEEK:
            actions: list[Action] = []
            c.consumed(n, actions, force)  # the engine's connection: no look-up per read
            if actions:
                ex.execute(actions)
        return n

    def recv_oob(self, out: memoryview) -> int:
        """``recv(MSG_OOB)``: the urgent byte, once (``EINVAL`` when there is none, or when
        it stays in the stream: ``SO_OOBINLINE``, as Linux's ``smc_rx_recv_urg``)."""
        if self.oob_inline:
            raise OSError(errno.EINVAL, "Invalid argument")
        ex, hc = self.ex, self.hc
        with ex.lock:
            c = ex.engine.conns.get(hc.conn_id)
            if (self.oob < 0 and c is not None and c.urg_rx_pos is not None
                    and c.urg_rx_pos != self.oob_read):  # fmt: skip
                self.oob_read = pos = c.urg_rx_pos
                self.oob = hc.rmb[pos % c.rmb.size]
            if self.oob < 0:
                raise OSError(errno.EINVAL, "Invalid argument")
            out[0] = self.oob
            self.oob = -1
            return 1

    # ================================================================ state

    def info(self) -> tuple[str, int, int] | None:
        """(state, RMB size, peer's RMB size) as ``smcss`` shows them, or None once released.
        Read without the runtime's lock (a glance, as ``smcss``'s): it may be asked from code
        that holds it, a handshake's outcome callback or a tap."""
        c = self.conn()
        if c is None:
            return None
        return c.state.value, c.rmb.size, c.peer_rmb_size

    def limit_sndbuf(self, size: int) -> int:
        """``SO_SNDBUF`` after the send buffer was allocated: what a send may have in flight
        from now on (as TCP's buffer shrinks; never beyond what was allocated).
        :returns: the limit now."""
        ex = self.ex
        with ex.lock:
            c = self.conn()
            if c is None:
                return size
            c.sndbuf_limit = size = min(size, c.sndbuf_size)
            ex.update_readiness(self.hc)
        return size

    def pending_reset(self, tcp_err: int) -> int:
        """``SO_ERROR`` in SMC-R mode: ECONNRESET once after the connection was reset (the
        peer's abort, its listener's close before accepting it, the link's end), as TCP
        reports a reset there once; else 0.  An event loop's non-blocking connect asks it
        when the socket is writable (tornado's does) and fails as over TCP.

        :param tcp_err: the TCP socket's own error (an abortive close resets it too),
            taken by the caller: so it is told once.
        """
        if self.reset_told:
            return 0
        if not tcp_err:
            ex = self.ex
            with ex.lock:
                ex.process()
                c = self.conn()
                if c is None or not c.aborted or c.peer_finished:
                    return 0
        self.reset_told = True
        return tcp_err or errno.ECONNRESET

    def readiness(self, blocking: bool) -> Readiness:
        """The connection's readiness descriptor (made on first use, with ``blocking`` as
        its ``O_NONBLOCK``)."""
        ex, hc = self.ex, self.hc
        with ex.lock:
            if hc.readiness is None:
                r = ex.adopt_readiness(hc)
                r.set_blocking(blocking)
                self.stack.readiness_watched()
                return r
            return hc.readiness

    # ================================================================ closing

    def shutdown(self, how: int) -> None:
        """SHUT_RD, SHUT_WR (the done-writing CDC after the send buffer, then TCP FIN, as
        Linux), SHUT_RDWR."""
        if how in (socket.SHUT_RD, socket.SHUT_RDWR):
            self.rd_shut = True
        if how in (socket.SHUT_WR, socket.SHUT_RDWR):
            self.wr_shut = True
            with self.ex.lock:
                self.ex.shutdown_write(self.hc)

    def close(self, linger: float | None) -> None:
        """The last holder closes (``smc_close_active``).

        Without ``SO_LINGER`` (``linger`` None), bytes still in the send buffer (the peer's
        RMBE is full) go in the background and ``close`` returns at once, as TCP's does
        (:meth:`Closing.close_later`).  With it, ``close`` waits its linger time for them,
        then, within the same time, for the peer to confirm the closing CDC
        (:func:`cdcs_done`); bytes still unsent when the linger time is over go in the
        background as without it (TCP's ``close`` returns then too, and its kernel sends
        on).  A linger time of 0 closes abortively (:meth:`Closing.abort`).
        The readiness descriptor goes at once, as a closed socket's descriptor does.
        """
        stack, ex, hc = self.stack, self.ex, self.hc
        with ex.lock:  # (one locked section: a close is on every connection's path)
            if linger == 0:
                stack.closing.abort(hc)
            elif linger is None and self._unsent():
                stack.closing.close_later(hc)  # the rest goes in the background, as TCP's
            else:
                wait = ex.config.close_wait_tx if linger is None else linger
                deadline = monotonic() + wait
                self._drain_tx(deadline)
                c = self.conn()
                if linger is not None and self._unsent():  # the linger time is over: the
                    stack.closing.close_later(hc)  # rest goes in the background, as TCP's
                else:
                    stack.closing.app_close(hc)  # (a local peer's closing CDC taken at once)
                    if c is not None:
                        self.progress.wait(hc, lambda: cdcs_done(c), deadline)
            stack.drop_readiness(hc)

    def _unsent(self) -> bool:
        """Whether bytes of the send buffer wait for the peer's room (lock held)."""
        self.ex.process()
        c = self.conn()
        return c is not None and c.tx_pending() > 0 and not (c.reset_reason or c.peer_closed)

    def _drain_tx(self, deadline: float) -> None:
        """Wait (lock held) until ``deadline`` for the send buffer to go out."""
        c = self.conn()
        if c is not None:
            self.ex.uncork(self.hc)  # (nothing follows: corked bytes go now)
            self.progress.wait(self.hc, lambda: c.tx_pending() == 0 or bool(c.reset_reason)
                               or c.peer_closed, deadline)  # fmt: skip

    def abort(self) -> None:
        """Abort the connection (a handshake nobody waits for any more made it)."""
        with self.ex.lock:
            self.stack.closing.abort(self.hc)

    def orphan(self, linger: float | None) -> None:
        """The socket was garbage-collected unclosed: the runtime closes the connection as
        ``close`` would (:meth:`Closing.orphan`); any thread, takes no lock."""
        self.stack.orphan(self.hc, linger)


class SocketCalls:
    """One socket object's hold on a connection, and its data calls (module docstring).

    :param path: the connection.
    :param timeout: the socket's timeout (the socket keeps it current).
    """

    def __init__(self, path: DataPath, timeout: float | None) -> None:
        self.path = path
        self.timeout = timeout
        self.closed = False
        """The socket was closed (or handed its connection on): calls fail with ``EBADF``."""
        self.forked = path.stack.pid != os.getpid()
        """This process is a forked child of the connection's: the connection is the
        parent's (its runtime drives it), and calls on it fail with ``EOPNOTSUPP``."""
        self.relay: Callable[[], Any] | None = None
        """A forked child's socket now relayed by the parent (``weakref.ref``), which a call
        kept from before the fork goes to (:mod:`smcr.socket.fork`)."""

    def _relayed(self) -> Any:
        """The socket that serves this hold's calls through the parent now, or None."""
        relay = self.relay
        return relay() if relay is not None else None

    def check(self) -> DataPath:
        """The connection, for a call of an open socket of this process.

        :raises OSError: ``EBADF`` once closed; ``EOPNOTSUPP`` in a forked child.
        """
        if self.closed:
            raise OSError(errno.EBADF, "Bad file descriptor")
        if self.forked:
            raise OSError(errno.EOPNOTSUPP, "this SMC-R connection belongs to the process "
                          "that forked this one: it cannot be used here")  # fmt: skip
        return self.path

    def deadline(self, flags: int) -> float | None:
        """When a call with ``flags`` gives up waiting (0: at once; None: never)."""
        return deadline_of(flags, self.timeout)

    def sendall(self, data: Any, flags: int = 0) -> None:
        """``socket.sendall`` (:meth:`_sendall`; an error keeps no hold on ``data``:
        :func:`release_frames`)."""
        try:
            self._sendall(data, flags)
        except OSError as exc:
            release_frames(exc)
            del data
            raise

    def send(self, data: Any, flags: int = 0) -> int:
        """``socket.send`` (:meth:`_send`; an error keeps no hold on ``data``)."""
        try:
            return self._send(data, flags)
        except OSError as exc:
            release_frames(exc)
            del data
            raise

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        """``socket.recv_into`` (:meth:`_recv_into`; an error keeps no hold on ``buffer``)."""
        try:
            return self._recv_into(buffer, nbytes, flags)
        except OSError as exc:
            release_frames(exc)
            del buffer
            raise

    def _sendall(self, data: Any, flags: int = 0) -> None:
        """``socket.sendall``."""
        if (not flags and SENDS_NOW and not (self.closed or self.forked)
                and (send_now := inplace.SEND_NOW) is not None and send_now(self.path, data) > 0):
            return  # (the common case whole, in C: DataPath.try_send's and what it calls)
        view = byte_view(data)
        flags = int(flags)
        if not flags and view and not (self.closed or self.forked) and (
                self.path.try_send(view) > 0):  # fmt: skip
            return
        if (sock := self._relayed()) is not None:
            type(sock).sendall(sock, data, flags)
            return
        wait_peer = self.timeout != 0.0 and not flags & (_DONTWAIT | _OOB)
        while view:  # (the socket's state looked at again for every piece)
            n = self.check().send(view, flags, self.timeout, wait_peer)
            view = view[n:]

    def _send(self, data: Any, flags: int = 0) -> int:
        """``socket.send``."""
        if (not flags and SENDS_NOW and not (self.closed or self.forked)
                and (send_now := inplace.SEND_NOW) is not None
                and (sent := int(send_now(self.path, data))) > 0):  # (as _sendall's)
            return sent
        view = byte_view(data)
        flags = int(flags)
        if not flags and view and not (self.closed or self.forked):
            n = self.path.try_send(view)
            if n > 0:
                return n
        if (sock := self._relayed()) is not None:
            result: int = type(sock).send(sock, data, flags)
            return result
        if not view:
            return 0
        return self.check().send(view, flags, self.timeout)

    def _recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        """``socket.recv_into``."""
        flags = int(flags)  # socket.MSG_* are enums: one conversion, not one per test
        out = byte_view(buffer)
        if nbytes < 0:
            raise ValueError("negative buffersize in recv_into")
        if nbytes > len(out):
            raise ValueError("buffer too small for requested bytes")
        want = nbytes or len(out)
        path = self.path
        if (not flags or flags == _WAITALL) and want and not (self.closed or self.forked):
            part = out[:want] if want < len(out) else out
            if self.timeout is None:  # (it takes what is there at once, as try_read would)
                n = path.read_waiting(part, bool(flags))
            else:
                n = -1 if flags else NOT_NOW
                news = self.timeout == 0.0  # (path.take_news says why)
                if n == NOT_NOW and READS_NOW and (read_now := inplace.READ_NOW) is not None:
                    n = int(read_now(path, part, want, news))  # (the common case whole)
                if n == NOT_NOW:
                    n = path.try_read(part, want)
                    if n < 0 and news:
                        path.take_news()
                        try:
                            n = path.try_read(part, want)
                        finally:
                            path.news_taken()
            if n > 0:
                return n
        if (sock := self._relayed()) is not None:
            got: int = type(sock).recv_into(sock, buffer, nbytes, flags)
            return got
        return self.check().recv_into(out, want, flags, self.timeout)

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        """``socket.recv``: a buffer the size of what is there when it is, not of
        ``bufsize``."""
        flags = int(flags)
        path = self.path
        if not flags and bufsize > 0 and not (self.closed or self.forked):
            got: Any = NOT_NOW
            if READS_NOW and (read_now := inplace.READ_NOW) is not None:  # (as _recv_into's)
                got = read_now(path, None, bufsize, self.timeout == 0.0)
                if isinstance(got, bytes):  # made the size of what was there
                    return got
            c = path.conn() if got == NOT_NOW else None  # (else nothing there, news taken)
            if c is not None:
                avail = c.rx_prod - c.rx_cons  # (a glance: try_read looks again, locked)
                took = avail <= 0 and self.timeout == 0.0
                if took:
                    path.take_news()
                    avail = c.rx_prod - c.rx_cons
                try:
                    if avail > 0:
                        buf = bytearray(min(avail, bufsize))
                        n = path.try_read(memoryview(buf), bufsize)
                        if n > 0:
                            if n < len(buf):
                                del buf[n:]
                            return bytes(buf)
                finally:
                    if took:
                        path.news_taken()
        if (sock := self._relayed()) is not None:
            data: bytes = type(sock).recv(sock, bufsize, flags)
            return data
        if bufsize < 0:
            raise ValueError("negative buffersize in recv")
        buf = bytearray(bufsize)
        n = self._recv_into(buf, bufsize, flags)
        del buf[n:]
        return bytes(buf)


#: The socket methods a :class:`SocketCalls` stands in for.
METHODS: Final = ("sendall", "send", "recv", "recv_into")


def deadline_of(flags: int, timeout: float | None) -> float | None:
    """When a call with ``flags`` on a socket with ``timeout`` gives up waiting."""
    if flags & _DONTWAIT or timeout == 0.0:
        return 0.0
    return None if timeout is None else monotonic() + timeout


def byte_view(data: Any) -> memoryview:
    """A flat unsigned-byte view of a bytes-like object (TypeError for anything else)."""
    kind = type(data)
    if kind is bytearray or kind is bytes:  # (flat bytes already: no format to look at)
        return memview(data)
    view = memview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


SENDS_NOW: Final = sender.bind(DataPath, byte_view)
"""``send`` and ``sendall`` try the lane's whole send first (:mod:`smcr.stack.sender`)."""
READS_NOW: Final = SENDS_NOW and reader.FOLLOW is not None
"""A non-blocking ``recv``/``recv_into`` tries the lane's read first (:mod:`smcr.stack.reader`)."""
waiter.WAIT_READABLE = waiter.bound()  # (after the send's and the read's: it reads theirs)
NOT_NOW: Final = -2
"""The lane's read declined: the Python reads."""


def cdcs_done(c: Connection) -> bool:
    """Whether every CDC of ``c`` completed (or the connection is gone): what ``close`` waits
    for after its closing CDC, as Linux's ``smc_close_wait_tx_pends``.

    Why: over RoCE a posted WRITE or CDC is not yet delivered (the window, the peer's ACK); a
    process that exits right after ``close`` takes its QP, and with it what is still unsent,
    along (the kernel keeps Linux's link alive instead).  The closing CDC is signaled, so its
    completion confirms all the connection's bytes and CDCs before it.  A peer that closed
    reads no more: nothing to wait for (it may be gone already, and would never confirm)."""
    return c.aborted or c.peer_closed or not any(entry[1] is c for entry in c.cdc_pending)


def left_blocked_at_exit(stack: Stack) -> None:
    """A daemon thread whose ``recv`` or ``send`` the links' end at exit would fail
    (:meth:`Stack.close_at_exit`) stays blocked instead, as in TCP's, until the process is
    gone, and so does any thread once a signal ends the process
    (:func:`smcr.exits.stays_parked`); called with no lock held.  Other threads, and every
    thread before the exit, get the error."""
    if stack.exiting and exits.stays_parked():
        threading.Event().wait()  # never set: the process ends around it


__all__ = ["METHODS", "PEER_READ_WAIT", "DataPath", "SocketCalls", "byte_view", "cdcs_done",
           "deadline_of", "left_blocked_at_exit"]  # fmt: skip
