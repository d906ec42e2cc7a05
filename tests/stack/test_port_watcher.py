"""The RoCE port watcher's thread (:class:`smcr.stack.ports.PortWatcher`) ends when its
netlink socket is gone instead of spinning on it."""

from __future__ import annotations

import os
import threading

from smcr.stack.hostconn import PortRes
from smcr.stack.ports import RECHECK, PortWatcher


class _NoPorts:
    """A runtime without RoCE ports (the watcher only looks at :attr:`ports`)."""

    def __init__(self) -> None:
        self.ports: list[PortRes] = []
        self.lock = threading.Lock()

    def port_up(self, port: int) -> None:
        raise AssertionError("no port to come up")

    def port_down(self, port: int, reason: str) -> None:
        raise AssertionError("no port to go down")


def _cpu_seconds(tid: int) -> float:
    """CPU time of one thread of this process, from /proc (user + system)."""
    with open(f"/proc/self/task/{tid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_the_thread_ends_when_its_socket_is_closed_under_it() -> None:
    """A socket closed while the thread still runs (``close`` gave up joining it) turns
    every poll into ``POLLNVAL`` and every read into ``EBADF``: the thread returns rather
    than retrying the read forever (a core at 100% for the process's life)."""
    watcher = PortWatcher(_NoPorts())
    thread = watcher._thread
    assert thread.native_id is not None
    try:
        watcher._sock.close()  # (what a timed-out join in close() leaves behind)
        # its poll notices at the next re-read (RECHECK); then it must end, not spin
        thread.join(timeout=RECHECK + 3.0)
        spent = _cpu_seconds(thread.native_id) if thread.is_alive() else 0.0
        assert not thread.is_alive(), f"still running, {spent:.2f} s of CPU so far"
    finally:
        os.write(watcher._stop_w, b"x")
        thread.join(timeout=2.0)
        os.close(watcher._stop_r)
        os.close(watcher._stop_w)


def test_a_socket_closed_before_the_thread_first_looks_ends_it_without_an_error() -> None:
    """The close can come before the new thread registers the socket (a runtime closed at
    once): the thread then returns quietly; it died of a ValueError (fileno() is -1) in
    CI once, a thread exception pytest reported."""
    watcher = PortWatcher(_NoPorts())
    os.write(watcher._stop_w, b"x")  # the real thread ends ...
    watcher._thread.join(timeout=2.0)
    assert not watcher._thread.is_alive()
    os.read(watcher._stop_r, 1)  # ... and its stop byte is taken back
    try:
        watcher._sock.close()
        watcher._run()  # what the thread runs when the close came first: no exception
    finally:
        os.close(watcher._stop_r)
        os.close(watcher._stop_w)
