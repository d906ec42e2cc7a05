"""Routes and neighbours from the kernel (rtnetlink), for SMC-Rv2 across routers.

Why: SMC-Rv2 exists to cross IP routers, and Linux decides per link group whether the
peer is on-link or behind a gateway (``smc_ib_find_route`` in ``net/smc/smc_ib.c``):
it looks up the output route to the peer's address (``ip_route_output_flow``, from
the TCP connection's local address), takes ``rt_uses_gateway``, and the next hop's
MAC from the neighbour table (``dst->ops->neigh_lookup``: the gateway's MAC when
there is one).  A route via a gateway of another family (an IPv4 route with an IPv6
next hop) counts as none.  The group then sends with hop limit 64 and the next
hop's MAC (``smc_ib_modify_qp_rtr``) and says "not direct" in CLC and ADD LINK.
:func:`find_route` asks the same of the kernel, in the calling thread's network
namespace, with one ``RTM_GETROUTE`` and, for a gateway, one ``RTM_GETNEIGH`` (no
``ip`` command: a connection's handshake waits on it).

Our RoCE RNIC sends through kernel UDP sockets, so the kernel routes its packets
and fills in the MAC itself; what it needs of the answer is the hop limit (TTL 1
dies at the first router).  The MAC goes into the QP's address vector for what a
hardware RNIC would need, and for the tools.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import struct
from dataclasses import dataclass

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

NLMSG_ERROR = 2
NLM_F_REQUEST = 1
RTM_NEWROUTE = 24
RTM_GETROUTE = 26
RTM_NEWNEIGH = 28
RTM_GETNEIGH = 30
RTA_DST = 1
RTA_SRC = 2
RTA_OIF = 4
RTA_GATEWAY = 5
RTA_VIA = 18
NDA_DST = 1
NDA_LLADDR = 2
_NLMSG = struct.Struct("=IHHII")
_RTMSG = struct.Struct("=BBBBBBBBI")
_NDMSG = struct.Struct("=BxxxiHBB")
_RTA = struct.Struct("=HH")
NO_MAC = bytes(6)


@dataclass(frozen=True, slots=True)
class Route:
    """The kernel's output route to an address (the parts SMC-R uses).

    :param oif: the interface index it leaves by.
    :param gateway: the next hop when it is not on-link (``rt_uses_gateway``), else None.
    :param nexthop_mac: the gateway's MAC from the neighbour table (zeros while
        unresolved, and for an on-link peer, whose own MAC CLC tells).
    """

    oif: int
    gateway: IpAddress | None = None
    nexthop_mac: bytes = NO_MAC

    @property
    def uses_gateway(self) -> bool:
        """Whether the peer is behind a router (Linux ``rt->rt_uses_gateway``)."""
        return self.gateway is not None


def rtnl_ask(kind: int, body: bytes, answer: int, what: str) -> memoryview:
    """Send one rtnetlink request (``kind``, ``body``) in the calling thread's network
    namespace; the payload of the first answer of type ``answer``.

    :raises OSError: the kernel's error for the request (``what`` names its subject).
    """
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as nl:
        nl.settimeout(2.0)
        nl.send(_NLMSG.pack(_NLMSG.size + len(body), kind, NLM_F_REQUEST, 1, 0) + body)
        while True:
            data = nl.recv(65536)
            off = 0
            while off + _NLMSG.size <= len(data):
                length, got, _flags, _seq, _pid = _NLMSG.unpack_from(data, off)
                if got == NLMSG_ERROR:
                    err = -struct.unpack_from("i", data, off + _NLMSG.size)[0]
                    raise OSError(err, os.strerror(err), what)
                if got == answer:
                    return memoryview(data)[off + _NLMSG.size : off + max(length, _NLMSG.size)]
                off += max(length, _NLMSG.size)


def _attributes(payload: memoryview, start: int) -> dict[int, bytes]:
    """The rtnetlink attributes after a fixed header of ``start`` bytes, by type."""
    out: dict[int, bytes] = {}
    at = start
    while at + _RTA.size <= len(payload):
        alen, atype = _RTA.unpack_from(payload, at)
        if alen < _RTA.size:
            break
        out.setdefault(atype, bytes(payload[at + _RTA.size : at + alen]))
        at += (alen + 3) & ~3
    return out


def _rta(kind: int, value: bytes) -> bytes:
    raw = _RTA.pack(_RTA.size + len(value), kind) + value
    return raw + bytes(-len(raw) % 4)


def _family(address: IpAddress) -> int:
    return socket.AF_INET if address.version == 4 else socket.AF_INET6


def _route_attributes(address: IpAddress, source: IpAddress | None) -> dict[int, bytes]:
    """The attributes of the kernel's answer to ``ip route get ADDRESS [from SOURCE]``.

    Why no ``oif`` in the question: given one, the kernel assumes an address it has no
    route for is on that link and answers anyway; without, the answer is the route.
    """
    raw = address.packed
    rta = _rta(RTA_DST, raw)
    src_len = 0
    if source is not None and source.version == address.version:
        rta += _rta(RTA_SRC, source.packed)
        src_len = len(raw) * 8
    body = _RTMSG.pack(_family(address), len(raw) * 8, src_len, 0, 0, 0, 0, 0, 0) + rta
    answer = rtnl_ask(RTM_GETROUTE, body, RTM_NEWROUTE, str(address))
    return _attributes(answer, _RTMSG.size)


def route_oif(address: IpAddress, source: IpAddress | None = None) -> int:
    """The interface index the kernel routes ``address`` out of (``ip route get``, ``from
    source`` where given: the route packets from that address take, policy rules
    included), asked of the calling thread's network namespace.

    :raises OSError: no route (``ENETUNREACH``...), or rtnetlink failed.
    """
    oif = _route_attributes(address, source).get(RTA_OIF)
    if oif is None:
        raise OSError(errno.ENETUNREACH, "route without an interface", str(address))
    return int(struct.unpack("=i", oif[:4])[0])


def neighbour_mac(address: IpAddress, oif: int) -> bytes:
    """The link-layer address the neighbour table holds for ``address`` on interface
    ``oif`` (``ip neigh get``); zeros when it has none (yet), as Linux's
    ``neigh_lookup`` gives an entry still resolving."""
    body = _NDMSG.pack(_family(address), oif, 0, 0, 0) + _rta(NDA_DST, address.packed)
    try:
        answer = rtnl_ask(RTM_GETNEIGH, body, RTM_NEWNEIGH, str(address))
    except OSError:
        return NO_MAC
    mac = _attributes(answer, _NDMSG.size).get(NDA_LLADDR, b"")
    return mac if len(mac) == len(NO_MAC) else NO_MAC


def find_route(address: IpAddress, source: IpAddress | None = None) -> Route | None:
    """The route to a peer's address as Linux ``smc_ib_find_route`` takes it (module
    docstring); None when there is none (or its gateway is of another family)."""
    try:
        attrs = _route_attributes(address, source)
    except OSError:
        return None
    oif_raw = attrs.get(RTA_OIF)
    if oif_raw is None or RTA_VIA in attrs:  # (a next hop of another family)
        return None
    oif = int(struct.unpack("=i", oif_raw[:4])[0])
    gw_raw = attrs.get(RTA_GATEWAY)
    if gw_raw is None:  # on-link: Linux takes the peer's MAC from CLC then
        return Route(oif)
    gateway = ipaddress.ip_address(gw_raw)
    return Route(oif, gateway, neighbour_mac(gateway, oif))


def gid_address(gid: bytes) -> IpAddress:
    """The IP address of a RoCEv2 GID (IPv4-mapped, or IPv6)."""
    ip = ipaddress.IPv6Address(gid)
    return ip.ipv4_mapped or ip
