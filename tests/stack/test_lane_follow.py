"""The lane's readiness update (``_lane.c``'s ``follow``) against the Python it stands for,
:meth:`Readiness.follow <smcr.stack.readiness.Readiness.follow>`.

Two named descriptors with consumer bells on one CQ follow two connections whose fields go
through the same random changes, while a peer (a mapping of the CQ's notification segment,
as a peer process maps it) rings each alike; one is followed by the lane (the Python where
it declines), the other by the Python alone.  Their answers, their state, their bells'
and the datagrams waiting on them must be alike.  The compiled build serves the lane (CI
builds it: there a skip fails).
"""

from __future__ import annotations

import mmap
import os
import random
import select
import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from smcr.core.close import SmcState
from smcr.core.connection import Connection
from smcr.rdma import bells
from smcr.rdma.shm import layout as lay
from smcr.rdma.shm.cq import ShmCompletionQueue
from smcr.stack import reader
from smcr.stack.readiness import DeferredChecks, Readiness
from tests.core.pair import Pair

TOKENS = (7, 8)


def follow() -> Callable[[Any, Any], int]:
    if reader.FOLLOW is None:
        pytest.skip("the compiled build serves the lane")
    return reader.FOLLOW


class Twin:
    """A connection and the named descriptor with a bell that follows it."""

    def __init__(self, cq: ShmCompletionQueue, conn: Connection, token: int,
                 later: DeferredChecks | None) -> None:  # fmt: skip
        self.conn, self.token, self.later = conn, token, later
        self.r = Readiness(named=True)
        self.r.attach(cq, token, later)
        assert self.r.rid and self.r.bell is not None
        self.bell = self.r.bell

    def state(self) -> tuple[object, ...]:
        r, bell = self.r, self.bell
        word = lay.U32.unpack_from(bell.notify, bell.offset)[0]
        return (r.readable, r.writable, r.looks, r.unchecked, r.failed, r.check_pending,
                bell.armed, bell.rung, word == bell.rid, word == 0, _events(r),
                len(self.later.pending) if self.later is not None else None)  # fmt: skip

    def datagrams(self) -> int:
        """Datagrams waiting (read out: the caller's twin is read out alike)."""
        n = 0
        try:
            while True:
                self.r.a.recv(64, socket.MSG_DONTWAIT)
                n += 1
        except BlockingIOError:
            return n


def _armed(one: Twin) -> bool:
    """(A call: mypy would take an ``assert`` on the attribute for a narrowing.)"""
    return one.bell.armed


def _events(r: Readiness) -> int:
    p = select.poll()
    p.register(r.a.fileno(), select.POLLIN | select.POLLOUT)
    got = p.poll(0)
    return got[0][1] if got else 0


@pytest.fixture(params=["checked at once", "checked later"])
def twins(request: pytest.FixtureRequest) -> Iterator[tuple[Twin, Twin, mmap.mmap, bytes]]:
    """Two descriptors with bells, and the peer's mapping; a readable one on the peer's ring
    is checked at once, or later (:class:`DeferredChecks`, an event loop's runtime)."""
    cq = ShmCompletionQueue(64)
    pair = Pair()
    conns = []
    for _ in TOKENS:
        client, _server = pair.connect(rmb_size=16384)
        pair.pump()
        conns.append(pair.client.engine.conns[client])
    later = request.param == "checked later"
    ones = [Twin(cq, c, t, DeferredChecks() if later else None)
            for c, t in zip(conns, TOKENS, strict=True)]  # fmt: skip
    notify = lay.map_segment(os.dup(cq.notify_fd))
    prefix = bells.peer_prefix(notify)
    assert prefix
    yield ones[0], ones[1], notify, prefix
    for one in ones:
        one.r.close()
    notify.close()
    cq.close()


