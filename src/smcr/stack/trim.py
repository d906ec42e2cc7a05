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

A quiet connection that has read a page or more since it last sent its consumer cursor
sends it (a CDC), so that its peer's writer can give back in turn: a reader sends its
cursor only once much is unconfirmed (Linux's rule, ``smc_tx_consumer_update``), and a
slow one-way stream's writer would otherwise never learn that up to half its ring was
read.  A closing connection is left alone: its buffers go back at its release (and the
peer may give its RMB to a new connection before we hear that it closed).

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
from smcr.rdma.base import PAGE, QueuePair
from smcr.stack.counters import COUNTERS
from smcr.stack.hostconn import HostConn

LOOK_EVERY: Final = 1.0
"""Seconds between looks while connections have traffic (none once all are quiet)."""
QUIET_BYTES: Final = 1 << 20
"""A connection that wrote at most this many bytes since the previous look gives back."""
TRICKLE_STEP: Final = 8 * PAGE
"""The least that a connection still writing (a trickle: some bytes since the previous look,
at most :data:`QUIET_BYTES`) gives back at once; one that wrote nothing gives back any
whole page.  Why: a give-back of an shm segment punches it, and the kernel then flushes the
TLB of every CPU that runs either process, an interrupt to each (a VM exit each under a
hypervisor), whatever the length; 1,000 connections of 100-byte request/responses, each
giving back the page or so it wrote a second, spent 2.7% of the server's CPU in madvise.
A page at a time costs that many interrupts; 8 at a time, an eighth.  The cost in memory:
at most this much more of each ring held while its connection trickles, none once quiet
(and a quarter of a smaller ring: :func:`trickle_step`)."""


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
            qps: dict[int, QueuePair]) -> list[int]:  # fmt: skip
        """Give back what quiet connections touched (lock held).

        :returns: the connections whose consumer cursor the peer should hear now: quiet
            ones that read at least a page since they last told it (a reader tells it
            only once much is unconfirmed, as Linux's does, and a slow one-way stream's
            writer would never learn that up to half its ring was read)."""
        tell: list[int] = []
        if not self.due or now < self.due:
            return tell
        busy = False
        for hc in conns.values():
            c = engine_conns.get(hc.conn_id)
            if c is None or not c.peer_rmb_size or c.sends_ended():
                continue  # (a closing connection's buffers go back at its release)
            sent, seen = c.tx_sent, hc.trim_seen
            prod, prod_seen = c.rx_prod, hc.trim_prod
            hc.trim_seen, hc.trim_prod = sent, prod
            if sent != seen or prod != prod_seen:  # (traffic: look again at the next)
                busy = True
            if seen < 0:
                continue
            if prod - prod_seen <= QUIET_BYTES and c.rx_cons - c.rx_cons_sent >= PAGE:
                tell.append(c.id)
            # (bytes that wait in the send buffer wait for the peer's CDC, which touches
            # the connection: the look after it sees them go)
            if sent - seen <= QUIET_BYTES and c.tx_app == sent:
                busy = not trim_connection(hc, c, qps.get(c.qpn), sent == seen) or busy
        self.due = now + LOOK_EVERY if busy else 0.0
        return tell


def trim_connection(hc: HostConn, c: Connection, qp: QueuePair | None,
                    quiet: bool = True) -> bool:  # fmt: skip
    """Give back what ``c`` touched and nobody needs: the peer's RMB behind its consumer
    cursor, our send buffer behind what a failover would write again (module doc); each
    part once a whole page of it can go, or, where the connection still writes (not
    ``quiet``), once :func:`trickle_step` of that ring can.

    :returns: False when the peer's RMB could not be given back now (its QP busy): the
        next look tries again."""
    sent, cons = c.tx_sent, c.peer_cons
    size = c.peer_rmb_size
    low = read_behind(hc.trim_cons, sent, size)
    if cons - low >= (PAGE if quiet else trickle_step(size)):
        if qp is not None:
            done = _ring_discard(
                lambda addr, n: qp.discard_remote(c.peer_rkey, c.peer_vaddr + addr, n),
                low, cons, size)
            if done < 0:
                return False
            COUNTERS.trimmed_bytes += done
        # from the page the cursor is in: the next range has its start, read meanwhile
        hc.trim_cons = max(hc.trim_cons, cons // PAGE * PAGE)
    needed = max(c.tx_fin, cons)  # (a failover writes again from here)
    size = c.sndbuf_size
    low = read_behind(hc.trim_sent, c.tx_app, size)
    if needed - low >= (PAGE if quiet else trickle_step(size)):
        mr = hc.sndbuf_mr
        if mr is not None:
            _ring_discard(mr.discard, low, needed, size)  # (not counted: seldom written)
        hc.trim_sent = max(hc.trim_sent, needed // PAGE * PAGE)
    return True


def read_behind(given_back: int, written: int, size: int) -> int:
    """Where the positions that may go begin, in a ring of ``size`` bytes written up to
    ``written`` (absolute) and given back up to ``given_back``: no earlier than ``written
    - size``, whose ring slot the next byte takes (an older position's slot holds a newer
    byte, maybe one still to be read)."""
    return max(given_back, written - size)


def ring_pieces(low: int, high: int, size: int) -> list[tuple[int, int]]:
    """The ring slots ``(offset, length)`` of the absolute byte range ``[low, high)``, at
    most ``size`` long, in a ring of ``size`` bytes: one piece, or two where it wraps."""
    start = low % size
    first = min(high - low, size - start)
    pieces = [(start, first)]
    if high - low > first:
        pieces.append((0, high - low - first))
    return pieces


def trickle_step(ring: int) -> int:
    """What a trickling connection gives back at once, with a ring of ``ring`` bytes:
    :data:`TRICKLE_STEP`, or a quarter of a smaller ring (whole pages, at least one)."""
    return max(PAGE, min(TRICKLE_STEP, ring // 4 // PAGE * PAGE))


def _ring_discard(discard: Callable[[int, int], int], low: int, high: int, size: int) -> int:
    """``discard(offset, length)`` for each of :func:`ring_pieces`; the bytes given back,
    or -1 as soon as a call says not now (-1)."""
    done = 0
    for offset, length in ring_pieces(low, high, size):
        n = discard(offset, length)
        if n < 0:
            return -1
        done += n
    return done
