"""Event loops over shm between processes: the peer's message wakes the loop's thread
through the connection's consumer bell (``smcr.rdma.bells``), no message is lost to a
bell nobody hears, and a program that waits for writability only still gets its window."""

from __future__ import annotations

import errno
import selectors
import socket
import time
from typing import Any

import pytest

import smcr
from smcr.stack.counters import COUNTERS
from tests.socket import smc_peer
from tests.socket.conftest import Peer
from tests.support import voluntary_switches

ROUNDS = 2000


def _loop_round_trips(conns: list[smcr.SMCSocket], rounds: int, deadline: float) -> None:
    """Each connection sends a message, waits for its echo, ``rounds`` times, all from one
    selectors loop; every echo checked."""
    sel = selectors.DefaultSelector()
    state: dict[Any, list[Any]] = {}
    for c in conns:
        c.setblocking(False)
        sel.register(c, selectors.EVENT_READ)
        state[c] = [0, b"", bytearray()]  # rounds done, message, received
    def start(c: smcr.SMCSocket) -> None:
        done = state[c][0]
        size = 1 + (done * 389 + conns.index(c) * 97) % 3000
        msg = bytes([(done + k) & 0xFF for k in range(min(size, 256))]) * (size // 256 + 1)
        state[c][1] = msg[:size]
        state[c][2] = bytearray()
        sent = 0
        while sent < size:
            try:
                sent += c.send(state[c][1][sent:])
            except BlockingIOError:
                time.sleep(0.0001)
    for c in conns:
        start(c)
    left = len(conns)
    while left:
        assert time.monotonic() < deadline, [state[c][0] for c in conns]
        for key, _ in sel.select(5):
            c = key.fileobj  # type: ignore[assignment]
            try:
                data = c.recv(65536)
            except BlockingIOError:
                continue
            assert data, "EOF from the echo server"
            got = state[c][2]
            got += data
            if len(got) == len(state[c][1]):
                assert bytes(got) == state[c][1]
                state[c][0] += 1
                if state[c][0] == rounds:
                    sel.unregister(c)
                    left -= 1
                else:
                    start(c)
    sel.close()


def _connect(port: int, nonblocking: bool) -> smcr.SMCSocket:
    """A client connection; ``nonblocking``: connected as an event loop connects (the
    readiness descriptor the program watched while connecting is the connection's)."""
    if not nonblocking:
        return smcr.create_connection(("127.0.0.1", port), timeout=20)
    conn = smcr.SMCSocket()
    conn.setblocking(False)
    assert conn.connect_ex(("127.0.0.1", port)) in (0, errno.EINPROGRESS)
    sel = selectors.DefaultSelector()
    sel.register(conn, selectors.EVENT_WRITE)
    assert sel.select(20), "connect did not settle"
    sel.close()
    assert conn.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
    return conn


@pytest.mark.parametrize("nonblocking", [False, True], ids=["connect", "connect-nonblocking"])
def test_an_event_loops_messages_ring_the_consumer_bell(nonblocking: bool) -> None:
    """Both ends wait in ``select`` on their readiness descriptor: each message makes the
    other end's descriptor readable through its bell (the peer rang it: counted), or is
    taken by that end's own look (an answer that comes while its send holds the CQ's
    standby arm rings nobody: ``Progress.send_ended``), never through the other end's
    progress thread (woken once per message where there are no bells); every echo intact.
    A client that connected without blocking keeps the descriptor it watched meanwhile,
    named since its connect (no listener of this process took it), and rung as well.

    How many messages ring and how many the send's look takes depends on timing (within
    ``STANDBY`` of an application thread's poll, such as a blocking connect's, and on a
    busy host, sends hold the arm and their answers often come meanwhile): what is sure is
    that the progress threads sleep through the loop."""
    peer = Peer(smc_peer.loop_echo_server, 1)
    try:
        port = peer.recv()
        conn = _connect(port, nonblocking)
        assert conn.smc_info().mode == "SMCR"
        counted = COUNTERS.bell_cnt
        woken = voluntary_switches("smcr-progress")
        _loop_round_trips([conn], ROUNDS, time.monotonic() + 120)
        woken = voluntary_switches("smcr-progress") - woken
        ours = conn._hc.readiness.bell  # type: ignore[union-attr]
        assert woken < ROUNDS // 4, woken
        assert ours is not None and ours.rung >= ROUNDS // 10, ours and ours.rung
        assert COUNTERS.bell_cnt - counted >= ROUNDS // 10  # (smcr stats -d shows it)
        conn.close()
        (theirs,), their_woken = peer.recv(60)
        assert their_woken < ROUNDS // 4, their_woken
        assert theirs is not None and theirs >= ROUNDS // 10, theirs
    finally:
        peer.stop()


def test_many_connections_in_one_loop_lose_no_message() -> None:
    """Twelve connections, all in flight at once in one loop at each end: a message whose
    bell was armed while another connection's news was being taken is never left
    unheard (each round waits for its echo; a lost ring would stall the loop)."""
    n = 12
    peer = Peer(smc_peer.loop_echo_server, n)
    try:
        port = peer.recv()
        conns = [smcr.create_connection(("127.0.0.1", port), timeout=20) for _ in range(n)]
        assert all(c.smc_info().mode == "SMCR" for c in conns)
        _loop_round_trips(conns, 300, time.monotonic() + 180)
        for c in conns:
            c.close()
        rung, _ = peer.recv(60)
        assert len(rung) == n and all(r is not None for r in rung), rung
    finally:
        peer.stop()


def test_a_sender_that_waits_for_writability_only_gets_its_window() -> None:
    """The peer's window updates reach a sender that never watches for reading (its bell is
    not armed while its bytes wait for the window: a ring would be heard by nobody)."""
    size = 24 << 20
    peer = Peer(smc_peer.write_only_sender, size)
    try:
        port = peer.recv()
        with smcr.create_connection(("127.0.0.1", port), timeout=20) as conn:
            assert conn.smc_info().mode == "SMCR"
            got = bytearray()
            chunks = 0
            while len(got) < size:
                data = conn.recv(65536)
                assert data, f"EOF after {len(got)} bytes"
                got += data
                chunks += 1
                if chunks % 64 == 0:
                    time.sleep(0.002)  # (a slow reader: the sender waits for room)
            assert got == smc_peer.pattern(size)
        assert peer.recv(60) == "sent"
    finally:
        peer.stop()
