"""What a correct receiver delivers, read from a RoCEv2 capture of one SMC-R connection.

A test that finds the bytes an application received differ from what the other end's
application sent has to tell whose fault that is.  SMC-R carries no checksum of its own
over the data, so the capture is the only witness: this module replays it as a responder
would (each QP's packets in PSN order, duplicates and packets past a gap dropped, RDMA
WRITE payloads placed at their virtual address in the receive buffer), and hands the
application, at each CDC, the bytes up to the CDC's producer cursor.  If the receiver
under test delivered the same bytes, it did its job whatever the sender put on the wire;
where those bytes differ from the expected stream, :class:`Deviation` says whether they
are the sender's *later* bytes (its send buffer refilled before the WRITE went out).
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field
from pathlib import Path

from smcr.wire.cdc import CdcMessage, ProducerFlags
from smcr.wire.roce import Opcode
from smcr.wire.roce_packet import RocePacket
from tests.support import pcap_frames

ROCE_PORT = 4791
CDC_TYPE = 0xFE
CDC_LEN = 44
_ETHERTYPE_IPV4 = b"\x08\x00"
_WRITES = {
    Opcode.RDMA_WRITE_FIRST,
    Opcode.RDMA_WRITE_MIDDLE,
    Opcode.RDMA_WRITE_LAST,
    Opcode.RDMA_WRITE_ONLY,
}
_PSN_MASK = 0xFFFFFF


@dataclass(frozen=True)
class Deviation:
    """A run of delivered bytes that differs from the expected stream.

    :param offset: where it starts in the stream.
    :param length: how long it is.
    :param ahead: for each part of the run, in order, how far ahead in the expected
        stream its bytes are found: > 0 for bytes the sender's application wrote later,
        0 for a part found nowhere ahead (stale bytes, zeros, bytes out of place).
    """

    offset: int
    length: int
    ahead: tuple[int, ...]

    @property
    def later_bytes(self) -> bool:
        """The whole run is bytes the sender wrote later: its send buffer was refilled
        before the WRITE that carried them was built."""
        return all(d > 0 for d in self.ahead)


@dataclass
class Delivered:
    """The stream a correct receiver delivered, as the capture shows it.

    :param nbytes: bytes handed over (the last producer cursor, as a stream offset).
    :param sha256: their SHA-256.
    :param deviations: with ``expected``, where the delivered bytes differ from it.
    :param gaps: request packets whose PSN was past the one expected (lost on the wire or
        missed by the capture: what follows on that QP is dropped until the PSN comes).
    """

    nbytes: int = 0
    sha256: str = ""
    deviations: list[Deviation] = field(default_factory=list)
    gaps: int = 0


def _datagrams(pcap: Path, receiver: str) -> list[RocePacket]:
    """The RoCEv2 packets to ``receiver`` (IPv4 over Ethernet; from each of the sender's
    links), in order."""
    dst = bytes(int(b) for b in receiver.split("."))
    out = []
    for raw in pcap_frames(pcap):
        if raw[12:14] != _ETHERTYPE_IPV4 or raw[23] != 17 or raw[30:34] != dst:
            continue
        udp = 14 + (raw[14] & 0x0F) * 4
        _sport, dport, length = struct.unpack_from(">HHH", raw, udp)
        if dport == ROCE_PORT:
            out.append(RocePacket.decode(raw[udp + 8 : udp + length]))
    return out


def _accepted(packets: list[RocePacket]) -> tuple[list[RocePacket], int]:
    """The request packets a responder accepts (each QP's next PSN only), and the gaps."""
    expected: dict[int, int] = {}
    out, gaps = [], 0
    for packet in packets:
        bth = packet.bth
        if bth.opcode == Opcode.ACKNOWLEDGE:
            continue  # a response: the other direction's PSNs
        want = expected.get(bth.dest_qp, bth.psn)
        if bth.psn != want:
            if (bth.psn - want) & _PSN_MASK < 0x800000:
                gaps += 1  # ahead: the responder NAKs and drops it
            continue  # behind: a duplicate
        expected[bth.dest_qp] = (want + 1) & _PSN_MASK
        out.append(packet)
    return out, gaps


def delivered_stream(
    pcap: Path, receiver: str, rmb_size: int, expected: bytes | None = None
) -> Delivered:
    """Replay the capture's RDMA WRITEs and CDCs to ``receiver`` into a receive buffer of
    ``rmb_size`` bytes and return what a correct receiver delivers.

    The capture must hold one connection's receive buffer: its base is the lowest address
    written (the stream wraps it, so every offset is written).  Producer cursors that do
    not move forward (a failover validation CDC, an older one over another link) are
    ignored, as a receiver ignores them.  With ``expected``, the runs where the delivered
    bytes differ from it are listed.
    """
    packets, gaps = _accepted(_datagrams(pcap, receiver))
    vas = [p.reth.va for p in packets if p.bth.opcode in _WRITES and p.reth is not None]
    if not vas:
        return Delivered(gaps=gaps)
    base = min(vas)
    rmb = bytearray(rmb_size)
    at: dict[int, int] = {}  # QP -> where its current WRITE message goes next
    digest = hashlib.sha256()
    result = Delivered(gaps=gaps)
    consumed = 0
    for packet in packets:
        bth = packet.bth
        if bth.opcode in _WRITES:
            if packet.reth is not None:
                at[bth.dest_qp] = packet.reth.va - base
            offset = at[bth.dest_qp]
            end = offset + len(packet.payload)
            if end > rmb_size:
                raise ValueError(f"a WRITE to {offset}..{end} leaves the {rmb_size}-byte RMB")
            rmb[offset:end] = packet.payload
            at[bth.dest_qp] = end
            continue
        payload = bytes(packet.payload)
        if bth.opcode != Opcode.SEND_ONLY or len(payload) != CDC_LEN or payload[0] != CDC_TYPE:
            continue  # LLC
        cdc = CdcMessage.decode(payload)
        if cdc.producer_flags & ProducerFlags.FAILOVER_VALIDATION:
            continue
        produced = cdc.producer_cursor.wrap * rmb_size + cdc.producer_cursor.count
        while consumed < produced:  # an older or repeated cursor moves nothing
            offset = consumed % rmb_size
            n = min(produced - consumed, rmb_size - offset)
            piece = rmb[offset : offset + n]
            digest.update(piece)
            if expected is not None:
                result.deviations += _runs(piece, expected, consumed)
            consumed += n
    result.nbytes, result.sha256 = consumed, digest.hexdigest()
    return result


def _runs(piece: bytes | bytearray, expected: bytes, start: int) -> list[Deviation]:
    """Each run where ``piece`` (at stream ``start``) differs from ``expected``: the
    1 KiB blocks that differ, consecutive ones joined, trimmed to the bytes that differ."""
    step = 1024
    blocks = [
        lo
        for lo in range(0, len(piece), step)
        if piece[lo : lo + step] != expected[start + lo : start + lo + step]
    ]
    out: list[Deviation] = []
    while blocks:
        first = blocks.pop(0)
        last = first
        while blocks and blocks[0] == last + step:
            last = blocks.pop(0)
        lo = _first_difference(piece, expected, start, first, last + step)
        hi = _last_difference(piece, expected, start, first, min(last + step, len(piece)))
        out.append(Deviation(start + lo, hi - lo + 1, _ahead(piece, expected, start, lo, hi + 1)))
    return out


def _differs(piece: bytes | bytearray, expected: bytes, start: int, i: int) -> bool:
    return start + i >= len(expected) or piece[i] != expected[start + i]


def _first_difference(
    piece: bytes | bytearray, expected: bytes, start: int, lo: int, hi: int
) -> int:
    return next(i for i in range(lo, hi) if _differs(piece, expected, start, i))


def _last_difference(
    piece: bytes | bytearray, expected: bytes, start: int, lo: int, hi: int
) -> int:
    return next(i for i in range(hi - 1, lo - 1, -1) if _differs(piece, expected, start, i))


def _ahead(
    piece: bytes | bytearray, expected: bytes, start: int, lo: int, hi: int
) -> tuple[int, ...]:
    """How far ahead in ``expected`` each part of ``piece[lo:hi]`` is found (see
    :attr:`Deviation.ahead`)."""
    out: list[int] = []
    pos = lo
    while pos < hi:
        probe = bytes(piece[pos : min(pos + 64, hi)])
        found = expected.find(probe, start + pos + 1)
        if found < 0:
            return (*out, 0)
        distance = found - (start + pos)
        n = 0  # how far the part goes on at that distance, a block at a time, then bytes
        while pos + n + 64 <= hi and piece[pos + n : pos + n + 64] == expected[
            start + pos + n + distance : start + pos + n + distance + 64
        ]:
            n += 64
        while pos + n < hi and piece[pos + n] == expected[start + pos + n + distance]:
            n += 1
        out.append(distance)
        pos += n
    return tuple(out)
