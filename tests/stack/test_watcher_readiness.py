"""The runtime's small parts at their own level: the watcher thread and readiness
descriptors (``smcr.stack.watcher``, ``smcr.stack.readiness.Readiness``)."""

from __future__ import annotations

import os
import random
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


def test_readiness_matches_every_state_of_a_long_random_run() -> None:
    """Each fill and drain stops on a short count (no EAGAIN): none leaves a byte behind
    or the queue not full, whatever came before."""
    rng = random.Random(5)
    r = Readiness()
    try:
        for _ in range(500):
            state = (rng.random() < 0.5, rng.random() < 0.5)
            r.set(*state)
            assert ready(r.fileno()) == state
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


def test_an_unwatched_number_closed_at_once_never_calls_its_next_owner_back() -> None:
    """Callers unwatch a descriptor and close it at once (a non-blocking connect's socket
    closed, a refused connect's error read by the program) while the file lives on
    under another number (the program's number of the TCP socket; a forked child's).
    epoll keeps a registration by (file, number) until the file dies, so the watcher
    must be done with the number when ``unwatch`` returns: else the old file's events
    come in as the number's next owner's, and a connect still under way is taken for
    one that ended (and a readable old file makes the watcher spin)."""
    w = Watcher()
    old, old_peer = socket.socketpair()
    survivor = os.dup(old.fileno())  # the file lives on under another number
    number = old.fileno()
    seen = threading.Event()

    def drain_old() -> None:  # (so that no call of the old file's is under way later)
        old.recv(1)
        seen.set()

    w.watch(number, selectors.EVENT_READ, drain_old)
    old_peer.send(b"x")
    assert seen.wait(10)
    w.unwatch(number)
    old.close()
    new, new_peer = socket.socketpair()
    try:
        if new.fileno() != number:  # (the lowest free number is ``number``, as a rule)
            os.dup2(new.fileno(), number)
            new.close()
            new = socket.socket(fileno=number)
        called = threading.Event()
        w.watch(number, selectors.EVENT_READ, called.set)
        old_peer.send(b"x")  # the old file is readable from now on, the new one not
        assert not called.wait(0.5), "called back for the old file's event"
        new_peer.send(b"y")
        assert called.wait(10)  # its own events do come
    finally:
        w.unwatch(number)
        for s in (new, new_peer, old_peer):
            s.close()
        os.close(survivor)


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
