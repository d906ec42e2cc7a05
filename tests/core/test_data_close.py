"""Data path and close state machine between two in-memory engines."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smcr.core import Config, Connection, ConnectionReset, SmcState
from smcr.core.close import TRANSITIONS, CloseInput, Send, step
from smcr.core.events import PostSend
from smcr.wire.cdc import CdcMessage, ConnectionStateFlags, ProducerFlags
from smcr.wire.cursor import Cursor
from tests.core.pair import Pair

SMALL = Config(sndbuf_size=16384, rmb_size=16384)


def ready(cfg: Config = SMALL) -> tuple[Pair, int, int]:
    p = Pair(cfg)
    c, s = p.connect(rmb_size=cfg.rmb_size)
    p.pump()
    return p, c, s


def transfer(p: Pair, src: object, dst: object, sc: int, dc: int, data: bytes,
             read_chunk: int = 5000) -> bytes:
    got = bytearray()
    off = 0
    for _ in range(10_000):
        if off < len(data):
            n, acts = src.write(sc, data[off:off + 7000], p.now)  # type: ignore[attr-defined]
            off += n
            p.do(src, acts)  # type: ignore[arg-type]
        chunk, acts = dst.read(dc, read_chunk, p.now)  # type: ignore[attr-defined]
        got += chunk
        p.do(dst, acts)  # type: ignore[arg-type]
        if len(got) == len(data):
            return bytes(got)
    raise AssertionError("transfer stalled")


def test_data_with_wrap_around_both_rings() -> None:
    p, c, s = ready()
    data = os.urandom(100_000)  # six times round a 16 KiB RMBE and send buffer
    assert transfer(p, p.client, p.server, c, s, data) == data
    back = os.urandom(50_001)
    assert transfer(p, p.server, p.client, s, c, back, read_chunk=777) == back
    conn = p.client.engine.conns[c]
    assert conn.tx_sent == 100_000 and conn.tx_fin == 100_000


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 20000), min_size=1, max_size=8), st.integers(300, 17000))
def test_transfer_any_sizes(writes: list[int], chunk: int) -> None:
    p, c, s = ready()
    data = b"".join(os.urandom(n) for n in writes)
    assert transfer(p, p.client, p.server, c, s, data, read_chunk=chunk) == data


def test_inline_writes_mixed_with_copies_across_wraps() -> None:
    """The inline data path (Connection.write_inline) where it may run, the send buffer
    where it may not: the bytes arrive in order round both rings, the accounting is one."""
    p, c, s = ready()
    data = os.urandom(150_000)
    got, off, inline = bytearray(), 0, 0
    cl, sv = p.client, p.server
    conn = cl.engine.conns[c]
    for _ in range(10_000):
        if off < len(data):
            piece = data[off : off + 7000]
            if conn.direct_room() >= len(piece):  # else it would be cut: copy instead
                n, acts = cl.write_inline(c, piece)
                inline += n
            else:
                n, acts = cl.write(c, piece, p.now)
            off += n
            p.do(cl, acts)
        chunk, acts = sv.read(s, 3000, p.now)
        got += chunk
        p.do(sv, acts)
        if len(got) == len(data):
            break
    assert bytes(got) == data
    assert 0 < inline < len(data)  # both paths ran
    assert conn.tx_sent == conn.tx_app == conn.tx_fin == len(data)


def test_inline_write_limits_and_flags() -> None:
    p, c, s = ready()
    conn = p.client.engine.conns[c]
    room = conn.direct_room()
    assert room == 16383  # the peer's RMBE but the byte held back (Connection.peer_hold)
    with pytest.raises(ValueError):
        conn.write_inline(memoryview(bytes(room + 1)))
    with pytest.raises(ValueError):
        conn.write_inline(memoryview(b""))
    n, acts = p.client.write_inline(c, bytes(room))  # fills the peer's RMBE
    assert n == room
    (post,) = acts
    assert isinstance(post, PostSend)
    msg = CdcMessage.decode(post.data)
    assert msg.producer_cursor == Cursor(0, 16383)
    assert msg.producer_flags == ProducerFlags.WRITE_BLOCKED  # (no request)
    p.do(p.client, acts)
    assert conn.direct_room() == 0  # the peer's RMBE is full
    _, acts = p.server.read(s, 5000, p.now)
    p.do(p.server, acts)
    assert conn.direct_room() == 5000  # the consumer update reopened it
    conn.urg_tx_end = conn.tx_app + 1  # an urgent byte not yet out: only the copy path
    assert conn.direct_room() == 0


def test_window_full_blocks_sender_and_reader_reopens_it() -> None:
    p, c, s = ready()
    conn = p.client.engine.conns[c]
    _, acts = p.client.write(c, b"a" * 16383)  # the RMBE full but the byte held back
    p.do(p.client, acts)
    assert conn.peer_space() == 0
    n2, acts = p.client.write(c, b"b" * 16384)  # send buffer took it, RMBE full
    p.do(p.client, acts)
    assert n2 == 16384 and conn.tx_sent == 16383
    assert conn.sndbuf_space() == 0
    n3, acts = p.client.write(c, b"c")
    assert n3 == 0  # the app would block or get BlockingIOError
    # the CDC carried "write blocked": the first read past 10 % answers at once
    assert p.server.engine.conns[s].peer_write_blocked
    _, acts = p.server.read(s, 3000)
    p.do(p.server, acts)
    assert conn.peer_cons == 3000 and conn.tx_sent == 16383 + 3000


def _cdcs_in_flight(p: Pair) -> list[bytes]:
    """Take the messages queued for the server (they stay undelivered)."""
    out = [data for side, _qpn, data in p.sends if side is p.server]
    p.sends.clear()
    return out


@pytest.mark.parametrize("story", ["plain", "urgent", "close", "bad_cursor"])
def test_coalesced_cdcs_leave_the_state_one_by_one_would(story: str) -> None:
    """CDCs that wait together go to the engine as a batch (receive_wrs): cursor-only
    ones are coalesced, the rest applied in place; the outcome is what delivering
    them one by one gives -- cursors, flags, urgent mark, close state, abort."""
    outcomes = []
    for batched in (False, True):
        p, c, s = ready()
        for i in range(5):
            _, acts = p.client.write(c, bytes([i]) * 1500, p.now)
            p.run(p.client, acts)
            if story == "urgent" and i == 2:  # one MSG_OOB byte in the middle
                sender = p.client.engine.conns[c]
                buf = p.client.sndbufs[c]
                buf[sender.tx_app % len(buf)] = ord("!")
                p.run(p.client, p.client.engine.data_written(c, 1, p.now, urgent=True))
        if story == "close":
            p.run(p.client, p.client.engine.shutdown_write(c, p.now))
        datas = _cdcs_in_flight(p)
        if story == "bad_cursor":
            bad = bytearray(datas[1])
            bad[12:16] = (99999).to_bytes(4, "big")  # producer count outside the 16 KiB ring
            datas[1] = bytes(bad)
        assert len(datas) >= 5
        qpn = next(iter(p.server.engine.lgrs.values())).links[0].qpn
        if batched:
            p.run(p.server, p.server.engine.receive_wrs(qpn, [memoryview(d) for d in datas],
                                                        p.now))  # fmt: skip
        else:
            for d in datas:
                p.run(p.server, p.server.engine.receive_wr(qpn, memoryview(d), p.now))
        conn = p.server.engine.conns[s]
        outcomes.append((conn.rx_prod, conn.peer_cons, conn.rx_flags, conn.urg_rx_pos,
                         conn.state, conn.reset_reason, conn.peer_write_blocked,
                         [type(e).__name__ for e in p.server.events[-2:]]))  # fmt: skip
    assert outcomes[0] == outcomes[1]
    if story == "bad_cursor":
        assert outcomes[1][5]  # reset: the bad CDC was not coalesced away
    elif story == "close":
        assert outcomes[1][2]  # done writing seen
    else:
        assert outcomes[1][0] == 5 * 1500 + (1 if story == "urgent" else 0)
        assert (outcomes[1][3] is not None) == (story == "urgent")


def test_consumer_update_rule_small_reads_send_nothing() -> None:
    p, c, s = ready(Config())
    _, acts = p.client.write(c, b"x" * 1000)
    p.do(p.client, acts)
    seq = p.server.engine.conns[s].seq
    _, acts = p.server.read(s)
    assert acts == []  # 1000 bytes < max(RMBE/10, 2304): no CDC
    assert p.server.engine.conns[s].seq == seq


def test_cdc_with_cursor_outside_ring_aborts_connection() -> None:
    p, c, s = ready()
    conn = p.client.engine.conns[c]
    qpn = next(iter(p.client.engine.lgrs.values())).links[0].qpn
    bad = CdcMessage(5, conn.token, producer_cursor=Cursor(0, 99999))
    p.do(p.client, p.client.engine.receive_wr(qpn, memoryview(bad.encode()), p.now))
    assert any(isinstance(e, ConnectionReset) for e in p.client.events)
    assert conn.state is SmcState.CLOSED
    assert p.server.engine.conns[s].state is SmcState.PROCESSABORT  # got our abort CDC


def test_cdc_overfilling_rmbe_aborts_and_old_seqno_is_dropped() -> None:
    p, c, _ = ready()
    conn = p.client.engine.conns[c]
    qpn = next(iter(p.client.engine.lgrs.values())).links[0].qpn
    old = CdcMessage(0xFFF0, conn.token, producer_cursor=Cursor(0, 10))
    p.do(p.client, p.client.engine.receive_wr(qpn, memoryview(old.encode()), p.now))
    assert conn.rx_prod == 0  # seqno before the last one: dropped
    over = CdcMessage(conn.rx_seq + 1, conn.token, producer_cursor=Cursor(1, 10))
    p.do(p.client, p.client.engine.receive_wr(qpn, memoryview(over.encode()), p.now))
    assert conn.state is SmcState.CLOSED


def test_urgent_data_marks_last_byte() -> None:
    p, c, s = ready()
    _, acts = p.client.write(c, b"hello")
    p.do(p.client, acts)
    _, acts = p.client.write(c, b"!")
    acts = p.client.engine.data_written(c, 0, p.now, urgent=True) + acts
    p.do(p.client, acts)
    sconn = p.server.engine.conns[s]
    assert sconn.rx_prod == 6


def test_urgent_flag_on_the_wire() -> None:
    p, c, s = ready()
    conn = p.client.engine.conns[c]
    buf = p.client.sndbufs[c]
    buf[0:3] = b"ab!"
    p.do(p.client, p.client.engine.data_written(c, 3, p.now, urgent=True))
    sconn = p.server.engine.conns[s]
    assert sconn.urg_rx_pos == 2 and conn.urg_tx_end is None


# ------------------------------------------------------------------ close


def state(conn: Connection) -> SmcState:
    """The close state, read through a function so that mypy does not narrow it."""
    return conn.state


def test_active_close_then_passive_close() -> None:
    p, c, s = ready()
    p.do(p.client, p.client.engine.close(c, p.now))
    assert p.client.engine.conns[c].state is SmcState.PEERCLOSEWAIT1
    assert p.client.tcp_shut[c] == 2  # TCP shut down right after the closed CDC
    assert p.server.engine.conns[s].state is SmcState.APPCLOSEWAIT1
    p.do(p.server, p.server.engine.close(s, p.now))
    assert s in p.server.released and c in p.client.released
    # each end's TCP socket shut down both ways once (the active end's twice before: after
    # its closed CDC, and again when the peer's answer ended the connection)
    assert p.client.tcp_shutdowns[c] == [2] and p.server.tcp_shutdowns[s] == [2]


def test_a_half_closed_connection_shuts_its_tcp_socket_down_further_when_it_ends() -> None:
    p, c, s = ready()
    p.do(p.client, p.client.engine.shutdown_write(c, p.now))
    p.do(p.server, p.server.engine.close(s, p.now))
    p.do(p.client, p.client.engine.close(c, p.now))
    assert p.client.tcp_shutdowns[c] == [1, 2] and p.server.tcp_shutdowns[s] == [2]


def test_half_close_shutdown_write() -> None:
    p, c, s = ready()
    p.do(p.client, p.client.engine.shutdown_write(c, p.now))
    cc, sc = p.client.engine.conns[c], p.server.engine.conns[s]
    assert state(cc) is SmcState.PEERCLOSEWAIT1 and p.client.tcp_shut[c] == 1
    assert cc.tx_flags == ConnectionStateFlags.PEER_DONE_WRITING
    assert state(sc) is SmcState.APPCLOSEWAIT1 and sc.peer_done
    # the server still sends; the client still reads
    _, acts = p.server.write(s, b"reply")
    p.do(p.server, acts)
    assert p.client.read(c)[0] == b"reply"
    p.do(p.server, p.server.engine.shutdown_write(s, p.now))
    assert state(sc) is SmcState.APPCLOSEWAIT2
    assert state(cc) is SmcState.PEERCLOSEWAIT2
    p.do(p.client, p.client.engine.close(c, p.now))  # closed CDC with 0x80 still set (C0)
    assert cc.tx_flags == ConnectionStateFlags(0xC0)
    assert state(sc) is SmcState.APPCLOSEWAIT2
    p.do(p.server, p.server.engine.close(s, p.now))
    assert state(cc) is SmcState.CLOSED and state(sc) is SmcState.CLOSED


def test_shutdown_then_peer_closes_appfinclosewait() -> None:
    p, c, s = ready()
    cc, sc = p.client.engine.conns[c], p.server.engine.conns[s]
    p.do(p.client, p.client.engine.shutdown_write(c, p.now))
    p.do(p.server, p.server.engine.close(s, p.now))
    assert state(cc) is SmcState.APPFINCLOSEWAIT
    assert state(sc) is SmcState.PEERFINCLOSEWAIT
    p.do(p.client, p.client.engine.close(c, p.now))
    assert state(cc) is SmcState.CLOSED
    assert s in p.server.released


def test_close_with_unread_data_sends_abort() -> None:
    p, c, s = ready()
    _, acts = p.server.write(s, b"unread")
    p.do(p.server, acts)
    p.do(p.client, p.client.engine.close(c, p.now))
    assert p.client.engine.conns[c].tx_flags == ConnectionStateFlags.PEER_CONNECTION_ABORT
    assert p.server.engine.conns[s].state is SmcState.PROCESSABORT
    p.do(p.server, p.server.engine.close(s, p.now))
    assert s in p.server.released


def test_close_with_bytes_that_cannot_go_aborts_rather_than_end_the_stream_short() -> None:
    """The host's wait for the send buffer ended (the peer's RMBE stayed full): a closed
    CDC would give the peer EOF after the bytes it has, as if that were all; an abort
    tells it the stream broke, and the unsent bytes are dropped, never written after."""
    p, c, s = ready()
    conn = p.client.engine.conns[c]
    _, acts = p.client.write(c, b"a" * 16383)  # (the RMBE but the byte held back)
    p.do(p.client, acts)
    n, acts = p.client.write(c, b"b" * 1000)  # into the send buffer: the RMBE is full
    p.do(p.client, acts)
    assert n == 1000 and conn.tx_pending() == 1000 and conn.peer_space() == 0
    p.do(p.client, p.client.engine.close(c, p.now))
    assert conn.tx_flags == ConnectionStateFlags.PEER_CONNECTION_ABORT
    assert conn.tx_pending() == 0
    server = p.server.engine.conns[s]
    assert server.state is SmcState.PROCESSABORT and not server.peer_finished
    _, acts = p.server.read(s)  # the server reads what came: the RMBE opens, nothing more
    p.do(p.server, acts)
    assert conn.tx_sent == 16383


def test_close_with_bytes_that_fit_sends_them_and_closes() -> None:
    """Bytes still in the send buffer that the peer's RMBE has room for go with the
    closed CDC: a clean end."""
    p, c, s = ready()
    p.client.cork_write(c, b"tail")  # in the send buffer, no CDC yet
    assert p.client.engine.conns[c].tx_pending() == 4
    p.do(p.client, p.client.engine.close(c, p.now))
    conn = p.client.engine.conns[c]
    assert conn.tx_flags == ConnectionStateFlags.PEER_CONNECTION_CLOSED
    assert p.server.read(s)[0] == b"tail" and p.server.engine.conns[s].peer_finished


def test_an_abort_keeps_the_connection_and_its_rmb_until_the_peer_answers() -> None:
    """SO_LINGER 0 (``Engine.abort``) while the peer is sending: the abort CDC goes out and
    the application is done, but the connection (its RMB registered with the peer) waits
    in PEERCLOSEWAIT1, as Linux's after its linger-0 close, until the peer's closing CDC:
    only then is it released and its RMB's DELETE RKEY sent.  Released at once, its DELETE
    RKEY reached the Linux kernel while it still wrote into the RMB; the kernel, which
    clears the rtoken on DELETE RKEY, wrote with rkey 0, and the access error ended the
    link group (seen live, tests/interop)."""
    p, c, s = ready()
    _, acts = p.server.write(s, b"x" * 5000)  # the peer sends, the client reads nothing
    p.do(p.server, acts)
    p.client.llc_sent.clear()
    p.do(p.client, p.client.engine.abort(c, p.now))
    client = p.client.engine.conns[c]
    assert client.tx_flags == ConnectionStateFlags.PEER_CONNECTION_ABORT
    assert (client.state, client.released) == (SmcState.PEERCLOSEWAIT1, True)
    assert c not in p.client.released and p.client.llc_sent == []  # no DELETE RKEY yet
    server = p.server.engine.conns[s]
    assert server.state is SmcState.PROCESSABORT and server.aborted
    _, acts = p.server.write(s, b"y" * 100)  # the peer's write before it has closed lands
    p.do(p.server, acts)
    assert c not in p.client.released
    p.do(p.server, p.server.engine.close(s, p.now))  # its close answers with abort
    assert server.tx_flags & ConnectionStateFlags.PEER_CONNECTION_ABORT
    assert s in p.server.released
    assert c in p.client.released and client.state is SmcState.CLOSED
    requests = [m[0] for m in p.client.llc_sent if not m[3] & 0x80]
    assert requests == [0x09]  # now the DELETE RKEY of its RMB


def test_an_abort_after_the_peer_closed_releases_at_once() -> None:
    p, c, s = ready()
    p.do(p.server, p.server.engine.close(s, p.now))
    assert p.client.engine.conns[c].state is SmcState.APPCLOSEWAIT1
    p.do(p.client, p.client.engine.abort(c, p.now))
    assert c in p.client.released and s in p.server.released


def test_simultaneous_close() -> None:
    p, c, s = ready()
    a1 = p.client.engine.close(c, p.now)
    a2 = p.server.engine.close(s, p.now)
    p.run(p.client, a1)
    p.run(p.server, a2)
    p.pump()
    assert p.client.engine.conns.get(c) is None or c in p.client.released
    assert c in p.client.released and s in p.server.released


def test_close_table_every_pair_is_total() -> None:
    for state in SmcState:
        for ev in CloseInput:
            send, new = step(state, ev)
            assert isinstance(send, Send) and isinstance(new, SmcState)
    assert all(new is SmcState.CLOSED for (st_, ev), (_, new) in TRANSITIONS.items()
               if ev is CloseInput.LINK_DOWN)


@pytest.mark.parametrize("flag", [0x80, 0x40, 0x20])
def test_peer_flags_are_sticky_on_the_wire(flag: int) -> None:
    msg = CdcMessage(1, 1, connection_state_flags=ConnectionStateFlags(flag),
                     producer_flags=ProducerFlags(0))
    assert msg.encode()[25] == flag


@given(st.integers(0, 1 << 40), st.integers(0, 0xFFFF), st.sampled_from([1, 7, 16384, 1 << 20]),
       st.data())  # fmt: skip
def test_int_cursor_advance_matches_cursor_compare(absolute: int, wrap: int, size: int,
                                                    data: st.DataObject) -> None:  # fmt: skip
    """The data path's int form of ``advance_to`` is ``compare`` on Cursor objects."""
    from smcr.core.connection import _advance, to_cursor  # noqa: PLC0415
    from smcr.wire.cursor import compare  # noqa: PLC0415

    count = data.draw(st.integers(0, size - 1))
    delta = compare(to_cursor(absolute, size), Cursor(wrap, count), size)
    expected = absolute + delta if delta > 0 else absolute
    assert _advance(absolute, wrap, count, size) == expected


def test_send_buffer_size_from_the_host_not_the_config() -> None:
    """The runtime sizes each send buffer from SO_SNDBUF (as Linux does): the engine
    must ring-wrap at that size, not at ``Config.sndbuf_size``."""
    p = Pair(Config())  # configured 64 KiB
    c, s = p.connect(rmb_size=16384, sndbuf_size=8192)
    p.pump()
    assert p.client.engine.conns[c].sndbuf_size == 8192
    data = os.urandom(60_000)
    assert transfer(p, p.client, p.server, c, s, data) == data
    back = os.urandom(30_000)
    assert transfer(p, p.server, p.client, s, c, back, read_chunk=999) == back
