"""Tests for smcr.wire.cdc: the 44-byte CDC message (spec §4, §9a, §9b)."""

from __future__ import annotations

import dataclasses
import itertools
import re
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from smcr.wire.cdc import (
    CDC,
    CDC_CONN_STATE_FLAGS,
    CDC_CONS_COUNT,
    CDC_CONS_WRAP,
    CDC_HDR_LENGTH,
    CDC_HDR_TYPE,
    CDC_MSG_LENGTH,
    CDC_MSG_TYPE,
    CDC_PROD_COUNT,
    CDC_PROD_FLAGS,
    CDC_PROD_WRAP,
    CDC_SEQNO,
    CDC_TOKEN,
    CdcMessage,
    ConnectionStateFlags,
    ProducerFlags,
    sequence_before,
)
from smcr.wire.cursor import Cursor
from smcr.wire.errors import WireError
from tests.support import FUZZ_EXAMPLES, LINUX_DECODED

GOLDEN_DECODED = LINUX_DECODED

# Frame 19 of the golden capture: the first CDC of the first connection (spec §9b).
FIRST_CDC = bytes.fromhex(
    "fe2c000100000001000000000000001c00000000000000000000000000000000000000000000000000000000"
)

_FLAG_NAMES: dict[str, ProducerFlags | ConnectionStateFlags] = {
    "write_blocked": ProducerFlags.WRITE_BLOCKED,
    "urg_data_pending": ProducerFlags.URGENT_DATA_PENDING,
    "urg_data_present": ProducerFlags.URGENT_DATA_PRESENT,
    "cons_curs_upd_req": ProducerFlags.CONSUMER_CURSOR_UPDATE_REQUESTED,
    "failover_validation": ProducerFlags.FAILOVER_VALIDATION,
    "peer_done_writing": ConnectionStateFlags.PEER_DONE_WRITING,
    "peer_conn_closed": ConnectionStateFlags.PEER_CONNECTION_CLOSED,
    "peer_conn_abort": ConnectionStateFlags.PEER_CONNECTION_ABORT,
}

_CDC_LINE = re.compile(
    r"CDC len=(?P<len>\d+) seq=(?P<seq>\d+) token=0x(?P<token>[0-9a-f]+) "
    r"prod=(?P<pw>\d+):(?P<pc>\d+) cons=(?P<cw>\d+):(?P<cc>\d+) flags=\[(?P<flags>[^\]]*)\]"
)


def golden_cdcs() -> list[tuple[dict[str, str], bytes]]:
    """(fields printed on the CDC line, raw bytes on the next line) for each CDC."""
    lines = GOLDEN_DECODED.read_text().splitlines()
    cases = []
    for line, following in itertools.pairwise(lines):
        match = _CDC_LINE.search(line)
        if match:
            raw = following.strip()
            assert raw.startswith("raw: "), following
            cases.append((match.groupdict(), bytes.fromhex(raw.removeprefix("raw: "))))
    return cases


def expected_message(fields: dict[str, str]) -> CdcMessage:
    producer_flags = ProducerFlags(0)
    state_flags = ConnectionStateFlags(0)
    for name in filter(None, fields["flags"].split(",")):
        flag = _FLAG_NAMES[name]
        if isinstance(flag, ProducerFlags):
            producer_flags |= flag
        else:
            state_flags |= flag
    return CdcMessage(
        sequence_number=int(fields["seq"]),
        alert_token=int(fields["token"], 16),
        producer_cursor=Cursor(int(fields["pw"]), int(fields["pc"])),
        consumer_cursor=Cursor(int(fields["cw"]), int(fields["cc"])),
        producer_flags=producer_flags,
        connection_state_flags=state_flags,
    )


# --- golden -------------------------------------------------------------------------


def test_golden_every_cdc_decodes_and_reencodes() -> None:
    cases = golden_cdcs()
    assert len(cases) == 20  # two connections, both directions
    for fields, raw in cases:
        assert int(fields["len"]) == len(raw) == CDC_MSG_LENGTH
        message = CdcMessage.decode(raw)
        assert message == expected_message(fields), fields
        assert message.encode() == raw
        assert CdcMessage.decode(memoryview(raw)) == message


def test_golden_first_cdc_spec_9b() -> None:
    # Frame 19: seqno 1, token 1, producer 0:28 (spec §9b, §9a "first CDC").
    assert FIRST_CDC[:4] == bytes.fromhex("fe2c0001")
    message = CdcMessage.decode(FIRST_CDC)
    assert message == CdcMessage(sequence_number=1, alert_token=1, producer_cursor=Cursor(0, 28))
    assert message.consumer_cursor == Cursor(0, 0)
    assert message.producer_flags == ProducerFlags(0)
    assert message.connection_state_flags == ConnectionStateFlags(0)
    assert message.encode() == FIRST_CDC


