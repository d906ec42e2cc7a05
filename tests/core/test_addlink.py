"""ADD LINK (SMC-Rv1) between two engines: symmetric, asymmetric both ways, rejects.

The flow as Linux runs it (``smc_llc_srv_add_link`` / ``smc_llc_cli_add_link``):
ADD LINK request and response on the first link, ADD LINK CONTINUATION
ping-pong carrying every RMB's rkey for the new link, CONFIRM LINK over the new
link and its response.
"""

from __future__ import annotations

import dataclasses

from smcr.core import Action, Config, ConnectionReset, LgrType, LinkGroup, LinkState
from smcr.core.linkgroup import Link
from smcr.wire.llc import AddLink, AddLinkCont, ConfirmLink, DeleteLink, LlcType, decode_llc
from tests.core.pair import Pair, Side, lgr_of

ADD = Config(add_links=True)


def active(lgr: LinkGroup) -> list[Link]:
    return [x for x in lgr.links if x.state is LinkState.LINK_ACTIVE]


def llc_types(side: Side) -> list[tuple[int, int]]:
    """(type, flags byte) of every LLC message the side sent, in order."""
    return [(m[0], m[3]) for m in side.llc_sent]


def first_contact(p: Pair) -> tuple[int, int]:
    c, s = p.connect()
    p.pump()
    return c, s


def transfer_over(p: Pair, c: int, s: int, data: bytes) -> bytes:
    """Client -> server bytes through the connection's current link; what the server read."""
    n, actions = p.client.write(c, data)
    assert n == len(data)
    p.do(p.client, actions)
    got, actions = p.server.read(s)
    p.do(p.server, actions)
    return got


def test_symmetric_add_link_after_first_contact_both_roles() -> None:
    p = Pair(ADD, client_ports=2, server_ports=2)
    c, s = first_contact(p)
    srv, cli = lgr_of(p.server), lgr_of(p.client)
    for lgr in (srv, cli):
        assert lgr.lgr_type is LgrType.SYMMETRIC
        assert [(x.link_id, x.port) for x in active(lgr)] == [(1, 0), (2, 1)]
    # the server: CONFIRM LINK, ADD LINK, ADD LINK CONT, CONFIRM LINK (new link)
    assert llc_types(p.server) == [(0x01, 0x03), (0x02, 0x00), (0x03, 0x00), (0x01, 0x03)]
    # the client: CONFIRM LINK resp, ADD LINK resp, ADD LINK CONT (0x80), CONFIRM LINK resp
    assert llc_types(p.client) == [(0x01, 0x83), (0x02, 0x80), (0x03, 0x80), (0x01, 0x83)]
    assert all(len(m) == 44 and m[1] == 0x2C for m in p.server.llc_sent + p.client.llc_sent)
    s_new, c_new = srv.links[1], cli.links[1]
    server_port1 = p.server.engine.identity.ports[1]
    client_port1 = p.client.engine.identity.ports[1]
    req = decode_llc(p.server.llc_sent[1])
    assert req == AddLink(sender_mac=server_port1.mac, sender_gid=server_port1.gid,
                          sender_qp_num=s_new.qpn, link_num=2, qp_mtu=5, initial_psn=s_new.psn)
    resp = decode_llc(p.client.llc_sent[1])
    assert resp == AddLink(flags=0x80, sender_mac=client_port1.mac, sender_gid=client_port1.gid,
                           sender_qp_num=c_new.qpn, link_num=2, qp_mtu=5, initial_psn=c_new.psn)
    # the new links' QPs: each over port 1, towards the other's, RTS on both
    assert (s_new.peer_qpn, c_new.peer_qpn) == (c_new.qpn, s_new.qpn)
    assert (p.server.qp_port[s_new.qpn], p.client.qp_port[c_new.qpn]) == (1, 1)
    assert s_new.qpn in p.server.rts and c_new.qpn in p.client.rts
    # CONFIRM LINK of the new link: on its QP, with port 1's MAC/GID and link id 2
    conf = decode_llc(p.server.llc_sent[3])
    assert isinstance(conf, ConfirmLink)
    assert (conf.sender_gid, conf.sender_qp_num, conf.link_num) == (
        server_port1.gid, s_new.qpn, 2)
    conf_resp = decode_llc(p.client.llc_sent[3])
    assert isinstance(conf_resp, ConfirmLink)
    assert (conf_resp.sender_gid, conf_resp.sender_qp_num) == (client_port1.gid, c_new.qpn)
    # the rkeys exchanged: each side's RMB registered on port 1, and the peer knows that rkey
    (reg_s,) = p.server.registered
    (reg_c,) = p.client.registered
    assert reg_s[:2] == (s, 1) and reg_c[:2] == (c, 1)
    cont_s, cont_c = decode_llc(p.server.llc_sent[2]), decode_llc(p.client.llc_sent[2])
    assert isinstance(cont_s, AddLinkCont) and isinstance(cont_c, AddLinkCont)
    assert (cont_s.link_num, cont_s.num_rkeys) == (2, 1)
    assert cont_s.rkeys[0].rmb_key == p.server.rmbs[s].rkey
    assert cont_s.rkeys[0].rmb_key_new == reg_s[2]
    assert cont_c.rkeys[0].rmb_key_new == reg_c[2]
    assert p.client.engine.conns[c].peer_rtoken[c_new][0] == reg_s[2]
    assert p.server.engine.conns[s].peer_rtoken[s_new][0] == reg_c[2]


