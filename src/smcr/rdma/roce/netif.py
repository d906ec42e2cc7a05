"""Network interfaces as RNIC candidates: addresses, MAC, MTU, and the RNIC list.

Design: rxe binds one RNIC to one net device and gives it one GID per address
(spec rocev2 §9); we give one RNIC per (interface, address), so a host with two
interfaces has two RNICs (see :func:`list_devices` for the names).  Everything
is read without privileges and without a subprocess: IPv4 addresses through
``SIOCGIFCONF``, IPv6 ones from ``/proc/net/if_inet6``, MAC and MTU from
``/sys/class/net``.  The port's active MTU is rxe's: the largest IB MTU that
fits in ``netdev MTU - 80`` (``rxe_set_mtu``, spec §3.1).
"""

from __future__ import annotations

import array
import fcntl
import socket
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from smcr.rdma.verbs import PathMtu, ipv4_mapped_gid

SIOCGIFCONF = 0x8912
SIOCGIFNETMASK = 0x891B
SIOCGIFFLAGS = 0x8913
SIOCGIFMTU = 0x8921
SIOCGIFHWADDR = 0x8927
IFF_LOOPBACK = 0x8
IFF_RUNNING = 0x40
_IFREQ = 40  # sizeof(struct ifreq) on 64-bit Linux
#: rxe's RXE_MAX_HDR_LENGTH: the MTU room it keeps for headers.
HEADER_ROOM = 80
#: Linux UDP socket options the RNIC's sockets use (the typeshed stubs lack them):
#: the level, GSO's segment size on send, GRO on receive.
SOL_UDP: Final = 17
UDP_SEGMENT: Final = 103
UDP_GRO: Final = 104
IFA_F_TENTATIVE = 0x40
SYS_NET = Path("/sys/class/net")


@dataclass(frozen=True, slots=True)
class RnicInfo:
    """One RNIC this host can open: what ``ibv_devices``/``rdma link`` would show.

    :param name: RNIC name.
    :param ifname: the net device.
    :param address: its IPv4 (dotted) or IPv6 address.
    :param gid: the RoCEv2 GID (IPv4-mapped, or the IPv6 address).
    :param mac: the interface MAC (6 bytes; zeros on loopback).
    :param mtu: the interface MTU.
    :param active_mtu: the largest path MTU (rxe's rule).
    :param operstate: ``up``, ``down``, ``unknown`` (loopback) as the kernel says.
    """

    name: str
    ifname: str
    address: str
    gid: bytes
    mac: bytes
    mtu: int
    active_mtu: PathMtu
    operstate: str
    scope_id: int = 0
    prefix_len: int = 0
    """The address's network prefix length (0: unknown); the CLC prefix check uses it."""

    @property
    def family(self) -> socket.AddressFamily:
        """``AF_INET`` or ``AF_INET6``."""
        return socket.AF_INET6 if ":" in self.address else socket.AF_INET


def active_mtu(netdev_mtu: int) -> PathMtu:
    """rxe's port MTU: the largest IB MTU <= ``netdev_mtu - 80`` (256 at least)."""
    best = PathMtu.MTU_256
    for m in PathMtu:
        if m.nbytes <= netdev_mtu - HEADER_ROOM:
            best = m
    return best


def ipv4_addresses() -> list[tuple[str, str]]:
    """``(ifname, address)`` of every IPv4 address of this network namespace."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        size = 64
        while True:
            buf = array.array("B", bytes(size * _IFREQ))
            addr, _ = buf.buffer_info()
            got = struct.unpack(
                "iL", fcntl.ioctl(s.fileno(), SIOCGIFCONF, struct.pack("iL", len(buf), addr))
            )[0]
            if got < len(buf):
                break
            size *= 2
    raw = buf.tobytes()
    out = []
    for off in range(0, got, _IFREQ):
        name = raw[off : off + 16].split(b"\0", 1)[0].decode()
        out.append((name, socket.inet_ntoa(raw[off + 20 : off + 24])))
    return out


def ipv4_prefix_len(label: str) -> int:
    """The prefix length of the IPv4 address ``SIOCGIFCONF`` listed under ``label``.

    ``SIOCGIFNETMASK`` answers for the same address ``SIOCGIFCONF`` named by that
    label (a secondary address appears only under its own label), so the pair is
    consistent; 0 if the kernel does not say.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            got = fcntl.ioctl(s.fileno(), SIOCGIFNETMASK,
                              struct.pack("16s16x", label.encode()[:15]))  # fmt: skip
        except OSError:
            return 0
    return bin(int.from_bytes(got[20:24], "big")).count("1")


