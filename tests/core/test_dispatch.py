"""The engine's dispatch tables: LLC ``(type, response) -> (handler, allowed link states)``
and CLC ``(role, handshake state, message type) -> handler``."""

from __future__ import annotations

import pytest

from smcr.core import (
    Action,
    FellBack,
    HandshakeFailed,
    HsState,
    LinkGroupTerminated,
    LinkState,
    LlcDropped,
    Role,
    SendClc,
    SmcState,
)
from smcr.core.linkgroup import Link
from smcr.wire.clc import ClcDecline, ClcType
from smcr.wire.decline import DeclineCode
from smcr.wire.llc import (
    LLC_CLASSES,
    LLC_FLAG_NO_RMBE_EYEC,
    LLC_FLAG_RESP,
    AddLink,
    ConfirmLink,
    LlcMessage,
    LlcType,
    TestLink,
)
from tests.core.pair import Pair, Side, lgr_of

# -- LLC ----------------------------------------------------------------------------


def test_the_llc_table_routes_every_type_linux_accepts_both_ways() -> None:
    table = Pair().client.engine.llc.table
    assert set(table) == {(t, r) for t in LLC_CLASSES for r in (False, True)}
    assert all(states and states <= frozenset(LinkState) for _, states in table.values())
    # the v2 variants share the v1 entries (Linux takes the type's low nibble)
    assert table[(LlcType.ADD_LINK_V2, True)] == table[(LlcType.ADD_LINK, True)]


def drops(side: Side) -> list[LlcDropped]:
    return [e for e in side.pull_events() if isinstance(e, LlcDropped)]


def deliver(p: Pair, to: Side, link: Link, msg: LlcMessage) -> None:
    """``msg`` arrives at ``to`` on its ``link`` (sent by the peer over its end of it)."""
    p.sends.append((to, link.qpn, msg.encode()))
    p.pump()


def test_a_confirm_link_response_on_an_active_link_is_dropped_by_the_table() -> None:
    """A CONFIRM LINK response is taken on a link being confirmed only: on the active
    link of a group it is dropped and counted, the group and its connection untouched."""
    p = Pair()
    c, s = p.connect()
    p.pump()
    link = lgr_of(p.server).links[0]
    assert link.state is LinkState.LINK_ACTIVE
    dropped, sent = p.server.engine.dropped, len(p.server.llc_sent)
    late = ConfirmLink(flags=LLC_FLAG_RESP | LLC_FLAG_NO_RMBE_EYEC, sender_mac=bytes(6),
                       sender_gid=bytes(16), sender_qp_num=1, link_num=1, link_uid=bytes(4))
    deliver(p, p.server, link, late)
    assert p.server.engine.dropped == dropped + 1
    (drop,) = drops(p.server)
    assert drop.qpn == link.qpn and "CONFIRM_LINK response" in drop.reason
    assert "LINK_ACTIVE" in drop.reason
    assert len(p.server.llc_sent) == sent  # nothing answered
    assert p.server.engine.conns[s].state is SmcState.ACTIVE
    assert p.client.engine.conns[c].state is SmcState.ACTIVE


def test_an_add_link_response_on_a_link_being_confirmed_is_dropped_by_the_table() -> None:
    """An ADD LINK response is taken on the active link the server's flow runs over: on a
    first contact's link whose CONFIRM LINK is still unanswered it is dropped."""
    p = Pair()
    p.drop_llc = lambda side, data: side is p.client and data[0] == LlcType.CONFIRM_LINK
    p.connect()
    p.pump()
    link = lgr_of(p.server).links[0]
    assert link.state is LinkState.LINK_ACTIVATING
    answer = AddLink(flags=LLC_FLAG_RESP, sender_mac=bytes(6), sender_gid=bytes(16),
                     sender_qp_num=7, link_num=2, qp_mtu=3, initial_psn=5)
    dropped = p.server.engine.dropped
    deliver(p, p.server, link, answer)
    assert p.server.engine.dropped == dropped + 1
    (drop,) = drops(p.server)
    assert "ADD_LINK response" in drop.reason and "LINK_ACTIVATING" in drop.reason
    assert link.state is LinkState.LINK_ACTIVATING and link in p.server.engine.links.values()


