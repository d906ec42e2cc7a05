"""Marks (``smcr.rdma.shm.cq``): a poll of a CQ that many QPs share looks only at the QPs
whose requesters placed work in them, and never misses a SEND.

Why it matters: a runtime has one CQ for every link group, so a server with a thousand
peers (or a thousand first contacts that never finish) ran a thousand receive-area looks
per poll. Every wait here is bounded: a lost wake-up fails the test instead of hanging it.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from smcr.rdma import (
    AccessFlag,
    CompletionQueue,
    MemoryRegion,
    QpCap,
    RecvWr,
    SendFlag,
    SendWr,
    Sge,
    WcStatus,
    WrOpcode,
)
from smcr.rdma.shm import ShmDevice, ShmQp
from smcr.rdma.shm import peer as shm_peer
from smcr.rdma.shm.cq import FEW, MARKS, MAX_MARKS, ShmCompletionQueue

DEPTH = 2048
WAIT = 10.0  # per wait; only a lost wake-up comes near it


@dataclass
class Fan:
    """QPs of one receiving device on one CQ, each connected to a QP of a sending device."""

    rx: ShmDevice
    cq: ShmCompletionQueue
    rx_qps: list[ShmQp]
    rx_buf: MemoryRegion
    tx: ShmDevice
    tx_qps: list[ShmQp]
    tx_buf: MemoryRegion


def _fan(directory: Path, n: int) -> Fan:
    rx, tx = ShmDevice("rx", directory=directory), ShmDevice("tx", directory=directory)
    rx_pd, tx_pd = rx.alloc_pd(), tx.alloc_pd()
    cq, tx_cq = rx.create_cq(1 << 16), tx.create_cq(1 << 16)
    assert isinstance(cq, ShmCompletionQueue)
    cap = QpCap(max_send_wr=DEPTH, max_recv_wr=DEPTH)
    rx_qps = [rx_pd.create_qp(cq, cq, cap) for _ in range(n)]
    tx_qps = [tx_pd.create_qp(tx_cq, tx_cq, cap) for _ in range(n)]
    for a, b in zip(rx_qps, tx_qps, strict=True):
        a.to_rts(dgid=tx.gid, dest_qp_num=b.qp_num, rq_psn=7, sq_psn=9, access=AccessFlag(0))
        b.to_rts(dgid=rx.gid, dest_qp_num=a.qp_num, rq_psn=9, sq_psn=7, access=AccessFlag(0))
    rx_buf = rx_pd.alloc_mr(64 * DEPTH, AccessFlag.LOCAL_WRITE)
    tx_buf = tx_pd.alloc_mr(4096, AccessFlag.LOCAL_WRITE)
    return Fan(rx, cq, rx_qps, rx_buf, tx, tx_qps, tx_buf)


@pytest.fixture
def fan_of(shm_dir: Path) -> Iterator[list[Fan]]:
    made: list[Fan] = []
    yield made
    for fan in made:
        fan.tx.close()
        fan.rx.close()


def _post_recvs(fan: Fan, qp: ShmQp, count: int) -> None:
    qp.post_recv([RecvWr(wr_id=i, sg_list=(Sge(fan.rx_buf.addr + 64 * i, 64, fan.rx_buf.lkey),))
                  for i in range(count)])  # fmt: skip


def _send(fan: Fan, qp: ShmQp, wr_id: int) -> None:
    sge = Sge(fan.tx_buf.addr, 16, fan.tx_buf.lkey)
    qp.post_send(SendWr(wr_id=wr_id, opcode=WrOpcode.SEND, sg_list=(sge,),
                        send_flags=SendFlag.NONE))  # fmt: skip


def _marks_set(cq: ShmCompletionQueue) -> int:
    return bytes(cq._notify[MARKS : cq._marks_end]).count(1)


def test_a_poll_looks_only_at_the_qps_with_work(shm_dir: Path, fan_of: list[Fan]) -> None:
    fan = _fan(shm_dir, 40)  # (more than FEW: a poll goes by the marks)
    fan_of.append(fan)
    cq = fan.cq
    assert cq._progress == []  # no QP is looked at by every poll: all their requesters mark
    for qp in fan.rx_qps:
        _post_recvs(fan, qp, 2)
    cq.poll()
    assert _marks_set(cq) == 0
    _send(fan, fan.tx_qps[7], 1)
    _send(fan, fan.tx_qps[31], 2)
    assert _marks_set(cq) == 2  # the two QPs with work, and no other
    wcs = cq.poll()
    assert sorted(wc.qp_num for wc in wcs) == sorted(fan.rx_qps[i].qp_num for i in (7, 31))
    assert all(wc.status is WcStatus.SUCCESS for wc in wcs)
    assert _marks_set(cq) == 0
    fan.rx_qps[7].destroy()  # its mark goes back; the others keep working
    _send(fan, fan.tx_qps[8], 3)
    assert [wc.qp_num for wc in cq.poll()] == [fan.rx_qps[8].qp_num]


def test_a_requester_that_does_not_mark_is_still_heard(
    shm_dir: Path, fan_of: list[Fan], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A requester whose hello asks for no mark (an smcr before marks) gets none, and its
    QP is looked at by every poll, as before."""
    monkeypatch.setattr(shm_peer, "HELLO_FLAGS", 0)
    fan = _fan(shm_dir, 5)
    fan_of.append(fan)
    assert len(fan.cq._progress) == 5
    for i, qp in enumerate(fan.rx_qps):
        _post_recvs(fan, qp, 1)
        _send(fan, fan.tx_qps[i], i)
    assert sorted(wc.qp_num for wc in fan.cq.poll(16)) == sorted(q.qp_num for q in fan.rx_qps)
    assert _marks_set(fan.cq) == 0


