"""Two engines wired in memory: handshakes, link groups, LLC flows, declines."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

import pytest

from smcr.core import (
    Config,
    ConnectionReset,
    FellBack,
    HandshakeCompleted,
    HandshakeFailed,
    LinkGroupTerminated,
    LinkState,
    LlcDropped,
    SmcState,
)
from smcr.core.rkeys import IDLE_RMBS_MAX
from smcr.wire.clc import ClcDecline, ClcProposal, decode_clc
from smcr.wire.clc_header import SmcType
from smcr.wire.clc_proposal import IpPrefixArea
from smcr.wire.decline import DeclineCode
from smcr.wire.llc import AddLink, ConfirmLink, DeleteLink, LlcType, TestLink, decode_llc
from tests.core.pair import LOOPBACK, Pair, Side


def completed(side_events: Sequence[object]) -> list[HandshakeCompleted]:
    return [e for e in side_events if isinstance(e, HandshakeCompleted)]


def test_first_contact_builds_link_group_with_confirm_link_both_ways() -> None:
    p = Pair()
    c, s = p.connect()
    p.pump()
    assert completed(p.client.events) == [HandshakeCompleted(conn=c, first_contact=True, lgr_id=1)]
    assert completed(p.server.events)[0].first_contact
    assert p.client.engine.conns[c].state is SmcState.ACTIVE
    assert p.server.engine.conns[s].state is SmcState.ACTIVE
    # CLC: Linux >= 5.10 SMC-Rv1 Proposal (92 bytes, byte 7 0x28), v1 Accept/Confirm with FC
    proposal = p.client.clc_out[c][:92]
    assert proposal[:8] == bytes.fromhex("e2d4c3d901005c28")
    assert isinstance(decode_clc(bytes(proposal)), ClcProposal)
    assert p.server.clc_out[s][:8] == bytes.fromhex("e2d4c3d902004418")
    assert p.client.clc_out[c][92:100] == bytes.fromhex("e2d4c3d903004418")
    # LLC: CONFIRM LINK request 01 2C 00 03 from the server, response 01 2C 00 83
    assert p.server.llc_sent[0][:4] == bytes.fromhex("012c0003")
    assert p.client.llc_sent[0][:4] == bytes.fromhex("012c0083")
    for side in (p.client, p.server):
        (lgr,) = side.engine.lgrs.values()
        assert lgr.links[0].state is LinkState.LINK_ACTIVE
        assert lgr.links[0].qpn in side.rts


def test_second_connection_reuses_link_group_with_confirm_rkey() -> None:
    p = Pair()
    p.connect()
    p.pump()
    before = len(p.server.llc_sent), len(p.client.llc_sent)
    c2, s2 = p.connect()
    p.pump()
    assert completed(p.client.events)[-1] == HandshakeCompleted(conn=c2, first_contact=False,
                                                                lgr_id=1)
    # Accept/Confirm without first contact (byte 7 0x10)
    assert p.server.clc_out[s2][:8] == bytes.fromhex("e2d4c3d902004410")
    assert p.client.clc_out[c2][92:100] == bytes.fromhex("e2d4c3d903004410")
    new_server = [decode_llc(m) for m in p.server.llc_sent[before[0]:]]
    new_client = [decode_llc(m) for m in p.client.llc_sent[before[1]:]]
    # each side: its own CONFIRM RKEY request and the response to the peer's
    assert sorted((m.TYPE, m.is_response) for m in new_server) == [
        (LlcType.CONFIRM_RKEY, False), (LlcType.CONFIRM_RKEY, True)]
    assert sorted((m.TYPE, m.is_response) for m in new_client) == [
        (LlcType.CONFIRM_RKEY, False), (LlcType.CONFIRM_RKEY, True)]
    assert len(p.client.engine.lgrs) == 1 and len(p.server.engine.lgrs) == 1


def test_a_proposal_the_host_sent_itself_makes_the_same_handshake() -> None:
    """A blocking connect's thread sends the Proposal before the runtime's part of the
    set-up (Stack.early_proposal): the engine gives its bytes, the port they name and the
    v2 offer; connect(sent=...) then sends nothing, and the handshake goes on as ever."""
    p = Pair()
    c1, _ = p.connect()
    p.pump()
    c, s = p.connect(early=True)
    p.pump()
    assert completed(p.client.events)[-1] == HandshakeCompleted(conn=c, first_contact=False,
                                                                lgr_id=1)  # fmt: skip
    assert completed(p.server.events)[-1].conn == s
    # the same bytes as the engine's own Proposal, then the Confirm: nothing sent twice
    assert p.client.clc_out[c][:92] == p.client.clc_out[c1][:92]
    assert len(p.client.clc_out[c]) == len(p.client.clc_out[c1]) == 92 + 68
    assert p.client.engine.connect(99, None, LOOPBACK, p.now, 0, (0, False)) == []


def test_an_orderly_close_keeps_the_rmb_with_the_peer_for_the_next_connection() -> None:
    """A connection closed in order: no DELETE RKEY, the RMB reusable at once; the group's
    next connection that gets it again runs no CONFIRM RKEY (the peer holds the rkey),
    and its bytes land in it both ways."""
    p = Pair()
    p.connect()
    p.pump()
    c, s = p.connect()
    p.pump()
    p.do(p.client, p.client.engine.close(c, p.now))
    p.do(p.server, p.server.engine.close(s, p.now))
    assert c in p.client.released and s in p.server.released
    assert p.client.reused == [c] and p.server.reused == [s]
    sent = len(p.client.llc_sent), len(p.server.llc_sent)
    c2, s2 = p.connect(reuse=(c, s))
    p.pump()
    assert completed(p.client.events)[-1].conn == c2 and completed(p.server.events)[-1].conn == s2
    assert p.client.llc_sent[sent[0]:] == [] and p.server.llc_sent[sent[1]:] == []
    assert p.client.engine.conns[c2].rmb == p.client.rmbs[c]
    p.do(p.client, p.client.write(c2, b"ping")[1])
    assert p.server.read(s2)[0] == b"ping"
    p.do(p.server, p.server.write(s2, b"pong")[1])
    assert p.client.read(c2)[0] == b"pong"


def close_both(p: Pair, c: int, s: int) -> None:
    p.do(p.client, p.client.engine.close(c, p.now))
    p.do(p.server, p.server.engine.close(s, p.now))


def test_an_idle_rmb_taken_by_another_group_is_taken_back_from_the_first() -> None:
    """The client's RMB kept in group B serves a connection of group A: CONFIRM RKEY in A
    (A's peer does not hold it), DELETE RKEY in B (B's peer must not keep a key to a
    buffer another group's connection uses).  (One connection per group on the server.)"""
    p = Pair(server_config=Config(max_conns=1))
    c1, s1 = p.connect()
    p.pump()
    c2, s2 = p.connect()  # group A is full: a second group, B
    p.pump()
    lgr_a, lgr_b = (completed(p.client.events)[i].lgr_id for i in (0, 1))
    assert lgr_a != lgr_b
    close_both(p, c2, s2)
    close_both(p, c1, s1)
    rkey2 = p.client.rmbs[c2].rkey
    assert rkey2 in p.client.engine.lgrs[lgr_b].idle_rmbs
    sent = len(p.client.llc_sent)
    c3, s3 = p.connect(reuse=(c2, s2))  # the server picks A, its first group with room
    p.pump()
    assert completed(p.client.events)[-1] == HandshakeCompleted(conn=c3, first_contact=False,
                                                                lgr_id=lgr_a)
    kinds = sorted((m[0], m[3] & 0x80) for m in p.client.llc_sent[sent:])
    assert (LlcType.CONFIRM_RKEY, 0) in kinds and (LlcType.DELETE_RKEY, 0) in kinds
    assert rkey2 not in p.client.engine.lgrs[lgr_b].idle_rmbs
    p.do(p.client, p.client.write(c3, b"in A")[1])
    assert p.server.read(s3)[0] == b"in A"


def test_a_group_keeps_at_most_idle_rmbs_max() -> None:
    """Beyond IDLE_RMBS_MAX idle RMBs in a group, a released one is DELETE RKEY'd as before."""
    p = Pair()
    pairs = [p.connect()]
    p.pump()  # the group first, then the rest join it
    pairs += [p.connect() for _ in range(IDLE_RMBS_MAX + 1)]
    p.pump()
    sent = len(p.client.llc_sent)
    for c, s in pairs:
        close_both(p, c, s)
    (lgr,) = p.client.engine.lgrs.values()
    assert len(lgr.idle_rmbs) == IDLE_RMBS_MAX
    deletes = [m for m in p.client.llc_sent[sent:] if m[0] == LlcType.DELETE_RKEY
               and not m[3] & 0x80]  # fmt: skip
    assert len(deletes) == 2


def test_a_new_rmb_in_a_reused_group_is_confirmed_and_deleted_after_an_abort() -> None:
    """An RMB the peer does not hold yet: CONFIRM RKEY (above); released after an abort,
    when the peer may still be writing into it: DELETE RKEY both ways."""
    p = Pair()
    p.connect()
    p.pump()
    c, s = p.connect()
    p.pump()
    p.do(p.client, p.client.engine.abort(c, p.now))
    p.do(p.server, p.server.engine.close(s, p.now))
    assert c in p.client.released and s in p.server.released
    for side in (p.client, p.server):
        types = [(m[0], m[3] & 0x80) for m in side.llc_sent]
        assert (LlcType.DELETE_RKEY, 0) in types and (LlcType.DELETE_RKEY, 0x80) in types


def test_a_proposal_during_the_first_contact_waits_for_it_and_joins_the_group() -> None:
    """Linux ``smc_server_lgr_pending``: the client's connect returns once it answered
    CONFIRM LINK, and its next Proposal (over TCP) reaches the server before that
    answer (over the link): the server holds the Proposal until its first contact
    ends, then the connection joins the group, one group on each side (a second one
    was made here before, under load in 1 of 5 runs of 200 connections)."""
    p = Pair()
    c1, s1 = p.connect()
    p.step_until(lambda: c1 not in p.client.engine.handshakes and bool(p.sends),
                 "the client's first contact done, its CONFIRM LINK answer in flight")  # fmt: skip
    assert s1 in p.server.engine.handshakes  # the server has not had the answer yet
    c2, s2 = p.connect()  # the Proposal reaches the server now, before the answer
    assert s2 not in p.server.engine.conns  # held: no Accept yet
    p.pump()
    assert len(p.server.engine.lgrs) == len(p.client.engine.lgrs) == 1
    assert [e.first_contact for e in completed(p.server.events)] == [True, False]
    for c, s in ((c1, s1), (c2, s2)):
        assert p.client.engine.conns[c].state is p.server.engine.conns[s].state is SmcState.ACTIVE
        p.do(p.client, p.client.write(c, b"joined %d" % c)[1])
        assert p.server.read(s)[0] == b"joined %d" % c


def test_a_held_proposal_makes_the_next_first_contact_when_the_first_fails() -> None:
    """The first contact fails (its CONFIRM LINK answer lost: TIMEOUT_CL); the Proposal
    that waited for it goes on and makes a group of its own."""
    p = Pair()
    p.drop_llc = lambda side, data: side is p.client and data[0] == 0x01  # CONFIRM LINK
    c1, _s1 = p.connect()
    p.step_until(lambda: c1 not in p.client.engine.handshakes,
                 "the client's first contact done")  # fmt: skip
    p.drop_llc = lambda side, data: False
    c2, s2 = p.connect()
    assert s2 not in p.server.engine.conns
    p.advance(4.5)  # the server gives up on the CONFIRM LINK answer (llc_wait_first)
    assert s2 in p.server.engine.conns and s2 not in p.server.engine.handshakes
    assert p.server.engine.conns[s2].state is SmcState.ACTIVE
    assert [e.first_contact for e in completed(p.server.events)] == [True]
    assert completed(p.client.events)[-1].conn == c2


def test_server_without_buffer_declines_mem_and_both_fall_back() -> None:
    p = Pair()
    c, s = p.connect(server_rmb=False)
    p.pump()
    assert FellBack(conn=s, local_code=DeclineCode.MEM, peer_code=0) in p.server.events
    assert FellBack(conn=c, local_code=DeclineCode.PEERDECL,
                    peer_code=DeclineCode.MEM) in p.client.events
    decline = decode_clc(bytes(p.server.clc_out[s]))
    assert isinstance(decline, ClcDecline) and decline.code is DeclineCode.MEM
    assert not p.server.engine.lgrs


def test_client_without_buffer_declines_mem_after_accept() -> None:
    p = Pair()
    c, s = p.connect(client_rmb=False)
    p.pump()
    assert FellBack(conn=c, local_code=DeclineCode.MEM, peer_code=0) in p.client.events
    assert FellBack(conn=s, local_code=DeclineCode.PEERDECL,
                    peer_code=DeclineCode.MEM) in p.server.events
    assert not p.server.engine.conns


def test_prefix_mismatch_declines_diffprefix() -> None:
    p = Pair()
    c, s = 101, 102
    p.tcp[("client", c)] = ("server", s)
    p.tcp[("server", s)] = ("client", c)
    p.run(p.server, p.server.engine.accept(s, p.fabric.alloc(65536),
                                           ipaddress.IPv4Address("10.0.0.1"), 0.0))
    p.run(p.client, p.client.engine.connect(c, p.fabric.alloc(65536),
                                            ipaddress.IPv4Address("10.0.0.2"), 0.0))
    p.pump()
    assert FellBack(conn=s, local_code=DeclineCode.DIFFPREFIX, peer_code=0) in p.server.events
    assert FellBack(conn=c, local_code=DeclineCode.PEERDECL,
                    peer_code=DeclineCode.DIFFPREFIX) in p.client.events


@pytest.mark.parametrize(("eids", "code"), [
    ((b"X".ljust(32),), DeclineCode.NOSMCDEV),  # a UEID we lack: smc_find_rdma_v1_device_serv
    ((), DeclineCode.NOUEID),  # no UEID at all: smc_listen_v2_check
])
def test_smcr_v2_only_proposal_without_common_ueid_declines_as_linux(
        eids: tuple[bytes, ...], code: DeclineCode) -> None:
    p = Pair()
    s = 7
    p.tcp[("server", s)] = ("client", 8)
    p.tcp[("client", 8)] = ("server", s)
    p.run(p.server, p.server.engine.accept(s, p.fabric.alloc(65536),
                                           ipaddress.IPv4Address("127.0.0.1"), 0))
    v2 = ClcProposal.smcr_v2(bytes(16), eids).encode()
    p.run(p.server, p.server.engine.receive_clc(s, v2, 0.0))
    assert FellBack(conn=s, local_code=code, peer_code=0) in p.server.events


def test_accept_naming_unknown_link_declines_syncerr_out_of_sync() -> None:
    p = Pair()
    p.connect()
    p.pump()
    # the client forgets its link group: the server's next Accept (FC=0) names a link it lacks
    p.client.engine.lgrs.clear()
    c2, _ = p.connect()
    p.pump()
    assert FellBack(conn=c2, local_code=DeclineCode.SYNCERR, peer_code=0) in p.client.events
    decline = decode_clc(bytes(p.client.clc_out[c2][92:]))
    assert isinstance(decline, ClcDecline) and decline.out_of_sync
    # Linux: the server drops the group it thought it shared
    assert any(isinstance(e, LinkGroupTerminated) for e in p.server.events)


def test_confirm_link_lost_client_waits_then_both_fall_back_timeout_cl() -> None:
    p = Pair()
    p.drop_llc = lambda side, data: data[0] == LlcType.CONFIRM_LINK
    c, s = p.connect()
    p.pump()
    p.advance(2.1)  # server: no CONFIRM LINK response within 2 s
    server_fell = [e for e in p.server.events if isinstance(e, FellBack)]
    assert server_fell == [FellBack(conn=s, local_code=DeclineCode.TIMEOUT_CL, peer_code=0)]
    assert FellBack(conn=c, local_code=DeclineCode.PEERDECL,
                    peer_code=DeclineCode.TIMEOUT_CL) in p.client.events
    assert not p.server.engine.lgrs and not p.client.engine.lgrs
    # one Decline on the wire: a second one would reach the client's application as data
    out = bytes(p.server.clc_out[s])
    messages = []
    while out:
        length = int.from_bytes(out[5:7], "big")
        messages.append(decode_clc(out[:length]))
        out = out[length:]
    assert [type(m).__name__ for m in messages] == ["ClcAccept", "ClcDecline"]


def test_confirm_link_without_no_rmbe_eyecatcher_flag_declines_rmbe_ec() -> None:
    p = Pair()

    def strip(side: object, data: bytes) -> bytes:
        if data[0] == LlcType.CONFIRM_LINK and not data[3] & 0x80:
            return data[:3] + b"\x00" + data[4:]
        return data

    p.mangle = strip
    c, _ = p.connect()
    p.pump()
    assert FellBack(conn=c, local_code=DeclineCode.RMBE_EC, peer_code=0) in p.client.events


def test_silent_server_times_out_client_handshake() -> None:
    p = Pair()
    p.clc_filter = lambda side, conn, data: b"" if side is p.server else data
    c, _ = p.connect()
    p.pump()
    p.advance(6.1)
    assert any(isinstance(e, HandshakeFailed) and e.conn == c for e in p.client.events)


@pytest.mark.parametrize("garbage", [b"GET / HTTP/1.1\r\n", b"\xe2\xd4\xc3\xd9\x02\x00\x05\x10"])
def test_garbage_instead_of_accept(garbage: bytes) -> None:
    p = Pair()
    p.clc_filter = lambda side, conn, data: garbage if side is p.server else data
    c, _ = p.connect()
    p.pump()
    ev = [e for e in p.client.events if getattr(e, "conn", None) == c]
    if garbage.startswith(b"\xe2\xd4\xc3\xd9"):  # malformed CLC: Linux -EPROTO, no fallback
        assert isinstance(ev[-1], HandshakeFailed)
    else:  # not an SMC peer: fall back, its bytes are the application's
        assert ev[-1] == FellBack(conn=c, local_code=DeclineCode.PEERNOSMC, peer_code=0)
        hs_gone = c not in p.client.engine.handshakes
        assert hs_gone


def test_malformed_proposal_fails_without_decline() -> None:
    p = Pair()
    s = 5
    p.tcp[("server", s)] = ("client", 6)
    p.run(p.server, p.server.engine.accept(s, p.fabric.alloc(65536),
                                           ipaddress.IPv4Address("127.0.0.1"), 0.0))
    bad = bytearray(ClcProposal.smcr_v1(bytes(8), bytes(16), bytes(6)).encode())
    bad[-1] ^= 0xFF  # trailer
    p.run(p.server, p.server.engine.receive_clc(s, bytes(bad), 0.0))
    assert isinstance(p.server.events[-1], HandshakeFailed)
    assert s not in p.server.clc_out


def test_test_link_is_answered_and_keepalive_downs_silent_link() -> None:
    p = Pair(Config(testlink_time=30.0))
    c, _ = p.connect()
    p.pump()
    p.advance(30.5)  # both sides send TEST LINK and answer the other's
    assert any(m[:4] == bytes.fromhex("072c0000") for m in p.client.llc_sent)
    assert any(m[:4] == bytes.fromhex("072c0080") for m in p.client.llc_sent)
    p.drop_llc = lambda side, data: side is p.server  # the server goes silent
    p.advance(30.5)
    p.advance(2.5)
    assert any(isinstance(e, ConnectionReset) and e.conn == c for e in p.client.events)
    assert p.client.engine.conns[c].state is SmcState.CLOSED


def test_add_link_request_is_rejected_by_client() -> None:
    p = Pair()
    p.connect()
    p.pump()
    link = next(iter(p.server.engine.lgrs.values())).links[0]
    req = AddLink(sender_mac=b"\x02" * 6, sender_gid=b"\x02" * 16, sender_qp_num=77,
                  link_num=2, qp_mtu=3, initial_psn=5)
    p.sends.append((p.client, p.server.qp_peer[link.qpn], req.encode()))
    p.pump()
    assert p.client.llc_sent[-1][:4] == bytes.fromhex("022c01c0")


def test_delete_link_all_terminates_and_resets_connections() -> None:
    p = Pair()
    c, _ = p.connect()
    p.pump()
    link = next(iter(p.server.engine.lgrs.values())).links[0]
    p.sends.append((p.client, p.server.qp_peer[link.qpn],
                    DeleteLink(flags=0x60, reason=0x30000).encode()))
    p.pump()
    assert any(isinstance(e, ConnectionReset) and e.conn == c for e in p.client.events)
    assert not p.client.engine.lgrs


def test_unknown_llc_and_bad_cdc_are_dropped_and_counted() -> None:
    p = Pair()
    c, _ = p.connect()
    p.pump()
    link = next(iter(p.server.engine.lgrs.values())).links[0]
    q = p.server.qp_peer[link.qpn]
    p.sends.append((p.client, q, bytes([0x05, 44]) + bytes(42)))  # v1 0x05: dropped
    p.sends.append((p.client, q, bytes([0xFE, 40]) + bytes(42)))  # bad CDC length byte
    p.sends.append((p.client, q, bytes([0xFE, 44]) + bytes(42)))  # unknown token 0
    p.pump()
    assert sum(isinstance(e, LlcDropped) for e in p.client.events) == 3
    assert p.client.engine.conns[c].state is SmcState.ACTIVE


def test_llc_protocol_violation_terminates_group() -> None:
    p = Pair()
    p.connect()
    p.pump()
    link = next(iter(p.server.engine.lgrs.values())).links[0]
    stray = ConfirmLink(sender_mac=bytes(6), sender_gid=bytes(16), sender_qp_num=1,
                        link_num=1, link_uid=bytes(4))
    p.sends.append((p.client, p.server.qp_peer[link.qpn], stray.encode()))
    p.pump()
    assert not p.client.engine.lgrs
    sent = decode_llc(p.client.llc_sent[-1])
    assert isinstance(sent, DeleteLink) and sent.is_all and sent.reason == 0x40000


def test_link_failure_resets_all_connections() -> None:
    p = Pair()
    c1, _ = p.connect()
    p.pump()
    c2, _ = p.connect()
    p.pump()
    qpn = next(iter(p.client.engine.lgrs.values())).links[0].qpn
    p.run(p.client, p.client.engine.link_failed(qpn, "flush", p.now))
    resets = {e.conn for e in p.client.events if isinstance(e, ConnectionReset)}
    assert resets == {c1, c2}
    assert qpn in p.client.destroyed


def test_test_link_wire_bytes() -> None:
    assert TestLink().encode()[:4] == bytes.fromhex("072c0000")


def test_first_cdc_overtaking_the_confirm_is_not_lost() -> None:
    """The client's data CDC (QP) may reach the server before its Confirm (TCP)."""
    p = Pair()
    p.connect()
    p.pump()
    held: list[tuple[object, int, bytes]] = []
    real = p.clc_filter

    def hold_confirm(side: object, conn: int, data: bytes) -> bytes:
        if side is p.client and data[4] == 3:
            held.append((side, conn, data))
            return b""
        return real(side, conn, data)  # type: ignore[arg-type]

    p.clc_filter = hold_confirm
    c, s = p.connect()
    p.pump()
    assert held and c in p.client.engine.conns
    _, acts = p.client.write(c, b"early")
    p.do(p.client, acts)
    p.clc_filter = real
    p.run(p.server, p.server.engine.receive_clc(s, held[0][2], p.now))
    p.pump()
    assert p.server.read(s)[0] == b"early"


def test_a_cdc_asking_for_an_answer_before_the_confirm_is_answered_after_it() -> None:
    """A client CDC that asks for an answer (autocorking) may reach the server before the
    client's Confirm: the server cannot send a CDC yet (no peer RMB, no link), so it
    answers once the Confirm is in (it used to divide by the unknown RMB size)."""
    p = Pair(Config(autocork_size=65536))
    p.connect()
    p.pump()
    held: list[bytes] = []
    real = p.clc_filter

    def hold_confirm(side: object, conn: int, data: bytes) -> bytes:
        if side is p.client and data[4] == 3:
            held.append(data)
            return b""
        return real(side, conn, data)  # type: ignore[arg-type]

    p.clc_filter = hold_confirm
    c, s = p.connect()
    p.pump()
    assert held
    _, acts = p.client.write_inline(c, b"early", request=True)
    p.do(p.client, acts)
    assert p.client.engine.conns[c].echo_pending  # no answer yet
    p.clc_filter = real
    p.run(p.server, p.server.engine.receive_clc(s, held[0], p.now))
    p.pump()
    assert not p.client.engine.conns[c].echo_pending  # answered
    assert p.server.read(s)[0] == b"early"


def test_idle_link_group_is_ended_after_linger_with_delete_link_all_orderly() -> None:
    p = Pair(Config(lgr_linger_server=600.0, lgr_linger_client=610.0, testlink_time=0))
    c, s = p.connect()
    p.pump()
    p.do(p.client, p.client.engine.close(c, p.now))
    p.do(p.server, p.server.engine.close(s, p.now))
    p.advance(599.0)
    assert p.server.engine.lgrs
    p.advance(2.0)
    assert not p.server.engine.lgrs and not p.client.engine.lgrs
    sent = decode_llc(p.server.llc_sent[-1])
    assert isinstance(sent, DeleteLink) and sent.flags == 0x60 and sent.reason == 0x30000


def _aborted(side: Side, conn: int) -> bool:
    """Reset here (an event), or by the peer's abort CDC."""
    c = side.engine.conns.get(conn)
    return (c is not None and c.aborted) or any(
        isinstance(e, ConnectionReset) and e.conn == conn for e in side.events)


def test_reuse_sends_clc_messages_without_waiting_for_confirm_rkey() -> None:
    """Accept and Confirm go before the CONFIRM RKEY responses (Linux waits for them):
    on a reused link group the handshake needs no LLC round trip."""
    p = Pair()
    p.connect()
    p.pump()
    p.drop_llc = lambda side, data: data[0] == LlcType.CONFIRM_RKEY and bool(data[3] & 0x80)
    c2, s2 = p.connect()
    p.pump()
    assert any(isinstance(e, HandshakeCompleted) and e.conn == c2 for e in p.client.events)
    assert any(isinstance(e, HandshakeCompleted) and e.conn == s2 for e in p.server.events)
    _, acts = p.client.write(c2, b"at once")
    p.do(p.client, acts)
    p.pump()
    assert p.server.read(s2)[0] == b"at once"


def test_server_confirm_rkey_unanswered_aborts_the_connection() -> None:
    p = Pair()
    p.connect()
    p.pump()
    # the client stops answering CONFIRM RKEY: the server's flow times out (2 s)
    p.drop_llc = lambda side, data: side is p.client and data[0] == LlcType.CONFIRM_RKEY
    c2, s2 = p.connect()
    p.pump()
    p.advance(2.1)
    assert _aborted(p.server, s2) and _aborted(p.client, c2)  # the abort CDC reached it
    assert len(p.server.engine.lgrs) == 1  # the group itself stays


def test_client_confirm_rkey_negative_aborts_the_connection() -> None:
    p = Pair()
    p.connect()
    p.pump()

    def negative(side: object, data: bytes) -> bytes:
        if side is p.server and data[0] == LlcType.CONFIRM_RKEY and data[3] & 0x80:
            return data[:3] + bytes([0xB0]) + data[4:]
        return data

    p.mangle = negative
    c2, s2 = p.connect()
    p.pump()
    assert _aborted(p.client, c2) and _aborted(p.server, s2)
    p.mangle = lambda side, data: data
    c3, _ = p.connect()  # the group goes on
    p.pump()
    assert c3 in p.client.engine.conns and not _aborted(p.client, c3)


def test_rkey_refused_before_the_confirm_aborts_once_the_handshake_is_done() -> None:
    """The server's Accept is out, so it cannot decline any more: the connection
    completes when the client's Confirm comes, and is aborted at once."""
    p = Pair()
    p.connect()
    p.pump()
    held: list[bytes] = []

    def hold_confirm(side: Side, conn: int, data: bytes) -> bytes:
        if side is p.client and data[4] == 3:
            held.append(data)
            return b""
        return data

    def negative(side: object, data: bytes) -> bytes:
        if side is p.client and data[0] == LlcType.CONFIRM_RKEY and data[3] & 0x80:
            return data[:3] + bytes([0xB0]) + data[4:]
        return data

    p.clc_filter, p.mangle = hold_confirm, negative
    c2, s2 = p.connect()
    p.pump()
    assert held and s2 in p.server.engine.handshakes and not _aborted(p.server, s2)
    p.run(p.server, p.server.engine.receive_clc(s2, held[0], p.now))
    p.pump()
    assert any(isinstance(e, HandshakeCompleted) and e.conn == s2 for e in p.server.events)
    assert _aborted(p.server, s2) and _aborted(p.client, c2)


@pytest.mark.parametrize(("prefix", "code"), [
    (IpPrefixArea(ipaddress.IPv4Address("127.0.0.0"), 8), DeclineCode.NOSMCDDEV),
    (IpPrefixArea(), DeclineCode.DIFFPREFIX),  # the prefix check's reason comes first
])
def test_smcd_only_proposal_declines_as_linux(prefix: IpPrefixArea, code: DeclineCode) -> None:
    """Linux ``smc_listen_find_device``: no ISM device, no SMC-R offered."""
    p = Pair()
    s = 9
    p.tcp[("server", s)] = ("client", 10)
    p.run(p.server, p.server.engine.accept(s, p.fabric.alloc(65536),
                                           ipaddress.IPv4Address("127.0.0.1"), 0.0))
    smcd = ClcProposal(version=2, typev1=SmcType.D, typev2=SmcType.N, ip_area_offset=40,
                       ism_gid=5, prefix=prefix)
    p.run(p.server, p.server.engine.receive_clc(s, smcd.encode(), 0.0))
    assert FellBack(conn=s, local_code=code, peer_code=0) in p.server.events


def test_silent_server_after_confirm_client_declines_timeout_cl() -> None:
    """Linux smcr_clnt_conf_first_link: 4 s for CONFIRM LINK, 1 s for a Decline, then
    its own Decline TIMEOUT_CL."""
    p = Pair()
    p.drop_llc = lambda side, data: True
    p.clc_filter = lambda side, conn, data: b"" if side is p.server and data[4] == 4 else data
    c, _ = p.connect()
    p.pump()
    p.advance(4.1)
    assert c in p.client.engine.handshakes
    p.advance(1.1)
    assert FellBack(conn=c, local_code=DeclineCode.TIMEOUT_CL, peer_code=0) in p.client.events


def test_link_down_during_reuse_handshake_declines_noactlink() -> None:
    p = Pair()
    p.connect()
    p.pump()
    # the server's Accept is out (no CONFIRM RKEY wait), the client's Confirm is not
    p.clc_filter = lambda side, conn, data: b"" if side is p.client and data[4] == 3 else data
    _, s2 = p.connect()
    p.pump()
    assert s2 in p.server.engine.handshakes
    qpn = next(iter(p.server.engine.lgrs.values())).links[0].qpn
    p.run(p.server, p.server.engine.link_failed(qpn, "flush", p.now))
    p.pump()
    assert FellBack(conn=s2, local_code=DeclineCode.NOACTLINK, peer_code=0) in p.server.events
