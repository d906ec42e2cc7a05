"""RoCEv2 transport headers: the RC opcode table, the BTH and the extension headers.

Design
------
A RoCEv2 packet is ``IP | UDP(dport 4791) | BTH | ext headers | payload | pad | ICRC``
(spec rocev2 §1.1).  This module holds the header codecs; whole packets, the ICRC, the
IP/UDP encapsulation and the UDP source port are in :mod:`smcr.wire.roce_packet`.

The user-space RNIC builds and parses every packet with these codecs, at hundreds of
thousands of packets per second, so each header has one precompiled
:class:`struct.Struct` (one ``unpack_from``/``pack`` per header), and the opcode alone
says which extension headers follow and how long they are (:data:`OPCODE_INFO`, spec
§2.3, mirroring Linux ``rxe_opcode.c``), so a parser walks a fixed list and never
guesses.  Hot paths use plain-int copies of the table (``_MASK_BY_BYTE``,
``_LENGTH_BY_BYTE``): IntFlag arithmetic costs about a microsecond per operation.

Reserved bits that rxe ignores on receive (BTH byte 4 bits 5:0, BTH byte 8 bits 6:0,
FETH bits 31:6) are accepted with any value and always sent as zero.  Decoders raise
only :class:`~smcr.wire.errors.WireError`; encoders raise ``ValueError`` (or
``struct.error``) for a field out of range, which is a local bug, not bad input.
"""

from __future__ import annotations

import struct
from dataclasses import astuple, dataclass
from enum import IntEnum, IntFlag
from typing import ClassVar, Final, NamedTuple, Self

from smcr.wire.errors import WireError
from smcr.wire.validate import check_uint

Buffer = bytes | bytearray | memoryview

#: IANA RoCEv2 UDP destination port (spec §1.2).
ROCEV2_UDP_PORT: Final = 4791

BTH_LEN: Final = 12
RETH_LEN: Final = 16
AETH_LEN: Final = 4
IMMDT_LEN: Final = 4
IETH_LEN: Final = 4
ATOMIC_ETH_LEN: Final = 28
ATOMIC_ACK_ETH_LEN: Final = 8
FETH_LEN: Final = 4
ICRC_LEN: Final = 4

#: The P_Key rxe sends (spec §2.1).
DEFAULT_P_KEY: Final = 0xFFFF
#: P_Keys rxe accepts on receive: the default partition, full or limited member.
ACCEPTED_P_KEYS: Final = frozenset({0xFFFF, 0x7FFF})

_U24: Final = 0xFFFFFF


# --------------------------------------------------------------------------------------
# Opcodes (spec §2.3)


class Opcode(IntEnum):
    """An RC opcode of the BTH (transport bits 7:5 = 000), spec §2.3, Linux ``ib_pack.h``."""

    SEND_FIRST = 0x00
    SEND_MIDDLE = 0x01
    SEND_LAST = 0x02
    SEND_LAST_WITH_IMMEDIATE = 0x03
    SEND_ONLY = 0x04
    SEND_ONLY_WITH_IMMEDIATE = 0x05
    RDMA_WRITE_FIRST = 0x06
    RDMA_WRITE_MIDDLE = 0x07
    RDMA_WRITE_LAST = 0x08
    RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x09
    RDMA_WRITE_ONLY = 0x0A
    RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x0B
    RDMA_READ_REQUEST = 0x0C
    RDMA_READ_RESPONSE_FIRST = 0x0D
    RDMA_READ_RESPONSE_MIDDLE = 0x0E
    RDMA_READ_RESPONSE_LAST = 0x0F
    RDMA_READ_RESPONSE_ONLY = 0x10
    ACKNOWLEDGE = 0x11
    ATOMIC_ACKNOWLEDGE = 0x12
    COMPARE_SWAP = 0x13
    FETCH_ADD = 0x14
    SEND_LAST_WITH_INVALIDATE = 0x16
    SEND_ONLY_WITH_INVALIDATE = 0x17
    FLUSH = 0x1C
    ATOMIC_WRITE = 0x1D


