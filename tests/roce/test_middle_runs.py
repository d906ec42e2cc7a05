"""The data path's runs of WRITE Middles: built and placed as the general path would.

``IcrcV4/IcrcV6.run_frames`` (sender) must give the very bytes ``frames``
gives for the same packets queued one by one; ``place_middles`` (receiver) must
place exactly the packets the general path would accept as in-order Middles,
stop before anything else, and leave the target untouched past what it placed.
Each test runs twice: with the C loops (``_loops.c``, built by install.sh with the
compiled modules: a missing build fails here) and with the Python ones.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import socket
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smcr import native, nativebuild
from smcr.rdma.roce import fastpath
from smcr.rdma.roce.fastpath import ACK_REQ, U24, Buffer, IcrcV4, IcrcV6, MiddleRun

DQP = 0x00ABCDEF
PMTU = 256
SEG = PMTU + 16


def c_loops() -> ModuleType:
    """The built C loops, also in a pure-Python process (loaded from the build's file)."""
    name = "smcr.rdma.roce._loops"
    if name in sys.modules:
        return sys.modules[name]
    built, files = native.check()
    assert name in files, f"no C loops ({built.reason}): install.sh builds them"
    assert name in nativebuild.C_EXTENSIONS
    loader = importlib.machinery.ExtensionFileLoader(name, str(files[name]))
    spec = importlib.util.spec_from_file_location(name, files[name], loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@pytest.fixture(params=["C", "Python"], autouse=True, scope="module")
def loops(request: pytest.FixtureRequest) -> Iterator[str]:
    """The module's tests with each implementation of the loops (module scope: hypothesis
    wants no function-scoped fixture)."""
    before = fastpath.LOOPS
    fastpath.LOOPS = c_loops() if request.param == "C" else None
    try:
        yield request.param
    finally:
        fastpath.LOOPS = before


def _flows(v6: bool, sport: int) -> tuple[IcrcV4 | IcrcV6, IcrcV4 | IcrcV6]:
    """The sender's and the receiver's ICRC calculators of one flow."""
    if v6:
        a, b = (socket.inet_pton(socket.AF_INET6, x) for x in ("fd00::1", "fd00::2"))
        return IcrcV6(a, b, sport), IcrcV6(a, b, sport)
    a, b = socket.inet_aton("10.9.0.1"), socket.inet_aton("10.9.0.2")
    return IcrcV4(a, b, sport), IcrcV4(a, b, sport)


def _run(psn: int, count: int, index: int, data: bytes) -> MiddleRun:
    return MiddleRun(0x07, psn, memoryview(data), index * PMTU, PMTU, count, index, 8)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, U24), st.integers(1, 12), st.integers(0, 5), st.integers(1, 30),
       st.integers(0, 0xFFFF), st.booleans())  # fmt: skip
def test_run_frames_are_frames_of_the_same_packets(
        psn: int, count: int, start: int, index: int, sport: int, v6: bool) -> None:  # fmt: skip
    tx, _ = _flows(v6, sport)
    data = bytes(range(256)) * (PMTU * 50 // 256)
    run = _run(psn, count + start, index, data)
    queue: list[tuple[int, int, int, bytes, Buffer]] = []
    for i in range(start, start + count):
        p = (psn + i) & U24
        ack = ACK_REQ if (index + i) % 8 == 7 else 0
        off = (index + i) * PMTU
        queue.append((0x07, 0, ack | p, b"", data[off : off + PMTU]))
    want = b"".join(bytes(x) for x in tx.frames(queue, 0, count, DQP))
    got = b"".join(bytes(x) for x in tx.run_frames(run, start, count, DQP))
    assert got == want
    assert run.split(start).count == count and run.split(start).psn == (psn + start) & U24


def _gro(v6: bool, psn: int, count: int) -> tuple[IcrcV4 | IcrcV6, bytearray, bytes]:
    """A receiver's flow and one GRO read of ``count`` Middles from PSN ``psn`` (IDs 0..)."""
    tx, rx = _flows(v6, 4242)
    data = bytes((i * 7 + 3) & 0xFF for i in range(PMTU * 64))
    frames = tx.run_frames(_run(psn, count, 1, data), 0, count, DQP)
    return rx, bytearray(b"".join(bytes(x) for x in frames)), data[PMTU : PMTU * (count + 1)]


@settings(max_examples=40, deadline=None)
@given(st.integers(0, U24), st.integers(1, 12), st.booleans())
def test_place_middles_places_a_whole_read(psn: int, count: int, v6: bool) -> None:
    rx, read, payload = _gro(v6, psn, count)
    target = memoryview(bytearray(PMTU * 80))
    placed, ack = rx.place_middles(memoryview(read), 0, len(read), SEG, 0, DQP, psn, 100,
                                   target, PMTU)  # fmt: skip
    assert placed == count
    assert bytes(target[PMTU : PMTU * (count + 1)]) == payload
    assert not any(target[:PMTU]) and not any(target[PMTU * (count + 1) :])
    # run index 1, AckReq every 8th (index % 8 == 7): packet i=6 of the run
    assert ack == ((psn + 6) & U24 if count > 6 else -1)


def test_place_middles_stops_before_what_the_general_path_must_see() -> None:
    psn = 0xFFFFFE  # the run wraps the PSN space
    for v6 in (False, True):
        rx, read, payload = _gro(v6, psn, 6)
        view = memoryview(read)

        def place(limit: int = 100, start_psn: int = psn, data: memoryview = view,
                  ip_id: int = 0, rx: IcrcV4 | IcrcV6 = rx) -> tuple[int, bytes]:  # fmt: skip
            target = memoryview(bytearray(PMTU * 8))
            n, _ack = rx.place_middles(data, 0, len(data), SEG, ip_id, DQP, start_psn, limit,
                                       target, 0)  # fmt: skip
            return n, bytes(target)

        assert place()[0] == 6
        n, placed = place(limit=4)  # the Middles that leave room for the Last
        assert n == 4 and placed[: PMTU * 4] == payload[: PMTU * 4] and not any(placed[PMTU * 4 :])
        assert place(start_psn=psn + 1)[0] == 0  # not the PSN expected: sequence error path
        corrupt = bytearray(read)
        corrupt[SEG * 3 + 100] ^= 0x01  # a payload bit of packet 3
        n, placed = place(data=memoryview(corrupt))
        assert n == 3 and not any(placed[PMTU * 3 :])  # nothing of the bad packet placed
        other_op = bytearray(read)
        other_op[SEG * 2] = 0x08  # packet 2 a WRITE Last
        assert place(data=memoryview(other_op))[0] == 2
        flagged = bytearray(read)
        flagged[SEG * 1 + 1] = 0x80  # SE set on packet 1: not the plain Middle
        assert place(data=memoryview(flagged))[0] == 1
        other_qp = bytearray(read)
        other_qp[7] ^= 1  # packet 0 for another QP
        assert place(data=memoryview(other_qp))[0] == 0
        if not v6:  # IPv4: the ICRC covers the ID; a read whose IDs are not 0, 1, ... stops
            assert place(ip_id=1)[0] == 0


def test_place_middles_never_writes_past_the_target() -> None:
    """A target too short for the packets to place is an error, not a write past its end."""
    rx, read, payload = _gro(False, 10, 3)
    target = memoryview(bytearray(PMTU * 3))
    with pytest.raises(ValueError):
        rx.place_middles(memoryview(read), 0, len(read), SEG, 0, DQP, 10, 3, target, PMTU)
    assert bytes(target[PMTU:]) == payload[: PMTU * 2]  # the two that fitted, nothing more

