"""The parts every CLC message shares: 8-byte header, 4-byte trailer, types (spec §2.1).

Design
------
A CLC message travels in the TCP byte stream before any application data.  It
starts with an 8-byte header -- the EBCDIC eyecatcher ``SMCR`` (``E2 D4 C3 D9``)
or ``SMCD`` (``E2 D4 C3 C4``), the message type, the 16-bit total length, and a
"version / flags" byte -- and ends with a 4-byte trailer that repeats the
eyecatcher.

Byte 7 is read with the current Linux bit layout (``smc_clc.h``
``struct smc_clc_msg_hdr``): ``version`` in 0xF0, ``typev2`` in 0x0C and
``typev1`` in 0x03.  In a Proposal ``typev1``/``typev2`` are the SMC types
offered for v1 and v2 (:class:`SmcType`).  In Accept, Confirm and Decline the
0x08 bit (``SMC_FIRST_CONTACT_MASK`` inside ``typev2``) is the *first contact*
flag (Accept/Confirm) or the *out of sync* flag (Decline), 0x04 is unused, and
``typev1`` says SMC-R (0) or SMC-D (1) in Accept/Confirm.  Old Linux (4.x) and
RFC 7609 call the same 0x08 bit ``flag``; the bytes are identical.

Linux accepts either eyecatcher in header and trailer of every message type
(``smc_clc_msg_hdr_valid``); so do the decoders here.  smcr only speaks SMC-R,
and Linux sends the ``SMCR`` eyecatcher in every message except SMC-D
Accept/Confirm, so the encoders always write ``SMCR``.

This module holds what the message modules (:mod:`smcr.wire.clc_proposal`,
:mod:`smcr.wire.clc`) share; :mod:`smcr.wire.clc` re-exports all of it.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import TypeAlias

from smcr.wire.errors import WireError
from smcr.wire.validate import check_bytes, check_uint

__all__ = [
    "CLC_HEADER_LEN",
    "CLC_MAX_LENGTH",
    "CLC_MIN_LENGTH",
    "CLC_TRAILER_LEN",
    "EYECATCHER_SMCD",
    "EYECATCHER_SMCR",
    "FIRST_CONTACT_MASK",
    "Buffer",
    "ClcHeader",
    "ClcType",
    "SmcType",
]

Buffer: TypeAlias = bytes | bytearray | memoryview

#: EBCDIC "SMCR", the eyecatcher of every SMC-R CLC message (spec §2.1).
EYECATCHER_SMCR = b"\xe2\xd4\xc3\xd9"
#: EBCDIC "SMCD", used by SMC-D Accept/Confirm; Linux accepts it anywhere.
EYECATCHER_SMCD = b"\xe2\xd4\xc3\xc4"
_EYECATCHERS = (EYECATCHER_SMCR, EYECATCHER_SMCD)

CLC_HEADER_LEN = 8
CLC_TRAILER_LEN = 4

#: Byte 7 bit that means first contact (Accept/Confirm) or out of sync (Decline).
FIRST_CONTACT_MASK = 0x08
_VERSION_MASK = 0xF0
_TYPEV2_MASK = 0x0C
_TYPEV1_MASK = 0x03

_HEADER = struct.Struct(">4sBHB")


class ClcType(enum.IntEnum):
    """CLC message type, byte 4 of the header (``SMC_CLC_*``, spec §2.1)."""

    PROPOSAL = 0x01
    ACCEPT = 0x02
    CONFIRM = 0x03
    DECLINE = 0x04


class SmcType(enum.IntEnum):
    """An SMC type set as offered in a Proposal (``SMC_TYPE_*``, spec §2.1).

    Also the ``typev1`` value of Accept/Confirm, where only R (0) and D (1) occur.
    """

    R = 0  #: SMC-R only
    D = 1  #: SMC-D only
    N = 2  #: neither
    B = 3  #: both SMC-R and SMC-D

    @property
    def smcr(self) -> bool:
        """True when SMC-R is indicated (Linux ``smcr_indicated``)."""
        return self in (SmcType.R, SmcType.B)

    @property
    def smcd(self) -> bool:
        """True when SMC-D is indicated (Linux ``smcd_indicated``)."""
        return self in (SmcType.D, SmcType.B)


SMC_TYPES: tuple[SmcType, ...] = tuple(SmcType)
""":class:`SmcType` by its 2-bit value (a header's ``typev1``/``typev2``): an index, where
calling the enum is interpreted code (``EnumType.__call__``), on every Proposal read."""

#: Shortest valid message of each type: RFC-style Proposal 52, v1 SMC-D
#: Accept/Confirm 48 (SMC-R: 68), v1 Decline 28 (spec §2.3.5, §2.4, §2.5, §9).
CLC_MIN_LENGTH: dict[ClcType, int] = {
    ClcType.PROPOSAL: 52,
    ClcType.ACCEPT: 48,
    ClcType.CONFIRM: 48,
    ClcType.DECLINE: 28,
}

#: Longest valid message of each type that the decoders accept.
#:
#: * Proposal 652 = 40 base + 40 SMC-D/v2 area + 8 prefix + 8 x 17 IPv6 prefixes
#:   + 40 v2 extension + 8 x 32 user EIDs + 48 SMC-Dv2 extension + 8 x 10 ISM
#:   GID/CHID + 4 trailer: exactly Linux's ``struct smc_clc_msg_proposal_area``,
#:   the largest Proposal Linux can send or accept.
#: * Accept 160 (v2 first contact), Decline 44 (v2).
#: * Confirm 292 = 160 + 4 GID-list header + 8 x 16 GIDs (Linux sends 1 or 2
#:   GIDs; 8 leaves room while bounding the buffer, see
#:   :data:`smcr.wire.clc.CONFIRM_MAX_GIDS`).
#:
#: Linux itself reads a CLC message into a buffer of the expected type's size
#: and silently drains any excess (``smc_clc_wait_msg``); a byte-stream reader
#: that must not buffer without bound refuses such lengths instead, before the
#: body arrives (:class:`smcr.wire.clc.ClcReader`).
CLC_MAX_LENGTH: dict[ClcType, int] = {
    ClcType.PROPOSAL: 652,
    ClcType.ACCEPT: 160,
    ClcType.CONFIRM: 292,
    ClcType.DECLINE: 44,
}


@dataclass(frozen=True, slots=True, init=False)
class ClcHeader:
    """The common 8-byte CLC header (spec §2.1, ``struct smc_clc_msg_hdr``).

    :param eyecatcher: ``SMCR`` or ``SMCD`` eyecatcher, 4 bytes.
    :param type: message type (:class:`ClcType`).
    :param length: total message length including header and trailer.
    :param version: CLC version, the high nibble of byte 7 (1 or 2; higher
        values are read as version 2, as Linux does).
    :param typev2: bits 0x0C of byte 7, as the 2-bit value (0..3).
    :param typev1: bits 0x03 of byte 7 (0..3).
    """

    eyecatcher: bytes
    type: ClcType
    length: int
    version: int
    typev2: int
    typev1: int

    def __init__(self, eyecatcher: bytes, type: ClcType, length: int, version: int,
                 typev2: int, typev1: int) -> None:  # fmt: skip
        # written out (each message read makes one): the compiled build then stores each
        # field without the interpreter, where the dataclass's frozen __init__ is interpreted
        object.__setattr__(self, "eyecatcher", eyecatcher)
        object.__setattr__(self, "type", type)
        object.__setattr__(self, "length", length)
        object.__setattr__(self, "version", version)
        object.__setattr__(self, "typev2", typev2)
        object.__setattr__(self, "typev1", typev1)

    @property
    def flag(self) -> bool:
        """The 0x08 bit of byte 7: first contact (Accept/Confirm), out of sync (Decline)."""
        return bool(self.typev2 & (FIRST_CONTACT_MASK >> 2))

    def encode(self) -> bytes:
        """The 8 header bytes."""
        return _HEADER.pack(
            self.eyecatcher,
            self.type,
            self.length,
            (self.version << 4) | (self.typev2 << 2) | self.typev1,
        )

    @classmethod
    def decode(cls, data: Buffer) -> ClcHeader:
        """Read and check the first 8 bytes of a CLC message.

        Checks what can be checked from the header alone, before the body has
        arrived: the eyecatcher (either one, as Linux), a known type, version
        >= 1 (Linux ``smc_clc_wait_msg``), and a length within
        :data:`CLC_MIN_LENGTH` .. :data:`CLC_MAX_LENGTH` for that type.  Only
        the first 8 bytes of *data* are read.

        Linux answers every one of these faults with ``-EPROTO``: the
        handshake ends in an error and no Decline is sent, so the
        :class:`WireError` carries no decline code.

        :raises WireError: on any of the faults above, or fewer than 8 bytes.
        """
        if len(data) < CLC_HEADER_LEN:
            raise WireError(f"CLC header needs 8 bytes, got {len(data)}")
        eyecatcher, msg_type, length, byte7 = _HEADER.unpack_from(data, 0)
        if eyecatcher not in _EYECATCHERS:
            raise WireError(f"CLC eyecatcher at 0 is {eyecatcher.hex()}, not SMCR/SMCD")
        ctype = _TYPES.get(msg_type)
        if ctype is None:
            raise WireError(f"CLC type at 4 is 0x{msg_type:02x}, not 1..4")
        version = byte7 >> 4
        if version < 1:
            raise WireError("CLC version at 7 is 0 (Linux needs >= 1)")
        if not CLC_MIN_LENGTH[ctype] <= length <= CLC_MAX_LENGTH[ctype]:
            raise WireError(
                f"CLC {ctype.name} length at 5 is {length}, outside "
                f"{CLC_MIN_LENGTH[ctype]}..{CLC_MAX_LENGTH[ctype]}"
            )
        # (ClcHeader, not cls: a native call, where cls(...) goes through the type's call)
        return ClcHeader(bytes(eyecatcher), ctype, length, version,
                         (byte7 & _TYPEV2_MASK) >> 2, byte7 & _TYPEV1_MASK)  # fmt: skip


_TYPES = {int(t): t for t in ClcType}

def decode_header(data: Buffer, expected: ClcType, hdr: ClcHeader | None = None) -> ClcHeader:
    """Check the header of a whole message of type *expected*; internal helper.

    Besides :meth:`ClcHeader.decode`'s checks: the type is *expected* and the
    length field equals ``len(data)`` (a decoder is handed exactly one message).

    :param hdr: the header decoded already (:class:`~smcr.wire.clc.ClcReader`).
    :raises WireError: without decline code (Linux: ``-EPROTO``, no Decline).
    """
    if hdr is None:
        hdr = ClcHeader.decode(data)
    if hdr.type != expected:
        raise WireError(f"CLC type at 4 is {hdr.type.name}, expected {expected.name}")
    if hdr.length != len(data):
        raise WireError(f"CLC length field at 5 is {hdr.length}, but {len(data)} bytes given")
    return hdr


def check_trailer(data: Buffer) -> None:
    """Check the 4-byte trailer eyecatcher at the end of *data* (``SMCR`` or ``SMCD``).

    :raises WireError: without decline code (Linux: ``-EPROTO``).
    """
    trailer = bytes(data[-CLC_TRAILER_LEN:])
    if trailer not in _EYECATCHERS:
        raise WireError(f"CLC trailer at {len(data) - 4} is {trailer.hex()}, not SMCR/SMCD")


def byte7(version: int, typev2: int, typev1: int) -> int:
    """Compose header byte 7 from its three fields; internal helper."""
    return (version << 4) | (typev2 << 2) | typev1


def pack_header(msg_type: ClcType, length: int, flags: int) -> bytes:
    """The 8 header bytes with the ``SMCR`` eyecatcher; internal helper."""
    return _HEADER.pack(EYECATCHER_SMCR, msg_type, length, flags)


def check_version(version: int) -> None:
    """Raise ValueError unless *version* is a CLC version (byte 7's high nibble, >= 1);
    internal helper."""
    check_uint("version", version, 4)
    if version < 1:
        raise ValueError("version must be >= 1")


def check_peer(peer_id: bytes, gid: bytes, mac: bytes) -> None:
    """Raise ValueError unless the sender's peer ID (8 bytes), RoCE GID (16) and MAC (6)
    have their sizes, as Proposal, Accept and Confirm carry them; internal helper."""
    check_bytes("peer_id", peer_id, 8)
    check_bytes("gid", gid, 16)
    check_bytes("mac", mac, 6)
