"""The sock_ops program that puts the SMC option into SYN and SYN-ACK, assembled here.

What it does, per callback (``BPF_SOCK_OPS_*``), for sockets of the cgroup it
is attached to:

* ``TCP_CONNECT`` / ``TCP_LISTEN``: a socket whose entry in the per-socket map
  says ``want`` (set by smcr before ``connect``/``listen``) gets the
  write-header-option callbacks switched on; a listener also keeps each SYN
  (``TCP_SAVE_SYN``) so that the established child can look at it.
* ``HDR_OPT_LEN`` / ``WRITE_HDR_OPT``: a SYN of a ``want`` socket gets the
  option (kind 254, length 6, ExID 0xE2D4C3D9; the kernel pads it to 8 bytes);
  a SYN-ACK gets it only when the SYN had it, and never when the SYN-ACK is a
  SYN cookie: the cookie's connection keeps no SYN to look at later, so the
  server could not know that the client asked; both ends then stay TCP.
* ``ACTIVE_ESTABLISHED`` (the SYN-ACK) / ``PASSIVE_ESTABLISHED`` (the saved
  SYN): sets ``peer`` in the socket's entry when that segment had the option,
  and switches the header callbacks off again (data segments carry nothing).
* A SYN-ACK also goes without the option while the ports map holds a count
  other than 0 for its local port: a listener with ``SMC_LIMIT_HS`` whose SMC
  handshakes are congested says so there, and its new clients stay TCP (Linux's
  ``smc_hs_congested``, which clears ``smc_ok`` of the request).  The SYN-ACK is
  sent for a request socket, not the listener, so the listener's own entry is
  out of reach there; its port is not.  The request's peer (address, port and
  local port) then goes into the withheld map: its retransmitted SYN-ACKs go
  without the option too, whatever the count says by then, and at
  ``PASSIVE_ESTABLISHED`` the entry (taken out) says the SYN's option was not
  answered, so ``peer`` stays 0 and both ends are TCP.  Entries of requests that
  never complete age out of the map (LRU).

The child of a listener gets a copy of the listener's entry (``BPF_F_CLONE``),
so ``want`` is already set there.  The map is keyed by socket: user space
passes a socket descriptor as the key, and a process can only ever reach the
entries of sockets it holds.  Sockets without an entry cost one failed lookup
in the established callbacks and nothing else.

The layout of ``struct bpf_sock_ops`` and the helper numbers are the kernel's
UAPI (stable); :data:`VALUE` is the map's value, ``{u32 want; u32 peer;}``.
"""

from __future__ import annotations

import struct
import sys

from smcr.wire.tcpopt import build_smc_option

PROG_TYPE_SOCK_OPS = 13
ATTACH_CGROUP_SOCK_OPS = 3
MAP_TYPE_SK_STORAGE = 24
MAP_F_NO_PREALLOC = 1
MAP_F_CLONE = 512

VERSION = 2
"""Of the program: one more whenever what it does changes, so that ``smcr enable`` replaces
a program an earlier smcr attached (:data:`smcr.discovery.bpf.PROG_PIN`)."""

VALUE = struct.Struct("=II")
"""The map's value: ``want`` (user space), ``peer`` (the program)."""

MAP_TYPE_HASH = 1
PORTS_MAX = 4096
PORT = struct.Struct("=I")
"""The ports map's key (a local port, host order) and value (listeners of that port whose
SMC handshakes are congested)."""

MAP_TYPE_LRU_HASH = 9
WITHHELD_MAX = 4096
WITHHELD_KEY = struct.Struct("=6I")
"""The withheld map's key: the peer's address (IPv4 in the first word, the rest 0), the
peer's port and the local port, as ``struct bpf_sock_ops`` holds them; its value is a u32."""

