"""Failover between the two links of a group (smc_switch_conns, DELETE LINK of one link).

Each test builds a symmetric group (ADD LINK), stops a client -> server transfer on
link 1 at one point, fails link 1 on one side, and checks that the server's
application reads every byte once, in order, and that both sides end with link 2
alone (SINGLE) after DELETE LINK.
"""

from __future__ import annotations

import pytest

from smcr.core import Action, Config, ConnectionReset, LgrType, LinkState, PostSend, RdmaWrite
from smcr.core.linkgroup import LinkGroup
from smcr.wire.llc import DeleteLink, LlcType, decode_llc
from tests.core.pair import Pair, Side

ADD = Config(add_links=True)
DATA = bytes(range(256)) * 40  # 10 KiB


def lgr_of(side: Side) -> LinkGroup:
    (lgr,) = side.engine.lgrs.values()
    return lgr


def symmetric() -> tuple[Pair, int, int]:
    p = Pair(ADD, client_ports=2, server_ports=2)
    c, s = p.connect()
    p.pump()
    for side in (p.client, p.server):
        assert lgr_of(side).lgr_type is LgrType.SYMMETRIC
    return p, c, s


def write_stalled(p: Pair, c: int, data: bytes, deliver_cdc: bool,
                  deliver_writes: bool = True) -> list[Action]:  # fmt: skip
    """The client writes: its WRITEs land in the server's RMB if ``deliver_writes``; its CDC
    reaches the server only if ``deliver_cdc``, and no completion comes back (the link
    fails first)."""
    n, actions = p.client.write(c, data)
    assert n == len(data)
    writes = [a for a in actions if isinstance(a, RdmaWrite)]
    cdcs = [a for a in actions if isinstance(a, PostSend)]
    assert writes and len(cdcs) == 1
    for a in writes if deliver_writes else ():
        p._execute(p.client, a)
    if deliver_cdc:
        qpn = p.client.qp_peer[cdcs[0].qpn]
        p.run(p.server, p.server.engine.receive_wr(qpn, memoryview(cdcs[0].data), p.now))
        p.pump()
    return actions


def read_all(p: Pair, s: int) -> bytes:
    got, actions = p.server.read(s)
    p.do(p.server, actions)
    return got


def fail_link1(p: Pair, side: Side) -> None:
    link1 = lgr_of(side).links[0]
    assert link1.link_id == 1
    p.do(side, side.engine.link_failed(link1.qpn, "injected", p.now))


def assert_on_link2_only(p: Pair) -> None:
    for side in (p.client, p.server):
        lgr = lgr_of(side)
        assert [(x.link_id, x.state) for x in lgr.links] == [(2, LinkState.LINK_ACTIVE)]
        assert lgr.lgr_type is LgrType.SINGLE
        for conn in lgr.conns.values():
            assert conn.link is lgr.links[0] and conn.qpn == lgr.links[0].qpn
        assert not [e for e in side.events if isinstance(e, ConnectionReset)]


@pytest.mark.parametrize("detector", ["server", "client"])
@pytest.mark.parametrize(("deliver_writes", "deliver_cdc"), [(False, False), (True, False),
                                                             (True, True)],
                         ids=["write-lost", "cdc-lost", "cdc-delivered"])  # fmt: skip
def test_failover_during_transfer_loses_and_duplicates_nothing(
        detector: str, deliver_writes: bool, deliver_cdc: bool) -> None:  # fmt: skip
    """WRITE posted and lost with its CDC; WRITE done, CDC lost; both done but not seen
    complete: the bytes from the last completed CDC on are written again over link 2."""
    p, c, s = symmetric()
    write_stalled(p, c, DATA[:4000], deliver_cdc, deliver_writes)
    fail_link1(p, p.server if detector == "server" else p.client)
    assert_on_link2_only(p)
    # the rest of the stream goes over link 2, and the server reads it all once
    n, actions = p.client.write(c, DATA[4000:])
    p.do(p.client, actions)
    assert read_all(p, s) == DATA[: 4000 + n]
    conn_c = p.client.engine.conns[c]
    assert conn_c.tx_fin == conn_c.tx_sent == 4000 + n


