"""Which RNIC a connection uses: the shm RNIC, or the RoCE RNIC of its TCP address.

Design (the why of each):

* **The kind is a process-wide choice**, ``SMCR_RNIC=shm|roce`` (default
  ``shm``), read when a stack is first needed: both ends of a connection must
  use the same kind, and an environment variable reaches ``smcr-run`` children
  and spawned test peers without touching the application.
* **RoCE: the RNIC of the TCP connection's local address**, as Linux picks the
  RNIC of the net device the TCP socket uses (``smc_pnet_find_roce_resource``;
  when that net device has a PNET ID, an RNIC of that PNET ID, :func:`_by_pnetid`):
  one RoCE RNIC per interface address (:func:`smcr.rdma.roce.list_devices`),
  one runtime per RNIC (each its own engine, so CLC carries that RNIC's GID and
  MAC).  An address with no RNIC uses the default RNIC; the CLC prefix check
  then declines (``DIFFPREFIX``) and the connection falls back to TCP.
* **Loopback gets a per-process address.**  Two processes whose RNICs both sat
  on 127.0.0.1 would have QP flows with the same 4-tuple (the UDP source port
  is derived from the QPNs the same way in both directions), and the kernel
  could hand one process's packets to the other.  So the loopback RNIC of a
  process uses ``127.<a>.<b>.<c>`` derived from its pid: all of 127/8 is
  local, the CLC prefix check stays 127.0.0.0/8, and the flows are distinct.
* **The CLC prefix comes from the interface** (Linux ``smc_clc_prfx_set``): the
  TCP local address is handed to the engine as an ``ip_interface`` with the
  RNIC's prefix length, so two hosts on one /24 pass the check.  Over shm the
  plain address keeps the "same host" rule of :mod:`smcr.core.handshake`.
* **CLC over RoCE** carries the RoCEv2 GID (IPv4-mapped or IPv6 address) and the
  interface MAC: SMC-Rv1, or SMC-Rv2 beside it once a UEID is configured (Linux
  picks v2 then).  Linux uses SMC-Rv1 only with RoCE v1 GIDs, which rxe lacks, so
  a Linux peer over rxe answers a v1-only offer with ``NOSMCDEV``.  SMC-Rv2 is
  what crosses IP routers (:mod:`smcr.stack.routes`); smcr offers it over IPv6
  too (:func:`v2_over_ipv6`), where Linux offers it over IPv4 only.
* **Mixed kinds fail fast**: a shm RNIC cannot reach a RoCE GID nor the other
  way round; the QP set-up fails at once and both ends fall back
  (``ERR_RDYLNK``/``PEERDECL``, as Linux when ``smc_ib_ready_link`` fails) with the
  TCP connection intact.
"""

from __future__ import annotations

import ipaddress
import os
import socket

from smcr import settings
from smcr.pnet import PnetTable, lookup
from smcr.rdma.base import Device
from smcr.rdma.ibverbs.device import VerbsDevice
from smcr.rdma.roce import RnicInfo, RoceDevice, list_devices

IpRnic = RoceDevice | VerbsDevice
"""An RNIC of an IP address (RoCEv2: GIDs of addresses, routes, net devices): smcr's own
RoCE RNIC or the kernel's device through verbs."""
IP_RNICS = (RoceDevice, VerbsDevice)

RNIC_ENV = "SMCR_RNIC"
KINDS = ("shm", "roce", "verbs")
LOOPBACK = "lo"
"""The registry key of the loopback RoCE RNIC."""

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_PNET = PnetTable()
"""The host's PNET table (:func:`_by_pnetid`), re-read when it changes."""


def rnic_kind() -> str:
    """The RNIC kind this process uses (``SMCR_RNIC``, default ``shm``).

    :raises SettingError: for an unknown kind (a typo must not silently mean shm).
    """
    return settings.RNIC.value("shm")


def loopback_address(pid: int) -> str:
    """This process's loopback RNIC address, ``127.<1 + pid>>16>.<pid>>8>.<pid>``."""
    return f"127.{1 + (pid >> 16) % 254}.{(pid >> 8) & 255}.{pid & 255}"


