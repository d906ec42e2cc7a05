"""A ``threading.Lock`` taken and given back in one C call where the build has it.

Why: the runtime's lock, a connection's reader lock and a CQ's lock are taken and given
back several times per message, and on CPython 3.11 ``lock.acquire()`` looks the method
up, parses its arguments with keywords and reads the monotonic clock even when the lock is
free.  :mod:`smcr._locks` takes a free lock with one ``sem_trywait`` on the lock object
itself (a held one is waited for by its own ``acquire``), so Python code, a
``threading.Condition`` over the lock, and these calls all see one lock.  A pure-Python
process, or an interpreter whose lock is not the layout ``_locks.c`` knows (the import's
check below), uses the methods: the same effect.
"""

from __future__ import annotations

import importlib
import threading
from _thread import LockType
from collections.abc import Callable
from types import ModuleType
from typing import Final


def _py_take(lock: LockType) -> None:
    lock.acquire()


def _py_try_take(lock: LockType) -> bool:
    return lock.acquire(False)


def _py_give(lock: LockType) -> None:
    lock.release()


def _c_locks() -> ModuleType | None:
    """The C calls, where built and where a lock they take is held for ``acquire`` and one
    they give back is free for it (the layout they read is this interpreter's)."""
    try:
        calls = importlib.import_module("smcr._locks")
    except ImportError:
        return None
    if not getattr(calls, "DIRECT", 0):
        return None
    probe = threading.Lock()
    calls.take(probe)
    held = probe.locked() and not probe.acquire(False) and not calls.try_take(probe)
    calls.give(probe)
    free = not probe.locked() and probe.acquire(False)
    if free:
        probe.release()
        free = calls.try_take(probe) and probe.locked()
        calls.give(probe)
    return calls if held and free and not probe.locked() else None


C_CALLS: Final = _c_locks()

take: Final[Callable[[LockType], None]] = _py_take if C_CALLS is None else C_CALLS.take
"""``lock.acquire()``."""
try_take: Final[Callable[[LockType], bool]] = _py_try_take if C_CALLS is None else C_CALLS.try_take
"""``lock.acquire(False)``."""
give: Final[Callable[[LockType], None]] = _py_give if C_CALLS is None else C_CALLS.give
"""``lock.release()``."""
