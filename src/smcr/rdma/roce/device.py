"""The RoCEv2 RNIC: a user-space counterpart of Linux rxe, one per interface address.

Design decisions (the why of each):

* **One device per (interface, address)**, GID ``::ffff:a.b.c.d`` or the IPv6
  address, MAC and active MTU from the interface (:mod:`smcr.rdma.roce.netif`).
  A loopback address other than 127.0.0.1 (e.g. 127.0.0.2) is accepted too, so
  two RNICs in one namespace can talk over ``lo`` with distinct flows.
* **Port 4791 shared, without privileges**: every socket bound to it sets
  ``SO_REUSEPORT``; each QP receives on its own connected socket (see
  :mod:`smcr.rdma.roce.qp`), and the device keeps one unconnected socket as
  the catch-all for packets of flows no connected socket claims (a peer that
  uses another source port, as rxe before 5.17 does).  Whatever socket a
  packet arrives on, it is dispatched by BTH DestQP among all QPs of this
  process (QPNs are unique per process).
* **One progress thread per device** (the shm RNIC's epoll
  :class:`~smcr.rdma.eventloop.Engine`): it sleeps in ``epoll_wait`` until a
  socket is readable or a timer is due, so an idle RNIC costs no CPU; a
  readable socket is drained up to :data:`BATCH` reads (each may hold many
  packets with UDP GRO); an ACK that a read's packets asked for goes out at the
  end of that read (coalesced within it), so the peer's window keeps moving.
* **The data path** (runs of in-order WRITE Middles, all but two packets of a
  long WRITE) is checked and placed by
  :meth:`~smcr.rdma.roce.fastpath.IcrcFlow.place_middles`, one tight loop per read.
* **Whoever polls a CQ receives** (:mod:`smcr.rdma.roce.cq`): a thread that
  polls or sleeps on a QP's CQ reads the QP's socket itself, and the progress
  thread steps back from that socket while it does, so a message costs one
  wakeup in the thread that wants it instead of a wakeup of the progress thread,
  a doorbell and a second wakeup.  A QP's receive lock keeps one reader at a
  time, so packets are still handled in arrival order.
* **ICRC**: generated on every packet; checked on every packet received
  (IPv4: first with the ID our own sender's UDP GSO gives it, its index in the
  read, 0 for a lone packet; then ID recovery, spec §4.4 option (c); IPv6: exactly).
  A bad packet is dropped silently and counted, as rxe does.  Against live rxe
  6.12 (tests/interop) *every* packet takes the recovery path: rxe's IPv4 IDs
  are never 0 but a per-destination counter that goes up by one per packet
  (e.g. 0x8969, 0x896a, ...), with DF set and UDP checksum 0; the recovery
  found them all (``id_recovered == rx``, ``icrc_errors == 0``).
* **Memory**: MRs are process memory; a responder finds them through the
  device's rkey table and checks PD, access and bounds before any byte moves.
"""

from __future__ import annotations

import contextlib
import errno
import secrets
import socket
import struct
import threading
from collections.abc import Callable
from typing import Final, cast

from smcr import plainsock
from smcr.bound import monotonic
from smcr.rdma.base import (
    PAGE,
    Device,
    KeyAllocator,
    MemoryRegion,
    ProtectionDomain,
    random_qpn,
    zeroed_memory,
)
from smcr.rdma.completion import CompletionQueue
from smcr.rdma.eventloop import Engine
from smcr.rdma.roce import fastpath, netif
from smcr.rdma.roce.cq import CEDE_SECONDS, RoceCq
from smcr.rdma.roce.fastpath import BTH, U24, IcrcV4, IcrcV6, flow_icrc
from smcr.rdma.roce.netif import SOL_UDP, UDP_GRO
from smcr.rdma.roce.qp import RoceQp
from smcr.rdma.verbs import REMOTE_ACCESS, AccessFlag, DeviceAttr, QpCap, VerbsError
from smcr.wire.roce import ROCEV2_UDP_PORT

