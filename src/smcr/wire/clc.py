"""CLC messages: Accept, Confirm, Decline, the stream reader, and re-exports (spec §2).

Design
------
CLC ("connection layer control") messages are the SMC handshake, carried in the
TCP byte stream of the connection that SMC takes over (spec §2.7): the client
sends a Proposal (:mod:`smcr.wire.clc_proposal`), the server answers with an
Accept, the client with a Confirm; either side may instead send a Decline and
both fall back to plain TCP on the same connection.

* :class:`ClcAccept` / :class:`ClcConfirm` (SMC-R, spec §2.4): one layout, 68
  bytes in v1; 108 bytes in v2 (adds the negotiated EID); with the first-contact
  bit set a v2 message also carries the 52-byte first-contact extension at 104
  (:class:`FirstContactExt`), and a v2 first-contact Confirm then the GID list
  (count + 3 reserved + 16-byte GIDs).  Lengths are exact: 68, 108, 160 and
  ``164 + 16n``, which is what every Linux sends.  (Linux's receiver only checks
  ``length >= 108`` for v2 and drains the rest; a longer message is refused here.)
* :class:`ClcDecline` (spec §2.5): 28 bytes in v1, 44 in v2 (four more
  diagnosis codes).  Linux does not check the Decline trailer, so neither does
  :meth:`ClcDecline.decode`; the encoder always writes the eyecatcher.
* :class:`ClcReader` takes the TCP stream in pieces (h2 ``FrameBuffer`` style,
  STYLE.md §5) and hands out one message at a time; bytes after it stay in
  :attr:`ClcReader.trailing_data`, they belong to the application after a
  fallback.  :func:`decode_clc` decodes one whole message of any type.

Decline codes of decode errors: Linux checks a received CLC message in
``smc_clc_wait_msg`` / ``smc_clc_msg_hdr_valid``; on any fault (bad eyecatcher,
unexpected type, version 0, wrong length, bad trailer, bad Proposal layout) it
returns ``-EPROTO``, and both ``smc_listen_decline`` and
``smc_connect_decline_fallback`` treat a negative code as "error, no fallback
possible": the handshake ends without a Decline.  So the :class:`WireError`
raised for malformed bytes carries ``code=None`` (not ``CNFERR``: Linux never
sends CNFERR for a malformed message).  The one exception is a well-formed
SMC-D Accept/Confirm (``typev1 = D``), which smcr cannot use: that raises
``code=DeclineCode.MODEUNSUPP``, the code a Linux client declines with when the
accepted mode was not proposed (``smc_connect_check_aclc``).

Reserved fields that Linux ignores on receive (Accept/Confirm bytes 51, 60,
96-103, the low 7 bits of 104, 106-107, 148-155, 157-159; Decline byte 20's low
nibble and 21-23; the unused 0x04 bit of byte 7, and ``typev1`` of a Decline)
are accepted with any value and sent as zero.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Self, TypeAlias

from smcr.wire.clc_header import (
    CLC_HEADER_LEN,
    CLC_MAX_LENGTH,
    CLC_MIN_LENGTH,
    CLC_TRAILER_LEN,
    EYECATCHER_SMCD,
    EYECATCHER_SMCR,
    FIRST_CONTACT_MASK,
    Buffer,
    ClcHeader,
    ClcType,
    SmcType,
    byte7,
    check_peer,
    check_trailer,
    check_version,
    decode_header,
)
from smcr.wire.clc_proposal import (
    MAX_IPV6_PREFIXES,
    MAX_ISM_GIDS,
    MAX_UEIDS,
    ClcProposal,
    IpPrefixArea,
    Ipv6Prefix,
    SmcdGidChid,
    SmcdV2Extension,
    V2Extension,
)
from smcr.wire.decline import DeclineCode
from smcr.wire.decline import lookup as lookup_decline
from smcr.wire.errors import WireError
from smcr.wire.validate import check_bytes, check_uint

__all__ = [
    "CLC_HEADER_LEN",
    "CLC_MAX_LENGTH",
    "CLC_MIN_LENGTH",
    "CLC_TRAILER_LEN",
    "CONFIRM_MAX_GIDS",
    "EYECATCHER_SMCD",
    "EYECATCHER_SMCR",
    "FIRST_CONTACT_MASK",
    "MAX_IPV6_PREFIXES",
    "MAX_ISM_GIDS",
    "MAX_UEIDS",
    "OS_AIX",
    "OS_LINUX",
    "OS_UNKNOWN",
    "OS_ZOS",
    "SMCD_DMBE_SIZES",
    "SMCR_RMBE_SIZES",
    "SMC_BUF_MIN_SIZE",
    "ClcAccept",
    "ClcConfirm",
    "ClcDecline",
    "ClcHeader",
    "ClcMessage",
    "ClcProposal",
    "ClcReader",
    "ClcType",
    "FirstContactExt",
    "IbMtu",
    "IpPrefixArea",
    "Ipv6Prefix",
    "SmcType",
    "SmcdGidChid",
    "SmcdV2Extension",
    "V2Extension",
    "compress_bufsize",
    "decode_clc",
    "make_eid",
    "make_hostname",
    "uncompress_bufsize",
]

# -- helpers: RMBE size code, MTU enum, EIDs, host names ---------------------

#: ``SMC_BUF_MIN_SIZE``: the smallest RMB/send buffer, 16 KiB (size code 0).
SMC_BUF_MIN_SIZE = 16384
#: Largest size code Linux uses for SMC-R RMBs (15 = 512 MiB, ``SMCR_RMBE_SIZES``).
SMCR_RMBE_SIZES = 15
#: Largest size code Linux uses for SMC-D DMBs (6 = 1 MiB, ``SMCD_DMBE_SIZES``).
SMCD_DMBE_SIZES = 6


def compress_bufsize(size: int, *, smcd: bool = False) -> int:
    """Buffer size in bytes -> 4-bit size code, rounding up (Linux ``smc_compress_bufsize``).

    Code ``n`` means ``16 KiB << n`` (spec §5).  Sizes up to 16 KiB give 0; the
    result is capped at :data:`SMCR_RMBE_SIZES` (or :data:`SMCD_DMBE_SIZES`).
    """
    if size <= SMC_BUF_MIN_SIZE:
        return 0
    compressed = ((size - 1) >> 14).bit_length()  # ilog2((size-1) >> 14) + 1
    return min(compressed, SMCD_DMBE_SIZES if smcd else SMCR_RMBE_SIZES)


def uncompress_bufsize(code: int) -> int:
    """4-bit size code -> buffer size in bytes, ``16 KiB << code`` (``smc_uncompress_bufsize``)."""
    check_uint("size code", code, 4)
    return SMC_BUF_MIN_SIZE << code


class IbMtu(enum.IntEnum):
    """The QP MTU enum of Accept/Confirm byte 50 (low nibble), as in ``ib_mtu`` (spec §2.4)."""

    MTU_256 = 1
    MTU_512 = 2
    MTU_1024 = 3
    MTU_2048 = 4
    MTU_4096 = 5

    @property
    def size(self) -> int:
        """The MTU in bytes (256 << (value - 1))."""
        return 128 << self.value

    @classmethod
    def from_size(cls, size: int) -> IbMtu:
        """The enum for an MTU of *size* bytes (256, 512, 1024, 2048 or 4096).

        :raises ValueError: for any other size.
        """
        for mtu in cls:
            if mtu.size == size:
                return mtu
        raise ValueError(f"no IB MTU of {size} bytes")


OS_ZOS = 1  #: ``SMC_CLC_OS_ZOS``
OS_LINUX = 2  #: ``SMC_CLC_OS_LINUX``
OS_AIX = 3  #: ``SMC_CLC_OS_AIX``
OS_UNKNOWN = 15  #: OS type "unknown" (spec §2.4)

_EID_CHARS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-")


def make_eid(text: str) -> bytes:
    """A user EID as it travels: 32 bytes, blank padded (Linux ``smc_clc_ueid_valid``).

    Linux accepts a UEID of 1-32 characters from A-Z, 0-9, '.' and '-' that
    starts with a letter or digit.  Received EIDs are compared byte for byte and
    are not checked, so decoders take any 32 bytes.

    :raises ValueError: if *text* is not a valid UEID.
    """
    raw = text.encode("ascii", "replace")
    if not 1 <= len(raw) <= 32 or not set(raw) <= _EID_CHARS or raw[:1] in (b".", b"-"):
        raise ValueError(f"invalid user EID {text!r}")
    return raw.ljust(32, b" ")


def make_hostname(name: str) -> bytes:
    """The 32-byte host-name field of the first-contact extension (``smc_clc_init``).

    Linux copies the first 32 bytes of the node name and pads with ASCII blanks.
    """
    return name.encode("ascii", "replace")[:32].ljust(32, b" ")


# -- Accept / Confirm ------------------------------------------------------

#: Most GIDs a Confirm's GID list may hold here (Linux sends 1 or 2, one per
#: link the client can offer; 8 bounds the message, see ``CLC_MAX_LENGTH``).
CONFIRM_MAX_GIDS = 8

# 64 bytes, header to PSN; reserved bytes 51 and 60 are pad bytes (read as
# nothing, written as 0).  24-bit QPN and PSN are split into B + H.
_ACC_V1 = struct.Struct(">4sBHB8s16s6sBHIBIBxQxBH")
_ACC_V2 = struct.Struct(">32s8x")  # 64..103: negotiated EID, 8 reserved
_FCE = struct.Struct(">BB2x32sBBHI8x")  # 104..155: first-contact extension
_GLE = struct.Struct(">B3x")  # GID list header: count + 3 reserved
_ACC_V1_LEN = _ACC_V1.size + CLC_TRAILER_LEN  # 68
_ACC_V2_LEN = _ACC_V1.size + _ACC_V2.size + CLC_TRAILER_LEN  # 108
_FCE_LEN = _FCE.size  # 52
_GID_LEN = 16


@dataclass(frozen=True, slots=True)
class FirstContactExt:
    """The 52-byte SMC-Rv2 first-contact extension at 104 (spec §2.4).

    Linux ``struct smc_clc_first_contact_ext_v2x``; SMC-R always sends all 52
    bytes (v2.0 peers leave the v2.1 fields zero).

    :param v2_direct: peer reachable without an IP gateway (0x80 of byte 104).
    :param os_type: high nibble of byte 105 (1 z/OS, 2 Linux, 3 AIX, 15 unknown).
    :param release: SMC release, low nibble of byte 105 (0 v2.0, 1 v2.1).
    :param hostname: 32 bytes, ASCII blank padded (:func:`make_hostname`).
    :param max_conns: max connections per link group (v2.1).
    :param max_links: max links per link group (v2.1).
    :param feature_mask: supplemental feature mask.
    :param vendor_options: 32-bit vendor experimental options.
    """

    v2_direct: bool = True
    os_type: int = OS_LINUX
    release: int = 1
    hostname: bytes = b" " * 32
    max_conns: int = 255
    max_links: int = 2
    feature_mask: int = 0x0001
    vendor_options: int = 0

    def __post_init__(self) -> None:
        check_uint("os_type", self.os_type, 4)
        check_uint("release", self.release, 4)
        check_bytes("hostname", self.hostname, 32)
        check_uint("max_conns", self.max_conns, 8)
        check_uint("max_links", self.max_links, 8)
        check_uint("feature_mask", self.feature_mask, 16)
        check_uint("vendor_options", self.vendor_options, 32)

    def encode(self) -> bytes:
        """The extension's 52 bytes."""
        return _FCE.pack(
            0x80 if self.v2_direct else 0,
            (self.os_type << 4) | self.release,
            self.hostname,
            self.max_conns,
            self.max_links,
            self.feature_mask,
            self.vendor_options,
        )

    @classmethod
    def decode_from(cls, data: Buffer, offset: int) -> FirstContactExt:
        """Decode the extension at *offset*; the caller has checked the length."""
        direct, os_rel, host, conns, links, features, vendor = _FCE.unpack_from(data, offset)
        return cls(
            v2_direct=bool(direct & 0x80),
            os_type=os_rel >> 4,
            release=os_rel & 0x0F,
            hostname=host,
            max_conns=conns,
            max_links=links,
            feature_mask=features,
            vendor_options=vendor,
        )


