"""The CDC message: 44 bytes that announce cursors and flags (spec §4).

Design
------
Connection Data Control messages travel as RDMA SENDs on the link's RC QP.
After each RDMA WRITE of payload into the peer's RMBE, a CDC carries the new
*producer cursor*; after the application reads, a CDC carries the new
*consumer cursor* (the window update); the flag bytes carry write-blocked,
urgent data and the close/abort state.  Layout (Linux ``struct smc_cdc_msg``,
all big-endian)::

     0  type = 0xFE            1  length = 44        2  sequence number (u16)
     4  alert token (u32)
     8  reserved (2)          10  producer wrap (u16) 12  producer count (u32)
    16  reserved (2)          18  consumer wrap (u16) 20  consumer count (u32)
    24  producer flags        25  connection state flags
    26  reserved (18)

Reserved fields: Linux ignores the cursor reserved halfwords, the 18 trailing
bytes and the reserved flag bits on receive (``smcr_cdc_msg_to_host`` copies
only wrap/count and tests only the named bits), so :meth:`CdcMessage.decode`
accepts any value there and drops it, and :meth:`CdcMessage.encode` always
sends zeros (the ``x`` pad bytes of the struct, the masks of the flag enums).

What decode rejects (:class:`~smcr.wire.errors.WireError`, no decline code:
Linux drops a bad CDC silently, ``smc_cdc_rx_handler``): a buffer that is not
exactly 44 bytes, a type other than 0xFE, a length byte other than 44.  Linux
itself only drops receives shorter than 26 bytes and checks the length byte;
every conforming sender sends 44 bytes (``SMC_WR_TX_SIZE``), and a CDC that is
cut short has no reserved tail we could re-send, so we hold it to 44.

Hot path: one precompiled :class:`struct.Struct`; :meth:`CdcMessage.encode_into`
packs straight into a send slot, :meth:`CdcMessage.decode` unpacks straight from
a completion's memoryview.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, field
from typing import Final

from smcr.wire.cursor import Cursor
from smcr.wire.errors import WireError
from smcr.wire.validate import check_uint

__all__ = [
    "CDC",
    "CDC_CONN_STATE_FLAGS",
    "CDC_CONS_COUNT",
    "CDC_CONS_WRAP",
    "CDC_HDR_LENGTH",
    "CDC_HDR_TYPE",
    "CDC_MSG_LENGTH",
    "CDC_MSG_TYPE",
    "CDC_PROD_COUNT",
    "CDC_PROD_FLAGS",
    "CDC_PROD_WRAP",
    "CDC_SEQNO",
    "CDC_TOKEN",
    "CdcMessage",
    "ConnectionStateFlags",
    "ProducerFlags",
    "sequence_before",
]

CDC_MSG_TYPE: Final = 0xFE
"""Byte 0 of every CDC (Linux ``SMC_CDC_MSG_TYPE``)."""
CDC_MSG_LENGTH: Final = 44
"""Byte 1 of every CDC and its size on the wire (Linux ``SMC_WR_TX_SIZE``)."""

_SEQNO_LIMIT: Final = 1 << 16


class ProducerFlags(enum.IntFlag):
    """Producer flags, byte 24 (spec §4; Linux ``smc_cdc_producer_flags``)."""

    WRITE_BLOCKED = 0x80
    """The sender had at least as much data as free space in our RMBE."""
    URGENT_DATA_PENDING = 0x40
    """An out-of-band send is outstanding."""
    URGENT_DATA_PRESENT = 0x20
    """The byte just before the producer cursor is the urgent byte."""
    CONSUMER_CURSOR_UPDATE_REQUESTED = 0x10
    """Please send your consumer cursor (Linux never sets it)."""
    FAILOVER_VALIDATION = 0x08
    """Failover validation CDC (spec §4, :meth:`CdcMessage.failover_validation`)."""


class ConnectionStateFlags(enum.IntFlag):
    """Connection state flags, byte 25 (spec §4; Linux ``smc_cdc_conn_state_flags``).

    Sticky: once set, every later CDC of the connection carries them.
    """

    PEER_DONE_WRITING = 0x80
    """The sender has shut down writing (Linux ``peer_done_writing``)."""
    PEER_CONNECTION_CLOSED = 0x40
    """The sender closed the connection (Linux ``peer_conn_closed``)."""
    PEER_CONNECTION_ABORT = 0x20
    """The sender aborted: abnormal close (Linux ``peer_conn_abort``)."""


# Bits 0x07 of byte 24 and 0x1F of byte 25 are reserved: masked off on decode.
_PRODUCER_FLAGS_MASK: Final = int(
    ProducerFlags.WRITE_BLOCKED
    | ProducerFlags.URGENT_DATA_PENDING
    | ProducerFlags.URGENT_DATA_PRESENT
    | ProducerFlags.CONSUMER_CURSOR_UPDATE_REQUESTED
    | ProducerFlags.FAILOVER_VALIDATION
)
_CONNECTION_STATE_FLAGS_MASK: Final = int(
    ConnectionStateFlags.PEER_DONE_WRITING
    | ConnectionStateFlags.PEER_CONNECTION_CLOSED
    | ConnectionStateFlags.PEER_CONNECTION_ABORT
)

_NO_PRODUCER_FLAGS: Final = ProducerFlags(0)
_NO_CONNECTION_STATE_FLAGS: Final = ConnectionStateFlags(0)
# Flag byte -> flags with the reserved bits dropped: a lookup instead of an
# enum construction per received CDC.
_PRODUCER_FLAGS_BY_BYTE: Final = tuple(ProducerFlags(b & _PRODUCER_FLAGS_MASK) for b in range(256))
_CONNECTION_STATE_FLAGS_BY_BYTE: Final = tuple(
    ConnectionStateFlags(b & _CONNECTION_STATE_FLAGS_MASK) for b in range(256)
)

CDC: Final = struct.Struct(">BBHI2xHI2xHIBB18x")
"""The CDC layout (Linux ``struct smc_cdc_msg``), the one definition of it.

