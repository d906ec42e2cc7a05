"""The provider-independent model: enum values, the QP state table, keys, CQ, PSNs."""

from __future__ import annotations

import errno
import itertools
import os
import select
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from smcr.rdma import (
    TRANSITIONS,
    AccessFlag,
    AhAttr,
    CompletionQueue,
    KeyAllocator,
    PathMtu,
    QpAttr,
    QpAttrMask,
    QpState,
    VerbsError,
    WcOpcode,
    WcStatus,
    WorkCompletion,
    WrOpcode,
    check_modify,
    ipv4_mapped_gid,
    local_ack_timeout,
    psn_add,
    psn_diff,
    rc_bring_up,
    transition_masks,
)
from smcr.rdma.base import scatter
from smcr.rdma.verbs import RNR_TIMER_SECONDS

M = QpAttrMask


def test_values_match_libibverbs() -> None:
    """Spot values from spec §7-§8, so traces and pyverbs read the same numbers."""
    assert [s.value for s in QpState] == [0, 1, 2, 3, 4, 5, 6]
    assert WcStatus.WR_FLUSH_ERR.value == 5
    assert WcStatus.REM_ACCESS_ERR.value == 10
    assert WcStatus.RETRY_EXC_ERR.value == 12
    assert WcStatus.RNR_RETRY_EXC_ERR.value == 13
    assert WcOpcode.RECV.value == 128 and WcOpcode.RECV_RDMA_WITH_IMM.value == 129
    assert [int(WrOpcode.RDMA_WRITE), int(WrOpcode.SEND), int(WrOpcode.RDMA_READ)] == [0, 2, 4]
    assert int(AccessFlag.REMOTE_READ) == 4 and M.DEST_QPN == 1 << 20 and M.MIN_RNR_TIMER == 1 << 15
    assert PathMtu.MTU_4096.nbytes == 4096 and PathMtu.MTU_256.nbytes == 256
    assert RNR_TIMER_SECONDS[0] == pytest.approx(0.65536)
    assert RNR_TIMER_SECONDS[5] == pytest.approx(60e-6)
    assert local_ack_timeout(0) is None
    assert local_ack_timeout(15) == pytest.approx(0.134, rel=0.01)
    assert ipv4_mapped_gid(bytes([10, 0, 0, 1])).hex() == "00000000000000000000ffff0a000001"


@given(st.integers(0, 2**24 - 1), st.integers(-(2**23) + 1, 2**23 - 1))
def test_psn_arithmetic_wraps_at_24_bits(a: int, n: int) -> None:
    """PSNs compare as a signed 24-bit difference (spec §5.1)."""
    b = psn_add(a, n)
    assert 0 <= b < 2**24
    assert psn_diff(b, a) == n


def _full_mask(cur: QpState, new: QpState) -> QpAttrMask:
    masks = transition_masks(cur, new)
    assert masks is not None
    return masks[0]


def test_state_table_every_pair() -> None:
    """Every (state, state) pair: legal ones pass with their required mask, others raise."""
    attr_for = QpAttr(ah_attr=AhAttr(dgid=bytes(16)), path_mtu=PathMtu.MTU_1024)
    for cur, new in itertools.product(QpState, QpState):
        attr_for.qp_state = new
        masks = transition_masks(cur, new)
        if masks is None:
            with pytest.raises(VerbsError) as exc:
                check_modify(cur, attr_for, M.STATE, PathMtu.MTU_4096)
            assert exc.value.errno == errno.EINVAL
            continue
        assert check_modify(cur, attr_for, masks[0], PathMtu.MTU_4096) is new
        for bit in QpAttrMask(masks[0] & ~M.STATE):
            with pytest.raises(VerbsError):
                check_modify(cur, attr_for, masks[0] & ~bit, PathMtu.MTU_4096)
    assert (QpState.INIT, QpState.RTR) in TRANSITIONS
    assert transition_masks(QpState.RTS, QpState.RTR) is None


