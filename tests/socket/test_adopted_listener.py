"""A listening socket made from another one's number (``socket.fromfd(listener.fileno())``,
``socket.socket(fileno=os.dup(...))``, ``dup()``), as frameworks adopt a port handed over
by a supervisor or a parent: it is TCP's in every way a program looks.

A listening SMC socket's ``fileno()`` names its accept queue's readiness descriptor (readable
when a handshake has ended), not the TCP socket, so the socket made from it listens with
that queue: its addresses and options are the listening TCP socket's, its ``accept`` takes
the queue's connections (SMC-R or TCP), and the queue stays until the last of the sockets
listening with it closes, as the last descriptor of a listening socket closes it.  Each
story runs with smcr's sockets and the standard library's, and must go the same way.
"""

from __future__ import annotations

import errno
import os
import selectors
import socket

import pytest

import smcr

KINDS = ("smcr", "tcp")
FAMILIES = [("127.0.0.1", socket.AF_INET), ("::1", socket.AF_INET6)]


def listener(kind: str, host: str) -> socket.socket:
    make = smcr.create_server if kind == "smcr" else socket.create_server
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return make((host, 0), family=family)


def connect(kind: str, address: tuple[str, int]) -> socket.socket:
    make = smcr.create_connection if kind == "smcr" else socket.create_connection
    return make(address[:2], timeout=20)


def story(kind: str, host: str, adopt: str) -> list[object]:
    """What a program sees of a listener adopted from ``srv``'s number."""
    srv = listener(kind, host)
    address = srv.getsockname()
    cls = smcr.SMCSocket if kind == "smcr" else socket.socket  # (smcr run's socket.socket)
    if adopt == "fromfd":  # what socket.fromfd does
        adopted = cls(srv.family, socket.SOCK_STREAM, 0, os.dup(srv.fileno()))
    elif adopt == "fileno":
        adopted = cls(fileno=os.dup(srv.fileno()))  # family etc. from the descriptor
    else:
        adopted = srv.dup()
    seen: list[object] = [adopted.getsockname() == address, adopted.family, adopted.type,
                          adopted.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)]  # fmt: skip
    adopted.listen(5)  # (listening already: nothing changes)
    srv.close()  # the adopted socket goes on listening
    adopted.settimeout(20)
    with connect(kind, address) as client, selectors.DefaultSelector() as sel:
        sel.register(adopted, selectors.EVENT_READ)
        seen.append(len(sel.select(20)))  # readable: a connection waits
        conn, peer = adopted.accept()
        with conn:
            seen += [peer[:2] == client.getsockname()[:2], getattr(conn, "smc_mode", "TCP")]
            client.sendall(b"over the adopted listener")
            seen.append(conn.recv(100))
    adopted.close()  # the last one: the port no longer listens
    with pytest.raises(ConnectionRefusedError):
        connect(kind, address)
    return seen


@pytest.mark.parametrize("adopt", ["fromfd", "fileno", "dup"])
@pytest.mark.parametrize(("host", "family"), FAMILIES)
def test_an_adopted_listener_is_tcps(host: str, family: int, adopt: str) -> None:
    over_tcp = story("tcp", host, adopt)
    over_smc = story("smcr", host, adopt)
    assert over_tcp[-2] == "TCP" and over_smc[-2] == "SMCR"
    over_smc[-2] = "TCP"
    assert over_smc == over_tcp
    assert over_tcp[:4] == [True, family, socket.SOCK_STREAM, 1]


def test_both_listen_until_both_closed() -> None:
    """The original and the adopted socket both accept, whichever closes first."""
    srv = smcr.create_server(("127.0.0.1", 0))
    address = srv.getsockname()
    adopted = smcr.SMCSocket(socket.AF_INET, socket.SOCK_STREAM, 0, os.dup(srv.fileno()))
    for sock in (srv, adopted):
        sock.settimeout(20)
    for taker in (srv, adopted, srv):
        with connect("smcr", address) as client:
            conn, _ = taker.accept()
            with conn:
                assert isinstance(conn, smcr.SMCSocket) and conn.smc_mode == "SMCR"
                client.sendall(b"x")
                assert conn.recv(1) == b"x"
    adopted.close()
    with connect("smcr", address) as client:
        conn, _ = srv.accept()
        conn.close()
        assert client.recv(1) == b""
    srv.close()
    with pytest.raises(OSError) as info:
        connect("smcr", address)
    assert info.value.errno == errno.ECONNREFUSED


@pytest.mark.parametrize("kind", KINDS)
def test_adopted_from_a_non_blocking_listener_does_not_block(kind: str) -> None:
    """``O_NONBLOCK`` belongs to the descriptor both numbers name: made from a non-blocking
    listener, the new socket says ``gettimeout() is None`` as TCP's does, and its accept
    still returns at once (Twisted's ``adoptStreamPort`` accepts until ``EAGAIN``)."""
    srv = listener(kind, "127.0.0.1")
    srv.setblocking(False)
    cls = smcr.SMCSocket if kind == "smcr" else socket.socket
    adopted = cls(srv.family, socket.SOCK_STREAM, 0, os.dup(srv.fileno()))
    with srv, adopted:
        assert adopted.gettimeout() is None
        with pytest.raises(BlockingIOError):
            adopted.accept()