def _change(c: Connection, rng: random.Random) -> None:
    """One random change of what a descriptor follows."""
    what = rng.randrange(9)
    if what == 0:  # bytes came
        c.rx_prod += rng.choice((1, 100, 5000))
    elif what == 1:  # read: some or all
        c.rx_cons = rng.choice((c.rx_prod, c.rx_cons + (c.rx_prod - c.rx_cons) // 2))
    elif what == 2:  # the application sends (the send buffer fills, maybe to its limit)
        c.tx_app = c.tx_fin + rng.choice((0, 10, c.sndbuf_limit))
    elif what == 3:  # sent, confirmed
        c.tx_sent = c.tx_app if rng.random() < 0.7 else c.tx_sent
        c.tx_fin = c.tx_sent if rng.random() < 0.7 else c.tx_fin
    elif what == 4:
        c.tx_flags = rng.choice((0, 0, 0, 0x40))
    elif what == 5:
        c.rx_flags = rng.choice((0, 0, 0, 0, 0x40))
    elif what == 6:
        c.reset_reason = rng.choice(("", "", "", "", "peer aborted"))
    elif what == 7:  # (closed for a while, as a reset above: readable whatever the cursors)
        c.state = SmcState.CLOSED if rng.random() < 0.2 else SmcState.ACTIVE
    else:
        c.tx_app = c.tx_sent = c.tx_fin  # quiet again


def test_follow_in_c_and_python_alike(twins: tuple[Twin, Twin, mmap.mmap, bytes]) -> None:
    c_follow = follow()
    lane, python, notify, prefix = twins
    rng = random.Random(5)
    taken = declined = 0
    for step in range(3000):
        seed = rng.random()
        for one in (lane, python):
            _change(one.conn, random.Random(seed))
        if rng.random() < 0.3:  # the peer's message: it rings an armed bell (takes it)
            for one in (lane, python):
                bells.ring_consumer(notify, prefix, one.token)
        if rng.random() < 0.05:  # a requester that took the arm and died before its ring
            for one in (lane, python):
                lay.U32.pack_into(notify, one.bell.offset, 0)
        deferred = rng.random() < 0.2  # (a reader that took the news: DataPath.take_news)
        for one in (lane, python):
            one.r.defer_check = deferred
        before = lane.state()
        answer = c_follow(lane.r, lane.conn)
        if answer < 0:
            declined += 1
            assert lane.state() == before  # (declined: nothing changed)
            answer = int(lane.r.follow(lane.conn))
        else:
            taken += 1
        assert answer == int(python.r.follow(python.conn)), step
        for one in (lane, python):
            one.r.defer_check = False
        assert lane.state() == python.state(), step
        if rng.random() < 0.1:
            assert lane.datagrams() == python.datagrams(), step
    assert taken > 2000 and declined > 50
    assert lane.bell.rung > 30  # (the peer's rings taken back: trusted, checked, or own)


def test_a_read_that_empties_it_drains_and_arms_the_bell(
        twins: tuple[Twin, Twin, mmap.mmap, bytes]) -> None:  # fmt: skip
    c_follow = follow()
    one, _, notify, prefix = twins
    c, r = one.conn, one.r
    c.tx_app = c.tx_sent = c.tx_fin
    assert c_follow(r, c) == 1 and _armed(one)  # (quiet, writable, not readable: armed)
    c.rx_prod += 10
    assert bells.ring_consumer(notify, prefix, one.token)  # the peer's message rings it
    assert not r.follow(c)  # (turning readable is the Python's: the peer's ring came)
    assert _events(r) & select.POLLIN and not _armed(one)
    c.rx_cons = c.rx_prod  # read out
    assert c_follow(r, c) == 1  # drained, armed again: a look at the CQ asked for
    assert not _events(r) & select.POLLIN and _armed(one)
    assert lay.U32.unpack_from(notify, one.bell.offset)[0] == one.bell.rid
    c.tx_app += 5  # a send: the arm taken back, nobody rang
    assert c_follow(r, c) == 0 and not _armed(one)
    assert lay.U32.unpack_from(notify, one.bell.offset)[0] == 0


CASES = ["turns unwritable", "failed", "gone", "not a connection", "a pair", "long int",
         "closed segment"]


@pytest.mark.parametrize("case", CASES)
def test_what_follow_declines_it_leaves_as_it_was(
        twins: tuple[Twin, Twin, mmap.mmap, bytes], case: str) -> None:  # fmt: skip
    c_follow = follow()
    one = twins[0]
    c, r = one.conn, one.r
    c.tx_app = c.tx_sent = c.tx_fin
    assert c_follow(r, c) == 1 and _armed(one)
    c.tx_app += 1  # (the arm goes back: this call's case, but for what each case changes)
    target: Any = r
    arg: Any = c
    if case == "turns unwritable":
        c.tx_app = c.tx_fin + c.sndbuf_limit
    elif case == "failed":
        r.fail()
    elif case == "gone":
        arg = None
    elif case == "not a connection":
        arg = object()
    elif case == "a pair":
        target = Readiness(named=False)
    elif case == "long int":
        c.rx_prod = 2**70
    elif case == "closed segment":
        one.bell.notify.close()
    before = one.state() if case != "closed segment" else (r.readable, r.looks, _armed(one))
    assert c_follow(target, arg) == -1
    after = one.state() if case != "closed segment" else (r.readable, r.looks, _armed(one))
    assert after == before
    if case == "a pair":
        target.close()


def test_a_named_descriptor_without_a_bell_is_drained_alike(
        twins: tuple[Twin, Twin, mmap.mmap, bytes]) -> None:  # fmt: skip
    """A named descriptor with no bell (a peer that rings none): the C drains it as the
    Python does, and asks for no look."""
    c_follow = follow()
    conn = twins[0].conn
    ones = [Readiness(named=True) for _ in range(2)]
    try:
        for r in ones:
            assert r.rid and r.bell is None
        conn.rx_prod += 10
        for r in ones:
            r.follow(conn)  # readable (the Python: a datagram of its own)
            assert _events(r) & select.POLLIN
        conn.rx_cons = conn.rx_prod
        assert c_follow(ones[0], conn) == 0
        assert ones[1].follow(conn) is False
        for r in ones:
            assert not _events(r) & select.POLLIN and not r.readable
    finally:
        for r in ones:
            r.close()
