"""A descriptor whose readability and writability follow an SMC-R connection.

``fileno()`` of an SMC socket in SMC-R mode is one end of a unix socket pair that the
runtime makes readable (a byte is waiting) and writable (the other end drained) to
follow the connection, so that ``select``, ``poll``, ``epoll``, ``selectors`` and asyncio
watch it as they would a TCP socket.

Where the connection's other end is another process's, it is a unix datagram socket
bound to a name of the process's (:class:`smcr.rdma.bells.Names`) instead, alone.  Over
shm that other end can ring it (a *consumer bell*, :mod:`smcr.rdma.bells`): the peer that
sends the connection's next message makes it readable itself, and the program's thread
is the one woken.  It is made not writable by connecting it to the process's
:class:`FullPeer` (Linux's ``unix_dgram_poll`` reports a datagram socket not writable
while the peer it is connected to has a full queue and is not connected back), and
writable again by disconnecting it, which wakes its pollers; the full peer, the one
socket that may send to it meanwhile, rings it when it turns readable.  One descriptor
per connection, where a pair (or a sink of its own to fill) costs two.  (Only there: a
datagram socket cannot take what a stream socket takes -- an ``os.sendfile`` to the
number, which asyncio's tests make with both ends in one process, fails.  A non-blocking
``connect``'s descriptor, which becomes the connection's, is named where no listener of
this process takes the connection.)  The bell is armed (its watch word set) only while
a message could change nothing but readability: not readable, writable, no bytes of
ours waiting for the peer's window (a window update rung to a program that waits for
writability only would be heard by no one).
"""

from __future__ import annotations

import _socket
import atexit
import errno
import os
import socket
from collections import deque
from typing import Final

from smcr import plainsock
from smcr.bound import monotonic
from smcr.core.connection import Connection
from smcr.rdma import doorbell
from smcr.rdma.bells import NAMES, WatchSlot
from smcr.rdma.completion import CompletionQueue
from smcr.stack.counters import COUNTERS
from smcr.stack.descriptors import put_at

_DONTWAIT: Final = socket.MSG_DONTWAIT
_FILL: Final = bytes(65536)
"""More than the not-writable fill takes (``a``'s send buffer is the smallest the kernel
allows): one non-blocking send of it stops short, which says the queue is full."""
_DRAIN: Final = 65536
"""A read of the fill (a few KiB): one that comes back short has emptied the queue."""
_DRAIN_READABLE: Final = 64
"""A read of the readable byte (one per change to readable)."""


class FullPeer:
    """A unix datagram socket whose receive queue is kept full (a second socket's datagrams,
    never read, past ``net.unix.max_dgram_qlen``): a named readiness descriptor connected
    to it is not writable.  It also rings those (a connected datagram socket takes
    datagrams from its peer only): its send buffer as large as the kernel allows, each
    ring counted against it until read (thousands where the process may raise its
    buffer past the system's limit, a few hundred where not; :func:`full_peer` makes
    another when it is full).  Names are per network namespace: one per namespace, made
    in it (a thread may be in another namespace than the process)."""

    def __init__(self) -> None:
        self.sock = plainsock.datagram()
        self.fillers: list[_socket.socket] = []
        try:
            self.sock.bind(b"")  # (an abstract name of the kernel's choosing)
            self.name: bytes = self.sock.getsockname()
            plainsock.widen_send_buffer(self.sock)
            probe = plainsock.datagram()
            try:
                probe.connect(self.name)
                while _writable(probe):  # (a filler's send buffer may end before the queue)
                    if len(self.fillers) >= _MAX_FILLERS:
                        raise OSError(errno.ENOBUFS, "cannot fill a datagram queue")
                    filler = plainsock.datagram()
                    self.fillers.append(filler)
                    try:
                        while True:
                            filler.sendto(b"f", self.name)
                    except BlockingIOError:
                        pass
            finally:
                probe.close()
        except OSError:
            self.close()
            raise

    def close(self) -> None:
        for sock in (self.sock, *self.fillers):
            sock.close()


