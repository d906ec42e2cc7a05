"""SMCSocket between real processes over the shm RNIC; the essentials also over RoCE.

``RNICS`` tests run again over the RoCE RNIC, over loopback and between two
network namespaces (root; see ``conftest``): the same code above the verbs.
"""

from __future__ import annotations

import errno
import hashlib
import os
import selectors
import socket
import threading
import time
from collections.abc import Callable

import pytest

import smcr
from smcr.wire.decline import DeclineCode
from tests.socket import smc_peer
from tests.socket.conftest import RNICS, Peer, port_4791_shareable

PeerFactory = Callable[..., Peer]


def connect(port: int) -> smcr.SMCSocket:
    s = smcr.create_connection((smc_peer.host(), port), timeout=20)
    return s


@RNICS
def test_echo_both_ways_over_smcr_and_link_group_reuse(peer: PeerFactory) -> None:
    p = peer(smc_peer.echo_server, False, 2)
    port = p.recv()
    for first in (True, False):
        with connect(port) as s:
            info = s.smc_info()
            assert info.mode == "SMCR" and info.first_contact is first
            assert p.recv() == ("SMCR", 0, 0)
            for size in (1, 100, 5000, 70000):
                msg = os.urandom(size)
                s.sendall(msg)
                got = b""
                while len(got) < size:
                    got += s.recv(size - len(got))
                assert got == msg


@RNICS
def test_bulk_both_directions_at_once_sha256(peer: PeerFactory) -> None:
    total = 8 << 20
    p = peer(smc_peer.sink_server)
    port = p.recv()
    s = connect(port)
    seed = os.urandom(8)
    p.ctl.send((total, seed))
    assert s.smc_info().mode == "SMCR"
    sent_hash = hashlib.sha256()
    recv_hash = hashlib.sha256()

    def writer() -> None:
        left = total
        while left:
            chunk = os.urandom(min(left, 65536))
            s.sendall(chunk)
            sent_hash.update(chunk)
            left -= len(chunk)
        s.shutdown(socket.SHUT_WR)

    t = threading.Thread(target=writer)
    t.start()
    buf = bytearray(1 << 16)
    got = 0
    while n := s.recv_into(buf):
        recv_hash.update(buf[:n])
        got += n
    t.join(30)
    theirs_in, theirs_out = p.recv(30)
    assert got == total
    assert theirs_in == sent_hash.hexdigest()
    assert theirs_out == recv_hash.hexdigest()
    s.close()


def test_many_small_messages(peer: PeerFactory) -> None:
    p = peer(smc_peer.echo_server)
    with connect(p.recv()) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(2000):
            msg = i.to_bytes(4, "big")
            s.sendall(msg)
            assert s.recv(4, socket.MSG_WAITALL) == msg


@RNICS
def test_plain_tcp_client_to_smcr_server_falls_back_with_bytes_intact(peer: PeerFactory) -> None:
    p = peer(smc_peer.echo_server)
    port = p.recv()
    payload = os.urandom(100_000)
    assert smc_peer.plain_tcp_client(port, payload) == payload
    assert p.recv() == ("TCP", DeclineCode.PEERNOSMC, 0)


@RNICS
def test_declining_server_falls_back_both_sides(peer: PeerFactory) -> None:
    p = peer(smc_peer.echo_server, True)
    with connect(p.recv()) as s:
        info = s.smc_info()
        assert info.mode == "TCP"
        assert (info.local_code, info.peer_code) == (DeclineCode.PEERDECL, DeclineCode.MEM)
        assert info.reason == "0x05000000/0x01010000"
        assert p.recv() == ("TCP", DeclineCode.MEM, 0)
        msg = os.urandom(50_000)
        s.sendall(msg)
        got = b""
        while len(got) < len(msg):
            got += s.recv(65536)
        assert got == msg


