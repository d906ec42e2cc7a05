"""The RoCEv2 RNIC in one process over loopback: 127.0.0.1 and 127.0.0.2 as two RNICs.

No privileges needed: this is the "over loopback on one host when asked to"
mode, and the quickest check that the provider presents the shm RNIC's API
(the same calls as ``tests/rdma``) with real packets underneath.
"""

from __future__ import annotations

import errno
import select
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from smcr.rdma import (
    AccessFlag,
    CompletionQueue,
    MemoryRegion,
    QpAttr,
    QpAttrMask,
    QpState,
    RecvWr,
    SendFlag,
    SendWr,
    Sge,
    VerbsError,
    WcOpcode,
    WcStatus,
    WorkCompletion,
    WrOpcode,
)
from smcr.rdma.roce import RoceDevice, RocePd, RoceQp, fastpath
from smcr.rdma.roce.cq import POLLER_RX_ENV, RoceCq
from smcr.rdma.roce.responder import ACK_HOLD_PSNS
from tests.support import port_4791_free

RW = AccessFlag.LOCAL_WRITE | AccessFlag.REMOTE_WRITE | AccessFlag.REMOTE_READ
SIG = SendFlag.SIGNALED



pytestmark = pytest.mark.skipif(not port_4791_free(),
                                reason="UDP port 4791 is taken here (rdma_rxe loaded?)")


@dataclass
class Side:
    dev: RoceDevice
    pd: RocePd
    cq: CompletionQueue
    qp: RoceQp
    rmb: MemoryRegion
    buf: MemoryRegion
    psn: int
    wcs: list[WorkCompletion] = field(default_factory=list)

    def wait(self, n: int = 1, timeout: float = 3.0) -> list[WorkCompletion]:
        out: list[WorkCompletion] = []
        deadline = time.monotonic() + timeout
        while len(out) < n:
            left = deadline - time.monotonic()
            assert left > 0, f"timed out with {out}"
            out += self.cq.wait(left, n - len(out))
        return out


def make_side(address: str, psn: int, gso: bool = True) -> Side:
    dev = RoceDevice(address, gso=gso)
    pd = dev.alloc_pd()
    cq = dev.create_cq()
    qp = pd.create_qp(cq, cq)
    return Side(dev, pd, cq, qp, pd.alloc_mr(1 << 20, RW),
                pd.alloc_mr(1 << 20, AccessFlag.LOCAL_WRITE), psn)  # fmt: skip


def write_then_send(a: Side, b: Side, n: int, send: int) -> None:
    """One batch: an unsignaled WRITE of ``a.buf[:n]`` to the start of ``b.rmb`` (wr_id 1),
    then a signaled SEND of ``a.buf[:send]`` (wr_id 2)."""
    a.qp.post_send([
        SendWr(wr_id=1, opcode=WrOpcode.RDMA_WRITE, sg_list=(Sge(a.buf.addr, n, a.buf.lkey),),
               remote_addr=b.rmb.addr, rkey=b.rmb.rkey),
        SendWr(wr_id=2, opcode=WrOpcode.SEND, send_flags=SIG,
               sg_list=(Sge(a.buf.addr, send, a.buf.lkey),)),
    ])  # fmt: skip


@pytest.fixture(params=[(True, True), (False, True), (True, False)],
                ids=["gso", "no-gso", "gso-python-loops"])  # fmt: skip
def pair(request: pytest.FixtureRequest,
         monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Side, Side]]:  # fmt: skip
    """Two RNICs with a QP each, connected; with UDP GSO or without, and with the C loops
    of WRITE Middles (when built: the suite's normal case) or the Python ones."""
    gso, c_loops = request.param
    if not c_loops:
        monkeypatch.setattr(fastpath, "LOOPS", None)
    a, b = make_side("127.0.0.1", 0xFFFFF8, gso), make_side("127.0.0.2", 1234, gso)
    for me, other in ((a, b), (b, a)):
        me.qp.to_rts(dgid=other.dev.gid, dest_qp_num=other.qp.qp_num, rq_psn=other.psn,
                     sq_psn=me.psn, access=RW, timeout=12, retry_cnt=3)  # fmt: skip
    yield a, b
    a.dev.close()
    b.dev.close()


