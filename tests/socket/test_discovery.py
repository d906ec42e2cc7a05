"""SMC-R only where both ends offered it (issue: discovery), and accepts that do not
wait on each other.

The session has discovery on (``tests/discovery_on.py``: the TCP option as root,
else loopback listed as a peer).  Tests of the policy and off modes set
``SMCR_DISCOVERY`` for this process and the peers they start.
"""

from __future__ import annotations

import asyncio
import os
import selectors
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import cast

import pytest

import smcr
from smcr import discovery
from smcr.wire.decline import DeclineCode
from tests.socket import discovery_peers, smc_peer
from tests.socket.conftest import Peer
from tests.support import REPO_ROOT

PEERNOSMC = int(DeclineCode.PEERNOSMC)


def set_mode(env: pytest.MonkeyPatch, mode: str, peers: str | None = None) -> None:
    env.setenv("SMCR_DISCOVERY", mode)
    if peers is not None:
        env.setenv("SMCR_PEERS", peers)
    discovery.reset()
    assert discovery.current().mode == mode


def test_smcr_client_sends_a_plain_server_only_its_own_bytes() -> None:
    """Regression: an smcr client used to send its CLC Proposal to any server."""
    srv = socket.create_server(("127.0.0.1", 0))
    got: list[bytes] = []

    def serve() -> None:
        c, _ = srv.accept()
        data = b""
        while chunk := c.recv(4096):
            data += chunk
        got.append(data)
        c.close()

    t = threading.Thread(target=serve)
    t.start()
    s = smcr.create_connection(srv.getsockname(), timeout=20)
    info = s.smc_info()
    assert (info.mode, info.local_code, info.peer_code) == ("TCP", PEERNOSMC, 0)
    s.sendall(b"GET / HTTP/1.0\r\n\r\n")
    s.close()
    t.join(20)
    srv.close()
    assert got == [b"GET / HTTP/1.0\r\n\r\n"]


FIRST_CONNECT = """
import os, socket, threading
import smcr, smcr.diag
from smcr.socket import connecting
seen = []
kernel_connect = connecting.PlainSocket.connect
def connect(sock, address):
    seen.append(smcr.diag._state.pid == os.getpid() and smcr.diag.endpoint() is not None)
    return kernel_connect(sock, address)
connecting.PlainSocket.connect = connect
srv = socket.create_server(("127.0.0.1", 0))
threading.Thread(target=lambda: srv.accept()[0].recv(1), daemon=True).start()
s = smcr.create_connection(srv.getsockname(), timeout=20)
print(s.smc_info().mode, seen)
"""


def test_the_first_connection_to_a_plain_server_opens_the_endpoint_before_the_syn(
        tmp_path: Path) -> None:  # fmt: skip
    """A process's first connection opens its smcr ss/stats endpoint (imports, a thread)
    before the kernel's connect: a plain server, whose SYN-ACK says it speaks no SMC, must
    not wait for that between its accept and the client's first byte."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src"),
           "SMCR_DIAG_DIR": str(tmp_path / "diag")}  # fmt: skip
    env.pop("SMCR_DIAG", None)
    out = subprocess.run([sys.executable, "-c", FIRST_CONNECT], capture_output=True,
                         text=True, env=env, timeout=60, check=True)  # fmt: skip
    assert out.stdout.split() == ["TCP", "[True]"], (out.stdout, out.stderr)


def test_plain_client_gets_the_banner_of_a_server_that_speaks_first() -> None:
    """Regression: accept() used to wait 2 s for a client's first bytes."""
    p = Peer(discovery_peers.banner_server, b"220 smtp.example ESMTP\r\n")
    try:
        port = p.recv()
        c = socket.create_connection(("127.0.0.1", port), timeout=20)
        c.settimeout(1.0)  # half the old wait: the banner comes without it
        assert c.recv(100) == b"220 smtp.example ESMTP\r\n"
        assert p.recv() == "TCP"
        p.ctl.send("done")
        c.close()
    finally:
        p.stop()


def test_smcr_client_behind_idle_plain_clients_connects() -> None:
    """Regression: five idle plain clients made the next smcr client time out."""
    p = Peer(discovery_peers.modes_server, 6)
    idle = []
    try:
        port = p.recv()
        idle = [socket.create_connection(("127.0.0.1", port), timeout=20) for _ in range(5)]
        for _ in idle:
            assert p.recv()[:2] == ("TCP", PEERNOSMC)
        s = smcr.create_connection(("127.0.0.1", port), timeout=20)
        assert s.smc_info().mode == "SMCR"
        assert p.recv() == ("SMCR", 0, s.getsockname()[1])
        s.sendall(b"ping")
        assert s.recv(4) == b"ping"
        p.ctl.send("stop")
        s.close()
    finally:
        for c in idle:
            c.close()
        p.stop()


def silent_smc_client(port: int) -> socket.socket:
    """A client that offers SMC in its SYN and then says nothing (no CLC Proposal)."""
    found = discovery.current()
    c = socket.socket()
    assert found.opt_in(c)
    c.connect(("127.0.0.1", port))
    assert found.peer_offered(c, client=True)
    return c