def test_golden_write_blocked_wrap() -> None:
    # Frame 93: producer wrap 1 count 28, write blocked (spec §9b).
    raw = bytes.fromhex(
        "fe2c000200000001000000010000001c000000000000001b8000000000000000000000000000000000000000"
    )
    message = CdcMessage.decode(raw)
    assert message.producer_cursor == Cursor(1, 28)
    assert message.consumer_cursor == Cursor(0, 27)
    assert message.producer_flags == ProducerFlags.WRITE_BLOCKED
    assert message.encode() == raw


@pytest.mark.parametrize(
    ("flag", "byte25"),
    [
        (ConnectionStateFlags.PEER_CONNECTION_CLOSED, 0x40),
        (ConnectionStateFlags.PEER_DONE_WRITING, 0x80),
        (ConnectionStateFlags.PEER_CONNECTION_ABORT, 0x20),
    ],
)
def test_close_bytes_spec_9a(flag: ConnectionStateFlags, byte25: int) -> None:
    message = CdcMessage(sequence_number=8, alert_token=1, connection_state_flags=flag)
    raw = message.encode()
    assert raw[25] == byte25
    assert raw[24] == 0
    assert CdcMessage.decode(raw).connection_state_flags == flag


@pytest.mark.parametrize(
    ("flag", "byte24"),
    [
        (ProducerFlags.WRITE_BLOCKED, 0x80),
        (ProducerFlags.URGENT_DATA_PENDING, 0x40),
        (ProducerFlags.URGENT_DATA_PRESENT, 0x20),
        (ProducerFlags.CONSUMER_CURSOR_UPDATE_REQUESTED, 0x10),
        (ProducerFlags.FAILOVER_VALIDATION, 0x08),
    ],
)
def test_producer_flag_bits(flag: ProducerFlags, byte24: int) -> None:
    raw = CdcMessage(sequence_number=1, alert_token=1, producer_flags=flag).encode()
    assert raw[24] == byte24
    assert raw[25] == 0


# --- layout --------------------------------------------------------------------------


def test_field_offsets() -> None:
    message = CdcMessage(
        sequence_number=0x1234,
        alert_token=0xA1B2C3D4,
        producer_cursor=Cursor(0x0102, 0x03040506),
        consumer_cursor=Cursor(0x0708, 0x090A0B0C),
        producer_flags=ProducerFlags.WRITE_BLOCKED | ProducerFlags.URGENT_DATA_PRESENT,
        connection_state_flags=ConnectionStateFlags.PEER_DONE_WRITING,
    )
    raw = message.encode()
    assert len(raw) == CDC_MSG_LENGTH
    assert raw.hex() == ("fe2c1234a1b2c3d4000001020304050600000708090a0b0ca080" + "00" * 18)


def test_named_indices_of_the_unpacked_layout() -> None:
    """The data path reads CDC.unpack's tuple by these names: each is the field it says."""
    message = CdcMessage(
        sequence_number=0x1234,
        alert_token=0xA1B2C3D4,
        producer_cursor=Cursor(0x0102, 0x03040506),
        consumer_cursor=Cursor(0x0708, 0x090A0B0C),
        producer_flags=ProducerFlags.WRITE_BLOCKED,
        connection_state_flags=ConnectionStateFlags.PEER_DONE_WRITING,
    )
    f = CDC.unpack(message.encode())
    assert len(f) == 10
    assert (f[CDC_HDR_TYPE], f[CDC_HDR_LENGTH]) == (CDC_MSG_TYPE, CDC_MSG_LENGTH)
    assert (f[CDC_SEQNO], f[CDC_TOKEN]) == (0x1234, 0xA1B2C3D4)
    assert (f[CDC_PROD_WRAP], f[CDC_PROD_COUNT]) == (0x0102, 0x03040506)
    assert (f[CDC_CONS_WRAP], f[CDC_CONS_COUNT]) == (0x0708, 0x090A0B0C)
    assert f[CDC_PROD_FLAGS] == ProducerFlags.WRITE_BLOCKED
    assert f[CDC_CONN_STATE_FLAGS] == ConnectionStateFlags.PEER_DONE_WRITING


def test_failover_validation_message() -> None:
    message = CdcMessage.failover_validation(0xBEEF, 0x01020304)
    raw = message.encode()
    assert raw == bytes.fromhex("fe2cbeef01020304") + b"\x00" * 16 + b"\x08" + b"\x00" * 19
    assert CdcMessage.decode(raw) == message
    assert message.producer_cursor == message.consumer_cursor == Cursor(0, 0)


