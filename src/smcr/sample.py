"""A sample SMC-R conversation, built from :mod:`smcr.wire`, as frames for a capture.

It serves two jobs that need every kind of message in realistic context: the
test that holds smcr to Wireshark's reading of our bytes (tshark must name each
message and decode each field as we encoded it), and ``smcr demo`` while the
end-to-end path is still being built.

The conversation follows spec §2.7 for a first contact between two hosts, as
Linux runs it: TCP handshake with the SMC option, CLC Proposal / Accept /
Confirm, LLC CONFIRM LINK both ways, an ADD LINK that the client rejects, data
(RDMA WRITE, then a CDC with the new producer cursor), the close CDCs and a
FIN.  Then it shows the LLC messages a longer life brings (ADD LINK
CONTINUATION, CONFIRM RKEY, DELETE RKEY, TEST LINK, DELETE LINK) and, on other
TCP connections, the other CLC forms: a v1 Proposal with IPv6 prefixes
answered by a v1 Decline, and an SMC-Rv2 handshake ended by a v2 Decline.

The RFC 7609-style 52-byte Proposal is left out: Wireshark reads every
Proposal as if it had Linux's 40-byte SMC-D/v2 area and reports the short RFC
form as malformed, though Linux accepts it (a Wireshark limitation).

LLC goes out in the v1 (44-byte, ``2C`` length) form, which Wireshark 4.0
recognises; x86 Linux's v2 LLC, with its little-endian length, is outside
Wireshark's heuristic (see shared/golden/README.md).
"""

from __future__ import annotations

import dataclasses
import ipaddress
from dataclasses import dataclass
from typing import Literal

from smcr.pcap import Endpoint, TcpFlow, roce_frame
from smcr.wire.cdc import CdcMessage, ConnectionStateFlags, ProducerFlags
from smcr.wire.clc import (
    ClcAccept,
    ClcConfirm,
    ClcDecline,
    ClcProposal,
    FirstContactExt,
    IbMtu,
    Ipv6Prefix,
    compress_bufsize,
    make_eid,
    make_hostname,
)
from smcr.wire.cursor import Cursor
from smcr.wire.decline import DeclineCode
from smcr.wire.llc import (
    AddLink,
    AddLinkCont,
    ConfirmLink,
    ConfirmRkey,
    DeleteLink,
    DeleteLinkReason,
    DeleteRkey,
    LlcMessage,
    RkeyPair,
    Rtoken,
    TestLink,
)
from smcr.wire.roce import Aeth, Opcode, Reth
from smcr.wire.roce_packet import RocePacket

WireMessage = ClcProposal | ClcAccept | ClcConfirm | ClcDecline | LlcMessage | CdcMessage


@dataclass(frozen=True, slots=True)
class SampleFrame:
    """One frame of the sample, with the message it carries (if any).

    :param frame: the Ethernet frame as it goes into the pcap file.
    :param message: the smcr.wire object whose bytes the frame carries, or
        ``None`` for TCP control segments, RoCE ACKs and RDMA WRITEs.
    :param packet: the RoCEv2 packet, for RoCE frames.
    :param kind: ``"tcp"`` or ``"roce"``.
    :param note: what the frame is, in words, for the demo's listing.
    """

    frame: bytes
    message: WireMessage | None
    packet: RocePacket | None
    kind: Literal["tcp", "roce"]
    note: str


def _mac(last: int) -> bytes:
    return bytes([0x02, 0x00, 0x5E, 0x00, 0x00, last])


def _gid(ip: str) -> bytes:
    """The RoCE GID of an IPv4 address: ::ffff:a.b.c.d (spec §8)."""
    return ipaddress.IPv6Address(f"::ffff:{ip}").packed


CLIENT_IP, SERVER_IP = "10.99.0.1", "10.99.0.2"
CLIENT_MAC, SERVER_MAC = _mac(1), _mac(2)
CLIENT_QPN, SERVER_QPN = 0x000101, 0x000202
CLIENT_PSN, SERVER_PSN = 0x2A4B50, 0x3C74BC
CLIENT_RKEY, SERVER_RKEY = 0x000003AF, 0x000003A4
CLIENT_VADDR, SERVER_VADDR = 0xFF378CBA83530000, 0xFF45874B42770000
CLIENT_TOKEN, SERVER_TOKEN = 1, 1
RMBE_SIZE = 64 * 1024
SMC_EID = make_eid("SMCR-SAMPLE")


