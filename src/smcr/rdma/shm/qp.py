"""The RC queue pair of the shm RNIC: requester and responder over shared memory.

Design: the *requester does the responder's work*.  Having mapped the peer's
receive area and MR table (handed over at RTR), ``post_send`` checks the
peer's published state exactly as a responder would (spec §5.3 and §6, in
that order), then copies: an RDMA WRITE is one copy straight into the peer's
registered region, a READ one copy out of it, a SEND one copy into the slot of
the peer's next posted receive.  The peer's thread finishes a SEND only when it
polls its receive CQ (a progress hook copies the slot into the receive buffer);
the requester rings the CQ's doorbell only when the CQ is armed for sleep
(:mod:`smcr.rdma.shm.cq`), so a busy responder costs its peers no syscalls and
no wakeups.  Consequences:

* RC ordering holds by construction: WRs of one QP run one after the other in
  the caller's thread, so a WRITE is in the target memory before the slot of a
  later SEND is published (spec §5.7).
* A violation (bad rkey, out of bounds, missing access flag, deregistered MR)
  is found *before* any byte moves, so target memory stays untouched; the
  requester completes with the status a NAK would give and both QPs go to ERR.
* RNR: ``posted`` (responder) against ``produced`` (requester) says whether a
  receive is waiting; if not, the send queue blocks and the device engine
  retries after the responder's ``min_rnr_timer``, ``rnr_retry`` times (7 means
  forever).  A responder that is not yet in RTR, or expects another PSN, is
  treated as dropping the request: retries every ``timeout`` period,
  ``retry_cnt`` times (7 means forever, as rxe does), then RETRY_EXC_ERR.
* Peer death: both connection sockets are watched by the engine; EOF moves the
  QP to ERR and flushes (measured: about 1 ms after SIGKILL on an idle host).
* A deregistration racing a WRITE already past its check lands in the old
  segment, which stays mapped here until the next look-up notices: the
  peer's other memory is never touched.

What the requester holds of its peer (socket, mappings) is in
:mod:`smcr.rdma.shm.peer`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from mmap import mmap
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Final, Protocol

from smcr.bound import monotonic
from smcr.rdma.base import ProtectionDomain, QueuePair
from smcr.rdma.completion import TAKEN_IN_PLACE, CompletionQueue
from smcr.rdma.eventloop import QpDevice
from smcr.rdma.shm import layout as lay
from smcr.rdma.shm import rendezvous as rdv
from smcr.rdma.shm import send
from smcr.rdma.shm.cq import cq_forget, cq_requester, cq_watch
from smcr.rdma.shm.inbound import Inbound
from smcr.rdma.shm.layout import (
    HDR_ACCESS,
    HDR_EPSN,
    HDR_MAX_DEST_RD_ATOMIC,
    HDR_PD,
    HDR_POSTED,
    HDR_STATE,
)
from smcr.rdma.shm.ops import OPS, check_inline
from smcr.rdma.shm.peer import PeerLink
from smcr.rdma.shm.receive import deliver
from smcr.rdma.shm.words import load_u32, load_u64, store_u32, store_u64
from smcr.rdma.stores import store
from smcr.rdma.verbs import (
    PSN_MASK,
    RNR_TIMER_SECONDS,
    AccessFlag,
    AsyncEvent,
    AsyncEventType,
    QpAttr,
    QpAttrMask,
    QpCap,
    QpState,
    RecvWr,
    SendFlag,
    SendWr,
    VerbsError,
    WcOpcode,
    WcStatus,
    WorkCompletion,
    WrOpcode,
    local_ack_timeout,
)

if TYPE_CHECKING:
    from smcr.rdma.eventloop import Timer


class ShmQpDevice(QpDevice, Protocol):
    """What a QP asks of its device (:class:`~smcr.rdma.shm.device.ShmDevice`), none of it on
    the data path: the device module makes QPs, and an import back from here would close
    a circle."""

    @property
    def name(self) -> str:
        """The device's name."""

    @property
    def gid(self) -> bytes:
        """The device's GID (its rendezvous name)."""

    @property
    def directory(self) -> Path:
        """Where the host's shm devices meet (:mod:`smcr.rdma.shm.rendezvous`)."""

    @property
    def slot_size(self) -> int:
        """The receive slot size of the device's QPs."""

    @property
    def table_fd(self) -> int:
        """The descriptor of the device's MR table, handed to peers."""


DONE: Final = 0
RNR: Final = 1
NOT_READY: Final = 2
FAILED: Final = 3
_LIVE: Final = (int(QpState.RTR), int(QpState.RTS))
_SIGNALED: Final = int(SendFlag.SIGNALED)
_INLINE: Final = int(SendFlag.INLINE)
_REMOTE_WRITE: Final = int(AccessFlag.REMOTE_WRITE)
_MR_KEY: Final = lay.MR_KEY.unpack_from
_AREA_HEADER: Final = lay.AREA_HEADER.unpack_from
_get_ident: Final = threading.get_ident

