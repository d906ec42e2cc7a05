"""CLC Proposal (type 0x01), the client's first message, v1 and v2 (spec §2.3).

Design
------
A Proposal is a chain of optional parts after a fixed 40-byte base (header,
peer ID, GID, MAC, IP-area offset at 38)::

    base 40 | [SMC-D/v2 area 40] | [IP prefix area 8 + 17n] | [v2 extension 40 + 32k]
            | [SMC-Dv2 extension 48 + 10m] | trailer 4

Which parts are present is decided by the header (spec §2.3.2-§2.3.5):

* **v1 header** (RFC 7609 / old Linux): the IP-area offset says how many bytes
  lie between 40 and the prefix area; it is 0 (RFC, SMC-R) or 40 (the 40-byte
  SMC-D area, required when SMC-D v1 is offered).  The prefix area is always
  there; ``typev2`` bits and the area's v2-extension offset mean nothing in v1
  and are ignored on receive (written 0).  Length must be
  ``40 + offset + 8 + 17n + 4`` (Linux ``smc_clc_msg_prop_valid``).
* **v2 header** (Linux >= 5.10 always): the 40-byte SMC-D/v2 area is always at
  40-79.  The prefix area follows at 80 iff a v1 type is offered, and then the
  IP-area offset is 40; with ``typev1 = N`` the offset is 0 and there is no
  prefix area [checked against the Linux 6.12 capture].  The v2 extension is
  present iff ``typev2 != N`` and the SMC-Dv2 extension iff ``typev2`` offers
  SMC-D.  Length must be the exact sum of the parts.

Strictness beyond Linux: Linux locates the prefix area and the extensions
through the offsets it reads (``smc_clc_proposal_get_prefix``,
``smc_get_clc_v2_ext``, ``smc_get_clc_smcd_v2_ext``) and only checks the total
length, so it would accept offsets that make parts overlap.  Every Linux
version places the parts back to back, and so must a Proposal decoded here: an
IP-area offset other than the one the layout implies, or a v2 / SMC-Dv2
extension offset that does not point right behind the previous part, is
refused.  An IP-area offset above 40 is invalid for Linux too.

Errors: Linux answers a malformed Proposal with ``-EPROTO`` from
``smc_clc_wait_msg`` -- the server ends the handshake (``smc_listen_out_err``)
and sends no Decline -- so every :class:`WireError` raised here has
``code=None``.

Reserved fields (SMC-D area 60-79, prefix area bytes 5-6, v2 extension bytes
2, 4-5, 28-39 and the middle bits of byte 3, SMC-Dv2 extension bytes 32-47)
are ignored on receive, as Linux does, and sent as zero.
"""

from __future__ import annotations

import functools
import ipaddress
import struct
from dataclasses import dataclass

from smcr.wire.clc_header import (
    CLC_TRAILER_LEN,
    EYECATCHER_SMCR,
    SMC_TYPES,
    Buffer,
    ClcHeader,
    ClcType,
    SmcType,
    byte7,
    check_peer,
    check_trailer,
    check_version,
    decode_header,
    pack_header,
)
from smcr.wire.errors import WireError
from smcr.wire.validate import check_bytes, check_uint

__all__ = [
    "MAX_ISM_GIDS",
    "MAX_IPV6_PREFIXES",
    "MAX_UEIDS",
    "ClcProposal",
    "IpPrefixArea",
    "Ipv6Prefix",
    "SmcdGidChid",
    "SmcdV2Extension",
    "V2Extension",
]

#: ``SMC_CLC_MAX_V6_PREFIX``: at most 8 IPv6 prefixes in the prefix area.
MAX_IPV6_PREFIXES = 8
#: ``SMC_CLC_MAX_UEID``: at most 8 user EIDs in the v2 extension.
MAX_UEIDS = 8
#: ``SMCD_CLC_MAX_V2_GID_ENTRIES``: at most 8 ISM GID/CHID entries.
MAX_ISM_GIDS = 8

