"""CLC version negotiation, SMC-Rv1 and SMC-Rv2, as Linux decides it (``af_smc.c``).

Pure functions over decoded CLC messages: the engine calls them and acts on
the outcome.  Each step names the Linux function it mirrors and declines with
the code Linux uses on that path.

Client (``__smc_connect``, ``smc_find_proposal_devices``): SMC-R v1 is always
offered; SMC-Rv2 as well when the host has a UEID, the RNIC's GID serves v2
and the TCP connection is IPv4 (or v4-mapped): byte 7 ``0x20``, the v1 parts
and the v2 extension with the UEIDs and the GID (:func:`proposal`).  On the
Accept (:func:`check_accept`): a version that was not offered declines with
``MODEUNSUPP`` (``smc_connect_check_aclc``); a v2 first contact takes the
server's release, max conns and max links (``smc_connect_rdma_v2_prepare``,
``smc_clc_clnt_v2x_features_validate``).

Server (``smc_listen_work``), :func:`choose`: ``smc_listen_v2_check`` (which
versions the Proposal leaves: none -> ``PEERNOSMC``, v2 without any UEID ->
``NOUEID``, SMC-Dv2 -> ``NOISM2SUPP`` since we have no ISM), then
``smc_clc_srv_v2x_features_validate`` (v2.1 max conns/links, ``MAXCONNERR`` /
``MAXLINKERR``), then ``smc_listen_find_device``: the prefix check (v1 parts
only), SMC-Rv2 if a UEID of the Proposal is ours and our GID serves v2
(``smc_find_rdma_v2_device_serv``; a GID that does not records ``NOSMCRDEV``),
else SMC-Rv1 when the prefixes match (``smc_find_rdma_v1_device_serv``:
``NOSMCDEV`` without a v1 offer).  As in Linux the first recorded reason wins
(``smc_find_ism_store_rc``), so an SMC-Rv2-only Proposal without a common
UEID is declined with ``NOSMCDEV``, not ``NOUEID``.  On the Confirm
(:func:`check_confirm`): ``smc_clc_v2x_features_confirm_check``.

Routes (SMC-Rv2 crosses IP routers): the server asks how it reaches the GID of
the Proposal's v2 extension (``smc_find_rdma_v2_device_serv`` ->
``smc_ib_determine_gid`` -> ``smc_ib_find_route``); no route means no SMC-Rv2
device (``NOSMCRDEV`` recorded, SMC-Rv1 may still be chosen), an on-link client's
next hop is the Proposal's MAC.  Its first-contact extension says "direct" unless
the client is behind a gateway (``smc_clc_send_confirm_accept``: ``v2_direct =
!lgr->uses_gateway``).  The client takes a "direct" Accept's MAC as next hop, else
asks its own route to the server's GID (:func:`client_next_hop`,
``smc_connect_rdma_v2_prepare``): none declines ``NOROUTE``, an on-link one
``NOINDIRECT``.  The lookup itself is the host's (``Provider.find_route``): the core
has no routing table.  SMC-Rv1 has no gateways: a client in another subnet has
other prefixes and the server declines ``DIFFPREFIX`` at once.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Callable
from dataclasses import dataclass, field

from smcr.core.config import Config, LocalIdentity
from smcr.core.events import NextHop
from smcr.core.handshake import Decline, IpAddress, prefix_area
from smcr.core.linkgroup import SMC_FEATURE_MASK, V2Terms
from smcr.wire.clc import ClcAccept, ClcConfirm, ClcProposal, FirstContactExt, V2Extension
from smcr.wire.decline import DeclineCode

SMC_RELEASE = 1
"""``SMC_RELEASE``: we speak SMC v2.1 (max conns / max links negotiation)."""
__all__ = ["SMC_FEATURE_MASK", "RouteTo", "ServerChoice", "V2Terms", "check_accept",
           "check_confirm", "choose", "client_next_hop", "first_contact_ext", "offers_v2",
           "on_link", "proposal"]
CONN_PER_LGR_MIN = 16  # SMC_CONN_PER_LGR_MIN
CONN_PER_LGR_MAX = 255  # SMC_CONN_PER_LGR_MAX
LINKS_ADD_LNK_MIN = 1  # SMC_LINKS_ADD_LNK_MIN
LINKS_ADD_LNK_MAX = 2  # SMC_LINKS_ADD_LNK_MAX


RouteTo = Callable[[bytes], "NextHop | None"]
"""How we reach a peer's GID (``Provider.find_route`` for the port in question)."""


