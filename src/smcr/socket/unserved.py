"""A connection whose address has no RNIC smcr can open (``SMCR_RNIC=verbs`` on a host
without the device or without pyverbs): declined with ``NOSMCRDEV``, then plain TCP.

Why a decline and not silence: the peer offered SMC and, as a client, has sent or will
send its CLC Proposal; as a server it waits for one.  Linux answers both with a CLC
Decline ``SMC_CLC_DECL_NOSMCRDEV`` (``smc_find_proposal_devices`` on the client,
``smc_listen_find_device`` on the server) and both ends go on over TCP, so smcr does the
same.  A server without a runtime has no engine to read the Proposal, so a short-lived
thread does: it reads exactly one CLC message (bounded by the CLC wait time, so a client
that sends nothing holds nothing for long), answers, and hands the connection to
``accept()``; bytes that are not a CLC message stay for the program (a client that fell
back on its own).
"""

from __future__ import annotations

import errno
import threading
import time
from collections.abc import Callable
from typing import Final

from smcr import plainsock
from smcr.core.config import Config
from smcr.socket.base import PlainSocket, SocketBase
from smcr.wire.clc import (
    CLC_HEADER_LEN,
    EYECATCHER_SMCD,
    EYECATCHER_SMCR,
    ClcDecline,
    ClcType,
)
from smcr.wire.decline import DeclineCode

NO_RNIC: Final = frozenset((errno.ENODEV,))
"""The errors of a runtime that cannot open its RNIC (:func:`smcr.stack.runtime.get_stack`)."""
CODE: Final = DeclineCode.NOSMCRDEV


def send_decline(sock: SocketBase, code: DeclineCode, version: int = 1) -> None:
    """Send Linux's CLC Decline for ``code`` on the TCP connection itself: for a handshake
    that never got a runtime (no RNIC here, or no descriptor or memory for one: the
    callers in :mod:`smcr.socket.handshake`).  A peer gone meanwhile: TCP will say so."""
    try:
        PlainSocket.sendall(sock, ClcDecline.linux(code, version=version).encode())
    except OSError:
        pass


def _read(sock: SocketBase, n: int, deadline: float) -> bytes:
    """Up to ``n`` bytes by ``deadline`` (fewer: the peer closed or went quiet)."""
    out = b""
    fd = PlainSocket.fileno(sock)
    while len(out) < n:
        left = deadline - time.monotonic()
        if left <= 0 or not plainsock.ready(fd, timeout=left):
            break
        try:
            chunk = PlainSocket.recv(sock, n - len(out))
        except (BlockingIOError, InterruptedError):
            continue
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    return out


def server_declines(sock: SocketBase, done: Callable[[], None]) -> None:
    """Read the client's Proposal, decline it, then ``done()`` (in a thread of its own;
    module docstring).  The socket's fallback fields are set before ``done``."""

    def run() -> None:
        deadline = time.monotonic() + Config().clc_wait
        head = _read(sock, CLC_HEADER_LEN, deadline)
        if len(head) == CLC_HEADER_LEN and head[:4] in (EYECATCHER_SMCR, EYECATCHER_SMCD):
            length = int.from_bytes(head[5:7], "big")
            _read(sock, max(length - CLC_HEADER_LEN, 0), deadline)
            if head[4] == ClcType.PROPOSAL:  # (a client's own Decline needs no answer)
                send_decline(sock, CODE, 2 if head[7] >> 4 >= 2 else 1)
        else:
            sock._prefix = head  # not a CLC message: the program's bytes
        done()

    threading.Thread(target=run, name="smcr-decline", daemon=True).start()
