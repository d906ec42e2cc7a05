"""A client that goes away while the server's SMC handshake runs: ``accept`` still gives
the connection, as a TCP listener does, and its reads tell what the client did.

A TCP listener queues a connection as soon as the three-way handshake is done; if the
client then resets it (an abortive close just after a non-blocking connect, as an event
loop's abort does), ``accept`` returns it and the first read raises ``ECONNRESET``.
An SMC listener runs the CLC handshake before it queues: a client that resets under it
must not vanish from the queue (Twisted's abort tests waited for it for 120 s).  Linux's
SMC queues it too (``smc_listen_out_err``).

Each story runs with smcr's listener and with the standard library's, and must go the
same way.
"""

from __future__ import annotations

import contextlib
import errno
import select
import socket
import struct
import time

import pytest

import smcr

LINGER_ZERO = struct.pack("ii", 1, 0)


def listener(kind: str) -> socket.socket:
    make = smcr.create_server if kind == "smcr" else socket.create_server
    srv = make(("127.0.0.1", 0))
    srv.settimeout(10)
    return srv


def reset_at_once(address: tuple[str, int], *, smc: bool, after: float = 0.0) -> None:
    """Connect without waiting and close abortively (``SO_LINGER`` 0) straight away, or
    ``after`` seconds."""
    client = smcr.SMCSocket() if smc else socket.socket()
    client.setblocking(False)
    with contextlib.suppress(BlockingIOError):
        client.connect(address)
    time.sleep(after)
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_ZERO)
    client.close()


def first_reads(server: socket.socket) -> tuple[str, bytes]:
    """What the accepted socket's first read raises, then what the next returns."""
    server.settimeout(10)
    try:
        data = server.recv(100)
        first = f"data {data!r}"
    except OSError as exc:
        first = type(exc).__name__
    return first, server.recv(100)


@pytest.mark.parametrize("kind", ["smcr", "tcp"])
def test_a_plain_client_that_resets_is_still_accepted(kind: str) -> None:
    """A client that resets before it sent a byte, whether the listener took it for an
    SMC peer (its handshake waits for the CLC Proposal by then) or not."""
    with listener(kind) as srv:
        for _ in range(5):
            reset_at_once(srv.getsockname(), smc=False, after=0.1)
            server, _ = srv.accept()
            with server:
                assert first_reads(server) == ("ConnectionResetError", b"")


@pytest.mark.parametrize("kind", ["smcr", "tcp"])
def test_the_reset_is_told_once_by_so_error(kind: str) -> None:
    """``SO_ERROR`` of such a socket says ``ECONNRESET`` once, as the kernel's; reads
    then see the end of the stream."""
    with listener(kind) as srv:
        reset_at_once(srv.getsockname(), smc=False)
        server, _ = srv.accept()
        with server:
            server.settimeout(10)
            errors = [server.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) for _ in range(2)]
            assert errors == [errno.ECONNRESET, 0]
            assert server.recv(100) == b""


def test_smc_clients_that_abort_while_connecting_are_all_accepted() -> None:
    """smcr clients that abort right after a non-blocking connect, at whatever point of
    the SMC handshake: each reaches ``accept``, and reading it ends in ``ECONNRESET``
    (before, most never came out of the listener's queue)."""
    with listener("smcr") as srv:
        outcomes = []
        for _ in range(20):
            reset_at_once(srv.getsockname(), smc=True)
            server, _ = srv.accept()  # (TimeoutError here: a connection lost)
            with server:
                outcomes.append(first_reads(server))
    assert set(outcomes) == {("ConnectionResetError", b"")}


@pytest.mark.parametrize("kind", ["smcr", "tcp"])
def test_the_listener_has_the_connection_once_the_connect_is_done(kind: str) -> None:
    """Both ends in one program: when a non-blocking connect is reported done, the
    listener is readable already, as TCP's is (an event loop that runs both ends
    accepts in the same round).  Over SMC-R the server's handshake ends after the
    client's (the Confirm or the CONFIRM LINK response is still on its way to it)."""
    make = smcr.SMCSocket if kind == "smcr" else socket.socket
    with listener(kind) as srv:
        srv.setblocking(False)
        for _ in range(20):
            client = make()
            client.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                client.connect(srv.getsockname())
            readable, _, _ = select.select([srv], [client], [], 10)  # (whichever first)
            assert readable, "the connect was done before the listener had it"
            server, _ = srv.accept()
            _, writable, _ = select.select([], [client], [], 10)
            assert writable and client.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
            server.close()
            client.close()
