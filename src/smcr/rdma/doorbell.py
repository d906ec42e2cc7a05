"""Ringing and draining doorbells, in C where the build has it.

A doorbell (a socket pair's end: a CQ's, a socket-pair readiness descriptor) is rung with
one byte and drained by reading what is there, both without blocking: a full one is rung
already, a closed one belongs to a peer that is gone.  A named readiness descriptor (a
unix datagram socket, :mod:`smcr.rdma.bells`) is rung with a datagram sent to its name.
:mod:`smcr.rdma._doorbell` makes each the bare system call, the GIL held; a pure-Python
process uses the socket's own methods (same effect, more of Python's machinery per call).
So is the look at an epoll descriptor that never waits (:func:`ready`).
"""

from __future__ import annotations

import _socket
import importlib
import select
import socket
from types import ModuleType
from typing import Final

_NOSIGNAL_DONTWAIT: Final = socket.MSG_NOSIGNAL | socket.MSG_DONTWAIT


DRAIN_MOST: Final = 4096
"""The most bytes one :func:`drain` reads (a full read: more may wait)."""
SCRAMBLE: Final = 0x9E3779B1
"""An odd multiplier (2**32 over the golden ratio): rids far apart (:func:`bell_name`)."""


def _c_doorbell() -> ModuleType | None:
    """The C calls, built with the compiled modules; None in a pure-Python process, or where
    the C's drain reads another most than :data:`DRAIN_MOST`, or scrambles names with
    another :data:`SCRAMBLE` (a build of other sources)."""
    try:
        calls = importlib.import_module("smcr.rdma._doorbell")
    except ImportError:
        return None
    same = (getattr(calls, "DRAIN_MOST", None) == DRAIN_MOST
            and getattr(calls, "SCRAMBLE", None) == SCRAMBLE)  # fmt: skip
    return calls if same else None


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


def bell_name(prefix: bytes, rid: int) -> bytes:
    """The name of readiness descriptor ``rid`` (0: a CQ's probe) under ``prefix``: the rid
    scrambled (times an odd constant, mod 2**32: one name per rid) in eight hex digits.
    Why: the kernel finds an abstract name in one of 256 chains chosen by the name's 16-bit
    ones'-complement sum (``unix_abstract_hash``), and every ring walks its chain comparing
    names.  The rid's own digits sum to a few dozen values, so 2,000 names (1,000
    connections) sat in 69 chains, ~34 compared per ring (3.7% of both processes' CPU);
    scrambled, they use nearly all 256.  Printable, as names were: ``/proc/net/unix``
    prints a name's bytes as they are (a newline among them would break its lines for
    ``ss`` and every other reader)."""
    return prefix + b"%08x" % (rid * SCRAMBLE & 0xFFFFFFFF)


def ring_rid(sock: _socket.socket, prefix: bytes, rid: int) -> int:
    """:func:`ring_to` the readiness descriptor named ``bell_name(prefix, rid)``; the C call
    makes the name in the address itself (a ring per message at scale: no name object
    each time).  ``prefix`` starts an abstract name (a leading NUL: ``ValueError``
    otherwise)."""
    calls = C_CALLS
    if calls is not None:
        err: int = calls.ring_rid(sock, prefix, rid)
        return err
    if not prefix.startswith(b"\0"):
        raise ValueError("ring_rid needs an abstract name's prefix")
    return ring_to(sock, bell_name(prefix, rid))


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


def ready(ep: select.epoll) -> list[int]:
    """The descriptors ``ep`` reports ready now (``ep.poll(0)``'s, without the events).
    The C call keeps the GIL, which ``poll(0)`` lets go (another thread of ours then takes
    it, and the caller waits to have it back) around a call that never waits.  Raises as
    ``ep.poll`` (``ValueError`` once ``ep`` is closed)."""
    calls = C_CALLS
    if calls is not None:
        fds: list[int] = calls.ready(ep)
        return fds
    return [fd for fd, _events in ep.poll(0)]
