"""A process out of descriptors while SMC-R connections start: never a hang.

An SMC-R connection needs descriptors a TCP one does not (its readiness descriptor, made
when the program asks for it), so a handshake starts only with a descriptor to spare
(:func:`smcr.socket.headroom.descriptors_free`, asked with the TCP socket), and a process
at its descriptor limit can have a TCP connect succeed and the handshake fail to start.
A client then declines (CLC Decline ``MEM``, as Linux's ``smc_connect_decline_fallback``)
and both ends go on over TCP; a server refuses that peer and ``accept`` raises the error,
as it raises TCP's own ``EMFILE``, with the listener usable afterwards.  The limit is
reached for one end only, by failing exactly the probe asked with that end's TCP socket
(a real limit would hit the other end too, which lives in this process).
"""

from __future__ import annotations

import contextlib
import errno
import os
import selectors
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import smcr
from smcr.socket import headroom
from smcr.wire.decline import DeclineCode
from tests.socket.conftest import Peer

MEM = int(DeclineCode.MEM)


def _ports(fd: int) -> tuple[int, int]:
    """(local, peer) port of a connected TCP descriptor (no descriptor made to learn it)."""
    probe = socket.socket(fileno=fd)
    try:
        local, peer = probe.getsockname(), probe.getpeername()
    finally:
        probe.detach()
    if not (isinstance(local, tuple) and isinstance(peer, tuple)):
        raise OSError(errno.ENOTSOCK, "not a TCP socket")  # (a socketpair's end)
    return local[1], peer[1]


def _no_descriptor_for(monkeypatch: pytest.MonkeyPatch,
                       which: Callable[[int, int], bool]) -> list[int]:  # fmt: skip
    """No descriptor is free (:func:`~smcr.socket.headroom.descriptors_free`) when asked
    with a TCP socket whose (local, peer) ports ``which`` picks; the list counts those."""
    real_free, failed = headroom.descriptors_free, []

    def descriptors_free(fd: int, count: int) -> bool:
        try:
            ports = _ports(fd)
        except OSError:
            ports = (0, 0)
        if ports != (0, 0) and which(*ports):
            failed.append(fd)
            return False
        return real_free(fd, count)

    monkeypatch.setattr(headroom, "descriptors_free", descriptors_free)
    return failed


def _talk(a: socket.socket, b: socket.socket) -> None:
    """Bytes both ways, intact: nothing of the handshake is left in the stream."""
    a.sendall(b"ping" * 1000)
    got = b""
    while len(got) < 4000:
        got += b.recv(4000 - len(got))
    assert got == b"ping" * 1000
    b.sendall(b"pong")
    assert a.recv(4) == b"pong"


