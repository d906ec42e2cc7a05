"""The RC protocol halves (requester, responder) over a fake lossy wire: no sockets, fake time.

Covers segmentation and PSN wrap, go-back-N after a NAK sequence error, the
small window after timeouts that acknowledged nothing,
duplicates answered without being applied twice, coalesced ACKs, RNR NAK
with its timer and retry count, retransmission on timeout until the retry
count runs out (with exact fake-time bounds), partial READ retry replayed
from a Middle packet, memory checks before any byte is placed, and random
loss/duplication/reordering with every byte intact.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smcr.rdma import WcOpcode, WcStatus
from smcr.rdma.roce.fastpath import U24
from smcr.rdma.roce.requester import MIN_CWND
from smcr.rdma.verbs import local_ack_timeout
from smcr.wire.roce import Opcode
from tests.roce.rc_pair import End, Wire, pair, read_wr, send_wr, write_wr


def fill(end: End, n: int, seed: int) -> bytes:
    data = random.Random(seed).randbytes(n)
    end.buf.buf[:n] = data
    return data


def test_write_send_read_segmented_across_psn_wrap() -> None:
    wire = Wire()
    a, b = pair(wire)
    data = fill(a, 5000, 1)
    b.post_recv(1)
    a.post(write_wr(a, b, 100, 5000, 1), 0.0)  # 20 packets of 256 B, PSN wraps at 2**24
    a.post(send_wr(a, 0, 700, 2, imm=0xBEEF), 0.0)
    a.post(read_wr(a, b, 100, 3000, 3, loff=0x8000), 0.0)
    wire.run((a, b), lambda: len(a.send_wcs) == 3)
    assert [(w.wr_id, w.status, w.opcode) for w in a.send_wcs] == [
        (1, WcStatus.SUCCESS, WcOpcode.RDMA_WRITE), (2, WcStatus.SUCCESS, WcOpcode.SEND),
        (3, WcStatus.SUCCESS, WcOpcode.RDMA_READ),
    ]  # fmt: skip
    assert bytes(b.rmb.buf[100:5100]) == data
    assert [(w.wr_id, w.byte_len, w.imm_data) for w in b.recv_wcs] == [(1, 700, 0xBEEF)]
    assert bytes(b.buf.buf[:700]) == data[:700]
    assert bytes(a.buf.buf[0x8000 : 0x8000 + 3000]) == data[:3000]
    assert a.req.una == a.req.next == (0xFFFFF0 + 20 + 3 + 12) & U24
    assert a.req.stats["retransmits"] == 0


def test_segmentation_opcodes_and_ackreq() -> None:
    wire = Wire()
    a, b = pair(wire)
    fill(a, 256 * 70, 2)
    sent: list[bytes] = []

    def record(_dst: End, pkt: bytes) -> bool:
        sent.append(pkt)
        return True

    wire.filter = record
    a.post(write_wr(a, b, 0, 256 * 70 - 3, 1), 0.0)
    wire.run((a, b), lambda: bool(a.send_wcs))
    reqs = [p for p in sent if p[0] != Opcode.ACKNOWLEDGE]
    ops = [p[0] for p in reqs]
    assert ops == [Opcode.RDMA_WRITE_FIRST] + [Opcode.RDMA_WRITE_MIDDLE] * 68 + [
        Opcode.RDMA_WRITE_LAST]
    assert all(len(p) == 12 + 16 + 256 for p in reqs[:1])
    assert all(len(p) == 12 + 256 for p in reqs[1:-1])
    assert (reqs[-1][1] >> 4) & 3 == 3 and len(reqs[-1]) == 12 + 256  # 253 bytes + 3 pad
    ackreq = [i for i, p in enumerate(reqs) if p[8] & 0x80]
    assert ackreq == [63, 69]  # every 64 packets (as rxe) and the last
    # the responder ACKed only what asked; the batch coalesced them into one
    acks = [p for p in sent if p[0] == Opcode.ACKNOWLEDGE]
    assert 1 <= len(acks) <= 3


def test_ackreq_goes_on_each_rounds_last_packet_not_on_every_message_end() -> None:
    """A WRITE and the SEND behind it posted as one batch go out in one round: only the
    SEND (the round's last packet) asks for an ACK, which acknowledges both.  A round
    the window cuts short asks on its last packet too, a Middle (else nothing would be
    answered and the sender would wait for its timeout), and so does a post of its own."""
    wire = Wire()
    a, b = pair(wire)
    fill(a, 256 * 8, 4)
    b.post_recv(1)
    sent: list[bytes] = []

    def record(_dst: End, pkt: bytes) -> bool:
        sent.append(pkt)
        return True

    def asked() -> list[tuple[int, bool]]:
        return [(p[0], bool(p[8] & 0x80)) for p in sent if p[0] != Opcode.ACKNOWLEDGE]

    wire.filter = record
    views = [a.buf.buf[0 : 256 * 3]]
    a.req.post(write_wr(a, b, 0, 256 * 3, 1), views, 256 * 3, 0.0, transmit=False)
    a.post(send_wr(a, 0, 40, 2), 0.0)
    wire.run((a, b), lambda: len(a.send_wcs) == 2)
    assert asked() == [(Opcode.RDMA_WRITE_FIRST, False), (Opcode.RDMA_WRITE_MIDDLE, False),
                       (Opcode.RDMA_WRITE_LAST, False), (Opcode.SEND_ONLY, True)]  # fmt: skip
    assert [p[0] for p in sent if p[0] == Opcode.ACKNOWLEDGE] == [Opcode.ACKNOWLEDGE]
    assert [(w.wr_id, w.status) for w in a.send_wcs] == [(1, WcStatus.SUCCESS),
                                                         (2, WcStatus.SUCCESS)]  # fmt: skip

    sent.clear()
    a.req.window = 5  # the round stops at the WRITE's fifth packet, a Middle
    a.post(write_wr(a, b, 0, 256 * 8, 3), 0.0)
    wire.run((a, b), lambda: len(a.send_wcs) == 3)
    assert asked() == [(Opcode.RDMA_WRITE_FIRST, False)] + [(Opcode.RDMA_WRITE_MIDDLE, False)] * 3 \
        + [(Opcode.RDMA_WRITE_MIDDLE, True)] + [(Opcode.RDMA_WRITE_MIDDLE, False)] * 2 \
        + [(Opcode.RDMA_WRITE_LAST, True)]  # fmt: skip
    assert a.req.stats["timeouts"] == a.req.stats["retransmits"] == 0


def test_nak_sequence_error_goes_back_n() -> None:
    wire = Wire()
    a, b = pair(wire)
    data = fill(a, 256 * 10, 3)
    dropped: list[int] = []

    def drop_psn_3(dst: End, pkt: bytes) -> bool:
        if dst is b and pkt[0] == Opcode.RDMA_WRITE_MIDDLE and not dropped:
            psn = int.from_bytes(pkt[9:12], "big")
            if psn == (a.psn + 3) & U24:
                dropped.append(psn)
                return False
        return True

    wire.filter = drop_psn_3
    a.post(write_wr(a, b, 0, 256 * 10, 1), 0.0)
    wire.run((a, b), lambda: bool(a.send_wcs))
    assert a.send_wcs[0].status is WcStatus.SUCCESS
    assert bytes(b.rmb.buf[: 256 * 10]) == data
    assert b.resp.stats["seq_naks"] == 1  # one NAK for the gap, the rest dropped silently
    assert a.req.stats["naks"] == 1 and a.req.stats["timeouts"] == 0
    assert a.req.stats["retransmits"] == 7  # PSNs 3..9 again


def _overwhelmed(wire: Wire, dst: End, queue: int) -> list[int]:
    """Make ``dst`` a receiver that drops every burst of more than ``queue`` packets whole
    (an emulated guest whose ring overflows); returns the list of burst sizes offered."""
    bursts: list[int] = []
    step = wire.step

    def burst(ends: tuple[End, End]) -> bool:
        n = sum(1 for to, _ in wire.flight if to is dst)
        if n:
            bursts.append(n)
        wire.filter = (lambda to, _pkt: to is not dst) if n > queue else None
        return step(ends)

    wire.step = burst  # type: ignore[method-assign]
    return bursts


def test_a_receiver_that_takes_nothing_is_not_flooded_by_go_back_n() -> None:
    """A full window per timeout is what flooded an emulated rxe guest (1.9 million packets
    for 2 MiB): after a second timeout in a row with nothing acknowledged the requester
    resends a few PSNs and opens the window by what they get acknowledged, so the bytes
    arrive, in a number of packets and timeouts bounded by the message's size."""
    wire = Wire()
    a, b = pair(wire)
    data = fill(a, 60000, 21)
    bursts = _overwhelmed(wire, b, 16)
    a.post(write_wr(a, b, 0, 60000, 1), 0.0)
    wire.run((a, b), lambda: bool(a.send_wcs), max_steps=20000)
    assert a.send_wcs[0].status is WcStatus.SUCCESS
    assert bytes(b.rmb.buf[:60000]) == data
    needed = -(-60000 // 256)
    assert a.req.stats["restarts"] > 0
    assert a.req.stats["timeouts"] < needed // 2, a.req.stats
    assert sum(bursts) < 10 * needed, (sum(bursts), a.req.stats)


def test_an_ack_for_what_was_sent_before_a_restart_is_taken() -> None:
    """Two timeouts in a row (the responder had it all, its ACKs were lost): the second
    go-back resends :data:`MIN_CWND` PSNs, and the responder's ACK of everything, beyond
    what that go-back sent, completes the WRITE at once and opens the window."""
    wire = Wire()
    a, b = pair(wire)
    data = fill(a, 256 * 40, 22)
    lost: list[bytes] = []

    def lose_two_acks(dst: End, pkt: bytes) -> bool:
        if dst is a and len(lost) < 2:
            lost.append(pkt)
            return False
        return True

    wire.filter = lose_two_acks
    a.post(write_wr(a, b, 0, 256 * 40, 1), 0.0)
    wire.run((a, b), lambda: bool(a.send_wcs))
    assert a.send_wcs[0].status is WcStatus.SUCCESS
    assert bytes(b.rmb.buf[: 256 * 40]) == data
    assert a.req.stats["timeouts"] == 2 and a.req.stats["restarts"] == 1
    assert a.req.stats["retransmits"] == 40 + MIN_CWND  # all of it, then the restart's few
    assert a.req.cwnd == 40 + MIN_CWND  # opened by the 40 PSNs the last ACK covered


def test_one_timeout_or_nak_keeps_the_whole_window() -> None:
    wire = Wire()
    a, b = pair(wire)
    fill(a, 256 * 40, 24)
    lost: list[bytes] = []

    def lose_a_middle_then_an_ack(dst: End, pkt: bytes) -> bool:
        if dst is b and not lost and pkt[0] == Opcode.RDMA_WRITE_MIDDLE:
            lost.append(pkt)
            return False
        if dst is a and len(lost) == 1 and len(a.send_wcs) == 1:
            lost.append(pkt)
            return False
        return True

    wire.filter = lose_a_middle_then_an_ack
    a.post(write_wr(a, b, 0, 256 * 40, 1), 0.0)
    wire.run((a, b), lambda: bool(a.send_wcs))
    a.post(write_wr(a, b, 0, 256 * 40, 2), wire.now)
    wire.run((a, b), lambda: len(a.send_wcs) == 2)
    assert len(lost) == 2
    assert a.req.stats["naks"] == 1 and a.req.stats["timeouts"] == 1
    assert a.req.stats["restarts"] == 0 and a.req.cwnd >= a.req.window


def test_the_window_opens_again_after_a_restart() -> None:
    wire = Wire(loss=1.0)  # a black hole for two timeouts
    a, b = pair(wire)
    fill(a, 256 * 256, 23)
    a.post(write_wr(a, b, 0, 256 * 256, 1), 0.0)
    while a.req.stats["timeouts"] < 2:
        wire.step((a, b))
    assert a.req.cwnd == MIN_CWND
    wire.loss = 0.0
    wire.run((a, b), lambda: bool(a.send_wcs))
    assert a.send_wcs[0].status is WcStatus.SUCCESS
    assert a.req.cwnd == a.req.window and a.req.stats["restarts"] == 1


def test_duplicate_send_is_acked_not_applied_twice() -> None:
    wire = Wire()
    a, b = pair(wire)
    fill(a, 100, 4)
    b.post_recv(1)
    b.post_recv(2, off=4096)
    captured: list[bytes] = []

    def capture(dst: End, pkt: bytes) -> bool:
        if dst is b:
            captured.append(pkt)
        return True

    wire.filter = capture
    a.post(send_wr(a, 0, 100, 1), 0.0)
    wire.run((a, b), lambda: bool(a.send_wcs))
    acks_before = b.resp.stats["acks"]
    b.deliver(captured[0], wire.now)  # the same SEND again, as a retransmission would
    b.resp.flush()
    assert len(b.recv_wcs) == 1 and len(b.resp.rq) == 1
    assert b.resp.stats["duplicates"] == 1 and b.resp.stats["acks"] == acks_before + 1


def test_rnr_nak_waits_then_delivers() -> None:
    wire = Wire()
    a, b = pair(wire, min_rnr_timer=14)  # 1.28 ms
    fill(a, 50, 5)
    a.post(send_wr(a, 0, 50, 1), 0.0)
    for _ in range(2):  # the SEND out, the RNR NAK back
        wire.step((a, b))
    assert a.req.stats["rnr"] == 1 and a.req.rnr_until == pytest.approx(0.00128)
    b.post_recv(9)
    wire.run((a, b), lambda: bool(a.send_wcs))
    assert a.send_wcs[0].status is WcStatus.SUCCESS
    assert b.recv_wcs[0].wr_id == 9 and wire.now >= 0.00128
    assert a.req.stats["restarts"] == 0  # the receiver's queue, not the path


def test_rnr_retry_exhausted() -> None:
    wire = Wire()
    a, b = pair(wire, rnr_retry=2, min_rnr_timer=1)
    fill(a, 50, 6)
    a.post(send_wr(a, 0, 50, 1), 0.0)
    a.post(send_wr(a, 0, 50, 2), 0.0)
    wire.run((a, b), lambda: bool(a.fatal))
    assert a.send_wcs[0].status is WcStatus.RNR_RETRY_EXC_ERR
    assert a.req.stats["rnr"] == 3  # the first try and two retries
    assert [w.wr.wr_id for w in a.req.wqes] == [2]  # left for the host to flush


@pytest.mark.parametrize("retry_cnt", [0, 3, 6])
def test_retry_exceeded_after_exactly_retry_cnt_plus_one_periods(retry_cnt: int) -> None:
    wire = Wire(loss=1.0)  # a black hole
    a, b = pair(wire, timeout=14, retry_cnt=retry_cnt)
    fill(a, 10, 7)
    a.post(write_wr(a, b, 0, 10, 1), 0.0)
    wire.run((a, b), lambda: bool(a.fatal))
    assert a.send_wcs[0].status is WcStatus.RETRY_EXC_ERR
    period = local_ack_timeout(14)
    assert period is not None
    assert wire.now == pytest.approx((retry_cnt + 1) * period)
    assert a.req.stats["timeouts"] == retry_cnt + 1


def test_retry_cnt_seven_is_infinite() -> None:
    wire = Wire(loss=1.0)
    a, b = pair(wire, timeout=8, retry_cnt=7)
    a.post(write_wr(a, b, 0, 10, 1), 0.0)
    for _ in range(200):
        wire.step((a, b))
    assert not a.fatal and a.req.stats["timeouts"] > 50


def test_partial_read_retry_replays_from_middle() -> None:
    wire = Wire()
    a, b = pair(wire)
    data = random.Random(8).randbytes(256 * 6)
    b.rmb.buf[: len(data)] = data
    dropped: list[int] = []
    seen: list[tuple[int, int]] = []

    def drop_third_response(dst: End, pkt: bytes) -> bool:
        psn = int.from_bytes(pkt[9:12], "big")
        if dst is a and 0x0D <= pkt[0] <= 0x10:
            seen.append((pkt[0], psn))
            if psn == (a.psn + 2) & U24 and not dropped:
                dropped.append(psn)
                return False
        return True

    wire.filter = drop_third_response
    a.post(read_wr(a, b, 0, len(data), 1, loff=0), 0.0)
    wire.run((a, b), lambda: bool(a.send_wcs))
    assert a.send_wcs[0].status is WcStatus.SUCCESS
    assert bytes(a.buf.buf[: len(data)]) == data
    # the re-read starts at the lost PSN, answered from a Middle packet (spec §5.6)
    replay = seen[6:]
    assert replay[0] == (Opcode.RDMA_READ_RESPONSE_MIDDLE, (a.psn + 2) & U24)
    assert replay[-1][0] == Opcode.RDMA_READ_RESPONSE_LAST


@pytest.mark.parametrize("case", ["rkey", "below", "above", "no_remote_write"])
def test_memory_checks_before_any_byte(case: str) -> None:
    wire = Wire()
    a, b = pair(wire)
    fill(a, 2000, 9)
    b.rmb.buf[:] = b"\xaa" * len(b.rmb.buf)
    if case == "no_remote_write":
        b.rmb.access_bits &= ~2
    off, rkey = {"rkey": (0, b.rmb.rkey ^ 1), "below": (-8, None),
                 "above": ((1 << 16) - 1000, None), "no_remote_write": (0, None)}[case]
    a.post(write_wr(a, b, off, 2000, 1, rkey=rkey), 0.0)
    a.post(write_wr(a, b, 0, 10, 2), 0.0)
    wire.run((a, b), lambda: bool(a.fatal) and bool(b.fatal))
    assert a.send_wcs[0].status is WcStatus.REM_ACCESS_ERR
    assert bytes(b.rmb.buf) == b"\xaa" * len(b.rmb.buf)
    assert b.resp.dead


def test_qp_without_remote_write_access_is_invalid_request() -> None:
    wire = Wire()
    a, b = pair(wire)
    b.resp.access = 0
    a.post(write_wr(a, b, 0, 10, 1), 0.0)
    wire.run((a, b), lambda: bool(a.fatal))
    assert a.send_wcs[0].status is WcStatus.REM_INV_REQ_ERR


def test_send_longer_than_receive_buffer() -> None:
    wire = Wire()
    a, b = pair(wire)
    fill(a, 600, 10)
    b.post_recv(1, size=300)
    a.post(send_wr(a, 0, 600, 1), 0.0)
    wire.run((a, b), lambda: bool(a.fatal) and bool(b.fatal))
    assert a.send_wcs[0].status is WcStatus.REM_INV_REQ_ERR
    assert b.fatal[0] is not None and b.fatal[0].status is WcStatus.LOC_LEN_ERR


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32), loss=st.sampled_from([0.05, 0.2]),
       dup=st.sampled_from([0.0, 0.1]), reorder=st.sampled_from([0.0, 0.3]))
