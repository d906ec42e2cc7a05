"""The runtime's action executor and work-request bookkeeping (``Stack.execute``,
``_post``, the receive slots): WR fusion, receives reposted, slots given back with a
QP, an orphan aborted.  Runtimes side by side in this process (``tests.stack.hosts``)."""

from __future__ import annotations

import select
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest

from smcr.rdma.base import QpTap, QueuePair
from smcr.rdma.completion import ARM_PROGRESS, ARM_SLEEPER
from smcr.rdma.verbs import SendWr
from smcr.stack import wrslots
from smcr.stack.hostconn import HostConn, StackTap
from smcr.stack.runtime import Stack
from tests.stack.hosts import SIZE, conn, connect, hosts, read, send, wait


def write_via_sndbuf(stack: Stack, hc: HostConn, data: bytes) -> None:
    """Copy ``data`` into the send buffer and let the engine RDMA-WRITE it (as ``send``
    does when the inline path is closed)."""
    with stack.lock:
        c = conn(stack, hc)
        assert c.sndbuf_space() >= len(data)
        buf, n = hc.sndbuf, len(data)
        start = c.tx_app % len(buf)
        first = min(n, len(buf) - start)
        buf[start : start + first] = data[:first]
        buf[: n - first] = data[first:]
        stack.execute(stack.engine.data_written(hc.conn_id, n, time.monotonic()))


class PostSpy(QpTap):
    """Records the posts a QP took onto its send queue, as the caller made them."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def sent(self, qp: QueuePair, wrs: list[SendWr]) -> None:
        self.calls.append(("post_send", [w.opcode.name for w in wrs]))

    def writes_sent(self, qp: QueuePair, writes: Sequence[tuple[int, int, memoryview]],
                    message: bytes) -> None:  # fmt: skip
        self.calls.append(("post_writes_send", [len(d) for _, _, d in writes]))


def spy(stack: Stack, hc: HostConn) -> list[tuple[str, Any]]:
    """Record the posts on the connection's QP (its tap: :class:`PostSpy`)."""
    tap = PostSpy()
    with stack.lock:
        stack.qps[conn(stack, hc).qpn].set_tap(tap)
    return tap.calls


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "wrs"])
def test_writes_from_the_send_buffer_and_their_cdc_go_in_one_post(fused: bool) -> None:
    """Bytes that wrap around the peer's RMBE go as two RDMA WRITEs, and the CDC after
    them: one fused ``post_writes_send`` where the RNIC takes inline WRs, else one
    ``post_send`` of WRITE, WRITE, SEND -- in that order, so the bytes are in place before
    the CDC that announces them (RC order); the peer reads them intact."""
    with hosts(2) as (x, y):
        hx, hy = connect(x, y)
        x.ex.fused = fused
        send(x, hx, bytes(SIZE - 100))
        assert read(y, hy, SIZE - 100) == bytes(SIZE - 100)
        c = conn(x, hx)
        # the consumer cursor came back (the peer's RMBE but the byte held back)
        wait(x, hx, lambda: c.direct_room() == SIZE - 1)
        calls = spy(x, hx)
        data = bytes(range(256)) + b"wraps around"
        write_via_sndbuf(x, hx, data)
        expected = ("post_writes_send", [100, len(data) - 100]) if fused else (
            "post_send", ["RDMA_WRITE", "RDMA_WRITE", "SEND"])  # fmt: skip
        assert calls == [expected]
        assert read(y, hy, len(data)) == data


def test_receives_are_reposted_so_the_link_never_runs_dry() -> None:
    """Every CDC takes one posted receive; taken ones are posted again in batches, so
    far more messages than receive slots pass, and every slot stays accounted for."""
    with hosts(2) as (x, y):
        hx, hy = connect(x, y)
        with x.lock:
            free = x.wr.free_slots
        for i in range(3 * wrslots.RECV_SLOTS + 5):
            send(y, hy, bytes([i & 0xFF]))
            assert read(x, hx, 1) == bytes([i & 0xFF])
        with x.lock:
            assert x.wr.free_slots == free
            assert len(x.wr.qp_recv_ids[conn(x, hx).qpn]) == wrslots.RECV_SLOTS


def test_a_destroyed_qp_gives_its_receive_slots_back() -> None:
    """A link group that ends destroys its QP; the QP's receive slots go back to the
    runtime's pool (else every dead link would leak RECV_SLOTS of them)."""
    with hosts(2) as (x, y):
        with x.lock:
            free = x.wr.free_slots
        hx, _ = connect(x, y)
        qpn = conn(x, hx).qpn
        with x.lock:
            assert x.wr.free_slots == free - wrslots.RECV_SLOTS
            x.execute(x.engine.link_failed(qpn, "injected", time.monotonic()))
            assert qpn not in x.qps and qpn not in x.wr.qp_recv_ids
            assert x.wr.free_slots == free