@pytest.mark.parametrize("blocking", [True, False])
def test_a_client_out_of_descriptors_declines_and_both_go_on_over_tcp(
        blocking: bool, server: smcr.SMCSocket,
        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    port = server.getsockname()[1]
    failed = _no_descriptor_for(monkeypatch, lambda _local, peer: peer == port)
    if blocking:
        client = smcr.create_connection(("127.0.0.1", port), timeout=20)
    else:
        client = smcr.SMCSocket()
        client.setblocking(False)
        assert client.connect_ex(("127.0.0.1", port)) == errno.EINPROGRESS
        with selectors.DefaultSelector() as sel:
            sel.register(client, selectors.EVENT_WRITE)
            assert sel.select(20), "the connect never settled"
        assert client.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
        client.setblocking(True)
        client.settimeout(20)
    with client:
        accepted, _ = server.accept()
        assert isinstance(accepted, smcr.SMCSocket)
        with accepted:
            assert len(failed) == 1
            info, peer_info = client.smc_info(), accepted.smc_info()
            assert (info.mode, info.local_code) == ("TCP", MEM)
            assert (peer_info.mode, peer_info.peer_code) == ("TCP", MEM)
            _talk(client, accepted)


def test_a_server_out_of_descriptors_refuses_the_peer_and_accept_raises_it(
        server: smcr.SMCSocket, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    port = server.getsockname()[1]
    failed = _no_descriptor_for(monkeypatch, lambda local, _peer: local == port)
    try:
        refused = smcr.create_connection(("127.0.0.1", port), timeout=20)
    except OSError:
        refused = None  # (the handshake met the closed peer: as good as a reset)
    with pytest.raises(OSError) as raised:
        server.accept()
    assert raised.value.errno == errno.EMFILE
    assert len(failed) == 1
    if refused is not None:  # closed by the server: end of stream or a reset, never a hang
        refused.settimeout(20)
        with contextlib.suppress(ConnectionError):
            assert refused.recv(1) == b""
        refused.close()
    monkeypatch.undo()  # descriptors again: the listener goes on
    with smcr.create_connection(("127.0.0.1", port), timeout=20) as client:
        accepted, _ = server.accept()
        with accepted:
            assert client.smc_info().mode == "SMCR"
            _talk(client, accepted)


def test_a_non_blocking_connect_without_a_descriptor_to_spare_goes_on_over_tcp(
        server: smcr.SMCSocket, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The connect's own machinery (its readiness descriptor) cannot be made: the kernel's
    connect needs no descriptor, so it goes on as TCP's, and the server hears why (a
    Decline, ``MEM``) before the program's first byte."""
    port = server.getsockname()[1]
    client = smcr.SMCSocket()
    client.setblocking(False)
    with monkeypatch.context() as patched:

        def no_descriptor(*_args: object, **_kwargs: object) -> None:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

        patched.setattr("smcr.socket.connecting.Connecting", no_descriptor)
        assert client.connect_ex(("127.0.0.1", port)) == errno.EINPROGRESS
    with client, selectors.DefaultSelector() as sel:
        sel.register(client, selectors.EVENT_WRITE)
        assert sel.select(20), "the connect never settled"
        assert client.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
        client.setblocking(True)
        client.settimeout(20)
        assert (client.smc_info().mode, client.smc_info().local_code) == ("TCP", MEM)
        client.sendall(b"x")  # the Decline goes first
        accepted, _ = server.accept()
        with accepted:
            assert (accepted.smc_info().mode, accepted.smc_info().peer_code) == ("TCP", MEM)
            assert accepted.recv(1) == b"x"
            _talk(client, accepted)


def test_accept_without_a_free_descriptor_raises_and_keeps_the_connection(
        server: smcr.SMCSocket, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """As accept(2), which takes a number before it looks at the queue: EMFILE, the
    connection (accepted in the background, its descriptors its own) stays queued."""
    with smcr.create_connection(server.getsockname(), timeout=20) as client:
        with monkeypatch.context() as patched:

            def no_descriptor(_fd: int) -> int:
                raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

            patched.setattr(os, "dup", no_descriptor)
            with pytest.raises(OSError) as raised:
                server.accept()
            assert raised.value.errno == errno.EMFILE
        accepted, _ = server.accept()
        with accepted:
            assert accepted.smc_info().mode == client.smc_info().mode == "SMCR"
            _talk(client, accepted)


def _reserve_dance(ctl: Any) -> None:
    """An event loop's recovery from EMFILE, in a process of its own (it takes every free
    descriptor): at its limit, it closes a reserved descriptor, accepts and closes the
    peer, and reserves again, which must succeed (no background work took the number it
    freed).  Reports what each step saw."""
    seen: list[str] = []
    exhausted: list[int] = []
    try:
        srv = smcr.create_server(("127.0.0.1", 0))
        srv.setblocking(False)
        reserve = os.open("/dev/null", os.O_RDONLY)
        client = smcr.SMCSocket()
        client.setblocking(False)
        with selectors.DefaultSelector() as sel:
            sel.register(srv, selectors.EVENT_READ)
            with contextlib.suppress(OSError):
                while True:
                    exhausted.append(os.dup(0))
            with contextlib.suppress(BlockingIOError):  # (TCP: no descriptor for SMC-R's)
                client.connect(srv.getsockname())
            for _ in range(50):
                if not sel.select(10):
                    seen.append("no connection")
                    break
                try:
                    accepted, _ = srv.accept()
                except BlockingIOError:
                    continue
                except OSError as exc:
                    seen.append(errno.errorcode[exc.errno or 0])
                    os.close(reserve)
                    with contextlib.suppress(OSError):
                        while True:
                            peer, _ = srv.accept()
                            peer.close()
                            seen.append("closed the peer")
                    reserve = os.open("/dev/null", os.O_RDONLY)  # (EMFILE: the test fails)
                    seen.append("reserved again")
                    break
                accepted.close()
                seen.append("accepted at the limit")
                break
        for fd in exhausted:
            os.close(fd)
        exhausted.clear()
        client.close()
        with smcr.create_connection(srv.getsockname(), timeout=20) as again:
            srv.setblocking(True)
            srv.settimeout(20)
            taken, _ = srv.accept()
            with taken:
                again.sendall(b"ok")
                seen.append(f"{taken.smc_info().mode} {taken.recv(2)!r}")
        ctl.send(seen)
    except BaseException as exc:
        ctl.send([*seen, repr(exc)])
    finally:
        for fd in exhausted:
            os.close(fd)


def test_an_event_loop_recovers_from_emfile_with_its_reserved_descriptor() -> None:
    """Twisted's EMFILE recovery: the number it frees for ``accept`` is still free when
    it reserves it again, and the listener goes on with SMC-R afterwards."""
    peer = Peer(_reserve_dance)
    try:
        seen = peer.recv(60)
    finally:
        peer.stop()
    assert seen[-2:] == ["reserved again", "SMCR b'ok'"], seen
    assert seen[0] == "EMFILE", seen


def test_an_accept_loop_with_a_timeout_never_opens_a_number_another_thread_closed(
        server: smcr.SMCSocket) -> None:  # fmt: skip
    """A server thread that calls ``accept`` with a short timeout, again and again, takes
    no descriptor number while no connection comes: one the program just closed stays
    closed (CPython's ``test_makefile_close`` reads its closed number to see EBADF)."""
    server.settimeout(0.001)
    stop = threading.Event()

    def accept_loop() -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                server.accept()[0].close()

    looper = threading.Thread(target=accept_loop)
    looper.start()
    seen_open = 0
    try:
        closed = os.open("/dev/null", os.O_RDONLY)  # (the lowest free number)
        os.close(closed)
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            try:
                os.fstat(closed)
            except OSError as exc:
                assert exc.errno == errno.EBADF
            else:
                seen_open += 1
    finally:
        stop.set()
        looper.join()
    assert seen_open == 0
