"""The RC queue pair of the RoCEv2 RNIC: the sans-IO halves bound to UDP sockets.

Design:

* The protocol lives in :class:`~smcr.rdma.roce.requester.Requester` and
  :class:`~smcr.rdma.roce.responder.Responder`; this class owns their inputs
  (``post_send`` in the caller's thread, packets and timers in the device's
  progress thread, all under the QP's one lock) and their outputs (packets,
  completions, the move to ERR).
* **Sockets, set up at RTR** (spec rocev2 §1.3, §4.4).  The UDP source port is
  rxe's ``rdma_get_udp_sport(flow_label, our QPN, peer QPN)``, the same in both
  directions.  We *receive* the flow on a socket bound to ``(our IP, 4791)``
  with ``SO_REUSEPORT`` and connected to ``(peer IP, that port)``: Linux
  prefers a connected socket for its exact 4-tuple over the unconnected
  members of the reuseport group, so each process gets its own QPs' packets
  even when several share port 4791 (verified by ``tests/roce``).  We *send*
  from an unconnected socket bound to ``(our IP, that port)`` with
  ``IP_PMTUDISC_DO``: the kernel then puts IPv4 ID 0 and DF in every packet,
  the only IPv4 header whose ICRC can be computed before sending (IPv6 has no
  ID; there we also set ``UDP_NO_CHECK6_RX`` and flow label 0, as rxe needs).
* **Batching**: packets are queued while an input runs and sent at its end
  (:meth:`RoceQp.flush_tx`), runs of equal size as one UDP GSO ``sendmsg``;
  the requester queues a message's Middles as one
  :class:`~smcr.rdma.roce.fastpath.MiddleRun` (no object per packet); the
  receive socket asks for UDP GRO, so one read may bring many packets.
* **Threads**: a post transmits at once in the caller's thread as far as the
  window allows; ACKs that open the window are handled, and further packets
  sent, by whoever receives: a thread polling one of the QP's CQs
  (:mod:`smcr.rdma.roce.cq`), else the progress thread.  Timers are one
  engine timer per QP, armed for the requester's earliest deadline and
  re-armed lazily when it moves later.
"""

from __future__ import annotations

import errno
import socket
import struct
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Final, Protocol

from smcr.bound import monotonic
from smcr.rdma.base import MemoryRegion, ProtectionDomain, QueuePair
from smcr.rdma.completion import CompletionQueue
from smcr.rdma.eventloop import QpDevice
from smcr.rdma.roce import fastpath
from smcr.rdma.roce.cq import RoceCq
from smcr.rdma.roce.fastpath import (
    HEADER_LENGTH,
    U24,
    IcrcV4,
    IcrcV6,
    MiddleRun,
    flow_icrc,
    parse_bth,
)
from smcr.rdma.roce.netif import SOL_UDP, UDP_SEGMENT
from smcr.rdma.roce.requester import SPREAD_CWND, WINDOW, Requester
from smcr.rdma.roce.responder import Responder
from smcr.rdma.verbs import (
    IPV4_MAPPED_PREFIX,
    AccessFlag,
    AsyncEvent,
    AsyncEventType,
    QpAttr,
    QpAttrMask,
    QpCap,
    QpState,
    RecvWr,
    SendWr,
    VerbsError,
    WcOpcode,
    WcStatus,
    WorkCompletion,
    WrOpcode,
    local_ack_timeout,
)
from smcr.wire.roce import ROCEV2_UDP_PORT
from smcr.wire.roce_packet import rdma_get_udp_sport

if TYPE_CHECKING:
    from smcr.rdma.eventloop import Timer


