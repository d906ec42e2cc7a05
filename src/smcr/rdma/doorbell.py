"""Ringing and draining a doorbell (a socket pair's end), in C where the build has it.

A doorbell is rung with one byte and drained by reading what is there, both without
blocking: a full one is rung already, a closed one belongs to a peer that is gone.
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


def _c_doorbell() -> ModuleType | None:
    """The C calls, built with the compiled modules; None in a pure-Python process."""
    try:
        return importlib.import_module("smcr.rdma._doorbell")
    except ImportError:
        return None


C_CALLS: ModuleType | None = _c_doorbell()
""":func:`_c_doorbell`; tests set it to None to run the Python calls in a compiled process."""

_SINK = bytearray(4096)
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
        return bell.recv_into(_SINK, 4096, socket.MSG_DONTWAIT)
    except OSError:
        return 0
