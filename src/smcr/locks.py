"""A ``threading.Lock`` (or ``RLock``) taken and given back in one C call where built.

Why: the runtime's lock, a connection's reader lock, a CQ's lock and a QP's state lock (an
``RLock``) are taken and given back several times per message, and on CPython 3.11
``lock.acquire()`` looks the method up, parses its arguments with keywords and reads the
monotonic clock even when the lock is free.  :mod:`smcr._locks` takes a free lock with one
``sem_trywait`` on the lock object itself (an ``RLock``'s owner and count kept as its
methods keep them; a lock held elsewhere is waited for by its own ``acquire``), so Python
code, a ``threading.Condition`` over the lock, and these calls all see one lock.  A
pure-Python process, or an interpreter whose locks are not the layouts ``_locks.c`` knows
(the import's check below), uses the methods: the same effect.
"""

from __future__ import annotations

import importlib
import threading
from _thread import LockType
from collections.abc import Callable
from types import ModuleType
from typing import Any, Final

from smcr.bound import get_ident


def _py_take(lock: LockType) -> None:
    lock.acquire()


def _py_try_take(lock: LockType) -> bool:
    return lock.acquire(False)


def _py_give(lock: LockType) -> None:
    lock.release()


def _c_locks() -> ModuleType | None:
    """The C calls, where built and where the locks they take and give back are held and
    free as the locks' own methods say (the layouts they read are this interpreter's)."""
    try:
        calls = importlib.import_module("smcr._locks")
    except ImportError:
        return None
    if not (getattr(calls, "DIRECT", 0) and getattr(calls, "DIRECT_RLOCK", 0)):
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
    again: Any = threading.RLock()  # (its _is_owned and _release_save: Condition's)
    calls.take(again)
    calls.take(again)
    owned = again._is_owned() and again._release_save() == (2, get_ident())
    again._acquire_restore((2, get_ident()))
    calls.give(again)
    still = again._is_owned()
    calls.give(again)
    given = not again._is_owned() and again.acquire(False)
    if given:
        again.release()
    trusted = held and free and not probe.locked() and owned and still and given
    return calls if trusted else None


C_CALLS: Final = _c_locks()

take: Final[Callable[[LockType], None]] = _py_take if C_CALLS is None else C_CALLS.take
"""``lock.acquire()``."""
try_take: Final[Callable[[LockType], bool]] = _py_try_take if C_CALLS is None else C_CALLS.try_take
"""``lock.acquire(False)``."""
give: Final[Callable[[LockType], None]] = _py_give if C_CALLS is None else C_CALLS.give
"""``lock.release()``."""
