"""Tests of the RoCEv2 codecs (smcr.wire.roce, smcr.wire.roce_packet).

Golden: every RoCEv2 packet of the Linux 6.12 rxe capture and of the hand-built
examples parses, its ICRC verifies, it re-encodes byte-identical, and its fields match
``.decoded.txt``.  Cross-check: scapy's RoCE layer builds the same bytes (ICRC included)
and dissects ours to the same fields.  Properties: hypothesis round trips, and the fuzz
invariant (decoders raise only WireError).
"""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scapy.contrib.roce import AETH, BTH
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.packet import Packet, Raw

from smcr.wire.errors import WireError
from smcr.wire.icrc import ICRC_SEED
from smcr.wire.inet import ipv4_checksum, ipv4_header, ipv6_header, udp_header
from smcr.wire.roce import (
    OPCODE_INFO,
    RNR_TIMER_US,
    Aeth,
    AethKind,
    AtomicAckEth,
    AtomicEth,
    Bth,
    ExtHeader,
    Feth,
    Ieth,
    ImmDt,
    NakCode,
    Opcode,
    Position,
    Reth,
    opcode_info,
)
from smcr.wire.roce_packet import (
    RocePacket,
    build_ipv4_udp_roce_frame,
    build_ipv6_udp_roce_frame,
    compute_icrc,
    icrc_ipv4,
    icrc_ipv6,
    pad_count,
    rdma_calc_flow_label,
    rdma_get_udp_sport,
    rxe_create_udp_sport,
    split_udp_datagram,
    verify_icrc,
)
from tests.support import FUZZ_EXAMPLES, LINUX_DECODED, LINUX_PCAP, ROCE_EXAMPLES_PCAP, pcap_frames

EXAMPLES_PCAP = ROCE_EXAMPLES_PCAP



def roce_datagrams(path: Path) -> dict[int, bytes]:
    """Frame number -> IP datagram bytes, for every UDP/4791 frame of a pcap."""
    out: dict[int, bytes] = {}
    for number, frame in enumerate(pcap_frames(path), 1):
        (ethertype,) = struct.unpack_from(">H", frame, 12)
        datagram = bytes(frame[14:])
        if ethertype == 0x0800 and datagram[9] == 17:
            udp = datagram[20:28]
        elif ethertype == 0x86DD and datagram[6] == 17:
            udp = datagram[40:48]
        else:
            continue
        if struct.unpack_from(">H", udp, 2)[0] == 4791:
            out[number] = datagram
    return out


@pytest.fixture(scope="module")
def linux_frames() -> dict[int, bytes]:
    return roce_datagrams(LINUX_PCAP)


@pytest.fixture(scope="module")
def example_frames() -> dict[int, bytes]:
    return roce_datagrams(EXAMPLES_PCAP)


def rebuild(datagram: bytes, packet: RocePacket) -> bytes:
    """Build the frame again from the parsed IP/UDP fields and the decoded packet."""
    ip, udp, _ = split_udp_datagram(datagram)
    sport, dport = struct.unpack_from(">HH", udp)
    if len(ip) == 20:
        ident, frag = struct.unpack_from(">HH", ip, 4)
        return build_ipv4_udp_roce_frame(
            packet, bytes(ip[12:16]), bytes(ip[16:20]), sport, dport=dport, ttl=ip[8],
            tos=ip[1], identification=ident, df=bool(frag & 0x4000),
        )  # fmt: skip
    (first,) = struct.unpack_from(">I", ip)
    return build_ipv6_udp_roce_frame(
        packet, bytes(ip[8:24]), bytes(ip[24:40]), sport, dport=dport, hop_limit=ip[7],
        traffic_class=(first >> 20) & 0xFF, flow_label=first & 0xFFFFF,
    )  # fmt: skip


# ----------------------------------------------------------------------------------------
# Golden captures


def check_golden(frames: dict[int, bytes]) -> dict[int, RocePacket]:
    decoded = {}
    for number, datagram in frames.items():
        assert verify_icrc(datagram), f"frame {number}: ICRC"
        udp_payload = split_udp_datagram(datagram).udp_payload
        packet = RocePacket.decode(udp_payload)
        assert packet.icrc == compute_icrc(datagram)
        assert packet.encode() == bytes(udp_payload), f"frame {number}: re-encode"
        assert rebuild(datagram, packet) == datagram, f"frame {number}: rebuild"
        decoded[number] = packet
    return decoded


def test_linux_capture_every_packet(linux_frames: dict[int, bytes]) -> None:
    packets = check_golden(linux_frames)
    assert len(packets) == 388
    for datagram in linux_frames.values():
        ip, udp, _ = split_udp_datagram(datagram)
        assert ip[8] == 1  # TTL 1 on SMC-R's RoCE packets
        assert struct.unpack_from(">HH", udp) == (0xC121, 4791)
        assert bytes(udp[6:8]) == b"\x00\x00"  # rxe sends UDP checksum 0
    counts: dict[Opcode, int] = {}
    for packet in packets.values():
        counts[packet.bth.opcode] = counts.get(packet.bth.opcode, 0) + 1
        assert packet.bth.p_key == 0xFFFF and not packet.bth.m
    assert counts[Opcode.RDMA_WRITE_MIDDLE] == 283
    assert counts[Opcode.ACKNOWLEDGE] == 50


