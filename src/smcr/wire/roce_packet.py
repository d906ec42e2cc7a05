"""Whole RoCEv2 packets: BTH through ICRC, the ICRC, IP/UDP encapsulation, UDP source port.

Design
------
:class:`RocePacket` is the UDP payload of a RoCEv2 datagram (spec rocev2 §1.1): the
BTH and the extension headers of :mod:`smcr.wire.roce`, the payload, the pad and the
ICRC.  Decoding leaves the payload as a :class:`memoryview` into the caller's buffer
(no copy); building takes any bytes-like payload and joins it once, or not at all when
the sender passes ``(encode_headers(), payload, pad + icrc)`` to ``sendmsg``.

What :meth:`RocePacket.decode` rejects (:class:`~smcr.wire.errors.WireError`) is what
rxe's receive path (``rxe_rcv``/``hdr_check``) drops silently: a runt (shorter than
its headers + pad + ICRC), TVer != 0, a P_Key that is not 0xFFFF/0x7FFF, an opcode that
is not RC.  We add one structural rule that rxe does not check but every IBTA packet
obeys: BTH through ICRC is a multiple of 4 bytes (PadCnt pads the payload to it).
Length rules that rxe answers with a NAK Invalid Request (First/Middle == PMTU,
Last >= 1, spec §3.2, §5.3) and payload on a payload-less opcode (rxe ignores it) are
*not* decode errors: the RNIC must see those packets to NAK or ignore them as rxe
does; :class:`~smcr.wire.roce.OpcodeInfo` tells it what to check.  Pad bytes are
ignored on receive, as rxe does, and always sent as zeros.

The ICRC (spec rocev2 §4, what it covers and how it is computed) is
:mod:`smcr.wire.icrc`'s; :func:`icrc_ipv4` and :func:`icrc_ipv6` take it from the IP
and UDP headers as sent.

The IP and UDP builders make what rxe sends (spec §1.2, §1.4): IPv4 with DF, ID 0 (what
an unconnected ``IP_PMTUDISC_DO`` socket sends), TTL 1 (SMC-R's hop limit, smc-r §8),
UDP checksum 0.  Like rxe (``rxe_icrc_hdr`` copies a fixed 20-byte header), the ICRC
code accepts IPv4 only without options, and IPv6 only without extension headers.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final, NamedTuple

from smcr.wire.errors import WireError
from smcr.wire.icrc import ICRC, icrc, masked_ipv4_headers, masked_ipv6_headers
from smcr.wire.inet import (
    IPPROTO_UDP,
    IPV4_HEADER,
    IPV4_HEADER_LEN,
    IPV6_HEADER,
    IPV6_HEADER_LEN,
    UDP_HEADER,
    UDP_HEADER_LEN,
    ipv4_header,
    ipv6_header,
)
from smcr.wire.roce import (
    _AETH,
    _AETH_F,
    _ATOMIC_ACK_ETH_F,
    _ATOMIC_ETH,
    _ATOMIC_ETH_F,
    _BTH,
    _FETH_F,
    _IETH_F,
    _IMMDT_F,
    _LENGTH_BY_BYTE,
    _MASK_BY_BYTE,
    _RETH,
    _RETH_F,
    _U24,
    _U32,
    _U64,
    AETH_LEN,
    ATOMIC_ACK_ETH_LEN,
    ATOMIC_ETH_LEN,
    BTH_LEN,
    DEFAULT_P_KEY,
    FETH_LEN,
    ICRC_LEN,
    IETH_LEN,
    IMMDT_LEN,
    OPCODE_INFO,
    RETH_LEN,
    ROCEV2_UDP_PORT,
    Aeth,
    AtomicAckEth,
    AtomicEth,
    Bth,
    Buffer,
    ExtHeader,
    Feth,
    Ieth,
    ImmDt,
    Opcode,
    OpcodeInfo,
    Reth,
)

#: TTL / hop limit Linux SMC-R gives its RoCE packets (smc-r spec §8).
SMCR_HOP_LIMIT: Final = 1

_U16: Final = struct.Struct(">H")


# --------------------------------------------------------------------------------------
# Whole packets: BTH | ext headers | payload | pad | ICRC

PADS: Final = (b"", b"\x00", b"\x00\x00", b"\x00\x00\x00")
"""The pad bytes after a payload, by PadCnt: always zeros (rxe ignores them on receive)."""


def pad_count(payload_length: int) -> int:
    """PadCnt for a payload: ``(-length) & 3`` (spec §3.2, rxe ``bth_pad``)."""
    return -payload_length & 3


@dataclass(frozen=True, slots=True)
class RocePacket:
    """A RoCEv2 packet from the BTH to the ICRC: the UDP payload (spec §1.1).

    The extension-header fields that the opcode carries (:data:`OPCODE_INFO`) are set,
    the others are ``None``.  ``payload`` excludes the pad; ``bth.pad_cnt`` says how many
    zero bytes follow it.  ``icrc`` is the ICRC as a number (stored little-endian on the
    wire, spec §4.1); :meth:`decode` does not check it, because it covers the IP and UDP
    headers: see :func:`verify_icrc`.

    :param bth: the base transport header.
    :param payload: the data (a memoryview into the decoded buffer, no copy).
    :param reth: RETH, on WRITE First/Only, READ request, FLUSH, ATOMIC WRITE.
    :param aeth: AETH, on ACK, ATOMIC ACK and READ response First/Last/Only.
    :param imm_dt: ImmDt, on the ``*_WITH_IMMEDIATE`` opcodes.
    :param ieth: IETH, on the ``SEND_*_WITH_INVALIDATE`` opcodes.
    :param atomic_eth: AtomicETH, on COMPARE_SWAP and FETCH_ADD.
    :param atomic_ack_eth: AtomicAckETH, on ATOMIC ACK.
    :param feth: FETH, on FLUSH.
    :param icrc: the ICRC value.
    """

    bth: Bth
    payload: Buffer = b""
    reth: Reth | None = None
    aeth: Aeth | None = None
    imm_dt: ImmDt | None = None
    ieth: Ieth | None = None
    atomic_eth: AtomicEth | None = None
    atomic_ack_eth: AtomicAckEth | None = None
    feth: Feth | None = None
    icrc: int = 0

    @classmethod
    def build(
        cls,
        opcode: Opcode,
        dest_qp: int,
        psn: int,
        payload: Buffer = b"",
        *,
        ack_req: bool = False,
        se: bool = False,
        p_key: int = DEFAULT_P_KEY,
        reth: Reth | None = None,
        aeth: Aeth | None = None,
        imm_dt: ImmDt | None = None,
        ieth: Ieth | None = None,
        atomic_eth: AtomicEth | None = None,
        atomic_ack_eth: AtomicAckEth | None = None,
        feth: Feth | None = None,
    ) -> RocePacket:
        """Build a packet with PadCnt computed from the payload, as rxe sends it.

        M, FECN and BECN are 0 and the ICRC is 0 until a frame builder computes it.

        :raises ValueError: if the extension headers given are not exactly those the
            opcode carries, or a payload-less opcode gets a payload.
        """
        bth = Bth(opcode, dest_qp, psn, se, False, -len(payload) & 3, p_key, ack_req=ack_req)
        packet = cls(bth, payload, reth, aeth, imm_dt, ieth, atomic_eth, atomic_ack_eth, feth)
        packet.check_headers()
        if payload and not OPCODE_INFO[opcode].has_payload:
            raise ValueError(f"{opcode.name} carries no payload")
        return packet

    def check_headers(self) -> None:
        """Check that exactly the extension headers of the opcode are present.

        :raises ValueError: if one is missing or one too many is set.
        """
        want = _MASK_BY_BYTE[self.bth.opcode]
        have = (
            (self.aeth is not None and _AETH_F)
            | (self.atomic_ack_eth is not None and _ATOMIC_ACK_ETH_F)
            | (self.feth is not None and _FETH_F)
            | (self.reth is not None and _RETH_F)
            | (self.atomic_eth is not None and _ATOMIC_ETH_F)
            | (self.imm_dt is not None and _IMMDT_F)
            | (self.ieth is not None and _IETH_F)
        )
        if have != want:
            raise ValueError(
                f"{self.bth.opcode.name} carries {ExtHeader(want)!r},"
                f" packet has {ExtHeader(have)!r}"
            )

    @property
    def info(self) -> OpcodeInfo:
        """The :class:`OpcodeInfo` of this packet's opcode."""
        return OPCODE_INFO[self.bth.opcode]

    def encode_headers(self) -> bytes:
        """Return BTH and extension headers, in wire order (spec §2.2).

        With :meth:`pad` and the payload this is what the ICRC covers; a sender can
        hand ``(headers, payload, pad + icrc)`` to ``sendmsg`` without joining them.

        :raises ValueError: for a field out of range or headers that do not fit the opcode.
        """
        self.check_headers()
        parts = [self.bth.encode()]
        # Canonical order; no opcode has two of these in another order (spec §2.2).
        for header in (
            self.aeth,
            self.atomic_ack_eth,
            self.feth,
            self.reth,
            self.atomic_eth,
            self.imm_dt,
            self.ieth,
        ):
            if header is not None:
                parts.append(header.encode())
        return b"".join(parts)

    @property
    def pad(self) -> bytes:
        """The pad bytes: ``bth.pad_cnt`` zeros."""
        return PADS[self.bth.pad_cnt]

    def encode(self) -> bytes:
        """Return the whole UDP payload, BTH through ICRC (``icrc`` little-endian).

        :raises ValueError: if payload plus pad is not a multiple of 4 bytes.
        """
        if (len(self.payload) + self.bth.pad_cnt) & 3:
            raise ValueError("payload plus PadCnt must be a multiple of 4 bytes")
        return b"".join(
            (self.encode_headers(), self.payload, PADS[self.bth.pad_cnt], ICRC.pack(self.icrc))
        )

    @classmethod
    def decode(cls, data: Buffer) -> RocePacket:
        """Decode a UDP payload, BTH through ICRC; the payload stays a view into ``data``.

        :raises WireError: shorter than its headers + pad + ICRC (rxe ``rxe_rcv``), a bad
            BTH (:meth:`Bth.decode`), or a length that is not a multiple of 4.
        """
        view = data if isinstance(data, memoryview) else memoryview(data)
        total = len(view)
        if total < BTH_LEN + ICRC_LEN:
            raise WireError(f"RoCE packet of {total} bytes is shorter than BTH + ICRC")
        bth = Bth._decode_from(view)
        op = bth.opcode
        end = total - ICRC_LEN - bth.pad_cnt
        if end < _LENGTH_BY_BYTE[op]:
            raise WireError(
                f"{op.name} packet of {total} bytes is shorter than its"
                f" {_LENGTH_BY_BYTE[op]}-byte headers + {bth.pad_cnt} pad + ICRC"
            )
        if total & 3:
            raise WireError(f"RoCE packet length {total} is not a multiple of 4")
        headers = _MASK_BY_BYTE[op]
        off = BTH_LEN
        reth = aeth = imm_dt = ieth = atomic_eth = atomic_ack_eth = feth = None
        if headers:
            if headers & _AETH_F:
                (word,) = _AETH.unpack_from(view, off)
                aeth = Aeth(word >> 24, word & _U24)
                off += AETH_LEN
            if headers & _ATOMIC_ACK_ETH_F:
                atomic_ack_eth = AtomicAckEth(*_U64.unpack_from(view, off))
                off += ATOMIC_ACK_ETH_LEN
            if headers & _FETH_F:
                (word,) = _U32.unpack_from(view, off)
                feth = Feth(word & 0x0F, (word >> 4) & 3)
                off += FETH_LEN
            if headers & _RETH_F:
                reth = Reth(*_RETH.unpack_from(view, off))
                off += RETH_LEN
            if headers & _ATOMIC_ETH_F:
                atomic_eth = AtomicEth(*_ATOMIC_ETH.unpack_from(view, off))
                off += ATOMIC_ETH_LEN
            if headers & _IMMDT_F:
                imm_dt = ImmDt(*_U32.unpack_from(view, off))
                off += IMMDT_LEN
            if headers & _IETH_F:
                ieth = Ieth(*_U32.unpack_from(view, off))
                off += IETH_LEN
        (icrc,) = ICRC.unpack_from(view, total - ICRC_LEN)
        return cls(
            bth, view[off:end], reth, aeth, imm_dt, ieth, atomic_eth, atomic_ack_eth, feth, icrc
        )


