"""Lean, allocation-light RoCEv2 header packing and ICRC for the RNIC's data path.

Design: :mod:`smcr.wire.roce_packet` decodes a packet into frozen dataclasses
(about 5 µs each), which is right for tools and tests but costs more than the
whole rest of a packet's handling here.  This module does the same work with
one precompiled :class:`struct.Struct` per step and plain ints and tuples:

* :func:`parse_bth` returns ``(opcode, b1, p_key, dest_qp_word, psn_word)``;
  the caller takes PSN, AckReq and PadCnt out of the ints itself;
* :class:`IcrcV4` computes the ICRC (spec rocev2 §4) of a packet of one flow from
  a single 40-byte masked IPv4+UDP+BTH header packed per packet, continued over
  the extension headers, payload and pad (``zlib.crc32`` runs on from a seed, so
  nothing is joined);
* :class:`IcrcV6` does the same for IPv6, where every covered field is known
  to a UDP receiver, so the check is exact;
* :func:`recover_id` implements option (c) of spec §4.4: a UDP socket
  never sees the IPv4 ID that the ICRC covers, so a packet whose ICRC fails
  with ID 0 (what our own sender, an unconnected ``IP_PMTUDISC_DO`` socket,
  puts there) is checked for *some* 16-bit ID that makes it consistent, by CRC
  linearity: ``crc(m ^ e) = crc(m) ^ crc(e) ^ crc(0)`` for equal lengths.
  What it costs: 16 of the ICRC's 32 bits go into finding the ID, so a
  corrupted packet passes with probability 2**-16 instead of 2**-32 (the
  Ethernet FCS and the UDP checksum, which our senders fill in, still guard
  the link); IDs 1-127, which our own UDP GSO runs carry, are one dict look-up.

Every function here is tested for agreement with the codecs of
:mod:`smcr.wire.roce_packet` (``tests/roce/test_fastpath.py``).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from functools import lru_cache
from typing import Final

from smcr.wire.roce import _LENGTH_BY_BYTE, _MASK_BY_BYTE, ROCEV2_UDP_PORT

Buffer = bytes | bytearray | memoryview

BTH: Final = struct.Struct(">BBHII")
RETH: Final = struct.Struct(">QII")
U32: Final = struct.Struct(">I")
ICRC: Final = struct.Struct("<I")
#: Masked IPv4 (20) + UDP (8) + BTH (12), as the ICRC sees them (spec §4.2):
#: TOS, TTL, IP checksum, UDP checksum and BTH byte 4 are all ones.
_V4_MASKED: Final = struct.Struct(">BBHHHBBH4s4sHHHHBBHII")
#: Masked IPv6 (40) + UDP (8) + BTH (12): traffic class and flow label (bytes 0-3
#: become 6F FF FF FF), hop limit, UDP checksum and BTH byte 4 are all ones.
_V6_MASKED: Final = struct.Struct(">IHBB16s16sHHHHBBHII")
_SEED: Final = zlib.crc32(b"\xff" * 8)
PADS: Final = (b"", b"\x00", b"\x00\x00", b"\x00\x00\x00")
P_KEY: Final = 0xFFFF
U24: Final = 0xFFFFFF
ACK_REQ: Final = 0x80000000
IP_DF: Final = 0x4000
#: BTH + extension header length per opcode byte (0 for an unknown opcode).
HEADER_LENGTH: Final = _LENGTH_BY_BYTE
#: Extension-header flags per opcode byte (:class:`smcr.wire.roce.ExtHeader` as int).
HEADER_MASK: Final = _MASK_BY_BYTE
#: Offset of the IPv4 ID inside the ICRC input (8 bytes of pseudo-LRH, then IP byte 4).
_ID_OFFSET: Final = 8 + 4


def parse_bth(view: Buffer) -> tuple[int, int, int, int, int]:
    """``(opcode, b1, p_key, dest_qp_word, psn_word)`` of the first 12 bytes.

    ``b1`` holds SE (bit 7), PadCnt (bits 5:4) and TVer (3:0); ``psn_word``
    holds AckReq (bit 31) and the PSN (23:0); ``dest_qp_word`` FECN/BECN and
    the DestQP (23:0).
    """
    op, b1, pkey, dqp, psn = BTH.unpack_from(view)
    return op, b1, pkey, dqp, psn


def pack_bth(opcode: int, b1: int, dest_qp: int, psn_word: int) -> bytes:
    """The 12 wire bytes of a BTH with P_Key 0xFFFF and FECN/BECN 0."""
    return BTH.pack(opcode, b1, P_KEY, dest_qp, psn_word)


def pack_reth(va: int, rkey: int, length: int) -> bytes:
    """The 16 bytes of a RETH."""
    return RETH.pack(va, rkey, length)


def pack_aeth(syndrome: int, msn: int) -> bytes:
    """The 4 bytes of an AETH."""
    return U32.pack((syndrome << 24) | (msn & U24))


class IcrcV4:
    """The ICRC of the packets of one IPv4 flow (source/destination address and ports).

    :param src: source address, 4 bytes.
    :param dst: destination address, 4 bytes.
    :param sport: UDP source port.
    :param dport: UDP destination port (4791).
    """

    __slots__ = ("dport", "dst", "sport", "src")

    def __init__(self, src: bytes, dst: bytes, sport: int, dport: int = ROCEV2_UDP_PORT) -> None:
        self.src = src
        self.dst = dst
        self.sport = sport
        self.dport = dport

    def compute(
        self, opcode: int, b1: int, dest_qp: int, psn_word: int, rest: Buffer, payload: Buffer,
        ip_id: int = 0,
    ) -> int:  # fmt: skip
        """ICRC of a packet with IPv4 ID ``ip_id`` and DF set.

        :param rest: the extension headers (may be empty).
        :param payload: the payload; the pad is derived from ``b1``'s PadCnt.
        """
        pad = (b1 >> 4) & 3
        ulen = 8 + 12 + len(rest) + len(payload) + pad + 4
        crc = zlib.crc32(
            _V4_MASKED.pack(
                0x45, 0xFF, ulen + 20, ip_id, IP_DF, 0xFF, 17, 0xFFFF, self.src, self.dst,
                self.sport, self.dport, ulen, 0xFFFF,
                opcode, b1, P_KEY, 0xFF000000 | (dest_qp & U24), psn_word,
            ),
            _SEED,
        )  # fmt: skip
        if rest:
            crc = zlib.crc32(rest, crc)
        if payload:
            crc = zlib.crc32(payload, crc)
        if pad:
            crc = zlib.crc32(PADS[pad], crc)
        return crc

    def check(self, packet: memoryview) -> int:
        """Whether a received UDP payload (BTH through ICRC) carries a consistent ICRC.

        :returns: 0 if not, 1 if it is right with IPv4 ID 0, 2 if right with a
            recovered ID.

        Tries ID 0 first (our own senders), then :meth:`recover_id` (rxe and
        hardware send a hashed ID that a UDP socket cannot see).  DF is assumed
        set, as rxe always sets it (spec §1.4).
        """
        opcode, b1, _pkey, dqp_word, psn_word = BTH.unpack_from(packet)
        return self.verify(packet, len(packet), opcode, b1, dqp_word, psn_word)

    def verify(self, packet: memoryview, n: int, opcode: int, b1: int, dqp_word: int,
               psn_word: int) -> int:  # fmt: skip
        """:meth:`check` for a packet of ``n`` bytes whose BTH the caller has unpacked."""
        crc = zlib.crc32(
            _V4_MASKED.pack(
                0x45, 0xFF, n + 28, 0, IP_DF, 0xFF, 17, 0xFFFF, self.src, self.dst,
                self.sport, self.dport, n + 8, 0xFFFF,
                opcode, b1, P_KEY, 0xFF000000 | (dqp_word & U24), psn_word,
            ),
            _SEED,
        )  # fmt: skip
        if n > 16:
            crc = zlib.crc32(packet[12 : n - 4], crc)
        (found,) = ICRC.unpack_from(packet, n - 4)
        if crc == found:
            return 1
        if (crc ^ found) in _small_ids(n):  # a UDP GSO segment's ID: 1, 2, 3...
            return 2
        return 0 if recover_id(n, crc ^ found) is None else 2

    def frames(self, queue: Sequence[tuple[int, int, int, bytes, Buffer]], start: int, end: int,
               dest_qp: int) -> list[Buffer]:  # fmt: skip
        """The ``sendmsg`` buffers of the packets ``queue[start:end]``, one UDP GSO run.

        Each entry is ``(opcode, b1, psn_word, ext_headers, payload)``; packet
        ``k`` of the run gets IPv4 ID ``k`` (how the kernel numbers GSO
        segments).  Why here and in one loop: per packet this is the sender's
        hottest Python, so the masked header is packed inline with the flow's
        constants in locals, and each packet's ICRC shares a buffer with the next
        packet's BTH, which halves the buffers handed to the kernel.
        """
        parts: list[Buffer] = []
        append = parts.append
        pack, crc32, bth, icrc = _V4_MASKED.pack, zlib.crc32, BTH.pack, ICRC.pack
        src, dst, sport, dport = self.src, self.dst, self.sport, self.dport
        masked_qp = 0xFF000000 | (dest_qp & U24)
        tail = b""
        for k in range(start, end):
            opcode, b1, psn_word, ext, payload = queue[k]
            pad = (b1 >> 4) & 3
            ulen = 24 + len(ext) + len(payload) + pad
            crc = crc32(pack(0x45, 0xFF, ulen + 20, k - start, IP_DF, 0xFF, 17, 0xFFFF, src, dst,
                             sport, dport, ulen, 0xFFFF, opcode, b1, P_KEY, masked_qp,
                             psn_word), _SEED)  # fmt: skip
            head = bth(opcode, b1, P_KEY, dest_qp, psn_word)
            if ext:
                crc = crc32(ext, crc)
                head += ext
            append(tail + head if tail else head)
            if payload:
                crc = crc32(payload, crc)
                append(payload)
            if pad:
                crc = crc32(PADS[pad], crc)
                tail = PADS[pad] + icrc(crc)
            else:
                tail = icrc(crc)
        append(tail)
        return parts


class IcrcV6:
    """The ICRC of the packets of one IPv6 flow; same interface as :class:`IcrcV4`.

    IPv6 has no ID, so a UDP receiver knows every covered field (addresses,
    payload length = UDP length, next header 17) and checks the ICRC exactly
    (spec §4.4).
    """

    __slots__ = ("dport", "dst", "sport", "src")

    def __init__(self, src: bytes, dst: bytes, sport: int, dport: int = ROCEV2_UDP_PORT) -> None:
        self.src = src
        self.dst = dst
        self.sport = sport
        self.dport = dport

    def compute(
        self, opcode: int, b1: int, dest_qp: int, psn_word: int, rest: Buffer, payload: Buffer,
        ip_id: int = 0,
    ) -> int:  # fmt: skip
        """ICRC of a packet (``ip_id`` is ignored: IPv6 has none)."""
        pad = (b1 >> 4) & 3
        ulen = 8 + 12 + len(rest) + len(payload) + pad + 4
        crc = zlib.crc32(
            _V6_MASKED.pack(
                0x6FFFFFFF, ulen, 17, 0xFF, self.src, self.dst, self.sport, self.dport, ulen,
                0xFFFF, opcode, b1, P_KEY, 0xFF000000 | (dest_qp & U24), psn_word,
            ),
            _SEED,
        )  # fmt: skip
        if rest:
            crc = zlib.crc32(rest, crc)
        if payload:
            crc = zlib.crc32(payload, crc)
        if pad:
            crc = zlib.crc32(PADS[pad], crc)
        return crc

    def check(self, packet: memoryview) -> int:
        """1 if the ICRC of a received UDP payload (BTH through ICRC) is right, else 0."""
        opcode, b1, _pkey, dqp_word, psn_word = BTH.unpack_from(packet)
        return self.verify(packet, len(packet), opcode, b1, dqp_word, psn_word)

    def verify(self, packet: memoryview, n: int, opcode: int, b1: int, dqp_word: int,
               psn_word: int) -> int:  # fmt: skip
        """:meth:`check` for a packet of ``n`` bytes whose BTH the caller has unpacked."""
        crc = zlib.crc32(
            _V6_MASKED.pack(
                0x6FFFFFFF, n + 8, 17, 0xFF, self.src, self.dst, self.sport, self.dport, n + 8,
                0xFFFF, opcode, b1, P_KEY, 0xFF000000 | (dqp_word & U24), psn_word,
            ),
            _SEED,
        )  # fmt: skip
        if n > 16:
            crc = zlib.crc32(packet[12 : n - 4], crc)
        return 1 if crc == ICRC.unpack_from(packet, n - 4)[0] else 0

    def frames(self, queue: Sequence[tuple[int, int, int, bytes, Buffer]], start: int, end: int,
               dest_qp: int) -> list[Buffer]:  # fmt: skip
        """The ``sendmsg`` buffers of ``queue[start:end]`` (see :meth:`IcrcV4.frames`)."""
        parts: list[Buffer] = []
        append = parts.append
        pack, crc32, bth, icrc = _V6_MASKED.pack, zlib.crc32, BTH.pack, ICRC.pack
        src, dst, sport, dport = self.src, self.dst, self.sport, self.dport
        masked_qp = 0xFF000000 | (dest_qp & U24)
        tail = b""
        for k in range(start, end):
            opcode, b1, psn_word, ext, payload = queue[k]
            pad = (b1 >> 4) & 3
            ulen = 24 + len(ext) + len(payload) + pad
            crc = crc32(pack(0x6FFFFFFF, ulen, 17, 0xFF, src, dst, sport, dport, ulen, 0xFFFF,
                             opcode, b1, P_KEY, masked_qp, psn_word), _SEED)  # fmt: skip
            head = bth(opcode, b1, P_KEY, dest_qp, psn_word)
            if ext:
                crc = crc32(ext, crc)
                head += ext
            append(tail + head if tail else head)
            if payload:
                crc = crc32(payload, crc)
                append(payload)
            if pad:
                crc = crc32(PADS[pad], crc)
                tail = PADS[pad] + icrc(crc)
            else:
                tail = icrc(crc)
        append(tail)
        return parts


def flow_icrc(src: bytes, dst: bytes, sport: int, dport: int = ROCEV2_UDP_PORT) -> IcrcV4 | IcrcV6:
    """The ICRC calculator of a flow: IPv4 for 4-byte addresses, IPv6 for 16-byte ones."""
    return (IcrcV4 if len(src) == 4 else IcrcV6)(src, dst, sport, dport)


@lru_cache(maxsize=64)
def _id_solver(length: int) -> tuple[tuple[int, int, int], ...]:
    """Row-reduced images of the 16 IPv4-ID bits for an ICRC input of ``length`` bytes.

    Returns ``(pivot_bit, vector, id_bits)`` triples: XOR-ing ``vector`` out of a
    CRC difference accounts for flipping ``id_bits`` of the ID.
    """
    zero = zlib.crc32(bytes(length))
    rows: list[tuple[int, int, int]] = []
    for bit in range(16):
        msg = bytearray(length)
        msg[_ID_OFFSET : _ID_OFFSET + 2] = (1 << bit).to_bytes(2, "big")
        vec, combo = zlib.crc32(msg) ^ zero, 1 << bit
        for pivot, rvec, rcombo in rows:
            if vec & pivot:
                vec ^= rvec
                combo ^= rcombo
        if vec:
            pivot = vec & -vec
            rows = [(p, v ^ vec, c ^ combo) if v & pivot else (p, v, c) for p, v, c in rows]
            rows.append((pivot, vec, combo))
    return tuple(rows)


@lru_cache(maxsize=64)
def _small_ids(udp_payload_length: int) -> dict[int, int]:
    """CRC difference -> ID for IDs 1..127, the IDs of our own UDP GSO segments.

    Why: a GSO run of k packets carries IDs 0..k-1 (see :meth:`RoceQp.flush_tx`),
    so most non-zero IDs we receive are small; one dict look-up finds them,
    where the general solver costs a 16-step loop.
    """
    length = 8 + 20 + 8 + udp_payload_length - 4
    zero = zlib.crc32(bytes(length))
    basis = []
    for bit in range(7):
        msg = bytearray(length)
        msg[_ID_OFFSET : _ID_OFFSET + 2] = (1 << bit).to_bytes(2, "big")
        basis.append(zlib.crc32(msg) ^ zero)
    table = {}
    for ident in range(1, 128):
        d = 0
        for bit in range(7):
            if ident >> bit & 1:
                d ^= basis[bit]
        table[d] = ident
    return table


def recover_id(udp_payload_length: int, difference: int) -> int | None:
    """The IPv4 ID that explains an ICRC ``difference`` (computed with ID 0 ^ found), or None.

    :param udp_payload_length: BTH through ICRC, in bytes.
    :param difference: the CRC computed assuming ID 0, XOR the ICRC found.
    :returns: the ID, or ``None`` if no ID explains it (a corrupted packet; with
        16 bits solved out of 32, about 1 in 65536 corruptions passes).
    """
    # ICRC input: 8 (pseudo-LRH) + 20 (IPv4) + 8 (UDP) + BTH..pad (payload - ICRC)
    length = 8 + 20 + 8 + udp_payload_length - 4
    ident = 0
    for pivot, vec, combo in _id_solver(length):
        if difference & pivot:
            difference ^= vec
            ident ^= combo
    return ident if difference == 0 else None
