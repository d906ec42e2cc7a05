"""The lane's whole read (``_lane.c``'s ``read_now``) against the Python it stands for:
:meth:`DataPath.try_read <smcr.stack.conn.DataPath.try_read>`, ``take_news`` and
``news_taken`` as a non-blocking ``recv_into`` calls them, and the readiness update.

Two connections, each between two runtimes of this process (hosts: to each other, other
machines), carry the same bytes; their readers watch readiness descriptors (an event
loop's), and read alike, one by ``read_now`` (the Python where it declines), the other by
the Python.  The bytes, the readers' cursors and their descriptors' readiness must be
alike.  The compiled build serves the lane (CI builds it: there a skip fails).
"""

from __future__ import annotations

import random
import select
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from smcr.core.connection import Connection
from smcr.stack import inplace
from smcr.stack.conn import READS_NOW, DataPath
from smcr.stack.counters import COUNTERS
from smcr.stack.runtime import Stack
from tests.stack.hosts import conn, connect, hosts, wait

NOT_NOW, NOTHING_THERE = -2, -3


def lane() -> Any:
    if inplace.LANE is None or not READS_NOW:
        pytest.skip("the compiled build serves the lane")
    return inplace.LANE


class Link:
    """A connection from a writing runtime to a reading one that watches its descriptor."""

    def __init__(self, writer: Stack, reader: Stack) -> None:
        self.hc, self.writer_hc = connect(reader, writer)
        self.writer, self.reader = writer, reader
        self.path = DataPath(reader, self.hc)
        self.writer_path = DataPath(writer, self.writer_hc)
        self.hc.local_peer = self.writer_hc.local_peer = False  # (another runtime's)
        with reader.ex.lock:
            self.r = reader.ex.adopt_readiness(self.hc)  # (as fileno() makes it)
            reader.readiness_watched()

    def conn(self) -> Connection:
        return conn(self.reader, self.hc)

    def write(self, data: bytes) -> int:
        return self.writer_path.try_send(memoryview(data))

    def python_read(self, out: memoryview, want: int) -> int:
        """``SocketCalls._recv_into``'s Python for a non-blocking socket."""
        n = self.path.try_read(out, want)
        if n < 0:
            self.path.take_news()
            try:
                n = self.path.try_read(out, want)
            finally:
                self.path.news_taken()
        return n

    def readable(self) -> bool:
        return bool(select.select([self.r.a.fileno()], [], [], 0)[0])

    def settle(self) -> None:
        """Until the reader's runtime has taken what the writer sent (its news)."""
        c = conn(self.writer, self.writer_hc)
        wait(self.reader, self.hc, lambda: self.conn().rx_prod == c.tx_sent)

    def settle_writer(self) -> None:
        """Until the writer has heard every cursor update its reader sent (its room)."""
        c = conn(self.writer, self.writer_hc)
        wait(self.writer, self.writer_hc, lambda: c.peer_cons == self.conn().rx_cons_sent)


@pytest.fixture
def links() -> Iterator[tuple[Link, Link]]:
    with hosts(4) as (a, b, c, d):
        yield Link(a, b), Link(c, d)


def test_read_now_and_the_python_alike(links: tuple[Link, Link]) -> None:
    now, python = links
    lane_ = lane()
    rng = random.Random(3)
    counted = sum(COUNTERS.rx_pd)
    taken = reads = 0
    sent = {id(now): bytearray(), id(python): bytearray()}
    got = {id(now): bytearray(), id(python): bytearray()}
    for _ in range(300):
        for _ in range(rng.randint(0, 3)):
            data = rng.randbytes(rng.choice([1, 100, 1000, 9000]))
            for link in links:
                n = link.write(data)
                sent[id(link)] += data[: max(n, 0)]
            assert len(sent[id(now)]) == len(sent[id(python)])
        for link in links:
            link.settle()
        want = rng.choice([1, 32, 500, 4096, 70000])
        made = rng.random() < 0.5  # (recv: bytes made the size of what is there)
        outs = []
        for link in links:
            out = memoryview(bytearray(want))
            if link is now:
                answer = lane_.read_now(link.path, None if made else out, want, True)
                if isinstance(answer, bytes):
                    out[: len(answer)] = answer
                    answer = len(answer)
                n = int(answer)
                if n == NOT_NOW:
                    n = link.python_read(out, want)
                else:
                    taken += n > 0
            else:
                n = link.python_read(out, want)
            got[id(link)] += out[: max(n, 0)]
            outs.append((max(n, -1), link.conn().rx_cons, link.conn().rx_cons_sent,
                         link.readable(), link.r.readable, link.r.writable))  # fmt: skip
        assert outs[0] == outs[1]
        reads += outs[0][0] > 0
        for link in links:
            link.settle_writer()
    for link in links:
        assert got[id(link)] == sent[id(link)][: len(got[id(link)])]
    assert len(got[id(now)]) > 100_000 and taken > 50
    assert sum(COUNTERS.rx_pd) - counted == 2 * reads  # each read counted once (smcr stats)