_MAX_FILLERS: Final = 64
_FULL_PEERS: dict[tuple[int, int], list[FullPeer]] = {}
"""The process's full peers by network namespace, the newest last (made on first use)."""


def full_peer(netns: tuple[int, int], fresh: bool = False) -> FullPeer:
    """The full peer of network namespace ``netns`` (:func:`netns_of`) to connect to and
    ring with (``fresh``: a new one, the newest's send buffer being full of unread rings).

    :raises OSError: where none can be made (out of descriptors, no datagram queue that
        fills, or this thread in another namespace)."""
    peers = _FULL_PEERS.get(netns)
    if peers and not fresh:
        return peers[-1]
    here = plainsock.datagram()
    try:
        if netns_of(here) != netns:
            raise OSError(errno.EXDEV, "a full peer is made in its own network namespace")
    finally:
        here.close()
    peer = FullPeer()
    _FULL_PEERS.setdefault(netns, []).append(peer)
    return peer


@atexit.register
def _close_full_peers() -> None:
    while _FULL_PEERS:
        for peer in _FULL_PEERS.popitem()[1]:
            peer.close()


_SO_NETNS_COOKIE: Final = 71
"""(Linux 5.14) a socket's network namespace, as a number no other namespace gets."""


def netns_of(sock: _socket.socket) -> tuple[int, int]:
    """The network namespace ``sock`` was made in (the calling thread's then): (0, its
    cookie), where the kernel has them; else the calling thread's now, (device, inode) of
    its ``ns/net`` -- a look-up through procfs, about 10 us where the cookie costs one
    ``getsockopt`` (every named readiness descriptor asks, in the thread that accepts)."""
    try:
        cookie = sock.getsockopt(socket.SOL_SOCKET, _SO_NETNS_COOKIE, 8)
    except OSError:
        try:
            st = os.stat("/proc/thread-self/ns/net")
        except OSError:
            return (0, 0)
        return (st.st_dev, st.st_ino)
    return (0, int.from_bytes(cookie, "little"))


def _writable(sock: _socket.socket) -> bool:
    return plainsock.ready(sock, write=True)


CHECK_DELAY: Final = 0.1
"""Seconds a descriptor turned readable on a peer's ring, by news that another call
took, is trusted before its datagram is looked for (:class:`DeferredChecks`)."""
CHECK_GRAIN: Final = 0.025
"""Checks fall due on multiples of this (seconds), up to that much after their
:data:`CHECK_DELAY`: those of one interval share a time, and the thread asleep until the
next (the progress thread, bounded by :attr:`DeferredChecks.due`) wakes once for them.
Due each at its own time, a thousand busy connections' checks woke it hundreds of times a
second, each wake-up taking the lock and the GIL from the event loop's thread."""


