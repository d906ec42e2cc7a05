"""Both ends of a connection in one process (what test suites and in-process servers do):
the sending thread takes what it made for the other end itself, and the runtime's
progress thread, asleep on the CQ, is not woken for it -- while it is still woken for
what a peer in another process sends."""

from __future__ import annotations

import errno
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable

import pytest

import smcr
from smcr.socket import acceptq
from smcr.stack import progress
from tests.socket.conftest import Peer
from tests.socket.smc_peer import echo_client, echo_server, host
from tests.support import voluntary_switches


def _round_trip(a: socket.socket, b: socket.socket, data: bytes) -> None:
    """``a`` sends ``data``; ``b`` waits for it as an event loop does (select on its
    descriptor, then a non-blocking recv)."""
    a.send(data)
    assert select.select([b], [], [], 5.0)[0], "the other end never turned readable"
    assert b.recv(len(data)) == data


def test_messages_between_ends_in_one_process_leave_the_progress_thread_asleep() -> None:
    peer = Peer(echo_server)
    remote = smcr.SMCSocket(socket.AF_INET, socket.SOCK_STREAM)
    lst = smcr.SMCSocket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        remote.connect((host(), peer.recv()))
        assert peer.recv()[0] == "SMCR"
        remote.setblocking(False)
        remote.send(b"hello")
        assert select.select([remote], [], [], 5.0)[0] and remote.recv(5) == b"hello"

        lst.bind((host(), 0))
        lst.listen(1)
        client = smcr.SMCSocket(socket.AF_INET, socket.SOCK_STREAM)
        client.connect(lst.getsockname())
        server, _ = lst.accept()
        with client, server:
            assert client.smc_info().mode == server.smc_info().mode == "SMCR"
            client.setblocking(False)
            server.setblocking(False)
            _round_trip(client, server, b"warm")
            before, started = voluntary_switches("smcr-progress"), time.monotonic()
            for i in range(200):
                _round_trip(client, server, b"x%03d" % i)
                _round_trip(server, client, b"y%03d" % i)
            woken = voluntary_switches("smcr-progress") - before
            # its own look-ins (every STANDBY after an application polled) are not the
            # messages': a slow machine's longer loop has more of them
            timers = (time.monotonic() - started) / progress.STANDBY
            # before: about three wake-ups a message (each CDC rang the CQ it sleeps on)
            assert woken - timers < 100, (f"the progress thread woke {woken} times for 400 "
                                          f"messages ({timers:.0f} look-ins due)")  # fmt: skip

        # the CQ was armed again after each of those: a remote peer's answer, which only
        # the progress thread takes here (nobody polls), still wakes it at once (else it
        # waited for the thread's next timeout, seconds)
        for i in range(5):
            remote.send(b"ping%d" % i)
            assert select.select([remote], [], [], 2.0)[0], "the remote answer rang nobody"
            assert remote.recv(5) == b"ping%d" % i
    finally:
        lst.close()
        remote.close()
        peer.stop()


def _pair(make: type[socket.socket]) -> tuple[socket.socket, socket.socket]:
    """A connected pair in this process, both ends non-blocking."""
    with make(socket.AF_INET, socket.SOCK_STREAM) as lst:
        lst.bind((host(), 0))
        lst.listen(1)
        client = make(socket.AF_INET, socket.SOCK_STREAM)
        client.connect(lst.getsockname())
        server, _ = lst.accept()
    client.setblocking(False)
    server.setblocking(False)
    return client, server


def _shut_wr(server: socket.socket) -> None:
    server.shutdown(socket.SHUT_WR)


def _abort(server: socket.socket) -> None:
    server.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    server.close()


@pytest.mark.parametrize("make", [socket.socket, smcr.SMCSocket], ids=["tcp", "smcr"])
@pytest.mark.parametrize(
    ("act", "expect"),
    [(_shut_wr, b""), (lambda s: s.close(), b""), (_abort, ConnectionResetError),
     (lambda s: s.send(b"x"), b"x")],
    ids=["shutdown", "close", "abort", "send"],
)
def test_the_other_end_sees_a_shutdown_close_or_abort_before_the_call_returns(
    make: type[socket.socket], act: Callable[[socket.socket], object],
    expect: bytes | type[Exception],
) -> None:  # fmt: skip
    """Over loopback TCP the other end of a shutdown, a close or an abort is readable
    when the call returns; a program that runs both ends in one event loop and looks
    once (select with no timeout) finds it so.  On SMC-R, too: the call takes what it
    sent its local peer itself (the progress thread, standing by while the program
    polls, would look in only 0.01-0.1 s later)."""
    client, server = _pair(make)
    try:
        if isinstance(client, smcr.SMCSocket) and isinstance(server, smcr.SMCSocket):
            assert client.smc_info().mode == server.smc_info().mode == "SMCR"
        # a blocking read that times out, as a program's would: on SMC-R its thread polled
        # the CQ, and the progress thread stands by for a while after it
        client.settimeout(0.005)
        with pytest.raises(TimeoutError):
            client.recv(1)
        client.setblocking(False)
        act(server)
        assert select.select([client], [], [], 0)[0] == [client]
        if isinstance(expect, bytes):
            assert client.recv(10) == expect
        else:
            with pytest.raises(expect):
                client.recv(10)
    finally:
        client.close()
        server.close()


