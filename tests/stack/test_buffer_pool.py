"""The runtime's buffer pool (:mod:`smcr.stack.bufpool` and the release path): buffers are
reused with their rkey and address, kept apart by size and kind, bounded, and a recycled
RMB is not handed out while the old peer may still write into it.  RMBs belong to their
link group: placed once the engine chose it, reused only by the group's next connections
(which need no CONFIRM RKEY for them), carved from the group's one shared segment (a
descriptor per group), and deregistered when the group has ended.  On RoCE (no descriptor
per RMB) an RMB serves any group, one whose last connection had the same peer first."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from smcr.core import FellBack
from smcr.rdma import AccessFlag
from smcr.rdma.shm import ShmDevice
from smcr.stack import bufpool
from smcr.stack.hostconn import HostConn
from smcr.stack.runtime import Stack
from smcr.wire.decline import DeclineCode
from tests.stack.hosts import SIZE, conn, connect, handshake_outcome, hosts, read, send, wait


def close_both(x: Stack, hx: HostConn, y: Stack, hy: HostConn) -> None:
    """Orderly close on both ends; wait until both runtimes let the connection go."""
    for stack, hc in ((x, hx), (y, hy)):
        with stack.lock:
            stack.app_close(hc)
    for stack, hc in ((x, hx), (y, hy)):
        wait(stack, hc, lambda hc=hc: hc.released)  # type: ignore[misc]


def pooled(stack: Stack, size: int = SIZE, remote: bool = True) -> list[int]:
    """The rkeys (RMBs, of every group) or lkeys (send buffers) waiting in the pool for
    that size."""
    with stack.lock:
        if not remote:
            return [mr.lkey for mr in stack.pool.free.get(size, [])]
        return [mr.rkey for group in stack.pool.groups.values()
                for mr in group.free.get(size, [])]  # fmt: skip


def wait_pooled(stack: Stack, rkey: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while rkey not in pooled(stack):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_released_rmb_serves_the_next_connection_with_its_rkey_and_address() -> None:
    """As Linux keeps freed RMBs for reuse: after an orderly close the RMB comes back to the
    next connection with the same rkey and address (still announced to the peer: no
    CONFIRM RKEY), and carries that connection's bytes."""
    with hosts(2) as (x, y):
        hx, hy = connect(x, y)
        assert hx.rmb_mr is not None
        rkey, addr = hx.rmb_mr.rkey, hx.rmb_mr.addr
        close_both(x, hx, y, hy)
        assert wait_pooled(x, rkey)
        hx2, hy2 = connect(x, y)
        assert hx2.rmb_mr is not None
        assert (hx2.rmb_mr.rkey, hx2.rmb_mr.addr) == (rkey, addr)
        assert conn(y, hy2).peer_rkey == rkey
        send(y, hy2, b"second life")
        assert read(x, hx2, 11) == b"second life"


def holding(pool: bufpool.BufferPool, group: int, size: int = SIZE) -> HostConn:
    """A connection record holding a send buffer and an RMB of ``group`` from ``pool``."""
    hc = HostConn(0, None, threading.Condition())  # type: ignore[arg-type]
    assert pool.reserve(hc, size, size)
    assert pool.place(hc, group, size) is not None
    return hc


def rkey(hc: HostConn) -> int:
    assert hc.rmb_mr is not None
    return hc.rmb_mr.rkey


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[bufpool.BufferPool]:
    dev = ShmDevice("pool", directory=tmp_path)
    try:
        pool = bufpool.BufferPool(dev.alloc_pd(), 64)
        yield pool
        pool.close()
    finally:
        dev.close()


def test_the_pool_keeps_sizes_and_kinds_apart(pool: bufpool.BufferPool) -> None:
    """A buffer comes back only for its own size, and a send buffer never comes out as an
    RMB nor the other way round: only an RMB is remotely writable."""
    hc = holding(pool, 1)
    rmb, snd = hc.rmb_mr, hc.sndbuf_mr
    assert rmb is not None and snd is not None
    assert rmb.access & AccessFlag.REMOTE_WRITE
    assert not snd.access & AccessFlag.REMOTE_WRITE
    pool.give_back(hc)
    other = holding(pool, 1, 2 * SIZE)  # another size: new buffers
    assert other.rmb_mr not in (rmb, snd) and other.sndbuf_mr not in (rmb, snd)
    again = holding(pool, 1)
    assert (again.rmb_mr, again.sndbuf_mr) == (rmb, snd)  # each from its own kind's list