def test_a_read_after_the_peers_ring_takes_its_news(links: tuple[Link, Link]) -> None:
    """An event loop's read: the peer's message rang the descriptor and waits in the CQ,
    taken by nobody yet; read_now takes it and reads, the descriptor read out, its bell
    armed again; with nothing more there it says so (-3), the news taken."""
    link, _ = links
    lane_ = lane()
    assert link.write(b"w") == 1
    link.settle()
    out = memoryview(bytearray(64))
    assert lane_.read_now(link.path, out, 64, True) == 1
    assert not link.readable() and link.r.bell is not None and link.r.bell.armed
    with link.reader.lock:  # (nobody else takes the news meanwhile)
        assert link.write(b"hello") == 5
        assert select.select([link.r.a.fileno()], [], [], 5)[0]  # rung by the peer
        assert link.conn().rx_available() == 0  # (its CDC not taken yet)
    assert lane_.read_now(link.path, out, 64, True) == 5
    assert bytes(out[:5]) == b"hello"
    assert not link.readable() and link.r.bell.armed
    assert lane_.read_now(link.path, out, 64, True) == NOTHING_THERE
    assert lane_.read_now(link.path, out, 64, False) == NOT_NOW  # (a timeout's: no news)
    with link.reader.lock:  # recv's: bytes made the size of what is there (up to want)
        assert link.write(b"0123456789") == 10
        assert select.select([link.r.a.fileno()], [], [], 5)[0]
    assert lane_.read_now(link.path, None, 4, True) == b"0123"
    assert lane_.read_now(link.path, None, 1 << 18, True) == b"456789"
    assert not link.readable()
    assert lane_.read_now(link.path, None, 64, True) == NOTHING_THERE
    assert lane_.read_now(link.path, None, 0, True) == NOT_NOW


def test_a_read_not_its_case_changes_nothing(links: tuple[Link, Link]) -> None:
    link, _ = links
    lane_ = lane()
    assert link.write(b"abcdef") == 6
    link.settle()
    c = link.conn()
    before = (c.rx_cons, c.rx_cons_sent, link.readable())
    out = memoryview(bytearray(16))
    link.hc.local_peer = None  # not known yet: the Python finds out
    assert lane_.read_now(link.path, out, 16, True) == NOT_NOW
    link.hc.local_peer = False
    with link.path.rlock:  # another thread reads (and may wait)
        assert lane_.read_now(link.path, out, 16, True) == NOT_NOW
    assert lane_.read_now(link.path, memoryview(bytes(16)), 16, True) == NOT_NOW  # read-only
    assert lane_.read_now(object(), out, 16, True) == NOT_NOW
    assert lane_.read_now(link.path, out, 2**64, True) == NOT_NOW  # (recv's bufsize: no C int)
    c.urg_rx_pos = c.rx_prod - 1  # an urgent byte among them: the general path's
    assert lane_.read_now(link.path, out, 16, True) == NOT_NOW
    c.urg_rx_pos = None
    assert (c.rx_cons, c.rx_cons_sent, link.readable()) == before
    assert lane_.read_now(link.path, out, 16, True) == 6
    assert bytes(out[:6]) == b"abcdef"


def test_a_reader_waits_for_the_runtimes_lock(links: tuple[Link, Link]) -> None:
    link, _ = links
    lane_ = lane()
    assert link.write(b"xyz") == 3
    link.settle()
    got: list[int] = []
    out = memoryview(bytearray(8))
    with link.reader.lock:
        t = threading.Thread(target=lambda: got.append(lane_.read_now(link.path, out, 8, True)))
        t.start()
        t.join(0.2)
        assert t.is_alive() and not got  # held: the read waits, as try_read's would
    t.join(10)
    assert got == [3] and bytes(out[:3]) == b"xyz"

