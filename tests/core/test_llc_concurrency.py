"""LLC flows that meet (Linux ``smc_llc_flow_start``, ``smc_llc_flow_parallel``,
``lgr->delayed_event``): an ADD LINK or DELETE LINK request that comes while a local flow
runs waits for its end; both sides starting ADD LINK at once; a DELETE LINK during the
server's ADD LINK flow."""

from __future__ import annotations

from smcr.core import Config, ConnectionReset, LgrType, LinkState
from smcr.wire.llc import LlcType
from tests.core.pair import Pair, Side, lgr_of, transfer
from tests.core.test_v2 import EID

ADD = Config(add_links=True)


def links(side: Side) -> list[int]:
    return [x.link_id for x in lgr_of(side).links if x.state is LinkState.LINK_ACTIVE]


def hold(p: Pair, sender: Side, llc_type: int, flags: int) -> list[bytes]:
    """Catch (and keep from the peer) the messages of that type and flags byte ``sender``
    sends from now on."""
    held: list[bytes] = []

    def drop(side: Side, data: bytes) -> bool:
        if side is sender and data[0] == llc_type and data[3] == flags:
            held.append(data)
            return True
        return False

    p.drop_llc = drop
    return held


def deliver(p: Pair, to: Side, data: bytes) -> None:
    qpn = lgr_of(to).links[0].qpn
    p.do(to, to.engine.receive_wr(qpn, memoryview(data), p.now))


def second_connection_with_confirm_rkey_held(p: Pair) -> tuple[int, int, list[bytes]]:
    """A new connection in the group: the server's answer to the client's CONFIRM RKEY is
    kept back, so the client's CONFIRM RKEY flow runs until it is delivered."""
    held = hold(p, p.server, LlcType.CONFIRM_RKEY, 0x80)
    c, s = p.connect()
    p.pump()
    assert len(held) == 1 and lgr_of(p.client).flow is not None
    p.drop_llc = lambda side, data: False
    return c, s, held


def test_delete_link_waits_for_the_clients_confirm_rkey_flow() -> None:
    """The server's DELETE LINK (it lost link 1) reaches the client while the client waits
    for its CONFIRM RKEY answer: the client answers the DELETE LINK only once that flow
    has ended; nothing is lost on either connection."""
    p = Pair(ADD, client_ports=2, server_ports=2)
    c1, s1 = p.connect()
    p.pump()
    c2, s2, held = second_connection_with_confirm_rkey_held(p)
    before = len(p.client.llc_sent)
    p.client.engine.ports_down.add(0)
    p.do(p.server, p.server.engine.port_down(0, "injected", p.now))
    assert not [m for m in p.client.llc_sent[before:] if m[0] == LlcType.DELETE_LINK]
    assert links(p.client) == [1, 2]  # not yet
    deliver(p, p.client, held[0])
    sent = [(m[0], m[3]) for m in p.client.llc_sent[before:]]
    assert sent[0] == (LlcType.DELETE_LINK, 0xA0)
    for side in (p.client, p.server):
        assert links(side) == [2]
        assert not [e for e in side.events if isinstance(e, ConnectionReset)]
    assert transfer(p, c1, s1, b"one") == b"one"
    assert transfer(p, c2, s2, b"two") == b"two"


def test_add_link_waits_for_the_clients_confirm_rkey_flow() -> None:
    """The server's ADD LINK (its port 1 came up) reaches the client during the client's
    CONFIRM RKEY flow: the client answers it after that flow; then both connections' RMBs
    are known on both links."""
    p = Pair(ADD, client_ports=2, server_ports=2)
    p.server.engine.ports_down.add(1)
    p.client.engine.ports_down.add(1)
    c1, s1 = p.connect()
    p.pump()
    assert links(p.server) == [1]  # the asymmetric offer was rejected
    c2, s2, held = second_connection_with_confirm_rkey_held(p)
    p.client.engine.ports_down.discard(1)
    before = len(p.client.llc_sent)
    p.do(p.server, p.server.engine.port_up(1, p.now))
    assert [m for m in p.client.llc_sent[before:] if m[0] == LlcType.ADD_LINK] == []
    deliver(p, p.client, held[0])
    assert [m[3] for m in p.client.llc_sent[before:] if m[0] == LlcType.ADD_LINK] == [0x80]
    for side in (p.client, p.server):
        assert lgr_of(side).lgr_type is LgrType.SYMMETRIC
        new = lgr_of(side).links[1]
        for conn in lgr_of(side).conns.values():
            assert new in conn.peer_rtoken and new in conn.rmb_keys
    for side, ids in ((p.client, (c1, c2)), (p.server, (s1, s2))):
        for conn_id in ids:
            side.engine.llc.use_link(side.engine.conns[conn_id], lgr_of(side).links[1])
    assert transfer(p, c1, s1, b"x" * 3000) == b"x" * 3000
    assert transfer(p, c2, s2, b"y" * 3000) == b"y" * 3000