def test_linux_capture_frame_18_rdma_write_only(linux_frames: dict[int, bytes]) -> None:
    packet = RocePacket.decode(split_udp_datagram(linux_frames[18]).udp_payload)
    assert packet.bth == Bth(Opcode.RDMA_WRITE_ONLY, 0x11, 2771794, ack_req=True)
    assert packet.reth == Reth(0xFF45874B42770000, 0x3A4, 28)
    assert len(packet.payload) == 28
    assert packet.bth.pad_cnt == 0
    assert packet.aeth is None and packet.imm_dt is None


def test_linux_capture_frame_12_ack(linux_frames: dict[int, bytes]) -> None:
    packet = RocePacket.decode(split_udp_datagram(linux_frames[12]).udp_payload)
    assert packet.bth == Bth(Opcode.ACKNOWLEDGE, 0x11, 3962044)
    assert packet.aeth == Aeth(0x1F, 1)
    assert packet.aeth.kind is AethKind.ACK and packet.aeth.value == 31
    assert len(packet.payload) == 0


def test_linux_capture_multi_packet_write(linux_frames: dict[int, bytes]) -> None:
    first = RocePacket.decode(split_udp_datagram(linux_frames[28]).udp_payload)
    assert first.bth.opcode is Opcode.RDMA_WRITE_FIRST and not first.bth.ack_req
    assert first.reth == Reth(0xFF45874B4277001C, 0x3A4, 65508)
    assert len(first.payload) == 1024
    last = RocePacket.decode(split_udp_datagram(linux_frames[91]).udp_payload)
    assert last.bth.opcode is Opcode.RDMA_WRITE_LAST and last.bth.ack_req
    assert (last.bth.psn, len(last.payload), last.reth) == (2771859, 996, None)
    # 63 full packets + 996 bytes = the RETH DMA length.
    assert (last.bth.psn - first.bth.psn) * 1024 + 996 == 65508


_LINE = re.compile(
    r"^\s*(?P<frame>\d+) \S+ \S+ -> \S+ RoCEv2 udp (?P<sport>\d+)->(?P<dport>\d+)"
    r" (?P<op>\w+) QP=0x(?P<qp>[0-9a-f]+) PSN=(?P<psn>\d+)(?P<se> SE)?(?P<ack> AckReq)?"
    r"(?: RETH\(va=0x(?P<va>[0-9a-f]+) rkey=0x(?P<rkey>[0-9a-f]+) len=(?P<len>\d+)\))?"
    r"(?: AETH\(\w+ syndrome=0x(?P<syn>[0-9a-f]+) msn=(?P<msn>\d+)\))?"
    r" payload=(?P<payload>\d+) ICRC ok$"
)


def test_linux_capture_matches_decoded_txt(linux_frames: dict[int, bytes]) -> None:
    names = {"ACK": Opcode.ACKNOWLEDGE}
    seen = 0
    for line in LINUX_DECODED.read_text().splitlines():
        if " RoCEv2 udp " not in line:
            continue
        m = _LINE.match(line)
        assert m, line
        packet = RocePacket.decode(split_udp_datagram(linux_frames[int(m["frame"])]).udp_payload)
        bth = packet.bth
        assert bth.opcode is names.get(m["op"]) or bth.opcode is Opcode[m["op"]]
        assert (bth.dest_qp, bth.psn) == (int(m["qp"], 16), int(m["psn"]))
        assert (bth.se, bth.ack_req) == (bool(m["se"]), bool(m["ack"]))
        assert len(packet.payload) == int(m["payload"])
        if m["va"]:
            assert packet.reth == Reth(int(m["va"], 16), int(m["rkey"], 16), int(m["len"]))
        else:
            assert packet.reth is None
        if m["syn"]:
            assert packet.aeth == Aeth(int(m["syn"], 16), int(m["msn"]))
        else:
            assert packet.aeth is None
        seen += 1
    assert seen == 388 - 283  # the Middle packets are not listed


def test_examples_capture(example_frames: dict[int, bytes]) -> None:
    packets = check_golden(example_frames)
    assert len(packets) == 9
    hello = packets[1]
    assert hello.bth == Bth(Opcode.SEND_ONLY, 0x12, 0, pad_cnt=3, ack_req=True)
    assert bytes(hello.payload) == b"hello" and hello.icrc == 0xBB28A5BF
    assert packets[2].aeth == Aeth.ack(1)
    write = packets[3]
    assert write.reth == Reth(0x7F0000001000, 0x1234, 8)
    assert bytes(write.payload) == bytes(range(8))
    imm = packets[4]
    assert imm.bth.opcode is Opcode.SEND_ONLY_WITH_IMMEDIATE and imm.bth.se
    assert imm.imm_dt == ImmDt(0xDEADBEEF) and bytes(imm.payload) == b"ABCD"
    nak = packets[5]
    assert nak.aeth == Aeth.nak(1, NakCode.PSN_SEQUENCE_ERROR) and nak.bth.psn == 5
    assert nak.aeth.nak_code is NakCode.PSN_SEQUENCE_ERROR
    rnr = packets[6]
    assert rnr.aeth == Aeth.rnr_nak(2, 12) and rnr.aeth.rnr_timer_us == 640
    read = packets[7]
    assert read.bth.opcode is Opcode.RDMA_READ_REQUEST
    assert read.reth == Reth(0x7F0000002000, 0x1234, 3000) and len(read.payload) == 0
    response = packets[8]
    assert response.bth.opcode is Opcode.RDMA_READ_RESPONSE_FIRST
    assert response.aeth == Aeth.ack(3) and len(response.payload) == 1024
    v6 = packets[9]
    assert len(split_udp_datagram(example_frames[9]).ip_header) == 40
    assert bytes(v6.payload) == b"hello" and v6.icrc == 0x4E1297D4