# --------------------------------------------------------------------------------------
# ICRC (spec §4)


def _udp_and_bth(udp_header: Buffer, first: memoryview) -> tuple[int, ...]:
    """``(sport, dport, UDP length, opcode, b1, P_Key, DestQP word, PSN word)``."""
    sport, dport, ulen, _ = UDP_HEADER.unpack(udp_header)
    return (sport, dport, ulen, *_BTH.unpack_from(first))


def icrc_ipv4(ip_header: Buffer, udp_header: Buffer, bth_onwards: Buffer, *more: Buffer) -> int:
    """ICRC of a RoCEv2 packet over IPv4 (spec §4, Linux ``rxe_icrc_hdr``).

    :param ip_header: the 20-byte IPv4 header as sent (no options).
    :param udp_header: the 8-byte UDP header.
    :param bth_onwards: BTH through pad, without the ICRC; or, with ``more``, the first
        piece of it, which must hold at least the whole BTH.
    :param more: further pieces (ext headers, payload, pad), CRC-ed in order, no join.
    :return: the CRC value; it goes on the wire as ``struct.pack("<I", value)``.
    """
    if len(ip_header) != IPV4_HEADER_LEN or len(udp_header) != UDP_HEADER_LEN:
        raise ValueError("icrc_ipv4 needs a 20-byte IPv4 and an 8-byte UDP header")
    if len(bth_onwards) < BTH_LEN:
        raise ValueError("the first piece must hold the whole BTH")
    first = memoryview(bth_onwards)
    vihl, _, total, ident, frag, _, proto, _, src, dst = IPV4_HEADER.unpack(ip_header)
    sport, dport, ulen, opcode, b1, p_key, dqp, psn = _udp_and_bth(udp_header, first)
    masked = masked_ipv4_headers(src, dst, sport, dport, ulen, opcode, b1, p_key, dqp, psn,
                                 ident=ident, frag=frag, total_length=total, version_ihl=vihl,
                                 protocol=proto)  # fmt: skip
    return icrc(masked, first[BTH_LEN:], *more)


