"""Threads blocked in ``accept`` that do not poll the runtime themselves wait on the accept
queue's condition (:class:`smcr.socket.acceptq.AcceptQueue`): a listener on a wildcard
address before its first handshake (no runtime known to poll yet), and a second thread
while another one polls.  Each must be woken when its connection is queued."""

from __future__ import annotations

import threading
from typing import Any

import smcr
from tests.socket import discovery_peers
from tests.socket.conftest import Peer


def _accept_and_echo(server: Any, modes: list[str]) -> None:
    conn, _ = server.accept()
    with conn:
        conn.sendall(conn.recv(1))
        modes.append(conn.smc_info().mode)


def _serve(server: Any, threads: int, clients: int) -> list[str]:
    """``threads`` threads each accept one connection (blocked before any client comes),
    while a client process makes ``clients`` connections one after another; the modes of
    the connections accepted."""
    modes: list[str] = []
    workers = [threading.Thread(target=_accept_and_echo, args=(server, modes), daemon=True)
               for _ in range(threads)]  # fmt: skip
    for w in workers:
        w.start()
    peer = Peer(discovery_peers.clients, server.getsockname()[1], clients)
    try:
        for w in workers:
            w.join(30)
            assert not w.is_alive(), "a thread blocked in accept was not woken"
        peer.proc.join(30)
        assert peer.proc.exitcode == 0
    finally:
        peer.stop()
    return modes


def test_accept_on_a_wildcard_listener_is_woken() -> None:
    """The listener's address names no runtime: its ``accept`` waits on the queue's
    condition until the watcher thread's handshake queues the connection."""
    server = smcr.create_server(("0.0.0.0", 0))
    try:
        assert _serve(server, 1, 1) == ["SMCR"]
    finally:
        server.close()


def test_two_threads_in_accept_are_both_woken() -> None:
    """One thread polls the runtime, the other waits on the condition; two clients, one
    after the other: each thread gets one."""
    server = smcr.create_server(("127.0.0.1", 0))
    try:
        assert _serve(server, 2, 2) == ["SMCR", "SMCR"]
    finally:
        server.close()
