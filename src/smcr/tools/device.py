"""``smcr device``: the RNICs this host offers, as smc-tools' ``smcr device show`` lists them.

What is listed, and why so:

* **RoCE RNICs**, one per interface address (:func:`smcr.rdma.roce.list_devices`),
  with the net device, GID (the IPv4-mapped or IPv6 address), MAC, the path MTU
  the RNIC announces (rxe's rule) beside the interface MTU, and the interface's
  operational state.  These are what ``SMCR_RNIC=roce`` picks from, by the TCP
  connection's local address.
* **verbs RNICs**: the kernel's RDMA devices (hardware, or Soft-RoCE), one line per
  port with a RoCE v2 GID, the IPv4 one where there is one (what ``SMCR_RNIC=verbs``
  picks from, by the TCP connection's address), with the port's state as the kernel
  gives it.  Where none can be used (no device, no pyverbs) the list says why in one
  line (:func:`verbs_reason`).
* **shm RNICs**: the shm RNIC is made per process on first use, so there is
  nothing to list until a process runs SMC-R; those that do each have a
  rendezvous socket in the per-user directory, listed here with the GID and
  MAC they announce in CLC.  Nothing is connected to or created to list them.
* The "hardware" columns of virtual devices are shown as ``-`` where they mean
  nothing (TOOLS.md: users complain about meaningless columns), and the line
  the current ``SMCR_RNIC`` setting would use by default is marked ``*``.
* ``#Links`` and ``Crit`` (smc-tools' columns) come from the smcr processes
  (:mod:`smcr.diag`): the links they have on the RNIC, and "Yes" when one of
  their link groups there has no second link to fail over to.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from smcr.rdma import ibverbs
from smcr.rdma.ibverbs import sysfs
from smcr.rdma.roce import list_devices, netif
from smcr.rdma.shm import rendezvous
from smcr.rdma.verbs import IPV4_MAPPED_PREFIX


@dataclass(frozen=True, slots=True)
class RnicRow:
    """One line of ``smcr device``."""

    name: str
    type: str
    netdev: str
    gid: str
    mac: str
    mtu: str
    state: str
    default: bool = False
    links: int = 0
    crit: str = "No"


def _mac(raw: bytes) -> str:
    return ":".join(f"{b:02x}" for b in raw)


def _gid(raw: bytes) -> str:
    """A GID as IPv6 text, an IPv4-mapped one as ``::ffff:a.b.c.d`` (readable at a glance)."""
    addr = ipaddress.IPv6Address(raw)
    return f"::ffff:{addr.ipv4_mapped}" if addr.ipv4_mapped is not None else str(addr)


def roce_rows(default_address: str | None) -> list[RnicRow]:
    """The RoCE RNICs of this network namespace."""
    return [RnicRow(name=info.name, type="roce", netdev=info.ifname, gid=_gid(info.gid),
                    mac=_mac(info.mac), mtu=f"{info.active_mtu.nbytes}/{info.mtu}",
                    state=info.operstate.upper(), default=info.address == default_address)
            for info in list_devices()]  # fmt: skip


def verbs_rows(default_address: str | None, root: Path = sysfs.SYS_INFINIBAND) -> list[RnicRow]:
    """The kernel's RDMA device ports with a RoCE v2 GID (module docstring)."""
    out: list[RnicRow] = []
    want = sysfs.address_gid(default_address) if default_address else None
    for name in sysfs.device_names(root):
        ports: dict[int, list[sysfs.GidEntry]] = {}
        for entry in sysfs.gid_entries(name, root):
            if entry.kind == sysfs.ROCE_V2:
                ports.setdefault(entry.port, []).append(entry)
        for port, entries in sorted(ports.items()):
            v4 = [e for e in entries if e.gid[:12] == IPV4_MAPPED_PREFIX]
            shown = (v4 or entries)[0]
            netdev, mac, mtu = shown.netdev or "-", "-", "-"
            try:
                info = netif.find(ifname=shown.netdev) if shown.netdev else None
            except (LookupError, OSError):
                info = None
            if info is not None:
                mac, mtu = _mac(info.mac), f"{info.active_mtu.nbytes}/{info.mtu}"
            out.append(RnicRow(name=name if port == 1 else f"{name}/{port}", type="verbs",
                               netdev=netdev, gid=_gid(shown.gid), mac=mac, mtu=mtu,
                               state=sysfs.port_state(name, port, root),
                               default=any(e.gid == want for e in entries)))  # fmt: skip
    return out