@pytest.mark.skipif(not port_4791_shareable(), reason="UDP port 4791 is taken")
def test_shm_client_and_roce_server_fall_back_fast_with_bytes_intact(
        peer: PeerFactory, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setenv("SMCR_RNIC", "roce")  # the server's, read in its process
    p = peer(smc_peer.echo_server)
    port = p.recv()
    monkeypatch.setenv("SMCR_RNIC", "shm")
    t0 = time.monotonic()
    with connect(port) as s:
        info = s.smc_info()
        assert (info.mode, info.local_code) == ("TCP", DeclineCode.NOACTLINK)
        assert time.monotonic() - t0 < 2.0
        assert p.recv() == ("TCP", DeclineCode.PEERDECL, DeclineCode.NOACTLINK)
        s.sendall(b"intact")
        assert s.recv(6, socket.MSG_WAITALL) == b"intact"


@RNICS
def test_peer_sigkill_gives_reset_in_bounded_time(peer: PeerFactory) -> None:
    p = peer(smc_peer.hold_server)
    s = connect(p.recv())
    assert p.recv() == "SMCR"
    assert s.recv(5, socket.MSG_WAITALL) == b"hello"
    p.proc.kill()
    t0 = time.monotonic()
    with pytest.raises(ConnectionResetError):
        s.settimeout(10)
        s.recv(10)
    assert time.monotonic() - t0 < 3.0
    with pytest.raises(OSError) as exc:
        s.sendall(b"x" * 10)
    assert exc.value.errno in (errno.ECONNRESET, errno.EPIPE)
    s.close()


@RNICS
def test_half_close(peer: PeerFactory) -> None:
    p = peer(smc_peer.half_close_server)
    s = connect(p.recv())
    s.sendall(b"x" * 12345)
    s.shutdown(socket.SHUT_WR)
    assert s.smc_info().state == "PEERCLW1"
    assert s.recv(100) == b"12345"
    assert s.recv(100) == b""  # EOF after the peer's close
    assert p.recv() == "APPLCLW1"
    s.close()


def test_selectors_nonblocking_and_peek(peer: PeerFactory) -> None:
    p = peer(smc_peer.echo_server)
    s = connect(p.recv())
    s.setblocking(False)
    with pytest.raises(BlockingIOError):
        s.recv(10)
    sel = selectors.DefaultSelector()
    sel.register(s, selectors.EVENT_READ)
    assert sel.select(0.05) == []
    s.send(b"ping")
    assert sel.select(5.0), "readable after the echo"
    assert s.recv(4, socket.MSG_PEEK) == b"ping"
    assert s.recv(4) == b"ping"
    assert sel.select(0.05) == []
    sel.close()
    s.setblocking(True)
    f = s.makefile("rwb")
    f.write(b"line one\n")
    f.flush()
    assert f.readline() == b"line one\n"
    f.close()
    s.close()


def test_window_full_nonblocking_send_raises(peer: PeerFactory) -> None:
    p = peer(smc_peer.hold_server)  # never reads
    s = connect(p.recv())
    p.recv()
    s.setblocking(False)
    sent = 0
    with pytest.raises(BlockingIOError):
        for _ in range(100):
            sent += s.send(b"z" * 65536)
    # peer RMBE + our send buffer
    assert sent == s.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) + s.smc_info().peer_rmb_size
    sel = selectors.DefaultSelector()
    sel.register(s, selectors.EVENT_WRITE)
    assert sel.select(0.05) == []
    sel.close()
    p.proc.kill()
    s.close()


@pytest.mark.slow
def test_200_concurrent_connections_one_link_group(peer: PeerFactory) -> None:
    n = 200
    p = peer(smc_peer.many_server, n)
    port = p.recv()
    socks = [connect(port) for _ in range(n)]
    assert all(s.smc_info().mode == "SMCR" for s in socks)
    assert len({s.smc_info().lgr_id for s in socks}) == 1
    for i, s in enumerate(socks):
        s.sendall(i.to_bytes(4, "big") * 100)
    for i, s in enumerate(socks):
        assert s.recv(400, socket.MSG_WAITALL) == i.to_bytes(4, "big") * 100
    for s in socks:
        s.close()
    modes, lgrs, _ = p.recv(60)
    assert modes == ["SMCR"] * n and lgrs == 1


