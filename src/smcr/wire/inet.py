"""IPv4, IPv6, UDP and TCP headers: just enough to put smcr's messages in frames.

smcr itself sends through the kernel's sockets, so it never needs these on the
data path.  They exist for two jobs that need whole frames: the ICRC of a
RoCEv2 packet covers the IP and UDP headers (spec rocev2 §4), and the pcap
writer (:mod:`smcr.pcap`) shows Wireshark CLC messages in a synthetic TCP
stream and LLC/CDC messages in RoCEv2 frames.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from typing import Final

Buffer = bytes | bytearray | memoryview

IPPROTO_TCP: Final = 6
IPPROTO_UDP: Final = 17
ETH_P_IP: Final = 0x0800
ETH_P_IPV6: Final = 0x86DD
IPV4_HEADER_LEN: Final = 20
IPV6_HEADER_LEN: Final = 40
UDP_HEADER_LEN: Final = 8
IP_DF: Final = 0x4000

IPV4_HEADER: Final = struct.Struct(">BBHHHBBH4s4s")
"""IPv4 without options: version/IHL, TOS, total length, ID, flags/fragment, TTL,
protocol, checksum, source, destination."""
_IPV4_WORDS: Final = struct.Struct(">10H")
IPV6_HEADER: Final = struct.Struct(">IHBB16s16s")
"""IPv6: version/traffic class/flow label, payload length, next header, hop limit,
source, destination."""
UDP_HEADER: Final = struct.Struct(">HHHH")
"""UDP: source port, destination port, length, checksum."""
_TCP: Final = struct.Struct(">HHIIBBHHH")
_ETH: Final = struct.Struct(">6s6sH")


def internet_checksum(data: Buffer) -> int:
    """RFC 1071 one's-complement sum of 16-bit words, as IPv4/TCP/UDP use it.

    Sums the whole buffer as one big integer slice-wise (``int.from_bytes`` on
    16-bit columns would be a per-word loop); the fold at the end reduces it.
    """
    raw = bytes(data)
    if len(raw) % 2:
        raw += b"\x00"
    total: int = sum(struct.unpack(f"!{len(raw) // 2}H", raw))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def _addr(family: int, addr: str | bytes, size: int) -> bytes:
    if isinstance(addr, str):
        return socket.inet_pton(family, addr)
    if len(addr) != size:
        raise ValueError(f"address must be {size} bytes")
    return bytes(addr)


def ipv4_checksum(header: Buffer) -> int:
    """The IPv4 header checksum (RFC 1071) of a 20-byte header whose checksum field is 0."""
    total: int = sum(_IPV4_WORDS.unpack(header))
    total = (total & 0xFFFF) + (total >> 16)
    total += total >> 16
    return ~total & 0xFFFF


def ipv4_header(
    src: str | bytes,
    dst: str | bytes,
    payload_length: int,
    *,
    ttl: int = 64,
    tos: int = 0,
    identification: int = 0,
    df: bool = True,
    protocol: int = IPPROTO_UDP,
) -> bytes:
    """A 20-byte IPv4 header with its checksum, as rxe's packets have it (spec §1.4).

    :param src: source address, dotted text or 4 bytes.
    :param dst: destination address.
    :param payload_length: bytes after the IP header (UDP header included).
    :param ttl: time to live; SMC-R uses 1.
    :param tos: type of service (DSCP/ECN); rxe sends the GRH traffic class, default 0.
    :param identification: the ID; 0 from an unconnected DF socket (spec §4.4).
    :param df: don't-fragment; rxe always sets it.
    """
    s = _addr(socket.AF_INET, src, 4)
    d = _addr(socket.AF_INET, dst, 4)
    length = IPV4_HEADER_LEN + payload_length
    frag = IP_DF if df else 0
    header = IPV4_HEADER.pack(0x45, tos, length, identification, frag, ttl, protocol, 0, s, d)
    checksum = ipv4_checksum(header)
    return IPV4_HEADER.pack(0x45, tos, length, identification, frag, ttl, protocol, checksum, s, d)


def ipv6_header(
    src: str | bytes,
    dst: str | bytes,
    payload_length: int,
    *,
    hop_limit: int = 64,
    traffic_class: int = 0,
    flow_label: int = 0,
    next_header: int = IPPROTO_UDP,
) -> bytes:
    """A 40-byte IPv6 header (rxe sends flow label 0, spec §1.4).

    :param payload_length: bytes after the IPv6 header (UDP header included).
    """
    s = _addr(socket.AF_INET6, src, 16)
    d = _addr(socket.AF_INET6, dst, 16)
    first = (6 << 28) | (traffic_class << 20) | flow_label
    return IPV6_HEADER.pack(first, payload_length, next_header, hop_limit, s, d)


def udp_header(
    sport: int, dport: int = 4791, payload_length: int = 0, checksum: int = 0
) -> bytes:
    """An 8-byte UDP header; rxe always sends checksum 0 (spec §1.2).

    :param payload_length: bytes after the UDP header (BTH through ICRC).
    """
    return UDP_HEADER.pack(sport, dport, UDP_HEADER_LEN + payload_length, checksum)



def _pseudo_header(src: str, dst: str, protocol: int, length: int) -> bytes:
    a = ipaddress.ip_address(src)
    b = ipaddress.ip_address(dst)
    if a.version == 4:
        return a.packed + b.packed + struct.pack("!BBH", 0, protocol, length)
    return a.packed + b.packed + struct.pack("!IxxxB", length, protocol)


TCP_FIN = 0x01
TCP_SYN = 0x02
TCP_RST = 0x04
TCP_PSH = 0x08
TCP_ACK = 0x10


def tcp_segment(
    src: str,
    dst: str,
    sport: int,
    dport: int,
    seq: int,
    ack: int,
    flags: int,
    payload: bytes = b"",
    *,
    options: bytes = b"",
    window: int = 65535,
) -> bytes:
    """A TCP header with ``options`` (padded to 4 bytes) plus payload, checksum filled in."""
    if len(options) % 4:
        options += b"\x00" * (4 - len(options) % 4)
    header_len = 20 + len(options)
    header = bytearray(
        _TCP.pack(sport, dport, seq & 0xFFFFFFFF, ack & 0xFFFFFFFF, (header_len // 4) << 4,
                  flags, window, 0, 0)
    )
    segment = bytes(header) + options + payload
    pseudo = _pseudo_header(src, dst, IPPROTO_TCP, len(segment))
    struct.pack_into("!H", header, 16, internet_checksum(pseudo + segment))
    return bytes(header) + options + payload


def ethernet_frame(src_mac: bytes, dst_mac: bytes, ethertype: int, payload: bytes) -> bytes:
    """An Ethernet II frame (no FCS, as captures store them)."""
    return _ETH.pack(dst_mac, src_mac, ethertype) + payload