def verbs_reason(kind: str) -> str | None:
    """For ``SMCR_RNIC=verbs``: why no verbs RNIC can be used here (one line), or None."""
    if kind != "verbs":
        return None
    reason = ibverbs.unusable()
    return None if reason is None else f"verbs RNIC unusable: {reason}"


def shm_gids(directory: Path | None = None, unix_table: Path = Path("/proc/net/unix")
             ) -> list[bytes]:  # fmt: skip
    """The GIDs of the shm RNICs in reach: this user's rendezvous sockets, and every
    user's abstract ones in this network namespace (``/proc/net/unix``, ``@`` for the NUL)."""
    path = directory or rendezvous.default_directory()
    names = [entry.name.removesuffix(".sock") for entry in sorted(path.glob("*.sock"))
             if path.is_dir()]  # fmt: skip
    prefix = rendezvous.ABSTRACT_PREFIX
    try:
        # (another process's abstract name may be any bytes: not UTF-8, a line break)
        lines = unix_table.read_text(errors="replace").split("\n")[1:]
    except OSError:
        lines = []
    names += [fields[-1][1 + len(prefix):] for fields in map(str.split, lines)
              if len(fields) == 8 and fields[-1].startswith("@" + prefix)]  # fmt: skip
    gids: list[bytes] = []
    for name in names:
        try:
            gid = bytes.fromhex(name)
        except ValueError:
            continue
        if rendezvous.is_shm_gid(gid) and gid not in gids:
            gids.append(gid)
    return gids


def shm_rows(directory: Path | None = None) -> list[RnicRow]:
    """The shm RNICs of running processes in reach (:func:`shm_gids`)."""
    return [RnicRow(name=f"shm:{gid[-4:].hex()}", type="shm", netdev="-", gid=gid.hex(),
                    mac=_mac(b"\x02" + gid[11:]), mtu="4096/-", state="ACTIVE")
            for gid in shm_gids(directory)]  # fmt: skip


def rows(kind: str) -> list[RnicRow]:
    """Every RNIC, verbs and RoCE first; ``kind`` (``SMCR_RNIC``) marks the default one."""
    default = None
    if kind in ("roce", "verbs"):
        from smcr.stack.devices import LOOPBACK, roce_key  # noqa: PLC0415

        key = roce_key(None)
        default = "127.0.0.1" if key == LOOPBACK else key.partition("%")[0]
    return (verbs_rows(default if kind == "verbs" else None)
            + roce_rows(default if kind == "roce" else None) + shm_rows())


def _gid_key(text: str) -> str:
    """A GID as :func:`_gid` or hex writes it, in one form (to match the two)."""
    try:
        raw = bytes.fromhex(text) if len(text) == 32 else ipaddress.IPv6Address(text).packed
    except ValueError:
        return text
    return raw.hex()


def with_links(table: list[RnicRow]) -> list[RnicRow]:
    """``#Links`` and ``Crit`` from every smcr process this user may ask (:mod:`smcr.diag`)."""
    from dataclasses import replace  # noqa: PLC0415

    from smcr.diag import client  # noqa: PLC0415

    links: dict[str, int] = {}
    crit: dict[str, bool] = {}
    for reply in client.gather("snapshot"):
        for dev in client.rows_of(reply, "devices"):
            n, gid = dev.get("links"), dev.get("gid")
            if not isinstance(n, int) or not isinstance(gid, str):
                continue
            key = _gid_key(gid)
            links[key] = links.get(key, 0) + max(0, n)
            crit[key] = crit.get(key, False) or dev.get("crit") is True
    return [replace(r, links=links.get(_gid_key(r.gid), 0),
                    crit="Yes" if crit.get(_gid_key(r.gid)) else "No") for r in table]


def render(table: list[RnicRow]) -> str:
    """The table as text, columns sized to their contents."""
    head = ("", "Name", "Type", "Netdev", "GID", "MAC", "MTU", "State", "Crit", "#Links")
    lines = [("*" if r.default else "", r.name, r.type, r.netdev, r.gid, r.mac, r.mtu, r.state,
              r.crit, str(r.links)) for r in table]  # fmt: skip
    widths = [max(len(x[i]) for x in [head, *lines]) for i in range(len(head))]
    out = ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
           for line in [head, *lines]]  # fmt: skip
    if not lines:
        out.append("(no RNIC)")
    return "\n".join(out)


def run(as_json: bool, kind: str) -> int:
    """Print the RNIC list; 0."""
    table = with_links(rows(kind))
    if as_json:
        print(json.dumps([asdict(r) for r in table], indent=1))
        return 0
    print(render(table))
    reason = verbs_reason(kind)
    if reason is not None:
        print(reason)
    return 0
