"""The runtime's buffer pool (``Stack.alloc_buffers`` and the release path): buffers are
reused with their rkey and address, kept apart by size and kind, bounded, and a recycled
RMB is not handed out while the old peer may still write into it.  An RMB whose last
connection had the same peer comes first: its link group kept it announced to that peer,
so no CONFIRM RKEY is due for it (and no DELETE RKEY takes it from that group)."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from smcr.core import FellBack
from smcr.rdma import AccessFlag
from smcr.rdma.base import MemoryRegion
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
    """The rkeys (RMBs) or lkeys (send buffers) waiting in the pool for that size."""
    with stack.lock:
        return [mr.rkey if remote else mr.lkey for mr in stack.pool.free.get((size, remote), [])]


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


def test_the_pool_keeps_sizes_and_kinds_apart() -> None:
    """A buffer comes back only for its own size, and a send buffer never comes out as an
    RMB nor the other way round: only an RMB is remotely writable."""
    with hosts(1) as (x,), x.lock:
        bufs = x.pool.alloc(SIZE, SIZE)
        assert bufs is not None
        rmb, snd = bufs
        assert rmb.access & AccessFlag.REMOTE_WRITE
        assert not snd.access & AccessFlag.REMOTE_WRITE
        hc = x.new_conn(socket.socket())
        hc.rmb_mr, hc.sndbuf_mr = rmb, snd
        x.pool.give_back(hc)
        other = x.pool.alloc(2 * SIZE, SIZE // 2)  # other sizes: new buffers
        assert other is not None and rmb not in other and snd not in other
        again = x.pool.alloc(SIZE, SIZE)
        assert again == (rmb, snd)  # each from its own kind's list
        hc.tcp.close()


def _backed(x: Stack, rmb: MemoryRegion) -> int:
    """Bytes of memory an RMB's shared segment holds now."""
    assert isinstance(x.device, ShmDevice)
    fd = x.device._remote[rmb.rkey].segment.fd
    return os.fstat(fd).st_blocks * 512


def test_the_latest_pooled_buffers_keep_their_pages_the_others_give_them_back(
        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """What closed connections wrote does not stay in the host's memory, but for the
    latest ones given back (``HOT_BYTES`` in all), whose pages the next connections
    reuse as they are (a bulk stream then faults no page in)."""
    monkeypatch.setattr(bufpool, "HOT_BYTES", 2 * SIZE)  # one connection's two buffers
    with hosts(1) as (x,), x.lock:
        given: list[tuple[MemoryRegion, MemoryRegion]] = []
        for _ in range(2):
            bufs = x.pool.alloc(SIZE, SIZE)
            assert bufs is not None
            for mr in bufs:
                mr.buf[:] = b"w" * mr.length
            given.append(bufs)
        for rmb, snd in given:
            hc = x.new_conn(socket.socket())
            hc.rmb_mr, hc.sndbuf_mr = rmb, snd
            x.pool.give_back(hc)
            hc.tcp.close()
        (old_rmb, old_snd), (new_rmb, new_snd) = given
        assert _backed(x, old_rmb) == 0 and bytes(old_snd.buf) == bytes(SIZE)  # given back
        assert _backed(x, new_rmb) >= SIZE and bytes(new_snd.buf[:1]) == b"w"  # kept
        assert x.pool.alloc(SIZE, SIZE) == (new_rmb, new_snd)  # the hot ones come first
        assert x.pool.alloc(SIZE, SIZE) == (old_rmb, old_snd)


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
    """A link that fails takes its connections down: once the application closes them,
    their buffers are back in the pool (no DELETE RKEY to wait for: the QP is gone)."""
    with hosts(2) as (x, y):
        hx, hy = connect(x, y)
        assert hx.rmb_mr is not None
        rkey = hx.rmb_mr.rkey
        with x.lock:
            out = x.pool.out
            x.execute(x.engine.link_failed(conn(x, hx).qpn, "injected", time.monotonic()))
            assert conn(x, hx).reset_reason
            x.app_close(hx)
            assert hx.released and x.pool.out == out - 1
        assert rkey in pooled(x)
        cy = conn(y, hy)
        wait(y, hy, lambda: bool(cy.reset_reason))  # the peer's QP went to ERR: reset too


# ------------------------------------------------------------ the choice of RMB



@pytest.fixture
def pool(tmp_path: Path) -> Iterator[bufpool.BufferPool]:
    dev = ShmDevice("pool", directory=tmp_path)
    try:
        yield bufpool.BufferPool(dev.alloc_pd(), 16)
    finally:
        dev.close()


def holding(pool: bufpool.BufferPool, peer: object) -> HostConn:
    """A connection record holding buffers from ``pool`` for ``peer``."""
    hc = HostConn(0, None, threading.Condition())  # type: ignore[arg-type]
    hc.peer = peer
    bufs = pool.alloc(SIZE, SIZE, peer)
    assert bufs is not None
    hc.rmb_mr, hc.sndbuf_mr = bufs
    return hc


def rkey(hc: HostConn) -> int:
    assert hc.rmb_mr is not None
    return hc.rmb_mr.rkey


def test_an_rmb_goes_to_a_connection_with_its_last_peer(pool: bufpool.BufferPool) -> None:
    """Both ends in one process: each role gets its own RMB back, whichever went last."""
    client, server = (True, "127.0.0.1"), (False, "127.0.0.1")
    a, b = holding(pool, client), holding(pool, server)
    a_rkey, b_rkey = rkey(a), rkey(b)
    pool.give_back(a)
    pool.give_back(b)  # (the latest given back: the server's)
    assert rkey(holding(pool, client)) == a_rkey
    assert rkey(holding(pool, server)) == b_rkey


def test_without_a_match_the_latest_given_back_comes_first(pool: bufpool.BufferPool) -> None:
    a, b = holding(pool, (True, "10.0.0.1")), holding(pool, (True, "10.0.0.2"))
    b_rkey = rkey(b)
    pool.give_back(a)
    pool.give_back(b)
    assert rkey(holding(pool, (True, "10.0.0.3"))) == b_rkey
    assert rkey(holding(pool, None)) not in (b_rkey, 0)
