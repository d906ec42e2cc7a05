"""Quiet connections give back the buffer pages their traffic touched (:mod:`smcr.stack.trim`).

Two runtimes over shm (:mod:`tests.stack.hosts`: 64 KiB RMBs and send buffers).  Memory is
read from the kernel: the allocated blocks of the RMB segment (``st_blocks`` of its memfd),
which the writer's mapping and the owner's share; a page given back reads as zeros.
"""

from __future__ import annotations

import os
import socket
import threading
import time

from hypothesis import given
from hypothesis import strategies as st

from smcr.core.connection import Connection, Rmb
from smcr.stack.counters import COUNTERS
from smcr.stack.hostconn import HostConn
from smcr.stack.runtime import Stack
from smcr.stack.trim import (
    LOOK_EVERY,
    QUIET_BYTES,
    TRICKLE_STEP,
    read_behind,
    ring_pieces,
    trickle_step,
    trim_connection,
)
from tests.stack.hosts import SIZE, conn, connect, hosts, read, send, wait

PAGE = 4096
STEP = trickle_step(SIZE)
"""What a trickle gives back at once here (a quarter of the test's small rings)."""


def _rmb_bytes(stack: Stack) -> int:
    """Bytes the shared segment of ``stack``'s RMBs (one link group) holds now."""
    with stack.lock:
        (group,) = stack.pool.groups.values()
        assert group.segment is not None
        return os.fstat(group.segment.fd).st_blocks * 512


def _read_all(stack: Stack, hc: HostConn, n: int) -> bytes:
    """Read ``n`` bytes and send the consumer cursor now (as a reader whose writer waits
    for room does; a small read's cursor may otherwise wait for the next)."""
    data = read(stack, hc, n)
    with stack.lock:
        stack.execute(stack.engine.data_consumed(hc.conn_id, 0, time.monotonic(), force=True))
    return data


def _look(stack: Stack, times: int = 2) -> None:
    """Run the runtime's idle look now, ``times`` times (the first after a write only sees
    it: a connection is idle at the next look that finds no new write)."""
    for _ in range(times):
        with stack.lock:
            stack.ex.trim.due = 1.0  # (due long ago)
            now = time.monotonic()
            for conn_id in stack.ex.trim.run(now, stack.ex.conns, stack.engine.conns, stack.qps):
                stack.execute(stack.engine.data_consumed(conn_id, 0, now, force=True))


def _acknowledged(stack: Stack, hc: HostConn, cons: int) -> None:
    """Until the peer's consumer cursor, as ``stack`` knows it, has come to ``cons``."""
    c = conn(stack, hc)
    wait(stack, hc, lambda: c.peer_cons == cons)


def test_an_idle_connection_gives_back_what_the_peer_read_in_both_processes_maps() -> None:
    """The writer punches the part of the peer's RMB the peer has read, by itself, a second
    or two after the traffic stopped (the runtime's timers: nobody calls in); the owner's
    mapping reads zeros there.  ``smcr stats -d`` counts the bytes."""
    with hosts(2) as (x, y):
        hx, hy = connect(x, y)
        before = _rmb_bytes(x)
        counted = COUNTERS.trimmed_bytes
        data = os.urandom(SIZE - 2 * PAGE)
        send(y, hy, data)
        assert read(x, hx, len(data)) == data
        cy = conn(y, hy)
        wait(y, hy, lambda: cy.peer_cons == cy.tx_sent)  # (the cursor came back to y)
        assert _rmb_bytes(x) >= before + len(data) - PAGE
        deadline = time.monotonic() + 4 * LOOK_EVERY + 5
        while _rmb_bytes(x) > before + PAGE and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _rmb_bytes(x) <= before + PAGE
        assert bytes(hx.rmb[PAGE : len(data) - PAGE]) == bytes(len(data) - 2 * PAGE)
        assert COUNTERS.trimmed_bytes - counted >= len(data) - 2 * PAGE