class ExtHeader(IntFlag):
    """The extension headers an opcode carries after the BTH (spec §2.2)."""

    NONE = 0
    AETH = 0x01
    ATOMIC_ACK_ETH = 0x02
    FETH = 0x04
    RETH = 0x08
    ATOMIC_ETH = 0x10
    IMMDT = 0x20
    IETH = 0x40


class Position(IntEnum):
    """Where a packet sits in its message (rxe ``RXE_START_MASK``/``RXE_END_MASK``).

    Single-packet operations (READ request, ACK, atomics, FLUSH) are ``ONLY``.
    """

    FIRST = 0
    MIDDLE = 1
    LAST = 2
    ONLY = 3


class OpcodeInfo(NamedTuple):
    """What the opcode alone says about a packet (spec §2.3, Linux ``rxe_opcode.c``).

    :param opcode: the opcode.
    :param headers: the extension headers after the BTH, as flags.
    :param header_length: BTH plus extension headers, in bytes.
    :param position: first/middle/last/only in its message.
    :param has_payload: whether the opcode carries data (rxe ``RXE_PAYLOAD_MASK``).
    :param is_request: sent by a requester (else it is a response: ACK, READ response,
        ATOMIC ACK).
    """

    opcode: Opcode
    headers: ExtHeader
    header_length: int
    position: Position
    has_payload: bool
    is_request: bool


_HEADER_LENGTHS: Final = {
    ExtHeader.AETH: AETH_LEN,
    ExtHeader.ATOMIC_ACK_ETH: ATOMIC_ACK_ETH_LEN,
    ExtHeader.FETH: FETH_LEN,
    ExtHeader.RETH: RETH_LEN,
    ExtHeader.ATOMIC_ETH: ATOMIC_ETH_LEN,
    ExtHeader.IMMDT: IMMDT_LEN,
    ExtHeader.IETH: IETH_LEN,
}


def _info(
    op: Opcode, headers: ExtHeader, position: Position, has_payload: bool, is_request: bool
) -> OpcodeInfo:
    length = BTH_LEN + sum(n for flag, n in _HEADER_LENGTHS.items() if headers & flag)
    return OpcodeInfo(op, headers, length, position, has_payload, is_request)


_H = ExtHeader
_P = Position
_O = Opcode

#: Opcode -> :class:`OpcodeInfo`, the table of spec §2.3.
OPCODE_INFO: Final[dict[Opcode, OpcodeInfo]] = {
    i.opcode: i
    for i in (
        _info(_O.SEND_FIRST, _H.NONE, _P.FIRST, True, True),
        _info(_O.SEND_MIDDLE, _H.NONE, _P.MIDDLE, True, True),
        _info(_O.SEND_LAST, _H.NONE, _P.LAST, True, True),
        _info(_O.SEND_LAST_WITH_IMMEDIATE, _H.IMMDT, _P.LAST, True, True),
        _info(_O.SEND_ONLY, _H.NONE, _P.ONLY, True, True),
        _info(_O.SEND_ONLY_WITH_IMMEDIATE, _H.IMMDT, _P.ONLY, True, True),
        _info(_O.RDMA_WRITE_FIRST, _H.RETH, _P.FIRST, True, True),
        _info(_O.RDMA_WRITE_MIDDLE, _H.NONE, _P.MIDDLE, True, True),
        _info(_O.RDMA_WRITE_LAST, _H.NONE, _P.LAST, True, True),
        _info(_O.RDMA_WRITE_LAST_WITH_IMMEDIATE, _H.IMMDT, _P.LAST, True, True),
        _info(_O.RDMA_WRITE_ONLY, _H.RETH, _P.ONLY, True, True),
        _info(_O.RDMA_WRITE_ONLY_WITH_IMMEDIATE, _H.RETH | _H.IMMDT, _P.ONLY, True, True),
        _info(_O.RDMA_READ_REQUEST, _H.RETH, _P.ONLY, False, True),
        _info(_O.RDMA_READ_RESPONSE_FIRST, _H.AETH, _P.FIRST, True, False),
        _info(_O.RDMA_READ_RESPONSE_MIDDLE, _H.NONE, _P.MIDDLE, True, False),
        _info(_O.RDMA_READ_RESPONSE_LAST, _H.AETH, _P.LAST, True, False),
        _info(_O.RDMA_READ_RESPONSE_ONLY, _H.AETH, _P.ONLY, True, False),
        _info(_O.ACKNOWLEDGE, _H.AETH, _P.ONLY, False, False),
        _info(_O.ATOMIC_ACKNOWLEDGE, _H.AETH | _H.ATOMIC_ACK_ETH, _P.ONLY, False, False),
        _info(_O.COMPARE_SWAP, _H.ATOMIC_ETH, _P.ONLY, False, True),
        _info(_O.FETCH_ADD, _H.ATOMIC_ETH, _P.ONLY, False, True),
        _info(_O.SEND_LAST_WITH_INVALIDATE, _H.IETH, _P.LAST, True, True),
        _info(_O.SEND_ONLY_WITH_INVALIDATE, _H.IETH, _P.ONLY, True, True),
        _info(_O.FLUSH, _H.FETH | _H.RETH, _P.ONLY, False, True),
        # ATOMIC WRITE carries its 8-byte value as payload (rxe RXE_PAYLOAD_MASK).
        _info(_O.ATOMIC_WRITE, _H.RETH, _P.ONLY, True, True),
    )
}

