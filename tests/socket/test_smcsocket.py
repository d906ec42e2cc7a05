"""SMCSocket between real processes over the shm RNIC; the essentials also over RoCE.

``RNICS`` tests run again over the RoCE RNIC, over loopback and between two
network namespaces (root; see ``conftest``): the same code above the verbs.
"""

from __future__ import annotations

import errno
import hashlib
import ipaddress
import os
import selectors
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable

import pytest

import smcr
from smcr.rdma.roce import RoceDevice, list_devices
from smcr.stack.runtime import close_stacks, get_stack
from smcr.wire.decline import DeclineCode
from tests.roce.netns import Hosts
from tests.socket import smc_peer
from tests.socket.conftest import RNICS, Peer, rnics
from tests.support import port_4791_free

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


@rnics(roce_slow=True)
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


@pytest.mark.skipif(not port_4791_free(), reason="UDP port 4791 is taken")
@pytest.mark.parametrize(("client", "server"), [("shm", "roce"), ("roce", "shm")],
                         ids=["shm-client-roce-server", "roce-client-shm-server"])  # fmt: skip
def test_mixed_rnic_kinds_fall_back_fast_with_bytes_intact(
        peer: PeerFactory, monkeypatch: pytest.MonkeyPatch, client: str,
        server: str) -> None:  # fmt: skip
    """A shm RNIC cannot reach a RoCE GID nor the other way round: the client's QP set-up
    fails at once, it declines ERR_RDYLNK (as Linux when ``smc_ib_ready_link`` fails) and
    both ends go on over TCP."""
    monkeypatch.setenv("SMCR_RNIC", server)  # the server's, read in its process
    p = peer(smc_peer.echo_server)
    port = p.recv()
    monkeypatch.setenv("SMCR_RNIC", client)
    t0 = time.monotonic()
    try:
        with connect(port) as s:
            info = s.smc_info()
            assert (info.mode, info.local_code) == ("TCP", DeclineCode.ERR_RDYLNK)
            assert time.monotonic() - t0 < 2.0
            assert p.recv() == ("TCP", DeclineCode.PEERDECL, DeclineCode.ERR_RDYLNK)
            s.sendall(b"intact")
            assert s.recv(6, socket.MSG_WAITALL) == b"intact"
    finally:
        close_stacks()  # the client's RoCE runtime, if it made one


@pytest.mark.slow
@rnics(kinds=("roce",))
@pytest.mark.skipif(shutil.which("nft") is None, reason="needs nftables")
def test_roce_blocked_falls_back_after_confirm_link_timeout_with_bytes_intact(
        peer: PeerFactory, roce_hosts: Hosts) -> None:  # fmt: skip
    """TCP gets through but RoCE does not (UDP 4791 dropped into the client's host): the
    server waits 2 s for the CONFIRM LINK response, declines TIMEOUT_CL, and both ends
    carry on over TCP with exactly the application's bytes.  Regression: the server also
    declined NOACTLINK as it ended the link group, and that second Decline reached the
    client's application as 44 bytes of data."""
    block = ("table inet smcrblock {\n chain input {\n"
             "  type filter hook input priority 0; policy accept;\n"
             "  udp dport 4791 drop\n }\n}\n")  # fmt: skip
    nft = ["ip", "netns", "exec", roce_hosts.ns[0], "nft"]
    subprocess.run([*nft, "-f", "-"], input=block, text=True, check=True, timeout=30)
    try:
        p = peer(smc_peer.echo_server)
        port = p.recv()
        t0 = time.monotonic()
        with connect(port) as s:
            info = s.smc_info()
            assert (info.mode, info.local_code, info.peer_code) == (
                "TCP", DeclineCode.PEERDECL, DeclineCode.TIMEOUT_CL)  # fmt: skip
            assert 1.5 < time.monotonic() - t0 < 5.0
            s.sendall(b"intact")
            got = b""
            while len(got) < 6 and (data := s.recv(100)):
                got += data
            assert got == b"intact"
            assert p.recv() == ("TCP", DeclineCode.TIMEOUT_CL, 0)
    finally:
        subprocess.run([*nft, "delete", "table", "inet", "smcrblock"], check=True, timeout=30)


