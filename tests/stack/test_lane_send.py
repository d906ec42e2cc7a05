"""The fast lane's send (``_lane.c``'s ``send_inline``, posting through the shm RNIC's C
post for C callers, ``_place.c``'s ``post_inline``) against the Python it stands for:
:meth:`Connection.write_inline` and :meth:`QueuePair.post_writes_send`, as
:meth:`Executor.send_inline <smcr.stack.executor.Executor.send_inline>` runs them.

The connection is an engine's (a sans-IO pair), its peer's RMBE a real shm MR behind a
real QP pair.  The compiled build serves the lane (CI builds it: there a skip fails).
"""

from __future__ import annotations

import random
import select
import shutil
import tempfile
import threading
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from smcr.core.connection import Connection
from smcr.rdma import (
    QpAttr,
    QpAttrMask,
    QpCap,
    QpState,
    RecvWr,
    Sge,
    WcStatus,
    WorkCompletion,
)
from smcr.rdma import bells as bl
from smcr.rdma.completion import ARM_SLEEPER, ARM_STANDBY
from smcr.rdma.shm import layout as lay
from smcr.rdma.shm.qp import POST_INLINE
from smcr.stack import inplace
from smcr.wire.cdc import CDC
from tests.core.pair import Pair
from tests.rdma.rdma_helpers import connect, make_side

RING = 4096  # the peer's RMBE: the first 4 KiB of its MR, so that the cursors wrap often
CAP = QpCap(max_inline_data=1 << 16)
FIELDS = ("tx_sent", "tx_app", "tx_fin", "peer_cons", "seq", "rx_cons_sent", "unanswered",
          "echo_pending", "peer_wants_update", "unsignaled", "stats_write_blocked",
          "peer_hold")  # fmt: skip


def lane() -> Any:
    if inplace.LANE is None or POST_INLINE is None:
        pytest.skip("the compiled build serves the lane")
    return inplace.LANE


class Setup:
    """An engine's connection whose peer RMBE is ``b``'s MR, sending over ``a``'s QP."""

    def __init__(self, directory: Path, name: str) -> None:
        self.pair = Pair()
        _, s = self.pair.connect()
        self.pair.pump()
        self.conn: Connection = self.pair.server.engine.conns[s]
        self.a = make_side(directory, f"a{name}", 0x10, cap=CAP)
        self.b = make_side(directory, f"b{name}", 0x20, cap=CAP)
        connect(self.a, self.b)
        c = self.conn
        c.peer_vaddr, c.peer_rkey, c.peer_rmb_size = self.b.rmb.addr, self.b.rmb.rkey, RING
        self.a.qp._retry_left, self.a.qp._rnr_left = 1, 2  # (a send sets both from the attr)
        self.received: list[bytes] = []

    def python_send(self, data: memoryview, request: bool) -> None:
        """What the executor does where the lane declines."""
        writes, cdc, wr_id, signaled = self.conn.write_inline(data, request)
        self.a.qp.post_writes_send(writes, cdc, wr_id, signaled, self.conn.peer_token)

    def take(self) -> None:
        """The CDC that arrived, kept (a receive posted again for the next)."""
        (wc,) = self.b.wait()
        assert wc.status is WcStatus.SUCCESS
        self.received.append(bytes(self.b.buf.buf[: wc.byte_len]))
        self.post_recv()

    def post_recv(self) -> None:
        self.b.qp.post_recv(RecvWr(wr_id=1, sg_list=(Sge(self.b.buf.addr, 64, self.b.buf.lkey),)))

    def snapshot(self) -> tuple[object, ...]:
        c = self.conn
        return (tuple(getattr(c, f) for f in FIELDS),
                [(conn.id, at) for _, conn, at in c.cdc_pending],
                self.a.qp._next_psn, self.a.qp._produced, self.a.qp._retry_left,
                self.a.qp._rnr_left, bytes(self.b.rmb.buf[:RING]))  # fmt: skip

    def close(self) -> None:
        self.a.dev.close()
        self.b.dev.close()


