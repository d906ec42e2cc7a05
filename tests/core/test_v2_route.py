"""SMC-Rv2 across IP routers in the engine, as Linux: the server's route to the client's
GID (``smc_find_rdma_v2_device_serv`` -> ``smc_ib_find_route``), "v2 direct" in the
first-contact extensions and ADD LINK v2, the client's check of an indirect Accept
(``smc_connect_rdma_v2_prepare``: ``NOROUTE``, ``NOINDIRECT``), and hop limit 64 with
the next hop's MAC in the QPs' address vectors (``smc_ib_modify_qp_rtr``)."""

from __future__ import annotations

import dataclasses
import ipaddress

import pytest

from smcr.core import NextHop
from smcr.wire.clc import ClcAccept, ClcConfirm, ClcProposal, V2Extension, decode_clc
from smcr.wire.decline import DeclineCode
from smcr.wire.llc import AddLinkV2, decode_llc
from tests.core import test_addlink_v2
from tests.core.pair import lgr_of
from tests.core.test_v2 import EID, clc_sent, client_declined, declined, server_gets, v2_pair

GATEWAY_MAC = bytes.fromhex("02aabbccdd01")
ROUTED = NextHop(uses_gateway=True, mac=GATEWAY_MAC)


def test_routed_peers_use_hop_limit_64_and_the_gateway_mac() -> None:
    p = v2_pair()
    p.client.route = p.server.route = lambda port, gid: ROUTED
    c, s = p.connect()
    p.pump()
    (acc,) = clc_sent(p.server, s)
    conf = clc_sent(p.client, c)[1]
    accept, confirm = decode_clc(acc), decode_clc(conf)
    assert isinstance(accept, ClcAccept) and isinstance(confirm, ClcConfirm)
    assert accept.fce is not None and not accept.fce.v2_direct
    assert confirm.fce is not None and not confirm.fce.v2_direct
    assert acc[104] == 0x00  # byte 104: not direct
    for side in (p.client, p.server):
        lgr = lgr_of(side)
        assert (lgr.uses_gateway, lgr.nexthop_mac) == (True, GATEWAY_MAC)
        (rtr,) = side.rtr
        assert (rtr.hop_limit, rtr.dmac) == (64, GATEWAY_MAC)
    _n, actions = p.client.write(c, b"routed")
    p.do(p.client, actions)
    assert p.server.read(s)[0] == b"routed"


def test_on_link_peers_keep_hop_limit_1_and_the_peer_mac() -> None:
    p = v2_pair()
    _c, s = p.connect()
    p.pump()
    accept = decode_clc(clc_sent(p.server, s)[0])
    assert isinstance(accept, ClcAccept) and accept.fce is not None and accept.fce.v2_direct
    for side, peer in ((p.client, p.server), (p.server, p.client)):
        (rtr,) = side.rtr
        assert (rtr.hop_limit, rtr.dmac) == (1, peer.engine.identity.mac)
        assert not lgr_of(side).uses_gateway


def test_a_direct_accept_is_taken_without_a_route_lookup() -> None:
    """The server says direct: the client takes the Accept's MAC as next hop and asks no
    route (Linux asks only for an indirect server)."""
    p = v2_pair()
    asked: list[bytes] = []
    p.client.route = lambda port, gid: asked.append(gid) or None  # type: ignore[func-returns-value]
    p.connect()
    p.pump()
    assert asked == [] and p.client.rtr[0].hop_limit == 1


@pytest.mark.parametrize(("route", "code"), [
    (None, DeclineCode.NOROUTE),
    (NextHop(uses_gateway=False), DeclineCode.NOINDIRECT),
])  # fmt: skip
def test_an_indirect_accept_the_client_cannot_route_declines(route: NextHop | None,
                                                            code: DeclineCode) -> None:  # fmt: skip
    p = v2_pair()
    p.server.route = lambda port, gid: ROUTED
    p.client.route = lambda port, gid: route
    p.connect()
    p.pump()
    client_declined(p, code)
    assert p.client.rtr == []


def test_the_server_without_a_route_to_the_v2_gid_takes_no_v2() -> None:
    """No route to the client's v2 GID: no SMC-Rv2 device (``NOSMCRDEV``), as for a GID
    that serves no v2; a v2-only Proposal is declined with it."""
    asked: list[bytes] = []

    def no_route(port: int, gid: bytes) -> NextHop | None:
        asked.append(gid)
        return None

    gid = bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 9])
    declined(server_gets(ClcProposal.smcr_v2(gid, (EID,)), route=no_route),
             DeclineCode.NOSMCRDEV)  # fmt: skip
    assert asked == [gid]


def test_a_v1_and_v2_proposal_from_another_subnet_without_a_route_declines_diffprefix() -> None:
    """Both offered, the prefixes differ and there is no route for v2: the prefix
    mismatch was recorded first (``smc_listen_find_device``), so ``DIFFPREFIX``."""
    gid = bytes(10) + b"\xff\xff" + bytes([10, 9, 9, 9])
    ext = V2Extension(roce_gid=gid, user_eids=(EID,), max_conns=255, max_links=2)
    prop = ClcProposal.smcr_v1_v2(bytes(8), gid, bytes(6), ext,
                                  outgoing_subnet=ipaddress.IPv4Address("10.9.9.0"),
                                  prefix_len=24)  # fmt: skip
    declined(server_gets(prop, route=lambda port, gid: None), DeclineCode.DIFFPREFIX)


def test_add_link_v2_says_not_direct_in_a_routed_group() -> None:
    p = test_addlink_v2.v2_pair()
    p.client.route = p.server.route = lambda port, gid: ROUTED
    p.connect()
    p.pump()
    adds = [decode_llc(m) for m in p.server.llc_sent + p.client.llc_sent if m[0] == 0x22]
    assert adds and all(isinstance(a, AddLinkV2) and a.ext is not None and not a.ext.direct
                        for a in adds)  # fmt: skip
    assert {r.hop_limit for side in (p.client, p.server) for r in side.rtr} == {64}


def test_an_ipv6_roce_gid_offers_v2_over_ipv6() -> None:
    """Beyond Linux (which offers SMC-Rv2 over IPv4 only): an RNIC whose GID is an IPv6
    address offers it over IPv6 TCP too, with that GID in the v2 extension."""
    p = v2_pair()
    gid = ipaddress.IPv6Address("fd00::1").packed
    p.client.engine.identity = dataclasses.replace(p.client.engine.identity, gid=gid,
                                                   v2_over_ipv6=True)  # fmt: skip
    c, s = 41, 42
    p.tcp[("client", c)], p.tcp[("server", s)] = ("server", s), ("client", c)
    p.run(p.client, p.client.engine.connect(c, p.fabric.alloc(65536),
                                            ipaddress.IPv6Address("fd00::1"), 0.0))  # fmt: skip
    prop = decode_clc(clc_sent(p.client, c)[0])
    assert isinstance(prop, ClcProposal) and prop.v2_extension is not None
    assert prop.v2_extension.roce_gid == gid
