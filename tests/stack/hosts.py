"""Runtimes (:class:`smcr.stack.runtime.Stack`) side by side in this process, as hosts.

Each :class:`Host` is a ``Stack`` on its own shm RNIC, with its own engine and
progress thread: to the others it is another machine.  :func:`connect` joins
two with an SMC-R connection over a TCP socket pair (the CLC handshake runs in
the runtimes, as under ``SMCSocket``); :func:`send` and :func:`read` move bytes
the way the socket layer does (inline into the peer's RMBE; consumed from our
RMBE), nothing more.  Every wait has a deadline.
"""

from __future__ import annotations

import ipaddress
import itertools
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from smcr.core import Config, FellBack, HandshakeCompleted
from smcr.core.connection import Connection
from smcr.rdma.shm import ShmDevice
from smcr.stack.hostconn import HostConn
from smcr.stack.runtime import Stack

LOOPBACK = ipaddress.IPv4Address("127.0.0.1")
SIZE = 1 << 16  # every buffer: a small RMB and send buffer, quick to fill
_names = itertools.count()


@contextmanager
def hosts(n: int, max_buffers: int = 64) -> Iterator[list[Stack]]:
    """``n`` runtimes, each on its own shm RNIC; closed at the end."""
    made = []
    try:
        for _ in range(n):
            device = ShmDevice(f"t{os.getpid()}h{next(_names)}")
            made.append(Stack(Config(sndbuf_size=SIZE, rmb_size=SIZE), max_buffers, device))
        yield made
    finally:
        for stack in made:
            stack.close()


def wait(stack: Stack, hc: HostConn, ready: Callable[[], bool], timeout: float = 10.0) -> None:
    """Until ``ready()`` (checked with the runtime's lock held), or fail."""
    with stack.lock:
        assert stack.wait(hc, ready, time.monotonic() + timeout), "not within the deadline"


def connect(server: Stack, client: Stack) -> tuple[HostConn, HostConn]:
    """An SMC-R connection between two runtimes; returns (server's, client's) side."""
    a, b = socket.socketpair()
    ends = []
    for stack, tcp, is_client in ((server, a, False), (client, b, True)):
        with stack.lock:
            hc = stack.new_conn(tcp)
            stack.start_handshake(hc, is_client, LOOPBACK, 0, 0)
        ends.append(hc)
    for stack, hc in ((server, ends[0]), (client, ends[1])):
        wait(stack, hc, lambda hc=hc: hc.outcome is not None)  # type: ignore[misc]
        assert isinstance(hc.outcome, HandshakeCompleted), hc.outcome
    return ends[0], ends[1]


def handshake_outcome(server: Stack, client: Stack) -> tuple[object, object]:
    """Try a connection; both sides' handshake outcomes (events)."""
    a, b = socket.socketpair()
    ends = []
    for stack, tcp, is_client in ((server, a, False), (client, b, True)):
        with stack.lock:
            hc = stack.new_conn(tcp)
            stack.start_handshake(hc, is_client, LOOPBACK, 0, 0)
        ends.append((stack, hc))
    for stack, hc in ends:
        wait(stack, hc, lambda hc=hc: hc.outcome is not None)  # type: ignore[misc]
    return ends[0][1].outcome, ends[1][1].outcome


def conn(stack: Stack, hc: HostConn) -> Connection:
    """The engine's record of a connection."""
    c = stack.engine_conn(hc)
    assert c is not None
    return c


def send(stack: Stack, hc: HostConn, data: bytes) -> None:
    """Write ``data`` straight into the peer's RMBE with its CDC (the inline data path)."""
    with stack.lock:
        c = conn(stack, hc)
        assert c.direct_room() >= len(data)
        stack.send_inline(c, memoryview(data))


def read(stack: Stack, hc: HostConn, n: int) -> bytes:
    """Wait for ``n`` bytes in our RMBE, take them (consumer cursor moved, as recv does)."""
    c = conn(stack, hc)
    wait(stack, hc, lambda: c.rx_available() >= n)
    with stack.lock:
        start, size = c.rx_cons % c.rmb.size, c.rmb.size
        first = min(n, size - start)  # the RMBE is a ring
        data = bytes(hc.rmb[start : start + first]) + bytes(hc.rmb[: n - first])
        stack.execute(stack.engine.data_consumed(hc.conn_id, n, time.monotonic()))
    return data


def fell_back(outcome: object) -> tuple[int, int]:
    """The (local, peer) decline codes of a fallback outcome."""
    assert isinstance(outcome, FellBack), outcome
    return outcome.local_code, outcome.peer_code