# Indexed by the opcode byte for the decoder: one list lookup, no enum construction.
_INFO_BY_BYTE: Final[list[OpcodeInfo | None]] = [None] * 256
# The same as plain ints (IntFlag arithmetic costs about a microsecond per operation).
_MASK_BY_BYTE: Final[list[int]] = [0] * 256
_LENGTH_BY_BYTE: Final[list[int]] = [0] * 256
for _op, _i in OPCODE_INFO.items():
    _INFO_BY_BYTE[_op] = _i
    _MASK_BY_BYTE[_op] = int(_i.headers)
    _LENGTH_BY_BYTE[_op] = _i.header_length
_AETH_F: Final = int(ExtHeader.AETH)
_ATOMIC_ACK_ETH_F: Final = int(ExtHeader.ATOMIC_ACK_ETH)
_FETH_F: Final = int(ExtHeader.FETH)
_RETH_F: Final = int(ExtHeader.RETH)
_ATOMIC_ETH_F: Final = int(ExtHeader.ATOMIC_ETH)
_IMMDT_F: Final = int(ExtHeader.IMMDT)
_IETH_F: Final = int(ExtHeader.IETH)


def opcode_info(opcode: int) -> OpcodeInfo:
    """Return the :class:`OpcodeInfo` of an opcode byte.

    :param opcode: the BTH opcode byte.
    :raises WireError: if it is not an RC opcode this stack knows (rxe drops those).
    """
    info = _INFO_BY_BYTE[opcode] if 0 <= opcode <= 0xFF else None
    if info is None:
        raise WireError(f"BTH opcode 0x{opcode:02x} is not a supported RC opcode")
    return info


# --------------------------------------------------------------------------------------
# BTH (spec §2.1)

_BTH: Final = struct.Struct(">BBHII")


