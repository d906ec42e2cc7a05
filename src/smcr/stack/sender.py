"""The lane's whole send (``_lane.c``'s ``send_now``), bound to the compiled classes it reads.

Why in C: a send's common case (a blocking request/response, an event loop's answer)
went through :meth:`DataPath.try_send <smcr.stack.conn.DataPath.try_send>`, ``send_fast``,
:meth:`Executor.send_inline <smcr.stack.executor.Executor.send_inline>`, the executor's
``post_inline`` and the QP's ``ring_after``, five layers of compiled Python around the C
post, each paying CPython's object machinery (attribute lookups, boxed integers, calls
through bound methods); ``send_now`` takes the same steps in one call on the same
objects.  Its case and its steps are in ``_lane.c``; anything else it leaves untouched
(``-2``), and the Python path runs as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from smcr.rdma import bells, doorbell
from smcr.rdma.shm.cq import ShmCompletionQueue
from smcr.rdma.shm.peer import PeerLink
from smcr.stack import inplace
from smcr.stack.executor import Executor, post_inline
from smcr.stack.hostconn import HostConn
from smcr.stack.wakeup import Wakeups


def bind(datapath: type, byte_view: Callable[[Any], memoryview]) -> bool:
    """Bind the lane's sender to the compiled classes (``datapath``: the data path's class,
    ``byte_view``: how the Python's post sees a caller's buffer), and to the doorbells'
    rings in C (a CQ's, and a consumer bell's by name through the process's ringing
    socket); whether it sends from now on (False without the lane, or in a process whose
    classes are not the compiled ones)."""
    lane = inplace.LANE
    if lane is None:
        return False
    calls = doorbell.C_CALLS
    try:
        lane.bind_sender(datapath, Executor, HostConn, Wakeups, ShmCompletionQueue, PeerLink,
                         post_inline, byte_view, calls.ring if calls is not None else None,
                         calls.ring_rid if calls is not None else None, bells.RINGERS)
    except TypeError:
        return False
    return True
