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
by a normal exit or by SIGTERM, SIGHUP or SIGINT (:func:`smcr.exits.on_exit`).

Modules: ``paths`` (where), ``protocol`` (frames), ``server`` (the endpoint's
thread), ``snapshot`` (what a process tells), ``registry`` (the listening
and fallback sockets, which the socket layer adds), ``store`` (exited
processes, reset baseline), ``trace`` (``smcr trace``'s hooks and stream),
``client`` (the tools' side).
"""

from __future__ import annotations

import functools
import os
import threading
from typing import TYPE_CHECKING

from smcr import exits
from smcr.stack.counters import COUNTERS

if TYPE_CHECKING:
    from smcr.diag.server import Endpoint

__all__ = ["COUNTERS", "endpoint", "start", "stop"]


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
        # at exit, or as SIGTERM, SIGHUP or SIGINT end the process (a server stopped by
        # its service manager): their default action skips atexit, and with it the counts
        exits.on_exit(functools.partial(_at_exit, pid))


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