class _ClcTyped:
    """What a CLC message class says of its type (:attr:`TYPE`), outside the dataclass: a
    ``ClassVar`` in a dataclass body that mypyc compiles is taken for a field (mypyc
    drops ``ClassVar`` from the annotations it gives the dataclass decorator)."""

    __slots__ = ()
    TYPE: ClassVar[ClcType]


@dataclass(frozen=True, slots=True, init=False)
class _AcceptConfirm(_ClcTyped):
    """Fields and codec shared by :class:`ClcAccept` and :class:`ClcConfirm` (spec §2.4).

    :param version: CLC version (1, or 2+ for the v2 layout).
    :param first_contact: the first-contact bit (0x08 of byte 7).
    :param peer_id: sender peer ID, 8 bytes.
    :param gid: sender RoCE GID, 16 bytes.
    :param mac: sender RoCE MAC, 6 bytes.
    :param qpn: sender QP number, 24 bits.
    :param rmb_rkey: rkey of the sender's RMB on the link named here.
    :param rmbe_idx: RMBE index, 1-based (Linux always 1).
    :param rmbe_alert_token: sender's connection token, nonzero in practice.
    :param rmbe_size: compressed RMBE size code, 4 bits (:func:`uncompress_bufsize`).
    :param qp_mtu: QP MTU enum, 4 bits (:class:`IbMtu`; kept raw, Linux does not check).
    :param rmb_vaddr: RMB virtual address (Linux ``rmb_dma_addr``), 64 bits.
    :param psn: the link's initial PSN, 24 bits.
    :param eid: v2: negotiated EID, 32 bytes (must be zeros in v1).
    :param fce: the first-contact extension; present iff v2 and first contact.
    :param gid_list: Confirm v2 first contact only: the client's GIDs (at most
        :data:`CONFIRM_MAX_GIDS`); empty otherwise.
    """

    version: int
    first_contact: bool
    peer_id: bytes
    gid: bytes
    mac: bytes
    qpn: int
    rmb_rkey: int
    rmbe_alert_token: int
    rmbe_size: int
    qp_mtu: int
    rmb_vaddr: int
    psn: int
    rmbe_idx: int = 1
    eid: bytes = bytes(32)
    fce: FirstContactExt | None = None
    gid_list: tuple[bytes, ...] = ()

    def __init__(self, version: int, first_contact: bool, peer_id: bytes, gid: bytes,
                 mac: bytes, qpn: int, rmb_rkey: int, rmbe_alert_token: int, rmbe_size: int,
                 qp_mtu: int, rmb_vaddr: int, psn: int, rmbe_idx: int = 1,
                 eid: bytes = bytes(32), fce: FirstContactExt | None = None,
                 gid_list: tuple[bytes, ...] = (), trusted: bool = False) -> None:  # fmt: skip
        """:param trusted: the fields are known to hold what :meth:`__post_init__` checks
        (:meth:`decode`, from fixed-width fields of a layout it checked): not checked again."""
        # written out (every handshake makes one to send): the dataclass's frozen __init__
        # is interpreted code even in the compiled build, which makes these plain stores
        object.__setattr__(self, "version", version)
        object.__setattr__(self, "first_contact", first_contact)
        object.__setattr__(self, "peer_id", peer_id)
        object.__setattr__(self, "gid", gid)
        object.__setattr__(self, "mac", mac)
        object.__setattr__(self, "qpn", qpn)
        object.__setattr__(self, "rmb_rkey", rmb_rkey)
        object.__setattr__(self, "rmbe_alert_token", rmbe_alert_token)
        object.__setattr__(self, "rmbe_size", rmbe_size)
        object.__setattr__(self, "qp_mtu", qp_mtu)
        object.__setattr__(self, "rmb_vaddr", rmb_vaddr)
        object.__setattr__(self, "psn", psn)
        object.__setattr__(self, "rmbe_idx", rmbe_idx)
        object.__setattr__(self, "eid", eid)
        object.__setattr__(self, "fce", fce)
        object.__setattr__(self, "gid_list", gid_list)
        if not trusted:
            self.__post_init__()

    def __post_init__(self) -> None:
        check_version(self.version)
        check_peer(self.peer_id, self.gid, self.mac)
        check_uint("qpn", self.qpn, 24)
        check_uint("rmb_rkey", self.rmb_rkey, 32)
        check_uint("rmbe_idx", self.rmbe_idx, 8)
        check_uint("rmbe_alert_token", self.rmbe_alert_token, 32)
        check_uint("rmbe_size", self.rmbe_size, 4)
        check_uint("qp_mtu", self.qp_mtu, 4)
        check_uint("rmb_vaddr", self.rmb_vaddr, 64)
        check_uint("psn", self.psn, 24)
        check_bytes("eid", self.eid, 32)
        v2 = self.version >= 2
        if self.version == 1 and any(self.eid):
            raise ValueError("a v1 Accept/Confirm has no EID")
        if (self.fce is not None) != (v2 and self.first_contact):
            raise ValueError("fce present iff v2 and first contact")
        if self.gid_list and not self._has_gid_list:
            raise ValueError("a GID list is only in a v2 first-contact Confirm")
        if len(self.gid_list) > CONFIRM_MAX_GIDS:
            raise ValueError(f"at most {CONFIRM_MAX_GIDS} GIDs")
        for g in self.gid_list:
            check_bytes("GID list entry", g, _GID_LEN)

    @property
    def _has_gid_list(self) -> bool:
        return self.TYPE == ClcType.CONFIRM and self.version >= 2 and self.first_contact

    @property
    def rmbe_size_bytes(self) -> int:
        """The RMBE size in bytes, ``16 KiB << rmbe_size``."""
        return uncompress_bufsize(self.rmbe_size)

    @property
    def length(self) -> int:
        """Total encoded length: 68, 108, 160 or ``164 + 16n``."""
        if self.version == 1:
            return _ACC_V1_LEN
        n = _ACC_V2_LEN
        if self.first_contact:
            n += _FCE_LEN
        if self._has_gid_list:
            n += _GLE.size + _GID_LEN * len(self.gid_list)
        return n

    def encode(self) -> bytes:
        """The message's bytes (Linux ``smcr_clc_prep_confirm_accept``)."""
        flags = byte7(self.version, 0, SmcType.R) | (FIRST_CONTACT_MASK * self.first_contact)
        parts = [
            _ACC_V1.pack(
                EYECATCHER_SMCR,
                self.TYPE,
                self.length,
                flags,
                self.peer_id,
                self.gid,
                self.mac,
                self.qpn >> 16,
                self.qpn & 0xFFFF,
                self.rmb_rkey,
                self.rmbe_idx,
                self.rmbe_alert_token,
                (self.rmbe_size << 4) | self.qp_mtu,
                self.rmb_vaddr,
                self.psn >> 16,
                self.psn & 0xFFFF,
            )
        ]
        if self.version >= 2:
            parts.append(_ACC_V2.pack(self.eid))
            if self.fce is not None:
                parts.append(self.fce.encode())
            if self._has_gid_list:
                parts.append(_GLE.pack(len(self.gid_list)))
                parts += self.gid_list
        parts.append(EYECATCHER_SMCR)
        return b"".join(parts)

    @classmethod
    def decode(cls, data: Buffer, header: ClcHeader | None = None) -> Self:
        """Decode one whole message of this class's type (``smc_clc_msg_acc_conf_valid``).

        :param data: exactly one message (length field == ``len(data)``).
        :param header: its header, decoded already (:class:`ClcReader`).
        :raises WireError: ``code=None`` when malformed (Linux ``-EPROTO``);
            ``MODEUNSUPP`` for an SMC-D Accept/Confirm.
        """
        hdr = decode_header(data, cls.TYPE, header)
        name = cls.TYPE.name.capitalize()
        if hdr.typev1 == SmcType.D:
            raise WireError(f"{name} is SMC-D (typev1 1 at byte 7)", DeclineCode.MODEUNSUPP)
        if hdr.typev1 != SmcType.R:
            raise WireError(f"{name} typev1 at byte 7 is {hdr.typev1}, not SMC-R or SMC-D")
        first_contact = hdr.flag
        size = len(data)
        if hdr.version == 1:
            want = _ACC_V1_LEN
        else:
            want = _ACC_V2_LEN + (_FCE_LEN if first_contact else 0)
            if first_contact and cls.TYPE == ClcType.CONFIRM:
                if size < want + _GLE.size:
                    raise WireError(f"{name} length {size} too short for its GID list")
                (count,) = _GLE.unpack_from(data, want - CLC_TRAILER_LEN)
                if count > CONFIRM_MAX_GIDS:
                    raise WireError(f"{name} GID count at {want - 4} is {count}, max 8")
                want += _GLE.size + _GID_LEN * count
        if size != want:
            raise WireError(f"{name} v{hdr.version} length is {size}, expected {want}")
        check_trailer(data)
        (peer_id, gid, mac, qpn_hi, qpn_lo, rkey, idx, token, size_mtu, vaddr, psn_hi, psn_lo) = (
            _ACC_V1.unpack_from(data, 0)[4:]
        )
        eid = bytes(32)
        fce = None
        gids: tuple[bytes, ...] = ()
        if hdr.version >= 2:
            (eid,) = _ACC_V2.unpack_from(data, _ACC_V1.size)
            if first_contact:
                fce = FirstContactExt.decode_from(data, _ACC_V2_LEN - CLC_TRAILER_LEN)
                if cls.TYPE == ClcType.CONFIRM:
                    start = _ACC_V2_LEN - CLC_TRAILER_LEN + _FCE_LEN + _GLE.size
                    end = size - CLC_TRAILER_LEN
                    gids = tuple(bytes(data[i : i + _GID_LEN]) for i in range(start, end, _GID_LEN))
        # every field from a fixed-width struct field, the layout checked above: what
        # __post_init__ checks holds (a v1 message has no EID, fce iff v2 and first
        # contact, a GID list of at most 8 only in a v2 first-contact Confirm), so it is
        # not checked again; positional (keywords cost the compiled build an argument
        # parse of some 12k instructions, on every handshake's Accept and Confirm)
        return cls(hdr.version, first_contact, peer_id, gid, mac, (qpn_hi << 16) | qpn_lo,
                   rkey, token, size_mtu >> 4, size_mtu & 0x0F, vaddr, (psn_hi << 16) | psn_lo,
                   idx, eid, fce, gids, True)  # fmt: skip


