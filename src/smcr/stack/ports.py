"""Which RNICs a runtime uses beside the first, and the watcher that tells it when one fails.

Design (the why of each):

* **More RNICs are asked for, not taken by default**, so that a host's existing
  single-link behaviour does not change under it: ``SMCR_ROCE_DEVS`` lists the net
  devices (or ``all``: every IPv4 RoCE RNIC but loopback) whose RoCE RNICs a runtime
  adds to the one of the TCP connection's address; ``SMCR_SHM_RNICS=N`` gives a
  process N shm RNICs (tests, and ``smcr demo --failover``).  With two or more the
  server side of each new link group offers a second link (ADD LINK) over the other
  RNIC (:class:`smcr.stack.runtime.Stack`).
* **Pairing across hosts**: the engine offers its first other RNIC of the group's
  PNET ID (:mod:`smcr.pnet`, ``smcr pnet add``; none set: every RNIC matches, as
  Linux's ``smc_pnet_find_alt_roce``); the peer answers from its own other RNIC of
  that PNET ID.  Two hosts with one subnet per RNIC pair (the usual redundant
  setup) pair up right.  A RoCE port is taken for a link only if the kernel routes
  the peer port's address out of its net device (:func:`roce_reaches`,
  :meth:`Stack.reaches`), so the pairing holds whatever order the RNICs are in.
* **Failure detection of a RoCE RNIC is its net device's** (Linux
  ``smc_ib_port_event_work``, which follows the IB port state an rxe device takes
  from its net device): :class:`PortWatcher` listens on rtnetlink for link and
  address changes and then re-reads each port's state, up meaning the interface is
  up with carrier (``IFF_LOWER_UP``: a veth whose peer end went down has none) and
  still has the RNIC's address.  A change calls :meth:`Stack.port_down` or
  :meth:`Stack.port_up`.  Why re-read rather than decode the messages: an event
  only says "look again"; what counts is the state now, also after messages were
  lost (an overrun rtnetlink socket drops them: the watcher then re-reads too).
"""

from __future__ import annotations

import errno
import ipaddress
import os
import select
import socket
import struct
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from smcr import settings
from smcr.osthreads import NamedThread
from smcr.rdma.ibverbs.device import VerbsDevice
from smcr.rdma.roce import RoceDevice, netif
from smcr.stack.devices import IP_RNICS, IpRnic
from smcr.stack.hostconn import PortRes
from smcr.stack.routes import gid_address, route_oif, rtnl_ask

IpRnicT = TypeVar("IpRnicT", RoceDevice, VerbsDevice)
"""An RNIC kind of IP addresses (:func:`more_rnics` opens more of the same)."""

ROCE_DEVS_ENV = "SMCR_ROCE_DEVS"
SHM_RNICS_ENV = "SMCR_SHM_RNICS"
RTMGRP_LINK = 0x1
RTMGRP_IPV4_IFADDR = 0x10
RTMGRP_IPV6_IFADDR = 0x100
RTM_NEWLINK = 16
RTM_GETLINK = 18
IFF_UP = 0x1
IFF_LOWER_UP = 0x10000
_IFINFO = struct.Struct("=BxHiII")
RECHECK = 1.0
"""Seconds between re-reads without an event (a lost netlink message costs at most this)."""


def shm_rnics() -> int:
    """How many shm RNICs a process's runtime uses (``SMCR_SHM_RNICS``, default 1).

    :raises SettingError: for a value that is not a count of 1 to 64.
    """
    return settings.SHM_RNICS.value(1)


def roce_more(first: RoceDevice) -> list[RoceDevice]:
    """The RoCE RNICs ``SMCR_ROCE_DEVS`` adds to ``first`` (module docstring): one per listed
    net device (its first IPv4 address), not ``first``'s own; none when unset.

    :raises LookupError: for a listed net device without an IPv4 address.
    """
    return more_rnics(first, lambda address, name: RoceDevice(address, ifname=name))


def verbs_more(first: VerbsDevice) -> list[VerbsDevice]:
    """The verbs RNICs ``SMCR_ROCE_DEVS`` adds to ``first``, as :func:`roce_more` for RoCE:
    the RDMA device of each listed net device (the one with a RoCE v2 GID of its first
    IPv4 address), not ``first``'s own net device; none when unset.

    :raises LookupError: for a listed net device without an IPv4 address.
    :raises VerbsError: ENODEV for one whose address has no RDMA device.
    """
    return more_rnics(first, lambda address, name: VerbsDevice(address, ifname=name))


def more_rnics(first: IpRnicT, open_rnic: Callable[[str, str], IpRnicT]) -> list[IpRnicT]:
    """The RNICs of the net devices ``SMCR_ROCE_DEVS`` lists (all with an IPv4 address for
    an empty list), each opened by ``open_rnic(address, ifname)`` on its first IPv4
    address, leaving out ``first``'s own net device; none when unset or when ``first`` is
    on loopback.  Those opened before a failure are closed again.

    :raises LookupError: for a listed net device without an IPv4 address.
    """
    listed = settings.ROCE_DEVS.value(None)
    if listed is None or first.netdev in ("lo", None):
        return []
    names = list(listed) or [i.ifname for i in netif.list_devices()
                             if i.family == socket.AF_INET and i.ifname != "lo"]  # fmt: skip
    out: list[IpRnicT] = []
    seen = {first.netdev}
    try:
        for name in names:
            if name in seen:
                continue
            seen.add(name)
            info = netif.find(ifname=name)
            if info.family != socket.AF_INET:
                continue
            out.append(open_rnic(info.address, name))
    except BaseException:
        for dev in out:
            dev.close()
        raise
    return out