def test_device_facts() -> None:
    dev = RoceDevice("127.0.0.2")
    try:
        assert dev.gid == bytes(10) + b"\xff\xff" + bytes([127, 0, 0, 2])
        assert dev.netdev == "lo" and dev.max_mtu.nbytes == 4096
    finally:
        dev.close()


def test_write_send_read_over_loopback(pair: tuple[Side, Side]) -> None:
    a, b = pair
    data = bytes(range(256)) * 1000
    a.buf.buf[: len(data)] = data
    b.qp.post_recv(RecvWr(wr_id=5, sg_list=(Sge(b.buf.addr, 8192, b.buf.lkey),)))
    a.qp.post_send([
        SendWr(wr_id=1, opcode=WrOpcode.RDMA_WRITE, sg_list=(Sge(a.buf.addr, len(data),
               a.buf.lkey),), remote_addr=b.rmb.addr + 3, rkey=b.rmb.rkey),  # unsignaled
        SendWr(wr_id=2, opcode=WrOpcode.RDMA_WRITE_WITH_IMM, send_flags=SIG, imm_data=99,
               sg_list=(Sge(a.buf.addr, 10, a.buf.lkey),), remote_addr=b.rmb.addr + 500_000,
               rkey=b.rmb.rkey),
    ])  # fmt: skip
    assert [(w.wr_id, w.status) for w in a.wait()] == [(2, WcStatus.SUCCESS)]
    assert bytes(b.rmb.buf[3 : 3 + len(data)]) == data
    (rwc,) = b.wait()
    assert (rwc.wr_id, rwc.opcode, rwc.byte_len, rwc.imm_data) == (
        5, WcOpcode.RECV_RDMA_WITH_IMM, 10, 99)
    a.qp.post_send(SendWr(wr_id=3, opcode=WrOpcode.RDMA_READ, send_flags=SIG,
                          sg_list=(Sge(a.buf.addr + 300_000, 70_000, a.buf.lkey),),
                          remote_addr=b.rmb.addr + 3, rkey=b.rmb.rkey))  # fmt: skip
    assert a.wait()[0].status is WcStatus.SUCCESS
    assert bytes(a.buf.buf[300_000:370_000]) == data[:70_000]
    assert a.dev.stats["icrc_errors"] == b.dev.stats["icrc_errors"] == 0