def test_encode_into_writes_zero_reserved_in_place() -> None:
    message = CdcMessage.decode(FIRST_CDC)
    slot = bytearray(b"\xff" * 100)
    message.encode_into(slot, 7)
    assert bytes(slot[7:51]) == FIRST_CDC
    assert slot[:7] == b"\xff" * 7
    assert slot[51:] == b"\xff" * 49
    view = memoryview(bytearray(44))
    message.encode_into(view)
    assert bytes(view) == FIRST_CDC
    with pytest.raises(struct.error):
        message.encode_into(bytearray(43))


def test_decode_from_memoryview_slice() -> None:
    buf = bytearray(b"\x00" * 10 + FIRST_CDC + b"\x99" * 4)
    assert CdcMessage.decode(memoryview(buf)[10:54]).encode() == FIRST_CDC


def test_reserved_accepted_on_decode_zeroed_on_encode() -> None:
    raw = bytearray(FIRST_CDC)
    raw[8:10] = b"\xaa\xbb"  # producer cursor reserved
    raw[16:18] = b"\xcc\xdd"  # consumer cursor reserved
    raw[24] |= 0x07  # reserved producer flag bits
    raw[25] |= 0x1F  # reserved connection state bits
    raw[26:44] = b"\xee" * 18  # trailing reserved
    message = CdcMessage.decode(bytes(raw))
    assert message == CdcMessage.decode(FIRST_CDC)
    assert message.encode() == FIRST_CDC


def test_flags_out_of_range_are_masked_on_encode() -> None:
    message = CdcMessage(
        sequence_number=1,
        alert_token=1,
        producer_flags=ProducerFlags(0xFF),
        connection_state_flags=ConnectionStateFlags(0xFF),
    )
    raw = message.encode()
    assert raw[24] == 0xF8
    assert raw[25] == 0xE0


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "empty"),
        (FIRST_CDC[:43], "short"),
        (FIRST_CDC[:26], "Linux minimum, still short"),
        (FIRST_CDC + b"\x00", "long"),
        (b"\xfd" + FIRST_CDC[1:], "type"),
        (b"\x01" + FIRST_CDC[1:], "LLC type"),
        (FIRST_CDC[:1] + b"\x2b" + FIRST_CDC[2:], "length byte"),
        (FIRST_CDC[:1] + b"\x58" + FIRST_CDC[2:], "v2 LLC length byte"),
    ],
)
def test_decode_rejects(data: bytes, why: str) -> None:
    with pytest.raises(WireError):
        CdcMessage.decode(data)


@pytest.mark.parametrize(
    ("sequence_number", "alert_token"), [(-1, 1), (65536, 1), (1, -1), (1, 1 << 32)]
)
def test_constructor_rejects_out_of_range(sequence_number: int, alert_token: int) -> None:
    with pytest.raises(ValueError):
        CdcMessage(sequence_number=sequence_number, alert_token=alert_token)


def test_immutable() -> None:
    message = CdcMessage.decode(FIRST_CDC)
    with pytest.raises(dataclasses.FrozenInstanceError):
        message.sequence_number = 2  # type: ignore[misc]


def test_constants() -> None:
    assert CDC_MSG_TYPE == 0xFE
    assert CDC_MSG_LENGTH == 44


# --- sequence numbers (smc_cdc_before) --------------------------------------------------------


def test_sequence_before_examples() -> None:
    assert sequence_before(1, 2)
    assert not sequence_before(2, 1)
    assert not sequence_before(5, 5)
    assert sequence_before(0xFFFF, 0)  # across the u16 wrap
    assert not sequence_before(0, 0xFFFF)
    assert sequence_before(0, 0x7FFF)
    # Exactly half the space apart: (s16)0x8000 < 0 either way round.
    assert sequence_before(0, 0x8000)
    assert sequence_before(0x8000, 0)


@given(st.integers(0, 0xFFFF), st.integers(0, 0xFFFF))
def test_sequence_before_is_signed_16_bit_difference(seq1: int, seq2: int) -> None:
    diff = struct.unpack(">h", struct.pack(">H", (seq1 - seq2) & 0xFFFF))[0]
    assert sequence_before(seq1, seq2) is (diff < 0)


@given(st.integers(0, 0xFFFF), st.integers(1, 0x7FFF))
def test_sequence_before_following(seq: int, ahead: int) -> None:
    later = (seq + ahead) & 0xFFFF
    assert sequence_before(seq, later)
    assert not sequence_before(later, seq)


