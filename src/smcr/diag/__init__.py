"""Host-wide observability: each smcr process answers the tools; the tools gather.

In Linux the kernel holds every SMC socket and smc-tools ask it over netlink.
In smcr the state lives in each process, so each process that uses SMC
(:func:`start`, called by the socket layer on its first SMC-relevant socket:
a listen, a handshake, a fallback) opens an endpoint of its own
(:mod:`smcr.diag.server`) in its user's private directory
(:mod:`smcr.diag.paths`), and ``smcr ss``/``stats``/``linkgroup``/``top`` ask
every endpoint they may see (:mod:`smcr.diag.client`).  Counters are the
process's :data:`~smcr.stack.counters.COUNTERS`; at exit they are left in the
directory (:mod:`smcr.diag.store`) so host totals include processes that ended,
by a normal exit or by SIGTERM, SIGHUP or SIGINT (:func:`keep_counters_on_signals`).

Modules: ``paths`` (where), ``protocol`` (frames), ``server`` (the endpoint's
thread), ``snapshot`` (what a process tells), ``registry`` (the listening
and fallback sockets, which the socket layer adds), ``store`` (exited
processes, reset baseline), ``trace`` (``smcr trace``'s hooks and stream),
``client`` (the tools' side).
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
from types import FrameType
from typing import TYPE_CHECKING

from smcr.stack.counters import COUNTERS

if TYPE_CHECKING:
    from smcr.diag.server import Endpoint

__all__ = ["COUNTERS", "SIGNALS", "endpoint", "keep_counters_on_signals", "start", "stop"]



SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
"""The signals that end a process the usual way (a service manager, a closed terminal,
Ctrl-C): the counters are kept as at a normal exit (:func:`keep_counters_on_signals`)."""


class _State:
    """The process's endpoint, and the pid that made it (a forked child makes its own)."""

    endpoint: Endpoint | None = None
    pid = 0  # the process that tried last
    persisted = False  # the counters are left (at exit or a signal): never twice


_state = _State()
_lock = threading.Lock()


def _forked_child() -> None:
    """A lock another thread held (in :func:`start`) when this process forked stays held
    in the child, where that thread does not exist: the child's first :func:`start`
    would wait for ever.  The child gets a fresh one, and lets go of the parent's
    endpoint (:meth:`~smcr.diag.server.Endpoint.drop_inherited`)."""
    global _lock  # noqa: PLW0603 - the module's own lock, replaced in a forked child
    _lock = threading.Lock()
    if _state.endpoint is not None:  # the parent's: its descriptors go (not its file)
        _state.endpoint.drop_inherited()


os.register_at_fork(after_in_child=_forked_child)


def start() -> None:
    """Open this process's endpoint if it has none (cheap after the first call).

    Failures (no private directory, ``SMCR_DIAG=0``) leave the process without
    one: observability must never stop a connection.
    """
    if _state.pid == os.getpid():
        return
    with _lock:
        if _state.pid == os.getpid():
            return
        pid = _state.pid = os.getpid()
        _state.endpoint = None  # a forked child: the parent's endpoint is the parent's
        _state.persisted = False
        from smcr.diag import paths  # noqa: PLC0415 - nothing of this on import

        if not paths.enabled():
            return
        from smcr.diag import server, snapshot, trace  # noqa: PLC0415

        try:
            directory = paths.ensure_private(paths.own_directory())
            _state.endpoint = server.Endpoint(paths.socket_path(directory, pid),
                                              snapshot.answer,
                                              {"trace": trace.open_stream})  # fmt: skip
        except OSError:
            return
        atexit.register(_at_exit, pid)
        keep_counters_on_signals()


def keep_counters_on_signals() -> None:
    """Leave the counters when :data:`SIGNALS` end the process, as at a normal exit.

    A signal whose action is the default kills the process without its ``atexit``:
    its counts left the host totals (a server stopped by SIGTERM, uvicorn among
    them: it handles SIGTERM, then restores the handler it found and raises the
    signal again).  So where the action is still the default, a handler leaves
    the counters, restores the default and raises the signal again: the process
    still dies of it, as it would have.  A handler the program installed first
    is left alone (it decides how the process ends; one that exits normally runs
    ``atexit``); one installed after ours finds ours and, as uvicorn, restores it.
    Python's own SIGINT handler raises KeyboardInterrupt, a normal exit.  Only
    the main thread may set handlers: ``smcr run`` calls this at start (through
    :func:`start`), before the program sets its own.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in SIGNALS:
        if signal.getsignal(sig) == signal.SIG_DFL:
            signal.signal(sig, _on_signal)


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    """Leave the counters, then die of the signal with its default action."""
    _at_exit(os.getpid())
    signal.signal(signum, signal.SIG_DFL)
    signal.raise_signal(signum)


def endpoint() -> Endpoint | None:
    """This process's endpoint, if it has one."""
    return _state.endpoint if _state.pid == os.getpid() else None


def stop() -> None:
    """Close the endpoint (its socket file goes); the counters are not persisted."""
    ep = endpoint()
    if ep is not None:
        ep.close()


def _at_exit(pid: int) -> None:
    """Leave the final counters (if any) and take the endpoint away."""
    if pid != os.getpid() or _state.persisted:
        return
    ep = endpoint()
    if ep is None:
        return
    from smcr.diag import snapshot, store  # noqa: PLC0415

    _state.persisted = True
    if COUNTERS.any():
        store.persist_exit(ep.path.parent, snapshot.counters()["counters"], pid)
    ep.close()
