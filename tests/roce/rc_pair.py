"""Two RC endpoints (requester + responder each) joined by a fake, lossy wire: no sockets.

The aioquic ``client_and_server()`` pattern for the sans-IO halves of
:mod:`smcr.rdma.roce`: packets are bytes in a list, time is a number the test
advances, and the wire can drop, duplicate or reorder with a seeded RNG.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from smcr.rdma import (
    AccessFlag,
    MemoryRegion,
    ProtectionDomain,
    QueuePair,
    RecvWr,
    SendFlag,
    SendWr,
    Sge,
    WorkCompletion,
    WrOpcode,
)
from smcr.rdma.roce.fastpath import HEADER_LENGTH, PADS, pack_bth
from smcr.rdma.roce.requester import Requester
from smcr.rdma.roce.responder import Responder
from smcr.rdma.verbs import local_ack_timeout

RW = AccessFlag.LOCAL_WRITE | AccessFlag.REMOTE_WRITE | AccessFlag.REMOTE_READ


class StubPd(ProtectionDomain):
    """A PD that only holds MRs (the sans-IO halves need nothing else)."""

    def alloc_mr(self, length: int, access: AccessFlag) -> MemoryRegion:
        raise NotImplementedError

    def reg_mr(self, buffer: bytearray | memoryview, access: AccessFlag) -> MemoryRegion:
        raise NotImplementedError

    def create_qp(self, *args: object, **kwargs: object) -> QueuePair:
        raise NotImplementedError

    def dealloc(self) -> None:
        pass


def region(pd: StubPd, rkeys: dict[int, MemoryRegion], addr: int, key: int, size: int,
           access: AccessFlag) -> MemoryRegion:  # fmt: skip
    def forget(m: MemoryRegion) -> None:
        rkeys.pop(m.rkey, None)

    mr = MemoryRegion(pd, memoryview(bytearray(size)), addr=addr, key=key, access=access,
                      on_dereg=forget)  # fmt: skip
    pd.mrs[key] = mr
    rkeys[key] = mr
    return mr


@dataclass
class End:
    """One endpoint: memory, the two halves, and what came out of them."""

    name: str
    qpn: int
    psn: int
    wire: Wire
    pd: StubPd = field(init=False)
    rkeys: dict[int, MemoryRegion] = field(default_factory=dict)
    send_wcs: list[WorkCompletion] = field(default_factory=list)
    recv_wcs: list[WorkCompletion] = field(default_factory=list)
    fatal: list[WorkCompletion | None] = field(default_factory=list)
    sent_ops: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.pd = StubPd(1)
        base = 0x10000 * (1 + (self.qpn & 0xF))
        self.rmb = region(self.pd, self.rkeys, base, 0x1000 + self.qpn, 1 << 16, RW)
        self.buf = region(self.pd, self.rkeys, base + 0x100000, 0x2000 + self.qpn, 1 << 16,
                          AccessFlag.LOCAL_WRITE)  # fmt: skip
        self.peer: End | None = None
        self.req = Requester(self.qpn, self._tx, self.send_wcs.append, self._fatal)
        self.resp = Responder(self.qpn, self.pd, self.rkeys.get, self._tx,
                              self.recv_wcs.append, self.fatal.append)  # fmt: skip

    def _fatal(self, wc: WorkCompletion) -> None:
        self.send_wcs.append(wc)
        self.fatal.append(wc)

    def _tx(self, op: int, b1: int, psn_word: int, ext: bytes,
            payload: bytes | bytearray | memoryview) -> None:  # fmt: skip
        assert self.peer is not None
        self.sent_ops.append(op)
        pkt = pack_bth(op, b1, self.peer.qpn, psn_word) + ext + bytes(payload)
        self.wire.send(self.peer, pkt + PADS[(b1 >> 4) & 3])

    def deliver(self, pkt: bytes, now: float) -> None:
        view = memoryview(pkt)
        op = pkt[0]
        if op == 0x07 and self.resp.write_middle(int.from_bytes(pkt[8:12], "big"), view):
            return  # the data path's shortcut, as RoceQp.input takes it
        hlen = HEADER_LENGTH[op]
        if not hlen or len(pkt) - ((pkt[1] >> 4) & 3) < hlen:
            return  # what RoceQp.input drops
        if 0x0D <= op <= 0x11:
            syndrome = -1 if op == 0x0E else pkt[12]
            payload = view[hlen : len(pkt) - ((pkt[1] >> 4) & 3)]
            self.req.receive(op, int.from_bytes(pkt[9:12], "big"), syndrome, payload, now)
        else:
            self.resp.receive(op, pkt[1], int.from_bytes(pkt[8:12], "big"), view)

    def post(self, wr: SendWr, now: float) -> None:
        mr = self.pd.mrs[wr.sg_list[0].lkey] if wr.sg_list else self.buf
        views = [mr.buf[s.addr - mr.addr : s.addr - mr.addr + s.length] for s in wr.sg_list]
        self.req.post(wr, views, sum(s.length for s in wr.sg_list), now)

    def post_recv(self, wr_id: int, off: int = 0, size: int = 4096) -> None:
        self.resp.rq.append(RecvWr(wr_id=wr_id, sg_list=(Sge(self.buf.addr + off, size,
                                                               self.buf.lkey),)))  # fmt: skip


class Wire:
    """In-flight packets between two ends, with seeded loss, duplication and reordering."""

    def __init__(self, loss: float = 0.0, dup: float = 0.0, reorder: float = 0.0,
                 seed: int = 0) -> None:  # fmt: skip
        self.loss, self.dup, self.reorder = loss, dup, reorder
        self.rng = random.Random(seed)
        self.flight: list[tuple[End, bytes]] = []
        self.now = 0.0
        self.delivered = 0
        self.filter: Callable[[End, bytes], bool] | None = None  # False: drop this one

    def send(self, dst: End, pkt: bytes) -> None:
        self.flight.append((dst, pkt))

    def step(self, ends: tuple[End, End]) -> bool:
        """Deliver what is in flight (one batch), or advance time to the next deadline.

        :returns: False when nothing is in flight and no timer is pending.
        """
        if self.flight:
            batch, self.flight = self.flight, []
            if self.reorder and len(batch) > 1 and self.rng.random() < self.reorder:
                i = self.rng.randrange(len(batch) - 1)
                batch[i], batch[i + 1] = batch[i + 1], batch[i]
            for dst, pkt in batch:
                if self.filter is not None and not self.filter(dst, pkt):
                    continue
                if self.rng.random() < self.loss:
                    continue
                for _ in range(2 if self.rng.random() < self.dup else 1):
                    self.delivered += 1
                    dst.deliver(pkt, self.now)
            for e in ends:
                e.resp.flush()
            return True
        deadlines = [d for e in ends if (d := e.req.deadline()) is not None]
        if not deadlines:
            return False
        self.now = max(self.now, min(deadlines))
        for e in ends:
            e.req.handle_timer(self.now)
            e.resp.flush()
        return True

    def run(self, ends: tuple[End, End], until: Callable[[], bool], max_steps: int = 20000) -> None:
        """Step until ``until()`` holds; fail after ``max_steps`` (never hang)."""
        for _ in range(max_steps):
            if until():
                return
            if not self.step(ends):
                break
        assert until(), "the pair went quiet before the condition held"


def pair(wire: Wire, pmtu: int = 256, timeout: int = 14, retry_cnt: int = 7,
         rnr_retry: int = 7, min_rnr_timer: int = 1, psn_a: int = 0xFFFFF0,
         psn_b: int = 77) -> tuple[End, End]:  # fmt: skip
    """Two connected ends (A's PSNs wrap early), both at RTS."""
    a, b = End("a", 0x11, psn_a, wire), End("b", 0x12, psn_b, wire)
    a.peer, b.peer = b, a
    for me, other in ((a, b), (b, a)):
        me.resp.start(other.psn, pmtu, int(RW), 4, min_rnr_timer, other.qpn)
        me.resp.coalesce = True
        me.req.start(me.psn, pmtu, local_ack_timeout(timeout), retry_cnt, rnr_retry, 4)
    return a, b


def write_wr(src: End, dst: End, off: int, n: int, wr_id: int, loff: int = 0,
             rkey: int | None = None, imm: int | None = None) -> SendWr:  # fmt: skip
    return SendWr(
        wr_id=wr_id,
        opcode=WrOpcode.RDMA_WRITE if imm is None else WrOpcode.RDMA_WRITE_WITH_IMM,
        send_flags=SendFlag.SIGNALED, sg_list=(Sge(src.buf.addr + loff, n, src.buf.lkey),),
        remote_addr=dst.rmb.addr + off, rkey=dst.rmb.rkey if rkey is None else rkey,
        imm_data=imm or 0,
    )  # fmt: skip


def send_wr(src: End, loff: int, n: int, wr_id: int, imm: int | None = None) -> SendWr:
    return SendWr(wr_id=wr_id, opcode=WrOpcode.SEND if imm is None else WrOpcode.SEND_WITH_IMM,
                  send_flags=SendFlag.SIGNALED, imm_data=imm or 0,
                  sg_list=(Sge(src.buf.addr + loff, n, src.buf.lkey),))  # fmt: skip


def read_wr(src: End, dst: End, roff: int, n: int, wr_id: int, loff: int) -> SendWr:
    return SendWr(wr_id=wr_id, opcode=WrOpcode.RDMA_READ, send_flags=SendFlag.SIGNALED,
                  sg_list=(Sge(src.buf.addr + loff, n, src.buf.lkey),),
                  remote_addr=dst.rmb.addr + roff, rkey=dst.rmb.rkey)  # fmt: skip