Fields in order, at the indices below: type, length, seqno, token, [2x] prod wrap,
prod count, [2x] cons wrap, cons count, producer flags, connection state flags,
[18x].  The pad bytes are skipped on unpack (any value accepted) and written as
zeros on pack.  The data path (:mod:`smcr.core.connection`, :mod:`smcr.core.llc`)
packs and unpacks it with plain ints, without :class:`CdcMessage`'s enums and
cursors; it indexes the unpacked tuple with these names (module-level ``Final``
ints, which the compiled build inlines).
"""
CDC_HDR_TYPE: Final = 0
"""Index of the type byte (:data:`CDC_MSG_TYPE`) in :data:`CDC`'s tuple."""
CDC_HDR_LENGTH: Final = 1
"""Index of the length byte (:data:`CDC_MSG_LENGTH`)."""
CDC_SEQNO: Final = 2
"""Index of the sequence number (u16)."""
CDC_TOKEN: Final = 3
"""Index of the alert token (u32, the receiver's)."""
CDC_PROD_WRAP: Final = 4
"""Index of the producer cursor's wrap (u16)."""
CDC_PROD_COUNT: Final = 5
"""Index of the producer cursor's count (u32)."""
CDC_CONS_WRAP: Final = 6
"""Index of the consumer cursor's wrap (u16)."""
CDC_CONS_COUNT: Final = 7
"""Index of the consumer cursor's count (u32)."""
CDC_PROD_FLAGS: Final = 8
"""Index of the producer flags byte (:class:`ProducerFlags`)."""
CDC_CONN_STATE_FLAGS: Final = 9
"""Index of the connection state flags byte (:class:`ConnectionStateFlags`)."""
assert CDC.size == CDC_MSG_LENGTH


def cdc_token(message: bytes) -> int:
    """The alert token a CDC message is for; 0 for any other message (an LLC message)."""
    if len(message) != CDC.size or message[0] != CDC_MSG_TYPE:
        return 0
    return int.from_bytes(message[4:8], "big")


def sequence_before(seq1: int, seq2: int) -> bool:
    """Whether u16 sequence number ``seq1`` comes before ``seq2``.

    Linux ``smc_cdc_before``: ``(s16)(seq1 - seq2) < 0``, i.e. serial-number
    arithmetic on 16 bits.  The receiver drops a CDC whose sequence number is
    before the last one it took (spec §4); a failover validation CDC whose
    sequence number is *not* before-or-equal the last one received (i.e.
    ``sequence_before(last_received, seq)``) aborts the connection
    (``smc_cdc_msg_validate``).

    :param seq1: a sequence number, 0..65535.
    :param seq2: another sequence number, 0..65535.
    :returns: ``True`` if ``seq1`` is before ``seq2``.
    """
    return (seq1 - seq2) % _SEQNO_LIMIT >= _SEQNO_LIMIT // 2


