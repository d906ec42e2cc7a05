"""The socket data path's edges: inline sends of every size around the buffer limits,
and an orderly end that outlives the link (a peer that closes and exits).

Over shm a send goes straight from the caller's buffer into the peer's RMBE
while nothing waits in the send buffer, and is copied into the send buffer
otherwise; these tests cross between the two paths on purpose.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import select
import socket
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import pytest

import smcr
from tests.socket import smc_peer
from tests.socket.conftest import RNICS, Peer

PeerFactory = Callable[..., Peer]
SMALL = 32768  # SO_SNDBUF/SO_RCVBUF: a 32 KiB RMBE and send buffer on both sides


def bye_server(ctl: Connection, size: int, close: bool = True) -> None:
    """Accept one client, send ``size`` bytes of pattern, close and exit at once (without
    ``close``: exit with the connection open, still referenced so that no collection
    closes it)."""
    srv = smcr.create_server((smc_peer.host(), 0))
    ctl.send(srv.getsockname()[1])
    c, _ = srv.accept()
    c.sendall(pattern(size))
    ctl.send(c.smc_info().mode)
    if not close:
        LEFT_OPEN.append(c)
        return
    c.close()
    srv.close()


LEFT_OPEN: list[socket.socket] = []
"""The connections the servers here leave open (referenced until their process ends)."""


def digest_server(ctl: Connection) -> None:
    """Accept one small-buffer client; report SHA-256 and count of what came until EOF."""
    srv = smcr.create_server((smc_peer.host(), 0))
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SMALL)
    ctl.send(srv.getsockname()[1])
    c, _ = srv.accept()
    h, n = hashlib.sha256(), 0
    buf = bytearray(7919)  # a prime: reads end everywhere in the ring
    while got := c.recv_into(buf):
        h.update(buf[:got])
        n += got
    ctl.send((n, h.hexdigest(), c.smc_info().mode))
    c.close()
    srv.close()


def count_server(ctl: Connection, size: int) -> None:
    """Accept one client; read ``size`` bytes, report their SHA-256 (then wait for EOF)."""
    srv = smcr.create_server((smc_peer.host(), 0))
    ctl.send(srv.getsockname()[1])
    c, _ = srv.accept()
    h, n = hashlib.sha256(), 0
    buf = bytearray(65536)
    while n < size and (got := c.recv_into(buf, min(len(buf), size - n))):
        h.update(buf[:got])
        n += got
    ctl.send((n, h.hexdigest()))
    while c.recv(65536):
        pass
    c.close()
    srv.close()


def test_a_burst_of_small_sends_arrives_whole_while_the_sender_does_nothing_more(
        peer: PeerFactory) -> None:  # fmt: skip
    """Autocorking holds small sends of a burst in the send buffer until the peer answers
    the CDC before them; the answer must flush them though the application makes no
    further call on the socket (the progress thread takes it), and the bytes come in
    order across the inline and the corked path."""
    chunks = [os.urandom(n) for n in [1024] * 300 + [1, 7, 4096, 3, 1024, 100]]
    total = sum(map(len, chunks))
    p = peer(count_server, total)
    with smcr.create_connection((smc_peer.host(), p.recv()), timeout=20) as s:
        for chunk in chunks:
            s.sendall(chunk)
        # nothing more on the socket until the peer has it all
        assert p.recv(20) == (total, hashlib.sha256(b"".join(chunks)).hexdigest())


@pytest.mark.parametrize("end", ["close", "shutdown"])
def test_a_burst_then_close_or_shutdown_delivers_every_byte_before_eof(
        peer: PeerFactory, end: str) -> None:  # fmt: skip
    """Bytes corked at the end of a burst go out before the closing (or done-writing) CDC:
    close and shutdown wait for the send buffer, which the peer's answer flushes."""
    p = peer(digest_server)
    s = smcr.SMCSocket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SMALL)
    s.settimeout(20)
    s.connect((smc_peer.host(), p.recv()))
    data = os.urandom(1000 * 200)
    for i in range(0, len(data), 1000):
        s.sendall(data[i : i + 1000])
    if end == "close":
        s.close()
    else:
        s.shutdown(socket.SHUT_WR)
    assert p.recv(30) == (len(data), hashlib.sha256(data).hexdigest(), "SMCR")
    s.close()


def burst_and_leave_server(ctl: Connection, drop: bool) -> None:
    """Accept one client, send it a burst of 1 KiB writes and end the process without
    closing the socket (``drop``: the socket collected first; else still referenced)."""
    import gc  # noqa: PLC0415

    srv = smcr.create_server((smc_peer.host(), 0))
    ctl.send(srv.getsockname()[1])
    c, _ = srv.accept()
    for i in range(300):
        c.sendall(pattern(1024 * (i + 1))[-1024:])
    ctl.send("sent")
    if drop:
        del c
        gc.collect()


