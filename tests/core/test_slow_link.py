"""LLC waits over a slow link (heavy loss): a link that still delivers is waited on, a silent
one is given up on after ``llc_wait`` as in Linux (:meth:`LinkLayer.wait_more
<smcr.core.llc.LinkLayer.wait_more>`).

The host says the link delivers with :meth:`Engine.link_delivered
<smcr.core.engine.Engine.link_delivered>` (its QP's PSNs moved: RC retransmissions
getting data through); a message received or a send of ours completing says it too.
"""

from __future__ import annotations

from smcr.core import Config, ConnectionReset, SmcState
from smcr.wire.llc import LlcType
from tests.core.pair import Pair, Side, lgr_of
from tests.core.test_llc_concurrency import deliver, hold

CFG = Config(llc_wait=2.0, llc_wait_heard=10.0)


def _reset(side: Side, conn: int) -> bool:
    c = side.engine.conns.get(conn)
    return (c is not None and c.aborted) or any(
        isinstance(e, ConnectionReset) and e.conn == conn for e in side.events)


def delivering(p: Pair, side: Side, seconds: float, every: float = 0.5) -> None:
    """Let ``seconds`` pass with ``side``'s link delivering all along (to the end)."""
    qpn = lgr_of(side).links[0].qpn
    for _ in range(round(seconds / every)):
        p.advance(every)
        side.engine.link_delivered(qpn, p.now)


def rkey_answer_held(p: Pair) -> tuple[int, int, list[bytes]]:
    """A second connection whose CONFIRM RKEY answer from the client is kept back."""
    p.connect()
    p.pump()
    held = hold(p, p.client, LlcType.CONFIRM_RKEY, 0x80)
    c2, s2 = p.connect()
    p.pump()
    assert held
    return c2, s2, held


def test_confirm_rkey_answer_later_than_llc_wait_on_a_delivering_link_keeps_the_connection(
) -> None:  # fmt: skip
    p = Pair(CFG)
    c2, s2, held = rkey_answer_held(p)
    delivering(p, p.server, 6.0)  # three times llc_wait: the answer is stuck behind data
    assert not _reset(p.server, s2) and not _reset(p.client, c2)
    deliver(p, p.server, held[0])
    p.advance(CFG.llc_wait_heard)
    assert not _reset(p.server, s2) and not _reset(p.client, c2)
    assert p.server.engine.conns[s2].state is SmcState.ACTIVE
    assert lgr_of(p.server).flow is None  # the flow ended with the answer


def test_confirm_rkey_unanswered_on_a_link_gone_silent_aborts_llc_wait_after_its_last_sign(
) -> None:  # fmt: skip
    p = Pair(CFG)
    c2, s2, _ = rkey_answer_held(p)
    delivering(p, p.server, 3.0)
    p.advance(CFG.llc_wait - 0.1)  # silent from here on
    assert not _reset(p.server, s2)
    p.advance(0.2)
    assert _reset(p.server, s2) and _reset(p.client, c2)


def test_confirm_rkey_unanswered_after_the_peer_ended_its_stream_keeps_its_last_bytes(
) -> None:  # fmt: skip
    """The flow ran behind slow data until after the peer had written its last bytes and
    closed, and the peer's process then exited: nothing answers, but the peer needs the
    rkey no more, and its bytes are read to EOF, not thrown away by an abort."""
    p = Pair(CFG)
    c2, s2, _ = rkey_answer_held(p)
    n, actions = p.client.write(c2, b"the last words", p.now)
    p.do(p.client, actions)
    p.do(p.client, p.client.engine.close(c2, p.now))
    p.pump()
    assert n == 14 and p.server.engine.conns[s2].peer_finished
    p.advance(CFG.llc_wait + 0.5)  # silent from here on: the flow gives up
    assert lgr_of(p.server).flow is None
    assert not _reset(p.server, s2)
    data, _ = p.server.read(s2)
    assert data == b"the last words"
    assert p.server.engine.conns[s2].peer_done


def test_confirm_rkey_never_answered_on_a_delivering_link_aborts_at_llc_wait_heard() -> None:
    p = Pair(CFG)
    c2, s2, _ = rkey_answer_held(p)
    delivering(p, p.server, CFG.llc_wait_heard - 0.5)
    assert not _reset(p.server, s2)
    delivering(p, p.server, 1.0)
    assert _reset(p.server, s2) and _reset(p.client, c2)
    assert len(p.server.engine.lgrs) == 1  # the group itself stays


def test_unanswered_test_link_on_a_delivering_link_keeps_it_a_silent_one_fails() -> None:
    p = Pair(CFG)
    c, _ = p.connect()
    p.pump()
    held = hold(p, p.server, LlcType.TEST_LINK, 0x80)  # the answers are stuck or lost
    p.do(p.client, p.client.engine.probe_link(c, p.now))
    delivering(p, p.client, 4.0)
    assert held and not _reset(p.client, c)
    assert lgr_of(p.client).links[0].test_deadline is not None  # still waiting
    p.advance(CFG.llc_wait + 0.1)  # the link went silent: down, as in Linux
    assert _reset(p.client, c)


def test_link_delivered_on_an_unknown_qp_changes_nothing() -> None:
    p = Pair(CFG)
    p.connect()
    p.pump()
    (link,) = lgr_of(p.client).links
    before = link.last_delivered
    p.client.engine.link_delivered(link.qpn + 1, p.now + 5.0)
    assert link.last_delivered == before
