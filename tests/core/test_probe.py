"""What the RoCE RNIC brought up: TCP ending under a live connection (the link is
probed, not trusted), and a link that cannot be set up (mixed RNIC kinds) falling back
cleanly on both sides."""

from __future__ import annotations

from smcr.core import (
    Config,
    ConnectionReset,
    FellBack,
    HandshakeCompleted,
    HandshakeFailed,
    SmcState,
)
from smcr.core.handshake import HsState
from smcr.wire.decline import DeclineCode
from tests.core.pair import Pair

TEST_LINK_REQUEST = bytes.fromhex("072c0000")


def test_probe_sends_test_link_at_once_and_an_answer_keeps_the_connection() -> None:
    p = Pair()
    c, _ = p.connect()
    p.pump()
    p.do(p.client, p.client.engine.probe_link(c, p.now))
    assert p.client.llc_sent[-1][:4] == TEST_LINK_REQUEST
    p.advance(2.5)
    assert p.client.engine.conns[c].state is SmcState.ACTIVE
    assert not any(isinstance(e, ConnectionReset) for e in p.client.events)


def test_probe_of_a_dead_peer_resets_within_llc_wait() -> None:
    p = Pair(Config(llc_wait=2.0))
    c, _ = p.connect()
    p.pump()
    p.drop_llc = lambda side, data: side is p.server  # the peer process is gone
    p.do(p.client, p.client.engine.probe_link(c, p.now))
    p.advance(2.1)
    assert any(isinstance(e, ConnectionReset) and e.conn == c for e in p.client.events)


def test_tcp_eof_while_server_waits_for_confirm_link_response_is_not_fatal() -> None:
    p = Pair()
    _, s = p.connect()
    def server_waits() -> bool:
        hs = p.server.engine.handshakes.get(s)
        return hs is not None and hs.state is HsState.CONFIRM_LINK_RESP_WAIT

    p.step_until(server_waits, "the server waits for the CONFIRM LINK response")
    # the client, done, shut its TCP down before its response reached the server
    assert p.server.engine.tcp_closed(s, p.now) == []
    p.pump()
    assert any(isinstance(e, HandshakeCompleted) for e in p.server.events)
    assert not any(isinstance(e, HandshakeFailed) for e in p.server.events)


def test_link_failing_at_setup_falls_back_both_sides_with_tcp_intact() -> None:
    """A QP that cannot reach the peer's GID (shm vs RoCE RNIC) during first contact:
    the client declines ERR_RDYLNK (Linux ``smc_connect_rdma`` when ``smc_ib_ready_link``
    fails), the server falls back on it; nobody resets or shuts the TCP connection, and
    the server sends no Decline back."""
    p = Pair()
    c, s = p.connect()
    def client_waits() -> bool:  # its QP set up (after the Accept)
        hs = p.client.engine.handshakes.get(c)
        return hs is not None and hs.state is HsState.CONFIRM_LINK_WAIT

    p.step_until(client_waits, "the client waits for CONFIRM LINK")
    hs = p.client.engine.handshakes[c]
    assert hs.link is not None
    p.sends.clear()  # the QP never carried anything
    p.do(p.client, p.client.engine.link_failed(hs.link.qpn, "RTR: not a shm GID", p.now,
                                               DeclineCode.ERR_RDYLNK))  # fmt: skip
    fell = [e for side in (p.client, p.server) for e in side.events
            if isinstance(e, FellBack)]  # fmt: skip
    assert [(e.local_code, e.peer_code) for e in fell] == [
        (DeclineCode.ERR_RDYLNK, 0), (DeclineCode.PEERDECL, DeclineCode.ERR_RDYLNK)]
    for side in (p.client, p.server):
        assert not side.released and not side.tcp_shut
        assert not any(isinstance(e, ConnectionReset) for e in side.events)
    assert len(p.server.clc_out[s]) == 68  # the Accept, and no Decline after it
