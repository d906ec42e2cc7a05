"""SMC-Rv2 in the engine: negotiation both roles, first contact and reuse, the v2
declines Linux sends, LLC v2 on v2 link groups; compared with the Linux 6.12 capture
where the messages correspond."""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Callable

import pytest

from smcr.core import (
    Config,
    ConnectionReset,
    FellBack,
    HandshakeCompleted,
    LinkGroupTerminated,
    NextHop,
)
from smcr.core.close import SmcState
from smcr.core.negotiation import SMC_FEATURE_MASK
from smcr.wire.clc import (
    ClcAccept,
    ClcConfirm,
    ClcProposal,
    FirstContactExt,
    V2Extension,
    decode_clc,
    make_eid,
    make_hostname,
)
from smcr.wire.decline import DeclineCode
from smcr.wire.llc import (
    AddLinkV2,
    AddLinkV2Ext,
    DeleteRkeyV2,
    LlcType,
    RequestAddLinkV2,
    RkeyPair,
    TestLinkV2,
    decode_llc,
)
from tests.core.pair import LOOPBACK, Pair, Side
from tests.wire.test_llc import golden_frame

EID = make_eid("SMC-KVM-TEST")
OTHER = make_eid("OTHER-SITE")


def v2_pair(client: tuple[bytes, ...] = (EID,), server: tuple[bytes, ...] = (EID,),
            config: Config | None = None) -> Pair:
    p = Pair(config)
    p.client.engine.ueids, p.server.engine.ueids = client, server
    return p


def clc_sent(side: Side, conn: int) -> list[bytes]:
    """The CLC messages a side wrote on a connection, split."""
    data, out = bytes(side.clc_out[conn]), []
    while data:
        n = int.from_bytes(data[5:7], "big")
        out.append(data[:n])
        data = data[n:]
    return out


def completed(side: Side, conn: int) -> HandshakeCompleted:
    return next(e for e in side.events if isinstance(e, HandshakeCompleted) and e.conn == conn)


def transfer_works(p: Pair, c: int, s: int) -> None:
    n, actions = p.client.write(c, b"v2 payload")
    p.do(p.client, actions)
    data, actions = p.server.read(s)
    p.do(p.server, actions)
    assert (n, data) == (10, b"v2 payload")


# ------------------------------------------------------------ first contact, reuse


def test_v2_first_contact_and_reuse() -> None:
    p = v2_pair()
    c, s = p.connect()
    p.pump()
    assert completed(p.client, c).first_contact and completed(p.server, s).first_contact
    prop, conf = clc_sent(p.client, c)
    (acc,) = clc_sent(p.server, s)
    assert prop[7] == 0x20 and len(prop) == 92 + 40 + 32  # v1 + v2 offered, one UEID
    proposal = decode_clc(prop)
    assert isinstance(proposal, ClcProposal) and proposal.v2_extension is not None
    assert proposal.v2_extension.user_eids == (EID,)
    assert proposal.v2_extension.roce_gid == p.client.engine.identity.gid
    assert (proposal.v2_extension.release, proposal.v2_extension.max_conns,
            proposal.v2_extension.max_links) == (1, 255, 1)
    assert acc[:8] == bytes.fromhex("e2d4c3d902 00a0 28".replace(" ", ""))  # 160, v2 + FC
    assert len(conf) == 160 + 4 + 16 and conf[7] == 0x28
    accept, confirm = decode_clc(acc), decode_clc(conf)
    assert isinstance(accept, ClcAccept) and isinstance(confirm, ClcConfirm)
    assert accept.eid == confirm.eid == EID
    assert accept.fce is not None and confirm.fce is not None
    assert (accept.fce.max_conns, accept.fce.max_links) == (255, 1)
    assert confirm.gid_list == (p.client.engine.identity.gid,)
    lgr = p.server.engine.lgrs[completed(p.server, s).lgr_id]
    assert lgr.version == 2 and lgr.terms is not None and lgr.terms.eid == EID
    # CONFIRM LINK v2, max conns/links as negotiated (v2.1)
    req = decode_llc(p.server.llc_sent[0])
    assert req.TYPE == LlcType.CONFIRM_LINK_V2 and p.server.llc_sent[0][:4] == bytes.fromhex(
        "212c0003")
    assert p.client.llc_sent[0][:4] == bytes.fromhex("212c0083")
    transfer_works(p, c, s)
    # a second connection reuses the group: 108-byte Accept/Confirm, CONFIRM RKEY v2
    c2, s2 = p.connect()
    p.pump()
    assert not completed(p.client, c2).first_contact
    (acc2,) = clc_sent(p.server, s2)
    assert len(acc2) == 108 and acc2[7] == 0x20
    assert len(clc_sent(p.client, c2)[1]) == 108
    kinds = [m[0] for m in p.server.llc_sent + p.client.llc_sent]
    assert LlcType.CONFIRM_RKEY_V2 in kinds and LlcType.CONFIRM_RKEY not in kinds
    transfer_works(p, c2, s2)
    # the second aborted (an orderly close keeps the RMBs announced): DELETE RKEY v2
    # (one rkey, 44 bytes)
    p.do(p.client, p.client.engine.abort(c2, p.now))
    p.do(p.server, p.server.engine.close(s2, p.now))
    deletes = [m for m in p.client.llc_sent + p.server.llc_sent if m[0] == 0x29]
    assert deletes and all(len(m) == 44 for m in deletes)
    assert any(m[:8] == bytes.fromhex("292c0000 01000000".replace(" ", "")) for m in deletes)