# ----------------------------------------------------------------------------------------
# Spec worked examples (rocev2 §4.3)

HELLO = bytes.fromhex(
    "45000034000040004011a565c0a80a01c0a80a02"
    "c13212b700200000"
    "0430ffff0000001280000000"
    "68656c6c6f000000"
    "bfa528bb"
)


def hello_packet() -> RocePacket:
    return RocePacket.build(Opcode.SEND_ONLY, 0x12, 0, b"hello", ack_req=True)


def test_spec_hello_frame() -> None:
    frame = build_ipv4_udp_roce_frame(
        hello_packet(), "192.168.10.1", "192.168.10.2", 0xC132, ttl=64
    )
    assert frame == HELLO
    assert verify_icrc(HELLO)
    crc_input = bytes.fromhex(
        "ffffffffffffffff45ff003400004000ff11ffffc0a80a01c0a80a02c13212b7"
        "0020ffff0430ffffff00001280000000" + "68656c6c6f000000"
    )
    assert zlib.crc32(crc_input) == 0xBB28A5BF == compute_icrc(HELLO)


@pytest.mark.parametrize(
    ("kwargs", "icrc"),
    [
        ({"identification": 0x1234}, 0xC20C0C2E),
        ({"df": False}, 0xF7F10007),
        ({"tos": 0x62, "ttl": 1}, 0xBB28A5BF),
    ],
)
def test_spec_icrc_sensitivity(kwargs: dict[str, Any], icrc: int) -> None:
    args: dict[str, Any] = {"ttl": 64} | kwargs
    frame = build_ipv4_udp_roce_frame(
        hello_packet(), "192.168.10.1", "192.168.10.2", 0xC132, **args
    )
    assert struct.unpack("<I", frame[-4:])[0] == icrc
    assert verify_icrc(frame)


def test_spec_more_examples() -> None:
    ack = RocePacket.build(Opcode.ACKNOWLEDGE, 0x11, 0, aeth=Aeth.ack(1))
    frame = build_ipv4_udp_roce_frame(ack, "192.168.10.2", "192.168.10.1", 0xC132, ttl=64)
    assert frame.hex() == (
        "45000030000040004011a569c0a80a02c0a80a01c13212b7001c0000"
        "1100ffff0000001100000000" "1f000001" "e986afbc"
    )  # fmt: skip
    write = RocePacket.build(
        Opcode.RDMA_WRITE_ONLY, 0x12, 1, bytes(range(8)), ack_req=True,
        reth=Reth(0x7F0000001000, 0x1234, 8),
    )  # fmt: skip
    frame = build_ipv4_udp_roce_frame(write, "192.168.10.1", "192.168.10.2", 0xC132, ttl=64)
    assert frame[20:].hex() == (
        "c13212b700300000" "0a00ffff0000001280000001" "00007f0000001000" "00001234" "00000008"
        "0001020304050607" "337a8be3"
    )  # fmt: skip
    nak = RocePacket.build(Opcode.ACKNOWLEDGE, 0x11, 5, aeth=Aeth.nak(1, NakCode(0)))
    frame = build_ipv4_udp_roce_frame(nak, "192.168.10.2", "192.168.10.1", 0xC132, ttl=64)
    assert frame[28:].hex() == "1100ffff00000011000000056000000153b91347"
    rnr = RocePacket.build(Opcode.ACKNOWLEDGE, 0x11, 3, aeth=Aeth.rnr_nak(2, 12))
    frame = build_ipv4_udp_roce_frame(rnr, "192.168.10.2", "192.168.10.1", 0xC132, ttl=64)
    assert frame[28:].hex() == "1100ffff00000011000000032c000002ccfa9880"
    v6 = build_ipv6_udp_roce_frame(hello_packet(), "fd00::1", "fd00::2", 0xC132, hop_limit=64)
    assert v6[-4:] == bytes.fromhex("d497124e") and verify_icrc(v6)


def test_icrc_seed_is_rxe_seed() -> None:
    # rxe starts crc32_le from 0xDEBB20E3: the register after 8 x 0xFF (spec §4.1).
    assert zlib.crc32(b"\xff" * 8) ^ 0xFFFFFFFF == 0xDEBB20E3
    assert ICRC_SEED ^ 0xFFFFFFFF == 0xDEBB20E3


def test_icrc_pieces_equal_whole() -> None:
    ip, udp, roce = split_udp_datagram(HELLO)
    body = bytes(roce[:-4])
    whole = icrc_ipv4(ip, udp, body)
    assert whole == icrc_ipv4(ip, udp, body[:12], body[12:15], body[15:]) == 0xBB28A5BF
    assert icrc_ipv4(ip, udp, body[:13], b"", body[13:]) == whole
    with pytest.raises(ValueError):
        icrc_ipv4(ip, udp, body[:11], body[11:])
    with pytest.raises(ValueError):
        icrc_ipv6(ip, udp, body)


def test_icrc_masks_only_the_spec_fields() -> None:
    """Flipping a masked bit leaves the ICRC alone; flipping any other bit changes it."""
    frame = bytearray(HELLO)
    base = compute_icrc(frame)
    masked = {1, 8, 10, 11, 20 + 6, 20 + 7, 28 + 4}
    checked = 0
    for index in range(len(frame) - 4):
        frame[index] ^= 0x01
        if _parses(frame):  # flips of version, IHL, lengths, protocol no longer parse
            assert (compute_icrc(frame) != base) == (index not in masked), index
            checked += 1
        frame[index] ^= 0x01
    assert checked >= 40