@rnics(kinds=("roce",))
@pytest.mark.skipif(shutil.which("nft") is None, reason="needs nftables")
@pytest.mark.parametrize("verdict", ["reject with tcp reset", "reject", "drop"])
def test_an_ip_filter_of_the_client_refuses_smcr_as_it_refuses_tcp(
        peer: PeerFactory, roce_hosts: Hosts, verdict: str) -> None:  # fmt: skip
    """Issue 25: an nftables rule in the server's host against the client's address
    (reset, ICMP port unreachable, or a silent drop) ends an SMC-R connect exactly as it
    ends a TCP one, with the same exception, and nothing of SMC-R gets through; without
    the rule the same client gets SMC-R."""
    p = peer(smc_peer.echo_server, False, 1)
    port = p.recv()
    rule = (f"table inet smcrfilter {{\n chain input {{\n"
            f"  type filter hook input priority 0; policy accept;\n"
            f"  ip saddr {roce_hosts.addr[0]} tcp dport {port} {verdict}\n }}\n}}\n")
    nft = ["ip", "netns", "exec", roce_hosts.ns[1], "nft"]
    subprocess.run([*nft, "-f", "-"], input=rule, text=True, check=True, timeout=30)
    outcomes = []
    try:
        for make in (smcr.create_connection, socket.create_connection):
            t0 = time.monotonic()
            with pytest.raises(OSError) as exc:
                make((smc_peer.host(), port), timeout=1.0).close()
            outcomes.append((type(exc.value), exc.value.errno, round(time.monotonic() - t0)))
    finally:
        subprocess.run([*nft, "delete", "table", "inet", "smcrfilter"], check=True, timeout=30)
    expected = TimeoutError if verdict == "drop" else ConnectionRefusedError
    assert outcomes[0] == outcomes[1] and outcomes[0][0] is expected, outcomes
    with connect(port) as s:
        assert s.smc_info().mode == "SMCR"
        s.sendall(b"through")
        assert s.recv(7, socket.MSG_WAITALL) == b"through"
    assert p.recv() == ("SMCR", 0, 0)


@RNICS
def test_peer_sigkill_ends_the_stream_in_bounded_time(peer: PeerFactory, rnic: str) -> None:
    """Over shm the RNIC delivered all the killed process posted, and nothing waited in
    its send buffer: EOF, as from a TCP peer, whose kernel closes in order
    (tests/socket/test_datapath.py has one with bytes left: reset).  Over RoCE its
    last WRITEs may die unacknowledged with it: reset."""
    p = peer(smc_peer.hold_server)
    s = connect(p.recv())
    assert p.recv() == "SMCR"
    assert s.recv(5, socket.MSG_WAITALL) == b"hello"
    p.proc.kill()
    t0 = time.monotonic()
    s.settimeout(10)
    if rnic == "shm":
        assert s.recv(10) == b""
    else:
        with pytest.raises(ConnectionResetError):
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
    p.ctl.send("go")  # (before, the peer's close could come first: APPLFINCLW)
    assert s.recv(100) == b"12345"
    assert s.recv(100) == b""  # EOF after the peer's close
    assert p.recv() == "APPLCLW1"
    s.close()


@RNICS
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


def fill_window(s: smcr.SMCSocket, chunk: bytes, window: int) -> int:
    """Non-blocking sends of ``chunk`` over and over (a partial send goes on where it
    stopped) until ``window`` bytes went; returns the bytes sent.

    Before the window is full a send raises only while WRITEs are in flight (the send
    buffer frees as their CDCs complete, as in Linux; over RoCE that takes a round
    trip): that is waited out.
    """
    sel = selectors.DefaultSelector()
    sel.register(s, selectors.EVENT_WRITE)
    sent = 0
    try:
        while sent < window:
            off = sent % len(chunk)
            try:
                sent += s.send(chunk[off : off + window - sent])
            except BlockingIOError:
                assert sel.select(5.0), f"not writable after {sent} of {window} bytes"
    finally:
        sel.close()
    return sent