def test_connection_moved_to_the_added_link_carries_bytes_over_its_rkey() -> None:
    """The second link is usable: a connection switched to it writes with the peer RMB's
    rkey for that link and its CDC travels on the new QP."""
    p = Pair(ADD, client_ports=2, server_ports=2)
    c, s = first_contact(p)
    assert transfer_over(p, c, s, b"over link 1") == b"over link 1"
    for side, conn in ((p.client, c), (p.server, s)):
        eng = side.engine
        eng.llc.use_link(eng.conns[conn], lgr_of(side).links[1])
    conn_c = p.client.engine.conns[c]
    assert conn_c.qpn == lgr_of(p.client).links[1].qpn
    assert conn_c.peer_rkey == p.server.registered[0][2]
    sent = len(p.client.llc_sent)
    assert transfer_over(p, c, s, b"over link 2" * 100) == b"over link 2" * 100
    assert len(p.client.llc_sent) == sent  # data, not LLC


def test_rkey_exchange_ping_pong_with_several_rmbs() -> None:
    """Five server RMBs and five client RMBs: three CONTINUATIONs each way (2+2+1), every
    count the rkeys still to send including those in the message (smc_llc_add_link_cont)."""
    p = Pair(Config(), client_ports=2, server_ports=2)
    pairs = [first_contact(p) for _ in range(5)]
    for side in (p.client, p.server):
        side.engine.config = dataclasses.replace(side.engine.config, add_links=True)
    before_s, before_c = len(p.server.llc_sent), len(p.client.llc_sent)
    out: list[Action] = []
    p.server.engine.addlink.srv_add_link(lgr_of(p.server), p.now, out)
    p.do(p.server, out)
    conts_s = [AddLinkCont.decode(m) for m in p.server.llc_sent[before_s:]
               if m[0] == LlcType.ADD_LINK_CONT]  # fmt: skip
    conts_c = [AddLinkCont.decode(m) for m in p.client.llc_sent[before_c:]
               if m[0] == LlcType.ADD_LINK_CONT]  # fmt: skip
    assert [(m.num_rkeys, len(m.rkeys)) for m in conts_s] == [(5, 2), (3, 2), (1, 1)]
    assert [(m.num_rkeys, len(m.rkeys)) for m in conts_c] == [(5, 2), (3, 2), (1, 1)]
    for lgr in (lgr_of(p.server), lgr_of(p.client)):
        assert lgr.lgr_type is LgrType.SYMMETRIC and len(active(lgr)) == 2
    new_c = lgr_of(p.client).links[1]
    new_s = lgr_of(p.server).links[1]
    for c, s in pairs:
        conn_c, conn_s = p.client.engine.conns[c], p.server.engine.conns[s]
        assert conn_c.peer_rtoken[new_c] == conn_s.rmb_keys[new_s]
        assert conn_s.peer_rtoken[new_s] == conn_c.rmb_keys[new_c]


