"""Spawned server for the SMC-Rv2 socket tests: which version its side agreed."""

from __future__ import annotations

import ipaddress
from multiprocessing.connection import Connection

import smcr
from tests.socket import smc_peer


def lgr_version(sock: smcr.SMCSocket) -> int:
    """The SMC-R version of a connection as its socket says it (0 on TCP), checked against
    the version of the link group it runs on in the runtime."""
    from smcr.stack.runtime import get_stack  # noqa: PLC0415

    info = sock.smc_info()
    if info.mode != "SMCR":
        return 0
    stack = get_stack(ipaddress.ip_address(sock.getsockname()[0]))
    assert info.version == stack.engine.lgrs[info.lgr_id].version
    return info.version


def echo_version(ctl: Connection) -> None:
    """Accept one client, echo one message, report (mode, link group version)."""
    srv = smcr.create_server((smc_peer.host(), 0))
    ctl.send(srv.getsockname()[1])
    c, _ = srv.accept()
    c.sendall(c.recv(100))
    ctl.send((c.smc_info().mode, lgr_version(c)))
    c.recv(1)
    c.close()
    srv.close()