def _echo_for_another_process(lst: socket.socket, size: int) -> tuple[str, bool]:
    """A client in another process connects to ``lst`` and sends ``size`` bytes; accept it
    (the listener must turn readable on its own: the background accept), echo them, and
    return what the client reports: its mode and whether the echo was intact."""
    peer = Peer(echo_client, host(), lst.getsockname()[1], size)
    try:
        assert select.select([lst], [], [], 20.0)[0], "the other process's client waits"
        server, _ = lst.accept()
        with server:
            server.setblocking(True)
            data = b""
            while len(data) < size and (chunk := server.recv(size - len(data))):
                data += chunk
            server.sendall(data)
            report: tuple[str, bool] = peer.recv()
        return report
    finally:
        peer.stop()


@pytest.mark.parametrize("make", [socket.socket, smcr.SMCSocket], ids=["tcp", "smcr"])
def test_a_connect_to_a_listener_of_this_process_is_accepted_when_it_returns(
    make: type[socket.socket],
) -> None:
    """Over loopback TCP the listener is readable, and the client writable, when a
    non-blocking ``connect`` returns.  On SMC-R, too: the connecting thread accepts its
    own server end and runs both handshakes (the watcher thread leaves it the listener
    meanwhile), and the connection is SMC-R at once.  Other clients of the listener, in
    another process, are still accepted in the background."""
    lst = make(socket.AF_INET, socket.SOCK_STREAM)
    try:
        lst.bind((host(), 0))
        lst.listen(8)
        lst.setblocking(False)
        for i in range(20):
            client = make(socket.AF_INET, socket.SOCK_STREAM)
            client.setblocking(False)
            assert client.connect_ex(lst.getsockname()) in (0, errno.EINPROGRESS)
            assert select.select([lst], [client], [], 0) == ([lst], [client], [])
            server, _ = lst.accept()
            with client, server:
                if isinstance(client, smcr.SMCSocket) and isinstance(server, smcr.SMCSocket):
                    assert client.smc_info().mode == server.smc_info().mode == "SMCR"
                client.send(b"%02d" % i)
                assert select.select([server], [], [], 5.0)[0]
                assert server.recv(2) == b"%02d" % i
        # a client in another process is accepted in the background as before
        mode, intact = _echo_for_another_process(lst, 1000)
        assert intact and mode == ("SMCR" if make is smcr.SMCSocket else "TCP")
    finally:
        lst.close()


def test_a_failure_while_the_connecting_thread_accepts_leaves_the_listener_watched(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """A bug in accepting the server end in the connecting thread is reported as the
    watcher reports its own, fails nobody's ``connect``, and leaves the listener watched:
    the next client, in another process, is accepted in the background."""
    failed: list[bool] = []
    admit = acceptq.AcceptQueue._admit

    def failing_admit(self: acceptq.AcceptQueue, fd: int, addr: object) -> None:
        if not failed and threading.current_thread() is threading.main_thread():
            failed.append(True)
            os.close(fd)
            raise RuntimeError("injected accept failure")
        admit(self, fd, addr)

    monkeypatch.setattr(acceptq.AcceptQueue, "_admit", failing_admit)
    lst = smcr.SMCSocket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        lst.bind((host(), 0))
        lst.listen(8)
        lst.setblocking(False)
        with smcr.SMCSocket(socket.AF_INET, socket.SOCK_STREAM) as client:
            client.setblocking(False)
            assert client.connect_ex(lst.getsockname()) in (0, errno.EINPROGRESS)
        assert failed and "injected accept failure" in capsys.readouterr().err
        assert _echo_for_another_process(lst, 100) == ("SMCR", True)
    finally:
        lst.close()