_BASE = struct.Struct(">4sBHB8s16s6sH")  # 40: header, peer ID, GID, MAC, IP-area offset
_SMCD_AREA = struct.Struct(">QHH3s5s20x")  # 40: ISM GID, CHID, v2-ext offset, OUI, options
_PREFIX = struct.Struct(">4sB2xB")  # 8: IPv4 subnet, prefix length, reserved, IPv6 count
_IPV6_PREFIX = struct.Struct(">16sB")  # 17 each, packed
_V2_EXT = struct.Struct(">BBxBxxH16sBBH12x")  # 40: counts, flags, SMC-Dv2 offset, GID, ...
_SMCD_V2_EXT = struct.Struct(">32s16x")  # 48: system EID, reserved
_GID_CHID = struct.Struct(">QH")  # 10 each

_BASE_LEN = _BASE.size  # 40
_AREA_LEN = _SMCD_AREA.size  # 40
_EID_LEN = 32
#: bytes from the end of the v2-extension offset field (52) to the end of the area (80)
_V2_EXT_OFFSET_BASE = 80 - 52
#: bytes from the end of the SMC-Dv2 offset field (X+8) to the end of the fixed v2 ext (X+40)
_SMCD_EXT_OFFSET_BASE = _V2_EXT.size - 8
_ZERO_IPV4 = ipaddress.IPv4Address(0)


@dataclass(frozen=True, slots=True, init=False)
class Ipv6Prefix:
    """One IPv6 prefix entry of the prefix area: 16-byte prefix + 1-byte length (spec §2.3.3).

    :param prefix: the prefix (address with host bits as sent; Linux zeroes them).
    :param prefix_len: number of prefix bits, 0..255 on the wire (Linux: 0..128).
    """

    prefix: ipaddress.IPv6Address
    prefix_len: int

    def __init__(self, prefix: ipaddress.IPv6Address, prefix_len: int) -> None:
        # the Proposal's records write __init__ out: every handshake decodes (server) or
        # encodes (client) one, and a dataclass's frozen __init__ is interpreted code even
        # in the compiled build, which makes these stores plain ones
        object.__setattr__(self, "prefix", prefix)
        object.__setattr__(self, "prefix_len", prefix_len)
        self.__post_init__()

    def __post_init__(self) -> None:
        check_uint("prefix_len", self.prefix_len, 8)


@dataclass(frozen=True, slots=True, init=False)
class IpPrefixArea:
    """The Proposal's IP prefix area (spec §2.3.3, ``smc_clc_msg_proposal_prefix``).

    The server compares it with its own outgoing interface and declines with
    ``DIFFPREFIX`` on mismatch; for IPv4 the IPv6 list is empty, for IPv6 the
    IPv4 fields are 0.

    :param outgoing_subnet: IPv4 address AND mask of the client's interface.
    :param prefix_len: IPv4 mask bits.
    :param ipv6_prefixes: up to 8 IPv6 prefixes.
    """

    outgoing_subnet: ipaddress.IPv4Address = _ZERO_IPV4
    prefix_len: int = 0
    ipv6_prefixes: tuple[Ipv6Prefix, ...] = ()

    def __init__(self, outgoing_subnet: ipaddress.IPv4Address = _ZERO_IPV4, prefix_len: int = 0,
                 ipv6_prefixes: tuple[Ipv6Prefix, ...] = ()) -> None:  # fmt: skip
        object.__setattr__(self, "outgoing_subnet", outgoing_subnet)
        object.__setattr__(self, "prefix_len", prefix_len)
        object.__setattr__(self, "ipv6_prefixes", ipv6_prefixes)
        self.__post_init__()

    def __post_init__(self) -> None:
        check_uint("prefix_len", self.prefix_len, 8)
        if len(self.ipv6_prefixes) > MAX_IPV6_PREFIXES:
            raise ValueError(f"at most {MAX_IPV6_PREFIXES} IPv6 prefixes")

    @property
    def size(self) -> int:
        """Encoded size: 8 + 17 per IPv6 prefix."""
        return _PREFIX.size + _IPV6_PREFIX.size * len(self.ipv6_prefixes)

    def encode(self) -> bytes:
        """The area's bytes."""
        count = len(self.ipv6_prefixes)
        parts = [_PREFIX.pack(self.outgoing_subnet.packed, self.prefix_len, count)]
        parts += [_IPV6_PREFIX.pack(p.prefix.packed, p.prefix_len) for p in self.ipv6_prefixes]
        return b"".join(parts)

    @classmethod
    def decode_from(cls, data: Buffer, offset: int) -> IpPrefixArea:
        """Decode the area at *offset*; the caller checks the total length.

        :raises WireError: fewer bytes than the area needs, or > 8 IPv6 prefixes.
        """
        if len(data) < offset + _PREFIX.size:
            raise WireError(f"Proposal prefix area at {offset} truncated")
        subnet, prefix_len, count = _PREFIX.unpack_from(data, offset)
        if count > MAX_IPV6_PREFIXES:
            raise WireError(f"Proposal IPv6 prefix count at {offset + 7} is {count}, max 8")
        start = offset + _PREFIX.size
        end = start + _IPV6_PREFIX.size * count
        if len(data) < end:
            raise WireError(f"Proposal IPv6 prefixes at {start} truncated")
        prefixes = tuple(Ipv6Prefix(ipaddress.IPv6Address(p), n)
                         for p, n in _IPV6_PREFIX.iter_unpack(bytes(data[start:end])))  # fmt: skip
        return IpPrefixArea(_ipv4(subnet), prefix_len, prefixes)