def icrc_ipv6(ip_header: Buffer, udp_header: Buffer, bth_onwards: Buffer, *more: Buffer) -> int:
    """ICRC of a RoCEv2 packet over IPv6 (spec §4); arguments as :func:`icrc_ipv4`.

    :param ip_header: the 40-byte IPv6 header (no extension headers).
    """
    if len(ip_header) != IPV6_HEADER_LEN or len(udp_header) != UDP_HEADER_LEN:
        raise ValueError("icrc_ipv6 needs a 40-byte IPv6 and an 8-byte UDP header")
    if len(bth_onwards) < BTH_LEN:
        raise ValueError("the first piece must hold the whole BTH")
    first = memoryview(bth_onwards)
    word0, plen, next_header, _, src, dst = IPV6_HEADER.unpack(ip_header)
    sport, dport, ulen, opcode, b1, p_key, dqp, psn = _udp_and_bth(udp_header, first)
    masked = masked_ipv6_headers(src, dst, sport, dport, ulen, opcode, b1, p_key, dqp, psn,
                                 payload_length=plen, version=word0 >> 28,
                                 next_header=next_header)  # fmt: skip
    return icrc(masked, first[BTH_LEN:], *more)


# --------------------------------------------------------------------------------------
# IP and UDP headers


# --------------------------------------------------------------------------------------
# Whole datagrams