def test_random_loss_dup_reorder_every_byte_intact(
    seed: int, loss: float, dup: float, reorder: float
) -> None:
    wire = Wire(loss=loss, dup=dup, reorder=reorder, seed=seed)
    a, b = pair(wire, timeout=10)
    rng = random.Random(seed)
    data = fill(a, 30000, seed)
    b.rmb.buf[30000:40000] = rng.randbytes(10000)
    remote = bytes(b.rmb.buf[30000:40000])
    for i in range(6):
        b.post_recv(100 + i, off=i * 2048, size=2048)
    wrs = []
    for i in range(6):
        wrs.append(write_wr(a, b, i * 5000, 5000, 2 * i, loff=i * 5000))
        wrs.append(send_wr(a, i * 100, 1000 + i, 2 * i + 1))
    wrs.append(read_wr(a, b, 30000, 10000, 99, loff=40000))
    for wr in wrs:
        a.post(wr, 0.0)
    wire.run((a, b), lambda: len(a.send_wcs) == len(wrs), max_steps=200000)
    assert [w.wr_id for w in a.send_wcs] == [w.wr_id for w in wrs]
    assert all(w.status is WcStatus.SUCCESS for w in a.send_wcs)
    assert bytes(b.rmb.buf[:30000]) == data
    assert bytes(a.buf.buf[40000:50000]) == remote
    assert [(w.wr_id, w.byte_len) for w in b.recv_wcs] == [(100 + i, 1000 + i) for i in range(6)]
    for i in range(6):
        assert bytes(b.buf.buf[i * 2048 : i * 2048 + 1000 + i]) == data[i * 100 :][: 1000 + i]


