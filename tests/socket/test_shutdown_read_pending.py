"""shutdown(SHUT_RD) on SMC-R still returns the bytes already received, as TCP does.

Linux TCP, and Linux SMC (``smc_rx_recvmsg``: RCV_SHUTDOWN ends a read only when no
data is available), return the bytes that are there after SHUT_RD.
"""

from __future__ import annotations

import select
import socket

import pytest

from tests.socket.test_error_paths import outcome, pair


def wait_readable(s: socket.socket) -> None:
    assert select.select([s], [], [], 10)[0], "the bytes did not arrive"


def pending_story(a: socket.socket, b: socket.socket, how: int) -> list[object]:
    b.sendall(b"queued")
    wait_readable(a)
    a.shutdown(how)
    seen: list[object] = [outcome(lambda: a.recv(100))]
    seen.append(outcome(lambda: a.recv(100)))
    return seen


@pytest.mark.parametrize("how", [socket.SHUT_RD, socket.SHUT_RDWR], ids=["RD", "RDWR"])
def test_shutdown_read_still_returns_the_bytes_already_received(how: int) -> None:
    with pair("tcp") as (a, b):
        tcp = pending_story(a, b, how)
    with pair("smc") as (a, b):
        smc = pending_story(a, b, how)
    assert tcp == [b"queued", b""]
    assert smc == tcp
