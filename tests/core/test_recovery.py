"""A link added again: after DELETE LINK, when a port is usable again (``port_up``), and
the asymmetric link replaced once a symmetric one exists (Linux ``smcr_port_add``,
``smc_llc_add_link_local``, ``smc_llc_cli_add_link_invite``, ``smc_llc_delete_asym_link``).
"""

from __future__ import annotations

from smcr.core import Config, ConnectionReset, LgrType, LinkAdded, LinkRemoved, LinkState
from smcr.wire.llc import AddLink, DeleteLink, LlcType, decode_llc
from tests.core.pair import Pair, Side, lgr_of, transfer
from tests.core.test_llc_concurrency import deliver, hold

ADD = Config(add_links=True)


def links(side: Side) -> list[tuple[int, int]]:
    """(link id, port) of the side's active links."""
    return [(x.link_id, x.port) for x in lgr_of(side).links if x.state is LinkState.LINK_ACTIVE]


def symmetric(client_ports: int = 2, server_ports: int = 2) -> tuple[Pair, int, int]:
    p = Pair(ADD, client_ports=client_ports, server_ports=server_ports)
    c, s = p.connect()
    p.pump()
    return p, c, s


def path0_down(p: Pair) -> None:
    """Port 0 goes down on both sides at once (a cable, a veth pair): each fails link 1."""
    p.run(p.server, p.server.engine.port_down(0, "carrier lost", p.now))
    p.run(p.client, p.client.engine.port_down(0, "carrier lost", p.now))
    p.pump()


def new_messages(side: Side, since: int) -> list[bytes]:
    return side.llc_sent[since:]


def test_path_down_both_detect_then_single_on_link2() -> None:
    """Both sides lose port 0 at once: each moves its connection to link 2; the client's
    DELETE LINK is dropped by the server (its own DELETE LINK flow runs, and link 1 is gone
    already), the client answers the server's with 'no such link'; the server's offer of a
    link again (asymmetric, over its port 1) is rejected: the client has no other port."""
    p, c, s = symmetric()
    path0_down(p)
    for side in (p.client, p.server):
        assert links(side) == [(2, 1)]
        assert lgr_of(side).lgr_type is LgrType.SINGLE
        assert not [e for e in side.events if isinstance(e, ConnectionReset)]
    adds = [AddLink.decode(m) for m in p.server.llc_sent if m[0] == LlcType.ADD_LINK]
    assert [(a.link_num, a.sender_gid) for a in adds] == [
        (2, p.server.engine.identity.ports[1].gid), (3, p.server.engine.identity.ports[1].gid)]
    assert p.client.llc_sent[-1][:4] == bytes.fromhex("022c01c0")
    assert transfer(p, c, s, b"on link 2") == b"on link 2"


def test_port_up_server_adds_the_link_again() -> None:
    """Port 0 comes back on both sides: the server's port_up starts ADD LINK (link 3, over
    its port 0, to the client's port 0); the client's invitation crossing it is dropped
    (one ADD LINK flow at a time); the group is SYMMETRIC again and carries bytes."""
    p, c, s = symmetric()
    path0_down(p)
    before = len(p.server.llc_sent)
    p.run(p.server, p.server.engine.port_up(0, p.now))
    p.run(p.client, p.client.engine.port_up(0, p.now))
    p.pump()
    for side in (p.client, p.server):  # link 3 was the offer rejected after the failure
        assert links(side) == [(2, 1), (4, 0)]
        assert lgr_of(side).lgr_type is LgrType.SYMMETRIC
    add = decode_llc(new_messages(p.server, before)[0])
    port0 = p.server.engine.identity.ports[0]
    assert isinstance(add, AddLink) and not add.is_response
    assert (add.link_num, add.sender_gid, add.sender_mac) == (4, port0.gid, port0.mac)
    assert transfer(p, c, s, b"again" * 1000) == b"again" * 1000
    # a connection made now lands on either link, and the peer knows its rkey on both
    c2, s2 = p.connect()
    p.pump()
    assert transfer(p, c2, s2, b"second") == b"second"