class DeferredChecks:
    """Descriptors readable on a peer's ring whose datagram nobody looked for yet, each
    looked for :data:`CHECK_DELAY` after it turned readable.

    Why later: news taken by another connection's call (an event loop's read of one
    connection takes every connection's CDCs) turns a descriptor readable whose datagram
    is nearly always there already, and which the program reads, and so drains, within
    its current round of events; a look at once (``recv(MSG_PEEK)``) cost a system call
    for most messages at a thousand busy connections.  The look still comes, for the
    rare datagram that never does (a requester that died between taking the arm and
    sending, or whose send failed and which rang the CQ instead): that descriptor turns
    readable :data:`CHECK_DELAY` late.  The runtime runs :meth:`run` among its timers
    (lock held) and bounds its pollers' sleep by :attr:`due`.
    """

    def __init__(self) -> None:
        self.pending: deque[tuple[float, Readiness]] = deque()
        """(when to look, descriptor), oldest first."""
        self.due = 0.0
        """When :meth:`run` looks next (``time.monotonic()``), 0.0 while none waits."""

    def add(self, r: Readiness) -> None:
        """Look for ``r``'s datagram later (once, however often it is added meanwhile)."""
        if not r.check_pending:
            r.check_pending = True
            due = -(-(monotonic() + CHECK_DELAY) // CHECK_GRAIN) * CHECK_GRAIN
            self.pending.append((due, r))
            if not self.due:
                self.due = due

    def run(self, now: float) -> None:
        """Look for the datagrams of those due and still unchecked (lock held)."""
        if not self.due or now < self.due:
            return
        pending = self.pending
        while pending and pending[0][0] <= now:
            r = pending.popleft()[1]
            r.check_pending = False
            r.check()
        self.due = pending[0][0] if pending else 0.0


class Readiness:
    """A descriptor whose readability/writability the runtime sets (see module doc).

    Readable: a datagram (a byte of a socket pair) waits in ``a``.  Not writable: ``a``
    has filled ``b``'s queue, writable again once ``b`` is drained; named, ``a`` is
    connected to the :class:`FullPeer`, writable again once disconnected.
    """

    def __init__(self, named: bool = False) -> None:
        """:param named: a datagram socket with a name where the process has names (module
            doc), for a connection whose peer can ring it; else, or where its name cannot
            be bound, a socket pair."""
        self.rid = NAMES.new_rid() if named else 0
        """The descriptor's rid (its name, :class:`~smcr.rdma.bells.Names`); 0: a pair."""
        self.a: _socket.socket
        self.b: _socket.socket | None = None
        """A pair's other end (a named descriptor has none)."""
        self.name = b""
        """A named descriptor's name."""
        self.peer: FullPeer | None = None
        """The full peer a named descriptor is connected to while not writable."""
        self.netns = (0, 0)
        """A named descriptor's network namespace (its name's, and its full peer's)."""
        if self.rid:
            self.name = NAMES.name(self.rid)
            self.a = plainsock.datagram()
            self.netns = netns_of(self.a)
            try:
                self.a.bind(self.name)
                full_peer(self.netns)  # (made now: without one, a pair)
            except OSError:  # (a name taken by another: a pair, as where names are none)
                self.a.close()
                self.rid = 0
        if not self.rid:
            self.a, self.b = plainsock.nonblocking_pair()
        self.bell: WatchSlot | None = None
        """The consumer bell (:meth:`attach`)."""
        self.cq: CompletionQueue | None = None
        self.failed = False
        """:meth:`fail` made it ready for good (a named descriptor: later sets change nothing)."""
        self.looks = False
        """The bell was armed, or taken back after a peer rang it: the caller looks at the
        CQ (what the peer placed may have rung nobody else)."""
        self.defer_check = False
        """A reader that took the CQ's news and reads at once (:meth:`DataPath.take_news
        <smcr.stack.conn.DataPath.take_news>`): turning readable on a peer's ring, trust
        it for now (:attr:`unchecked`), as the read most likely turns it unreadable again."""
        self.unchecked = False
        """Readable on a peer's ring whose datagram nobody looked for yet (:meth:`check`)."""
        self.later: DeferredChecks | None = None
        """Where a ring taken by news that another call took is checked (:meth:`attach`);
        None: at once."""
        self.check_pending = False
        """In :attr:`later`'s list."""
        self.a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1024)
        self.readable = False
        self.writable = True
        st = os.fstat(self.a.fileno())
        self.file = (st.st_dev, st.st_ino)
        """(device, inode) of the descriptor's file: whether a number names it."""
        self.app = -1
        """The application's number for ``a``'s file (:meth:`fileno`), -1 before it asks."""

    def attach(self, cq: CompletionQueue, token: int,
               later: DeferredChecks | None = None) -> None:  # fmt: skip
        """Give the descriptor the consumer bell ``cq`` has for the connection whose alert
        token is ``token`` (0: none, the other end is in this process), if it has one (a
        named descriptor, a CQ whose peers ring by name, the slot free); ``cq`` gets it
        back at :meth:`close`.  ``later``: where rings are checked that news taken by
        another call turned readable (None: at once)."""
        self.later = later
        if self.rid and token and self.bell is None and not self.failed:
            bell = cq.watch(token, self.rid)
            if bell is not None:
                self.bell, self.cq = bell, cq

    def follow(self, c: Connection | None) -> bool:
        """Follow the connection (None: gone, ready for good).  Returns whether the caller
        must look at the CQ now (:attr:`looks`)."""
        if c is None:
            self.set(True, True)
        else:
            self.set(c.rx_available() > 0 or c.peer_done or bool(c.reset_reason),
                     c.sndbuf_space() > 0 or bool(c.tx_flags) or bool(c.reset_reason),
                     c.tx_app == c.tx_sent and not c.tx_flags)  # fmt: skip
        looks, self.looks = self.looks, False
        return looks

    def lost(self) -> bool:
        """Whether the application's descriptor was closed under us (``os.close`` of
        what ``fileno()`` gave) or now names another file: a socket's would-block path
        asks, so that its call fails with ``EBADF`` as one on the closed descriptor of
        a TCP socket does (one ``fstat``, only where the call would block anyway)."""
        return self.app >= 0 and not self._names_ours(self.app)

    def _names_ours(self, number: int) -> bool:
        try:
            st = os.fstat(number)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self.file

    def set_blocking(self, blocking: bool) -> None:
        """Give the application's descriptor the socket's blocking mode (``O_NONBLOCK``),
        for programs that look at the flag of what ``fileno()`` returned; the runtime's
        own reads and writes of it never block either way."""
        try:
            os.set_blocking(self.a.fileno(), blocking)
        except OSError:
            pass

    def fileno(self) -> int:
        """The application's descriptor: a number of its own for ``a``'s file, apart from
        the one the runtime reads and writes, so that a program that closes what it was
        given (``os.close(sock.fileno())``) never has the runtime write into whatever
        file takes that number next."""
        if self.app < 0:
            self.app = os.dup(self.a.fileno())
        return self.app

    def place(self, number: int) -> None:
        """Give the application this descriptor under ``number`` from now on (whatever it
        named before goes: :func:`smcr.stack.descriptors.put_at`)."""
        put_at(number, self.a.fileno())
        if self.app >= 0 and self.app != number:
            try:
                os.close(self.app)
            except OSError:
                pass
        self.app = number

    def disown(self) -> None:
        """The application's number names another file now (the socket's TCP socket):
        :meth:`close` leaves it alone."""
        self.app = -1

    def set(self, readable: bool, writable: bool, quiet: bool = False) -> None:
        """Make the descriptor's readiness match (syscalls only on a change).

        Writability first: a connect that settles turns writable before readable, so
        a program waiting for ``EPOLLOUT`` never sees ``EPOLLIN`` alone meanwhile (a
        loop that counts wakeups, or one that reads on ``EPOLLIN`` only, took such an
        in-between state for the socket's: the thread setting it may wait for the GIL
        while the program polls and spins).

        :param quiet: nothing of ours waits for the peer (module doc: a consumer bell
            is armed only then).
        """
        if self.rid:
            if not self.failed:
                self._set_named(self.bell, readable, writable, quiet)
            return
        # (each loop ends on a short count, not on EAGAIN: an exception per change, each
        # message's readable -> unreadable among them, cost more than its system call)
        b = self.b
        if writable != self.writable and b is not None:
            self.writable = writable
            if writable:
                try:
                    while len(b.recv(_DRAIN, _DONTWAIT)) == _DRAIN:
                        pass
                except OSError:
                    pass
            else:
                try:
                    while self.a.send(_FILL, _DONTWAIT) == len(_FILL):
                        pass
                except OSError:
                    pass
        if readable != self.readable:
            self.readable = readable
            if readable:
                self._ring_self()
            else:
                while doorbell.drain(self.a) == doorbell.DRAIN_MOST:
                    pass

    def _set_named(self, bell: WatchSlot | None, readable: bool, writable: bool,
                   quiet: bool) -> None:  # fmt: skip
        """:meth:`set` for a named descriptor, with its consumer bell if it has one."""
        if writable != self.writable:
            self.writable = writable
            if writable:
                self._leave_full_peer(readable and self.readable)
            else:
                self._join_full_peer()
        if readable != self.readable:
            self.readable = readable
            if readable:
                # rung by the peer already (it took the arm), unless its datagram never
                # came (it died between the two steps, or could not send: bells.py), or
                # cannot come (connected to the full peer just now: only it may send)
                if bell is None or not bell.armed or bell.take() or self.peer is not None:
                    rung = False
                else:
                    COUNTERS.bell_cnt += 1
                    later = self.later
                    if self.defer_check:
                        rung = self.unchecked = True
                    elif later is not None:
                        rung = self.unchecked = True
                        later.add(self)
                    else:
                        rung = self._queued()
                if not rung:
                    self._ring_self()
            else:
                self.unchecked = False  # (the drain takes the datagram, come or not)
                doorbell.drain(self.a)
        if bell is None:
            return
        arm = quiet and writable and not readable
        if arm != bell.armed:
            if arm:
                bell.arm()
                self.looks = True
            elif not bell.take():
                self.looks = True  # (a peer rang: its message waits for a look)

    def check(self) -> None:
        """Readable on a peer's ring taken on trust (:attr:`defer_check`) and still
        readable: make sure the datagram came (a peer that died between taking the bell
        and sending it), else ring ``a`` ourselves (lock held)."""
        if self.unchecked:
            self.unchecked = False
            if self.readable and not self.failed and not self._queued():
                self._ring_self()

    def _join_full_peer(self) -> None:
        """Not writable: connected to the full peer (which only may ring it meanwhile)."""
        try:
            peer = full_peer(self.netns)
            self.a.connect(peer.name)
        except OSError:
            return
        self.peer = peer

    def _leave_full_peer(self, stays_readable: bool) -> None:
        """Writable again: disconnected from the full peer, which wakes its pollers.  Linux
        drops a datagram socket's queue when it leaves its peer (``unix_dgram_disconnected``):
        one that stays readable is rung again."""
        if self.peer is None:
            return
        self.peer = None
        try:
            plainsock.disconnect(self.a)
        except OSError:
            return
        if stays_readable:
            self.unchecked = False
            self._ring_self()

    def _ring_self(self) -> None:
        """Make ``a`` readable: a byte (a datagram) from ``b``; named, from itself, or,
        not writable, from its full peer (no other may send to it then)."""
        b = self.b
        if b is not None:
            doorbell.ring(b)
            return
        peer = self.peer
        err = doorbell.ring_to(self.a if peer is None else peer.sock, self.name)
        if err == errno.EAGAIN:  # (the full peer's send buffer holds as many rings as it may)
            self._ring_past_full_peer()

    def _ring_past_full_peer(self) -> None:
        """Ring through a fresh full peer, connected to it instead; where none can be made
        (this thread in another namespace), leave the full peer and ring itself: writable
        before its time (a program's send finds no room) rather than never readable."""
        try:
            fresh = full_peer(self.netns, fresh=True)
            self.a.connect(fresh.name)
            self.peer = fresh
            fresh.sock.sendto(b"r", _DONTWAIT, self.name)
            return
        except OSError:
            pass
        self.peer = None
        try:
            plainsock.disconnect(self.a)
            self.a.sendto(b"r", _DONTWAIT, self.name)
        except OSError:
            pass

    def _queued(self) -> bool:
        """Whether a datagram waits on ``a``."""
        return doorbell.queued(self.a)

    def settle(self) -> bool:
        """A call found nothing to do where the descriptor may have said otherwise: a
        datagram that came after its message was taken (or a stranger's) goes, and a bell
        a requester took meanwhile is armed afresh.  Returns whether the caller must look
        at the CQ (what that requester placed)."""
        if not self.rid or self.readable:
            return False
        _drain(self.a)
        bell = self.bell
        if bell is None or not bell.armed or bell.holds():
            return False
        bell.arm()
        return True

    def fail(self) -> None:
        """Ready for good, as a TCP socket whose connect failed: readable, writable, and
        ``EPOLLERR``/``EPOLLHUP`` in poll (a program waiting for either wakes as over TCP).

        How: ``b`` goes while it holds unread bytes of ``a``'s (the not-writable fill),
        and Linux then gives ``a`` the error ``ECONNRESET`` (``unix_release_sock``) and
        both shutdowns; ``b``'s queue freed makes ``a`` writable.  Later :meth:`set`
        calls change nothing (``b`` is closed: their sends and drains fail quietly)."""
        if self.rid:
            self._fail_named()
            return
        if self.writable:
            self.set(self.readable, False)  # (``b`` must hold unread bytes)
        try:
            if self.b is not None:
                self.b.close()  # (one change: all of a's events at once)
        except OSError:
            pass
        self.readable = self.writable = True

    def _fail_named(self) -> None:
        """:meth:`fail` for a named descriptor.  Linux gives a datagram socket ``EPOLLERR``
        (``ECONNRESET``) when the socket it is connected to, and that is connected to it,
        disconnects with datagrams unread (``unix_dgram_disconnected``): so ``a`` and a
        socket made for the purpose connect to each other, ``a`` sends it one, and it
        disconnects (and goes).  Readable first, and shut for reading before it leaves
        its peer (which drops its queue): every state a poller may see on the way has
        ``EPOLLIN`` (Twisted's poll reactor takes ``EPOLLERR`` without it for a lost
        connection, not for the connect's failure).  Writable last, after the error and
        the shutdown for writing (``EPOLLHUP``): until then a datagram of ``a``'s fills
        its send buffer (``unix_writable``) from the queue of another socket, which then
        goes.  (Writable any earlier, a poller woken by it saw ``EPOLLOUT`` without
        ``EPOLLERR``, a refused connect that looked like a made one: the kernel frees the
        resetting socket's queue, and wakes ``a``'s pollers, before it sets the error.)"""
        self._give_bell_back()
        if not self.readable:
            self.set(True, self.writable)
        try:
            self.a.shutdown(socket.SHUT_RD)
        except OSError:
            pass
        resetter = holder = None
        try:
            holder = plainsock.datagram()
            holder.bind(b"")
            _fill_send_buffer(self.a, holder.getsockname())
            resetter = plainsock.datagram()
            resetter.bind(b"")
            self.a.connect(resetter.getsockname())
            self.peer = None
            resetter.connect(self.name)
            self.a.send(b"f", _DONTWAIT)
            plainsock.disconnect(resetter)
        except OSError:
            pass
        finally:
            if resetter is not None:
                resetter.close()
        try:
            self.a.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        if holder is not None:
            holder.close()
        self.failed = True
        self.readable = self.writable = True

    def _give_bell_back(self) -> None:
        """The bell goes back to its CQ (taken back, if armed): no peer rings it again."""
        if self.bell is not None and self.cq is not None:
            self.cq.unwatch(self.bell)
        self.bell = self.cq = None

    def close(self) -> None:
        """Release both ends (the application's end may have been closed under us by a
        program that closes the descriptors it was given)."""
        for end in (self.a, self.b):
            try:
                if end is not None:
                    end.close()
            except OSError:
                pass
        self._give_bell_back()
        app, self.app = self.app, -1
        if app >= 0 and self._names_ours(app):  # (not a number closed and taken since)
            try:
                os.close(app)
            except OSError:
                pass


def _fill_send_buffer(sock: _socket.socket, to: bytes) -> None:
    """Send ``to`` one datagram of a quarter of ``sock``'s send buffer, which makes
    ``sock`` not writable while it waits there (Linux: writable while what its unread
    datagrams take is at most a quarter of the buffer) and leaves room to send more."""
    size = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) // 4
    try:
        sock.sendto(bytes(size), _DONTWAIT, to)
    except OSError:
        pass


def _drain(sock: _socket.socket) -> None:
    """Read a datagram socket's queue empty."""
    try:
        while True:
            sock.recv(_DRAIN_READABLE, _DONTWAIT)
    except OSError:
        pass
