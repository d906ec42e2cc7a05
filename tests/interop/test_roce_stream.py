"""The capture replay that tells a receiver's fault from its sender's
(:mod:`tests.interop.roce_stream`), on a capture made here: a sender that writes a
16 KiB receive buffer round three times over two links, with a duplicate, a packet past a gap,
a failover validation CDC and a rewritten message on the way, and two WRITEs whose bytes
are not the stream's (one its sender's later bytes, one zeros)."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

from scapy.utils import RawPcapWriter

from smcr.wire.cdc import CdcMessage
from smcr.wire.cursor import Cursor
from smcr.wire.roce import Opcode, Reth
from smcr.wire.roce_packet import RocePacket, build_ipv4_udp_roce_frame
from tests.interop.roce_stream import Deviation, delivered_stream

RMB = 16 * 1024
MSG = 4096
MTU = 1024
BASE = 0x7F00_0000_0000
RECEIVER, LINK1, LINK2 = "10.0.0.1", "10.0.0.11", "10.0.0.21"
ETHER = bytes(6) + bytes(5) + b"\x01" + b"\x08\x00"


class Sender:
    """One link's sender: WRITE messages of :data:`MSG` bytes in :data:`MTU` packets,
    each followed by a CDC, as frames of a capture."""

    def __init__(self, ip: str, qpn: int, psn: int, frames: list[bytes]) -> None:
        self.ip, self.qpn, self.psn, self.frames = ip, qpn, psn, frames
        self.seq = 0

    def packet(self, packet: RocePacket) -> None:
        self.frames.append(ETHER + build_ipv4_udp_roce_frame(packet, self.ip, RECEIVER, 49152))

    def write(self, offset: int, data: bytes) -> None:
        """One RDMA WRITE of ``data`` to ring ``offset``, then a CDC up to its end."""
        parts = [data[i : i + MTU] for i in range(0, len(data), MTU)]
        for i, part in enumerate(parts):
            op = (Opcode.RDMA_WRITE_FIRST if i == 0 else Opcode.RDMA_WRITE_LAST
                  if i == len(parts) - 1 else Opcode.RDMA_WRITE_MIDDLE)  # fmt: skip
            reth = Reth(BASE + offset, 0x1234, len(data)) if i == 0 else None
            self.packet(RocePacket.build(op, self.qpn, self.psn, part, reth=reth))
            self.psn = (self.psn + 1) & 0xFFFFFF

    def cdc(self, produced: int, flags: int = 0) -> None:
        self.seq += 1
        cdc = CdcMessage(self.seq, 7, producer_cursor=Cursor(produced // RMB, produced % RMB))
        data = bytearray(cdc.encode())
        data[24] |= flags
        self.packet(RocePacket.build(Opcode.SEND_ONLY, self.qpn, self.psn, bytes(data)))
        self.psn = (self.psn + 1) & 0xFFFFFF


def test_the_replay_delivers_what_the_wire_says_and_names_the_runs_that_differ(
    tmp_path: Path,
) -> None:
    expected = random.Random(5).randbytes(12 * MSG)
    wire = bytearray(expected)
    wire[7 * MSG : 8 * MSG] = expected[9 * MSG : 10 * MSG]  # the sender's later bytes
    wire[9 * MSG : 10 * MSG] = bytes(MSG)  # nothing the sender ever wrote
    frames: list[bytes] = []
    one, two = Sender(LINK1, 100, 1000, frames), Sender(LINK2, 200, 0xFFFFFE, frames)
    for i in range(5):  # link 1: round the ring once and a bit
        one.write(i * MSG % RMB, bytes(wire[i * MSG : (i + 1) * MSG]))
        one.cdc((i + 1) * MSG)
    two.cdc(0, flags=0x08)  # failover validation: no cursor
    two.write(4 * MSG % RMB, bytes(wire[4 * MSG : 5 * MSG]))  # rewritten, same bytes
    two.cdc(5 * MSG)  # a cursor already seen moves nothing
    for i in range(5, 12):
        two.write(i * MSG % RMB, bytes(wire[i * MSG : (i + 1) * MSG]))
        if i in (5, 6):  # into what the CDC below hands over: a PSN already seen
            psn = (two.psn + (-3 if i == 5 else 1)) & 0xFFFFFF  # or one past a gap
            two.packet(RocePacket.build(Opcode.RDMA_WRITE_ONLY, 200, psn, b"\xdd" * MTU,
                                        reth=Reth(BASE + i * MSG % RMB, 0x1234, MTU)))  # fmt: skip
        two.cdc((i + 1) * MSG)
    pcap = tmp_path / "wire.pcap"
    with RawPcapWriter(str(pcap), linktype=1) as out:
        for frame in frames:
            out.write(frame)

    got = delivered_stream(pcap, RECEIVER, RMB, expected)
    assert (got.nbytes, got.sha256, got.gaps) == (len(wire), hashlib.sha256(wire).hexdigest(), 1)
    assert got.deviations == [Deviation(7 * MSG, MSG, (2 * MSG,)), Deviation(9 * MSG, MSG, (0,))]
    assert [d.later_bytes for d in got.deviations] == [True, False]
    assert delivered_stream(pcap, RECEIVER, RMB).sha256 == got.sha256  # no expected: no runs
    assert delivered_stream(pcap, RECEIVER, RMB).deviations == []