class ClcAccept(_AcceptConfirm):
    """CLC Accept (type 0x02, server -> client), SMC-R (spec §2.4).

    Describes the server's side of the link and connection.  See
    :class:`_AcceptConfirm` for the fields; an Accept never has a GID list.  (No
    ``@dataclass`` of its own: it adds no field, and its dataclass methods are its
    base's.)
    """

    __slots__ = ()
    TYPE: ClassVar[ClcType] = ClcType.ACCEPT


class ClcConfirm(_AcceptConfirm):
    """CLC Confirm (type 0x03, client -> server), SMC-R (spec §2.4).

    Same layout as :class:`ClcAccept` with the client's values; a v2
    first-contact Confirm adds the GID list after the extension.
    """

    __slots__ = ()
    TYPE: ClassVar[ClcType] = ClcType.CONFIRM


# -- Decline ----------------------------------------------------------------

_DECL = struct.Struct(">4sBHB8sIB3x")  # 24: header, peer ID, diagnosis, OS type
_DECL_V2 = struct.Struct(">4I")  # 24..39: four more diagnosis codes
_DECL_V1_LEN = _DECL.size + CLC_TRAILER_LEN  # 28
_DECL_V2_LEN = _DECL.size + _DECL_V2.size + CLC_TRAILER_LEN  # 44