@dataclass(frozen=True, slots=True)
class Bth:
    """Base Transport Header, 12 bytes (spec §2.1, Linux ``rxe_hdr.h`` ``struct rxe_bth``).

    TVer is not a field: it must be 0 (rxe drops anything else), so it is always sent 0
    and rejected otherwise.  The reserved bits of bytes 4 and 8 are ignored on receive,
    as rxe does, and sent as zero.

    :param opcode: the RC opcode.
    :param dest_qp: DestQP, the peer's 24-bit QP number.
    :param psn: 24-bit packet sequence number.
    :param se: solicited event (last/only packet of a solicited SEND or WRITE-with-IMM).
    :param m: MigReq; rxe sends 0 and ignores it.
    :param pad_cnt: PadCnt, 0-3 pad bytes between payload and ICRC.
    :param p_key: partition key; sent 0xFFFF, accepted 0xFFFF or 0x7FFF.
    :param fecn: forward explicit congestion notification (masked in the ICRC).
    :param becn: backward explicit congestion notification (masked in the ICRC).
    :param ack_req: AckReq, ask the responder for an ACK (spec §5.2).
    """

    opcode: Opcode
    dest_qp: int
    psn: int
    se: bool = False
    m: bool = False
    pad_cnt: int = 0
    p_key: int = DEFAULT_P_KEY
    fecn: bool = False
    becn: bool = False
    ack_req: bool = False

    def encode(self) -> bytes:
        """Return the 12 wire bytes.

        :raises ValueError: for a field out of range.
        """
        check_uint("BTH DestQP", self.dest_qp, 24)
        check_uint("BTH PSN", self.psn, 24)
        check_uint("BTH PadCnt", self.pad_cnt, 2)
        return _BTH.pack(
            self.opcode,
            (self.se << 7) | (self.m << 6) | (self.pad_cnt << 4),
            self.p_key,
            (self.fecn << 31) | (self.becn << 30) | self.dest_qp,
            (self.ack_req << 31) | self.psn,
        )

    @classmethod
    def decode(cls, data: Buffer) -> Bth:
        """Decode exactly 12 bytes.

        :raises WireError: wrong length, TVer != 0, unsupported opcode, bad P_Key.
        """
        if len(data) != BTH_LEN:
            raise WireError(f"BTH is {BTH_LEN} bytes, got {len(data)}")
        return cls._decode_from(data)

    @classmethod
    def _decode_from(cls, data: Buffer) -> Bth:
        # Caller guarantees len(data) >= 12.
        op, b1, p_key, w1, w2 = _BTH.unpack_from(data)
        info = _INFO_BY_BYTE[op]
        if info is None:
            raise WireError(f"BTH opcode 0x{op:02x} is not a supported RC opcode")
        if b1 & 0x0F:
            raise WireError(f"BTH TVer {b1 & 0x0F} != 0")
        if p_key not in ACCEPTED_P_KEYS:
            raise WireError(f"BTH P_Key 0x{p_key:04x} is not 0xFFFF/0x7FFF")
        return cls(
            info.opcode,
            w1 & _U24,
            w2 & _U24,
            bool(b1 & 0x80),
            bool(b1 & 0x40),
            (b1 >> 4) & 3,
            p_key,
            bool(w1 & 0x80000000),
            bool(w1 & 0x40000000),
            bool(w2 & 0x80000000),
        )


# --------------------------------------------------------------------------------------
# Extension headers (spec §2.2)

_RETH: Final = struct.Struct(">QII")
_AETH: Final = struct.Struct(">I")
_U32: Final = struct.Struct(">I")
_ATOMIC_ETH: Final = struct.Struct(">QIQQ")
_U64: Final = struct.Struct(">Q")


def _need(data: Buffer, length: int, what: str) -> None:
    if len(data) != length:
        raise WireError(f"{what} is {length} bytes, got {len(data)}")


@dataclass(frozen=True, slots=True)
class _PlainHeader:
    """An extension header whose fields are its :class:`struct.Struct`'s, in order.

    :meth:`encode` packs the fields, :meth:`decode` unpacks exactly ``_LAYOUT.size``
    bytes into them; a header with bit fields (AETH, FETH) has its own codec.
    """

    _LAYOUT: ClassVar[struct.Struct]
    _NAME: ClassVar[str]

    def encode(self) -> bytes:
        """Return the wire bytes."""
        return self._LAYOUT.pack(*astuple(self))

    @classmethod
    def decode(cls, data: Buffer) -> Self:
        """Decode exactly ``_LAYOUT.size`` bytes."""
        _need(data, cls._LAYOUT.size, cls._NAME)
        return cls(*cls._LAYOUT.unpack_from(data))


