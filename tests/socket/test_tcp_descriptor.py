"""An SMC-R connection's TCP socket is held by one descriptor, which the program's socket
object and the runtime share (:mod:`smcr.socket.tcphold`): whichever lets go last closes
it, and neither closes it under the other (close, collection, a forked child).

Why: each held its own (a ``dup``), one descriptor more per connection, and at thousands
of connections descriptors are what a process runs out of first.
"""

from __future__ import annotations

import gc
import os
import selectors
import socket
import time
import warnings

import pytest

import smcr
from smcr.socket.sharing import same_file, socket_file
from smcr.socket.tcphold import RuntimeTcp, TcpHold


def descriptors_of(sock_fd: int) -> list[int]:
    """This process's descriptors that name the socket ``sock_fd`` names."""
    key = file_key(sock_fd)
    return [int(name) for name in os.listdir("/proc/self/fd") if same_file(int(name), key)]


def file_key(fd: int) -> tuple[int, int]:
    key = socket_file(fd)
    assert key is not None
    return key


def tcp_fd(s: smcr.SMCSocket) -> int:
    """The descriptor of ``s``'s own TCP socket (not the number ``fileno()`` gives out)."""
    return socket.socket.fileno(s)


def wait_until(check: object, what: str) -> None:
    deadline = time.monotonic() + 20
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def connected(server: smcr.SMCSocket, how: str) -> tuple[smcr.SMCSocket, smcr.SMCSocket]:
    """A client connected ``how`` (blocking, blocking with its number asked for first,
    non-blocking with its number registered first) and the server's end."""
    client = smcr.SMCSocket()
    if how == "blocking":
        client.settimeout(20)
        client.connect(server.getsockname())
    elif how == "number first":
        client.settimeout(20)
        client.fileno()
        client.connect(server.getsockname())
    else:
        client.setblocking(False)
        with selectors.DefaultSelector() as sel:
            sel.register(client, selectors.EVENT_WRITE)
            client.connect_ex(server.getsockname())
            assert sel.select(20)
        client.settimeout(20)
    accepted, _ = server.accept()
    assert isinstance(accepted, smcr.SMCSocket)
    accepted.settimeout(20)
    return client, accepted


@pytest.mark.parametrize("how", ["blocking", "number first", "non-blocking"])
def test_each_end_holds_its_tcp_socket_by_one_descriptor(server: smcr.SMCSocket,
                                                         how: str) -> None:  # fmt: skip
    client, accepted = connected(server, how)
    with client, accepted:
        assert client.smc_info().mode == accepted.smc_info().mode == "SMCR"
        for end in (client, accepted):
            end.fileno()  # (its readiness descriptor: not the TCP socket's)
            hc = end._hc
            assert hc is not None
            assert descriptors_of(tcp_fd(end)) == [tcp_fd(end)] == [hc.tcp.fileno()]
        client.sendall(b"ping")
        assert accepted.recv(4) == b"ping"
        assert client.getsockname() == accepted.getpeername()


def test_the_program_closes_first_and_the_runtime_closes_the_descriptor_after(
        server: smcr.SMCSocket) -> None:  # fmt: skip
    client, accepted = connected(server, "blocking")
    fd = tcp_fd(client)
    key = file_key(fd)
    hc = client._hc
    assert hc is not None
    client.sendall(b"x" * 100_000)
    client.close()
    assert descriptors_of(fd) == [fd] == [hc.tcp.fileno()]  # (the runtime's, still)
    got = bytearray()
    while data := accepted.recv(65536):
        got += data
    assert got == b"x" * 100_000
    accepted.close()
    wait_until(lambda: hc.released, "the runtime never let the connection go")
    assert not same_file(fd, key)


def test_a_collected_socket_warns_and_leaves_the_runtime_its_descriptor(
        server: smcr.SMCSocket) -> None:  # fmt: skip
    client, accepted = connected(server, "blocking")
    fd, hc = tcp_fd(client), client._hc
    assert hc is not None
    key = file_key(fd)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del client
        gc.collect()
        warned = [str(w.message) for w in caught if w.category is ResourceWarning
                  and "SMCSocket" in str(w.message)]  # fmt: skip
    del caught  # (a warning's source is the socket: recorded, it would keep it alive)
    gc.collect()
    assert warned, "no ResourceWarning"
    assert hc.tcp.fileno() in (fd, -1)
    if hc.tcp.fileno() == fd:  # (still the runtime's: the same socket under it)
        assert same_file(fd, key)
    assert accepted.recv(1) == b""  # the collected end closed as close() would
    accepted.close()
    wait_until(lambda: hc.released, "the runtime never let the connection go")


def test_after_a_fallback_the_program_holds_the_descriptor_alone(
        server: smcr.SMCSocket) -> None:  # fmt: skip
    """The runtime lets go first (the handshake fell back): the program's socket goes on
    over TCP on the descriptor, and its close closes it."""
    plain = socket.create_connection(server.getsockname(), timeout=20)  # not SMC
    accepted, _ = server.accept()
    with plain:
        assert accepted.smc_info().mode == "TCP"
        fd = tcp_fd(accepted)
        key = file_key(fd)
        assert descriptors_of(fd) == [fd]
        plain.sendall(b"hi")
        assert accepted.recv(2) == b"hi"
        accepted.close()
        assert not same_file(fd, key)
        assert plain.recv(1) == b""


# ---------------------------------------------------------------- the hold itself


def test_whoever_lets_go_last_closes() -> None:
    first = TcpHold(-1, app=True)
    shared_at_first = first.shared
    assert shared_at_first
    assert not first.app_lets_go()
    assert (first.app, first.runtime, first.shared) == (False, True, False)
    assert first.runtime_lets_go()
    second = TcpHold(-1, app=True)
    assert not second.runtime_lets_go()
    assert second.app_lets_go()


def test_the_program_joins_only_while_the_runtime_holds() -> None:
    hold = TcpHold(-1, app=False)
    alone = not hold.shared
    assert alone
    assert hold.join()
    assert (hold.app, hold.runtime, hold.shared) == (True, True, True)
    late = TcpHold(-1, app=False)
    assert late.runtime_lets_go()  # (nobody else held it: closed by the runtime)
    assert not late.join()


def test_in_a_forked_child_the_runtime_never_closes_and_the_program_always_does() -> None:
    hold = TcpHold(-1, app=True)
    hold.pid = os.getpid() + 1  # (as a copy of the parent's looks in the child)
    assert not hold.shared and not hold.join()
    assert not hold.runtime_lets_go()
    assert hold.app_lets_go()


def test_the_runtime_object_collected_unclosed_lets_go_without_closing_a_held_number() -> None:
    a, b = socket.socketpair()
    with a, b:
        hold = TcpHold(a.fileno(), app=True)
        runtime = RuntimeTcp(socket.AF_UNIX, socket.SOCK_STREAM, 0, a.fileno())
        runtime.hold = hold
        del runtime
        gc.collect()
        assert not hold.runtime and hold.app
        a.sendall(b"still open")
        assert b.recv(10) == b"still open"
