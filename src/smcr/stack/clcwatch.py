"""The TCP sockets a runtime watches: those of handshakes under way (their CLC messages), and
those of SMC-R connections (their peer's end).

Pollers sleep on the handshakes' sockets through one epoll descriptor (:attr:`ClcWatch.ep`):
one added wakes a poller already asleep by itself (a doorbell ring cost the poller a wasted
round: on every accepted connection, the thread in ``accept`` that polls).  The SMC-R
connections' sockets are in a second one (:attr:`ClcWatch.tcp_ep`), so that a poller's
sleep costs the same with a thousand connections as with one (each sleep used to register
every one of them in a new ``poll`` set).  A socket is
registered only while in :attr:`ClcWatch.watch`: it is let go (:meth:`ClcWatch.remove`)
before it is closed.  Feeding what they bring to the engine is the executor's
(:class:`~smcr.stack.executor.Executor`); this is the bookkeeping.
"""

from __future__ import annotations

import select

from smcr.rdma import doorbell
from smcr.stack.hostconn import HostConn


class ClcWatch:
    """Handshakes' TCP sockets by descriptor, and SMC-R connections' (module docstring)."""

    def __init__(self, watch_tcp: bool) -> None:
        self.watch: dict[int, HostConn] = {}
        self.ep = select.epoll()
        """The sockets of :attr:`watch` (module docstring)."""
        self.ends: dict[tuple[object, object], HostConn] = {}
        """Handshakes under way by their TCP connection's (ours, peer's) addresses: the
        other end of one is found when both ends are ours (:meth:`sent`)."""
        self.local: list[HostConn] = []
        """Handshakes of ours that CLC was sent to, to read it before ``execute`` returns."""
        self.feeding = False
        self.tcp: dict[int, HostConn] = {}
        """TCP sockets of SMC-R connections, watched for the peer's end; not over shm
        (``watch_tcp`` False), whose RNIC itself sees a peer process die."""
        self.tcp_ep = select.epoll()
        """The sockets of :attr:`tcp` (module docstring)."""
        self.watch_tcp = watch_tcp

    def add(self, hc: HostConn, ends: tuple[object, object] | None = None,
            register: bool = True) -> None:  # fmt: skip
        """Watch a handshake's TCP socket (made non-blocking) for CLC.

        :param ends: its (``getsockname()``, ``getpeername()``), when the caller has them.
        :param register: in :attr:`ep` now; False: the caller reads what is there first
            and then calls :meth:`register` (a server's handshake, whose client's Proposal is
            mostly there already: registered readable, it would wake the thread asleep on
            :attr:`ep` for a message this thread is about to read).
        """
        hc.tcp.setblocking(False)
        fd = hc.tcp.fileno()
        self.watch[fd] = hc
        if register:
            self._register_fd(fd)
        if ends is None:
            try:
                ends = (hc.tcp.getsockname(), hc.tcp.getpeername())
            except OSError:
                return
        hc.ends = ends
        self.ends[ends] = hc

    def register(self, hc: HostConn) -> None:
        """Put a handshake added unregistered (:meth:`add`) in :attr:`ep`, if it is still
        watched (lock held)."""
        fd = hc.tcp.fileno()
        if self.watch.get(fd) is hc:
            self._register_fd(fd)

    def _register_fd(self, fd: int) -> None:
        try:
            self.ep.register(fd, select.EPOLLIN)
        except FileExistsError:  # (a number registered before: never closed unwatched)
            self.ep.modify(fd, select.EPOLLIN)

    def remove(self, hc: HostConn) -> None:
        """The handshake reads no more CLC (lock held)."""
        fd = hc.tcp.fileno()
        if self.watch.pop(fd, None) is not None:
            try:
                self.ep.unregister(fd)
            except (OSError, ValueError):
                pass
        if hc.ends is not None:
            self.ends.pop(hc.ends, None)
            hc.ends = None

    def sent(self, hc: HostConn) -> None:
        """CLC went out on ``hc``'s TCP connection: if its other end is a handshake of this
        runtime too (both ends in one process), that end reads it before ``execute``
        returns -- as TCP over loopback has delivered when ``send`` returns.  Why: the
        server's handshake then ends, and its connection is in the accept queue, before
        the client's ``connect`` returns; a program that connects, talks, closes and then
        closes its listener (CPython's asyncio test_streams does) found it closed before
        it was queued, one time in four."""
        if hc.ends is None:
            return
        peer = self.ends.get((hc.ends[1], hc.ends[0]))
        if peer is not None and peer is not hc:
            self.local.append(peer)

    def watch_end(self, hc: HostConn) -> None:
        """Watch an SMC-R connection's TCP socket for the peer's end (:attr:`tcp`)."""
        fd = hc.tcp.fileno()
        self.tcp[fd] = hc
        try:
            self.tcp_ep.register(fd, select.EPOLLIN)
        except FileExistsError:
            self.tcp_ep.modify(fd, select.EPOLLIN)

    def unwatch_tcp(self, hc: HostConn) -> None:
        """Stop watching an SMC-R connection's TCP socket (before it is closed)."""
        fd = hc.tcp.fileno()
        if self.tcp.pop(fd, None) is not None:
            try:
                self.tcp_ep.unregister(fd)
            except (OSError, ValueError):
                pass

    def ended(self) -> list[HostConn]:
        """The SMC-R connections whose TCP socket became readable, watched no more (the
        caller looks at each, and watches it again if it was nothing)."""
        found: list[HostConn] = []
        for fd in doorbell.ready(self.tcp_ep):
            hc = self.tcp.pop(fd, None)
            try:
                self.tcp_ep.unregister(fd)
            except (OSError, ValueError):
                pass
            if hc is not None:
                found.append(hc)
        return found

    def close(self) -> None:
        """Close the epoll descriptors."""
        self.ep.close()
        self.tcp_ep.close()
