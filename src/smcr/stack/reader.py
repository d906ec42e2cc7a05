"""The lane's whole read (``_lane.c``'s ``read_now``) and its readiness update (``follow``),
bound to the compiled classes they read.

Why in C: a non-blocking read's common case (an event loop's, a server with many
connections) went through :meth:`DataPath.try_read <smcr.stack.conn.DataPath.try_read>`,
``recv_fast``, :meth:`Executor.update_readiness
<smcr.stack.executor.Executor.update_readiness>` and the readiness descriptor's
``follow``, ``set`` and ``_set_named``, each paying CPython's object machinery around a
copy and one system call (the readable datagram's drain); ``read_now`` takes the same steps
in one call on the same objects, and ``follow`` serves every other caller of
``update_readiness`` (a send, the CQ's news).  Their cases and steps are in ``_lane.c``;
anything else they leave untouched, and the Python runs as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from smcr.core.close import SmcState
from smcr.rdma import doorbell
from smcr.rdma.bells import WatchSlot
from smcr.stack import inplace
from smcr.stack.readiness import Readiness


def _bind() -> Callable[[Any, Any], int] | None:
    """The lane's ``follow``, bound to the compiled classes (None without the lane or the
    doorbell's C, or in a process whose classes are not the compiled ones)."""
    lane, calls = inplace.LANE, doorbell.C_CALLS
    if lane is None or calls is None:
        return None
    try:
        lane.bind_reader(Readiness, WatchSlot, SmcState.CLOSED, calls.drain)
    except TypeError:
        return None
    follow: Callable[[Any, Any], int] = lane.follow
    return follow


FOLLOW: Callable[[Any, Any], int] | None = _bind()
"""``Readiness.follow(c)``'s common case in C: 1 or 0 (its answer, the update made), -1 where
it is not its case (nothing changed).  Bound once, where it is used:
:meth:`Executor.update_readiness <smcr.stack.executor.Executor.update_readiness>` reads it
at import (a compiled module's look-up of another module's attribute is generic, per use),
and the lane's whole send and read follow in C (:data:`smcr.stack.inplace.SEND_NOW`,
:data:`~smcr.stack.inplace.READ_NOW`): setting it later changes nothing."""