@dataclass(frozen=True, slots=True)
class ClcDecline:
    """CLC Decline (type 0x04, either direction; spec §2.5, ``smc_clc_msg_decline[_v2]``).

    :param version: CLC version: 1 -> 28 bytes, 2+ -> 44 bytes.
    :param out_of_sync: the 0x08 bit of byte 7; the receiver drops the link
        group it shares with the sender (sent with ``SYNCERR``).
    :param peer_id: sender peer ID, 8 bytes (Linux: zeros if it has none).
    :param peer_diagnosis: the 32-bit diagnosis code, kept as an int because it
        may be unknown or a Linux 4.14 value; :attr:`code` names it when known.
    :param os_type: high nibble of byte 20 (Linux: 0 in v1, 2 in v2).
    :param peer_diagnosis_v2: v2 only: four more diagnosis codes (zeros in v1).
    """

    version: int = 2
    out_of_sync: bool = False
    peer_id: bytes = bytes(8)
    peer_diagnosis: int = 0
    os_type: int = 0
    peer_diagnosis_v2: tuple[int, int, int, int] = (0, 0, 0, 0)

    def __post_init__(self) -> None:
        check_version(self.version)
        check_bytes("peer_id", self.peer_id, 8)
        check_uint("peer_diagnosis", self.peer_diagnosis, 32)
        check_uint("os_type", self.os_type, 4)
        if len(self.peer_diagnosis_v2) != 4:
            raise ValueError("peer_diagnosis_v2 needs 4 codes")
        for code in self.peer_diagnosis_v2:
            check_uint("peer_diagnosis_v2", code, 32)
        if self.version == 1 and any(self.peer_diagnosis_v2):
            raise ValueError("a v1 Decline has no extra diagnosis codes")

    @classmethod
    def linux(cls, code: DeclineCode, peer_id: bytes = bytes(8), version: int = 2) -> ClcDecline:
        """The Decline Linux sends for *code* (``smc_clc_send_decline``).

        Out-of-sync set iff *code* is ``SYNCERR``; OS type 0 in v1, Linux (2) in v2.
        """
        return cls(
            version=version,
            out_of_sync=code == DeclineCode.SYNCERR,
            peer_id=peer_id,
            peer_diagnosis=int(code),
            os_type=0 if version == 1 else OS_LINUX,
        )

    @property
    def code(self) -> DeclineCode | None:
        """:attr:`peer_diagnosis` as a :class:`DeclineCode`, or None if not a current code."""
        return lookup_decline(self.peer_diagnosis)

    @property
    def length(self) -> int:
        """Total encoded length: 28 (v1) or 44 (v2)."""
        return _DECL_V1_LEN if self.version == 1 else _DECL_V2_LEN

    def encode(self) -> bytes:
        """The Decline's bytes, always with the ``SMCR`` trailer."""
        flags = byte7(self.version, 0, 0) | (FIRST_CONTACT_MASK * self.out_of_sync)
        parts = [
            _DECL.pack(
                EYECATCHER_SMCR,
                ClcType.DECLINE,
                self.length,
                flags,
                self.peer_id,
                self.peer_diagnosis,
                self.os_type << 4,
            )
        ]
        if self.version >= 2:
            parts.append(_DECL_V2.pack(*self.peer_diagnosis_v2))
        parts.append(EYECATCHER_SMCR)
        return b"".join(parts)

    @classmethod
    def decode(cls, data: Buffer, header: ClcHeader | None = None) -> ClcDecline:
        """Decode one whole Decline (``smc_clc_msg_decl_valid``): exact length, any trailer.

        :param header: its header, decoded already (:class:`ClcReader`).
        :raises WireError: ``code=None`` (Linux ``-EPROTO``) for a bad header or length.
        """
        hdr = decode_header(data, ClcType.DECLINE, header)
        want = _DECL_V1_LEN if hdr.version == 1 else _DECL_V2_LEN
        if len(data) != want:
            raise WireError(f"Decline v{hdr.version} length is {len(data)}, expected {want}")
        _, _, _, _, peer_id, diagnosis, os_byte = _DECL.unpack_from(data, 0)
        extra: tuple[int, int, int, int] = (0, 0, 0, 0)
        if hdr.version >= 2:
            extra = _DECL_V2.unpack_from(data, _DECL.size)
        # The trailer is not checked: Linux does not check it for a Decline.
        return cls(
            version=hdr.version,
            out_of_sync=hdr.flag,
            peer_id=peer_id,
            peer_diagnosis=diagnosis,
            os_type=os_byte >> 4,
            peer_diagnosis_v2=extra,
        )