def test_server_two_ports_client_one_asymmetric() -> None:
    """The client has one RNIC: its new link is over it too (ASYMMETRIC_LOCAL); the server
    sees the same peer GID/MAC twice (ASYMMETRIC_PEER)."""
    p = Pair(ADD, client_ports=1, server_ports=2)
    first_contact(p)
    srv, cli = lgr_of(p.server), lgr_of(p.client)
    assert srv.lgr_type is LgrType.ASYMMETRIC_PEER
    assert cli.lgr_type is LgrType.ASYMMETRIC_LOCAL
    assert [x.port for x in active(srv)] == [0, 1]
    assert [x.port for x in active(cli)] == [0, 0]
    assert p.client.registered == []  # its RMB's own registration serves both links
    assert cli.links[1].peer_gid == p.server.engine.identity.ports[1].gid


def test_server_one_port_client_two_asymmetric() -> None:
    """A server with one RNIC offers, as Linux, a link over the same RNIC (ASYMMETRIC_LOCAL);
    a client with a second RNIC takes it over that one (ASYMMETRIC_PEER)."""
    p = Pair(ADD, client_ports=2, server_ports=1)
    first_contact(p)
    srv, cli = lgr_of(p.server), lgr_of(p.client)
    assert srv.lgr_type is LgrType.ASYMMETRIC_LOCAL
    assert cli.lgr_type is LgrType.ASYMMETRIC_PEER
    assert [x.port for x in active(srv)] == [0, 0]
    assert [x.port for x in active(cli)] == [0, 1]
    req = decode_llc(p.server.llc_sent[1])
    assert isinstance(req, AddLink) and req.sender_gid == p.server.engine.identity.gid


def test_no_second_port_either_side_reject() -> None:
    """Both have one RNIC: the offer comes from the path the client has, it rejects
    (02 2C 01 C0, the request echoed); the server destroys its new QP, the group stays SINGLE."""
    p = Pair(ADD)
    first_contact(p)
    srv, cli = lgr_of(p.server), lgr_of(p.client)
    assert llc_types(p.client) == [(0x01, 0x83), (0x02, 0xC0)]
    reject = p.client.llc_sent[1]
    assert reject[:4] == bytes.fromhex("022c01c0")
    assert reject[4:] == p.server.llc_sent[1][4:]
    offered = decode_llc(p.server.llc_sent[1])
    assert isinstance(offered, AddLink)
    assert offered.sender_qp_num in p.server.destroyed
    for lgr in (srv, cli):
        assert lgr.lgr_type is LgrType.SINGLE
        assert [x.link_id for x in lgr.links] == [1]
    assert p.client.registered == [] and p.server.registered == []


def test_without_add_links_nothing_offered_and_offers_rejected() -> None:
    """The default (the runtime's): a server with two ports offers nothing; a client with
    two ports still rejects an offer."""
    p = Pair(Config(), client_ports=2, server_ports=2)
    first_contact(p)
    assert llc_types(p.server) == [(0x01, 0x03)]
    link = lgr_of(p.server).links[0]
    port1 = p.server.engine.identity.ports[1]
    offer = AddLink(sender_mac=port1.mac, sender_gid=port1.gid, sender_qp_num=0x777,
                    link_num=2, qp_mtu=5, initial_psn=1)
    p.do(p.client, p.client.engine.receive_wr(lgr_of(p.client).links[0].qpn,
                                              memoryview(offer.encode()), p.now))
    assert p.client.llc_sent[-1][:4] == bytes.fromhex("022c01c0")
    assert len(lgr_of(p.client).links) == 1 and link.lgr.lgr_type is LgrType.SINGLE


def test_unanswered_add_link_clears_the_new_link_on_both_sides() -> None:
    """The client's response is lost: the server clears its new QP after llc_wait, and the
    client its own at its deadline; both groups carry on with the first link."""
    p = Pair(ADD, client_ports=2, server_ports=2)
    p.drop_llc = lambda side, data: side is p.client and data[0] == LlcType.ADD_LINK
    c, s = first_contact(p)
    srv, cli = lgr_of(p.server), lgr_of(p.client)
    assert len(srv.links) == 2 and len(cli.links) == 2
    new_s, new_c = srv.links[1].qpn, cli.links[1].qpn
    p.advance(ADD.llc_wait)
    assert new_s in p.server.destroyed and new_c in p.client.destroyed
    for lgr in (srv, cli):
        assert [x.link_id for x in lgr.links] == [1] and lgr.lgr_type is LgrType.SINGLE
        assert all(len(rt) == 1 for rt in lgr.peer_rtokens)
    assert transfer_over(p, c, s, b"still fine") == b"still fine"


