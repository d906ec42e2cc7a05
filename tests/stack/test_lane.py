"""The fast lane's C (``stack/_lane.c``) against the Python it stands for.

The compiled build serves it (CI builds it: there a missing module fails, not skips).
"""

from __future__ import annotations

import random
import re
from typing import Any

import pytest

from smcr.core import Action
from smcr.core.connection import Connection
from smcr.stack import inplace
from smcr.wire.cdc import CDC, CDC_MSG_LENGTH, CDC_MSG_TYPE
from tests.core.pair import Pair

SIZE = 4096  # a small RMB: the cursors wrap often
FIELDS = ("rx_seq", "rx_prod", "rx_cons", "peer_cons", "tx_sent", "tx_app", "tx_fin",
          "unanswered", "echo_pending", "peer_write_blocked", "peer_blocked_last",
          "peer_wants_update", "rx_flags", "tx_flags", "urg_rx_pos", "reset_reason", "seq",
          "state", "ask_backoff", "ask_skip")  # fmt: skip


def lane() -> Any:
    if inplace.LANE is None:
        pytest.skip("the compiled build serves the lane")
    return inplace.LANE


def connected() -> tuple[Pair, Connection]:
    """A pair whose server connection has sent 3,000 bytes (so a CDC's consumer cursor has
    room to move) and read nothing."""
    p = Pair()
    _, s = p.connect(rmb_size=SIZE)
    p.pump()
    n, actions = p.server.write(s, b"x" * 3000)
    assert n == 3000
    p.do(p.server, actions)
    return p, p.server.engine.conns[s]


def snapshot(p: Pair, conn: Connection) -> tuple[object, ...]:
    link = conn.link
    assert link is not None
    lk: Any = link
    return (tuple(getattr(conn, f) for f in FIELDS), lk.last_rx, lk.test_deadline,
            sorted(p.server.engine.state.touched))  # fmt: skip


def unnamed(x: object) -> str:
    """An action or event as text, its QP numbers left out (each pair has its own)."""
    return re.sub(r"qpn=\d+", "qpn=_", repr(x))


def cdcs(rng: random.Random, token: int) -> list[tuple[bytes, int]]:
    """A peer's CDCs, mostly in order with new data (the common case), among them repeats,
    old sequence numbers, flags of every kind, cursors outside the ring; each with the
    bytes the server's application reads after it."""
    out = []
    seq = prod = 0
    for i in range(400):
        kind = rng.random()
        if i < 300 and 0.7 <= kind < 0.75:  # (closing flags and faults end the connection:
            kind = 0.0  # only in the last hundred)
        pflags = sflags = 0
        cons = rng.randrange(0, 3001)
        if kind < 0.6:  # new data
            seq += 1
            prod += rng.randrange(1, 900)
        elif kind < 0.7:
            pflags = rng.choice((0x80, 0x40, 0x20, 0x10, 0x80 | 0x10, 0x07)
                                + ((0x08,) if i >= 300 else ()))  # (failover: a fault)
            seq += 1
        elif kind < 0.75:
            sflags = rng.choice((0x80, 0x40, 0x20, 0x1F))
            seq += 1
        elif kind < 0.85:  # a repeat, or an old sequence number
            seq -= rng.randrange(0, 3)
        elif kind < 0.9:  # the sequence number wraps
            seq += 30000
        pwrap, pcount = divmod(prod, SIZE)
        cwrap, ccount = divmod(cons, SIZE)
        if i >= 300 and rng.random() < 0.03:
            pcount = SIZE + rng.randrange(5)  # outside the ring: a fault
        data = CDC.pack(CDC_MSG_TYPE, CDC_MSG_LENGTH, seq & 0xFFFF, token, pwrap & 0xFFFF,
                        pcount, cwrap & 0xFFFF, ccount, pflags, sflags)  # fmt: skip
        out.append((data, rng.randrange(0, 2000)))  # (reads keep up: no overflow)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_c_and_python_take_cdcs_alike(seed: int) -> None:
    """The same CDCs, and the same reads between them, through the lane (the Python where it
    declines) on one pair and through the Python alone on the other: after each, the
    connections, their links and the engines' touched sets are the same, and so are the
    actions and events."""
    c = lane()
    runs = []
    for use_lane in (True, False):
        p, conn = connected()
        assert conn.link is not None
        qpn, state = conn.link.qpn, p.server.engine.state
        steps: list[object] = []
        taken = 0
        for i, (data, read) in enumerate(cdcs(random.Random(seed), conn.token)):
            now = 1000.0 + i
            view = memoryview(bytearray(b"\0" * 8 + data))
            out: list[Action] = []
            if use_lane and c.take_cdc(state, qpn, view, 8, len(data), now) > 0:
                taken += 1
            else:
                p.server.engine.take_cdc(qpn, view, 8, len(data), now, out)
            steps.append((snapshot(p, conn), [unnamed(a) for a in out],
                          [unnamed(e) for e in p.server.pull_events()]))  # fmt: skip
            state.touched.clear()
            if conn.rx_available() and not conn.reset_reason:
                p.server.engine.data_consumed(conn.id, min(read, conn.rx_available()), now)
        runs.append((steps, taken))
    (with_lane, taken), (python, _) = runs
    for i, (a, b) in enumerate(zip(with_lane, python, strict=True)):
        assert a == b, f"after CDC {i}"
    assert 150 < taken < 350  # (the lane took the common ones; the Python the rest)


def test_not_a_cdc_of_a_known_connection_is_left_to_the_python() -> None:
    c = lane()
    p, conn = connected()
    assert conn.link is not None
    qpn, state = conn.link.qpn, p.server.engine.state
    good = CDC.pack(CDC_MSG_TYPE, CDC_MSG_LENGTH, 1, conn.token, 0, 10, 0, 0, 0, 0)
    before = snapshot(p, conn)
    for area, off, n, q in ((good, 0, 44, qpn + 1),  # another QP
                            (good[:40], 0, 40, qpn),  # short
                            (b"\x01" + good[1:], 0, 44, qpn),  # an LLC message
                            (good, 4, 44, qpn),  # beyond the area
                            (CDC.pack(CDC_MSG_TYPE, CDC_MSG_LENGTH, 1, conn.token + 1, 0, 10, 0,
                                      0, 0, 0), 0, 44, qpn)):  # fmt: skip
        assert c.take_cdc(state, q, memoryview(area), off, n, 5.0) == -1
        assert snapshot(p, conn) == before
    assert c.take_cdc(state, qpn, memoryview(good), 0, 44, 5.0) == 1
    assert conn.rx_prod == 10 and conn.rx_seq == 1


def test_the_lane_binds_only_the_compiled_classes() -> None:
    """Interpreted classes (a pure-Python process's) are refused: their instances are not
    the structs the C reads."""
    c = lane()

    class Plain:
        pass

    with pytest.raises(TypeError):
        c.bind(Plain, Plain, Plain, Plain, Plain)
