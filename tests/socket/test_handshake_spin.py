"""A blocking ``connect`` or ``accept`` watches for the handshake's next message while a CPU is
free (smcr.stack.progress: ``CLC_SPIN``): the client's Accept and the server's Confirm are
taken without a sleep and the wake-up of an idle CPU that would follow it.  Only then: with
spinning off nothing is watched for, and an ``accept`` that waits for a client who is not
coming sleeps.  (An smcr client's blocking connect sends its Proposal before the rest of its
set-up, so the server's watcher thread mostly reads it and sends the Accept, and the
``accept`` wakes for the Confirm; it watches for it where it read the Proposal itself.)"""

from __future__ import annotations

import ipaddress
import threading
import time

import pytest

import smcr
from smcr.stack.counters import COUNTERS
from smcr.stack.runtime import get_stack
from tests.socket import smc_peer
from tests.socket.conftest import Peer

CONNS = 40


def test_a_blocking_connect_takes_the_accept_without_sleeping(peer: type[Peer]) -> None:
    """Each wait for the Accept that may spin ends when the Accept is there, not at its
    budget, and is counted.  The policy is made to find the host idle and to wait up to 50
    ms (beside the interop guests that CI runs, the host is crowded, rightly no spin; and a
    loaded host may take longer than ``CLC_SPIN`` to answer), then put back."""
    server = peer(smc_peer.handshake_count_server, CONNS)
    port = server.recv()
    assert smc_peer.byte_each_way(port) == "SMCR"  # (this address's runtime exists now)
    policy = get_stack(ipaddress.ip_address("127.0.0.1")).progress.clc_spin
    saved = policy.runnable, policy.most
    try:
        policy.runnable, policy.most = (lambda: 0), 0.05
        policy.pause = policy.misses = policy.looks = 0
        policy.next_look, policy.crowded = 0.0, False
        before = COUNTERS.clc_spin_cnt
        started = time.monotonic()
        modes = [smc_peer.byte_each_way(port) for _ in range(CONNS - 1)]
        took = time.monotonic() - started
        caught = COUNTERS.clc_spin_cnt - before
    finally:
        policy.runnable, policy.most = saved
        policy.next_look = 0.0
    smc, server_caught = server.recv()
    assert modes == ["SMCR"] * (CONNS - 1)
    assert smc == CONNS and server_caught <= CONNS
    # idle, nearly every one is caught; beside busy processes fewer (news of the CQ, the
    # last connection's closing CDCs, ends some spins first), never none
    assert caught >= 1, caught
    assert took < (CONNS - 1) * 0.05, took  # no spin ran out its budget every time


def test_with_spinning_off_every_step_sleeps(peer: type[Peer],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SMCR_SPIN_US", "0")  # (read by the spawned peers as they start)
    server = peer(smc_peer.handshake_count_server, CONNS)
    client = peer(smc_peer.handshake_count_client, server.recv(), CONNS)
    assert client.recv() == (CONNS, 0)
    assert server.recv() == (CONNS, 0)


def test_an_accept_that_waits_for_a_client_not_coming_sleeps() -> None:
    srv = smcr.create_server(("127.0.0.1", 0))
    srv.settimeout(1.0)
    used: list[float] = []

    def accept() -> None:
        start = time.thread_time()
        with pytest.raises(TimeoutError):
            srv.accept()
        used.append(time.thread_time() - start)

    try:
        t = threading.Thread(target=accept)
        t.start()
        t.join(10)
    finally:
        srv.close()
    assert used and used[0] < 0.05, f"{used} s of CPU in a second's wait"
