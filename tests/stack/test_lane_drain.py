"""CDCs taken where the peer placed them by the shm RNIC's poll in C (``_place.c``'s
``drain_in_place``, calling ``_lane.c``'s ``ring_take`` through the RNIC layer's ring-taker
ABI) against the Python it stands for (:func:`smcr.rdma.shm.qp._take_in_place` calling
:meth:`InPlace.take_run <smcr.stack.inplace.InPlace.take_run>`).

The connection is an engine's (a sans-IO pair) whose CDCs arrive as SENDs over a real shm
QP pair.  The compiled build serves the C (CI builds it: there a skip fails).
"""

from __future__ import annotations

import ctypes
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from smcr.rdma import WcOpcode, WcStatus, WorkCompletion
from smcr.rdma.completion import TAKEN_IN_PLACE
from smcr.rdma.shm import layout as lay
from smcr.rdma.shm import qp as shm_qp
from smcr.rdma.shm.qp import DRAINED, NOT_IN_C, OFFERED
from smcr.stack import inplace
from smcr.stack.counters import COUNTERS
from smcr.stack.hostconn import StackTap, Taps
from smcr.stack.inplace import InPlace
from smcr.wire.cdc import CDC, CDC_MSG_LENGTH, CDC_MSG_TYPE
from tests.rdma.rdma_helpers import connect, make_side
from tests.rdma.test_shm_in_place import post_recv, send
from tests.stack.test_lane import FIELDS, cdcs, connected, unnamed

RECEIVES = 8


class Offered:
    """The runtime's receiver, every SEND offered to it recorded (its bytes, and whether
    it took it)."""

    def __init__(self, receive: Callable[[int, memoryview, int, int], bool]) -> None:
        self.receive = receive
        self.seen: list[tuple[bytes, bool]] = []
        self.fail = False

    def __call__(self, qpn: int, area: memoryview, off: int, n: int) -> bool:
        if self.fail:
            raise MemoryError("a receiver that fails")
        took = self.receive(qpn, area, off, n)
        self.seen.append((bytes(area[off : off + n]), took))
        return took


def drainer() -> Any:
    if shm_qp.DRAIN_IN_PLACE is None or inplace.RING_TAKER is None:
        pytest.skip("the compiled build serves the C")
    return shm_qp.DRAIN_IN_PLACE


class Setup:
    """A server connection of an engine pair whose CDCs come over ``b``'s QP from ``a``,
    taken in place by an :class:`InPlace` of the server's engine (its C run or not)."""

    def __init__(self, directory: Path, name: str, c_run: bool,
                 receives: int = RECEIVES) -> None:  # fmt: skip
        self.pair, self.conn, qpn, state = connected()
        self.a = make_side(directory, f"a{name}", 0x10)
        self.b = make_side(directory, f"b{name}", 0x20)
        connect(self.a, self.b)
        self.qpn = self.b.qp.qp_num
        link = state.links.pop(qpn)  # (the engine finds the link by the QP the CDC came on)
        link.qpn = self.qpn
        state.links[self.qpn] = link
        self.taps = Taps()
        self.in_place = InPlace(self.pair.server.engine, self.taps)
        self.offered = Offered(self.in_place.receive)
        self.b.qp.set_receiver(self.offered, self.in_place.take_run,
                               self.in_place.c_run() if c_run else None)  # fmt: skip
        for i in range(receives):
            post_recv(self.b, i)

    def poll(self) -> list[object]:
        """What a poll returned, the delivered receives given to the engine (as the
        executor does) and posted again."""
        out: list[object] = []
        for wc in self.b.cq.poll(64):
            if wc is TAKEN_IN_PLACE:
                out.append("taken")
                continue
            out.append((wc.opcode, wc.status, wc.byte_len))
            data = memoryview(bytes(self.b.buf.buf[64 * wc.wr_id : 64 * wc.wr_id + wc.byte_len]))
            actions = self.pair.server.engine.receive_wrs(self.qpn, [data], time.monotonic())
            out.append([unnamed(a) for a in actions])
            post_recv(self.b, wc.wr_id)
        return out

    def state(self) -> tuple[object, ...]:
        """The connection and the QP's receive side (the link's last receive time aside:
        each run reads the clock)."""
        qp = self.b.qp
        return (tuple(getattr(self.conn, f) for f in FIELDS), qp._consumed, qp._posted,
                lay.U64.unpack_from(qp._area, lay.OFF_POSTED)[0], len(qp._rq),
                self.in_place.taken, sorted(self.pair.server.engine.state.touched))  # fmt: skip

    def close(self) -> None:
        self.a.dev.close()
        self.b.dev.close()