class _RoceLink:
    """Both ends of one RC QP pair: PSNs and frames for SENDs, WRITEs and ACKs."""

    def __init__(self, client: Endpoint, server: Endpoint) -> None:
        self.ends = {True: client, False: server}
        self.qpn = {True: CLIENT_QPN, False: SERVER_QPN}
        self.psn = {True: CLIENT_PSN, False: SERVER_PSN}
        self.msn = {True: 0, False: 0}

    def _frame(self, from_client: bool, packet: RocePacket) -> bytes:
        return roce_frame(self.ends[from_client], self.ends[not from_client], packet)

    def _next_psn(self, from_client: bool) -> int:
        psn = self.psn[from_client]
        self.psn[from_client] = (psn + 1) & 0xFFFFFF
        return psn

    def send(self, from_client: bool, payload: bytes) -> tuple[RocePacket, bytes]:
        """A SEND Only with SE and AckReq, as Linux posts LLC and CDC messages."""
        packet = RocePacket.build(
            Opcode.SEND_ONLY,
            self.qpn[not from_client],
            self._next_psn(from_client),
            payload,
            ack_req=True,
            se=True,
        )
        return packet, self._frame(from_client, packet)

    def write(self, from_client: bool, va: int, rkey: int, data: bytes) -> tuple[RocePacket, bytes]:
        """An RDMA WRITE Only into the peer's RMB."""
        packet = RocePacket.build(
            Opcode.RDMA_WRITE_ONLY,
            self.qpn[not from_client],
            self._next_psn(from_client),
            data,
            ack_req=True,
            reth=Reth(va=va, r_key=rkey, dma_length=len(data)),
        )
        return packet, self._frame(from_client, packet)

    def ack(self, from_client: bool) -> tuple[RocePacket, bytes]:
        """The ACK ``from_client`` sends for the peer's last packet."""
        peer = not from_client
        self.msn[from_client] += 1
        packet = RocePacket.build(
            Opcode.ACKNOWLEDGE,
            self.qpn[peer],
            (self.psn[peer] - 1) & 0xFFFFFF,
            aeth=Aeth.ack(self.msn[from_client]),
        )
        return packet, self._frame(from_client, packet)


class _Builder:
    """Collects frames; one method per step of the conversation."""

    def __init__(self) -> None:
        self.frames: list[SampleFrame] = []

    def tcp(self, frame: bytes, note: str, message: WireMessage | None = None) -> None:
        self.frames.append(SampleFrame(frame, message, None, "tcp", note))

    def clc(self, flow: TcpFlow, from_client: bool, message: WireMessage, note: str) -> None:
        self.tcp(flow.data(from_client, message.encode()), note, message)

    def llc(self, link: _RoceLink, from_client: bool, message: WireMessage, note: str) -> None:
        packet, frame = link.send(from_client, message.encode())
        self.frames.append(SampleFrame(frame, message, packet, "roce", note))
        ack, ack_frame = link.ack(not from_client)
        self.frames.append(SampleFrame(ack_frame, None, ack, "roce", "RoCE ACK"))


def _endpoints(port: int) -> tuple[Endpoint, Endpoint]:
    return Endpoint(CLIENT_MAC, CLIENT_IP, port), Endpoint(SERVER_MAC, SERVER_IP, 5002)


