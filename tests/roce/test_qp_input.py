"""``RoceQp.input`` on garbage: a real QP of a real RoCE RNIC over loopback, fed any bytes.

The QP (at 127.0.0.2) is at RTS with a receive posted and a READ and a WRITE
outstanding, so every check of ``input`` and of both protocol halves has work to
act on.  Its peer is a plain UDP socket at 127.0.0.3:4791 that records what the
QP sends.  Each example feeds one packet, BTH onwards (its PSN set to the one the
QP expects, so the sequence checks pass and the later checks run), the way the
device's receive loop does after the ICRC check, and then checks the outcome:

* a packet that fails the header checks (unknown opcode, runt, TVer != 0, a
  foreign P_Key: rxe ``hdr_check``) is counted as malformed and changes nothing;
* a request is answered with an Acknowledge (ACK or NAK) at most, places
  nothing in the QP's memory (its rkey is wrong) and completes only the receive;
* a response reaches the requester, which may retransmit or complete its work;
* nothing raises, no completion names work that was not posted, and a QP that
  went to ERR has completed (flushed) everything it held.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from smcr.rdma import AccessFlag, MemoryRegion, QpState, RecvWr, SendFlag, SendWr, Sge, WrOpcode
from smcr.rdma.completion import CompletionQueue
from smcr.rdma.roce import RoceDevice, RocePd
from smcr.rdma.roce.requester import MIN_CWND
from smcr.wire.roce import OPCODE_INFO, ExtHeader, Opcode
from tests.support import port_4791_free

RW = AccessFlag.LOCAL_WRITE | AccessFlag.REMOTE_WRITE | AccessFlag.REMOTE_READ
ADDRESS, PEER = "127.0.0.2", "127.0.0.3"
PEER_GID = bytes(10) + b"\xff\xff" + socket.inet_aton(PEER)
RQ_PSN, SQ_PSN = 0x123456, 0xABCDE0
RECV, READ, WRITE = 1, 2, 3



pytestmark = pytest.mark.skipif(not port_4791_free(PEER),
                                reason="UDP port 4791 is taken here (rdma_rxe loaded?)")


@dataclass
class Rig:
    dev: RoceDevice
    pd: RocePd
    cq: CompletionQueue
    rmb: MemoryRegion
    buf: MemoryRegion
    peer: socket.socket

    def sent(self) -> list[bytes]:
        """What the QP sent since the last call (loopback delivers before sendmsg returns)."""
        out = []
        while True:
            try:
                out.append(self.peer.recv(65536))
            except BlockingIOError:
                return out


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    peer.bind((PEER, 4791))
    peer.setblocking(False)
    dev = RoceDevice(ADDRESS)
    pd = dev.alloc_pd()
    try:
        yield Rig(dev, pd, dev.create_cq(), pd.alloc_mr(1 << 16, RW),
                  pd.alloc_mr(1 << 16, AccessFlag.LOCAL_WRITE), peer)  # fmt: skip
    finally:
        dev.close()
        peer.close()


def header_ok(pkt: bytes) -> bool:
    """rxe ``hdr_check`` as the wire spec states it: a known opcode, room for its headers
    (pad excluded), TVer 0, the default P_Key (either membership bit)."""
    try:
        info = OPCODE_INFO[Opcode(pkt[0])]
    except ValueError:
        return False
    pad = (pkt[1] >> 4) & 3
    p_key = int.from_bytes(pkt[2:4], "big")
    return len(pkt) - pad >= info.header_length and pkt[1] & 0x0F == 0 and p_key & 0x7FFF == 0x7FFF


def reth_length(pkt: bytes) -> int | None:
    """The DMA length of a request's RETH, if it has one."""
    if reth_rkey(pkt) is None:
        return None
    return int.from_bytes(pkt[24:28], "big")


def reth_rkey(pkt: bytes) -> int | None:
    """The rkey of a request's RETH, if it has one."""
    try:
        info = OPCODE_INFO[Opcode(pkt[0])]
    except ValueError:
        return None
    if not info.headers & ExtHeader.RETH or len(pkt) < 28:
        return None
    return int.from_bytes(pkt[20:24], "big")