# ------------------------------------------------------------------- negotiation


@pytest.mark.parametrize(("client", "server"), [
    ((), (EID,)),  # the client offers v1 only: the server takes v1
    ((EID,), ()),  # the server has no UEID: v1 (smc_find_rdma_v2_device_serv fails silently)
    ((EID,), (OTHER,)),  # no common UEID: v1
])
def test_v1_where_v2_cannot_be_agreed(client: tuple[bytes, ...],
                                      server: tuple[bytes, ...]) -> None:
    p = v2_pair(client, server)
    c, s = p.connect()
    p.pump()
    assert completed(p.client, c).first_contact
    (acc,) = clc_sent(p.server, s)
    assert len(acc) == 68 and acc[7] == 0x18  # v1 Accept, first contact
    assert clc_sent(p.client, c)[0][7] == (0x28 if not client else 0x20)
    assert p.server.llc_sent[0][0] == LlcType.CONFIRM_LINK  # v1 LLC
    transfer_works(p, c, s)


def test_the_first_common_ueid_of_the_proposal_is_chosen() -> None:
    p = v2_pair(client=(OTHER, EID), server=(EID, OTHER))
    _c, s = p.connect()
    p.pump()
    accept = decode_clc(clc_sent(p.server, s)[0])
    assert isinstance(accept, ClcAccept) and accept.eid == OTHER  # smc_clc_match_eid order


def test_ipv6_connections_offer_v1_only() -> None:
    p = v2_pair()
    c, s = 41, 42
    p.tcp[("client", c)], p.tcp[("server", s)] = ("server", s), ("client", c)
    p.run(p.client, p.client.engine.connect(c, p.fabric.alloc(65536),
                                            ipaddress.IPv6Address("fd00::1"), 0.0))
    assert clc_sent(p.client, c)[0][7] == 0x28


# ---------------------------------------------------------------------- declines


def server_gets(proposal: ClcProposal, ueids: tuple[bytes, ...] = (EID,),
                config: Config | None = None, v2_capable: bool = True,
                route: Callable[[int, bytes], NextHop | None] | None = None) -> Pair:  # fmt: skip
    p = v2_pair((), ueids, config)
    p.server.route = route
    p.server.engine.identity = dataclasses.replace(p.server.engine.identity,
                                                   v2_capable=v2_capable)
    s = 7
    p.tcp[("server", s)] = ("client", 8)
    p.tcp[("client", 8)] = ("server", s)
    p.run(p.server, p.server.engine.accept(s, p.fabric.alloc(65536), LOOPBACK, 0.0))
    p.run(p.server, p.server.engine.receive_clc(s, proposal.encode(), 0.0))
    return p


def declined(p: Pair, code: DeclineCode) -> None:
    assert FellBack(conn=7, local_code=code, peer_code=0) in p.server.events
    decline = decode_clc(bytes(p.server.clc_out[7]))
    assert decline.peer_diagnosis == code and decline.version == 2  # type: ignore[union-attr]