@pytest.fixture
def directory() -> Iterator[Path]:
    made = Path(tempfile.mkdtemp(prefix="smcr-t"))
    yield made
    shutil.rmtree(made, ignore_errors=True)


@pytest.mark.parametrize("seed", range(3))
def test_c_and_python_drain_alike(directory: Path, seed: int) -> None:
    """The same CDCs (the common ones among repeats, old sequence numbers, flags of every
    kind, faults), one to three per poll, and the same reads between the polls, through the
    poll in C on one setup and through the Python on the other: after each poll the
    connection, the QP's counts and posted word, the receives, what the poll returned and
    the engine's actions are the same; the C path took most of them, counted them where
    the Python does, and noted the link's last receive by time.monotonic's clock."""
    drainer()
    script = cdcs(random.Random(seed), 0)
    runs = []
    for c_run in (True, False):
        s = Setup(directory, f"{seed}{int(c_run)}", c_run)
        for i, (data, _) in enumerate(script):
            fields = list(CDC.unpack(data))
            fields[3] = s.conn.token
            script[i] = (CDC.pack(*fields), script[i][1])
        steps: list[object] = []
        counted = COUNTERS.inplace_cnt
        i = 0
        while i < len(script):
            batch = script[i : i + 1 + (i % 3)]
            for j, (data, _) in enumerate(batch):
                send(s.a, data, at=0x8000 + 64 * j)
            began = time.monotonic()
            got = s.poll()
            link: Any = s.conn.link
            if "taken" in got and c_run:
                assert began <= link.last_rx <= time.monotonic()
            steps.append((got, [unnamed(a) for a in s.in_place.take_actions()], s.state(),
                          [unnamed(e) for e in s.pair.server.pull_events()]))  # fmt: skip
            s.pair.server.engine.state.touched.clear()
            read = batch[-1][1]
            conn = s.conn
            if conn.rx_available() and not conn.reset_reason:
                s.pair.server.engine.data_consumed(conn.id, min(read, conn.rx_available()),
                                                   time.monotonic())  # fmt: skip
            i += len(batch)
        runs.append((steps, s.in_place.taken, COUNTERS.inplace_cnt - counted, s.offered.seen))
        s.close()
    (with_c, taken, counted_c, offered), (python, python_taken, counted_py, py_offered) = runs
    for k, (x, y) in enumerate(zip(with_c, python, strict=True)):
        assert x == y, f"after poll {k}"
    assert taken == python_taken == counted_c == counted_py > len(script) // 3
    # the runs took most: the receiver was offered only what they left, the same SENDs
    assert offered == py_offered and len(offered) < len(script) // 2
    assert taken - sum(took for _, took in offered) > len(script) // 3


def cdc(s: Setup, seq: int, prod: int, pflags: int = 0) -> bytes:
    return CDC.pack(CDC_MSG_TYPE, CDC_MSG_LENGTH, seq, s.conn.token, 0, prod, 0, 0, pflags, 0)


def test_the_receiver_gets_what_the_run_leaves_and_the_python_what_it_refuses(
        directory: Path) -> None:  # fmt: skip
    """A CDC the C run leaves (a flag it does not take) goes to the receiver, as the
    Python's poll offers it; the first SEND the receiver refuses (an LLC message) and every
    one behind it are delivered into receives by the Python, after the one stand-in for
    those taken."""
    drain = drainer()
    s = Setup(directory, "r", True)
    qp = s.b.qp
    llc = b"\x01" + cdc(s, 3, 30)[1:]
    for j, data in enumerate((cdc(s, 1, 10), cdc(s, 2, 20, 0x40), llc, cdc(s, 3, 30))):
        send(s.a, data, at=0x8000 + 64 * j)
    consumed = qp._consumed
    qp.recv_cq.polling = threading.get_ident()  # (as within the CQ's poll)
    try:
        assert drain(qp) == OFFERED  # the LLC message refused: the delivery's turn
    finally:
        qp.recv_cq.polling = 0
    assert qp._consumed == consumed + 2 and s.conn.rx_seq == 2 and s.conn.rx_prod == 20
    assert s.in_place.taken == 2
    wcs = s.b.cq.poll(16)
    assert wcs[0] is TAKEN_IN_PLACE
    assert [(w.opcode, w.byte_len) for w in wcs[1:]] == [(WcOpcode.RECV, 44)] * 2
    assert [bytes(s.b.buf.buf[64 * w.wr_id : 64 * w.wr_id + 44]) for w in wcs[1:]] == [
        llc, cdc(s, 3, 30)]
    assert qp._consumed == consumed + 4 and len(qp._rq) == RECEIVES - 2
    s.close()