def _parses(frame: bytearray) -> bool:
    try:
        split_udp_datagram(frame)
    except WireError:
        return False
    return True


def test_icrc_ipv6_masks() -> None:
    frame = bytearray(build_ipv6_udp_roce_frame(hello_packet(), "fd00::1", "fd00::2", 0xC132))
    base = compute_icrc(frame)
    for index, flip in ((0, 0x0F), (1, 0xFF), (2, 0xFF), (3, 0xFF), (7, 0xFF), (46, 0xFF)):
        frame[index] ^= flip
        assert compute_icrc(frame) == base
        frame[index] ^= flip
    frame[0] ^= 0x10  # the version nibble is covered... and no longer IPv6
    with pytest.raises(WireError):
        compute_icrc(frame)


# ----------------------------------------------------------------------------------------
# UDP source port (spec §1.3)


def test_udp_sport_formula() -> None:
    assert rdma_get_udp_sport(0, 0x11, 0x12) == 0xC132 == rdma_get_udp_sport(0, 0x12, 0x11)
    assert rdma_get_udp_sport(0, 0x11, 0x11) == 0xC121 == 49441
    assert rdma_calc_flow_label(0x11, 0x12) == rdma_calc_flow_label(0x12, 0x11)
    assert rdma_get_udp_sport(0x12345, 1, 2) == 0xC000 | (0x2345 ^ 0x4)
    assert [rxe_create_udp_sport(q) for q in (0x11, 0x12, 0x13)] == [0xDF94, 0xF806, 0xD078]


# ----------------------------------------------------------------------------------------
# IP / UDP headers


def test_ipv4_header_matches_scapy() -> None:
    header = ipv4_header("10.99.0.11", b"\x0a\x63\x00\x0c", 100, ttl=1, tos=0x62)
    ref = IP(src="10.99.0.11", dst="10.99.0.12", ttl=1, tos=0x62, id=0, flags="DF", proto=17)
    assert header == bytes(ref / Raw(bytes(100)))[:20]
    assert (
        ipv4_checksum(header[:10] + b"\0\0" + header[12:]) == struct.unpack(">H", header[10:12])[0]
    )
    assert udp_header(0xC121, payload_length=40) == bytes.fromhex("c12112b700300000")
    v6 = ipv6_header("fd00::1", "fd00::2", 48, hop_limit=64, traffic_class=0x12, flow_label=0xABCDE)
    assert v6 == bytes(
        IPv6(src="fd00::1", dst="fd00::2", hlim=64, tc=0x12, fl=0xABCDE, nh=17, plen=48)
    )
    with pytest.raises(ValueError):
        ipv4_header(b"\x01\x02\x03", "1.2.3.4", 0)


def test_split_udp_datagram_ignores_ethernet_padding_and_rejects_bad_ip() -> None:
    ip, udp, payload = split_udp_datagram(HELLO + b"\0" * 6)
    assert len(ip) == 20 and len(udp) == 8 and bytes(payload) == HELLO[28:]
    bad = {
        "options": b"\x46" + HELLO[1:],
        "fragment": HELLO[:6] + b"\x20\x00" + HELLO[8:],
        "tcp": HELLO[:9] + b"\x06" + HELLO[10:],
        "version": b"\x55" + HELLO[1:],
        "truncated": HELLO[:-1],
        "udp length": HELLO[:24] + b"\x00\x21" + HELLO[26:],
        "empty": b"",
        "short": HELLO[:27],
    }
    for name, datagram in bad.items():
        with pytest.raises(WireError):
            split_udp_datagram(datagram)
        with pytest.raises(WireError):
            verify_icrc(datagram)
        assert name
    # IP and UDP fine, but no room for BTH + ICRC.
    tiny = ipv4_header("1.2.3.4", "1.2.3.5", 8 + 12) + udp_header(1, 4791, 12) + bytes(12)
    with pytest.raises(WireError):
        verify_icrc(tiny)


# ----------------------------------------------------------------------------------------
# Opcode table (spec §2.3)

SPEC_TABLE = {
    # opcode: (header bytes after BTH, position, has_payload)
    0x00: (0, Position.FIRST, True), 0x01: (0, Position.MIDDLE, True),
    0x02: (0, Position.LAST, True), 0x03: (4, Position.LAST, True),
    0x04: (0, Position.ONLY, True), 0x05: (4, Position.ONLY, True),
    0x06: (16, Position.FIRST, True), 0x07: (0, Position.MIDDLE, True),
    0x08: (0, Position.LAST, True), 0x09: (4, Position.LAST, True),
    0x0A: (16, Position.ONLY, True), 0x0B: (20, Position.ONLY, True),
    0x0C: (16, Position.ONLY, False), 0x0D: (4, Position.FIRST, True),
    0x0E: (0, Position.MIDDLE, True), 0x0F: (4, Position.LAST, True),
    0x10: (4, Position.ONLY, True), 0x11: (4, Position.ONLY, False),
    0x12: (12, Position.ONLY, False), 0x13: (28, Position.ONLY, False),
    0x14: (28, Position.ONLY, False), 0x16: (4, Position.LAST, True),
    0x17: (4, Position.ONLY, True), 0x1C: (20, Position.ONLY, False),
    0x1D: (16, Position.ONLY, True),
}  # fmt: skip


