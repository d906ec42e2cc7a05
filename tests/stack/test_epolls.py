"""Finding the process's epoll instances and their registrations of a descriptor number
(:mod:`smcr.stack.descriptors`), in C (:mod:`smcr.stack._epolls`) and in the Python it
stands for: both give what ``/proc`` says, among many descriptors and past holes in the
numbers, and a registration is found where it is the number's current file's, not where
it is one left from a file the number named before.

Why in C: a non-blocking connect of a socket whose number was handed out (asyncio's
``open_connection`` does) looks at every descriptor of the process; 500 connects at once
spent 3.4 of their 4.8 s there, 6.8 ms each, in Python.
"""

from __future__ import annotations

import os
import resource
import select
import socket
from collections.abc import Iterator

import pytest

import smcr.stack.descriptors as descriptors

C_EPOLLS = descriptors.C_EPOLLS
ALWAYS = select.EPOLLERR | select.EPOLLHUP
"""What the kernel watches for in every registration (and shows in its list)."""
needs_c = pytest.mark.skipif(C_EPOLLS is None, reason="a pure-Python process: no C calls")


@pytest.fixture(params=["c", "python"])
def look(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test runs with the C calls and with the Python's (the C ones only where the
    build has them)."""
    if request.param == "c":
        if C_EPOLLS is None:
            pytest.skip("a pure-Python process: no C calls")
    else:
        monkeypatch.setattr(descriptors, "C_EPOLLS", None)
    return str(request.param)


def epolls_by_proc() -> set[int]:
    """The epoll descriptors as /proc tells them, each looked at (the reference)."""
    found = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == "anon_inode:[eventpoll]":
                found.add(int(name))
        except OSError:
            continue
    return found


@pytest.fixture(autouse=True)
def room() -> Iterator[None]:
    """A descriptor limit of at least 4,096 for the test (the hard limit allowing)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4096 if hard == resource.RLIM_INFINITY else min(hard, 4096)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.fixture
def many() -> Iterator[list[socket.socket]]:
    """600 sockets, closed after the test."""
    socks = [socket.socket() for _ in range(600)]
    try:
        yield socks
    finally:
        for s in socks:
            s.close()


def test_every_epoll_instance_is_found_and_nothing_else(
        look: str, many: list[socket.socket]) -> None:  # fmt: skip
    eventfd = os.eventfd(0)  # (an anonymous inode too, but no epoll)
    eps = [select.epoll() for _ in range(3)]
    try:
        mine = {ep.fileno() for ep in eps}
        found = descriptors.epoll_fds()
        assert len(found) == len(set(found))
        assert mine <= set(found)
        assert set(found) == epolls_by_proc()
        assert eventfd not in found
    finally:
        os.close(eventfd)
        for ep in eps:
            ep.close()


def test_an_epoll_past_a_wide_hole_in_the_numbers_is_found(look: str) -> None:
    """The C's walk stops after 2 * (open descriptors) + 1024 numbers and lists the rest:
    an instance numbered beyond a hole that wide is found all the same."""
    pad = [socket.socket() for _ in range(3000)]
    top = pad[-1].fileno()
    for s in pad:
        s.close()
    ep = select.epoll()
    os.dup2(ep.fileno(), top, inheritable=False)  # (the instance, past the hole too)
    try:
        assert top - ep.fileno() > 2 * len(os.listdir("/proc/self/fd")) + 1024
        assert {ep.fileno(), top} <= set(descriptors.epoll_fds())
        assert set(descriptors.epoll_fds()) == epolls_by_proc()
    finally:
        os.close(top)
        ep.close()


@needs_c
def test_out_of_descriptors_the_c_still_finds_every_instance() -> None:
    """The C asks each descriptor with an eventfd of its own (an epoll instance is asked
    to forget it); with no descriptor free for it, fstat and readlink look instead."""
    assert C_EPOLLS is not None
    eps = [select.epoll() for _ in range(2)]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    fillers: list[int] = []
    try:
        highest = max(int(name) for name in os.listdir("/proc/self/fd"))
        resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 1, hard))
        with pytest.raises(OSError):
            while True:  # (the holes below the highest number filled: none free)
                fillers.append(os.eventfd(0))
        found = C_EPOLLS.epoll_fds()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert {ep.fileno() for ep in eps} <= set(found)
        assert set(found) == epolls_by_proc()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        for fd in fillers:
            os.close(fd)
        for ep in eps:
            ep.close()


