"""The requester and completer of an RC QP, sans-IO: send queue, PSNs, ACKs, retries.

Design (rxe ``rxe_req.c`` and ``rxe_comp.c``, digested in spec rocev2 §5.2, §5.5):

* **PSNs are assigned at post time.**  A SEND/WRITE of L bytes takes
  ``max(1, ceil(L / pmtu))`` PSNs, a READ as many (one per response packet).
  Three PSN cursors then say everything: ``una`` (oldest unacknowledged,
  rxe's ``comp.psn``), ``tx`` (next to transmit, ``req.psn``) and ``next``
  (next to assign).  Go-back-N is just ``tx = una``; a partially answered READ
  is re-requested from ``una`` with VA and length advanced (spec §5.5), and a
  partially acknowledged WRITE resumes with a Middle/Last packet, as rxe does.
* **Transmission** runs in whichever thread calls in (the poster, or the
  progress thread on an ACK), limited by a PSN window (:data:`WINDOW` unacked
  PSNs, smaller for a while after timeouts: below) and ``max_rd_atomic``.
  AckReq goes on the last packet a transmission round sends (nothing more to
  send now: the responder must answer it) and every
  :data:`ACK_EVERY` packets of a message, not on every message's last packet as
  rxe's requester does: a WRITE followed by its CDC would cost the responder an
  ACK each, where the CDC's ACK acknowledges both (ACKs are cumulative).
* **A receiver that takes nothing**: go-back-N resends a whole window per
  timeout.  Against a receiver that drops every burst it cannot take (an
  emulated rxe guest under 5% loss: 7,490 timeouts and 1.9 million packets for
  2 MiB, about nothing acknowledged per timeout, until the guest ran out of
  memory) that is a flood that never ends.  So a second timeout in a row with
  nothing acknowledged between resends only :data:`MIN_CWND` PSNs, and each
  ACK then opens that window by what it acknowledged (doubling per round trip)
  until the PSN window is whole again; AckReq goes on every quarter of such a
  window, so one lost packet or ACK does not stall it.  Nothing else shrinks
  it: a single timeout, a sequence-error NAK and an RNR NAK go back with the
  whole window as before.  Measured: TCP's rule (any timeout restarts from
  :data:`MIN_CWND`, any NAK halves the window, as in Reno) made 10% random loss
  between two namespaces 10-20x slower (1-2 s for 2 MiB became 12-45 s, the
  small windows' tails met 30x as many timeouts); this rule keeps it at 1-2 s.
* **Completion** strictly in posting order: an ACK or READ response with PSN P
  completes every SEND/WRITE whose last PSN is at or below P (coalesced ACKs);
  an ACK beyond a READ whose responses did not all arrive starts a retry.
* **Timers**: one retransmit deadline (``4.096 µs * 2**timeout``, re-armed on
  progress) and one RNR deadline; the host asks :meth:`Requester.deadline`
  and calls :meth:`Requester.handle_timer`.  Retries exhausted complete the
  head WQE with RETRY_EXC_ERR / RNR_RETRY_EXC_ERR and report the QP fatal.
  ``retry_cnt == 7`` and ``rnr_retry == 7`` are infinite, as in rxe.

Nothing here does I/O or reads a clock: packets go out through ``tx``,
completions through ``complete``, a fatal error through ``fatal``; ``now`` is
passed in.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Final

from smcr.rdma.base import scatter
from smcr.rdma.roce.fastpath import ACK_REQ, RETH, U24, U32, Buffer, MiddleRun
from smcr.rdma.verbs import (
    RNR_TIMER_SECONDS,
    SendFlag,
    SendWr,
    WcOpcode,
    WcStatus,
    WorkCompletion,
    WrOpcode,
)
from smcr.wire.roce import Opcode

#: PSNs a requester may have unacknowledged: twice rxe's ``RXE_MAX_UNACKED_PSNS`` (128).  A
#: responder puts no limit on WRITEs in flight (SENDs are limited by its receive queue, with
#: RNR); the receiver's socket buffer does, which :meth:`RoceQp._window` applies.  Measured
#: between two namespaces (bench/roce_bench.py): WRITE 1743 MB/s with 128, 1976 with 256.
WINDOW: Final = 256
#: Set AckReq at least every this many packets of a long message (rxe: RXE_MAX_PKT_PER_ACK).
#: Seen against live rxe 6.12 (tests/interop, not in spec rocev2.md): rxe itself sets AckReq
#: on every 66th packet (PSN offsets 65, 131, 197 of a message: its counter must *exceed* 64)
#: and on the last, and it answers every AckReq packet with its own ACK (no coalescing).
#: Our 64 is within what rxe's responder expects; our ACKs, coalesced per batch, satisfy it.
ACK_EVERY: Final = 64
#: The window after a second timeout in a row, in PSNs (module doc, "A receiver that
#: takes nothing").
MIN_CWND: Final = 4
#: A restart window this small or smaller goes out one packet per datagram, no GSO
#: (:meth:`RoceQp.flush_tx <smcr.rdma.roce.qp.RoceQp.flush_tx>`).  Why: a stalled
#: requester resends :data:`MIN_CWND` PSNs per retransmit timeout and hears nothing until
#: one of them and its ACK get through; as one GSO buffer (between namespaces it stays
#: one skb to the receiving socket, so a drop takes all of them) each timeout was a
#: single chance, and at 30% loss each way a link went silent for 2 s (the LLC wait)
#: often enough to reset connections (tests/roce/test_loss.py).  Sent apart, each packet
#: is a chance of its own, and a duplicate read apart from the others gets its own ACK.
SPREAD_CWND: Final = 16
#: The restart window of a path that has not stalled: more than any PSN window.
NOT_RESTARTED: Final = 1 << 24
#: Retransmit period used when ``timeout == 0`` would mean "wait forever".
MIN_PERIOD: Final = 0.001

K_SEND: Final = 0
K_WRITE: Final = 1
K_READ: Final = 2
_KIND: Final = {
    WrOpcode.SEND: K_SEND, WrOpcode.SEND_WITH_IMM: K_SEND,
    WrOpcode.RDMA_WRITE: K_WRITE, WrOpcode.RDMA_WRITE_WITH_IMM: K_WRITE,
    WrOpcode.RDMA_READ: K_READ,
}  # fmt: skip
_WC_OP: Final = (WcOpcode.SEND, WcOpcode.RDMA_WRITE, WcOpcode.RDMA_READ)
_IMM: Final = (WrOpcode.SEND_WITH_IMM, WrOpcode.RDMA_WRITE_WITH_IMM)
# (first, middle, last, only) opcodes per kind, with and without immediate data
#: A message's opcodes by the packet's place in it: first, middle, last, only (``Wqe.ops``).
OP_FIRST: Final = 0
OP_MIDDLE: Final = 1
OP_LAST: Final = 2
OP_ONLY: Final = 3
_OPS: Final = {
    (K_SEND, False): (Opcode.SEND_FIRST, Opcode.SEND_MIDDLE, Opcode.SEND_LAST, Opcode.SEND_ONLY),
    (K_SEND, True): (Opcode.SEND_FIRST, Opcode.SEND_MIDDLE, Opcode.SEND_LAST_WITH_IMMEDIATE,
                     Opcode.SEND_ONLY_WITH_IMMEDIATE),
    (K_WRITE, False): (Opcode.RDMA_WRITE_FIRST, Opcode.RDMA_WRITE_MIDDLE, Opcode.RDMA_WRITE_LAST,
                       Opcode.RDMA_WRITE_ONLY),
    (K_WRITE, True): (Opcode.RDMA_WRITE_FIRST, Opcode.RDMA_WRITE_MIDDLE,
                      Opcode.RDMA_WRITE_LAST_WITH_IMMEDIATE, Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE),
}  # fmt: skip
_SOLICITED: Final = int(SendFlag.SOLICITED)
_SIGNALED: Final = int(SendFlag.SIGNALED)
_FENCE: Final = int(SendFlag.FENCE)
# Opcode's members the per-packet code compares with, as Final names (C statics in the
# compiled build): smcr.wire.roce is not compiled, so a member read from its class is a
# Python attribute read, some 900 instructions each (Python 3.11's EnumType has a
# ``__getattr__``, which makes every attribute read of the class a call of
# ``__getattribute__``); the members of the compiled modules' enums are C statics already
_ACKNOWLEDGE: Final = int(Opcode.ACKNOWLEDGE)

#: ``tx(opcode, b1, psn_word, ext_headers, payload)``: send one packet (pad and ICRC added).
Transmit = Callable[[int, int, int, bytes, Buffer], None]


def pdiff(a: int, b: int) -> int:
    """Signed 24-bit ``a - b`` (spec §5.1)."""
    d = (a - b) & U24
    return d - 0x1000000 if d & 0x800000 else d


class Wqe:
    """A posted send WR with its PSN range and resolved local memory."""

    __slots__ = ("data", "first", "gate", "imm", "kind", "last", "length", "npkts", "ops",
                 "solicited", "views", "wr")  # fmt: skip

    def __init__(self, wr: SendWr, views: list[memoryview], length: int, first: int,
                 npkts: int) -> None:  # fmt: skip
        self.wr = wr
        self.kind = _KIND[wr.opcode]
        self.imm = wr.opcode in _IMM
        flags = int(wr.send_flags)
        self.solicited = bool(flags & _SOLICITED)
        # a READ (max_rd_atomic) or a fenced WR may have to wait for earlier READs
        self.gate = self.kind == K_READ or bool(flags & _FENCE)
        self.ops: tuple[Opcode, ...] = _OPS.get((self.kind, self.imm), ())
        self.views = views
        # one SGE: send straight from it; several: gather once (read once, as inline)
        self.data: Buffer = views[0] if len(views) == 1 else b"".join(views)
        self.length = length
        self.first = first
        self.npkts = npkts
        self.last = (first + npkts - 1) & U24


class Requester:
    """Send queue and completer of one RC QP (see the module docstring).

    :param qp_num: our QPN (for completions).
    :param tx: sends one packet.
    :param complete: delivers a send-queue completion.
    :param fatal: called once with the failing WR's completion; the host moves
        the QP to ERR and flushes (:meth:`flush`).
    :param tx_run: sends a run of Middle packets of one message (the data path);
        without it they go through ``tx`` one by one.
    """

    def __init__(
        self,
        qp_num: int,
        tx: Transmit,
        complete: Callable[[WorkCompletion], None],
        fatal: Callable[[WorkCompletion], None],
        *,
        sq_sig_all: bool = False,
        window: int = WINDOW,
        tx_run: Callable[[MiddleRun], None] | None = None,
    ) -> None:
        self.qp_num = qp_num
        self._tx = tx
        self._tx_run = tx_run
        self._complete = complete
        self._fatal = fatal
        self.sq_sig_all = sq_sig_all
        self.window = window
        # the restart window (module doc): unlimited until a stall, ``window`` caps it
        self.cwnd = NOT_RESTARTED
        self._stalled = False  # a timeout fired and nothing was acknowledged since
        self.wqes: deque[Wqe] = deque()
        self.pmtu = 1024
        self.una = self.tx = self.next = 0
        self.hi = 0  # one past the highest PSN ever sent: what an ACK may acknowledge
        self._final = -1  # PSN of the current transmission round's last packet (pump)
        self._every = ACK_EVERY  # AckReq on every this many packets of a message (pump)
        self._tx_idx = 0  # index in wqes of the WQE holding ``tx``
        self.period: float | None = None
        self.retry_cnt = self.rnr_retry = 0
        self.retry_left = self.rnr_left = 0
        self.max_rd_atomic = 1
        self.rto: float | None = None  # retransmit deadline
        self.rnr_until: float | None = None
        self._retried_at = -1  # ``una`` of the last out-of-order-triggered retry
        self.dead = False
        self.stats = {"packets": 0, "retransmits": 0, "timeouts": 0, "naks": 0, "rnr": 0,
                      "restarts": 0}  # fmt: skip

    def start(self, sq_psn: int, pmtu: int, timeout_s: float | None, retry_cnt: int,
              rnr_retry: int, max_rd_atomic: int) -> None:  # fmt: skip
        """Configure at RTS (the attributes of spec §7.3)."""
        self.una = self.tx = self.next = self.hi = sq_psn & U24
        self.pmtu = pmtu
        self.period = timeout_s
        self.retry_cnt, self.rnr_retry = retry_cnt, rnr_retry
        self.retry_left, self.rnr_left = retry_cnt, rnr_retry
        self.max_rd_atomic = max(1, max_rd_atomic)

    # ------------------------------------------------------------------ input

    def post(self, wr: SendWr, views: list[memoryview], length: int, now: float,
             transmit: bool = True) -> None:  # fmt: skip
        """Queue a WR whose local memory the caller already checked, then transmit.

        :param transmit: False for all but the last WR of a batch posted together: they
            go out in one round (:meth:`pump`), whose last packet alone asks for an ACK.
        """
        npkts = max(1, -(-length // self.pmtu))
        self.wqes.append(Wqe(wr, views, length, self.next, npkts))
        self.next = (self.next + npkts) & U24
        if transmit:
            self.pump(now)

    def deadline(self) -> float | None:
        """The earliest time :meth:`handle_timer` must run, or None."""
        if self.rnr_until is not None:
            return self.rnr_until
        return self.rto

    def handle_timer(self, now: float) -> None:
        """Run expired timers: the RNR wait, then the retransmit timeout."""
        if self.dead:
            return
        if self.rnr_until is not None:
            if now < self.rnr_until:
                return
            self.rnr_until = None
            self._go_back(now)
            return
        if self.rto is None or now < self.rto:
            return
        self.rto = None
        if self.una == self.tx:
            return
        self.stats["timeouts"] += 1
        if self.period is None:  # timeout 0: rxe never retransmits; we poll, uncounted
            self._go_back(now)
            return
        if self._stalled:
            self._restart()  # a second timeout with nothing acknowledged since the first
        self._stalled = True
        self._retry(now)

    def receive(self, opcode: int, psn: int, syndrome: int, payload: memoryview,
                now: float) -> None:  # fmt: skip
        """A response: ACK/NAK (``opcode`` 0x11) or READ response (0x0D-0x10).

        :param syndrome: the AETH syndrome, or -1 for a READ Response Middle.
        """
        if self.dead or not self.wqes or pdiff(psn, self.hi) >= 0:
            return  # nothing outstanding, or beyond anything sent: bogus
        if opcode == _ACKNOWLEDGE:
            kind = syndrome >> 5
            if kind == 0:
                self._acked(psn, now)
            elif kind == 1:
                self._rnr(psn, syndrome, now)
            elif kind == 3:
                self._nak(psn, syndrome & 0x1F, now)
            return
        self._read_response(psn, payload, now)

    # ------------------------------------------------------------ completion

    def _acked(self, psn: int, now: float) -> None:
        """An ACK of everything up to ``psn`` (coalesced: it may cover many WQEs)."""
        if pdiff(psn, self.una) < 0:
            return  # stale (a duplicate's re-ACK)
        before = self.una
        head = self._retire(psn)
        if head is not None and head.kind == K_READ and pdiff(psn, head.first) >= 0:
            # the responder is past a READ whose responses we lack: they were lost
            self._retry_once(now)
        elif pdiff(psn + 1, self.una) > 0 and (head is None or head.kind != K_READ):
            self.una = (psn + 1) & U24  # partial ACK inside a multi-packet SEND/WRITE
        self._progress(before, now)

    def _retire(self, psn: int) -> Wqe | None:
        """Complete the SEND/WRITE WQEs whose last PSN is at or below ``psn``.

        :returns: the new head WQE (not completed), or None.
        """
        wqes = self.wqes
        while wqes:
            w = wqes[0]
            if w.kind == K_READ or pdiff(psn, w.last) < 0:
                return w
            if pdiff(self.hi, w.first) <= 0:
                return w  # never sent: an ACK cannot cover it
            wqes.popleft()
            self._tx_idx = max(0, self._tx_idx - 1)
            self.una = (w.last + 1) & U24
            self._done(w, WcStatus.SUCCESS)
        return None

    def _read_response(self, psn: int, payload: memoryview, now: float) -> None:
        before = self.una
        head = self._retire((psn - 1) & U24)  # a response implicitly ACKs what precedes it
        if (head is None or head.kind != K_READ or pdiff(psn, head.first) < 0
                or pdiff(psn, self.una) < 0):  # fmt: skip
            self._progress(before, now)  # not for the head READ, or a stale duplicate
            return
        if psn != self.una:
            self._progress(before, now)
            self._retry_once(now)  # a response was lost: re-request the tail
            return
        k = pdiff(psn, head.first)
        off = k * self.pmtu
        want = min(self.pmtu, head.length - off)
        if len(payload) != want:
            return  # malformed response: drop it, the timer will retry
        if want:
            scatter(head.views, off, payload)
        self.una = (psn + 1) & U24
        if psn == head.last:
            self.wqes.popleft()
            self._tx_idx = max(0, self._tx_idx - 1)
            self._done(head, WcStatus.SUCCESS)
        self._progress(before, now)

    def _progress(self, before: int, now: float) -> None:
        """After an ACK/response: :meth:`_advanced`, then send."""
        self._advanced(before, now)
        self.pump(now)

    def _advanced(self, before: int, now: float) -> None:
        """If ``una`` moved: reset retry counters and the timer, open the restart window by
        what was acknowledged, and skip what the responder already has (sent before a
        go-back that the restart window cut short)."""
        if self.una == before:
            return
        self._stalled = False
        if self.cwnd < self.window:  # slow start after a timeout: doubles per round trip
            self.cwnd = min(self.cwnd + pdiff(self.una, before), self.window)
        self.retry_left, self.rnr_left = self.retry_cnt, self.rnr_retry
        if pdiff(self.una, self.tx) > 0:
            self.tx = self.una
            self._seek()
        self.rto = None if self.una == self.tx else self._rto(now)

    def _done(self, w: Wqe, status: WcStatus) -> None:
        if status is not WcStatus.SUCCESS or self.sq_sig_all or int(w.wr.send_flags) & _SIGNALED:
            self._complete(WorkCompletion(
                wr_id=w.wr.wr_id, status=status, opcode=_WC_OP[w.kind], qp_num=self.qp_num,
                byte_len=w.length,
            ))  # fmt: skip

    def _nak(self, psn: int, code: int, now: float) -> None:
        self.stats["naks"] += 1
        before = self.una
        self._retire((psn - 1) & U24)
        if code == 0:  # PSN sequence error: go back to what the responder expects
            if pdiff(psn, self.una) > 0:
                self.una = psn
            if self.rnr_until is not None:
                return  # packets sent after an RNR NAK; the RNR timer goes back anyway
            self._advanced(before, now)
            self._retry(now)
            return
        status = {1: WcStatus.REM_INV_REQ_ERR, 2: WcStatus.REM_ACCESS_ERR}.get(
            code, WcStatus.REM_OP_ERR
        )
        self._fail_head(status)

    def _rnr(self, psn: int, syndrome: int, now: float) -> None:
        # The wait is the NAK's timer code as IBTA tables it, not rounded.  Seen against live
        # rxe 6.12 (tests/interop; not in spec rocev2.md): rxe as *requester* rounds its RNR
        # wait up to whole jiffies (at least 4 ms at HZ=250; ~6.5 ms per retry measured for
        # code 1 = 0.01 ms), while we honour 0.01 ms exactly (~0.4 ms per retry, the round
        # trip).  Both are within the rules; rnr_retry 7 retries without limit on both sides.
        self.stats["rnr"] += 1
        before = self.una
        self._retire((psn - 1) & U24)
        if pdiff(psn, self.una) > 0:
            self.una = psn
        if self.una != before:
            self.retry_left = self.retry_cnt
        if self.rnr_left == 0:
            self._fail_head(WcStatus.RNR_RETRY_EXC_ERR)
            return
        if self.rnr_retry != 7:
            self.rnr_left -= 1
        self.tx = self.una  # stop: nothing goes out until the RNR timer expires
        self._seek()
        self.rto = None
        self.rnr_until = now + RNR_TIMER_SECONDS[syndrome & 0x1F]

    def _restart(self) -> None:
        """A retransmit timeout: the go-back sends :data:`MIN_CWND` PSNs (module doc)."""
        self.cwnd = MIN_CWND
        self.stats["restarts"] += 1

    def _retry_once(self, now: float) -> None:
        """Go back for lost responses, once per ``una`` (later out-of-order ones are dropped)."""
        if self._retried_at == self.una:
            return
        self._retried_at = self.una
        self._retry(now)

    def _retry(self, now: float) -> None:
        """Go back and resend from ``una``, one retry counted (``retry_cnt`` 7: without
        limit); with none left the head WQE fails with RETRY_EXC_ERR (rxe ``rxe_completer``)."""
        if self.retry_left == 0:
            self._fail_head(WcStatus.RETRY_EXC_ERR)
            return
        if self.retry_cnt != 7:
            self.retry_left -= 1
        self._go_back(now)

    def _fail_head(self, status: WcStatus) -> None:
        """The head WQE fails with ``status``; the host moves the QP to ERR."""
        self.dead = True
        self.rto = self.rnr_until = None
        w = self.wqes.popleft()
        self._fatal(WorkCompletion(wr_id=w.wr.wr_id, status=status, opcode=_WC_OP[w.kind],
                                   qp_num=self.qp_num, byte_len=w.length))  # fmt: skip

    def flush(self) -> list[SendWr]:
        """Stop for good and hand back every WR still queued (to flush with WR_FLUSH_ERR)."""
        self.dead = True
        self.rto = self.rnr_until = None
        out = [w.wr for w in self.wqes]
        self.wqes.clear()
        return out

    # ---------------------------------------------------------- transmission

    def _rto(self, now: float) -> float:
        return now + (self.period if self.period is not None else MIN_PERIOD * 100)

    def _go_back(self, now: float) -> None:
        """Go-back-N from ``una`` (spec §5.5)."""
        self.tx = self.una
        self._seek()
        self.rto = None
        self.pump(now)

    def _seek(self) -> None:
        """Point ``_tx_idx`` at the WQE holding ``tx``."""
        for i, w in enumerate(self.wqes):
            if pdiff(self.tx, w.last) <= 0:
                self._tx_idx = i
                return
        self._tx_idx = len(self.wqes)

    def pump(self, now: float) -> None:
        """Transmit what the window, the READ limit and fences allow."""
        if self.dead or self.rnr_until is not None:
            return
        wqes, pmtu, tx_run = self.wqes, self.pmtu, self._tx_run
        room = min(self.window, self.cwnd) - pdiff(self.tx, self.una)
        # the round's last packet asks for the ACK (module doc); a READ or fence that makes
        # the round stop before it is answered by the READ responses before it
        self._final = (self.tx + min(room, pdiff(self.next, self.tx)) - 1) & U24
        sent, start, hi = 0, self.tx, self.hi
        # a restart window asks for ACKs 4 times per window: each lost packet or ACK would
        # otherwise stall a window that only the round's last packet's ACK reopens
        every = ACK_EVERY if self.cwnd >= self.window else max(1, min(ACK_EVERY, self.cwnd // 4))
        self._every = every
        while room > 0 and self.tx != self.next:
            w = wqes[self._tx_idx]
            if w.gate and self._reads_before(self._tx_idx, w.kind == K_READ):
                break
            k = pdiff(self.tx, w.first)
            if w.kind == K_READ:
                self._send_read(w, k)
                self.tx = (w.last + 1) & U24
                if pdiff(self.tx, self.hi) > 0:
                    self.hi = self.tx
                self._tx_idx += 1
                sent += 1
                room = min(self.window, self.cwnd) - pdiff(self.tx, self.una)
                continue
            # this WQE's packets k..end-1: Middles as one run (the data path), the rest generic
            end = min(w.npkts, k + room)
            last, psn, j = w.npkts - 1, self.tx, k
            while j < end:
                m = min(end, last) - j if 0 < j < last else 0
                if m and (psn + m - 1) & U24 == self._final:
                    m -= 1  # (the round's last packet, which asks for the ACK, goes alone)
                if m:
                    if tx_run is not None:
                        tx_run(MiddleRun(w.ops[OP_MIDDLE], psn, w.data, j * pmtu, pmtu, m, j,
                                         every))  # fmt: skip
                    else:
                        self._send_middles(w, j, m, psn, pmtu)
                    psn = (psn + m) & U24
                    j += m
                else:
                    self.tx = psn
                    self._send_packet(w, j, pmtu)
                    psn = (psn + 1) & U24
                    j += 1
            self.tx = psn
            if pdiff(psn, self.hi) > 0:
                self.hi = psn
            sent += end - k
            room -= end - k
            if end == w.npkts:
                self._tx_idx += 1
        if sent:
            self.stats["packets"] += sent
            if pdiff(hi, start) > 0:  # sent before (a go-back): PSNs below the high mark
                self.stats["retransmits"] += min(sent, pdiff(hi, start))
            if self.rto is None:
                self.rto = self._rto(now)

    def _reads_before(self, idx: int, is_read: bool) -> bool:
        """Whether WQE ``idx`` must wait: too many READs out (or any, for a fence)."""
        limit = self.max_rd_atomic if is_read else 1
        n = 0
        for i in range(idx):
            if self.wqes[i].kind == K_READ:
                n += 1
                if n >= limit:
                    return True
        return False

    def _send_middles(self, w: Wqe, j: int, m: int, psn: int, pmtu: int) -> None:
        """Middle packets ``j .. j+m-1`` of ``w`` one by one (a host without ``tx_run``)."""
        op, data, tx, every = w.ops[OP_MIDDLE], w.data, self._tx, self._every
        for i in range(j, j + m):
            off = i * pmtu
            ack = ACK_REQ if i % every == every - 1 else 0
            tx(op, 0, ack | psn, b"", data[off : off + pmtu])
            psn = (psn + 1) & U24

    def _send_packet(self, w: Wqe, k: int, pmtu: int) -> None:
        """Packet ``k`` of a SEND/WRITE, PSN ``self.tx`` (counted by :meth:`pump`)."""
        ops = w.ops
        off = k * pmtu
        last = k == w.npkts - 1
        op = (ops[OP_ONLY] if w.npkts == 1 else ops[OP_FIRST] if k == 0
              else ops[OP_LAST] if last else ops[OP_MIDDLE])  # fmt: skip
        ext = b""
        if k == 0 and w.kind == K_WRITE:
            ext = RETH.pack(w.wr.remote_addr, w.wr.rkey, w.length)
        if last and w.imm:
            ext += U32.pack(w.wr.imm_data & 0xFFFFFFFF)
        b1 = 0x80 if last and w.solicited else 0
        every = self._every
        ack = ACK_REQ if self.tx == self._final or k % every == every - 1 else 0
        # (a one-packet message's payload is its data, whole: a slice of a memoryview costs
        # about a thousand instructions, and a small message's WRITE and CDC are one each)
        payload = (w.data if w.npkts == 1 else w.data[off : off + pmtu]) if w.length else b""
        self._tx(op, b1 | ((-len(payload) & 3) << 4), ack | self.tx, ext, payload)

    def _send_read(self, w: Wqe, k: int) -> None:
        """A READ request for the part from packet ``k`` on (k > 0: a partial re-read)."""
        off = k * self.pmtu
        ext = RETH.pack(w.wr.remote_addr + off, w.wr.rkey, w.length - off)
        self._tx(Opcode.RDMA_READ_REQUEST, 0, ACK_REQ | self.tx, ext, b"")
