"""Lean, allocation-light RoCEv2 header packing and ICRC for the RNIC's data path.

Design: :mod:`smcr.wire.roce_packet` decodes a packet into frozen dataclasses
(about 5 µs each), which is right for tools and tests but costs more than the
whole rest of a packet's handling here.  This module does the same work with
one precompiled :class:`struct.Struct` per step and plain ints and tuples:

* :func:`parse_bth` returns ``(opcode, b1, p_key, dest_qp_word, psn_word)``;
  the caller takes PSN, AckReq and PadCnt out of the ints itself;
* :class:`IcrcV4` computes the ICRC (spec rocev2 §4, :mod:`smcr.wire.icrc`) of a
  packet of one flow from a single 40-byte masked IPv4+UDP+BTH header packed per
  packet, continued over the extension headers, payload and pad (``crc32`` runs on
  from a seed, so nothing is joined); :meth:`IcrcFlow.compute` is
  :func:`smcr.wire.icrc.icrc` itself, and the per-packet loops (:meth:`IcrcFlow.frames`,
  :meth:`IcrcV4.verify`) pack the same masked header inline, with the flow's
  constants in locals;
* :class:`IcrcV6` does the same for IPv6, where every covered field is known
  to a UDP receiver, so the check is exact;
* :func:`recover_id` implements option (c) of spec §4.4: a UDP socket
  never sees the IPv4 ID that the ICRC covers, so a packet whose ICRC fails
  with ID 0 (what our own sender, an unconnected ``IP_PMTUDISC_DO`` socket,
  puts there) is checked for *some* 16-bit ID that makes it consistent, by CRC
  linearity: ``crc(m ^ e) = crc(m) ^ crc(e) ^ crc(0)`` for equal lengths.
  What it costs: 16 of the ICRC's 32 bits go into finding the ID, so a
  corrupted packet passes with probability 2**-16 instead of 2**-32 (the
  Ethernet FCS and the UDP checksum, which our senders fill in, still guard
  the link); IDs 1-127, which our own UDP GSO runs carry, are one dict look-up.

Every function here is tested for agreement with the codecs of
:mod:`smcr.wire.roce_packet` (``tests/roce/test_fastpath.py``).
"""

from __future__ import annotations

import importlib
import struct
from collections.abc import Sequence
from functools import lru_cache
from types import ModuleType
from typing import ClassVar, Final

from smcr.wire import icrc as wire_icrc
from smcr.wire import roce as wire_roce
from smcr.wire import roce_packet
from smcr.wire.icrc import crc32, icrc, masked_ipv4_headers, masked_ipv6_headers
from smcr.wire.roce import _LENGTH_BY_BYTE, _MASK_BY_BYTE, ROCEV2_UDP_PORT


def _c_loops() -> ModuleType | None:
    """The C loops (``_loops.c``), built with the compiled modules and served with them
    (:mod:`smcr.native`): :meth:`IcrcFlow.place_middles`, :meth:`IcrcFlow.send_run` and
    :meth:`IcrcFlow.send_packets` run there, the RNIC reads its sockets with its
    ``recvgro`` and checks ICRCs with its ``verify``.  None in a pure-Python process,
    where the RNIC sends what :meth:`IcrcFlow.run_frames` and :meth:`IcrcFlow.frames`
    build and Python's loops run."""
    try:
        return importlib.import_module("smcr.rdma.roce._loops")
    except ImportError:
        return None


#: :func:`_c_loops`; tests set it to None to run the Python loops in a compiled process.
LOOPS: ModuleType | None = _c_loops()

Buffer = bytes | bytearray | memoryview