def test_opcode_table_matches_spec() -> None:
    assert sorted(OPCODE_INFO) == sorted(SPEC_TABLE)
    for op, (ext, position, has_payload) in SPEC_TABLE.items():
        info = opcode_info(op)
        assert info.opcode == op
        assert (info.header_length, info.position, info.has_payload) == (
            12 + ext, position, has_payload,
        )  # fmt: skip
    assert OPCODE_INFO[Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE].headers == (
        ExtHeader.RETH | ExtHeader.IMMDT
    )
    assert (
        OPCODE_INFO[Opcode.ATOMIC_ACKNOWLEDGE].headers == ExtHeader.AETH | ExtHeader.ATOMIC_ACK_ETH
    )
    assert not OPCODE_INFO[Opcode.ACKNOWLEDGE].is_request
    assert OPCODE_INFO[Opcode.RDMA_READ_REQUEST].is_request
    for op in (0x15, 0x18, 0x1F, 0x20, 0x64, 0x81, -1, 256):
        with pytest.raises(WireError):
            opcode_info(op)


# ----------------------------------------------------------------------------------------
# Header details


def test_bth_fields_and_reserved_bits() -> None:
    bth = Bth(Opcode.SEND_ONLY, 0xABCDEF, 0x123456, se=True, m=True, pad_cnt=2,
              p_key=0x7FFF, fecn=True, becn=True, ack_req=True)  # fmt: skip
    raw = bth.encode()
    assert raw == bytes.fromhex("04e07fff c0abcdef 80123456")
    assert Bth.decode(raw) == bth
    # Reserved bits of bytes 4 and 8 are ignored on receive and sent as zero.
    noisy = raw[:4] + bytes([raw[4] | 0x3F]) + raw[5:8] + bytes([raw[8] | 0x7F]) + raw[9:]
    assert Bth.decode(noisy) == bth and Bth.decode(noisy).encode() == raw


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ("0401ffff 00000011 00000000", "TVer"),
        ("0400ffff 00000011 0000000000", "length"),
        ("0400fffe 00000011 00000000", "P_Key"),
        ("0400ffef 00000011 00000000", "P_Key"),
        ("1500ffff 00000011 00000000", "opcode"),
        ("2400ffff 00000011 00000000", "opcode"),  # UC SEND ONLY
        ("8100ffff 00000011 00000000", "opcode"),  # CNP
    ],
)
def test_bth_rejects(raw: str, why: str) -> None:
    with pytest.raises(WireError):
        Bth.decode(bytes.fromhex(raw))
    assert why


def test_bth_encode_rejects_out_of_range() -> None:
    for bad in (Bth(Opcode.SEND_ONLY, 1 << 24, 0), Bth(Opcode.SEND_ONLY, 0, -1),
                Bth(Opcode.SEND_ONLY, 0, 0, pad_cnt=4)):  # fmt: skip
        with pytest.raises(ValueError):
            bad.encode()


def test_aeth_syndromes() -> None:
    assert Aeth.ack(7).syndrome == 0x1F and Aeth.ack(7, credits=3).syndrome == 0x03
    assert [Aeth.nak(0, c).syndrome for c in NakCode] == [0x60, 0x61, 0x62, 0x63, 0x64]
    assert Aeth.rnr_nak(0, 0).rnr_timer_us == 655360
    assert [Aeth.rnr_nak(0, t).rnr_timer_us for t in range(32)] == list(RNR_TIMER_US)
    assert RNR_TIMER_US[25] == 61440 and RNR_TIMER_US[31] == 491520
    assert Aeth(0x1F, 0).kind is AethKind.ACK and Aeth(0x1F, 0).nak_code is None
    assert Aeth(0x2C, 0).kind is AethKind.RNR_NAK and Aeth(0x2C, 0).value == 12
    assert (
        Aeth(0x62, 0).kind is AethKind.NAK and Aeth(0x62, 0).nak_code is NakCode.REMOTE_ACCESS_ERROR
    )
    assert Aeth(0x65, 0).kind is AethKind.NAK and Aeth(0x65, 0).nak_code is None
    assert Aeth(0x40, 0).kind is AethKind.RESERVED and Aeth(0x9F, 0).kind is AethKind.RESERVED
    assert Aeth(0x1F, 0).rnr_timer_us is None
    assert Aeth.decode(bytes.fromhex("2c000002")) == Aeth.rnr_nak(2, 12)
    for bad in (lambda: Aeth.ack(0, 32), lambda: Aeth.rnr_nak(0, 32), Aeth(0, 1 << 24).encode):
        with pytest.raises(ValueError):
            bad()


def test_ext_header_layouts() -> None:
    assert Reth(0x0102030405060708, 0x090A0B0C, 0x0D0E0F10).encode() == bytes(range(1, 17))
    atomic = AtomicEth(0x0102030405060708, 0x090A0B0C, 0x0D0E0F1011121314, 0x15161718191A1B1C)
    assert atomic.encode() == bytes(range(1, 29))
    assert AtomicAckEth(0x0102030405060708).encode() == bytes(range(1, 9))
    assert ImmDt(0x01020304).encode() == b"\x01\x02\x03\x04"  # big-endian, network order
    assert Ieth(0xDEADBEEF).encode() == bytes.fromhex("deadbeef")
    assert Feth(2, 1).encode() == bytes.fromhex("00000012")
    assert Feth.decode(bytes.fromhex("ffffff12")) == Feth(2, 1)  # reserved bits ignored
    with pytest.raises(ValueError):
        Feth(16, 0).encode()


# ----------------------------------------------------------------------------------------
# Whole packets


def test_packet_payload_is_a_view() -> None:
    buffer = bytearray(HELLO[28:])
    packet = RocePacket.decode(buffer)
    assert isinstance(packet.payload, memoryview) and packet.payload.obj is buffer
    buffer[12] = ord("j")
    assert bytes(packet.payload) == b"jello"


