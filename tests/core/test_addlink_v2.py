"""ADD LINK in SMC-Rv2 link groups: the rkeys in the ADD LINK itself (no CONTINUATION),
REQUEST ADD LINK, and the v2.1 max links that decides whether a link is offered (Linux
``smc_llc_fill_ext_v2``, ``smc_llc_save_add_link_rkeys``, ``smc_llc_send_request_add_link``,
``smcr_serv_conf_first_link``)."""

from __future__ import annotations

from smcr.core import Config, LgrType, LinkState
from smcr.wire.clc import ClcAccept, decode_clc
from smcr.wire.llc import AddLinkV2, ConfirmLinkV2, LlcType, RequestAddLinkV2, decode_llc
from tests.core.pair import Pair, Side, lgr_of, transfer
from tests.core.test_recovery import ask_overtakes_the_confirmation
from tests.core.test_v2 import EID, clc_sent
from tests.wire.test_llc import golden_frame

ADD = Config(add_links=True)


def v2_pair(config: Config = ADD, client_ports: int = 2, server_ports: int = 2,
            client_config: Config | None = None) -> Pair:  # fmt: skip
    p = Pair(client_config or config, server_config=config, client_ports=client_ports,
             server_ports=server_ports)  # fmt: skip
    p.client.engine.ueids = p.server.engine.ueids = (EID,)
    return p


def links(side: Side) -> list[tuple[int, int]]:
    return [(x.link_id, x.port) for x in lgr_of(side).links if x.state is LinkState.LINK_ACTIVE]


def test_v2_symmetric_add_link_rkeys_in_the_message() -> None:
    """Both sides v2 with two ports: ADD LINK v2 request and response of 72 + 16 bytes
    (one RMB each), no CONTINUATION, CONFIRM LINK v2 over the new link; each side knows
    the other's RMB on both links, and bytes go over link 2."""
    p = v2_pair()
    c, s = p.connect()
    p.pump()
    assert lgr_of(p.server).version == 2
    for side in (p.client, p.server):
        assert links(side) == [(1, 0), (2, 1)]
        assert lgr_of(side).lgr_type is LgrType.SYMMETRIC
    assert [(m[0], m[3]) for m in p.server.llc_sent] == [(0x21, 0x03), (0x22, 0x00), (0x21, 0x03)]
    assert [(m[0], m[3]) for m in p.client.llc_sent] == [(0x21, 0x83), (0x22, 0x80), (0x21, 0x83)]
    req, resp = p.server.llc_sent[1], p.client.llc_sent[1]
    s_new, c_new = lgr_of(p.server).links[1], lgr_of(p.client).links[1]
    s_port1, c_port1 = (side.engine.identity.ports[1] for side in (p.server, p.client))
    (reg_s,), (reg_c,) = p.server.registered, p.client.registered
    # Linux's layout (golden frame 15): length 88 little-endian, body as v1, then at 44
    # flags 0x80 (direct), 0, the new link's GID, 8 zero bytes, count 01 00, the entry
    assert req[:4] == bytes.fromhex("22580000") and len(req) == 88
    assert req[4:10] == s_port1.mac and req[12:28] == s_port1.gid
    assert int.from_bytes(req[28:31], "big") == s_new.qpn and req[31] == 2
    assert req[44:46] == b"\x80\x00" and req[46:62] == s_port1.gid and req[62:70] == bytes(8)
    assert req[70:72] == b"\x01\x00"
    assert req[72:76] == p.server.rmbs[s].rkey.to_bytes(4, "big")
    assert req[76:80] == reg_s[2].to_bytes(4, "big")
    golden = golden_frame(15)
    assert golden[:4] == bytes.fromhex("22580000") and golden[44:46] == b"\x80\x00"
    assert golden[70:72] == b"\x01\x00" and golden[62:70] == bytes(8)
    assert resp[:4] == bytes.fromhex("22580080") and resp[46:62] == c_port1.gid
    assert resp[72:76] == p.client.rmbs[c].rkey.to_bytes(4, "big")
    assert resp[76:80] == reg_c[2].to_bytes(4, "big")
    assert p.client.engine.conns[c].peer_rtoken[c_new][0] == reg_s[2]
    assert p.server.engine.conns[s].peer_rtoken[s_new][0] == reg_c[2]
    conf = decode_llc(p.server.llc_sent[2])
    assert isinstance(conf, ConfirmLinkV2)
    assert (conf.link_num, conf.sender_gid, conf.max_links) == (2, s_port1.gid, 2)
    for side, conn in ((p.client, c), (p.server, s)):
        side.engine.llc.use_link(side.engine.conns[conn], lgr_of(side).links[1])
    assert transfer(p, c, s, b"v2 over link 2" * 300) == b"v2 over link 2" * 300