# smcr.wire.roce's header layouts (BTH, RETH, a 32-bit word: AETH, ImmDt) and
# smcr.wire.icrc's, as Final names of this module (the compiled build keeps them in C
# statics, not in the module's dict): the ICRC, the masked headers, the CRC seed
BTH: Final = wire_roce._BTH
RETH: Final = wire_roce._RETH
U32: Final = wire_roce._U32
ICRC: Final = wire_icrc.ICRC
_V4_MASKED: Final = wire_icrc.IPV4_MASKED
_V6_MASKED: Final = wire_icrc.IPV6_MASKED
_SEED: Final = wire_icrc.ICRC_SEED
#: The parts of a masked IPv4 header that vary within a run of Middles: the ID, the
#: fixed 30 bytes between (see :meth:`IcrcV4._varying`), the PSN word.
_ID_MID_PSN: Final = struct.Struct(">H30sI")
#: The same for IPv6, cut at the BTH's P_Key: P_Key, the masked DestQP word, the PSN word.
_PKEY_QP_PSN: Final = struct.Struct(">H4sI")
#: A BTH as its fixed first 8 bytes (opcode, flags, P_Key, DestQP word) and the PSN word.
_BTH_SPLIT: Final = struct.Struct(">QI")
PADS: Final = roce_packet.PADS
#: The literals the loops need inlined (smcr.wire.roce.DEFAULT_P_KEY, _U24, ACK_REQ;
#: smcr.wire.inet.IP_DF): tests/roce/test_fastpath.py checks them against the wire codecs.
P_KEY: Final = 0xFFFF
U24: Final = 0xFFFFFF
ACK_REQ: Final = 0x80000000
IP_DF: Final = 0x4000
#: BTH + extension header length per opcode byte (0 for an unknown opcode).
HEADER_LENGTH: Final = _LENGTH_BY_BYTE
#: Extension-header flags per opcode byte (:class:`smcr.wire.roce.ExtHeader` as int).
HEADER_MASK: Final = _MASK_BY_BYTE
#: Offset of the IPv4 ID inside the ICRC input (8 bytes of pseudo-LRH, then IP byte 4).
_ID_OFFSET: Final = 8 + 4


def parse_bth(view: Buffer) -> tuple[int, int, int, int, int]:
    """``(opcode, b1, p_key, dest_qp_word, psn_word)`` of the first 12 bytes.

    ``b1`` holds SE (bit 7), PadCnt (bits 5:4) and TVer (3:0); ``psn_word``
    holds AckReq (bit 31) and the PSN (23:0); ``dest_qp_word`` FECN/BECN and
    the DestQP (23:0).
    """
    op, b1, pkey, dqp, psn = BTH.unpack_from(view)
    return op, b1, pkey, dqp, psn


def pack_bth(opcode: int, b1: int, dest_qp: int, psn_word: int) -> bytes:
    """The 12 wire bytes of a BTH with P_Key 0xFFFF and FECN/BECN 0."""
    return BTH.pack(opcode, b1, P_KEY, dest_qp, psn_word)


def pack_reth(va: int, rkey: int, length: int) -> bytes:
    """The 16 bytes of a RETH."""
    return RETH.pack(va, rkey, length)


def pack_aeth(syndrome: int, msn: int) -> bytes:
    """The 4 bytes of an AETH."""
    return U32.pack((syndrome << 24) | (msn & U24))


class MiddleRun:
    """``count`` Middle packets of one SEND/WRITE, queued as one entry (the data path).

    Why: a 1 MiB WRITE is 256 packets of which all but two are Middles that differ
    only in PSN, AckReq and their slice of the message; one entry per run instead
    of a tuple per packet saves the sender about a third of its Python per packet.
    Packet ``i`` carries PSN ``psn + i``, the ``pmtu`` bytes of ``data`` at
    ``offset + i * pmtu``, and AckReq when ``(index + i) % ack_every == ack_every - 1``
    (``index``: its packet number in the message, the requester's AckReq rule).
    """

    __slots__ = ("ack_every", "count", "data", "index", "offset", "opcode", "pmtu", "psn")

    def __init__(self, opcode: int, psn: int, data: Buffer, offset: int, pmtu: int, count: int,
                 index: int, ack_every: int) -> None:  # fmt: skip
        self.opcode = opcode
        self.psn = psn
        self.data = data
        self.offset = offset
        self.pmtu = pmtu
        self.count = count
        self.index = index
        self.ack_every = ack_every

    def split(self, n: int) -> MiddleRun:
        """The part from packet ``n`` on, as a run of its own."""
        return MiddleRun(self.opcode, (self.psn + n) & U24, self.data, self.offset + n * self.pmtu,
                         self.pmtu, self.count - n, self.index + n, self.ack_every)


