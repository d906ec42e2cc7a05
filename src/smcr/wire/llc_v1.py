"""The SMC-R v1 LLC messages: 44 bytes each, sent on a link's RC QP (spec §3).

Design
------
Link Layer Control messages manage links and link groups (CONFIRM LINK, ADD
LINK, DELETE LINK, TEST LINK) and announce or withdraw RMBs (CONFIRM RKEY,
DELETE RKEY).  Every v1 LLC is one RDMA SEND of exactly 44 bytes with this
header (Linux ``struct smc_llc_hdr``)::

     0  type                   1  length = 44 (0x2C)
     2  reserved; ADD LINK: low nibble = reject reason
     3  flags; 0x80 = response in every type, other bits per type

All multi-byte fields are big-endian.  One frozen dataclass per message type,
one precompiled :class:`struct.Struct` for bytes 4-43 of each (the body), and
one for the header.  The SMC-Rv2 variants (byte 0 = ``0x20 | type``) live in
:mod:`smcr.wire.llc_v2`; the four whose layout is the v1 layout subclass the
classes here, so ``isinstance(msg, ConfirmLink)`` holds for both versions,
as Linux (which switches on the low nibble) treats them alike.

Flags are kept as the raw byte ``flags`` (with named masks below), so that
every bit a peer sets survives decode/encode and the core tests
``msg.flags & LLC_FLAG_RESP`` the way ``smc_llc.c`` does.

Validation (:class:`~smcr.wire.errors.WireError`, never with a decline code:
Linux answers a bad LLC by dropping it, ``smc_llc_rx_handler``, or by ending
the link group, ``smc_llc_protocol_violation``, never by a CLC Decline):

* the buffer is exactly 44 bytes and byte 1 is 44 (Linux drops a v1 LLC whose
  length byte is not 44; a conforming sender always sends 44 bytes);
* byte 0 is the type the decoder is for;
* counts are in the range the message can carry (spec §3.5-§3.8).

Reserved fields, byte 2 (outside ADD LINK's reason nibble) and the unused
slots of the rkey/rtoken lists are ignored by Linux on receive (it reads only
the named fields and only ``count`` list entries), so decoders accept any
value there and drop it; encoders always send zeros.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, replace
from typing import ClassVar, Literal, Protocol, Self, TypeAlias

from smcr.wire.errors import WireError
from smcr.wire.validate import check_bytes, check_uint

__all__ = [
    "DEFAULT_BYTEORDER",
    "LLC_FLAG_ADD_LNK_REJ",
    "LLC_FLAG_DEL_LINK_ALL",
    "LLC_FLAG_DEL_LINK_ORDERLY",
    "LLC_FLAG_NO_RMBE_EYEC",
    "LLC_FLAG_RESP",
    "LLC_FLAG_RKEY_NEG",
    "LLC_FLAG_RKEY_RETRY",
    "LLC_MSG_SIZE",
    "LLC_REJ_RSN_NO_ALT_PATH",
    "LLC_V2_MAX_SIZE",
    "AddLink",
    "AddLinkCont",
    "Buffer",
    "ByteOrder",
    "ConfirmLink",
    "ConfirmRkey",
    "ConfirmRkeyCont",
    "DeleteLink",
    "DeleteLinkReason",
    "DeleteRkey",
    "LlcMessage",
    "LlcType",
    "RkeyPair",
    "Rtoken",
    "TestLink",
]

Buffer: TypeAlias = bytes | bytearray | memoryview
ByteOrder: TypeAlias = Literal["little", "big"]
"""Byte order of the v2 length field and of the ADD LINK v2 rkey count (spec §9)."""

DEFAULT_BYTEORDER: ByteOrder = "little"
"""What x86 Linux writes in host order (spec §9 [DISCREPANCY], golden capture)."""

LLC_MSG_SIZE = 44
"""Size of every v1 LLC and of the fixed v2 ones (Linux ``sizeof(union smc_llc_msg)``)."""
LLC_V2_MAX_SIZE = 8192
"""Largest v2 LLC (Linux ``SMC_WR_BUF_V2_SIZE``)."""

LLC_FLAG_RESP = 0x80
"""Byte 3: this is a response (Linux ``SMC_LLC_FLAG_RESP``), all types."""
LLC_FLAG_NO_RMBE_EYEC = 0x03
"""CONFIRM LINK byte 3: no RMBE eyecatchers; Linux sets both bits."""
LLC_FLAG_ADD_LNK_REJ = 0x40
"""ADD LINK byte 3: the response rejects the new link."""
LLC_REJ_RSN_NO_ALT_PATH = 1
"""ADD LINK byte 2 low nibble: reject reason "no alternate path"."""
LLC_FLAG_DEL_LINK_ALL = 0x40
"""DELETE LINK byte 3: delete all links (terminate the link group)."""
LLC_FLAG_DEL_LINK_ORDERLY = 0x20
"""DELETE LINK byte 3: orderly deletion."""
LLC_FLAG_RKEY_NEG = 0x20
"""CONFIRM/DELETE RKEY byte 3: negative response."""
LLC_FLAG_RKEY_RETRY = 0x10
"""CONFIRM RKEY byte 3: retry rkey set (configuration change in progress)."""


class LlcType(enum.IntEnum):
    """Byte 0 of an LLC message: ``(llc_version << 4) | type`` (spec §3.2)."""

    CONFIRM_LINK = 0x01
    ADD_LINK = 0x02
    ADD_LINK_CONT = 0x03
    DELETE_LINK = 0x04
    REQ_ADD_LINK = 0x05  # v2 only (0x25); Linux drops a v1 0x05
    CONFIRM_RKEY = 0x06
    TEST_LINK = 0x07
    CONFIRM_RKEY_CONT = 0x08
    DELETE_RKEY = 0x09
    CONFIRM_LINK_V2 = 0x21
    ADD_LINK_V2 = 0x22
    DELETE_LINK_V2 = 0x24
    REQ_ADD_LINK_V2 = 0x25
    CONFIRM_RKEY_V2 = 0x26
    TEST_LINK_V2 = 0x27
    DELETE_RKEY_V2 = 0x29


class DeleteLinkReason(enum.IntEnum):
    """DELETE LINK reason code, bytes 5-8 (spec §3.6; Linux ``SMC_LLC_DEL_*``)."""

    OK = 0x00000000
    """Response: link deleted."""
    LOST_PATH = 0x00010000
    """Request: the link's path was lost."""
    OP_INIT_TERM = 0x00020000
    """Request: operator-initiated termination."""
    PROG_INIT_TERM = 0x00030000
    """Request: program-initiated termination (Linux: link group idle)."""
    PROT_VIOL = 0x00040000
    """Request: LLC protocol violation."""
    NO_ASYM_NEEDED = 0x00050000
    """Request: the asymmetric link is no longer needed."""
    NOLNK = 0x00100000
    """Response: unknown link id."""
    NOLGR = 0x00200000
    """Response: unknown link group."""


