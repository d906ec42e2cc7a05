"""Write what smcr sends as a pcap file that Wireshark and tshark can read.

Two uses: ``smcr demo`` and the tests show that Wireshark decodes smcr's
messages the way smcr meant them, and later ``smcr trace`` records live
traffic.  :class:`PcapWriter` is the classic libpcap format (microsecond
timestamps, Ethernet link type); :class:`TcpFlow` turns CLC messages into the
segments of a TCP connection (with the SMC option in SYN and SYN-ACK), so that
Wireshark's SMC heuristic, which looks at TCP payloads, finds them.
:func:`roce_frame` puts a :class:`~smcr.wire.roce_packet.RocePacket` into a
frame with its ICRC.

Files are created with :func:`open` mode ``"xb"`` by default: we never write
through a path that someone else pre-created (smc-tools once had a predictable
temporary-file bug; see design/TOOLS.md).
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

from smcr.wire import inet
from smcr.wire.roce_packet import (
    RocePacket,
    build_ipv4_udp_roce_frame,
    build_ipv6_udp_roce_frame,
)
from smcr.wire.tcpopt import build_smc_option

PCAP_MAGIC = 0xA1B2C3D4
LINKTYPE_ETHERNET = 1

_GLOBAL = struct.Struct("<IHHiIII")
_RECORD = struct.Struct("<IIII")


class PcapWriter:
    """A libpcap (not pcapng) writer of Ethernet frames.

    :param target: a path (created exclusively unless ``overwrite``) or an
        open binary file.
    """

    def __init__(self, target: str | Path | BinaryIO, *, overwrite: bool = False) -> None:
        if isinstance(target, (str, Path)):
            self._file: BinaryIO = open(target, "wb" if overwrite else "xb")  # noqa: SIM115
            self._owned = True
        else:
            self._file = target
            self._owned = False
        self._file.write(_GLOBAL.pack(PCAP_MAGIC, 2, 4, 0, 0, 65535, LINKTYPE_ETHERNET))
        self.frames = 0

    def write(self, frame: bytes, timestamp: float | None = None) -> None:
        """Append one frame, stamped with ``timestamp`` (default: now)."""
        ts = time.time() if timestamp is None else timestamp
        sec = int(ts)
        usec = round((ts - sec) * 1_000_000)
        if usec >= 1_000_000:
            sec, usec = sec + 1, usec - 1_000_000
        self._file.write(_RECORD.pack(sec, usec, len(frame), len(frame)))
        self._file.write(frame)
        self.frames += 1

    def flush(self) -> None:
        """Push what is written to the file (``smcr trace``: a reader may follow it)."""
        self._file.flush()

    def close(self) -> None:
        """Flush, and close the file if this writer opened it."""
        self._file.flush()
        if self._owned:
            self._file.close()

    def __enter__(self) -> PcapWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One side of a synthetic flow: MAC, IPv4 address and port."""

    mac: bytes
    ip: str
    port: int


def ipv4_frame(src: Endpoint, dst: Endpoint, protocol: int, l4: bytes, *, ttl: int = 64) -> bytes:
    """Ethernet + IPv4 (ID 0, DF) around a layer-4 segment."""
    ip = inet.ipv4_header(src.ip, dst.ip, len(l4), protocol=protocol, ttl=ttl)
    return inet.ethernet_frame(src.mac, dst.mac, inet.ETH_P_IP, ip + l4)


def ip_frame(src: Endpoint, dst: Endpoint, protocol: int, l4: bytes) -> bytes:
    """Ethernet + IPv4 (as :func:`ipv4_frame`) or IPv6, as the addresses are."""
    if ":" not in src.ip:
        return ipv4_frame(src, dst, protocol, l4)
    ip = inet.ipv6_header(src.ip, dst.ip, len(l4), hop_limit=64, next_header=protocol)
    return inet.ethernet_frame(src.mac, dst.mac, inet.ETH_P_IPV6, ip + l4)


def roce_frame(src: Endpoint, dst: Endpoint, packet: RocePacket, *, ttl: int = 1) -> bytes:
    """Ethernet + a RoCEv2 datagram (UDP to 4791 from ``src.port``) with its ICRC, over
    IPv4 or (addresses with a colon) IPv6.

    IPv4 ID 0, DF and UDP checksum 0 as rxe sends them; TTL (hop limit) 1 is
    what Linux SMC-R uses (spec rocev2 §1.4).
    """
    if ":" in src.ip:
        v6 = bytearray(build_ipv6_udp_roce_frame(packet, src.ip, dst.ip, src.port,
                                                 hop_limit=ttl))  # fmt: skip
        # IPv6 forbids UDP checksum 0 (RFC 8200 §8.1; Wireshark flags it); the ICRC
        # leaves the field out (masked), so filling it in changes nothing else.
        udp = v6[40:]
        pseudo = v6[8:40] + struct.pack("!IxxxB", len(udp), inet.IPPROTO_UDP)
        checksum = inet.internet_checksum(bytes(pseudo) + bytes(udp)) or 0xFFFF
        struct.pack_into("!H", v6, 46, checksum)
        return inet.ethernet_frame(src.mac, dst.mac, inet.ETH_P_IPV6, bytes(v6))
    datagram = build_ipv4_udp_roce_frame(packet, src.ip, dst.ip, src.port, ttl=ttl)
    return inet.ethernet_frame(src.mac, dst.mac, inet.ETH_P_IP, datagram)


@dataclass
class TcpFlow:
    """A TCP connection made up for a capture: handshake, data, FIN.

    Sequence numbers and checksums are right, so Wireshark reassembles the
    stream and its SMC dissector finds the CLC messages in it.
    """

    client: Endpoint
    server: Endpoint
    client_isn: int = 1000
    server_isn: int = 5000
    _seq: dict[bool, int] = field(default_factory=dict)

    def _segment(self, from_client: bool, flags: int, payload: bytes, options: bytes) -> bytes:
        src, dst = (self.client, self.server) if from_client else (self.server, self.client)
        seq = self._seq[from_client]
        ack = self._seq[not from_client] if flags & inet.TCP_ACK else 0
        tcp = inet.tcp_segment(
            src.ip, dst.ip, src.port, dst.port, seq, ack, flags, payload, options=options
        )
        consumes_seq = bool(flags & (inet.TCP_SYN | inet.TCP_FIN))
        self._seq[from_client] = seq + len(payload) + consumes_seq
        return ip_frame(src, dst, inet.IPPROTO_TCP, tcp)

    def handshake(self, *, smc_option: bool = True) -> list[bytes]:
        """SYN, SYN-ACK, ACK; the SYN and SYN-ACK carry the SMC option if asked."""
        self._seq = {True: self.client_isn, False: self.server_isn}
        opt = build_smc_option() if smc_option else b""
        return [
            self._segment(True, inet.TCP_SYN, b"", opt),
            self._segment(False, inet.TCP_SYN | inet.TCP_ACK, b"", opt),
            self._segment(True, inet.TCP_ACK, b"", b""),
        ]

    def data(self, from_client: bool, payload: bytes) -> bytes:
        """One PSH/ACK segment carrying ``payload``."""
        return self._segment(from_client, inet.TCP_PSH | inet.TCP_ACK, payload, b"")

    def fin(self, from_client: bool) -> bytes:
        """A FIN/ACK from one side."""
        return self._segment(from_client, inet.TCP_FIN | inet.TCP_ACK, b"", b"")