def on_link(gid: bytes) -> NextHop | None:
    """The route of a host without routes: every peer on-link."""
    return NextHop()


@dataclass(frozen=True, slots=True, init=False)
class ServerChoice:
    """The server's decision on a Proposal: the version and whom it talks to.

    :param version: 1 (SMC-Rv1) or 2 (SMC-Rv2).
    :param peer_gid: the client's GID for the link (v2: the v2 extension's).
    :param peer_mac: the client's MAC (v2: zeros unless a v1 part was offered).
    :param terms: the v2 terms; ``None`` for v1.
    :param next_hop: v2: how we reach the client (through a gateway or not, and the
        next hop's MAC: the client's own when on-link).
    """

    version: int
    peer_gid: bytes
    peer_mac: bytes
    terms: V2Terms | None = None
    next_hop: NextHop = field(default_factory=NextHop)

    def __init__(self, version: int, peer_gid: bytes, peer_mac: bytes,
                 terms: V2Terms | None = None,
                 next_hop: NextHop | None = None) -> None:  # fmt: skip
        # written out (one per handshake): the dataclass's frozen __init__ is interpreted
        # code even in the compiled build, which makes these plain stores
        object.__setattr__(self, "version", version)
        object.__setattr__(self, "peer_gid", peer_gid)
        object.__setattr__(self, "peer_mac", peer_mac)
        object.__setattr__(self, "terms", terms)
        object.__setattr__(self, "next_hop", NextHop() if next_hop is None else next_hop)


# ---------------------------------------------------------------- client


def offers_v2(ueids: tuple[bytes, ...], identity: LocalIdentity, local_ip: IpAddress) -> bool:
    """Whether a Proposal offers SMC-Rv2 (``smc_find_proposal_devices``: a UEID is set,
    an RNIC GID serves v2, the TCP socket is IPv4 or v4-mapped; or, beyond Linux, an
    IPv6 RoCE GID, :attr:`LocalIdentity.v2_over_ipv6`)."""
    return (bool(ueids) and identity.v2_capable
            and (identity.v2_over_ipv6 or _ipv4_or_mapped(local_ip)))  # fmt: skip


@functools.lru_cache(maxsize=256, typed=True)  # (an interface is not its address)
def _ipv4_or_mapped(local_ip: IpAddress) -> bool:
    """Whether a local address (or interface) is IPv4 or v4-mapped IPv6 (kept per address:
    asked at every handshake)."""
    ip = ipaddress.ip_address(str(local_ip).split("/")[0])
    return not (isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is None)


def proposal(identity: LocalIdentity, local_ip: IpAddress, ueids: tuple[bytes, ...],
             config: Config) -> ClcProposal:  # fmt: skip
    """The client's Proposal: v1 only, or v1 and v2 (``smc_clc_send_proposal``)."""
    area = prefix_area(local_ip)
    ident = identity
    if not offers_v2(ueids, identity, local_ip):
        return ClcProposal.smcr_v1(ident.peer_id, ident.gid, ident.mac,
                                   outgoing_subnet=area.outgoing_subnet,
                                   prefix_len=area.prefix_len,
                                   ipv6_prefixes=area.ipv6_prefixes)  # fmt: skip
    ext = V2Extension(release=SMC_RELEASE, roce_gid=ident.gid, max_conns=config.max_conns,
                      max_links=config.v2_max_links, feature_mask=SMC_FEATURE_MASK,
                      user_eids=ueids)  # fmt: skip
    return ClcProposal.smcr_v1_v2(ident.peer_id, ident.gid, ident.mac, ext,
                                  outgoing_subnet=area.outgoing_subnet,
                                  prefix_len=area.prefix_len,
                                  ipv6_prefixes=area.ipv6_prefixes)  # fmt: skip


