"""``fileno()`` is one number for a socket's whole life, as a TCP socket's is, and a
selector or epoll that registered it before ``listen`` or ``connect`` goes on
watching the right file (:func:`smcr.stack.descriptors.put_at`).

Why: event loops register a socket before it connects (tornado's streams do, for
their close callback) or before it listens (asyncore), and look it up by number
afterwards; a number that changed left them with a stale registration (tornado:
a KeyError about one run in six) or none that ever fired (asyncore: a hang).
Each story runs over TCP and over smcr; both must tell the same.
"""

from __future__ import annotations

import errno
import os
import select
import socket
import threading
import time
from collections.abc import Callable

import pytest

import smcr
import smcr.socket.connecting as smcr_connecting
import smcr.socket.numbers as smcr_socket_numbers
import smcr.stack.descriptors as smcr_descriptors
import smcr.stack.readiness as smcr_readiness

Make = Callable[..., socket.socket]
KINDS: dict[str, Make] = {"tcp": socket.socket, "smc": smcr.SMCSocket}


def wait_events(ep: select.epoll, fd: int, mask: int) -> int:
    """The events of ``fd`` once one of ``mask`` is there (at most 20 s)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        for got_fd, events in ep.poll(0.1):
            assert got_fd == fd, f"an event for {got_fd}, registered: {fd}"
            if events & mask:
                return events
    raise AssertionError(f"no event {mask:#x} for {fd} in 20 s")


def listener_registered_before_listen(kind: Make) -> list[object]:
    """A listener's number, taken before ``listen`` (asyncore's dispatcher does), is
    readable in select once a client waits, and still the listener's number."""
    srv = kind(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    number = srv.fileno()
    srv.listen(5)
    srv.setblocking(False)
    client = smcr.create_connection(srv.getsockname(), timeout=20)
    seen: list[object] = [srv.fileno() == number]
    seen.append(bool(select.select([number], [], [], 20)[0]))
    conn, _ = srv.accept()
    conn.setblocking(True)
    conn.settimeout(20)
    client.sendall(b"ping")
    seen.append(conn.recv(4))
    conn.close()
    client.close()
    srv.close()
    return seen


def test_a_listener_keeps_the_number_it_had_before_listen_as_on_tcp() -> None:
    tcp, smc = (listener_registered_before_listen(make) for make in KINDS.values())
    assert tcp == smc == [True, True, b"ping"]


def connect_registered_before(kind: Make, target: str) -> list[object]:
    """tornado's story: the number is registered for reading before a non-blocking
    connect, for writing too right after it (epoll MOD), and unregistered by
    ``fileno()`` at the end; the loop then holds no registration at all."""
    if target == "smc":
        srv: socket.socket = smcr.create_server(("127.0.0.1", 0))
    else:
        srv = socket.create_server(("127.0.0.1", 0))
    addr = srv.getsockname()
    if target == "nobody":
        srv.close()
    s = kind(socket.AF_INET, socket.SOCK_STREAM)
    s.setblocking(False)
    number = s.fileno()
    ep = select.epoll()
    seen: list[object] = []
    try:
        ep.register(number, select.EPOLLIN)
        seen.append(errno.errorcode[s.connect_ex(addr)])
        ep.modify(number, select.EPOLLIN | select.EPOLLOUT)
        events = wait_events(ep, number, select.EPOLLOUT | select.EPOLLERR)
        err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        seen += [s.fileno() == number, errno.errorcode.get(err, err)]
        if not err:
            ep.modify(number, select.EPOLLIN)
            conn, _ = srv.accept()
            conn.sendall(b"pong")
            wait_events(ep, number, select.EPOLLIN)
            seen.append(s.recv(4))
            # read: nothing more to read, as on TCP (the number names what follows the socket)
            seen.append(select.select([number], [], [], 0)[0])
            conn.close()
        else:
            seen.append(bool(events & select.EPOLLERR))
        ep.unregister(s.fileno())
        seen.append(ep.poll(0.2))  # nothing registered is left to fire
    finally:
        ep.close()
        s.close()
        srv.close()
    return seen


@pytest.mark.parametrize("target", ["smc", "tcp", "nobody"])
def test_a_connect_keeps_the_number_and_its_epoll_registration_as_on_tcp(target: str) -> None:
    """Over SMC-R (an smcr server), after a fallback (a plain server) and after a refusal."""
    tcp = connect_registered_before(socket.socket, "tcp" if target == "smc" else target)
    smc = connect_registered_before(smcr.SMCSocket, target)
    assert tcp == smc
    if target == "nobody":
        assert tcp == ["EINPROGRESS", True, "ECONNREFUSED", True, []]
    else:
        assert tcp == ["EINPROGRESS", True, 0, b"pong", [], []]


@pytest.mark.parametrize("target", ["tcp-late", "nobody"])
def test_a_settled_connect_moves_the_number_in_the_programs_thread_only(
        target: str, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A connect that settles to TCP after ``connect`` returned (a peer without SMC whose
    SYN-ACK came later: ``tcp-late``, the loopback's answer hidden from ``connect``; or a
    refusal) moves the number to the TCP socket on the program's next call, in the
    program's thread: moved in the watcher's, the move (read the epoll registrations,
    unregister, ``dup2``, register) raced the program's ``ep.modify`` right after
    ``connect``, whose events were lost or which failed with ``ENOENT``."""
    threads: list[str] = []
    real = smcr_descriptors.put_at

    def put_at(number: int, source: int) -> None:
        threads.append(threading.current_thread().name)
        real(number, source)

    monkeypatch.setattr(smcr_socket_numbers, "put_at", put_at)
    monkeypatch.setattr(smcr_readiness, "put_at", put_at)
    if target == "tcp-late":
        monkeypatch.setattr(smcr_connecting, "_established", lambda sock: False)
    target = target.removesuffix("-late")
    tcp = connect_registered_before(socket.socket, target)
    smc = connect_registered_before(smcr.SMCSocket, target)
    assert tcp == smc
    me = threading.current_thread().name
    assert threads[:2] == [me, me]  # the connect's readiness in, the TCP socket back
    assert set(threads) == {me}


def test_so_error_leaves_the_move_to_the_program_s_next_call(
        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """asyncio's order: the number registered for writing after ``connect``, ``SO_ERROR``
    read when it is writable, the registration dropped, then ``fileno()`` (its
    transport's).  The move back to the TCP socket after a fallback comes at that last
    call, when no registration is left to carry (carrying one means reading the event
    loop's whole list of registrations, one per connection), and the program sees TCP's
    story: connected, then the bytes."""
    carried: list[list[tuple[int, int]]] = []
    real = smcr_descriptors.epoll_registrations

    def epoll_registrations(number: int) -> list[tuple[int, int]]:
        found = real(number)
        carried.append(found)
        return found

    monkeypatch.setattr(smcr_descriptors, "epoll_registrations", epoll_registrations)
    monkeypatch.setattr(smcr_connecting, "_established", lambda sock: False)
    srv = socket.create_server(("127.0.0.1", 0))
    s = smcr.SMCSocket(socket.AF_INET, socket.SOCK_STREAM)
    s.setblocking(False)
    number = s.fileno()
    ep = select.epoll()
    try:
        assert s.connect_ex(srv.getsockname()) == errno.EINPROGRESS
        ep.register(number, select.EPOLLOUT)
        wait_events(ep, number, select.EPOLLOUT)
        assert s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
        assert len(carried) == 1  # (the connect's move only)
        ep.unregister(number)
        assert s.fileno() == number
        assert carried == [[], []]  # the move back, after the loop let go: nothing to carry
        ep.register(number, select.EPOLLIN)
        conn, _ = srv.accept()
        conn.sendall(b"pong")
        wait_events(ep, number, select.EPOLLIN)
        assert s.recv(4) == b"pong"
        assert s.smc_info().mode == "TCP"
        conn.close()
    finally:
        ep.close()
        s.close()
        srv.close()


def test_a_peer_that_answered_without_smc_before_connect_returned_moves_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Over loopback a non-blocking connect's TCP handshake is over before ``connect``
    returns: where the peer offered no SMC, the socket is TCP at once and its number stays
    the TCP socket's throughout, as under the kernel's connect (each move looks at every
    descriptor of the process, and reads an event loop's registrations), and the program
    sees what TCP shows."""
    moves: list[int] = []
    real = smcr_descriptors.put_at

    def put_at(number: int, source: int) -> None:
        moves.append(number)
        real(number, source)

    monkeypatch.setattr(smcr_socket_numbers, "put_at", put_at)
    monkeypatch.setattr(smcr_readiness, "put_at", put_at)
    tcp = connect_registered_before(socket.socket, "tcp")
    smc = connect_registered_before(smcr.SMCSocket, "tcp")
    assert tcp == smc == ["EINPROGRESS", True, 0, b"pong", [], []]
    assert moves == []


def test_a_number_closed_by_the_program_is_not_used_by_smcr() -> None:
    """A program closes what ``fileno()`` gave (``os.close``) and a socket of its own takes
    the number: the connection's readiness changes (bytes come, are read) never touch
    that socket -- the runtime works on a number of its own (it drained the number it
    had handed out, and took the program's bytes)."""
    with smcr.create_server(("127.0.0.1", 0)) as srv:
        srv.settimeout(20)
        a = smcr.create_connection(srv.getsockname(), timeout=20)
        b, _ = srv.accept()
        b.settimeout(20)
        assert a.smc_info().mode == "SMCR"
        number = a.fileno()
        mine, other = socket.socketpair()
        os.close(number)
        os.dup2(mine.fileno(), number)
        mine.close()
        try:
            other.sendall(b"mine")
            for _ in range(3):
                b.sendall(b"x")
                assert a.recv(1) == b"x"
            os.set_blocking(number, False)
            assert os.read(number, 100) == b"mine"
        finally:
            os.close(number)
            other.close()
        b.close()
        a.close()