@pytest.mark.parametrize("drop", [False, True])
def test_a_burst_then_process_exit_without_close_delivers_every_byte(
        peer: PeerFactory, drop: bool) -> None:  # fmt: skip
    """A process that ends without closing: the bytes it sent arrive, corked ones too
    (at exit they go before the links end, Stack.uncork), and then EOF, as when TCP's
    kernel closes an exiting process's socket."""
    p = peer(burst_and_leave_server, drop)
    got = bytearray()
    with smcr.create_connection((smc_peer.host(), p.recv()), timeout=20) as s:
        assert p.recv(20) == "sent"
        while chunk := s.recv(65536):
            got += chunk
    assert bytes(got) == pattern(300 * 1024)


def leave_unread_server(ctl: Connection) -> None:
    """Accept one client and end the process with the connection open once the client's
    bytes have arrived, none of them read."""
    srv = smcr.create_server((smc_peer.host(), 0))
    ctl.send(srv.getsockname()[1])
    c, _ = srv.accept()
    LEFT_OPEN.append(c)
    assert select.select([c], [], [], 20)[0]  # (arrived: the RMB holds it)


@RNICS
def test_a_process_that_exits_with_bytes_unread_resets_the_connection(
        peer: PeerFactory) -> None:  # fmt: skip
    """The process ends with the connection open and our bytes unread: the peer's reads
    end in a reset, as TCP's kernel answers unread data at close with RST."""
    p = peer(leave_unread_server)
    with smcr.create_connection((smc_peer.host(), p.recv()), timeout=20) as s:
        s.sendall(b"x" * 100)
        p.proc.join(10)
        assert not p.proc.is_alive()
        with pytest.raises(ConnectionResetError):
            s.recv(10)


def send_first_server(ctl: Connection, size: int) -> None:
    """Accept one client; send ``size`` bytes before reading any, then read ``size``."""
    srv = smcr.create_server((smc_peer.host(), 0))
    ctl.send(srv.getsockname()[1])
    c, _ = srv.accept()
    c.sendall(pattern(size))
    got = bytearray()
    while len(got) < size and (chunk := c.recv(65536)):
        got += chunk
    ctl.send(bytes(got) == pattern(size))
    c.close()
    srv.close()