def test_registrations_of_a_number_are_found_with_their_events(
        look: str, many: list[socket.socket]) -> None:  # fmt: skip
    a, b = select.epoll(), select.epoll()
    try:
        target, other = many[7].fileno(), many[300].fileno()
        for s in many[:200]:  # (an event loop's instance holds many)
            a.register(s.fileno(), select.EPOLLIN)
        a.modify(target, select.EPOLLIN | select.EPOLLOUT)
        b.register(target, select.EPOLLOUT | select.EPOLLET)
        assert sorted(descriptors.epoll_registrations(target)) == sorted([
            (a.fileno(), select.EPOLLIN | select.EPOLLOUT | ALWAYS),
            (b.fileno(), select.EPOLLOUT | select.EPOLLET | ALWAYS)])  # fmt: skip
        assert descriptors.epoll_registrations(other) == []
        assert descriptors.epoll_registrations(many[0].fileno()) == [
            (a.fileno(), select.EPOLLIN | ALWAYS)]
    finally:
        a.close()
        b.close()


def test_a_registration_left_from_the_number_s_former_file_is_not_its_own(
        look: str) -> None:  # fmt: skip
    """An instance watches (file, number) pairs: after another file took the number, the
    registration of the former one (still open elsewhere) is not the new file's; once the
    new file is registered too, that one is found, whichever comes first in the instance."""
    old, new = socket.socket(), socket.socket()
    ep = select.epoll()
    try:
        number = os.dup(old.fileno())
        ep.register(number, select.EPOLLIN)
        os.dup2(new.fileno(), number)  # (old stays open: its registration stays)
        assert descriptors.epoll_registrations(number) == []
        ep.register(number, select.EPOLLOUT)
        assert descriptors.epoll_registrations(number) == [(ep.fileno(), select.EPOLLOUT | ALWAYS)]
        os.close(number)
    finally:
        ep.close()
        old.close()
        new.close()


@needs_c
def test_watches_answers_for_the_number_s_current_file() -> None:
    assert C_EPOLLS is not None
    old, new, plain = socket.socket(), socket.socket(), socket.socket()
    ep = select.epoll()
    try:
        number = os.dup(old.fileno())
        assert C_EPOLLS.watches(ep.fileno(), number) == 0  # nothing registered
        ep.register(number, select.EPOLLIN)
        assert C_EPOLLS.watches(ep.fileno(), number) == 1
        os.dup2(new.fileno(), number)
        assert C_EPOLLS.watches(ep.fileno(), number) == 0  # the former file's only
        ep.register(number, select.EPOLLIN)
        assert C_EPOLLS.watches(ep.fileno(), number) == 1  # (after the former's)
        assert C_EPOLLS.watches(plain.fileno(), number) == -1  # not an epoll: cannot say
        os.close(number)
        with pytest.raises(ValueError):
            C_EPOLLS.watches(-1, 3)
    finally:
        ep.close()
        old.close()
        new.close()
        plain.close()


def test_put_at_carries_the_registration_to_the_new_file(look: str) -> None:
    """:func:`put_at` end to end: the instance's registration of the number follows the
    file put under it, with its events, and reports the new file's readiness."""
    a, b = socket.socketpair()
    c, d = socket.socketpair()
    ep = select.epoll()
    try:
        number = os.dup(a.fileno())
        ep.register(number, select.EPOLLIN)
        descriptors.put_at(number, c.fileno())
        assert descriptors.epoll_registrations(number) == [(ep.fileno(), select.EPOLLIN | ALWAYS)]
        b.send(b"x")  # (the former file readable: not the number's any more)
        assert ep.poll(0) == []
        d.send(b"y")
        assert ep.poll(1) == [(number, select.EPOLLIN)]
        os.close(number)
    finally:
        ep.close()
        for s in (a, b, c, d):
            s.close()
