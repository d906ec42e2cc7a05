"""``smcr trace``: a traced process's records (:mod:`smcr.diag.trace`) as frames Wireshark reads.

* CLC: the segments of the connection's TCP stream (its real addresses and
  ports), after a made-up SYN / SYN-ACK / ACK carrying the SMC option
  (:class:`~smcr.pcap.TcpFlow`): the handshake happened before the first CLC
  message, in the kernel, and Wireshark's SMC heuristic wants it.  Sequence
  numbers are synthetic; MACs are zero (the kernel's TCP is not ours to see).
* LLC and CDC: RoCEv2 SEND Only packets (UDP 4791) between the link's GIDs and
  MACs, to the peer's QP, with PSNs counted from the link's initial PSNs (over
  RoCE, from the RNIC's next PSNs when the link was up before the trace: then
  exact for what we send).  A GID that is an IPv4-mapped address (RoCE) gives
  IPv4 frames; the shm RNIC's GIDs (``fd73:6d63:7273:686d::/64``) give IPv6 ones.
* RDMA WRITEs: one RDMA WRITE Only packet per WRITE (BTH + RETH with the
  remote address, rkey and the whole DMA length), its payload cut to the snap
  length (default none); the PSNs advance as the packets the WRITE takes at
  the link's path MTU.  A WRITE received is inferred from the producer cursor
  of the CDC that announces it (one per contiguous piece of the RMB).
* ACKs are not recorded (the RNIC's business, not the process's).

Nothing a process sends is trusted: a record that does not check out is
counted (:attr:`TraceFramer.bad`) and skipped.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import zlib
from dataclasses import dataclass, field
from typing import Any

from smcr.pcap import Endpoint, TcpFlow, roce_frame
from smcr.wire.cdc import CdcMessage
from smcr.wire.errors import WireError
from smcr.wire.roce import Opcode, Reth
from smcr.wire.roce_packet import RocePacket, rdma_get_udp_sport

U24 = 0xFFFFFF
MAX_DATA = 1 << 16
_ZERO_MAC = bytes(6)
_CLC_EYECATCHER = bytes.fromhex("e2d4c3d9")
_FAILOVER = 0x08


class BadRecordError(ValueError):
    """A record that is not one."""


@dataclass
class _Link:
    local: Endpoint
    peer: Endpoint
    qpn: int
    peer_qpn: int
    psn: int
    peer_psn: int
    mtu: int  # bytes


@dataclass
class _Rx:
    rkey: int
    vaddr: int
    size: int
    wrap: int
    count: int


@dataclass
class TraceFramer:
    """The frames of one traced process's records, in the order they come."""

    links: dict[tuple[int, int], _Link] = field(default_factory=dict)
    flows: dict[tuple[int, int], tuple[TcpFlow, bool]] = field(default_factory=dict)
    rx: dict[tuple[int, int], _Rx] = field(default_factory=dict)
    bad: int = 0
    unframed: int = 0  # records of links never described
    last_ts: float = 0.0

    def frames(self, record: Any) -> list[tuple[float, bytes]]:
        """(timestamp, frame) for one record; [] for a record that makes none.  Timestamps
        never go back (an inferred WRITE is stamped just before its CDC)."""
        try:
            if not isinstance(record, dict):
                raise BadRecordError("not an object")
            kind = record.get("t")
            handler = _HANDLERS.get(kind) if isinstance(kind, str) else None
            if handler is None:
                raise BadRecordError(f"unknown record {kind!r}")
            out = []
            for ts, frame in handler(self, record):
                self.last_ts = max(ts, self.last_ts)
                out.append((self.last_ts, frame))
            return out
        except (BadRecordError, WireError, ValueError, TypeError, KeyError, OverflowError):
            self.bad += 1
            return []

    # ------------------------------------------------------------ records

    def _link(self, r: dict[str, Any]) -> list[tuple[float, bytes]]:
        qpn, peer_qpn = _int(r, "qpn", U24), _int(r, "peer_qpn", U24)
        local = _roce_end(_hex(r, "gid", 16), _hex(r, "mac", 6), qpn, peer_qpn)
        peer = _roce_end(_hex(r, "peer_gid", 16), _hex(r, "peer_mac", 6), qpn, peer_qpn)
        mtu_enum = _int(r, "mtu", 0xFF)
        mtu = 128 << mtu_enum if 1 <= mtu_enum <= 5 else 1024
        psn, peer_psn = _int(r, "psn", U24), _int(r, "peer_psn", U24)
        self.links[(_int(r, "dev", 0xFFFF), qpn)] = _Link(local, peer, qpn, peer_qpn, psn,
                                                          peer_psn, mtu)  # fmt: skip
        return []

    def _conn(self, r: dict[str, Any]) -> list[tuple[float, bytes]]:
        size = _int(r, "size", 1 << 40)
        if size <= 0:
            raise BadRecordError("RMB of no size")
        wrap, count = divmod(_int(r, "prod", 1 << 62), size)
        self.rx[(_int(r, "dev", 0xFFFF), _int(r, "token", 0xFFFFFFFF))] = _Rx(
            _int(r, "rkey", 0xFFFFFFFF), _int(r, "vaddr", (1 << 64) - 1), size, wrap & 0xFFFF,
            count)  # fmt: skip
        return []

    def _clc(self, r: dict[str, Any]) -> list[tuple[float, bytes]]:
        ts, data, out = _ts(r), _data(r), _bool(r, "out")
        key = (_int(r, "dev", 0xFFFF), _int(r, "conn", 1 << 62))
        out_frames = []
        known = self.flows.get(key)
        if known is None:
            local, peer = _addr(r, "local"), _addr(r, "peer")
            we_are_client = _sender_is_client(data) == out
            client, server = (local, peer) if we_are_client else (peer, local)
            seed = zlib.crc32(repr((client, server)).encode())
            flow = TcpFlow(client, server, client_isn=seed, server_isn=seed ^ 0x5A5A5A5A)
            known = self.flows[key] = (flow, we_are_client)
            out_frames = [(ts - 0.000_003 + i * 0.000_001, f) for i, f in
                          enumerate(flow.handshake())]  # fmt: skip
        flow, we_are_client = known
        out_frames.append((ts, flow.data(out == we_are_client, data)))
        return out_frames

    def _send(self, r: dict[str, Any]) -> list[tuple[float, bytes]]:
        ts, data, out = _ts(r), _data(r), _bool(r, "out")
        dev, qpn = _int(r, "dev", 0xFFFF), _int(r, "qpn", U24)
        link = self.links.get((dev, qpn))
        if link is None:
            self.unframed += 1
            return []
        frames = []
        if not out and len(data) >= 44 and data[0] == 0xFE:
            frames = self._inferred_writes(link, dev, ts, data)
        frames.append((ts, self._packet(link, out, Opcode.SEND_ONLY, data, se=True)))
        return frames

    def _write(self, r: dict[str, Any]) -> list[tuple[float, bytes]]:
        ts, data = _ts(r), _data(r)
        link = self.links.get((_int(r, "dev", 0xFFFF), _int(r, "qpn", U24)))
        if link is None:
            self.unframed += 1
            return []
        reth = Reth(va=_int(r, "va", (1 << 64) - 1), r_key=_int(r, "rkey", 0xFFFFFFFF),
                    dma_length=_int(r, "len", 0xFFFFFFFF))  # fmt: skip
        return [(ts, self._packet(link, True, Opcode.RDMA_WRITE_ONLY, data, reth=reth))]

    # ------------------------------------------------------------ framing

    def _packet(self, link: _Link, out: bool, opcode: Opcode, payload: bytes, *,
                se: bool = False, reth: Reth | None = None) -> bytes:  # fmt: skip
        length = reth.dma_length if reth is not None else len(payload)
        packets = max(1, -(-length // link.mtu))
        if out:
            src, dst, dest_qp, psn = link.local, link.peer, link.peer_qpn, link.psn
            link.psn = (psn + packets) & U24
        else:
            src, dst, dest_qp, psn = link.peer, link.local, link.qpn, link.peer_psn
            link.peer_psn = (psn + packets) & U24
        packet = RocePacket.build(opcode, dest_qp, psn, payload, ack_req=True, se=se, reth=reth)
        return roce_frame(src, dst, packet)

    def _inferred_writes(self, link: _Link, dev: int, ts: float,
                         data: bytes) -> list[tuple[float, bytes]]:  # fmt: skip
        """The WRITEs a received CDC's producer cursor says the peer made into our RMB."""
        cdc = CdcMessage.decode(data[:44])
        rx = self.rx.get((dev, cdc.alert_token))
        if rx is None or int(cdc.producer_flags) & _FAILOVER:
            return []
        wrap, count = cdc.producer_cursor.wrap, cdc.producer_cursor.count
        if (wrap, count) == (rx.wrap, rx.count) or count > rx.size:
            return []
        if wrap == rx.wrap:
            pieces = [(rx.count, count - rx.count)] if count > rx.count else []
        else:
            pieces = [(rx.count, rx.size - rx.count), (0, count)]
        rx.wrap, rx.count = wrap, count
        return [(ts - 0.000_001, self._packet(link, False, Opcode.RDMA_WRITE_ONLY, b"",
                                              reth=Reth(va=rx.vaddr + off, r_key=rx.rkey,
                                                        dma_length=n)))
                for off, n in pieces if n > 0]  # fmt: skip


_HANDLERS = {"link": TraceFramer._link, "conn": TraceFramer._conn, "clc": TraceFramer._clc,
             "send": TraceFramer._send, "write": TraceFramer._write}  # fmt: skip


# ---------------------------------------------------------------- checked fields


def _int(r: dict[str, Any], key: str, most: int) -> int:
    v = r[key]
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= most:
        raise BadRecordError(f"{key}: not an integer in 0..{most}")
    return v


def _bool(r: dict[str, Any], key: str) -> bool:
    v = r[key]
    if not isinstance(v, bool):
        raise BadRecordError(f"{key}: not a boolean")
    return v


def _ts(r: dict[str, Any]) -> float:
    v = r["ts"]
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v < 1 << 32:
        raise BadRecordError("ts: not a time")
    return float(v)


def _data(r: dict[str, Any]) -> bytes:
    v = r.get("data", "")
    if not isinstance(v, str) or len(v) > MAX_DATA * 4 // 3 + 4:
        raise BadRecordError("data: not base64 of at most 64 KiB")
    try:
        return base64.b64decode(v, validate=True)
    except (binascii.Error, ValueError):
        raise BadRecordError("data: not base64") from None


def _hex(r: dict[str, Any], key: str, size: int) -> bytes:
    v = r[key]
    if not isinstance(v, str) or len(v) != 2 * size:
        raise BadRecordError(f"{key}: not {size} bytes of hex")
    return bytes.fromhex(v)


def _addr(r: dict[str, Any], key: str) -> Endpoint:
    v = r[key]
    if not (isinstance(v, list) and len(v) == 2 and isinstance(v[0], str)
            and isinstance(v[1], int) and 0 <= v[1] <= 0xFFFF):  # fmt: skip
        raise BadRecordError(f"{key}: not [address, port]")
    ip = ipaddress.ip_address(v[0].split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return Endpoint(_ZERO_MAC, str(ip), v[1])


def _roce_end(gid: bytes, mac: bytes, qpn: int, peer_qpn: int) -> Endpoint:
    """A RoCEv2 end: the GID as its IP address (IPv4 if mapped), Linux's UDP source port."""
    addr = ipaddress.IPv6Address(gid)
    ip = str(addr.ipv4_mapped) if addr.ipv4_mapped is not None else str(addr)
    return Endpoint(mac, ip, rdma_get_udp_sport(0, qpn, peer_qpn))


def _sender_is_client(data: bytes) -> bool:
    """Whether a CLC message (the first of a connection seen) comes from the client:
    Proposal and Confirm do; Accept and Decline (most often) come from the server."""
    if len(data) >= 5 and data[:4] == _CLC_EYECATCHER:
        return data[4] in (1, 3)
    return True