def pattern(size: int) -> bytes:
    return (hashlib.sha256(b"bye").digest() * (size // 32 + 1))[:size]


@RNICS
def test_peer_that_closes_and_exits_still_gives_eof(peer: PeerFactory) -> None:
    """Its done-writing/closed CDC came before its link went: all bytes, then EOF.

    (The bytes fit into our RMBE, so that the peer's close need not wait for us.)"""
    size = 50_000
    p = peer(bye_server, size)
    with smcr.create_connection((smc_peer.host(), p.recv()), timeout=20) as s:
        assert p.recv() == "SMCR"
        p.proc.join(10)  # the peer process is gone, and its link with it
        assert not p.proc.is_alive()
        time.sleep(0.2)
        got = bytearray()
        while chunk := s.recv(65536):
            got += chunk
        assert bytes(got) == pattern(size)
        assert s.recv(10) == b""


@RNICS
@pytest.mark.parametrize("close", [True, False], ids=["close", "exit-open"])
def test_peer_that_closes_and_exits_after_more_than_a_window_delivers_it_all(
        peer: PeerFactory, rnic: str, close: bool) -> None:  # fmt: skip
    """More than the peer's RMBE is sent, the tail still in the sender's send buffer when
    we start reading; then every byte and EOF, not a reset.

    ``close``: close waits for the tail to go out *and* for the closing CDC to be
    confirmed before the sender's process exits (over RoCE a posted WRITE is not yet
    delivered; the exit would take the unsent packets with the QP).  ``exit-open``: the
    process ends with the connection open; at exit it closes as TCP's kernel closes the
    socket of a process that ends, the rest going out first (the links' DELETE LINK alone
    had reset it with the tail unsent)."""
    from smcr.stack.runtime import default_buffer_size  # noqa: PLC0415

    size = default_buffer_size("shm" if rnic == "shm" else "roce") * 3 // 2
    p = peer(bye_server, size, close)
    with smcr.create_connection((smc_peer.host(), p.recv()), timeout=20) as s:
        assert p.recv() == "SMCR"  # its sendall is done: the rest waits in its send buffer
        time.sleep(0.3)
        got = bytearray()
        while chunk := s.recv(65536):
            got += chunk
        assert bytes(got) == pattern(size)
        assert s.recv(10) == b""
        p.proc.join(10)
        assert not p.proc.is_alive()


@RNICS
def test_sends_of_every_size_around_the_buffer_limits(peer: PeerFactory) -> None:
    """Sizes below, at and above the 32 KiB buffers, sent back to back: the inline and
    the copying path take turns as the peer's RMBE fills; every byte arrives once."""
    p = peer(digest_server)
    s = smcr.SMCSocket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SMALL)
    s.settimeout(20)
    s.connect((smc_peer.host(), p.recv()))
    assert s.smc_info().mode == "SMCR"
    h, total = hashlib.sha256(), 0
    sizes = [1, 2, 100, 4095, 4096, 4097, SMALL - 1, SMALL, SMALL + 1, 3 * SMALL + 7, 65536]
    for _ in range(3):
        for size in sizes:
            data = os.urandom(size)
            view = memoryview(data)
            while view:  # send(), not sendall(): partial sends are part of the test
                n = s.send(view)
                assert 0 < n <= len(view)
                view = view[n:]
            h.update(data)
            total += size
    s.shutdown(socket.SHUT_WR)
    assert p.recv(30) == (total, h.hexdigest(), "SMCR")
    s.close()


@RNICS
def test_both_ends_send_before_they_read(peer: PeerFactory, rnic: str) -> None:
    """Each end sends 1.5 buffers' worth before reading: what the send buffer and the
    peer's RMBE hold together must be taken (a blocking sendall waits for the peer
    to read only briefly, then copies into the send buffer as before)."""
    from smcr.stack.runtime import default_buffer_size  # noqa: PLC0415

    size = default_buffer_size("shm" if rnic == "shm" else "roce") * 3 // 2
    p = peer(send_first_server, size)
    with smcr.create_connection((smc_peer.host(), p.recv()), timeout=30) as s:
        s.sendall(pattern(size))
        got = bytearray()
        while len(got) < size and (chunk := s.recv(65536)):
            got += chunk
        assert bytes(got) == pattern(size)
        assert p.recv(30) is True


def exit_server(ctl: Connection, kind: str, reply: int) -> None:
    """Accept one client (``kind``: an smcr or a plain socket), read its 5-byte request,
    send ``reply`` bytes of pattern (the client does not read them yet), then end the
    process at once: ``os._exit``, no close, no atexit (a preforked server's worker that
    dies mid-request, as tornado's process test makes them)."""
    make = smcr.create_server if kind == "smc" else socket.create_server
    srv = make((smc_peer.host(), 0))
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SMALL)
    ctl.send(srv.getsockname()[1])
    c, _ = srv.accept()
    got = b""
    while len(got) < 5:
        got += c.recv(5 - len(got))
    c.settimeout(0.0)
    sent = 0
    with contextlib.suppress(BlockingIOError):
        while sent < reply:
            sent += c.send(pattern(reply)[sent:])
    ctl.send((c.smc_info().mode if isinstance(c, smcr.SMCSocket) else None, sent))
    os._exit(3)


def after_the_peer_died(peer: PeerFactory, kind: str, reply: int) -> tuple[Any, ...]:
    """What the client of :func:`exit_server` reads once that process is gone: the
    bytes, then EOF or the error that ended them."""
    p = peer(exit_server, kind, reply)
    with (smcr.SMCSocket if kind == "smc" else socket.socket)() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL)  # our RMBE (smc)
        s.settimeout(20)
        s.connect((smc_peer.host(), p.recv()))
        s.sendall(b"GET /")
        mode, sent = p.recv()
        p.proc.join(10)
        assert not p.proc.is_alive()
        got = bytearray()
        end: object = b""
        try:
            while chunk := s.recv(65536):
                got += chunk
        except OSError as exc:
            end = type(exc)
        return mode, sent, bytes(got) == pattern(reply)[: len(got)], len(got), end


def test_a_peer_process_that_dies_with_nothing_unsent_gives_eof_as_on_tcp(
        peer: PeerFactory) -> None:  # fmt: skip
    """Its kernel closes a TCP socket in order (FIN); over shm the RNIC delivered all
    it posted and its last CDC said nothing waits: the same bytes, then EOF."""
    tcp = after_the_peer_died(peer, "tcp", 1000)
    smc = after_the_peer_died(peer, "smc", 1000)
    assert tcp == (None, 1000, True, 1000, b"")
    assert smc == ("SMCR", 1000, True, 1000, b"")


def test_a_peer_process_that_dies_with_bytes_unsent_gives_a_reset_not_eof(
        peer: PeerFactory) -> None:  # fmt: skip
    """More than our RMBE was sent: the rest was in its send buffer, in its process,
    and is lost with it (TCP's kernel would still deliver it): what came, then
    ECONNRESET, never an EOF that would pass a truncated stream off as whole."""
    mode, sent, intact, n, end = after_the_peer_died(peer, "smc", 4 * SMALL)
    assert mode == "SMCR" and intact and end is ConnectionResetError
    assert 0 < n < sent
