"""Peer processes for the discovery and accept-queue tests (spawned)."""

from __future__ import annotations

from multiprocessing.connection import Connection

import smcr


def banner_server(ctl: Connection, banner: bytes) -> None:
    """A server that speaks first (SMTP, SSH): the banner as soon as accept returns."""
    srv = smcr.create_server(("127.0.0.1", 0))
    ctl.send(srv.getsockname()[1])
    c, _ = srv.accept()
    c.sendall(banner)
    ctl.send(c.smc_info().mode)
    ctl.recv()  # the test's word that it read the banner
    c.close()
    srv.close()


def modes_server(ctl: Connection, conns: int) -> None:
    """Accept ``conns`` clients; report each one's (mode, local code, peer port) in the
    order accept returned them; echo one message of each SMC-R client; then hold all
    until the test says stop."""
    srv = smcr.create_server(("127.0.0.1", 0))
    ctl.send(srv.getsockname()[1])
    held = []
    for _ in range(conns):
        c, addr = srv.accept()
        info = c.smc_info()
        ctl.send((info.mode, info.local_code, addr[1]))
        if info.mode == "SMCR":
            c.sendall(c.recv(100))
        held.append(c)
    ctl.recv()
    for c in held:
        c.close()
    srv.close()


def exact_server(ctl: Connection) -> None:
    """Report every byte one client sent, to EOF, and the connection's mode."""
    srv = smcr.create_server(("127.0.0.1", 0))
    ctl.send(srv.getsockname()[1])
    c, _ = srv.accept()
    data = b""
    while chunk := c.recv(65536):
        data += chunk
    ctl.send((c.smc_info().mode, c.smc_info().local_code, data))
    c.close()
    srv.close()


def clients(ctl: Connection, port: int, count: int) -> None:
    """Connect ``count`` smcr clients one after another; each sends a byte, reads it back."""
    for i in range(count):
        with smcr.create_connection(("127.0.0.1", port), timeout=20) as s:
            s.sendall(bytes([i]))
            assert s.recv(1) == bytes([i])


def slow_reader(ctl: Connection, delay: float) -> None:
    """Accept one client, wait ``delay`` seconds before reading anything, then read to
    EOF: report the byte count and SHA-256."""
    import hashlib  # noqa: PLC0415
    import time  # noqa: PLC0415

    srv = smcr.create_server(("127.0.0.1", 0))
    ctl.send(srv.getsockname()[1])
    c, _ = srv.accept()
    time.sleep(delay)
    digest = hashlib.sha256()
    size = 0
    while chunk := c.recv(1 << 16):
        digest.update(chunk)
        size += len(chunk)
    ctl.send((c.smc_info().mode, size, digest.hexdigest()))
    c.close()
    srv.close()