@pytest.mark.parametrize(("ext", "code"), [
    (V2Extension(roce_gid=bytes(16), user_eids=(OTHER,), max_conns=255, max_links=2),
     DeclineCode.NOSMCDEV),
    # v2.1 terms are checked before any device (smc_clc_srv_v2x_features_validate)
    (V2Extension(roce_gid=bytes(16), user_eids=(OTHER,)), DeclineCode.MAXCONNERR),
    (V2Extension(roce_gid=bytes(16)), DeclineCode.NOUEID),
    (V2Extension(roce_gid=bytes(16), user_eids=(EID,), max_conns=15, max_links=2),
     DeclineCode.MAXCONNERR),
    (V2Extension(roce_gid=bytes(16), user_eids=(EID,), max_conns=255, max_links=0),
     DeclineCode.MAXLINKERR),
])
def test_v2_only_proposal_declines(ext: V2Extension, code: DeclineCode) -> None:
    prop = dataclasses.replace(ClcProposal.smcr_v2(bytes(16), ()), v2_extension=ext)
    declined(server_gets(prop), code)


def test_v2_only_proposal_to_a_server_whose_gid_serves_no_v2_declines_nosmcrdev() -> None:
    prop = ClcProposal.smcr_v2(bytes(16), (EID,))
    declined(server_gets(prop, v2_capable=False), DeclineCode.NOSMCRDEV)


def test_v2_release_0_skips_the_v21_negotiation() -> None:
    prop = ClcProposal.smcr_v2(bytes(16), (EID,), release=0, max_conns=0, max_links=0)
    p = server_gets(prop)
    accept = decode_clc(bytes(p.server.clc_out[7]))
    assert isinstance(accept, ClcAccept) and accept.fce is not None
    assert (accept.fce.release, accept.fce.max_conns, accept.fce.max_links) == (0, 0, 0)


def client_gets_accept(rewrite: dict[str, object], offered: tuple[bytes, ...] = (EID,),
                       fce: dict[str, object] | None = None) -> Pair:
    """A v2 handshake whose Accept is rewritten on its way to the client."""
    p = v2_pair(offered, (EID,))

    def filt(side: Side, conn: int, data: bytes) -> bytes:
        if side is p.server and data[4] == 2:
            acc = decode_clc(data)
            assert isinstance(acc, ClcAccept)
            changes = dict(rewrite)
            if fce is not None and acc.fce is not None:
                changes["fce"] = dataclasses.replace(acc.fce, **fce)  # type: ignore[arg-type]
            return dataclasses.replace(acc, **changes).encode()  # type: ignore[arg-type]
        return data

    p.clc_filter = filt
    p.connect()
    p.pump()
    return p


def client_declined(p: Pair, code: DeclineCode) -> None:
    assert any(isinstance(e, FellBack) and e.local_code == code for e in p.client.events)
    assert any(isinstance(e, FellBack) and e.peer_code == code for e in p.server.events)


def test_v2_accept_to_a_v1_proposal_declines_modeunsupp() -> None:
    p = v2_pair((), (EID,))
    p.server.engine.ueids = (EID,)
    c, s = 61, 62
    p.tcp[("client", c)], p.tcp[("server", s)] = ("server", s), ("client", c)
    p.run(p.client, p.client.engine.connect(c, p.fabric.alloc(65536), LOOPBACK, 0.0))
    acc = ClcAccept(version=2, first_contact=True, peer_id=bytes(8), gid=bytes(16),
                    mac=bytes(6), qpn=1, rmb_rkey=1, rmbe_alert_token=1, rmbe_size=2,
                    qp_mtu=3, rmb_vaddr=0, psn=0, eid=EID, fce=FirstContactExt())
    p.run(p.client, p.client.engine.receive_clc(c, acc.encode(), 0.0))
    assert FellBack(conn=c, local_code=DeclineCode.MODEUNSUPP, peer_code=0) in p.client.events


@pytest.mark.parametrize(("fce", "code"), [
    ({"max_conns": 15}, DeclineCode.MAXCONNERR),
    ({"max_links": 3}, DeclineCode.MAXLINKERR),
    ({"max_links": 0}, DeclineCode.MAXLINKERR),
])
def test_v2_accept_with_bad_v21_terms_declines(fce: dict[str, object],
                                               code: DeclineCode) -> None:
    client_declined(client_gets_accept({}, fce=fce), code)


@pytest.mark.parametrize(("fce", "code"), [
    ({"release": 0}, DeclineCode.RELEASEERR),
    ({"max_conns": 200}, DeclineCode.MAXCONNERR),
    ({"max_links": 2}, DeclineCode.MAXLINKERR),
])
def test_v2_confirm_that_changes_the_terms_declines(fce: dict[str, object],
                                                    code: DeclineCode) -> None:
    """Linux ``smc_clc_v2x_features_confirm_check`` on the server."""
    p = v2_pair()

    def filt(side: Side, conn: int, data: bytes) -> bytes:
        if side is p.client and data[4] == 3:
            conf = decode_clc(data)
            assert isinstance(conf, ClcConfirm) and conf.fce is not None
            new_fce = dataclasses.replace(conf.fce, **fce)  # type: ignore[arg-type]
            return dataclasses.replace(conf, fce=new_fce).encode()
        return data

    p.clc_filter = filt
    p.connect()
    p.pump()
    assert any(isinstance(e, FellBack) and e.local_code == code for e in p.server.events)