def test_deregistered_during_a_write_stops_placement() -> None:
    wire = Wire()
    a, b = pair(wire)
    fill(a, 256 * 4, 11)

    def dereg_after_first(dst: End, pkt: bytes) -> bool:
        if dst is b and pkt[0] == Opcode.RDMA_WRITE_MIDDLE and b.rmb.valid:
            b.rmb.dereg()
        return True

    wire.filter = dereg_after_first
    a.post(write_wr(a, b, 0, 256 * 4, 1), 0.0)
    wire.run((a, b), lambda: bool(a.fatal))
    assert a.send_wcs[0].status is WcStatus.REM_ACCESS_ERR
    assert bytes(b.rmb.buf[256:1024]) == bytes(768)  # nothing after the deregistration


def hold_middles(wire: Wire, dst: End) -> list[bytes]:
    """Keep the WRITE Middles headed for ``dst`` off the wire; the list fills with them."""
    held: list[bytes] = []

    def hold(to: End, pkt: bytes) -> bool:
        if to is dst and pkt[0] == Opcode.RDMA_WRITE_MIDDLE:
            held.append(pkt)
            return False
        return True

    wire.filter = hold
    return held


def test_write_middle_shortcut_refuses_what_the_full_path_would() -> None:
    """The WRITE Middle shortcut only takes in-order packets of a live, accepted WRITE."""
    wire = Wire()
    a, b = pair(wire)
    fill(a, 256 * 4, 12)
    held = hold_middles(wire, b)
    a.post(write_wr(a, b, 0, 256 * 4, 1), 0.0)
    wire.step((a, b))
    assert len(held) == 2 and b.resp.epsn == (a.psn + 1) & U24
    word = int.from_bytes(held[1][8:12], "big")
    assert not b.resp.write_middle(word, memoryview(held[1]))  # out of order
    b.resp.dead = True  # as after a fatal error
    word = int.from_bytes(held[0][8:12], "big")
    assert not b.resp.write_middle(word, memoryview(held[0]))
    b.resp.dead = False
    tver = bytearray(held[0])
    tver[1] |= 1
    assert not b.resp.write_middle(word, memoryview(tver))
    assert b.resp.write_middle(word, memoryview(held[0]))
    assert bytes(b.rmb.buf[256:512]) == bytes(a.buf.buf[256:512])