# -- any message, and the stream reader --------------------------------------

ClcMessage: TypeAlias = ClcProposal | ClcAccept | ClcConfirm | ClcDecline

_DECODERS: dict[ClcType, Callable[[Buffer, ClcHeader], ClcMessage]] = {
    ClcType.PROPOSAL: ClcProposal.decode,
    ClcType.ACCEPT: ClcAccept.decode,
    ClcType.CONFIRM: ClcConfirm.decode,
    ClcType.DECLINE: ClcDecline.decode,
}


def decode_clc(data: Buffer) -> ClcMessage:
    """Decode one whole CLC message of any type, dispatching on byte 4.

    :param data: exactly one message (its length field must equal ``len(data)``).
    :raises WireError: see the module docstring for the decline codes.
    """
    hdr = ClcHeader.decode(data)
    msg: ClcMessage = _DECODERS[hdr.type](data, hdr)
    return msg


class ClcReader:
    """Reassembles CLC messages from the TCP byte stream, one at a time (spec §2.1).

    Mirrors Linux ``smc_clc_wait_msg``: look at the 8-byte header first, then
    read exactly ``length`` bytes, never more -- whatever follows belongs to the
    next message or, after a fallback, to the application
    (:attr:`trailing_data`).  Unlike Linux, which drains an over-long message,
    the reader refuses a length above :data:`CLC_MAX_LENGTH` for the type as
    soon as the header is in, so it never buffers an unbounded body.

    After a :class:`WireError` the reader stays failed: every later
    :meth:`next_message` raises the same error (the handshake is over).
    """

    __slots__ = ("_buf", "_error")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._error: WireError | None = None

    def feed(self, data: Buffer) -> None:
        """Append bytes received from the TCP stream."""
        self._buf.extend(data)

    def next_message(self, expect: ClcType | None = None) -> ClcMessage | None:
        """Decode and consume the next whole message, or return None if it is incomplete.

        :param expect: if given, the only type besides Decline that may come
            next; anything else fails from the header alone, as in Linux
            ``smc_clc_wait_msg`` (``-EPROTO``, ``code=None``).
        :raises WireError: bad header, unexpected type, bad message.
        """
        if self._error is not None:
            raise self._error
        if len(self._buf) < CLC_HEADER_LEN:
            return None
        try:
            hdr = ClcHeader.decode(self._buf)
            if expect is not None and hdr.type not in (expect, ClcType.DECLINE):
                raise WireError(f"CLC {hdr.type.name} received while waiting for {expect.name}")
            if len(self._buf) < hdr.length:
                return None
            msg = _DECODERS[hdr.type](bytes(self._buf[: hdr.length]), hdr)
        except WireError as exc:
            self._error = exc
            raise
        del self._buf[: hdr.length]
        return msg

    @property
    def buffered(self) -> int:
        """Number of bytes received but not yet consumed."""
        return len(self._buf)

    @property
    def trailing_data(self) -> bytes:
        """The bytes received after the last consumed message (the app's, on fallback)."""
        return bytes(self._buf)