def check_accept(acc: ClcAccept, offered_v2: bool) -> V2Terms | None:
    """The client's checks of an Accept; the v2 terms for a v2 Accept, else None.

    :raises Decline: ``MODEUNSUPP`` for a version not offered
        (``smc_connect_check_aclc``); ``MAXCONNERR``/``MAXLINKERR`` for v2.1 terms
        out of range (``smc_clc_clnt_v2x_features_validate``).
    """
    if acc.version < 2:
        return None
    if not offered_v2:
        raise Decline(DeclineCode.MODEUNSUPP, "SMC-Rv2 Accept to a Proposal without v2")
    fce = acc.fce
    if fce is None:  # not first contact: the link group's terms hold
        return V2Terms(eid=acc.eid)
    if fce.release < SMC_RELEASE:
        return V2Terms(eid=acc.eid, release=fce.release)
    if fce.max_conns < CONN_PER_LGR_MIN:
        raise Decline(DeclineCode.MAXCONNERR, f"server's max conns {fce.max_conns}")
    if not LINKS_ADD_LNK_MIN <= fce.max_links <= LINKS_ADD_LNK_MAX:
        raise Decline(DeclineCode.MAXLINKERR, f"server's max links {fce.max_links}")
    return V2Terms(eid=acc.eid, release=fce.release, max_conns=fce.max_conns,
                   max_links=fce.max_links,
                   feature_mask=fce.feature_mask & SMC_FEATURE_MASK)  # fmt: skip


def client_next_hop(acc: ClcAccept, route_to: RouteTo) -> NextHop:
    """How the client reaches the server of a first-contact v2 Accept
    (``smc_connect_rdma_v2_prepare``): a "direct" server is on-link at the Accept's MAC;
    else our route to its GID must go through a gateway.

    :raises Decline: ``NOROUTE`` without a route, ``NOINDIRECT`` for an on-link route
        to a server that said it is not direct.
    """
    fce = acc.fce
    if fce is None or fce.v2_direct:
        return NextHop(False, acc.mac)
    hop = route_to(acc.gid)
    if hop is None:
        raise Decline(DeclineCode.NOROUTE, "no route to the server's GID")
    if not hop.uses_gateway:
        raise Decline(DeclineCode.NOINDIRECT, "the server says indirect, our route is on-link")
    return hop


def first_contact_ext(terms: V2Terms, identity: LocalIdentity,
                      direct: bool = True) -> FirstContactExt:  # fmt: skip
    """Our first-contact extension (``smc_clc_fill_fce_v2x``): v2.1 fields only in v2.1;
    ``v2_direct`` unless the peer is behind a gateway."""
    v21 = terms.release >= SMC_RELEASE
    return FirstContactExt(
        v2_direct=direct, release=terms.release, hostname=identity.hostname,
        max_conns=terms.max_conns if v21 else 0, max_links=terms.max_links if v21 else 0,
        feature_mask=terms.feature_mask if v21 else 0,
    )  # fmt: skip


# ---------------------------------------------------------------- server


