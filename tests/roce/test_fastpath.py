"""The lean data-path helpers agree with the tested codecs of smcr.wire.roce_packet.

Also: ICRC ID recovery (spec rocev2 §4.4 option (c)) finds any IPv4 ID and
rejects corruptions; the RNIC list reads this host's interfaces.
"""

from __future__ import annotations

import socket
import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from smcr.rdma import PathMtu
from smcr.rdma.roce import fastpath, list_devices
from smcr.rdma.roce.fastpath import (
    PADS,
    Buffer,
    IcrcV4,
    IcrcV6,
    pack_aeth,
    pack_bth,
    pack_reth,
    parse_bth,
    recover_id,
)
from smcr.rdma.roce.netif import active_mtu
from smcr.wire import icrc as wire_icrc
from smcr.wire import inet
from smcr.wire.roce import DEFAULT_P_KEY, OPCODE_INFO, Aeth, Bth, ImmDt, Opcode, Reth
from smcr.wire.roce_packet import (
    RocePacket,
    build_ipv4_udp_roce_frame,
    build_ipv6_udp_roce_frame,
    split_udp_datagram,
)

SRC, DST = "10.1.2.3", "10.1.2.4"
# no atomics, FLUSH or invalidate: the RNIC does not offer them
opcodes = st.sampled_from([op for op, i in OPCODE_INFO.items() if not i.headers & 0x56])


@st.composite
def packets(draw: st.DrawFn) -> RocePacket:
    op = draw(opcodes)
    info = OPCODE_INFO[op]
    payload = draw(st.binary(max_size=64)) if info.has_payload else b""
    kw: dict[str, object] = {}
    if info.headers & 0x08:
        kw["reth"] = Reth(draw(st.integers(0, 2**64 - 1)), draw(st.integers(0, 2**32 - 1)),
                          draw(st.integers(0, 2**32 - 1)))  # fmt: skip
    if info.headers & 0x01:
        kw["aeth"] = Aeth(draw(st.integers(0, 255)), draw(st.integers(0, 2**24 - 1)))
    if info.headers & 0x20:
        kw["imm_dt"] = ImmDt(draw(st.integers(0, 2**32 - 1)))
    return RocePacket.build(op, draw(st.integers(0, 2**24 - 1)), draw(st.integers(0, 2**24 - 1)),
                            payload, ack_req=draw(st.booleans()), se=draw(st.booleans()),
                            **kw)  # type: ignore[arg-type]


@settings(max_examples=150, deadline=None)
@given(packets(), st.integers(0, 0xFFFF), st.integers(0, 0xFFFF))
def test_pack_and_icrc_agree_with_the_codecs(packet: RocePacket, sport: int, ident: int) -> None:
    frame = build_ipv4_udp_roce_frame(packet, SRC, DST, sport, identification=ident)
    udp = split_udp_datagram(frame).udp_payload
    bth = packet.bth
    b1 = (bth.se << 7) | (bth.pad_cnt << 4)
    word2 = (bth.ack_req << 31) | bth.psn
    assert pack_bth(bth.opcode, b1, bth.dest_qp, word2) == bytes(udp[:12])
    assert parse_bth(udp) == (bth.opcode, b1, 0xFFFF, bth.dest_qp, word2)
    ext = packet.encode_headers()[12:]
    icrc = IcrcV4(socket.inet_aton(SRC), socket.inet_aton(DST), sport)
    crc = icrc.compute(bth.opcode, b1, bth.dest_qp, word2, ext, packet.payload, ident)
    assert struct.pack("<I", crc) == bytes(udp[-4:])
    # a receiver that cannot see the ID: right at once with ID 0, else by recovery
    assert icrc.check(udp) == (1 if ident == 0 else 2)


@settings(max_examples=80, deadline=None)
@given(packets(), st.integers(0, 0xFFFF))
def test_ipv6_icrc_agrees_with_the_codec(packet: RocePacket, sport: int) -> None:
    frame = build_ipv6_udp_roce_frame(packet, "fd00::1", "fd00::2", sport, hop_limit=9)
    udp = split_udp_datagram(frame).udp_payload
    icrc = IcrcV6(socket.inet_pton(socket.AF_INET6, "fd00::1"),
                  socket.inet_pton(socket.AF_INET6, "fd00::2"), sport)  # fmt: skip
    bth = packet.bth
    b1 = (bth.se << 7) | (bth.pad_cnt << 4)
    word2 = (bth.ack_req << 31) | bth.psn
    crc = icrc.compute(bth.opcode, b1, bth.dest_qp, word2, packet.encode_headers()[12:],
                       packet.payload)  # fmt: skip
    assert struct.pack("<I", crc) == bytes(udp[-4:])
    assert icrc.check(udp) == 1
    bad = bytearray(udp)
    bad[-5] ^= 0x10
    assert icrc.check(memoryview(bad)) == 0