def test_the_c_takes_no_more_than_the_receives_posted(directory: Path) -> None:
    """Two receives posted, four CDCs sent: the requester places two (the others wait,
    RNR), the C takes those, their receives posted again; the requester's retry places
    the rest, and a later poll takes them."""
    drainer()
    s = Setup(directory, "n", True, receives=2)
    for j in range(4):
        send(s.a, cdc(s, j + 1, 10 * (j + 1)), at=0x8000 + 64 * j)
    assert s.b.cq.poll(16) == [TAKEN_IN_PLACE]
    assert s.conn.rx_seq == 2 and s.in_place.taken == 2 and len(s.b.qp._rq) == 2
    deadline = time.monotonic() + 5
    while s.conn.rx_seq != 4 and time.monotonic() < deadline:
        assert s.b.cq.poll(16) in ([], [TAKEN_IN_PLACE])
        time.sleep(0.01)
    assert s.conn.rx_seq == 4 and s.conn.rx_prod == 40 and s.in_place.taken == 4
    s.close()


def other_capsule() -> object:
    """A capsule of another ABI (its name is not the ring taker's)."""
    new = ctypes.pythonapi.PyCapsule_New
    new.restype = ctypes.py_object
    new.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
    capsule: object = new(1, OTHER_ABI, None)
    return capsule


OTHER_ABI = b"smcr.rdma.RING_TAKER.v0"  # (the capsule keeps a pointer to it: kept alive)


def completion(opcode: WcOpcode, status: WcStatus = WcStatus.SUCCESS,
               qpn: int = 1) -> WorkCompletion:  # fmt: skip
    return WorkCompletion(wr_id=99, status=status, opcode=opcode, qp_num=qpn)


def waiting_not_sends(qpn: int) -> dict[str, list[WorkCompletion]]:
    """Completions waiting in a CQ that a SEND taken in place must not overtake, by why."""
    send = completion(WcOpcode.SEND, qpn=qpn)
    return {
        "a receive's completion waiting": [send, completion(WcOpcode.RECV, qpn=qpn)],
        "a receive with immediate's": [completion(WcOpcode.RECV_RDMA_WITH_IMM, qpn=qpn)],
        "a stand-in waiting": [TAKEN_IN_PLACE],
        "a send that failed": [completion(WcOpcode.RDMA_WRITE, WcStatus.RETRY_EXC_ERR, qpn)],
        "a flush": [send, completion(WcOpcode.SEND, WcStatus.WR_FLUSH_ERR, qpn)],
        "more than 16 waiting": [send] * 17,
    }