@dataclass(frozen=True, slots=True)
class Reth(_PlainHeader):
    """RDMA Extended Transport Header, 16 bytes (spec §2.2).

    :param va: remote virtual address (u64).
    :param r_key: remote key (u32).
    :param dma_length: DMA length (u32): the *whole* message length, spec §3.2.
    """

    va: int
    r_key: int
    dma_length: int

    _LAYOUT: ClassVar[struct.Struct] = _RETH
    _NAME: ClassVar[str] = "RETH"


class AethKind(IntEnum):
    """The AETH syndrome type, bits 7:5 as rxe reads them (``syn & AETH_TYPE_MASK``).

    Bit 7 is reserved: a syndrome with it set, or with type 10, is ``RESERVED`` (rxe's
    completer treats those as an unexpected syndrome).
    """

    ACK = 0
    RNR_NAK = 1
    RESERVED = 2
    NAK = 3


class NakCode(IntEnum):
    """The NAK codes in the low 5 bits of a NAK syndrome (spec §5.4)."""

    PSN_SEQUENCE_ERROR = 0
    INVALID_REQUEST = 1
    REMOTE_ACCESS_ERROR = 2
    REMOTE_OPERATIONAL_ERROR = 3
    INVALID_RD_REQUEST = 4


#: Credit count rxe always sends in an ACK: 31, "invalid/unlimited" (spec §5.4).
CREDITS_INVALID: Final = 31