def test_unanswered_confirm_link_on_new_link_deletes_it() -> None:
    """CONFIRM LINK over the new link gets no answer: the server sends DELETE LINK for it
    (lost path, smc_llc_srv_conf_link) on the first link and destroys its QP."""
    p = Pair(ADD, client_ports=2, server_ports=2)
    p.drop_llc = lambda side, data: (side is p.client and data[0] == LlcType.CONFIRM_LINK
                                     and bool(data[3] & 0x80) and len(side.llc_sent) > 1)
    first_contact(p)
    srv = lgr_of(p.server)
    new_s = srv.links[1].qpn
    p.advance(ADD.llc_wait)
    assert new_s not in p.server.destroyed  # SMC_LLC_WAIT_FIRST_TIME, not SMC_LLC_WAIT_TIME
    p.advance(ADD.llc_wait_confirm - ADD.llc_wait)
    assert new_s in p.server.destroyed
    last = decode_llc(p.server.llc_sent[-1])
    assert last == DeleteLink(flags=0, link_num=2, reason=0x00010000)
    assert [x.link_id for x in srv.links] == [1]


def test_connection_made_during_add_link_gets_rkeys_for_both_links() -> None:
    """A second connection whose handshake runs while the rkey exchange of ADD LINK is under
    way: its CONFIRM RKEY waits for the ADD LINK flow (both sides, as Linux
    smc_llc_flow_start) and then names the new link too, so each side knows the other's
    RMB on both links."""
    p = Pair(ADD, client_ports=2, server_ports=2)
    p.connect()
    def exchanging_rkeys() -> bool:  # the first contact's ADD LINK at its rkey exchange
        lgrs = p.server.engine.lgrs
        flow = next(iter(lgrs.values())).flow if lgrs else None
        return flow is not None and flow.add_link is not None and flow.add_link.step == "cont"

    p.step_until(exchanging_rkeys, "the ADD LINK flow's rkey exchange")
    c2, s2 = p.connect()
    p.pump()
    srv, cli = lgr_of(p.server), lgr_of(p.client)
    assert srv.lgr_type is LgrType.SYMMETRIC and cli.lgr_type is LgrType.SYMMETRIC
    conn_c, conn_s = p.client.engine.conns[c2], p.server.engine.conns[s2]
    for link_c, link_s in zip(cli.links, srv.links, strict=True):
        assert conn_c.peer_rtoken[link_c] == conn_s.rmb_keys[link_s]
        assert conn_s.peer_rtoken[link_s] == conn_c.rmb_keys[link_c]
    rkeys = [decode_llc(m) for m in p.server.llc_sent if m[0] == LlcType.CONFIRM_RKEY
             and not m[3] & 0x80]  # fmt: skip
    assert [len(m.other_rtokens) for m in rkeys] == [1]  # type: ignore[attr-defined]


def link_id(side: Side, conn: int) -> int:
    link = side.engine.conns[conn].link
    assert link is not None
    return link.link_id


def test_new_connections_alternate_between_the_links() -> None:
    """The server puts each new connection on the link with fewer connections, the first
    on a tie (as smcr_lgr_conn_assign_link: even count first, odd the second); the client
    follows the link the Accept names (its QPN and the server port's GID); bytes flow on
    each."""
    p = Pair(ADD, client_ports=2, server_ports=2)
    pairs = [first_contact(p) for _ in range(4)]
    srv, cli = lgr_of(p.server), lgr_of(p.client)
    assert [link_id(p.server, s) for _c, s in pairs] == [1, 2, 1, 2]
    assert [link_id(p.client, c) for c, _s in pairs] == [1, 2, 1, 2]
    assert srv.lgr_type is cli.lgr_type is LgrType.SYMMETRIC
    for c, s in pairs:
        assert transfer_over(p, c, s, b"balanced %d" % c) == b"balanced %d" % c