@pytest.mark.parametrize("qps", [FEW, 8], ids=["few-looked-at-each", "marks"])
def test_many_senders_to_one_sleeping_cq_lose_no_send(
    shm_dir: Path, fan_of: list[Fan], qps: int
) -> None:
    """Threads send on their own QPs, with pauses, to one CQ whose consumer arms and
    sleeps whenever it finds nothing: every SEND arrives, in order per QP."""
    rounds = 1500
    fan = _fan(shm_dir, qps)
    fan_of.append(fan)
    for qp in fan.rx_qps:
        _post_recvs(fan, qp, rounds)
    errors: list[BaseException] = []

    def sender(qp: ShmQp, seed: int) -> None:
        rng = random.Random(seed)
        try:
            for i in range(rounds):
                _send(fan, qp, i)
                if rng.random() < 0.05:
                    time.sleep(rng.random() * 0.001)  # the consumer goes to sleep meanwhile
        except BaseException as exc:  # (reported by the test)
            errors.append(exc)

    threads = [threading.Thread(target=sender, args=(qp, i)) for i, qp in enumerate(fan.tx_qps)]
    for t in threads:
        t.start()
    got: dict[int, list[int]] = {qp.qp_num: [] for qp in fan.rx_qps}
    cq: CompletionQueue = fan.cq
    total = 0
    while total < qps * rounds:
        wcs = cq.wait(WAIT, 256)
        assert wcs, f"no completion in {WAIT} s after {total}: a lost wake-up"
        for wc in wcs:
            assert wc.status is WcStatus.SUCCESS
            got[wc.qp_num].append(wc.wr_id)
        total += len(wcs)
    for t in threads:
        t.join()
    assert not errors
    assert all(ids == list(range(rounds)) for ids in got.values())


def test_when_the_marks_run_out_a_qp_is_looked_at_by_every_poll() -> None:
    """The mark bytes end where the watch words begin (:mod:`smcr.rdma.bells`): past the
    last one a QP gets no mark (0: its requester does not mark) and is among the hooks every
    poll runs, rather than looked at by none."""
    cq = ShmCompletionQueue(16)
    try:
        ran: list[str] = []

        def last() -> None:
            ran.append("last")

        def beyond() -> None:
            ran.append("beyond")

        cq._marks_end = MARKS + MAX_MARKS - 1  # (as after 65,535 QPs, without making them)
        assert cq.take_mark(last) == MARKS + MAX_MARKS - 1
        assert cq.take_mark(beyond) == 0
        for _ in range(3):
            ran.clear()
            cq.poll(1)
            assert "beyond" in ran
    finally:
        cq.close()
