"""The C send loops (``_loops.c``): ``sendrun`` (:meth:`IcrcFlow.send_run`) sends exactly
the packets ``run_frames`` builds in Python, then the buffers after the run, in one
``sendmsg`` (UDP GSO cuts them into the datagrams); ``sendq`` (:meth:`IcrcFlow.send_packets`)
exactly what ``frames`` builds for any queued packets; both refuse bad arguments before
they send anything.  Over loopback, read back datagram by datagram.  Also the receiver's
C: ``recvgro``, and ``verify`` against :meth:`IcrcV4.verify`/:meth:`IcrcV6.verify`.
"""

from __future__ import annotations

import errno
import socket
import struct
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smcr.rdma.roce import fastpath
from smcr.rdma.roce.fastpath import ACK_REQ, Buffer, IcrcV4, IcrcV6
from smcr.wire.roce_packet import (
    RocePacket,
    build_ipv4_udp_roce_frame,
    build_ipv6_udp_roce_frame,
    split_udp_datagram,
)
from tests.roce.test_fastpath import DST, SRC, packets
from tests.roce.test_middle_runs import DQP, PMTU, SEG, _flows, _run, c_loops


@pytest.fixture(autouse=True)
def the_c_loops(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fastpath, "LOOPS", c_loops())


@pytest.fixture(params=[socket.AF_INET, socket.AF_INET6], ids=["ipv4", "ipv6"])
def link(request: pytest.FixtureRequest) -> Iterator[tuple[socket.socket, socket.socket, bytes]]:
    """A sending and a receiving UDP socket on loopback, and the receiver's packed address."""
    family = request.param
    host = "127.0.0.1" if family == socket.AF_INET else "::1"
    rx, tx = socket.socket(family, socket.SOCK_DGRAM), socket.socket(family, socket.SOCK_DGRAM)
    rx.bind((host, 0))
    rx.settimeout(2.0)
    port = rx.getsockname()[1].to_bytes(2, "big")
    addr = socket.inet_pton(family, host)
    name = (struct.pack("=H2s4s8s", family, port, addr, b"") if family == socket.AF_INET
            else struct.pack("=H2sI16sI", family, port, 0, addr, 0))  # fmt: skip
    yield tx, rx, name
    rx.close()
    tx.close()


def flow(tx: socket.socket) -> IcrcV4 | IcrcV6:
    return _flows(tx.family == socket.AF_INET6, 4791)[0]


def datagrams(rx: socket.socket, n: int) -> list[bytes]:
    return [rx.recv(1 << 16) for _ in range(n)]


DATA = bytes((i * 13 + 5) & 0xFF for i in range(PMTU * 48))


@pytest.mark.parametrize(("start", "m"), [(0, 1), (0, 7), (3, 12), (0, 40)])
def test_send_run_sends_the_packets_run_frames_builds(
        link: tuple[socket.socket, socket.socket, bytes], start: int, m: int) -> None:  # fmt: skip
    tx, rx, name = link
    icrc = flow(tx)
    run = _run(0xFFFFFC, 40, 5, DATA)  # the PSN wraps within the run
    gso = SEG if m > 1 else 0
    sent = icrc.send_run(tx.fileno(), name, gso, run, start, m, DQP, [])
    assert sent == m * SEG
    want = b"".join(bytes(x) for x in icrc.run_frames(run, start, m, DQP))
    assert datagrams(rx, m) == [want[i * SEG : (i + 1) * SEG] for i in range(m)]


def test_the_packets_after_the_run_go_in_the_same_send(
        link: tuple[socket.socket, socket.socket, bytes]) -> None:  # fmt: skip
    """The Last (as long as a Middle) and a shorter CDC joined behind the run: GSO cuts
    them into datagrams of their own."""
    tx, rx, name = link
    icrc = flow(tx)
    run = _run(100, 3, 0, DATA)
    queue: list[tuple[int, int, int, bytes, Buffer]] = [
        (0x08, 0, 103, b"", DATA[3 * PMTU : 4 * PMTU]), (0x04, 0, 104, b"", bytes(44))]
    extra = icrc.frames(queue, 0, 2, DQP, 3)  # (their IPv4 IDs follow the run's: 3, 4)
    sent = icrc.send_run(tx.fileno(), name, SEG, run, 0, 3, DQP, extra)
    assert sent == 4 * SEG + 16 + 44
    got = datagrams(rx, 5)
    want = b"".join(bytes(x) for x in [*icrc.run_frames(run, 0, 3, DQP), *extra])
    assert got[:4] == [want[i * SEG : (i + 1) * SEG] for i in range(4)]
    assert got[4] == want[4 * SEG :] and len(got[4]) == 60


