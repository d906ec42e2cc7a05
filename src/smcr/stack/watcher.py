"""One thread per process that watches descriptors for the socket layer's background work.

Listening sockets accept and start handshakes here while the application is
busy elsewhere (Linux runs this in its ``smc_tcp_listen_work`` and
``smc_listen_work`` workers), and non-blocking connects finish here.  The
work itself is short (an ``accept``, a map lookup, starting a handshake that
the runtime then drives); nothing here waits for a peer.

Callbacks run in the watcher's thread, one at a time, without any lock of
the watcher held (they may watch and unwatch).  ``unwatch`` is done with the
number when it returns, from any thread: epoll keeps a registration by file and
number until the file dies, and callers close the descriptor right after while
its file may live on under another number (the program's own; a forked child's),
so a registration left behind would report that file's events under the number's
next owner.  A call the watcher picked just before an ``unwatch`` may still run
(its events were read first), so callbacks check their owner's state (closed?
still connecting?) first.  A forked child gets its own watcher on first use; the
parent's thread does not exist there.
"""

from __future__ import annotations

import os
import select
import selectors
import sys
import threading
import traceback
from collections.abc import Callable

from smcr.osthreads import NamedThread

Callback = Callable[[], None]


def _epoll_mask(events: int) -> int:
    """``selectors``' EVENT_READ/EVENT_WRITE as epoll's bits."""
    mask = 0
    if events & selectors.EVENT_READ:
        mask |= select.EPOLLIN
    if events & selectors.EVENT_WRITE:
        mask |= select.EPOLLOUT
    return mask


class Watcher:
    """An epoll in a daemon thread; ``watch``/``unwatch`` from any thread, each one
    changing the epoll at once (Linux lets ``epoll_ctl`` run beside ``epoll_wait``)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._epoll = select.epoll()
        self._lock = threading.Lock()
        self._callbacks: dict[int, Callback] = {}
        self._thread = NamedThread(target=self._run, name="smcr-watcher", daemon=True)
        self._thread.start()

    def watch(self, fd: int, events: int, callback: Callback) -> None:
        """Call ``callback`` (in the watcher thread) whenever ``fd`` is ready for
        ``events`` (``selectors.EVENT_READ``/``EVENT_WRITE``), until :meth:`unwatch`.
        A descriptor closed meanwhile is not watched."""
        with self._lock:
            if self._callbacks.pop(fd, None) is not None:
                try:
                    self._epoll.unregister(fd)
                except OSError:
                    pass
            try:
                self._epoll.register(fd, _epoll_mask(events))
            except OSError:
                return
            self._callbacks[fd] = callback

    def unwatch(self, fd: int) -> None:
        """Stop watching ``fd`` (before it is closed)."""
        with self._lock:
            if self._callbacks.pop(fd, None) is not None:
                try:  # (closed already: epoll dropped it)
                    self._epoll.unregister(fd)
                except OSError:
                    pass

    def _run(self) -> None:
        while True:
            for fd, _mask in self._epoll.poll():
                with self._lock:
                    callback = self._callbacks.get(fd)
                if callback is None:  # unwatched since the events were read
                    continue
                try:
                    callback()
                except Exception:  # a bug in one callback must not stop the others
                    traceback.print_exc(file=sys.stderr)


_watcher: Watcher | None = None
_watcher_lock = threading.Lock()


def _forked() -> None:
    """In a forked child: the parent's watcher thread is not here, its lock may be held."""
    global _watcher, _watcher_lock
    _watcher, _watcher_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forked)


def get_watcher() -> Watcher:
    """This process's watcher, started on first use (again in a forked child)."""
    global _watcher  # noqa: PLW0603 - one per process
    found = _watcher
    if found is not None and found.pid == os.getpid():
        return found
    with _watcher_lock:
        if _watcher is None or _watcher.pid != os.getpid():
            _watcher = Watcher()
        return _watcher
