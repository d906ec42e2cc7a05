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
import time
from multiprocessing.connection import Connection
from pathlib import Path

import pytest

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
from smcr.rdma.completion import ARM_SLEEPER, ARM_STANDBY
from smcr.rdma.shm import ShmDevice
from smcr.rdma.shm import peer as peer_mod
from smcr.rdma.shm import rendezvous as rdv
from smcr.rdma.shm.cq import ARMED, ShmCompletionQueue
from smcr.rdma.shm.layout import U32
from tests.rdma.rdma_helpers import RW, Side, connect, make_side

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


def test_a_taken_arm_rings_nobody_until_it_is_given_back(pair: tuple[Side, Side]) -> None:
    a, b = pair
    _post_recvs(b, 200, 8)
    _drain_bell(b.cq)
    b.cq.req_notify()
    assert b.cq.take_arm()  # armed: the taker polls itself now
    assert _armed(b.cq) == 0
    _send(a, 1)  # a peer's SEND meanwhile rings nobody ...
    a.cq.req_notify()
    assert a.cq.take_arm()
    _send(a, 2, signaled=True)  # ... nor does a local completion
    assert not _readable(b.cq) and not _readable(a.cq)
    assert not b.cq.take_arm()  # (taken already: a second taker has nothing to give back)
    b.cq.req_notify()  # given back: then the taker's look finds what came meanwhile
    a.cq.req_notify()
    assert [wc.wr_id for wc in b.cq.poll(8)] == [200, 201]
    assert [wc.wr_id for wc in a.cq.poll(8)] == [2]
    _send(a, 3)  # armed again: the next SEND rings as before
    assert _readable(b.cq)


def test_no_send_waits_for_a_ring_after_arms_were_taken(pair: tuple[Side, Side]) -> None:
    """The runtime's pattern: a thread asleep on the CQ (the progress thread), another that
    now and then takes the arm, polls and gives it back (an application thread sending to
    a peer in its own process), both under one lock, and a peer whose SENDs land at any
    moment.  While the arm is taken no SEND rings; once the taker stops, every SEND must
    still wake the sleeper: one left unrung waits for the sleeper's long timeout."""
    a, b = pair
    n, taken_part, depth = 600, 300, 16
    _post_recvs(b, 0, depth)
    lock = threading.Lock()
    sent: dict[int, float] = {}
    taken: dict[int, float] = {}
    taking = threading.Event()
    taking.set()
    rng = random.Random(7)

    def take(wcs: list[WorkCompletion]) -> None:  # (lock held)
        now = time.monotonic()
        for wc in wcs:
            taken[wc.wr_id] = now
            if wc.wr_id + depth < n:  # the k-th SEND takes the receive posted k-th
                _post_recvs(b, wc.wr_id + depth, 1)

    def sleeper() -> None:
        with lock:
            while len(taken) < n:
                wcs = b.cq.poll(64)
                if not wcs:
                    b.cq.req_notify()
                    wcs = b.cq.poll(64)
                if wcs:
                    take(wcs)
                    continue
                lock.release()
                try:
                    ready = select.select([b.cq.fileno()], [], [], 5.0)[0]
                finally:
                    lock.acquire()
                if ready:
                    b.cq.clear_signal()

    def taker() -> None:
        while taking.is_set():
            with lock:
                armed = b.cq.take_arm()
                time.sleep(rng.random() * 0.001)  # SENDs land while the arm is taken
                take(b.cq.poll(64))
                if armed:
                    b.cq.req_notify()
                    take(b.cq.poll(64))
            time.sleep(rng.random() * 0.002)

    threads = [threading.Thread(target=sleeper), threading.Thread(target=taker)]
    for t in threads:
        t.start()
    try:
        for i in range(n):
            if i == taken_part:
                taking.clear()  # from now on only rings wake the sleeper
            sent[i] = time.monotonic()
            _send(a, i)
            if rng.random() < 0.3:
                time.sleep(rng.random() * 0.002)
    finally:
        taking.clear()
        for t in threads:
            t.join(30)
    assert not any(t.is_alive() for t in threads)
    assert sorted(taken) == list(range(n))
    late = {i: taken[i] - sent[i] for i in range(n) if taken[i] - sent[i] > 1.0}
    assert not late, f"SENDs that rang nobody (taken seconds after): {late}"