# sock_ops callbacks
_OP_CONNECT, _OP_ACTIVE_EST, _OP_PASSIVE_EST = 3, 4, 5
_OP_LISTEN, _OP_HDR_LEN, _OP_WRITE_HDR = 11, 14, 15
# helpers
_MAP_LOOKUP_ELEM, _MAP_UPDATE_ELEM, _MAP_DELETE_ELEM = 1, 2, 3
_SETSOCKOPT, _CB_FLAGS_SET, _SK_STORAGE_GET = 49, 59, 107
_LOAD_HDR_OPT, _STORE_HDR_OPT, _RESERVE_HDR_OPT = 142, 143, 144
# struct bpf_sock_ops offsets
_CTX_OP, _CTX_ARG0, _CTX_FAMILY, _CTX_REMOTE_IP4, _CTX_REMOTE_IP6 = 0, 4, 20, 24, 32
_CTX_REMOTE_PORT, _CTX_LOCAL_PORT, _CTX_CB_FLAGS = 64, 68, 84
_AF_INET = 2
_V4_MAPPED = int.from_bytes(b"\0\0\xff\xff", sys.byteorder)  # ::ffff:a.b.c.d's third word
# the stack: the option at r10-8, a port key at r10-12, a withheld key at r10-40 and its
# value at r10-44
_PORT_KEY, _PEER_KEY, _WITHHELD_VALUE = -12, -40, -44
_CTX_SK, _CTX_TCP_FLAGS = 184, 212
_WRITE_HDR_OPT_CB_FLAG = 1 << 6
_SYNACK_COOKIE = 2  # BPF_WRITE_HDR_TCP_SYNACK_COOKIE in args[0]
_LOAD_FROM_SYN = 1  # BPF_LOAD_HDR_OPT_TCP_SYN
_SOL_TCP, _TCP_SAVE_SYN = 6, 27
_TH_SYN, _TH_ACK = 0x02, 0x10

_OPTION = build_smc_option(aligned=False) + b"\0\0"
_OPT_LO, _OPT_HI = struct.unpack("<ii", _OPTION)  # stored as two 32-bit words on the stack

# instruction encoding
_ALU64, _LDX, _ST, _STX, _JMP, _JMP32, _LD = 0x07, 0x01, 0x02, 0x03, 0x05, 0x06, 0x00
_MOV, _ADD, _AND, _OR = 0xB0, 0x00, 0x50, 0x40
_K, _X = 0x00, 0x08
_W, _DW, _MEM, _IMM = 0x00, 0x18, 0x60, 0x00
_JA, _JEQ, _JNE, _JSET, _CALL, _EXIT = 0x00, 0x10, 0x50, 0x40, 0x80, 0x90
R0, R1, R2, R3, R4, R5, R6, R7, R8, R9, R10 = range(11)