def test_bad_arguments_are_refused_before_anything_is_sent(
        link: tuple[socket.socket, socket.socket, bytes]) -> None:  # fmt: skip
    tx, rx, name = link
    icrc = flow(tx)
    c = c_loops()
    pre, mid, ident = icrc._varying(24 + PMTU, 0x07, DQP, 0)
    args = [tx.fileno(), name, SEG, bytearray(16 * 4 + 4), DATA, 0, PMTU, 4, bytes(8), 1, 0, 8,
            pre, mid, ident, 1, []]  # fmt: skip

    def call(**change: object) -> object:
        names = ["fd", "name", "gso", "scratch", "data", "off", "pmtu", "m", "bth8", "psn",
                 "index", "every", "pre", "mid", "ident", "step", "extra"]  # fmt: skip
        return c.sendrun(*[change.get(n, a) for n, a in zip(names, args, strict=True)])

    with pytest.raises(ValueError):
        call(scratch=bytearray(16 * 4))  # no room for the last ICRC
    with pytest.raises(ValueError):
        call(off=len(DATA) - 3 * PMTU)  # the run's payload beyond the data
    with pytest.raises(ValueError):
        call(m=0)
    with pytest.raises(ValueError):
        call(extra=[b"x"] * 400)  # more buffers than one sendmsg takes here
    with pytest.raises(TypeError):
        call(extra=(b"x",))
    with pytest.raises(BufferError):
        call(scratch=bytes(100))  # read-only
    with pytest.raises(TypeError):
        c.sendrun(*args[:-1])
    rx.settimeout(0.2)
    with pytest.raises(TimeoutError):
        rx.recv(1 << 16)  # none of them sent anything
    with pytest.raises(OSError) as failed:
        call(fd=-1)
    assert failed.value.errno == errno.EBADF
    assert call() == 4 * SEG  # the same arguments, unchanged, do send


def test_recvgro_reads_a_gro_batch_with_its_segment_size(
        link: tuple[socket.socket, socket.socket, bytes]) -> None:  # fmt: skip
    """The receiver's read (``recvgro``): a GSO run arrives as one read of a UDP_GRO socket,
    with its segment size; a lone datagram with its own length; an empty socket is
    ``(-1, 0)``, not an exception."""
    tx, rx, name = link
    rx.setsockopt(socket.SOL_UDP, 104, 1)  # UDP_GRO
    c, icrc = c_loops(), flow(tx)
    run = _run(7, 6, 0, DATA)
    buf = bytearray(1 << 16)
    assert c.recvgro(rx.fileno(), buf) == (-1, 0)
    icrc.send_run(tx.fileno(), name, SEG, run, 0, 6, DQP, [])
    n, seg = c.recvgro(rx.fileno(), buf)
    assert (n, seg) == (6 * SEG, SEG)
    assert bytes(buf[:n]) == b"".join(bytes(x) for x in icrc.run_frames(run, 0, 6, DQP))
    tx.sendto(b"x" * 44, rx.getsockname())
    assert c.recvgro(rx.fileno(), buf) == (44, 44)
    assert c.recvgro(rx.fileno(), buf) == (-1, 0)
    with pytest.raises(BufferError):
        c.recvgro(rx.fileno(), bytes(10))
    with pytest.raises(OSError) as failed:
        c.recvgro(-1, buf)
    assert failed.value.errno == errno.EBADF


# ------------------------------------------- any packet: sendq (flush_tx) and verify (_drain)


