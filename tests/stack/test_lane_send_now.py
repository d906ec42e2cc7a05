"""The lane's whole send (``_lane.c``'s ``send_now``) against the Python it stands for:
:meth:`DataPath.try_send <smcr.stack.conn.DataPath.try_send>` and what it calls.

Two connections, each between two runtimes of this process (hosts: to each other, other
machines), take the same sends, one by ``send_now``, the other by ``try_send``; their
connections' fields, the bytes their peers read and the calls' answers must be alike.
The compiled build serves the lane (CI builds it: there a skip fails).
"""

from __future__ import annotations

import random
import select
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from smcr.core.connection import Connection
from smcr.rdma import bells, doorbell
from smcr.rdma.shm.cq import ShmCompletionQueue
from smcr.rdma.shm.peer import PeerLink
from smcr.rdma.shm.qp import ShmQp
from smcr.stack import inplace, sender
from smcr.stack.conn import SENDS_NOW, DataPath, byte_view
from smcr.stack.counters import COUNTERS
from smcr.stack.executor import Executor, post_inline
from smcr.stack.hostconn import HostConn
from smcr.stack.runtime import Stack
from smcr.stack.wakeup import Wakeups
from tests.stack.hosts import conn, connect, hosts, read, wait

NOT_NOW = -2
FIELDS = ("tx_sent", "tx_app", "tx_fin", "peer_cons", "seq", "rx_cons_sent", "unanswered",
          "echo_pending", "peer_wants_update", "unsignaled", "stats_write_blocked",
          "ask_skip", "tx_flags", "peer_hold")  # fmt: skip


def lane() -> Any:
    if inplace.LANE is None or not SENDS_NOW:
        pytest.skip("the compiled build serves the lane")
    return inplace.LANE


class Link:
    """A connection from a sending runtime to a reading one, and the sender's data path."""

    def __init__(self, sender: Stack, reader: Stack) -> None:
        self.reader_hc, self.hc = connect(reader, sender)
        self.sender, self.reader = sender, reader
        self.path = DataPath(sender, self.hc)
        self.hc.local_peer = False  # (as the first send finds it: another runtime's)

    def conn(self) -> Connection:
        return conn(self.sender, self.hc)

    def fields(self) -> dict[str, object]:
        c = self.conn()
        return {name: getattr(c, name) for name in FIELDS}

    def take(self, n: int) -> bytes:
        return read(self.reader, self.reader_hc, n) if n else b""


@pytest.fixture
def links() -> Iterator[tuple[Link, Link]]:
    with hosts(4) as (a, b, c, d):
        yield Link(a, b), Link(c, d)


def rebind(ring: Any = None, post: Any = None, ring_rid: Any = None) -> None:
    """The lane's sender bound with these stand-ins for its rings and its Python post."""
    calls = doorbell.C_CALLS
    assert calls is not None
    lane().bind_sender(DataPath, Executor, HostConn, Wakeups, ShmCompletionQueue, PeerLink,
                       post or post_inline, byte_view, ring or calls.ring,
                       ring_rid or calls.ring_rid, bells.RINGERS)  # fmt: skip


@pytest.fixture
def bound() -> Iterator[None]:
    """Whatever a test binds, the lane's own binding again after it."""
    yield
    assert sender.bind(DataPath, byte_view)


def settle(link: Link) -> None:
    """Until the sender has heard every cursor update its reader sent."""
    peer = conn(link.reader, link.reader_hc)
    wait(link.sender, link.hc, lambda: link.conn().peer_cons == peer.rx_cons_sent)


def test_send_now_and_try_send_alike(links: tuple[Link, Link], bound: None) -> None:
    now, python = links
    lane_ = lane()
    handed: list[int] = []  # posts the lane declined (handed to the Python's post)

    def counting_post(*args: Any) -> None:
        handed.append(len(args[2]))
        post_inline(*args)

    rebind(post=counting_post)
    for link in links:  # no answers asked for (autocork off): nothing comes back unbidden
        link.conn().autocork = 0
    rng = random.Random(7)
    counted = sum(COUNTERS.tx_pd)
    taken = sent = 0
    for _ in range(80):
        unread = 0
        for _ in range(rng.randint(1, 8)):
            data = rng.randbytes(rng.choice([1, 7, 100, 1000, 4096, 20000]))
            got = lane_.send_now(now.path, data)
            if got == NOT_NOW:
                got = now.path.try_send(memoryview(data))
            else:
                taken += 1
            assert got == python.path.try_send(memoryview(data)), len(data)
            assert now.fields() == python.fields()
            if got > 0:
                sent += 1
                unread += got
        assert now.take(unread) == python.take(unread)
        settle(now)
        settle(python)
        assert now.fields() == python.fields()
    assert taken > 200  # (the lane's case is the common one here)
    assert len(handed) <= 1  # the first WRITE only (the peer's MR looked up then)
    assert sum(COUNTERS.tx_pd) - counted == 2 * sent  # each send counted once (smcr stats)


