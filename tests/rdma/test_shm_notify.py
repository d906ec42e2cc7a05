"""Doorbell suppression of the shm RNIC (``smcr.rdma.shm.cq``): rings only for an armed CQ.

The mechanism must never lose a wakeup.  The race tests hammer sleep/wake in
both directions, between threads and between processes, with random jitter;
every wait is bounded (a lost wakeup fails the test instead of hanging it).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import select
import threading
from multiprocessing.connection import Connection
from pathlib import Path

from smcr.rdma import (
    AccessFlag,
    CompletionQueue,
    RecvWr,
    SendFlag,
    SendWr,
    Sge,
    WorkCompletion,
    WrOpcode,
)
from smcr.rdma.shm import ShmDevice
from smcr.rdma.shm.cq import ARMED, ShmCompletionQueue
from smcr.rdma.shm.layout import U32
from tests.rdma.rdma_helpers import RW, Side, make_side

CTX = mp.get_context("spawn")
ROUNDS = 2000
WAIT = 10.0  # per message; generous: only a lost wakeup comes near it


def _readable(cq: CompletionQueue) -> bool:
    return bool(select.select([cq.fileno()], [], [], 0)[0])


def _drain_bell(cq: CompletionQueue) -> None:
    while _readable(cq):
        os.read(cq.fileno(), 4096)


def _post_recvs(side: Side, first: int, n: int) -> None:
    side.qp.post_recv([RecvWr(wr_id=first + i, sg_list=(Sge(side.buf.addr + 64 * (i % 64), 64,
                                                             side.buf.lkey),))
                       for i in range(n)])  # fmt: skip


def _send(side: Side, wr_id: int, signaled: bool = False) -> None:
    sge = Sge(side.buf.addr + 0x8000, 44, side.buf.lkey)
    flags = SendFlag.SIGNALED if signaled else SendFlag.NONE
    side.qp.post_send(SendWr(wr_id=wr_id, opcode=WrOpcode.SEND, sg_list=(sge,), send_flags=flags))


def _armed(cq: CompletionQueue) -> int:
    assert isinstance(cq, ShmCompletionQueue)
    return int(U32.unpack_from(cq._notify, ARMED)[0])


def test_device_cqs_publish_their_arming(shm_dir: Path) -> None:
    dev = ShmDevice("n", directory=shm_dir)
    try:
        cq = dev.create_cq()
        assert isinstance(cq, ShmCompletionQueue)
        assert _armed(cq) == 1  # armed from the start: a first SEND always rings
        cq.req_notify()
        assert _armed(cq) == 1
    finally:
        dev.close()


def test_ring_only_when_armed(pair: tuple[Side, Side]) -> None:
    a, b = pair
    _post_recvs(b, 100, 8)
    _drain_bell(b.cq)
    _send(a, 1)  # b's CQ is armed (initially): rung, and the word cleared
    assert _readable(b.cq)
    assert _armed(b.cq) == 0
    _drain_bell(b.cq)
    _send(a, 2)  # not armed: no doorbell, yet the completion is there for a poll
    assert not _readable(b.cq)
    assert [wc.wr_id for wc in b.cq.poll(8)] == [100, 101]
    b.cq.req_notify()  # about to sleep: the next SEND must ring
    _send(a, 3)
    assert _readable(b.cq)
    assert [wc.wr_id for wc in b.cq.wait(WAIT, 8)] == [102]


def _echo_loop(side: Side, rounds: int, starts: bool, seed: int) -> int:
    """Ping-pong ``rounds`` SENDs; each receive is waited for (bounded) and answered."""
    rng = random.Random(seed)
    got = 0
    if starts:
        _send(side, 0)
    for i in range(rounds):
        wcs: list[WorkCompletion] = []
        while not wcs:
            wcs = side.cq.wait(WAIT, 4)
            assert wcs, f"lost wakeup at round {i}"
            wcs = [wc for wc in wcs if wc.opcode.name == "RECV"]
        got += len(wcs)
        _post_recvs(side, 1000 + i, len(wcs))
        jitter = rng.random()
        if jitter < 0.2:
            threading.Event().wait(0)  # yield the GIL / CPU at random points
        elif jitter < 0.25:
            threading.Event().wait(0.0002)
        if starts and i == rounds - 1:
            break
        _send(side, i + 1, signaled=jitter > 0.9)
    return got


def test_sleep_wake_race_between_threads(pair: tuple[Side, Side]) -> None:
    a, b = pair
    _post_recvs(a, 0, 16)
    _post_recvs(b, 0, 16)
    result: dict[str, int] = {}
    t = threading.Thread(target=lambda: result.update(b=_echo_loop(b, ROUNDS, False, 2)))
    t.start()
    result["a"] = _echo_loop(a, ROUNDS, True, 1)
    t.join(60)
    assert not t.is_alive()
    assert result == {"a": ROUNDS, "b": ROUNDS}


def _child(conn: Connection, directory: str, rounds: int) -> None:
    side = make_side(Path(directory), "child", 0x4242)
    conn.send({"gid": side.dev.gid, "qpn": side.qp.qp_num, "psn": side.psn})
    remote = conn.recv()
    side.qp.to_rts(dgid=remote["gid"], dest_qp_num=remote["qpn"], rq_psn=remote["psn"],
                   sq_psn=side.psn, access=AccessFlag(RW))  # fmt: skip
    _post_recvs(side, 0, 16)
    conn.send("up")
    try:
        conn.send(_echo_loop(side, rounds, False, 3))
    except AssertionError as exc:
        conn.send(str(exc))
    conn.recv()  # keep the QP up until the parent is done
    side.dev.close()


def test_sleep_wake_race_between_processes(shm_dir: Path) -> None:
    local = make_side(shm_dir, "parent", 0x777)
    parent, child = CTX.Pipe()
    proc = CTX.Process(target=_child, args=(child, str(shm_dir), ROUNDS), daemon=True)
    proc.start()
    try:
        assert parent.poll(20), "peer did not start"
        info = parent.recv()
        parent.send({"gid": local.dev.gid, "qpn": local.qp.qp_num, "psn": local.psn})
        local.qp.to_rts(dgid=info["gid"], dest_qp_num=info["qpn"], rq_psn=info["psn"],
                        sq_psn=local.psn, access=AccessFlag(RW))  # fmt: skip
        _post_recvs(local, 0, 16)
        assert parent.poll(10) and parent.recv() == "up"
        assert _echo_loop(local, ROUNDS, True, 4) == ROUNDS
        assert parent.poll(60)
        assert parent.recv() == ROUNDS
        parent.send("bye")
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
        local.dev.close()
