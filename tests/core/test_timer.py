"""The engine's next deadline (:meth:`Engine.get_timer`), which every poller's sleep asks."""

from __future__ import annotations

from smcr.core import Engine
from smcr.core.linkgroup import LinkState
from tests.core.pair import Pair, lgr_of


def _every_deadline(engine: Engine) -> float | None:
    """The deadlines one by one, as the engine's state holds them: the earliest, or None."""
    clc = engine.clc
    found = [hs.deadline for hs in engine.state.handshakes.values()
             if hs.conn not in clc._held]  # fmt: skip
    testlink = engine.state.config.testlink_time
    for lgr in engine.state.lgrs.values():
        found += [x.deadline for x in (lgr.flow, lgr.remote_add) if x is not None]
        if lgr.idle_since is not None:
            found.append(lgr.idle_since + engine._linger(lgr))
        for link in lgr.links:
            if link.switch_deadline is not None:
                found.append(link.switch_deadline)
            if link.state is LinkState.LINK_ACTIVE and testlink > 0:
                found.append(link.test_deadline if link.test_deadline is not None
                             else link.last_rx + testlink)  # fmt: skip
    return min(found) if found else None


def _check(p: Pair) -> None:
    for side in (p.client, p.server):
        assert side.engine.get_timer() == _every_deadline(side.engine), side.name


def test_the_next_deadline_through_a_connections_life() -> None:
    """None before anything; the handshakes' waits; the links' keepalives and the link
    group's flows once up (a deadline of each kind set by hand too, earlier than the
    rest); the idle group's linger once its connection is gone."""
    p = Pair()
    assert p.client.engine.get_timer() is None and p.server.engine.get_timer() is None
    c, s = p.connect()
    _check(p)  # (the handshakes' waits, nothing pumped yet)
    assert p.client.engine.get_timer() is not None
    p.pump()
    _check(p)
    lgr = lgr_of(p.client)
    (link,) = lgr.links
    for setting in ("switch_deadline", "test_deadline"):
        setattr(link, setting, p.now + 0.25)
        _check(p)
        assert p.client.engine.get_timer() == p.now + 0.25
        setattr(link, setting, None)
    p.advance(0.5)
    _check(p)
    p.do(p.client, p.client.engine.close(c, p.now))
    p.do(p.server, p.server.engine.close(s, p.now))
    for side, conn in ((p.client, c), (p.server, s)):
        p.do(side, side.engine.release(conn, p.now))
    _check(p)
    assert any(lgr.idle_since is not None for lgr in p.client.engine.state.lgrs.values())
