"""Failover between the two links of a group (smc_switch_conns, DELETE LINK of one link).

Each test builds a symmetric group (ADD LINK), stops a client -> server transfer on
link 1 at one point, fails link 1 on one side, and checks that the server's
application reads every byte once, in order, and that both sides end with link 2
alone (SINGLE) after DELETE LINK.
"""

from __future__ import annotations

import pytest

from smcr.core import Action, Config, ConnectionReset, LgrType, LinkState, PostSend, RdmaWrite
from smcr.wire.llc import DeleteLink, LlcType, decode_llc
from tests.core.pair import Pair, Side, lgr_of

ADD = Config(add_links=True)
DATA = bytes(range(256)) * 40  # 10 KiB


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
    """Link 1's path goes: ``side`` sees its port 0 go down (its link 1 fails), the peer's
    port 0 is down too but the peer has not noticed (it learns of it by DELETE LINK).
    The server's offer of a link again (over port 1 of its own, asymmetric) is then
    rejected by the client, whose other port is down: both end with link 2 alone."""
    link1 = lgr_of(side).links[0]
    assert link1.link_id == 1
    p.peer(side).engine.ports_down.add(0)
    p.do(side, side.engine.port_down(0, "injected", p.now))


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
    # the DELETE LINK response, then the reject of the server's new offer: no CDC
    assert [m[:4] for m in p.client.llc_sent[sent_before:]] == [
        bytes.fromhex("042c00a0"), bytes.fromhex("022c01c0")]
    assert read_all(p, s) == b""
    _n, actions = p.client.write(c, b"after")
    p.do(p.client, actions)
    assert read_all(p, s) == b"after"


@pytest.mark.parametrize("detector", ["server", "client"])
def test_connections_move_only_once_the_peer_heard_of_the_loss(detector: str) -> None:
    """The side that sees link 1 fail sends DELETE LINK first and moves its connections
    (failover-validation CDC, bytes again) only once the peer has switched its own: a
    Linux peer answers a CDC over the link its connection is on, and one answer lost
    over the failed link is never sent again (failover.py's docstring).  So the first
    CDC of the detecting side over link 2 finds the peer's connection on link 2."""
    p, c, s = symmetric()
    write_stalled(p, c, DATA[:4000], deliver_cdc=False)
    side = p.server if detector == "server" else p.client
    peer_conn = (p.client.engine.conns[c] if side is p.server else p.server.engine.conns[s])
    link2 = lgr_of(side).links[1]
    before = len(side.cdc_sent)
    p.peer(side).engine.ports_down.add(0)  # (as fail_link1)
    p.run(side, side.engine.port_down(0, "injected", p.now))
    assert side.cdc_sent[before:] == []  # the DELETE LINK alone
    assert all(x.link is not None and x.link.link_id == 1 for x in lgr_of(side).conns.values())
    p.step_until(lambda: any(q == link2.qpn for q, _ in side.cdc_sent[before:]), "a CDC on link 2")
    assert peer_conn.link is not None and peer_conn.link.link_id == 2
    p.pump()
    assert_on_link2_only(p)
    assert read_all(p, s) == DATA[:4000]


@pytest.mark.parametrize("detector", ["server", "client"])
def test_connections_move_when_the_peer_never_answers(detector: str) -> None:
    """The peer does not answer the DELETE LINK (nor, a server, echo it): the connections
    move after the LLC wait time all the same, and the bytes go over link 2."""
    p, c, s = symmetric()
    write_stalled(p, c, DATA[:4000], deliver_cdc=False)
    side = p.server if detector == "server" else p.client
    p.drop_llc = lambda sender, data: sender is not side and data[0] == LlcType.DELETE_LINK
    p.peer(side).engine.ports_down.add(0)
    p.do(side, side.engine.port_down(0, "injected", p.now))
    assert all(x.link is not None and x.link.link_id == 1 for x in lgr_of(side).conns.values())
    p.advance(side.engine.config.llc_wait)
    p.pump()
    assert all(x.link is not None and x.link.link_id == 2 for x in lgr_of(side).conns.values())
    assert [x.link_id for x in lgr_of(side).links][:1] == [2]
    assert not [e for e in side.events if isinstance(e, ConnectionReset)]
    assert read_all(p, s) == DATA[:4000]


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


