"""SMC-R connections across ``fork``: the child that is handed one uses it through the parent.

A listening socket's accept queue pauses in a forking parent (:meth:`AcceptQueue.pause
<smcr.socket.acceptq.AcceptQueue.pause>`) until it accepts again.

An SMC-R connection lives in its process's runtime: the link group, the QP and
the thread that drives them are the parent's, and a forked child has none of
them.  Yet the classic forking server (``socketserver.ForkingMixIn``) accepts in
the parent, forks, serves the request in the child and closes the parent's copy
at once.  In the kernel both processes hold the same socket; here the parent
keeps the connection and relays it:

- Before every ``fork`` each open SMC-R socket of the process gets a Unix
  socket pair.  The child's end replaces the socket's descriptor in the child,
  where the socket is a plain stream from then on (its addresses, mode and
  codes are those of the SMC-R connection; TCP-level options are accepted and
  have no effect).  The parent keeps the other end, unused.
- Whichever closes first decides.  If the parent closes its socket while the
  child still holds its end, the parent hands the connection to a relay: two
  threads that copy bytes between the connection and the pair (EOF and
  shutdowns passed on, the connection closed when both directions are done or
  the child goes).  The peer keeps talking SMC-R with the parent's runtime.
  If the child has closed its end (or exited), the parent's close is the
  ordinary one.
- A parent that keeps using a connection keeps it: its child's end stays
  silent (two processes reading one stream is not something to relay).

So a connection costs a socket pair per fork while it is open in the parent;
a relayed one, two threads and a copy of each byte in the parent until the
child is done.  Nested forks need nothing more: the child's end is an ordinary
descriptor and is inherited as one.
"""

from __future__ import annotations

import os
import socket as _socket
import threading
import weakref
from typing import Any

from smcr.osthreads import NamedThread
from smcr.socket import sharing
from smcr.socket.base import PlainSocket, SocketBase, accept_queues, smc_sockets
from smcr.socket.numbers import own_number
from smcr.stack.descriptors import put_at

CHUNK = 1 << 16
"""Bytes a relay thread copies at a time."""


class ForkEnds:
    """The pair made for one socket before a fork: ``parent`` end and ``child`` end."""

    __slots__ = ("child", "parent")

    def __init__(self) -> None:
        self.parent, self.child = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)


def child_holds(end: _socket.socket) -> bool:
    """Whether the child still has its end open, or left bytes in it (non-blocking).

    A closed end reads as EOF (``b""``), not as an error: it is the child gone.
    """
    try:
        data = end.recv(1, _socket.MSG_PEEK | _socket.MSG_DONTWAIT)
    except BlockingIOError:
        return True  # open, silent
    except OSError:
        return False
    return bool(data)  # bytes from it: the child's request, relayed later; b"": gone