class IcrcFlow:
    """What the ICRC calculators of both IP versions share: the flow, and the data path's
    runs of WRITE Middles (:meth:`run_frames`, :meth:`place_middles`).

    Within a run only the IPv4 ID and the PSN word of a packet's masked header
    vary, so a subclass cuts its header there once per run (``_varying``) and
    packs the varying part per packet with ``_VARYING`` (ID or fixed 16 bits, the
    fixed bytes between, the PSN word); ``_ID_STEP`` is 1 where the ID counts up
    per GSO segment (IPv4) and 0 where the cut is at a constant field (IPv6).

    :param src: source address (4 or 16 bytes).
    :param dst: destination address.
    :param sport: UDP source port.
    :param dport: UDP destination port (4791).
    """

    __slots__ = ("_cuts", "_scratch", "dport", "dst", "head", "sport", "src")
    _VARYING: ClassVar[struct.Struct]
    _ID_STEP: ClassVar[int]
    _IPV6: ClassVar[bool]

    def __init__(self, src: bytes, dst: bytes, sport: int, dport: int = ROCEV2_UDP_PORT) -> None:
        self.src = src
        self.dst = dst
        self.sport = sport
        self.dport = dport
        #: :meth:`send_run`'s headers and ICRCs (the C loop's scratch; one sender at a time:
        #: the QP's lock)
        self._scratch = bytearray(16 * 64 + 4)
        self._cuts: dict[tuple[int, int, int, int], tuple[int, bytes, int]] = {}
        #: the masked header with the flow's constants and zeros where a packet's lengths,
        #: IPv4 ID and BTH go: the template the C loops (:data:`LOOPS` ``verify``,
        #: ``sendq``) fill in per packet
        self.head = self._masked(0, 0, 0, 0, 0, 0)

    def _masked(self, ulen: int, opcode: int, b1: int, dest_qp: int, psn_word: int,
                ip_id: int) -> bytes:  # fmt: skip
        """The masked IP + UDP + BTH header the ICRC of a packet of this flow covers
        (:func:`smcr.wire.icrc.masked_ipv4_headers` or ``masked_ipv6_headers``)."""
        raise NotImplementedError

    def compute(
        self, opcode: int, b1: int, dest_qp: int, psn_word: int, rest: Buffer, payload: Buffer,
        ip_id: int = 0,
    ) -> int:  # fmt: skip
        """ICRC of a packet (with IPv4 ID ``ip_id`` and DF set; IPv6 has no ID).

        :param rest: the extension headers (may be empty).
        :param payload: the payload; the pad is derived from ``b1``'s PadCnt.
        """
        pad = (b1 >> 4) & 3
        ulen = 8 + 12 + len(rest) + len(payload) + pad + 4
        masked = self._masked(ulen, opcode, b1, dest_qp, psn_word, ip_id)
        return icrc(masked, rest, payload, PADS[pad])

    def check(self, packet: memoryview) -> int:
        """Whether a received UDP payload (BTH through ICRC) carries a right ICRC:
        :meth:`verify` with its BTH unpacked here."""
        opcode, b1, _pkey, dqp_word, psn_word = BTH.unpack_from(packet)
        return self.verify(packet, len(packet), opcode, b1, dqp_word, psn_word)

    def verify(self, packet: memoryview, n: int, opcode: int, b1: int, dqp_word: int,
               psn_word: int) -> int:  # fmt: skip
        """:meth:`check` for a packet of ``n`` bytes whose BTH the caller has unpacked:
        0 if the ICRC is wrong, else 1 (or 2: right with a recovered IPv4 ID)."""
        raise NotImplementedError

    def judge(self, n: int, difference: int) -> int:
        """A packet of ``n`` bytes whose ICRC computed with IPv4 ID 0 differs by
        ``difference`` (non-zero) from the one it carries: 2 if some ID explains it
        (IPv4), else 0 (:meth:`verify`'s answer; the C loops' ``verify`` gives the
        difference)."""
        raise NotImplementedError

    def frames(self, queue: Sequence[tuple[int, int, int, bytes, Buffer]], start: int, end: int,
               dest_qp: int, id_base: int = 0) -> list[Buffer]:  # fmt: skip
        """The ``sendmsg`` buffers of the packets ``queue[start:end]``, one UDP GSO run.

        Each entry is ``(opcode, b1, psn_word, ext_headers, payload)``; packet
        ``k`` of the run gets IPv4 ID ``id_base + k`` (how the kernel numbers GSO
        segments; IPv6 has none).  Why here and in one loop: per packet this is the
        sender's hottest Python, so the masked header (:meth:`_masked`) is packed
        inline with the flow's constants in locals, and each packet's ICRC shares a
        buffer with the next packet's BTH, which halves the buffers handed to the kernel.
        """
        parts: list[Buffer] = []
        append = parts.append
        pack4, pack6, bth, put_icrc = _V4_MASKED.pack, _V6_MASKED.pack, BTH.pack, ICRC.pack
        src, dst, sport, dport = self.src, self.dst, self.sport, self.dport
        v6 = self._IPV6
        masked_qp = 0xFF000000 | (dest_qp & U24)
        tail = b""
        for k in range(start, end):
            opcode, b1, psn_word, ext, payload = queue[k]
            pad = (b1 >> 4) & 3
            ulen = 24 + len(ext) + len(payload) + pad
            if v6:
                crc = crc32(pack6(0x6FFFFFFF, ulen, 17, 0xFF, src, dst, sport, dport, ulen, 0xFFFF,
                                  opcode, b1, P_KEY, masked_qp, psn_word), _SEED)  # fmt: skip
            else:
                crc = crc32(pack4(0x45, 0xFF, ulen + 20, id_base + k - start, IP_DF, 0xFF, 17,
                                  0xFFFF, src, dst, sport, dport, ulen, 0xFFFF, opcode, b1, P_KEY,
                                  masked_qp, psn_word), _SEED)  # fmt: skip
            head = bth(opcode, b1, P_KEY, dest_qp, psn_word)
            if ext:
                crc = crc32(ext, crc)
                head += ext
            append(tail + head if tail else head)
            if payload:
                crc = crc32(payload, crc)
                append(payload)
            if pad:
                crc = crc32(PADS[pad], crc)
                tail = PADS[pad] + put_icrc(crc)
            else:
                tail = put_icrc(crc)
        append(tail)
        return parts

    def _varying(self, ulen: int, opcode: int, dest_qp: int, id0: int) -> tuple[int, bytes, int]:
        """``(CRC of the masked header before the cut, fixed bytes to the PSN word, first
        value of the 16-bit field at the cut)`` for packets of UDP length ``ulen``."""
        raise NotImplementedError

    def _cut(self, ulen: int, opcode: int, dest_qp: int, id0: int) -> tuple[int, bytes, int]:
        """:meth:`_varying`, remembered: a flow's runs ask for the same few (one size, one
        opcode, one QP; on receive the first ID of a run, 0..63), and working one out
        costs a pack, a slice and a CRC (half a microsecond) per run."""
        key = (ulen, opcode, dest_qp, id0)
        cut = self._cuts.get(key)
        if cut is None:
            if len(self._cuts) >= 256:
                self._cuts.clear()
            cut = self._cuts[key] = self._varying(ulen, opcode, dest_qp, id0)
        return cut

    def run_frames(self, run: MiddleRun, start: int, m: int, dest_qp: int) -> list[Buffer]:
        """The ``sendmsg`` buffers of packets ``start .. start+m-1`` of ``run``, one GSO run.

        What ``frames`` gives for the same packets (IPv4 IDs 0..m-1), for a
        :class:`MiddleRun`: no extension headers, no pad, one size, so a packet is
        a slice, two small packs and two CRC calls; the buffers joined are the packets.
        """
        pm, data, every = run.pmtu, run.data, run.ack_every
        pre, mid, ident = self._cut(24 + pm, run.opcode, dest_qp, 0)
        bth8 = BTH.pack(run.opcode, 0, P_KEY, dest_qp, 0)[:8]
        psn = (run.psn + start) & U24
        off = run.offset + start * pm
        index = run.index + start
        parts: list[Buffer] = []
        append = parts.append
        pack, step, icrc, word_of = self._VARYING.pack, self._ID_STEP, ICRC.pack, U32.pack
        tail = b""
        for _ in range(m):
            word = psn | ACK_REQ if index % every == every - 1 else psn
            payload = data[off : off + pm]
            append(tail + bth8 + word_of(word))
            append(payload)
            tail = icrc(crc32(payload, crc32(pack(ident, mid, word), pre)))
            psn = (psn + 1) & U24
            off += pm
            index += 1
            ident += step
        append(tail)
        return parts

    def send_run(self, fd: int, name: bytes, gso: int, run: MiddleRun, start: int, m: int,
                 dest_qp: int, extra: list[Buffer]) -> int:  # fmt: skip
        """Send packets ``start .. start+m-1`` of ``run`` and then the buffers ``extra`` with
        one ``sendmsg`` on socket ``fd`` to the packed socket address ``name`` (UDP GSO
        segments of ``gso`` bytes, unless 0): the C loops' (:data:`LOOPS`, which must be
        there) :meth:`run_frames` and send in one, each payload straight from the run's
        buffer.  Raises :class:`OSError` as ``socket.sendmsg``.  Bytes sent."""
        assert LOOPS is not None
        pm = run.pmtu
        pre, mid, ident = self._cut(24 + pm, run.opcode, dest_qp, 0)
        sent: int = LOOPS.sendrun(fd, name, gso, self._scratch, run.data, run.offset + start * pm,
                                  pm, m, BTH.pack(run.opcode, 0, P_KEY, dest_qp, 0)[:8],
                                  (run.psn + start) & U24, run.index + start, run.ack_every,
                                  pre, mid, ident, self._ID_STEP, extra)  # fmt: skip
        return sent

    def send_packets(self, fd: int, name: bytes, gso: int,
                     queue: Sequence[tuple[int, int, int, bytes, Buffer]], start: int, end: int,
                     dest_qp: int) -> int:  # fmt: skip
        """Send ``queue[start:end]`` with one ``sendmsg`` on socket ``fd`` to the packed
        socket address ``name`` (UDP GSO segments of ``gso`` bytes, unless 0): what
        :meth:`frames` builds (IPv4 IDs 0, 1, 2...) and the send in one, in the C loops
        (:data:`LOOPS`, which must be there), each payload straight from its buffer.
        Raises :class:`OSError` as ``socket.sendmsg``.  Bytes sent."""
        assert LOOPS is not None
        sent: int = LOOPS.sendq(fd, name, gso, self.head, queue, start, end, dest_qp, 0)
        return sent

    def place_middles(self, view: memoryview, off: int, end: int, seg: int, ip_id: int,
                      dest_qp: int, psn: int, limit: int, target: memoryview,
                      toff: int) -> tuple[int, int]:  # fmt: skip
        """Check and place the in-order RDMA WRITE Middles at ``view[off:end]`` (one GRO read).

        The receiver's data path: packets of ``seg`` bytes, the first with IPv4 ID
        ``ip_id`` (its index in the read: how our own GSO runs arrive; ignored for
        IPv6), each must be an RDMA WRITE Middle for ``dest_qp`` with PSN ``psn``,
        ``psn + 1``..., no flags and a right ICRC; each one's payload is copied to
        ``target`` at ``toff``, ``toff + pmtu``...  Stops before the first packet
        that is not such (the caller's general path takes it: a different ID, a
        NAK case, the Last) and after ``limit`` packets.

        :returns: ``(packets placed, PSN of the last with AckReq or -1)``.
        """
        pm = seg - 16
        pre, mid, ident = self._cut(seg + 8, 0x07, dest_qp, ip_id)
        want = (0x07 << 56) | (P_KEY << 32) | dest_qp  # opcode, no flags, P_Key, DestQP
        loops = LOOPS
        if loops is not None:
            placed: tuple[int, int] = loops.place(view, off, end, seg, pre, mid, ident,
                                                  self._ID_STEP, want, psn, limit, target, toff)
            return placed
        pack, step = self._VARYING.pack, self._ID_STEP
        head, found = _BTH_SPLIT.unpack_from, ICRC.unpack_from
        count, ack = 0, -1
        while count < limit and off + seg <= end:
            fixed, word = head(view, off)
            if fixed != want or word & U24 != psn:
                break
            payload = view[off + 12 : off + seg - 4]
            if crc32(payload, crc32(pack(ident, mid, word), pre)) != found(view, off + seg - 4)[0]:
                break
            target[toff : toff + pm] = payload
            if word & ACK_REQ:
                ack = psn
            psn = (psn + 1) & U24
            count += 1
            off += seg
            ident += step
            toff += pm
        return count, ack


