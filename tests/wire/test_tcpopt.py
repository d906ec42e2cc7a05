"""Tests for smcr.wire.tcpopt: the SMC experimental TCP option (spec §1)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scapy.layers.inet import TCP
from scapy.utils import rdpcap

from smcr.wire.errors import WireError
from smcr.wire.tcpopt import (
    SMC_OPTION,
    SMC_OPTION_ALIGNED,
    TCPOPT_SMC_MAGIC,
    build_smc_option,
    find_smc_option,
    tcp_header_options,
)
from tests.support import FUZZ_EXAMPLES, LINUX_PCAP

GOLDEN_PCAP = LINUX_PCAP

# Options as Linux 6.12 sends them (frames 3 and 4 of the golden capture).
SYN_OPTIONS = bytes.fromhex("020405b40402080ad830798f00000000010303070101fe06e2d4c3d9")
MSS = bytes.fromhex("020405b4")
SACK_PERM = bytes.fromhex("0402")
TIMESTAMP = bytes.fromhex("080ad830798f00000000")
WSCALE = bytes.fromhex("030307")
FASTOPEN_COOKIE_REQUEST = bytes.fromhex("fe04f989")


# --- building ------------------------------------------------------------------


def test_build_aligned_is_linux_on_wire_form() -> None:
    assert build_smc_option() == bytes.fromhex("0101fe06e2d4c3d9")
    assert build_smc_option(aligned=True) == SMC_OPTION_ALIGNED
    assert len(build_smc_option()) == 8


def test_build_bare_option() -> None:
    assert build_smc_option(aligned=False) == bytes.fromhex("fe06e2d4c3d9")
    assert build_smc_option(aligned=False) == SMC_OPTION
    assert struct.unpack(">BBI", SMC_OPTION) == (254, 6, TCPOPT_SMC_MAGIC)


@pytest.mark.parametrize("aligned", [True, False])
def test_built_option_is_found(aligned: bool) -> None:
    assert find_smc_option(build_smc_option(aligned))
    assert find_smc_option(build_smc_option(aligned), strict=True)


# --- finding -------------------------------------------------------------------


def test_linux_syn_options_carry_smc() -> None:
    assert find_smc_option(SYN_OPTIONS)
    assert find_smc_option(SYN_OPTIONS, strict=True)


def test_only_syn_segments_count() -> None:
    # smc_parse_options tests th->syn: the option on a non-SYN segment is ignored.
    assert not find_smc_option(SYN_OPTIONS, syn=False)


@pytest.mark.parametrize(
    "options",
    [
        b"",
        MSS + SACK_PERM + TIMESTAMP,
        b"\x01\x01" + TIMESTAMP,
        FASTOPEN_COOKIE_REQUEST,
        bytes.fromhex("fe06e2d4c3d8"),  # wrong magic (last byte)
        bytes.fromhex("fe06f989e2d4"),  # Fast Open magic, not SMC
        bytes.fromhex("fd06e2d4c3d9"),  # kind 253 (other experimental) with the magic
    ],
)
def test_absent(options: bytes) -> None:
    assert not find_smc_option(options)
    assert not find_smc_option(options, strict=True)


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (bytes.fromhex("fe08e2d4c3d90000"), True),  # even and > 6: accepted
        (bytes.fromhex("fe0ae2d4c3d900000000"), True),
        (bytes.fromhex("fe07e2d4c3d900"), False),  # odd length: rejected
        (bytes.fromhex("fe05e2d4c300"), False),  # below 6 (and odd)
        (bytes.fromhex("fe04e2d4"), False),
    ],
)
def test_smc_parse_options_length_rule(options: bytes, expected: bool) -> None:
    # smc_parse_options: !(opsize & 1) && opsize >= TCPOLEN_EXP_SMC_BASE.
    assert find_smc_option(options) is expected


def test_eol_ends_walk() -> None:
    assert not find_smc_option(b"\x00" + SMC_OPTION)
    assert not find_smc_option(MSS + b"\x00\x01\x01" + SMC_OPTION)
    assert find_smc_option(SMC_OPTION_ALIGNED + b"\x00\xff\xff")


def test_nops_are_skipped_any_number() -> None:
    assert find_smc_option(b"\x01" * 7 + SMC_OPTION)
    assert find_smc_option(b"\x01" + SMC_OPTION + b"\x01")


def test_option_after_other_options() -> None:
    assert find_smc_option(MSS + WSCALE + b"\x01" + SMC_OPTION)
    assert find_smc_option(FASTOPEN_COOKIE_REQUEST + SMC_OPTION)


# --- malformed blobs: Linux stops silently; strict mode raises ------------------

MALFORMED = [
    pytest.param(b"\x02", id="kind-without-length"),
    pytest.param(MSS + b"\x03", id="trailing-kind"),
    pytest.param(b"\x02\x01" + SMC_OPTION, id="length-1-silly"),
    pytest.param(b"\x02\x00" + SMC_OPTION, id="length-0-silly"),
    pytest.param(b"\x02\x09" + b"\x00" * 6, id="length-past-end"),
    pytest.param(bytes.fromhex("fe06e2d4c3"), id="truncated-smc-option"),
    pytest.param(bytes.fromhex("fe08e2d4c3d9"), id="smc-length-past-end"),
]


@pytest.mark.parametrize("options", MALFORMED)
def test_malformed_linux_mode_stops_silently(options: bytes) -> None:
    assert find_smc_option(options) is False


@pytest.mark.parametrize("options", MALFORMED)
def test_malformed_strict_mode_raises(options: bytes) -> None:
    with pytest.raises(WireError):
        find_smc_option(options, strict=True)


def test_malformed_after_option_keeps_what_was_found() -> None:
    # tcp_parse_options returns at the bad option; smc_ok stays set.
    for tail in (b"\x02", b"\x02\x01", b"\x02\x20\x00\x00"):
        assert find_smc_option(SMC_OPTION_ALIGNED + tail)
        with pytest.raises(WireError):
            find_smc_option(SMC_OPTION_ALIGNED + tail, strict=True)


def test_malformed_before_option_hides_it() -> None:
    # The walk never reaches an option after a silly length.
    assert not find_smc_option(b"\x02\x01" + SMC_OPTION)


def test_strict_rejects_more_than_40_bytes() -> None:
    blob = b"\x01" * 35 + SMC_OPTION
    assert find_smc_option(blob)
    with pytest.raises(WireError):
        find_smc_option(blob, strict=True)


def test_accepts_memoryview_and_bytearray() -> None:
    assert find_smc_option(memoryview(SYN_OPTIONS))
    assert find_smc_option(bytearray(SYN_OPTIONS))
    assert find_smc_option(memoryview(b"xx" + SYN_OPTIONS)[2:])


# --- tcp_header_options -----------------------------------------------------------


def _tcp_header(options: bytes, *, data_offset: int | None = None) -> bytes:
    doff = data_offset if data_offset is not None else (20 + len(options)) // 4
    return struct.pack(">HHIIBBHHH", 1, 2, 3, 4, doff << 4, 0x02, 5, 0, 0) + options


def test_tcp_header_options() -> None:
    assert bytes(tcp_header_options(_tcp_header(SYN_OPTIONS))) == SYN_OPTIONS
    assert bytes(tcp_header_options(_tcp_header(b""))) == b""
    assert bytes(tcp_header_options(_tcp_header(SYN_OPTIONS) + b"payload")) == SYN_OPTIONS


@pytest.mark.parametrize(
    "header",
    [
        b"",
        b"\x00" * 19,
        _tcp_header(b"", data_offset=4),
        _tcp_header(b"", data_offset=0),
        _tcp_header(b"\x01" * 4, data_offset=15),
    ],
)
def test_tcp_header_options_rejects(header: bytes) -> None:
    with pytest.raises(WireError):
        tcp_header_options(header)


# --- golden: Linux 6.12 capture -----------------------------------------------------


@pytest.fixture(scope="module")
def golden_tcp() -> list[tuple[int, str, bytes]]:
    """(frame number, TCP flags, raw TCP header + payload) for every TCP frame."""
    frames = []
    for number, packet in enumerate(rdpcap(str(GOLDEN_PCAP)), start=1):
        if TCP in packet:
            frames.append((number, str(packet[TCP].flags), bytes(packet[TCP])))
    return frames


def test_golden_syn_and_synack_carry_option(golden_tcp: list[tuple[int, str, bytes]]) -> None:
    by_number = {number: (flags, raw) for number, flags, raw in golden_tcp}
    for number, expected_flags in ((3, "S"), (4, "SA")):
        flags, raw = by_number[number]
        assert flags == expected_flags
        options = tcp_header_options(raw)
        assert bytes(options).endswith(SMC_OPTION_ALIGNED)
        assert find_smc_option(options, syn=True)
        assert find_smc_option(options, syn=True, strict=True)


def test_golden_other_segments_lack_option(golden_tcp: list[tuple[int, str, bytes]]) -> None:
    by_number = {number: (flags, raw) for number, flags, raw in golden_tcp}
    flags, raw = by_number[5]
    assert flags == "A"
    assert not find_smc_option(tcp_header_options(raw), syn=True, strict=True)
    assert len(golden_tcp) > 10, "capture has data frames"
    syns = []
    for number, flags, raw in golden_tcp:
        options = tcp_header_options(raw)
        if "S" in flags:
            # Both connections' SYN and SYN-ACK (frames 3/4 and 375/376).
            syns.append(number)
            assert find_smc_option(options, syn=True, strict=True), number
        else:
            # Not even present as bytes: the option is sent on SYN/SYN-ACK only.
            assert not find_smc_option(options, syn=True, strict=True), number
            assert not find_smc_option(options, syn=False), number
    assert syns[:2] == [3, 4]
    assert len(syns) == 4


# --- property tests -------------------------------------------------------------------

_OTHER_OPTIONS = st.sampled_from(
    [MSS, SACK_PERM, TIMESTAMP, WSCALE, FASTOPEN_COOKIE_REQUEST, b"\x01", bytes.fromhex("fe04e2d4")]
)


@st.composite
def option_blobs(draw: st.DrawFn) -> tuple[bytes, bool]:
    """A well-formed options area and whether it holds the SMC option."""
    parts = draw(st.lists(_OTHER_OPTIONS, max_size=6))
    has_smc = draw(st.booleans())
    if has_smc:
        at = draw(st.integers(0, len(parts)))
        parts.insert(at, draw(st.sampled_from([SMC_OPTION, SMC_OPTION_ALIGNED])))
    blob = b"".join(parts)
    if draw(st.booleans()):
        blob += b"\x00" + draw(st.binary(max_size=4))  # EOL, then anything
    return blob, has_smc


@given(option_blobs())
def test_well_formed_blobs(case: tuple[bytes, bool]) -> None:
    blob, has_smc = case
    assert find_smc_option(blob) is has_smc
    assert find_smc_option(blob, syn=False) is False
    if len(blob) <= 40:
        assert find_smc_option(blob, strict=True) is has_smc


def linux_parse(blob: bytes) -> tuple[bool, bool]:
    """Linux ``tcp_parse_options`` + ``smc_parse_options`` on a SYN, transcribed as a reference.

    :returns: ``(smc_ok, stopped_early)``: whether the option was seen, and whether
        the walk stopped at a malformed option (no length byte, ``opsize < 2``, or
        ``opsize > length``: "don't parse partial options").
    """
    ptr, length, smc_ok = 0, len(blob), False
    while length > 0:
        opcode = blob[ptr]
        ptr += 1
        if opcode == 0:  # TCPOPT_EOL
            return smc_ok, False
        if opcode == 1:  # TCPOPT_NOP
            length -= 1
            continue
        if length < 2:
            return smc_ok, True
        opsize = blob[ptr]
        ptr += 1
        if opsize < 2 or opsize > length:
            return smc_ok, True
        value = blob[ptr : ptr + opsize - 2]
        # TCPOPT_EXP: Fast Open's magic is looked at first, then SMC's
        # (th->syn && !(opsize & 1) && opsize >= TCPOLEN_EXP_SMC_BASE && magic)
        if opcode == 254 and value[:2] != b"\xf9\x89" and opsize % 2 == 0 and opsize >= 6:
            smc_ok = smc_ok or value[:4] == b"\xe2\xd4\xc3\xd9"
        ptr += opsize - 2
        length -= opsize
    return smc_ok, False


def _fuzz_one(blob: bytes) -> None:
    found, malformed = linux_parse(blob)
    assert find_smc_option(blob) is found
    assert find_smc_option(blob, syn=False) is False
    if malformed or len(blob) > 40:
        with pytest.raises(WireError):
            find_smc_option(blob, strict=True)
    else:
        assert find_smc_option(blob, strict=True) is found
    doff = (blob[12] >> 4) * 4 if len(blob) > 12 else 0
    if len(blob) < 20 or doff < 20 or doff > len(blob):
        with pytest.raises(WireError):
            tcp_header_options(blob)
    else:
        assert bytes(tcp_header_options(blob)) == blob[20:doff]


def test_reference_model_on_known_blobs() -> None:
    """The reference itself, on hand-made cases (so a wrong model cannot pass the fuzz)."""
    assert linux_parse(SYN_OPTIONS) == (True, False)
    assert linux_parse(MSS + SACK_PERM) == (False, False)
    assert linux_parse(SMC_OPTION + b"\x02") == (True, True)  # kind without a length byte
    assert linux_parse(b"\x02\x01" + SMC_OPTION) == (False, True)  # opsize 1
    assert linux_parse(b"\x00" + SMC_OPTION) == (False, False)  # EOL first
    assert linux_parse(bytes.fromhex("fe07e2d4c3d900")) == (False, False)  # odd length
    assert linux_parse(bytes.fromhex("fe08e2d4c3d9")) == (False, True)  # length past the end


@given(st.binary(max_size=64))
def test_fuzz_random_bytes(blob: bytes) -> None:
    _fuzz_one(blob)


@given(option_blobs(), st.data())
def test_fuzz_mutated_blobs(case: tuple[bytes, bool], data: st.DataObject) -> None:
    blob = bytearray(case[0])
    if blob:
        for _ in range(data.draw(st.integers(1, 3))):
            blob[data.draw(st.integers(0, len(blob) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(blob)))
    _fuzz_one(bytes(blob[:cut]))
    _fuzz_one(bytes(blob))


@pytest.mark.slow
@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.one_of(st.binary(max_size=64), option_blobs().map(lambda case: case[0])))
def test_fuzz_slow(blob: bytes) -> None:
    _fuzz_one(blob)
    _fuzz_one(blob[: len(blob) // 2])
