"""The RC queue pair of the verbs RNIC: smcr's QP model over a device QP.

The state table and the checks stay smcr's (:class:`~smcr.rdma.base.QueuePair`), so a
modify the device would refuse is refused first with the same words as on the other
RNICs; a modify that passes goes to the device with the same mask (Linux SMC-R's
``smc_ib_modify_qp_init/rtr/rts`` attributes, :func:`smcr.rdma.qpstate.rc_bring_up`).
The address vector is the device's: its port and the ``sgid_index`` of its RoCE v2 GID,
looked up at each modify (the kernel fills the GID table anew when the net device comes
back up, not always at the same index);
the hop limit is the caller's (1 on a subnet, 64 through a router); the destination MAC
is the kernel's to resolve (a RoCE device does so from the destination GID).

A device QP that fails on its own (retries exceeded, a remote access error) reports it
in a completion; the completion queue then marks this QP ERR (:meth:`VerbsQp.failed`),
so :attr:`state` says what the device's QP is.
"""

from __future__ import annotations

import ctypes
import errno
import ipaddress
import socket
from collections.abc import Iterable
from typing import Any, Protocol

from smcr.rdma.base import ProtectionDomain, QueuePair
from smcr.rdma.ibverbs import binding
from smcr.rdma.ibverbs.cq import VerbsCq
from smcr.rdma.verbs import (
    AsyncEvent,
    AsyncEventType,
    PathMtu,
    QpAttr,
    QpAttrMask,
    QpCap,
    QpState,
    RecvWr,
    SendFlag,
    SendWr,
    VerbsError,
    WcOpcode,
    WrOpcode,
)


class QpDevice(Protocol):
    """What a QP asks of its device (:class:`~smcr.rdma.ibverbs.device.VerbsDevice`): the
    device module makes QPs, and an import back from here would close a circle."""

    @property
    def port_num(self) -> int:
        """The device port the QPs use."""

    def gid_index(self) -> int:
        """The port's GID table index of the device's RoCE v2 GID now."""

    @property
    def max_mtu(self) -> PathMtu:
        """The port's active MTU."""

    @property
    def qps(self) -> dict[int, VerbsQp]:
        """The device's QPs by number."""

    def post_async_event(self, event: AsyncEvent) -> None:
        """Queue an asynchronous event."""


class QpPd(Protocol):
    """What a QP asks of its protection domain (:class:`~smcr.rdma.ibverbs.device.VerbsPd`)."""

    @property
    def ibv(self) -> Any:
        """The device's PD (pyverbs)."""

    @property
    def device(self) -> QpDevice:
        """The device."""

_RDMA = frozenset({WrOpcode.RDMA_WRITE, WrOpcode.RDMA_WRITE_WITH_IMM, WrOpcode.RDMA_READ})
_WITH_IMM = frozenset({WrOpcode.RDMA_WRITE_WITH_IMM, WrOpcode.SEND_WITH_IMM})
#: The mask bits that a modify passes to the device as they are.
_PLAIN = (
    (QpAttrMask.ACCESS_FLAGS, "qp_access_flags"), (QpAttrMask.PKEY_INDEX, "pkey_index"),
    (QpAttrMask.PATH_MTU, "path_mtu"), (QpAttrMask.DEST_QPN, "dest_qp_num"),
    (QpAttrMask.RQ_PSN, "rq_psn"), (QpAttrMask.SQ_PSN, "sq_psn"),
    (QpAttrMask.TIMEOUT, "timeout"), (QpAttrMask.RETRY_CNT, "retry_cnt"),
    (QpAttrMask.RNR_RETRY, "rnr_retry"), (QpAttrMask.MIN_RNR_TIMER, "min_rnr_timer"),
    (QpAttrMask.MAX_QP_RD_ATOMIC, "max_rd_atomic"),
    (QpAttrMask.MAX_DEST_RD_ATOMIC, "max_dest_rd_atomic"),
)  # fmt: skip


