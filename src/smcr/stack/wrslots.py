"""Work-request slots of a runtime's QPs: receive slots posted and reposted, send slots
filled, WRs posted (Linux ``smc_wr.c``).

Receives: every QP keeps :data:`RECV_SLOTS` receives posted, each a :data:`SLOT` of one
buffer shared by every QP (and registered on every RNIC of the runtime: a slot index means
the same bytes whichever port's QP used it) plus a tail buffer per QP for the longer
SMC-Rv2 LLC messages.  A taken receive is reposted as the same WR (same wr_id, same slot)
in batches of :data:`REPOST_BATCH`.  Sends: CDC and LLC messages are copied into the next
slots of a send ring.  Nothing here calls the engine: a failure is returned to the caller
(:class:`~smcr.stack.executor.Executor`), which fails the link.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Sequence
from typing import Final

from smcr.bound import monotonic
from smcr.core import PostSend
from smcr.rdma import (
    AccessFlag,
    MemoryRegion,
    RecvWr,
    SendFlag,
    SendWr,
    Sge,
    WorkCompletion,
    WrOpcode,
)
from smcr.rdma.base import ProtectionDomain, QueuePair, zeroed_memory
from smcr.stack.hostconn import PortRes
from smcr.wire.cdc import cdc_token

RECV_SLOTS: Final = 256  # per QP; Linux posts 48 (we answer from one thread, so keep more)
SLOT: Final = 64  # receive buffer per slot: v1 LLC and CDC are 44 bytes (Linux: 48)
V2_MSG = 8192
"""The longest SMC-Rv2 LLC message a receive takes (Linux ``SMC_WR_BUF_V2_SIZE``): ADD LINK
v2 is 88 bytes and more (its rkey list), which a :data:`SLOT` alone would refuse with
LOC_LEN_ERR, ending the link.  As Linux's, each receive has a second SGE for the rest, in
one buffer per QP (Linux: per link group): LLC flows come one at a time."""
SEND_SLOTS: Final = 4096
REPOST_BATCH: Final = 16  # receives reposted together (RECV_SLOTS - REPOST_BATCH stay posted)
WAIT_FREE_SLOT = 10.0  # SMC_WR_TX_WAIT_FREE_SLOT_TIME
RECV_QPS: Final = 4096
"""QPs the receive buffer has slots for: a link (QP) per peer process and RNIC, so this many
peers at once (64 was a cap a server with many client processes met: the 65th fell back
to TCP with ERR_RDYLNK).  The buffer is memory backed only where written (64 MiB of
address space, 16 KiB for each QP in use), and its slots are handed out lowest first."""

_SEND: Final = WrOpcode.SEND
_WRITE: Final = WrOpcode.RDMA_WRITE
_SOLICITED: Final = SendFlag.SOLICITED
_SOLICITED_SIGNALED: Final = SendFlag.SOLICITED | SendFlag.SIGNALED
"""The two flags a send slot's WR carries, combined once: ``|`` of two ``enum.Flag`` members
runs interpreted (``Flag.__or__``, then the class's ``__call__`` and ``__new__``), some six
thousand instructions per message from compiled code."""


class WorkRequests:
    """The receive and send slots of one runtime (module docstring)."""

    def __init__(self, pd: ProtectionDomain) -> None:
        self.recv_buf = zeroed_memory(SLOT * RECV_SLOTS * RECV_QPS)
        self.send_buf = bytearray(SLOT * SEND_SLOTS)
        self.recv_mr = pd.reg_mr(self.recv_buf, AccessFlag.LOCAL_WRITE)
        self.send_mr = pd.reg_mr(self.send_buf, AccessFlag.LOCAL_WRITE)
        self.recv_free: list[int] = []
        """Slots given back (taken again first); those from :attr:`recv_next` on were never
        taken."""
        self.recv_next = 0
        self.recv_slot: dict[int, int] = {}  # wr_id -> slot
        self.recv_wr: dict[int, RecvWr] = {}  # wr_id -> its receive WR, reposted as is
        self.qp_recv_ids: dict[int, list[int]] = {}  # qpn -> its receive WR ids (slots)
        self.recv_tail: dict[int, MemoryRegion] = {}  # qpn -> where long messages go on
        self.repost_wrs: dict[int, list[RecvWr]] = {}
        self.repost_due = False  # some QP has REPOST_BATCH receives to post again
        self.send_off = 0
        self.wr_ids = 1

    @property
    def free_slots(self) -> int:
        """Receive slots not posted on any QP."""
        return len(self.recv_free) + RECV_SLOTS * RECV_QPS - self.recv_next

    def _take_slot(self) -> int:
        """A free receive slot, lowest first.  :raises IndexError: none is left."""
        if self.recv_free:
            return self.recv_free.pop()
        slot = self.recv_next
        if slot >= RECV_SLOTS * RECV_QPS:
            raise IndexError("no receive slot left")
        self.recv_next = slot + 1
        return slot

    def register_on(self, pd: ProtectionDomain) -> tuple[MemoryRegion, MemoryRegion]:
        """The receive and send slot buffers registered on another RNIC's PD too."""
        return (pd.reg_mr(self.recv_buf, AccessFlag.LOCAL_WRITE),
                pd.reg_mr(self.send_buf, AccessFlag.LOCAL_WRITE))  # fmt: skip

    # ------------------------------------------------------------ sends

    def send_wr(self, a: PostSend, mr: MemoryRegion) -> SendWr:
        """``a``'s message copied into the next send slot of ``mr`` (a message longer than
        one, an SMC-Rv2 LLC message such as ADD LINK v2 with its rkeys, takes as many
        slots as it needs, never wrapping around the ring's end)."""
        off = self.send_off
        span = max(1, -(-len(a.data) // SLOT)) * SLOT
        if off + span > len(mr.buf):
            off = 0
        self.send_off = (off + span) % len(mr.buf)
        mr.buf[off : off + len(a.data)] = a.data
        # solicited, as Linux smc_wr_tx_send posts every CDC and LLC message (the SE bit
        # of the BTH on the wire)
        return SendWr(wr_id=a.wr_id, opcode=_SEND,
                      send_flags=_SOLICITED_SIGNALED if a.signaled else _SOLICITED,
                      sg_list=(Sge(mr.addr + off, len(a.data), mr.lkey),))  # fmt: skip

    @staticmethod
    def post(qp: QueuePair, wrs: list[SendWr], writes: Sequence[tuple[int, int, memoryview]]
             = (), cdc: PostSend | None = None) -> str:  # fmt: skip
        """Post ``wrs`` in order, or with ``cdc`` the fused batch of ``writes`` (inline) and
        its SEND (:meth:`QueuePair.post_writes_send`).

        A full send queue (the peer takes no SENDs: RNR) is waited out for up to
        ``SMC_WR_TX_WAIT_FREE_SLOT_TIME`` (10 s), as Linux waits for a free slot.  The
        runtime's lock stays held meanwhile: releasing it could let another thread post
        behind these WRs' backs.

        :returns: "" when posted, else why not (the caller declares the link down).
        """
        deadline = 0.0
        while True:
            try:
                if cdc is not None:
                    qp.post_writes_send(writes, cdc.data, cdc.wr_id, cdc.signaled,
                                        cdc_token(cdc.data))  # fmt: skip
                else:
                    qp.post_send(wrs)
                return ""
            except OSError as exc:
                now = monotonic()
                deadline = deadline or now + WAIT_FREE_SLOT
                if exc.errno == errno.ENOMEM and now < deadline:
                    time.sleep(0.001)
                    continue
                return f"post_send: {exc}"

    # ------------------------------------------------------------ receives

    def post_first(self, qpn: int, qp: QueuePair, port: PortRes) -> None:
        """Post a new QP's :data:`RECV_SLOTS` receives (at RTR, as Linux's
        ``smc_wr_rx_post_init``).

        :raises OSError: the post failed; :raises IndexError: no slots are left.
        """
        wrs = []
        ids = self.qp_recv_ids.setdefault(qpn, [])
        recv_mr = port.recv_mr
        tail = self.recv_tail.get(qpn)
        if tail is None:
            tail = self.recv_tail[qpn] = port.pd.reg_mr(bytearray(V2_MSG - SLOT),
                                                        AccessFlag.LOCAL_WRITE)  # fmt: skip
        for _ in range(RECV_SLOTS):
            slot = self._take_slot()
            wr_id = self.wr_ids
            self.wr_ids += 1
            ids.append(wr_id)
            self.recv_slot[wr_id] = slot
            head = Sge(recv_mr.addr + slot * SLOT, SLOT, recv_mr.lkey)
            wr = RecvWr(wr_id=wr_id, sg_list=(head, Sge(tail.addr, tail.length, tail.lkey)))
            self.recv_wr[wr_id] = wr
            wrs.append(wr)
        qp.post_recv(wrs)

    def again(self, qpn: int, wr_id: int) -> None:
        """Queue a taken receive for reposting: the same WR (same wr_id, same slot)."""
        again = self.repost_wrs.get(qpn)
        if again is None:
            again = self.repost_wrs[qpn] = []
        again.append(self.recv_wr[wr_id])
        if len(again) >= REPOST_BATCH:
            self.repost_due = True

    def repost(self, qps: dict[int, QueuePair], everything: bool) -> None:
        """Post the receives taken since the last time again, per QP in batches of
        :data:`REPOST_BATCH` (a post costs microseconds; :data:`RECV_SLOTS` stay
        ahead of the peer by far), or ``everything``."""
        for qpn, wrs in list(self.repost_wrs.items()):
            if len(wrs) < REPOST_BATCH and not everything and qpn in qps:
                continue
            del self.repost_wrs[qpn]
            qp = qps.get(qpn)
            if qp is not None:
                try:
                    qp.post_recv(wrs)
                except OSError:
                    pass
            else:  # a drained QP's last receives (:meth:`release`): slots back to the pool
                for wr in wrs:
                    self.free_slot(wr.wr_id)

    def free_slot(self, wr_id: int) -> None:
        """A receive's slot back to the free list (the receive will not be posted again)."""
        slot = self.recv_slot.pop(wr_id, None)
        if slot is not None:
            self.recv_free.append(slot)
            self.recv_wr.pop(wr_id, None)

    def release(self, qpn: int, drained: bool) -> None:
        """A QP is destroyed: its receive slots back to the pool -- at once, or (``drained``:
        its receives complete into the CQ as flushes) as those completions are taken."""
        ids = self.qp_recv_ids.pop(qpn, ())
        if drained:  # (its receives taken from the CQ next are not reposted: slots back)
            self.repost_due = True
            return  # (its tail buffer stays: a long message may be among them)
        tail = self.recv_tail.pop(qpn, None)
        if tail is not None:
            try:
                tail.dereg()
            except OSError:
                pass
        self.repost_wrs.pop(qpn, None)
        for wr_id in ids:
            self.free_slot(wr_id)

    def long_message(self, wc: WorkCompletion, off: int) -> memoryview:
        """A message longer than a slot: its slot, then the rest in its QP's tail buffer."""
        tail = self.recv_tail[wc.qp_num]
        data = bytes(self.recv_mr.buf[off : off + SLOT]) + bytes(tail.buf[: wc.byte_len - SLOT])
        return memoryview(data)


def write_wrs(writes: list[tuple[int, int, memoryview]]) -> list[SendWr]:
    """Inline RDMA WRITE WRs for ``(remote_addr, rkey, data)`` (writes no CDC followed)."""
    return [SendWr(wr_id=0, opcode=_WRITE, remote_addr=addr, rkey=rkey,
                   send_flags=SendFlag.INLINE, inline_data=data)
            for addr, rkey, data in writes]  # fmt: skip