def _first_contact(b: _Builder) -> None:
    """Spec §2.7 first contact (SMC-R v1 in a Linux v2-header Proposal), data and close."""
    client, server = _endpoints(40001)
    flow = TcpFlow(client, server)
    for segment, note in zip(flow.handshake(), ("SYN + SMC option", "SYN-ACK + SMC option", "ACK"),
                             strict=True):
        b.tcp(segment, note)
    client_peer_id, server_peer_id = b"\x42\x08" + CLIENT_MAC, b"\x08\x42" + SERVER_MAC
    size_code = compress_bufsize(RMBE_SIZE)
    proposal = ClcProposal.smcr_v1(
        client_peer_id, _gid(CLIENT_IP), CLIENT_MAC,
        outgoing_subnet=ipaddress.IPv4Address("10.99.0.0"), prefix_len=24,
    )
    b.clc(flow, True, proposal, "CLC Proposal (SMC-R v1, Linux layout)")
    accept = ClcAccept(
        version=1, first_contact=True, peer_id=server_peer_id, gid=_gid(SERVER_IP),
        mac=SERVER_MAC, qpn=SERVER_QPN, rmb_rkey=SERVER_RKEY, rmbe_alert_token=SERVER_TOKEN,
        rmbe_size=size_code, qp_mtu=IbMtu.MTU_1024, rmb_vaddr=SERVER_VADDR, psn=SERVER_PSN,
    )
    b.clc(flow, False, accept, "CLC Accept, first contact")
    confirm = ClcConfirm(
        version=1, first_contact=True, peer_id=client_peer_id, gid=_gid(CLIENT_IP),
        mac=CLIENT_MAC, qpn=CLIENT_QPN, rmb_rkey=CLIENT_RKEY, rmbe_alert_token=CLIENT_TOKEN,
        rmbe_size=size_code, qp_mtu=IbMtu.MTU_1024, rmb_vaddr=CLIENT_VADDR, psn=CLIENT_PSN,
    )
    b.clc(flow, True, confirm, "CLC Confirm, first contact")

    link = _RoceLink(client, server)
    link_uid = (0x00000101).to_bytes(4, "big")
    req = ConfirmLink(sender_mac=SERVER_MAC, sender_gid=_gid(SERVER_IP),
                      sender_qp_num=SERVER_QPN, link_num=1, link_uid=link_uid)
    b.llc(link, False, req, "LLC CONFIRM LINK request")
    resp = ConfirmLink(flags=0x83, sender_mac=CLIENT_MAC, sender_gid=_gid(CLIENT_IP),
                       sender_qp_num=CLIENT_QPN, link_num=1, link_uid=link_uid)
    b.llc(link, True, resp, "LLC CONFIRM LINK response")
    add = AddLink(sender_mac=SERVER_MAC, sender_gid=_gid(SERVER_IP), sender_qp_num=0x000203,
                  link_num=2, qp_mtu=IbMtu.MTU_1024, initial_psn=0x28AB25)
    b.llc(link, False, add, "LLC ADD LINK request (second, asymmetric link)")
    b.llc(link, True, add.reject(), "LLC ADD LINK rejected: no alternate path")

    data = b"Hello from smcr over RDMA WRITE!"
    packet, frame = link.write(True, SERVER_VADDR, SERVER_RKEY, data)
    b.frames.append(SampleFrame(frame, None, packet, "roce", f"RDMA WRITE of {len(data)} bytes"))
    cdc = CdcMessage(sequence_number=1, alert_token=SERVER_TOKEN,
                     producer_cursor=Cursor(0, len(data)))
    b.llc(link, True, cdc, "CDC: producer cursor moved past the data")
    reply = CdcMessage(sequence_number=1, alert_token=CLIENT_TOKEN,
                       consumer_cursor=Cursor(0, len(data)),
                       producer_flags=ProducerFlags.WRITE_BLOCKED)
    b.llc(link, False, reply, "CDC: consumer cursor update")
    close = CdcMessage(sequence_number=2, alert_token=SERVER_TOKEN,
                       producer_cursor=Cursor(0, len(data)),
                       connection_state_flags=ConnectionStateFlags.PEER_CONNECTION_CLOSED)
    b.llc(link, True, close, "CDC: peer connection closed (active close)")
    b.tcp(flow.fin(True), "FIN of the idle TCP connection")
    _llc_life(b, link)


def _llc_life(b: _Builder, link: _RoceLink) -> None:
    """The LLC messages of a link group's later life, each a request and its answer."""
    cont = AddLinkCont(link_num=2, num_rkeys=1,
                       rkeys=(RkeyPair(rmb_key=SERVER_RKEY, rmb_key_new=0x5BC,
                                       rmb_vaddr_new=SERVER_VADDR),))
    b.llc(link, False, cont, "LLC ADD LINK CONTINUATION")
    rkey = ConfirmRkey(rmb_key=0x3B0, rmb_vaddr=SERVER_VADDR + 0x10000,
                       other_rtokens=(Rtoken(link_id=2, rmb_key=0x5C0,
                                             rmb_vaddr=SERVER_VADDR + 0x10000),))
    b.llc(link, False, rkey, "LLC CONFIRM RKEY request")
    b.llc(link, True, rkey.response(), "LLC CONFIRM RKEY response")
    delete = DeleteRkey(rkeys=(0x3B0,))
    b.llc(link, False, delete, "LLC DELETE RKEY request")
    b.llc(link, True, delete.response(), "LLC DELETE RKEY response")
    test = TestLink(user_data=b"smcr-keepalive!!")
    b.llc(link, True, test, "LLC TEST LINK request")
    b.llc(link, False, test.response(), "LLC TEST LINK response")
    dl = DeleteLink(flags=0x20, link_num=2, reason=DeleteLinkReason.LOST_PATH)
    b.llc(link, False, dl, "LLC DELETE LINK request (orderly, lost path)")
    b.llc(link, True, dl.response(), "LLC DELETE LINK response")
    end = DeleteLink(flags=0x60, link_num=0, reason=DeleteLinkReason.PROG_INIT_TERM)
    b.llc(link, False, end, "LLC DELETE LINK ALL (link group idle)")


