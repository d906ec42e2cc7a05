"""Linux's own SMC socket API on :class:`smcr.SMCSocket` (:mod:`smcr.socket.linuxapi`):
``AF_SMC`` with ``SMCPROTO_SMC``/``SMCPROTO_SMC6``, ``IPPROTO_SMC``, and ``SOL_SMC``'s
``SMC_LIMIT_HS``, with the errors Linux gives (``smc_create``, ``__smc_setsockopt``)."""

from __future__ import annotations

import errno
import socket
import sys

import pytest

import smcr
from smcr.socket.linuxapi import (
    AF_SMC,
    IPPROTO_SMC,
    SMC_LIMIT_HS,
    SMCPROTO_SMC,
    SMCPROTO_SMC6,
    SOL_SMC,
)

MADE = [(AF_SMC, SMCPROTO_SMC, "127.0.0.1"), (AF_SMC, SMCPROTO_SMC6, "::1"),
        (socket.AF_INET, IPPROTO_SMC, "127.0.0.1"), (socket.AF_INET6, IPPROTO_SMC, "::1")]


@pytest.mark.parametrize(("family", "proto", "host"), MADE)
def test_a_socket_made_with_linuxs_smc_api_is_an_smc_socket(family: int, proto: int,
                                                            host: str) -> None:  # fmt: skip
    with smcr.SMCSocket(family, socket.SOCK_STREAM, proto) as srv:
        srv.bind((host, 0))
        srv.listen()
        srv.settimeout(20)
        shown = [srv.family, srv.proto, srv.getsockopt(socket.SOL_SOCKET, socket.SO_DOMAIN),
                 srv.getsockopt(socket.SOL_SOCKET, socket.SO_PROTOCOL)]  # fmt: skip
        assert shown == [family, proto, family, proto]
        with smcr.SMCSocket(family, socket.SOCK_STREAM, proto) as cli:
            cli.settimeout(20)
            cli.connect(srv.getsockname()[:2])
            conn, _ = srv.accept()
            with conn:
                assert (conn.family, conn.proto) == (family, proto)  # as the listener's
                assert cli.smc_mode == conn.smc_mode == "SMCR"
                cli.sendall(b"over SMC-R")
                assert conn.recv(100) == b"over SMC-R"


def test_what_linux_refuses_to_make() -> None:
    cases = [(AF_SMC, socket.SOCK_DGRAM, 0, errno.ESOCKTNOSUPPORT),
             (AF_SMC, socket.SOCK_STREAM, 2, errno.EPROTONOSUPPORT),
             (socket.AF_INET, socket.SOCK_DGRAM, IPPROTO_SMC, errno.EPROTONOSUPPORT)]
    for family, kind, proto, expected in cases:
        with pytest.raises(OSError) as info:
            smcr.SMCSocket(family, kind, proto)
        assert info.value.errno == expected, (family, kind, proto)


def test_smc_limit_hs() -> None:
    with smcr.SMCSocket(AF_SMC, socket.SOCK_STREAM, SMCPROTO_SMC) as s:
        assert s.getsockopt(SOL_SMC, SMC_LIMIT_HS) == 0  # (Linux: net.smc.limit_smc_hs, 0)
        s.setsockopt(SOL_SMC, SMC_LIMIT_HS, 7)  # !!val
        assert s.getsockopt(SOL_SMC, SMC_LIMIT_HS) == 1
        assert s.getsockopt(SOL_SMC, SMC_LIMIT_HS, 4) == (1).to_bytes(4, sys.byteorder)
        s.setsockopt(SOL_SMC, SMC_LIMIT_HS, bytes(4))
        assert s.getsockopt(SOL_SMC, SMC_LIMIT_HS) == 0
        for bad, code in ((lambda: s.setsockopt(SOL_SMC, SMC_LIMIT_HS, b"\x01"), errno.EINVAL),
                          (lambda: s.setsockopt(SOL_SMC, 2, 1), errno.EOPNOTSUPP),
                          (lambda: s.getsockopt(SOL_SMC, 2), errno.EOPNOTSUPP)):  # fmt: skip
            with pytest.raises(OSError) as info:
                bad()
            assert info.value.errno == code
    with smcr.SMCSocket(socket.AF_INET, socket.SOCK_DGRAM) as udp, pytest.raises(OSError):
        udp.getsockopt(SOL_SMC, SMC_LIMIT_HS)  # not an SMC socket: the kernel's answer


def test_a_descriptor_is_taken_as_it_comes() -> None:
    """``socket(family, type, proto, fileno)`` does not make a socket: the C type takes the
    numbers as given (CPython's test_socket passes 43, the next unknown family, with a TCP
    descriptor); only a new socket of family 43 is an AF_SMC one."""
    fd = socket.socket(socket.AF_INET, socket.SOCK_STREAM).detach()
    with smcr.SMCSocket(AF_SMC, 11, 23, fd) as s:
        assert (s.family, s.type, s.proto) == (AF_SMC, 11, 23)