def test_client_port_up_sends_invitation_and_server_adds() -> None:
    """Only the client learns that its port is back (the server's never went): its ADD
    LINK invitation carries only that port's MAC and GID (02 2C 00 00, QPN/link/MTU/PSN 0);
    the server answers it with its own ADD LINK flow."""
    p, c, s = symmetric()
    path0_down(p)
    p.server.engine.ports_down.discard(0)  # the server's port was never reported down
    before = len(p.client.llc_sent)
    p.do(p.client, p.client.engine.port_up(0, p.now))
    invite = new_messages(p.client, before)[0]
    port0 = p.client.engine.identity.ports[0]
    assert invite == (bytes.fromhex("022c0000") + port0.mac + bytes(2) + port0.gid
                      + bytes(16))  # fmt: skip
    for side in (p.client, p.server):
        assert links(side) == [(2, 1), (4, 0)]
        assert lgr_of(side).lgr_type is LgrType.SYMMETRIC
    assert transfer(p, c, s, b"x" * 5000) == b"x" * 5000


def test_port_up_without_add_links_does_nothing() -> None:
    p = Pair(Config(), client_ports=2, server_ports=2)
    p.connect()
    p.pump()
    before = (len(p.client.llc_sent), len(p.server.llc_sent))
    p.do(p.server, p.server.engine.port_up(1, p.now))
    p.do(p.client, p.client.engine.port_up(1, p.now))
    assert (len(p.client.llc_sent), len(p.server.llc_sent)) == before
    assert links(p.server) == [(1, 0)]


def test_port_down_of_the_only_link_ends_the_group() -> None:
    p, _c, s = symmetric(client_ports=1, server_ports=1)  # the offer rejected: one link
    assert lgr_of(p.server).lgr_type is LgrType.SINGLE
    p.do(p.server, p.server.engine.port_down(0, "gone", p.now))
    assert not p.server.engine.lgrs
    assert [e.conn for e in p.server.events if isinstance(e, ConnectionReset)] == [s]


def test_link_failure_with_ports_up_server_adds_again_at_once() -> None:
    """A link fails but every port stays usable (e.g. its TEST LINK went unanswered): after
    the DELETE LINK the server offers a link again right away (smc_llc_add_link_local at
    the end of smc_llc_process_srv_delete_link), symmetric over its port 0."""
    p, c, s = symmetric()
    link1 = lgr_of(p.client).links[0]
    p.do(p.client, p.client.engine.link_failed(link1.qpn, "injected", p.now))
    for side in (p.client, p.server):
        assert links(side) == [(2, 1), (3, 0)]
        assert lgr_of(side).lgr_type is LgrType.SYMMETRIC
    assert transfer(p, c, s, b"fine") == b"fine"


def test_asymmetric_link_replaced_when_the_port_comes_up() -> None:
    """The server's port 1 is down at first contact: its second link goes over port 0 too
    (ASYMMETRIC_LOCAL).  Port 1 up: a third link, symmetric, then the asymmetric one is
    deleted (DELETE LINK 04 2C 00 20, reason 0x00050000 'no longer needed'), its
    connections moved first."""
    p = Pair(ADD, client_ports=2, server_ports=2)
    p.server.engine.ports_down.add(1)
    c, s = p.connect()
    p.pump()
    assert lgr_of(p.server).lgr_type is LgrType.ASYMMETRIC_LOCAL
    assert links(p.server) == [(1, 0), (2, 0)]
    assert links(p.client) == [(1, 0), (2, 1)]
    asym = lgr_of(p.server).links[1]
    assert asym.is_asym
    # a connection on the asymmetric link, to see it moved
    p.server.engine.llc.use_link(p.server.engine.conns[s], asym)
    p.do(p.server, p.server.engine.port_up(1, p.now))
    for side in (p.client, p.server):
        assert links(side) == [(1, 0), (3, 1)]
        assert lgr_of(side).lgr_type is LgrType.SYMMETRIC
    dels = [decode_llc(m) for m in p.server.llc_sent if m[0] == LlcType.DELETE_LINK]
    assert dels == [DeleteLink(flags=0x20, link_num=2, reason=0x00050000)]
    resp = [decode_llc(m) for m in p.client.llc_sent if m[0] == LlcType.DELETE_LINK]
    assert resp == [DeleteLink(flags=0xA0, link_num=2, reason=0)]
    assert asym.qpn in p.server.destroyed
    assert p.server.engine.conns[s].link is not asym
    assert transfer(p, c, s, b"moved") == b"moved"