@functools.lru_cache(maxsize=256)
def _ipv4(packed: bytes) -> ipaddress.IPv4Address:
    """An IPv4 address from its 4 bytes, kept: every Proposal carries its client's subnet,
    and ``IPv4Address`` is made in interpreted code."""
    return ipaddress.IPv4Address(packed)


@dataclass(frozen=True, slots=True, init=False)
class V2Extension:
    """The SMCv2 extension of a Proposal (spec §2.3.4, ``smc_clc_v2_extension``).

    The EID count and ISMv2 GID count are not fields: they are the lengths of
    :attr:`user_eids` and of the SMC-Dv2 extension's list.

    :param release: SMC release in the high nibble of byte 3 (0 = v2.0, 1 = v2.1).
    :param seid: the SEID flag (0x01 of byte 3): a system EID is offered (SMC-D).
    :param roce_gid: the client's SMC-Rv2 RoCEv2 GID (IPv4-mapped), 16 bytes.
    :param max_conns: max connections per link group (v2.1; Linux sends its sysctl).
    :param max_links: max links per link group (v2.1).
    :param feature_mask: supplemental features (bit 0 = emulated ISM).
    :param user_eids: up to 8 user EIDs, 32 bytes each (blank padded).
    """

    release: int = 1
    seid: bool = False
    roce_gid: bytes = bytes(16)
    max_conns: int = 0
    max_links: int = 0
    feature_mask: int = 0
    user_eids: tuple[bytes, ...] = ()

    def __init__(self, release: int = 1, seid: bool = False, roce_gid: bytes = bytes(16),
                 max_conns: int = 0, max_links: int = 0, feature_mask: int = 0,
                 user_eids: tuple[bytes, ...] = ()) -> None:  # fmt: skip
        object.__setattr__(self, "release", release)
        object.__setattr__(self, "seid", seid)
        object.__setattr__(self, "roce_gid", roce_gid)
        object.__setattr__(self, "max_conns", max_conns)
        object.__setattr__(self, "max_links", max_links)
        object.__setattr__(self, "feature_mask", feature_mask)
        object.__setattr__(self, "user_eids", user_eids)
        self.__post_init__()

    def __post_init__(self) -> None:
        check_uint("release", self.release, 4)
        check_bytes("roce_gid", self.roce_gid, 16)
        check_uint("max_conns", self.max_conns, 8)
        check_uint("max_links", self.max_links, 8)
        check_uint("feature_mask", self.feature_mask, 16)
        if len(self.user_eids) > MAX_UEIDS:
            raise ValueError(f"at most {MAX_UEIDS} user EIDs")
        for eid in self.user_eids:
            check_bytes("user EID", eid, _EID_LEN)

    @property
    def size(self) -> int:
        """Encoded size: 40 + 32 per user EID."""
        return _V2_EXT.size + _EID_LEN * len(self.user_eids)


