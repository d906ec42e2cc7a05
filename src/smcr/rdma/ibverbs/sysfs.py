"""The host's RDMA devices as the kernel lists them under ``/sys/class/infiniband``.

Why sysfs and not verbs: picking the device, port and GID index for a TCP connection's
address needs only the GID table with each entry's type and net device, which the kernel
shows to everyone without opening a device (``ibv_devinfo -v`` and ``rdma link`` read
the same), and a host without rdma-core or pyverbs can still say what it has
(``smcr device``).  The SMC-R rule is Linux's ``smc_ib_determine_gid``: a RoCE v2 GID
whose net device carries the address, IPv4-mapped for an IPv4 address.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from smcr.rdma.verbs import ipv4_mapped_gid

SYS_INFINIBAND: Final = Path("/sys/class/infiniband")
ROCE_V2: Final = "RoCE v2"
EMPTY_RUN: Final = 32
"""Unused entries in a row after which a port's GID table is read no further: the kernel
gives a new GID the lowest free index (``ib_cache_gid_add``), so the used entries sit at
the start of tables of 1024 or more, each entry three files (rxe's whole table takes
1.6 s to read under emulation)."""


@dataclass(frozen=True, slots=True)
class GidEntry:
    """One entry of a port's GID table.

    :param device: the RDMA device (``rxe0``, ``mlx5_0``).
    :param port: the port number (from 1).
    :param index: the entry's index in the port's table (``sgid_index`` of an address vector).
    :param gid: the 16 GID bytes.
    :param kind: ``RoCE v2``, ``IB/RoCE v1`` as the kernel names it.
    :param netdev: the net device the entry belongs to (RoCE), or None.
    """

    device: str
    port: int
    index: int
    gid: bytes
    kind: str
    netdev: str | None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:  # (an unused entry answers EINVAL on Linux)
        return None


def device_names(root: Path = SYS_INFINIBAND) -> list[str]:
    """The RDMA devices the kernel has, sorted (none on a kernel without RDMA)."""
    try:
        return sorted(p.name for p in root.iterdir())
    except OSError:
        return []


def gid_entries(device: str, root: Path = SYS_INFINIBAND) -> list[GidEntry]:
    """The used GID entries of every port of ``device`` (zero GIDs left out)."""
    return list(_entries(device, root))


def _entries(device: str, root: Path) -> Iterator[GidEntry]:
    """:func:`gid_entries` one at a time, in port and index order; a port's table is read
    up to :data:`EMPTY_RUN` unused entries in a row."""
    ports = root / device / "ports"
    try:
        port_nums = sorted(int(p.name) for p in ports.iterdir())
    except (OSError, ValueError):
        return
    for port in port_nums:
        try:
            size = sum(1 for _ in (ports / str(port) / "gids").iterdir())
        except OSError:
            continue
        empty = 0
        for index in range(size):
            entry = gid_entry(device, port, index, root)
            if entry is None:
                empty += 1
                if empty >= EMPTY_RUN:
                    break
                continue
            empty = 0
            yield entry


def gid_entry(device: str, port: int, index: int,
              root: Path = SYS_INFINIBAND) -> GidEntry | None:  # fmt: skip
    """Entry ``index`` of a port's GID table; None while it is unused (a zero GID)."""
    port_dir = root / device / "ports" / str(port)
    text = _read(port_dir / "gids" / str(index))
    if not text:
        return None
    gid = ipaddress.IPv6Address(text).packed
    if gid == bytes(16):
        return None
    kind = _read(port_dir / "gid_attrs" / "types" / str(index)) or ""
    netdev = _read(port_dir / "gid_attrs" / "ndevs" / str(index))
    return GidEntry(device, port, index, gid, kind, netdev or None)


def port_state(device: str, port: int, root: Path = SYS_INFINIBAND) -> str:
    """A port's state as the kernel names it (``ACTIVE``, ``DOWN``...; ``-`` if unknown):
    the file reads ``4: ACTIVE``."""
    text = _read(root / device / "ports" / str(port) / "state") or ""
    return text.partition(":")[2].strip() or "-"


def address_gid(address: str) -> bytes:
    """The RoCE v2 GID of an IP address: IPv4-mapped for IPv4, the address for IPv6."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv4Address):
        return ipv4_mapped_gid(ip.packed)
    return ip.packed


def find_gid(address: str, root: Path = SYS_INFINIBAND,
             device: str | None = None) -> GidEntry | None:  # fmt: skip
    """The RoCE v2 GID entry of ``address`` on any device (or on ``device``), the first in
    device, port and index order; None when no RDMA device has one."""
    want = address_gid(address)
    for name in [device] if device else device_names(root):
        for entry in _entries(name, root):
            if entry.gid == want and entry.kind == ROCE_V2:
                return entry
    return None