def link_flags(ifname: str) -> int:
    """A net device's flags as rtnetlink gives them (``ifi_flags``, 32 bits: with
    ``IFF_LOWER_UP``, which ``SIOCGIFFLAGS`` cuts off), asked of the calling thread's
    network namespace.

    :raises OSError: for a device that does not exist (any more).
    """
    index = socket.if_nametoindex(ifname)
    body = _IFINFO.pack(socket.AF_UNSPEC, 0, index, 0, 0)
    return int(_IFINFO.unpack_from(rtnl_ask(RTM_GETLINK, body, RTM_NEWLINK, ifname))[3])


def roce_reaches(device: IpRnic, gid: bytes) -> bool:
    """Whether a RoCE RNIC reaches a peer port's GID: the kernel routes its address, from
    the RNIC's own, out of the RNIC's net device (a subnet of it, or a gateway behind it),
    as Linux checks the route before it uses an RNIC for SMC-Rv2 (``smc_ib_find_route``).
    From the RNIC's address: two net devices on one subnet carry separate links only where
    policy routing sends each address's packets out of its own device, and the route the
    packets will take is the one to check."""
    if device.netdev is None:
        return True
    try:
        source = ipaddress.ip_address(device.address)
        return route_oif(gid_address(gid), source) == socket.if_nametoindex(device.netdev)
    except (OSError, ValueError):
        return False


def roce_port_problem(device: IpRnic) -> str | None:
    """Why a RoCE RNIC cannot carry traffic now, or None when it can: its net device must be
    up with carrier (what rxe follows: ``netif_running`` and ``netif_carrier_ok``; not the
    operstate, which the kernel's linkwatch reports up to a second late) and still have
    the RNIC's address; a verbs device must also have its GID back
    (:meth:`VerbsDevice.gid_ready`: the watcher's look every second sees it).

    :raises OSError: the net device is gone.
    """
    ifname = device.netdev
    if ifname is None:
        return None
    if link_flags(ifname) & (IFF_UP | IFF_LOWER_UP) != IFF_UP | IFF_LOWER_UP:
        return f"net device {ifname} down"
    if (ifname, device.address) not in netif.ipv4_addresses():
        return f"net device {ifname} without {device.address}"
    if isinstance(device, VerbsDevice) and not device.gid_ready():
        return f"{device.name} port {device.port_num} not active or without the GID"
    return None


class PortOwner(Protocol):
    """What a :class:`PortWatcher` follows and tells: the runtime
    (:class:`smcr.stack.runtime.Stack`)."""

    @property
    def ports(self) -> list[PortRes]:
        """The runtime's RNICs by port."""

    @property
    def lock(self) -> Any:
        """The runtime's lock, held around :meth:`port_up` and :meth:`port_down`."""

    def port_up(self, port: int) -> None:
        """The RNIC of ``port`` is back."""

    def port_down(self, port: int, reason: str) -> None:
        """The RNIC of ``port`` is gone."""


class PortWatcher:
    """A thread that follows the RoCE ports of a runtime (module docstring).

    :param stack: the runtime; its :attr:`~PortOwner.ports` are watched.
    :param problem: why a port is down now, None if up (default :func:`roce_port_problem`).
    """

    def __init__(self, stack: PortOwner,
                 problem: Callable[[IpRnic], str | None] = roce_port_problem,
                 ) -> None:  # fmt: skip
        self.stack = stack
        self.problem = problem
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        self._sock.bind((0, RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR))
        self._sock.setblocking(False)
        self._stop_r, self._stop_w = os.pipe()
        self.events = 0
        """Port state changes seen (for the tools and the tests)."""
        self._thread = NamedThread(target=self._run, name="smcr-ports", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        fd = self._sock.fileno()
        if fd < 0:
            return  # closed before this thread first looked (close()'s join gave up)
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        poller.register(self._stop_r, select.POLLIN)
        while True:
            ready = [fd for fd, _ in poller.poll(RECHECK * 1000)]
            if self._stop_r in ready:
                return
            while True:  # drain: the messages only say "look again"
                try:
                    if not self._sock.recv(65536):
                        break
                except BlockingIOError:
                    break
                except OSError as exc:
                    if exc.errno == errno.ENOBUFS:  # lost messages: the re-read covers them
                        continue
                    return  # (closed under us: close()'s join gave up; nothing to watch)
            self.check()

    def check(self) -> None:
        """Re-read every RoCE port's state; tell the runtime what changed."""
        stack = self.stack
        for port, res in enumerate(stack.ports):
            dev = res.device
            if not isinstance(dev, IP_RNICS):
                continue
            problem = self.problem_of(dev)
            if (problem is None) == res.up:
                continue
            self.events += 1
            with stack.lock:
                if problem is None:
                    stack.port_up(port)
                else:
                    stack.port_down(port, problem)

    def problem_of(self, dev: IpRnic) -> str | None:
        """Why ``dev``'s port cannot carry traffic now (:attr:`problem`; a net device gone
        is one reason too), or None when it can."""
        try:
            return self.problem(dev)
        except OSError as exc:
            return f"net device {dev.netdev}: {exc.strerror or exc}"

    def close(self) -> None:
        """Stop the thread and close the netlink socket."""
        try:
            os.write(self._stop_w, b"x")
        except OSError:
            pass
        self._thread.join(timeout=2.0)
        self._sock.close()
        os.close(self._stop_r)
        os.close(self._stop_w)