class UdpDatagram(NamedTuple):
    """An IP datagram split into views of its IP header, UDP header and UDP payload."""

    ip_header: memoryview
    udp_header: memoryview
    udp_payload: memoryview


def split_udp_datagram(datagram: Buffer) -> UdpDatagram:
    """Split an IPv4 or IPv6 datagram carrying UDP into views (no copy).

    Bytes past the IP length (Ethernet padding) are ignored.  IPv4 options, fragments
    and IPv6 extension headers are refused: rxe's ICRC code assumes none.

    :raises WireError: if it is not such a datagram or its lengths disagree.
    """
    view = datagram if isinstance(datagram, memoryview) else memoryview(datagram)
    size = len(view)
    if size < 1:
        raise WireError("empty IP datagram")
    version = view[0] >> 4
    if version == 4:
        if size < IPV4_HEADER_LEN + UDP_HEADER_LEN:
            raise WireError(f"IPv4 datagram of {size} bytes is too short for IP + UDP")
        vihl, _, total, _, frag, _, proto, _, _, _ = IPV4_HEADER.unpack_from(view)
        if vihl != 0x45:
            raise WireError("IPv4 header with options (IHL != 5)")
        if frag & 0x3FFF:
            raise WireError("IPv4 fragment")
        hlen = IPV4_HEADER_LEN
        end = total
    elif version == 6:
        if size < IPV6_HEADER_LEN + UDP_HEADER_LEN:
            raise WireError(f"IPv6 datagram of {size} bytes is too short for IP + UDP")
        _, plen, proto, _, _, _ = IPV6_HEADER.unpack_from(view)
        hlen = IPV6_HEADER_LEN
        end = IPV6_HEADER_LEN + plen
    else:
        raise WireError(f"IP version {version} is neither 4 nor 6")
    if proto != IPPROTO_UDP:
        raise WireError(f"IP protocol {proto} is not UDP")
    if not hlen + UDP_HEADER_LEN <= end <= size:
        raise WireError(f"IP length {end} does not fit the {size}-byte datagram")
    (udp_len,) = _U16.unpack_from(view, hlen + 4)
    if udp_len != end - hlen:
        raise WireError(f"UDP length {udp_len} != IP payload length {end - hlen}")
    return UdpDatagram(view[:hlen], view[hlen : hlen + UDP_HEADER_LEN], view[hlen + 8 : end])