def test_asymmetric_link_failing_while_it_is_deleted_ends_nothing() -> None:
    """The asymmetric link's QP fails while the server's DELETE LINK of it waits for the
    client's answer (the client answered and destroyed its QP; the server's QP saw the
    peer go first): the link is not active any more, so as Linux's
    ``smcr_link_down_cond`` nothing happens; the group goes on, SYMMETRIC, when the
    answer comes."""
    p = Pair(ADD, client_ports=2, server_ports=2)
    p.server.engine.ports_down.add(1)
    c, s = p.connect()
    p.pump()
    asym = lgr_of(p.server).links[1]
    assert asym.is_asym
    p.server.engine.llc.use_link(p.server.engine.conns[s], asym)
    p.run(p.server, p.server.engine.port_up(1, p.now))
    p.step_until(lambda: asym.state is LinkState.LINK_INACTIVE, "the asymmetric link deleted")
    p.run(p.server, p.server.engine.link_failed(asym.qpn, "receive WR_FLUSH_ERR", p.now))
    p.pump()
    for side in (p.client, p.server):
        assert links(side) == [(1, 0), (3, 1)]
        assert lgr_of(side).lgr_type is LgrType.SYMMETRIC and not lgr_of(side).terminated
        assert not [e for e in side.events if isinstance(e, ConnectionReset)]
    assert asym.qpn in p.server.destroyed
    assert transfer(p, c, s, b"moved") == b"moved"


def test_offer_failing_in_the_rkey_exchange_tells_the_client_and_the_next_one_is_taken() -> None:
    """The server's port 0 goes (the client has not noticed): its asymmetric offer, link 3
    from its port 1 to the client's port 0, is answered, then its new QP fails during the
    rkey exchange (over RoCE: no route from one veth to the other).  The client is told
    by DELETE LINK of link 3 and ends its flow at once; when port 0 is back, the server's
    offer of link 4 is taken (the client's late reject of link 3 does not end it) and
    the group is SYMMETRIC again."""
    p, c, s = symmetric()
    p.run(p.server, p.server.engine.port_down(0, "carrier lost", p.now))
    lgr = lgr_of(p.server)
    p.step_until(lambda: lgr.flow is not None and lgr.flow.add_link is not None
                 and lgr.flow.add_link.step == "cont", "the server's offer answered")
    assert lgr.flow is not None and lgr.flow.add_link is not None
    new = lgr.flow.add_link.new
    assert (new.link_id, new.port) == (3, 1)
    sent = len(p.server.llc_sent)
    p.run(p.server, p.server.engine.link_failed(new.qpn, "RTR: network unreachable", p.now))
    dels = [decode_llc(m) for m in new_messages(p.server, sent) if m[0] == LlcType.DELETE_LINK]
    assert dels == [DeleteLink(flags=0, link_num=3, reason=0x00010000)]
    p.do(p.server, p.server.engine.port_up(0, p.now))
    for side in (p.client, p.server):
        assert lgr_of(side).remote_add is None
        assert links(side) == [(2, 1), (4, 0)]
        assert lgr_of(side).lgr_type is LgrType.SYMMETRIC
        assert not [e for e in side.events if isinstance(e, ConnectionReset)]
    assert transfer(p, c, s, b"back") == b"back"


