"""The buffer pool's choice of RMB: one whose last connection had the same peer comes
first, so that its link group, which kept it announced to that peer, needs no CONFIRM
RKEY for it (and no DELETE RKEY takes it back from that group); otherwise the latest
given back, whose pages are most likely in place."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from smcr.rdma.shm import ShmDevice
from smcr.stack.bufpool import BufferPool
from smcr.stack.hostconn import HostConn

SIZE = 65536


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[BufferPool]:
    dev = ShmDevice("pool", directory=tmp_path)
    try:
        yield BufferPool(dev.alloc_pd(), 16)
    finally:
        dev.close()


def conn(pool: BufferPool, peer: object) -> HostConn:
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


def test_an_rmb_goes_to_a_connection_with_its_last_peer(pool: BufferPool) -> None:
    """Both ends in one process: each role gets its own RMB back, whichever went last."""
    client, server = (True, "127.0.0.1"), (False, "127.0.0.1")
    a, b = conn(pool, client), conn(pool, server)
    a_rkey, b_rkey = rkey(a), rkey(b)
    pool.give_back(a)
    pool.give_back(b)  # (the latest given back: the server's)
    assert rkey(conn(pool, client)) == a_rkey
    assert rkey(conn(pool, server)) == b_rkey


def test_without_a_match_the_latest_given_back_comes_first(pool: BufferPool) -> None:
    a, b = conn(pool, (True, "10.0.0.1")), conn(pool, (True, "10.0.0.2"))
    b_rkey = rkey(b)
    pool.give_back(a)
    pool.give_back(b)
    assert rkey(conn(pool, (True, "10.0.0.3"))) == b_rkey
    assert rkey(conn(pool, None)) not in (b_rkey, 0)