def _standby_readable(cq: CompletionQueue) -> bool:
    return bool(select.select([cq.standby_fileno()], [], [], 0)[0])


def test_a_cq_armed_for_its_standby_rings_the_standby_bell_for_peers_only(
        pair: tuple[Side, Side]) -> None:  # fmt: skip
    """Armed for the standby (a thread that hears the news while no one polls), a peer's
    SEND rings the standby doorbell, never the poller's; the completions of the CQ's own
    posts ring nobody and leave the arm in place; a poller that begins takes it back."""
    a, b = pair
    _post_recvs(b, 300, 8)
    _drain_bell(b.cq)
    b.cq.req_notify(ARM_STANDBY)
    assert _armed(b.cq) == ARM_STANDBY
    _send(a, 1)
    assert _standby_readable(b.cq) and not _readable(b.cq)
    assert _armed(b.cq) == 0  # (one ring per arm)
    b.cq.clear_standby()
    assert not _standby_readable(b.cq)
    a.cq.req_notify(ARM_STANDBY)
    _send(a, 2, signaled=True)  # a's own SEND completes on a's CQ: no ring, still armed
    assert not _standby_readable(a.cq) and not _readable(a.cq)
    assert [wc.wr_id for wc in a.cq.poll(8)] == [2]
    assert a.cq.take_arm() == ARM_STANDBY
    b.cq.req_notify(ARM_STANDBY)
    b.cq.take_standby()  # a poller begins
    assert _armed(b.cq) == 0
    _send(a, 3)
    assert not _standby_readable(b.cq) and not _readable(b.cq)
    b.cq.req_notify()  # the poller arms for itself: the poller's bell, as before
    _send(a, 4)
    assert _readable(b.cq) and not _standby_readable(b.cq)
    assert [wc.wr_id for wc in b.cq.poll(8)] == [300, 301, 302, 303]


def test_a_requester_without_the_standby_doorbell_rings_the_cq_doorbell(
        shm_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A requester whose hello does not ask for the standby doorbell (an smcr before it)
    gets the four descriptors it knows, and rings the one doorbell it has for any arm:
    the consumer hears of it later than its standby would (at a look-in), never not."""
    monkeypatch.setattr(peer_mod, "HELLO_FLAGS", rdv.HELLO_MARKS)
    a = make_side(shm_dir, "a", 0x100)
    b = make_side(shm_dir, "b", 0xFFFFF0)
    try:
        connect(a, b)
        _post_recvs(b, 400, 8)
        _drain_bell(b.cq)
        b.cq.req_notify(ARM_STANDBY)
        _send(a, 1)
        assert _readable(b.cq) and not _standby_readable(b.cq)
        assert [wc.wr_id for wc in b.cq.poll(8)] == [400]
    finally:
        a.dev.close()
        b.dev.close()


@pytest.mark.parametrize("arm", [ARM_SLEEPER, ARM_STANDBY])
def test_a_poster_that_looks_rings_nobody_unless_it_cannot_look(
        pair: tuple[Side, Side], arm: int) -> None:  # fmt: skip
    """While a poster says it looks (:attr:`poster_looks`), its own post's completion rings
    nobody and leaves the arm; if it then cannot look (its post raised), ``ring_held`` rings
    whom the arm names, once, and nobody while nothing waits."""
    a, b = pair
    _post_recvs(b, 300, 8)
    _drain_bell(a.cq)
    a.cq.clear_standby()
    a.cq.req_notify(arm)
    a.cq.ring_held()  # (nothing waits: nobody rung, still armed)
    assert not _readable(a.cq) and not _standby_readable(a.cq) and _armed(a.cq) == arm
    a.cq.poster_looks = True
    try:
        _send(a, 7, signaled=True)
    finally:
        a.cq.poster_looks = False
    assert not _readable(a.cq) and not _standby_readable(a.cq) and _armed(a.cq) == arm
    a.cq.ring_held()

    def rung() -> bool:
        return _standby_readable(a.cq) if arm == ARM_STANDBY else _readable(a.cq)

    assert rung()
    _drain_bell(a.cq)
    a.cq.clear_standby()
    a.cq.ring_held()  # (one ring per arm)
    assert not rung()
    assert [wc.wr_id for wc in a.cq.poll(8)] == [7]
