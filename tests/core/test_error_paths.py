"""Error paths of the engine: a failed send completion, a DELETE LINK of the only link,
an unsolicited LLC response.  Two engines wired in memory (``tests.core.pair``)."""

from __future__ import annotations

from smcr.core import ConnectionReset, LinkGroupTerminated, SmcState
from smcr.wire.llc import DeleteLink, TestLink
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
