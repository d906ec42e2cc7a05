"""The accept queue of a listening SMC socket: handshakes run side by side in the background
from ``listen`` on, and ``accept`` takes what has finished (Linux's listen worker,
``smc_tcp_listen_work``, and accept queue).
"""

from __future__ import annotations

import errno
import os
import selectors
import socket as _socket
import sys
import threading
import time
import traceback
import weakref
from collections import deque
from typing import Any

from smcr import discovery
from smcr.osthreads import NamedThread, NamedTimer
from smcr.socket import handshake, unserved
from smcr.socket.base import LINGER_ZERO, PlainSocket, SocketBase, new_socket
from smcr.socket.headroom import descriptor_shortage, descriptors_free
from smcr.stack.hostconn import HostConn
from smcr.stack.readiness import Readiness
from smcr.stack.runtime import Stack
from smcr.stack.watcher import get_watcher
from smcr.wire.decline import DeclineCode

MAX_QUEUED = 4096
"""Connections an accept queue holds (handshakes included) before it leaves the rest to
the kernel: a bound for floods (each SMC-R one holds an RMB and a send buffer)."""


INLINE_HEADROOM = 8
"""Descriptors free for an accept queue to accept in the background again after the process
ran out: a connection's (TCP's, the runtime's copy, the readiness pair) and some to spare."""


INLINE_RECHECK = 0.05
"""Seconds between looks at the free descriptors while the kernel holds a connection and
``accept`` takes them itself."""


_BY_PORT: dict[int, weakref.WeakSet[AcceptQueue]] = {}
"""This process's accept queues by port (:func:`local_connect_begins`)."""


def local_connect_begins(address: Any) -> list[AcceptQueue]:
    """A thread of this process is about to connect to ``address`` without blocking (a
    blocking connect may wait, and the listener would wait with it): the accept queues of
    this process on that port leave the next connections to it (:meth:`AcceptQueue.
    begin_local_connect`) until :func:`local_connect_ends`.  Both ends of a connection in
    one process then start their handshakes in the connecting thread, one after the
    other, instead of the watcher thread taking the GIL from it about ten times a
    connection (each a sleep and a wake-up of both: ~15% of such a connection's CPU)."""
    if not _BY_PORT:
        return []
    try:
        queues = _BY_PORT.get(int(address[1]))
    except (TypeError, IndexError, ValueError):
        return []
    return [q for q in list(queues) if q.begin_local_connect()] if queues else []


def local_connect_ends(queues: list[AcceptQueue], established: bool) -> None:
    """The connect of :func:`local_connect_begins` returned: if it is established, the
    queues accept what the kernel holds now, in this thread (the connecting thread then
    starts the client end, whose CLC messages reach the server end at once); either way
    the watcher watches them again."""
    for queue in queues:
        queue.end_local_connect(established)


