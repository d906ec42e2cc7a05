"""RMBs placed once the link group is chosen (``Provider.place_rmb``, Linux
``smc_buf_create`` after ``smc_conn_create``): a host that keeps a link group's RMBs
together (the shm RNIC's segments) is asked with the group each connection joins."""

from __future__ import annotations

import pytest

from smcr.core import FellBack, Rmb
from smcr.wire.clc import ClcDecline, decode_clc
from smcr.wire.decline import DeclineCode
from tests.core.pair import Pair, Side, lgr_of, transfer


def placing(side: Side, refuse: bool = False) -> list[tuple[int, int, int, int]]:
    """Give ``side`` a ``place_rmb`` that allocates (or refuses: None); returns the list of
    (conn, lgr_id, size, rkey placed) it was asked for."""
    asked: list[tuple[int, int, int, int]] = []

    def place_rmb(conn: int, lgr_id: int, size: int) -> Rmb | None:
        if refuse:
            asked.append((conn, lgr_id, size, 0))
            return None
        rmb = side.rmbs[conn] = side.fabric.alloc(size)
        asked.append((conn, lgr_id, size, rmb.rkey))
        return rmb

    side.place_rmb = place_rmb  # type: ignore[attr-defined]
    return asked


def test_each_end_places_its_rmb_in_the_group_the_connection_joins() -> None:
    """First contact and a connection that reuses the group: both ends are asked once per
    connection, with the group's id and the size the handshake asked for (the RMB handed
    to connect/accept says only that), and the peer writes into the RMB placed: its rkey
    is the one the CLC carried."""
    p = Pair()
    client_asked, server_asked = placing(p.client), placing(p.server)
    for size in (1 << 16, 1 << 15):
        c, s = p.connect(rmb_size=size)
        p.pump()
        assert transfer(p, c, s, b"placed %d" % size) == b"placed %d" % size
        client_conn, server_conn = p.client.engine.conns[c], p.server.engine.conns[s]
        assert client_conn.peer_rkey == server_asked[-1][3]
        assert server_conn.peer_rkey == client_asked[-1][3]
        assert client_conn.rmb.size == server_conn.rmb.size == size
    client_group, server_group = lgr_of(p.client).lgr_id, lgr_of(p.server).lgr_id
    assert [(a[1], a[2]) for a in client_asked] == [(client_group, 1 << 16),
                                                    (client_group, 1 << 15)]  # fmt: skip
    assert [(a[1], a[2]) for a in server_asked] == [(server_group, 1 << 16),
                                                    (server_group, 1 << 15)]  # fmt: skip


@pytest.mark.parametrize("refuser", ["server", "client"])
def test_an_end_that_cannot_place_the_rmb_declines_mem_and_both_fall_back(refuser: str) -> None:
    """The server on the Proposal, the client after the Accept: the end that cannot place
    declines ``MEM``, the other falls back on the peer's decline, and the first contact's
    group made for the connection is gone with it."""
    p = Pair()
    decliner, other = (p.server, p.client) if refuser == "server" else (p.client, p.server)
    placing(other)
    asked = placing(decliner, refuse=True)
    c, s = p.connect()
    p.pump()
    mine, theirs = (s, c) if refuser == "server" else (c, s)
    assert len(asked) == 1
    assert FellBack(conn=mine, local_code=DeclineCode.MEM, peer_code=0) in decliner.events
    assert FellBack(conn=theirs, local_code=DeclineCode.PEERDECL,
                    peer_code=DeclineCode.MEM) in other.events  # fmt: skip
    assert not decliner.engine.lgrs
    if refuser == "server":
        decline = decode_clc(bytes(p.server.clc_out[s]))
        assert isinstance(decline, ClcDecline) and decline.code is DeclineCode.MEM
    else:
        assert not p.server.engine.conns
