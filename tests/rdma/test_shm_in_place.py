"""SENDs taken in place by a QP's receiver (:meth:`QueuePair.set_receiver`), shm RNIC."""

from __future__ import annotations

import functools
import threading
import time

import pytest

from smcr.rdma import (
    RecvWr,
    SendFlag,
    SendWr,
    Sge,
    VerbsError,
    WcOpcode,
    WcStatus,
    WorkCompletion,
    WrOpcode,
)
from smcr.rdma.completion import TAKEN_IN_PLACE
from smcr.rdma.shm import layout as lay
from smcr.rdma.shm import qp as shm_qp
from smcr.rdma.shm.cq import ShmCompletionQueue
from smcr.rdma.shm.qp import sends_waiting
from tests.rdma.rdma_helpers import Side


def post_recv(side: Side, wr_id: int, length: int = 64) -> None:
    off = 64 * wr_id
    side.qp.post_recv(RecvWr(wr_id=wr_id, sg_list=(Sge(side.buf.addr + off, length,
                                                       side.buf.lkey),)))  # fmt: skip


def send(src: Side, data: bytes, signaled: bool = False, at: int = 0x8000) -> None:
    """SEND ``data`` staged at ``at`` in ``src.buf`` (read when the SEND runs: after an RNR
    wait, later)."""
    src.buf.buf[at : at + len(data)] = data
    src.qp.post_send(SendWr(wr_id=1, opcode=WrOpcode.SEND,
                            send_flags=SendFlag.SIGNALED if signaled else SendFlag(0),
                            sg_list=(Sge(src.buf.addr + at, len(data), src.buf.lkey),)))