def test_modify_refuses_extra_bits_and_bad_values() -> None:
    """A bit outside required|optional, and values beyond their widths, are EINVAL."""
    attr = QpAttr(qp_state=QpState.INIT)
    with pytest.raises(VerbsError, match="does not take"):
        check_modify(QpState.RESET, attr, _full_mask(QpState.RESET, QpState.INIT) | M.TIMEOUT,
                     PathMtu.MTU_4096)  # fmt: skip
    rts = QpAttr(qp_state=QpState.RTS, timeout=32)
    with pytest.raises(VerbsError, match="timeout"):
        check_modify(QpState.RTR, rts, _full_mask(QpState.RTR, QpState.RTS), PathMtu.MTU_4096)
    rtr = QpAttr(qp_state=QpState.RTR, path_mtu=PathMtu.MTU_4096, dest_qp_num=1 << 24)
    with pytest.raises(VerbsError, match="dest_qp_num"):
        check_modify(QpState.INIT, rtr, _full_mask(QpState.INIT, QpState.RTR), PathMtu.MTU_4096)
    rtr.dest_qp_num = 5
    with pytest.raises(VerbsError, match="path_mtu"):
        check_modify(QpState.INIT, rtr, _full_mask(QpState.INIT, QpState.RTR), PathMtu.MTU_1024)


def test_bring_up_sequence_is_legal() -> None:
    """The helper's three modifies pass the table in order, with Linux SMC-R values."""
    state = QpState.RESET
    steps = rc_bring_up(dgid=bytes(16), dest_qp_num=7, rq_psn=1, sq_psn=2,
                        access=AccessFlag.LOCAL_WRITE)  # fmt: skip
    for attr, mask in steps:
        state = check_modify(state, attr, mask, PathMtu.MTU_4096)
    assert state is QpState.RTS
    assert steps[2][0].timeout == 15 and steps[2][0].rnr_retry == 7
    assert steps[1][0].min_rnr_timer == 5


def test_keys_unique_while_live() -> None:
    """Keys are never 0 and never repeat while live; released keys may come back."""
    keys = KeyAllocator()
    drawn = {keys.new_key() for _ in range(5000)}
    assert len(drawn) == 5000 and 0 not in drawn
    k = next(iter(drawn))
    assert keys.is_live(k)
    keys.release(k)
    assert not keys.is_live(k)


def _wc(i: int) -> WorkCompletion:
    return WorkCompletion(wr_id=i, status=WcStatus.SUCCESS, opcode=WcOpcode.SEND, qp_num=1)


def test_cq_poll_order_and_wait_timeout() -> None:
    """FIFO order, max_entries honoured, and wait returns [] after its timeout."""
    cq = CompletionQueue(16)
    try:
        cq.push_many(_wc(i) for i in range(5))
        assert [w.wr_id for w in cq.poll(3)] == [0, 1, 2]
        assert [w.wr_id for w in cq.poll()] == [3, 4]
        t = time.monotonic()
        assert cq.wait(0.05) == []
        assert 0.04 < time.monotonic() - t < 1.0
    finally:
        cq.close()


def test_cq_fileno_wakes_a_sleeper() -> None:
    """A thread sleeping in wait() wakes on a push; an armed fileno is selectable."""
    cq = CompletionQueue(16)
    try:
        timer = threading.Timer(0.05, cq.push, args=(_wc(9),))
        timer.start()
        t = time.monotonic()
        got = cq.wait(2.0)
        assert [w.wr_id for w in got] == [9] and time.monotonic() - t < 1.0
        timer.join()
        cq.req_notify()
        cq.push(_wc(10))
        ready, _, _ = select.select([cq.fileno()], [], [], 1.0)
        assert ready == [cq.fileno()]
        assert os.read(cq.fileno(), 64)
        assert [w.wr_id for w in cq.poll()] == [10]
    finally:
        cq.close()


def test_scatter_places_a_message_across_the_sges_at_any_offset() -> None:
    """One scatter copy for every RNIC: a receive's or a READ's SGEs, a packet at a time."""
    message = bytes(range(1, 21))
    for sizes in ((20,), (3, 0, 7, 10), (1,) * 20):
        for cut in (0, 1, 5, 13, 20):
            bufs = [bytearray(n) for n in sizes]
            views = [memoryview(b) for b in bufs]
            scatter(views, 0, memoryview(message)[:cut])  # the first packet...
            scatter(views, cut, memoryview(message)[cut:])  # ...and the rest at its offset
            assert b"".join(bufs) == message, (sizes, cut)
    bufs = [bytearray(4), bytearray(4)]
    scatter([memoryview(b) for b in bufs], 2, memoryview(b"abc"))  # room left unwritten
    assert bufs == [bytearray(b"\0\0ab"), bytearray(b"c\0\0\0")]