def _icrc_of(parts: UdpDatagram) -> tuple[int, int]:
    ip, udp, roce = parts
    if len(roce) < BTH_LEN + ICRC_LEN:
        raise WireError(f"UDP payload of {len(roce)} bytes is shorter than BTH + ICRC")
    body = roce[:-ICRC_LEN]
    icrc = icrc_ipv4 if len(ip) == IPV4_HEADER_LEN else icrc_ipv6
    computed = icrc(ip, udp, body)
    (found,) = ICRC.unpack_from(roce, len(roce) - ICRC_LEN)
    return computed, found


def compute_icrc(datagram: Buffer) -> int:
    """The ICRC a whole IPv4/IPv6 RoCEv2 datagram should carry (its last 4 bytes excluded).

    :raises WireError: if it is not a UDP datagram with at least BTH + ICRC after UDP.
    """
    return _icrc_of(split_udp_datagram(datagram))[0]


def verify_icrc(datagram: Buffer) -> bool:
    """Whether the ICRC at the end of a whole IPv4/IPv6 RoCEv2 datagram is right.

    :raises WireError: if it is not a UDP datagram with at least BTH + ICRC after UDP.
    """
    computed, found = _icrc_of(split_udp_datagram(datagram))
    return computed == found


def _frame(ip: bytes, udp: bytes, packet: RocePacket, headers: bytes, v4: bool) -> bytes:
    pad = packet.pad
    icrc = (icrc_ipv4 if v4 else icrc_ipv6)(ip, udp, headers, packet.payload, pad)
    return b"".join((ip, udp, headers, packet.payload, pad, ICRC.pack(icrc)))


