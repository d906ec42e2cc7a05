"""CLC handshake state of one connection, and the CLC checks (Linux ``af_smc.c``).

What smcr proposes over the shm RNIC: **SMC-Rv1 in a v2-header Proposal**
(Linux >= 5.10 layout, byte 7 ``0x28``, 92 bytes for IPv4), answered by v1
Accept/Confirm (68 bytes).  Why v1: the shm RNIC's GIDs are opaque 16-byte
device ids, not IPv4-mapped RoCE v2 GIDs, and SMC-Rv2 needs a common UEID;
SMC-Rv1 only needs the peer's GID/MAC/QPN, which is exactly what the shm
rendezvous uses.  The v2 header is what current Linux sends for SMC-Rv1.

The IP prefix area: the shm RNIC reaches only processes of this host, so the
"same subnet" check of Linux is done on the TCP connection's local address:
IPv4 loopback as ``127.0.0.0/8``, any other IPv4 address as a /32, IPv6 as a
/128 (we have no portable netmask query without ioctls; same host is what
counts).  A mismatch declines with ``DIFFPREFIX`` as Linux does.  Over the
RoCE RNIC the runtime hands in the address with its interface prefix (an
``ip_interface``), as Linux does with the netdev's.

Over the RoCE RNIC smcr keeps this SMC-Rv1 framing between smcr peers: the GID
is then the IPv4-mapped (or IPv6) RoCEv2 GID and the MAC the interface's.
Linux would use SMC-Rv1 only with RoCE v1 GIDs, which rxe lacks, so a Linux
server over rxe declines our Proposal with ``NOSMCDEV`` (0x03030000, from
``smc_find_rdma_v1_device_serv``; seen live in ``tests/interop/test_kernel_smc.py``)
and both fall back to TCP; SMC-Rv2 (UEID, v2 Accept/Confirm, v2 LLC) is the
later interop step (see :mod:`smcr.stack.devices`).
"""

from __future__ import annotations

import enum
import functools
import ipaddress
from dataclasses import dataclass, field

from smcr.core.connection import Rmb
from smcr.core.events import SendClc
from smcr.core.linkgroup import Link, LinkGroup, V2Terms
from smcr.wire.clc import ClcAccept, ClcDecline, ClcReader
from smcr.wire.clc_proposal import IpPrefixArea, Ipv6Prefix
from smcr.wire.decline import DeclineCode

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class HsState(enum.Enum):
    """Where a connection's handshake stands (client and server states)."""

    # (an identity hash: Enum's own hashes the name in Python, and the engine's tables
    # are keyed by members several times per connection)
    __hash__ = object.__hash__

    PROPOSAL_SENT = "client: waiting for Accept"
    CLIENT_RKEY_WAIT = "client: CONFIRM RKEY running"
    CONFIRM_LINK_WAIT = "client: waiting for CONFIRM LINK"
    DECLINE_WAIT = "client: waiting briefly for the server's Decline"
    PROPOSAL_WAIT = "server: waiting for Proposal"
    SERVER_RKEY_WAIT = "server: CONFIRM RKEY running"
    CONFIRM_WAIT = "server: waiting for Confirm"
    CONFIRM_LINK_RESP_WAIT = "server: waiting for CONFIRM LINK response"
    DONE = "SMC-R"
    FALLBACK = "TCP fallback"
    FAILED = "failed"


class Decline(Exception):  # noqa: N818 - it is an outcome, named as Linux names it
    """A handshake step failed: send a Decline with ``code`` and fall back."""

    def __init__(self, code: DeclineCode, reason: str = "") -> None:
        super().__init__(reason or code.description)
        self.code = code


@dataclass(eq=False, init=False)
class Handshake:
    """One connection's CLC progress.  Made per connection: ``__init__`` written out
    (:class:`smcr.core.events.SendClc`)."""

    conn: int
    client: bool
    state: HsState
    deadline: float
    rmb: Rmb | None
    local_ip: IpAddress
    reader: ClcReader = field(default_factory=ClcReader)
    version: int = 2  # CLC version for a Decline we send
    lgr: LinkGroup | None = None
    link: Link | None = None
    first_contact: bool = False
    accept: ClcAccept | None = None
    token: int = 0
    sndbuf_size: int = 0  # the connection's send buffer; 0: the engine config's
    offered_v2: bool = False  # client: the Proposal offered SMC-Rv2
    smc_version: int = 1  # the SMC-R version chosen (server) or accepted (client)
    terms: V2Terms | None = None  # v2: what was negotiated
    port: int = 0  # client: our port the Proposal named (a first contact's link uses it)

    def __init__(self, conn: int, client: bool, state: HsState, deadline: float,
                 rmb: Rmb | None, local_ip: IpAddress, reader: ClcReader | None = None,
                 version: int = 2, lgr: LinkGroup | None = None, link: Link | None = None,
                 first_contact: bool = False, accept: ClcAccept | None = None,
                 token: int = 0, sndbuf_size: int = 0, offered_v2: bool = False,
                 smc_version: int = 1, terms: V2Terms | None = None,
                 port: int = 0) -> None:  # fmt: skip
        self.conn = conn
        self.client = client
        self.state = state
        self.deadline = deadline
        self.rmb = rmb
        self.local_ip = local_ip
        self.reader = ClcReader() if reader is None else reader
        self.version = version
        self.lgr = lgr
        self.link = link
        self.first_contact = first_contact
        self.accept = accept
        self.token = token
        self.sndbuf_size = sndbuf_size
        self.offered_v2 = offered_v2
        self.smc_version = smc_version
        self.terms = terms
        self.port = port


def decline_clc(hs: Handshake, code: DeclineCode, peer_id: bytes) -> SendClc:
    """The Decline a handshake sends (``smc_clc_send_decline``), in its CLC version."""
    return SendClc(hs.conn, ClcDecline.linux(code, peer_id, version=hs.version).encode())


@functools.lru_cache(maxsize=256, typed=True)  # (an interface is not its address)
def prefix_area(ip: IpAddress) -> IpPrefixArea:
    """The prefix area for a local address (see the module docstring).

    Kept per address (an immutable result, asked at every handshake by both roles).

    An ``ip_interface`` (a subclass of the address types) brings its own prefix
    length: the RoCE RNIC's runtime passes the interface's, as Linux
    ``smc_clc_prfx_set`` takes the netdev's (:mod:`smcr.stack.devices`).
    """
    if isinstance(ip, ipaddress.IPv4Interface):
        return IpPrefixArea(ip.network.network_address, ip.network.prefixlen)
    if isinstance(ip, ipaddress.IPv6Interface):
        return IpPrefixArea(ipv6_prefixes=(Ipv6Prefix(ip.network.network_address,
                                                      ip.network.prefixlen),))  # fmt: skip
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if isinstance(ip, ipaddress.IPv4Address):
        bits = 8 if ip.is_loopback else 32
        net = ipaddress.IPv4Network((ip, bits), strict=False)
        return IpPrefixArea(net.network_address, bits)
    return IpPrefixArea(ipv6_prefixes=(Ipv6Prefix(ip, 128),))