class IcrcV4(IcrcFlow):
    """The ICRC of the packets of one IPv4 flow (source/destination address and ports).

    :param src: source address, 4 bytes.
    :param dst: destination address, 4 bytes.
    :param sport: UDP source port.
    :param dport: UDP destination port (4791).
    """

    __slots__ = ()
    _VARYING = _ID_MID_PSN
    _ID_STEP = 1
    _IPV6 = False

    def _masked(self, ulen: int, opcode: int, b1: int, dest_qp: int, psn_word: int,
                ip_id: int) -> bytes:  # fmt: skip
        return masked_ipv4_headers(self.src, self.dst, self.sport, self.dport, ulen, opcode, b1,
                                   P_KEY, dest_qp, psn_word, ident=ip_id)  # fmt: skip

    def verify(self, packet: memoryview, n: int, opcode: int, b1: int, dqp_word: int,
               psn_word: int) -> int:  # fmt: skip
        """Whether a received packet of ``n`` bytes carries a consistent ICRC.

        :returns: 0 if not, 1 if it is right with IPv4 ID 0, 2 if right with a
            recovered ID.

        Tries ID 0 first (our own senders), then :meth:`recover_id` (rxe and
        hardware send a hashed ID that a UDP socket cannot see).  DF is assumed
        set, as rxe always sets it (spec §1.4).  The masked header is
        :meth:`_masked`'s, packed inline (the general receive path's per-packet work).
        """
        crc = crc32(
            _V4_MASKED.pack(
                0x45, 0xFF, n + 28, 0, IP_DF, 0xFF, 17, 0xFFFF, self.src, self.dst,
                self.sport, self.dport, n + 8, 0xFFFF,
                opcode, b1, P_KEY, 0xFF000000 | (dqp_word & U24), psn_word,
            ),
            _SEED,
        )  # fmt: skip
        if n > 16:
            crc = crc32(packet[12 : n - 4], crc)
        (found,) = ICRC.unpack_from(packet, n - 4)
        return 1 if crc == found else self.judge(n, crc ^ found)

    def judge(self, n: int, difference: int) -> int:
        """2 if an IPv4 ID explains the ``difference`` (:func:`recover_id`), else 0."""
        if difference in _small_ids(n):  # a UDP GSO segment's ID: 1, 2, 3...
            return 2
        return 0 if recover_id(n, difference) is None else 2

    def _varying(self, ulen: int, opcode: int, dest_qp: int, id0: int) -> tuple[int, bytes, int]:
        """The masked header of a packet with UDP length ``ulen`` cut around what varies
        within a run (:meth:`IcrcFlow.run_frames`): the CRC of the bytes before the
        IPv4 ID, the 30 fixed bytes from there to the PSN word, the first ID (``id0``)."""
        h = self._masked(ulen, opcode, 0, dest_qp, 0, 0)
        return crc32(h[:4], _SEED), h[6:36], id0