# ------------------------------------------------------------------------- LLC v2


def established(config: Config | None = None) -> tuple[Pair, int, int]:
    p = v2_pair(config=config)
    c, s = p.connect()
    p.pump()
    completed(p.client, c)
    return p, c, s


def test_add_link_v2_is_rejected_as_the_linux_client_rejects_it() -> None:
    """Golden frames 15 -> 17: the server's ADD LINK v2 (88 bytes) and the reject
    (its first 44 bytes, header ``22 2C 00 C0``)."""
    p, c, s = established()
    request = golden_frame(15)
    qpn = next(iter(p.client.engine.links))
    p.client.llc_sent.clear()
    p.run(p.client, p.client.engine.receive_wr(qpn, memoryview(request), p.now))
    (reject,) = p.client.llc_sent
    assert reject == golden_frame(17)
    # also one the engine builds itself
    ours = AddLinkV2(sender_mac=b"\x02" * 6, sender_gid=bytes(16), sender_qp_num=0x22,
                     link_num=2, qp_mtu=3, initial_psn=5,
                     ext=AddLinkV2Ext(client_target_gid=bytes(16),
                                      rkeys=(RkeyPair(rmb_key=1, rmb_key_new=2,
                                                      rmb_vaddr_new=3),)))
    p.client.llc_sent.clear()
    p.run(p.client, p.client.engine.receive_wr(qpn, memoryview(ours.encode()), p.now))
    assert p.client.llc_sent == [ours.reject().encode()]
    transfer_works(p, c, s)


def test_request_add_link_v2_gets_the_zeroed_response() -> None:
    p, _c, _s = established()
    qpn = next(iter(p.server.engine.links))
    p.server.llc_sent.clear()
    req = RequestAddLinkV2(gids=(b"\x01" * 16, b"\x02" * 16))
    p.run(p.server, p.server.engine.receive_wr(qpn, memoryview(req.encode()), p.now))
    assert p.server.llc_sent == [bytes.fromhex("252c0080") + bytes(40)]


def test_test_link_v2_echoed_and_keepalive_in_v2() -> None:
    p, _c, _s = established(Config(testlink_time=5.0))
    qpn = next(iter(p.server.engine.links))
    p.server.llc_sent.clear()
    probe = TestLinkV2(user_data=b"0123456789abcdef")
    p.run(p.server, p.server.engine.receive_wr(qpn, memoryview(probe.encode()), p.now))
    assert p.server.llc_sent == [probe.response().encode()]
    p.client.llc_sent.clear()
    p.advance(6.0)
    assert any(m[:4] == bytes.fromhex("272c0000") for m in p.client.llc_sent + p.server.llc_sent)
    assert not [e for e in p.client.events if type(e).__name__ == "LinkGroupTerminated"]


def test_delete_rkey_v2_counts_unknown_rkeys() -> None:
    p, _c, _s = established()
    qpn = next(iter(p.server.engine.links))
    p.server.llc_sent.clear()
    req = DeleteRkeyV2.request((0xDEAD,))
    p.run(p.server, p.server.engine.receive_wr(qpn, memoryview(req.encode()), p.now))
    (resp,) = p.server.llc_sent
    assert resp[:6] == bytes.fromhex("292c00a0 0101".replace(" ", "")) and not any(resp[6:])


def test_delete_link_all_v2_ends_the_group() -> None:
    p, c, s = established()
    p.do(p.client, p.client.engine.abort(c, p.now))
    lgr_id = completed(p.server, s).lgr_id
    server = p.server.engine
    # the server's idle link group ends with DELETE LINK ALL v2, orderly
    p.do(p.client, p.client.engine.close(c, p.now))
    p.do(p.server, server.close(s, p.now))
    p.advance(server.config.lgr_linger_server + 1)
    assert lgr_id not in server.lgrs
    assert any(m[:4] == bytes.fromhex("242c0060") for m in p.server.llc_sent)


# ------------------------------------------------------------- against the capture


