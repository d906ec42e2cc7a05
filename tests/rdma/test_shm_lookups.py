"""MR look-ups over one kept connection to the peer's device (:meth:`PeerLink._ask
<smcr.rdma.shm.peer.PeerLink>`, :meth:`ShmDevice._keep_asker
<smcr.rdma.shm.device.ShmDevice>`): every connection's first WRITE looks its peer's RMB
up, and a connection of its own per look-up was half the look-up's cost.  The kept
connection answers as a fresh one would, a refusal still revokes and closes, a
connection the device let go is made anew, and the device keeps a bounded number.
"""

from __future__ import annotations

import errno
import os
import socket
import time

import pytest

from smcr.rdma.shm import device as shm_device
from smcr.rdma.shm import rendezvous as rdv
from smcr.rdma.shm.segment import Segment
from tests.rdma.rdma_helpers import RW, Side


def until(check: object, timeout: float = 5.0) -> bool:
    """Whether ``check()`` came true within ``timeout`` (the device's thread acts)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return True
        time.sleep(0.01)
    return False


def test_look_ups_share_one_kept_connection_and_see_the_right_memory(
        pair: tuple[Side, Side]) -> None:  # fmt: skip
    a, b = pair
    seg = Segment("smcr-group")
    mrs = [b.pd.alloc_mr(1 << 16, RW, seg) for _ in range(20)]
    peer = a.qp._peer
    assert peer is not None
    for n, mr in enumerate(mrs):
        mr.buf[:2] = n.to_bytes(2, "big")
        mapped = peer.lookup(mr.rkey)
        assert mapped is not None and bytes(mapped.view[:2]) == n.to_bytes(2, "big")
    assert peer.asker is not None
    assert until(lambda: len(b.dev._askers) == 1)  # one connection for all 20
    seg.close()


def test_a_refused_look_up_revokes_the_token_and_the_connection_goes(
        pair: tuple[Side, Side]) -> None:  # fmt: skip
    a, b = pair
    seg = Segment("smcr-group")
    good = b.pd.alloc_mr(1 << 16, RW, seg)
    peer = a.qp._peer
    assert peer is not None
    assert peer.lookup(good.rkey) is not None
    unknown = good.rkey ^ 0x5A5A5A5A
    assert peer.lookup(unknown) is None
    assert peer.asker is None  # (a refused one is not kept)
    assert until(lambda: not b.dev._askers)
    # the token is revoked: a live MR is refused now too, over a fresh connection
    answer, fds = rdv.request(peer.path, rdv.Message(rdv.GET_MR, a=good.rkey, gid=peer.token))
    assert (answer.kind, answer.a, fds) == (rdv.NACK, errno.EPERM, [])
    seg.close()


def test_a_kept_connection_the_device_let_go_is_made_anew(pair: tuple[Side, Side]) -> None:
    a, b = pair
    seg = Segment("smcr-group")
    first, second = (b.pd.alloc_mr(1 << 16, RW, seg) for _ in range(2))
    peer = a.qp._peer
    assert peer is not None
    assert peer.lookup(first.rkey) is not None
    assert until(lambda: len(b.dev._askers) == 1)
    kept = next(iter(b.dev._askers.values()))
    kept.shutdown(socket.SHUT_RDWR)  # (the device's end gone, as at its limit or its close)
    assert peer.lookup(second.rkey) is not None
    assert until(lambda: len(b.dev._askers) == 1)
    seg.close()


def test_past_its_limit_the_device_answers_and_closes(
        pair: tuple[Side, Side], monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    a, b = pair
    monkeypatch.setattr(shm_device, "MOST_ASKERS", 0)
    seg = Segment("smcr-group")
    mrs = [b.pd.alloc_mr(1 << 16, RW, seg) for _ in range(3)]
    peer = a.qp._peer
    assert peer is not None
    for mr in mrs:
        assert peer.lookup(mr.rkey) is not None
    assert not b.dev._askers
    seg.close()


def test_a_device_s_close_closes_its_kept_connections(pair: tuple[Side, Side]) -> None:
    a, b = pair
    seg = Segment("smcr-group")
    mr = b.pd.alloc_mr(1 << 16, RW, seg)
    peer = a.qp._peer
    assert peer is not None
    assert peer.lookup(mr.rkey) is not None
    assert until(lambda: len(b.dev._askers) == 1)
    kept = next(iter(b.dev._askers.values()))
    seg.close()
    b.dev.close()
    assert kept.fileno() == -1 and not b.dev._askers


def test_connections_that_say_nothing_hold_up_no_look_up_and_are_closed(
        pair: tuple[Side, Side], monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Anyone in the network namespace may connect to a device's abstract name and say
    nothing: the device never waits for one (three of them, waited for a second each, made a
    peer's look-up time out and its WRITE fail), closes each after ``FIRST_WAIT``, and of
    more than ``MOST_WAITING`` closes the oldest (each holds a descriptor)."""
    a, b = pair
    monkeypatch.setattr(shm_device, "FIRST_WAIT", 0.5)
    monkeypatch.setattr(shm_device, "MOST_WAITING", 4)
    silent = [rdv.connect(rdv.abstract_address(b.dev.gid)) for _ in range(6)]
    seg = Segment("smcr-group")
    mr = b.pd.alloc_mr(1 << 16, RW, seg)
    peer = a.qp._peer
    assert peer is not None
    assert until(lambda: len(b.dev._waiting) == 4)  # (the two oldest closed at once)
    assert [rdv.receive(s) for s in silent[:2]] == [None, None]  # (EOF: closed)
    mapped = peer.lookup(mr.rkey)  # (a fresh connection: the first look-up)
    assert mapped is not None
    mr.buf[:3] = b"yes"
    assert bytes(mapped.view[:3]) == b"yes"
    assert until(lambda: not b.dev._waiting, timeout=5.0)  # the rest closed at FIRST_WAIT
    for s in silent[2:]:
        s.settimeout(2.0)
        assert rdv.receive(s) is None
    for s in silent:
        s.close()
    seg.close()


