"""Error paths of the engine: a failed send completion, a DELETE LINK of the only link,
an unsolicited LLC response, a first link dying during the handshake, the LLC flow
queue on terminate, CDCs a peer should never send.  Two engines wired in memory
(``tests.core.pair``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from smcr.core import Action, ConnectionReset, FellBack, LinkGroupTerminated, SmcState
from smcr.core.handshake import HsState
from smcr.wire.cdc import CdcMessage, ConnectionStateFlags, ProducerFlags
from smcr.wire.clc import ClcDecline
from smcr.wire.cursor import Cursor
from smcr.wire.decline import DeclineCode
from smcr.wire.llc import DeleteLink, LlcType, TestLink
from tests.core.pair import Pair


def active_pair() -> tuple[Pair, int, int, int]:
    """A connected pair with one connection; returns it, both conn ids and the client's QPN."""
    p = Pair()
    c, s = p.connect()
    p.pump()
    assert p.client.engine.conns[c].state is SmcState.ACTIVE
    qpn = next(iter(p.client.engine.lgrs.values())).links[0].qpn
    return p, c, s, qpn


def test_failed_send_completion_downs_the_link_and_resets_its_connections() -> None:
    """Linux ``smc_wr_tx_process_cqe``: a send completing with an error ends the link;
    with one link the link group goes, and its connections are reset."""
    p, c, _, qpn = active_pair()
    p.run(p.client, p.client.engine.send_completed(qpn, 1, False, p.now))
    assert [e.conn for e in p.client.events if isinstance(e, ConnectionReset)] == [c]
    assert any(isinstance(e, LinkGroupTerminated) for e in p.client.events)
    assert qpn in p.client.destroyed
    assert not p.client.engine.lgrs


def test_delete_link_of_the_only_link_ends_the_group() -> None:
    """A DELETE LINK naming our only link (not ALL): no link is left to move the
    connections to, so the group ends (Linux ``smc_llc_rmt_delete_link`` on a
    single-link group; ``smc_lgr_terminate``)."""
    p, c, _, qpn = active_pair()
    link = next(iter(p.client.engine.lgrs.values())).links[0]
    request = DeleteLink(link_num=link.link_id, reason=0x00010000)
    p.sends.append((p.client, qpn, request.encode()))
    p.pump()
    assert [e.conn for e in p.client.events if isinstance(e, ConnectionReset)] == [c]
    assert not p.client.engine.lgrs
    assert qpn in p.client.destroyed


def test_unsolicited_llc_response_is_dropped_and_the_link_stays() -> None:
    """A TEST LINK *response* nobody asked for is ignored, as Linux ``smc_llc_rx_response``
    ignores one with no TEST LINK outstanding: no answer, no event, the link stays."""
    p, c, s, qpn = active_pair()
    events_before, sent_before = len(p.client.events), len(p.client.llc_sent)
    p.sends.append((p.client, qpn, TestLink().response().encode()))
    p.pump()
    assert p.client.events[events_before:] == []
    assert p.client.llc_sent[sent_before:] == []  # a response is never echoed
    _, acts = p.client.write(c, b"still here")
    p.do(p.client, acts)
    assert p.server.read(s)[0] == b"still here"


def client_waits_for_confirm_link(p: Pair, c: int) -> bool:
    """Whether the client's handshake ``c`` has its QP up and waits for CONFIRM LINK."""
    hs = p.client.engine.handshakes.get(c)
    return hs is not None and hs.state is HsState.CONFIRM_LINK_WAIT


def until_client_waits_for_confirm_link(p: Pair, c: int) -> int:
    """Step a first contact until the client has its QP up and waits for CONFIRM LINK;
    drop what is in flight (the server has not seen the Confirm); the client's QPN."""
    p.step_until(lambda: client_waits_for_confirm_link(p, c), "the client waits for CONFIRM LINK")
    hs = p.client.engine.handshakes[c]
    assert hs.link is not None
    p.sends.clear()
    p.pending_actions.clear()
    return hs.link.qpn


