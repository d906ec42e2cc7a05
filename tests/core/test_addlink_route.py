"""ADD LINK only over ports that reach the peer (the host's routing, ``Provider.reaches``):
Linux checks a route to the peer port's address through the RNIC's net device
(``smc_ib_determine_gid`` with ``smcrv2``, ``smc_ib_find_route``) and rejects an offer no
RNIC of its reaches (``SMC_LLC_REJ_RSN_NO_ALT_PATH``)."""

from __future__ import annotations

import pytest

from smcr.core import Config, LgrType, LinkGroup, LinkState
from smcr.wire.llc import AddLink, DeleteLink, DeleteLinkReason, decode_llc
from tests.core.pair import Pair, lgr_of
from tests.core.test_addlink_v2 import v2_pair

ADD = Config(add_links=True)


def ports(lgr: LinkGroup) -> list[tuple[int, int]]:
    return [(x.link_id, x.port) for x in lgr.links if x.state is LinkState.LINK_ACTIVE]


def test_the_client_takes_the_port_that_reaches_the_offer() -> None:
    """The client's first other port has no path to the server's offered port, its second
    has: the new link goes over the second."""
    p = Pair(ADD, client_ports=3, server_ports=2)
    offered = p.server.engine.identity.ports[1].gid
    p.client.reach = lambda port, gid: port == 2 and gid == offered
    p.connect()
    p.pump()
    assert ports(lgr_of(p.client)) == [(1, 0), (2, 2)]
    assert ports(lgr_of(p.server)) == [(1, 0), (2, 1)]
    for side in (p.client, p.server):
        assert lgr_of(side).lgr_type is LgrType.SYMMETRIC


def test_an_offer_no_port_reaches_is_rejected_no_alt_path() -> None:
    """No port of the client reaches the offered one, not even its first (no asymmetric
    link either): the reject, reason 1 (no alternate path); the group stays SINGLE."""
    p = Pair(ADD, client_ports=2, server_ports=2)
    offered = p.server.engine.identity.ports[1].gid
    p.client.reach = lambda port, gid: gid != offered
    p.connect()
    p.pump()
    reject = p.client.llc_sent[1]
    assert reject[:4] == bytes.fromhex("022c01c0")  # reason nibble 1: NO_ALT_PATH
    assert reject[4:] == p.server.llc_sent[1][4:]
    offer = decode_llc(p.server.llc_sent[1])
    assert isinstance(offer, AddLink) and offer.sender_qp_num in p.server.destroyed
    for side in (p.client, p.server):
        assert lgr_of(side).lgr_type is LgrType.SINGLE
        assert ports(lgr_of(side)) == [(1, 0)]


def test_without_a_path_the_client_falls_back_to_its_first_port_if_that_reaches() -> None:
    """The client's other port does not reach the offer, its first does: an asymmetric
    link over its first port (ASYMMETRIC_LOCAL), as with one RNIC."""
    p = Pair(ADD, client_ports=2, server_ports=2)
    p.client.reach = lambda port, gid: port == 0
    p.connect()
    p.pump()
    assert ports(lgr_of(p.client)) == [(1, 0), (2, 0)]
    assert lgr_of(p.client).lgr_type is LgrType.ASYMMETRIC_LOCAL


def test_the_server_deletes_a_link_whose_client_port_it_cannot_reach() -> None:
    """The client answers from a port the server's new link has no path to: the server
    ends the flow with DELETE LINK (lost path) at once, both clear the new link."""
    p = Pair(ADD, client_ports=2, server_ports=2)
    answer = p.client.engine.identity.ports[1].gid
    p.server.reach = lambda port, gid: gid != answer
    p.connect()
    p.pump()
    deletes = [m for m in map(decode_llc, p.server.llc_sent) if isinstance(m, DeleteLink)]
    assert len(deletes) == 1 and deletes[0].reason == DeleteLinkReason.LOST_PATH
    assert deletes[0].link_num == 2
    for side in (p.client, p.server):
        assert ports(lgr_of(side)) == [(1, 0)]
        assert lgr_of(side).lgr_type is LgrType.SINGLE


def test_request_add_link_the_server_picks_a_port_that_reaches_the_client_s_other() -> None:
    """v2: REQUEST ADD LINK lists the client's GIDs, its link's first; the server offers
    from a port that reaches one of the others (its port 2, not its port 1, which has
    no path to the client's port 1)."""
    p = v2_pair(client_ports=2, server_ports=3)
    client_alt = p.client.engine.identity.ports[1].gid
    p.server.reach = lambda port, gid: port != 1 or gid != client_alt
    p.client.engine.ports_down.add(1)
    p.connect()
    p.pump()
    p.do(p.client, p.client.engine.port_up(1, p.now))
    p.pump()
    # link 3, asked for, from the server's port 2 to the client's port 1 (the server's
    # asymmetric link 2 is over a port of its own: none of its ports has two links, so
    # it stays, as smc_llc_find_asym_link finds none)
    for side, want in ((p.server, 2), (p.client, 1)):
        lgr = lgr_of(side)
        assert lgr.lgr_type is LgrType.SYMMETRIC
        assert (3, want) in ports(lgr)


@pytest.mark.parametrize("whose", ["client", "server"])
def test_a_port_event_dropped_during_a_failed_offer_is_taken_up_after_it(whose: str) -> None:
    """A port event while the server's offer is on its way, and the offer fails (the
    client, with no path to it then, rejects it); the event is not lost: the server
    offers again after, and the group gets its symmetric second link.

    ``client``: the client asks for a link (its port event: ADD LINK invitation); the
    server drops the request (one flow at a time, as Linux).  ``server``: the server's
    second port comes back (port_up) while its asymmetric offer, made when that port was
    down, runs; the request is dropped too (before, the group stayed at one link until
    the next port event; a CI run of tests/stack/test_failover_roce.py waited 60 s)."""
    p = Pair(ADD, client_ports=2, server_ports=2)
    if whose == "server":
        p.run(p.server, p.server.engine.port_down(1, "cut", p.now))
    blocked = [True]
    p.client.reach = lambda port, gid: not blocked[0]
    p.connect()
    p.step_until(lambda: any(m[0] == 0x02 for m in p.server.llc_sent), "the server's offer")
    side = p.client if whose == "client" else p.server
    p.run(side, side.engine.port_up(1, p.now))  # dropped: the offer runs
    p.step_until(lambda: any(m[:4] == bytes.fromhex("022c01c0") for m in p.client.llc_sent),
                 "the client's reject")  # fmt: skip
    blocked[0] = False
    p.pump()
    offers = [m for m in p.server.llc_sent if m[0] == 0x02 and not m[3] & 0x80]
    assert len(offers) == 2
    for end in (p.client, p.server):
        assert lgr_of(end).lgr_type is LgrType.SYMMETRIC
        assert [port for _, port in ports(lgr_of(end))] == [0, 1]