def test_an_rmb_serves_only_its_own_link_groups_connections(pool: bufpool.BufferPool) -> None:
    """Given back, an RMB waits for its group's next connection (still announced to that
    peer: no CONFIRM RKEY); another group's connection gets an RMB of its own group."""
    a, b = holding(pool, 1), holding(pool, 2)
    a_rkey, b_rkey = rkey(a), rkey(b)
    pool.give_back(a)
    pool.give_back(b)  # (the latest given back: group 2's)
    assert rkey(holding(pool, 1)) == a_rkey
    assert rkey(holding(pool, 3)) not in (a_rkey, b_rkey)
    assert rkey(holding(pool, 2)) == b_rkey


def _memfds(name: str) -> int:
    """This process's descriptors of memfds called ``name``."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # (a descriptor closed meanwhile)
            count += os.readlink(f"/proc/self/fd/{fd}") == f"/memfd:{name} (deleted)"
    return count


def test_a_groups_rmbs_share_one_segment_that_goes_after_the_group(
        pool: bufpool.BufferPool) -> None:  # fmt: skip
    """30 connections of one group hold one descriptor for their RMBs, a second group one
    more.  When a group ends, the RMBs it had pooled are deregistered at once, those still
    held as they come back, and its segment's descriptor goes with the last."""
    before = _memfds("smcr-rmbs")
    group_one = [holding(pool, 1) for _ in range(30)]
    assert _memfds("smcr-rmbs") - before == 1
    group_two = [holding(pool, 2) for _ in range(3)]
    assert _memfds("smcr-rmbs") - before == 2
    for hc in group_one[:10]:
        pool.give_back(hc)
    pooled_rmbs = [mr for free in pool.groups[1].free.values() for mr in free]
    assert len(pooled_rmbs) == 10
    pool.group_ended(1)
    assert all(not mr.valid for mr in pooled_rmbs)  # deregistered at once
    assert _memfds("smcr-rmbs") - before == 2  # the 20 still held keep the segment
    held = group_one[10:]
    for hc in held[:-1]:
        mr = hc.rmb_mr
        pool.give_back(hc)
        assert mr is not None and not mr.valid
    assert _memfds("smcr-rmbs") - before == 2
    pool.give_back(held[-1])
    assert _memfds("smcr-rmbs") - before == 1 and 1 not in pool.groups  # its segment went
    assert rkey(holding(pool, 2)) != 0 and pool.out == 4  # the other group goes on
    for hc in group_two:
        pool.give_back(hc)


def test_connections_of_one_link_group_hold_one_rmb_descriptor_per_runtime() -> None:
    """20 connections between two runtimes: one link group, each runtime's RMBs in one
    memfd; each peer wrote into every RMB of the other's (all mapped) and holds no
    descriptor for them."""
    before = _memfds("smcr-rmbs")
    with hosts(2) as (x, y):
        pairs = [connect(x, y) for _ in range(20)]
        assert {hx.rmb_group for hx, _ in pairs} == {next(iter(x.pool.groups))}
        for i, (hx, hy) in enumerate(pairs):
            send(y, hy, b"to x %d" % i)
            send(x, hx, b"to y %d" % i)
        for i, (hx, hy) in enumerate(pairs):
            assert read(x, hx, len(b"to x %d" % i)) == b"to x %d" % i
            assert read(y, hy, len(b"to y %d" % i)) == b"to y %d" % i
        assert _memfds("smcr-rmbs") - before == 2  # (x's and y's)
    assert _memfds("smcr-rmbs") == before  # (the runtimes' close lets them go)


def _segment_bytes(pool: bufpool.BufferPool, group: int) -> int:
    """Bytes of memory the shared segment of ``group``'s RMBs holds now."""
    segment = pool.groups[group].segment
    assert segment is not None
    return os.fstat(segment.fd).st_blocks * 512