class Assembler:
    """Just enough of an eBPF assembler: instructions in order, jumps to named labels."""

    def __init__(self) -> None:
        self._insns: list[tuple[int, int, int, int | str, int]] = []
        self._labels: dict[str, int] = {}

    def _emit(self, code: int, dst: int = 0, src: int = 0, off: int | str = 0,
              imm: int = 0) -> None:  # fmt: skip
        self._insns.append((code, dst, src, off, imm))

    def label(self, name: str) -> None:
        """Name the next instruction."""
        self._labels[name] = len(self._insns)

    def mov(self, dst: int, src: int) -> None:
        """dst = src"""
        self._emit(_ALU64 | _MOV | _X, dst, src)

    def movi(self, dst: int, imm: int) -> None:
        """dst = imm"""
        self._emit(_ALU64 | _MOV | _K, dst, imm=imm)

    def addi(self, dst: int, imm: int) -> None:
        """dst += imm"""
        self._emit(_ALU64 | _ADD | _K, dst, imm=imm)

    def andi(self, dst: int, imm: int) -> None:
        """dst &= imm"""
        self._emit(_ALU64 | _AND | _K, dst, imm=imm)

    def ori(self, dst: int, imm: int) -> None:
        """dst |= imm"""
        self._emit(_ALU64 | _OR | _K, dst, imm=imm)

    def load32(self, dst: int, src: int, off: int) -> None:
        """dst = *(u32 *)(src + off)"""
        self._emit(_LDX | _MEM | _W, dst, src, off)

    def load64(self, dst: int, src: int, off: int) -> None:
        """dst = *(u64 *)(src + off)"""
        self._emit(_LDX | _MEM | _DW, dst, src, off)

    def store32(self, dst: int, off: int, imm: int) -> None:
        """*(u32 *)(dst + off) = imm"""
        self._emit(_ST | _MEM | _W, dst, off=off, imm=imm)

    def store32_reg(self, dst: int, off: int, src: int) -> None:
        """*(u32 *)(dst + off) = src"""
        self._emit(_STX | _MEM | _W, dst, src, off)

    def load_map(self, dst: int, map_fd: int) -> None:
        """dst = the map of ``map_fd`` (a two-slot ld_imm64 with BPF_PSEUDO_MAP_FD)."""
        self._emit(_LD | _DW | _IMM, dst, 1, imm=map_fd)
        self._emit(0)

    def jeq(self, dst: int, imm: int, label: str) -> None:
        """if dst == imm goto label"""
        self._emit(_JMP | _JEQ | _K, dst, off=label, imm=imm)

    def jne(self, dst: int, imm: int, label: str) -> None:
        """if dst != imm goto label"""
        self._emit(_JMP | _JNE | _K, dst, off=label, imm=imm)

    def jne32(self, dst: int, imm: int, label: str) -> None:
        """if (u32)dst != (u32)imm goto label"""
        signed = imm - (1 << 32) if imm >= 1 << 31 else imm
        self._emit(_JMP32 | _JNE | _K, dst, off=label, imm=signed)

    def jset(self, dst: int, imm: int, label: str) -> None:
        """if dst & imm goto label"""
        self._emit(_JMP | _JSET | _K, dst, off=label, imm=imm)

    def goto(self, label: str) -> None:
        """goto label"""
        self._emit(_JMP | _JA, off=label)

    def call(self, helper: int) -> None:
        """r0 = helper(r1..r5)"""
        self._emit(_JMP | _CALL, imm=helper)

    def exit(self) -> None:
        """return r0"""
        self._emit(_JMP | _EXIT)

    def assemble(self) -> bytes:
        """The instructions as the kernel takes them (little-endian, 8 bytes each)."""
        out = bytearray()
        for pc, (code, dst, src, off, imm) in enumerate(self._insns):
            rel = self._labels[off] - pc - 1 if isinstance(off, str) else off
            out += struct.pack("<BBhi", code, (src << 4) | dst, rel, imm)
        return bytes(out)


def _storage_of_sk(a: Assembler, map_fd: int, missing: str) -> None:
    """r0 = this socket's entry (no entry, or no full socket: goto ``missing``)."""
    a.load64(R2, R6, _CTX_SK)
    a.jeq(R2, 0, missing)
    a.load_map(R1, map_fd)
    a.movi(R3, 0)
    a.movi(R4, 0)
    a.call(_SK_STORAGE_GET)
    a.jeq(R0, 0, missing)


def _option_on_stack(a: Assembler) -> None:
    """The option's 8 bytes at r10-8 (the load helper matches kind and ExID)."""
    a.store32(R10, -8, _OPT_LO)
    a.store32(R10, -4, _OPT_HI)


def _call_with_option(a: Assembler, helper: int, length: int, flags: int | None) -> None:
    """r0 = helper(ctx, &option, length, flags) for the header-option helpers, with the
    option on the stack; ``flags`` None: the flags are in r9."""
    _option_on_stack(a)
    a.mov(R1, R6)
    a.mov(R2, R10)
    a.addi(R2, -8)
    a.movi(R3, length)
    if flags is None:
        a.mov(R4, R9)
    else:
        a.movi(R4, flags)
    a.call(helper)


def _cb_flags(a: Assembler, on: bool) -> None:
    """Switch the write-header-option callbacks of this socket on or off."""
    a.load32(R2, R6, _CTX_CB_FLAGS)
    if on:
        a.ori(R2, _WRITE_HDR_OPT_CB_FLAG)
    else:
        a.andi(R2, ~_WRITE_HDR_OPT_CB_FLAG)
    a.mov(R1, R6)
    a.call(_CB_FLAGS_SET)