class RoceQpDevice(QpDevice, Protocol):
    """What a QP asks of its device (:class:`~smcr.rdma.roce.device.RoceDevice`): the device
    module makes QPs and receives for them, and an import back from here would close a
    circle.  Nothing here is asked per packet."""

    @property
    def gso(self) -> bool:
        """Whether the device sends and receives runs with UDP GSO/GRO."""

    @property
    def stats(self) -> dict[str, int]:
        """The device's counters (errors and drops)."""

    @property
    def family(self) -> int:
        """The address family of the device's address."""

    @property
    def ip(self) -> bytes:
        """The device's address, packed."""

    def open_socket(self, port: int, *, ttl: int = 64, tos: int = 0,
                    gro: bool = False) -> socket.socket:
        """A UDP socket of a QP's flow, bound to the device's address and ``port``."""

    def sockaddr(self, address: str, port: int) -> tuple[str, int] | tuple[str, int, int, int]:
        """A socket address of ``address`` in the device's family."""

    def packed_sockaddr(self, address: bytes, port: int) -> bytes:
        """A packed ``sockaddr`` of ``address``, as ``sendmsg(2)`` takes it."""

    def watch_qp_socket(self, qp: RoceQp, sock: socket.socket) -> None:
        """Receive the QP's flow socket's packets from now on."""

    def lookup_rkey(self, rkey: int) -> MemoryRegion | None:
        """The MR an rkey of this device names."""

    def receive_qp(self, qp: RoceQp) -> int:
        """Read and handle what waits on the QP's flow socket; the packets read."""

    def unwatch(self, sock: socket.socket, qp: RoceQp | None = None) -> None:
        """Stop watching a flow socket."""



_SUPPORTED: Final = frozenset({WrOpcode.SEND, WrOpcode.SEND_WITH_IMM, WrOpcode.RDMA_WRITE,
                        WrOpcode.RDMA_WRITE_WITH_IMM, WrOpcode.RDMA_READ})  # fmt: skip
_LOCAL_WRITE: Final = int(AccessFlag.LOCAL_WRITE)
_RESPONSE_MIN: Final = 0x0D  # READ responses and Acknowledge
_RESPONSE_MAX: Final = 0x11
_GSO_SIZE: Final = struct.Struct("H")
#: ``sendmsg`` errors that mean "no UDP GSO on this path": fall back to one packet per call.
_NO_GSO: Final = (errno.EINVAL, errno.EIO, errno.EOPNOTSUPP)
#: Segments and bytes per GSO send (the kernel's UDP_MAX_SEGMENTS is 64 or more; an
#: IPv4 datagram holds at most 65535 bytes, headers included).
GSO_MAX_SEGMENTS: Final = 64
GSO_MAX_BYTES: Final = 65535 - 28
#: The largest UDP datagram a read returns (a GRO batch is at most 64 KiB).
MAX_DATAGRAM: Final = 65536
Buffer = bytes | bytearray | memoryview