@dataclass(frozen=True, slots=True)
class SmcdGidChid:
    """One ISM GID + CHID entry of the SMC-Dv2 extension (``smc_clc_smcd_gid_chid``).

    :param gid: 64-bit ISM GID.
    :param chid: 16-bit ISM channel ID.
    """

    gid: int
    chid: int

    def __post_init__(self) -> None:
        check_uint("gid", self.gid, 64)
        check_uint("chid", self.chid, 16)


@dataclass(frozen=True, slots=True)
class SmcdV2Extension:
    """The SMC-Dv2 extension of a Proposal (spec §2.3.4, ``smc_clc_smcd_v2_extension``).

    :param system_eid: 32-byte system EID (zeros when not offered).
    :param gid_chids: up to 8 ISMv2 GID/CHID entries.
    """

    system_eid: bytes = bytes(32)
    gid_chids: tuple[SmcdGidChid, ...] = ()

    def __post_init__(self) -> None:
        check_bytes("system_eid", self.system_eid, _EID_LEN)
        if len(self.gid_chids) > MAX_ISM_GIDS:
            raise ValueError(f"at most {MAX_ISM_GIDS} ISM GID/CHID entries")

    @property
    def size(self) -> int:
        """Encoded size: 48 + 10 per entry."""
        return _SMCD_V2_EXT.size + _GID_CHID.size * len(self.gid_chids)