def _udp_pair(v6: bool) -> tuple[socket.socket, socket.socket, bytes]:
    """A sender, a receiver and the receiver's packed address, as the ``link`` fixture (which
    hypothesis cannot take: it is made per test, not per example)."""
    family = socket.AF_INET6 if v6 else socket.AF_INET
    host = "::1" if v6 else "127.0.0.1"
    rx, tx = socket.socket(family, socket.SOCK_DGRAM), socket.socket(family, socket.SOCK_DGRAM)
    rx.bind((host, 0))
    rx.settimeout(2.0)
    port = rx.getsockname()[1].to_bytes(2, "big")
    addr = socket.inet_pton(family, host)
    name = (struct.pack("=H2s4s8s", family, port, addr, b"") if not v6
            else struct.pack("=H2sI16sI", family, port, 0, addr, 0))  # fmt: skip
    return tx, rx, name


def _queued(pkts: list[RocePacket]) -> list[tuple[int, int, int, bytes, Buffer]]:
    """The packets as the QP queues them (``RoceQp._tx``), behind one entry not sent."""
    queue: list[tuple[int, int, int, bytes, Buffer]] = [(0, 0, 0, b"", b"x")]
    for packet in pkts:
        bth = packet.bth
        queue.append((int(bth.opcode), (bth.se << 7) | (bth.pad_cnt << 4),
                      (bth.ack_req << 31) | bth.psn, packet.encode_headers()[12:],
                      memoryview(bytearray(packet.payload))))  # fmt: skip
    return queue


@settings(max_examples=60, deadline=None)
@given(st.lists(packets(), min_size=1, max_size=6), st.booleans())
def test_sendq_sends_the_packets_frames_builds(pkts: list[RocePacket], v6: bool) -> None:
    """Any packets the QP queues (every opcode the RNIC sends, pads, extension headers):
    one at a time and all in one datagram, the bytes ``frames`` gives, packet ``k`` of a
    send with IPv4 ID ``k``."""
    tx, rx, name = _udp_pair(v6)
    try:
        icrc, queue, c = flow(tx), _queued(pkts), c_loops()
        for k in range(1, len(queue)):
            sent = icrc.send_packets(tx.fileno(), name, 0, queue, k, k + 1, DQP)
            want = b"".join(bytes(x) for x in icrc.frames(queue, k, k + 1, DQP))
            assert sent == len(want)
            assert rx.recv(1 << 16) == want
        c.sendq(tx.fileno(), name, 0, icrc.head, queue, 1, len(queue), DQP, 0)
        assert rx.recv(1 << 16) == b"".join(bytes(x) for x in icrc.frames(queue, 1, len(queue),
                                                                          DQP))  # fmt: skip
    finally:
        rx.close()
        tx.close()


def test_sendq_sends_a_gso_run_as_frames_numbers_it(
        link: tuple[socket.socket, socket.socket, bytes]) -> None:  # fmt: skip
    """Equal packets and a shorter last one in one UDP GSO send: the kernel's datagrams are
    the packets ``frames`` builds with IDs 0, 1, 2... (what flush_tx sends)."""
    tx, rx, name = link
    icrc = flow(tx)
    queue: list[tuple[int, int, int, bytes, Buffer]] = [
        (0x06, 0, 10 + k, b"", DATA[k * PMTU : (k + 1) * PMTU]) for k in range(5)]
    queue.append((0x04, 0, ACK_REQ | 15, b"", bytes(44)))
    sent = icrc.send_packets(tx.fileno(), name, SEG, queue, 0, 6, DQP)
    assert sent == 5 * SEG + 60
    want = b"".join(bytes(x) for x in icrc.frames(queue, 0, 6, DQP))
    assert datagrams(rx, 6) == [want[i * SEG : (i + 1) * SEG] for i in range(6)]


