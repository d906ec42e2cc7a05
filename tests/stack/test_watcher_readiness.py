"""The runtime's small parts at their own level: the watcher thread and readiness
descriptors (``smcr.stack.watcher``, ``smcr.stack.readiness.Readiness``)."""

from __future__ import annotations

import os
import select
import selectors
import socket
import threading

from smcr.stack.readiness import Readiness
from smcr.stack.watcher import Watcher, get_watcher


def ready(fd: int) -> tuple[bool, bool]:
    r, w, _ = select.select([fd], [fd], [], 0)
    return bool(r), bool(w)


def test_readiness_follows_what_the_runtime_sets() -> None:
    r = Readiness()
    try:
        assert ready(r.fileno()) == (False, True)
        r.set(True, True)
        assert ready(r.fileno()) == (True, True)
        r.set(True, False)
        assert ready(r.fileno()) == (True, False)
        r.set(False, False)
        assert ready(r.fileno()) == (False, False)
        r.set(False, True)
        assert ready(r.fileno()) == (False, True)
    finally:
        r.close()


def poll_events(fd: int, deadline_s: float = 20.0) -> int:
    """poll's events of ``fd`` once it has any (at most ``deadline_s``)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLOUT)
    got = poller.poll(deadline_s * 1000)
    return got[0][1] if got else 0


def test_a_failed_readiness_polls_as_a_refused_tcp_connect() -> None:
    """:meth:`Readiness.fail` (a non-blocking connect that failed, before the program's
    next call puts the TCP socket under its number): the events of a TCP socket
    whose connect was refused, ERR and HUP included, from either writability."""
    probe = socket.create_server(("127.0.0.1", 0))
    addr = probe.getsockname()
    probe.close()
    tcp = socket.socket()
    tcp.setblocking(False)
    try:
        tcp.connect_ex(addr)
        refused = poll_events(tcp.fileno())
    finally:
        tcp.close()
    assert refused & select.POLLERR and refused & select.POLLHUP
    for writable in (False, True):
        r = Readiness()
        try:
            r.set(False, writable)
            r.fail()
            assert poll_events(r.fileno()) == refused
            r.set(True, True)  # (changes nothing any more)
            assert poll_events(r.fileno()) == refused
        finally:
            r.close()


def test_readiness_close_survives_a_descriptor_closed_under_it() -> None:
    """A program that closes the descriptors it was given (tornado's close(all_fds=True))
    must not make the runtime's own close fail."""
    r = Readiness()
    os.close(r.fileno())
    r.close()  # no OSError


def test_watcher_calls_back_until_unwatched_and_keeps_going_after_a_failing_callback() -> None:
    w = Watcher()
    a, b = socket.socketpair()
    calls: list[str] = []
    got = threading.Event()

    def failing() -> None:
        calls.append("failing")
        w.unwatch(a.fileno())  # (from inside a callback: applied at once)
        raise RuntimeError("a bug in one callback")

    def reading() -> None:
        calls.append(a.recv(10).decode())
        got.set()

    try:
        w.watch(a.fileno(), selectors.EVENT_READ, failing)
        b.send(b"x")
        assert got.wait(0.5) is False  # the failing callback ran instead, and unwatched
        assert calls == ["failing"]
        a.recv(10)
        w.watch(a.fileno(), selectors.EVENT_READ, reading)
        b.send(b"hello")
        assert got.wait(10), "the watcher thread stopped after a failing callback"
        assert calls == ["failing", "hello"]
        w.unwatch(a.fileno())
        got.clear()
        b.send(b"more")
        assert not got.wait(0.3)  # unwatched: no more calls
    finally:
        a.close()
        b.close()


def test_one_watcher_per_process_and_a_new_one_in_a_forked_child() -> None:
    first = get_watcher()
    assert get_watcher() is first
    r, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        child = get_watcher()
        ok = child is not first and child.pid == os.getpid() and child._thread.is_alive()
        os.write(wfd, b"1" if ok else b"0")
        os._exit(0)
    os.close(wfd)
    os.waitpid(pid, 0)
    assert os.read(r, 1) == b"1"
    os.close(r)
