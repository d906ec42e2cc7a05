"""Interop against real rxe traffic: the Linux 6.12 SMC-R capture in ``shared/golden``.

No rxe runs here, so the capture stands in for it:

* every RoCE packet rxe sent passes our receive-side ICRC check, which sees
  only what a UDP socket sees (addresses, ports, UDP payload) and recovers the
  hashed IPv4 ID rxe put in (spec rocev2 §4.4 option (c)); the ID found is the
  one in the frame;
* one host's requests, replayed into our responder, get the same ACKs (PSN,
  syndrome, MSN) as the other host's rxe sent, and land the same bytes;
* the same messages posted to our requester come out as the packets rxe sent;
* the UDP source port rxe used is the one our QPs use for that QP pair.
"""

from __future__ import annotations

import socket
from collections import defaultdict

from smcr.rdma import AccessFlag, MemoryRegion, RecvWr, SendFlag, SendWr, Sge, WrOpcode
from smcr.rdma.roce.fastpath import RETH, U24, flow_icrc, pack_bth, recover_id
from smcr.rdma.roce.requester import Requester
from smcr.rdma.roce.responder import Responder
from smcr.wire.roce_packet import rdma_get_udp_sport, split_udp_datagram
from tests.roce.rc_pair import StubPd
from tests.support import LINUX_PCAP, pcap_frames

Packet = tuple[bytes, bytes, int, int, bytes]  # src, dst, sport, ip id, UDP payload


def roce_packets() -> list[Packet]:
    out = []
    for frame in pcap_frames(LINUX_PCAP):
        raw = bytes(frame)
        if raw[12:14] != b"\x08\x00" or raw[23] != 17:
            continue
        ip, udp, payload = split_udp_datagram(raw[14:])
        if int.from_bytes(udp[2:4], "big") != 4791:
            continue
        ident = int.from_bytes(ip[4:6], "big")
        out.append((bytes(ip[12:16]), bytes(ip[16:20]), int.from_bytes(udp[0:2], "big"), ident,
                    bytes(payload)))  # fmt: skip
    return out


def test_every_rxe_packet_passes_our_udp_side_icrc_check() -> None:
    packets = roce_packets()
    assert len(packets) == 388
    nonzero = 0
    for src, dst, sport, ident, payload in packets:
        icrc = flow_icrc(src, dst, sport)
        assert icrc.check(memoryview(payload)) >= 1
        found = int.from_bytes(payload[-4:], "little")
        op, b1, dqp, word = payload[0], payload[1], int.from_bytes(payload[5:8], "big"), 0
        word = int.from_bytes(payload[8:12], "big")
        ext_len = len(payload) - 16 - ((b1 >> 4) & 3)
        zero = icrc.compute(op, b1, dqp, word, b"", payload[12 : 12 + ext_len])
        assert recover_id(len(payload), zero ^ found) == ident
        nonzero += ident != 0
    assert nonzero > 300  # rxe's IDs really are hashed, not 0


def test_rxe_source_port_is_ours() -> None:
    sports = {sport for _s, _d, sport, _i, _p in roce_packets()}
    assert sports == {rdma_get_udp_sport(0, 0x11, 0x11)}


def test_replayed_requests_get_the_acks_rxe_sent() -> None:
    packets = roce_packets()
    a, b = sorted({p[0] for p in packets})  # 10.99.0.11, 10.99.0.12
    for requester, responder_ip in ((a, b), (b, a)):
        requests = [p for p in packets if p[0] == requester and p[4][0] != 0x11]
        rxe_acks = [p[4] for p in packets if p[0] == responder_ip and p[4][0] == 0x11]
        want = [(int.from_bytes(x[9:12], "big"), x[12], int.from_bytes(x[13:16], "big"))
                for x in rxe_acks]  # fmt: skip
        ours, placed = _replay(requests)
        assert ours == want, socket.inet_ntoa(requester)
        assert placed > 0