def test_failover_after_the_peer_read_more_than_completed() -> None:
    """The server read the bytes and told so (consumer cursor) before the client saw its
    CDC complete: nothing is written again, the send buffer is free (smc_switch_cursor's
    cons > fin case)."""
    p, c, s = symmetric()
    write_stalled(p, c, DATA[:3000], deliver_cdc=True)
    assert read_all(p, s) == DATA[:3000]
    out: list[Action] = []
    p.server.engine.conns[s].consumed(0, out, force=True)  # a consumer-cursor CDC now
    p.do(p.server, out)
    conn_c = p.client.engine.conns[c]
    assert conn_c.peer_cons == 3000 and conn_c.tx_fin == 0
    sent_before = len(p.client.llc_sent)
    fail_link1(p, p.server)
    assert conn_c.tx_fin == conn_c.tx_sent == 3000
    assert len(p.client.llc_sent) == sent_before + 1  # the DELETE LINK response only
    assert read_all(p, s) == b""
    _n, actions = p.client.write(c, b"after")
    p.do(p.client, actions)
    assert read_all(p, s) == b"after"


def test_delete_link_messages_as_linux() -> None:
    """Server-detected: DELETE LINK request 04 2C 00 20 (orderly), link 1, reason lost path,
    over link 2; the client's response echoes it with 0x80 and reason 0."""
    p, _c, _s = symmetric()
    fail_link1(p, p.server)
    req = [decode_llc(m) for m in p.server.llc_sent if m[0] == LlcType.DELETE_LINK]
    resp = [decode_llc(m) for m in p.client.llc_sent if m[0] == LlcType.DELETE_LINK]
    assert req == [DeleteLink(flags=0x20, link_num=1, reason=0x00010000)]
    assert resp == [DeleteLink(flags=0xA0, link_num=1, reason=0)]
    raw = next(m for m in p.server.llc_sent if m[0] == LlcType.DELETE_LINK)
    assert raw[:9] == bytes.fromhex("042c00200100010000")
    assert p.server.engine.lgrs[1].flow is None  # the flow ended with the response


def test_client_detected_failure_server_echoes_delete_link() -> None:
    """Client-detected: the client's request, the server's echo of it, the client's answer
    'no such link' (it is gone already), as smc_llc_process_srv/cli_delete_link."""
    p, _c, _s = symmetric()
    fail_link1(p, p.client)
    cli = [decode_llc(m) for m in p.client.llc_sent if m[0] == LlcType.DELETE_LINK]
    srv = [decode_llc(m) for m in p.server.llc_sent if m[0] == LlcType.DELETE_LINK]
    assert srv == [DeleteLink(flags=0x20, link_num=1, reason=0x00010000)]
    assert cli == [DeleteLink(flags=0x20, link_num=1, reason=0x00010000),
                   DeleteLink(flags=0xA0, link_num=1, reason=0x00100000)]
    assert p.server.engine.lgrs[1].flow is None


def test_last_link_failing_ends_the_group() -> None:
    """Both links fail: the second failure has nowhere to go, the connections are reset."""
    p, _c, s = symmetric()
    fail_link1(p, p.server)
    link2 = lgr_of(p.server).links[0]
    p.do(p.server, p.server.engine.link_failed(link2.qpn, "injected", p.now))
    assert not p.server.engine.lgrs
    assert [e.conn for e in p.server.events if isinstance(e, ConnectionReset)] == [s]


