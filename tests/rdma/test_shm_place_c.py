"""The C of the shm fused send (``rdma/shm/_place.c``) against the Python it stands for.

The compiled build serves it (CI builds it: there a missing module fails, not skips).
"""

from __future__ import annotations

import random
import select
from collections.abc import Iterator
from pathlib import Path

import pytest

from smcr.rdma import QpCap, RecvWr, Sge, WcStatus
from smcr.rdma import bells as bl
from smcr.rdma.completion import ARM_PROGRESS, ARM_SLEEPER, ARM_STANDBY
from smcr.rdma.shm import layout as lay
from smcr.rdma.shm import send
from tests.rdma.rdma_helpers import Side, connect, make_side

C = pytest.importorskip("smcr.rdma.shm._place", reason="the compiled build serves it")
CAP = QpCap(max_inline_data=1 << 16)


@pytest.fixture
def pairs(shm_dir: Path) -> Iterator[list[tuple[Side, Side]]]:
    made = []
    for i in range(2):
        a = make_side(shm_dir, f"a{i}", 0x10, cap=CAP)
        b = make_side(shm_dir, f"b{i}", 0x20, cap=CAP)
        connect(a, b)
        made.append((a, b))
    yield made
    for a, b in made:
        a.dev.close()
        b.dev.close()