@pytest.fixture
def setups() -> Iterator[list[Setup]]:
    directory = Path(tempfile.mkdtemp(prefix="smcr-t"))
    made = [Setup(directory, str(i)) for i in range(2)]
    for s in made:
        s.post_recv()
    yield made
    for s in made:
        s.close()
    shutil.rmtree(directory, ignore_errors=True)


def test_c_and_python_send_alike(setups: list[Setup]) -> None:
    """The same sends (every size that fits, around the RMBE's end, up to filling it; some
    asking for an answer) and the same progress of the peer between them, through the lane
    (the Python where it declines) on one setup and through the Python alone on the other:
    after each, the connections, their pending CDCs, the QPs' PSNs and counts and the peer's
    RMBE are the same, and so are the CDCs that arrived, byte for byte."""
    c = lane()
    rng = random.Random(5)
    script = [(rng.random(), rng.random(), rng.randbytes(rng.randrange(1, 1500)))
              for _ in range(600)]  # fmt: skip
    runs = []
    for use_lane, s in zip((True, False), setups, strict=True):
        conn = s.conn
        steps = []
        taken = 0
        for what, how, data in script:
            if what < 0.03:  # a failover's switch: the byte held back may go, asking
                conn.peer_hold = 0
            elif what < 0.25:  # the peer read some (its consumer cursor came)
                moved = int((conn.tx_sent - conn.peer_cons) * how)
                conn.peer_cons += moved
                conn.peer_hold = 1 if moved else conn.peer_hold
            elif what < 0.35:  # CDCs completed
                conn.cdc_completed(conn.tx_sent)
            else:
                room = conn.direct_room()
                if not room:
                    conn.peer_cons = conn.tx_sent
                    conn.cdc_completed(conn.tx_sent)
                    room = conn.direct_room()
                view = memoryview(data)[: min(len(data), room)]
                request = how < 0.2
                if use_lane and c.send_inline(conn, s.a.qp, view, request) >= 0:
                    taken += 1
                else:
                    s.python_send(view, request)
                s.take()
            steps.append(s.snapshot())
        runs.append((steps, taken, s.received, len(s.a.cq.poll(1000))))
    (with_lane, taken, got, signaled), (python, _, expected, python_signaled) = runs
    for i, (x, y) in enumerate(zip(with_lane, python, strict=True)):
        assert x == y, f"after step {i}"
    assert got == expected
    assert signaled == python_signaled > len(got) // 16  # (every 16th, and more)
    fields = [CDC.unpack(m) for m in got]
    assert [f[2] for f in fields] == [(i + 1) & 0xFFFF for i in range(len(got))]
    assert 300 < taken < len(got)  # (the lane took the common ones; the Python the rest)