def test_v21_negotiates_two_links_with_add_links() -> None:
    """With add_links the Proposal offers and the server grants Linux's 2 links (the
    capture's kernels said 2); without, 1 as before."""
    p = v2_pair()
    _c, s = p.connect()
    p.pump()
    accept = decode_clc(clc_sent(p.server, s)[0])
    assert isinstance(accept, ClcAccept) and accept.fce is not None
    assert accept.fce.max_links == 2 and lgr_of(p.server).max_links == 2
    assert Config().v2_max_links == 1 and ADD.v2_max_links == 2
    assert Config(add_links=True, max_links_v2=3).v2_max_links == 3


def test_v21_peer_with_one_link_gets_no_offer() -> None:
    """A client that negotiates max links 1 (smcr without add_links, or Linux with
    smcr_max_links_per_lgr 1): the server offers no ADD LINK (smcr_serv_conf_first_link),
    and port_up adds none to the SINGLE group (smcr_port_add)."""
    p = v2_pair(client_config=Config())
    p.connect()
    p.pump()
    assert lgr_of(p.server).max_links == 1
    assert [m[0] for m in p.server.llc_sent] == [0x21]
    p.do(p.server, p.server.engine.port_up(1, p.now))
    assert [m[0] for m in p.server.llc_sent] == [0x21]
    assert links(p.server) == [(1, 0)]


def test_client_accepts_the_kernels_add_link_v2() -> None:
    """Golden frame 15 (a Linux server's offer) to a client with a second port: it answers
    ADD LINK v2 with flag 0x80, its port-1 QP, link 2, MTU min(ours, 3), and its RMB's
    rkeys for the new link; it waits for CONFIRM LINK then."""
    p = v2_pair(server_ports=1, config=Config(add_links=False), client_config=ADD)
    c, _s = p.connect()
    p.pump()
    qpn = lgr_of(p.client).links[0].qpn
    p.client.llc_sent.clear()
    p.run(p.client, p.client.engine.receive_wr(qpn, memoryview(golden_frame(15)), p.now))
    (resp,) = p.client.llc_sent
    msg = decode_llc(resp)
    assert isinstance(msg, AddLinkV2) and msg.ext is not None
    port1 = p.client.engine.identity.ports[1]
    new = lgr_of(p.client).links[1]
    assert resp[:4] == bytes.fromhex("22580080")
    assert (msg.sender_gid, msg.sender_qp_num, msg.link_num, msg.qp_mtu) == (
        port1.gid, new.qpn, 2, 3)
    (reg,) = p.client.registered
    assert [(r.rmb_key, r.rmb_key_new) for r in msg.ext.rkeys] == [(p.client.rmbs[c].rkey,
                                                                    reg[2])]
    assert lgr_of(p.client).remote_add is not None  # waiting for CONFIRM LINK
    # no CONFIRM LINK: DELETE LINK for the new link (lost path), the QP destroyed, and the
    # offer rejected after all (22 2C 00 C0), as smc_llc_cli_conf_link / out_clear_lnk
    p.client.llc_sent.clear()
    p.advance(ADD.llc_wait_confirm)
    assert [m[:4] for m in p.client.llc_sent] == [bytes.fromhex("242c0000"),
                                                  bytes.fromhex("222c00c0")]
    assert p.client.llc_sent[0][4] == 2
    assert p.client.llc_sent[1][4:44] == golden_frame(15)[4:44]
    assert new.qpn in p.client.destroyed and links(p.client) == [(1, 0)]


