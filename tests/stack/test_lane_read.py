"""The lane's read (``_lane.c`` ``read_fast``) against the Python of ``DataPath.recv_fast``.

The compiled build serves it (CI builds it: there a missing module fails, not skips).
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from smcr.core import Action
from smcr.core.connection import Connection
from smcr.stack.executor import ring_read
from tests.core.pair import Pair
from tests.stack.test_lane import FIELDS, lane, unnamed

SIZE = 16384  # the smallest RMBE (CLC): the cursors wrap often


def python_read(conn: Connection, rmb: memoryview, out: memoryview,
                waitall: bool) -> tuple[int, list[Action]]:  # fmt: skip
    """``DataPath.recv_fast``'s Python: the bytes copied out and consumed, or -1."""
    cons = conn.rx_cons
    avail = conn.rx_prod - cons
    n = len(out)
    if (avail <= 0 or avail >= len(rmb) or not n or conn.urg_rx_pos is not None
            or (waitall and avail < n)):  # fmt: skip
        return -1, []
    n = min(n, avail)
    ring_read(rmb, cons, out[:n])
    actions: list[Action] = []
    conn.consumed(n, actions)
    return n, actions


def connected() -> tuple[Pair, int, Connection, memoryview]:
    """A pair, the client's connection id, the server's connection and its RMB's bytes."""
    p = Pair()
    client, server = p.connect(rmb_size=SIZE)
    p.pump()
    conn = p.server.engine.conns[server]
    return p, client, conn, memoryview(p.fabric.memory[conn.rmb.rkey][1])


def state(conn: Connection) -> tuple[object, ...]:
    return tuple(getattr(conn, f) for f in FIELDS)


@pytest.mark.parametrize("seed", range(4))
def test_c_and_python_read_alike(seed: int) -> None:
    """The same writes of the peer's and the same reads, through the lane (the Python where
    it declines) on one pair and through the Python alone on the other: after each read the
    bytes read, the connection and the actions (consumer cursor updates) are the same, and
    what was read is what the peer wrote, in order."""
    c = lane()
    runs = []
    for use_lane in (True, False):
        rng = random.Random(seed)
        p, client, conn, rmb = connected()
        steps: list[object] = []
        sent, got = bytearray(), bytearray()
        taken = declined = 0
        for _ in range(500):
            if rng.random() < 0.55:
                data = rng.randbytes(rng.choice((1, 7, 100, 1000, 2500, 9000)))
                n, actions = p.client.write(client, data)
                p.do(p.client, actions)
                sent += data[:n]
            out = memoryview(bytearray(rng.choice((1, 5, 64, 700, 3000, 16384))))
            waitall = rng.random() < 0.3
            r = c.read_fast(conn, rmb, out, waitall) if use_lane else -1
            actions = []
            if r > 0:
                taken += 1
            else:
                declined += use_lane
                r, actions = python_read(conn, rmb, out, waitall)
            got += out[: max(r, 0)]
            steps.append((r, state(conn), [unnamed(a) for a in actions]))
            p.do(p.server, actions)
            if conn.rx_available() >= SIZE:  # a full RMBE: the general path's (both runs)
                data, actions = p.server.read(conn.id, 5000)
                got += data
                p.do(p.server, actions)
        assert got == sent[: len(got)] and len(got) > 300_000
        runs.append((steps, taken, declined))
    (with_lane, taken, declined), (python, _, _) = runs
    for i, (a, b) in enumerate(zip(with_lane, python, strict=True)):
        assert a == b, f"after read {i}"
    assert taken > 100 and declined > 50  # (the lane took the common reads; the Python the rest)


def _ready(rx: int = 1500) -> tuple[Pair, int, Connection, memoryview]:
    p, client, conn, rmb = connected()
    if rx == SIZE:  # (filled to its last byte: as a Linux peer fills it, or smcr after a
        p.client.engine.conns[client].peer_hold = 0  # failover: Connection.peer_hold)
    n, actions = p.client.write(client, bytes(range(256)) * (rx // 256) + b"z" * (rx % 256))
    p.do(p.client, actions)
    assert n == rx and conn.rx_available() == rx
    return p, client, conn, rmb


def test_a_read_the_lane_takes_copies_out_and_moves_the_consumer_cursor() -> None:
    c = lane()
    _, _, conn, rmb = _ready()
    out = memoryview(bytearray(100))
    assert c.read_fast(conn, rmb, out, True) == 100
    assert bytes(out) == bytes(range(100)) and conn.rx_cons == 100
    big = memoryview(bytearray(4000))
    assert c.read_fast(conn, rmb, big, True) == -1  # waitall: not all of it there
    assert c.read_fast(conn, rmb, big, False) == 1400  # what is there
    assert conn.rx_cons == 1500 and conn.rx_cons_sent == 0
    assert c.read_fast(conn, rmb, out, False) == -1  # nothing there


@pytest.mark.parametrize("case", ["urgent", "update asked", "update due", "full", "empty out",
                                  "ring size", "strided out", "not a connection"])  # fmt: skip
def test_what_the_lane_declines_it_leaves_as_it_was(case: str) -> None:
    c = lane()
    _, _, conn, rmb = _ready(SIZE if case == "full" else 1500)
    out: Any = memoryview(bytearray(64))
    target: Any = conn
    if case == "urgent":
        conn.urg_rx_pos = conn.rx_prod - 1
    elif case == "update asked":
        conn.peer_wants_update = True
    elif case == "update due":  # (past a tenth of the RMBE and half of it not free to the peer)
        p2, client2, conn, rmb = connected()
        n, actions = p2.client.write(client2, b"u" * 9000)
        p2.do(p2.client, actions)
        assert n == 9000
        out = memoryview(bytearray(3000))
        target = conn
    elif case == "empty out":
        out = memoryview(bytearray(0))
    elif case == "ring size":
        rmb = rmb[:2048]
    elif case == "strided out":
        out = memoryview(bytearray(128))[::2]
    elif case == "not a connection":
        target = object()
    before = state(conn)
    assert c.read_fast(target, rmb, out, False) == -1
    assert state(conn) == before
