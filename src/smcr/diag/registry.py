"""Sockets the runtime does not hold, kept for the diag endpoint: listening and fallback ones.

SMC-R connections (and those in their handshake) are the runtime's
(:attr:`smcr.stack.runtime.Stack.conns`); a listening socket or a connection
that fell back to TCP is known only to its ``SMCSocket``, which adds itself
here (weakly: the registry keeps nothing alive, and a socket dropped
unclosed disappears from it with its collection).
"""

from __future__ import annotations

import weakref
from typing import Any

listening: weakref.WeakSet[Any] = weakref.WeakSet()
fallbacks: weakref.WeakSet[Any] = weakref.WeakSet()


def members(group: weakref.WeakSet[Any]) -> list[Any]:
    """A copy of ``group`` taken from another thread (retried if it changed meanwhile)."""
    for _ in range(10):
        try:
            return list(group)
        except RuntimeError:  # "set changed size during iteration"
            continue
    return []