def test_bytes_the_peer_has_not_read_stay_and_the_stream_goes_on_intact() -> None:
    """Only the ring positions behind the peer's consumer cursor go: bytes still to be read
    survive every look, and a stream that goes on through the punched pages (wrapping the
    ring several times, a look between each burst) arrives byte for byte."""
    with hosts(2) as (x, y):
        hx, hy = connect(x, y)
        sent = bytearray()
        got = bytearray()
        for burst in range(12):
            n = SIZE // 2 + burst * 977
            data = os.urandom(n)
            cy = conn(y, hy)
            wait(y, hy, lambda cy=cy, n=n: cy.direct_room() >= n)  # type: ignore[misc]
            send(y, hy, data)
            sent += data
            got += _read_all(x, hx, len(data) // 3)  # most of it still unread at the look
            _acknowledged(y, hy, len(got))
            _look(y)
            got += _read_all(x, hx, len(data) - len(data) // 3)
            _acknowledged(y, hy, len(got))
            _look(y)
        for lap in range(4):  # more than a ring between two looks, the last lap half read
            data = os.urandom(SIZE - PAGE)
            send(y, hy, data)
            sent += data
            got += _read_all(x, hx, len(data) // 2 if lap == 3 else len(data))
            _acknowledged(y, hy, len(got))
        _look(y, times=1)
        got += _read_all(x, hx, len(sent) - len(got))
        assert got == sent


def test_a_busy_stream_keeps_its_pages_a_slow_one_gives_them_back() -> None:
    """A connection that wrote more than ``QUIET_BYTES`` since the previous look keeps its
    pages (a busy stream would only fault them in again); one that wrote less gives back
    what the peer has read, :func:`trickle_step` or more at a time (a chat, a heartbeat: its
    writes would otherwise move through the whole ring over time), and all of it at the
    first look that finds it quiet."""
    with hosts(2) as (x, y):
        hx, hy = connect(x, y)
        before = _rmb_bytes(x)
        _look(y)
        chunk = SIZE - PAGE
        for _ in range(QUIET_BYTES // chunk + 2):  # (more than QUIET_BYTES, the ring's laps)
            data = os.urandom(chunk)
            cy = conn(y, hy)
            wait(y, hy, lambda cy=cy: cy.direct_room() >= chunk)  # type: ignore[misc]
            send(y, hy, data)
            assert _read_all(x, hx, len(data)) == data
        cy = conn(y, hy)
        wait(y, hy, lambda: cy.peer_cons == cy.tx_sent)
        held = _rmb_bytes(x)
        assert held >= before + SIZE - 2 * PAGE
        _look(y, times=1)
        assert _rmb_bytes(x) == held  # busy since the last look
        for _ in range(3):  # now slow: a little between looks
            data = os.urandom(3 * PAGE)
            send(y, hy, data)
            assert _read_all(x, hx, len(data)) == data
            wait(y, hy, lambda: cy.peer_cons == cy.tx_sent)
            _look(y, times=1)
            assert _rmb_bytes(x) <= before + STEP + 2 * PAGE
        _look(y, times=1)  # quiet now: every whole page read goes
        assert _rmb_bytes(x) <= before + PAGE


def test_the_send_buffer_gives_back_what_was_sent_and_read() -> None:
    """Bytes copied into the send buffer (the peer's RMB was full) are let go of once
    the peer has read them: the send buffer's pages read as zeros after the look."""
    with hosts(2) as (x, y):
        hx, hy = connect(x, y)
        first = os.urandom(SIZE - 1)
        send(y, hy, first)  # the peer's RMB is full now (but the byte held back: peer_hold)
        more = os.urandom(SIZE // 2)
        with y.lock:  # (as a send does when the peer's RMB has no room: copied, then flushed)
            at = conn(y, hy).tx_app % len(hy.sndbuf)  # (its last byte, then from the start)
            hy.sndbuf[at:] = more[: len(hy.sndbuf) - at]
            hy.sndbuf[: len(more) - (len(hy.sndbuf) - at)] = more[len(hy.sndbuf) - at :]
            y.execute(y.engine.data_written(hy.conn_id, len(more), time.monotonic()))
        assert read(x, hx, SIZE - 1) == first
        assert read(x, hx, len(more)) == more
        cy = conn(y, hy)
        wait(y, hy, lambda: cy.peer_cons == cy.tx_sent == SIZE - 1 + len(more))
        _look(y)
        end = cy.tx_sent % len(hy.sndbuf) // PAGE * PAGE  # (up to the cursor's page)
        assert end and bytes(hy.sndbuf[:end]) == bytes(end)


def test_a_trickle_gives_back_several_pages_at_a_time() -> None:
    """Less than a page between looks: the pages read go once :func:`trickle_step` of them are
    there, in give-backs of at least that much (each one interrupts every CPU that runs
    either process); three laps of the ring at 1,000 bytes a look hold no more than that
    and the pages around the cursor; a look that finds the trickle quiet gives back the
    rest."""
    with hosts(2) as (x, y):
        hx, hy = connect(x, y)
        before = _rmb_bytes(x)
        steps = []
        for i in range(3 * SIZE // 1000):
            data = os.urandom(1000)
            send(y, hy, data)
            assert _read_all(x, hx, len(data)) == data
            if i % 2:  # (else the look may come before the reader's cursor does: the send
                _acknowledged(y, hy, conn(x, hx).rx_cons)  # buffer's part is then ahead)
            trimmed = COUNTERS.trimmed_bytes
            _look(y, times=1)
            if COUNTERS.trimmed_bytes != trimmed:
                steps.append(COUNTERS.trimmed_bytes - trimmed)
            assert _rmb_bytes(x) <= before + STEP + 3 * PAGE  # (+ what the cursor lags)
        assert STEP >= 2 * PAGE  # (several pages even in the test's small rings)
        assert len(steps) >= 3 * SIZE // STEP - 2, steps
        assert min(steps) >= STEP, steps
        _look(y, times=1)
        assert _rmb_bytes(x) <= before + PAGE


def test_a_quiet_reader_tells_its_cursor_so_that_the_writer_gives_back() -> None:
    """A reader sends its consumer cursor only once much is unconfirmed (Linux's rule), so
    a slow one-way stream's writer would not learn that the bytes were read: a quiet
    reader's look sends it, and the writer's next look gives back."""
    with hosts(2) as (x, y):
        hx, hy = connect(x, y)
        before = _rmb_bytes(x)
        data = os.urandom(SIZE // 3)
        send(y, hy, data)
        assert read(x, hx, len(data)) == data  # (no cursor sent: a third of the ring)
        _look(y)
        assert conn(y, hy).peer_cons == 0 and _rmb_bytes(x) >= before + len(data) - PAGE
        _look(x)  # (its first look only sees the connection)
        _acknowledged(y, hy, len(data))
        _look(y, times=1)
        assert _rmb_bytes(x) <= before + PAGE


@given(st.integers(1, 16), st.integers(0, 1 << 22), st.data())
def test_the_slots_given_back_hold_only_bytes_already_read(
        pages: int, written: int, data: st.DataObject) -> None:  # fmt: skip
    """The arithmetic: whatever the cursors (at most a ring unread, the given-back mark
    behind the consumer cursor), the ring slots of ``[read_behind(...), cons)`` are
    exactly those whose latest byte was read, never a slot of an unread byte."""
    size = pages * PAGE
    cons = data.draw(st.integers(max(0, written - size), written))
    given_back = data.draw(st.integers(0, cons))
    low = read_behind(given_back, written, size)
    slots: set[int] = set()
    for offset, length in ring_pieces(low, max(low, cons), size):
        assert offset >= 0 and offset + length <= size
        slots.update(range(offset, offset + length))
    unread = {p % size for p in range(cons, written)}
    assert not slots & unread
    assert slots == {p % size for p in range(max(given_back, written - size), cons)}


def test_the_trickle_step_is_a_quarter_of_a_small_ring_and_whole_pages() -> None:
    assert trickle_step(4 << 20) == TRICKLE_STEP == 8 * PAGE
    assert trickle_step(64 << 10) == 4 * PAGE
    assert trickle_step(20 << 10) == PAGE  # (a quarter is 5 KiB: one whole page)
    assert trickle_step(PAGE) == PAGE


def _trickling(peer_cons: int, written: int, sndbuf: int) -> tuple[HostConn, Connection]:
    """A connection that wrote ``written`` bytes, all CDC-confirmed, of which the peer
    reports having read ``peer_cons``; nothing given back yet."""
    hc = HostConn(1, socket.socket(), threading.Condition())
    c = Connection(1, 1, Rmb(rkey=1, vaddr=0, size=4 << 20), sndbuf)
    c.peer_rmb_size = 4 << 20
    c.tx_app = c.tx_sent = c.tx_fin = written
    c.peer_cons = peer_cons
    hc.trim_cons = hc.trim_sent = 0
    return hc, c


def test_each_part_of_a_trickle_goes_by_its_own_step() -> None:
    """The peer's RMB part goes once its own cursor has moved a step, not when the send
    buffer's (which runs ahead while the reader's cursor lags) has; the send buffer's
    step is its own ring's; a quiet connection gives back both at any whole page."""
    hc, c = _trickling(peer_cons=20 << 10, written=40 << 10, sndbuf=4 << 20)
    with hc.tcp:
        assert trim_connection(hc, c, None, quiet=False)
        assert (hc.trim_cons, hc.trim_sent) == (0, 40 << 10)  # (RMB: 20 KiB < 32 KiB)
        c.peer_cons = 36 << 10
        assert trim_connection(hc, c, None, quiet=False)
        assert hc.trim_cons == 36 << 10
    hc, c = _trickling(peer_cons=8 << 10, written=12 << 10, sndbuf=64 << 10)
    with hc.tcp:
        assert trim_connection(hc, c, None, quiet=False)
        assert (hc.trim_cons, hc.trim_sent) == (0, 0)  # (12 KiB < a 64 KiB ring's 16)
        assert trim_connection(hc, c, None, quiet=True)
        assert (hc.trim_cons, hc.trim_sent) == (8 << 10, 12 << 10)