#: Datagrams read from one socket before the batch's ACKs go out.
BATCH: Final = 64
#: Socket buffer sizes asked for (granted up to rmem_max/wmem_max, or forced as root).
RCVBUF: Final = 4 << 20
SNDBUF: Final = 4 << 20
IP_PMTUDISC_DO: Final = 2
# Linux values the typeshed stubs lack
IP_MTU_DISCOVER: Final = 10
SO_RCVBUFFORCE: Final = 33
SO_SNDBUFFORCE: Final = 32
IPV6_MTU_DISCOVER: Final = 23
UDP_NO_CHECK6_RX: Final = 102
IPV6_AUTOFLOWLABEL: Final = 70
IOVA_BASE: Final = 0x0000_7F00_0000_0000
MAX_DATAGRAM: Final = 65536
_GRO_SIZE: Final = struct.Struct("i")
_DQP: Final = struct.Struct(">I")
#: ``struct sockaddr_in`` and ``sockaddr_in6``: family (host order), port, (flow info,)
#: address, zero padding or scope id (host order)
_SOCKADDR_IN: Final = struct.Struct("=H2s4s8s")
_SOCKADDR_IN6: Final = struct.Struct("=H2sI16sI")
#: Every QP of this process, by QPN (unique process-wide): a packet is handed to
#: the QP its DestQP names whichever of our sockets the kernel chose, which
#: matters when two QPs' flows have the same 4-tuple (two RNICs on one address).
_PROCESS_QPS: dict[int, RoceQp] = {}
_PROCESS_LOCK = threading.Lock()