_REASONS = frozenset(int(r) for r in DeleteLinkReason)

_HDR_V1 = struct.Struct(">BBBB")


def _view(data: Buffer, size: int | None = None) -> memoryview:
    """Return ``data`` as a byte memoryview, checking its size if given."""
    view = memoryview(data).cast("B") if isinstance(data, memoryview) else memoryview(data)
    if size is not None and len(view) != size:
        raise WireError(f"LLC message is {len(view)} bytes, expected {size}")
    return view


def _check_type(view: memoryview, expected: int) -> None:
    if not view:
        raise WireError("empty LLC message")
    if view[0] != expected:
        raise WireError(f"LLC type byte 0x{view[0]:02x}, expected 0x{expected:02x}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Rtoken:
    """One RMB on one link: ``(link id, rkey, vaddr)``, 13 bytes (spec §3.7).

    :param link_id: the link the rkey is valid on (Linux ``smc_rmb_rtoken.link_id``).
    :param rmb_key: the RMB's rkey on that link.
    :param rmb_vaddr: the RMB's virtual address on that link.
    """

    link_id: int
    rmb_key: int
    rmb_vaddr: int

    def __post_init__(self) -> None:
        check_uint("link_id", self.link_id, 8)
        check_uint("rmb_key", self.rmb_key, 32)
        check_uint("rmb_vaddr", self.rmb_vaddr, 64)


@dataclass(frozen=True, slots=True, kw_only=True)
class RkeyPair:
    """An RMB's rkey on an old link and its rkey/vaddr on a new one, 16 bytes.

    Carried by ADD LINK CONTINUATION (spec §3.5) and ADD LINK v2 (spec §9);
    Linux ``struct smc_llc_msg_add_link_cont_rt``.

    :param rmb_key: the rkey as known on the link the message travels on.
    :param rmb_key_new: the rkey of the same RMB on the new link.
    :param rmb_vaddr_new: the RMB's virtual address on the new link.
    """

    rmb_key: int
    rmb_key_new: int
    rmb_vaddr_new: int

    def __post_init__(self) -> None:
        check_uint("rmb_key", self.rmb_key, 32)
        check_uint("rmb_key_new", self.rmb_key_new, 32)
        check_uint("rmb_vaddr_new", self.rmb_vaddr_new, 64)


_RKEY_PAIR = struct.Struct(">IIQ")
_RTOKEN = struct.Struct(">BIQ")
_ZERO_RTOKEN = Rtoken(link_id=0, rmb_key=0, rmb_vaddr=0)
_ZERO_PAIR = RkeyPair(rmb_key=0, rmb_key_new=0, rmb_vaddr_new=0)


class LlcMessage:
    """Base of the fixed 44-byte LLC messages: header handling and the codec frame.

    Subclasses are frozen dataclasses; they set :attr:`TYPE`, implement
    :meth:`_body` (bytes 4-43) and :meth:`_parse` (the inverse), and may
    override :meth:`_byte2`.  The v2 subclasses in :mod:`smcr.wire.llc_v2`
    override :meth:`_header` and :meth:`decode`.
    """

    __slots__ = ()

    TYPE: ClassVar[int]
    """Byte 0 on the wire."""

    flags: int

    def __post_init__(self) -> None:
        """Check the fields (each message class checks its own)."""

    @property
    def is_response(self) -> bool:
        """Whether flag 0x80 (response) is set."""
        return bool(self.flags & LLC_FLAG_RESP)

    def _byte2(self) -> int:
        return 0  # reserved: always sent as zero

    def _header(self) -> bytes:
        return _HDR_V1.pack(self.TYPE, LLC_MSG_SIZE, self._byte2(), self.flags)

    def _body(self) -> bytes:
        raise NotImplementedError

    def encode(self) -> bytes:
        """Return the 44 bytes of this message."""
        return self._header() + self._body()

    @classmethod
    def _parse(cls, view: memoryview) -> Self:
        raise NotImplementedError

    @classmethod
    def decode(cls, data: Buffer) -> Self:
        """Decode one v1 message of this type.

        :param data: exactly the 44 bytes of the message.
        :raises WireError: wrong size, type or length byte (Linux
            ``smc_llc_rx_handler`` drops such a message).
        """
        view = _view(data, LLC_MSG_SIZE)
        _check_type(view, cls.TYPE)
        if view[1] != LLC_MSG_SIZE:
            raise WireError(f"LLC length byte {view[1]}, expected {LLC_MSG_SIZE}")
        return cls._parse(view)


_CONFIRM_LINK = struct.Struct(">6s16s3sB4sBB8x")


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfirmLink(LlcMessage):
    """CONFIRM LINK (0x01): a new link's QP data, sent on that link (spec §3.3).

    The server sends the request on the new QP after the CLC Confirm (first
    link) or at the end of the ADD LINK flow; the client answers with its own
    values and flag 0x80.  Linux ``smc_llc_send_confirm_link``.

    :param flags: byte 3; Linux sends ``0x03`` (no RMBE eyecatcher) in the
        request and ``0x83`` in the response, and on the first link refuses a
        peer that sets neither 0x03 bit.
    :param sender_mac: MAC of the sender's RNIC port (6 bytes).
    :param sender_gid: GID of the sender's RNIC port (16 bytes).
    :param sender_qp_num: the sender's QP number (24 bits).
    :param link_num: link id, assigned by the server.
    :param link_uid: sender's link user id (4 bytes; informational).
    :param max_links: max links per group (Linux: 2, or the v2.1 negotiated value).
    :param max_conns: max connections per group (v2.1 only, else 0).
    """

    TYPE: ClassVar[int] = LlcType.CONFIRM_LINK

    flags: int = LLC_FLAG_NO_RMBE_EYEC
    sender_mac: bytes
    sender_gid: bytes
    sender_qp_num: int
    link_num: int
    link_uid: bytes
    max_links: int = 2
    max_conns: int = 0

    def __post_init__(self) -> None:
        check_uint("flags", self.flags, 8)
        check_bytes("sender_mac", self.sender_mac, 6)
        check_bytes("sender_gid", self.sender_gid, 16)
        check_uint("sender_qp_num", self.sender_qp_num, 24)
        check_uint("link_num", self.link_num, 8)
        check_bytes("link_uid", self.link_uid, 4)
        check_uint("max_links", self.max_links, 8)
        check_uint("max_conns", self.max_conns, 8)

    def _body(self) -> bytes:
        return _CONFIRM_LINK.pack(
            self.sender_mac,
            self.sender_gid,
            self.sender_qp_num.to_bytes(3, "big"),
            self.link_num,
            self.link_uid,
            self.max_links,
            self.max_conns,
        )

    @classmethod
    def _parse(cls, view: memoryview) -> Self:
        mac, gid, qpn, link_num, uid, max_links, max_conns = _CONFIRM_LINK.unpack_from(view, 4)
        return cls(
            flags=view[3],
            sender_mac=mac,
            sender_gid=gid,
            sender_qp_num=int.from_bytes(qpn, "big"),
            link_num=link_num,
            link_uid=uid,
            max_links=max_links,
            max_conns=max_conns,
        )


# ADD LINK body: MAC, 2 reserved, GID, QPN, link number, MTU nibble byte, PSN, 8 reserved.
_ADD_LINK = struct.Struct(">6s2x16s3sBB3s8x")


class _AddLinkFields(Protocol):
    """The fields of bytes 3-43 that ADD LINK v1 and v2 share (:class:`AddLink`,
    :class:`~smcr.wire.llc_v2.AddLinkV2`)."""

    @property
    def flags(self) -> int: ...
    @property
    def sender_mac(self) -> bytes: ...
    @property
    def sender_gid(self) -> bytes: ...
    @property
    def sender_qp_num(self) -> int: ...
    @property
    def link_num(self) -> int: ...
    @property
    def qp_mtu(self) -> int: ...
    @property
    def initial_psn(self) -> int: ...


def _check_add_link(msg: _AddLinkFields) -> None:
    """Check the fields of bytes 3-43 of an ADD LINK (v1 and v2 share them)."""
    check_uint("flags", msg.flags, 8)
    check_bytes("sender_mac", msg.sender_mac, 6)
    check_bytes("sender_gid", msg.sender_gid, 16)
    check_uint("sender_qp_num", msg.sender_qp_num, 24)
    check_uint("link_num", msg.link_num, 8)
    check_uint("qp_mtu", msg.qp_mtu, 4)
    check_uint("initial_psn", msg.initial_psn, 24)


def _pack_add_link_body(msg: _AddLinkFields) -> bytes:
    """Return bytes 4-43 of an ADD LINK (v1 and v2 share them)."""
    return _ADD_LINK.pack(msg.sender_mac, msg.sender_gid, msg.sender_qp_num.to_bytes(3, "big"),
                          msg.link_num, msg.qp_mtu, msg.initial_psn.to_bytes(3, "big"))  # fmt: skip


def _parse_add_link_body(view: memoryview) -> tuple[bytes, bytes, int, int, int, int]:
    """Return (MAC, GID, QPN, link number, MTU nibble, PSN) from bytes 4-43."""
    mac, gid, qpn, link_num, mtu_byte, psn = _ADD_LINK.unpack_from(view, 4)
    # high nibble of byte 32 is reserved: Linux reads only the qp_mtu bitfield
    return (
        mac,
        gid,
        int.from_bytes(qpn, "big"),
        link_num,
        mtu_byte & 0x0F,
        int.from_bytes(psn, "big"),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class AddLink(LlcMessage):
    """ADD LINK (0x02): offer a new link, or answer/reject such an offer (spec §3.4).

    The server sends the request with its new QP's data on an existing link;
    the client answers with its own (flag 0x80) or rejects (0x80|0x40, reason
    nibble 1).  A client "invitation" request carries only MAC and GID.
    Linux ``smc_llc_send_add_link``, ``smc_llc_cli_add_link_reject``.

    :param flags: byte 3: 0x80 response, 0x40 rejected.
    :param reject_reason: byte 2 low nibble (1 = no alternate path); the high
        nibble is reserved (ignored on receive, sent as zero).
    :param sender_mac: MAC of the new link's RNIC port.
    :param sender_gid: GID of the new link's RNIC port.
    :param sender_qp_num: the sender's QP number for the new link (24 bits).
    :param link_num: the new link's id (server-chosen).
    :param qp_mtu: byte 32 low nibble, IB MTU enum (request: own; response:
        min(own, peer)); the high nibble is reserved.
    :param initial_psn: initial PSN of the new QP (24 bits).
    """

    TYPE: ClassVar[int] = LlcType.ADD_LINK

    flags: int = 0
    reject_reason: int = 0
    sender_mac: bytes
    sender_gid: bytes
    sender_qp_num: int = 0
    link_num: int = 0
    qp_mtu: int = 0
    initial_psn: int = 0

    def __post_init__(self) -> None:
        _check_add_link(self)
        check_uint("reject_reason", self.reject_reason, 4)

    @property
    def is_rejected(self) -> bool:
        """Whether flag 0x40 (reject) is set."""
        return bool(self.flags & LLC_FLAG_ADD_LNK_REJ)

    def reject(self, reason: int = LLC_REJ_RSN_NO_ALT_PATH) -> Self:
        """Return the reject Linux sends for this request: the echo with 0x80|0x40.

        Mirrors ``smc_llc_cli_add_link_reject``: flags |= response|reject and
        the reason nibble is set (v1; ``02 2C 01 C0`` + the request's bytes 4-43).

        :param reason: reject reason nibble (Linux always sends 1).
        """
        return replace(
            self, flags=self.flags | LLC_FLAG_RESP | LLC_FLAG_ADD_LNK_REJ, reject_reason=reason
        )

    def _byte2(self) -> int:
        return self.reject_reason

    def _body(self) -> bytes:
        return _pack_add_link_body(self)

    @classmethod
    def _parse(cls, view: memoryview) -> Self:
        mac, gid, qpn, link_num, qp_mtu, psn = _parse_add_link_body(view)
        return cls(
            flags=view[3],
            reject_reason=view[2] & 0x0F,  # high nibble reserved, ignored by Linux
            sender_mac=mac,
            sender_gid=gid,
            sender_qp_num=qpn,
            link_num=link_num,
            qp_mtu=qp_mtu,
            initial_psn=psn,
        )


_ADD_LINK_CONT = struct.Struct(">BBxx" + "IIQ" * 2 + "4x")


@dataclass(frozen=True, slots=True, kw_only=True)
class AddLinkCont(LlcMessage):
    """ADD LINK CONTINUATION (0x03): rkeys of in-use RMBs for a new link (spec §3.5).

    Exchanged ping-pong on the old link after ADD LINK (v1 only; v2 puts the
    rkeys in the ADD LINK itself).  The pairs start at byte 8 as in Linux
    ``struct smc_llc_msg_add_link_cont``; Wireshark reads them from byte 6
    (spec §3.5 [DISCREPANCY]).  Linux ``smc_llc_add_link_cont``.

    :param flags: byte 3; Linux sets 0x80 when the client sends it.
    :param link_num: the new link's id.
    :param num_rkeys: rkeys this side still has to send, *including* those in
        this message (may exceed 2).
    :param rkeys: the pairs in this message: exactly ``min(num_rkeys, 2)``.
    """

    TYPE: ClassVar[int] = LlcType.ADD_LINK_CONT

    flags: int = 0
    link_num: int
    num_rkeys: int
    rkeys: tuple[RkeyPair, ...] = ()

    def __post_init__(self) -> None:
        check_uint("flags", self.flags, 8)
        check_uint("link_num", self.link_num, 8)
        check_uint("num_rkeys", self.num_rkeys, 8)
        if len(self.rkeys) != min(self.num_rkeys, 2):
            raise ValueError(f"{len(self.rkeys)} rkey pairs for num_rkeys={self.num_rkeys}")

    def _body(self) -> bytes:
        p1, p2 = (*self.rkeys, _ZERO_PAIR, _ZERO_PAIR)[:2]
        return _ADD_LINK_CONT.pack(
            self.link_num,
            self.num_rkeys,
            p1.rmb_key,
            p1.rmb_key_new,
            p1.rmb_vaddr_new,
            p2.rmb_key,
            p2.rmb_key_new,
            p2.rmb_vaddr_new,
        )

    @classmethod
    def _parse(cls, view: memoryview) -> Self:
        link_num, num, k1, n1, v1, k2, n2, v2 = _ADD_LINK_CONT.unpack_from(view, 4)
        pairs = (
            RkeyPair(rmb_key=k1, rmb_key_new=n1, rmb_vaddr_new=v1),
            RkeyPair(rmb_key=k2, rmb_key_new=n2, rmb_vaddr_new=v2),
        )
        # unused pair slots are ignored (Linux reads min(num_rkeys, 2) pairs)
        return cls(flags=view[3], link_num=link_num, num_rkeys=num, rkeys=pairs[: min(num, 2)])


_DELETE_LINK = struct.Struct(">BI35x")


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteLink(LlcMessage):
    """DELETE LINK (0x04): remove one link, or all of them (spec §3.6).

    Linux ``smc_llc_send_delete_link``, ``smc_llc_send_link_delete_all``;
    the lgr idle timeout sends ``04 2C 00 60 00 00 03 00 00`` (ALL, orderly,
    program-initiated termination).

    :param flags: byte 3: 0x80 response, 0x40 ALL links, 0x20 orderly.
    :param link_num: the link to delete (0 with ALL).
    :param reason: reason code (:class:`DeleteLinkReason` when known; any
        32-bit value is carried).
    """

    TYPE: ClassVar[int] = LlcType.DELETE_LINK

    flags: int = 0
    link_num: int = 0
    reason: int = DeleteLinkReason.OK

    def __post_init__(self) -> None:
        check_uint("flags", self.flags, 8)
        check_uint("link_num", self.link_num, 8)
        check_uint("reason", self.reason, 32)

    @property
    def is_all(self) -> bool:
        """Whether flag 0x40 (delete all links) is set."""
        return bool(self.flags & LLC_FLAG_DEL_LINK_ALL)

    @property
    def is_orderly(self) -> bool:
        """Whether flag 0x20 (orderly) is set."""
        return bool(self.flags & LLC_FLAG_DEL_LINK_ORDERLY)

    def response(self, reason: int = DeleteLinkReason.OK) -> Self:
        """Return the response Linux sends: the request echoed with 0x80 and a reason.

        Mirrors ``smc_llc_process_cli_delete_link`` (reason 0, or
        :attr:`DeleteLinkReason.NOLNK` for an unknown link id).
        """
        return replace(self, flags=self.flags | LLC_FLAG_RESP, reason=reason)

    def _body(self) -> bytes:
        return _DELETE_LINK.pack(self.link_num, self.reason)

    @classmethod
    def _parse(cls, view: memoryview) -> Self:
        link_num, reason = _DELETE_LINK.unpack_from(view, 4)
        if reason in _REASONS:
            reason = DeleteLinkReason(reason)
        return cls(flags=view[3], link_num=link_num, reason=reason)


_CONFIRM_RKEY = struct.Struct(">BIQ" + "BIQ" * 2 + "x")


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfirmRkey(LlcMessage):
    """CONFIRM RKEY (0x06): announce a new RMB's rkey on every link (spec §3.7).

    The first rtoken is for the link the message is sent on (its first byte is
    the count of *additional* rtokens); up to two more name other links.
    Linux ``smc_llc_send_confirm_rkey``, ``smc_llc_rmt_conf_rkey``.

    :param flags: byte 3: 0x80 response, 0x20 negative, 0x10 retry.
    :param rmb_key: the RMB's rkey on the sending link (bytes 5-8).
    :param rmb_vaddr: the RMB's vaddr on the sending link (bytes 9-16).
    :param other_rtokens: 0-2 rtokens for other links (bytes 17-42); byte 4
        is their count.  Linux answers a count of 3 as if it were 2 and a
        larger one with a negative response; this decoder refuses counts > 2.
    """

    TYPE: ClassVar[int] = LlcType.CONFIRM_RKEY

    flags: int = 0
    rmb_key: int
    rmb_vaddr: int
    other_rtokens: tuple[Rtoken, ...] = ()

    def __post_init__(self) -> None:
        check_uint("flags", self.flags, 8)
        check_uint("rmb_key", self.rmb_key, 32)
        check_uint("rmb_vaddr", self.rmb_vaddr, 64)
        if len(self.other_rtokens) > 2:
            raise ValueError("CONFIRM RKEY carries at most 2 additional rtokens")

    def response(self, negative: bool = False) -> Self:
        """Return the response Linux sends: the request echoed with 0x80.

        Mirrors ``smc_llc_rmt_conf_rkey``: a failed request is answered with
        0x80|0x20|0x10 (negative, retry).
        """
        flags = self.flags | LLC_FLAG_RESP
        if negative:
            flags |= LLC_FLAG_RKEY_NEG | LLC_FLAG_RKEY_RETRY
        return replace(self, flags=flags)

    def _body(self) -> bytes:
        t2, t3 = (*self.other_rtokens, _ZERO_RTOKEN, _ZERO_RTOKEN)[:2]
        return _CONFIRM_RKEY.pack(
            len(self.other_rtokens),
            self.rmb_key,
            self.rmb_vaddr,
            t2.link_id,
            t2.rmb_key,
            t2.rmb_vaddr,
            t3.link_id,
            t3.rmb_key,
            t3.rmb_vaddr,
        )

    @classmethod
    def _parse(cls, view: memoryview) -> Self:
        num, key, vaddr, l2, k2, v2, l3, k3, v3 = _CONFIRM_RKEY.unpack_from(view, 4)
        if num > 2:
            raise WireError(f"CONFIRM RKEY count of additional rtokens {num} > 2 (byte 4)")
        others = (
            Rtoken(link_id=l2, rmb_key=k2, rmb_vaddr=v2),
            Rtoken(link_id=l3, rmb_key=k3, rmb_vaddr=v3),
        )
        # unused rtoken slots are ignored (Linux reads only `num` of them)
        return cls(flags=view[3], rmb_key=key, rmb_vaddr=vaddr, other_rtokens=others[:num])


_CONFIRM_RKEY_CONT = struct.Struct(">B" + "BIQ" * 3)


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfirmRkeyCont(LlcMessage):
    """CONFIRM RKEY CONTINUATION (0x08): more rtokens for a CONFIRM RKEY (spec §3.7).

    Linux never sends it (at most 3 links fit one CONFIRM RKEY) and ignores
    it on receipt; it is decoded so that such a message from another peer
    is recognised, and encoded for completeness.

    :param flags: byte 3 (0x80 response).
    :param num_rkeys: byte 4, rtokens still to come including these (may exceed 3).
    :param rtokens: the rtokens in this message: exactly ``min(num_rkeys, 3)``.
    """

    TYPE: ClassVar[int] = LlcType.CONFIRM_RKEY_CONT

    flags: int = 0
    num_rkeys: int
    rtokens: tuple[Rtoken, ...] = ()

    def __post_init__(self) -> None:
        check_uint("flags", self.flags, 8)
        check_uint("num_rkeys", self.num_rkeys, 8)
        if len(self.rtokens) != min(self.num_rkeys, 3):
            raise ValueError(f"{len(self.rtokens)} rtokens for num_rkeys={self.num_rkeys}")

    def _body(self) -> bytes:
        t = (*self.rtokens, _ZERO_RTOKEN, _ZERO_RTOKEN, _ZERO_RTOKEN)[:3]
        return _CONFIRM_RKEY_CONT.pack(
            self.num_rkeys,
            t[0].link_id,
            t[0].rmb_key,
            t[0].rmb_vaddr,
            t[1].link_id,
            t[1].rmb_key,
            t[1].rmb_vaddr,
            t[2].link_id,
            t[2].rmb_key,
            t[2].rmb_vaddr,
        )

    @classmethod
    def _parse(cls, view: memoryview) -> Self:
        num, *rest = _CONFIRM_RKEY_CONT.unpack_from(view, 4)
        tokens = tuple(
            Rtoken(link_id=rest[i], rmb_key=rest[i + 1], rmb_vaddr=rest[i + 2])
            for i in range(0, 9, 3)
        )
        return cls(flags=view[3], num_rkeys=num, rtokens=tokens[: min(num, 3)])


_DELETE_RKEY = struct.Struct(">BBxx8I4x")
_DELETE_RKEY_MAX = 8


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteRkey(LlcMessage):
    """DELETE RKEY (0x09): withdraw RMB rkeys (spec §3.8).

    Linux sends one rkey when a connection's RMB is released
    (``smc_llc_send_delete_rkey``) and answers with the request echoed, flag
    0x80, and an error mask (``smc_llc_rmt_delete_rkey``).

    :param flags: byte 3: 0x80 response, 0x20 negative.
    :param err_mask: byte 5 (response): bit ``0x80 >> i`` set if rkey ``i`` was unknown.
    :param rkeys: 1-8 rkeys (bytes 8-39); byte 4 is their count.
    """

    TYPE: ClassVar[int] = LlcType.DELETE_RKEY

    flags: int = 0
    err_mask: int = 0
    rkeys: tuple[int, ...]

    def __post_init__(self) -> None:
        check_uint("flags", self.flags, 8)
        check_uint("err_mask", self.err_mask, 8)
        if not 1 <= len(self.rkeys) <= _DELETE_RKEY_MAX:
            raise ValueError(f"DELETE RKEY carries 1-8 rkeys, got {len(self.rkeys)}")
        for rkey in self.rkeys:
            check_uint("rkey", rkey, 32)

    def response(self, err_mask: int = 0) -> Self:
        """Return the response Linux sends: the request echoed with 0x80.

        Mirrors ``smc_llc_rmt_delete_rkey`` (v1): 0x20 and the error mask are
        added when some rkey was unknown; the rkeys are echoed.
        """
        flags = self.flags | LLC_FLAG_RESP
        if err_mask:
            flags |= LLC_FLAG_RKEY_NEG
        return replace(self, flags=flags, err_mask=err_mask)

    def _body(self) -> bytes:
        padded = (*self.rkeys, 0, 0, 0, 0, 0, 0, 0, 0)[:_DELETE_RKEY_MAX]
        return _DELETE_RKEY.pack(len(self.rkeys), self.err_mask, *padded)

    @classmethod
    def _parse(cls, view: memoryview) -> Self:
        num, err_mask, *rkeys = _DELETE_RKEY.unpack_from(view, 4)
        if not 1 <= num <= _DELETE_RKEY_MAX:
            raise WireError(f"DELETE RKEY count {num} not in 1..8 (byte 4)")
        # unused rkey slots are ignored (Linux reads only `num` of them)
        return cls(flags=view[3], err_mask=err_mask, rkeys=tuple(rkeys[:num]))


_TEST_LINK = struct.Struct(">16s24x")


@dataclass(frozen=True, slots=True, kw_only=True)
class TestLink(LlcMessage):
    """TEST LINK (0x07): keepalive, echoed by the peer with 0x80 (spec §3.9).

    Linux sends it after ``testlink_time`` (30 s) without receipt and downs
    the link if no response comes within 2 s (``smc_llc_testlink_work``).

    :param flags: byte 3 (0x80 response).
    :param user_data: 16 bytes, echoed (Linux sends zeros).
    """

    __test__: ClassVar[bool] = False  # not a pytest test class, despite its name

    TYPE: ClassVar[int] = LlcType.TEST_LINK

    flags: int = 0
    user_data: bytes = bytes(16)

    def __post_init__(self) -> None:
        check_uint("flags", self.flags, 8)
        check_bytes("user_data", self.user_data, 16)

    def response(self) -> Self:
        """Return the echo Linux sends: the request with 0x80 (``smc_llc_event_handler``)."""
        return replace(self, flags=self.flags | LLC_FLAG_RESP)

    def _body(self) -> bytes:
        return _TEST_LINK.pack(self.user_data)

    @classmethod
    def _parse(cls, view: memoryview) -> Self:
        (user_data,) = _TEST_LINK.unpack_from(view, 4)
        return cls(flags=view[3], user_data=user_data)
