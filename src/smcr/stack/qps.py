"""The runtime's queue pairs: made for the engine, brought up and torn down as it asks
(Linux ``smc_ib_create_queue_pair``, ``smc_ib_modify_qp_*``, ``smc_ib_destroy_queue_pair``).

Every port's QPs complete into the runtime's one CQ (:class:`~smcr.stack.hostconn.PortRes`).
Errors are returned, not acted on: the executor fails the link
(:class:`~smcr.stack.executor.Executor`).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable

from smcr.core import QpToRtr
from smcr.rdma import (
    AccessFlag,
    PathMtu,
    QpAttr,
    QpAttrMask,
    QpCap,
    QpState,
    rc_bring_up,
)
from smcr.rdma.base import QueuePair
from smcr.rdma.completion import CompletionQueue
from smcr.stack.hostconn import PortRes, Taps
from smcr.stack.inplace import InPlace
from smcr.stack.wrslots import RECV_SLOTS, SEND_SLOTS, WorkRequests

QP_ACCESS = AccessFlag.LOCAL_WRITE | AccessFlag.REMOTE_WRITE


class QueuePairs:
    """The QPs of one runtime, by number (module docstring)."""

    def __init__(self, ports: list[PortRes], cq: CompletionQueue, wr: WorkRequests,
                 taps: Taps, max_inline: int) -> None:  # fmt: skip
        self.ports = ports
        self.cq = cq
        self.wr = wr
        self.taps = taps
        self.max_inline = max_inline
        self.qps: dict[int, QueuePair] = {}
        self.qp_port: dict[int, int] = {}
        """QPN -> port, for the QPs of ports other than 0."""
        self.setup: dict[int, list[tuple[QpAttr, QpAttrMask]]] = {}
        """QPN -> its bring-up steps, from RTR until RTS."""
        self.keep: set[int] = set()
        """QPs whose destruction waits (:meth:`destroy`, :meth:`quiet`): at exit, those a
        peer may still send over (:meth:`Engine.links_peers_may_use
        <smcr.core.engine.Engine.links_peers_may_use>`)."""
        self.kept: dict[int, QueuePair] = {}
        """The QPs of :attr:`keep` the engine has let go; their RNIC still acknowledges
        what arrives, the host takes no notice of it."""
        self._delivery_marks: dict[int, int] = {}
        """Each QP's :meth:`~smcr.rdma.base.QueuePair.delivery_mark` at the last look."""
        self._delivery_looked = 0.0  # when delivered() last looked
        self.in_place: InPlace | None = None
        """The receiver every new QP gets (:mod:`smcr.stack.inplace`), once the executor
        has made it."""

    def delivered(self, now: float) -> list[tuple[int, float]]:
        """The QPs that delivered since the last look, each with when that look was (the
        executor tells the engine at every timer check, :data:`~smcr.stack.executor.TIMER_GRAIN`,
        while the progress thread runs; :meth:`QueuePair.delivery_mark
        <smcr.rdma.base.QueuePair.delivery_mark>`), so that an LLC wait gives up on a
        dead link only, not on one slowed by loss.  A move is dated at the previous look:
        after a long sleep that is early, and a wait that ran out meanwhile ends as in
        Linux (a killed peer's link is not given more time for what it sent before)."""
        marks: dict[int, int] = {}
        moved: list[tuple[int, float]] = []
        seen, since = self._delivery_marks, self._delivery_looked
        for qpn, qp in self.qps.items():
            mark = qp.delivery_mark()
            if mark is not None:
                marks[qpn] = mark
                if seen.get(qpn) != mark:
                    moved.append((qpn, since))
        self._delivery_marks, self._delivery_looked = marks, now
        return moved

    def new_qp(self, port: int = 0) -> tuple[int, int]:
        """A QP in RESET on ``port``'s RNIC, with a random initial PSN.

        QP numbers are unique in the process (the engine finds a link by it): the RoCE
        RNIC draws them process-wide, the shm RNIC per device, so a number another port
        uses is drawn again.
        """
        res = self.ports[port]
        cap = QpCap(max_send_wr=SEND_SLOTS, max_recv_wr=RECV_SLOTS,
                    max_inline_data=self.max_inline)  # fmt: skip
        qp = res.pd.create_qp(self.cq, self.cq, cap)
        while qp.qp_num in self.qps or qp.qp_num in self.qp_port:
            again = res.pd.create_qp(self.cq, self.cq, cap)
            qp.destroy()
            qp = again
        self.qps[qp.qp_num] = qp
        if self.in_place is not None:
            qp.set_receiver(self.in_place.receive, self.in_place.take_run,
                            self.in_place.c_run())  # fmt: skip
        if port:
            self.qp_port[qp.qp_num] = port
        tap = self.taps.tap
        if tap is not None:
            tap.new_qp(self.taps.host, qp.qp_num)
        return qp.qp_num, secrets.randbits(24)

    def port_of(self, qpn: int) -> int:
        """The port (RNIC) a QP of this runtime is on."""
        return self.qp_port.get(qpn, 0)

    def to_rtr(self, a: QpToRtr, sq_psn: int) -> str:
        """INIT and RTR (the peer's QP known), then the receives posted.

        :returns: "" or why it failed.
        """
        qp = self.qps[a.qpn]
        steps = rc_bring_up(dgid=a.peer_gid, dest_qp_num=a.peer_qpn, rq_psn=a.peer_psn,
                            sq_psn=sq_psn, access=QP_ACCESS,
                            path_mtu=PathMtu(max(1, min(a.mtu, 5))), hop_limit=a.hop_limit,
                            dmac=a.dmac)  # fmt: skip
        try:
            qp.modify(*steps[0])
            qp.modify(*steps[1])
            self.wr.post_first(a.qpn, qp, self.ports[self.qp_port.get(a.qpn, 0)])
        except (OSError, IndexError) as exc:
            return f"RTR: {exc}"
        self.setup[a.qpn] = steps
        return ""

    def to_rts(self, qpn: int) -> str:
        """RTS (the link confirmed).  :returns: "" or why it failed."""
        qp = self.qps.get(qpn)
        steps = self.setup.pop(qpn, None)
        if qp is not None and steps is not None:
            try:
                qp.modify(*steps[2])
            except OSError as exc:
                return f"RTS: {exc}"
        return ""

    def to_err(self, qpn: int) -> None:
        """Move a QP to ERR: what it had posted completes as flushes."""
        qp = self.qps.get(qpn)
        if qp is not None:
            try:
                qp.modify(QpAttr(qp_state=QpState.ERR), QpAttrMask.STATE)
            except OSError:
                pass

    def destroy(self, qpn: int, drain: bool) -> None:
        """Destroy a QP; its receive slots go back to the pool.

        ``drain``: the link is cleared while its group lives (failover): the QP is first
        moved to ERR, so what it had delivered completes into the CQ and its other
        receives flush (Linux ``smc_wr_drain_cq`` before ``smcr_link_clear``); their
        slots come back as those completions are taken.  Otherwise at once.  A QP of
        :attr:`keep` is only set aside (:attr:`kept`) while it carries packets
        (:meth:`destroy_kept` ends it).
        """
        kept = self.qps.get(qpn) if qpn in self.keep else None
        if kept is not None and kept.delivery_mark() is not None:  # (shm: nothing in flight)
            self.kept[qpn] = kept
            return
        self.qp_port.pop(qpn, None)
        qp = self.qps.pop(qpn, None)
        drained = False
        if qp is not None:
            if drain:
                try:
                    qp.modify(QpAttr(qp_state=QpState.ERR), QpAttrMask.STATE)
                    drained = True
                except OSError:
                    pass
            qp.destroy()
        self.wr.release(qpn, drained)

    def quiet(self) -> tuple[bool, tuple[int | None, ...]]:
        """Of the kept QPs: whether the peers acknowledged all they were sent, and what
        their transports delivered so far (:meth:`QueuePair.delivery_mark
        <smcr.rdma.base.QueuePair.delivery_mark>`): the host destroys them once this
        stays the same for a while (the peers have nothing more to say)."""
        qps = list(self.kept.values())
        return all(qp.acknowledged() for qp in qps), _marks(qps)

    def mark_of(self, qpn: int) -> int | None:
        """QP ``qpn``'s :meth:`~smcr.rdma.base.QueuePair.delivery_mark`: what its transport
        delivered so far; None for a QP that delivers at once (shm) or is gone.  A close
        that waits for its send buffer waits on while it moves
        (:meth:`Closing.close_later <smcr.stack.closing.Closing.close_later>`)."""
        qp = self.qps.get(qpn)
        return qp.delivery_mark() if qp is not None else None

    def marks(self) -> tuple[int | None, ...]:
        """What every QP's transport delivered so far (:meth:`QueuePair.delivery_mark
        <smcr.rdma.base.QueuePair.delivery_mark>`): a change says the links deliver."""
        return _marks(self.qps.values())

    def destroy_kept(self) -> None:
        """Destroy the QPs :meth:`destroy` kept."""
        self.keep = set()
        for qpn in list(self.kept):
            del self.kept[qpn]
            self.destroy(qpn, False)

    def destroy_all(self) -> None:
        """Destroy every QP (the runtime closes)."""
        for qp in list(self.qps.values()):
            qp.destroy()
        self.qps.clear()


def _marks(qps: Iterable[QueuePair]) -> tuple[int | None, ...]:
    """The QPs' :meth:`~smcr.rdma.base.QueuePair.delivery_mark`, in order."""
    return tuple(qp.delivery_mark() for qp in qps)
