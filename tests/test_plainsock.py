"""``plainsock.ready``: ``select``'s answer for a descriptor of any number."""

from __future__ import annotations

import errno
import fcntl
import os
import resource
import socket
import time

import pytest

from smcr import plainsock


def test_ready_says_what_select_says_of_a_socket_pair() -> None:
    a, b = socket.socketpair()
    with a, b:
        assert not plainsock.ready(a)
        assert plainsock.ready(a, write=True)
        b.send(b"x")
        assert plainsock.ready(a, timeout=1.0)
        assert plainsock.ready(a.fileno())
        b.close()
        assert plainsock.ready(a)  # (the byte, and the hang-up after it)
        a.recv(1)
        assert plainsock.ready(a)  # a hang-up reads as readable: recv says b""


def test_ready_waits_no_longer_than_asked_and_rounds_up() -> None:
    a, b = socket.socketpair()
    with a, b:
        start = time.monotonic()
        assert not plainsock.ready(a, timeout=0.0004)  # (less than poll's millisecond)
        assert not plainsock.ready(a, timeout=0.05)
        assert time.monotonic() - start >= 0.05


def test_ready_refuses_closed_descriptors_as_select_does() -> None:
    a, b = socket.socketpair()
    b.close()
    fd = a.fileno()
    a.close()
    with pytest.raises(ValueError):
        plainsock.ready(a)  # (fileno() is -1)
    with pytest.raises(OSError) as raised:
        plainsock.ready(fd)
    assert raised.value.errno == errno.EBADF


def test_ready_takes_descriptors_past_fd_setsize() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2048:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))
    a, b = socket.socketpair()
    try:
        high = fcntl.fcntl(a.fileno(), fcntl.F_DUPFD, 1500)  # (the first free from 1500)
        b.send(b"x")
        assert plainsock.ready(high)
        assert plainsock.ready(high, write=True)
        os.close(high)
    finally:
        a.close()
        b.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