def test_c_and_python_place_alike(pairs: list[tuple[Side, Side]],
                                  monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The same batches (no WRITE, one, two around the RMB's end; SENDs of every length up
    to a slot) through the C on one pair and the Python on the other: the same bytes land,
    the same messages arrive, the PSNs and counts agree."""
    rng = random.Random(7)
    length = pairs[0][1].rmb.length
    batches = []
    for _ in range(300):
        kind = rng.randrange(3)
        n = rng.randrange(1, 3000)
        at = rng.randrange(length - n) if kind < 2 else length - rng.randrange(1, n)
        data = rng.randbytes(n)
        writes = [] if kind == 0 else [(at, data)] if kind == 1 else [
            (at, data[: length - at]), (0, data[length - at :])]  # fmt: skip
        batches.append((writes, rng.randbytes(rng.randrange(1, 65))))
    results = []
    for (a, b), place in zip(pairs, (C, None), strict=True):
        monkeypatch.setattr(send, "PLACE", place)
        got = []
        for i, (writes, message) in enumerate(batches):
            b.qp.post_recv(RecvWr(wr_id=i, sg_list=(Sge(b.buf.addr, 64, b.buf.lkey),)))
            wrs = [(b.rmb.addr + off, b.rmb.rkey, memoryview(d)) for off, d in writes]
            a.qp.post_writes_send(wrs, message, i, i % 7 == 0)
            (wc,) = b.wait()
            assert (wc.status, wc.byte_len) == (WcStatus.SUCCESS, len(message))
            got.append(bytes(b.buf.buf[: len(message)]))
        sent = [wc.wr_id for wc in a.cq.poll(1000)]
        results.append((got, bytes(b.rmb.buf), a.qp._next_psn, a.qp._produced, sent,
                        lay.U32.unpack_from(b.qp._area, lay.OFF_EPSN)[0]))  # fmt: skip
    assert results[0] == results[1]
    assert results[0][0] == [m for _, m in batches]
    assert results[0][4] == list(range(0, 300, 7))


def test_a_refusal_writes_nothing(pairs: list[tuple[Side, Side]]) -> None:
    """Every check the Python makes refuses in C too, before a byte moves."""
    a, b = pairs[0]
    b.qp.post_recv(RecvWr(wr_id=1, sg_list=(Sge(b.buf.addr, 64, b.buf.lkey),)))
    a.qp.post_writes_send([(b.rmb.addr, b.rmb.rkey, memoryview(b"x"))], b"m", 1, False)
    b.wait()  # (the peer MR is mapped now)
    b.qp.post_recv(RecvWr(wr_id=2, sg_list=(Sge(b.buf.addr, 64, b.buf.lkey),)))
    peer = a.qp._peer
    assert peer is not None
    rm = peer.mrs[b.rmb.rkey]
    base = dict(psn=a.qp._next_psn, produced=a.qp._produced, depth=peer.depth,
                slot_size=peer.slot_size, mtu=a.qp._mtu, limit=a.qp._max_inline, iova=rm.iova,
                end=rm.end, allowed=rm.allowed, pd=rm.pd, mr_offset=rm.offset, seal=rm.seal,
                generation=rm.generation, addr=rm.iova + 8, addr2=0)  # fmt: skip

    def place(changes: dict[str, int] | None = None, message: bytes = b"cdc") -> int:
        v = {**base, **(changes or {})}
        return int(C.place_send(peer.area, peer.table, rm.view, b"data", None, message,
                                *v.values()))  # fmt: skip

    before = (bytes(peer.area), bytes(rm.view))
    for refused in (dict(psn=base["psn"] + 1), dict(produced=base["produced"] + 1),
                    dict(seal=rm.seal ^ 1), dict(generation=rm.generation + 1),
                    dict(pd=rm.pd + 1), dict(addr=rm.iova - 1), dict(addr=rm.end - 2),
                    dict(limit=3), dict(allowed=0), dict(slot_size=2)):  # fmt: skip
        assert place(refused) == -1, refused
    assert place(message=bytes(peer.slot_size + 1)) == -1
    assert (bytes(peer.area), bytes(rm.view)) == before
    lay.U32.pack_into(peer.area, lay.OFF_STATE, 6)  # the peer QP in ERR
    assert place() == -1
    lay.U32.pack_into(peer.area, lay.OFF_STATE, 3)
    assert place() == (base["psn"] + 2) & 0xFFFFFF  # (then it goes: the checks were each's)
    assert bytes(rm.view[8:12]) == b"data"


def notify_segment(arm: int, rid: int = 0, token: int = 5) -> bytearray:
    seg = bytearray(bl.WATCHES_END)
    lay.U32.pack_into(seg, 0, arm)
    lay.U32.pack_into(seg, bl.WATCHES + 4 * (token & bl.WATCH_MASK), rid)
    return seg


@pytest.mark.parametrize(("arm", "rid", "wake", "bells", "whom", "arm_after", "rid_after"), [
    (0, 9, 5, True, 0, 0, 9),  # a poller is awake: nobody
    (ARM_SLEEPER, 9, 5, True, 1, 0, 9),  # an application thread asleep: always the CQ
    (ARM_PROGRESS, 9, 5, True, 9 << 2 | 1, ARM_PROGRESS, 0),  # the consumer's bell
    (ARM_STANDBY, 9, 5, True, 9 << 2 | 2, ARM_STANDBY, 0),
    (ARM_STANDBY, 0, 5, True, 2, 0, 0),  # no bell armed: the standby doorbell
    (ARM_PROGRESS, 9, 0, True, 1, 0, 9),  # a SEND of no connection
    (ARM_PROGRESS, 9, 5, False, 1, 0, 9),  # a peer that does not ring by name
])  # fmt: skip
def test_look_peer_says_whom_to_ring(arm: int, rid: int, wake: int, bells: bool, whom: int,
                                     arm_after: int, rid_after: int) -> None:  # fmt: skip
    seg = notify_segment(arm, rid)
    assert C.look_peer(seg, 70, wake, bl.WATCHES, bl.WATCH_MASK, bells) == whom
    assert seg[70] == 1  # the peer QP's mark
    assert lay.U32.unpack_from(seg, 0)[0] == arm_after
    assert lay.U32.unpack_from(seg, bl.WATCHES + 4 * 5)[0] == rid_after


def test_look_peer_refuses_a_short_segment() -> None:
    with pytest.raises(ValueError):
        C.look_peer(bytearray(2), 0, 0, bl.WATCHES, bl.WATCH_MASK, False)
    with pytest.raises(ValueError):
        C.look_peer(bytearray(64), 64, 0, bl.WATCHES, bl.WATCH_MASK, False)
    # a watch word past the segment's end is not read (an older consumer's segment)
    assert C.look_peer(notify_segment(ARM_PROGRESS)[:100], 0, 5, bl.WATCHES, bl.WATCH_MASK,
                       True) == 1  # fmt: skip


def _rung(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


@pytest.mark.parametrize("place", ["c", "python"])
def test_a_standby_arm_rings_the_door_it_was_taken_for(pairs: list[tuple[Side, Side]],
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       place: str) -> None:  # fmt: skip
    """A requester that finds the consumer's CQ armed takes the arm and rings its door.  The
    C takes it by a compare and exchange, so the door is the one of the value it took: the
    standby's alone.  The Python has no atomic exchange, and between its load and its store
    the consumer may have armed for the other door (a poller that took the standby's arm
    back and armed its own): for a standby's arm it rings both, a spurious wake-up at
    worst, where ringing the one it read left that poller asleep with its news in the
    queue; a poller's arm rings the poller's door alone (the standby rung at every message
    woke the progress thread at every round trip)."""
    a, b = pairs[0]
    monkeypatch.setattr(send, "PLACE", C if place == "c" else None)
    peer = a.qp._peer
    assert peer is not None and peer.notify is not None and peer.standby_bell is not None
    b.cq.clear_signal()
    b.cq.clear_standby()
    lay.U32.pack_into(peer.notify, 0, ARM_STANDBY)
    send.notify(peer)
    assert lay.U32.unpack_from(peer.notify, 0)[0] == 0
    assert _rung(b.cq.standby_fileno())
    assert _rung(b.cq.fileno()) == (place == "python")
    b.cq.clear_signal()
    b.cq.clear_standby()
    lay.U32.pack_into(peer.notify, 0, ARM_SLEEPER)
    send.notify(peer)  # (a poller's arm: its door, the CQ's)
    assert lay.U32.unpack_from(peer.notify, 0)[0] == 0
    assert _rung(b.cq.fileno())
    assert not _rung(b.cq.standby_fileno())