def _declined(b: _Builder) -> None:
    """An IPv6-capable v1 Proposal that the server declines (v1 Decline, prefix mismatch)."""
    client, server = _endpoints(40002)
    flow = TcpFlow(client, server)
    for segment in flow.handshake():
        b.tcp(segment, "TCP handshake")
    prefixes = (Ipv6Prefix(ipaddress.IPv6Address("fd00:99::"), 64),
                Ipv6Prefix(ipaddress.IPv6Address("2001:db8:1::"), 48))
    proposal = ClcProposal.smcr_v1(
        b"\x42\x08" + CLIENT_MAC, _gid(CLIENT_IP), CLIENT_MAC,
        outgoing_subnet=ipaddress.IPv4Address("10.99.0.0"), prefix_len=24,
        ipv6_prefixes=prefixes,
    )
    b.clc(flow, True, proposal, "CLC Proposal (SMC-R v1, two IPv6 prefixes)")
    decline = ClcDecline.linux(DeclineCode.DIFFPREFIX, b"\x08\x42" + SERVER_MAC, version=1)
    b.clc(flow, False, decline, "CLC Decline v1: IP prefix mismatch -> TCP fallback")


def _v2_handshake(b: _Builder) -> None:
    """SMC-Rv2 as Linux runs it over rxe: v2 Proposal, first-contact Accept and Confirm."""
    client, server = _endpoints(40003)
    flow = TcpFlow(client, server)
    for segment in flow.handshake():
        b.tcp(segment, "TCP handshake")
    proposal = ClcProposal.smcr_v2(_gid(CLIENT_IP), (SMC_EID,))
    b.clc(flow, True, proposal, "CLC Proposal (SMC-Rv2 only, one UEID)")
    fce = FirstContactExt(v2_direct=True, os_type=2, release=1,
                          hostname=make_hostname("server"), max_conns=255, max_links=2,
                          feature_mask=1, vendor_options=0)
    size_code = compress_bufsize(RMBE_SIZE)
    accept = ClcAccept(version=2, first_contact=True, peer_id=b"\x08\x42" + SERVER_MAC,
                       gid=_gid(SERVER_IP), mac=SERVER_MAC, qpn=SERVER_QPN,
                       rmb_rkey=SERVER_RKEY, rmbe_alert_token=2, rmbe_size=size_code,
                       qp_mtu=IbMtu.MTU_1024, rmb_vaddr=SERVER_VADDR, psn=SERVER_PSN,
                       eid=SMC_EID, fce=fce)
    b.clc(flow, False, accept, "CLC Accept v2, first contact")
    confirm = ClcConfirm(version=2, first_contact=True, peer_id=b"\x42\x08" + CLIENT_MAC,
                         gid=_gid(CLIENT_IP), mac=CLIENT_MAC, qpn=CLIENT_QPN,
                         rmb_rkey=CLIENT_RKEY, rmbe_alert_token=2, rmbe_size=size_code,
                         qp_mtu=IbMtu.MTU_1024, rmb_vaddr=CLIENT_VADDR, psn=CLIENT_PSN,
                         eid=SMC_EID,
                         fce=dataclasses.replace(fce, hostname=make_hostname("client")),
                         gid_list=(_gid(CLIENT_IP),))
    b.clc(flow, True, confirm, "CLC Confirm v2, first contact, GID list")
    decline = ClcDecline.linux(DeclineCode.TIMEOUT_CL, b"\x08\x42" + SERVER_MAC, version=2)
    b.clc(flow, False, decline, "CLC Decline v2: timeout waiting for CONFIRM LINK")


def sample_conversation() -> list[SampleFrame]:
    """Every frame of the sample, in order (three TCP connections, one RoCE link)."""
    b = _Builder()
    _first_contact(b)
    _declined(b)
    _v2_handshake(b)
    return b.frames