@settings(max_examples=80, deadline=None)
@given(st.lists(packets(), min_size=1, max_size=5), st.integers(0, 0xFFFF), st.booleans())
def test_frames_are_the_packets_with_their_icrcs(pkts: list[RocePacket], sport: int,
                                                 v6: bool) -> None:  # fmt: skip
    """``frames`` (the sender's GSO run) joins BTH, headers, payload, pad and ICRC as
    :meth:`compute` defines them, packet ``k`` with IPv4 ID ``k``."""
    if v6:
        family, src, dst = socket.AF_INET6, "fd00::1", "fd00::2"
        icrc: IcrcV4 | IcrcV6 = IcrcV6(socket.inet_pton(family, src),
                                       socket.inet_pton(family, dst), sport)  # fmt: skip
    else:
        icrc = IcrcV4(socket.inet_aton(SRC), socket.inet_aton(DST), sport)
    queue: list[tuple[int, int, int, bytes, Buffer]] = [(0, 0, 0, b"", b"x")]
    want = b""
    for k, packet in enumerate(pkts):
        bth = packet.bth
        b1 = (bth.se << 7) | (bth.pad_cnt << 4)
        word2 = (bth.ack_req << 31) | bth.psn
        ext = packet.encode_headers()[12:]
        queue.append((int(bth.opcode), b1, word2, ext, packet.payload))
        crc = icrc.compute(bth.opcode, b1, 0x123456, word2, ext, packet.payload, k)
        want += (pack_bth(bth.opcode, b1, 0x123456, word2) + ext + packet.payload
                 + PADS[bth.pad_cnt] + struct.pack("<I", crc))  # fmt: skip
    # the run starts inside the queue (entry 0 is not part of it)
    assert b"".join(icrc.frames(queue, 1, len(queue), 0x123456)) == want


def test_the_loops_constants_are_the_wire_ones() -> None:
    """The per-packet loops use literals (inlined by the compiled build) and the wire's
    ICRC definition as their own Final names: all the same values as smcr.wire's."""
    assert fastpath.P_KEY == DEFAULT_P_KEY
    assert fastpath.IP_DF == inet.IP_DF
    assert fastpath.U24 == (1 << 24) - 1
    ack_req_byte = Bth(Opcode.SEND_ONLY, 0, 0, ack_req=True).encode()[8]
    assert ack_req_byte << 24 == fastpath.ACK_REQ
    assert fastpath.ICRC is wire_icrc.ICRC
    assert fastpath._SEED == wire_icrc.ICRC_SEED
    assert fastpath._V4_MASKED is wire_icrc.IPV4_MASKED
    assert fastpath._V6_MASKED is wire_icrc.IPV6_MASKED


def test_ext_header_packers() -> None:
    assert pack_reth(1, 2, 3) == Reth(1, 2, 3).encode()
    assert pack_aeth(0x1F, 0x123456) == Aeth(0x1F, 0x123456).encode()
    assert Bth.decode(pack_bth(Opcode.SEND_ONLY, 0x30, 0x12, 0x80000000)).ack_req


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 0xFFFF), st.integers(0, 200), st.integers(0, 7))
def test_id_recovery_finds_the_id_and_rejects_corruption(ident: int, where: int, bit: int) -> None:
    packet = RocePacket.build(Opcode.SEND_ONLY, 0x12, 5, bytes(range(200)), ack_req=True)
    frame = build_ipv4_udp_roce_frame(packet, SRC, DST, 0xC132, identification=ident)
    udp = bytearray(split_udp_datagram(frame).udp_payload)
    n = len(udp)
    icrc = IcrcV4(socket.inet_aton(SRC), socket.inet_aton(DST), 0xC132)
    zero = icrc.compute(Opcode.SEND_ONLY, 0, 0x12, 0x80000005, b"", bytes(range(200)))
    (found,) = struct.unpack("<I", udp[-4:])
    assert recover_id(n, zero ^ found) == ident
    udp[12 + where % 200] ^= 1 << bit  # one flipped payload bit
    assert icrc.check(memoryview(udp)) == 0


def test_list_devices_has_loopback() -> None:
    devs = list_devices()
    lo = [d for d in devs if d.ifname == "lo"]
    assert lo and lo[0].address == "127.0.0.1" and lo[0].gid[-4:] == bytes([127, 0, 0, 1])
    assert lo[0].gid[:12] == bytes(10) + b"\xff\xff" and lo[0].name == "roce_lo"
    six = [d for d in lo if d.address == "::1"]
    if six:  # IPv6 may be disabled on a host
        assert six[0].gid == bytes(15) + b"\x01" and six[0].name == "roce6_lo"
    assert len({d.name for d in devs}) == len(devs)


def test_active_mtu_is_rxe_rule() -> None:
    assert active_mtu(1500) is PathMtu.MTU_1024
    assert active_mtu(4175) is PathMtu.MTU_2048
    assert active_mtu(4176) is PathMtu.MTU_4096
    assert active_mtu(9000) is PathMtu.MTU_4096
    assert active_mtu(300) is PathMtu.MTU_256