def test_link_down_while_the_client_waits_for_confirm_link_waits_for_the_servers_decline() -> None:
    """The client's first link dies while it waits for CONFIRM LINK (the server's QP
    failed and was destroyed): as Linux ``smcr_clnt_conf_first_link`` it sends no Decline
    at once but waits ``CLC_WAIT_TIME_SHORT`` for the server's -- two Declines crossing
    would leave one in the fallen-back server's data -- and falls back on it."""
    p = Pair()
    c, _ = p.connect()
    qpn = until_client_waits_for_confirm_link(p, c)
    sent = len(p.client.clc_out[c])
    p.run(p.client, p.client.engine.link_failed(qpn, "receive WR_FLUSH_ERR", p.now))
    assert p.client.engine.handshakes[c].state is HsState.DECLINE_WAIT
    assert not p.client.engine.lgrs and qpn in p.client.destroyed
    assert len(p.client.clc_out[c]) == sent  # no Decline of ours
    assert not [e for e in p.client.events if isinstance(e, FellBack)]
    decline = ClcDecline.linux(DeclineCode.ERR_RDYLNK, b"\x00\x01" + b"\x02" * 6, version=1)
    p.run(p.client, p.client.engine.receive_clc(c, decline.encode(), p.now + 0.5))
    assert [e for e in p.client.events if isinstance(e, FellBack)] == [
        FellBack(conn=c, local_code=DeclineCode.PEERDECL, peer_code=DeclineCode.ERR_RDYLNK)]
    assert len(p.client.clc_out[c]) == sent


def test_link_down_while_the_client_waits_for_confirm_link_and_no_decline_comes() -> None:
    """... and when no Decline comes within the short wait, the client declines
    TIMEOUT_CL (Linux: ``SMC_CLC_DECL_TIMEOUT_CL``) and falls back."""
    p = Pair()
    c, _ = p.connect()
    qpn = until_client_waits_for_confirm_link(p, c)
    sent = len(p.client.clc_out[c])
    p.run(p.client, p.client.engine.link_failed(qpn, "receive WR_FLUSH_ERR", p.now))
    p.run(p.client, p.client.engine.handle_timer(p.now + 0.9))
    assert c in p.client.engine.handshakes
    p.run(p.client, p.client.engine.handle_timer(p.now + 1.0))
    assert [e for e in p.client.events if isinstance(e, FellBack)] == [
        FellBack(conn=c, local_code=DeclineCode.TIMEOUT_CL, peer_code=0)]
    sent_now = bytes(p.client.clc_out[c][sent:])
    assert ClcDecline.decode(sent_now).peer_diagnosis == DeclineCode.TIMEOUT_CL


def test_the_own_qp_failing_to_come_up_declines_at_once() -> None:
    """Not so when the client's own QP could not be brought up (``ERR_RDYLNK``, Linux
    ``smc_connect_rdma``): nothing is coming from the server then, the Decline goes at once."""
    p = Pair()
    c, _ = p.connect()
    qpn = until_client_waits_for_confirm_link(p, c)
    p.run(p.client, p.client.engine.link_failed(qpn, "RTR: injected", p.now,
                                                DeclineCode.ERR_RDYLNK))  # fmt: skip
    assert [e for e in p.client.events if isinstance(e, FellBack)] == [
        FellBack(conn=c, local_code=DeclineCode.ERR_RDYLNK, peer_code=0)]


def test_terminate_drains_the_llc_flow_queue_with_a_negative_outcome() -> None:
    """Local LLC flows run one at a time per link group; the group ending (here its link
    failing) finishes the running flow and every queued one with ok=False, in order, at
    once: nothing waits for a timer, and no flow's request goes out afterwards."""
    p, _, _, qpn = active_pair()
    lgr = next(iter(p.client.engine.lgrs.values()))
    p.drop_llc = lambda side, data: True  # the peer never answers
    outcomes: list[tuple[int, bool]] = []

    def recorder(n: int) -> Callable[[bool, float], list[Action]]:
        def done(ok: bool, now: float) -> list[Action]:
            outcomes.append((n, ok))
            return []

        return done

    out: list[Action] = []
    for n in range(3):
        p.client.engine.llc.start_flow(lgr, TestLink(), recorder(n), p.now, out)
    p.do(p.client, out)
    assert (lgr.flow is not None, len(lgr.flow_queue)) == (True, 2)  # one runs, two wait
    sent_before = len(p.client.llc_sent)
    p.run(p.client, p.client.engine.link_failed(qpn, "send RETRY_EXC_ERR", p.now))
    assert outcomes == [(0, False), (1, False), (2, False)]
    assert (lgr.flow, len(lgr.flow_queue)) == (None, 0)
    assert p.client.engine.get_timer() is None  # no flow deadline left behind
    p.advance(10.0)
    assert outcomes == [(0, False), (1, False), (2, False)]  # each finished once
    assert len(p.client.llc_sent) == sent_before


