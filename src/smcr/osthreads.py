"""Threads that the operating system knows by their name.

CPython (before 3.14) names a thread only for itself: ``top -H``, ``ps -L``, ``perf`` and
``/proc/PID/task/*/comm`` show every thread of an smcr process as ``python``, so a user
cannot tell the progress thread that answers the peer from the RNIC's engine or from the
program's own threads.  :class:`NamedThread` gives the kernel the thread's name (its
first 15 bytes, the kernel's limit) as the thread starts, by ``prctl(PR_SET_NAME)``: no
descriptor is opened for it (writing ``/proc/self/task/TID/comm`` would take the lowest
free number for a moment, in a thread that runs beside the program's own, which may be
counting on that number).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import threading
from typing import Any

COMM_LIMIT = 15
"""Bytes of a thread's name the kernel keeps (``TASK_COMM_LEN`` less its NUL)."""
_PR_SET_NAME = 15


@functools.cache
def _prctl() -> Any:
    """libc's ``prctl``, looked up once."""
    return ctypes.CDLL(None, use_errno=True).prctl


def name_this_thread(name: str) -> None:
    """Tell the kernel the calling thread's name (cut to :data:`COMM_LIMIT` bytes).  Best
    effort: a name is for people looking, and no thread should fail for want of one."""
    with contextlib.suppress(OSError, AttributeError):
        _prctl()(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:COMM_LIMIT]), 0, 0, 0)


class NamedThread(threading.Thread):
    """A :class:`threading.Thread` whose name the kernel also shows."""

    def run(self) -> None:
        name_this_thread(self.name)
        super().run()