_SLOT_HEADER: Final = lay.SLOT_HEADER.unpack_from
_SLOT_HEADER_SIZE: Final = lay.SLOT_HEADER.size
_RTS: Final = QpState.RTS
_SLOT_BASE: Final = lay.AREA_HEADER_SIZE
"""Receive i's length word at ``_SLOT_BASE + 4 * i``, its slot at ``_SLOT_BASE + 4 * depth
+ i * (header + slot size)`` (:func:`~smcr.rdma.shm.layout.slot_offset`), inlined."""


#: Retry period when ``timeout`` is 0 (rxe would never retransmit and hang).
INFINITE_TIMEOUT_POLL: Final = 0.1


class ShmQp(QueuePair):
    """An RC QP of a :class:`~smcr.rdma.shm.device.ShmDevice` (create it with ``pd.create_qp``)."""

    def __init__(
        self,
        device: ShmQpDevice,
        pd: ProtectionDomain,
        qp_num: int,
        *,
        send_cq: CompletionQueue,
        recv_cq: CompletionQueue,
        cap: QpCap,
        sq_sig_all: bool,
    ) -> None:
        super().__init__(
            pd, qp_num, send_cq=send_cq, recv_cq=recv_cq, cap=cap, max_mtu=device.max_mtu
        )
        self.device = device
        self.sq_sig_all = sq_sig_all
        self._spd = pd
        self._depth = max(1, cap.max_recv_wr)
        self._slot_size = device.slot_size
        self._max_inline = cap.max_inline_data
        self._slot_base = lay.slot_offset(self._depth, self._slot_size, 0)
        self._slot_stride = lay.SLOT_HEADER.size + self._slot_size
        self._area_fd, self._area = lay.new_segment(
            "smcr-qp", lay.area_size(self._depth, self._slot_size)
        )
        self._view = memoryview(self._area)
        # responder side
        self._rq: deque[RecvWr] = deque()
        self._posted = 0
        self._consumed = 0
        self._rq_lock = threading.Lock()
        # a receive's fatal completion taken under _rq_lock, queued by whichever thread
        # moves to ERR first, ahead of the flushes (see _drain)
        self._fatal_recv: WorkCompletion | None = None
        # requester side
        self._sq: deque[SendWr] = deque()
        self._peer: PeerLink | None = None
        self._inbound = Inbound(device.engine)
        self._timer: Timer | None = None
        self._produced = 0
        self._next_psn = 0
        self._mtu = 1024
        self._rnr_left = 0
        self._retry_left = 0
        self._publish(QpState.RESET)
        cq_watch(recv_cq, self._drain, *_looks(self))  # (shm: from the hello)

    # ---------------------------------------------------------------- state

    def _publish(self, state: QpState) -> None:
        """Write our responder-visible attributes, the state word last.

        ``posted``, ``produced`` and ``epsn`` are not rewritten here: each has a
        single writer of its own (post_recv, the requester, RTR/the requester).
        """
        a = self.attr
        store(
            self._area, 0, lay.AREA_FIELDS, load_u32(self._area, lay.OFF_STATE),
            int(a.qp_access_flags), a.min_rnr_timer, a.max_dest_rd_atomic, self._spd.pd_id,
            self._depth, self._slot_size,
        )  # fmt: skip
        store_u32(self._area, lay.OFF_STATE, int(state))
        a.qp_state = state

    def _apply_modify(self, new: QpState, attr: QpAttr, mask: QpAttrMask) -> None:
        """Commit a validated modify; RTR connects to the peer first (may raise)."""
        if new is QpState.RTR:
            device = self.device
            peer = PeerLink.connect(device.directory, device.gid, self.qp_num,
                                    attr.ah_attr.dgid, attr.dest_qp_num)  # fmt: skip
            if self._peer is not None:
                self._drop_peer()
            try:
                self._inbound.bind((attr.dest_qp_num, attr.ah_attr.dgid,
                                    rdv.credentials(peer.sock)))  # fmt: skip
            except BaseException:
                peer.close()
                raise
            self._peer = peer
            self.device.engine.watch(peer.sock.fileno(), self._on_socket_event)
        self._copy_attrs(attr, mask)
        if new is QpState.RTS and self.attr.qp_state is QpState.RTR:
            self._next_psn = self.attr.sq_psn
            self._rnr_left, self._retry_left = self.attr.rnr_retry, self.attr.retry_cnt
        if new is QpState.RTR:
            store_u32(self._area, lay.OFF_EPSN, self.attr.rq_psn)
            self._mtu = self.attr.path_mtu.nbytes
        self._publish(new)

    def _reset(self) -> None:
        """Back to RESET: drop all work without completions and disconnect."""
        self._cancel_timer()
        self._sq.clear()
        with self._rq_lock:
            self._rq.clear()
            self._posted = self._consumed = 0
            self._fatal_recv = None
        self._produced = 0
        self.attr = QpAttr(qp_state=QpState.RESET)
        store_u64(self._area, lay.OFF_PRODUCED, 0)
        self._publish(QpState.RESET)  # before the peer sees our sockets close (peer_gone)
        self._drop_peer()
        self._drop_inbound()

    def _to_error(self, event: str | None, first: WorkCompletion | None = None) -> None:
        """Move to ERR: deliver what already arrived, flush everything else (spec §8.2).

        :param event: if given, also raise a QP_FATAL async event with this reason.
        :param first: the failing WR's completion; it is queued after the state
            changed (a caller woken by it sees ERR) and before the flushes; a failed
            receive's likewise (``_fatal_recv``), before what the drain delivers too.
        """
        with self._state_lock:
            if self._area.closed:  # destroyed meanwhile: nothing left to flush
                return
            if self.attr.qp_state is QpState.ERR:
                if first is not None:
                    self.send_cq.push(first)
                self._push_fatal_recv()
                return
            self._publish(QpState.ERR)
            self._cancel_timer()
            flushed = [self._wc(wr, WcStatus.WR_FLUSH_ERR) for wr in self._sq]
            if first is not None:
                flushed.insert(0, first)
            self._sq.clear()
            if flushed:
                self.send_cq.push_many(flushed)
            self._push_fatal_recv()  # (ahead of what arrived after it, which the drain delivers)
            self._drain(notify=True)
            with self._rq_lock:
                rflushed = [
                    WorkCompletion(
                        wr_id=w.wr_id, status=WcStatus.WR_FLUSH_ERR, opcode=WcOpcode.RECV,
                        qp_num=self.qp_num,
                    )
                    for w in self._rq
                ]  # fmt: skip
                self._rq.clear()
                if rflushed:
                    self.recv_cq.push_many(rflushed)
        if event is not None:
            self.device.post_async_event(AsyncEvent(AsyncEventType.QP_FATAL, self.qp_num, event))

    # ------------------------------------------------------------ connection

    def accept_inbound(self, sock: socket.socket, src_qpn: int, src_gid: bytes,
                       token: bytes, marks: bool = False,
                       standby: bool = False) -> bool:  # fmt: skip
        """Answer a hello from QP ``src_qpn`` of ``src_gid`` if it may be our peer
        (:mod:`smcr.rdma.shm.inbound`): our area, CQ doorbell and MR table, ``token``, and
        our mark byte if it ``marks`` its SENDs (:func:`~smcr.rdma.shm.cq.cq_requester`),
        the CQ's standby doorbell if it rings one (``standby``).

        Runs in the device's server thread and takes no QP state lock, so two
        processes that move their QPs to RTR at the same moment cannot deadlock.

        :returns: whether the hello was taken.
        """
        if self._area.closed:
            return False
        fds = [self._area_fd, self.recv_cq.doorbell_fd(), self.device.table_fd]
        notify_fd = getattr(self.recv_cq, "notify_fd", None)
        if notify_fd is not None:  # a ShmCompletionQueue: requesters ring only when armed
            fds.append(notify_fd)
            if standby:
                fds.append(self.recv_cq.standby_doorbell_fd())
        mark = cq_requester(self.recv_cq, self._drain, marks)
        if self._inbound.admit(sock, (src_qpn, src_gid), token, fds, self._on_socket_event, mark):
            return True
        cq_requester(self.recv_cq, self._drain, False)  # the requester we have may not mark
        return False

    def _on_socket_event(self, _events: int) -> None:
        """Engine: a connection spoke or hung up (EOF is how a peer's death shows)."""
        with self._state_lock:
            for sock in (self._inbound.sock, self._peer.sock if self._peer else None):
                if sock is None:
                    continue
                try:
                    got = rdv.receive(sock)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    got = None
                if got is None:
                    # a process that ended left its QP's state word as it was (RTR/RTS);
                    # one that destroyed or errored its QP wrote it first (destroy)
                    peer = self._peer
                    self.peer_gone = (
                        peer is not None and _AREA_HEADER(peer.area, 0)[HDR_STATE] in _LIVE
                    )
                    self._to_error("peer closed or died")
                    self._drop_peer()
                    self._drop_inbound()
                    return
                msg, fds = got
                for fd in fds:
                    os.close(fd)
                if msg.kind == rdv.QP_ERR:
                    self._to_error("peer reported a fatal error on this QP")

    def _drop_peer(self) -> None:
        self._inbound.bind(None)
        if self._peer is not None:
            self.device.engine.unwatch(self._peer.sock.fileno())
            self._peer.close()
            self._peer = None

    def _drop_inbound(self) -> None:
        self._inbound.drop()

    def destroy(self) -> None:
        """``ibv_destroy_qp``: disconnect (the peer's QP goes to ERR) and free everything."""
        with self._state_lock:
            if self._area.closed:
                return
            self._cancel_timer()
            cq_forget(self.recv_cq, self._drain)
            # before the peer sees our sockets close: we are alive, not gone (peer_gone)
            store_u32(self._area, lay.OFF_STATE, int(QpState.ERR))
            self._drop_peer()
            self._drop_inbound()
            self.device.forget_qp(self.qp_num)
            with self._rq_lock:  # (a poll's drain holds the ring's buffer under it)
                self._view.release()
                self._area.close()
            os.close(self._area_fd)

    # --------------------------------------------------------------- receive

    def _post_recv(self, wrs: RecvWr | Iterable[RecvWr]) -> None:
        """``ibv_post_recv``: publish the receives (and their lengths) to the requester.

        :raises VerbsError: EINVAL in RESET or for too many SGEs, ENOMEM when full.
        """
        batch = (wrs,) if isinstance(wrs, RecvWr) else tuple(wrs)
        max_sge = self.cap.max_recv_sge
        for wr in batch:
            if len(wr.sg_list) > max_sge:
                self._check_sges(wr.sg_list, max_sge)
        if self.attr.qp_state is QpState.RESET:
            raise VerbsError(errno.EINVAL, "post_recv on a QP in RESET")
        with self._rq_lock:
            if self.attr.qp_state is not QpState.ERR:
                rq, area, depth, posted = self._rq, self._area, self._depth, self._posted
                if len(rq) + len(batch) > depth:
                    raise VerbsError(errno.ENOMEM, "receive queue full")
                for wr in batch:
                    total = 0
                    for sge in wr.sg_list:
                        total += sge.length
                    store_u32(area, lay.AREA_HEADER_SIZE + 4 * (posted % depth), total)
                    posted += 1
                rq.extend(batch)
                self._posted = posted
                store_u64(area, lay.OFF_POSTED, posted)
                return
        self.recv_cq.push_many(
            WorkCompletion(wr_id=w.wr_id, status=WcStatus.WR_FLUSH_ERR, opcode=WcOpcode.RECV,
                           qp_num=self.qp_num)
            for w in batch
        )  # fmt: skip

    def _drain(self, notify: bool = False, asked: int = -1) -> None:
        """CQ progress hook: move SENDs the requester placed into our receives, or to the
        receiver where it takes them in place (:func:`_take_in_place`, or in C
        :data:`DRAIN_IN_PLACE`, whose answer ``asked`` is where ``_place.c``'s drain_hook
        had it already); ``notify``: signal the CQ (when not called from inside its poll)."""
        if (in_c := asked if asked >= 0 else _drain_in_c(self, notify)) == DRAINED:
            return
        area = self._area
        if area.closed or load_u64(area, lay.OFF_PRODUCED) == self._consumed:
            return
        wcs: list[WorkCompletion] = []
        fatal = False
        depth, base, stride = self._depth, self._slot_base, self._slot_stride
        pd, view, slot_size = self.pd, self._view, self._slot_size
        qp_num, src_qp = self.qp_num, self.attr.dest_qp_num
        with self._rq_lock:
            if self._fatal_recv is not None:  # (not queued yet: the receives behind it are
                return  # flushed after it, never completed ahead of it)
            produced = load_u64(area, lay.OFF_PRODUCED)
            rq, consumed = self._rq, self._consumed
            if self.receiver is not None and not notify and in_c != OFFERED:
                consumed = _take_in_place(self, consumed, produced)
            while consumed < produced and rq and not fatal:
                wr = rq.popleft()
                off = base + (consumed % depth) * stride
                consumed += 1
                byte_len, kind, imm, _ = _SLOT_HEADER(area, off)
                wc, fatal = deliver(pd, view, slot_size, qp_num, src_qp, wr,
                                    off + _SLOT_HEADER_SIZE, byte_len, kind, imm)  # fmt: skip
                wcs.append(wc)
            self._consumed = consumed
            if fatal:
                # handed over under the lock: a thread moving to ERR meanwhile (the peer's
                # QP_ERR) queues it ahead of its flush of the receives behind it
                self._fatal_recv = wcs.pop()
            if wcs:  # (under the lock: a receiver's poll must not overtake them)
                self.recv_cq.push_many(wcs, notify)
        if fatal:
            self._to_error(None)

    def _push_fatal_recv(self) -> None:
        """Queue a failed receive's completion that :meth:`_drain` took, if any is pending."""
        with self._rq_lock:
            fatal, self._fatal_recv = self._fatal_recv, None
            if fatal is not None:
                self.recv_cq.push(fatal)

    # ------------------------------------------------------------------ send

    def _post_send(self, wrs: SendWr | Iterable[SendWr]) -> None:
        """``ibv_post_send``: run the WRs now, in order, or queue them behind a blocked one.

        :raises VerbsError: EINVAL before RTS, for an unsupported opcode or too many
            SGEs; ENOMEM when the send queue is full.  In ERR the WRs are flushed.
        """
        batch = [wrs] if isinstance(wrs, SendWr) else list(wrs)
        max_sge = self.cap.max_send_sge
        for wr in batch:
            if len(wr.sg_list) > max_sge or wr.opcode not in OPS:
                self._check_sges(wr.sg_list, max_sge)
                raise VerbsError(errno.EINVAL, f"{wr.opcode.name} is not supported by shm")
            if wr.inline_data is not None or int(wr.send_flags) & _INLINE:
                check_inline(wr, self.cap.max_inline_data)
        with self._state_lock:
            state = self.attr.qp_state
            if state is QpState.ERR:
                self.send_cq.push_many(self._wc(w, WcStatus.WR_FLUSH_ERR) for w in batch)
                return
            if state is not QpState.RTS:
                raise VerbsError(errno.EINVAL, f"post_send in {state.name}")
            if len(self._sq) + len(batch) > self.cap.max_send_wr:
                raise VerbsError(errno.ENOMEM, "send queue full")
            sq = self._sq
            sq.extend(batch)
            if self._timer is None:
                self._run_sq()
            if sq:  # waiting (RNR, peer not ready): inline data is the caller's again on return
                for wr in sq:
                    if wr.inline_data is not None and type(wr.inline_data) is not bytes:
                        wr.inline_data = bytes(wr.inline_data)

    def next_psns(self) -> tuple[int, int] | None:
        """Our next PSN and the one the peer sends next (it keeps it in our area), for
        ``smcr trace``: shm QPs number their packets as RoCE does."""
        return self._next_psn, load_u32(self._area, lay.OFF_EPSN) & PSN_MASK

    def _post_writes_send(self, writes: Sequence[tuple[int, int, memoryview]], message: bytes,
                          wr_id: int, signaled: bool, wake: int = 0) -> None:  # fmt: skip
        """:meth:`post_writes_send` (the data path's batch, see the base class), fused: the
        checks of :meth:`_execute` for every WR first, then the copies, with no WR objects
        (in C where built: :func:`_place_in_c`).  Anything off the common path (not RTS,
        work queued, peer not ready, no receive posted, a remote check that fails,
        ``sq_sig_all``) goes to the generic :meth:`_post_send` (within this one post),
        which repeats the checks and reports the exact error."""
        with self._state_lock:
            peer = self._peer
            attr = self.attr
            if (attr.qp_state is not _RTS or self._sq or self._timer is not None
                    or peer is None or self.sq_sig_all):  # fmt: skip
                peer = None
            elif send.PLACE is not None and _place_in_c(send.PLACE, self, peer, writes, message,
                                                        wr_id, signaled, wake):  # fmt: skip
                return
            else:
                area = peer.area
                hdr = _AREA_HEADER(area, 0)
                produced = self._produced
                depth = peer.depth
                idx = produced % depth
                size = len(message)
                if (hdr[HDR_STATE] not in _LIVE or hdr[HDR_EPSN] != self._next_psn
                        or hdr[HDR_POSTED] == produced or not hdr[HDR_ACCESS] & _REMOTE_WRITE
                        or size > peer.slot_size
                        or size > load_u32(area, _SLOT_BASE + 4 * idx)):  # fmt: skip
                    peer = None
                else:
                    targets = []
                    limit, mrs, table, pd = self._max_inline, peer.mrs, peer.table, hdr[HDR_PD]
                    for addr, rkey, data in writes:
                        n = len(data)
                        rm = mrs.get(rkey)
                        if (rm is None or n > limit or addr < rm.iova or addr + n > rm.end
                                or not rm.allowed & _REMOTE_WRITE or rm.pd != pd
                                or _MR_KEY(table, rm.offset) != rm.key):  # fmt: skip
                            peer = None
                            break
                        targets.append((rm.view, addr - rm.iova, data))
            if peer is not None:
                mtu, psn = self._mtu, self._next_psn
                for view, off, data in targets:
                    n = len(data)
                    view[off : off + n] = data
                    psn += -(-n // mtu) or 1
                slot = _SLOT_BASE + 4 * depth + idx * (_SLOT_HEADER_SIZE + peer.slot_size)
                start = slot + _SLOT_HEADER_SIZE
                peer.view[start : start + size] = message
                self._next_psn = psn = (psn + (-(-size // mtu) or 1)) & PSN_MASK
                self._retry_left = attr.retry_cnt
                self._rnr_left = attr.rnr_retry
                self._place(peer, slot, size, lay.KIND_SEND, 0, wake)
                store_u32(area, lay.OFF_EPSN, psn)
                if signaled:
                    send.sent_signaled(self, wr_id, size)
                return
        super()._post_writes_send(writes, message, wr_id, signaled, wake)

    def discard_remote(self, rkey: int, addr: int, length: int) -> int:
        """Through our mapping (:meth:`PeerLink.discard`): in RTS, no WR queued to write."""
        with self._state_lock:
            peer = self._peer
            if peer is None or self._sq or self.attr.qp_state is not QpState.RTS:
                return -1
            return peer.discard(rkey, addr, length)

    def ring_after(self, whom: int) -> None:
        """Ring whom :data:`POST_INLINE` named (:func:`send.ring_whom`)."""
        if self._peer is not None:
            send.ring_whom(self._peer, whom)

    def _run_sq(self) -> None:
        """Execute queued WRs in order until done or one blocks (state lock held).

        The peer's header is read once per run, not per WR (it is the data
        path's largest fixed cost), and read again only before declaring RNR,
        since ``posted`` may have grown meanwhile.  The PSN check is per run too:
        only this requester advances the peer's expected PSN, so it can store it
        once at the end.
        """
        sq, peer = self._sq, self._peer
        if not sq or self.attr.qp_state is not QpState.RTS:
            return
        if peer is None:
            self._block(NOT_READY)
            return
        hdr = lay.AREA_HEADER.unpack_from(peer.area, 0)
        if hdr[HDR_STATE] not in _LIVE or hdr[HDR_EPSN] != self._next_psn:
            self._block(NOT_READY)
            return
        self._retry_left = self.attr.retry_cnt  # the peer answers: an ACK resets the count
        execute = self._execute
        while sq:
            wr = sq.popleft()
            result = execute(wr, peer, hdr)
            if result == RNR:
                hdr = lay.AREA_HEADER.unpack_from(peer.area, 0)
                result = execute(wr, peer, hdr)
            if result:
                if result != FAILED:
                    sq.appendleft(wr)
                    self._block(result)
                break
        store_u32(peer.area, lay.OFF_EPSN, self._next_psn)

    def _block(self, why: int) -> None:
        """Arm a retry of the head WR (RNR timer or retransmit period) or give up."""
        a = self.attr
        peer = self._peer
        if why == RNR:
            if self._rnr_left == 0:
                self._give_up(WcStatus.RNR_RETRY_EXC_ERR)
                return
            self._rnr_left -= a.rnr_retry != 7
            code = load_u32(peer.area, lay.OFF_MIN_RNR) if peer else 0
            delay = RNR_TIMER_SECONDS[code & 31]
        else:
            period = local_ack_timeout(a.timeout)
            if self._retry_left == 0 and period is not None:
                self._give_up(WcStatus.RETRY_EXC_ERR)
                return
            self._retry_left -= a.retry_cnt != 7 and period is not None
            delay = INFINITE_TIMEOUT_POLL if period is None else period
        self._timer = self.device.engine.call_at(monotonic() + delay, self._on_retry)

    def _give_up(self, status: WcStatus) -> None:
        """Retries exhausted: the head WR gets ``status``, the QP goes to ERR (spec §5.5)."""
        wr = self._sq.popleft()
        self._to_error(None, self._wc(wr, status))

    def _on_retry(self) -> None:
        with self._state_lock:
            self._timer = None
            self._run_sq()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fail(self, wr: SendWr, status: WcStatus, nak: bool) -> int:
        """Complete ``wr`` with an error and go to ERR; ``nak`` also puts the peer in ERR."""
        if nak and self._peer is not None:
            with contextlib.suppress(OSError):
                rdv.send(self._peer.sock, rdv.Message(rdv.QP_ERR))
        self._to_error(None, self._wc(wr, status))
        return FAILED

    def _wc(self, wr: SendWr, status: WcStatus, n: int = 0) -> WorkCompletion:
        op = (
            WcOpcode.SEND
            if wr.opcode in (WrOpcode.SEND, WrOpcode.SEND_WITH_IMM)
            else (WcOpcode.RDMA_READ if wr.opcode is WrOpcode.RDMA_READ else WcOpcode.RDMA_WRITE)
        )
        return WorkCompletion(wr_id=wr.wr_id, status=status, opcode=op, qp_num=self.qp_num,
                              byte_len=n)  # fmt: skip

    def _execute(self, wr: SendWr, peer: PeerLink, hdr: tuple[int, ...]) -> int:
        """Run one WR against the peer's published state: the checks of spec §5.3/§6, then copy.

        This is the data path: plain ints (no enum arithmetic, which costs
        microseconds in CPython 3.11), SGEs resolved inline, one table look-up
        per opcode.
        """
        op = OPS[wr.opcode]
        local: list[memoryview] = []
        length = 0
        inline = wr.inline_data
        if inline is not None:  # checked by post_send: a byte view within max_inline_data
            local.append(memoryview(inline))
            length = len(inline)
        else:
            mrs = self.pd.mrs
            need_local = op.need_local
            for sge in wr.sg_list:
                mr = mrs.get(sge.lkey)
                if mr is None:
                    return self._fail(wr, WcStatus.LOC_PROT_ERR, nak=False)
                off, n = sge.addr - mr.addr, sge.length
                if not mr.valid or need_local & ~mr.access_bits or off < 0 or off + n > mr.length:
                    return self._fail(wr, WcStatus.LOC_PROT_ERR, nak=False)
                local.append(mr.buf[off : off + n])
                length += n
        slot = -1
        if op.kind:
            depth, slot_size = peer.depth, peer.slot_size
            if hdr[HDR_POSTED] == self._produced:  # posted == produced: no receive waiting
                return RNR
            idx = self._produced % depth
            slot = lay.slot_offset(depth, slot_size, idx)
            if op.kind != lay.KIND_WRITE_IMM:
                if length > slot_size:
                    return self._fail(wr, WcStatus.LOC_LEN_ERR, nak=False)
                if length > load_u32(peer.area, lay.lens_offset(idx)):
                    self._place(peer, slot, 0, lay.KIND_LEN_ERR, 0)
                    return self._fail(wr, WcStatus.REM_INV_REQ_ERR, nak=True)
        need = op.need_remote
        if need:
            if not hdr[HDR_ACCESS] & need or (op.read and hdr[HDR_MAX_DEST_RD_ATOMIC] == 0):
                return self._fail(wr, WcStatus.REM_INV_REQ_ERR, nak=True)
            if length:
                # spec §6 steps 3-4, inlined: the look-up cached per rkey, the live
                # (seal, generation) words read per WR (see PeerLink.lookup)
                rkey = wr.rkey
                rm = peer.mrs.get(rkey)
                if rm is None or _MR_KEY(peer.table, rm.offset) != rm.key:
                    try:
                        rm = peer.lookup(rkey)
                    except VerbsError:  # the peer's device is gone: as if never answered
                        return self._fail(wr, WcStatus.RETRY_EXC_ERR, nak=False)
                addr = wr.remote_addr
                if (rm is None or addr < rm.iova or addr + length > rm.end
                        or need & ~rm.allowed or rm.pd != hdr[HDR_PD]):  # fmt: skip
                    return self._fail(wr, WcStatus.REM_ACCESS_ERR, nak=True)
                off = addr - rm.iova
                view = rm.view
                for v in local:
                    n = len(v)
                    if op.read:
                        v[:] = view[off : off + n]
                    else:
                        view[off : off + n] = v
                    off += n
        elif length:
            _copy_sges(peer.view, slot + lay.SLOT_HEADER.size, local)
        if slot >= 0:
            self._place(peer, slot, length, op.kind, wr.imm_data)
        self._next_psn = (self._next_psn + (-(-length // self._mtu) or 1)) & PSN_MASK
        if op.kind:
            self._rnr_left = self.attr.rnr_retry
        if self.sq_sig_all or int(wr.send_flags) & _SIGNALED:
            self.send_cq.push(WorkCompletion(wr_id=wr.wr_id, status=WcStatus.SUCCESS,
                                             opcode=op.wc_opcode, qp_num=self.qp_num,
                                             byte_len=length), local=True)  # fmt: skip
        return DONE

    def _place(self, peer: PeerLink, slot: int, length: int, kind: int, imm: int,
               wake: int = 0) -> None:  # fmt: skip
        """Publish a slot (header, then the ``produced`` count) and ring the peer's CQ (or
        the consumer bell ``wake`` names: :func:`_notify`)."""
        area = peer.area
        store(area, slot, lay.SLOT_HEADER, length, kind, imm & 0xFFFFFFFF, 0)
        self._produced = produced = self._produced + 1
        store_u64(area, lay.OFF_PRODUCED, produced)
        send.notify(peer, wake)


def _copy_sges(remote: memoryview, off: int, local: list[memoryview]) -> None:
    """One copy per SGE from local memory into the peer's mapping at ``off``."""
    for v in local:
        n = len(v)
        remote[off : off + n] = v
        off += n


def sends_waiting(qp: ShmQp) -> bool:
    """Whether ``qp``'s :meth:`~ShmQp._drain` would find SENDs to take now (a look without the
    receive lock, taking nothing: the CQ's
    :meth:`~smcr.rdma.shm.cq.ShmCompletionQueue.has_news`).  Not without receives posted,
    which the delivery and the receiver both need, nor for a count behind ours (a broken
    or hostile requester's: nothing to take)."""
    try:
        return (bool(qp._rq) and qp._fatal_recv is None
                and load_u64(qp._area, lay.OFF_PRODUCED) > qp._consumed)  # fmt: skip
    except ValueError:  # closed (the QP is going)
        return False


def _looks(qp: ShmQp) -> tuple[Callable[[], bool], Callable[[], None] | None]:
    """The CQ's look at ``qp``, and its run (:func:`cq_watch`): in C for a ShmQp itself."""
    if (looks := LOOKS_IN_C) is None or type(qp) is not ShmQp:
        return partial(sends_waiting, qp), None
    return partial(looks[1], qp), partial(looks[0], qp)


def _take_in_place(qp: ShmQp, consumed: int, produced: int) -> int:
    """The SENDs from ``consumed`` on that the QP's receiver takes in place
    (:meth:`~smcr.rdma.base.QueuePair.set_receiver`; receive lock held): only within the
    CQ's poll and while nothing but sends' completions waits in the CQ
    (:meth:`~smcr.rdma.completion.CompletionQueue.only_sends_wait`: others made before, by
    another thread's look too, come first; they are pushed under this lock), up to the
    first it refuses, and only with receives posted (as many SENDs as the delivery would
    take).
    Each taken leaves its receive posted: one more is published behind the others, as
    long as its slot's.  Returns the new consumed count."""
    receiver, cq = qp.receiver, qp.recv_cq
    if receiver is None or cq.polling != _get_ident() or not cq.only_sends_wait():
        return consumed
    area, view, depth, base, stride = qp._area, qp._view, qp._depth, qp._slot_base, qp._slot_stride
    slot_size, qp_num, posted = qp._slot_size, qp.qp_num, qp._posted
    start = consumed
    offered = -1
    produced = min(produced, consumed + len(qp._rq))  # (more only from a requester that
    run = qp.ring_taker  # placed past the receives posted: delivered as before)
    try:
        if run is not None and consumed < produced:  # (a run at once, then one by one)
            consumed, posted = run(qp_num, view, _SLOT_BASE, base, stride, depth, slot_size,
                                   consumed, produced, posted)  # fmt: skip
        while consumed < produced:
            off = base + (consumed % depth) * stride
            byte_len, kind, _, _ = _SLOT_HEADER(area, off)
            if kind != lay.KIND_SEND or byte_len > slot_size:
                break
            offered = consumed
            if not receiver(qp_num, view, off + _SLOT_HEADER_SIZE, byte_len):
                break
            offered = -1
            posted = _repost(area, depth, posted, consumed)
            consumed += 1
    except BaseException:
        if offered == consumed:  # (a receiver that failed on a SEND took it, as a
            posted = _repost(area, depth, posted, consumed)  # completion taken would be:
            consumed += 1  # it is not offered again)
        raise
    finally:
        if consumed != start:
            qp._posted, qp._consumed = posted, consumed
            store_u64(area, lay.OFF_POSTED, posted)
            cq.push_many((TAKEN_IN_PLACE,), False)
    return consumed



NOT_IN_C: Final = 0
"""The C's answer (:data:`DRAIN_IN_PLACE`): not its case, nothing done
(:meth:`ShmQp._drain` does it all)."""
DRAINED: Final = 1
"""The C's answer: nothing left (all taken, or nothing there)."""
OFFERED: Final = 2
"""The C's answer: what the receiver takes taken; the rest is for the delivery."""


def _repost(area: mmap, depth: int, posted: int, consumed: int) -> int:
    """The receive of slot ``consumed`` posted again, behind the others (its length
    published at ``posted``); returns the new posted count."""
    store_u32(area, _SLOT_BASE + 4 * (posted % depth),
              load_u32(area, _SLOT_BASE + 4 * (consumed % depth)))  # fmt: skip
    return posted + 1


def _drain_in_c(qp: ShmQp, notify: bool) -> int:
    """:meth:`ShmQp._drain`'s in-place case by :data:`DRAIN_IN_PLACE` where it can (in the
    CQ's poll, a receiver with a C run): :data:`NOT_IN_C`, ``DRAINED`` or ``OFFERED``."""
    drain = DRAIN_IN_PLACE
    if drain is None or notify or qp.c_taker is None:
        return NOT_IN_C
    return drain(qp)


def _place_in_c(c: ModuleType, qp: ShmQp, peer: PeerLink,
                writes: Sequence[tuple[int, int, memoryview]], message: bytes, wr_id: int,
                signaled: bool, wake: int) -> bool:  # fmt: skip
    """:meth:`ShmQp._post_writes_send`'s common case by the C of ``_place.c`` (state lock
    held, the QP in RTS with nothing queued): at most two WRITEs into one peer MR already
    mapped, and the SEND.  False: not taken, nothing written (the Python looks again)."""
    count = len(writes)
    if not count:  # (a CDC alone: no peer MR to check)
        psn: int = c.place_send(peer.area, peer.table, None, None, None, message, qp._next_psn,
                                qp._produced, peer.depth, peer.slot_size, qp._mtu,
                                qp._max_inline, 0, 0, 0, 0, 0, 0, 0, 0, 0)  # fmt: skip
    else:
        addr, rkey, data = writes[0]
        rm = peer.mrs.get(rkey)
        if rm is None or count > 2 or (count == 2 and writes[1][1] != rkey):
            return False
        addr2, data2 = (writes[1][0], writes[1][2]) if count == 2 else (0, None)
        psn = c.place_send(peer.area, peer.table, rm.view, data, data2, message, qp._next_psn,
                           qp._produced, peer.depth, peer.slot_size, qp._mtu, qp._max_inline,
                           rm.iova, rm.end, rm.allowed, rm.pd, rm.offset, rm.seal,
                           rm.generation, addr, addr2)  # fmt: skip
    if psn < 0:
        return False
    attr = qp.attr
    qp._produced += 1
    qp._next_psn = psn
    qp._retry_left = attr.retry_cnt
    qp._rnr_left = attr.rnr_retry
    send.notify(peer, wake)
    if signaled:
        send.sent_signaled(qp, wr_id, len(message))
    return True


POST_INLINE: Final = send.c_poster(ShmQp)
""":meth:`ShmQp._post_writes_send`'s common case for C callers (``_place.c``'s
``post_inline``, a capsule): the stack's fast lane posts a message's WRITEs and CDC through
it, then rings whom it names (:meth:`ShmQp.ring_after`, after the QP's state lock: the peer
it rings is the QP's peer then, gone after a reset, or a new one after another RTR in
between, which at worst wakes that one for nothing); None without the C."""

DRAIN_IN_PLACE: Final = send.c_drainer() if POST_INLINE else None
""":meth:`ShmQp._drain`'s in-place case in C (``_place.c``'s ``drain_in_place``), for a QP
whose receiver has a C run (:meth:`~smcr.rdma.base.QueuePair.set_receiver`'s ``c_run``),
under the receive lock (which :meth:`ShmQp.destroy` takes to close the ring): the run, then
the receiver for what it leaves, as :func:`_take_in_place` does; it answers as
:data:`NOT_IN_C` says.  None without the C (a C static once compiled: ``Final``)."""
LOOKS_IN_C: Final = send.c_looks() if DRAIN_IN_PLACE is not None else None
"""``_place.c``'s ``drain_hook`` and ``sends_waiting`` (:func:`_looks`), or None."""