def test_our_accept_has_linux_layout_for_the_captured_proposal() -> None:
    """The capture's SMC-Rv2-only Proposal (frame 6) makes our server answer with an
    Accept laid out as Linux's (frame 8): compared byte for byte outside the per-host
    values (peer ID, GID, MAC, QPN, rkey, token, vaddr, PSN, size/MTU)."""
    from tests.wire.test_clc_golden import ACCEPT_9B, _capture_clc  # noqa: PLC0415

    golden_prop = _capture_clc()[6]
    p = v2_pair(config=Config(max_links_v2=2))
    p.server.engine.identity = dataclasses.replace(p.server.engine.identity,
                                                   hostname=make_hostname("g2"))
    s = 7
    p.tcp[("server", s)] = ("client", 8)
    p.tcp[("client", 8)] = ("server", s)
    p.run(p.server, p.server.engine.accept(
        s, p.fabric.alloc(65536), ipaddress.ip_interface("10.99.0.12/24"), 0.0))
    p.run(p.server, p.server.engine.receive_clc(s, golden_prop, 0.0))
    ours = bytes(p.server.clc_out[s])
    assert len(ours) == len(ACCEPT_9B) == 160
    same = [range(0, 8), range(45, 46), range(64, 160)]  # header, RMBE index, EID..trailer
    for r in same:
        assert ours[r.start:r.stop] == ACCEPT_9B[r.start:r.stop], r
    accept = decode_clc(ours)
    assert isinstance(accept, ClcAccept) and accept.fce is not None
    assert accept.fce.feature_mask == SMC_FEATURE_MASK
    lgr = next(iter(p.server.engine.lgrs.values()))
    assert lgr.links[0].peer_gid == bytes(10) + b"\xff\xff" + bytes([10, 99, 0, 11])


def test_our_confirm_has_linux_layout_for_the_captured_accept() -> None:
    """Our client, given the capture's Accept (frame 8), confirms as Linux did (frame
    10): same layout, EID, extension and GID-list structure."""
    from tests.wire.test_clc_golden import _capture_clc  # noqa: PLC0415

    cap = _capture_clc()
    p = v2_pair(config=Config(max_links_v2=2))
    p.client.engine.identity = dataclasses.replace(p.client.engine.identity,
                                                   hostname=make_hostname("g1"))
    c = 5
    p.tcp[("client", c)] = ("server", 6)
    p.tcp[("server", 6)] = ("client", c)
    p.run(p.client, p.client.engine.connect(c, p.fabric.alloc(65536),
                                            ipaddress.ip_interface("10.99.0.11/24"), 0.0))
    p.client.clc_out[c].clear()
    p.run(p.client, p.client.engine.receive_clc(c, cap[8], 0.0))
    ours, linux = bytes(p.client.clc_out[c]), cap[10]
    assert len(ours) == len(linux) == 180
    for r in (range(0, 8), range(45, 46), range(64, 156), range(156, 160), range(176, 180)):
        assert ours[r.start:r.stop] == linux[r.start:r.stop], r
    assert ours[160:176] == p.client.engine.identity.gid


def test_shutdown_waits_for_closes_then_deletes_every_link() -> None:
    """The live kernel case (a Linux client whose smcr server process ended right after
    its close): the server is in PEERFINCLOSEWAIT, the peer's last CDC still to come, so
    ``closing()`` holds the host back; once the peer has closed and the DELETE RKEY flows
    are answered it does not, and ``shutdown()`` ends the group with DELETE LINK ALL v2
    (not orderly, program-initiated: Linux ``smc_lgr_cleanup``), which ends the peer's
    group at once instead of after its TEST LINK."""
    p, c, s = established()
    server, client = p.server.engine, p.client.engine
    lgr_id = completed(p.server, s).lgr_id
    assert not server.closing()
    p.do(p.client, client.shutdown_write(c, p.now))
    p.do(p.server, server.close(s, p.now))
    assert server.conns[s].state is SmcState.PEERFINCLOSEWAIT
    assert server.closing()
    p.do(p.client, client.close(c, p.now))
    assert not server.closing() and not client.closing()
    p.server.llc_sent.clear()
    p.client.llc_sent.clear()
    p.do(p.server, server.shutdown(p.now))
    # type 0x24, length 44 (little-endian, as x86 Linux), flags ALL; link 0; reason
    delete_all = bytes.fromhex("242c0040" "00" "00030000") + bytes(35)
    assert p.server.llc_sent == [delete_all]
    # the client answers as a Linux client does (the live kernel, too): DELETE LINK ALL,
    # not orderly, with our reason; that answer, received, ends our group (no final call)
    assert p.client.llc_sent == [delete_all]
    assert lgr_id not in server.lgrs and p.server.destroyed and not server.ending()
    ended = [e for e in p.client.events if isinstance(e, LinkGroupTerminated)]
    assert len(ended) == 1 and "peer deleted all links" in ended[0].reason
    assert not client.lgrs
    assert server.shutdown(p.now, final=True) == []  # nothing left to end