def test_sendq_refuses_a_bad_queue_before_anything_is_sent(
        link: tuple[socket.socket, socket.socket, bytes]) -> None:  # fmt: skip
    tx, rx, name = link
    icrc, c = flow(tx), c_loops()
    good: list[tuple[int, int, int, bytes, Buffer]] = [(0x04, 0, 1, b"", bytes(44))]

    def send(queue: object, start: int = 0, end: int = 1, head: object = icrc.head) -> object:
        return c.sendq(tx.fileno(), name, 0, head, queue, start, end, DQP, 0)

    with pytest.raises(ValueError):
        send(good, 0, 2)  # beyond the queue
    with pytest.raises(ValueError):
        send(good, 0, 0)  # nothing
    with pytest.raises(ValueError):
        send(good * 65, 0, 65)  # more than one send takes
    with pytest.raises(ValueError):
        send(good, head=icrc.head[:-1])  # not a masked header
    with pytest.raises(ValueError):
        send([(0x04, 0, 1, bytes(33), b"")])  # longer extension headers than any
    with pytest.raises(ValueError):
        send([(0x104, 0, 1, b"", b"")])  # no opcode
    with pytest.raises(TypeError):
        send([(0x04, 0, 1, b"")])  # not a queued packet
    with pytest.raises(TypeError):
        send(tuple(good))
    with pytest.raises(TypeError):
        send([(0x04, 0, 1, b"", 5)])  # no buffer
    rx.settimeout(0.2)
    with pytest.raises(TimeoutError):
        rx.recv(1 << 16)  # none of them sent anything
    with pytest.raises(OSError) as failed:
        c.sendq(-1, name, 0, icrc.head, good, 0, 1, DQP, 0)
    assert failed.value.errno == errno.EBADF
    assert send(good) == 60


@settings(max_examples=100, deadline=None)
@given(packets(), st.sampled_from([0, 1, 5, 127, 4000, 0xFFFF]), st.integers(0, 64),
       st.booleans())  # fmt: skip
def test_c_verify_is_python_verify(packet: RocePacket, ident: int, at: int, v6: bool) -> None:
    """The receiver's check in C (``_drain``): its difference with ID 0 is 0 exactly where
    ``verify`` says right with ID 0, and ``judge`` of a non-zero one is ``verify``'s answer:
    a recovered IPv4 ID (2) or a wrong ICRC (0); so for a flipped bit too.  Given the ID
    the packet carries, it is 0 at once."""
    sport = 0xC0DE
    if v6:
        frame = build_ipv6_udp_roce_frame(packet, "fd00::1", "fd00::2", sport)
        a, b = (socket.inet_pton(socket.AF_INET6, x) for x in ("fd00::1", "fd00::2"))
        icrc: IcrcV4 | IcrcV6 = IcrcV6(a, b, sport)
    else:
        frame = build_ipv4_udp_roce_frame(packet, SRC, DST, sport, identification=ident)
        icrc = IcrcV4(socket.inet_aton(SRC), socket.inet_aton(DST), sport)
    udp = bytes(split_udp_datagram(frame).udp_payload)
    c = c_loops()
    for candidate in (udp, udp[:-5] + bytes([udp[-5] ^ 0x20]) + udp[-4:]):
        buf = bytearray(at) + candidate + bytearray(7)  # where a GRO read puts it
        n = len(candidate)
        difference = c.verify(buf, at, n, icrc.head, 0)
        want = icrc.check(memoryview(candidate))
        assert (difference == 0) == (want == 1)
        if difference:
            assert icrc.judge(n, difference) == want
        # with the ID the packet carries (the k-th of one of our GSO reads): right at once
        # (IPv6 has no ID: the argument changes nothing)
        assert (c.verify(buf, at, n, icrc.head, ident) == 0) == (candidate is udp)
        if ident and not v6:
            assert c.verify(buf, at, n, icrc.head, ident ^ 1) != 0
    with pytest.raises(ValueError):
        c.verify(bytearray(udp), 1, len(udp), icrc.head, 0)  # beyond the buffer
    with pytest.raises(ValueError):
        c.verify(bytearray(udp), 0, 12, icrc.head, 0)  # shorter than a BTH and an ICRC
    with pytest.raises(ValueError):
        c.verify(bytearray(udp), 0, len(udp), icrc.head + b"x", 0)
    for wrong in (-1, 0x10000):
        with pytest.raises(ValueError):
            c.verify(bytearray(udp), 0, len(udp), icrc.head, wrong)