def test_what_the_c_leaves_to_the_python(directory: Path) -> None:
    """Each case the C declines changes nothing: a call outside the CQ's poll (another
    thread's, or no poll), a completion waiting in the CQ that is not a successful send's
    (it comes first), a failed
    receive pending, a capsule that is none or of another ABI, an object that is no shm
    QP, a destroyed QP (its ring closed); with nothing new it answers at once; with a tap
    watching the run takes nothing and the receiver refuses (every CDC shown as a
    receive): the delivery's turn."""
    drain = drainer()
    s = Setup(directory, "d", True)
    qp = s.b.qp
    cq = qp.recv_cq
    cq.polling = threading.get_ident()
    assert drain(qp) == DRAINED  # nothing there
    cq.polling = 0
    send(s.a, cdc(s, 1, 10))
    before = s.state()

    def declined(why: str, polling: int = threading.get_ident(), answer: int = NOT_IN_C) -> None:
        cq.polling = polling  # (as within the CQ's poll, by this thread)
        try:
            assert drain(qp) == answer, why
        finally:
            cq.polling = 0
        assert s.state() == before, why

    declined("not within the CQ's poll", 0)
    declined("another thread's poll", threading.get_ident() + 1)
    for why, waiting_wcs in waiting_not_sends(qp.qp_num).items():
        cq.push_many(waiting_wcs, False)
        declined(why)
        cq._wcs.clear()  # (taken without a poll: a poll would deliver the SEND behind it)
    waiting = completion(WcOpcode.SEND)
    qp._fatal_recv = waiting
    declined("a failed receive pending")
    qp._fatal_recv = None
    qp.c_taker, taker = object(), qp.c_taker
    declined("not a capsule")
    qp.c_taker = other_capsule()
    declined("a capsule of another ABI")
    qp.c_taker = taker
    assert drain(object()) == NOT_IN_C
    s.taps.tap = StackTap()
    declined("a tap watching", answer=OFFERED)
    assert s.offered.seen == [(cdc(s, 1, 10), False)]
    s.taps.tap = None
    assert s.state() == before
    assert cq.poll(16) == [TAKEN_IN_PLACE]  # (the C's, within the poll)
    assert s.conn.rx_prod == 10
    send(s.a, cdc(s, 2, 20))
    qp.destroy()
    assert drain(qp) == NOT_IN_C  # (its ring closed: the Python sees it)
    s.a.dev.close()
    s.b.dev.close()


@pytest.mark.parametrize("c_run", [True, False])
def test_a_receiver_that_fails_took_its_send(directory: Path, c_run: bool) -> None:
    """A receiver that raises on a SEND the run left took it (it is not offered again),
    its stand-in is pushed and the receive lock let go; the poll raises, and the next one
    goes on behind it (the stand-in still waiting: the rest delivered into receives): the
    same through the C and the Python."""
    drainer()
    s = Setup(directory, f"f{int(c_run)}", c_run)
    qp = s.b.qp
    for j, data in enumerate((cdc(s, 1, 10), cdc(s, 2, 20, 0x40), cdc(s, 3, 30))):
        send(s.a, data, at=0x8000 + 64 * j)
    consumed = qp._consumed
    s.offered.fail = True
    with pytest.raises(MemoryError):
        s.b.cq.poll(16)
    assert not qp._rq_lock.locked()
    assert qp._consumed == consumed + 2 and s.conn.rx_seq == 1  # (the flagged one: gone)
    s.offered.fail = False
    wcs = s.b.cq.poll(16)  # the first poll's stand-in, then the third (the CQ was not idle)
    assert wcs[0] is TAKEN_IN_PLACE and [(w.opcode, w.byte_len) for w in wcs[1:]] == [
        (WcOpcode.RECV, 44)]
    assert qp._consumed == consumed + 3
    s.close()


def test_a_destroy_meanwhile_waits_for_the_drain(directory: Path) -> None:
    """Another thread destroys the QP while the poll's receiver runs: the destroy waits for
    the receive lock, then closes the ring (no export of it is left behind)."""
    drainer()
    s = Setup(directory, "x", True)
    qp = s.b.qp
    errors: list[BaseException] = []

    def destroy() -> None:
        try:
            qp.destroy()
        except BaseException as exc:
            errors.append(exc)

    inner = s.offered.receive
    thread = threading.Thread(target=destroy)

    def slow(qpn: int, area: memoryview, off: int, n: int) -> bool:
        if not thread.is_alive():
            thread.start()
            time.sleep(0.2)  # (the destroy is waiting for the receive lock now)
        return inner(qpn, area, off, n)

    s.offered.receive = slow
    send(s.a, cdc(s, 1, 10, 0x40))  # (a flag: the receiver's)
    assert s.b.cq.poll(16) == [TAKEN_IN_PLACE]
    thread.join(5)
    assert errors == [] and qp._area.closed
    s.a.dev.close()
    s.b.dev.close()


@pytest.mark.parametrize("hostile", ["produced far ahead", "produced past 2^63",
                                     "a slot longer than slots are"])