def test_port_back_while_the_asymmetric_offer_runs_is_offered_after_it() -> None:
    """The server's port 1 is down at first contact: it offers an asymmetric link over port
    0.  Port 1 comes back while that flow runs (its own offer dropped: one ADD LINK flow
    at a time): once the asymmetric link is up, the symmetric one is offered and the
    asymmetric one deleted."""
    p = Pair(ADD, client_ports=2, server_ports=2)
    p.server.engine.ports_down.add(1)
    c, s = p.connect()
    lgr = p.server.engine.lgrs
    p.step_until(lambda: any(g.flow is not None and g.flow.add_link is not None
                             and g.flow.add_link.step == "cont" for g in lgr.values()),
                 "the asymmetric offer answered")  # fmt: skip
    p.run(p.server, p.server.engine.port_up(1, p.now))
    p.pump()
    for side in (p.client, p.server):
        assert links(side) == [(1, 0), (3, 1)]
        assert lgr_of(side).lgr_type is LgrType.SYMMETRIC
    assert transfer(p, c, s, b"both ports") == b"both ports"


def test_delete_rkey_names_the_rmb_by_its_rkey_on_the_link_it_goes_over() -> None:
    """After link 1 is gone the group talks over link 2: a released RMB's DELETE RKEY
    carries its rkey for link 2 (smc_llc_send_delete_rkey), which the peer knows there:
    the answer is positive and the peer forgets the RMB."""
    p, c, s = symmetric()
    c2, s2 = p.connect()
    p.pump()
    path0_down(p)
    rkey2 = p.client.engine.conns[c2].rmb_keys[lgr_of(p.client).links[0]][0]
    assert rkey2 != p.client.rmbs[c2].rkey
    before = len(p.client.llc_sent)
    known = len(lgr_of(p.server).peer_rtokens)
    for side, conn in ((p.client, c2), (p.server, s2)):
        p.do(side, side.engine.close(conn, p.now))
    dels = [m for m in p.client.llc_sent[before:] if m[0] == LlcType.DELETE_RKEY]
    assert dels and dels[0][8:12] == rkey2.to_bytes(4, "big")
    answers = [m for m in p.server.llc_sent if m[0] == LlcType.DELETE_RKEY and m[3] & 0x80]
    assert answers and not answers[-1][3] & 0x20  # positive
    assert len(lgr_of(p.server).peer_rtokens) == known - 1
    assert transfer(p, c, s, b"left") == b"left"


def test_link_added_again_over_a_port_reuses_the_rmb_registration() -> None:
    """Port 1 goes and comes back: the new link over it uses the RMB registration the host
    made for the first link over port 1 (register_rmb is asked once per RMB and port)."""
    p, c, s = symmetric()
    assert [r[:2] for r in p.server.registered] == [(s, 1)]
    p.run(p.server, p.server.engine.port_down(1, "carrier lost", p.now))
    p.run(p.client, p.client.engine.port_down(1, "carrier lost", p.now))
    p.pump()
    assert links(p.server) == [(1, 0)]
    p.run(p.server, p.server.engine.port_up(1, p.now))
    p.run(p.client, p.client.engine.port_up(1, p.now))
    p.pump()
    assert [lid for lid, port in links(p.server) if port == 1]
    assert [r[:2] for r in p.server.registered] == [(s, 1)]
    assert [r[:2] for r in p.client.registered] == [(c, 1)]
    for side, conn in ((p.client, c), (p.server, s)):
        side.engine.llc.use_link(side.engine.conns[conn], lgr_of(side).links[1])
    assert transfer(p, c, s, b"over port 1 again") == b"over port 1 again"