class IcrcV6(IcrcFlow):
    """The ICRC of the packets of one IPv6 flow; same interface as :class:`IcrcV4`.

    IPv6 has no ID, so a UDP receiver knows every covered field (addresses,
    payload length = UDP length, next header 17) and checks the ICRC exactly
    (spec §4.4).
    """

    __slots__ = ()
    _VARYING = _PKEY_QP_PSN
    _ID_STEP = 0
    _IPV6 = True

    def _masked(self, ulen: int, opcode: int, b1: int, dest_qp: int, psn_word: int,
                ip_id: int) -> bytes:  # fmt: skip
        return masked_ipv6_headers(self.src, self.dst, self.sport, self.dport, ulen, opcode, b1,
                                   P_KEY, dest_qp, psn_word)  # fmt: skip

    def verify(self, packet: memoryview, n: int, opcode: int, b1: int, dqp_word: int,
               psn_word: int) -> int:  # fmt: skip
        """1 if the ICRC of a received packet of ``n`` bytes is right, else 0 (the masked
        header packed inline, as :meth:`IcrcV4.verify`)."""
        crc = crc32(
            _V6_MASKED.pack(
                0x6FFFFFFF, n + 8, 17, 0xFF, self.src, self.dst, self.sport, self.dport, n + 8,
                0xFFFF, opcode, b1, P_KEY, 0xFF000000 | (dqp_word & U24), psn_word,
            ),
            _SEED,
        )  # fmt: skip
        if n > 16:
            crc = crc32(packet[12 : n - 4], crc)
        return 1 if crc == ICRC.unpack_from(packet, n - 4)[0] else 0

    def judge(self, n: int, difference: int) -> int:
        """0: IPv6 has no ID to recover, a difference is a wrong ICRC."""
        return 0

    def _varying(self, ulen: int, opcode: int, dest_qp: int, id0: int) -> tuple[int, bytes, int]:
        """As :meth:`IcrcV4._varying`; IPv6 has no ID, so the cut is at the BTH's P_Key
        (constant), and the rest is the masked DestQP word."""
        h = self._masked(ulen, opcode, 0, dest_qp, 0, 0)
        return crc32(h[:50], _SEED), h[52:56], P_KEY


