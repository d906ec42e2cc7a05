"""Linux's own SMC socket API on smcr's sockets: a program written for the kernel's SMC runs
unchanged (under ``smcr run``, or with :class:`smcr.SMCSocket`).

Linux offers ``socket(AF_SMC, SOCK_STREAM, SMCPROTO_SMC | SMCPROTO_SMC6)`` (IPv4 or IPv6
beneath, ``net/smc/af_smc.c`` ``smc_create``) and, since 6.11,
``socket(AF_INET | AF_INET6, SOCK_STREAM, IPPROTO_SMC)`` (``smc_inet.c``), with socket
options at level ``SOL_SMC`` (``SMC_LIMIT_HS``).  On a kernel without SMC these fail with
``EAFNOSUPPORT``/``EPROTONOSUPPORT``; here the socket beneath is TCP's of the family the
kernel's SMC would use, and the socket shows the family and protocol it was made with
(``family``, ``proto``), as the kernel's does.  Addresses are ``(host, port)`` tuples of
that family (CPython has no address format of its own for ``AF_SMC``).
"""

from __future__ import annotations

import errno
import os
import socket as _socket
import sys

AF_SMC = 43
SMCPROTO_SMC = 0
"""``AF_SMC`` over IPv4."""
SMCPROTO_SMC6 = 1
"""``AF_SMC`` over IPv6."""
IPPROTO_SMC = 256
SOL_SMC = 286
SMC_LIMIT_HS = 1
"""``SOL_SMC`` option: limit handshakes while the listener's are congested (int, 0 or 1)."""

_FLAGS = int(getattr(_socket, "SOCK_NONBLOCK", 0)) | int(getattr(_socket, "SOCK_CLOEXEC", 0))
_INET = (int(_socket.AF_INET), int(_socket.AF_INET6))


def beneath(family: int, kind: int, proto: int) -> tuple[int, int, tuple[int, int] | None]:
    """For ``socket(family, kind, proto)``: the family and protocol of the TCP socket that
    serves it, and the (family, protocol) it shows (None: the TCP socket's own).

    :raises OSError: as Linux for an SMC socket it cannot make: ``ESOCKTNOSUPPORT`` for
        ``AF_SMC`` of another type, ``EPROTONOSUPPORT`` for another ``AF_SMC`` protocol
        or an ``IPPROTO_SMC`` socket that is not a stream.
    """
    if family == AF_SMC:
        if kind != -1 and kind & ~_FLAGS != _socket.SOCK_STREAM:
            raise OSError(errno.ESOCKTNOSUPPORT, os.strerror(errno.ESOCKTNOSUPPORT))
        if proto in (-1, SMCPROTO_SMC):
            return int(_socket.AF_INET), 0, (AF_SMC, SMCPROTO_SMC)
        if proto == SMCPROTO_SMC6:
            return int(_socket.AF_INET6), 0, (AF_SMC, SMCPROTO_SMC6)
        raise OSError(errno.EPROTONOSUPPORT, os.strerror(errno.EPROTONOSUPPORT))
    if proto == IPPROTO_SMC and family in _INET:
        if kind != -1 and kind & ~_FLAGS != _socket.SOCK_STREAM:
            raise OSError(errno.EPROTONOSUPPORT, os.strerror(errno.EPROTONOSUPPORT))
        return family, 0, (family, IPPROTO_SMC)
    return family, proto, None


def _only_limit_hs(optname: int) -> None:
    """``SMC_LIMIT_HS`` is the only ``SOL_SMC`` option (``EOPNOTSUPP`` else, as Linux's
    ``__smc_setsockopt``/``__smc_getsockopt``).  Kept and reported; smcr's accept queue
    runs every handshake in the background whatever its value."""
    if optname != SMC_LIMIT_HS:
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))


def get_option(optname: int, value: int, args: tuple[object, ...]) -> int | bytes:
    """``getsockopt(SOL_SMC, optname[, buflen])`` of a socket whose option is ``value``."""
    _only_limit_hs(optname)
    if not args:
        return value
    return value.to_bytes(4, sys.byteorder)[: int(args[0])]  # type: ignore[call-overload]


def set_option(optname: int, value: object, args: tuple[object, ...]) -> int:
    """The int a ``setsockopt(SOL_SMC, SMC_LIMIT_HS, value)`` sets (``!!val``, as
    ``__smc_setsockopt``); bytes as C passes them (at least an int's size)."""
    _only_limit_hs(optname)
    if args:
        raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        if len(raw) < 4:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return int(int.from_bytes(raw[:4], sys.byteorder) != 0)
    if not isinstance(value, int):
        raise TypeError("an integer or a bytes-like object is required")
    return int(value != 0)