def test_failover_validation_cdc_bytes_as_linux() -> None:
    """smcr_cdc_msg_send_validation writes type, length, the sequence number of the last
    completed CDC, the peer's token and producer flag 0x08 into a send buffer Linux zeroes
    after each use (smc_wr_tx_process_cqe / smc_wr_tx_put_slot): every other byte is 0."""
    p, c, s = symmetric()
    _n, actions = p.client.write(c, b"z" * 100)
    p.do(p.client, actions)  # one CDC, completed: seq 1
    conn = p.client.engine.conns[c]
    p.server.engine.ports_down.add(0)
    link2 = lgr_of(p.client).links[1]
    before = len(p.client.cdc_sent)
    p.do(p.client, p.client.engine.port_down(0, "injected", p.now))
    cdcs = p.client.cdc_sent[before:]
    validation = cdcs[0][1]
    assert validation == (bytes.fromhex("fe2c") + (1).to_bytes(2, "big")
                          + conn.peer_token.to_bytes(4, "big") + bytes(16) + b"\x08"
                          + bytes(19))  # fmt: skip
    assert all(qpn == link2.qpn for qpn, _ in cdcs)
    assert read_all(p, s) == b"z" * 100


def test_unanswered_test_link_fails_over_not_ends_the_group() -> None:
    """Link 1's path breaks silently (nothing the client sends on it arrives): the TEST
    LINK probes of the idle links go unanswered on link 1, which each side then takes
    down as for any failure (smc_llc_testlink_work -> smcr_link_down_cond_sched): the
    connection moves to link 2, the group lives on, and, every port being up, the server
    adds a link again (link 3)."""
    p = Pair(Config(add_links=True, testlink_time=5.0), client_ports=2, server_ports=2)
    c, s = p.connect()
    p.pump()
    link1_c, link1_s = lgr_of(p.client).links[0], lgr_of(p.server).links[0]
    real = p._execute

    def execute(side: Side, a: Action) -> None:
        if side is p.client and isinstance(a, PostSend) and a.qpn == link1_c.qpn:
            return  # lost on the way
        real(side, a)

    p._execute = execute  # type: ignore[method-assign]
    p.advance(5.0)  # both sides probe their idle links
    assert link1_s.state is LinkState.LINK_ACTIVE  # waiting for the answer
    p.advance(ADD.llc_wait)
    for side, link1 in ((p.client, link1_c), (p.server, link1_s)):
        assert link1.state is LinkState.LINK_INACTIVE and link1.qpn in side.destroyed
        lgr = lgr_of(side)
        assert [x.link_id for x in lgr.links] == [2, 3] and lgr.lgr_type is LgrType.SYMMETRIC
        assert not [e for e in side.events if isinstance(e, ConnectionReset)]
    assert p.server.engine.conns[s].link is lgr_of(p.server).links[0]
    _n, actions = p.client.write(c, b"after the probe")
    p.do(p.client, actions)
    assert read_all(p, s) == b"after the probe"


@pytest.mark.parametrize("detector", ["server", "client"])
def test_many_connections_on_both_links_survive_a_path_loss(detector: str) -> None:
    """Twenty connections, balanced over links 1 and 2, each with bytes in flight (WRITEs
    done, CDCs lost) when port 0 goes: every connection ends on link 2 and the server
    reads every byte of each once, in order; then more bytes flow on each."""
    p, c0, s0 = symmetric()
    pairs = [(c0, s0)]
    for _ in range(19):
        pairs.append(p.connect())
        p.pump()
    on_link1 = [c for c, _s in pairs if p.client.engine.conns[c].link is lgr_of(p.client).links[0]]
    assert 5 <= len(on_link1) <= 15
    for i, (c, _s) in enumerate(pairs):
        write_stalled(p, c, DATA[: 500 + i], deliver_cdc=False)
    fail_link1(p, p.server if detector == "server" else p.client)
    assert_on_link2_only(p)
    for i, (c, s) in enumerate(pairs):
        _n, actions = p.client.write(c, b"tail %d" % i)
        p.do(p.client, actions)
        assert read_all(p, s) == DATA[: 500 + i] + b"tail %d" % i


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
    p.run(p.server, p.server.engine.link_failed(link1.qpn, "injected", p.now))
    # link 1 is cleared once the client answered the DELETE LINK (its answer comes before
    # its failover-validation CDC, on the same QP)
    p.step_until(lambda: link1.qpn in p.server.engine.late_links, "link 1 cleared")
    # the CDC's completion was in the CQ before anything the peer sends after the failover
    p.do(p.server, p.server.engine.receive_wr(link1.qpn, memoryview(cdc.data), p.now))
    for side in (p.client, p.server):  # (the server has added a link again meanwhile)
        assert all(x.link is not None and x.link.link_id == 2 for x in lgr_of(side).conns.values())
        assert not [e for e in side.events if isinstance(e, ConnectionReset)]
    assert read_all(p, s) == DATA[:4000]
    # an LLC message on the cleared link is dropped with it
    late = p.server.engine.receive_wr(link1.qpn, memoryview(bytes([LlcType.TEST_LINK]) + bytes(43)),
                                      p.now)  # fmt: skip
    assert late == []