def test_send_now_asks_for_an_answer_as_echo_wanted_does(links: tuple[Link, Link]) -> None:
    link, _ = links
    lane_ = lane()
    c = link.conn()
    with link.sender.lock:
        c.unanswered, c.autocork, c.ask_skip = True, 1 << 16, 2
        assert c.echo_wanted(10) is False and c.ask_skip == 1  # (the Python's, for the record)
    assert lane_.send_now(link.path, b"a" * 10) == 10  # skips one more ask
    assert (c.ask_skip, c.echo_pending) == (0, False)
    with link.reader.lock:  # (the peer's answer waits: its runtime's lock is held)
        assert lane_.send_now(link.path, b"b" * 10) == 10  # asks for an answer
        assert c.echo_pending is True
        sent, app = c.tx_sent, c.tx_app
        for part in (b"c", b"dd", b"eee"):  # corked behind the ask (Connection.cork)
            assert lane_.send_now(link.path, part) == len(part)
        assert (c.tx_sent, c.tx_app) == (sent, app + 6)
        assert link.sender.ex.corked_any
    assert link.take(26) == b"a" * 10 + b"b" * 10 + b"cddeee"  # the answer flushed them


def test_a_send_not_its_case_changes_nothing(links: tuple[Link, Link]) -> None:
    link, _ = links
    lane_ = lane()
    before = link.fields()
    c = link.conn()
    full = c.direct_room() + 1  # more than the peer's RMBE takes now
    assert lane_.send_now(link.path, bytes(full)) == NOT_NOW
    assert lane_.send_now(link.path, b"") == NOT_NOW
    assert lane_.send_now(link.path, memoryview(bytes(8)).cast("d")) == NOT_NOW  # 8-byte items
    link.path.wr_shut = True
    assert lane_.send_now(link.path, b"x") == NOT_NOW
    link.path.wr_shut = False
    c.echo_pending = True  # corking is the Python's
    assert lane_.send_now(link.path, b"x") == NOT_NOW
    c.echo_pending = False
    link.hc.local_peer = None  # not known yet: the Python finds out
    assert lane_.send_now(link.path, b"x") == NOT_NOW
    link.hc.local_peer = False
    with link.path.wlock:  # another thread sends (and may wait)
        assert lane_.send_now(link.path, b"x") == NOT_NOW
    assert link.fields() == before
    assert lane_.send_now(link.path, b"x") == 1
    assert link.take(1) == b"x"


def test_a_sender_waits_for_the_runtimes_lock(links: tuple[Link, Link]) -> None:
    link, _ = links
    lane_ = lane()
    sent: list[int] = []
    with link.sender.lock:
        t = threading.Thread(target=lambda: sent.append(lane_.send_now(link.path, b"abc")))
        t.start()
        t.join(0.2)
        assert t.is_alive() and not sent  # held: the send waits, as try_send's would
    t.join(10)
    assert sent == [3]
    assert link.take(3) == b"abc"


def test_the_peer_that_sleeps_is_rung(links: tuple[Link, Link], bound: None) -> None:
    link, _ = links
    lane_ = lane()
    assert lane_.send_now(link.path, b"w") == 1  # (the first WRITE: the peer's MR looked up)
    assert link.take(1) == b"w"
    rung: list[object] = []
    calls = doorbell.C_CALLS
    assert calls is not None

    def counting_ring(bell: object) -> bool:
        rung.append(bell)
        return bool(calls.ring(bell))

    rebind(ring=counting_ring)
    link.reader.progress.spin.most = 0.0  # (the reader arms the CQ and sleeps at once)
    got: list[bytes] = []
    t = threading.Thread(target=lambda: got.append(link.take(5)))
    t.start()
    t.join(0.2)
    assert t.is_alive()  # asleep on its CQ, armed
    assert lane_.send_now(link.path, b"hello") == 5
    t.join(10)
    assert got == [b"hello"]
    qp = link.sender.ex.qps[link.conn().qpn]
    assert isinstance(qp, ShmQp) and qp._peer is not None
    assert rung == [qp._peer.bell]  # the peer's CQ doorbell, by the C, once


def test_a_watched_peer_is_rung_by_name(links: tuple[Link, Link], bound: None) -> None:
    """A peer that waits in an event loop (its readiness descriptor's consumer bell armed) is
    rung by name by the C, once, through the process's ringing socket; its descriptor
    turns readable, and the bytes are there."""
    link, _ = links
    lane_ = lane()
    assert lane_.send_now(link.path, b"w") == 1  # (the first WRITE: the peer's MR looked up)
    assert link.take(1) == b"w"
    settle(link)  # (no answer awaited: the next send is posted, not corked)
    reader = link.reader
    with reader.ex.lock:
        r = reader.ex.adopt_readiness(link.reader_hc)
        reader.readiness_watched()  # (the CQ armed for the standby: a peer looks at watches)
    assert r.bell is not None and r.bell.armed  # (quiet, writable, nothing to read)
    bells.ring_name(b"\0smcr-test-nobody", 1)  # (the ringing socket made)
    rung: list[tuple[object, ...]] = []
    calls = doorbell.C_CALLS
    assert calls is not None

    def counting_ring_rid(sock: object, prefix: bytes, rid: int) -> int:
        rung.append((sock, prefix, rid))
        return int(calls.ring_rid(sock, prefix, rid))

    def no_ring(bell: object) -> bool:
        raise AssertionError("a CQ doorbell was rung")

    rebind(ring=no_ring, ring_rid=counting_ring_rid)
    assert not select.select([r.fileno()], [], [], 0)[0]
    assert lane_.send_now(link.path, b"hello") == 5
    qp = link.sender.ex.qps[link.conn().qpn]
    assert isinstance(qp, ShmQp) and qp._peer is not None
    assert rung == [(bells.RINGERS[0], qp._peer.bells, r.rid)]
    assert select.select([r.fileno()], [], [], 5)[0]  # the datagram came
    assert link.take(5) == b"hello"