def test_new_connection_while_port0_is_down_joins_the_group_over_port1() -> None:
    """Port 0 down on both sides: a new connection's Proposal names the client's port 1
    (Linux takes an RNIC whose port is active), so the server finds the group by its
    surviving link and the Accept names that link (the server's port 1 GID); no new group."""
    p, c, s = symmetric()
    path0_down(p)
    c2, s2 = p.connect()
    p.pump()
    assert len(p.server.engine.lgrs) == len(p.client.engine.lgrs) == 1
    proposal = bytes(p.client.clc_out[c2])
    port1 = p.client.engine.identity.ports[1]
    assert port1.gid in proposal and port1.mac in proposal
    assert p.server.engine.conns[s2].link is lgr_of(p.server).links[0]
    assert transfer(p, c2, s2, b"joined") == b"joined"
    assert transfer(p, c, s, b"old") == b"old"


def test_first_contact_while_port0_is_down_starts_on_port1() -> None:
    """No group yet and port 0 down on both sides: the first link goes over port 1 of
    each, and CLC names those ports."""
    p = Pair(ADD, client_ports=2, server_ports=2)
    for side in (p.client, p.server):
        side.engine.ports_down.add(0)
    c, s = p.connect()
    p.pump()
    for side in (p.client, p.server):
        assert links(side) == [(1, 1)]
        assert lgr_of(side).lgr_type is LgrType.SINGLE  # no other usable port: rejected
    assert transfer(p, c, s, b"port 1") == b"port 1"


def test_link_events_for_the_host() -> None:
    """The host hears of links that come and go in a living group: LinkRemoved (with the
    reason) when port 0 goes, LinkAdded (with the group's new type) when it is back."""
    p, _c, _s = symmetric()
    added = [e for e in p.server.events if isinstance(e, LinkAdded)]
    assert added == [LinkAdded(lgr_id=lgr_of(p.server).lgr_id, link_id=2, port=1,
                               lgr_type="SYMMETRIC")]
    path0_down(p)
    for side in (p.server, p.client):
        removed = [e for e in side.events if isinstance(e, LinkRemoved)]
        assert [(e.link_id, e.port) for e in removed] == [(1, 0)]
        assert "port 0 down" in removed[0].reason
    p.run(p.server, p.server.engine.port_up(0, p.now))
    p.run(p.client, p.client.engine.port_up(0, p.now))
    p.pump()
    for side in (p.server, p.client):
        added = [e for e in side.events if isinstance(e, LinkAdded)]
        assert [(e.link_id, e.port, e.lgr_type) for e in added] == [(2, 1, "SYMMETRIC"),
                                                                     (4, 0, "SYMMETRIC")]


def ask_overtakes_the_confirmation(p: Pair) -> tuple[bytes, bytes]:
    """Only the client's port 0 fails: the server replaces link 1 by an asymmetric link 3
    (its port 0 to the client's port 1).  The port is back while that flow runs: the
    client's ask for a link (v1 invitation, v2 REQUEST ADD LINK) waits for the flow's end,
    then goes out on link 2 right behind its CONFIRM LINK response on link 3, two QPs
    with no order between them; here the ask is delivered first.  Returns (the
    confirmation, the ask), both still to be delivered."""
    p.run(p.client, p.client.engine.port_down(0, "carrier lost", p.now))
    lgr = lgr_of(p.client)
    p.step_until(lambda: lgr.remote_add is not None and lgr.remote_add.step == "confirm",
                 "the client answered the asymmetric offer")  # fmt: skip
    p.run(p.client, p.client.engine.port_up(0, p.now))  # waits for the server's flow
    p.step_until(lambda: lgr.remote_add is None, "the client confirmed link 3")
    *_, confirmed, ask = p.sends
    p.sends.remove(ask)
    p.sends.appendleft(ask)
    return confirmed[2], ask[2]


