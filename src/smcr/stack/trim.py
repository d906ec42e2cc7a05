"""Quiet connections give back the memory their traffic touched.

An SMC-R connection's buffers are big (4 MiB each way by default: a bulk stream needs
them) and backed only where written (:func:`~smcr.rdma.base.zeroed_memory`, shm
segments).  A connection that moved a few MiB and then went quiet, as a kept-alive HTTP
connection does, would keep every page it ever touched for as long as it stays open:
1,000 of them held 4 GB in each process, where TCP's idle sockets hold nothing.  So would,
over hours, one that sends a little now and then (a chat, a heartbeat): its writes move
through the whole ring.

So :class:`IdleTrim` looks every :data:`LOOK_EVERY` seconds while the runtime sees
traffic, and for each connection that wrote at most :data:`QUIET_BYTES` since its
previous look (none waiting in the send buffer) gives back:

* the part of the **peer's RMB** the peer has read since (through the QP,
  :meth:`~smcr.rdma.base.QueuePair.discard_remote`: the writer is the one end that
  knows which part it will not write into now, where the peer cannot know when its
  sender writes; shm punches its segment, the page leaves both processes);
* the part of **our send buffer** whose bytes nobody needs any more: written, and
  either confirmed or read by the peer (a failover writes again from the later of
  the two, :meth:`~smcr.core.connection.Connection.switch_cursor`).

Never a byte that is still to be read or sent: only the ring positions behind the
peer's consumer cursor that no newer byte has taken, in whole pages (the one the cursor
is in stays).  A busy stream is left alone: its pages would only fault in again, in both
processes (about 2 us a page: at :data:`QUIET_BYTES` a second, 0.05% of a CPU).  The
runtime runs :meth:`IdleTrim.run` among its timers (lock held) and bounds its pollers'
sleep by :attr:`IdleTrim.due` while a look is due.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from smcr.core.connection import Connection
from smcr.rdma.base import QueuePair
from smcr.stack.counters import COUNTERS
from smcr.stack.hostconn import HostConn

LOOK_EVERY: Final = 1.0
"""Seconds between looks while connections have traffic (none once all are quiet)."""
QUIET_BYTES: Final = 1 << 20
"""A connection that wrote at most this many bytes since the previous look gives back."""


class IdleTrim:
    """When the next look is due, and the look itself (module doc)."""

    def __init__(self) -> None:
        self.due = 0.0
        """When :meth:`run` looks next (``time.monotonic()``), 0.0 while nothing waits."""

    def arm(self, now: float) -> None:
        """Traffic was seen: look :data:`LOOK_EVERY` from now (unless a look is due)."""
        if not self.due:
            self.due = now + LOOK_EVERY

    def run(self, now: float, conns: dict[int, HostConn], engine_conns: dict[int, Connection],
            qps: dict[int, QueuePair]) -> None:  # fmt: skip
        """Give back what quiet connections touched (lock held)."""
        if not self.due or now < self.due:
            return
        busy = False
        for hc in conns.values():
            c = engine_conns.get(hc.conn_id)
            if c is None or not c.peer_rmb_size:
                continue
            sent, seen = c.tx_sent, hc.trim_seen
            hc.trim_seen = sent
            if sent != seen:  # (traffic: look again at the next)
                busy = True
                if seen < 0 or sent - seen > QUIET_BYTES:
                    continue
            if c.tx_app == sent:  # (none waits in the send buffer)
                trim_connection(hc, c, qps.get(c.qpn))
            else:
                busy = True
        self.due = now + LOOK_EVERY if busy else 0.0


def trim_connection(hc: HostConn, c: Connection, qp: QueuePair | None) -> None:
    """Give back what ``c`` touched and nobody needs: the peer's RMB behind its consumer
    cursor, our send buffer behind what a failover would write again (module doc)."""
    sent, cons = c.tx_sent, c.peer_cons
    size = c.peer_rmb_size
    low = max(hc.trim_cons, sent - size)  # (older positions hold newer bytes now)
    if cons > low and qp is not None:
        COUNTERS.trimmed_bytes += _ring_discard(
            lambda addr, n: qp.discard_remote(c.peer_rkey, c.peer_vaddr + addr, n),
            low, cons, size)
    hc.trim_cons = cons
    mr = hc.sndbuf_mr
    needed = max(c.tx_fin, cons)  # (a failover writes again from here)
    if mr is not None:
        size = c.sndbuf_size
        low = max(hc.trim_sent, c.tx_app - size)
        if needed > low:
            COUNTERS.trimmed_bytes += _ring_discard(mr.discard, low, needed, size)
    hc.trim_sent = max(hc.trim_sent, needed)


def _ring_discard(discard: Callable[[int, int], int], low: int, high: int, size: int) -> int:
    """Call ``discard(offset, length)`` for the ring positions of the absolute byte range
    ``[low, high)`` (at most ``size`` long) of a ring of ``size`` bytes: one call, or two
    where the range wraps.  Returns the bytes given back."""
    start = low % size
    n = high - low
    first = min(n, size - start)
    done = discard(start, first)
    if n > first:
        done += discard(0, n - first)
    return done