def test_an_orphan_with_linger_zero_is_aborted_and_the_peer_sees_the_reset() -> None:
    """A connection handed over unclosed with a linger time of 0 (``Stack.orphan``, any
    thread, no lock): the progress thread aborts it, and the peer's connection ends in a
    reset, as a TCP RST; it is released once the peer's close answers the abort."""
    with hosts(2) as (x, y):
        hx, hy = connect(x, y)
        send(x, hx, b"unread")
        x.orphan(hx, 0)
        cy = conn(y, hy)
        wait(y, hy, lambda: cy.aborted)
        assert cy.rx_available() <= len(b"unread")
        with y.lock:
            y.app_close(hy)
        wait(x, hx, lambda: hx.released)


def test_a_waiter_is_woken_by_the_round_that_releases_its_connection() -> None:
    """A thread that waits for news of a connection while another thread polls (``close``
    waiting for its closing CDC) sleeps on the connection's condition, and a round of
    completions wakes the waiters of the connections it touched that are still there.  The
    round that releases the connection (the peer's close answered ours) must wake its
    waiters too: they slept out their whole wait (``close_wait_tx``, 2 s per close for a
    threaded HTTP client against gunicorn; 30 s here)."""
    with hosts(2) as (x, y):
        hx, hy = connect(x, y)
        result: list[tuple[bool, float]] = []

        def waiter() -> None:
            with x.lock:
                x.ex.wake.poller = "app"  # (another application thread polls)
                began = time.monotonic()
                ok = x.wait(hx, lambda: hx.released, began + 30)
                result.append((ok, time.monotonic() - began))

        thread = threading.Thread(target=waiter)
        thread.start()
        time.sleep(0.2)  # (it waits on the condition)
        with x.lock:
            x.closing.app_close(hx)
        with y.lock:
            y.closing.app_close(hy)
        deadline = time.monotonic() + 10
        while not hx.released and time.monotonic() < deadline:
            with x.lock:
                x.ex.process()  # the polling thread's rounds
            time.sleep(0.01)
        assert hx.released
        thread.join(40)
        with x.lock:
            x.ex.wake.poller = None
        assert result and result[0][0], result
        assert result[0][1] < 15, result  # (at once; 30 s when not woken)


def test_cdcs_are_taken_in_place_and_every_byte_and_close_arrives() -> None:
    """Over shm the CDCs are read where the peer placed them (``stack/inplace.py``): the
    bytes both ways, of sizes that wrap the RMBE, and the close arrive as before."""
    with hosts(2) as (x, y):
        hx, hy = connect(x, y)
        for i in range(200):
            data = bytes([i & 0xFF]) * (1 + (i * 997) % 3000)
            send(x, hx, data)
            assert read(y, hy, len(data)) == data
            send(y, hy, data[:7])
            assert read(x, hx, len(data[:7])) == data[:7]
        assert x.ex.in_place.taken > 100 and y.ex.in_place.taken > 100
        with x.lock:
            x.execute(x.engine.close(hx.conn_id, time.monotonic()))
        c = conn(y, hy)
        wait(y, hy, lambda: c.peer_done)


def test_a_tap_sees_every_cdc_as_a_receive_and_none_is_taken_in_place() -> None:
    """``smcr trace`` shows what the receives carried: with a tap the CDCs complete as
    receives again."""
    with hosts(2) as (x, y):
        hx, hy = connect(x, y)
        seen: list[int] = []

        class Record(StackTap):
            def received(self, stack: Stack, qpn: int, messages: list[memoryview]) -> None:
                seen.extend(m[0] for m in messages)

        y.tap = Record()
        taken = y.ex.in_place.taken
        for i in range(20):
            send(x, hx, b"m%d" % i)
            assert read(y, hy, len(b"m%d" % i)) == b"m%d" % i
        assert y.ex.in_place.taken == taken
        assert seen.count(0xFE) >= 20


@pytest.mark.parametrize("arm", [ARM_PROGRESS, ARM_SLEEPER])
def test_a_send_takes_its_own_completions_and_rings_nobody_for_them(arm: int) -> None:
    """The completion of a signaled CDC comes while the send posts it (shm): the sending
    thread takes it before it returns (the send buffer is free up to it), and its CQ,
    armed for a thread asleep on it, rings nobody for it and stays armed (that thread,
    woken, would only find it taken, and take the lock and the GIL to do so)."""
    with hosts(2) as (x, y):
        hx, _ = connect(x, y)
        cq = x.ex.cq
        bell = cq.fileno()
        with x.lock:
            c = conn(x, hx)
            cq.poll(64)
            cq.clear_signal()
            cq.req_notify(arm)
            signaled = 0
            for i in range(40):
                pending = len(c.cdc_pending)
                x.ex.send_inline(c, memoryview(bytes([i]) * 100))
                if len(c.cdc_pending) <= pending:  # (a completion took it, and those before)
                    signaled += 1
                    assert c.tx_fin == c.tx_sent
                assert cq.idle() and not select.select([bell], [], [], 0)[0]
                assert cq.take_arm() == arm
                cq.req_notify(arm)
            assert signaled >= 2