def test_packet_padding() -> None:
    for n in range(9):
        packet = RocePacket.build(Opcode.SEND_ONLY, 1, 2, bytes(range(n)))
        assert packet.bth.pad_cnt == pad_count(n) == (4 - n % 4) % 4
        raw = packet.encode()
        assert len(raw) % 4 == 0 and raw[12 + n : -4] == bytes(pad_count(n))
        assert RocePacket.decode(raw) == packet
    # Pad bytes are ignored on receive and sent as zeros.
    noisy = bytearray(RocePacket.build(Opcode.SEND_ONLY, 1, 2, b"hello").encode())
    noisy[17:20] = b"xyz"
    packet = RocePacket.decode(noisy)
    assert bytes(packet.payload) == b"hello" and packet.encode()[17:20] == bytes(3)


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ("0400ffff0000001280000000", "shorter than BTH + ICRC"),
        ("0430ffff000000128000000000000000", "PadCnt 3, no room"),
        ("0a00ffff00000012800000000000000000000000", "RETH missing"),
        ("0400ffff00000012800000006800000000", "not a multiple of 4"),
        ("1100ffff0000001100000000", "AETH and ICRC missing"),
        ("1101ffff000000110000000000000000", "TVer"),
    ],
)
def test_packet_rejects(raw: str, why: str) -> None:
    with pytest.raises(WireError):
        RocePacket.decode(bytes.fromhex(raw.replace(" ", "")))
    assert why


def test_packet_accepts_what_rxe_accepts() -> None:
    # rxe ignores data after an ACK's AETH; the responder, not the parser, checks
    # First/Middle/Last lengths (NAK Invalid Request, spec §5.3).
    ack = RocePacket.decode(bytes.fromhex("1100ffff00000011000000001f000001abcdabcd00000000"))
    assert bytes(ack.payload) == bytes.fromhex("abcdabcd")
    first = RocePacket.decode(bytes.fromhex("0010ffff0000001100000000aabbcc0000000000"))
    assert first.bth.pad_cnt == 1 and bytes(first.payload) == bytes.fromhex("aabbcc")


def test_packet_build_checks_headers() -> None:
    with pytest.raises(ValueError):
        RocePacket.build(Opcode.RDMA_WRITE_ONLY, 1, 2, b"x")
    with pytest.raises(ValueError):
        RocePacket.build(Opcode.SEND_ONLY, 1, 2, b"x", reth=Reth(0, 0, 1))
    with pytest.raises(ValueError):
        RocePacket.build(Opcode.ACKNOWLEDGE, 1, 2, b"x", aeth=Aeth.ack(0))
    with pytest.raises(ValueError):
        RocePacket(Bth(Opcode.SEND_ONLY, 1, 2), b"x").encode()  # PadCnt should be 3
    packet = RocePacket.build(
        Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE, 1, 2, b"abcd", reth=Reth(1, 2, 4), imm_dt=ImmDt(9)
    )
    assert (
        packet.encode_headers() == packet.bth.encode() + Reth(1, 2, 4).encode() + ImmDt(9).encode()
    )
    assert packet.info is OPCODE_INFO[Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE]


# ----------------------------------------------------------------------------------------
# Hypothesis strategies

u8 = st.integers(0, 0xFF)
u24 = st.integers(0, 0xFFFFFF)
u32 = st.integers(0, 0xFFFFFFFF)
u64 = st.integers(0, 0xFFFFFFFFFFFFFFFF)

EXT_STRATEGIES: dict[ExtHeader, tuple[str, st.SearchStrategy[Any]]] = {
    ExtHeader.AETH: ("aeth", st.builds(Aeth, u8, u24)),
    ExtHeader.ATOMIC_ACK_ETH: ("atomic_ack_eth", st.builds(AtomicAckEth, u64)),
    ExtHeader.FETH: ("feth", st.builds(Feth, st.integers(0, 15), st.integers(0, 3))),
    ExtHeader.RETH: ("reth", st.builds(Reth, u64, u32, u32)),
    ExtHeader.ATOMIC_ETH: ("atomic_eth", st.builds(AtomicEth, u64, u32, u64, u64)),
    ExtHeader.IMMDT: ("imm_dt", st.builds(ImmDt, u32)),
    ExtHeader.IETH: ("ieth", st.builds(Ieth, u32)),
}


def bths(opcode: Opcode, pad_cnt: int) -> st.SearchStrategy[Bth]:
    return st.builds(
        Bth, st.just(opcode), u24, u24, st.booleans(), st.booleans(), st.just(pad_cnt),
        st.sampled_from([0xFFFF, 0x7FFF]), st.booleans(), st.booleans(), st.booleans(),
    )  # fmt: skip


@st.composite
def packets(draw: st.DrawFn, max_payload: int = 80) -> RocePacket:
    opcode = draw(st.sampled_from(list(Opcode)))
    info = OPCODE_INFO[opcode]
    payload = draw(st.binary(max_size=max_payload)) if info.has_payload else b""
    bth = draw(bths(opcode, pad_count(len(payload))))
    headers = {
        name: draw(strategy)
        for flag, (name, strategy) in EXT_STRATEGIES.items()
        if info.headers & flag
    }
    return RocePacket(bth, payload, icrc=draw(u32), **headers)


