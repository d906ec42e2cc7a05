"""Inline WRs and the fused data-path batch (``post_writes_send``) on the shm RNIC.

What the SMC-R data path relies on: an inline WRITE reads the caller's buffer
while ``post_send`` runs (the buffer is free again when it returns, even if
the WR has to wait), the limits are enforced as ibverbs enforces them, and the
fused batch behaves exactly like the WRs it stands for -- including every
error, which it leaves to the general path before a byte has moved.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from pathlib import Path

import pytest

from smcr.rdma import (
    QpCap,
    QpState,
    RecvWr,
    SendFlag,
    SendWr,
    Sge,
    VerbsError,
    WcOpcode,
    WcStatus,
    WrOpcode,
)
from smcr.rdma.base import QueuePair
from tests.rdma.rdma_helpers import Side, connect, make_side

INLINE_CAP = QpCap(max_inline_data=4096)
INL = SendFlag.INLINE


@pytest.fixture
def ipair(shm_dir: Path) -> Iterator[tuple[Side, Side]]:
    """Two connected sides whose QPs take up to 4 KiB inline."""
    a = make_side(shm_dir, "a", 0x10, cap=INLINE_CAP)
    b = make_side(shm_dir, "b", 0x20, cap=INLINE_CAP)
    connect(a, b)
    yield a, b
    a.dev.close()
    b.dev.close()


def post_recv(side: Side, wr_id: int, length: int = 64, off: int = 0) -> None:
    side.qp.post_recv(RecvWr(wr_id=wr_id, sg_list=(Sge(side.buf.addr + off, length,
                                                       side.buf.lkey),)))  # fmt: skip


def inline_write(src: Side, dst: Side, off: int, data: bytearray | bytes, wr_id: int = 1,
                 flags: SendFlag = INL | SendFlag.SIGNALED) -> None:  # fmt: skip
    src.qp.post_send(SendWr(wr_id=wr_id, opcode=WrOpcode.RDMA_WRITE, send_flags=flags,
                            remote_addr=dst.rmb.addr + off, rkey=dst.rmb.rkey,
                            inline_data=data))  # fmt: skip


def test_device_advertises_inline_and_refuses_more(shm_dir: Path) -> None:
    side = make_side(shm_dir, "a", 1)
    try:
        limit = side.dev.attr.max_inline_data
        assert limit >= 1 << 20
        with pytest.raises(VerbsError) as exc:
            side.pd.create_qp(side.cq, side.cq, QpCap(max_inline_data=limit + 1))
        assert exc.value.errno == errno.EINVAL
    finally:
        side.dev.close()


def test_inline_write_lands_and_buffer_is_free_on_return(ipair: tuple[Side, Side]) -> None:
    a, b = ipair
    data = bytearray(b"inline payload!!")
    inline_write(a, b, 100, data)
    data[:] = b"X" * len(data)  # the caller reuses its buffer at once
    (wc,) = a.wait()
    assert (wc.status, wc.opcode, wc.byte_len) == (WcStatus.SUCCESS, WcOpcode.RDMA_WRITE, 16)
    assert bytes(b.rmb.buf[100:116]) == b"inline payload!!"


def test_inline_limits_and_misuse(ipair: tuple[Side, Side]) -> None:
    a, b = ipair
    cases = [
        SendWr(wr_id=1, opcode=WrOpcode.RDMA_WRITE, send_flags=INL, rkey=b.rmb.rkey,
               remote_addr=b.rmb.addr, inline_data=bytes(4097)),  # above max_inline_data
        SendWr(wr_id=2, opcode=WrOpcode.RDMA_WRITE, rkey=b.rmb.rkey,
               remote_addr=b.rmb.addr, inline_data=b"no flag"),
        SendWr(wr_id=3, opcode=WrOpcode.RDMA_WRITE, send_flags=INL, rkey=b.rmb.rkey,
               remote_addr=b.rmb.addr),  # the flag without data
        SendWr(wr_id=4, opcode=WrOpcode.RDMA_READ, send_flags=INL, rkey=b.rmb.rkey,
               remote_addr=b.rmb.addr, inline_data=b"read"),
    ]  # fmt: skip
    for wr in cases:
        with pytest.raises(VerbsError) as exc:
            a.qp.post_send(wr)
        assert exc.value.errno == errno.EINVAL, wr
    assert a.qp.state is QpState.RTS  # refused at post: nothing happened
    assert bytes(b.rmb.buf[:8]) == bytes(8)


def test_inline_send_waiting_for_a_receive_keeps_posted_bytes(ipair: tuple[Side, Side]) -> None:
    """RNR: the WR waits in the send queue, yet the caller's buffer is already free."""
    a, b = ipair
    data = bytearray(b"first words")
    a.qp.post_send(SendWr(wr_id=7, opcode=WrOpcode.SEND, send_flags=INL | SendFlag.SIGNALED,
                          inline_data=memoryview(data)))  # fmt: skip
    data[:] = b"overwritten"
    assert a.cq.wait(0.05) == []  # no receive yet: waiting
    post_recv(b, 1)
    assert a.wait()[0].status is WcStatus.SUCCESS
    (rwc,) = b.wait()
    assert bytes(b.buf.buf[: rwc.byte_len]) == b"first words"