class VerbsQp(QueuePair):
    """An RC QP of a :class:`~smcr.rdma.ibverbs.device.VerbsDevice` (module docstring)."""

    def __init__(self, pd: ProtectionDomain, owner: QpPd, send_cq: VerbsCq, recv_cq: VerbsCq,
                 device_cqs: tuple[Any, Any], cap: QpCap, sq_sig_all: bool) -> None:  # fmt: skip
        """:param device_cqs: the device's CQs behind ``send_cq`` and ``recv_cq`` (those of
        this QP's device: :meth:`VerbsCq.part_for`)."""
        pv = binding.load()
        self._pv = pv
        e = pv.enums
        init = pv.qp.QPInitAttr(
            qp_type=e.IBV_QPT_RC, scq=device_cqs[0], rcq=device_cqs[1],
            cap=pv.qp.QPCap(max_send_wr=cap.max_send_wr, max_recv_wr=cap.max_recv_wr,
                            max_send_sge=cap.max_send_sge, max_recv_sge=cap.max_recv_sge,
                            max_inline_data=cap.max_inline_data),
            sq_sig_all=int(sq_sig_all),
        )  # fmt: skip
        try:
            self.ibv = pv.qp.QP(owner.ibv, init)
        except pv.error.PyverbsError as exc:
            raise VerbsError(binding.errno_of(exc), f"create QP: {exc}") from exc
        device = owner.device
        super().__init__(pd, int(self.ibv.qp_num), send_cq=send_cq, recv_cq=recv_cq, cap=cap,
                         max_mtu=device.max_mtu)  # fmt: skip
        self.device = device
        self._recv_ids: set[int] = set()
        """Every ``wr_id`` posted as a receive (bounded by the distinct ids the caller uses):
        how a failed completion, whose opcode verbs leaves undefined, finds its queue."""
        self._bounce = (ctypes.c_char * max(cap.max_inline_data, 1))()
        self._bounce_addr = ctypes.addressof(self._bounce)
        send_cq.attach(self.qp_num, self)
        recv_cq.attach(self.qp_num, self)

    def failed(self, wr_id: int) -> WcOpcode:
        """A completion of ``wr_id`` failed: the device's QP is in ERR now (verbs moves a QP
        there before it completes work with an error); the queue the work came from."""
        self.attr.qp_state = QpState.ERR
        return WcOpcode.RECV if wr_id in self._recv_ids else WcOpcode.SEND

    # ------------------------------------------------------------- modifies

    def _device_attr(self, new: QpState, attr: QpAttr, mask: QpAttrMask) -> Any:
        pv = self._pv
        a = pv.qp.QPAttr(qp_state=int(new), cur_qp_state=int(self.attr.qp_state))
        for bit, name in _PLAIN:
            if mask & bit:
                setattr(a, name, int(getattr(attr, name)))
        if mask & QpAttrMask.PORT:
            a.port_num = self.device.port_num
        if mask & QpAttrMask.AV:
            ah = attr.ah_attr
            dgid = str(ipaddress.IPv6Address(ah.dgid).exploded)
            gr = pv.addr.GlobalRoute(dgid=pv.addr.GID(dgid), sgid_index=self.device.gid_index(),
                                     hop_limit=ah.hop_limit, traffic_class=ah.traffic_class,
                                     flow_label=ah.flow_label)  # fmt: skip
            a.ah_attr = pv.addr.AHAttr(gr=gr, is_global=1, port_num=self.device.port_num)
        return a

    def _apply_modify(self, new: QpState, attr: QpAttr, mask: QpAttrMask) -> None:
        """Commit a validated modify on the device, then in smcr's attributes."""
        try:
            self.ibv.modify(self._device_attr(new, attr, mask), int(mask))
        except self._pv.error.PyverbsError as exc:
            raise VerbsError(binding.errno_of(exc),
                             f"modify QP {self.qp_num} to {new.name}: {exc}") from exc
        self._copy_attrs(attr, mask)
        self.attr.qp_state = new

    def _to_error(self, event: str | None) -> None:
        """ERR on the device: its outstanding work completes as flushes.  A QP still in
        RESET has none, and rxe refuses that move (``EINVAL``): marked only."""
        if self.attr.qp_state is QpState.RESET:
            self.attr.qp_state = QpState.ERR
            return
        try:
            self.ibv.modify(self._pv.qp.QPAttr(qp_state=int(QpState.ERR)), int(QpAttrMask.STATE))
        except self._pv.error.PyverbsError:
            pass  # (destroyed, or the device is gone: nothing left to flush)
        self.attr.qp_state = QpState.ERR
        if event is not None:
            self.device.post_async_event(AsyncEvent(AsyncEventType.QP_FATAL, self.qp_num, event))

    def _reset(self) -> None:
        """RESET on the device: its work is dropped without completions."""
        try:
            self.ibv.modify(self._pv.qp.QPAttr(qp_state=int(QpState.RESET)),
                            int(QpAttrMask.STATE))  # fmt: skip
        except self._pv.error.PyverbsError as exc:
            raise VerbsError(binding.errno_of(exc), f"reset QP {self.qp_num}: {exc}") from exc
        self.attr = QpAttr(qp_state=QpState.RESET)

    # ---------------------------------------------------------------- posts

    def _send_wr(self, wr: SendWr) -> Any:
        pv = self._pv
        flags = wr.send_flags
        data = wr.inline_data
        if data is not None:
            n = len(data)
            if n > self.cap.max_inline_data:
                raise VerbsError(errno.EINVAL, f"{n} inline bytes, the QP takes "
                                               f"{self.cap.max_inline_data}")  # fmt: skip
            ctypes.memmove(self._bounce_addr, bytes(data), n)  # (copied again by the post)
            sges = [pv.wr.SGE(self._bounce_addr, n, 0)]
            flags |= SendFlag.INLINE
        else:
            self._check_sges(wr.sg_list, self.cap.max_send_sge)
            sges = [pv.wr.SGE(s.addr, s.length, s.lkey) for s in wr.sg_list]
        imm = socket.htonl(wr.imm_data & 0xFFFFFFFF) if wr.opcode in _WITH_IMM else 0
        swr = pv.wr.SendWR(wr_id=wr.wr_id, opcode=int(wr.opcode), num_sge=len(sges),
                           imm_data=imm, sg=sges or None, send_flags=int(flags))  # fmt: skip
        if wr.opcode in _RDMA:
            swr.set_wr_rdma(wr.rkey, wr.remote_addr)
        return swr

    def _post_send(self, wrs: SendWr | Iterable[SendWr]) -> None:
        """``ibv_post_send``, one WR at a time (an inline WR's bytes are copied by its post).

        :raises VerbsError: EINVAL in RESET/INIT/RTR or for a bad WR, ENOMEM when the send
            queue is full; WRs before the failing one stay posted, as in verbs.
        """
        state = self.attr.qp_state
        if state in (QpState.RESET, QpState.INIT, QpState.RTR):
            raise VerbsError(errno.EINVAL, f"post_send on a QP in {state.name}")
        for wr in (wrs,) if isinstance(wrs, SendWr) else wrs:
            try:
                self.ibv.post_send(self._send_wr(wr))
            except self._pv.error.PyverbsError as exc:
                raise VerbsError(binding.errno_of(exc), f"post_send: {exc}") from exc

    def _post_recv(self, wrs: RecvWr | Iterable[RecvWr]) -> None:
        """``ibv_post_recv``.

        :raises VerbsError: EINVAL in RESET or for too many SGEs, ENOMEM when full.
        """
        if self.attr.qp_state is QpState.RESET:
            raise VerbsError(errno.EINVAL, "post_recv on a QP in RESET")
        pv = self._pv
        for wr in (wrs,) if isinstance(wrs, RecvWr) else wrs:
            self._check_sges(wr.sg_list, self.cap.max_recv_sge)
            sges = [pv.wr.SGE(s.addr, s.length, s.lkey) for s in wr.sg_list]
            self._recv_ids.add(wr.wr_id)
            try:
                self.ibv.post_recv(pv.wr.RecvWR(wr_id=wr.wr_id, num_sge=len(sges),
                                                sg=sges or None))  # fmt: skip
            except pv.error.PyverbsError as exc:
                raise VerbsError(binding.errno_of(exc), f"post_recv: {exc}") from exc

    def destroy(self) -> None:
        """``ibv_destroy_qp``: no completions for what it had posted."""
        for cq in (self.send_cq, self.recv_cq):
            if isinstance(cq, VerbsCq):
                cq.detach(self.qp_num)
        self.device.qps.pop(self.qp_num, None)
        try:
            self.ibv.close()
        except Exception:
            pass
        self.attr.qp_state = QpState.ERR