def _unmapped(ip: IpAddress) -> IpAddress:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def roce_key(local_ip: IpAddress | None, scope_id: int = 0) -> str:
    """The registry key of the RoCE RNIC for a TCP local address (module docstring).

    ``None`` (no connection yet) means the default RNIC: the first IPv4 RNIC
    that is up and not loopback, else loopback.  A link-local IPv6 address
    comes with the TCP socket's ``scope_id`` (its interface index): the same
    fe80:: address may sit on several interfaces, each its own RNIC, and only
    the one the TCP connection uses reaches the peer (key ``address%ifname``).
    """
    if local_ip is not None:
        ip = _unmapped(local_ip)
        if ip.is_loopback:
            return LOOPBACK
        text = str(ip)
        infos = list_devices()
        for info in infos:
            if info.address == text and (not scope_id or info.scope_id == scope_id):
                return _by_pnetid(info, infos) or (f"{text}%{info.ifname}" if scope_id else text)
    for info in list_devices():
        if info.family == socket.AF_INET and info.ifname != "lo" and info.operstate == "up":
            return info.address
    return LOOPBACK


def _by_pnetid(tcp: RnicInfo, infos: list[RnicInfo]) -> str | None:
    """The key of the RNIC a PNET ID picks for a TCP connection over ``tcp``'s net device
    (Linux ``smc_pnet_find_roce_resource``): when that net device has a PNET ID and its
    own RNIC has another, the first RNIC that is up with the net device's PNET ID
    (:mod:`smcr.pnet`).  None: the net device's own RNIC, as without a PNET ID."""
    entries = _PNET.current()
    want = lookup(entries, tcp.ifname) if entries else ""
    if not want or lookup(entries, tcp.ifname, (tcp.name,)) == want:
        return None
    for info in infos:
        if (info.family == tcp.family and info.operstate == "up"
                and lookup(entries, info.ifname, (info.name,)) == want):  # fmt: skip
            return f"{info.address}%{info.ifname}" if info.scope_id else info.address
    return None


def open_roce(key: str) -> RoceDevice:
    """Open the RoCE RNIC of a registry key (:func:`roce_key`)."""
    if key == LOOPBACK:
        return RoceDevice(loopback_address(os.getpid()), name="roce_lo")
    address, _, ifname = key.partition("%")
    return RoceDevice(address, ifname=ifname or None)


def open_verbs(key: str) -> VerbsDevice:
    """Open the verbs RNIC of a registry key (:func:`roce_key`): the kernel's RDMA device
    whose RoCE v2 GID is that address.

    :raises VerbsError: ENODEV when there is none (or no pyverbs): the connection then
        falls back to TCP, as with an RNIC the handshake cannot use.
    """
    address, _, ifname = key.partition("%")
    if key == LOOPBACK:
        return VerbsDevice(ifname="lo")
    return VerbsDevice(address, ifname=ifname or None)


def v2_over_ipv6(device: Device) -> bool:
    """Whether the RNIC's GID (which serves SMC-Rv2 whatever it is: an IPv4-mapped RoCE
    v2 GID as Linux ``smc_ib_determine_gid`` wants, the shm RNIC's opaque one between
    smcr peers) is an IPv6 one that carries SMC-Rv2 over IPv6 TCP
    (:attr:`smcr.core.config.LocalIdentity.v2_over_ipv6`): the RoCE RNIC of an IPv6
    address.  Why beyond Linux: SMC-Rv2 is what crosses routers, and Linux's needs an
    IPv4 address; an IPv6 host pair of smcr would else have SMC-R on one subnet only."""
    return isinstance(device, IP_RNICS) and device.gid[:12] != bytes(10) + b"\xff\xff"


def prefix_ip(device: Device, local_ip: IpAddress) -> IpAddress:
    """The TCP local address as the CLC prefix check should see it (module docstring).

    For a RoCE RNIC on that very address, an ``ip_interface`` (a subclass of the
    address type) carrying the interface's prefix length; otherwise the address.
    """
    info: RnicInfo | None = getattr(device, "info", None)
    ip = _unmapped(local_ip)
    if info is not None and info.address != str(ip) and not ip.is_loopback:
        # an RNIC a PNET ID chose on another net device (:func:`_by_pnetid`): the prefix
        # is the TCP connection's, as Linux ``smc_clc_prfx_set`` takes it from the route
        info = next((i for i in list_devices() if i.address == str(ip)), None)
    if info is None or info.prefix_len <= 0 or info.address != str(ip) or ip.is_loopback:
        return local_ip
    return ipaddress.ip_interface(f"{ip}/{info.prefix_len}")