def test_a_new_connection_goes_to_the_least_used_link() -> None:
    """Four connections alternate over the two links; the two on link 1 end; the next
    two go to link 1, which then carries none (Linux's parity of the connection count
    would put the second on link 2, leaving link 1 with one and link 2 with three)."""
    p = Pair(ADD, client_ports=2, server_ports=2)
    pairs = [first_contact(p) for _ in range(4)]
    assert [link_id(p.server, s) for _c, s in pairs] == [1, 2, 1, 2]
    for c, s in (pairs[0], pairs[2]):  # both ends close: the connections go
        p.do(p.client, p.client.engine.close(c, p.now))
        p.do(p.server, p.server.engine.close(s, p.now))
        p.pump()
    assert len(lgr_of(p.server).conns) == 2
    more = [first_contact(p) for _ in range(2)]
    assert [link_id(p.server, s) for _c, s in more] == [1, 1]
    assert [link_id(p.client, c) for c, _s in more] == [1, 1]
    for c, s in more:
        assert transfer_over(p, c, s, b"least used %d" % c) == b"least used %d" % c


def test_asymmetric_link_takes_no_new_connections() -> None:
    """The asymmetric link (server one port, ASYMMETRIC_LOCAL) is skipped: every new
    connection goes to link 1 (Linux: link_is_asym)."""
    p = Pair(ADD, client_ports=2, server_ports=1)
    pairs = [first_contact(p) for _ in range(3)]
    assert lgr_of(p.server).lgr_type is LgrType.ASYMMETRIC_LOCAL
    assert lgr_of(p.server).links[1].is_asym
    assert [link_id(p.server, s) for _c, s in pairs] == [1, 1, 1]


def test_client_answers_delete_link_instead_of_confirm_link_and_rejects() -> None:
    """The server's CONFIRM LINK over the new link is lost: the server gives up and sends
    DELETE LINK for link 2 (04 2C 00 00, lost path); the client, still waiting for CONFIRM
    LINK, echoes it as answer (04 2C 00 80, reason kept), clears its new link and rejects
    the offer after all (02 2C 01 C0), as smc_llc_cli_conf_link and out_clear_lnk."""
    quick = dataclasses.replace(ADD, llc_wait_confirm=1.0)  # the server gives up first
    p = Pair(ADD, server_config=quick, client_ports=2, server_ports=2)
    p.drop_llc = lambda side, data: (side is p.server and data[0] == LlcType.CONFIRM_LINK
                                     and len(side.llc_sent) > 1)
    first_contact(p)
    c_new = lgr_of(p.client).links[1]
    sent = len(p.client.llc_sent)
    p.advance(quick.llc_wait_confirm)
    assert [m[:9].hex() for m in p.client.llc_sent[sent:]] == [
        "042c008002" + "00010000", "022c01c0" + p.server.llc_sent[1][4:9].hex()]
    assert c_new.qpn in p.client.destroyed
    for side in (p.client, p.server):
        assert [x.link_id for x in lgr_of(side).links] == [1]
        assert lgr_of(side).lgr_type is LgrType.SINGLE


def test_link_failure_in_an_asymmetric_local_group_ends_it() -> None:
    """Both of the server's links are over its one port (ASYMMETRIC_LOCAL): a link failure
    is a device error, and Linux's smc_switch_conns moves nothing to a link of the same
    port: the group ends."""
    p = Pair(ADD, client_ports=2, server_ports=1)
    _c, s = first_contact(p)
    assert lgr_of(p.server).lgr_type is LgrType.ASYMMETRIC_LOCAL
    link1 = lgr_of(p.server).links[0]
    p.do(p.server, p.server.engine.link_failed(link1.qpn, "injected", p.now))
    assert not p.server.engine.lgrs
    assert [e.conn for e in p.server.events if isinstance(e, ConnectionReset)] == [s]


def test_second_link_only_over_a_port_of_the_same_pnetid() -> None:
    """smc_pnet_find_alt_roce: the alternate RNIC must have the group's PNET ID; a port of
    another PNET ID is passed over for the next one that matches."""
    p = Pair(ADD, client_ports=2, server_ports=3)
    ident = p.server.engine.identity
    more = (dataclasses.replace(ident.more_ports[0], pnetid="OTHERNET"), ident.more_ports[1])
    p.server.engine.identity = dataclasses.replace(ident, more_ports=more)
    first_contact(p)
    assert [(x.link_id, x.port) for x in active(lgr_of(p.server))] == [(1, 0), (2, 2)]
    assert lgr_of(p.server).lgr_type is LgrType.SYMMETRIC