def test_v2_reject_without_second_port() -> None:
    """Neither side has a second port: the server's asymmetric offer (v2: 88 bytes) is
    rejected with its first 44 bytes, header 22 2C 00 C0."""
    p = v2_pair(client_ports=1, server_ports=1)
    p.connect()
    p.pump()
    offer = next(m for m in p.server.llc_sent if m[0] == LlcType.ADD_LINK_V2)
    reject = next(m for m in p.client.llc_sent if m[0] == LlcType.ADD_LINK_V2)
    assert reject == bytes.fromhex("222c00c0") + offer[4:44]
    assert links(p.server) == [(1, 0)] and lgr_of(p.server).lgr_type is LgrType.SINGLE


def test_request_add_link_from_client_port_up() -> None:
    """The client's port 1 is down at first contact: the server's symmetric offer is taken
    over the client's port 0 (client ASYMMETRIC_LOCAL, server ASYMMETRIC_PEER).  Port 1
    up: the client sends REQUEST ADD LINK v2 with its two GIDs (25 3C 00 00, count 2); the
    server answers with an ADD LINK (link 3, symmetric) and not with a response, then
    deletes the asymmetric link; both SYMMETRIC."""
    p = v2_pair()
    p.client.engine.ports_down.add(1)
    c, s = p.connect()
    p.pump()
    assert lgr_of(p.client).lgr_type is LgrType.ASYMMETRIC_LOCAL
    assert lgr_of(p.server).lgr_type is LgrType.ASYMMETRIC_PEER
    before_c, before_s = len(p.client.llc_sent), len(p.server.llc_sent)
    p.do(p.client, p.client.engine.port_up(1, p.now))
    req = p.client.llc_sent[before_c]
    ports = p.client.engine.identity.ports
    assert req == bytes.fromhex("253c0000") + bytes(20) + b"\x02" + bytes(3) + ports[0].gid \
        + ports[1].gid
    srv_types = [(m[0], m[3]) for m in p.server.llc_sent[before_s:]]
    assert (0x25, 0x80) not in srv_types
    assert srv_types[:2] == [(0x22, 0x00), (0x21, 0x03)]
    assert srv_types[2] == (0x24, 0x20)  # DELETE LINK of the asymmetric link 2
    for side in (p.client, p.server):
        assert lgr_of(side).lgr_type is LgrType.SYMMETRIC
        assert links(side) == [(1, 0), (3, 1)]
        assert lgr_of(side).flow is None
    assert transfer(p, c, s, b"after") == b"after"


def test_request_add_link_into_a_full_group_is_answered() -> None:
    """A REQUEST ADD LINK the server cannot follow (its group is SYMMETRIC already) gets
    the zeroed response 25 2C 00 80 (smc_llc_send_req_add_link_response)."""
    p = v2_pair()
    p.connect()
    p.pump()
    qpn = lgr_of(p.server).links[0].qpn
    p.server.llc_sent.clear()
    req = RequestAddLinkV2(gids=(b"\x01" * 16, b"\x02" * 16))
    p.do(p.server, p.server.engine.receive_wr(qpn, memoryview(req.encode()), p.now))
    assert p.server.llc_sent == [bytes.fromhex("252c0080") + bytes(40)]


def test_request_add_link_overtaking_the_asymmetric_links_confirmation_is_taken_up() -> None:
    """:func:`~tests.core.test_recovery.ask_overtakes_the_confirmation`, v2: the REQUEST ADD
    LINK meets the server's running ADD LINK flow (dropped unanswered, as Linux); once the
    asymmetric link is up the server offers the symmetric one anyway, which ends the
    client's request flow, and the group is SYMMETRIC again."""
    p = v2_pair()
    c, s = p.connect()
    p.pump()
    confirmed, request = ask_overtakes_the_confirmation(p)
    assert decode_llc(confirmed).TYPE == LlcType.CONFIRM_LINK_V2
    assert isinstance(decode_llc(request), RequestAddLinkV2)
    p.pump()
    for side in (p.client, p.server):
        assert links(side) == [(2, 1), (4, 0)]
        assert lgr_of(side).lgr_type is LgrType.SYMMETRIC
        assert lgr_of(side).flow is None
    assert transfer(p, c, s, b"z" * 5000) == b"z" * 5000