@dataclass(frozen=True, slots=True, init=False)
class ClcProposal:
    """CLC Proposal, v1 or v2 header (spec §2.3, ``smc_clc_msg_proposal`` + parts).

    Build the usual forms with :meth:`smcr_v1`, :meth:`smcr_v2` and
    :meth:`rfc_v1`.  :meth:`decode` raises :class:`WireError` with
    ``code=None`` (Linux: ``-EPROTO``, no Decline); see the module docstring.

    :param version: CLC version (1 = v1 header; 2 or more = v2 layout).
    :param typev1: SMC types offered for v1 (not N in a v1 header).
    :param typev2: SMC types offered for v2 (always N in a v1 header).
    :param peer_id: client peer ID, 8 bytes (zeros unless SMC-R v1 offered).
    :param gid: client RoCE GID for SMC-Rv1, 16 bytes.
    :param mac: client RoCE MAC, 6 bytes.
    :param ip_area_offset: bytes between 40 and the prefix area: v1 header 0 or
        40; v2 header 40 if ``typev1 != N`` else 0.
    :param ism_gid: SMC-D/v2 area: native ISM GID (present in a v2 header, or
        in a v1 header with ``ip_area_offset == 40``; must be 0 otherwise).
    :param ism_chid: SMC-D/v2 area: ISM CHID.
    :param vendor_oui: SMC-D/v2 area: vendor OUI, 3 bytes.
    :param vendor_options: SMC-D/v2 area: vendor experimental options, 5 bytes.
    :param prefix: the IP prefix area; present iff ``typev1 != N``.
    :param v2_extension: present iff v2 header and ``typev2 != N``.
    :param smcd_v2_extension: present iff v2 header and ``typev2`` offers SMC-D.
    """

    version: int
    typev1: SmcType
    typev2: SmcType
    peer_id: bytes = bytes(8)
    gid: bytes = bytes(16)
    mac: bytes = bytes(6)
    ip_area_offset: int = 0
    ism_gid: int = 0
    ism_chid: int = 0
    vendor_oui: bytes = bytes(3)
    vendor_options: bytes = bytes(5)
    prefix: IpPrefixArea | None = None
    v2_extension: V2Extension | None = None
    smcd_v2_extension: SmcdV2Extension | None = None

    def __init__(self, version: int, typev1: SmcType, typev2: SmcType, peer_id: bytes = bytes(8),
                 gid: bytes = bytes(16), mac: bytes = bytes(6), ip_area_offset: int = 0,
                 ism_gid: int = 0, ism_chid: int = 0, vendor_oui: bytes = bytes(3),
                 vendor_options: bytes = bytes(5), prefix: IpPrefixArea | None = None,
                 v2_extension: V2Extension | None = None,
                 smcd_v2_extension: SmcdV2Extension | None = None) -> None:  # fmt: skip
        object.__setattr__(self, "version", version)
        object.__setattr__(self, "typev1", typev1)
        object.__setattr__(self, "typev2", typev2)
        object.__setattr__(self, "peer_id", peer_id)
        object.__setattr__(self, "gid", gid)
        object.__setattr__(self, "mac", mac)
        object.__setattr__(self, "ip_area_offset", ip_area_offset)
        object.__setattr__(self, "ism_gid", ism_gid)
        object.__setattr__(self, "ism_chid", ism_chid)
        object.__setattr__(self, "vendor_oui", vendor_oui)
        object.__setattr__(self, "vendor_options", vendor_options)
        object.__setattr__(self, "prefix", prefix)
        object.__setattr__(self, "v2_extension", v2_extension)
        object.__setattr__(self, "smcd_v2_extension", smcd_v2_extension)
        self.__post_init__()

    def __post_init__(self) -> None:
        check_version(self.version)
        check_peer(self.peer_id, self.gid, self.mac)
        check_uint("ism_gid", self.ism_gid, 64)
        check_uint("ism_chid", self.ism_chid, 16)
        check_bytes("vendor_oui", self.vendor_oui, 3)
        check_bytes("vendor_options", self.vendor_options, 5)
        if (self.prefix is not None) != (self.typev1 != SmcType.N):
            raise ValueError("prefix area present iff typev1 != N")
        if self.version == 1:
            self._check_v1()
        else:
            self._check_v2()

    def _check_v1(self) -> None:
        if self.typev1 == SmcType.N:
            raise ValueError("a v1 Proposal must offer a v1 type")
        if (
            self.typev2 != SmcType.N
            or self.v2_extension is not None
            or self.smcd_v2_extension is not None
        ):
            raise ValueError("a v1 Proposal offers no v2 type and has no v2 extensions")
        if self.ip_area_offset not in (0, _AREA_LEN):
            raise ValueError("v1 ip_area_offset must be 0 or 40")
        if self.typev1.smcd and self.ip_area_offset != _AREA_LEN:
            raise ValueError("SMC-D v1 needs ip_area_offset 40")
        if self.ip_area_offset == 0 and (
            self.ism_gid or self.ism_chid or any(self.vendor_oui + self.vendor_options)
        ):
            raise ValueError("no SMC-D area with ip_area_offset 0: its fields must be 0")

    def _check_v2(self) -> None:
        want = _AREA_LEN if self.typev1 != SmcType.N else 0
        if self.ip_area_offset != want:
            raise ValueError(f"v2 ip_area_offset must be {want} for typev1 {self.typev1.name}")
        if (self.v2_extension is not None) != (self.typev2 != SmcType.N):
            raise ValueError("v2_extension present iff typev2 != N")
        if (self.smcd_v2_extension is not None) != self.typev2.smcd:
            raise ValueError("smcd_v2_extension present iff typev2 offers SMC-D")

    # -- convenience constructors: what Linux / the RFC send -----------------

    @classmethod
    def smcr_v1(
        cls,
        peer_id: bytes,
        gid: bytes,
        mac: bytes,
        *,
        outgoing_subnet: ipaddress.IPv4Address = _ZERO_IPV4,
        prefix_len: int = 0,
        ipv6_prefixes: tuple[Ipv6Prefix, ...] = (),
    ) -> ClcProposal:
        """The Proposal Linux >= 5.10 sends offering SMC-R v1 only (spec §2.3.5).

        v2 header, ``typev1 = R``, ``typev2 = N``: byte 7 ``0x28``, IP-area
        offset 40, zero SMC-D/v2 area; 92 bytes for IPv4, + 17 per IPv6 prefix.
        """
        prefix = IpPrefixArea(outgoing_subnet, prefix_len, ipv6_prefixes)
        return cls._offering_smcr_v1(2, peer_id, gid, mac, prefix, None)

    @classmethod
    def smcr_v2(
        cls,
        roce_gid: bytes,
        user_eids: tuple[bytes, ...],
        *,
        release: int = 1,
        max_conns: int = 255,
        max_links: int = 2,
        feature_mask: int = 0x0001,
    ) -> ClcProposal:
        """The SMC-Rv2-only Proposal Linux sends over rxe (spec §2.3.5).

        v2 header, ``typev1 = N``, ``typev2 = R``: byte 7 ``0x22``; bytes 8-39
        zero (IP-area offset 0), zero SMC-D/v2 area with v2-extension offset
        28, no prefix area, v2 extension at 80; ``124 + 32k`` bytes for k user
        EIDs.  Defaults are Linux 6.12's: release 1 (v2.1), max conns 255
        (sysctl ``smcr_max_conns_per_lgr``), max links 2, feature mask 0x0001.
        """
        return cls(
            version=2,
            typev1=SmcType.N,
            typev2=SmcType.R,
            v2_extension=V2Extension(
                release=release,
                roce_gid=roce_gid,
                max_conns=max_conns,
                max_links=max_links,
                feature_mask=feature_mask,
                user_eids=user_eids,
            ),
        )

    @classmethod
    def smcr_v1_v2(
        cls,
        peer_id: bytes,
        gid: bytes,
        mac: bytes,
        v2_extension: V2Extension,
        *,
        outgoing_subnet: ipaddress.IPv4Address = _ZERO_IPV4,
        prefix_len: int = 0,
        ipv6_prefixes: tuple[Ipv6Prefix, ...] = (),
    ) -> ClcProposal:
        """The Proposal Linux sends offering SMC-R v1 and v2 (``smc_clc_send_proposal``).

        v2 header, ``typev1 = R``, ``typev2 = R``: byte 7 ``0x20``, the v1 part
        (peer ID, GID, MAC, IP-area offset 40, prefix area at 80) and then the
        v2 extension (v2-extension offset 28 + prefix area size);
        ``92 + 40 + 32k`` bytes for IPv4 and k user EIDs (spec §2.3.5).
        """
        prefix = IpPrefixArea(outgoing_subnet, prefix_len, ipv6_prefixes)
        return cls._offering_smcr_v1(2, peer_id, gid, mac, prefix, v2_extension)

    @classmethod
    def rfc_v1(
        cls,
        peer_id: bytes,
        gid: bytes,
        mac: bytes,
        *,
        outgoing_subnet: ipaddress.IPv4Address = _ZERO_IPV4,
        prefix_len: int = 0,
        ipv6_prefixes: tuple[Ipv6Prefix, ...] = (),
    ) -> ClcProposal:
        """The RFC 7609-style v1 Proposal: byte 7 ``0x10``, offset 0, 52 bytes (spec §2.3.5).

        Prefix area right at 40; + 17 bytes per IPv6 prefix.
        """
        prefix = IpPrefixArea(outgoing_subnet, prefix_len, ipv6_prefixes)
        return cls._offering_smcr_v1(1, peer_id, gid, mac, prefix, None)

    @classmethod
    def _offering_smcr_v1(
        cls,
        version: int,
        peer_id: bytes,
        gid: bytes,
        mac: bytes,
        prefix: IpPrefixArea,
        v2_extension: V2Extension | None,
    ) -> ClcProposal:
        """A Proposal that offers SMC-R v1 (and SMC-R v2 with ``v2_extension``): in a v2
        header the IP area follows the 40-byte SMC-D/v2 area, in a v1 one it is at 40."""
        return cls(
            version=version,
            typev1=SmcType.R,
            typev2=SmcType.N if v2_extension is None else SmcType.R,
            peer_id=peer_id,
            gid=gid,
            mac=mac,
            ip_area_offset=_AREA_LEN if version >= 2 else 0,
            prefix=prefix,
            v2_extension=v2_extension,
        )

    # -- layout ---------------------------------------------------------------

    @property
    def has_smcd_area(self) -> bool:
        """True when the 40-byte SMC-D/v2 area is at 40-79 (v2, or v1 with offset 40)."""
        return self.version >= 2 or self.ip_area_offset == _AREA_LEN

    @property
    def length(self) -> int:
        """Total encoded length (what byte 5-6 says)."""
        n = _BASE_LEN + CLC_TRAILER_LEN
        if self.has_smcd_area:
            n += _AREA_LEN
        if self.prefix is not None:
            n += self.prefix.size
        if self.v2_extension is not None:
            n += self.v2_extension.size
        if self.smcd_v2_extension is not None:
            n += self.smcd_v2_extension.size
        return n

    def encode(self) -> bytes:
        """The Proposal's bytes, parts back to back (``smc_clc_send_proposal``)."""
        v2 = self.version >= 2
        typev2 = self.typev2 if v2 else 0  # no v2 types in a v1 header
        hdr = pack_header(ClcType.PROPOSAL, self.length, byte7(self.version, typev2, self.typev1))
        parts = [hdr, self.peer_id, self.gid, self.mac, self.ip_area_offset.to_bytes(2, "big")]
        prefix_size = self.prefix.size if self.prefix is not None else 0
        if self.has_smcd_area:
            v2_ext_offset = 0
            if v2 and self.v2_extension is not None:
                v2_ext_offset = _V2_EXT_OFFSET_BASE + prefix_size
            parts.append(
                _SMCD_AREA.pack(
                    self.ism_gid,
                    self.ism_chid,
                    v2_ext_offset,
                    self.vendor_oui,
                    self.vendor_options,
                )
            )
        if self.prefix is not None:
            parts.append(self.prefix.encode())
        ext = self.v2_extension
        if ext is not None:
            smcd = self.smcd_v2_extension
            gids = smcd.gid_chids if smcd is not None else ()
            smcd_offset = 0
            if smcd is not None:
                smcd_offset = _SMCD_EXT_OFFSET_BASE + _EID_LEN * len(ext.user_eids)
            parts.append(
                _V2_EXT.pack(
                    len(ext.user_eids),
                    len(gids),
                    (ext.release << 4) | int(ext.seid),
                    smcd_offset,
                    ext.roce_gid,
                    ext.max_conns,
                    ext.max_links,
                    ext.feature_mask,
                )
            )
            parts += ext.user_eids
            if smcd is not None:
                parts.append(_SMCD_V2_EXT.pack(smcd.system_eid))
                parts += [_GID_CHID.pack(g.gid, g.chid) for g in gids]
        parts.append(EYECATCHER_SMCR)
        return b"".join(parts)

    @classmethod
    def decode(cls, data: Buffer, header: ClcHeader | None = None) -> ClcProposal:
        """Decode one whole Proposal (``smc_clc_msg_prop_valid`` plus layout checks).

        :param data: exactly the message's bytes (length field == ``len(data)``).
        :param header: its header, decoded already (:class:`~smcr.wire.clc.ClcReader`).
        :raises WireError: with ``code=None`` for any malformed Proposal.
        """
        hdr = decode_header(data, ClcType.PROPOSAL, header)
        _, _, _, _, peer_id, gid, mac, ip_off = _BASE.unpack_from(data, 0)
        typev1 = SMC_TYPES[hdr.typev1]
        if ip_off > _AREA_LEN:
            raise WireError(f"Proposal IP-area offset at 38 is {ip_off}, max 40")
        if hdr.version == 1:
            typev2 = SmcType.N  # typev2 bits mean nothing in a v1 header; Linux ignores them
            if typev1 == SmcType.N:
                raise WireError("v1 Proposal offers no SMC type (typev1 N at byte 7)")
            if ip_off not in (0, _AREA_LEN):
                raise WireError(f"v1 Proposal IP-area offset at 38 is {ip_off}, not 0 or 40")
            if typev1.smcd and ip_off != _AREA_LEN:
                raise WireError("v1 Proposal offers SMC-D but IP-area offset at 38 is not 40")
        else:
            typev2 = SMC_TYPES[hdr.typev2]
            want = _AREA_LEN if typev1 != SmcType.N else 0
            if ip_off != want:
                raise WireError(f"v2 Proposal IP-area offset at 38 is {ip_off}, expected {want}")
        pos = _BASE_LEN
        ism_gid, ism_chid, v2_ext_offset, oui, options = 0, 0, 0, bytes(3), bytes(5)
        if hdr.version >= 2 or ip_off == _AREA_LEN:
            if len(data) < pos + _AREA_LEN + CLC_TRAILER_LEN:
                raise WireError("Proposal SMC-D/v2 area at 40 truncated")
            ism_gid, ism_chid, v2_ext_offset, oui, options = _SMCD_AREA.unpack_from(data, pos)
            pos += _AREA_LEN
        prefix = None
        if typev1 != SmcType.N:
            prefix = IpPrefixArea.decode_from(data, pos)
            pos += prefix.size
        ext = smcd = None
        if hdr.version >= 2:
            want_off = pos - 52 if typev2 != SmcType.N else 0
            if v2_ext_offset != want_off:
                raise WireError(
                    f"Proposal v2-extension offset at 50 is {v2_ext_offset}, expected {want_off}"
                )
            if typev2 != SmcType.N:
                ext, smcd, pos = _decode_v2_parts(data, pos, typev2)
        if pos + CLC_TRAILER_LEN != len(data):
            raise WireError(f"Proposal length {len(data)} does not match its parts ({pos + 4})")
        check_trailer(data)
        # fixed-width fields, the layout rules checked above: __post_init__'s checks hold
        # (were one to fail, the peer's message is malformed all the same: a WireError)
        try:
            return ClcProposal(hdr.version, typev1, typev2, peer_id, gid, mac, ip_off, ism_gid,
                               ism_chid, oui, options, prefix, ext, smcd)  # fmt: skip
        except ValueError as exc:
            raise WireError(f"Proposal: {exc}") from None