class RoceDevice(Device):
    """A RoCEv2 RNIC bound to one interface address (see the module docstring).

    :param address: the IPv4 address; default the first address of ``ifname``.
    :param ifname: the interface, if ``address`` is not given.
    :param name: device name; default ``roce_<ifname>``.
    :param verify_icrc: check the ICRC of received packets (default on).
    :param gso: send runs of equal-sized packets with UDP GSO and receive QP flows
        with UDP GRO (default on; a kernel without it falls back per QP).
    """

    def __init__(self, address: str | None = None, *, ifname: str | None = None,
                 name: str | None = None, verify_icrc: bool = True,
                 gso: bool = True) -> None:  # fmt: skip
        info = _resolve(address, ifname)
        attr = DeviceAttr(
            max_qp_wr=4096, max_sge=4, max_cqe=1 << 20, max_mr=1 << 16, max_mr_size=1 << 40,
            max_msg_sz=1 << 31, max_qp_rd_atom=16, active_mtu=info.active_mtu,
        )  # fmt: skip
        super().__init__(name or info.name, info.gid, info.mac, info.ifname, attr)
        self.address = info.address
        self.family = info.family
        self.scope_id = info.scope_id
        self.ip = socket.inet_pton(self.family, info.address)
        self.info = info
        self.verify_icrc = verify_icrc
        self.gso = gso
        self.keys = KeyAllocator()
        self.stats = {"rx": 0, "rx_catchall": 0, "icrc_errors": 0, "id_recovered": 0,
                      "unknown_qp": 0, "malformed": 0, "tx_errors": 0,
                      "rx_rnic_thread": 0}  # fmt: skip
        """Counts: ``rx_rnic_thread`` is the part of ``rx`` this device's own thread read
        from QP sockets (the rest, CQ pollers: application or runtime threads)."""
        self._rkeys: dict[int, MemoryRegion] = {}
        self._qps: dict[int, RoceQp] = {}  # this device's; dispatch uses the process's
        self._next_iova = IOVA_BASE + secrets.randbits(20) * PAGE
        self._buf = bytearray(MAX_DATAGRAM)
        self._view = memoryview(self._buf)
        self.engine = Engine("smcr-roce")  # (the kernel keeps 15 bytes of a name)
        self._closed = False
        self._ceded: dict[int, tuple[RoceQp, socket.socket]] = {}
        self._reclaim_armed = False
        self.listener = self.open_socket(ROCEV2_UDP_PORT)
        self.engine.watch(self.listener.fileno(), self._on_listener)

    # --------------------------------------------------------------- objects

    def alloc_pd(self) -> RocePd:
        """A new protection domain (bookkeeping in :meth:`Device.alloc_pd`)."""
        return cast(RocePd, super().alloc_pd())

    def _new_pd(self, pd_id: int) -> RocePd:
        return RocePd(self, pd_id)

    def _new_cq(self, depth: int) -> RoceCq:
        return RoceCq(depth)

    def new_qp(self, pd: RocePd, send_cq: CompletionQueue, recv_cq: CompletionQueue,
               cap: QpCap, sq_sig_all: bool) -> RoceQp:  # fmt: skip
        """A QP with a fresh random 24-bit QPN (0 and 1 are reserved in IB)."""
        with _PROCESS_LOCK:
            qpn = random_qpn(_PROCESS_QPS)
            qp = RoceQp(self, pd, qpn, send_cq=send_cq, recv_cq=recv_cq, cap=cap,
                        sq_sig_all=sq_sig_all)  # fmt: skip
            self._qps[qpn] = qp
            _PROCESS_QPS[qpn] = qp
        return qp

    def forget_qp(self, qpn: int) -> None:
        """Drop a destroyed QP from the dispatch table."""
        with _PROCESS_LOCK:
            self._qps.pop(qpn, None)
            _PROCESS_QPS.pop(qpn, None)

    def lookup_rkey(self, rkey: int) -> MemoryRegion | None:
        """The live MR of an rkey, or None (the responder checks PD, access, bounds)."""
        return self._rkeys.get(rkey)

    def publish(self, mr: MemoryRegion) -> None:
        """Make an MR reachable by its rkey."""
        self._rkeys[mr.rkey] = mr

    def revoke(self, mr: MemoryRegion) -> None:
        """End remote access to an MR (at once: the next packet's look-up fails)."""
        self._rkeys.pop(mr.rkey, None)

    # --------------------------------------------------------------- sockets

    def open_socket(self, port: int, *, ttl: int = 64, tos: int = 0,
                    gro: bool = False) -> socket.socket:  # fmt: skip
        """A UDP socket bound to ``(address, port)`` with SO_REUSEPORT, DF, big buffers.

        ``IP_PMTUDISC_DO`` sets DF and, on an unconnected socket, IPv4 ID 0 (spec §4.4).

        :param gro: ask for UDP GRO (several same-size packets per read), if the
            kernel has it.
        """
        s = socket.socket(self.family, socket.SOCK_DGRAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if self.family == socket.AF_INET:
                s.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
                s.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, max(1, ttl))
                if tos:
                    s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
            else:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                s.setsockopt(socket.IPPROTO_IPV6, IPV6_MTU_DISCOVER, IP_PMTUDISC_DO)
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_UNICAST_HOPS, max(1, ttl))
                if tos:
                    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, tos)
                # rxe sends UDP checksum 0, which Linux drops over IPv6 unless told (§10)
                s.setsockopt(SOL_UDP, UDP_NO_CHECK6_RX, 1)
                with contextlib.suppress(OSError):  # flow label 0, as rxe sends (§1.4)
                    s.setsockopt(socket.IPPROTO_IPV6, IPV6_AUTOFLOWLABEL, 0)
            for forced, plain, size in ((SO_RCVBUFFORCE, socket.SO_RCVBUF, RCVBUF),
                                        (SO_SNDBUFFORCE, socket.SO_SNDBUF, SNDBUF)):
                try:
                    s.setsockopt(socket.SOL_SOCKET, forced, size)
                except PermissionError:
                    s.setsockopt(socket.SOL_SOCKET, plain, size)
            if gro:
                with contextlib.suppress(OSError):
                    s.setsockopt(SOL_UDP, UDP_GRO, 1)
            s.bind(self.sockaddr(self.address, port))
            s.setblocking(False)
        except OSError:
            s.close()
            raise
        return s

    def sockaddr(self, address: str, port: int) -> tuple[str, int] | tuple[str, int, int, int]:
        """A socket address of this device's family (with our scope id over IPv6)."""
        if self.family == socket.AF_INET:
            return (address, port)
        return (address, port, 0, self.scope_id)

    def packed_sockaddr(self, address: bytes, port: int) -> bytes:
        """:meth:`sockaddr` as ``sendmsg(2)`` takes it (``struct sockaddr_in`` or
        ``sockaddr_in6``), for the C send loop (:meth:`IcrcFlow.send_run
        <smcr.rdma.roce.fastpath.IcrcFlow.send_run>`)."""
        if self.family == socket.AF_INET:
            return _SOCKADDR_IN.pack(socket.AF_INET, port.to_bytes(2, "big"), address, b"")
        return _SOCKADDR_IN6.pack(socket.AF_INET6, port.to_bytes(2, "big"), 0, address,
                                  self.scope_id)  # fmt: skip

    def watch_qp_socket(self, qp: RoceQp, sock: socket.socket) -> None:
        """Receive a QP's flow socket in the progress thread and in its CQs' pollers."""
        fd = sock.fileno()
        self.engine.watch(fd, self._handler(qp, sock))
        for cq in qp.roce_cqs:
            cq.attach(qp, fd)

    def unwatch(self, sock: socket.socket, qp: RoceQp | None = None) -> None:
        """Stop receiving from ``sock`` (before it is closed)."""
        fd = sock.fileno()
        with contextlib.suppress(OSError, ValueError):
            self.engine.unwatch(fd)
        self._ceded.pop(fd, None)
        if qp is not None:
            for cq in qp.roce_cqs:
                cq.detach(fd)

    def _handler(self, qp: RoceQp, sock: socket.socket) -> Callable[[int], None]:
        """The progress thread's handler of a QP socket."""

        def on_readable(_events: int) -> None:
            self._on_qp_socket(qp, sock)

        return on_readable

    def _on_qp_socket(self, qp: RoceQp, sock: socket.socket) -> None:
        """The progress thread's turn at a QP socket: receive, then maybe cede it.

        Why cede: a thread that polls one of the QP's CQs also sleeps on the
        socket and receives itself (:mod:`smcr.rdma.roce.cq`), without a thread
        hop; the progress thread waking as well would only contend for the
        lock and the GIL.  So while a waiter looked at a CQ of the QP within
        :data:`~smcr.rdma.roce.cq.CEDE_SECONDS` (:meth:`RoceCq.waiting
        <smcr.rdma.roce.cq.RoceCq.waiting>`), the progress thread stops
        watching the socket and looks again that much later (:meth:`_reclaim`).
        """
        self.stats["rx_rnic_thread"] += self.receive_qp(qp)
        if qp.rx_sock is not sock:
            return  # closed or replaced meanwhile
        now = monotonic()
        if not qp.polled_since(now - CEDE_SECONDS):
            return
        with qp._state_lock:  # closing the socket takes it too: no fd reuse in between
            if qp.rx_sock is not sock:
                return
            fd = sock.fileno()
            with contextlib.suppress(OSError, ValueError):
                self.engine.unwatch(fd)
            self._ceded[fd] = (qp, sock)
        if not self._reclaim_armed:
            self._reclaim_armed = True
            self.engine.call_at(now + CEDE_SECONDS, self._reclaim)

    def _reclaim(self) -> None:
        """Take back the ceded sockets whose CQs nobody polled lately (engine timer).

        A socket that holds packets when the timer fires is taken back too: a
        poller that still sleeps on the CQ would have woken and read them, so
        nobody does (the application polled, then went off to compute), and a
        packet must not wait for the application (the peer's retransmit timer
        runs).  So a packet waits at most about :data:`CEDE_SECONDS`.
        """
        self._reclaim_armed = False
        now = monotonic()
        for fd, (qp, sock) in list(self._ceded.items()):
            if qp.polled_since(now - CEDE_SECONDS) and not self._closed and not _readable(sock):
                continue  # still polled, and the pollers keep up
            with qp._state_lock:  # as above: the socket cannot close meanwhile
                if self._ceded.pop(fd, None) is not None and qp.rx_sock is sock:
                    with contextlib.suppress(OSError, ValueError):
                        self.engine.watch(fd, self._handler(qp, sock))
        if self._ceded:
            self._reclaim_armed = True
            self.engine.call_at(now + CEDE_SECONDS, self._reclaim)

    def receive_qp(self, qp: RoceQp) -> int:
        """Drain a QP's connected socket: its own flow, so its ICRC parameters are known.

        Called by the progress thread and by CQ pollers; the QP's receive lock
        keeps one reader at a time, so packets are handled in arrival order.
        With UDP GRO one read may return several packets of one size (the
        ``UDP_GRO`` control message gives it; only the last may be shorter).

        :returns: the packets read.
        """
        got = 0
        qp.rx_lock.acquire()
        try:
            sock = qp.rx_sock
            if sock is not None:
                got = self._drain(qp, sock)
        finally:
            # a socket let go meanwhile is ours to close (RoceQp._close_sockets); the lock
            # let go under the state lock, so that one let go later finds it free
            with qp._state_lock:
                left, qp.rx_left_open = qp.rx_left_open, []
                qp.rx_lock.release()
            for done in left:
                done.close()
        return got

    def _drain(self, qp: RoceQp, sock: socket.socket) -> int:
        """Read up to :data:`BATCH` datagrams of a QP's flow and run their packets.

        Runs of in-order WRITE Middles (the data path: all but two packets of a
        long WRITE) are checked and placed by the flow's
        :meth:`~smcr.rdma.roce.fastpath.IcrcFlow.place_middles` straight into the
        target MR, a few lines per packet; every other packet, and any the run
        stops at, takes the general path (ICRC in C when the build has it, with ID
        recovery, then :meth:`RoceQp.input`).  An ACK that a read's packets asked for goes out
        at the end of that read once it covers a good part of the peer's window
        (:meth:`~smcr.rdma.roce.responder.Responder.ack_due`), else at the end of the
        batch: a bulk stream's window must not wait for a whole batch (measured: the
        requester idled half the time), while the small messages of many connections
        share a link group's ACK.

        :returns: the packets read.
        """
        view, stats = qp.rx_view, self.stats
        touched: dict[int, RoceQp] = {}
        icrc = qp.icrc_rx if self.verify_icrc else None
        verify = icrc.verify if icrc is not None else None
        place = icrc.place_middles if icrc is not None else None  # the data path checks
        own, lock, unpack = qp.qp_num, qp._state_lock, BTH.unpack_from
        now = monotonic()
        bufs = [view]
        rx = recovered = bad = 0
        foreign: list[bytes] = []
        recv = sock.recvmsg_into
        loops, fd = fastpath.LOOPS, sock.fileno()
        # the ICRC check in C (the difference from the ICRC computed with the ID our GSO
        # runs carry), the answer for a non-zero difference (ID recovery) in Python
        c_verify = loops.verify if loops is not None and icrc is not None else None
        head = icrc.head if icrc is not None else b""
        judge = icrc.judge if icrc is not None else None
        for _ in range(BATCH):
            try:
                if loops is not None:  # (the same read, without its address and exception)
                    got: tuple[int, int] = loops.recvgro(fd, view)
                    n, seg = got
                    if n < 0:
                        break
                else:
                    n, anc, _flags, _addr = recv(bufs, 64)
                    seg = n
                    if anc:  # UDP_GRO's (level, type, segment size)
                        _level, _type, gro = anc[0]
                        seg = _GRO_SIZE.unpack(gro)[0] or n
            except (BlockingIOError, InterruptedError):
                break
            except OSError:  # an ICMP error reported on the connected socket
                continue
            if qp.rx_sock is not sock:  # let go meanwhile (RoceQp._close_sockets): no more
                break
            with lock:  # once per read, not per packet: the poster waits at most one read
                resp = qp.resp
                write_middle = resp.write_middle
                middle_seg = resp.pmtu + 16
                off = k = 0
                while off < n:
                    if seg == middle_seg and place is not None and view[off] == 0x07:
                        target = resp.middle_target()
                        buf, toff, most = target if target is not None else (view, 0, 0)
                        if most > 0:
                            count, ack = place(view, off, n, seg, k, own, resp.epsn, most, buf,
                                               toff)  # fmt: skip
                            if count:
                                resp.middles_placed(count, ack)
                                rx += count
                                off += count * seg
                                k += count
                                continue
                    end = off + seg if off + seg < n else n
                    size = end - off
                    pkt = view[off:end]
                    off = end
                    k += 1
                    rx += 1
                    if size < 16 or size & 3:
                        stats["malformed"] += 1
                        continue
                    op, b1, p_key, dqp_word, psn_word = unpack(pkt)
                    if c_verify is not None and judge is not None:
                        # (the ID our own sender's GSO gives the read's k-th packet)
                        difference: int = c_verify(view, end - size, size, head, k - 1)
                        if difference and k > 1:  # (judge starts from ID 0's difference)
                            difference = c_verify(view, end - size, size, head, 0)
                        if difference:
                            if not judge(size, difference):
                                bad += 1
                                continue
                            recovered += 1
                    elif verify is not None:
                        ok = verify(pkt, size, op, b1, dqp_word, psn_word)
                        if ok != 1:
                            if not ok:
                                bad += 1
                                continue
                            recovered += 1
                    if dqp_word & U24 != own:  # another QP shares this flow (two RNICs
                        foreign.append(bytes(pkt))  # on one address)
                    elif not (op == 0x07 and p_key == 0xFFFF
                              and write_middle(psn_word, view[end - size : end - 4])):  # fmt: skip
                        # all but an in-order WRITE Middle (the data path)
                        qp.input_bth(pkt, now, op, b1, p_key, psn_word)
                if resp.ack_due():  # a window's worth asked for: answer now
                    resp.flush()
                    qp.flush_tx()
            for raw in foreign:  # outside our lock: two progress threads, no lock order
                self._dispatch(memoryview(raw), now, touched, qp.peer_raw)
            foreign.clear()
        touched[own] = qp
        stats["rx"] += rx
        stats["id_recovered"] += recovered
        stats["icrc_errors"] += bad
        for q in touched.values():
            with q._state_lock:
                q.after_input(now)
        return rx

    def _on_listener(self, _events: int) -> None:
        """Drain the catch-all socket: packets of flows no QP socket claimed."""
        buf, view, stats = self._buf, self._view, self.stats
        touched: dict[int, RoceQp] = {}
        now = monotonic()
        for _ in range(BATCH):
            try:
                n, source = self.listener.recvfrom_into(buf)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                continue
            stats["rx"] += 1
            stats["rx_catchall"] += 1
            pkt = view[:n]
            if n < 16 or n & 3:
                stats["malformed"] += 1
                continue
            host, port, *_ = source  # (IPv6 adds flow info and scope id)
            src = socket.inet_pton(self.family, host.split("%", 1)[0])
            if self.verify_icrc and not self._icrc_ok(flow_icrc(src, self.ip, port), pkt):
                continue
            self._dispatch(pkt, now, touched, src)
        for q in touched.values():
            with q._state_lock:
                q.after_input(now)

    def _icrc_ok(self, icrc: IcrcV4 | IcrcV6, pkt: memoryview) -> bool:
        ok = icrc.check(pkt)
        if ok == 1:
            return True
        self.stats["id_recovered" if ok else "icrc_errors"] += 1
        return bool(ok)

    def _dispatch(self, pkt: memoryview, now: float, touched: dict[int, RoceQp],
                  src: bytes) -> None:  # fmt: skip
        """Hand a checked packet to the QP its BTH names (rxe ``hdr_check``/``check_addr``).

        The IP destination must be the QP's address and the source its peer's.
        """
        qp = _PROCESS_QPS.get(_DQP.unpack_from(pkt, 4)[0] & U24)
        if qp is None or qp.device.ip != self.ip or qp.peer_raw != src:
            self.stats["unknown_qp"] += 1
            return
        with qp._state_lock:
            qp.input(pkt, now)
        touched[qp.qp_num] = qp

    # ----------------------------------------------------------------- close

    def close(self) -> None:
        """Destroy every QP, MR and CQ of the device and stop its thread."""
        if self._closed:
            return
        self._closed = True
        for qp in list(self._qps.values()):
            qp.destroy()
        self._deregister_all()
        self.engine.stop()
        self.listener.close()
        self._close_cqs()


