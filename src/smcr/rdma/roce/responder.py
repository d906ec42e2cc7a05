"""The responder of an RC QP, sans-IO: PSN checks, memory checks, placement, ACK/NAK.

Design (rxe ``rxe_resp.c``, digested in spec rocev2 §5.3, §5.6 and §6).  Each
request packet goes through the checks in rxe's order and stops at the first
that fails:

1. **PSN**: the expected one proceeds; a later one gets one NAK PSN-sequence
   error (then silence until the gap closes); an earlier one is a duplicate:
   a SEND/WRITE is re-ACKed with the last processed PSN and *not* applied
   again, a READ is replayed from the saved resource (from a Middle packet if
   it starts inside the original, as rxe does).
2. **Opcode sequence**, 3. **QP access flags**, 4. **resources** (an empty
   receive queue gives an RNR NAK with our ``min_rnr_timer``), 5. **lengths**
   (First/Middle exactly PMTU, the message ending exactly on its RETH length),
   6. **rkey, PD, access and bounds of the whole RETH length**: all before a
   byte is placed, so a refused request leaves memory untouched.  Failures of
   2-6 are class-C errors: a NAK, then the QP goes to ERR (``fatal``).
7. **Execute**: one copy from the packet into the target memory (a WRITE
   straight into the MR, a SEND into the posted receive buffer).
8. **ACK** only packets with AckReq, as rxe does.  With :attr:`coalesce` the
   ACK is held until :meth:`Responder.flush`, which the host calls after each
   batch of received packets (and within one once :meth:`Responder.ack_due`),
   so one ACK answers a whole batch; anything else sent (a NAK, READ responses)
   flushes it first, keeping PSN order.

Like the requester, this does no I/O: packets leave through ``tx``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Final

from smcr.rdma.base import MemoryRegion, ProtectionDomain, scatter
from smcr.rdma.roce.fastpath import HEADER_LENGTH, RETH, U24, U32, pack_aeth
from smcr.rdma.roce.requester import Transmit, pdiff
from smcr.rdma.verbs import (
    AccessFlag,
    RecvWr,
    WcFlag,
    WcOpcode,
    WcStatus,
    WorkCompletion,
)
from smcr.wire.roce import Opcode

ACK_SYNDROME: Final = 0x1F  # ACK, credits "invalid" (31), as rxe sends (spec §5.4)
#: PSNs a held ACK may run ahead of the last one sent before a reader sends it at once
#: (:meth:`Responder.ack_due`) rather than at the end of its batch: an eighth of the
#: requester's window (:data:`~smcr.rdma.roce.requester.WINDOW`), so that a bulk stream's
#: window reopens every read while small messages of many connections share one ACK.
ACK_HOLD_PSNS: Final = 32
NAK_SEQ: Final = 0x60
NAK_INV: Final = 0x61
NAK_ACCESS: Final = 0x62
NAK_OP: Final = 0x63
MAX_RETH_LENGTH: Final = 1 << 31

# (Final: constants in the compiled build, where a plain global is a dict look-up per use)
FIRST: Final = 0
MIDDLE: Final = 1
LAST: Final = 2
ONLY: Final = 3
SEQ_NONE: Final = 0
SEQ_SEND: Final = 1
SEQ_WRITE: Final = 2
# opcode byte -> (class, position, with_imm); class: 1 SEND, 2 WRITE, 3 READ
_REQ: Final[dict[int, tuple[int, int, bool]]] = {
    0x00: (1, FIRST, False), 0x01: (1, MIDDLE, False), 0x02: (1, LAST, False),
    0x03: (1, LAST, True), 0x04: (1, ONLY, False), 0x05: (1, ONLY, True),
    0x06: (2, FIRST, False), 0x07: (2, MIDDLE, False), 0x08: (2, LAST, False),
    0x09: (2, LAST, True), 0x0A: (2, ONLY, False), 0x0B: (2, ONLY, True),
    0x0C: (3, ONLY, False),
}  # fmt: skip
_REMOTE_WRITE: Final = int(AccessFlag.REMOTE_WRITE)
_REMOTE_READ: Final = int(AccessFlag.REMOTE_READ)
_LOCAL_WRITE: Final = int(AccessFlag.LOCAL_WRITE)
# (Opcode's members of the per-packet code as Final names: smcr.rdma.roce.requester says why)
_ACKNOWLEDGE: Final = int(Opcode.ACKNOWLEDGE)
_READ_REQUEST: Final = int(Opcode.RDMA_READ_REQUEST)


class _FaultError(Exception):
    """A class-C error found while checking a request: NAK ``syndrome``, then ERR."""

    def __init__(self, syndrome: int, recv_status: WcStatus | None = None) -> None:
        super().__init__(syndrome)
        self.syndrome = syndrome
        self.recv_status = recv_status


class Responder:
    """The responder half of an RC QP (see the module docstring).

    :param qp_num: our QPN.
    :param pd: the QP's protection domain; an rkey of another PD is refused.
    :param lookup_rkey: the device's rkey table.
    :param tx: sends one packet.
    :param complete: delivers a receive completion.
    :param fatal: called once after a class-C NAK, with the receive completion
        the error produced (or None); the host moves the QP to ERR.
    """

    def __init__(
        self,
        qp_num: int,
        pd: ProtectionDomain,
        lookup_rkey: Callable[[int], MemoryRegion | None],
        tx: Transmit,
        complete: Callable[[WorkCompletion], None],
        fatal: Callable[[WorkCompletion | None], None],
    ) -> None:
        self.qp_num = qp_num
        self._pd = pd
        self._lookup = lookup_rkey
        self._tx = tx
        self._complete = complete
        self._fatal = fatal
        self.rq: deque[RecvWr] = deque()
        self.epsn = self.msn = 0
        self.pmtu = 1024
        self.access = 0
        self.min_rnr_timer = 0
        self.src_qp = 0
        self.coalesce = False
        self.pending_ack = -1  # PSN of the coalesced ACK flush() sends; -1: none held
        self.acked = -1  # PSN of the last ACK sent (ack_due's reference)
        self._nak_sent = False
        self._seq = SEQ_NONE
        self._reads: deque[tuple[int, int, int, int, int]] = deque(maxlen=1)
        self.max_dest_rd_atomic = 0
        # WRITE in progress: target view, offset, bytes left, total
        self._wbuf: memoryview | None = None
        self._wmr: MemoryRegion | None = None
        self._woff = self._wleft = self._wlen = 0
        # SEND in progress: the receive WR, its buffers, bytes placed, room
        self._rwr: RecvWr | None = None
        self._rviews: list[memoryview] = []
        self._roff = self._rroom = 0
        self.dead = False
        self.stats = {"duplicates": 0, "naks": 0, "rnr_naks": 0, "acks": 0, "seq_naks": 0}

    def start(self, rq_psn: int, pmtu: int, access: int, max_dest_rd_atomic: int,
              min_rnr_timer: int, src_qp: int) -> None:  # fmt: skip
        """Configure at RTR (spec §7.3)."""
        self.epsn = rq_psn & U24
        self.acked = (self.epsn - 1) & U24
        self.pmtu = pmtu
        self.access = access
        self.max_dest_rd_atomic = max_dest_rd_atomic
        self._reads = deque(maxlen=max(1, max_dest_rd_atomic))
        self.min_rnr_timer = min_rnr_timer
        self.src_qp = src_qp

    # ------------------------------------------------------------------ input

    def write_middle(self, psn_word: int, pkt: memoryview) -> bool:
        """The data path's common case: an in-order WRITE Middle of a WRITE in progress.

        Does exactly what :meth:`receive` would for such a packet, with the
        checks that can fail for it (PSN, sequence, length, MR still valid),
        in a few lines; returns False (nothing done) for anything else, which
        then takes the full path.  ``pkt`` is BTH through pad, no ICRC.
        """
        n = len(pkt) - 12
        left = self._wleft
        mr = self._wmr
        if ((psn_word & U24) != self.epsn or self._seq != SEQ_WRITE or n != self.pmtu
                or n >= left or pkt[1] & 0x3F or self.dead or mr is None or not mr.valid
                or self._wbuf is None):  # fmt: skip  (0x3F: PadCnt and TVer must be 0)
            return False
        off = self._woff
        self._wbuf[off : off + n] = pkt[12:]
        self._woff = off + n
        self._wleft = left - n
        self.epsn = (self.epsn + 1) & U24
        self._nak_sent = False
        if psn_word & 0x80000000:
            self._ack(psn_word & U24)
        return True

    def middle_target(self) -> tuple[memoryview, int, int] | None:
        """Where in-order WRITE Middles go now: ``(buffer, offset, how many may come)``.

        For a caller that places a run of Middles itself (the device's receive
        path, :meth:`~smcr.rdma.roce.fastpath.IcrcFlow.place_middles`): the next
        packet must carry PSN :attr:`epsn` and ``pmtu`` bytes, and a Middle must
        leave bytes for the Last, hence the count.  None while no multi-packet
        WRITE is in progress (or its MR is gone): every packet takes :meth:`receive`.
        """
        mr = self._wmr
        if (self._seq != SEQ_WRITE or self.dead or self._wbuf is None or mr is None
                or not mr.valid):  # fmt: skip
            return None
        return self._wbuf, self._woff, (self._wleft - 1) // self.pmtu

    def middles_placed(self, count: int, ack_psn: int) -> None:
        """``count`` Middles were placed at :meth:`middle_target`; ACK ``ack_psn`` if >= 0."""
        n = count * self.pmtu
        self._woff += n
        self._wleft -= n
        self.epsn = (self.epsn + count) & U24
        self._nak_sent = False
        if ack_psn >= 0:
            self._ack(ack_psn)

    def receive(self, op: int, b1: int, psn_word: int, pkt: memoryview) -> None:
        """One request packet, BTH through pad (ICRC already checked and stripped)."""
        if self.dead:
            return
        psn = psn_word & U24
        d = pdiff(psn, self.epsn)
        if d:
            if d > 0:
                if not self._nak_sent:
                    self._nak_sent = True
                    self.stats["seq_naks"] += 1
                    self._send_ack(self.epsn, NAK_SEQ)
            else:
                self.stats["duplicates"] += 1
                if op == _READ_REQUEST:
                    self._replay_read(psn, pkt)
                else:
                    self._ack((self.epsn - 1) & U24)
            return
        self._nak_sent = False
        try:
            self._execute(op, b1, psn, pkt)
        except _FaultError as fault:
            self._fail(psn, fault)
            return
        if psn_word & 0x80000000 and op != _READ_REQUEST:
            self._ack(psn)

    def _execute(self, op: int, b1: int, psn: int, pkt: memoryview) -> None:
        """Checks 2-6 and the execution of one in-order request (raises :class:`_FaultError`)."""
        desc = _REQ.get(op)
        if desc is None:
            raise _FaultError(NAK_INV)  # atomics, invalidate, FLUSH: not offered
        cls, pos, imm = desc
        hlen = HEADER_LENGTH[op]
        end = len(pkt) - ((b1 >> 4) & 3)
        if end < hlen:
            raise _FaultError(NAK_INV)
        payload = pkt[hlen:end]
        n = end - hlen
        # 2. opcode sequence (rxe check_op_seq)
        want = SEQ_NONE if pos in (FIRST, ONLY) else (SEQ_SEND if cls == 1 else SEQ_WRITE)
        if self._seq != want:
            raise _FaultError(NAK_INV)
        # 5. (per-packet part) lengths
        pmtu = self.pmtu
        if (pos in (FIRST, MIDDLE) and n != pmtu) or n > pmtu or (pos == LAST and n == 0):
            raise _FaultError(NAK_INV)
        if cls == 1:
            self._send(pos, imm, payload, n, pkt, end)
        elif cls == 2:
            self._write(pos, imm, payload, n, pkt)
        else:
            self._read(psn, pkt)
            return
        self.epsn = (psn + 1) & U24

    # ------------------------------------------------------------------ SEND

    def _send(self, pos: int, imm: bool, payload: memoryview, n: int, pkt: memoryview,
              end: int) -> None:  # fmt: skip
        if pos in (FIRST, ONLY):
            if not self.rq:
                raise _RnrError
            wr = self.rq[0]
            views: list[memoryview] = []
            room = 0
            for sge in wr.sg_list:
                v = self._pd.lookup_local(sge, _LOCAL_WRITE)
                if v is None:
                    raise _FaultError(NAK_OP, WcStatus.LOC_PROT_ERR)
                views.append(v)
                room += len(v)
            self.rq.popleft()
            self._rwr, self._rviews, self._roff, self._rroom = wr, views, 0, room
        if self._roff + n > self._rroom:
            raise _FaultError(NAK_INV, WcStatus.LOC_LEN_ERR)
        if n:
            scatter(self._rviews, self._roff, payload)
            self._roff += n
        if pos in (LAST, ONLY):
            self._seq = SEQ_NONE
            self.msn = (self.msn + 1) & U24
            rwr = self._rwr
            assert rwr is not None
            self._rwr = None
            value = U32.unpack_from(pkt, end - n - 4)[0] if imm else 0
            self._complete(WorkCompletion(
                wr_id=rwr.wr_id, status=WcStatus.SUCCESS, opcode=WcOpcode.RECV,
                qp_num=self.qp_num, byte_len=self._roff, imm_data=value,
                wc_flags=WcFlag.WITH_IMM if imm else WcFlag.NONE, src_qp=self.src_qp,
            ))  # fmt: skip
        else:
            self._seq = SEQ_SEND

    # ----------------------------------------------------------------- WRITE

    def _write(self, pos: int, imm: bool, payload: memoryview, n: int, pkt: memoryview) -> None:
        if not self.access & _REMOTE_WRITE:
            raise _FaultError(NAK_INV)
        if imm and pos in (LAST, ONLY) and not self.rq:
            raise _RnrError
        if pos in (FIRST, ONLY):
            va, rkey, length = RETH.unpack_from(pkt, 12)
            if length > MAX_RETH_LENGTH or (pos == FIRST and length <= n):
                raise _FaultError(NAK_INV)
            if length:
                target = self._target(rkey, va, length, _REMOTE_WRITE)
                if target is None:
                    raise _FaultError(NAK_ACCESS)
                self._wbuf, self._woff = target
                self._wmr = self._lookup(rkey)
            else:
                self._wbuf, self._woff = None, 0  # zero length: no rkey check (C9-88)
            self._wleft = self._wlen = length
        left = self._wleft
        if (n > left if pos in (FIRST, MIDDLE) else n != left) or (pos == MIDDLE and n == left):
            raise _FaultError(NAK_INV)
        if n:
            mr = self._wmr
            if self._wbuf is None or mr is None or not mr.valid:
                raise _FaultError(NAK_ACCESS)  # deregistered during a multi-packet WRITE
            off = self._woff
            self._wbuf[off : off + n] = payload
            self._woff = off + n
            self._wleft = left - n
        if pos in (LAST, ONLY):
            self._seq = SEQ_NONE
            self.msn = (self.msn + 1) & U24
            self._wbuf = None
            if imm:
                wr = self.rq.popleft()
                (value,) = U32.unpack_from(pkt, len(pkt) - ((pkt[1] >> 4) & 3) - n - 4)
                self._complete(WorkCompletion(
                    wr_id=wr.wr_id, status=WcStatus.SUCCESS, opcode=WcOpcode.RECV_RDMA_WITH_IMM,
                    qp_num=self.qp_num, byte_len=self._wlen, imm_data=value,
                    wc_flags=WcFlag.WITH_IMM, src_qp=self.src_qp,
                ))  # fmt: skip
        else:
            self._seq = SEQ_WRITE

    def _target(self, rkey: int, va: int, length: int, need: int) -> tuple[memoryview, int] | None:
        """Spec §6 steps 3-4: the MR's buffer and offset, or None (NAK remote access)."""
        mr = self._lookup(rkey)
        if (mr is None or not mr.valid or mr.rkey != rkey or mr.pd is not self._pd
                or not mr.access_bits & need):  # fmt: skip
            return None
        off = va - mr.addr
        if off < 0 or off + length > mr.length:
            return None
        return mr.buf, off

    # ------------------------------------------------------------------ READ

    def _read(self, psn: int, pkt: memoryview) -> None:
        if not self.access & _REMOTE_READ or self.max_dest_rd_atomic == 0:
            raise _FaultError(NAK_INV)
        va, rkey, length = RETH.unpack_from(pkt, 12)
        if length > MAX_RETH_LENGTH:
            raise _FaultError(NAK_INV)
        if length and self._target(rkey, va, length, _REMOTE_READ) is None:
            raise _FaultError(NAK_ACCESS)
        npkts = max(1, -(-length // self.pmtu))
        last = (psn + npkts - 1) & U24
        self._reads.append((psn, last, va, rkey, length))
        self.epsn = (last + 1) & U24
        self.msn = (self.msn + 1) & U24  # C9-148: counted when the READ is received
        self._respond(psn, va, rkey, length, True)

    def _respond(self, psn: int, va: int, rkey: int, length: int, from_start: bool) -> None:
        """Send READ responses for ``length`` bytes at ``va``, PSNs from ``psn``."""
        self.flush()
        target = self._target(rkey, va, length, _REMOTE_READ) if length else None
        if length and target is None:
            return  # deregistered since: a replay is dropped, the requester times out
        buf, off = target if target is not None else (memoryview(b""), 0)
        pmtu = self.pmtu
        npkts = max(1, -(-length // pmtu))
        aeth = pack_aeth(ACK_SYNDROME, self.msn)
        for k in range(npkts):
            chunk = buf[off + k * pmtu : off + min(length, (k + 1) * pmtu)] if length else b""
            if npkts == 1:
                op = Opcode.RDMA_READ_RESPONSE_ONLY if from_start else (
                    Opcode.RDMA_READ_RESPONSE_LAST)
            elif k == 0:
                op = Opcode.RDMA_READ_RESPONSE_FIRST if from_start else (
                    Opcode.RDMA_READ_RESPONSE_MIDDLE)
            elif k == npkts - 1:
                op = Opcode.RDMA_READ_RESPONSE_LAST
            else:
                op = Opcode.RDMA_READ_RESPONSE_MIDDLE
            ext = b"" if op == Opcode.RDMA_READ_RESPONSE_MIDDLE else aeth
            self._tx(op, (-len(chunk) & 3) << 4, (psn + k) & U24, ext, chunk)

    def _replay_read(self, psn: int, pkt: memoryview) -> None:
        """A duplicate READ: answer it again if it is a subset of a saved one (spec §5.6)."""
        if len(pkt) < 28:
            return
        va, rkey, length = RETH.unpack_from(pkt, 12)
        for first, last, ova, orkey, olength in self._reads:
            if pdiff(psn, first) >= 0 and pdiff(psn, last) <= 0:
                if rkey == orkey and va >= ova and va + length <= ova + olength:
                    self._respond(psn, va, rkey, length, psn == first)
                return

    # ------------------------------------------------------------- ACK / NAK

    def _ack(self, psn: int) -> None:
        if self.coalesce:
            self.pending_ack = psn
        else:
            self._send_ack(psn, ACK_SYNDROME)

    def ack_due(self) -> bool:
        """Whether the held ACK should go now, not at the end of the batch.

        True when it covers :data:`ACK_HOLD_PSNS` or more PSNs past the last ACK
        sent.  Why hold at all: with many connections in a link group each read
        carries one connection's small message, and an ACK per read added a
        packet and a system call to each; the batch's end (:meth:`flush`) comes within
        one batch's work, well inside any retransmit timer.
        """
        held = self.pending_ack
        return held >= 0 and (held - self.acked) & U24 >= ACK_HOLD_PSNS

    def flush(self) -> None:
        """Send the held (coalesced) ACK, if any."""
        if self.pending_ack >= 0:
            psn, self.pending_ack = self.pending_ack, -1
            self._send_ack(psn, ACK_SYNDROME)

    def _send_ack(self, psn: int, syndrome: int) -> None:
        if syndrome != ACK_SYNDROME:
            self.flush()
            self.stats["naks"] += 1
        else:
            self.stats["acks"] += 1
            self.acked = psn
        self._tx(_ACKNOWLEDGE, 0, psn, pack_aeth(syndrome, self.msn), b"")

    def _fail(self, psn: int, fault: _FaultError) -> None:
        if isinstance(fault, _RnrError):
            self.stats["rnr_naks"] += 1
            self._send_ack(psn, 0x20 | (self.min_rnr_timer & 0x1F))
            return
        self._send_ack(psn, fault.syndrome)
        self.dead = True
        wc = None
        if self._rwr is not None:
            if fault.recv_status is not None:
                wc = WorkCompletion(wr_id=self._rwr.wr_id, status=fault.recv_status,
                                    opcode=WcOpcode.RECV, qp_num=self.qp_num)  # fmt: skip
            else:
                self.rq.appendleft(self._rwr)  # flushed with the rest
            self._rwr = None
        elif fault.recv_status is not None and self.rq:
            w = self.rq.popleft()
            wc = WorkCompletion(wr_id=w.wr_id, status=fault.recv_status, opcode=WcOpcode.RECV,
                                qp_num=self.qp_num)  # fmt: skip
        self._fatal(wc)


class _RnrError(_FaultError):
    """No receive WR for a SEND or WRITE-with-immediate: RNR NAK, no state change."""

    def __init__(self) -> None:
        super().__init__(0x20)
