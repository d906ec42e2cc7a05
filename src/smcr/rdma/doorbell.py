"""Ringing and draining doorbells, in C where the build has it.

A doorbell (a socket pair's end: a CQ's, a socket-pair readiness descriptor) is rung with
one byte and drained by reading what is there, both without blocking: a full one is rung
already, a closed one belongs to a peer that is gone.  A named readiness descriptor (a
unix datagram socket, :mod:`smcr.rdma.bells`) is rung with a datagram sent to its name.
:mod:`smcr.rdma._doorbell` makes each the bare system call, the GIL held; a pure-Python
process uses the socket's own methods (same effect, more of Python's machinery per call).
"""

from __future__ import annotations

import _socket
import importlib
import socket
from types import ModuleType
from typing import Final

_NOSIGNAL_DONTWAIT: Final = socket.MSG_NOSIGNAL | socket.MSG_DONTWAIT


DRAIN_MOST: Final = 4096
"""The most bytes one :func:`drain` reads (a full read: more may wait)."""


def _c_doorbell() -> ModuleType | None:
    """The C calls, built with the compiled modules; None in a pure-Python process, or where
    the C's drain reads another most than :data:`DRAIN_MOST` (a build of other sources)."""
    try:
        calls = importlib.import_module("smcr.rdma._doorbell")
    except ImportError:
        return None
    return calls if getattr(calls, "DRAIN_MOST", None) == DRAIN_MOST else None


C_CALLS: ModuleType | None = _c_doorbell()
""":func:`_c_doorbell`; tests set it to None to run the Python calls in a compiled process."""

_SINK = bytearray(DRAIN_MOST)
"""Where the Python's :func:`drain` reads to (its content is never looked at)."""


def ring(bell: _socket.socket) -> bool:
    """Send the doorbell's one byte; whether it went (not: full, closed, or a dead peer)."""
    calls = C_CALLS
    if calls is not None:
        went: bool = calls.ring(bell)
        return went
    try:
        return bell.send(b"\x01", _NOSIGNAL_DONTWAIT) == 1
    except OSError:
        return False


def drain(bell: _socket.socket) -> int:
    """Read what the doorbell holds (up to 4096 bytes, one call); the bytes read."""
    calls = C_CALLS
    if calls is not None:
        got: int = calls.drain(bell)
        return got
    try:
        return bell.recv_into(_SINK, DRAIN_MOST, socket.MSG_DONTWAIT)
    except OSError:
        return 0


def ring_to(sock: _socket.socket, name: bytes) -> int:
    """Send a ring datagram (``b"r"``) from ``sock`` to the unix socket ``name`` without
    blocking: 0 when it went, else the errno (``EAGAIN``: a full queue or send buffer)."""
    calls = C_CALLS
    if calls is not None:
        err: int = calls.ring_to(sock, name)
        return err
    try:
        sock.sendto(b"r", socket.MSG_DONTWAIT, name)
    except OSError as exc:
        if exc.errno is None:  # (not the call's: a name too long to be an address)
            raise
        return exc.errno
    return 0


def queued(sock: _socket.socket) -> bool:
    """Whether a datagram (or a byte) waits on ``sock``; nothing is taken."""
    calls = C_CALLS
    if calls is not None:
        waits: bool = calls.queued(sock)
        return waits
    try:
        sock.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK)
    except OSError:
        return False
    return True
