"""Threads that the operating system knows by their name.

CPython (before 3.14) names a thread only for itself: ``top -H``, ``ps -L``, ``perf`` and
``/proc/PID/task/*/comm`` show every thread of an smcr process as ``python``, so a user
cannot tell the progress thread that answers the peer from the RNIC's engine or from the
program's own threads.  :class:`NamedThread` gives the kernel the thread's name (its
first 15 bytes, the kernel's limit) as the thread starts, by ``prctl(PR_SET_NAME)``: no
descriptor is opened for it (writing ``/proc/self/task/TID/comm`` would take the lowest
free number for a moment, in a thread that runs beside the program's own, which may be
counting on that number).

smcr's threads also keep the signals that end or steer a process off themselves
(:data:`PROCESS_SIGNALS`, blocked as the thread starts): the kernel gives a signal sent to
the process to a thread that does not block it (the main thread first, but another one
where the main thread has a signal pending and is not running), and CPython only notes
one that lands on a thread other than the main one; a main thread asleep on a lock
(``threading.Event().wait()``, ``Thread.join``) is not woken, and its handler (Python's
own for SIGINT, smcr's for SIGTERM) does not run.  A program's own threads are the
program's business, as without smcr.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import signal
import threading
from typing import Any, Final

COMM_LIMIT = 15
"""Bytes of a thread's name the kernel keeps (``TASK_COMM_LEN`` less its NUL)."""
_PR_SET_NAME = 15

PROCESS_SIGNALS: Final = frozenset(
    getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1",
                                       "SIGUSR2", "SIGALRM", "SIGCHLD", "SIGWINCH", "SIGIO",
                                       "SIGPROF", "SIGVTALRM", "SIGXCPU", "SIGTSTP",
                                       "SIGCONT", "SIGTTIN", "SIGTTOU", "SIGURG")
    if hasattr(signal, name)) | frozenset(range(signal.SIGRTMIN, signal.SIGRTMAX + 1))  # fmt: skip
"""Signals sent to a process as a whole, which smcr's threads block so that the kernel
hands them to a thread of the program (module doc).  Signals that a thread's own fault
raises (SIGSEGV, SIGBUS, SIGFPE, SIGILL) and SIGPIPE (a write of the thread's own, which
Python ignores) stay unblocked."""


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
    """A :class:`threading.Thread` whose name the kernel also shows, and which blocks
    :data:`PROCESS_SIGNALS` from its first instruction (it inherits the mask that
    :meth:`start` sets for a moment in the starting thread: a signal that comes meanwhile
    waits, pending, until the starter unblocks it)."""

    def start(self) -> None:
        found = signal.pthread_sigmask(signal.SIG_BLOCK, PROCESS_SIGNALS)
        try:
            super().start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, found)

    def run(self) -> None:
        name_this_thread(self.name)
        super().run()


class NamedTimer(NamedThread, threading.Timer):
    """A :class:`threading.Timer` that is a :class:`NamedThread` (named, signals blocked)."""

    def __init__(self, interval: float, function: Any, name: str) -> None:
        threading.Timer.__init__(self, interval, function)
        self.name = name
        self.daemon = True
