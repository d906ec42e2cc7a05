"""The C send loop of WRITE Middles (``_loops.c`` ``sendrun``, :meth:`IcrcFlow.send_run`):
it sends exactly the packets ``run_frames`` builds in Python, then the buffers after the
run, in one ``sendmsg`` (UDP GSO cuts them into the datagrams), and refuses bad
arguments before it sends anything.  Over loopback, read back datagram by datagram.
"""

from __future__ import annotations

import errno
import socket
import struct
from collections.abc import Iterator

import pytest

from smcr.rdma.roce import fastpath
from smcr.rdma.roce.fastpath import Buffer, IcrcV4, IcrcV6
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