class AcceptQueue:
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

    ``SMC_LIMIT_HS``: while a listener that set it has as many handshakes running as
    its listen backlog, new clients get a SYN-ACK without the SMC option and stay
    TCP (:meth:`_limit_handshakes`).  Linux asks whether its handshake workqueue is
    congested, for all listeners at once; here each listener's handshakes are its own.
    """

    def __init__(self, listener: SocketBase) -> None:
        self.pid = os.getpid()
        # our own descriptor of the listening socket (non-blocking; the listener's
        # timeout applies to take()): nothing here keeps the listener object alive,
        # so one dropped unclosed is collected, and its finalizer closes this too
        self.sock = PlainSocket(fileno=os.dup(PlainSocket.fileno(listener)))
        self.sock.setblocking(False)
        self.fd = self.sock.fileno()
        self.family, self.type, self.proto = listener.family, listener.type, listener.proto
        self.cls = type(listener)  # (smcr run's socket class: its settings too)
        self.listener = weakref.ref(listener)  # its buffer sizes, set after listen() too
        handshake.stack_here(listener)  # bound to one address: its runtime
        self.stack = listener._stack
        self.polled: Stack | None = self.stack
        """The runtime :meth:`_poll` polls: the listener's, or on a wildcard address the
        one of its latest handshake."""
        self.backlog = MAX_QUEUED
        self.ready: deque[tuple[SocketBase, Any]] = deque()
        self.pending = 0
        self.hs_limit = max(1, listener._backlog)
        self.port = int(PlainSocket.getsockname(listener)[1])
        self.congested = False
        """Counted in the ports map as a congested listener (:meth:`_limit_handshakes`)."""
        self.error: OSError | None = None
        self.lock = threading.RLock()
        """``cond``'s lock, taken as ``with self.lock`` (a Condition's ``__enter__`` and
        ``__exit__`` are two interpreted calls each time)."""
        self.cond = threading.Condition(self.lock)
        self.readiness = Readiness()
        self.readiness.set(False, False)
        self.closed = False
        self.watching = False
        self.paused = False
        self.takers = 0
        """Threads in :meth:`take` that poll the runtime (:meth:`_poll`)."""
        self.sleepers = 0
        """Threads in :meth:`take` that wait on :attr:`cond` (notified only then: a
        ``notify_all`` is two interpreted calls, twice a connection)."""
        self.kernel_waiting = False
        """Paused or inline: the kernel holds a connection (:meth:`_on_readable_paused`)."""
        self.inline = False
        """After the kernel's accept ran out of descriptors: ``accept`` itself takes the
        next connection from the kernel (:meth:`_accept_inline`), and the watcher only
        makes :meth:`fileno` readable when one waits."""
        self.holders = 1
        """Socket objects listening with this queue: the listener, and those made from its
        ``fileno()`` (``dup``, ``socket.fromfd``); the last to let go closes it."""
        self.local_connects = 0
        """Connects of this process to this queue under way (:func:`local_connect_begins`)."""
        self.deferred = False
        """The watcher left the listener to them (:meth:`_on_watched`)."""
        self._watch()
        _BY_PORT.setdefault(self.port, weakref.WeakSet()).add(self)

    def fileno(self) -> int:
        """Readable while a connection (or an error) waits for ``accept``."""
        number = self.readiness.fileno()
        self.show()
        return number

    def show(self) -> None:
        """The program has a number for the readiness descriptor now (:meth:`fileno`,
        :func:`smcr.socket.numbers.reshow`): bring it up to date.  Until then :meth:`_changed`
        leaves it alone: a program that only calls ``accept`` saves the three system
        calls per connection of making it readable and unreadable again."""
        with self.lock:
            self.readiness.set(self._readable(), False)

    def _watch(self) -> None:
        self.watching = True
        get_watcher().watch(self.fd, selectors.EVENT_READ, self._on_watched)

    def _on_watched(self) -> None:
        """The kernel has a connection (watcher thread): accept it, unless a connect of this
        process to this queue is under way; then that thread accepts, and watching stops
        until it is done (the listener stays readable: epoll would call again and again)."""
        with self.lock:
            if self.local_connects:
                self.deferred = True
                get_watcher().unwatch(self.fd)
                return
        self._on_readable()

    def begin_local_connect(self) -> bool:
        """A thread of this process connects to this queue (:func:`local_connect_begins`):
        whether it takes the next connections (not in a forked child, nor while paused or
        taking them in ``accept``)."""
        with self.lock:
            if (self.closed or not self.watching or self.paused or self.inline
                    or self.pid != os.getpid()):  # fmt: skip
                return False
            self.local_connects += 1
            return True

    def end_local_connect(self, established: bool) -> None:
        """The connect of :meth:`begin_local_connect` returned (:func:`local_connect_ends`)."""
        try:
            if established:
                self._on_readable()
        except Exception:  # (as in the watcher: a bug here must not fail the program's connect)
            traceback.print_exc(file=sys.stderr)
        finally:  # (never left unwatched)
            with self.lock:
                self.local_connects -= 1
                if not self.local_connects and self.deferred:
                    self.deferred = False
                    if self.watching and not self.closed:
                        get_watcher().watch(self.fd, selectors.EVENT_READ, self._on_watched)

    def pause(self) -> None:
        """This process forked (:mod:`smcr.socket.fork`): stop taking connections from the
        kernel until this process asks for one again (``accept``, ``fileno``).

        A preforked server's parent listens and forks children that accept; were it
        to go on accepting in the background, its children would see none.  Meanwhile
        a connection the kernel holds makes :meth:`fileno` readable once, so that a
        parent that does accept (asyncio, a forking server) wakes and resumes.
        """
        with self.lock:
            if self.closed or self.paused:
                return
            self.paused = True
            self.watching = False
            get_watcher().watch(self.fd, selectors.EVENT_READ, self._on_readable_paused)

    def _on_readable_paused(self) -> None:
        with self.lock:
            if self.paused and not self.closed:
                get_watcher().unwatch(self.fd)
                self.kernel_waiting = True
                self.readiness.set(True, False)

    def _readable(self) -> bool:
        """What :meth:`fileno` says (cond held): a connection or an error for ``accept``, or
        one the kernel holds while we do not take them in the background."""
        return bool(self.ready) or self.error is not None or self.kernel_waiting

    def resume(self) -> None:
        """The process wants connections (again): take them from the kernel."""
        with self.lock:
            if self.paused and not self.closed:
                self.paused = False
                self._changed()
                self._watch()

    def _on_readable(self) -> None:
        """Accept what the kernel has (watcher thread)."""
        while True:
            with self.lock:
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
            except OSError as exc:
                with self.lock:
                    if not self.closed:
                        self.watching = False
                        get_watcher().unwatch(self.fd)
                        if exc.errno in handshake.OUT_OF_RESOURCES:
                            # (EMFILE...) the program's accept takes it from the kernel
                            # itself, and meets the kernel's error there, or not
                            self.inline = self.kernel_waiting = True
                        else:
                            self.error = exc  # accept() raises it
                        self._changed()
                return
            self._admit(fd, addr)

    def _admit(self, fd: int, addr: Any) -> None:
        sock = new_socket(self.cls, self.family, self.type, self.proto, fd)
        sock._stack = self.stack
        listener = self.listener()
        if listener is not None:
            sock._rmb_size, sock._sndbuf_size = listener._rmb_size, listener._sndbuf_size
        if not discovery.current().peer_offered(sock, client=False):
            handshake.fall_back(sock, int(DeclineCode.PEERNOSMC), 0, True)
            with self.lock:
                self.ready.append((sock, addr))
                self._changed()
            return
        with self.lock:
            self.pending += 1
            self._limit_handshakes()
        try:
            handshake.start_handshake(sock, False, lambda hc: self._handshake_ended(sock, addr, hc))
        except OSError as exc:
            if exc.errno in unserved.NO_RNIC:  # no RNIC for the address: NOSMCRDEV, TCP
                unserved.server_declines(sock, lambda: self._unserved(sock, addr))
                return
            # EMFILE, ENOMEM...: the peer is refused, accept() raises it
            sock.close()
            with self.lock:
                self.pending -= 1
                self._limit_handshakes()
                if not self.closed:
                    self.error = exc
                    self._changed()
            return
        except Exception:
            with self.lock:
                self.pending -= 1
                self._limit_handshakes()
            sock.close()
            raise
        if self.stack is None:  # (a wildcard address: the runtime its clients came to)
            with self.lock:
                self.polled = sock._stack

    def _handshake_ended(self, sock: SocketBase, addr: Any, hc: HostConn) -> None:
        """The runtime's news (its lock held): queue the socket, or drop a failed one."""
        assert sock._stack is not None
        handshake.finish_handshake(sock, sock._stack, hc)
        with self.lock:
            self.pending -= 1
            self._limit_handshakes()
            if sock._mode == "INIT":  # failed and reset: never seen by the application
                # (one whose client left under it is queued, as TCP: finish_handshake)
                if not self.watching and not self.closed:
                    self._watch()
                return
            if self.closed:
                self.ready.append((sock, addr))  # closed with the rest, outside the lock
            else:
                self.ready.append((sock, addr))
                self._changed()
        if self.closed:  # (this runs under the runtime's lock, which close() takes)
            NamedThread(target=self._close_ready, name="smcr-close", daemon=True).start()

    def _unserved(self, sock: SocketBase, addr: Any) -> None:
        """A connection declined for want of an RNIC (:mod:`smcr.socket.unserved`, in its
        thread): queued as a fallback to TCP."""
        handshake.fall_back(sock, int(unserved.CODE), 0, True)
        with self.lock:
            self.pending -= 1
            self._limit_handshakes()
            self.ready.append((sock, addr))
            if not self.closed:
                self._changed()
        if self.closed:
            self._close_ready()

    def limit_handshakes(self) -> None:
        """The listener's ``SMC_LIMIT_HS`` changed: count it as congested, or not, now."""
        with self.lock:
            self._limit_handshakes()

    def _limit_handshakes(self) -> None:
        """Count this listener as congested in the ports map while it set
        ``SMC_LIMIT_HS`` and runs as many handshakes as its backlog, and not otherwise
        (cond held; a change is one ``bpf(2)`` call, only when the state flips)."""
        listener = self.listener()
        congested = (not self.closed and listener is not None and bool(listener._limit_hs)
                     and self.pending >= self.hs_limit)  # fmt: skip
        if congested != self.congested:
            self.congested = congested
            discovery.current().hs_congested(self.port, congested)

    def _changed(self) -> None:
        """Wake ``take`` and the descriptor (cond held)."""
        if self.sleepers:
            self.cond.notify_all()
        self._wake_taker()
        if self.readiness.app >= 0:  # (else: show() when the program asks for it)
            self.readiness.set(self._readable(), False)

    def _wake_taker(self) -> None:
        """A thread in :meth:`take` that polls the runtime looks again (cond held)."""
        if self.takers and self.polled is not None:
            self.polled.wake_poller()

    def _signal_waiting(self) -> None:
        """Inline mode (cond held): make :meth:`fileno` readable when the kernel has a
        connection, so that the program calls ``accept`` (level-triggered, as the
        kernel's listener: again after every ``accept`` that left one there)."""
        if not self.closed:
            self.watching = False
            get_watcher().watch(self.fd, selectors.EVENT_READ, self._on_readable_inline)

    def _on_readable_inline(self) -> None:
        """The kernel has a connection while ``accept`` takes them itself (watcher thread):
        with descriptors to spare again, back to accepting in the background (a program
        blocked in ``connect`` to itself must not wait for its own ``accept``); else
        :meth:`fileno` turns readable for the program's ``accept``."""
        if descriptors_free(self.fd, INLINE_HEADROOM):
            with self.lock:
                if not self.inline or self.closed:
                    return
                self.inline = False
                self.watching = True
                get_watcher().watch(self.fd, selectors.EVENT_READ, self._on_watched)
            self._on_readable()
            return
        with self.lock:
            if self.inline and not self.closed:
                get_watcher().unwatch(self.fd)
                self.kernel_waiting = True
                self._changed()
                # look again soon: the program may free descriptors and then wait for the
                # connection without calling accept (a blocking connect to itself)
                NamedTimer(INLINE_RECHECK, self._recheck, "smcr-recheck").start()

    def _recheck(self) -> None:
        with self.lock:
            if self.inline and not self.closed:
                self._signal_waiting()  # (called at once if the kernel still holds one)

    def _accept_inline(self) -> None:
        """``accept`` after the process ran out of descriptors: the kernel's accept in the
        program's own thread, as TCP's, so that a descriptor the program frees to take
        the connection (and close it: Twisted's reserved descriptor) is not taken by a
        background accept in between; the kernel's EMFILE raised as it comes.  Once a
        connection is taken with no error, or none waits, accepting goes back to the
        background."""
        try:
            fd, addr = self.sock._accept()  # type: ignore[attr-defined]
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            fd = -1
        except OSError:
            with self.lock:
                self._signal_waiting()
            raise
        if fd >= 0:
            self._admit(fd, addr)
        with self.lock:
            if self.error is None and not self.closed and self.inline:
                self.inline = False
                self._watch()

    def take(self, timeout: float | None, headroom: int = 0) -> tuple[SocketBase, Any]:
        """The next connection: ``BlockingIOError`` when none waits and ``timeout`` is 0,
        ``TimeoutError`` when none came in time, an accept error of the kernel's, and
        EMFILE (ENFILE), the connection staying queued, when ``headroom`` descriptor
        numbers are not free as it is handed out.

        The numbers are probed only then, not while the queue is empty: the probe takes
        the lowest free numbers for a moment, and a program's other thread that has just
        closed a descriptor must not find it open again (an accept loop with a timeout
        would probe every time round; CPython's ``test_makefile_close``)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self.kernel_waiting = False  # (this call takes it, or says why not)
        self.resume()
        if self.inline and not self.ready and self.error is None:
            self._accept_inline()
        with self.lock:
            while not self.ready and self.error is None:
                if self.closed:
                    raise OSError(errno.EBADF, "Bad file descriptor")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    if timeout == 0.0:
                        if self.readiness.app >= 0:  # (readable for a connection the
                            self.readiness.set(self._readable(), False)  # kernel had)
                        raise BlockingIOError(errno.EAGAIN, os.strerror(errno.EAGAIN))
                    raise TimeoutError("timed out")
                if not self._poll(deadline) and not (self.ready or self.error or self.closed):
                    self.sleepers += 1
                    try:
                        self.cond.wait(left)  # (news came meanwhile: cond was released)
                    finally:
                        self.sleepers -= 1
            if self.error is not None and not self.ready:
                error, self.error = self.error, None
                self._changed()
                if self.inline:
                    self._signal_waiting()
                else:
                    self._watch()
                raise error
            if headroom:
                shortage = descriptor_shortage(self.fd, headroom)
                if shortage is not None and shortage.errno in (errno.EMFILE, errno.ENFILE):
                    raise shortage
            item = self.ready.popleft()
            self._changed()
            if self.inline:
                self._signal_waiting()
            elif not self.watching:
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
        self.lock.release()
        try:
            with stack.lock:
                return stack.poll_until(ready, deadline)
        finally:
            self.lock.acquire()
            self.takers -= 1

    def _close_ready(self) -> None:
        """Reset the connections nobody accepted, as a TCP listener's close resets its
        queue's (the client's next call, or ``getsockopt(SO_ERROR)``, says ECONNRESET):
        an abortive close (``SO_LINGER`` 0; SMC-R: the abort CDC)."""
        with self.lock:
            left, self.ready = list(self.ready), deque()
        for sock, _addr in left:
            try:
                sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_LINGER, LINGER_ZERO)
            except OSError:
                pass
            sock.close()

    def release(self) -> None:
        """A socket listening with this queue closed (or was collected): the last one
        closes it (:meth:`close`), as the last descriptor of a listening socket does."""
        with self.lock:
            self.holders -= 1
            if self.holders > 0:
                return
        self.close()

    def close(self) -> None:
        """The listener closes: connections nobody accepted are closed (Linux resets
        them); handshakes still running close theirs when they end."""
        with self.lock:
            if self.closed:  # (again, from the listener's finalizer: the descriptor's
                return  # number may be another socket's by now)
            self.closed = True
            queues = _BY_PORT.get(self.port)
            if queues is not None:
                queues.discard(self)
                if not queues:
                    _BY_PORT.pop(self.port, None)
            self._limit_handshakes()
            if self.watching or self.paused:
                get_watcher().unwatch(self.fd)
            self.watching = False
            self.cond.notify_all()
            self._wake_taker()
        self._close_ready()
        self.readiness.close()
        self.sock.close()