@st.composite
def plausible(draw: st.DrawFn) -> bytes:
    """A BTH that passes the header checks (an RC opcode, TVer 0, the default P_Key) and
    random bytes after it, so the checks behind the header check run too (plain random
    bytes, the other strategy, nearly always fail the header check)."""
    opcode = draw(st.sampled_from(list(Opcode)))
    b1 = draw(st.integers(0, 15)) << 4
    p_key = draw(st.sampled_from([0xFFFF, 0x7FFF]))
    rest = draw(st.binary(min_size=24, max_size=68))
    return bytes([opcode, b1]) + p_key.to_bytes(2, "big") + rest


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(min_size=12, max_size=80) | plausible(), st.booleans())
def test_garbage_is_dropped_answered_or_taken_never_raises(rig: Rig, garbage: bytes,
                                                           response: bool) -> None:  # fmt: skip
    qp = rig.pd.create_qp(rig.cq, rig.cq)
    try:
        # timeout 31 (~2.4 h): no retransmission while the example runs.  Not 0: rxe never
        # retransmits then, but this RNIC still looks every 100 ms (a hang otherwise), and a
        # test thread that lost the CPU that long saw both requests twice
        qp.to_rts(dgid=PEER_GID, dest_qp_num=0x99, rq_psn=RQ_PSN, sq_psn=SQ_PSN, access=RW,
                  timeout=31, rnr_retry=7)  # fmt: skip
        qp.post_recv(RecvWr(wr_id=RECV, sg_list=(Sge(rig.buf.addr, 4096, rig.buf.lkey),)))
        qp.post_send([
            SendWr(wr_id=READ, opcode=WrOpcode.RDMA_READ, send_flags=SendFlag.SIGNALED,
                   sg_list=(Sge(rig.buf.addr + 8192, 1000, rig.buf.lkey),),
                   remote_addr=0x5000, rkey=0x77),
            SendWr(wr_id=WRITE, opcode=WrOpcode.RDMA_WRITE, send_flags=SendFlag.SIGNALED,
                   sg_list=(Sge(rig.buf.addr + 16384, 1000, rig.buf.lkey),),
                   remote_addr=0x9000, rkey=0x77),
        ])  # fmt: skip
        due = qp.req.deadline()
        assert due is None or due - time.monotonic() > 3600  # (no timer within the example)
        assert [p[0] for p in rig.sent()] == [Opcode.RDMA_READ_REQUEST,
                                             Opcode.RDMA_WRITE_ONLY]  # fmt: skip
        raw = bytearray(garbage)
        raw[9:12] = (SQ_PSN if response else RQ_PSN).to_bytes(3, "big")
        pkt = bytes(raw)
        malformed = rig.dev.stats["malformed"]
        rig.rmb.buf[:4096] = bytes(4096)
        now = time.monotonic()
        with qp._state_lock:  # as the device's receive loop holds it
            qp.input(memoryview(pkt + b"ICRC"), now)
            qp.after_input(now)
        out = [p[0] for p in rig.sent()]
        wcs = rig.cq.poll(64)
        ids = [wc.wr_id for wc in wcs]
        assert len(ids) == len(set(ids)) and set(ids) <= {RECV, READ, WRITE}
        if not header_ok(pkt):
            assert rig.dev.stats["malformed"] == malformed + 1
            assert (out, wcs, qp.state) == ([], [], QpState.RTS)
            return
        assert rig.dev.stats["malformed"] == malformed
        if 0x0D <= pkt[0] <= 0x11:  # READ responses and Acknowledge: the requester's
            assert all(op < 0x0D for op in out), out  # retransmissions only
            assert RECV not in ids or qp.state is QpState.ERR
        elif pkt[0] == Opcode.RDMA_READ_REQUEST and reth_length(pkt) == 0:
            # a zero-length READ touches no memory, so its rkey is not checked (the IBA
            # requires no valid R_Key for it; rxe does the same): an empty READ RESPONSE
            assert out in ([], [Opcode.RDMA_READ_RESPONSE_ONLY]), out
        else:
            assert all(op == Opcode.ACKNOWLEDGE for op in out), out
            assert (READ not in ids and WRITE not in ids) or qp.state is QpState.ERR
            if reth_rkey(pkt) != rig.rmb.rkey:
                assert bytes(rig.rmb.buf[:4096]) == bytes(4096)
        assert qp.state in (QpState.RTS, QpState.ERR)
        if qp.state is QpState.ERR:
            assert set(ids) == {RECV, READ, WRITE}  # all work completed, flushed or not
    finally:
        qp.destroy()
        rig.sent()
        rig.cq.poll(64)


def test_a_duplicate_moves_no_psn_but_the_delivery_mark() -> None:
    """A receiver whose ACKs are lost hears only the sender's retransmissions: they move
    neither of its PSNs, but they say the peer lives, so the delivery mark (which an LLC
    wait that ran out asks: :meth:`QueuePairs.delivered
    <smcr.stack.qps.QueuePairs.delivered>`) moves; garbage does not move it."""
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    peer.bind((PEER, 4791))
    dev = RoceDevice(ADDRESS)
    try:
        pd = dev.alloc_pd()
        cq = dev.create_cq()
        qp = pd.create_qp(cq, cq)
        qp.to_rts(dgid=PEER_GID, dest_qp_num=0x99, rq_psn=RQ_PSN, sq_psn=SQ_PSN, access=RW,
                  timeout=0, rnr_retry=7)  # fmt: skip
        before = qp.delivery_mark()
        bth = bytes([Opcode.SEND_ONLY, 0, 0xFF, 0xFF, 0, 0, 0, 0x99, 0x80])  # AckReq
        dup = bth + (RQ_PSN - 1).to_bytes(3, "big") + b"x" * 8 + b"ICRC"
        runt = bytes([Opcode.SEND_ONLY, 0, 0x12, 0x34]) + bytes(8) + b"ICRC"
        now = time.monotonic()
        with qp._state_lock:
            qp.input(memoryview(dup), now)
            qp.after_input(now)
        assert (qp.resp.epsn, qp.req.una) == (RQ_PSN, SQ_PSN)
        assert qp.resp.stats["duplicates"] == 1
        heard = qp.delivery_mark()
        assert heard != before
        with qp._state_lock:
            qp.input(memoryview(runt), now)  # a foreign P_Key: dropped as malformed
        assert qp.delivery_mark() == heard
        qp.destroy()
    finally:
        dev.close()
        peer.close()