def test_the_latest_pooled_buffers_keep_their_pages_the_others_give_them_back(
        pool: bufpool.BufferPool, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """What closed connections wrote does not stay in the host's memory, but for the
    latest ones given back (``HOT_BYTES`` in all), whose pages the next connections
    reuse as they are (a bulk stream then faults no page in)."""
    monkeypatch.setattr(bufpool, "HOT_BYTES", 2 * SIZE)  # one connection's two buffers
    given = [holding(pool, 1) for _ in range(2)]
    bufs = [(hc.rmb_mr, hc.sndbuf_mr) for hc in given]
    for hc in given:
        for mr in (hc.rmb_mr, hc.sndbuf_mr):
            assert mr is not None
            mr.buf[:] = b"w" * mr.length
    assert _segment_bytes(pool, 1) >= 2 * SIZE
    for hc in given:
        pool.give_back(hc)
    (old_rmb, old_snd), (new_rmb, new_snd) = bufs
    assert old_rmb is not None and old_snd is not None
    assert new_rmb is not None and new_snd is not None
    assert SIZE <= _segment_bytes(pool, 1) < 2 * SIZE  # the older RMB's range punched
    assert bytes(old_rmb.buf) == bytes(SIZE) and bytes(old_snd.buf) == bytes(SIZE)  # given back
    assert bytes(new_rmb.buf[:1]) == b"w" and bytes(new_snd.buf[:1]) == b"w"  # kept
    again = holding(pool, 1)
    assert (again.rmb_mr, again.sndbuf_mr) == (new_rmb, new_snd)  # the hot ones come first
    again = holding(pool, 1)
    assert (again.rmb_mr, again.sndbuf_mr) == (old_rmb, old_snd)


def test_the_pool_limit_declines_mem_until_a_buffer_comes_back() -> None:
    """``max_buffers`` connections' buffers out: the next handshake declines MEM on the
    server (Linux ``SMC_CLC_DECL_MEM``), the client falls back on it; once a connection
    has gone and its RMB is back, a new connection gets SMC-R again."""
    with hosts(2, max_buffers=1) as (x, y):
        hx, hy = connect(x, y)
        server, client = handshake_outcome(x, y)
        assert isinstance(server, FellBack) and isinstance(client, FellBack)
        assert (server.local_code, client.local_code, client.peer_code) == (
            DeclineCode.MEM, DeclineCode.PEERDECL, DeclineCode.MEM)  # fmt: skip
        assert hx.rmb_mr is not None and hy.rmb_mr is not None
        rkey, client_rkey = hx.rmb_mr.rkey, hy.rmb_mr.rkey
        close_both(x, hx, y, hy)
        # Both ends are at their limit: each must have its RMB back (after an orderly
        # close at the release; else once the peer answered its DELETE RKEY).
        assert wait_pooled(x, rkey) and wait_pooled(y, client_rkey)
        hx2, hy2 = connect(x, y)
        assert hx2.rmb_mr is not None and hx2.rmb_mr.rkey == rkey
        assert hy2.rmb_mr is not None and hy2.rmb_mr.rkey == client_rkey


def test_a_recycled_rmb_gets_no_stale_write_from_the_old_peer() -> None:
    """X aborts a connection with Y (SO_LINGER 0: the application is done at once) while Y
    has not yet seen the abort and still writes into it.  A connection of X with Z made
    meanwhile must not get that RMB: Y's write would land in Z's bytes.  As Linux, X keeps
    the connection and its RMB until Y's closing CDC answers the abort (Y's application
    closes), and (``smcr_buf_unuse``) the RMB goes back to the pool only once Y has
    answered the DELETE RKEY of it -- Y's writes before each answer arrive before it (RC
    order).

    Y is held still by holding its runtime's lock: it takes no completion, no CDC."""
    with hosts(3) as (x, y, z):
        hx, hy = connect(x, y)
        assert hx.rmb_mr is not None
        old_rkey = hx.rmb_mr.rkey
        with y.lock:
            with x.lock:
                x.abort(hx)
            assert conn(x, hx).released
            hx2, hz = connect(x, z)  # X and Z go on; Y stands still
            send(z, hz, b"B" * 1000)
            c = conn(x, hx2)
            wait(x, hx2, lambda: c.rx_available() >= 1000)  # Z's bytes are in X's RMB
            # Y, not yet aware of the abort, writes on: into the old RMB
            cy = conn(y, hy)
            assert cy.peer_rkey == old_rkey and cy.direct_room() >= 1000
            y.send_inline(cy, memoryview(b"S" * 1000))
            assert read(x, hx2, 1000) == b"B" * 1000
            assert hx2.rmb_mr is not None and hx2.rmb_mr.rkey != old_rkey
            assert old_rkey not in pooled(x)
        # Y takes the abort; X keeps the RMB until Y's application closes and Y answers
        wait(y, hy, lambda: conn(y, hy).aborted)
        assert old_rkey not in pooled(x) and not hx.released
        with y.lock:
            y.app_close(hy)
        # then X releases it, and once Y answers the DELETE RKEY it is X's to reuse again
        assert wait_pooled(x, old_rkey)
        assert hx.released


def test_buffers_of_a_connection_whose_link_fails_go_back() -> None:
    """A link that fails takes its connections down, and its link group with it: once the
    application closes them, their send buffers are back in the pool and their RMBs
    deregistered with the group's segment (no DELETE RKEY to wait for: the QP is gone)."""
    with hosts(2) as (x, y):
        hx, hy = connect(x, y)
        rmb, snd = hx.rmb_mr, hx.sndbuf_mr
        assert rmb is not None and snd is not None
        group = hx.rmb_group
        with x.lock:
            out = x.pool.out
            x.execute(x.engine.link_failed(conn(x, hx).qpn, "injected", time.monotonic()))
            assert conn(x, hx).reset_reason
            x.app_close(hx)
            assert hx.released and x.pool.out == out - 1
        assert snd.lkey in pooled(x, remote=False)
        assert not rmb.valid and group not in x.pool.groups
        cy = conn(y, hy)
        wait(y, hy, lambda: bool(cy.reset_reason))  # the peer's QP went to ERR: reset too


@pytest.fixture
def ungrouped(tmp_path: Path) -> Iterator[bufpool.BufferPool]:
    """A pool that places RMBs as on RoCE (taken when the handshake starts, any group)."""
    dev = ShmDevice("pool", directory=tmp_path)
    try:
        yield bufpool.BufferPool(dev.alloc_pd(), 16, grouped=False)
    finally:
        dev.close()


def reserved(pool: bufpool.BufferPool, peer: object) -> HostConn:
    """A connection record whose handshake with ``peer`` started: on an ungrouped pool it
    holds its RMB already, and placing it in any group hands back that one."""
    hc = HostConn(0, None, threading.Condition())  # type: ignore[arg-type]
    hc.peer = peer
    assert pool.reserve(hc, SIZE, SIZE, peer)
    rmb = hc.rmb_mr
    assert rmb is not None and pool.place(hc, 7, SIZE) is rmb
    return hc


def test_an_ungrouped_rmb_goes_to_a_connection_with_its_last_peer(
        ungrouped: bufpool.BufferPool) -> None:  # fmt: skip
    """Both ends in one process: each role gets its own RMB back, whichever went last."""
    client, server = (True, "127.0.0.1"), (False, "127.0.0.1")
    a, b = reserved(ungrouped, client), reserved(ungrouped, server)
    a_rkey, b_rkey = rkey(a), rkey(b)
    ungrouped.give_back(a)
    ungrouped.give_back(b)  # (the latest given back: the server's)
    assert rkey(reserved(ungrouped, client)) == a_rkey
    assert rkey(reserved(ungrouped, server)) == b_rkey
    assert not ungrouped.groups


def test_without_a_match_the_latest_ungrouped_rmb_given_back_comes_first(
        ungrouped: bufpool.BufferPool) -> None:  # fmt: skip
    a, b = reserved(ungrouped, (True, "10.0.0.1")), reserved(ungrouped, (True, "10.0.0.2"))
    b_rkey = rkey(b)
    ungrouped.give_back(a)
    ungrouped.give_back(b)
    assert rkey(reserved(ungrouped, (True, "10.0.0.3"))) == b_rkey
    assert rkey(reserved(ungrouped, None)) not in (b_rkey, 0)