def test_a_hostile_ring_is_met_as_the_python_meets_it(directory: Path, hostile: str) -> None:
    """A requester's count far past what it placed, or a slot whose length is past the
    slot size: the C takes what is sound and leaves the rest to the delivery, with the
    same completions, counts and connection as the Python."""
    drainer()
    runs = []
    for c_run in (True, False):
        s = Setup(directory, f"h{hostile[-2:]}{int(c_run)}", c_run)
        qp = s.b.qp
        for j in range(2):
            send(s.a, cdc(s, j + 1, 10 * (j + 1)), at=0x8000 + 64 * j)
        at = qp._consumed
        if hostile == "produced far ahead":
            lay.U64.pack_into(qp._area, lay.OFF_PRODUCED, at + 1000)
        elif hostile == "produced past 2^63":
            lay.U64.pack_into(qp._area, lay.OFF_PRODUCED, (1 << 63) + at)
        else:
            send(s.a, cdc(s, 3, 30), at=0x8000 + 128)
            off = qp._slot_base + (at % qp._depth) * qp._slot_stride
            lay.U32.pack_into(qp._area, off, qp._slot_size + 1)  # (the first one's length)
        got = [(w.opcode, w.status, w.byte_len) if w is not TAKEN_IN_PLACE else "taken"
               for w in s.b.cq.poll(64)]  # fmt: skip
        runs.append((got, s.state(), qp._fatal_recv is not None))
        s.close()
    assert runs[0] == runs[1]




@pytest.mark.parametrize("c_run", [True, False])
def test_cdc_taken_in_place_behind_a_send_completion(directory: Path,
                                                      c_run: bool) -> None:  # fmt: skip
    """A successful send's completion waiting in the CQ (a signaled CDC's, pushed as the
    SEND was placed) does not keep the peer's CDC behind it from being taken in place: the
    poll returns the send's completion, then the stand-in, the C and the Python alike.
    Anything else waiting (a receive's, a stand-in, a failure, more than 16) sends the CDC
    the delivery's way, into a receive behind them."""
    drainer()
    s = Setup(directory, f"s{int(c_run)}", c_run, receives=RECEIVES + 20)
    cq = s.b.qp.recv_cq
    sent = [completion(WcOpcode.SEND, qpn=s.qpn), completion(WcOpcode.RDMA_WRITE, qpn=s.qpn)]
    cq.push_many(sent, False)
    assert cq.only_sends_wait()
    send(s.a, cdc(s, 1, 10))
    assert cq.poll(16) == [*sent, TAKEN_IN_PLACE]
    assert s.conn.rx_prod == 10 and s.in_place.taken == 1
    for seq, (why, waiting) in enumerate(waiting_not_sends(s.qpn).items(), start=2):
        cq.push_many(waiting, False)
        assert not cq.only_sends_wait(), why
        send(s.a, cdc(s, seq, 10 * seq), at=0x8000 + 64 * seq)
        wcs = cq.poll(64)
        assert wcs[: len(waiting)] == waiting, why
        assert [(w.opcode, w.byte_len) for w in wcs[len(waiting) :]] == [
            (WcOpcode.RECV, CDC_MSG_LENGTH)], why
        assert s.in_place.taken == 1, why
        post_recv(s.b, wcs[-1].wr_id)
    s.close()


def test_a_poll_offers_a_refused_send_once(directory: Path) -> None:
    """Through a poll (the CQ's run, ``_place.c``'s drain_hook): the run takes the CDCs it
    can, the receiver is offered the rest one by one, and what it refused (an LLC message)
    goes into a receive with everything behind it, offered to the receiver once, not
    again by the Python's delivery."""
    drainer()
    s = Setup(directory, "o", True)
    llc = b"\x01" + cdc(s, 3, 30)[1:]
    for j, data in enumerate((cdc(s, 1, 10), cdc(s, 2, 20, 0x40), llc, cdc(s, 3, 30))):
        send(s.a, data, at=0x8000 + 64 * j)
    wcs = s.b.cq.poll(16)
    assert wcs[0] is TAKEN_IN_PLACE
    assert [(w.opcode, w.byte_len) for w in wcs[1:]] == [(WcOpcode.RECV, 44)] * 2
    assert s.offered.seen == [(cdc(s, 2, 20, 0x40), True), (llc, False)]
    assert s.conn.rx_seq == 2 and s.conn.rx_prod == 20
    s.close()