def test_shutdown_final_ends_groups_whose_peer_does_not_answer() -> None:
    p, _c, _s = established()
    server = p.server.engine
    p.drop_llc = lambda side, data: side is p.server  # our DELETE LINK is lost
    p.do(p.server, server.shutdown(p.now))
    assert server.ending() and server.lgrs
    p.do(p.server, server.shutdown(p.now, final=True))
    assert not server.ending() and not server.lgrs and p.server.destroyed


def test_closes_the_host_does_not_wait_for_are_not_closing() -> None:
    """A connection the host closed at exit for an application that left it open waits for
    the peer's close as any other (PEERCLOSEWAIT1), but ``closing(unwaited)`` leaves it
    out: a TCP exit does not wait for the peer's FIN either."""
    p, _c, s = established()
    server = p.server.engine
    p.do(p.server, server.close(s, p.now))
    assert server.conns[s].state is SmcState.PEERCLOSEWAIT1
    assert server.closing() and not server.closing(unwaited={s})
    assert server.closing(unwaited={s + 1})


def test_the_links_a_peer_may_still_use_after_shutdown() -> None:
    """At exit the host keeps the QPs of the groups whose peer may still send after our
    DELETE LINK: one with a connection the peer has not closed (a Linux peer's
    ``smc_conn_kill`` sends an abort CDC over the link as its group ends), one whose
    DELETE LINK was not answered; not one whose connections both ends closed."""
    p, c, s = established()
    server, client = p.server.engine, p.client.engine
    qpns = {link.qpn for link in server.lgrs[completed(p.server, s).lgr_id].links}
    assert qpns and server.links_peers_may_use() == qpns  # open: the peer may abort it
    p.do(p.server, server.close(s, p.now))
    assert server.links_peers_may_use() == qpns  # closed by us, not yet by the peer
    p.do(p.client, client.close(c, p.now))  # both closed: nothing more will come
    assert server.links_peers_may_use() == set()
    p.drop_llc = lambda side, data: side is p.server  # our DELETE LINK is lost
    p.do(p.server, server.shutdown(p.now))
    assert server.links_peers_may_use() == qpns  # not answered: its DELETE LINK may come
    p.do(p.server, server.shutdown(p.now, final=True))
    assert server.links_peers_may_use() == set()


def test_a_server_answers_delete_link_all_orderly_with_the_reason() -> None:
    """Linux ``smc_llc_process_srv_delete_link``: DELETE LINK ALL | ORDERLY back (the
    live kernel server answered smcr's exit so: flags 0x60, reason 0x00030000)."""
    p, _c, _s = established()
    p.server.llc_sent.clear()
    p.do(p.client, p.client.engine.shutdown(p.now))
    assert p.server.llc_sent == [bytes.fromhex("242c0060" "00" "00030000") + bytes(35)]
    assert not p.client.engine.lgrs and not p.server.engine.lgrs


def test_shutdown_resets_connections_still_open() -> None:
    p, c, s = established()
    p.do(p.server, p.server.engine.shutdown(p.now))
    assert [e.conn for e in p.server.events if isinstance(e, ConnectionReset)] == [s]
    assert [e.conn for e in p.client.events if isinstance(e, ConnectionReset)] == [c]


def test_the_proposal_follows_the_ueids_from_one_connection_to_the_next() -> None:
    """The engine keeps its encoded Proposal per local address: a UEID set (or gone)
    between two connections changes the next Proposal as Linux, which reads its table
    at every handshake, changes it; unchanged, the bytes are the same."""
    p = v2_pair(client=())
    c1, _ = p.connect()
    c2, _ = p.connect()
    p.client.engine.ueids = (EID,)
    c3, _ = p.connect()
    first, second, third = (clc_sent(p.client, c)[0] for c in (c1, c2, c3))
    assert first == second and len(first) == 92  # v1 only
    assert len(third) > 92 and third[7] != first[7]  # v1 and v2: the v2 extension
    p.client.engine.ueids = ()
    c4, _ = p.connect()
    assert clc_sent(p.client, c4)[0] == first
