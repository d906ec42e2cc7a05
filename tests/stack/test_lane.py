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
          "state", "ask_backoff", "ask_skip", "peer_hold")  # fmt: skip


def lane() -> Any:
    if inplace.LANE is None:
        pytest.skip("the compiled build serves the lane")
    return inplace.LANE


def connected() -> tuple[Pair, Connection, int, Any]:
    """A pair whose server connection has sent 3,000 bytes (so a CDC's consumer cursor has
    room to move) and read nothing; with the QP number the CDCs come on and the server
    engine's state, as the lane takes them."""
    p = Pair()
    _, s = p.connect(rmb_size=SIZE)
    p.pump()
    n, actions = p.server.write(s, b"x" * 3000)
    assert n == 3000
    p.do(p.server, actions)
    conn = p.server.engine.conns[s]
    assert conn.link is not None
    return p, conn, conn.link.qpn, p.server.engine.state


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
        p, conn, qpn, state = connected()
        steps: list[object] = []
        taken = 0
        for i, (data, read) in enumerate(cdcs(random.Random(seed), conn.token)):
            now = 1000.0 + i
            if i % 9 == 4:  # a failover's switch: until the consumer cursor moves
                conn.peer_hold = 0
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
    p, conn, qpn, state = connected()
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
        c.bind(Plain, Plain, Plain, Plain, Plain, None, Plain)


def ring(messages: list[bytes], depth: int, slot_size: int, first: int) -> bytearray:
    """A receive ring as the shm QP keeps it (:data:`~smcr.rdma.base.RingTaker`): the
    receive lengths (slot ``i``'s is ``1000 + i``) at 0, the slots from ``64``; the
    messages in the slots of numbers ``first``, ``first + 1``, ... (each a SEND, kind 1,
    unless it is ``b"kind2"``)."""
    area = bytearray(64 + depth * (16 + slot_size))
    for i in range(depth):
        area[4 * i : 4 * i + 4] = (1000 + i).to_bytes(4, "little")
    for k, m in enumerate(messages):
        off = 64 + ((first + k) % depth) * (16 + slot_size)
        kind = 2 if m == b"kind2" else 1
        area[off : off + 8] = len(m).to_bytes(4, "little") + kind.to_bytes(4, "little")
        area[off + 16 : off + 16 + len(m)] = m
    return area


def test_a_run_takes_what_take_cdc_takes_and_reposts_each_receive() -> None:
    """``take_run`` takes the CDCs ``take_cdc`` would, in order, across the ring's end, up to
    the first it leaves to the Python (here a CDC asking for an answer), and posts each
    taken slot's receive again behind the others; the same CDCs one by one leave the
    connection as the run does."""
    c = lane()
    depth, slot_size = 8, 64
    runs = []
    for by_run in (True, False):
        p, conn, qpn, state = connected()
        cdc = [CDC.pack(CDC_MSG_TYPE, CDC_MSG_LENGTH, i, conn.token, 0, 100 * i, 0, 0,
                        0x80 if i == 3 else 0, 0) for i in range(1, 6)]  # fmt: skip
        cdc.append(CDC.pack(CDC_MSG_TYPE, CDC_MSG_LENGTH, 6, conn.token, 0, 600, 0, 0, 0x10, 0))
        area = ring(cdc, depth, slot_size, first=6)  # (numbers 6..11: slots 6, 7, 0, 1, ...)
        if by_run:
            got = c.take_run(state, qpn, memoryview(area), 0, 64, 16 + slot_size, depth,
                             slot_size, 6, 12, 14, 7.0)  # fmt: skip
            assert got == (11, 19)  # five taken, the sixth (UPDATE_REQUESTED) left
            # slot i's receive length went to the posted counts 14..18 (slots 6, 7, 0, 1, 2)
            lengths = [int.from_bytes(area[4 * (k % depth) : 4 * (k % depth) + 4], "little")
                       for k in range(14, 19)]  # fmt: skip
            assert lengths == [1000 + (k % depth) for k in range(6, 11)]
        else:
            for m in cdc[:5]:
                assert c.take_cdc(state, qpn, memoryview(m), 0, len(m), 7.0) == 1
        assert conn.rx_prod == 500
        runs.append(snapshot(p, conn))
    assert runs[0] == runs[1]


def test_a_run_stops_at_a_slot_that_is_not_a_cdc_send() -> None:
    c = lane()
    _, conn, qpn, state = connected()
    cdc = CDC.pack(CDC_MSG_TYPE, CDC_MSG_LENGTH, 1, conn.token, 0, 10, 0, 0, 0, 0)
    for bad in (b"kind2", b"\x01" * 44, cdc[:40], cdc + b"xx"):
        area = ring([bad, cdc], 4, 64, first=0)
        assert c.take_run(state, qpn, memoryview(area), 0, 64, 80, 4, 64, 0, 2, 4, 1.0) == (0, 4)
    assert conn.rx_prod == 0
    area = ring([cdc], 4, 64, first=0)
    assert c.take_run(state, qpn, memoryview(area), 0, 64, 80, 4, 40, 0, 1, 4, 1.0) == (0, 4)
    assert c.take_run(state, qpn, memoryview(area)[:200], 0, 64, 80, 4, 64, 0, 1, 4, 1.0) == (0, 4)
    assert c.take_run(state, qpn, memoryview(area), 0, 64, 80, 4, 64, 0, 1, 4, 1.0) == (1, 5)
    assert conn.rx_prod == 10