def _port_congested(a: Assembler, ports_fd: int, congested: str) -> None:
    """goto ``congested`` when the ports map counts a congested listener for this
    request's local port."""
    a.load32(R1, R6, _CTX_LOCAL_PORT)
    a.store32_reg(R10, _PORT_KEY, R1)
    _map_call(a, _MAP_LOOKUP_ELEM, ports_fd, _PORT_KEY)
    a.jeq(R0, 0, "port_free")
    a.load32(R1, R0, 0)
    a.jne(R1, 0, congested)
    a.label("port_free")


def _peer_key(a: Assembler, tag: str) -> None:
    """The withheld map's key for this request (or connection) at r10-40; ``tag`` keeps
    the labels of each use apart.

    A v4-mapped IPv6 peer (an IPv4 client of a dual-stack listener) gives the IPv4 key,
    so the request and the established socket agree however each shows the peer (on
    this host's kernel both gave the same key without it too; the dual-stack test
    checks)."""
    a.load32(R1, R6, _CTX_FAMILY)
    a.jne(R1, _AF_INET, f"{tag}_v6")
    a.load32(R1, R6, _CTX_REMOTE_IP4)
    a.goto(f"{tag}_v4")
    a.label(f"{tag}_v6")
    for word, mapped in ((0, 0), (1, 0), (2, _V4_MAPPED)):
        a.load32(R1, R6, _CTX_REMOTE_IP6 + 4 * word)
        a.jne32(R1, mapped, f"{tag}_v6_only")
    a.load32(R1, R6, _CTX_REMOTE_IP6 + 12)
    a.label(f"{tag}_v4")
    a.store32_reg(R10, _PEER_KEY, R1)
    for word in (1, 2, 3):
        a.store32(R10, _PEER_KEY + 4 * word, 0)
    a.goto(f"{tag}_ports")
    a.label(f"{tag}_v6_only")
    for word in range(4):
        a.load32(R1, R6, _CTX_REMOTE_IP6 + 4 * word)
        a.store32_reg(R10, _PEER_KEY + 4 * word, R1)
    a.label(f"{tag}_ports")
    a.load32(R1, R6, _CTX_REMOTE_PORT)
    a.store32_reg(R10, _PEER_KEY + 16, R1)
    a.load32(R1, R6, _CTX_LOCAL_PORT)
    a.store32_reg(R10, _PEER_KEY + 20, R1)


def _map_call(a: Assembler, helper: int, map_fd: int, key: int) -> None:
    """r0 = helper(map, r10 + key) (lookup, delete; an update's r3, r4 are the caller's)."""
    a.load_map(R1, map_fd)
    a.mov(R2, R10)
    a.addi(R2, key)
    a.call(helper)