@pytest.mark.slow
def test_1gib_both_directions_sha256(peer: PeerFactory) -> None:
    total = 1 << 30
    p = peer(smc_peer.sink_server)
    s = connect(p.recv())
    seed = os.urandom(8)
    p.ctl.send((total, seed))
    block = os.urandom(1 << 16)
    sent_hash = hashlib.sha256()
    recv_hash = hashlib.sha256()

    def writer() -> None:
        for _ in range(total // len(block)):
            s.sendall(block)
            sent_hash.update(block)
        s.shutdown(socket.SHUT_WR)

    t = threading.Thread(target=writer)
    t.start()
    buf = bytearray(1 << 16)
    got = 0
    while n := s.recv_into(buf):
        recv_hash.update(buf[:n])
        got += n
    t.join(600)
    theirs_in, theirs_out = p.recv(600)
    assert got == total
    assert theirs_in == sent_hash.hexdigest() and theirs_out == recv_hash.hexdigest()
    s.close()


def test_urgent_data_out_of_band(peer: PeerFactory) -> None:
    p = peer(smc_peer.oob_server)
    s = connect(p.recv())
    s.sendall(b"ab")
    s.send(b"!", socket.MSG_OOB)
    s.sendall(b"cd")
    time.sleep(0.2)
    p.ctl.send("go")
    assert p.recv() == (b"ab", b"!", b"cd")
    s.close()


def test_ipv6(peer: PeerFactory) -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    p = peer(smc_peer.echo_server6)
    with smcr.create_connection(("::1", p.recv()), timeout=20) as s:
        assert s.smc_info().mode == "SMCR" and s.family == socket.AF_INET6
        assert p.recv() == "SMCR"
        s.sendall(b"over six")
        assert s.recv(8, socket.MSG_WAITALL) == b"over six"


def test_nonblocking_connect_completes_and_recv_raises(peer: PeerFactory) -> None:
    p = peer(smc_peer.echo_server)
    port = p.recv()
    s = smcr.SMCSocket()
    s.setblocking(False)
    assert s.connect_ex(("127.0.0.1", port)) == 0
    assert s.smc_info().mode == "SMCR" and not s.getblocking()
    with pytest.raises(BlockingIOError):
        s.recv(1)
    s.close()


def test_buffer_sizes_default_and_so_sndbuf_so_rcvbuf(peer: PeerFactory) -> None:
    """Unset, a shm connection gets the runtime's default buffers; SO_SNDBUF and
    SO_RCVBUF override it per socket, each on its own, and data flows through both."""
    from smcr.stack.runtime import SHM_BUFFER  # noqa: PLC0415

    p = peer(smc_peer.echo_server, False, 2)
    port = p.recv()
    with connect(port) as s:
        assert p.recv() == ("SMCR", 0, 0)
        assert s.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) == SHM_BUFFER
        assert (s.smc_info().rmb_size, s.smc_info().peer_rmb_size) == (SHM_BUFFER, SHM_BUFFER)
    s = smcr.SMCSocket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 20000)  # rounded up to 32 KiB
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 17)
    s.settimeout(20)
    s.connect((smc_peer.host(), port))
    with s:
        assert p.recv() == ("SMCR", 0, 0)
        assert s.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) == 32768
        assert s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) == 1 << 17
        assert s.smc_info().rmb_size == 1 << 17
        msg = os.urandom(3 << 20)  # many times both rings, writes larger than the send buffer

        def writer() -> None:
            s.sendall(msg)

        t = threading.Thread(target=writer)
        t.start()
        got = bytearray()
        while len(got) < len(msg):
            chunk = s.recv(1 << 16)
            assert chunk
            got += chunk
        t.join(30)
        assert not t.is_alive()
        assert hashlib.sha256(got).digest() == hashlib.sha256(msg).digest()
