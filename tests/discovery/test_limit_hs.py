"""``SMC_LIMIT_HS``: a listener whose SMC handshakes pile up lets its new clients stay TCP.

Linux (``smc_hs_congested``) then answers their SYNs with a SYN-ACK that has no SMC
option, so the client falls back at once (peer has no SMC) and no handshake is added to
the pile.  smcr's sock_ops program does the same while the listener, having set the
option, runs as many handshakes as its listen backlog (root: the program is BPF).

The handshakes are made to pile up by clients whose SYN offers SMC and which then send
no Proposal: the server's handshake waits for one.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator

import pytest

import smcr
from smcr import discovery
from smcr.discovery import bpfsys, program
from smcr.socket.linuxapi import SMC_LIMIT_HS, SOL_SMC
from smcr.wire.decline import DeclineCode

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (BPF)"),
]

PEERNOSMC = int(DeclineCode.PEERNOSMC)
BACKLOG = 2


def silent_client(addr: tuple[str, int]) -> socket.socket:
    """A TCP client whose SYN offers SMC and which then says nothing."""
    sock = socket.socket(socket.AF_INET6 if ":" in addr[0] else socket.AF_INET)
    assert discovery.current().opt_in(sock)
    sock.connect(addr)
    return sock


def handshakes_running(srv: smcr.SMCSocket, count: int) -> None:
    """Wait until the listener runs ``count`` handshakes (its clients came in the
    background).  The count is read under the queue's lock, which the ports map's
    update shares with it: once it reads ``count`` the map says so too."""
    queue = srv._queue
    assert queue is not None
    deadline = time.monotonic() + 20
    while True:
        with queue.lock:
            pending = queue.pending
        if pending == count:
            return
        assert time.monotonic() < deadline, pending
        time.sleep(0.01)


def port_count(port: int) -> int:
    """The ports map's count of congested listeners for ``port``."""
    flags = discovery.current().flags
    assert flags is not None and flags.ports_fd >= 0
    found = bpfsys.map_lookup(flags.ports_fd, program.PORT.pack(port), program.PORT.size)
    return 0 if found is None else int(program.PORT.unpack(found)[0])


def connect_mode(addr: tuple[str, int]) -> tuple[str, int]:
    """(mode, local decline code) of a new smcr client of ``addr``."""
    with smcr.create_connection(addr, timeout=20) as client:
        info = client.smc_info()
        client.sendall(b"x")
        return info.mode, info.local_code


@pytest.fixture
def server() -> Iterator[smcr.SMCSocket]:
    assert discovery.current().mode == "bpf"
    srv = smcr.SMCSocket()
    srv.bind(("127.0.0.1", 0))
    yield srv
    srv.close()


# (listener's address, clients' address): IPv4, IPv6, and IPv4 clients of a dual-stack
# listener (their requests are IPv4, their sockets IPv6 with a v4-mapped peer)
ADDRESSES = [("127.0.0.1", "127.0.0.1"), ("::1", "::1"), ("::", "127.0.0.1")]


@pytest.mark.parametrize(("bound", "client"), ADDRESSES, ids=["ipv4", "ipv6", "dual-stack"])
def test_a_listener_with_limit_hs_lets_clients_stay_tcp_while_its_handshakes_pile_up(
        bound: str, client: str) -> None:  # fmt: skip
    assert discovery.current().mode == "bpf"
    server = smcr.SMCSocket(socket.AF_INET6 if ":" in bound else socket.AF_INET)
    server.bind((bound, 0))
    server.setsockopt(SOL_SMC, SMC_LIMIT_HS, 1)
    server.listen(BACKLOG)
    server.settimeout(20)
    port = server.getsockname()[1]
    addr = (client, port)
    silent = [silent_client(addr) for _ in range(BACKLOG)]
    try:
        handshakes_running(server, BACKLOG)
        assert port_count(port) == 1
        assert connect_mode(addr) == ("TCP", PEERNOSMC)  # the SYN-ACK had no option
        accepted, _ = server.accept()
        with accepted:
            assert accepted.smc_info().mode == "TCP" and accepted.recv(1) == b"x"
        silent.pop().close()  # one handshake ends: below the backlog again
        handshakes_running(server, BACKLOG - 1)
        assert port_count(port) == 0
        assert connect_mode(addr) == ("SMCR", 0)
    finally:
        for sock in silent:
            sock.close()
        server.close()
    assert port_count(port) == 0


def test_without_limit_hs_clients_get_smc_r_however_many_handshakes_run(
        server: smcr.SMCSocket) -> None:  # fmt: skip
    server.listen(BACKLOG)
    server.settimeout(20)
    addr = server.getsockname()
    silent = [silent_client(addr) for _ in range(BACKLOG + 1)]
    try:
        handshakes_running(server, BACKLOG + 1)
        assert port_count(addr[1]) == 0
        assert connect_mode(addr) == ("SMCR", 0)
    finally:
        for sock in silent:
            sock.close()


def test_turning_limit_hs_off_lets_smc_r_back_at_once(server: smcr.SMCSocket) -> None:
    server.setsockopt(SOL_SMC, SMC_LIMIT_HS, 1)
    server.listen(BACKLOG)
    server.settimeout(20)
    addr = server.getsockname()
    silent = [silent_client(addr) for _ in range(BACKLOG)]
    try:
        handshakes_running(server, BACKLOG)
        assert port_count(addr[1]) == 1
        server.setsockopt(SOL_SMC, SMC_LIMIT_HS, 0)
        assert port_count(addr[1]) == 0
        assert connect_mode(addr) == ("SMCR", 0)
    finally:
        for sock in silent:
            sock.close()


def test_a_new_listener_clears_what_a_killed_one_left_for_its_port(
        server: smcr.SMCSocket) -> None:  # fmt: skip
    flags = discovery.current().flags
    assert flags is not None
    port = server.getsockname()[1]
    assert flags.congested(port, True)  # as a listener killed while congested left it
    assert port_count(port) == 1
    server.listen(BACKLOG)
    server.settimeout(20)
    assert port_count(port) == 0
    assert connect_mode(server.getsockname()) == ("SMCR", 0)