class RocePd(ProtectionDomain):
    """A protection domain of a :class:`RoceDevice`."""

    def __init__(self, device: RoceDevice, pd_id: int) -> None:
        super().__init__(pd_id)
        self.device = device

    def alloc_mr(self, length: int, access: AccessFlag) -> MemoryRegion:
        """Allocate ``length`` zeroed bytes (:func:`~smcr.rdma.base.zeroed_memory`: backed
        only once written) and register them.

        :raises VerbsError: EINVAL for REMOTE_WRITE without LOCAL_WRITE (as
            ``ibv_reg_mr``) or a bad length; ENOMEM if the mapping fails.
        """
        if length <= 0 or length > self.device.attr.max_mr_size:
            raise VerbsError(errno.EINVAL, f"MR length {length}")
        return self.reg_mr(zeroed_memory(length), access)

    def reg_mr(self, buffer: bytearray | memoryview, access: AccessFlag) -> MemoryRegion:
        """Register a caller's writable buffer; remote access is allowed (the responder is us).

        :raises VerbsError: EINVAL for a read-only buffer or REMOTE_WRITE without LOCAL_WRITE.
        """
        if access & AccessFlag.REMOTE_WRITE and not access & AccessFlag.LOCAL_WRITE:
            raise VerbsError(errno.EINVAL, "REMOTE_WRITE needs LOCAL_WRITE")
        view = memoryview(buffer).cast("B")
        if view.readonly:
            raise VerbsError(errno.EINVAL, "buffer is read-only")
        dev = self.device
        key = dev.keys.new_key()
        mr = MemoryRegion(self, view, addr=dev.next_iova(len(view)), key=key, access=access,
                          on_dereg=self._dereg)  # fmt: skip
        self.mrs[key] = mr
        if access & REMOTE_ACCESS:
            dev.publish(mr)
        return mr

    def _dereg(self, mr: MemoryRegion) -> None:
        self.device.revoke(mr)
        self.mrs.pop(mr.lkey, None)
        self.device.keys.release(mr.lkey)

    def create_qp(self, send_cq: CompletionQueue, recv_cq: CompletionQueue,
                  cap: QpCap | None = None, *, sq_sig_all: bool = False) -> RoceQp:  # fmt: skip
        """An RC QP in RESET.

        :raises VerbsError: EINVAL for capabilities above the device's.
        """
        cap = cap or QpCap()
        a = self.device.attr
        if (max(cap.max_send_sge, cap.max_recv_sge) > a.max_sge
                or max(cap.max_send_wr, cap.max_recv_wr) > a.max_qp_wr):  # fmt: skip
            raise VerbsError(errno.EINVAL, f"QP capabilities {cap} above the device's")
        return self.device.new_qp(self, send_cq, recv_cq, cap, sq_sig_all)

    def dealloc(self) -> None:
        """Free the PD.

        :raises VerbsError: EBUSY while it still has memory regions.
        """
        if self.mrs:
            raise VerbsError(errno.EBUSY, "PD still has memory regions")


def _readable(sock: socket.socket) -> bool:
    """Whether a datagram waits on ``sock`` (False once it is closed)."""
    try:
        return plainsock.ready(sock)
    except (OSError, ValueError):
        return False


def _resolve(address: str | None, ifname: str | None) -> netif.RnicInfo:
    """The interface facts of an address; extra loopback addresses (127/8) map to ``lo``."""
    try:
        return netif.find(address, ifname)
    except LookupError:
        if address is None or not address.startswith("127."):
            raise
    lo = netif.find(ifname="lo")
    n = int(address.rsplit(".", 1)[1])
    return netif.RnicInfo(
        name=f"roce_lo_{n}", ifname="lo", address=address,
        gid=bytes(10) + b"\xff\xff" + socket.inet_aton(address), mac=lo.mac, mtu=lo.mtu,
        active_mtu=lo.active_mtu, operstate=lo.operstate,
    )  # fmt: skip