class RoceQp(QueuePair):
    """An RC QP of a :class:`~smcr.rdma.roce.device.RoceDevice` (``pd.create_qp``)."""

    def __init__(self, device: RoceQpDevice, pd: ProtectionDomain, qp_num: int, *,
                 send_cq: CompletionQueue, recv_cq: CompletionQueue, cap: QpCap,
                 sq_sig_all: bool) -> None:  # fmt: skip
        super().__init__(pd, qp_num, send_cq=send_cq, recv_cq=recv_cq, cap=cap,
                         max_mtu=device.max_mtu)  # fmt: skip
        self.device = device
        self.sq_sig_all = sq_sig_all
        self.sport = 0
        self.peer: tuple[str, int] | tuple[str, int, int, int] = ("", ROCEV2_UDP_PORT)
        self.rx_sock: socket.socket | None = None
        self.tx_sock: socket.socket | None = None
        self._icrc_tx: IcrcV4 | IcrcV6 | None = None
        self.icrc_rx: IcrcV4 | IcrcV6 | None = None
        self._gso_bytes = GSO_MAX_BYTES
        self.peer_raw = b""  # the peer's address (4 or 16 bytes), set at RTR
        self._name = b""  # the peer's socket address as sendmsg(2) takes it, set at RTR
        self._dest_qp = 0
        self._timer: Timer | None = None
        self._timer_at = 0.0
        self.req = Requester(qp_num, self._tx, send_cq.push, self._req_fatal,
                             sq_sig_all=sq_sig_all, tx_run=self._txq_run)  # fmt: skip
        self.resp = Responder(qp_num, pd, device.lookup_rkey, self._tx, recv_cq.push,
                              self._resp_fatal)  # fmt: skip
        self.resp.coalesce = True
        self.gso = device.gso
        self._txq: list[tuple[int, int, int, bytes, Buffer] | MiddleRun] = []
        #: One reader of the flow socket at a time (progress thread or a CQ poller),
        #: so packets are handled in arrival order; it also guards :attr:`rx_view`.
        self.rx_lock = threading.Lock()
        self.rx_view = memoryview(bytearray(MAX_DATAGRAM))
        #: Flow sockets let go while a reader held :attr:`rx_lock` (:meth:`_close_sockets`):
        #: that reader closes them when it is done (state lock held to look).
        self.rx_left_open: list[socket.socket] = []
        #: Well-formed packets of the peer's taken by :meth:`input` (all but in-order WRITE
        #: Middles, which move the responder's PSN): duplicates and stale ACKs say the peer
        #: lives (:meth:`delivery_mark`).
        self.heard = 0
        #: The CQs whose pollers receive for this QP (:mod:`smcr.rdma.roce.cq`).
        self.roce_cqs: tuple[RoceCq, ...] = tuple(
            {id(cq): cq for cq in (send_cq, recv_cq) if isinstance(cq, RoceCq)}.values())

    # ------------------------------------------------------------ transport

    def _tx(self, opcode: int, b1: int, psn_word: int, ext: bytes, payload: Buffer) -> None:
        """Queue one packet; :meth:`flush_tx` sends the queue at the end of each input."""
        self._txq.append((opcode, b1, psn_word, ext, payload))

    def _txq_run(self, run: MiddleRun) -> None:
        """Queue a run of Middle packets (the requester's data path) as one entry."""
        self._txq.append(run)

    def flush_tx(self) -> None:
        """Send the queued packets: runs of equal size as one UDP GSO ``sendmsg`` each.

        Why GSO: one system call and one trip through the stack for up to
        :data:`GSO_MAX_SEGMENTS` packets, instead of one each.  The kernel cuts
        the buffer into ``gso_size`` segments (all equal but the last, which may
        be shorter) and numbers their IPv4 IDs 0, 1, 2... (the base is 0 on an
        unconnected DF socket), so segment ``k``'s ICRC is computed with ID
        ``k``; ``tests/roce`` captures the segmented frames and checks them.
        A kernel or route that refuses GSO turns it off for this QP.  A requester
        recovering from a stall (its restart window at most
        :data:`~smcr.rdma.roce.requester.SPREAD_CWND` PSNs, and below its PSN window)
        sends packet by packet: one GSO send is one buffer the whole way between
        namespaces, which a single drop loses whole.
        """
        q = self._txq
        if not q:
            return
        self._txq = []
        icrc, sock = self._icrc_tx, self.tx_sock
        if icrc is None or sock is None:
            return
        dqp, peer, n, i = self._dest_qp, self.peer, len(q), 0
        frames = icrc.frames
        direct = fastpath.LOOPS is not None  # the C loop builds and sends in one
        cwnd = self.req.cwnd
        gso = self.gso and (cwnd > SPREAD_CWND or cwnd >= self.req.window)
        while i < n:
            item = q[i]
            if isinstance(item, MiddleRun):
                i += 1 + self._send_run(item, q, i + 1, gso)
                continue
            size = _wire_size(item)
            j = i + 1
            if gso:
                j += _joining(q, j, size, GSO_MAX_SEGMENTS - 1, self._gso_bytes - size)
            try:
                if direct:
                    icrc.send_packets(sock.fileno(), self._name, size if j - i > 1 else 0,
                                      q, i, j, dqp)  # type: ignore[arg-type]  # fmt: skip
                elif j - i == 1:
                    sock.sendmsg(frames(q, i, j, dqp), (), 0, peer)  # type: ignore[arg-type]
                else:
                    sock.sendmsg(frames(q, i, j, dqp),  # type: ignore[arg-type]
                                 [(SOL_UDP, UDP_SEGMENT, _GSO_SIZE.pack(size))], 0, peer)
            except OSError as err:
                if j - i > 1 and err.errno in _NO_GSO:
                    self.gso = False  # no UDP GSO here: resend this run one by one
                    self._txq = q[i:]
                    self.flush_tx()
                    return
                # link down, no route, buffer full: lost; the timers recover
                self.device.stats["tx_errors"] += 1
            i = j

    def _send_run(self, run: MiddleRun, q: list[tuple[int, int, int, bytes, Buffer] | MiddleRun],
                  after: int, gso_ok: bool) -> int:  # fmt: skip
        """Send a run of Middles in GSO runs; the packets queued after it (``q[after:]``)
        join the last GSO run while they are as long as a Middle (the message's Last),
        then one shorter one (the CDC SEND behind the WRITE): GSO cuts equal segments
        but the last.  Why: a 64 KiB WRITE and its CDC then cost two ``sendmsg`` (the
        First has a RETH, so it goes alone), not three, and the peer reads its CDC in
        the same GRO batch as the data.

        :returns: how many of the packets after the run went out with it.
        """
        icrc, sock, peer, dqp = self._icrc_tx, self.tx_sock, self.peer, self._dest_qp
        assert icrc is not None and sock is not None
        seg = run.pmtu + 16
        per = min(GSO_MAX_SEGMENTS, self._gso_bytes // seg) if gso_ok else 1
        start, count = 0, run.count
        direct = fastpath.LOOPS is not None  # the C loop sends from the run's own buffer
        while start < count:
            m = min(per, count - start)
            took = 0
            extra: list[Buffer] = []
            if start + m == count:
                took = _joining(q, after, seg, per - m, (per - m) * seg)
                if took:
                    extra = icrc.frames(q, after, after + took, dqp, m)  # type: ignore[arg-type]
            try:
                if direct:
                    icrc.send_run(sock.fileno(), self._name, seg if m + took > 1 else 0, run,
                                  start, m, dqp, extra)  # fmt: skip
                elif m + took == 1:
                    sock.sendmsg([*icrc.run_frames(run, start, m, dqp), *extra], (), 0, peer)
                else:
                    gso = [(SOL_UDP, UDP_SEGMENT, _GSO_SIZE.pack(seg))]
                    sock.sendmsg([*icrc.run_frames(run, start, m, dqp), *extra], gso, 0, peer)
            except OSError as e:
                if m + took > 1 and e.errno in _NO_GSO:
                    self.gso = False  # no UDP GSO here: the rest one by one
                    return self._send_run(run.split(start) if start else run, q, after, False)
                self.device.stats["tx_errors"] += 1
            if took:
                return took
            start += m
        return 0

    def input(self, pkt: memoryview, now: float) -> None:
        """One packet for this QP, BTH through ICRC, ICRC already checked (lock held)."""
        opcode, b1, p_key, _dqp, psn_word = parse_bth(pkt)
        self.input_bth(pkt, now, opcode, b1, p_key, psn_word)

    def input_bth(self, pkt: memoryview, now: float, opcode: int, b1: int, p_key: int,
                  psn_word: int) -> None:  # fmt: skip
        """:meth:`input` of a packet whose BTH the caller has unpacked (the receive loop
        has, for the ICRC: unpacking it again cost about a tenth of a small packet's
        handling)."""
        body = pkt[: len(pkt) - 4]
        if opcode == 0x07 and p_key == 0xFFFF and self.resp.write_middle(psn_word, body):
            return  # an in-order WRITE Middle of a WRITE this QP accepted in RTR/RTS
        hlen = HEADER_LENGTH[opcode]
        if (not hlen or len(body) - ((b1 >> 4) & 3) < hlen or b1 & 0x0F
                or p_key & 0x7FFF != 0x7FFF):  # fmt: skip
            # unknown opcode, runt, TVer != 0, foreign P_Key: rxe hdr_check drops them
            self.device.stats["malformed"] += 1
            return
        self.heard += 1
        state = self.attr.qp_state
        if _RESPONSE_MIN <= opcode <= _RESPONSE_MAX:
            if state is QpState.RTS:
                syndrome = -1 if opcode == 0x0E else body[12]
                payload = body[hlen : len(body) - ((b1 >> 4) & 3)]
                self.req.receive(opcode, psn_word & U24, syndrome, payload, now)
        elif state is QpState.RTR or state is QpState.RTS:
            self.resp.receive(opcode, b1, psn_word, body)

    def after_input(self, now: float) -> None:
        """End of a batch: send the coalesced ACK and re-arm the timer (lock held)."""
        self.resp.flush()
        self.flush_tx()
        self._arm()

    def _arm(self) -> None:
        deadline = self.req.deadline()
        if deadline is None:
            return
        if self._timer is None or deadline < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = deadline
            self._timer = self.device.engine.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        with self._state_lock:
            self._timer = None
            if self.attr.qp_state is not QpState.RTS:
                return
            now = monotonic()
            self.req.handle_timer(now)
            self.resp.flush()
            self.flush_tx()
            self._arm()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # ---------------------------------------------------------------- state

    def _apply_modify(self, new: QpState, attr: QpAttr, mask: QpAttrMask) -> None:
        """Commit a validated modify: sockets at RTR, the requester at RTS."""
        if new is QpState.RTR and self.attr.qp_state is not QpState.RTR:
            self._connect(attr, mask)
        self._copy_attrs(attr, mask)
        a = self.attr
        if new is QpState.RTR:
            self.resp.start(a.rq_psn, a.path_mtu.nbytes, int(a.qp_access_flags),
                            a.max_dest_rd_atomic, a.min_rnr_timer, a.dest_qp_num)  # fmt: skip
        elif new is QpState.RTS and self.attr.qp_state is QpState.RTR:
            self.req.start(a.sq_psn, a.path_mtu.nbytes, local_ack_timeout(a.timeout),
                           a.retry_cnt, a.rnr_retry, a.max_rd_atomic)  # fmt: skip
            self.req.window = self._window(a.path_mtu.nbytes)
        if mask & QpAttrMask.ACCESS_FLAGS:
            self.resp.access = int(a.qp_access_flags)
        if mask & QpAttrMask.MIN_RNR_TIMER:
            self.resp.min_rnr_timer = a.min_rnr_timer
        a.qp_state = new

    def _connect(self, attr: QpAttr, mask: QpAttrMask) -> None:
        """Open this QP's flow sockets (see the module docstring)."""
        dev = self.device
        dgid = attr.ah_attr.dgid
        v4 = dgid[:12] == IPV4_MAPPED_PREFIX
        if v4 != (dev.family == socket.AF_INET):
            raise VerbsError(errno.EINVAL, "the peer GID is not of this device's IP family")
        peer_raw = dgid[12:] if v4 else dgid
        peer_ip = socket.inet_ntop(dev.family, peer_raw)
        dest = attr.dest_qp_num
        sport = rdma_get_udp_sport(attr.ah_attr.flow_label, self.qp_num, dest)
        rx = dev.open_socket(ROCEV2_UDP_PORT, gro=self.gso)
        tx = None
        try:
            rx.connect(dev.sockaddr(peer_ip, sport))
            # TTL = our hop_limit (1 by default, as Linux SMC-R; 64 in an SMC-Rv2 group whose
            # peer is behind a router, smc_ib_modify_qp_rtr).  Nothing on receive looks
            # at the peer's TTL, and must not: live rxe 6.12 (tests/interop; not in spec
            # rocev2.md) sends TTL 64 from a *user* QP whatever hop_limit it was given, since
            # the kernel resolves the MAC at INIT->RTR (ib_resolve_eth_dmac) and overwrites
            # grh.hop_limit with the route's hop limit; only kernel QPs send theirs (TTL 1).
            # The same run showed rxe's flow using our sport formula in both directions.
            tx = dev.open_socket(sport, ttl=attr.ah_attr.hop_limit,
                                 tos=attr.ah_attr.traffic_class)  # fmt: skip
        except OSError as e:
            rx.close()
            if tx is not None:
                tx.close()
            raise VerbsError(e.errno or errno.EIO, f"cannot open the flow sockets: {e}") from e
        self._close_sockets()
        self.rx_sock, self.tx_sock, self.sport = rx, tx, sport
        self.peer = dev.sockaddr(peer_ip, ROCEV2_UDP_PORT)
        self._name = dev.packed_sockaddr(peer_raw, ROCEV2_UDP_PORT)
        self._dest_qp = dest
        self.peer_raw = peer_raw
        self._icrc_tx = flow_icrc(dev.ip, peer_raw, sport)
        self.icrc_rx = flow_icrc(peer_raw, dev.ip, sport)
        self._gso_bytes = 65535 - (28 if v4 else 8)
        dev.watch_qp_socket(self, rx)

    def receive(self) -> None:
        """Read and handle what waits on the flow socket (:meth:`RoceDevice.receive_qp`): a
        CQ's poller calls it (:class:`~smcr.rdma.roce.cq.ReceivingQp`)."""
        self.device.receive_qp(self)

    def _window(self, pmtu: int) -> int:
        """The PSN window: :data:`~smcr.rdma.roce.requester.WINDOW`, or fewer if a socket
        buffer holds fewer packets.

        Why: the peer's receive buffer is what a burst fills, and without
        privileges it is capped by ``net.core.rmem_max`` (often 208 KiB, about
        50 packets of 4 KiB); a window beyond it is loss by construction.  Our
        own grant stands in for the peer's (the kernel reports twice the bytes
        it accounts, each packet costing about twice its size in ``truesize``).
        """
        if self.rx_sock is None:
            return WINDOW
        granted = self.rx_sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        return max(16, min(WINDOW, granted // (2 * (pmtu + 256))))

    def polled_since(self, when: float) -> bool:
        """Whether a thread waiting on one of this QP's CQs looked at it at or after ``when``
        (monotonic; :meth:`RoceCq.waiting <smcr.rdma.roce.cq.RoceCq.waiting>`)."""
        return any(cq.last_poll >= when and cq.receives(self) for cq in self.roce_cqs)

    def _close_sockets(self) -> None:
        """Let the flow sockets go (state lock held).  A reader of the receive socket may be
        between two reads (:meth:`RoceDevice.receive_qp`, which reads by descriptor number):
        closed under it, the number could be another socket's by its next read, whose
        datagrams (or a stream's bytes) it would take.  So where a reader holds
        :attr:`rx_lock` the socket stays open until that reader ends, which closes it."""
        rx = self.rx_sock
        if rx is not None:
            self.rx_sock = None
            self.device.unwatch(rx, self)
            if self.rx_lock.acquire(False):
                rx.close()
                self.rx_lock.release()
            else:
                self.rx_left_open.append(rx)
        if self.tx_sock is not None:
            self.tx_sock.close()
            self.tx_sock = None

    def _reset(self) -> None:
        """Back to RESET: drop all work without completions and close the flow."""
        self._cancel_timer()
        self.req.flush()
        self.resp.rq.clear()
        self._close_sockets()
        self.req = Requester(self.qp_num, self._tx, self.send_cq.push, self._req_fatal,
                             sq_sig_all=self.sq_sig_all, tx_run=self._txq_run)  # fmt: skip
        self.resp = Responder(self.qp_num, self.pd, self.device.lookup_rkey, self._tx,
                              self.recv_cq.push, self._resp_fatal)  # fmt: skip
        self.resp.coalesce = True
        self.attr = QpAttr(qp_state=QpState.RESET)

    def _req_fatal(self, wc: WorkCompletion) -> None:
        self._to_error(None, first=wc)

    def _resp_fatal(self, wc: WorkCompletion | None) -> None:
        self._to_error(None, first_recv=wc)

    def _to_error(self, event: str | None, first: WorkCompletion | None = None,
                  first_recv: WorkCompletion | None = None) -> None:  # fmt: skip
        """Move to ERR: the failing completion first, then flush both queues (spec §8.2)."""
        with self._state_lock:
            if self.attr.qp_state is QpState.ERR:
                return
            self.attr.qp_state = QpState.ERR
            self._cancel_timer()
            self.resp.flush()
            self.flush_tx()  # a NAK that caused this still goes out
            self.resp.dead = True
            flushed = [self._flush_wc(wr) for wr in self.req.flush()]
            if first is not None:
                flushed.insert(0, first)
            if flushed:
                self.send_cq.push_many(flushed)
            rflushed = [first_recv] if first_recv is not None else []
            rflushed += [
                WorkCompletion(wr_id=w.wr_id, status=WcStatus.WR_FLUSH_ERR, opcode=WcOpcode.RECV,
                               qp_num=self.qp_num)
                for w in self.resp.rq
            ]
            self.resp.rq.clear()
            if rflushed:
                self.recv_cq.push_many(rflushed)
        if event is not None:
            self.device.post_async_event(AsyncEvent(AsyncEventType.QP_FATAL, self.qp_num, event))

    def _local_fault(self, wr: SendWr, later: list[SendWr]) -> None:
        """A WR failed its local memory check: complete in posting order, then go to ERR.

        The WRs queued before it are flushed first, then it gets LOC_PROT_ERR,
        then the rest of its batch is flushed (spec §8.2: the first failing WQE
        carries the real status, completions stay in SQ order).
        """
        wcs = [self._flush_wc(w) for w in self.req.flush()]
        wcs.append(WorkCompletion(wr_id=wr.wr_id, status=WcStatus.LOC_PROT_ERR,
                                  opcode=self._flush_wc(wr).opcode, qp_num=self.qp_num))
        wcs += [self._flush_wc(w) for w in later]
        self.send_cq.push_many(wcs)
        self._to_error(None)

    def _flush_wc(self, wr: SendWr) -> WorkCompletion:
        op = (WcOpcode.SEND if wr.opcode in (WrOpcode.SEND, WrOpcode.SEND_WITH_IMM)
              else WcOpcode.RDMA_READ if wr.opcode is WrOpcode.RDMA_READ
              else WcOpcode.RDMA_WRITE)  # fmt: skip
        return WorkCompletion(wr_id=wr.wr_id, status=WcStatus.WR_FLUSH_ERR, opcode=op,
                              qp_num=self.qp_num)  # fmt: skip

    def destroy(self) -> None:
        """``ibv_destroy_qp``: stop, close the flow; no completions (the peer times out)."""
        with self._state_lock:
            self._cancel_timer()
            self.req.flush()
            self.resp.dead = True
            self._close_sockets()
            self.device.forget_qp(self.qp_num)

    # ----------------------------------------------------------------- posts

    def _post_recv(self, wrs: RecvWr | Iterable[RecvWr]) -> None:
        """``ibv_post_recv``.

        :raises VerbsError: EINVAL in RESET or for too many SGEs, ENOMEM when full.
        """
        batch = (wrs,) if isinstance(wrs, RecvWr) else tuple(wrs)
        for wr in batch:
            self._check_sges(wr.sg_list, self.cap.max_recv_sge)
        with self._state_lock:
            state = self.attr.qp_state
            if state is QpState.RESET:
                raise VerbsError(errno.EINVAL, "post_recv on a QP in RESET")
            if state is not QpState.ERR:
                if len(self.resp.rq) + len(batch) > self.cap.max_recv_wr:
                    raise VerbsError(errno.ENOMEM, "receive queue full")
                self.resp.rq.extend(batch)
                return
        self.recv_cq.push_many(
            WorkCompletion(wr_id=w.wr_id, status=WcStatus.WR_FLUSH_ERR, opcode=WcOpcode.RECV,
                           qp_num=self.qp_num)
            for w in batch
        )  # fmt: skip

    def next_psns(self) -> tuple[int, int] | None:
        """The requester's next PSN and the responder's expected one (``smcr trace``)."""
        return self.req.next, self.resp.epsn

    def acknowledged(self) -> bool:
        """Whether the requester has no packet in flight and no WQE queued."""
        req = self.req
        return req.una == req.next and not req.wqes

    def delivery_mark(self) -> int | None:
        """The requester's oldest unacknowledged PSN, the responder's expected one and the
        packets :meth:`input` took, in one number: it moves with every ACK that retires
        packets of ours, every packet of the peer's taken in order, and any other packet
        of the peer's.  Why the last: under heavy loss a receiver whose ACKs are lost
        hears only the sender's retransmissions (duplicates) for a while; the peer is
        alive, and an LLC wait of the receiver's must not give up on it then.  The price:
        a path that fails one way only (our packets lost, the peer's still arriving) keeps
        an LLC wait going until ``Config.llc_wait_heard`` (60 s) rather than ``llc_wait``,
        as the peer's retransmissions go on moving the mark."""
        return self.heard << 48 | self.req.una << 24 | self.resp.epsn

    def _post_send(self, wrs: SendWr | Iterable[SendWr]) -> None:
        """``ibv_post_send``: check local memory, queue, transmit what the window allows.

        A WR whose SGEs fail the lkey/bounds/access check completes with
        LOC_PROT_ERR and takes the QP to ERR, as on the shm RNIC.

        :raises VerbsError: EINVAL before RTS, for an unsupported opcode or too many
            SGEs; ENOMEM when the send queue is full.  In ERR the WRs are flushed.
        """
        batch = [wrs] if isinstance(wrs, SendWr) else list(wrs)
        for wr in batch:
            self._check_sges(wr.sg_list, self.cap.max_send_sge)
            if wr.opcode not in _SUPPORTED:
                raise VerbsError(errno.EINVAL, f"{wr.opcode.name} is not supported")
        with self._state_lock:
            state = self.attr.qp_state
            if state is QpState.ERR:
                self.send_cq.push_many(self._flush_wc(w) for w in batch)
                return
            if state is not QpState.RTS:
                raise VerbsError(errno.EINVAL, f"post_send in {state.name}")
            if len(self.req.wqes) + len(batch) > self.cap.max_send_wr:
                raise VerbsError(errno.ENOMEM, "send queue full")
            now = monotonic()
            mrs = self.pd.mrs
            end = len(batch) - 1
            for i, wr in enumerate(batch):
                need = _LOCAL_WRITE if wr.opcode is WrOpcode.RDMA_READ else 0
                views: list[memoryview] = []
                length = 0
                for sge in wr.sg_list:
                    mr = mrs.get(sge.lkey)
                    off = sge.addr - mr.addr if mr is not None else -1
                    if (mr is None or not mr.valid or need & ~mr.access_bits or off < 0
                            or off + sge.length > mr.length):  # fmt: skip
                        self._local_fault(wr, batch[i + 1 :])
                        return
                    views.append(mr.buf[off : off + sge.length])
                    length += sge.length
                self.req.post(wr, views, length, now, i == end)  # (one round: Requester.post)
            self.resp.flush()
            self.flush_tx()
            self._arm()


def _joining(q: list[tuple[int, int, int, bytes, Buffer] | MiddleRun], start: int, seg: int,
             count: int, room: int) -> int:  # fmt: skip
    """How many queued packets from ``q[start]`` on join a UDP GSO send of ``seg``-byte
    segments: at most ``count`` of them and ``room`` bytes, none a :class:`MiddleRun`;
    while they are ``seg`` bytes long, then one shorter (GSO cuts equal segments but
    the last)."""
    n, took = len(q), 0
    while start + took < n and took < count:
        item = q[start + took]
        if isinstance(item, MiddleRun):
            break
        size = _wire_size(item)
        if size > seg or size > room:
            break
        room -= size
        took += 1
        if size < seg:
            break  # a shorter segment must be the last
    return took


def _wire_size(packet: tuple[int, int, int, bytes, Buffer]) -> int:
    """The UDP payload size of a queued packet ``(opcode, b1, psn_word, ext, payload)``:
    BTH, extension headers, payload, pad (PadCnt of ``b1``) and ICRC."""
    _op, b1, _psn, ext, payload = packet
    return 16 + len(ext) + len(payload) + ((b1 >> 4) & 3)