def _udp_payload_length(packet: RocePacket, headers: bytes) -> int:
    if (len(packet.payload) + packet.bth.pad_cnt) & 3:
        raise ValueError("payload plus PadCnt must be a multiple of 4 bytes")
    return len(headers) + len(packet.payload) + packet.bth.pad_cnt + ICRC_LEN


def build_ipv4_udp_roce_frame(
    packet: RocePacket,
    src: str | bytes,
    dst: str | bytes,
    sport: int,
    *,
    dport: int = ROCEV2_UDP_PORT,
    ttl: int = SMCR_HOP_LIMIT,
    tos: int = 0,
    identification: int = 0,
    df: bool = True,
) -> bytes:
    """A whole IPv4 datagram (IP header through ICRC) carrying ``packet``, ICRC computed.

    ``packet.icrc`` is ignored.  Defaults are what rxe sends for SMC-R: DF, ID 0, TTL 1,
    UDP checksum 0.
    """
    headers = packet.encode_headers()
    length = UDP_HEADER_LEN + _udp_payload_length(packet, headers)
    ip = ipv4_header(src, dst, length, ttl=ttl, tos=tos, identification=identification, df=df)
    return _frame(ip, UDP_HEADER.pack(sport, dport, length, 0), packet, headers, True)


def build_ipv6_udp_roce_frame(
    packet: RocePacket,
    src: str | bytes,
    dst: str | bytes,
    sport: int,
    *,
    dport: int = ROCEV2_UDP_PORT,
    hop_limit: int = SMCR_HOP_LIMIT,
    traffic_class: int = 0,
    flow_label: int = 0,
) -> bytes:
    """A whole IPv6 datagram (IP header through ICRC) carrying ``packet``, ICRC computed."""
    headers = packet.encode_headers()
    length = UDP_HEADER_LEN + _udp_payload_length(packet, headers)
    ip = ipv6_header(
        src, dst, length, hop_limit=hop_limit, traffic_class=traffic_class, flow_label=flow_label
    )
    return _frame(ip, UDP_HEADER.pack(sport, dport, length, 0), packet, headers, False)


# --------------------------------------------------------------------------------------
# UDP source port (spec §1.3)


def rdma_calc_flow_label(lqpn: int, rqpn: int) -> int:
    """20-bit flow label from a QP pair, symmetric (Linux ``rdma_calc_flow_label``)."""
    v = (lqpn * rqpn) & 0xFFFFFFFFFFFFFFFF
    v ^= v >> 20
    v ^= v >> 40
    return v & 0xFFFFF


def rdma_flow_label_to_udp_sport(flow_label: int) -> int:
    """UDP source port from a flow label (Linux ``rdma_flow_label_to_udp_sport``)."""
    return 0xC000 | ((flow_label & 0x3FFF) ^ ((flow_label & 0xFC000) >> 14))


def rdma_get_udp_sport(flow_label: int, lqpn: int, rqpn: int) -> int:
    """The UDP source port rxe >= 5.17 and mlx5 use for an RC QP (spec §1.3).

    With flow label 0 (rxe's case) both ends compute the same port.
    """
    if flow_label == 0:
        flow_label = rdma_calc_flow_label(lqpn, rqpn)
    return rdma_flow_label_to_udp_sport(flow_label)


def rxe_create_udp_sport(qpn: int) -> int:
    """The port rxe gives a QP at creation, before ``modify_qp`` (``rxe_qp_init_req``)."""
    return 0xC000 + ((((qpn * 0x61C88647) & 0xFFFFFFFF) >> 18) & 0x3FFF)