def flow_icrc(src: bytes, dst: bytes, sport: int, dport: int = ROCEV2_UDP_PORT) -> IcrcV4 | IcrcV6:
    """The ICRC calculator of a flow: IPv4 for 4-byte addresses, IPv6 for 16-byte ones."""
    return (IcrcV4 if len(src) == 4 else IcrcV6)(src, dst, sport, dport)


@lru_cache(maxsize=64)
def _id_solver(length: int) -> tuple[tuple[int, int, int], ...]:
    """Row-reduced images of the 16 IPv4-ID bits for an ICRC input of ``length`` bytes.

    Returns ``(pivot_bit, vector, id_bits)`` triples: XOR-ing ``vector`` out of a
    CRC difference accounts for flipping ``id_bits`` of the ID.
    """
    zero = crc32(bytes(length))
    rows: list[tuple[int, int, int]] = []
    for bit in range(16):
        msg = bytearray(length)
        msg[_ID_OFFSET : _ID_OFFSET + 2] = (1 << bit).to_bytes(2, "big")
        vec, combo = crc32(msg) ^ zero, 1 << bit
        for pivot, rvec, rcombo in rows:
            if vec & pivot:
                vec ^= rvec
                combo ^= rcombo
        if vec:
            pivot = vec & -vec
            rows = [(p, v ^ vec, c ^ combo) if v & pivot else (p, v, c) for p, v, c in rows]
            rows.append((pivot, vec, combo))
    return tuple(rows)