LONE_PEER = "127.0.0.4"
LONE_PEER_GID = bytes(10) + b"\xff\xff" + socket.inet_aton(LONE_PEER)


def _reads(sock: socket.socket, seconds: float) -> list[int]:
    """Packets per datagram read from a UDP_GRO socket for ``seconds``: a GSO send arrives
    as one read of several segments, separate sends as reads of one packet each."""
    out: list[int] = []
    end = time.monotonic() + seconds
    while True:
        try:
            data, anc, _flags, _addr = sock.recvmsg(1 << 16, 64)
        except BlockingIOError:
            if time.monotonic() >= end:
                return out
            time.sleep(0.001)
            continue
        seg = int.from_bytes(anc[0][2][:2], "little") if anc else len(data)
        out.append(-(-len(data) // seg))


def test_a_stalled_requester_resends_packet_by_packet() -> None:
    """Nothing acknowledged over two retransmit timeouts: the restart window
    (:data:`~smcr.rdma.roce.requester.MIN_CWND` PSNs) goes out one packet per datagram,
    each a chance of its own where one GSO send would be lost whole (between namespaces
    a GSO send stays one buffer to the receiver)."""
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    peer.setsockopt(socket.IPPROTO_UDP, 104, 1)  # UDP_GRO: a GSO send stays one read
    peer.bind((LONE_PEER, 4791))  # not PEER: the rig's socket there would share the packets
    peer.setblocking(False)
    dev = RoceDevice(ADDRESS)
    try:
        pd = dev.alloc_pd()
        cq = dev.create_cq()
        buf = pd.alloc_mr(1 << 16, AccessFlag.LOCAL_WRITE)
        qp = pd.create_qp(cq, cq)
        qp.to_rts(dgid=LONE_PEER_GID, dest_qp_num=0x99, rq_psn=RQ_PSN, sq_psn=SQ_PSN, access=RW,
                  timeout=12, retry_cnt=7)  # 17 ms, retried without limit  # fmt: skip
        qp.post_send(SendWr(wr_id=WRITE, opcode=WrOpcode.RDMA_WRITE,
                            sg_list=(Sge(buf.addr, 16 * qp.req.pmtu, buf.lkey),),
                            remote_addr=0x9000, rkey=0x77))  # fmt: skip
        first = _reads(peer, 0.005)
        assert sum(first) == 16 and max(first) > 1  # the Middles and Last as GSO
        deadline = time.monotonic() + 5.0
        while qp.req.stats["restarts"] == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert qp.req.stats["restarts"] >= 1 and qp.req.cwnd <= MIN_CWND
        _reads(peer, 0.0)
        later = _reads(peer, 0.1)  # several timeouts' worth, none acknowledged
        assert later and set(later) == {1}, later
        qp.destroy()
    finally:
        dev.close()
        peer.close()


def test_a_flow_socket_let_go_under_its_reader_stays_open_until_that_reader_ends(
        rig: Rig) -> None:  # fmt: skip
    """A QP destroyed while a thread reads its flow socket (which it reads by descriptor
    number): the socket stays open until that reader is done, which then closes it.  Closed
    under it, the number could be another socket's by its next read (a new QP's flow, a
    program's stream), whose data it would take."""
    qp = rig.pd.create_qp(rig.cq, rig.cq)
    qp.to_rts(dgid=PEER_GID, dest_qp_num=0x99, rq_psn=RQ_PSN, sq_psn=SQ_PSN, access=RW,
              timeout=31, rnr_retry=7)  # fmt: skip
    sock = qp.rx_sock
    assert sock is not None
    with qp._state_lock:  # the reader reads, then waits for it (as it does for each read)
        reader = threading.Thread(target=rig.dev.receive_qp, args=(qp,), daemon=True)
        reader.start()
        deadline = time.monotonic() + 10
        while not qp.rx_lock.locked():
            assert time.monotonic() < deadline, "the reader never began"
            time.sleep(0.001)
        qp.destroy()
        assert qp.rx_sock is None
        assert sock.fileno() >= 0, "closed under its reader"
    reader.join(10)
    assert not reader.is_alive()
    assert sock.fileno() == -1 and qp.rx_left_open == []
    rig.sent()
    rig.cq.poll(64)