def _replay(requests: list[Packet]) -> tuple[list[tuple[int, int, int]], int]:
    """Feed one host's requests to our responder; return its ACKs and the bytes placed."""
    pd = StubPd(1)
    extents: dict[int, list[int]] = defaultdict(lambda: [1 << 64, 0])
    for *_h, payload in requests:
        if payload[0] in (0x06, 0x0A):  # WRITE First/Only: VA, rkey, length
            va, rkey, length = RETH.unpack_from(payload, 12)
            extents[rkey][0] = min(extents[rkey][0], va)
            extents[rkey][1] = max(extents[rkey][1], va + length)
    mrs: dict[int, MemoryRegion] = {}
    rw = AccessFlag.LOCAL_WRITE | AccessFlag.REMOTE_WRITE
    for rkey, (lo, hi) in extents.items():
        mrs[rkey] = MemoryRegion(pd, memoryview(bytearray(hi - lo)), addr=lo, key=rkey,
                                 access=rw, on_dereg=lambda m: None)  # fmt: skip
        pd.mrs[rkey] = mrs[rkey]
    recv = MemoryRegion(pd, memoryview(bytearray(8192 * 64)), addr=1 << 40, key=7,
                        access=AccessFlag.LOCAL_WRITE, on_dereg=lambda m: None)  # fmt: skip
    pd.mrs[7] = recv
    acks: list[tuple[int, int, int]] = []

    def tx(op: int, _b1: int, psn_word: int, ext: bytes, _payload: object) -> None:
        assert op == 0x11
        acks.append((psn_word & U24, ext[0], int.from_bytes(ext[1:4], "big")))

    resp = Responder(0x11, pd, mrs.get, tx, lambda wc: None, lambda wc: None)
    first_psn = int.from_bytes(requests[0][4][9:12], "big")
    resp.start(first_psn, 1024, int(rw), 1, 5, 0x11)
    for i in range(64):
        resp.rq.append(RecvWr(wr_id=i, sg_list=(Sge(recv.addr + 8192 * i, 8192, 7),)))
    for *_h, payload in requests:
        view = memoryview(payload)[:-4]
        resp.receive(payload[0], payload[1], int.from_bytes(payload[8:12], "big"), view)
    assert not resp.dead and resp.stats["duplicates"] == 0
    placed = sum(sum(1 for byte in mr.buf if byte) for mr in mrs.values())
    return acks, placed


def test_our_requester_sends_what_rxe_sent() -> None:
    """The same messages, posted to our requester, give rxe's packets: opcodes, PSNs,
    RETHs, pads, payloads, SE and AckReq on last packets.  AckReq on other packets is
    left out: both ask every 64 packets, but rxe counts across messages, we within one."""
    packets = roce_packets()
    for host in sorted({p[0] for p in packets}):
        captured = [p[4][:-4] for p in packets if p[0] == host and p[4][0] != 0x11]
        sent: list[bytes] = []

        def tx(op: int, b1: int, psn_word: int, ext: bytes, payload: object,
               sent: list[bytes] = sent) -> None:  # fmt: skip
            assert isinstance(payload, bytes | bytearray | memoryview)
            pad = b"\0" * ((b1 >> 4) & 3)
            sent.append(pack_bth(op, b1, 0x11, psn_word) + ext + bytes(payload) + pad)

        req = Requester(0x11, tx, lambda wc: None, lambda wc: None)
        req.start(int.from_bytes(captured[0][9:12], "big"), 1024, None, 7, 7, 1)
        req.window = 1 << 20
        for wr, data in _messages(captured):
            req.post(wr, [memoryview(data)], len(data), 0.0)
        assert len(sent) == len(captured)
        for ours, theirs in zip(sent, captured, strict=True):
            last = theirs[0] in (0x04, 0x08, 0x0A, 0x02)
            mask = bytearray(b"\xff" * len(theirs))
            if not last:
                mask[8] = 0x7F  # AckReq on a First/Middle: cadence differs (see docstring)
            assert bytes(a & m for a, m in zip(ours, mask, strict=True)) == bytes(
                a & m for a, m in zip(theirs, mask, strict=True))


def _messages(requests: list[bytes]) -> list[tuple[SendWr, bytes]]:
    """Rebuild the WRs behind captured request packets (SEND Only, WRITE First..Last/Only)."""
    out: list[tuple[SendWr, bytes]] = []
    data = b""
    va = rkey = 0
    for pkt in requests:
        op, pad = pkt[0], (pkt[1] >> 4) & 3
        flags = SendFlag.SOLICITED if pkt[1] & 0x80 else SendFlag.NONE
        hlen = 28 if op in (0x06, 0x0A) else 12
        if op in (0x06, 0x0A):
            va, rkey, _length = RETH.unpack_from(pkt, 12)
            data = b""
        data += pkt[hlen : len(pkt) - pad]
        if op == 0x04:
            out.append((SendWr(wr_id=len(out), opcode=WrOpcode.SEND, send_flags=flags), data))
            data = b""
        elif op in (0x08, 0x0A):
            out.append((SendWr(wr_id=len(out), opcode=WrOpcode.RDMA_WRITE, send_flags=flags,
                               remote_addr=va, rkey=rkey), data))  # fmt: skip
            data = b""
        else:
            assert op in (0x06, 0x07), hex(op)
    return out