class Taker:
    """A receiver that takes messages starting with ``b"T"`` and records what it saw."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, bytes, int]] = []

    def __call__(self, qpn: int, area: memoryview, off: int, n: int) -> bool:
        data = bytes(area[off : off + n])
        self.seen.append((qpn, data, threading.get_ident()))
        return data.startswith(b"T")


def test_taken_sends_make_one_stand_in_and_keep_their_receives(pair: tuple[Side, Side]) -> None:
    """Taken SENDs: no completion each, one TAKEN_IN_PLACE per poll, the receive WR stays
    posted (more SENDs than receives ever posted go through, no RNR)."""
    a, b = pair
    taker = Taker()
    b.qp.set_receiver(taker)
    for i in range(4):
        post_recv(b, i)
    posted = lay.U64.unpack_from(b.qp._area, lay.OFF_POSTED)[0]
    for round_ in range(10):  # 30 SENDs over 4 receives
        for i in range(3):
            send(a, b"T%d-%d" % (round_, i))
        assert b.cq.poll(16) == [TAKEN_IN_PLACE]
    sent = [b"T%d-%d" % (r, i) for r in range(10) for i in range(3)]
    assert [d for _, d, _ in taker.seen] == sent
    assert {q for q, _, _ in taker.seen} == {b.qp.qp_num}
    assert lay.U64.unpack_from(b.qp._area, lay.OFF_POSTED)[0] == posted + 30
    assert b.cq.poll(16) == []
    # the receives are all still there, in order: refused messages fill them
    b.qp.set_receiver(None)
    for i in range(4):
        send(a, b"x%d" % i)
    wcs = b.cq.poll(16)
    assert [w.wr_id for w in wcs] == [0, 1, 2, 3]
    assert [bytes(b.buf.buf[64 * i : 64 * i + 2]) for i in range(4)] == [b"x0", b"x1", b"x2", b"x3"]


def test_a_refused_send_and_every_one_behind_it_complete_in_order(
        pair: tuple[Side, Side]) -> None:  # fmt: skip
    a, b = pair
    taker = Taker()
    b.qp.set_receiver(taker)
    for i in range(4):
        post_recv(b, i)
    for data in (b"T1", b"no", b"T2", b"T3"):
        send(a, data)
    wcs = b.cq.poll(16)
    assert wcs[0] is TAKEN_IN_PLACE
    assert [(w.opcode, w.status, w.byte_len) for w in wcs[1:]] == [
        (WcOpcode.RECV, WcStatus.SUCCESS, 2)] * 3
    assert [bytes(b.buf.buf[64 * w.wr_id : 64 * w.wr_id + 2]) for w in wcs[1:]] == [
        b"no", b"T2", b"T3"]
    assert [d for _, d, _ in taker.seen] == [b"T1", b"no"]  # (not asked after the refusal)


def test_only_a_poll_calls_the_receiver(pair: tuple[Side, Side]) -> None:
    """has_completions (a spinner without the consumer's lock) and a CQ with completions
    waiting deliver as before; the next poll of an empty CQ takes in place again."""
    a, b = pair
    taker = Taker()
    b.qp.set_receiver(taker)
    for i in range(4):
        post_recv(b, i)
    send(a, b"T1")
    assert b.cq.has_completions()
    assert taker.seen == []
    send(a, b"T2")
    wcs = b.cq.poll(16)  # T1's completion waited: T2 may not overtake it
    assert [w.wr_id for w in wcs] == [0, 1] and taker.seen == []
    send(a, b"T3")
    assert b.cq.poll(16) == [TAKEN_IN_PLACE]
    assert [(d, t) for _, d, t in taker.seen] == [(b"T3", threading.get_ident())]


def test_has_news_only_looks_and_the_poll_after_it_takes_in_place(
        pair: tuple[Side, Side]) -> None:  # fmt: skip
    """has_news (a spinner's look) takes nothing: the SEND stays where the peer placed it,
    and the poll that follows takes it in place; without receives posted it says no
    (neither the delivery nor the receiver could take it), and a completion waiting
    says yes."""
    a, b = pair
    taker = Taker()
    b.qp.set_receiver(taker)
    assert not b.cq.has_news()
    send(a, b"T0")  # placed past the receives posted (none yet): the requester waits (RNR)
    assert not b.cq.has_news()
    post_recv(b, 0)
    post_recv(b, 1)
    deadline = time.monotonic() + 10
    while not b.cq.has_news() and time.monotonic() < deadline:  # (the RNR retry places it)
        time.sleep(0.001)
    for _ in range(3):
        assert b.cq.has_news()
    assert taker.seen == [] and b.cq.idle()
    send(a, b"T1")
    assert b.cq.has_news() and taker.seen == []
    assert b.cq.poll(16) == [TAKEN_IN_PLACE]
    assert [d for _, d, _ in taker.seen] == [b"T0", b"T1"]
    assert not b.cq.has_news()
    post_recv(a, 0)
    send(b, b"x", signaled=True)  # b's own send completion waits in b's CQ
    assert b.cq.has_news()
    assert [w.opcode for w in b.cq.poll(16)] == [WcOpcode.SEND]
    assert not b.cq.has_news()


def test_a_local_completion_waiting_keeps_order(pair: tuple[Side, Side]) -> None:
    """A receive's completion in the CQ comes first: a SEND behind it is delivered, not
    taken in place.  The receiver's own QP's signaled send's completion comes first in
    the poll too, but the SEND behind it is taken in place (no RNIC orders a QP's send
    completions against its receives)."""
    a, b = pair
    taker = Taker()
    b.qp.set_receiver(taker)
    post_recv(b, 0)
    post_recv(b, 1)
    post_recv(a, 0)
    send(a, b"T0")
    assert b.cq.has_completions()  # (a look outside a poll: delivered into a receive)
    send(a, b"T1")
    wcs = b.cq.poll(16)
    assert [(w.opcode, w.byte_len) for w in wcs] == [(WcOpcode.RECV, 2), (WcOpcode.RECV, 2)]
    assert all(w is not TAKEN_IN_PLACE for w in wcs) and taker.seen == []
    post_recv(b, 0)
    post_recv(b, 1)
    send(b, b"to a", signaled=True)  # b's send completion waits in b's CQ
    send(a, b"T2")
    wcs = b.cq.poll(16)
    assert [w.opcode for w in wcs] == [WcOpcode.SEND, WcOpcode.RECV] and wcs[1] is TAKEN_IN_PLACE
    assert [d for _, d, _ in taker.seen] == [b"T2"]


def test_order_holds_with_a_spinner_looking_meanwhile(pair: tuple[Side, Side]) -> None:
    """A stress: a thread that spins on ``has_completions`` (delivering, without the
    consumer's lock), a producer in a third, and a poller whose receiver acts on what it
    takes at once (as the engine does): 3,000 messages, each acted on once, in order,
    however the threads split them (no receive lost or counted twice by the recycling).
    The order the CQ's idleness keeps is shown deterministically above."""
    a, b = pair
    count, depth = 3000, 16
    seen: list[int] = []
    in_place = 0

    def take(qpn: int, area: memoryview, off: int, n: int) -> bool:
        nonlocal in_place
        seq = int.from_bytes(area[off : off + 4], "little")
        if seq % 3 == 0:  # (some refused: those and what follows go as completions)
            return False
        seen.append(seq)
        in_place += 1
        return True

    b.qp.set_receiver(take)
    for i in range(depth):
        post_recv(b, i)
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            b.cq.has_completions()
            time.sleep(0)  # (the poller gets its turns too: both ways are taken)

    def produce() -> None:
        for seq in range(count):
            while True:
                try:
                    send(a, seq.to_bytes(4, "little"), at=0x8000 + 4 * (seq % 4096))
                    break
                except VerbsError:  # (the send queue full behind an RNR wait)
                    time.sleep(0.001)

    spinner = threading.Thread(target=spin)
    producer = threading.Thread(target=produce)
    spinner.start()
    producer.start()
    deadline = time.monotonic() + 60
    try:
        while len(seen) < count and time.monotonic() < deadline:
            time.sleep(0)  # (the spinner and the producer get turns between polls)
            for wc in b.cq.poll(64):
                if wc is TAKEN_IN_PLACE:
                    continue
                assert wc.status is WcStatus.SUCCESS
                seen.append(int.from_bytes(b.buf.buf[64 * wc.wr_id : 64 * wc.wr_id + 4],
                                           "little"))  # fmt: skip
                post_recv(b, wc.wr_id)
    finally:
        stop.set()
        producer.join(10)
        spinner.join(10)
    assert seen == list(range(count))
    assert 0 < in_place < count * 2 // 3  # (both ways; the refused ones never in place)


def test_no_more_taken_in_a_poll_than_receives_are_posted(pair: tuple[Side, Side]) -> None:
    """A requester that places past the receives posted (only a broken or hostile one can:
    a well-behaved one waits, RNR) gets no more taken in place in one poll than receives
    are posted; what follows is delivered into those receives as before, and the ring's
    counts stay whole (posted - consumed = the receives left)."""
    _, b = pair
    taker = Taker()
    b.qp.set_receiver(taker)
    post_recv(b, 0)
    post_recv(b, 1)
    qp = b.qp
    area = qp._area
    produced = lay.U64.unpack_from(area, lay.OFF_PRODUCED)[0]
    for i in range(4):  # four SENDs placed by hand where the requester would have
        slot = qp._slot_base + ((produced + i) % qp._depth) * qp._slot_stride
        lay.SLOT_HEADER.pack_into(area, slot, 2, lay.KIND_SEND, 0, 0)
        area[slot + lay.SLOT_HEADER.size : slot + lay.SLOT_HEADER.size + 2] = b"T%d" % i
    lay.U64.pack_into(area, lay.OFF_PRODUCED, produced + 4)
    wcs = b.cq.poll(16)
    assert wcs[0] is TAKEN_IN_PLACE
    assert [d for _, d, _ in taker.seen] == [b"T0", b"T1"]
    assert [(w.wr_id, bytes(b.buf.buf[64 * w.wr_id : 64 * w.wr_id + 2])) for w in wcs[1:]] == [
        (0, b"T2"), (1, b"T3")]  # fmt: skip
    assert not qp._rq and qp._posted == qp._consumed == produced + 4
    assert lay.U64.unpack_from(area, lay.OFF_POSTED)[0] == qp._posted


def test_a_receiver_that_fails_took_its_send(pair: tuple[Side, Side]) -> None:
    """A receiver that raises on a SEND: the poll raises, the SENDs taken before it stand in
    the CQ, and that SEND is not offered again (as a completion taken from the CQ is not
    given twice); the next poll goes on behind it, the ring's counts whole."""
    a, b = pair
    offered: list[bytes] = []

    def take(qpn: int, area: memoryview, off: int, n: int) -> bool:
        data = bytes(area[off : off + n])
        offered.append(data)
        if data == b"boom":
            raise RuntimeError("a bug in the receiver")
        return True

    b.qp.set_receiver(take)
    for i in range(4):
        post_recv(b, i)
    for data in (b"T1", b"boom", b"T2"):
        send(a, data)
    with pytest.raises(RuntimeError):
        b.cq.poll(16)
    assert offered == [b"T1", b"boom"]
    wcs = b.cq.poll(16)  # T1's stand-in; T2 behind it, delivered (the CQ was not empty)
    assert wcs[0] is TAKEN_IN_PLACE and len(wcs) == 2
    assert bytes(b.buf.buf[64 * wcs[1].wr_id : 64 * wcs[1].wr_id + 2]) == b"T2"
    assert offered == [b"T1", b"boom"]
    assert b.cq.poll(16) == []
    assert b.qp._posted - b.qp._consumed == len(b.qp._rq) == 3


def test_a_ring_taker_takes_a_run_first_and_the_receiver_the_rest(
        pair: tuple[Side, Side]) -> None:  # fmt: skip
    """``set_receiver(receiver, run)``: the poll hands ``run`` the ring (its geometry as
    :data:`~smcr.rdma.base.RingTaker` says) and the SENDs from the first unconsumed one;
    what it took (here the first two, their receives reposted by the run itself) is
    consumed, the receiver gets the rest one by one, one stand-in stands for all, and the
    ring's counts stay whole."""
    a, b = pair
    taker = Taker()
    calls: list[tuple[int, ...]] = []

    def run(qpn: int, area: memoryview, lens: int, base: int, stride: int, depth: int,
            slot_size: int, consumed: int, produced: int,
            posted: int) -> tuple[int, int]:  # fmt: skip
        calls.append((qpn, lens, base, stride, depth, slot_size, consumed, produced, posted))
        for i in (consumed, consumed + 1):  # the first two, as the lane would take them
            off = base + (i % depth) * stride
            n, kind = lay.U32.unpack_from(area, off)[0], lay.U32.unpack_from(area, off + 4)[0]
            taker.seen.append((qpn, bytes(area[off + 16 : off + 16 + n]), kind))
            lay.U32.pack_into(area, lens + 4 * (posted % depth),
                              lay.U32.unpack_from(area, lens + 4 * (i % depth))[0])  # fmt: skip
            posted += 1
        return consumed + 2, posted

    b.qp.set_receiver(taker, run)
    for i in range(4):
        post_recv(b, i)
    qp = b.qp
    posted = lay.U64.unpack_from(qp._area, lay.OFF_POSTED)[0]
    consumed = qp._consumed
    for i in range(4):
        send(a, b"T%d" % i)
    assert b.cq.poll(16) == [TAKEN_IN_PLACE]
    assert calls == [(qp.qp_num, lay.AREA_HEADER_SIZE, qp._slot_base, qp._slot_stride,
                      qp._depth, qp._slot_size, consumed, consumed + 4, posted)]  # fmt: skip
    assert [d for _, d, _ in taker.seen] == [b"T0", b"T1", b"T2", b"T3"]
    assert [k for _, _, k in taker.seen[:2]] == [lay.KIND_SEND] * 2
    assert qp._consumed == consumed + 4
    assert lay.U64.unpack_from(qp._area, lay.OFF_POSTED)[0] == posted + 4
    b.qp.set_receiver(None, run)  # (no receiver: no run either)
    assert b.qp.ring_taker is None


def test_a_produced_count_behind_ours_is_no_news(pair: tuple[Side, Side]) -> None:
    """A requester's count behind what we consumed (only a broken or hostile one writes
    it) is nothing to take: has_news says no, and so keeps a spinner from ending every
    spin at once for nothing."""
    _, b = pair
    b.qp.set_receiver(Taker())
    post_recv(b, 0)
    qp = b.qp
    qp._consumed = 5
    lay.U64.pack_into(qp._area, lay.OFF_PRODUCED, 3)
    assert not sends_waiting(qp)
    lay.U64.pack_into(qp._area, lay.OFF_PRODUCED, 6)
    assert sends_waiting(qp)
    assert b.cq.has_news()


def test_the_cq_looks_at_a_qp_in_c_as_the_python_would(pair: tuple[Side, Side]) -> None:
    """In the compiled build a shm CQ's polls and ``has_news`` reach a QP through
    ``_place.c`` (``drain_hook``, ``sends_waiting``) and not through the QP's bound
    ``_drain``: the C's look says what :func:`sends_waiting` says in each state (no
    receives posted, a count behind ours, SENDs there, a failed receive pending, the
    ring closed), and an object that is no ShmQp is refused."""
    a, b = pair
    looks = shm_qp.LOOKS_IN_C
    if looks is None:
        pytest.skip("the compiled build serves the C")
    drain_hook, c_sends_waiting = looks
    cq = b.cq
    assert isinstance(cq, ShmCompletionQueue)
    run = cq._runs[b.qp._drain]
    assert isinstance(run, functools.partial) and run.func is drain_hook
    peek = cq._peeks[run]
    assert isinstance(peek, functools.partial) and peek.func is c_sends_waiting
    assert run.args == peek.args == (b.qp,)
    qp = b.qp

    def agree() -> bool:
        said = sends_waiting(qp)
        assert c_sends_waiting(qp) is said
        return bool(said)

    assert not agree()  # no receives posted
    post_recv(b, 0)
    assert not agree()
    consumed = qp._consumed
    lay.U64.pack_into(qp._area, lay.OFF_PRODUCED, consumed + 1)
    assert agree()
    qp._fatal_recv = WorkCompletion(wr_id=0, status=WcStatus.WR_FLUSH_ERR, opcode=WcOpcode.RECV,
                                    qp_num=qp.qp_num)  # fmt: skip
    assert not agree()
    qp._fatal_recv = None
    lay.U64.pack_into(qp._area, lay.OFF_PRODUCED, consumed)
    assert not agree()
    with pytest.raises(TypeError):
        c_sends_waiting(a.dev)  # type: ignore[arg-type]
    taker = Taker()
    qp.set_receiver(taker)
    send(a, b"T0")
    assert b.cq.has_news()
    run()  # (a poll's look, outside a poll: the Python's _drain delivers it)
    assert [w.opcode for w in b.cq.poll(16)] == [WcOpcode.RECV] and taker.seen == []
    run()  # nothing there: answered in C
    assert b.cq.idle()
    qp.destroy()
    assert not c_sends_waiting(qp)  # (its ring closed)
    assert b.qp._drain not in cq._runs