def exchange(p: Pair, c: int, s: int, data: bytes) -> None:
    """``data`` from the client to the server and back: both sides' WRITEs over the
    connection's link, each landing only with the rkey the peer's RNIC on that link's
    port knows (the fake fabric checks it)."""
    for src, dst, a, b in ((p.client, p.server, c, s), (p.server, p.client, s, c)):
        n, actions = src.write(a, data)
        assert n == len(data)
        p.do(src, actions)
        got, actions = dst.read(b)
        p.do(dst, actions)
        assert got == data


@pytest.mark.parametrize("detector", ["server", "client"])
def test_a_connection_on_the_second_link_carries_bytes_and_survives_its_loss(
        detector: str) -> None:  # fmt: skip
    """A connection the server put on link 2 (port 1 to port 1): its CLC messages name the
    RMBs' rkeys on port 1's RNICs (not the RMBs' own, port 0's), and the CONFIRM RKEY that
    gave the rkeys for link 1 too counts for it although its CLC message came first; so
    when port 1 goes, it moves to link 1 with the peer's rkey there and goes on."""
    p, c0, s0 = symmetric()
    c, s = p.connect()
    p.pump()
    for side, conn in ((p.client, c), (p.server, s)):
        link = side.engine.conns[conn].link
        assert link is not None and link.link_id == 2 and link.port == 1
    exchange(p, c, s, DATA[:3000])
    side = p.server if detector == "server" else p.client
    p.peer(side).engine.ports_down.add(1)
    p.do(side, side.engine.port_down(1, "injected", p.now))
    for each in (p.client, p.server):
        lgr = lgr_of(each)
        assert [x.link_id for x in lgr.links if x.state is LinkState.LINK_ACTIVE] == [1]
        assert not [e for e in each.events if isinstance(e, ConnectionReset)]
    exchange(p, c, s, DATA[3000:6000])
    exchange(p, c0, s0, DATA[6000:7000])


def test_a_consumer_cursor_lost_with_the_link_is_asked_for_again() -> None:
    """The client filled the server's RMBE (but the byte held back: ``Connection.peer_hold``)
    and the server read it all, but the CDC with its consumer cursor went with link 1.
    The server switches as Linux does with an empty send buffer: the validation CDC alone
    (``smc_tx_sndbuf_nonempty`` sends nothing then, even when asked), so nothing tells the
    client of the room.  The client's switch writes the byte held back with a request for
    the cursor; the server answers, and the rest of the stream follows (a 96 MiB send to
    the kernel hung for ever on this: ``tests/interop/test_verbs.py``)."""
    p, c, s = symmetric()
    size = p.server.engine.conns[s].rmb.size
    data = bytes(i % 251 for i in range(3 * size))
    conn_c = p.client.engine.conns[c]
    written, actions = p.client.write(c, data)
    p.do(p.client, actions)
    assert (written, conn_c.tx_sent, conn_c.peer_space()) == (size, size - 1, 0)  # a byte waits
    link1 = lgr_of(p.server).links[0]
    real = p._execute
    validated: list[bool] = []

    def execute(side: Side, a: Action) -> None:
        if side is p.server and isinstance(a, PostSend) and a.data[:1] == b"\xfe":
            if a.qpn == link1.qpn:
                return  # lost with link 1
            if validated and not validated[-1]:
                validated.append(True)
                return  # (Linux's switch: the validation CDC alone)
            if a.data[24] & 0x08:
                validated.append(False)
        real(side, a)

    p._execute = execute  # type: ignore[method-assign]
    assert read_all(p, s) == data[: size - 1]  # its consumer cursor: lost
    assert conn_c.peer_cons == 0
    fail_link1(p, p.client)
    assert validated == [False, True]  # the server's switch sent no cursor
    assert_on_link2_only(p)
    got = data[: size - 1]
    while len(got) < len(data):
        more = read_all(p, s)
        assert more, f"stalled at {len(got)} of {len(data)} bytes"
        got += more
        n, actions = p.client.write(c, data[written:])
        p.do(p.client, actions)
        written += n
    assert got == data
    assert conn_c.peer_hold == 1  # (the cursor came: a byte is held back again)