def build(map_fd: int, ports_fd: int, withheld_fd: int) -> bytes:
    """The program, for the sk-storage map ``map_fd``, the ports map ``ports_fd`` and the
    withheld map ``withheld_fd`` (module docstring)."""
    a = Assembler()
    a.mov(R6, R1)  # r6 = ctx
    a.load32(R7, R6, _CTX_OP)  # r7 = op
    a.jeq(R7, _OP_CONNECT, "opt_in")
    a.jeq(R7, _OP_LISTEN, "opt_in")
    a.movi(R8, 0)
    a.jeq(R7, _OP_HDR_LEN, "header")
    a.movi(R8, 1)
    a.jeq(R7, _OP_WRITE_HDR, "header")
    a.movi(R9, 0)
    a.jeq(R7, _OP_ACTIVE_EST, "established")
    a.movi(R9, _LOAD_FROM_SYN)
    a.jeq(R7, _OP_PASSIVE_EST, "established")
    a.goto("out")

    # connect() / listen() of a socket that wants SMC
    a.label("opt_in")
    _storage_of_sk(a, map_fd, "out")
    a.load32(R1, R0, 0)
    a.jeq(R1, 0, "out")
    a.jne(R7, _OP_LISTEN, "switch_on")
    a.store32(R10, -4, 1)
    a.mov(R1, R6)
    a.movi(R2, _SOL_TCP)
    a.movi(R3, _TCP_SAVE_SYN)
    a.mov(R4, R10)
    a.addi(R4, -4)
    a.movi(R5, 4)
    a.call(_SETSOCKOPT)
    a.label("switch_on")
    _cb_flags(a, on=True)
    a.goto("out")

    # room for / writing of the option: r8 = 0 reserve, 1 write
    a.label("header")
    a.load32(R9, R6, _CTX_TCP_FLAGS)
    a.mov(R3, R9)
    a.andi(R3, _TH_SYN)
    a.jeq(R3, 0, "out")  # not a SYN (or no segment at all)
    a.jset(R9, _TH_ACK, "synack")
    # our SYN: only for a socket of this program's map that wants SMC
    _storage_of_sk(a, map_fd, "out")
    a.load32(R1, R0, 0)
    a.jeq(R1, 0, "out")
    a.goto("put")
    a.label("synack")  # echo only what the SYN asked for, and never in a SYN cookie
    a.load32(R3, R6, _CTX_ARG0)
    a.jset(R3, _SYNACK_COOKIE, "out")
    _call_with_option(a, _LOAD_HDR_OPT, 8, _LOAD_FROM_SYN)
    a.jne(R0, 6, "out")
    _peer_key(a, "synack")
    _map_call(a, _MAP_LOOKUP_ELEM, withheld_fd, _PEER_KEY)
    a.jne(R0, 0, "out")  # an earlier SYN-ACK of this request went without
    _port_congested(a, ports_fd, "withhold")
    a.label("put")
    a.jne(R8, 0, "write")
    a.mov(R1, R6)
    a.movi(R2, 6)
    a.movi(R3, 0)
    a.call(_RESERVE_HDR_OPT)
    a.goto("out")
    a.label("write")
    _call_with_option(a, _STORE_HDR_OPT, 6, 0)
    a.goto("out")
    a.label("withhold")  # (the key is still at r10-40)
    a.store32(R10, _WITHHELD_VALUE, 1)
    a.mov(R3, R10)
    a.addi(R3, _WITHHELD_VALUE)
    a.movi(R4, 0)  # BPF_ANY
    _map_call(a, _MAP_UPDATE_ELEM, withheld_fd, _PEER_KEY)
    a.goto("out")

    # the handshake is done: did the peer's SYN-ACK (r9 = 0) / SYN (r9 = 1) have it?
    a.label("established")
    _storage_of_sk(a, map_fd, "out")
    a.mov(R8, R0)
    a.load32(R1, R8, 0)
    a.jeq(R1, 0, "out")
    _call_with_option(a, _LOAD_HDR_OPT, 8, None)
    a.jne(R0, 6, "switch_off")
    a.jne(R9, _LOAD_FROM_SYN, "offered")  # the server: was the SYN answered in kind?
    _peer_key(a, "passive")
    _map_call(a, _MAP_DELETE_ELEM, withheld_fd, _PEER_KEY)
    a.jeq(R0, 0, "switch_off")  # deleted: the SYN-ACK went without, both ends are TCP
    a.label("offered")
    a.store32(R8, 4, 1)  # peer = 1
    a.label("switch_off")
    _cb_flags(a, on=False)

    a.label("out")
    a.movi(R0, 1)
    a.exit()
    return a.assemble()


def btf() -> tuple[bytes, int, int]:
    """BTF for the map (an sk-storage map must have typed key and value):
    ``(blob, key type id, value type id)``."""
    names = b"\0int\0smcr_sk\0want\0peer\0"

    def name(text: str) -> int:
        return names.index(text.encode() + b"\0")

    types = struct.pack("<IIII", name("int"), 1 << 24, 4, (1 << 24) | 32)  # [1] int, signed
    types += struct.pack("<III", name("smcr_sk"), (4 << 24) | 2, VALUE.size)  # [2] struct
    for i, member in enumerate(("want", "peer")):
        types += struct.pack("<III", name(member), 1, i * 32)
    header = struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(types), len(types), len(names))
    return header + types + names, 1, 2
