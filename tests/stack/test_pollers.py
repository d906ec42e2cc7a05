"""Who polls the runtime's CQ and descriptors (``Stack.wait``, the progress thread):
a ring of the doorbell reaches the thread it was meant for."""

from __future__ import annotations

import select
import socket
import threading
import time
from typing import Any

import pytest

from smcr.stack.runtime import Stack


def test_a_ring_drained_by_the_progress_thread_still_wakes_the_app_poller(
        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """An application thread takes over polling while the progress thread sleeps in its
    own poll; a ring (a handshake's new descriptor to watch) comes between the app
    thread's look at what to watch and its poll, and the progress thread drains it.
    The app thread must wake all the same (it did not: it slept until its deadline,
    and a handshake it should have watched timed out)."""
    real_poll, real_epoll = select.poll, select.epoll
    app = threading.get_ident()  # replaced by the app thread's below
    about_to_poll, go_on = threading.Event(), threading.Event()

    class Held:
        """A ``select.poll`` or ``select.epoll`` whose first sleep (a poll with a
        timeout) in the app thread waits for ``go_on``."""

        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        def poll(self, timeout: float | None = None) -> list[tuple[int, int]]:
            if threading.get_ident() == app and not go_on.is_set() and timeout:
                about_to_poll.set()
                go_on.wait(10)
            elif threading.get_ident() != app and made and made[0].wake.poller == "app":
                standby.set()  # (the progress thread's standby polls too)
            return self.inner.poll(timeout)  # type: ignore[no-any-return]

    # (the runtime's module is this one)
    monkeypatch.setattr(select, "poll", lambda: Held(real_poll()))
    monkeypatch.setattr(select, "epoll", lambda: Held(real_epoll()))
    standby = threading.Event()  # the progress thread gave polling up to the app thread
    made: list[Stack] = []  # (the progress thread may poll before Stack() returns)
    stack = Stack()  # its progress thread polls through Held too
    made.append(stack)
    a, b = socket.socketpair()
    woke: list[bool] = []
    news = threading.Event()

    def app_thread() -> None:
        nonlocal app
        app = threading.get_ident()
        with stack.lock:
            hc = stack.new_conn(a)
            woke.append(stack.wait(hc, news.is_set, time.monotonic() + 60, spin=0.0))

    try:
        t = threading.Thread(target=app_thread)
        t.start()
        assert about_to_poll.wait(10), "the app thread did not get to its poll"
        standby.clear()
        with stack.lock:
            news.set()
            stack.kick()  # as start_handshake rings after a new descriptor to watch
        # the progress thread, asleep in its own poll, takes the ring and stands by
        assert standby.wait(10), "the progress thread did not take the ring"
        go_on.set()
        t.join(10)
        assert not t.is_alive(), "the app poller slept through the ring"
        assert woke == [True]
    finally:
        go_on.set()
        stack.close()
        a.close()
        b.close()


def test_kicks_while_nobody_drains_the_doorbell_never_block() -> None:
    """Kicks from a thread that holds the runtime's lock, more than the doorbell holds:
    none blocks (a full bell wakes a poller already).  A kick that blocked held the lock
    that the poller which would drain the bell waited for: the whole process stopped."""
    stack = Stack()
    done = threading.Event()

    def kick_a_lot() -> None:
        with stack.lock:  # (the progress thread cannot drain meanwhile)
            for _ in range(100_000):
                stack.kick()
        done.set()

    t = threading.Thread(target=kick_a_lot, daemon=True)
    t.start()
    assert done.wait(30), "a kick blocked on the full doorbell"  # (its lock stays held)
    stack.close()