def _decode_v2_parts(
    data: Buffer, pos: int, typev2: SmcType
) -> tuple[V2Extension, SmcdV2Extension | None, int]:
    """Decode the v2 extension at *pos* and, if SMC-D is offered, the SMC-Dv2 extension.

    :returns: the two parts and the offset right behind them.
    :raises WireError: truncated parts, counts above 8, a misplaced SMC-Dv2 extension.
    """
    if len(data) < pos + _V2_EXT.size:
        raise WireError(f"Proposal v2 extension at {pos} truncated")
    (eid_cnt, gid_cnt, flags, smcd_off, roce_gid, max_conns, max_links, features) = (
        _V2_EXT.unpack_from(data, pos)
    )
    if eid_cnt > MAX_UEIDS:
        raise WireError(f"Proposal EID count at {pos} is {eid_cnt}, max 8")
    start = pos + _V2_EXT.size
    end = start + _EID_LEN * eid_cnt
    if len(data) < end:
        raise WireError(f"Proposal user EIDs at {start} truncated")
    eids = tuple(bytes(data[i : i + _EID_LEN]) for i in range(start, end, _EID_LEN))
    ext = V2Extension(flags >> 4, bool(flags & 0x01), roce_gid, max_conns, max_links, features,
                      eids)  # fmt: skip
    if not typev2.smcd:
        # SMC-R only: ISM GID count and SMC-Dv2 offset are not used (Linux
        # ignores them then); accepted as any value, sent as 0.
        return ext, None, end
    want = _SMCD_EXT_OFFSET_BASE + _EID_LEN * eid_cnt
    if smcd_off != want:
        raise WireError(f"Proposal SMC-Dv2 extension offset at {pos + 6} is {smcd_off}, not {want}")
    if gid_cnt > MAX_ISM_GIDS:
        raise WireError(f"Proposal ISM GID count at {pos + 1} is {gid_cnt}, max 8")
    if len(data) < end + _SMCD_V2_EXT.size + _GID_CHID.size * gid_cnt:
        raise WireError(f"Proposal SMC-Dv2 extension at {end} truncated")
    (system_eid,) = _SMCD_V2_EXT.unpack_from(data, end)
    start = end + _SMCD_V2_EXT.size
    end = start + _GID_CHID.size * gid_cnt
    gids = tuple(SmcdGidChid(g, c) for g, c in _GID_CHID.iter_unpack(bytes(data[start:end])))
    return ext, SmcdV2Extension(system_eid, gids), end