@lru_cache(maxsize=64)
def _small_ids(udp_payload_length: int) -> dict[int, int]:
    """CRC difference -> ID for IDs 1..127, the IDs of our own UDP GSO segments.

    Why: a GSO run of k packets carries IDs 0..k-1 (see :meth:`RoceQp.flush_tx`),
    so most non-zero IDs we receive are small; one dict look-up finds them,
    where the general solver costs a 16-step loop.
    """
    length = 8 + 20 + 8 + udp_payload_length - 4
    zero = crc32(bytes(length))
    basis = []
    for bit in range(7):
        msg = bytearray(length)
        msg[_ID_OFFSET : _ID_OFFSET + 2] = (1 << bit).to_bytes(2, "big")
        basis.append(crc32(msg) ^ zero)
    table = {}
    for ident in range(1, 128):
        d = 0
        for bit in range(7):
            if ident >> bit & 1:
                d ^= basis[bit]
        table[d] = ident
    return table


def recover_id(udp_payload_length: int, difference: int) -> int | None:
    """The IPv4 ID that explains an ICRC ``difference`` (computed with ID 0 ^ found), or None.

    :param udp_payload_length: BTH through ICRC, in bytes.
    :param difference: the CRC computed assuming ID 0, XOR the ICRC found.
    :returns: the ID, or ``None`` if no ID explains it (a corrupted packet; with
        16 bits solved out of 32, about 1 in 65536 corruptions passes).
    """
    # ICRC input: 8 (pseudo-LRH) + 20 (IPv4) + 8 (UDP) + BTH..pad (payload - ICRC)
    length = 8 + 20 + 8 + udp_payload_length - 4
    ident = 0
    for pivot, vec, combo in _id_solver(length):
        if difference & pivot:
            difference ^= vec
            ident ^= combo
    return ident if difference == 0 else None
