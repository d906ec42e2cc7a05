"""The SMC-Rv2 LLC messages: byte 0 = ``0x20 | type``, 16-bit length (spec §9).

Design
------
SMC-Rv2 keeps the v1 LLC layouts and changes the header: byte 0 carries LLC
version 2 in its high nibble, bytes 1-2 are a 16-bit length (44..8192, Linux
``SMC_WR_BUF_V2_SIZE``), byte 3 the flags.  CONFIRM LINK, DELETE LINK,
CONFIRM RKEY and TEST LINK stay 44 bytes with the v1 body; they subclass the
v1 classes.  ADD LINK v2 appends the new link's rkeys (it replaces ADD LINK
CONTINUATION), DELETE RKEY v2 may carry more than 8 rkeys, and REQUEST ADD
LINK v2 exists only in v2.

Byte order ([DISCREPANCY], spec §9 and §10.7): Linux declares the v2 length
and the ADD LINK v2 rkey count as host-order ``u16``, so x86 Linux writes them
little-endian (the golden capture shows ``2c 00`` and ``58 00``) and s390
Linux big-endian; Wireshark reads them big-endian.  Every v2 message therefore
carries a ``byteorder`` field: encoders write in it (default
:data:`~smcr.wire.llc_v1.DEFAULT_BYTEORDER`, little-endian as x86 Linux), and
decoders accept a length that equals the message size in either order and
record the order found, so that a message re-encodes byte-identical and a
reply can use the peer's order where Linux echoes the header.  Where both
orders give the same bytes (a length like ``0x0C0C``), ``byteorder`` is
normalised to the default, so decode(encode(m)) == m holds.

Validation (:class:`~smcr.wire.errors.WireError`, no decline code): the type
byte; a size of 44..8192 that equals the length field in one of the two orders;
exactly 44 bytes for the fixed types; list counts that match the size.  Linux
itself only checks ``length_v2 >= 44`` (``smc_llc_rx_handler``); every Linux
sender writes the true size, and a list whose count disagrees with the size
cannot be re-sent faithfully, so we hold peers to the exact size.  Reserved
bytes are ignored on receive and sent as zeros, as in :mod:`smcr.wire.llc_v1`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace
from typing import ClassVar, Self

from smcr.wire.errors import WireError
from smcr.wire.llc_v1 import (
    DEFAULT_BYTEORDER,
    LLC_FLAG_ADD_LNK_REJ,
    LLC_FLAG_RESP,
    LLC_FLAG_RKEY_NEG,
    LLC_MSG_SIZE,
    LLC_V2_MAX_SIZE,
    Buffer,
    ByteOrder,
    ConfirmLink,
    ConfirmRkey,
    DeleteLink,
    LlcMessage,
    LlcType,
    RkeyPair,
    TestLink,
    _check_add_link,
    _check_type,
    _pack_add_link_body,
    _parse_add_link_body,
    _view,
)
from smcr.wire.validate import check_bytes, check_uint

__all__ = [
    "LLC_FLAG_ADD_LINK_V2_DIRECT",
    "AddLinkV2",
    "AddLinkV2Ext",
    "ConfirmLinkV2",
    "ConfirmRkeyV2",
    "DeleteLinkV2",
    "DeleteRkeyV2",
    "RequestAddLinkV2",
    "TestLinkV2",
]

LLC_FLAG_ADD_LINK_V2_DIRECT = 0x80
"""ADD LINK v2 extension byte 44: the new link needs no IP gateway (``v2_direct``)."""

_ORDERS: tuple[ByteOrder, ByteOrder] = ("little", "big")
_HDR_V2 = {"little": struct.Struct("<BHB"), "big": struct.Struct(">BHB")}


def _u16(view: memoryview, offset: int, order: ByteOrder) -> int:
    return int.from_bytes(view[offset : offset + 2], order)


def _check_order(order: str) -> None:
    if order not in _ORDERS:
        raise ValueError(f"byteorder must be 'little' or 'big', got {order!r}")


def _canonical_order(order: ByteOrder, *values: int) -> ByteOrder:
    """Return ``order``, or the default where every u16 in ``values`` reads alike both ways."""
    if all(v >> 8 == v & 0xFF for v in values):
        return DEFAULT_BYTEORDER
    return order


def _v2_view(data: Buffer, type_byte: int) -> tuple[memoryview, tuple[ByteOrder, ...]]:
    """Check type and size of a v2 LLC; return it and the orders its length matches in.

    :raises WireError: wrong type, size outside 44..8192, or a length field that
        equals the size in neither byte order.
    """
    view = _view(data)
    _check_type(view, type_byte)
    size = len(view)
    if not LLC_MSG_SIZE <= size <= LLC_V2_MAX_SIZE:
        raise WireError(f"v2 LLC message is {size} bytes, expected 44..8192")
    orders = tuple(o for o in _ORDERS if _u16(view, 1, o) == size)
    if not orders:
        raise WireError(f"v2 LLC length field {bytes(view[1:3]).hex()} does not match size {size}")
    return view, orders


class _LlcV2(LlcMessage):
    """What every v2 message has: the v2 header, its 16-bit length in ``byteorder``.

    The 44-byte types name this base first, then their v1 class (``class
    ConfirmLinkV2(_LlcV2, ConfirmLink)``), so that :meth:`_header` and
    :meth:`decode` here come before the v1 ones and the v1 body codec (``_body``,
    ``_parse``) is used as it is.  The types that carry a list (ADD LINK,
    DELETE RKEY, REQUEST ADD LINK) override :attr:`size`, :meth:`decode` and
    ``encode``, and end their own ``__post_init__`` with this one's (a slots
    dataclass cannot call ``super()`` without arguments).  Each dataclass
    declares the ``byteorder`` field.
    """

    __slots__ = ()

    byteorder: ByteOrder

    @property
    def size(self) -> int:
        """Size on the wire, the value of the length field."""
        return LLC_MSG_SIZE

    def _u16s(self) -> tuple[int, ...]:
        """The u16 fields written in ``byteorder``: the length (and a list's count)."""
        return (self.size,)

    def __post_init__(self) -> None:
        super().__post_init__()  # a 44-byte type's v1 checks
        _check_order(self.byteorder)
        object.__setattr__(self, "byteorder", _canonical_order(self.byteorder, *self._u16s()))

    def _header(self) -> bytes:
        return _HDR_V2[self.byteorder].pack(self.TYPE, self.size, self.flags)

    @classmethod
    def decode(cls, data: Buffer) -> Self:
        """Decode a 44-byte message of this type (its length in either byte order).

        :raises WireError: wrong type, a size other than 44, or a length field
            that is not 44 in either byte order.
        """
        view, orders = _v2_view(data, cls.TYPE)
        if len(view) != LLC_MSG_SIZE:
            raise WireError(f"v2 LLC type 0x{cls.TYPE:02x} is {len(view)} bytes, expected 44")
        msg = cls._parse(view)
        # set on the fresh message (nobody else holds it yet), as __post_init__ does
        object.__setattr__(msg, "byteorder", orders[0])
        return msg


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfirmLinkV2(_LlcV2, ConfirmLink):
    """CONFIRM LINK v2 (0x21): :class:`~smcr.wire.llc_v1.ConfirmLink` with a v2 header.

    Golden capture frame 11: ``21 2C 00 03`` …, max links 2, max conns 255.

    :param byteorder: byte order of the length field (module docstring).
    """

    TYPE: ClassVar[int] = LlcType.CONFIRM_LINK_V2

    byteorder: ByteOrder = DEFAULT_BYTEORDER


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteLinkV2(_LlcV2, DeleteLink):
    """DELETE LINK v2 (0x24): :class:`~smcr.wire.llc_v1.DeleteLink` with a v2 header.

    :meth:`response` keeps the request's ``byteorder``: Linux answers by
    setting 0x80 in the received message without rewriting its header.

    :param byteorder: byte order of the length field (module docstring).
    """

    TYPE: ClassVar[int] = LlcType.DELETE_LINK_V2

    byteorder: ByteOrder = DEFAULT_BYTEORDER


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfirmRkeyV2(_LlcV2, ConfirmRkey):
    """CONFIRM RKEY v2 (0x26): :class:`~smcr.wire.llc_v1.ConfirmRkey` with a v2 header.

    Golden capture frames 380/382: ``26 2C 00 00`` / ``26 2C 00 80``.

    :param byteorder: byte order of the length field (module docstring).
    """

    TYPE: ClassVar[int] = LlcType.CONFIRM_RKEY_V2

    byteorder: ByteOrder = DEFAULT_BYTEORDER

    def response(self, negative: bool = False, *, byteorder: ByteOrder = DEFAULT_BYTEORDER) -> Self:
        """Return the response Linux sends: the echo with 0x80, header rewritten.

        ``smc_llc_rmt_conf_rkey`` rewrites the header (``smc_llc_init_msg_hdr``),
        so the length is in the *responder's* byte order.

        :param negative: answer 0x80|0x20|0x10 (negative, retry).
        :param byteorder: the responder's byte order.
        """
        return replace(ConfirmRkey.response(self, negative), byteorder=byteorder)


@dataclass(frozen=True, slots=True, kw_only=True)
class TestLinkV2(_LlcV2, TestLink):
    """TEST LINK v2 (0x27): :class:`~smcr.wire.llc_v1.TestLink` with a v2 header.

    :meth:`response` keeps the request's ``byteorder``: Linux echoes the
    received message with 0x80 set and does not rewrite its header.

    :param byteorder: byte order of the length field (module docstring).
    """

    __test__: ClassVar[bool] = False

    TYPE: ClassVar[int] = LlcType.TEST_LINK_V2

    byteorder: ByteOrder = DEFAULT_BYTEORDER


# extension flags, reserved, client target GID, 8 reserved; then the u16 count
_ADD_LINK_EXT = struct.Struct(">Bx16s8x")
_ADD_LINK_EXT_SIZE = _ADD_LINK_EXT.size + 2  # 28
_ADD_LINK_V2_MIN = LLC_MSG_SIZE + _ADD_LINK_EXT_SIZE  # 72
_RKEY_PAIR = struct.Struct(">IIQ")
_ADD_LINK_V2_MAX_RKEYS = (LLC_V2_MAX_SIZE - _ADD_LINK_V2_MIN) // _RKEY_PAIR.size  # 507


@dataclass(frozen=True, slots=True, kw_only=True)
class AddLinkV2Ext:
    """The part an ADD LINK v2 appends at byte 44 (spec §9; ``smc_llc_msg_add_link_v2_ext``).

    :param direct: byte 44 bit 0x80, the new link needs no IP gateway
        (other bits reserved).
    :param client_target_gid: bytes 46-61; Linux writes the GID of the
        sender's new link.
    :param rkeys: one entry per RMB in use (bytes 72 on, 16 each); bytes 70-71
        are their count, in the message's byte order.
    """

    direct: bool = True
    client_target_gid: bytes
    rkeys: tuple[RkeyPair, ...] = ()

    def __post_init__(self) -> None:
        check_bytes("client_target_gid", self.client_target_gid, 16)
        if len(self.rkeys) > _ADD_LINK_V2_MAX_RKEYS:
            raise ValueError(f"ADD LINK v2 carries at most {_ADD_LINK_V2_MAX_RKEYS} rkeys")


@dataclass(frozen=True, slots=True, kw_only=True)
class AddLinkV2(_LlcV2):
    """ADD LINK v2 (0x22): ADD LINK with the new link's rkeys appended (spec §3.4, §9).

    A request or (accepting) response is 44 bytes of ADD LINK plus the
    extension, 72 + 16·n bytes (golden frame 15: 88 bytes).  A reject is only
    the first 44 bytes echoed, with the header rewritten (golden frame 17:
    ``22 2C 00 C0``): the v2 length overwrites byte 2, so no reject reason is
    visible.  Linux ``smc_llc_send_add_link``, ``smc_llc_fill_ext_v2``.

    :param flags: byte 3: 0x80 response, 0x40 rejected.
    :param sender_mac: MAC of the new link's RNIC port.
    :param sender_gid: GID of the new link's RNIC port.
    :param sender_qp_num: the sender's QP number for the new link (24 bits).
    :param link_num: the new link's id.
    :param qp_mtu: byte 32 low nibble, IB MTU enum.
    :param initial_psn: initial PSN of the new QP (24 bits).
    :param ext: the extension, or ``None`` for a 44-byte message (a reject).
    :param byteorder: byte order of the length and of the rkey count.
    """

    TYPE: ClassVar[int] = LlcType.ADD_LINK_V2

    flags: int = 0
    sender_mac: bytes
    sender_gid: bytes
    sender_qp_num: int = 0
    link_num: int = 0
    qp_mtu: int = 0
    initial_psn: int = 0
    ext: AddLinkV2Ext | None = None
    byteorder: ByteOrder = DEFAULT_BYTEORDER

    def __post_init__(self) -> None:
        _check_add_link(self)
        _LlcV2.__post_init__(self)

    def _u16s(self) -> tuple[int, ...]:
        """The length and, with the extension, the rkey count (bytes 70-71)."""
        return (self.size,) if self.ext is None else (self.size, len(self.ext.rkeys))

    @property
    def size(self) -> int:
        """Size on the wire, the value of the length field."""
        if self.ext is None:
            return LLC_MSG_SIZE
        return _ADD_LINK_V2_MIN + _RKEY_PAIR.size * len(self.ext.rkeys)

    @property
    def is_rejected(self) -> bool:
        """Whether flag 0x40 (reject) is set."""
        return bool(self.flags & LLC_FLAG_ADD_LNK_REJ)

    def reject(self, *, byteorder: ByteOrder = DEFAULT_BYTEORDER) -> Self:
        """Return the reject Linux sends: the first 44 bytes echoed with 0x80|0x40.

        Mirrors ``smc_llc_cli_add_link_reject`` on a v2 link group: the
        extension is dropped and the header rewritten with length 44 in the
        responder's byte order, which overwrites the reason nibble.

        :param byteorder: the responder's byte order.
        """
        flags = self.flags | LLC_FLAG_RESP | LLC_FLAG_ADD_LNK_REJ
        return replace(self, flags=flags, ext=None, byteorder=byteorder)

    def encode(self) -> bytes:
        """Return the 44 or 72 + 16·n bytes of this message."""
        base = self._header() + _pack_add_link_body(self)
        ext = self.ext
        if ext is None:
            return base
        return b"".join(
            (
                base,
                _ADD_LINK_EXT.pack(
                    LLC_FLAG_ADD_LINK_V2_DIRECT if ext.direct else 0, ext.client_target_gid
                ),
                len(ext.rkeys).to_bytes(2, self.byteorder),
                *(_RKEY_PAIR.pack(r.rmb_key, r.rmb_key_new, r.rmb_vaddr_new) for r in ext.rkeys),
            )
        )

    @classmethod
    def decode(cls, data: Buffer) -> Self:
        """Decode an ADD LINK v2 of 44 or 72 + 16·n bytes.

        :raises WireError: wrong type, a size that fits neither form, a length
            field that is not the size, or an rkey count (bytes 70-71) that does
            not match the number of entries (in the same byte order).
        """
        view, orders = _v2_view(data, cls.TYPE)
        size = len(view)
        ext = None
        if size != LLC_MSG_SIZE:
            n, rest = divmod(size - _ADD_LINK_V2_MIN, _RKEY_PAIR.size)
            if n < 0 or rest:
                raise WireError(f"ADD LINK v2 is {size} bytes, expected 44 or 72 + 16n")
            orders = tuple(o for o in orders if _u16(view, 70, o) == n)
            if not orders:
                count = bytes(view[70:72]).hex()
                raise WireError(f"ADD LINK v2 rkey count {count} does not match {n} entries")
            ext_flags, target_gid = _ADD_LINK_EXT.unpack_from(view, LLC_MSG_SIZE)
            rkeys = tuple(
                RkeyPair(rmb_key=k, rmb_key_new=kn, rmb_vaddr_new=va)
                for k, kn, va in _RKEY_PAIR.iter_unpack(view[_ADD_LINK_V2_MIN:])
            )
            # reserved bits of byte 44 and bytes 45, 62-69 are ignored (Linux reads none)
            ext = AddLinkV2Ext(
                direct=bool(ext_flags & LLC_FLAG_ADD_LINK_V2_DIRECT),
                client_target_gid=target_gid,
                rkeys=rkeys,
            )
        mac, gid, qpn, link_num, qp_mtu, psn = _parse_add_link_body(view)
        return cls(
            flags=view[3],
            sender_mac=mac,
            sender_gid=gid,
            sender_qp_num=qpn,
            link_num=link_num,
            qp_mtu=qp_mtu,
            initial_psn=psn,
            ext=ext,
            byteorder=orders[0],
        )


_DELETE_RKEY_V2_HEAD = struct.Struct(">BBxx")
_DELETE_RKEY_V2_MAX = 255  # the count is one byte (Linux SMC_LLC_RKEYS_PER_MSG_V2)


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteRkeyV2(_LlcV2):
    """DELETE RKEY v2 (0x29): withdraw rkeys; the list may pass 44 bytes (spec §3.8, §9).

    Request: count at byte 4, rkeys from byte 8, size max(44, 8 + 4·n) (Linux
    sends one rkey in 44 bytes).  Response, as Linux ``smc_llc_rmt_delete_rkey``
    builds it (golden frames 368/371): 44 bytes, the count echoed, byte 5 = the
    number of unknown rkeys (plus flag 0x20 if any), the rkey list zeroed.

    :param flags: byte 3: 0x80 response, 0x20 negative.
    :param num_rkeys: byte 4, the number of rkeys (request: 1-255, = ``len(rkeys)``).
    :param num_invalid: byte 5, the number of unknown rkeys (response).
    :param rkeys: the rkeys of a request; ``()`` in a response, whose list
        Linux zeroes and whose receiver ignores it.
    :param byteorder: byte order of the length field.
    """

    TYPE: ClassVar[int] = LlcType.DELETE_RKEY_V2

    flags: int = 0
    num_rkeys: int
    num_invalid: int = 0
    rkeys: tuple[int, ...] = ()
    byteorder: ByteOrder = DEFAULT_BYTEORDER

    def __post_init__(self) -> None:
        check_uint("flags", self.flags, 8)
        check_uint("num_rkeys", self.num_rkeys, 8)
        check_uint("num_invalid", self.num_invalid, 8)
        if self.is_response:
            if self.rkeys:
                raise ValueError("a DELETE RKEY v2 response carries no rkeys (Linux zeroes them)")
        elif not 1 <= self.num_rkeys == len(self.rkeys):
            raise ValueError(f"num_rkeys={self.num_rkeys} but {len(self.rkeys)} rkeys")
        for rkey in self.rkeys:
            check_uint("rkey", rkey, 32)
        _LlcV2.__post_init__(self)

    @classmethod
    def request(cls, rkeys: tuple[int, ...], *, byteorder: ByteOrder = DEFAULT_BYTEORDER) -> Self:
        """Build a request for ``rkeys`` (Linux ``smc_llc_send_delete_rkey``)."""
        return cls(num_rkeys=len(rkeys), rkeys=rkeys, byteorder=byteorder)

    @property
    def size(self) -> int:
        """Size on the wire, the value of the length field."""
        return max(LLC_MSG_SIZE, 8 + 4 * len(self.rkeys))

    def response(self, num_invalid: int = 0, *, byteorder: ByteOrder = DEFAULT_BYTEORDER) -> Self:
        """Return the response Linux sends (``smc_llc_rmt_delete_rkey``, v2 branch).

        :param num_invalid: how many of the rkeys were unknown (adds 0x20 if > 0).
        :param byteorder: the responder's byte order (Linux rewrites the header).
        """
        flags = self.flags | LLC_FLAG_RESP
        if num_invalid:
            flags |= LLC_FLAG_RKEY_NEG
        return replace(self, flags=flags, num_invalid=num_invalid, rkeys=(), byteorder=byteorder)

    def encode(self) -> bytes:
        """Return the bytes of this message (44, or 8 + 4·n for more than 9 rkeys)."""
        size = self.size
        head = self._header()
        body = _DELETE_RKEY_V2_HEAD.pack(self.num_rkeys, self.num_invalid)
        rkeys = struct.pack(f">{len(self.rkeys)}I", *self.rkeys)
        return b"".join((head, body, rkeys, bytes(size - 8 - len(rkeys))))

    @classmethod
    def decode(cls, data: Buffer) -> Self:
        """Decode a DELETE RKEY v2 request or response.

        :raises WireError: wrong type, a length field that is not the size, a
            request count of 0 or a size other than max(44, 8 + 4·count), a
            response that is not 44 bytes.
        """
        view, orders = _v2_view(data, cls.TYPE)
        size = len(view)
        flags = view[3]
        num, num_invalid = _DELETE_RKEY_V2_HEAD.unpack_from(view, 4)
        rkeys: tuple[int, ...] = ()
        if flags & LLC_FLAG_RESP:
            if size != LLC_MSG_SIZE:
                raise WireError(f"DELETE RKEY v2 response is {size} bytes, expected 44")
            # bytes 8-43 are ignored: Linux zeroes them and the requester reads none
        else:
            if num == 0:
                raise WireError("DELETE RKEY v2 request with no rkeys (byte 4)")
            if size != max(LLC_MSG_SIZE, 8 + 4 * num):
                raise WireError(f"DELETE RKEY v2 of {num} rkeys is {size} bytes")
            rkeys = struct.unpack_from(f">{num}I", view, 8)
            # unused slots of a 44-byte request are ignored (Linux reads `num` rkeys)
        return cls(
            flags=flags, num_rkeys=num, num_invalid=num_invalid, rkeys=rkeys, byteorder=orders[0]
        )


_REQ_ADD_LINK_HEAD = struct.Struct(">20xB3x")
_REQ_ADD_LINK_MIN = 4 + _REQ_ADD_LINK_HEAD.size  # 28
_GID_SIZE = 16


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestAddLinkV2(_LlcV2):
    """REQUEST ADD LINK v2 (0x25): the client asks the server to add a link (spec §9).

    Layout: header, 20 reserved, GID count (byte 24), 3 reserved, then the
    client's GIDs; size max(44, 28 + 16·n).  Linux sends it with two or more
    GIDs (``smc_llc_send_request_add_link``); the server's response is the
    request with 0x80, the header rewritten to length 44 and bytes 4-43
    zeroed (``smc_llc_send_req_add_link_response``), i.e. a count of 0.

    :param flags: byte 3 (0x80 response).
    :param gids: the client's RoCE GIDs (16 bytes each, at most 255).
    :param byteorder: byte order of the length field.
    """

    TYPE: ClassVar[int] = LlcType.REQ_ADD_LINK_V2

    flags: int = 0
    gids: tuple[bytes, ...] = ()
    byteorder: ByteOrder = DEFAULT_BYTEORDER

    def __post_init__(self) -> None:
        check_uint("flags", self.flags, 8)
        if len(self.gids) > 255:
            raise ValueError("REQUEST ADD LINK v2 carries at most 255 GIDs")
        for gid in self.gids:
            check_bytes("gid", gid, _GID_SIZE)
        _LlcV2.__post_init__(self)

    @property
    def size(self) -> int:
        """Size on the wire, the value of the length field."""
        return max(LLC_MSG_SIZE, _REQ_ADD_LINK_MIN + _GID_SIZE * len(self.gids))

    def response(self, *, byteorder: ByteOrder = DEFAULT_BYTEORDER) -> Self:
        """Return the response Linux sends: flags | 0x80, no GIDs, 44 bytes.

        :param byteorder: the responder's byte order (Linux rewrites the header).
        """
        return replace(self, flags=self.flags | LLC_FLAG_RESP, gids=(), byteorder=byteorder)

    def encode(self) -> bytes:
        """Return the bytes of this message."""
        size = self.size
        gids = b"".join(self.gids)
        return b"".join(
            (
                self._header(),
                _REQ_ADD_LINK_HEAD.pack(len(self.gids)),
                gids,
                bytes(size - _REQ_ADD_LINK_MIN - len(gids)),
            )
        )

    @classmethod
    def decode(cls, data: Buffer) -> Self:
        """Decode a REQUEST ADD LINK v2.

        :raises WireError: wrong type, a length field that is not the size, or a
            size other than max(44, 28 + 16·count).
        """
        view, orders = _v2_view(data, cls.TYPE)
        (count,) = _REQ_ADD_LINK_HEAD.unpack_from(view, 4)
        if len(view) != max(LLC_MSG_SIZE, _REQ_ADD_LINK_MIN + _GID_SIZE * count):
            raise WireError(f"REQUEST ADD LINK v2 with {count} GIDs is {len(view)} bytes")
        raw = bytes(view[_REQ_ADD_LINK_MIN : _REQ_ADD_LINK_MIN + _GID_SIZE * count])
        gids = tuple(raw[i : i + _GID_SIZE] for i in range(0, len(raw), _GID_SIZE))
        # reserved bytes 4-23, 25-27 and the padding of a 0-GID message are ignored
        return cls(flags=view[3], gids=gids, byteorder=orders[0])