def test_a_declined_send_changes_nothing(setups: list[Setup]) -> None:
    """Each case the lane leaves to the Python (no receive posted at the peer, a send of
    more than the peer's RMBE has free, bytes waiting in the send buffer, urgent data,
    state flags, the QP's state lock held elsewhere, every WR signaled, an unknown peer
    MR, failures injected on the QP, the peer's QP in ERR, a QP of another kind, a QP not
    in RTS) is declined before anything changes: the connection, its pending CDCs, the QP,
    its CQ (the send would be signaled) and the peer's memory are as they were."""
    c = lane()
    s = setups[0]
    conn, qp = s.conn, s.a.qp
    s.python_send(memoryview(b"first"), False)  # (the peer MR is mapped by the Python)
    s.take()

    def declined(why: str) -> None:
        qp.send_cq.poll(100)
        unsignaled, conn.unsignaled = conn.unsignaled, 15  # (it would be signaled)
        before = s.snapshot()
        assert c.send_inline(conn, qp, memoryview(b"x" * 10), False) == -1, why
        assert s.snapshot() == before, why
        assert qp.send_cq.idle(), why  # (no completion pushed for it)
        conn.unsignaled = unsignaled

    assert c.send_inline(conn, qp, memoryview(b"second"), False) == 0
    declined("no receive posted at the peer (the last one is taken, not yet posted again)")
    s.take()

    conn.peer_cons = conn.tx_sent - (RING - 9)
    declined("more than the peer's RMBE has free")
    conn.peer_cons = conn.tx_sent
    conn.tx_app += 1
    declined("bytes wait in the send buffer")
    conn.tx_app -= 1
    conn.urg_tx_end = conn.tx_sent + 1
    declined("urgent data")
    conn.urg_tx_end = None
    conn.tx_flags = 0x40
    declined("state flags")
    conn.tx_flags = 0
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with qp._state_lock:  # (a re-entrant lock: held by another thread)
            held.set()
            done.wait(5)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(5)
    declined("another thread holds the QP's state lock")
    done.set()
    holder.join()
    qp.sq_sig_all = True
    declined("every WR signaled")
    qp.sq_sig_all = False
    rkey, conn.peer_rkey = conn.peer_rkey, conn.peer_rkey ^ 0x100
    declined("an unknown peer MR")
    conn.peer_rkey = rkey
    qp.fail_next("post_send", OSError(5, "injected"))
    declined("failures injected on the QP")
    qp.hooks = None
    assert c.send_inline(conn, qp, memoryview(b"third"), False) == 0
    s.take()
    s.b.qp.modify(QpAttr(qp_state=QpState.ERR), QpAttrMask.STATE)
    declined("the peer's QP in ERR")
    before = s.snapshot()
    assert c.send_inline(conn, s.b.cq, memoryview(b"x"), False) == -1
    assert s.snapshot() == before  # (another kind of QP: the lane's post serves the shm QP)
    qp.modify(QpAttr(qp_state=QpState.ERR), QpAttrMask.STATE)
    declined("a QP in ERR")
    assert len(s.received) == 3


def test_signaled_cdcs_complete(setups: list[Setup]) -> None:
    """Through the lane every 16th CDC is signaled, as is one that fills the peer's RMBE
    (it says write-blocked, and is counted): each one's completion comes on the sending
    QP's CQ with the WR id of its pending entry, the others none; and the connection takes
    it as a completed CDC."""
    c = lane()
    s = setups[0]
    conn, qp = s.conn, s.a.qp
    s.python_send(memoryview(b"first"), False)  # (the peer MR is mapped by the Python)
    s.take()
    qp.send_cq.poll(100)
    conn.unsignaled = 0
    ids = []
    for i in range(40):
        conn.peer_cons = conn.tx_sent
        conn.cdc_completed(conn.tx_sent)
        assert c.send_inline(conn, qp, memoryview(bytes([i]) * 7), False) == 0
        ids.append(conn.cdc_pending[-1][0])
        s.take()
    wcs = qp.send_cq.poll(100)
    assert [wc.wr_id for wc in wcs] == [ids[15], ids[31]]
    assert all(wc.status is WcStatus.SUCCESS and wc.byte_len == 44 for wc in wcs)
    assert conn.unsignaled == 40 - 32
    assert [CDC.unpack(m)[8] & 0x80 for m in s.received[1:]] == [0] * 40

    blocked = conn.stats_write_blocked
    free = RING - 1 - (conn.tx_sent - conn.peer_cons)  # (the byte held back: peer_hold)
    assert c.send_inline(conn, qp, memoryview(b"z" * free), False) == 0
    s.take()
    (wc,) = qp.send_cq.poll(100)
    assert wc.wr_id == conn.cdc_pending[-1][0]
    assert CDC.unpack(s.received[-1])[8] & 0x80  # (write-blocked)
    assert conn.stats_write_blocked == blocked + 1 and conn.unsignaled == 0
    assert conn.direct_room() == 0
    conn.peer_cons = conn.tx_sent
    conn.cdc_completed(conn.tx_sent)
    assert conn.direct_room() > 0