def test_non_byte_views_are_taken_as_bytes(ipair: tuple[Side, Side]) -> None:
    a, b = ipair
    words = memoryview(bytearray(range(16))).cast("I")  # four 4-byte items
    inline_write(a, b, 0, words)  # type: ignore[arg-type]
    assert a.wait()[0].byte_len == 16
    assert bytes(b.rmb.buf[:16]) == bytes(range(16))


@pytest.mark.parametrize("fused", [True, False], ids=["shm-fused", "generic-wrs"])
def test_writes_then_send_batch(ipair: tuple[Side, Side], fused: bool) -> None:
    """Two WRITEs then a SEND: the bytes are in place before the SEND completes at the peer;
    the fused provider path and the base class's WR-building default agree."""
    a, b = ipair
    post_recv(b, 11)
    writes = [(b.rmb.addr + 60_000, b.rmb.rkey, memoryview(b"wrap-end")),
              (b.rmb.addr, b.rmb.rkey, memoryview(b"start"))]  # fmt: skip
    post = a.qp.post_writes_send if fused else QueuePair.post_writes_send.__get__(a.qp)
    post(writes, b"the CDC", 99, True)
    (wc,) = a.wait()
    assert (wc.wr_id, wc.status, wc.opcode, wc.byte_len) == (99, WcStatus.SUCCESS,
                                                             WcOpcode.SEND, 7)  # fmt: skip
    (rwc,) = b.wait()
    assert (rwc.wr_id, rwc.status, rwc.byte_len) == (11, WcStatus.SUCCESS, 7)
    assert bytes(b.buf.buf[:7]) == b"the CDC"
    assert bytes(b.rmb.buf[60_000:60_008]) == b"wrap-end"
    assert bytes(b.rmb.buf[:5]) == b"start"
    # PSNs advanced as for three WRs: the next ordinary SEND is still accepted
    post_recv(b, 12)
    post(writes[:0], b"next", 100, True)
    assert a.wait()[0].status is WcStatus.SUCCESS
    assert b.wait()[0].wr_id == 12


def test_batch_unsignaled_is_silent(ipair: tuple[Side, Side]) -> None:
    a, b = ipair
    post_recv(b, 1)
    a.qp.post_writes_send([(b.rmb.addr, b.rmb.rkey, memoryview(b"x"))], b"cdc", 5, False)
    assert b.wait()[0].status is WcStatus.SUCCESS
    assert a.cq.poll() == []
    assert bytes(b.rmb.buf[:1]) == b"x"


@pytest.mark.parametrize("case", ["bad_rkey", "out_of_bounds"])
def test_batch_protection_fault_moves_nothing(ipair: tuple[Side, Side], case: str) -> None:
    """A bad WRITE in the batch: what the WRs posted one by one give -- the WRITE before it
    lands, the bad one places nothing (REM_ACCESS_ERR), the SEND is flushed, both QPs ERR."""
    a, b = ipair
    b.rmb.buf[:] = b"\x11" * b.rmb.length
    post_recv(b, 1)
    rkey = b.rmb.rkey ^ 0x5A5A if case == "bad_rkey" else b.rmb.rkey
    addr = b.rmb.addr + (b.rmb.length - 4 if case == "out_of_bounds" else 0)
    good = (b.rmb.addr + 100, b.rmb.rkey, memoryview(b"good"))
    a.qp.post_writes_send([good, (addr, rkey, memoryview(b"bad bytes"))], b"cdc", 9, True)
    statuses = [wc.status for wc in a.wait(2)]
    assert statuses == [WcStatus.REM_ACCESS_ERR, WcStatus.WR_FLUSH_ERR]
    assert a.qp.state is QpState.ERR
    (rwc,) = b.wait()
    assert (rwc.wr_id, rwc.status) == (1, WcStatus.WR_FLUSH_ERR)
    assert bytes(b.rmb.buf[100:104]) == b"good"  # the first WRITE ran, as RC ordering says
    assert bytes(b.rmb.buf[b.rmb.length - 4 :]) == b"\x11" * 4


def test_batch_waits_for_a_receive(ipair: tuple[Side, Side]) -> None:
    """No receive posted: the batch waits (RNR) with the caller's buffers already copied."""
    a, b = ipair
    data = bytearray(b"payload")
    a.qp.post_writes_send([(b.rmb.addr, b.rmb.rkey, memoryview(data))], b"cdc", 3, True)
    data[:] = b"changed"
    assert a.cq.wait(0.05) == []
    post_recv(b, 1)
    assert a.wait()[0].status is WcStatus.SUCCESS
    assert b.wait()[0].byte_len == 3
    assert bytes(b.rmb.buf[:7]) == b"payload"