def ipv6_addresses() -> list[tuple[str, str, int]]:
    """``(ifname, address, scope_id)`` of every usable IPv6 address (``/proc/net/if_inet6``).

    Tentative addresses (duplicate address detection still running) are left
    out; a link-local address carries its interface index as scope id.
    """
    try:
        lines = Path("/proc/net/if_inet6").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        hexaddr, index, _plen, scope, flags, ifname = line.split()
        if int(flags, 16) & IFA_F_TENTATIVE:
            continue
        addr = socket.inet_ntop(socket.AF_INET6, bytes.fromhex(hexaddr))
        out.append((ifname, addr, int(index, 16) if int(scope, 16) == 0x20 else 0))
    return out


def _ipv6_prefix_len(address: str) -> int:
    """The prefix length of an IPv6 address of this namespace (``/proc/net/if_inet6``)."""
    want = socket.inet_pton(socket.AF_INET6, address).hex()
    try:
        lines = Path("/proc/net/if_inet6").read_text().splitlines()
    except OSError:
        return 0
    for line in lines:  # address, ifindex, prefix length, scope, flags, name (all hex)
        addr, _ifindex, prefix_len, *_ = line.split()
        if addr == want:
            return int(prefix_len, 16)
    return 0


def _read(ifname: str, attr: str, default: str) -> str:
    try:
        return (SYS_NET / ifname / attr).read_text().strip()
    except OSError:
        return default


def interface(ifname: str) -> tuple[bytes, int, str]:
    """``(mac, mtu, operstate)`` of a net device, asked of this thread's namespace.

    Why ioctls first: ``/sys/class/net`` shows the namespace that mounted
    sysfs, which is not ours after a bare ``setns`` (only ``ip netns exec``
    remounts it); ``SIOCGIF*`` answer for the socket's namespace.  The
    operstate is derived from the flags: ``unknown`` for loopback (as the
    kernel reports it), ``up`` when running, else ``down``.
    """
    req = struct.pack("16s16x", ifname.encode()[:15])
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            hw = fcntl.ioctl(s.fileno(), SIOCGIFHWADDR, req)
            mtu = struct.unpack_from("i", fcntl.ioctl(s.fileno(), SIOCGIFMTU, req), 16)[0]
            flags = struct.unpack_from("H", fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, req), 16)[0]
    except OSError:
        return _sysfs_interface(ifname)
    state = "unknown" if flags & IFF_LOOPBACK else "up" if flags & IFF_RUNNING else "down"
    return hw[18:24], mtu, state


def _sysfs_interface(ifname: str) -> tuple[bytes, int, str]:
    mac_text = _read(ifname, "address", "00:00:00:00:00:00")
    mac = bytes.fromhex(mac_text.replace(":", "")) if mac_text else bytes(6)
    return (mac if len(mac) == 6 else bytes(6), int(_read(ifname, "mtu", "1500")),
            _read(ifname, "operstate", "unknown"))  # fmt: skip


def list_devices() -> list[RnicInfo]:
    """Every RNIC this host can open: one per interface address, IPv4 ones first.

    Names: ``roce_<ifname>`` for an interface's first IPv4 address, then
    ``roce_<ifname>_<n>``; IPv6 ones ``roce6_<ifname>``, ``roce6_<ifname>_<n>``.
    """
    out: list[RnicInfo] = []
    seen: dict[tuple[str, str], int] = {}
    found: list[tuple[str, str, str, int, bytes, int]] = [
        ("roce", ifname, address, 0, ipv4_mapped_gid(socket.inet_aton(address)),
         ipv4_prefix_len(ifname))
        for ifname, address in ipv4_addresses()
    ]  # fmt: skip
    found += [("roce6", ifname, address, scope, socket.inet_pton(socket.AF_INET6, address),
               _ipv6_prefix_len(address))
              for ifname, address, scope in ipv6_addresses()]  # fmt: skip
    for prefix, ifname, address, scope, gid, plen in found:
        n = seen.get((prefix, ifname), 0)
        seen[(prefix, ifname)] = n + 1
        mac, mtu, state = interface(ifname)
        out.append(RnicInfo(
            name=f"{prefix}_{ifname}" if n == 0 else f"{prefix}_{ifname}_{n}", ifname=ifname,
            address=address, gid=gid, mac=mac, mtu=mtu, active_mtu=active_mtu(mtu),
            operstate=state, scope_id=scope, prefix_len=plen,
        ))  # fmt: skip
    return out


def find(address: str | None = None, ifname: str | None = None) -> RnicInfo:
    """The RNIC of an address or an interface (its first address).

    :raises LookupError: if this namespace has no such address/interface.
    """
    if address is not None and ":" in address:  # compare IPv6 addresses in one spelling
        address = socket.inet_ntop(socket.AF_INET6, socket.inet_pton(socket.AF_INET6, address))
    for info in list_devices():
        if (address is None or info.address == address) and (
            ifname is None or info.ifname == ifname
        ):
            return info
    raise LookupError(f"no IPv4 interface address matches address={address} ifname={ifname}")