#: RNR timer code -> wait in microseconds (spec §5.4; code 0 is the longest wait).
RNR_TIMER_US: Final[tuple[int, ...]] = (
    655360, 10, 20, 30, 40, 60, 80, 120,
    160, 240, 320, 480, 640, 960, 1280, 1920,
    2560, 3840, 5120, 7680, 10240, 15360, 20480, 30720,
    40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520,
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Aeth:
    """ACK Extended Transport Header, 4 bytes: syndrome and 24-bit MSN (spec §2.2, §5.4).

    The syndrome is kept as the raw byte, so any value decodes and re-encodes unchanged
    (the RNIC interprets it; rxe treats unknown NAK codes as a remote operational
    error).  Build one with :meth:`ack`, :meth:`rnr_nak` or :meth:`nak`.

    :param syndrome: the syndrome byte (bit 7 reserved, bits 6:5 type, 4:0 value).
    :param msn: message sequence number (24-bit).
    """

    syndrome: int
    msn: int

    @classmethod
    def ack(cls, msn: int, credits: int = CREDITS_INVALID) -> Aeth:
        """An ACK; rxe always sends credit count 31."""
        check_uint("AETH credit count", credits, 5)
        return cls(credits, msn)

    @classmethod
    def rnr_nak(cls, msn: int, timer: int) -> Aeth:
        """An RNR NAK carrying an RNR timer code (see :data:`RNR_TIMER_US`)."""
        check_uint("AETH RNR timer code", timer, 5)
        return cls(0x20 | timer, msn)

    @classmethod
    def nak(cls, msn: int, code: NakCode) -> Aeth:
        """A NAK with one of the :class:`NakCode` values."""
        return cls(0x60 | code, msn)

    @property
    def kind(self) -> AethKind:
        """ACK, RNR NAK, NAK or RESERVED (bit 7 set or type 10)."""
        if self.syndrome & 0x80:
            return AethKind.RESERVED
        return AethKind(self.syndrome >> 5)

    @property
    def value(self) -> int:
        """The low 5 bits: credits (ACK), timer code (RNR NAK) or NAK code (NAK)."""
        return self.syndrome & 0x1F

    @property
    def nak_code(self) -> NakCode | None:
        """The NAK code, or ``None`` if this is not a NAK or the code is reserved (5-31)."""
        if self.syndrome & 0xE0 != 0x60 or self.value > NakCode.INVALID_RD_REQUEST:
            return None
        return NakCode(self.value)

    @property
    def rnr_timer_us(self) -> int | None:
        """The RNR wait in microseconds for an RNR NAK, else ``None``."""
        if self.syndrome & 0xE0 != 0x20:
            return None
        return RNR_TIMER_US[self.value]

    def encode(self) -> bytes:
        """Return the 4 wire bytes."""
        check_uint("AETH MSN", self.msn, 24)
        return _AETH.pack((self.syndrome << 24) | self.msn)

    @classmethod
    def decode(cls, data: Buffer) -> Aeth:
        """Decode exactly 4 bytes."""
        _need(data, AETH_LEN, "AETH")
        (word,) = _AETH.unpack_from(data)
        return cls(word >> 24, word & _U24)


@dataclass(frozen=True, slots=True)
class ImmDt(_PlainHeader):
    """Immediate data, 4 opaque bytes (spec §2.2).

    Kept as the unsigned integer the four wire bytes spell **big-endian** (network
    order): ``ImmDt(0x01020304)`` is on the wire as ``01 02 03 04``.  Linux passes
    these bytes unchanged into the ``__be32 wc.imm_data``; a verbs layer that wants
    that C value on a little-endian host must byte-swap.

    :param imm_data: the 32-bit value, big-endian on the wire.
    """

    imm_data: int

    _LAYOUT: ClassVar[struct.Struct] = _U32
    _NAME: ClassVar[str] = "ImmDt"


@dataclass(frozen=True, slots=True)
class Ieth(_PlainHeader):
    """Invalidate Extended Transport Header, 4 bytes: the R_Key to invalidate (spec §2.2).

    :param r_key: the remote key the responder invalidates.
    """

    r_key: int

    _LAYOUT: ClassVar[struct.Struct] = _U32
    _NAME: ClassVar[str] = "IETH"


@dataclass(frozen=True, slots=True)
class AtomicEth(_PlainHeader):
    """Atomic Extended Transport Header, 28 bytes, packed (spec §2.2).

    :param va: remote virtual address (8-byte aligned, checked by the responder).
    :param r_key: remote key.
    :param swap_add: Swap (COMPARE_SWAP) or Add (FETCH_ADD) data, u64.
    :param compare: Compare data (COMPARE_SWAP), u64.
    """

    va: int
    r_key: int
    swap_add: int
    compare: int

    _LAYOUT: ClassVar[struct.Struct] = _ATOMIC_ETH
    _NAME: ClassVar[str] = "AtomicETH"


@dataclass(frozen=True, slots=True)
class AtomicAckEth(_PlainHeader):
    """Atomic Acknowledge Extended Transport Header, 8 bytes (spec §2.2).

    :param orig_rem_dt: the original remote data (u64) before the atomic operation.
    """

    orig_rem_dt: int

    _LAYOUT: ClassVar[struct.Struct] = _U64
    _NAME: ClassVar[str] = "AtomicAckETH"


@dataclass(frozen=True, slots=True)
class Feth:
    """FLUSH Extended Transport Header, 4 bytes (spec §2.2; rxe >= 6.2 only).

    Bits 31:6 are reserved: ignored on receive (rxe reads only the two masks), sent 0.

    :param placement_type: bits 3:0 (1 = global visibility, 2 = persistence).
    :param selectivity_level: bits 5:4 (0 = the memory range, 1 = the whole region).
    """

    placement_type: int
    selectivity_level: int

    def encode(self) -> bytes:
        """Return the 4 wire bytes."""
        check_uint("FETH placement type", self.placement_type, 4)
        check_uint("FETH selectivity level", self.selectivity_level, 2)
        return _U32.pack((self.selectivity_level << 4) | self.placement_type)

    @classmethod
    def decode(cls, data: Buffer) -> Feth:
        """Decode exactly 4 bytes."""
        _need(data, FETH_LEN, "FETH")
        (word,) = _U32.unpack_from(data)
        return cls(word & 0x0F, (word >> 4) & 3)