def test_invitation_overtaking_the_asymmetric_links_confirmation_is_taken_up() -> None:
    """:func:`ask_overtakes_the_confirmation`, v1: the invitation meets the server's
    running ADD LINK flow (one at a time: not taken then); once the asymmetric link is
    up the server takes it up (Linux would leave the group asymmetric until the next
    port event), and the group is SYMMETRIC again."""
    p, c, s = symmetric()
    confirmed, invite = ask_overtakes_the_confirmation(p)
    assert decode_llc(confirmed).TYPE == LlcType.CONFIRM_LINK
    assert decode_llc(invite) == AddLink(sender_mac=p.client.engine.identity.ports[0].mac,
                                         sender_gid=p.client.engine.identity.ports[0].gid)
    p.pump()
    for side in (p.client, p.server):
        assert links(side) == [(2, 1), (4, 0)]
        assert lgr_of(side).lgr_type is LgrType.SYMMETRIC
    assert transfer(p, c, s, b"y" * 5000) == b"y" * 5000


def _one_subnet_per_path(p: Pair) -> None:
    """Each port reaches only the peer's port of the same index (a veth pair per path)."""
    server_gids = [x.gid for x in p.server.engine.identity.ports]
    client_gids = [x.gid for x in p.client.engine.identity.ports]
    p.client.reach = lambda port, gid: gid == server_gids[port]
    p.server.reach = lambda port, gid: gid == client_gids[port]


def _rkey_exchange_answer_held(p: Pair) -> list[bytes]:
    """Path 0 fails and comes back (the server sees it first: its offer goes to a client
    whose port is still down, and is rejected; the client's port back invites the offer
    that counts), and the client's ADD LINK CONTINUATION answers are kept back."""
    for _ in range(6):  # three rkey exchange round trips
        p.connect()
        p.pump()
    path0_down(p)
    assert links(p.server) == links(p.client) == [(2, 1)]
    p.do(p.server, p.server.engine.port_up(0, p.now))
    held = hold(p, p.client, LlcType.ADD_LINK_CONT, 0x80)
    p.do(p.client, p.client.engine.port_up(0, p.now))
    flow = lgr_of(p.server).flow
    assert flow is not None and flow.add_link is not None and flow.add_link.step == "cont"
    assert len(held) == 1
    return held


def test_an_rkey_exchange_answer_late_behind_a_busy_link_still_adds_the_link() -> None:
    """After a failover the one link left carries every connection's bytes, and the
    client's answers in the rkey exchange come later than ``llc_wait`` while that link
    delivers: both ends wait on, as for the other LLC flows, and the link is added when
    the answer comes (the offer used to fail at ``llc_wait``, and with no port event to
    come the group stayed at one link)."""
    p = Pair(ADD, client_ports=2, server_ports=2)
    _one_subnet_per_path(p)
    held = _rkey_exchange_answer_held(p)
    old = lgr_of(p.server).links[0]
    assert old.link_id == 2
    for _ in range(8):  # 4 s: past llc_wait, the old link delivering throughout
        p.advance(0.5)
        for side in (p.server, p.client):
            side.engine.link_delivered(lgr_of(side).links[0].qpn, p.now)
    assert lgr_of(p.server).flow is not None and lgr_of(p.client).remote_add is not None
    p.drop_llc = lambda side, data: False
    deliver(p, p.server, held[0])
    p.pump()
    assert links(p.server) == links(p.client)
    assert [port for _, port in links(p.server)] == [1, 0]
    assert lgr_of(p.server).lgr_type is lgr_of(p.client).lgr_type is LgrType.SYMMETRIC


def test_an_rkey_exchange_answer_that_never_comes_on_a_silent_link_fails_the_offer() -> None:
    """The same, but the old link shows no sign of life: the offer fails ``llc_wait`` after
    its last step, as before (no endless wait), and the group goes on on its one link."""
    p = Pair(ADD, client_ports=2, server_ports=2)
    _one_subnet_per_path(p)
    _rkey_exchange_answer_held(p)
    p.advance(2.5)
    flow = lgr_of(p.server).flow
    assert flow is None or flow.add_link is None
    p.advance(2.5)
    assert lgr_of(p.client).remote_add is None
    assert links(p.server) == links(p.client) == [(2, 1)]