class Relay:
    """Copies bytes between an SMC-R connection (the parent's socket, taken over) and
    the parent's end of a pair whose other end a child uses."""

    def __init__(self, sock: SocketBase, end: _socket.socket) -> None:
        self.sock = sock
        self.end = end
        self.lock = threading.Lock()
        self.running = 2
        self.threads = [NamedThread(target=self._up, name="smcr-relay-up", daemon=True),
                        NamedThread(target=self._down, name="smcr-relay-down",
                                    daemon=True)]  # fmt: skip
        self.end.setblocking(True)
        self.sock.settimeout(None)

    def start(self) -> None:
        _relays.add(self)
        for t in self.threads:
            t.start()

    def _up(self) -> None:
        """Child -> peer: until the child's EOF, then done-writing to the peer."""
        try:
            while data := self.end.recv(CHUNK):
                self.sock.sendall(data)
            try:
                self.sock.shutdown(_socket.SHUT_WR)
            except OSError:
                pass
        except OSError:
            self._break()
        finally:
            self._done()

    def _down(self) -> None:
        """Peer -> child: until the peer's EOF, then EOF to the child; a reset of the
        connection ends the child's end at once."""
        try:
            while data := self.sock.recv(CHUNK):
                self.end.sendall(data)
            try:
                self.end.shutdown(_socket.SHUT_WR)
            except OSError:
                pass
        except OSError:
            self._break()
        finally:
            self._done()

    def _break(self) -> None:
        """One side failed (the peer reset, the child vanished): end both at once."""
        try:
            self.end.shutdown(_socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self.sock.shutdown(_socket.SHUT_RDWR)
        except OSError:
            pass

    def _done(self) -> None:
        with self.lock:
            self.running -= 1
            last = self.running == 0
        if last:
            self.end.close()
            self.sock.close()
            _relays.discard(self)


_relays: set[Relay] = set()
"""Relays at work (referenced here: their threads are all that uses them)."""


def prepare(sockets: list[SocketBase]) -> None:
    """Before ``fork`` (parent): a pair for each open SMC-R socket."""
    for sock in sockets:
        if sock._mode == "SMCR" and not sock._closed and not _forked(sock):
            try:
                ends = ForkEnds()
            except OSError:
                continue  # no descriptors left: the child cannot use it, as before
            sock._fork_ends = ends


def after_in_parent(sockets: list[SocketBase]) -> None:
    """After ``fork`` (parent): keep our end of each pair, among the earlier ones whose
    child still holds its end (the others are closed: a parent that keeps a connection
    open across many forks would otherwise keep a descriptor per fork)."""
    for sock in sockets:
        ends: ForkEnds | None = sock.__dict__.pop("_fork_ends", None)
        if ends is not None:
            ends.child.close()
            kept = []
            for end in sock._parent_ends:
                if child_holds(end):
                    kept.append(end)
                else:
                    end.close()
            sock._parent_ends = [*kept, ends.parent]


def after_in_child(sockets: list[SocketBase]) -> None:
    """After ``fork`` (child): each socket becomes a stream over its end of the pair; one
    without a pair stays the parent's (its calls raise ``EOPNOTSUPP``)."""
    for sock in sockets:
        ends: ForkEnds | None = sock.__dict__.pop("_fork_ends", None)
        for end in sock._parent_ends:  # pairs of earlier forks: the parent's business
            end.close()
        sock._parent_ends = []
        if ends is None:
            _mark_forked(sock)
            continue
        ends.parent.close()
        try:
            become_relayed(sock, ends.child)
        except OSError:  # (closed meanwhile): the others must still become relayed
            _mark_forked(sock)


def hand_over(sock: SocketBase) -> bool:
    """The parent closes ``sock``: if a child still holds its end of a pair, the
    connection goes to a relay for it (True); else the pairs go (False)."""
    ends, sock._parent_ends = sock._parent_ends, []
    holder = None
    for end in reversed(ends):  # the latest child first: it was forked to serve it
        if holder is None and child_holds(end):
            holder = end
        else:
            end.close()
    if holder is None:
        return False
    relayed = sharing.move(sock)
    relayed._closed = False  # (the caller's close() marked the original)
    Relay(relayed, holder).start()
    return True


def become_relayed(sock: SocketBase, end: _socket.socket) -> None:
    """In a forked child: this SMC-R connection is used through the parent, over
    ``end`` (:mod:`smcr.socket.fork`), which becomes this socket's descriptor."""
    addresses: tuple[Any, Any] = ("", "")
    try:  # (a TCP connection already shut has no peer)
        addresses = (PlainSocket.getsockname(sock), PlainSocket.getpeername(sock))
    except OSError:
        pass
    os.dup2(end.fileno(), PlainSocket.fileno(sock), inheritable=False)
    sock._tcp_hold = None  # (the number is this child's end now, not the runtime's TCP)
    if sock._shown >= 0 and sock._shown != PlainSocket.fileno(sock):
        # the number the program has names the parent's readiness descriptor: the relay
        put_at(sock._shown, end.fileno())
        own_number(sock, sock._shown)
    end.close()
    if sock._finalizer is not None:
        sock._finalizer.detach()
        sock._finalizer = None
    sock._relayed = addresses
    sock._mode = "TCP"  # a stream like any other from here on
    sock._unshadow_fast()
    if sock._calls is not None:  # a data call kept from before the fork: through the relay
        sock._calls.forked = True
        sock._calls.relay = weakref.ref(sock)
    sock._hc = sock._stack = sock._calls = None
    PlainSocket.settimeout(sock, sock._timeout)



def _forked(sock: SocketBase) -> bool:
    return sock._calls is not None and sock._calls.forked


def _mark_forked(sock: SocketBase) -> None:
    """The connection stays the parent's: the child's calls on it raise ``EOPNOTSUPP``."""
    if sock._calls is not None:
        sock._calls.forked = True


def _forking() -> None:
    prepare(list(smc_sockets))


def _forked_parent() -> None:
    for queue in list(accept_queues):
        if queue.pid == os.getpid():
            queue.pause()
    after_in_parent(list(smc_sockets))


def _forked_child() -> None:
    """In a forked child, the SMC-R connections of the parent are used through the
    parent: the runtime that drives them (its thread, its link groups) is not here, and
    driving them from two processes would corrupt both.  (TCP sockets, and listening
    SMC sockets, which start their own accept queue and runtime here, work as after any
    fork.)"""
    after_in_child(list(smc_sockets))
    smc_sockets.clear()


os.register_at_fork(before=_forking, after_in_parent=_forked_parent,
                    after_in_child=_forked_child)  # fmt: skip


__all__ = ["CHUNK", "ForkEnds", "Relay", "after_in_child", "after_in_parent", "hand_over",
           "prepare"]  # fmt: skip