def test_middle_target_offers_only_what_write_middle_would_take() -> None:
    """The receive path's batch form of the shortcut (``middle_target`` and
    ``middles_placed``) sees the same WRITE state: where the next Middle goes, how
    many Middles may still come before the Last, none once the QP or MR is dead."""
    wire = Wire()
    a, b = pair(wire)
    fill(a, 256 * 5, 13)
    assert b.resp.middle_target() is None  # no WRITE in progress
    held = hold_middles(wire, b)
    a.post(write_wr(a, b, 0, 256 * 5, 1), 0.0)
    wire.step((a, b))
    assert len(held) == 3
    target = b.resp.middle_target()
    assert target is not None
    buf, off, count = target
    assert buf.obj is b.rmb.buf.obj and off == 256 and count == 3  # 3 Middles, then the Last
    b.resp.dead = True
    assert b.resp.middle_target() is None
    b.resp.dead = False
    # place two Middles as the device would, the third through the shortcut
    for k in (0, 1):
        buf[off + 256 * k : off + 256 * (k + 1)] = held[k][12:]
    b.resp.middles_placed(2, -1)
    assert b.resp.epsn == (a.psn + 3) & U24
    assert b.resp.middle_target() == (buf, off + 512, 1)
    word = int.from_bytes(held[2][8:12], "big")
    assert b.resp.write_middle(word, memoryview(held[2]))
    assert b.resp.middle_target() == (buf, off + 768, 0)  # only the Last may come now
    b.rmb.dereg()
    assert b.resp.middle_target() is None
