"""The RoCEv2 ICRC (spec rocev2 §4): what it covers, and the one function that computes it.

Design
------
The ICRC is a CRC-32 over 8 bytes of 0xFF (the pseudo-LRH), the IP header, the UDP
header and BTH through pad, with the fields a router may change set to all ones,
appended little-endian (:data:`ICRC`).  The masked fields are:

* IPv4: TOS (byte 1), TTL (byte 8), header checksum (bytes 10-11);
* IPv6: traffic class and flow label (bytes 0-3 become ``6F FF FF FF``), hop limit (7);
* UDP: checksum (bytes 6-7);
* BTH: byte 4 (FECN, BECN, reserved).

:func:`masked_ipv4_headers` and :func:`masked_ipv6_headers` build the 40 or 60 bytes
the CRC sees from the fields that are not masked (one :class:`struct.Struct` pack,
no per-byte work); :func:`icrc` runs the CRC over them and the rest of the packet,
on from :data:`ICRC_SEED`, the CRC of the eight 0xFF bytes (rxe's seed 0xDEBB20E3 is
the same register state before its final inversion, ``rxe_icrc_hdr``).  Pieces are
passed to ``crc32`` as they are, no join.

Who uses it: :mod:`smcr.wire.roce_packet` (whole frames, for tools, captures and
tests) and the RoCE RNIC's :mod:`smcr.rdma.roce.fastpath`, whose per-packet loops
pack :data:`IPV4_MASKED`/:data:`IPV6_MASKED` inline with a flow's constants (a
function call per packet would cost more than the rest of the packet's Python),
and whose C loops continue the CRCs it starts.  Like rxe, the ICRC assumes IPv4
without options and IPv6 without extension headers.
"""

from __future__ import annotations

import struct
from typing import Final

try:  # zlib-ng: the same CRC-32, ~10x faster (carry-less multiply)
    from zlib_ng.zlib_ng import crc32
except ImportError:  # pragma: no cover - zlib-ng not installed: the stdlib's, same results
    from zlib import crc32

from smcr.wire.inet import IP_DF, IPPROTO_UDP

Buffer = bytes | bytearray | memoryview

__all__ = [
    "ICRC",
    "ICRC_SEED",
    "IPV4_MASKED",
    "IPV6_MASKED",
    "MASKED_IPV6_WORD0",
    "MASKED_QP",
    "crc32",
    "icrc",
    "masked_ipv4_headers",
    "masked_ipv6_headers",
]

ICRC: Final = struct.Struct("<I")
"""The ICRC on the wire: the CRC value, little-endian, after the pad (spec §4.1)."""
ICRC_SEED: Final = crc32(b"\xff" * 8)
"""CRC register after the pseudo-LRH (8 x 0xFF): every ICRC runs on from here."""
IPV4_MASKED: Final = struct.Struct(">BBHHHBBH4s4sHHHHBBHII")
"""IPv4 (20) + UDP (8) + BTH (12) as the ICRC sees them: version/IHL, TOS (0xFF), total
length, ID, flags/fragment, TTL (0xFF), protocol, checksum (0xFFFF), source,
destination | source port, destination port, length, checksum (0xFFFF) | opcode, flags
byte, P_Key, :data:`MASKED_QP` | DestQP, PSN word."""
IPV6_MASKED: Final = struct.Struct(">IHBB16s16sHHHHBBHII")
"""IPv6 (40) + UDP (8) + BTH (12) as the ICRC sees them: :data:`MASKED_IPV6_WORD0` |
version, payload length, next header, hop limit (0xFF), source, destination | UDP and
BTH as in :data:`IPV4_MASKED`."""
MASKED_IPV6_WORD0: Final = 0x0FFFFFFF
"""Traffic class and flow label, OR-ed into the first IPv6 word (``6F FF FF FF``)."""
MASKED_QP: Final = 0xFF000000
"""BTH byte 4 (FECN, BECN, reserved), OR-ed into the DestQP word."""
_U24: Final = 0xFFFFFF


def masked_ipv4_headers(src: bytes, dst: bytes, sport: int, dport: int, udp_length: int,
                        opcode: int, b1: int, p_key: int, dest_qp: int, psn_word: int, *,
                        ident: int = 0, frag: int = IP_DF, total_length: int | None = None,
                        version_ihl: int = 0x45, protocol: int = IPPROTO_UDP) -> bytes:  # fmt: skip
    """The 40 bytes of IPv4 + UDP + BTH the ICRC covers, masked (spec §4.2).

    The defaults are what rxe sends (spec §1.4): no options, DF, UDP; the total
    length follows from ``udp_length`` unless given.

    :param src: source address, 4 bytes.
    :param dst: destination address, 4 bytes.
    :param sport: UDP source port.
    :param dport: UDP destination port.
    :param udp_length: the UDP length field (header + BTH through ICRC).
    :param opcode: BTH opcode.
    :param b1: BTH byte 1 (SE, M, PadCnt, TVer).
    :param p_key: BTH P_Key.
    :param dest_qp: the DestQP (its top byte, FECN/BECN, is masked anyway).
    :param psn_word: BTH bytes 8-11 (AckReq, reserved, PSN).
    :param ident: the IPv4 ID.
    :param frag: the IPv4 flags and fragment offset.
    :param total_length: the IPv4 total length, default ``udp_length + 20``.
    :param version_ihl: IPv4 byte 0.
    :param protocol: the IPv4 protocol.
    """
    total = udp_length + 20 if total_length is None else total_length
    return IPV4_MASKED.pack(version_ihl, 0xFF, total, ident, frag, 0xFF, protocol, 0xFFFF, src,
                            dst, sport, dport, udp_length, 0xFFFF, opcode, b1, p_key,
                            MASKED_QP | (dest_qp & _U24), psn_word)  # fmt: skip


def masked_ipv6_headers(src: bytes, dst: bytes, sport: int, dport: int, udp_length: int,
                        opcode: int, b1: int, p_key: int, dest_qp: int, psn_word: int, *,
                        payload_length: int | None = None, version: int = 6,
                        next_header: int = IPPROTO_UDP) -> bytes:  # fmt: skip
    """The 60 bytes of IPv6 + UDP + BTH the ICRC covers, masked (spec §4.2).

    Arguments as :func:`masked_ipv4_headers`; the IPv6 payload length follows from
    ``udp_length`` unless given (no extension headers).
    """
    plen = udp_length if payload_length is None else payload_length
    return IPV6_MASKED.pack((version << 28) | MASKED_IPV6_WORD0, plen, next_header, 0xFF, src,
                            dst, sport, dport, udp_length, 0xFFFF, opcode, b1, p_key,
                            MASKED_QP | (dest_qp & _U24), psn_word)  # fmt: skip


def icrc(masked_headers: Buffer, *rest: Buffer) -> int:
    """The ICRC of a packet: the CRC over its masked headers and then ``rest``.

    :param masked_headers: what :func:`masked_ipv4_headers` or
        :func:`masked_ipv6_headers` returns.
    :param rest: what follows the BTH up to the ICRC (extension headers, payload,
        pad), in pieces, in order; empty pieces change nothing.
    :returns: the CRC value; it goes on the wire as ``ICRC.pack(value)``.
    """
    crc = crc32(masked_headers, ICRC_SEED)
    for part in rest:
        crc = crc32(part, crc)
    return crc
