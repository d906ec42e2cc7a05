"""What a program's buffers and a closed peer look like through a socket: as over TCP.

* A call never keeps the caller's buffer once it returned, errors included: ``socket.socket``'s
  calls are C and leave no frame behind, so a program may keep the error (an event loop
  closes its stream with it) and still resize the ``bytearray`` it wrote from or read
  into.  Ours run Python frames (all of them in the pure build), which the error's
  traceback would keep, with their views of the buffer.
* Writing to a peer that has closed fails (``EPIPE`` or ``ECONNRESET``), however large the
  write: the first send after the peer's close may take what the send buffer holds, as
  TCP's takes what its socket buffer holds, never all of a 10 MiB write.
* ``SO_OOBINLINE``: urgent data stays in the stream (ftplib's ``abort``: ``ABOR`` sent with
  ``MSG_OOB`` to a server that reads it in line); ``recv(MSG_OOB)`` then fails with
  ``EINVAL``, as Linux's.

Each story runs over SMC-R, over TCP with smcr's socket (a fallback) and over the standard
library's socket, and must go the same way.
"""

from __future__ import annotations

import errno
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

import smcr

KINDS = ("smcr", "fallback", "tcp")


@contextmanager
def pair(kind: str) -> Iterator[tuple[socket.socket, socket.socket]]:
    """A connected (client, server) pair: SMC-R, smcr's sockets over TCP (the server is
    a plain socket, so the client falls back), or the standard library's."""
    make_server = smcr.create_server if kind == "smcr" else socket.create_server
    make_client = socket.create_connection if kind == "tcp" else smcr.create_connection
    with make_server(("127.0.0.1", 0)) as srv:
        srv.settimeout(20)
        client = make_client(srv.getsockname(), timeout=20)
        server, _ = srv.accept()
    mode = getattr(client, "smc_mode", "TCP")
    assert mode == ("SMCR" if kind == "smcr" else "TCP")
    try:
        yield client, server
    finally:
        client.close()
        server.close()


def error_of(call: Callable[[], object]) -> OSError:
    """The error a call raises (it must raise one)."""
    try:
        call()
    except OSError as exc:
        return exc
    raise AssertionError("no error")


def resizable(buf: bytearray) -> bool:
    """Whether nothing holds a view of ``buf`` (a view forbids resizing it)."""
    try:
        buf.append(0)
        del buf[-1:]
    except BufferError:
        return False
    return True


@pytest.mark.parametrize("kind", KINDS)
def test_a_failed_read_keeps_no_hold_on_the_buffer(kind: str) -> None:
    with pair(kind) as (client, _server):
        client.settimeout(0.05)
        buf = bytearray(1000)
        kept = [error_of(lambda: client.recv_into(buf)),  # nothing comes: timed out
                error_of(lambda: client.recv_into(memoryview(buf)[10:], 20)),
                error_of(lambda: client.recvmsg_into([buf]))]  # fmt: skip
        assert all(isinstance(exc, TimeoutError) for exc in kept)
        assert resizable(buf)


@pytest.mark.parametrize("kind", KINDS)
def test_a_failed_write_keeps_no_hold_on_the_buffer(kind: str) -> None:
    with pair(kind) as (client, server):
        server.close()
        time.sleep(0.2)  # the peer's close has arrived
        data = bytearray(b"x" * (10 << 20))
        kept: list[OSError] = []
        for call in (lambda: client.sendall(data), lambda: client.send(memoryview(data)),
                     lambda: client.sendmsg([data, data])):  # fmt: skip
            for _ in range(100):  # each call until it fails
                try:
                    call()
                except OSError as exc:
                    kept.append(exc)
                    break
            else:
                raise AssertionError("writes to a closed peer never failed")
        assert all(exc.errno in (errno.EPIPE, errno.ECONNRESET) for exc in kept), kept
        assert resizable(data)


@pytest.mark.parametrize("kind", KINDS)
def test_writing_to_a_peer_that_closed_fails_before_a_large_write_is_taken(kind: str) -> None:
    """Non-blocking, as an event loop writes: the 10 MiB are never all taken."""
    with pair(kind) as (client, server):
        server.close()
        client.setblocking(False)
        data = memoryview(bytearray(10 << 20))
        taken, deadline = 0, time.monotonic() + 10
        with pytest.raises((BrokenPipeError, ConnectionResetError)):
            while time.monotonic() < deadline:
                try:
                    taken += client.send(data[taken:])
                except BlockingIOError:
                    time.sleep(0.01)
                assert taken < len(data), "a closed peer took all of a 10 MiB write"
        data.release()
        client.setblocking(True)
        with pytest.raises((BrokenPipeError, ConnectionResetError)):
            client.sendall(b"more")  # and every write after that


@pytest.mark.parametrize("kind", KINDS)
def test_urgent_data_read_in_line(kind: str) -> None:
    """ftplib's ``abort()``: the command goes with MSG_OOB; the server reads it whole."""
    with pair(kind) as (client, server):
        server.setsockopt(socket.SOL_SOCKET, socket.SO_OOBINLINE, 1)
        assert server.getsockopt(socket.SOL_SOCKET, socket.SO_OOBINLINE) == 1
        client.sendall(b"ABOR\r\n", socket.MSG_OOB)
        got = b""
        while not got.endswith(b"\r\n"):  # (a read stops at the urgent mark, as TCP's)
            piece = server.recv(100)
            assert piece, got
            got += piece
        assert got == b"ABOR\r\n"
        assert error_of(lambda: server.recv(1, socket.MSG_OOB)).errno == errno.EINVAL
        client.sendall(b"after")
        assert server.recv(100) == b"after"


@pytest.mark.parametrize("kind", KINDS)
def test_urgent_data_out_of_line_without_the_option(kind: str) -> None:
    with pair(kind) as (client, server):
        client.sendall(b"ABOR\r\n", socket.MSG_OOB)
        got = b""
        deadline = time.monotonic() + 10
        while len(got) < 5 and time.monotonic() < deadline:
            got += server.recv(100)
        assert got == b"ABOR\r"  # the urgent byte is not in the stream
        assert server.recv(1, socket.MSG_OOB) == b"\n"


def test_oobinline_set_on_the_listener_is_inherited() -> None:
    """Set before the connection exists (on the listening socket, as TCP's accepted sockets
    inherit it): the SMC-R connection reads urgent data in line too."""
    with smcr.create_server(("127.0.0.1", 0)) as srv:
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_OOBINLINE, 1)
        srv.settimeout(20)
        got: list[bytes] = []

        def serve() -> None:
            conn, _ = srv.accept()
            with conn:
                assert conn.smc_mode == "SMCR"
                data = b""
                while len(data) < 4:
                    data += conn.recv(10)
                got.append(data)

        t = threading.Thread(target=serve)
        t.start()
        with smcr.create_connection(srv.getsockname(), timeout=20) as client:
            client.sendall(b"ab")
            client.sendall(b"cd", socket.MSG_OOB)
            t.join(20)
    assert got == [b"abcd"]