HEADER_CODECS: list[tuple[type[Any], int, st.SearchStrategy[Any]]] = [
    (Bth, 12, st.sampled_from(list(Opcode)).flatmap(lambda op: bths(op, 0))),
    (Reth, 16, EXT_STRATEGIES[ExtHeader.RETH][1]),
    (Aeth, 4, EXT_STRATEGIES[ExtHeader.AETH][1]),
    (ImmDt, 4, EXT_STRATEGIES[ExtHeader.IMMDT][1]),
    (Ieth, 4, EXT_STRATEGIES[ExtHeader.IETH][1]),
    (AtomicEth, 28, EXT_STRATEGIES[ExtHeader.ATOMIC_ETH][1]),
    (AtomicAckEth, 8, EXT_STRATEGIES[ExtHeader.ATOMIC_ACK_ETH][1]),
    (Feth, 4, EXT_STRATEGIES[ExtHeader.FETH][1]),
]


@pytest.mark.parametrize(
    ("cls", "size", "strategy"), HEADER_CODECS, ids=[c.__name__ for c, _, _ in HEADER_CODECS]
)
def test_header_round_trip(cls: type[Any], size: int, strategy: st.SearchStrategy[Any]) -> None:
    @settings(max_examples=100)
    @given(strategy)
    def run(header: Any) -> None:
        raw = header.encode()
        assert len(raw) == size
        assert cls.decode(raw) == header
        assert cls.decode(raw).encode() == raw

    run()


@pytest.mark.parametrize(
    ("cls", "size"), [(c, s) for c, s, _ in HEADER_CODECS if c not in (Bth, Feth)]
)
@given(data=st.data())
def test_header_bytes_round_trip(cls: type[Any], size: int, data: st.DataObject) -> None:
    raw = data.draw(st.binary(min_size=size, max_size=size))
    assert cls.decode(raw).encode() == raw


@given(packets())
def test_packet_round_trip(packet: RocePacket) -> None:
    raw = packet.encode()
    assert len(raw) % 4 == 0
    decoded = RocePacket.decode(raw)
    assert decoded == packet
    assert decoded.encode() == raw
    assert RocePacket.decode(memoryview(raw)) == packet


@given(packets(), st.booleans())
def test_frame_round_trip(packet: RocePacket, v6: bool) -> None:
    if v6:
        frame = build_ipv6_udp_roce_frame(packet, "fd00::1", "fd00::2", 0xC121)
    else:
        frame = build_ipv4_udp_roce_frame(packet, "10.0.0.1", "10.0.0.2", 0xC121)
    assert verify_icrc(frame)
    decoded = RocePacket.decode(split_udp_datagram(frame).udp_payload)
    assert decoded.icrc == compute_icrc(frame)
    assert rebuild(frame, decoded) == frame


# ----------------------------------------------------------------------------------------
# scapy's RoCE layer agrees


def scapy_frame(packet: RocePacket, v6: bool, ttl: int, tos: int, ident: int, sport: int) -> Packet:
    bth = packet.bth
    ip: Packet
    if v6:
        ip = IPv6(src="fd00::1", dst="fd00::2", hlim=ttl, tc=tos, fl=0)
    else:
        ip = IP(src="10.0.0.1", dst="10.0.0.2", ttl=ttl, tos=tos, id=ident, flags="DF")
    layer = BTH(
        opcode=int(bth.opcode), solicited=bth.se, migreq=bth.m, padcount=bth.pad_cnt,
        pkey=bth.p_key, fecn=bth.fecn, becn=bth.becn, dqpn=bth.dest_qp, ackreq=bth.ack_req,
        psn=bth.psn,
    )  # fmt: skip
    if bth.opcode is Opcode.ACKNOWLEDGE:
        assert packet.aeth is not None
        layer = layer / AETH(syndrome=packet.aeth.syndrome, msn=packet.aeth.msn)
    else:
        rest = packet.encode_headers()[12:] + bytes(packet.payload) + packet.pad
        layer = layer / Raw(rest)
    return ip / UDP(sport=sport, dport=4791, chksum=0) / layer


@settings(max_examples=60, deadline=None)
@given(
    packets(max_payload=40), st.booleans(), u8, u8, st.integers(0, 0xFFFF), st.integers(0, 0xFFFF)
)
def test_scapy_builds_the_same_bytes(
    packet: RocePacket, v6: bool, ttl: int, tos: int, ident: int, sport: int
) -> None:
    ref = bytes(scapy_frame(packet, v6, ttl, tos, ident, sport))
    if v6:
        ours = build_ipv6_udp_roce_frame(
            packet, "fd00::1", "fd00::2", sport, hop_limit=ttl, traffic_class=tos
        )
    else:
        ours = build_ipv4_udp_roce_frame(
            packet, "10.0.0.1", "10.0.0.2", sport, ttl=ttl, tos=tos, identification=ident
        )
    assert ours == ref


@settings(max_examples=60, deadline=None)
@given(packets(max_payload=40), st.booleans())
def test_scapy_dissects_our_bytes(packet: RocePacket, v6: bool) -> None:
    if v6:
        frame = build_ipv6_udp_roce_frame(packet, "fd00::1", "fd00::2", 0xC121)
        dissected: Packet = IPv6(frame)
    else:
        frame = build_ipv4_udp_roce_frame(packet, "10.0.0.1", "10.0.0.2", 0xC121)
        dissected = IP(frame)
    bth, ours = dissected[BTH], packet.bth
    assert (bth.opcode, bth.dqpn, bth.psn, bth.pkey, bth.padcount, bth.version) == (
        ours.opcode, ours.dest_qp, ours.psn, ours.p_key, ours.pad_cnt, 0,
    )  # fmt: skip
    assert (bth.solicited, bth.migreq, bth.fecn, bth.becn, bth.ackreq, bth.resv6, bth.resv7) == (
        ours.se, ours.m, ours.fecn, ours.becn, ours.ack_req, 0, 0,
    )  # fmt: skip
    # scapy reads the ICRC big-endian (like Wireshark): the byte-swapped value.
    (icrc,) = struct.unpack("<I", frame[-4:])
    assert bth.icrc == int.from_bytes(icrc.to_bytes(4, "little"), "big")
    if ours.opcode is Opcode.ACKNOWLEDGE:
        assert packet.aeth is not None
        assert (dissected[AETH].syndrome, dissected[AETH].msn) == (
            packet.aeth.syndrome,
            packet.aeth.msn,
        )
    else:
        rest = packet.encode_headers()[12:] + bytes(packet.payload) + packet.pad
        assert bytes(bth.payload) == rest