def test_a_released_rmb_is_reusable_only_once_the_peer_answered_its_delete_rkey() -> None:
    """Released after an abort (the peer may still be writing), release announces the
    RMB's end (DELETE RKEY); only the answer makes it reusable (``ReuseRmb``, Linux
    ``smcr_buf_unuse``): a write the peer posted before it arrives before it.  A peer
    that never answers: reusable when the flow times out."""
    p, c, s, _ = active_pair()
    p.drop_llc = lambda side, data: side is p.client and data[0] == LlcType.DELETE_RKEY \
        and bool(data[3] & 0x80)  # the client's answers are lost
    p.do(p.client, p.client.engine.abort(c, p.now))
    p.do(p.server, p.server.engine.close(s, p.now))
    assert s in p.server.released and c in p.client.released
    assert p.client.reused == [c]  # the server answered the client's DELETE RKEY
    assert p.server.reused == []  # the client's answer was lost: still the peer's to write
    p.advance(p.server.engine.config.llc_wait - 0.1)
    assert p.server.reused == []
    p.advance(0.1)  # no answer came: the flow gives up, the RMB is reusable
    assert p.server.reused == [s]


def test_a_released_rmb_of_a_dead_link_is_reusable_at_once() -> None:
    """Released on a link group that has ended: the QP is gone, nobody can write into the
    RMB any more, so it is reusable at once (and pending DELETE RKEY flows end with it)."""
    p, c, _, qpn = active_pair()
    p.run(p.client, p.client.engine.link_failed(qpn, "send RETRY_EXC_ERR", p.now))
    p.do(p.client, p.client.engine.close(c, p.now))
    assert c in p.client.released and p.client.reused == [c]


# -- a peer whose CDC cannot be right: the connection is aborted, the link stays -------------


def hostile_cdc(p: Pair, conn: int, qpn: int, seq_step: int = 1, pwrap: int = 0,
                pcount: int = 0, cwrap: int = 0, ccount: int = 0,
                flags: int = 0) -> None:  # fmt: skip
    """Deliver to the client's connection ``conn`` a CDC as if from the server."""
    c = p.client.engine.conns[conn]
    msg = CdcMessage(sequence_number=(c.rx_seq + seq_step) & 0xFFFF, alert_token=c.token,
                     producer_cursor=Cursor(pwrap, pcount), consumer_cursor=Cursor(cwrap, ccount),
                     producer_flags=ProducerFlags(flags))  # fmt: skip
    p.sends.append((p.client, qpn, msg.encode()))
    p.pump()


@pytest.mark.parametrize(("fields", "why"), [
    ({"pcount": 65536}, "CDC cursor outside the ring"),  # == the RMB's size
    ({"pwrap": 2, "pcount": 10}, "peer wrote more than our RMBE holds"),
    ({"ccount": 100}, "peer consumed more than we wrote"),  # we wrote nothing
    ({"flags": ProducerFlags.FAILOVER_VALIDATION},  # seq newer than the last CDC
     "failover validation CDC newer than the last CDC received"),
], ids=["cursor-outside", "overrun", "consumed-unwritten", "failover-newer"])  # fmt: skip
def test_a_cdc_that_cannot_be_right_aborts_the_connection(fields: dict[str, Any],
                                                          why: str) -> None:  # fmt: skip
    """smcr checks the peer's cursors (one past a ring would move reads and writes outside
    the buffers): such a CDC aborts its connection (abort CDC, as ``smc_conn_kill``), the
    peer's connection sees the abort, and the link and its group stay."""
    p, c, s, qpn = active_pair()
    hostile_cdc(p, c, qpn, **fields)
    assert [(e.conn, e.reason) for e in p.client.events if isinstance(e, ConnectionReset)] == [
        (c, f"peer fault: {why}")]  # fmt: skip
    assert p.client.engine.conns[c].state is SmcState.CLOSED
    peer = p.server.engine.conns[s]  # it got our abort CDC: its reads end in a reset
    assert peer.state is SmcState.PROCESSABORT
    assert peer.rx_flags & ConnectionStateFlags.PEER_CONNECTION_ABORT
    assert p.client.engine.lgrs and p.server.engine.lgrs and qpn not in p.client.destroyed


def test_stale_and_replayed_cdcs_change_nothing() -> None:
    """A CDC with an old sequence number is dropped (``smc_cdc_rx_handler``), and a failover
    validation CDC no newer than the last one received is taken without effect."""
    p, c, _, qpn = active_pair()
    conn = p.client.engine.conns[c]
    before = (conn.rx_prod, conn.peer_cons, conn.rx_seq)
    hostile_cdc(p, c, qpn, seq_step=-1, pcount=100)  # would announce 100 bytes
    hostile_cdc(p, c, qpn, seq_step=0, flags=ProducerFlags.FAILOVER_VALIDATION)
    assert (conn.rx_prod, conn.peer_cons, conn.rx_seq) == before
    assert conn.state is SmcState.ACTIVE
    assert not [e for e in p.client.events if isinstance(e, ConnectionReset)]