def test_a_silent_connection_woken_for_nothing_keeps_its_first_deadline(
        pair: tuple[Side, Side], monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A watched connection woken with no message there (a spurious wake-up) is watched on
    under the deadline it had: no timer more, and closed ``FIRST_WAIT`` after its accept
    however often it is woken."""
    _, b = pair
    monkeypatch.setattr(shm_device, "FIRST_WAIT", 1.0)
    server = b.dev._server
    silent = rdv.connect(rdv.abstract_address(b.dev.gid))
    accepted = time.monotonic()
    assert until(lambda: len(b.dev._waiting) == 1)
    conn = next(iter(b.dev._waiting.values()))
    timers = len(server._timers)
    for _ in range(4):  # (each run by the device's thread, as its wake-ups are)
        server.call_at(time.monotonic(), lambda: b.dev._on_first(conn, 0))
        time.sleep(0.15)
    assert b.dev._waiting == {conn.fileno(): conn}  # still watched
    assert len(server._timers) <= timers  # (the deadline's timer only, or none fired yet)
    silent.settimeout(3.0)
    assert rdv.receive(silent) is None  # closed at its first deadline...
    assert time.monotonic() - accepted < 1.0 + 0.5  # ...not one pushed back by the wakes
    assert not b.dev._waiting
    silent.close()


def test_a_hello_and_a_look_up_in_pieces_are_answered(pair: tuple[Side, Side]) -> None:
    """A requester whose first message comes a moment after its connect (the device
    accepted before it was there) is answered when it comes."""
    a, b = pair
    seg = Segment("smcr-group")
    mr = b.pd.alloc_mr(1 << 16, RW, seg)
    peer = a.qp._peer
    assert peer is not None
    sock = rdv.connect(peer.path)
    assert until(lambda: len(b.dev._waiting) == 1)
    rdv.send(sock, rdv.Message(rdv.GET_MR, a=mr.rkey, gid=peer.token))
    answer = rdv.receive(sock)
    assert answer is not None
    msg, fds = answer
    assert msg.kind in (rdv.MR_OK, rdv.MR_AT) and len(fds) == 1
    for fd in fds:
        os.close(fd)
    assert until(lambda: not b.dev._waiting and len(b.dev._askers) == 1)
    sock.close()
    seg.close()
