"""LLC (Link Layer Control) messages, v1 and SMC-Rv2: the public face (spec §3, §9).

Design
------
The codecs live in :mod:`smcr.wire.llc_v1` (the 44-byte v1 messages, flag
masks, reason codes) and :mod:`smcr.wire.llc_v2` (the v2 variants, with the
host-byte-order length); this module re-exports them and adds
:func:`decode_llc`, which dispatches on byte 0 as Linux ``smc_wr_rx_demultiplex``
does.  Linux registers LLC handlers for 0x01-0x04, 0x06-0x09 and 0x21, 0x22,
0x24-0x27, 0x29 (``smc_llc_rx_handlers``) and drops a SEND with any other
first byte; 0xFE is a CDC message (:mod:`smcr.wire.cdc`) and is refused here.
"""

from __future__ import annotations

from typing import Final

from smcr.wire.cdc import CDC_MSG_TYPE
from smcr.wire.errors import WireError
from smcr.wire.llc_v1 import (
    DEFAULT_BYTEORDER,
    LLC_FLAG_ADD_LNK_REJ,
    LLC_FLAG_DEL_LINK_ALL,
    LLC_FLAG_DEL_LINK_ORDERLY,
    LLC_FLAG_NO_RMBE_EYEC,
    LLC_FLAG_RESP,
    LLC_FLAG_RKEY_NEG,
    LLC_FLAG_RKEY_RETRY,
    LLC_MSG_SIZE,
    LLC_REJ_RSN_NO_ALT_PATH,
    LLC_V2_MAX_SIZE,
    AddLink,
    AddLinkCont,
    Buffer,
    ByteOrder,
    ConfirmLink,
    ConfirmRkey,
    ConfirmRkeyCont,
    DeleteLink,
    DeleteLinkReason,
    DeleteRkey,
    LlcMessage,
    LlcType,
    RkeyPair,
    Rtoken,
    TestLink,
    _view,
)
from smcr.wire.llc_v2 import (
    LLC_FLAG_ADD_LINK_V2_DIRECT,
    AddLinkV2,
    AddLinkV2Ext,
    ConfirmLinkV2,
    ConfirmRkeyV2,
    DeleteLinkV2,
    DeleteRkeyV2,
    RequestAddLinkV2,
    TestLinkV2,
)

__all__ = [
    "CDC_TYPE_BYTE",
    "DEFAULT_BYTEORDER",
    "LLC_CLASSES",
    "LLC_FLAG_ADD_LINK_V2_DIRECT",
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
    "AddLinkV2",
    "AddLinkV2Ext",
    "Buffer",
    "ByteOrder",
    "ConfirmLink",
    "ConfirmLinkV2",
    "ConfirmRkey",
    "ConfirmRkeyCont",
    "ConfirmRkeyV2",
    "DeleteLink",
    "DeleteLinkReason",
    "DeleteLinkV2",
    "DeleteRkey",
    "DeleteRkeyV2",
    "LlcMessage",
    "LlcType",
    "RequestAddLinkV2",
    "RkeyPair",
    "Rtoken",
    "TestLink",
    "TestLinkV2",
    "decode_llc",
]

CDC_TYPE_BYTE: Final = CDC_MSG_TYPE
"""Byte 0 of a CDC message, which shares the QP with LLC (spec §4; :mod:`smcr.wire.cdc`)."""

LLC_CLASSES: dict[int, type[LlcMessage]] = {
    cls.TYPE: cls
    for cls in (
        ConfirmLink,
        AddLink,
        AddLinkCont,
        DeleteLink,
        ConfirmRkey,
        TestLink,
        ConfirmRkeyCont,
        DeleteRkey,
        ConfirmLinkV2,
        AddLinkV2,
        DeleteLinkV2,
        RequestAddLinkV2,
        ConfirmRkeyV2,
        TestLinkV2,
        DeleteRkeyV2,
    )
}
"""Byte 0 -> codec class, for every type Linux accepts (``smc_llc_rx_handlers``)."""


def decode_llc(data: Buffer) -> LlcMessage:
    """Decode one LLC message of any type, v1 or v2, choosing the codec by byte 0.

    :param data: the received bytes of exactly one message (the completion's
        byte length, not the whole receive slot).
    :returns: an instance of the class in :data:`LLC_CLASSES` for byte 0.
    :raises WireError: an empty buffer, a type Linux does not accept (including
        v1 0x05, 0xFE = CDC), or whatever the type's decoder refuses.
    """
    view = _view(data)
    if not view:
        raise WireError("empty LLC message")
    type_byte = view[0]
    cls = LLC_CLASSES.get(type_byte)
    if cls is None:
        if type_byte == CDC_TYPE_BYTE:
            raise WireError("type 0xfe is a CDC message, not LLC")
        raise WireError(f"unknown LLC type 0x{type_byte:02x}")
    return cls.decode(view)
