"""CDCs taken in place: the runtime's receiver for QPs that offer one (shm,
:meth:`QueuePair.set_receiver <smcr.rdma.base.QueuePair.set_receiver>`).

A CDC that went through a receive WR costs, besides what the engine does with its
fields, a copy into the runtime's receive buffer, a completion object, the CQ's queue,
the executor's batch and the receive's repost.  Read where the peer placed it, in the
QP's receive ring, it costs the engine's work only: the receiver hands it to
:meth:`Engine.take_cdc <smcr.core.engine.Engine.take_cdc>` and keeps the actions that
come of it for the executor, which runs them where the CQ's poll says so
(:data:`~smcr.rdma.completion.TAKEN_IN_PLACE`), before the completions behind them.
LLC messages, malformed CDCs and anything while a tap watches (``smcr trace`` shows
what the receives carried) are completed as before.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any, Final

from smcr.bound import monotonic
from smcr.core import Action
from smcr.core.connection import Connection, Rmb
from smcr.core.engine import Engine
from smcr.core.linkgroup import Link, LinkGroup
from smcr.core.state import EngineState
from smcr.rdma.shm.qp import POST_INLINE, ShmQp
from smcr.stack.counters import COUNTERS, Counters
from smcr.stack.hostconn import Taps


def _c_lane() -> ModuleType | None:
    """The fast lane's C (``_lane.c``), built with the compiled modules and served with them
    (:mod:`smcr.native`), bound to their classes; None in a pure-Python process."""
    try:
        lane = importlib.import_module("smcr.stack._lane")
        lane.bind(EngineState, Link, LinkGroup, Connection, Rmb, POST_INLINE, ShmQp)
    except (ImportError, TypeError):  # (TypeError: these classes are not the compiled ones)
        return None
    return lane


LANE: ModuleType | None = _c_lane()
"""The C that takes the common CDCs of a run and posts a send's common case (``_lane.c``: the
engine's own objects, no Python objects per message; :meth:`Executor.send_inline
<smcr.stack.executor.Executor.send_inline>`); tests set it to None to run the Python in a
compiled process (before the runtime's QPs are made: :meth:`InPlace.c_run` is read then).
The lane's per-message functions below are bound as this module is imported: setting it
later leaves them on."""

# The lane's per-message functions, bound once: a compiled module's ``LANE.send_now(...)``
# looks ``LANE`` up in this module and ``send_now`` in the lane's on every call (smcr.bound).
SEND_NOW: Final[Callable[[Any, Any], int] | None] = None if LANE is None else LANE.send_now
"""``LANE.send_now``: a whole send's common case."""
READ_NOW: Final[Callable[..., Any] | None] = None if LANE is None else LANE.read_now
"""``LANE.read_now``: a non-blocking read's common case (the bytes read, or the bytes)."""
READ_FAST: Final[Callable[..., int] | None] = None if LANE is None else LANE.read_fast
"""``LANE.read_fast``: a read's copy-out once the bytes are there."""
SEND_INLINE: Final[Callable[..., int] | None] = None if LANE is None else LANE.send_inline
"""``LANE.send_inline``: an inline send's post."""


class InPlace:
    """The receiver of one runtime (module doc)."""

    def __init__(self, engine: Engine, taps: Taps) -> None:
        self.engine = engine
        self.taps = taps
        self.out: list[Action] = []
        """Actions of CDCs taken, for the executor to run (:meth:`take_actions`)."""
        self.taken = 0
        """CDCs this runtime took in place (the process's count: ``smcr stats -d``)."""

    def receive(self, qpn: int, area: memoryview, off: int, n: int) -> bool:
        """The receiver (:meth:`QueuePair.set_receiver
        <smcr.rdma.base.QueuePair.set_receiver>`): whether the engine took the SEND.  The
        QP offers it what :meth:`take_run` (the lane) left: the Python's cases."""
        if self.taps.tap is not None:
            return False
        if self.engine.take_cdc(qpn, area, off, n, monotonic(), self.out):
            self.taken += 1
            COUNTERS.inplace_cnt += 1
            return True
        return False

    def take_run(self, qpn: int, area: memoryview, lens: int, base: int, stride: int,
                 depth: int, slot_size: int, consumed: int, produced: int,
                 posted: int) -> tuple[int, int]:  # fmt: skip
        """The receiver's way through a run of SENDs (:data:`~smcr.rdma.base.RingTaker`):
        the CDCs the lane takes (``_lane.c``), up to the first it leaves to :meth:`receive`."""
        lane = LANE
        if lane is None or self.taps.tap is not None:
            return consumed, posted
        done: int
        done, posted = lane.take_run(self.engine.state, qpn, area, lens, base, stride, depth,
                                     slot_size, consumed, produced, posted, monotonic())
        if done != consumed:
            self.taken += done - consumed
            COUNTERS.inplace_cnt += done - consumed
        return done, posted

    def c_run(self) -> tuple[object, object] | None:
        """:meth:`take_run`'s C form with this receiver as its context, for an RNIC whose
        poll runs in C (:meth:`QueuePair.set_receiver <smcr.rdma.base.QueuePair.set_receiver>`'s
        ``c_run``: ``_lane.c``'s ``ring_take``); None without it."""
        taker = RING_TAKER if LANE is not None else None
        return None if taker is None else (taker, self)

    def take_actions(self) -> list[Action]:
        """The actions of the CDCs taken since the last call."""
        out = self.out
        if out:
            self.out = []
        return out


def _c_taker() -> object | None:
    """The capsule of ``_lane.c``'s ``ring_take`` (:meth:`InPlace.c_run`), bound to the
    compiled classes it reads; None without the lane."""
    lane = LANE
    if lane is None:
        return None
    try:
        capsule: object = lane.bind_taker(InPlace, Taps, Engine, Counters, COUNTERS)
    except TypeError:
        return None
    return capsule


RING_TAKER: object | None = _c_taker()
""":meth:`InPlace.take_run` in C for C callers (a capsule of the RNIC layer's ring-taker ABI,
:data:`~smcr.rdma.base.RingTaker`); None without the lane."""
