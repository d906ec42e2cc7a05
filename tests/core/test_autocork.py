"""Autocorking (Connection.cork, echo_wanted): small sends of a burst wait in the send
buffer while a CDC that asked the peer to answer is unanswered, and go with one CDC."""

from __future__ import annotations

import os

from smcr.core import Config
from smcr.wire.cdc import CdcMessage, ProducerFlags
from tests.core.pair import Pair, Side

CORK = Config(sndbuf_size=65536, rmb_size=65536, autocork_size=16384)
REQ = ProducerFlags.CONSUMER_CURSOR_UPDATE_REQUESTED


def ready(cfg: Config = CORK) -> tuple[Pair, int, int]:
    p = Pair(cfg)
    c, s = p.connect(rmb_size=cfg.rmb_size)
    p.pump()
    return p, c, s


def send(p: Pair, side: Side, conn: int, data: bytes) -> str:
    """One application send as the socket layer makes it (SMCSocket._send): corked, or
    inline with the CDC asking for an answer when echo_wanted says so; the actions run
    but nothing is delivered.  Returns "corked", "asked" or "plain"."""
    c = side.engine.conns[conn]
    if c.echo_pending and c.cork(len(data)):
        side.cork_write(conn, data)
        return "corked"
    request = c.echo_wanted(len(data))
    n, acts = side.write_inline(conn, data, request)
    assert n == len(data)
    p.run(side, acts)
    return "asked" if request else "plain"


def cdcs_in_flight(p: Pair) -> list[CdcMessage]:
    return [CdcMessage.decode(bytes(d)) for _, _, d in p.sends if d[0] == 0xFE]


def test_a_burst_is_corked_behind_one_asking_cdc_and_flushed_by_the_answer() -> None:
    p, c, s = ready()
    conn = p.client.engine.conns[c]
    data = [os.urandom(1024) for _ in range(10)]
    kinds = [send(p, p.client, c, d) for d in data]
    # the first goes as it is, the second asks the peer to answer, the rest wait
    assert kinds == ["plain", "asked"] + ["corked"] * 8
    flags = [m.producer_flags for m in cdcs_in_flight(p)]
    assert len(flags) == 2 and not flags[0] & REQ and flags[1] & REQ
    assert conn.tx_app - conn.tx_sent == 8 * 1024
    p.step_until(lambda: conn.tx_app == conn.tx_sent, "the answer flushes the corked bytes")
    flush = cdcs_in_flight(p)[-1]
    assert flush.producer_cursor.count == 10 * 1024 and flush.producer_flags & REQ
    p.pump()
    got, acts = p.server.read(s)
    p.do(p.server, acts)
    assert got == b"".join(data)


def test_corked_bytes_stay_within_the_corking_size() -> None:
    p, c, _ = ready()
    conn = p.client.engine.conns[c]
    assert send(p, p.client, c, bytes(1000)) == "plain"
    assert send(p, p.client, c, bytes(1000)) == "asked"
    corked = 0
    while conn.cork(1000):
        p.client.cork_write(c, bytes(1000))
        corked += 1000
    assert corked == 16000  # 16 sends of 1000 bytes: 16384 is the corking size
    assert not conn.cork(4096 + 1)  # more than a quarter of it is never corked
    assert conn.cork(384)


def test_lone_sends_and_answers_never_ask_nor_cork() -> None:
    p, c, s = ready()
    # request/response: each send follows the peer's message (the first is a lone one)
    for _ in range(5):
        assert send(p, p.client, c, b"q" * 100) == "plain"
        p.pump()
        _, acts = p.server.read(s)
        p.do(p.server, acts)
        assert send(p, p.server, s, b"r" * 100) == "plain"
        p.pump()
        _, acts = p.client.read(c)
        p.do(p.client, acts)
    assert not any(m.producer_flags & REQ for m in cdcs_in_flight(p))


def test_off_when_the_corking_size_is_zero() -> None:
    p, c, _ = ready(Config(sndbuf_size=65536, rmb_size=65536))
    for _ in range(10):
        assert send(p, p.client, c, bytes(100)) == "plain"


def test_no_corking_past_the_peers_free_space() -> None:
    """A corked byte must go with the flush the answer brings: never more than the peer's
    RMBE has room for now."""
    p, c, _ = ready(Config(sndbuf_size=65536, rmb_size=16384, autocork_size=16384))
    conn = p.client.engine.conns[c]
    send(p, p.client, c, bytes(10000))
    send(p, p.client, c, bytes(1000))
    assert conn.echo_pending and conn.peer_space() == 16384 - 1 - 11000  # (peer_hold)
    assert send(p, p.client, c, bytes(4096)) == "corked"
    assert conn.cork(1287) and not conn.cork(1288)  # 5383 bytes were free


def test_asking_backs_off_while_answers_find_nothing_corked() -> None:
    """A sender no faster than the peer's answers (each comes before the next send, as
    when sends are far apart):
    asking would cost the peer a CDC per two sends for nothing; after each vain answer
    twice as many sends go without asking, up to 64.  A burst that corks again resets it."""
    p, c, s = ready()
    conn = p.client.engine.conns[c]
    kinds = []
    for _ in range(300):
        kinds.append(send(p, p.client, c, b"m" * 100))
        p.pump()  # the peer's answer (if asked) comes before the next send
        _, acts = p.server.read(s)
        p.do(p.server, acts)
    asked = kinds.count("asked")
    assert 1 <= asked <= 10  # 1 + 1, 2, 4, ... 64 sends between: 7 in 300
    assert "corked" not in kinds
    # a burst (no answer between sends) corks once the sends to skip are used up
    burst = []
    for _ in range(200):
        burst.append(send(p, p.client, c, b"b" * 100))
    assert "corked" in burst
    p.step_until(lambda: conn.tx_app == conn.tx_sent, "the answer flushes the burst")
    assert conn.ask_backoff == 0  # that answer found bytes corked
    p.pump()


def test_sends_too_large_to_cork_ask_nothing() -> None:
    """A send of more than a quarter of the corking size is never corked (its own CDC
    pays), so a stream of them asks the peer for no answers either."""
    p, c, _ = ready()
    kinds = [send(p, p.client, c, bytes(4097)) for _ in range(5)]
    assert kinds == ["plain"] * 5
    p.pump()