def test_a_silent_smc_client_delays_nobody() -> None:
    """Handshakes run side by side: while one client's handshake waits for a Proposal
    that never comes, a later client's completes and accept() returns it first."""
    p = Peer(discovery_peers.modes_server, 3)
    try:
        port = p.recv()
        silent = silent_smc_client(port)
        s = smcr.create_connection(("127.0.0.1", port), timeout=20)
        assert s.smc_info().mode == "SMCR"
        assert p.recv() == ("SMCR", 0, s.getsockname()[1])  # the later client came first
        s.sendall(b"ping")
        assert s.recv(4) == b"ping"
        silent_port = silent.getsockname()[1]
        silent.close()  # its handshake ends (the server sees EOF), and accept() gives it
        # as TCP's listener would: a TCP connection whose reads see the end
        assert p.recv() == ("TCP", 0, silent_port)
        s2 = smcr.create_connection(("127.0.0.1", port), timeout=20)
        assert p.recv() == ("SMCR", 0, s2.getsockname()[1])
        s2.sendall(b"pong")
        assert s2.recv(4) == b"pong"
        p.ctl.send("stop")
        s.close()
        s2.close()
    finally:
        p.stop()


def test_policy_mode_listed_peers_speak_smc(discovery_env: pytest.MonkeyPatch) -> None:
    set_mode(discovery_env, "policy", "127.0.0.0/8")
    p = Peer(smc_peer.echo_server)
    try:
        with smcr.create_connection(("127.0.0.1", p.recv()), timeout=20) as s:
            assert s.smc_info().mode == "SMCR"
            s.sendall(b"policy")
            assert s.recv(6) == b"policy"
        assert p.recv() == ("SMCR", 0, 0)
    finally:
        p.stop()


def test_policy_mode_unlisted_port_is_plain_tcp_on_both_ends(discovery_env: pytest.MonkeyPatch
                                                             ) -> None:  # fmt: skip
    set_mode(discovery_env, "policy", "127.0.0.1:1")
    p = Peer(discovery_peers.exact_server)
    try:
        s = smcr.create_connection(("127.0.0.1", p.recv()), timeout=20)
        assert (s.smc_info().mode, s.smc_info().local_code) == ("TCP", PEERNOSMC)
        s.sendall(b"only this")
        s.close()
        assert p.recv() == ("TCP", PEERNOSMC, b"only this")
    finally:
        p.stop()


def test_off_mode_is_plain_tcp(discovery_env: pytest.MonkeyPatch) -> None:
    set_mode(discovery_env, "off")
    p = Peer(discovery_peers.exact_server)
    try:
        s = smcr.create_connection(("127.0.0.1", p.recv()), timeout=20)
        assert (s.smc_info().mode, s.smc_info().local_code) == ("TCP", PEERNOSMC)
        s.sendall(b"plain")
        s.close()
        assert p.recv() == ("TCP", PEERNOSMC, b"plain")
    finally:
        p.stop()


def spawn_clients(port: int, count: int) -> Peer:
    return Peer(discovery_peers.clients, port, count)


def test_nonblocking_listener_with_selectors() -> None:
    srv = smcr.create_server(("127.0.0.1", 0))
    srv.setblocking(False)
    with pytest.raises(BlockingIOError):
        srv.accept()
    sel = selectors.DefaultSelector()
    sel.register(srv, selectors.EVENT_READ)
    assert sel.select(0.05) == []
    p = spawn_clients(srv.getsockname()[1], 2)
    try:
        for i in range(2):
            assert sel.select(20.0), "readable when a connection waits"
            c, _ = srv.accept()
            assert c.smc_info().mode == "SMCR"
            c.setblocking(True)
            c.settimeout(20)
            assert c.recv(1) == bytes([i])
            c.sendall(bytes([i]))
            c.close()
        assert sel.select(0.05) == []
    finally:
        p.stop()
        sel.close()
        srv.close()


def test_asyncio_sock_accept_sock_connect_sendall_recv() -> None:
    """asyncio's loop.sock_* calls on SMC sockets, both ends in one loop."""
    async def main() -> tuple[str, str, bytes]:
        loop = asyncio.get_running_loop()
        srv = smcr.create_server(("127.0.0.1", 0))
        srv.setblocking(False)
        cli = smcr.SMCSocket()
        cli.setblocking(False)
        accepted = asyncio.ensure_future(loop.sock_accept(srv))
        await asyncio.wait_for(loop.sock_connect(cli, srv.getsockname()),
                               20)
        conn, _ = await asyncio.wait_for(accepted, 20)
        await loop.sock_sendall(cli, b"x" * 100000)
        got = b""
        while len(got) < 100000:
            got += await asyncio.wait_for(loop.sock_recv(conn, 65536), 20)
        modes = (cli.smc_info().mode, cast(smcr.SMCSocket, conn).smc_info().mode)
        for s in (cli, conn, srv):
            s.close()
        return modes[0], modes[1], got

    client_mode, server_mode, got = asyncio.run(main())
    assert (client_mode, server_mode) == ("SMCR", "SMCR")
    assert got == b"x" * 100000


def test_listener_close_with_connections_nobody_accepted() -> None:
    """Connections queued but never accepted are closed with the listener: the client
    reads EOF or a reset, not a hang."""
    srv = smcr.create_server(("127.0.0.1", 0))
    srv.settimeout(20)
    c = socket.create_connection(srv.getsockname(), timeout=20)
    srv.fileno()  # the queue starts watching (as select/asyncio would)
    deadline = time.monotonic() + 20
    while srv._queue is not None and not srv._queue.ready and time.monotonic() < deadline:
        time.sleep(0.01)
    srv.close()
    assert smc_peer.eof_or_reset(c) == b""
    c.close()