def test_the_lane_says_whom_to_ring(setups: list[Setup]) -> None:
    """A peer CQ armed for a sleeper: the send names its doorbell (the caller rings it,
    :meth:`QueuePair.ring_after`), and disarms it; unarmed, nobody."""
    c = lane()
    s = setups[0]
    s.python_send(memoryview(b"first"), False)
    s.take()
    bell = s.b.cq.fileno()
    s.b.cq.clear_signal()
    assert select.select([bell], [], [], 0)[0] == []
    s.b.cq.req_notify(ARM_SLEEPER)
    assert c.send_inline(s.conn, s.a.qp, memoryview(b"wake up"), False) == 1
    assert select.select([bell], [], [], 0)[0] == []  # (the C rings nobody itself)
    s.a.qp.ring_after(1)
    assert select.select([bell], [], [], 1)[0] == [bell]
    s.b.cq.clear_signal()
    s.take()
    assert c.send_inline(s.conn, s.a.qp, memoryview(b"quiet"), False) == 0
    s.take()


@pytest.mark.parametrize("rid", [9, 0x20000000, 0xFFFFFFFF])
def test_a_consumer_bell_of_any_name_is_named_whole(setups: list[Setup], rid: int) -> None:
    """A peer CQ armed for its standby thread, with the connection's consumer bell armed:
    the send names that bell (its 32-bit rid, shifted, with the door), and takes its watch
    word; the rid is never cut (a peer's rids go up to 2^32 - 1)."""
    c = lane()
    s = setups[0]
    s.python_send(memoryview(b"first"), False)
    s.take()
    peer = s.a.qp._peer
    assert peer is not None and peer.notify is not None
    peer.bells = peer.bells or b"bells"  # (rings by name: the C looks at the watch word)
    at = bl.WATCHES + 4 * (s.conn.peer_token & bl.WATCH_MASK)
    lay.U32.pack_into(peer.notify, 0, ARM_STANDBY)
    lay.U32.pack_into(peer.notify, at, rid)
    assert c.send_inline(s.conn, s.a.qp, memoryview(b"bell"), False) == rid << 2 | ARM_STANDBY
    assert lay.U32.unpack_from(peer.notify, at)[0] == 0
    assert lay.U32.unpack_from(peer.notify, 0)[0] == ARM_STANDBY  # (the arm word stays)
    lay.U32.pack_into(peer.notify, 0, 0)
    s.take()


class _PushFailsOnce(deque[WorkCompletion]):
    """A CQ's queue whose first push meets an error (memory, or a signal handler's)."""

    failed = False

    def extend(self, wcs: Iterable[WorkCompletion]) -> None:
        if not self.failed:
            self.failed = True
            raise MemoryError("the first push")
        super().extend(wcs)


def test_a_signaled_cdc_whose_completion_push_fails_is_sent_completed_and_raises(
        setups: list[Setup]) -> None:  # fmt: skip
    """The push of a placed CDC's completion meets an error: the CDC went, so the
    connection records it sent, the completion is pushed all the same (a write-blocked
    sender waits for it), and the sender meets the error."""
    c = lane()
    s = setups[0]
    conn, qp = s.conn, s.a.qp
    s.python_send(memoryview(b"first"), False)
    s.take()
    qp.send_cq.poll(100)
    conn.unsignaled = 15  # (the 16th: signaled)
    qp.send_cq._wcs = _PushFailsOnce()
    sent = conn.tx_sent
    with pytest.raises(MemoryError, match="the first push"):
        c.send_inline(conn, qp, memoryview(b"second"), False)
    s.take()
    assert s.received[-1] and conn.tx_sent == sent + 6 and conn.unsignaled == 0
    (wc,) = qp.send_cq.poll(100)
    assert wc.wr_id == conn.cdc_pending[-1][0] and wc.status is WcStatus.SUCCESS
    assert bytes(s.b.rmb.buf[sent % RING : sent % RING + 6]) == b"second"
