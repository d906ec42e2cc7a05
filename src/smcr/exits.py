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
does before raising SIGTERM again, finds ours.  The handler restores the default action
(a second signal ends the process at once) and runs the hooks, newest first as
``atexit`` does, in a thread of their own; then that thread raises the signal again, so
the process still dies of it, after :data:`HOOKS_BOUND` seconds at most.  The handler
itself returns at once: the signal may have come while the main thread held a lock a
hook needs (Python runs handlers between the steps of the interrupted code, inside a
system call that the signal interrupted too), and only the main thread can release it.
Application threads that would go on using smcr meanwhile wait where they are
(:func:`stays_parked`), as the kernel would have stopped them.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Final

from smcr.osthreads import NamedThread, NamedTimer

__all__ = ["HOOKS_BOUND", "SIGNALS", "install", "on_exit", "stays_parked"]

SIGNALS: Final = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
"""The signals that end a process the usual way (a service manager, a closed terminal,
Ctrl-C where Python's own handler was reset)."""
HOOKS_BOUND: Final = 12.0
"""How long the hooks may take after a signal: a runtime ending its link groups
takes its closes' wait, its DELETE LINK wait and its quiet wait
(:mod:`smcr.stack.closing`: 2 + 1 + 2 s over a link that delivers at once).  Over a
slow RoCE link those go on while it still delivers (up to ``EXIT_KEEP``, a minute);
a signal cuts them here: a process told to end does, and bytes still in flight then
are lost, the peer reset (a normal exit waits for them)."""

_hooks: list[Callable[[], None]] = []
_hooks_lock = threading.Lock()


class _Ending:
    """What a signal set going: the thread that runs the hooks, and the signal."""

    runner: threading.Thread | None = None
    signum = 0


_ending = _Ending()


def on_exit(hook: Callable[[], None]) -> None:
    """Run ``hook`` at a normal exit (``atexit``) and, where :func:`install` could set the
    handler, when one of :data:`SIGNALS` ends the process.  A hook must be cheap to call
    more than once and check itself that it runs in the process that registered it (a
    forked child inherits the list)."""
    atexit.register(_at_exit, hook)
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


def stays_parked() -> bool:
    """Whether the calling thread, whose smcr call the process's end would now answer (an
    EOF or an error from the closes at exit), waits instead until the process is gone: a
    daemon thread at exit (TCP's calls go on blocking until the kernel ends the process),
    and any thread once a signal ends the process; never the thread that runs the hooks."""
    me, runner = threading.current_thread(), _ending.runner
    return me is not runner and (me.daemon or runner is not None)


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    """The hooks in a thread of their own, which then dies of the signal (module doc)."""
    if _ending.runner is not None:
        return
    signal.signal(signum, signal.SIG_DFL)
    _ending.signum = signum
    NamedTimer(HOOKS_BOUND, _die, "smcr-exit-bound").start()
    _ending.runner = NamedThread(target=_run_hooks_then_die, name="smcr-exit",
                                 daemon=True)  # fmt: skip
    _ending.runner.start()


def _at_exit(hook: Callable[[], None]) -> None:
    """``hook`` at a normal exit; after a signal (the program ended meanwhile) the hooks are
    the signal's thread's: wait for it, which ends the process."""
    runner = _ending.runner
    if runner is None:
        hook()
        return
    runner.join(HOOKS_BOUND)
    _die()


def _run_hooks_then_die() -> None:
    _run_hooks()
    _die()


def _die() -> None:
    """End the process by the signal that came, with its default action (set by the
    handler)."""
    os.kill(os.getpid(), _ending.signum)


def _run_hooks() -> None:
    """Every hook, newest first; one that fails does not stop the others (the process is
    ending: there is nobody to report to)."""
    with _hooks_lock:
        hooks = list(reversed(_hooks))
    for hook in hooks:
        with contextlib.suppress(Exception):
            hook()
