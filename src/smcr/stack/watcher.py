"""One thread per process that watches descriptors for the socket layer's background work.

Listening sockets accept and start handshakes here while the application is
busy elsewhere (Linux runs this in its ``smc_tcp_listen_work`` and
``smc_listen_work`` workers), and non-blocking connects finish here.  The
work itself is short (an ``accept``, a map lookup, starting a handshake that
the runtime then drives); nothing here waits for a peer.

Callbacks run in the watcher's thread, one at a time, without any lock of
the watcher held (they may watch and unwatch).  What was unwatched before the
watcher woke is not called back; a call it had already picked may still run,
so callbacks check their owner's state (closed?) first.  A forked child gets its own
watcher on first use; the parent's thread does not exist there.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import sys
import threading
import traceback
from collections.abc import Callable

from smcr import plainsock

Callback = Callable[[], None]


class Watcher:
    """A selector in a daemon thread; ``watch``/``unwatch`` from any thread."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = plainsock.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._lock = threading.Lock()
        self._changes: list[tuple[int, int, Callback | None]] = []
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._run, name="smcr-watcher", daemon=True)
        self._thread.start()

    def watch(self, fd: int, events: int, callback: Callback) -> None:
        """Call ``callback`` (in the watcher thread) whenever ``fd`` is ready for
        ``events`` (``selectors.EVENT_READ``/``EVENT_WRITE``), until :meth:`unwatch`."""
        self._change(fd, events, callback)

    def unwatch(self, fd: int) -> None:
        """Stop watching ``fd`` (before it is closed)."""
        self._change(fd, 0, None)

    def _change(self, fd: int, events: int, callback: Callback | None) -> None:
        if threading.get_ident() == self._thread.ident:
            self._apply(fd, events, callback)
            return
        with self._lock:
            self._changes.append((fd, events, callback))
        with contextlib.suppress(OSError):
            self._wake_w.send(b"w")

    def _apply(self, fd: int, events: int, callback: Callback | None) -> None:
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._selector.unregister(fd)
        if callback is not None:
            with contextlib.suppress(ValueError, OSError):  # closed meanwhile: nothing to watch
                self._selector.register(fd, events, callback)

    def _run(self) -> None:
        while True:
            self._apply_changes()
            events = self._selector.select()
            # what was unwatched while we slept is not called back: a caller that has
            # unwatched may close the descriptor, and its number may be another's by now
            self._apply_changes()
            watched = self._selector.get_map()
            for key, _mask in events:
                if key.data is None:
                    with contextlib.suppress(OSError):
                        while self._wake_r.recv(4096):
                            pass
                    continue
                now = watched.get(key.fd)
                if now is None or now.data is not key.data:
                    continue
                try:
                    key.data()
                except Exception:  # a bug in one callback must not stop the others
                    traceback.print_exc(file=sys.stderr)

    def _apply_changes(self) -> None:
        with self._lock:
            changes, self._changes = self._changes, []
        for change in changes:
            self._apply(*change)


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