@RNICS
def test_window_full_nonblocking_send_raises_then_blocking_send_resumes(
        peer: PeerFactory) -> None:  # fmt: skip
    """A peer that does not read: non-blocking sends fill its RMB and our send buffer, then
    raise and the socket is not writable; a blocking send blocks until the peer reads, then
    completes, every byte in order."""
    p = peer(smc_peer.drain_server)
    s = connect(p.recv())
    assert p.recv() == "SMCR"
    s.setblocking(False)
    chunk = os.urandom(65536)
    # (our send buffer and the peer's RMBE but the byte held back: Connection.peer_hold)
    window = s.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) + s.smc_info().peer_rmb_size - 1
    sent = fill_window(s, chunk, window)
    h = hashlib.sha256()
    h.update((chunk * (sent // len(chunk) + 1))[:sent])
    with pytest.raises(BlockingIOError):
        s.send(b"z")
    sel = selectors.DefaultSelector()
    sel.register(s, selectors.EVENT_WRITE)
    assert sel.select(0.05) == []
    s.setblocking(True)
    more = os.urandom(300_000)  # more than the peer's RMB and our send buffer together
    h.update(more)
    t = threading.Thread(target=s.sendall, args=(more,))
    t.start()
    t.join(0.1)
    assert t.is_alive(), "a blocking send to a full window returned"
    p.ctl.send("go")
    t.join(20)
    assert not t.is_alive()
    s.shutdown(socket.SHUT_WR)
    assert p.recv() == (sent + len(more), h.hexdigest())
    assert sel.select(5.0), "writable again"
    sel.close()
    s.close()


@rnics(roce_slow=True)
def test_window_full_takes_every_byte_of_send_buffer_and_peer_rmb(peer: PeerFactory) -> None:
    """A peer with a 16 KiB RMB that does not read: the two 8 KiB writes that fill it
    (but the byte held back: ``Connection.peer_hold``) and then our whole send buffer are
    taken (Linux: sndbuf + peer RMBE).  Regression:
    the two CDCs were sent unsignaled (too few, too little unconfirmed) and no later one
    came to free their 16 KiB of the send buffer until the peer read."""
    p = peer(smc_peer.drain_server, 16384)
    s = connect(p.recv())
    assert p.recv() == "SMCR"
    assert s.smc_info().peer_rmb_size == 16384
    s.setblocking(False)
    window = s.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) + 16384 - 1  # (peer_hold)
    sent = fill_window(s, os.urandom(8192), window)
    with pytest.raises(BlockingIOError):
        s.send(b"z")
    p.ctl.send("go")
    s.setblocking(True)
    s.shutdown(socket.SHUT_WR)
    assert p.recv()[0] == sent == window
    s.close()


@pytest.mark.slow
@RNICS
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
@RNICS
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


@RNICS
def test_urgent_data_out_of_band(peer: PeerFactory) -> None:
    p = peer(smc_peer.oob_server)
    s = connect(p.recv())
    s.sendall(b"ab")
    s.send(b"!", socket.MSG_OOB)
    s.sendall(b"cd")
    p.ctl.send("go")  # the server waits for each part itself (smc_peer.oob_server)
    assert p.recv() == (b"ab", b"!", b"cd")
    s.close()


@RNICS
def test_ipv6(peer: PeerFactory, rnic: str) -> None:
    """TCP over IPv6: over loopback (::1) the RoCE RNIC is the process's 127/8 one (an
    IPv4-mapped GID); between hosts it is the veth address's, with that IPv6 GID."""
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    p = peer(smc_peer.echo_server6)
    with smcr.create_connection((smc_peer.host6(), p.recv()), timeout=20) as s:
        assert s.smc_info().mode == "SMCR" and s.family == socket.AF_INET6, s.smc_info()
        if rnic != "shm":
            local = s.getsockname()[0]
            device = get_stack(ipaddress.ip_address(local)).device
            assert isinstance(device, RoceDevice)
            gid = local if rnic == "roce" else f"::ffff:{ipaddress.IPv4Address(device.address)}"
            assert device.gid == ipaddress.IPv6Address(gid).packed
        assert p.recv() == "SMCR"
        s.sendall(b"over six")
        assert s.recv(8, socket.MSG_WAITALL) == b"over six"


@rnics(kinds=("roce",))
def test_ipv6_link_local_between_hosts(peer: PeerFactory, roce_hosts: Hosts) -> None:
    """fe80:: addresses with a scope id: the server binds its veth end's link-local
    address, the client connects to it with ``%<its interface>``; both ends use the RoCE
    RNIC of that link-local address (the link-local GID, sent with the scope id)."""
    p = peer(smc_peer.echo_server_link_local, roce_hosts.ifs[1])
    addr, port = p.recv()
    ifname = roce_hosts.ifs[0]
    ours = smc_peer.link_local(ifname)
    with smcr.create_connection((f"{addr}%{ifname}", port), timeout=20) as s:
        local = s.getsockname()
        assert local[0].split("%")[0] == ours and local[3] == socket.if_nametoindex(ifname)
        assert s.smc_info().mode == "SMCR"
        mode, index, rnic = p.recv()
        assert (mode, rnic) == ("SMCR", (addr, index))
        device = get_stack(ipaddress.ip_address(ours)).device
        assert isinstance(device, RoceDevice)
        assert (device.info.address, device.info.scope_id) == (ours, local[3])
        assert device.gid == socket.inet_pton(socket.AF_INET6, ours)
        msg = os.urandom(100_000)  # many RDMA WRITEs at path MTU 1024
        s.sendall(msg)
        got = bytearray()
        while len(got) < len(msg):
            got += s.recv(65536)
        assert got == msg


@pytest.mark.slow
@rnics(kinds=("roce",))
def test_ipv6_link_local_same_address_on_two_interfaces_uses_the_connections_rnic(
        peer: PeerFactory, roce_hosts: Hosts) -> None:  # fmt: skip
    """Host A has fe80::a on its veth end and on a second link to host B; host B has
    fe80::b on the one of the two links that is not listed first in A: the client must
    use the RoCE RNIC of the interface its TCP connection goes out on.  Regression: the
    RNIC was looked up by address alone (the scope id dropped), so the first one listed
    was used, the link could not come up and the handshake fell back after 2 s."""
    a, b = roce_hosts.ns

    def ip(ns: str, *args: str) -> None:
        subprocess.run(["ip", "-n", ns, *args], check=True, timeout=30, capture_output=True)

    ip(a, "link", "add", "llx0", "type", "veth", "peer", "name", "llx1", "netns", b)
    try:
        for ns, dev in ((a, "llx0"), (b, "llx1")):
            ip(ns, "link", "set", dev, "up")
        for dev in (roce_hosts.ifs[0], "llx0"):
            ip(a, "addr", "add", "fe80::a/64", "dev", dev, "nodad")
        first = next(r.ifname for r in list_devices() if r.address == "fe80::a")
        ours = "llx0" if first == roce_hosts.ifs[0] else roce_hosts.ifs[0]
        theirs = "llx1" if ours == "llx0" else roce_hosts.ifs[1]
        ip(b, "addr", "add", "fe80::b/64", "dev", theirs, "nodad")
        p = peer(smc_peer.echo_server_link_local, theirs, "fe80::b")
        _, port = p.recv()
        with smcr.create_connection((f"fe80::b%{ours}", port), timeout=20) as s:
            assert s.getsockname()[3] == socket.if_nametoindex(ours)
            # SMC-R only if our RNIC is the one on ``ours``: fe80::b is not on the other link
            assert s.smc_info().mode == "SMCR"
            mode, index, rnic = p.recv()
            assert (mode, rnic) == ("SMCR", ("fe80::b", index))
            s.sendall(b"scoped")
            assert s.recv(6, socket.MSG_WAITALL) == b"scoped"
    finally:
        ip(a, "link", "del", "llx0")
        ip(a, "addr", "del", "fe80::a/64", "dev", roce_hosts.ifs[0])


@rnics(roce_slow=True)
def test_nonblocking_connect_completes_and_recv_raises(peer: PeerFactory) -> None:
    p = peer(smc_peer.echo_server)
    port = p.recv()
    s = smcr.SMCSocket()
    s.setblocking(False)
    assert s.connect_ex((smc_peer.host(), port)) == errno.EINPROGRESS
    with pytest.raises(BlockingIOError):  # nothing goes before SMC-R or TCP is settled
        s.send(b"x")
    sel = selectors.DefaultSelector()
    sel.register(s, selectors.EVENT_WRITE)
    assert sel.select(20.0), "writable once connected"
    sel.close()
    assert s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
    assert s.smc_info().mode == "SMCR" and not s.getblocking()
    assert s.connect_ex((smc_peer.host(), port)) == 0  # the kernel's "completed" answer
    with pytest.raises(BlockingIOError):
        s.recv(1)
    s.close()


@rnics(roce_slow=True)
def test_buffer_sizes_default_and_so_sndbuf_so_rcvbuf(peer: PeerFactory, rnic: str) -> None:
    """Unset, a connection gets the runtime's default buffers (4 MiB on both RNICs);
    SO_SNDBUF and SO_RCVBUF override it per socket, each on its own, and data flows
    through both."""
    from smcr.stack.runtime import BUFFER, ROCE_BUFFER, default_buffer_size  # noqa: PLC0415

    default = BUFFER if rnic == "shm" else ROCE_BUFFER
    assert default_buffer_size("shm" if rnic == "shm" else "roce") == default
    p = peer(smc_peer.echo_server, False, 2)
    port = p.recv()
    with connect(port) as s:
        assert p.recv() == ("SMCR", 0, 0)
        assert s.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) == default
        assert (s.smc_info().rmb_size, s.smc_info().peer_rmb_size) == (default, default)
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