def test_the_dispatcher_calls_a_handler_only_in_its_states() -> None:
    """The state check is the dispatcher's: a handler whose states exclude the link's is
    not called (the message dropped and counted); in its states it is."""
    p = Pair()
    p.connect()
    p.pump()
    engine = p.server.engine
    link = lgr_of(p.server).links[0]
    seen: list[LlcMessage] = []

    def handler(at: Link, msg: LlcMessage, now: float, out: list[Action]) -> None:
        seen.append(msg)

    key = (LlcType.TEST_LINK, False)
    engine.llc.table[key] = (handler, frozenset({LinkState.LINK_ACTIVATING}))
    dropped = engine.dropped
    deliver(p, p.server, link, TestLink())
    assert (seen, engine.dropped) == ([], dropped + 1)
    engine.llc.table[key] = (handler, frozenset({LinkState.LINK_ACTIVE}))
    deliver(p, p.server, link, TestLink())
    assert (len(seen), engine.dropped) == (1, dropped + 1)


# -- CLC ----------------------------------------------------------------------------


def test_the_clc_table_takes_one_type_per_waiting_state_and_a_decline_in_each() -> None:
    clc = Pair().client.engine.clc
    assert clc.expected == {
        (Role.CLIENT, HsState.PROPOSAL_SENT): ClcType.ACCEPT,
        (Role.SERVER, HsState.PROPOSAL_WAIT): ClcType.PROPOSAL,
        (Role.SERVER, HsState.CONFIRM_WAIT): ClcType.CONFIRM,
    }
    waiting = {(Role.CLIENT, HsState.PROPOSAL_SENT), (Role.CLIENT, HsState.CONFIRM_LINK_WAIT),
               (Role.CLIENT, HsState.DECLINE_WAIT), (Role.SERVER, HsState.PROPOSAL_WAIT),
               (Role.SERVER, HsState.CONFIRM_WAIT), (Role.SERVER, HsState.CONFIRM_LINK_RESP_WAIT)}
    assert {(role, state) for role, state, t in clc.table if t is ClcType.DECLINE} == waiting


def test_a_message_the_state_does_not_wait_for_fails_the_handshake_without_decline() -> None:
    """The server waits for the Confirm; a second Proposal fails its handshake (Linux
    ``smc_clc_wait_msg``: -EPROTO, no Decline): the first contact's group ends too."""
    p = Pair()
    c, s = p.connect()  # the Proposal is in, the Accept out
    assert p.server.engine.handshakes[s].state is HsState.CONFIRM_WAIT
    proposal = bytes(p.client.clc_out[c])
    out = p.server.engine.receive_clc(s, proposal, p.now)
    assert not any(isinstance(a, SendClc) for a in out)
    p.run(p.server, out)
    failed = [e for e in p.server.events if isinstance(e, HandshakeFailed)]
    assert [e.conn for e in failed] == [s] and "PROPOSAL" in failed[0].reason
    assert s not in p.server.engine.handshakes and s not in p.server.engine.conns
    assert any(isinstance(e, LinkGroupTerminated) for e in p.server.events)


@pytest.mark.parametrize("server", [False, True])
def test_a_decline_in_a_waiting_state_falls_back(server: bool) -> None:
    """A Decline is taken in every waiting state: here the client waiting for CONFIRM
    LINK, the server waiting for the Confirm; both on a first contact, whose group ends."""
    p = Pair()
    c, s = p.connect()
    side, conn = (p.server, s) if server else (p.client, c)
    if not server:
        p.drop_llc = lambda at, data: True  # CONFIRM LINK never comes
        p.pump()
    hs = side.engine.handshakes[conn]
    assert hs.state is (HsState.CONFIRM_WAIT if server else HsState.CONFIRM_LINK_WAIT)
    decline = ClcDecline.linux(DeclineCode.SYNCERR, b"\x07" * 8, version=hs.version)
    p.run(side, side.engine.receive_clc(conn, decline.encode(), p.now))
    assert FellBack(conn=conn, local_code=DeclineCode.PEERDECL,
                    peer_code=DeclineCode.SYNCERR) in side.events
    assert not side.engine.lgrs


def test_a_state_without_an_entry_takes_nothing() -> None:
    """A handshake in a state the table has no entry for fails on any message, as the
    reader fails a type its state does not wait for."""
    p = Pair()
    c, _ = p.connect()
    hs = p.client.engine.handshakes[c]
    hs.state = HsState.CLIENT_RKEY_WAIT  # (no handshake waits in it)
    decline = ClcDecline.linux(DeclineCode.SYNCERR, b"\x07" * 8, version=hs.version)
    p.run(p.client, p.client.engine.receive_clc(c, decline.encode(), p.now))
    (failed,) = [e for e in p.client.events if isinstance(e, HandshakeFailed)]
    assert failed.conn == c and "DECLINE received in state CLIENT_RKEY_WAIT" in failed.reason
    assert c not in p.client.engine.handshakes