def test_a_send_the_kernel_refuses_is_a_lost_packet_not_an_error(pair: tuple[Side, Side]) -> None:
    """A ``sendmsg`` that fails is a packet lost on the wire: counted, left to the
    retransmit timer; the post itself succeeds.  Here the peer is the broadcast address
    without ``SO_BROADCAST``, which the kernel refuses at once (EACCES: nothing leaves the
    host), on each send path: the WRITE's First alone, its Middle run with the Last and
    the SEND behind it joined (gso), then, restored, everything arrives (the timer)."""
    a, b = pair
    pmtu = a.qp.req.pmtu
    data = bytes(range(256)) * (3 * pmtu // 256)
    a.buf.buf[: len(data)] = data
    b.qp.post_recv(RecvWr(wr_id=4, sg_list=(Sge(b.buf.addr, 64, b.buf.lkey),)))
    peer, name = a.qp.peer, a.qp._name  # (the C send loop takes the packed address)
    a.qp.peer = ("255.255.255.255", peer[1])
    a.qp._name = a.dev.packed_sockaddr(b"\xff" * 4, peer[1])
    write_then_send(a, b, len(data), 44)
    assert a.dev.stats["tx_errors"] >= 2  # (the First, then the rest: one or more sends)
    a.qp.peer, a.qp._name = peer, name
    assert [(w.wr_id, w.status) for w in a.wait(timeout=10.0)] == [(2, WcStatus.SUCCESS)]
    assert bytes(b.rmb.buf[: len(data)]) == data
    assert b.wait()[0].byte_len == 44


def test_rnr_then_delivery(pair: tuple[Side, Side]) -> None:
    a, b = pair
    a.qp.post_send(SendWr(wr_id=1, opcode=WrOpcode.SEND, send_flags=SIG,
                          sg_list=(Sge(a.buf.addr, 44, a.buf.lkey),)))  # fmt: skip
    deadline = time.monotonic() + 10.0  # min_rnr_timer 5 = 0.06 ms: RNR rounds come fast
    while a.qp.req.stats["rnr"] < 1:  # an RNR NAK came back: no receive was posted
        assert time.monotonic() < deadline, "no RNR NAK within 10 s"
        time.sleep(0.001)
    assert not a.cq.poll()  # RNR retry 7 is "infinite": nothing completes meanwhile
    b.qp.post_recv(RecvWr(wr_id=9, sg_list=(Sge(b.buf.addr, 64, b.buf.lkey),)))
    assert a.wait()[0].status is WcStatus.SUCCESS
    assert b.wait()[0].byte_len == 44


def test_local_protection_error_and_flush(pair: tuple[Side, Side]) -> None:
    a, b = pair
    b.qp.post_recv(RecvWr(wr_id=1, sg_list=(Sge(b.buf.addr, 64, b.buf.lkey),)))
    a.qp.post_send(SendWr(wr_id=7, opcode=WrOpcode.SEND, send_flags=SIG,
                          sg_list=(Sge(a.buf.addr, 10, a.buf.lkey ^ 1),)))  # fmt: skip
    assert a.wait()[0].status is WcStatus.LOC_PROT_ERR
    assert a.qp.state is QpState.ERR
    a.qp.post_send(SendWr(wr_id=8, opcode=WrOpcode.SEND, sg_list=()))
    assert a.wait()[0].status is WcStatus.WR_FLUSH_ERR
    b.qp.modify(QpAttr(qp_state=QpState.ERR), QpAttrMask.STATE)
    assert [(w.wr_id, w.status) for w in b.wait()] == [(1, WcStatus.WR_FLUSH_ERR)]


def test_post_errors(pair: tuple[Side, Side]) -> None:
    a, _b = pair
    qp = a.pd.create_qp(a.cq, a.cq)
    with pytest.raises(VerbsError) as e:
        qp.post_send(SendWr(wr_id=1, opcode=WrOpcode.SEND))
    assert e.value.errno == errno.EINVAL
    with pytest.raises(VerbsError):
        qp.post_recv(RecvWr(wr_id=1))
    with pytest.raises(VerbsError):
        a.qp.post_send(SendWr(wr_id=1, opcode=WrOpcode.ATOMIC_FETCH_AND_ADD))
    with pytest.raises(VerbsError):  # an IPv6 GID on an IPv4 RNIC
        qp.to_rts(dgid=b"\xfe\x80" + bytes(14), dest_qp_num=5, rq_psn=0, sq_psn=0, access=RW)


def test_peer_gone_retry_exceeded(pair: tuple[Side, Side]) -> None:
    a, b = pair
    b.qp.destroy()
    t0 = time.monotonic()
    a.qp.post_send(SendWr(wr_id=1, opcode=WrOpcode.RDMA_WRITE, send_flags=SIG,
                          sg_list=(Sge(a.buf.addr, 10, a.buf.lkey),),
                          remote_addr=b.rmb.addr, rkey=b.rmb.rkey))  # fmt: skip
    assert a.wait()[0].status is WcStatus.RETRY_EXC_ERR
    assert time.monotonic() - t0 < 4 * 0.0168 + 0.3


@pytest.mark.skipif(not socket.has_ipv6 or not Path("/proc/net/if_inet6").exists(),
                    reason="no IPv6")  # fmt: skip
def test_ipv6_two_rnics_on_one_address() -> None:
    """Two RNICs on ::1: both QPs' flows have the same 4-tuple, dispatch goes by DestQP."""
    a, b = make_side("::1", 10), make_side("::1", 20)
    try:
        for me, other in ((a, b), (b, a)):
            me.qp.to_rts(dgid=other.dev.gid, dest_qp_num=other.qp.qp_num, rq_psn=other.psn,
                         sq_psn=me.psn, access=RW, timeout=12)  # fmt: skip
        data = bytes(range(256)) * 100
        a.buf.buf[: len(data)] = data
        b.qp.post_recv(RecvWr(wr_id=1, sg_list=(Sge(b.buf.addr, 64, b.buf.lkey),)))
        write_then_send(a, b, len(data), 50)
        assert a.wait()[0].status is WcStatus.SUCCESS
        assert b.wait()[0].byte_len == 50
        assert bytes(b.rmb.buf[: len(data)]) == data
        assert a.dev.stats["icrc_errors"] == b.dev.stats["icrc_errors"] == 0
    finally:
        a.dev.close()
        b.dev.close()


def test_idle_rnic_costs_no_cpu(pair: tuple[Side, Side]) -> None:
    """The progress threads sleep in epoll when nothing happens: they never spin."""
    a, b = pair
    a.qp.post_send(SendWr(wr_id=1, opcode=WrOpcode.RDMA_WRITE, send_flags=SIG,
                          sg_list=(Sge(a.buf.addr, 10, a.buf.lkey),),
                          remote_addr=b.rmb.addr, rkey=b.rmb.rkey))  # fmt: skip
    assert a.wait()[0].status is WcStatus.SUCCESS
    cpu, wall = time.process_time(), time.monotonic()
    time.sleep(0.5)
    assert time.process_time() - cpu < 0.05 * (time.monotonic() - wall)


def test_local_fault_completes_in_posting_order(pair: tuple[Side, Side]) -> None:
    a, b = pair
    good = SendWr(wr_id=1, opcode=WrOpcode.RDMA_WRITE, sg_list=(Sge(a.buf.addr, 10,
                  a.buf.lkey),), remote_addr=b.rmb.addr, rkey=b.rmb.rkey)  # fmt: skip
    bad = SendWr(wr_id=2, opcode=WrOpcode.RDMA_WRITE,
                 sg_list=(Sge(a.buf.addr - 1, 10, a.buf.lkey),))  # below the MR
    later = SendWr(wr_id=3, opcode=WrOpcode.SEND, sg_list=())
    a.qp.post_send([good, bad, later])  # 1 is sent at once, but not ACKed yet: flushed
    assert [(w.wr_id, w.status) for w in a.wait(3)] == [
        (1, WcStatus.WR_FLUSH_ERR), (2, WcStatus.LOC_PROT_ERR), (3, WcStatus.WR_FLUSH_ERR)]


@pytest.fixture
def pollers_receive(monkeypatch: pytest.MonkeyPatch) -> None:
    """CQs made from now on receive in their pollers (the default; :mod:`smcr.rdma.roce.cq`),
    whatever the environment says.

    Ask for it before ``pair`` so that the pair's CQs are made with it."""
    monkeypatch.delenv(POLLER_RX_ENV, raising=False)


def test_cq_pollers_receive_and_the_progress_thread_steps_back(
        pollers_receive: None, pair: tuple[Side, Side]) -> None:  # fmt: skip
    """Whoever polls a CQ receives its QPs' packets itself (no thread hop per message).

    While b's CQ is polled, b's progress thread cedes the QP socket to the pollers
    (``_ceded``); the CQ descriptor still wakes on a packet (it is an epoll set
    holding the socket); once nobody polls, the progress thread takes the socket
    back, so a WRITE b never looks at is still acknowledged.
    """
    a, b = pair
    send = SendWr(wr_id=1, opcode=WrOpcode.SEND, send_flags=SIG,
                  sg_list=(Sge(a.buf.addr, 44, a.buf.lkey),))  # fmt: skip
    recv = RecvWr(wr_id=7, sg_list=(Sge(b.buf.addr, 64, b.buf.lkey),))

    def settle(ceded: bool) -> None:
        deadline = time.monotonic() + 5.0
        while bool(b.dev._ceded) != ceded and time.monotonic() < deadline:
            time.sleep(0.01)
        assert bool(b.dev._ceded) == ceded

    for _ in range(3):  # the poller receives
        b.qp.post_recv(recv)
        a.qp.post_send(send)
        assert [(w.wr_id, w.status) for w in b.wait()] == [(7, WcStatus.SUCCESS)]
        assert a.wait()[0].status is WcStatus.SUCCESS
    settle(False)  # nobody polls: the progress thread watches the socket
    cq = b.cq
    assert isinstance(cq, RoceCq)
    cq.last_poll = time.monotonic() + 3600  # as if a poller were busy on b's CQ
    b.qp.post_recv(recv)
    a.qp.post_send(send)
    assert a.wait()[0].status is WcStatus.SUCCESS  # received (and ACKed) by b's thread...
    settle(True)  # ... which then leaves the socket to the pollers
    assert [w.wr_id for w in b.wait()] == [7]
    b.qp.post_recv(recv)  # ceded: a packet wakes the CQ descriptor, the poll receives it
    b.cq.req_notify()
    a.qp.post_send(send)
    ready, _, _ = select.select([b.cq], [], [], 3.0)
    assert ready
    assert [w.wr_id for w in b.wait()] == [7]
    assert a.wait()[0].status is WcStatus.SUCCESS
    cq.last_poll = 0.0  # the poller is gone: the progress thread takes the socket back
    settle(False)
    a.qp.post_send(SendWr(wr_id=2, opcode=WrOpcode.RDMA_WRITE, send_flags=SIG,
                          sg_list=(Sge(a.buf.addr, 100_000, a.buf.lkey),),
                          remote_addr=b.rmb.addr, rkey=b.rmb.rkey))  # fmt: skip
    assert [(w.wr_id, w.status) for w in a.wait()] == [(2, WcStatus.SUCCESS)]


def test_a_look_that_is_no_waiters_leaves_the_socket_to_the_progress_thread(
        pollers_receive: None, pair: tuple[Side, Side]) -> None:  # fmt: skip
    """A poll of b's CQ by a thread that then waits elsewhere (an event loop's non-blocking
    read, before it sleeps in ``select`` on a readiness descriptor) is no waiter to cede
    the socket to: b's progress thread keeps receiving, so the answer is taken and
    acknowledged at once, not when the socket would have been taken back (up to
    ``CEDE_SECONDS`` a message, which an event-loop round trip paid).  A waiter's look
    (:meth:`RoceCq.waiting`, as a blocked ``recv`` makes) still makes it step back."""
    a, b = pair
    cq = b.cq
    assert isinstance(cq, RoceCq)
    send = SendWr(wr_id=1, opcode=WrOpcode.SEND, send_flags=SIG,
                  sg_list=(Sge(a.buf.addr, 44, a.buf.lkey),))  # fmt: skip
    recv = RecvWr(wr_id=7, sg_list=(Sge(b.buf.addr, 64, b.buf.lkey),))
    for _ in range(5):
        b.qp.post_recv(recv)
        assert cq.poll() == []  # a look, and then the thread waits elsewhere
        a.qp.post_send(send)
        assert a.wait()[0].status is WcStatus.SUCCESS  # b's progress thread received
        deadline = time.monotonic() + 3.0
        while cq.idle():  # its completion is there, made by the progress thread
            assert time.monotonic() < deadline, "b's receive never completed"
            time.sleep(0.001)
        assert not b.dev._ceded
        assert [w.wr_id for w in cq.poll()] == [7]
    looked = cq.last_poll
    assert not cq.has_completions() and cq.poll() == []
    assert cq.last_poll == looked  # (the looks above are no waiter's)
    cq.waiting()
    assert cq.last_poll > looked  # (what _on_qp_socket cedes to: the test above)


def test_a_ceded_socket_nobody_reads_is_taken_back(pollers_receive: None,
                                                   pair: tuple[Side, Side]) -> None:  # fmt: skip
    """A poller that stops polling cannot stall its peer: the progress thread reads on."""
    a, b = pair
    cq = b.cq
    assert isinstance(cq, RoceCq)
    cq.last_poll = time.monotonic() + 3600  # a poller that polled, then went away
    # a retransmit timer of 2 s, far beyond the cede period, instead of the pair's 17 ms: a
    # timeout then says the socket was not taken back, not that a busy machine ran late
    a.qp.req.period = 2.0
    for i in range(3):
        a.qp.post_send(SendWr(wr_id=i, opcode=WrOpcode.RDMA_WRITE, send_flags=SIG,
                              sg_list=(Sge(a.buf.addr, 50_000, a.buf.lkey),),
                              remote_addr=b.rmb.addr, rkey=b.rmb.rkey))  # fmt: skip
        assert [(w.wr_id, w.status) for w in a.wait()] == [(i, WcStatus.SUCCESS)]
    assert a.qp.req.stats["timeouts"] == 0


@pytest.fixture
def progress_thread_receives(monkeypatch: pytest.MonkeyPatch) -> None:
    """CQs made from now on leave receiving to the progress thread (``SMCR_ROCE_POLLER_RX=0``)."""
    monkeypatch.setenv(POLLER_RX_ENV, "0")


def test_pollers_receive_can_be_switched_off(progress_thread_receives: None,
                                             pair: tuple[Side, Side]) -> None:  # fmt: skip
    """With the switch off the progress thread receives everything and never cedes, and
    the CQ descriptor is rung by it (a sleeper on the CQ still wakes)."""
    a, b = pair
    assert isinstance(b.cq, RoceCq) and not b.cq.pollers_receive
    recv = RecvWr(wr_id=9, sg_list=(Sge(b.buf.addr, 64, b.buf.lkey),))
    for _ in range(3):
        b.qp.post_recv(recv)
        b.cq.req_notify()
        a.qp.post_send(SendWr(wr_id=1, opcode=WrOpcode.SEND, send_flags=SIG,
                              sg_list=(Sge(a.buf.addr, 44, a.buf.lkey),)))  # fmt: skip
        ready, _, _ = select.select([b.cq], [], [], 3.0)
        assert ready
        assert [(w.wr_id, w.status) for w in b.wait()] == [(9, WcStatus.SUCCESS)]
        assert a.wait()[0].status is WcStatus.SUCCESS
    assert not b.dev._ceded and not b.cq.receives(b.qp)


@pytest.mark.parametrize("messages", [20, 40])
def test_small_messages_read_in_one_batch_share_an_ack(pair: tuple[Side, Side],
                                                       messages: int) -> None:  # fmt: skip
    """Small WRITEs that arrive as separate datagrams and are read in one batch get one
    ACK, not one each (many connections' messages in one link group's QP); one that
    covers :data:`~smcr.rdma.roce.responder.ACK_HOLD_PSNS` goes at once, so a stream's
    window never waits for a whole batch."""
    a, b = pair
    acks = b.qp.resp.stats["acks"]
    # a's retransmit timer must not fire while b's reader is held (a retransmission is
    # answered by ACKs of its own): the fixture's 17 ms is shorter than the posts take
    # beside a busy process, so it is a second here
    a.qp.req.period = 1.0
    with b.qp.rx_lock:  # b's reader waits: the datagrams pile up in its socket
        for i in range(messages):  # one post each: one datagram each
            a.qp.post_send(SendWr(wr_id=i, opcode=WrOpcode.RDMA_WRITE, send_flags=SIG,
                                  sg_list=(Sge(a.buf.addr, 32, a.buf.lkey),),
                                  remote_addr=b.rmb.addr + 32 * i, rkey=b.rmb.rkey))  # fmt: skip
        # (loopback delivers before sendmsg returns)
    assert [w.wr_id for w in a.wait(messages)] == list(range(messages))
    assert a.qp.req.stats["timeouts"] == 0
    # one at each ACK_HOLD_PSNS-th PSN, one at the batch's end for what is left
    assert b.qp.resp.stats["acks"] - acks == -(-messages // ACK_HOLD_PSNS)