@dataclass(frozen=True, slots=True)
class CdcMessage:
    """A CDC message (spec §4; Linux ``struct smc_cdc_msg``).

    :param sequence_number: per-connection u16, the first CDC is 1.
    :param alert_token: the *receiver's* token (u32), learned from its CLC
        Accept/Confirm; the receiver finds the connection by it.
    :param producer_cursor: how far the sender has written into the receiver's
        RMBE.
    :param consumer_cursor: how far the sender has consumed its own RMBE (the
        window update for the peer).
    :param producer_flags: byte 24.
    :param connection_state_flags: byte 25.
    :raises ValueError: if ``sequence_number`` is not a u16 or ``alert_token``
        not a u32 (a programming error; decode never builds such a message).
    """

    sequence_number: int
    alert_token: int
    producer_cursor: Cursor = field(default_factory=Cursor)
    consumer_cursor: Cursor = field(default_factory=Cursor)
    producer_flags: ProducerFlags = _NO_PRODUCER_FLAGS
    connection_state_flags: ConnectionStateFlags = _NO_CONNECTION_STATE_FLAGS

    def __post_init__(self) -> None:
        check_uint("CDC sequence_number", self.sequence_number, 16)
        check_uint("CDC alert_token", self.alert_token, 32)

    @classmethod
    def failover_validation(cls, sequence_number: int, alert_token: int) -> CdcMessage:
        """Build the failover validation CDC (spec §4).

        After moving a connection to another link, Linux
        (``smcr_cdc_msg_send_validation``) sends a CDC carrying only type,
        length, the token, the *failover validation* flag and the sequence
        number of the last CDC whose send completed; cursors are zero.

        :param sequence_number: sequence number of the last CDC sent and
            completed on the old link.
        :param alert_token: the peer's alert token for the connection.
        :returns: the message.
        """
        return cls(
            sequence_number=sequence_number,
            alert_token=alert_token,
            producer_flags=ProducerFlags.FAILOVER_VALIDATION,
        )

    def _fields(self) -> tuple[int, ...]:
        prod = self.producer_cursor
        cons = self.consumer_cursor
        return (
            CDC_MSG_TYPE,
            CDC_MSG_LENGTH,
            self.sequence_number,
            self.alert_token,
            prod.wrap,
            prod.count,
            cons.wrap,
            cons.count,
            int(self.producer_flags) & _PRODUCER_FLAGS_MASK,
            int(self.connection_state_flags) & _CONNECTION_STATE_FLAGS_MASK,
        )

    def encode(self) -> bytes:
        """Return the 44 bytes of the message, reserved fields zero.

        :returns: the wire bytes.
        """
        return CDC.pack(*self._fields())

    def encode_into(self, buf: bytearray | memoryview, offset: int = 0) -> None:
        """Write the 44 bytes of the message into ``buf`` at ``offset``.

        For filling a send slot in place (Linux ``smc_wr_tx_get_free_slot``
        hands out the slot buffer); the reserved bytes are written as zeros.

        :param buf: a writable buffer with at least ``offset + 44`` bytes.
        :param offset: where the message starts in ``buf``.
        :raises struct.error: if ``buf`` is too small.
        """
        CDC.pack_into(buf, offset, *self._fields())

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview) -> CdcMessage:
        """Parse one CDC message; reserved fields may hold anything.

        :param data: exactly the 44 bytes of one message (e.g. a memoryview
            of a receive completion's buffer, sliced to its byte length).
        :returns: the message, with reserved flag bits cleared.
        :raises WireError: if ``data`` is not 44 bytes, or its type byte is not
            0xFE, or its length byte not 44.
        """
        if len(data) != CDC_MSG_LENGTH:
            raise WireError(f"CDC message is {len(data)} bytes, not {CDC_MSG_LENGTH}")
        (
            msg_type,
            length,
            sequence_number,
            alert_token,
            prod_wrap,
            prod_count,
            cons_wrap,
            cons_count,
            producer_flags,
            connection_state_flags,
        ) = CDC.unpack_from(data)
        if msg_type != CDC_MSG_TYPE:
            raise WireError(f"CDC type byte at 0 is 0x{msg_type:02X}, not 0xFE")
        if length != CDC_MSG_LENGTH:
            raise WireError(f"CDC length byte at 1 is {length}, not {CDC_MSG_LENGTH}")
        return cls(
            sequence_number=sequence_number,
            alert_token=alert_token,
            producer_cursor=Cursor(prod_wrap, prod_count),
            consumer_cursor=Cursor(cons_wrap, cons_count),
            producer_flags=_PRODUCER_FLAGS_BY_BYTE[producer_flags],
            connection_state_flags=_CONNECTION_STATE_FLAGS_BY_BYTE[connection_state_flags],
        )