# ----------------------------------------------------------------------------------------
# Fuzz invariant: decoders raise nothing but WireError

HEADER_DECODERS: list[tuple[Callable[[bytes], object], int]] = [
    (Bth.decode, 12), (Reth.decode, 16), (Aeth.decode, 4), (ImmDt.decode, 4),
    (Ieth.decode, 4), (AtomicEth.decode, 28), (AtomicAckEth.decode, 8), (Feth.decode, 4),
]  # fmt: skip


def only_wire_errors(data: bytes) -> None:
    """Every decoder refuses ``data`` with WireError or gives a result that holds up:
    headers and packets decode again to themselves, a split datagram is ``data``'s own
    bytes, and the ICRC check agrees with the computed ICRC and accepts it once written."""
    for decode, size in HEADER_DECODERS:
        for chunk in (data, data[:size]):  # any length, and the header's own length
            try:
                header: Any = decode(chunk)
            except WireError:
                continue
            assert len(chunk) >= size
            assert type(header).decode(header.encode()) == header
            assert len(header.encode()) == size
    try:
        packet = RocePacket.decode(data)
    except WireError:
        pass
    else:
        assert len(packet.encode()) == len(data)
        assert RocePacket.decode(packet.encode()) == packet
        assert bytes(packet.payload) in data
    try:
        ip, udp, payload = split_udp_datagram(data)
    except WireError:
        return
    end = len(ip) + len(udp) + len(payload)
    assert bytes(ip) + bytes(udp) + bytes(payload) == data[:end]
    assert int.from_bytes(udp[4:6], "big") == len(udp) + len(payload)
    try:
        icrc = compute_icrc(data)
    except WireError:
        with pytest.raises(WireError):
            verify_icrc(data)
        return
    assert verify_icrc(data) is (data[end - 4 : end] == struct.pack("<I", icrc))
    fixed = data[: end - 4] + struct.pack("<I", icrc) + data[end:]
    assert compute_icrc(fixed) == icrc and verify_icrc(fixed)


def _seed_corpus() -> list[bytes]:
    """Valid inputs to mutate: one packet per opcode, as UDP payload and IPv4/IPv6 frame."""
    corpus = [HELLO, HELLO[28:]]
    for opcode, info in OPCODE_INFO.items():
        headers = {
            name: _FIXED_HEADERS[flag]
            for flag, (name, _) in EXT_STRATEGIES.items()
            if info.headers & flag
        }
        payload = b"abcdefg" if info.has_payload else b""
        packet = RocePacket.build(opcode, 0x11, 0xABCDEF, payload, ack_req=True, **headers)
        corpus.append(packet.encode())
        corpus.append(build_ipv4_udp_roce_frame(packet, "10.0.0.1", "10.0.0.2", 0xC121))
        corpus.append(build_ipv6_udp_roce_frame(packet, "fd00::1", "fd00::2", 0xC121))
    return corpus


_FIXED_HEADERS: dict[ExtHeader, Any] = {
    ExtHeader.AETH: Aeth.ack(5),
    ExtHeader.ATOMIC_ACK_ETH: AtomicAckEth(0x1122334455667788),
    ExtHeader.FETH: Feth(1, 1),
    ExtHeader.RETH: Reth(0xFF45874B42770000, 0x3A4, 7),
    ExtHeader.ATOMIC_ETH: AtomicEth(0x1000, 0x3A4, 1, 2),
    ExtHeader.IMMDT: ImmDt(0xDEADBEEF),
    ExtHeader.IETH: Ieth(0x3A4),
}
SEED_CORPUS = _seed_corpus()


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A valid packet or frame with a few bytes changed, cut short and/or extended."""
    base = bytearray(draw(st.sampled_from(SEED_CORPUS)))
    for index, value in draw(st.lists(st.tuples(st.integers(0, 2047), u8), max_size=4)):
        base[index % len(base)] = value
    cut = draw(st.integers(0, len(base)))
    return bytes(base[:cut]) + draw(st.binary(max_size=8))


@st.composite
def flipped(draw: st.DrawFn) -> bytes:
    """A valid packet or frame with a few bytes changed, its length kept (most still parse,
    so the checks on what a decoder returns run often)."""
    base = bytearray(draw(st.sampled_from(SEED_CORPUS)))
    for index, value in draw(st.lists(st.tuples(st.integers(0, 2047), u8), max_size=3)):
        base[index % len(base)] = value
    return bytes(base)


fuzz_inputs = st.one_of(st.binary(max_size=96), mutated(), flipped())


@settings(max_examples=200)
@given(fuzz_inputs)
def test_fuzz_only_wire_error(data: bytes) -> None:
    only_wire_errors(data)


@pytest.mark.slow
@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(fuzz_inputs)
def test_fuzz_only_wire_error_slow(data: bytes) -> None:
    only_wire_errors(data)
