"""Work a process must do as it ends, whether it exits or a signal ends it.

``atexit`` runs at a normal exit only.  A signal whose action is the default (SIGTERM
from a service manager or ``docker stop``, SIGHUP as a terminal closes, SIGINT where a
program reset Python's handler) kills the process without it, and with it what smcr
does last: end its link groups so that no peer waits on a link nobody answers, and
leave its counters for the host totals.  TCP needs no such step: the kernel closes the
sockets of a process it ends.

:func:`on_exit` registers a hook for both ends.  For the signals, a handler is set
where the action is still the default, and only from the main thread (Python's rule):
``smcr run`` does it as the interpreter starts (through :func:`smcr.diag.start`), before
the program sets handlers of its own.  A handler the program installed first is left
alone (it decides how the process ends; one that exits normally runs ``atexit``); one
installed after ours and that restores what it found, as uvicorn's graceful shutdown
does before raising SIGTERM again, finds ours.  The handler runs the hooks, newest
first as ``atexit`` does, in a thread of their own that it waits for at most
:data:`HOOKS_BOUND` seconds (the signal may have come while the main thread held a lock
a hook needs), then restores the default action and raises the signal again: the
process still dies of it.
"""

from __future__ import annotations

import atexit
import contextlib
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Final

__all__ = ["HOOKS_BOUND", "SIGNALS", "install", "on_exit"]

SIGNALS: Final = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
"""The signals that end a process the usual way (a service manager, a closed terminal,
Ctrl-C where Python's own handler was reset)."""
HOOKS_BOUND: Final = 12.0
"""How long a signal's handler waits for the hooks: a runtime ending its link groups
takes at most its closes' wait, its DELETE LINK wait and its quiet wait
(:mod:`smcr.stack.closing`: 2 + 1 + 5 s)."""

_hooks: list[Callable[[], None]] = []
_hooks_lock = threading.Lock()


def on_exit(hook: Callable[[], None]) -> None:
    """Run ``hook`` at a normal exit (``atexit``) and, where :func:`install` could set the
    handler, when one of :data:`SIGNALS` ends the process.  A hook must be cheap to call
    more than once and check itself that it runs in the process that registered it (a
    forked child inherits the list)."""
    atexit.register(hook)
    with _hooks_lock:
        _hooks.append(hook)
    install()


def install() -> None:
    """Set the handler for each of :data:`SIGNALS` whose action is still the default (from
    the main thread only; elsewhere nothing happens)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in SIGNALS:
        if signal.getsignal(sig) == signal.SIG_DFL:
            signal.signal(sig, _on_signal)


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    """Run the hooks (bounded), then die of the signal with its default action."""
    runner = threading.Thread(target=_run_hooks, name="smcr-exit", daemon=True)
    runner.start()
    runner.join(HOOKS_BOUND)
    signal.signal(signum, signal.SIG_DFL)
    signal.raise_signal(signum)


def _run_hooks() -> None:
    """Every hook, newest first; one that fails does not stop the others (the process is
    ending: there is nobody to report to)."""
    with _hooks_lock:
        hooks = list(reversed(_hooks))
    for hook in hooks:
        with contextlib.suppress(Exception):
            hook()
