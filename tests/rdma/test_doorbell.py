"""Doorbells rung and drained (smcr.rdma.doorbell): the C calls and the Python's alike."""

from __future__ import annotations

import _socket
import errno
import fcntl
import os
import select
import socket
import sys
import termios
from collections.abc import Iterator
from pathlib import Path

import pytest

from smcr import native, plainsock
from smcr.rdma import doorbell
from smcr.rdma.completion import ARM_STANDBY, DRAIN_EVERY, CompletionQueue, EpollCq
from smcr.rdma.verbs import WcOpcode, WcStatus, WorkCompletion


@pytest.fixture(params=["c", "python"])
def calls(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Each test runs with the C calls (where this build has them) and with the Python's."""
    if request.param == "c":
        if doorbell.C_CALLS is None:
            assert not native.status().compiled  # (a compiled build always has them)
            pytest.skip("a pure-Python build has no C calls")
    else:
        monkeypatch.setattr(doorbell, "C_CALLS", None)
    yield request.param


def _readable(sock: _socket.socket) -> bool:
    return bool(select.select([sock], [], [], 0)[0])


@pytest.fixture
def pair() -> Iterator[tuple[_socket.socket, _socket.socket]]:
    """A doorbell's two ends (the socket type the runtime's doorbells are)."""
    r, w = plainsock.nonblocking_pair()
    yield r, w
    r.close()
    w.close()


def test_ring_makes_the_other_end_readable_and_drain_empties_it(
        calls: str, pair: tuple[_socket.socket, _socket.socket]) -> None:  # fmt: skip
    r, w = pair
    assert not _readable(r)
    assert doorbell.ring(w) is True
    assert doorbell.ring(w) is True
    assert _readable(r)
    assert doorbell.drain(r) == 2
    assert not _readable(r)
    assert doorbell.drain(r) == 0  # (nothing there: no error, no wait)


def test_a_full_doorbell_is_not_rung_again_and_nothing_blocks(
        calls: str, pair: tuple[_socket.socket, _socket.socket]) -> None:  # fmt: skip
    r, w = pair
    w.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    rung = 0
    while doorbell.ring(w):  # (a blocking send would hang here)
        rung += 1
        assert rung < 10_000_000
    assert rung > 0
    drained = 0
    while (got := doorbell.drain(r)) > 0:
        assert got <= 4096
        drained += got
    assert drained == rung
    assert doorbell.ring(w) is True  # room again


def test_a_dead_peer_or_a_closed_bell_is_not_an_error(calls: str) -> None:
    r, w = plainsock.nonblocking_pair()
    r.close()
    assert doorbell.ring(w) is False  # EPIPE, no SIGPIPE
    w.close()
    assert doorbell.ring(w) is False  # closed: fileno() -1, nothing written anywhere
    assert doorbell.drain(w) == 0
    assert doorbell.drain(r) == 0


def test_the_calls_take_a_socket_object_only(calls: str) -> None:
    with pytest.raises(AttributeError):
        doorbell.ring(3)  # type: ignore[arg-type]
    with pytest.raises(AttributeError):
        doorbell.drain(b"x")  # type: ignore[arg-type]


def test_a_cqs_kick_and_clear_signal_go_through_them(calls: str) -> None:
    cq = CompletionQueue(4)
    try:
        fd = cq.fileno()
        assert not select.select([fd], [], [], 0)[0]
        cq.kick()
        assert select.select([fd], [], [], 0)[0]
        cq.clear_signal()
        assert not select.select([fd], [], [], 0)[0]
        cq.kick_standby()
        assert select.select([cq.standby_fileno()], [], [], 0)[0]
        cq.clear_standby()
        assert not select.select([cq.standby_fileno()], [], [], 0)[0]
    finally:
        cq.close()
    cq.kick()  # closed: nothing happens
    cq.clear_signal()


def _bytes_waiting(sock: _socket.socket) -> int:
    got = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    return int.from_bytes(got, sys.byteorder)


A_RECV = WorkCompletion(wr_id=1, status=WcStatus.SUCCESS, opcode=WcOpcode.RECV_RDMA_WITH_IMM,
                        qp_num=1)  # fmt: skip
"""A completion whose push rings an armed CQ."""


@pytest.fixture
def edge_sleeper() -> Iterator[tuple[CompletionQueue, select.epoll]]:
    """A CQ and an epoll that watches its doorbell edge-triggered, as the runtime's pollers."""
    cq = CompletionQueue(4)
    ep = select.epoll()
    ep.register(cq.fileno(), select.EPOLLIN | select.EPOLLET)
    yield cq, ep
    ep.close()
    cq.close()


def test_an_edge_triggered_sleeper_hears_every_ring_and_the_bell_never_fills(
        calls: str, edge_sleeper: tuple[CompletionQueue, select.epoll]) -> None:  # fmt: skip
    """A thread asleep on a CQ's doorbell edge-triggered (the runtime's pollers) does not
    drain it at each wake-up: each ring is a new edge.  ``arming`` drains it every
    ``DRAIN_EVERY`` arms, so the bytes of one ring per arm never pile up to a full buffer
    (whose rings would be dropped, and never heard that way)."""
    cq, ep = edge_sleeper
    assert cq.edge_signals
    most = 0
    for _ in range(10 * DRAIN_EVERY):
        cq.arming()
        cq.req_notify()
        cq.push(A_RECV)
        assert ep.poll(5) == [(cq.fileno(), select.EPOLLIN)]  # heard, every time
        assert cq.poll(4)
        most = max(most, _bytes_waiting(cq._bell_r))
    assert ep.poll(0) == []  # (no ring: no edge, though bytes wait)
    assert 0 < most <= DRAIN_EVERY


def test_rings_for_a_standbys_arms_are_drained_before_a_sleeper_arms(
        calls: str, edge_sleeper: tuple[CompletionQueue, select.epoll]) -> None:  # fmt: skip
    """An event loop arms the CQ for its standby at every send and never sleeps on it; a
    requester too old for the standby doorbell rings the CQ's doorbell for those arms.  The
    bytes pile up (nobody drains a doorbell nobody sleeps on), but the next sleeper's arm
    drains them first: its own ring is then never the one a full buffer drops."""
    cq, ep = edge_sleeper
    cq._bell_w.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # (fills soon)
    for _ in range(2000):
        cq.req_notify(ARM_STANDBY)
        cq.kick()  # (the old requester's ring, at the CQ's door)
    assert _bytes_waiting(cq._bell_r) > 0
    assert not doorbell.ring(cq._bell_w)  # full: a ring now would be dropped
    cq.arming()
    cq.req_notify()
    assert _bytes_waiting(cq._bell_r) == 0
    ep.poll(0)  # (the standby rings' edge, taken)
    cq.push(A_RECV)
    assert ep.poll(5) == [(cq.fileno(), select.EPOLLIN)]  # the sleeper's ring, heard


def test_a_cq_whose_provider_descriptors_stay_readable_is_told_level_triggered() -> None:
    """The RoCE RNIC's and verbs' CQs: their sockets stay readable until the hook reads
    them, which an edge-triggered sleeper would miss."""
    cq = EpollCq(4)
    try:
        assert not cq.edge_signals
    finally:
        cq.close()


def _named(name: bytes) -> _socket.socket:
    sock = plainsock.datagram()
    sock.bind(name)
    return sock


def test_ring_to_sends_a_datagram_to_an_abstract_name_and_queued_peeks(calls: str) -> None:
    name = b"\0smcr-test-doorbell-%d" % os.getpid()
    target, ringer = _named(name), plainsock.datagram()
    try:
        assert doorbell.queued(target) is False
        assert doorbell.ring_to(ringer, name) == 0
        assert doorbell.queued(target) is True
        assert doorbell.queued(target) is True  # (a peek takes nothing)
        assert target.recv(64) == b"r"
        assert doorbell.queued(target) is False
        assert doorbell.ring_to(ringer, name) == 0
        assert doorbell.drain(target) == 1  # one datagram, as recv takes it
        assert doorbell.queued(target) is False
        assert doorbell.ring_to(ringer, name + b"-nobody") == errno.ECONNREFUSED
    finally:
        target.close()
        ringer.close()
    assert doorbell.ring_to(ringer, name) == errno.EBADF  # closed: nothing sent
    assert doorbell.queued(ringer) is False


def test_ring_to_a_path_and_to_a_full_queue(calls: str, tmp_path: Path) -> None:
    path = str(tmp_path / "bell").encode()
    target, ringer = _named(path), plainsock.datagram()
    try:
        assert doorbell.ring_to(ringer, path) == 0
        assert target.recv(64) == b"r"
        sent = 0
        while (err := doorbell.ring_to(ringer, path)) == 0:  # (never blocks)
            sent += 1
            assert sent < 1_000_000
        assert err == errno.EAGAIN
        assert sent > 0
        got = 0
        while doorbell.queued(target):
            assert doorbell.drain(target) == 1
            got += 1
        assert got == sent
    finally:
        target.close()
        ringer.close()


def test_ring_to_says_what_python_says_of_a_name_too_long(calls: str) -> None:
    ringer = plainsock.datagram()
    try:
        with pytest.raises(OSError, match="too long"):
            doorbell.ring_to(ringer, b"/" + b"x" * 200)
        with pytest.raises(OSError, match="too long"):
            doorbell.ring_to(ringer, b"\0" + b"x" * 200)
    finally:
        ringer.close()


@pytest.mark.parametrize("rid", [0, 1, 2, 0xFFFF, 0x1234567, 0xFFFFFFFF])
def test_ring_rid_rings_the_name_bell_name_makes(calls: str, rid: int) -> None:
    """A producer rings a consumer's readiness descriptor by its prefix and rid: the name rung
    is the one the consumer bound (``bell_name``), for any rid a process hands out."""
    prefix = b"\0smcr-test-ring-rid-%d-" % os.getpid()
    target, ringer = _named(doorbell.bell_name(prefix, rid)), plainsock.datagram()
    try:
        assert doorbell.ring_rid(ringer, prefix, rid) == 0
        assert target.recv(64) == b"r"
        assert doorbell.ring_rid(ringer, prefix, rid ^ 0x10) == errno.ECONNREFUSED  # nobody
        assert doorbell.queued(target) is False
        with pytest.raises(ValueError, match="abstract"):
            doorbell.ring_rid(ringer, prefix[1:], rid)  # a path's start: not a bell's name
        if calls == "c":
            assert doorbell.C_CALLS is not None
            assert doorbell.C_CALLS.SCRAMBLE == doorbell.SCRAMBLE
    finally:
        target.close()
        ringer.close()
    assert doorbell.ring_rid(ringer, prefix, rid) == errno.EBADF  # closed: nothing sent


def test_the_c_and_python_drains_read_the_same_most(calls: str) -> None:
    """Callers tell a full read (more may wait) by DRAIN_MOST: whichever drain runs reads at
    most that many in one call, and exactly that many where more wait."""
    r, w = plainsock.nonblocking_pair()
    try:
        w.send(bytes(doorbell.DRAIN_MOST + 10))
        assert doorbell.drain(r) == doorbell.DRAIN_MOST
        assert doorbell.drain(r) == 10
        if calls == "c":
            assert doorbell.C_CALLS is not None
            assert doorbell.C_CALLS.DRAIN_MOST == doorbell.DRAIN_MOST
    finally:
        r.close()
        w.close()


def test_ready_reports_the_descriptors_ready_now_and_nothing_else(calls: str) -> None:
    """``ready`` is ``epoll.poll(0)``'s descriptors: the rung ones, none once drained, at
    once when none is ready; a closed epoll raises as ``poll`` does."""
    pairs = [plainsock.nonblocking_pair() for _ in range(3)]
    ep = select.epoll()
    try:
        for r, _w in pairs:
            ep.register(r.fileno(), select.EPOLLIN)
        assert doorbell.ready(ep) == []
        doorbell.ring(pairs[0][1])
        doorbell.ring(pairs[2][1])
        assert sorted(doorbell.ready(ep)) == sorted([pairs[0][0].fileno(), pairs[2][0].fileno()])
        assert sorted(doorbell.ready(ep)) == sorted(fd for fd, _ in ep.poll(0))
        doorbell.drain(pairs[0][0])
        assert doorbell.ready(ep) == [pairs[2][0].fileno()]
    finally:
        ep.close()
        for r, w in pairs:
            r.close()
            w.close()
    with pytest.raises(ValueError):
        doorbell.ready(ep)


def test_ready_reports_every_ready_descriptor_over_successive_looks(calls: str) -> None:
    """More ready descriptors than one look reports (the C's takes 256 at most): they stay
    ready, and the looks that follow report the rest (a level-triggered epoll moves the
    reported ones behind the others)."""
    pairs = [plainsock.nonblocking_pair() for _ in range(300)]
    ep = select.epoll()
    try:
        for r, w in pairs:
            ep.register(r.fileno(), select.EPOLLIN)
            doorbell.ring(w)
        seen: set[int] = set()
        for _ in range(3):
            seen.update(doorbell.ready(ep))
        assert seen == {r.fileno() for r, _w in pairs}
    finally:
        ep.close()
        for r, w in pairs:
            r.close()
            w.close()
