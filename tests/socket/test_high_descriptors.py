"""SMC-R connections in processes whose descriptors number past 1,024.

``select.select`` refuses descriptors of ``FD_SETSIZE`` (1,024) and more, and a process
with a few hundred SMC-R connections has such numbers.  A runtime descriptor made there
(the named readiness descriptors' full peer, a completion queue) must work as a low one:
``fileno()`` of a connection, a selector on it, a blocking ``recv`` that waits for the
peer.  Both ends in fresh processes (the per-process descriptors are made on first
use), each holding 1,100 descriptors before its first connection.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import resource
import selectors
import time
from multiprocessing.connection import Connection

import smcr

CROWD = 1100
"""Descriptors each process opens before its first connection."""


def _crowd() -> list[int]:
    """Raise the descriptor limit and take :data:`CROWD` descriptors."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4 * CROWD if hard == resource.RLIM_INFINITY else min(hard, 4 * CROWD)
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    fds = [os.open(os.devnull, os.O_RDONLY) for _ in range(CROWD)]
    assert max(fds) >= 1024
    return fds


def _server(ctl: Connection) -> None:
    """Echo one connection; the second message's answer after a pause (the client waits)."""
    _crowd()
    with smcr.create_server(("127.0.0.1", 0)) as srv:
        ctl.send(srv.getsockname()[1])
        conn, _ = srv.accept()
        with conn:
            ctl.send((conn.smc_info().mode, conn.fileno() >= 1024))
            for pause in (0.0, 0.3):
                data = conn.recv(100)
                time.sleep(pause)
                conn.sendall(data)
            assert conn.recv(100) == b""


def _client(port: int, out: Connection) -> None:
    _crowd()
    with smcr.create_connection(("127.0.0.1", port)) as c:
        high = c.fileno() >= 1024
        c.setblocking(False)
        with selectors.DefaultSelector() as sel:
            sel.register(c, selectors.EVENT_READ)
            c.send(b"first")
            ready = sel.select(10.0)
            first = c.recv(100) if ready else b""
        c.setblocking(True)
        c.settimeout(10.0)
        c.sendall(b"second")
        second = c.recv(100)  # waits ~0.3 s for it
        out.send((c.smc_info().mode, high, first, second))


def test_connections_work_with_descriptor_numbers_past_fd_setsize() -> None:
    ctx = mp.get_context("spawn")
    srv_ctl, srv_end = ctx.Pipe()
    cli_ctl, cli_end = ctx.Pipe()
    server = ctx.Process(target=_server, args=(srv_end,), daemon=True)
    server.start()
    try:
        assert srv_ctl.poll(30.0), "the server never listened"
        port = srv_ctl.recv()
        client = ctx.Process(target=_client, args=(port, cli_end), daemon=True)
        client.start()
        assert cli_ctl.poll(30.0), "the client never finished"
        mode, high, first, second = cli_ctl.recv()
        assert (mode, high, first, second) == ("SMCR", True, b"first", b"second")
        assert srv_ctl.poll(10.0)
        assert srv_ctl.recv() == ("SMCR", True)
        client.join(10.0)
        server.join(10.0)
        assert (client.exitcode, server.exitcode) == (0, 0)
    finally:
        if server.is_alive():
            server.kill()