# --- property tests ------------------------------------------------------------------------

cursors = st.builds(Cursor, st.integers(0, 0xFFFF), st.integers(0, (1 << 32) - 1))
messages = st.builds(
    CdcMessage,
    sequence_number=st.integers(0, 0xFFFF),
    alert_token=st.integers(0, (1 << 32) - 1),
    producer_cursor=cursors,
    consumer_cursor=cursors,
    producer_flags=st.sampled_from(ProducerFlags).map(ProducerFlags)
    | st.integers(0, 0xFF).map(lambda bits: ProducerFlags(bits & 0xF8)),
    connection_state_flags=st.integers(0, 0xFF).map(lambda bits: ConnectionStateFlags(bits & 0xE0)),
)


@given(messages)
def test_round_trip(message: CdcMessage) -> None:
    raw = message.encode()
    assert len(raw) == CDC_MSG_LENGTH
    assert CdcMessage.decode(raw) == message
    assert CdcMessage.decode(raw).encode() == raw
    slot = bytearray(CDC_MSG_LENGTH)
    message.encode_into(slot)
    assert bytes(slot) == raw


@given(
    st.integers(0, 0xFFFF),
    st.integers(0, (1 << 32) - 1),
    st.tuples(st.integers(0, 0xFFFF), st.integers(0, (1 << 32) - 1)),
    st.tuples(st.integers(0, 0xFFFF), st.integers(0, (1 << 32) - 1)),
    st.integers(0, 0x1F),
    st.integers(0, 0x07),
)
def test_canonical_bytes_round_trip(
    seq: int,
    token: int,
    prod: tuple[int, int],
    cons: tuple[int, int],
    prod_bits: int,
    state_bits: int,
) -> None:
    # Bytes built independently of the encoder (reserved zero): encode(decode(b)) == b.
    raw = (
        struct.pack(">BBHI", 0xFE, 44, seq, token)
        + struct.pack(">HHI", 0, *prod)
        + struct.pack(">HHI", 0, *cons)
        + bytes((prod_bits << 3, state_bits << 5))
        + bytes(18)
    )
    message = CdcMessage.decode(raw)
    assert message.sequence_number == seq
    assert message.alert_token == token
    assert message.producer_cursor == Cursor(*prod)
    assert message.consumer_cursor == Cursor(*cons)
    assert int(message.producer_flags) == prod_bits << 3
    assert int(message.connection_state_flags) == state_bits << 5
    assert message.encode() == raw


@given(
    messages,
    st.binary(min_size=18, max_size=18),
    st.binary(min_size=4, max_size=4),
    st.integers(0, 0x07),
    st.integers(0, 0x1F),
)
def test_any_reserved_decodes_same(
    message: CdcMessage, tail: bytes, cursor_reserved: bytes, prod_bits: int, state_bits: int
) -> None:
    raw = bytearray(message.encode())
    raw[8:10] = cursor_reserved[:2]
    raw[16:18] = cursor_reserved[2:]
    raw[24] |= prod_bits
    raw[25] |= state_bits
    raw[26:] = tail
    assert CdcMessage.decode(bytes(raw)) == message
    assert CdcMessage.decode(bytes(raw)).encode() == message.encode()


def _fuzz_one(data: bytes) -> None:
    try:
        message = CdcMessage.decode(data)
    except WireError:
        return
    assert len(data) == CDC_MSG_LENGTH
    assert data[0] == CDC_MSG_TYPE
    assert data[1] == CDC_MSG_LENGTH
    raw = message.encode()
    assert CdcMessage.decode(raw) == message
    assert CdcMessage.decode(memoryview(data)) == message


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    raw = bytearray(draw(messages).encode())
    for _ in range(draw(st.integers(0, 4))):
        raw[draw(st.integers(0, CDC_MSG_LENGTH - 1))] = draw(st.integers(0, 255))
    cut = draw(st.sampled_from([CDC_MSG_LENGTH, CDC_MSG_LENGTH, 0, 1, 25, 26, 43, 45]))
    if cut > CDC_MSG_LENGTH:
        return bytes(raw) + b"\x00" * (cut - CDC_MSG_LENGTH)
    return bytes(raw[:cut])


fuzz_inputs = st.one_of(
    st.binary(max_size=64),
    st.binary(min_size=42, max_size=42).map(lambda body: b"\xfe\x2c" + body),
    mutated(),
)


@given(fuzz_inputs)
def test_fuzz(data: bytes) -> None:
    _fuzz_one(data)


@pytest.mark.slow
@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(fuzz_inputs)
def test_fuzz_slow(data: bytes) -> None:
    _fuzz_one(data)
