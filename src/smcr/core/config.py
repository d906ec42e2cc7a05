"""Engine configuration: a frozen dataclass with Linux's defaults (STYLE §7).

Every timeout is Linux's (``smc_clc.h``, ``smc_llc.h``, ``smc_close.h``; spec
§2.7 table); tests shorten them through this object, never by patching.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    """Knobs of the SMC-R engine (Linux defaults)."""

    sndbuf_size: int = 65536
    """Send buffer per connection (sysctl ``net.smc.wmem``, 64 KiB)."""
    rmb_size: int = 65536
    """RMB (receive buffer) per connection (sysctl ``net.smc.rmem``, 64 KiB)."""
    clc_wait: float = 6.0
    """``CLC_WAIT_TIME``: wait for Proposal / Accept / Confirm."""
    llc_wait: float = 2.0
    """``SMC_LLC_WAIT_TIME``: wait for an LLC response; while the link still delivers, a
    local flow or TEST LINK waits on, up to :attr:`llc_wait_heard`."""
    llc_wait_heard: float = 60.0
    """The longest a local LLC flow (CONFIRM RKEY, DELETE RKEY, ...) or a TEST LINK waits
    for its response while its link still delivers (a message heard, a send of ours
    acknowledged, the QP's PSNs moving): a wait ends :attr:`llc_wait` after the later
    of its start and the last such sign, and at the latest this long after its start.
    Linux ends it after ``SMC_LLC_WAIT_TIME`` flat; over a lossy fabric the request and
    the response queue behind the data both QPs retransmit (go-back-N), and
    connections would be reset for loss alone (:meth:`~smcr.core.llc.LinkLayer.wait_more`).
    A silent link still fails :attr:`llc_wait` after its last sign, as in Linux."""
    llc_wait_first: float = 4.0
    """``2 * SMC_LLC_WAIT_TIME``: client waits for the first CONFIRM LINK."""
    llc_wait_confirm: float = 5.0
    """``SMC_LLC_WAIT_FIRST_TIME``: both sides' wait for the CONFIRM LINK (response) of a
    link added by ADD LINK (``smc_llc_srv_conf_link``, ``smc_llc_cli_conf_link``)."""
    testlink_time: float = 30.0
    """``SMC_LLC_TESTLINK_DEFAULT_TIME``; 0 disables the keepalive."""
    close_wait_tx: float = 2.0
    """``SMC_MAX_STREAM_WAIT_TIMEOUT``: close waits this long for unsent data."""
    max_conns: int = 255
    """Connections per link group (Linux ``SMC_RMBS_PER_LGR_MAX``)."""
    max_links: int = 2
    """Advertised in a v1 CONFIRM LINK (Linux ``SMC_LINKS_ADD_LNK_MAX``)."""
    max_links_v2: int = 1
    """SMC-Rv2.1 link negotiation: the most links per link group we offer (Linux sysctl
    ``net.smc.smcr_max_links_per_lgr``, default 2 there).  1 here: smcr runs one link
    per group, and a peer that negotiated 1 neither offers a second link nor waits
    ~3 s for one after first contact (Linux ``smcr_clnt_conf_first_link``).  A peer
    that offers one anyway (v2.0, or 2 configured) is rejected as Linux rejects it.
    With :attr:`add_links` at least Linux's 2 is offered (:attr:`v2_max_links`)."""
    lgr_linger_server: float = 600.0
    """An empty link group is kept this long for reuse, then ended (Linux, server)."""
    lgr_linger_client: float = 610.0
    """The same for a client's link group (Linux: 10 s more than the server's)."""
    qp_mtu: int = 5
    """Our QP MTU enum for CLC (5 = 4096: the shm RNIC's active MTU)."""
    autocork_size: int = 0
    """Autocorking (Linux ``smc_should_autocork``, sysctl ``net.smc.autocorking_size``, 64 KiB
    there): a small send waits in the send buffer while an earlier CDC awaits the
    peer's answer, up to this many bytes (at most half the send buffer), and goes with
    the next CDC.  0 turns it off.  Linux waits for the CDC's completion; an RNIC
    whose sends complete when posted (the shm RNIC) has none to wait for, so this
    engine asks the peer to answer (:meth:`Connection.echo_wanted`).  The runtime turns
    it on where it pays (:mod:`smcr.stack.runtime`)."""
    add_links: bool = False
    """Whether this engine takes part in ADD LINK (SMC-Rv1 and v2): as server it offers
    another link after first contact, after a DELETE LINK left one, and on
    :meth:`~smcr.core.engine.Engine.port_up`, over another port of
    :attr:`LocalIdentity.ports` or, as Linux does with one usable RNIC, an asymmetric one
    over the same; as client it accepts an offer as Linux ``smc_llc_cli_add_link`` does
    and asks for a link on ``port_up``; SMC-Rv2.1 negotiates 2 links.  It needs a host
    that makes a QP on any port and registers every RMB there
    (:class:`~smcr.core.events.Provider`).  False: one link per group, the server offers
    none and the client rejects every offer (the runtime's choice with one RNIC and
    one link per group asked for)."""

    @property
    def v2_max_links(self) -> int:
        """The max links SMC-Rv2.1 negotiates with (Proposal, server's choice):
        :attr:`max_links_v2`, and at least Linux's default 2 (``smcr_max_links_per_lgr``)
        when this engine takes part in ADD LINK."""
        return max(self.max_links_v2, 2) if self.add_links else self.max_links_v2


@dataclass(frozen=True, slots=True)
class Port:
    """One RNIC port this system can make links over (Linux ``smcibdev`` + ``ibport``).

    :param gid: the port's GID, 16 bytes.
    :param mac: the port's MAC, 6 bytes.
    :param netdev: the host's name for it (net device or shm RNIC name), for the host
        and the tools only; the engine names a port by its index in
        :attr:`LocalIdentity.ports`.
    :param pnetid: its PNET ID (Linux ``smcibdev->pnetid``): a link group's further
        links go only over ports of the same PNET ID as its first (``smc_pnet_match``;
        two empty ones match).
    """

    gid: bytes
    mac: bytes
    netdev: str = ""
    pnetid: str = ""


@dataclass(frozen=True, slots=True)
class LocalIdentity:
    """This system as CLC and LLC describe it: RNIC GID and MAC, the peer ID, and
    what SMC-Rv2 needs besides (host name, whether the GID is usable for v2)."""

    gid: bytes
    mac: bytes
    peer_id: bytes
    hostname: bytes = b" " * 32
    """The 32-byte, blank-padded host name of the v2 first-contact extension
    (Linux ``smc_clc_init``: the node name)."""
    v2_capable: bool = True
    """Whether :attr:`gid` serves SMC-Rv2 (Linux: an IPv4-mapped RoCE v2 GID on the TCP
    connection's netdev, ``smc_ib_determine_gid`` with ``smcrv2``); the shm RNIC's
    opaque GID serves it between smcr peers."""
    netdev: str = ""
    """The host's name of the first port (:class:`Port`)."""
    pnetid: str = ""
    """The first port's PNET ID (:attr:`Port.pnetid`)."""
    more_ports: tuple[Port, ...] = ()
    """Further RNIC ports (redundant links, ADD LINK); CLC always names the first."""
    v2_over_ipv6: bool = False
    """Whether SMC-Rv2 is offered over IPv6 TCP connections too: :attr:`gid` is an IPv6
    RoCE v2 GID (the RoCE RNIC of an IPv6 address).  Linux offers SMC-Rv2 over IPv4 only
    (``smc_find_proposal_devices``); smcr peers cross IPv6 routers with it, and a Linux
    server answers such an offer as one without v2 (its route check finds no IPv4
    address in the GID).  The same wire form as the RFC "net/smc: add full IPv6 support
    for SMC" (netdev, November 2025: the GID is the IPv6 address, the route is
    ``smc_ib_find_route_v6``)."""

    ports: tuple[Port, ...] = field(init=False, repr=False, compare=False, default=())
    """Every port, the first (:attr:`gid`, :attr:`mac`: the one CLC names) at index 0;
    a link's ``port`` and the QP actions' ``port`` are indexes into this.  Made once
    (a handshake asks for it several times)."""

    def __post_init__(self) -> None:
        first = Port(self.gid, self.mac, self.netdev, self.pnetid)
        object.__setattr__(self, "ports", (first, *self.more_ports))