@pytest.mark.parametrize("side", ["server", "client"])
def test_a_port_back_adds_a_link_again(side: str) -> None:
    """The host's port news (Engine.port_state): a port down fails nothing by itself and
    keeps new links off it; back up, the server offers ADD LINK again (a client first
    sends the invitation, 02 2C 00 00 with only the port's MAC and GID): SYMMETRIC again,
    and a connection moved back carries bytes over the new link."""
    p, c, s = symmetric()
    detector = p.server if side == "server" else p.client
    port = lgr_of(detector).links[0].port
    p.do(detector, detector.engine.port_state(port, False, p.now))
    fail_link1(p, detector)
    assert_on_link2_only(p)
    before = (len(p.server.llc_sent), len(p.client.llc_sent))
    p.do(detector, detector.engine.port_state(port, True, p.now))
    p.pump()
    if side == "client":
        invite = next(m for m in p.client.llc_sent[before[1]:] if m[0] == LlcType.ADD_LINK)
        assert invite[:4] == bytes.fromhex("022c0000")
        assert invite[4:10] == p.client.engine.identity.ports[port].mac
        assert invite[12:28] == p.client.engine.identity.ports[port].gid
        assert not any(invite[28:])  # QPN, link number, MTU, PSN: 0
    for x in (p.client, p.server):
        lgr = lgr_of(x)
        assert lgr.lgr_type is LgrType.SYMMETRIC
        assert sorted((k.link_id, k.state) for k in lgr.links) == [
            (2, LinkState.LINK_ACTIVE), (3, LinkState.LINK_ACTIVE)]
    # the new link is a real path: move the connection there (fail link 2) and send
    link2 = next(k for k in lgr_of(p.server).links if k.link_id == 2)
    p.do(p.server, p.server.engine.link_failed(link2.qpn, "injected", p.now))
    n, actions = p.client.write(c, DATA[:5000])
    p.do(p.client, actions)
    assert read_all(p, s) == DATA[:n]


def test_cdcs_delivered_on_a_cleared_link_still_count() -> None:
    """A CDC the peer saw complete on link 1 is taken from the CQ only after link 1 was
    cleared (Linux drains the link's CQ first): it is applied, by token, and the peer's
    failover-validation CDC naming it is then no fault."""
    p, c, s = symmetric()
    actions = write_stalled(p, c, DATA[:4000], deliver_cdc=False)
    cdc = next(a for a in actions if isinstance(a, PostSend))
    link1 = lgr_of(p.server).links[0]
    # the client saw its CDC complete, then the server's link 1 went (its port down)
    p.do(p.client, p.client.engine.send_completed(cdc.qpn, cdc.wr_id, True, p.now))
    actions = p.server.engine.link_failed(link1.qpn, "injected", p.now)
    assert link1.qpn in p.server.engine.late_links
    # the CDC's completion was in the CQ before anything the peer sends after the failover
    actions += p.server.engine.receive_wr(link1.qpn, memoryview(cdc.data), p.now)
    p.do(p.server, actions)
    assert_on_link2_only(p)
    assert read_all(p, s) == DATA[:4000]
    # an LLC message on the cleared link is dropped with it
    late = p.server.engine.receive_wr(link1.qpn, memoryview(bytes([LlcType.TEST_LINK]) + bytes(43)),
                                      p.now)  # fmt: skip
    assert late == []


def test_an_invitation_waits_while_the_server_port_of_the_cut_is_down() -> None:
    """Both ends saw the same cut; the client's port came back first: its invitation is
    not answered with an asymmetric link over the server's remaining port; the server's
    own port coming back brings the symmetric one."""
    p, _c, _s = symmetric()
    for x in (p.server, p.client):
        p.do(x, x.engine.port_state(0, False, p.now))
    fail_link1(p, p.server)
    assert_on_link2_only(p)
    p.do(p.client, p.client.engine.port_state(0, True, p.now))
    assert [k.link_id for k in lgr_of(p.server).links] == [2]
    assert lgr_of(p.server).lgr_type is LgrType.SINGLE
    p.do(p.server, p.server.engine.port_state(0, True, p.now))
    for x in (p.client, p.server):
        assert lgr_of(x).lgr_type is LgrType.SYMMETRIC
        assert sorted(k.port for k in lgr_of(x).links) == [0, 1]


def test_both_ends_failing_the_same_link_keep_the_group() -> None:
    """Both ends see link 1 fail at once (a cut path): their DELETE LINK requests cross;
    each finds the link gone already (a client answers 'no such link', as Linux
    smc_llc_process_cli_delete_link) and the group lives on over link 2."""
    p, c, s = symmetric()
    link1 = {x.name: lgr_of(x).links[0].qpn for x in (p.client, p.server)}
    both = {x.name: x.engine.link_failed(link1[x.name], "injected", p.now)
            for x in (p.client, p.server)}  # fmt: skip
    for x in (p.client, p.server):
        p.run(x, both[x.name])
    p.pump()
    assert_on_link2_only(p)
    n, actions = p.client.write(c, DATA[:3000])
    p.do(p.client, actions)
    assert read_all(p, s) == DATA[:n]