def test_both_sides_start_add_link_at_once_v2() -> None:
    """v2, port 1 back on both sides at once: the server's ADD LINK and the client's
    REQUEST ADD LINK cross; the server drops the request (its flow runs), the client's
    request flow ends with the server's ADD LINK; one new link, SYMMETRIC."""
    p = Pair(ADD, client_ports=2, server_ports=2)
    p.client.engine.ueids = p.server.engine.ueids = (EID,)
    for side in (p.client, p.server):
        side.engine.ports_down.add(1)
    c, s = p.connect()
    p.pump()
    assert links(p.server) == [1]
    p.run(p.server, p.server.engine.port_up(1, p.now))
    p.run(p.client, p.client.engine.port_up(1, p.now))
    p.pump()
    assert (LlcType.REQ_ADD_LINK_V2, 0) in [(m[0], m[3]) for m in p.client.llc_sent]
    assert LlcType.REQ_ADD_LINK_V2 not in [m[0] for m in p.server.llc_sent]
    for side in (p.client, p.server):
        assert lgr_of(side).lgr_type is LgrType.SYMMETRIC
        assert links(side) == [1, 3]
        assert lgr_of(side).flow is None
    assert transfer(p, c, s, b"v2") == b"v2"


def test_delete_link_during_the_servers_add_link_flow() -> None:
    """The server waits for the answer to its ADD LINK (link 3, its port 1 back) when the
    client's DELETE LINK of link 2 arrives: the server's flow fails (link 3 cleared), the
    DELETE LINK is handled after it, and the server offers again.  Both sides settle on
    the same links, the connection intact."""
    p = Pair(ADD, client_ports=2, server_ports=2)
    p.server.engine.ports_down.add(1)
    c, s = p.connect()
    p.pump()
    assert lgr_of(p.server).lgr_type is LgrType.ASYMMETRIC_LOCAL  # links 1, 2 over port 0
    p.run(p.server, p.server.engine.port_up(1, p.now))  # ADD LINK (link 3) on its way
    link2 = lgr_of(p.client).links[1]
    p.client.engine.ports_down.add(1)  # the client's link 2 is over its port 1
    p.run(p.client, p.client.engine.port_down(1, "injected", p.now))
    p.pump()
    p.advance(ADD.llc_wait)
    p.advance(ADD.llc_wait)
    assert links(p.client) == links(p.server)
    assert 2 not in links(p.server) and link2.qpn in p.client.destroyed
    for side in (p.client, p.server):
        assert not [e for e in side.events if isinstance(e, ConnectionReset)]
        assert lgr_of(side).flow is None and lgr_of(side).remote_add is None
    assert transfer(p, c, s, b"still") == b"still"


def test_clients_delete_link_waits_for_its_running_flow() -> None:
    """The client loses link 1 while its CONFIRM RKEY flow waits for the server: its
    connections move at once, but its DELETE LINK goes only when that flow has ended
    (smcr_link_down waits for the local flow); the server then echoes it as usual."""
    p = Pair(ADD, client_ports=2, server_ports=2)
    c1, s1 = p.connect()
    p.pump()
    c2, s2, held = second_connection_with_confirm_rkey_held(p)
    before = len(p.client.llc_sent)
    p.server.engine.ports_down.add(0)
    p.do(p.client, p.client.engine.port_down(0, "injected", p.now))
    assert p.client.engine.conns[c1].link is lgr_of(p.client).links[0]
    assert links(p.client) == [2]
    assert not [m for m in p.client.llc_sent[before:] if m[0] == LlcType.DELETE_LINK]
    deliver(p, p.client, held[0])
    dels = [(m[3], m[4]) for m in p.client.llc_sent[before:] if m[0] == LlcType.DELETE_LINK]
    assert dels == [(0x20, 1), (0xA0, 1)]  # ours, then the answer to the server's echo
    for side in (p.client, p.server):
        assert links(side) == [2]
        assert not [e for e in side.events if isinstance(e, ConnectionReset)]
    assert transfer(p, c1, s1, b"one") == b"one"
    assert transfer(p, c2, s2, b"two") == b"two"
