"""The lane's wait for a blocking read (``_lane.c``'s ``wait_readable``), bound to the
compiled classes it reads.

Why in C: on a busy host a blocking request/response program's round trip lasts what both
ends' CPU costs (one CPU is free and the two ends take turns on it), and a blocked reader's
wait in compiled Python (:meth:`Progress.wait <smcr.stack.progress.Progress.wait>`,
``_app_poll``, ``_sleep_on_cq``: the poller's role, the CQ's arms, the sleep, the news)
spent about two microseconds of it per message in calls, boxed floats and lists.  The lane
takes the same steps on the same objects where no spin is allowed (the case of a crowded
host); a spin, another thread polling, or anything else not its case is the Python's, as
before.  Its steps are in ``_lane.c``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from smcr.stack import inplace, reader
from smcr.stack.progress import LONGEST_SLEEP, SPIN, Progress
from smcr.stack.readiness import DeferredChecks
from smcr.stack.spin import SpinPolicy
from smcr.stack.trim import IdleTrim

GROUP = "smcr_native"
"""mypyc's name for the compiled build (:data:`smcr.nativebuild.GROUP`): its shared library
is the module ``<GROUP>__mypyc``, whose compiled methods the lane's wait calls natively."""


def bound() -> Callable[[Any, Any, int], bool] | None:
    """The lane's ``wait_readable``, bound; None without the lane, where the lane's send and
    read are not bound (:mod:`smcr.stack.conn` binds them, then this, into
    :data:`WAIT_READABLE`), or in a process whose classes are not the compiled ones."""
    lane = inplace.LANE
    library = getattr(sys.modules.get(f"{GROUP}__mypyc"), "__file__", None)
    if lane is None or reader.FOLLOW is None or library is None:
        return None
    try:
        lane.bind_waiter(Progress, SpinPolicy, DeferredChecks, IdleTrim, "app", float(SPIN),
                         float(LONGEST_SLEEP), library)  # fmt: skip
    except TypeError:
        return None
    wait: Callable[[Any, Any, int], bool] = lane.wait_readable
    return wait


WAIT_READABLE: Callable[[Any, Any, int], bool] | None = None
"""``wait_readable(datapath, c, need)``: True once ``c.readable(need)``, waited in C; False
where it is not its case (:meth:`Progress.wait <smcr.stack.progress.Progress.wait>` waits
on from there).  Tests set it to None to run the Python in a compiled process."""