def choose(prop: ClcProposal, local_ip: IpAddress, ueids: tuple[bytes, ...],
           identity: LocalIdentity, config: Config,
           route_to: RouteTo = on_link) -> ServerChoice:  # fmt: skip
    """The server's choice of SMC-Rv2 or SMC-Rv1 for a Proposal (module docstring);
    ``route_to`` says how we reach the client's v2 GID.

    :raises Decline: with the code Linux declines with on that path.
    """
    v1 = prop.typev1.smcr
    v2 = prop.version >= 2 and prop.typev2.smcr
    smcd = prop.typev1.smcd  # SMC-D v1 offered: "found" nowhere here
    ext = prop.v2_extension
    # smc_listen_v2_check
    reason = DeclineCode.PEERNOSMC
    release = 0
    v2_offered = prop.version >= 2 and (prop.typev2.smcr or prop.typev2.smcd)
    if v2_offered:
        if ext is None:  # the decoder requires it; kept for the order of Linux's checks
            v2, reason = False, DeclineCode.NOV2EXT
        else:
            if prop.typev2.smcd:
                reason = DeclineCode.NOISM2SUPP
            if v2 and not ext.user_eids:
                v2, reason = False, DeclineCode.NOUEID
            release = min(ext.release, SMC_RELEASE)
    if not (v1 or v2 or smcd):
        raise Decline(reason)
    # smc_clc_srv_v2x_features_validate
    max_conns, max_links = CONN_PER_LGR_MAX, LINKS_ADD_LNK_MAX
    if v2 and ext is not None and release >= SMC_RELEASE:
        max_conns = min(ext.max_conns, config.max_conns)
        if max_conns < CONN_PER_LGR_MIN:
            raise Decline(DeclineCode.MAXCONNERR, f"client's max conns {ext.max_conns}")
        max_links = min(ext.max_links, config.v2_max_links)
        if max_links < LINKS_ADD_LNK_MIN:
            raise Decline(DeclineCode.MAXLINKERR, f"client's max links {ext.max_links}")
    # smc_listen_find_device
    stored: DeclineCode | None = None
    prefix_ok = prop.prefix is None or prop.prefix == prefix_area(local_ip)
    if not prefix_ok:
        stored = DeclineCode.DIFFPREFIX
    elif smcd:
        stored = DeclineCode.NOSMCDDEV  # smc_find_ism_v1_device_serv finds no ISM
    if not (v1 or prop.typev2.smcr):
        raise Decline(stored or DeclineCode.NOSMCDDEV)
    if v2 and ext is not None:
        eid = next((e for e in ext.user_eids if e in ueids), None)
        if eid is not None:
            hop = route_to(ext.roce_gid) if identity.v2_capable else None
            if hop is not None:
                terms = V2Terms(eid=eid, release=release, max_conns=max_conns,
                                max_links=max_links)  # fmt: skip
                if not hop.uses_gateway:  # the client's own MAC
                    hop = NextHop(False, prop.mac)
                return ServerChoice(2, ext.roce_gid, prop.mac, terms, hop)
            stored = stored or DeclineCode.NOSMCRDEV
    if not prefix_ok:
        raise Decline(DeclineCode.DIFFPREFIX)
    if not v1:
        raise Decline(stored or DeclineCode.NOSMCDEV)
    return ServerChoice(1, prop.gid, prop.mac)


def check_confirm(conf: ClcConfirm, terms: V2Terms | None) -> V2Terms | None:
    """The server's check of a first-contact v2 Confirm
    (``smc_clc_v2x_features_confirm_check``); the terms with the client's features.

    :raises Decline: ``RELEASEERR``, ``MAXCONNERR`` or ``MAXLINKERR``.
    """
    fce = conf.fce
    if terms is None or conf.version < 2 or fce is None:
        return terms
    if fce.release != terms.release:
        raise Decline(DeclineCode.RELEASEERR, f"Confirm release {fce.release}")
    if fce.release < SMC_RELEASE:
        return terms
    if fce.max_conns != terms.max_conns:
        raise Decline(DeclineCode.MAXCONNERR, f"Confirm max conns {fce.max_conns}")
    if fce.max_links != terms.max_links:
        raise Decline(DeclineCode.MAXLINKERR, f"Confirm max links {fce.max_links}")
    return V2Terms(eid=terms.eid, release=terms.release, max_conns=terms.max_conns,
                   max_links=terms.max_links, feature_mask=fce.feature_mask)  # fmt: skip
