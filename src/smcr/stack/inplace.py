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

import time

from smcr.core import Action
from smcr.core.engine import Engine
from smcr.stack.counters import COUNTERS
from smcr.stack.hostconn import Taps


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
        <smcr.rdma.base.QueuePair.set_receiver>`): whether the engine took the SEND."""
        if self.taps.tap is not None:
            return False
        if self.engine.take_cdc(qpn, area, off, n, time.monotonic(), self.out):
            self.taken += 1
            COUNTERS.inplace_cnt += 1
            return True
        return False

    def take_actions(self) -> list[Action]:
        """The actions of the CDCs taken since the last call."""
        out = self.out
        if out:
            self.out = []
        return out
