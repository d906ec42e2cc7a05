"""Link groups and links: the state the LLC flows work on (Linux ``smc_core.h``).

A link group holds every SMC-R connection between two peer systems in one
role pair (the side that was server stays server); it owns its links (RC QP
pairs, each over one of our ports) and the connections' tokens.  With
:attr:`Config.add_links <smcr.core.config.Config.add_links>` the engine adds a second
one (ADD LINK, :mod:`smcr.core.addlink`; a third for a moment while an asymmetric
link is replaced), else a group has one link.

Peer RMBs (Linux ``lgr->rtokens``): one :data:`Rtoken` per peer RMB, the
(rkey, vaddr) the peer gave for it on each link; a connection holds its peer
RMB's, so a link added later (ADD LINK CONTINUATION) fills in every
connection's rkey for that link at once.

LLC concurrency (``smc_llc_flow_start``): one *local* flow at a time per link
group -- CONFIRM RKEY, DELETE RKEY, the server's ADD LINK and DELETE LINK, the
client's REQUEST ADD LINK, queued in order -- while remote CONFIRM / DELETE RKEY
requests are answered at once; a remote ADD LINK or DELETE LINK request that comes
while a local flow of another kind runs waits for its end (``delayed``), one of the
same kind is dropped.  A response that does not fit the running local flow is
dropped.
"""

from __future__ import annotations

import enum
import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from smcr.core.connection import Connection
from smcr.core.events import Action, QpToRtr
from smcr.wire.llc import LlcMessage

ROUTED_HOP_LIMIT = 64
"""The hop limit of a link to a peer behind a router (Linux ``IPV6_DEFAULT_HOPLIMIT`` in
``smc_ib_modify_qp_rtr``); on-link peers get 1."""
SMC_FEATURE_MASK = 0x0001
"""``SMC_FEATURE_MASK`` (``SMC_SPF_EMULATED_ISM_DEV``), what Linux 6.12 sends."""


@dataclass(frozen=True, slots=True, init=False)
class V2Terms:
    """What an SMC-Rv2 link group was agreed with (Linux ``smc_init_info`` v2 fields).

    :param eid: the negotiated EID, 32 bytes.
    :param release: the SMC release both use (0 = v2.0, 1 = v2.1).
    :param max_conns: connections per link group (v2.1).
    :param max_links: links per link group (v2.1).
    :param feature_mask: the common supplemental features.
    """

    eid: bytes
    release: int = 1
    max_conns: int = 255
    max_links: int = 2
    feature_mask: int = SMC_FEATURE_MASK

    def __init__(self, eid: bytes, release: int = 1, max_conns: int = 255, max_links: int = 2,
                 feature_mask: int = SMC_FEATURE_MASK) -> None:  # fmt: skip
        object.__setattr__(self, "eid", eid)
        object.__setattr__(self, "release", release)
        object.__setattr__(self, "max_conns", max_conns)
        object.__setattr__(self, "max_links", max_links)
        object.__setattr__(self, "feature_mask", feature_mask)


class LinkState(enum.Enum):
    """Linux ``enum smc_link_state``; values as ``smcr link-show`` prints them."""

    LINK_UNUSED = "LINK_UNUSED"
    LINK_INACTIVE = "LINK_INACTIVE"
    LINK_ACTIVATING = "LINK_ACTIVATING"
    LINK_ACTIVE = "LINK_ACTIVE"


class Role(enum.Enum):
    """Link group role, as ``smcr linkgroup show`` prints it."""

    # (an identity hash: Enum's own hashes the name in Python, and the engine's tables
    # are keyed by members several times per connection)
    __hash__ = object.__hash__

    SERVER = "SERV"
    CLIENT = "CLNT"


class LgrType(enum.Enum):
    """Link group type (Linux ``enum smc_lgr_type``)."""

    NONE = "NONE"
    SINGLE = "SINGLE"
    SYMMETRIC = "SYMMETRIC"
    ASYMMETRIC_PEER = "ASYMMETRIC_PEER"
    ASYMMETRIC_LOCAL = "ASYMMETRIC_LOCAL"


Rtoken = dict["Link", tuple[int, int]]
"""One peer RMB: link -> (rkey, vaddr) the peer registered it with for that link."""


@dataclass(eq=False)
class Link:
    """One RC QP pair of a link group (Linux ``struct smc_link``)."""

    qpn: int
    psn: int
    lgr: LinkGroup
    link_id: int = 0
    port: int = 0  # index into LocalIdentity.ports: the RNIC port of our QP
    state: LinkState = LinkState.LINK_ACTIVATING
    peer_qpn: int = 0
    peer_psn: int = 0
    peer_gid: bytes = bytes(16)
    peer_mac: bytes = bytes(6)
    mtu: int = 0
    last_rx: float = 0.0
    last_delivered: float = 0.0
    """When the transport last showed that it delivers over this link, whether or not the
    peer sends anything: a signaled send of ours completed, or the host saw the QP's
    PSNs move (:meth:`~smcr.core.engine.Engine.link_delivered`)."""
    test_deadline: float | None = None
    test_sent: float = 0.0
    """When the TEST LINK awaiting :attr:`test_deadline` went out."""
    is_asym: bool = False
    """The group's asymmetric link (Linux ``link_is_asym``): new connections avoid it."""
    switch_deadline: float | None = None
    """A failed link whose connections wait to move until the peer has heard of its loss
    (:meth:`~smcr.core.failover.Failover.link_failed`): when they move at the latest."""
    down_reason: str = ""
    """Why that link failed."""
    wr_ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def next_wr_id(self) -> int:
        """A fresh per-link WR id (Linux ``smc_wr_tx_get_next_wr_id``)."""
        return next(self.wr_ids)

    @property
    def names(self) -> dict[str, int]:
        """The QP actions' naming fields for this link (lgr_id, link_id, port)."""
        return {"lgr_id": self.lgr.lgr_id, "link_id": self.link_id, "port": self.port}

    def qp_to_rtr(self) -> QpToRtr:
        """The action that brings this link's QP to RTR towards its peer (Linux
        ``smc_ib_modify_qp_rtr``): hop limit 1 and the peer's MAC; in an SMC-Rv2 group
        whose peer is behind a router (``lgr->uses_gateway``) hop limit 64
        (``IPV6_DEFAULT_HOPLIMIT``) and the next hop's MAC."""
        lgr = self.lgr
        routed = lgr.version >= 2 and lgr.uses_gateway
        return QpToRtr(self.qpn, self.peer_gid, self.peer_qpn, self.peer_psn, self.mtu,
                       lgr.lgr_id, self.link_id, self.port,
                       ROUTED_HOP_LIMIT if routed else 1,
                       lgr.nexthop_mac if routed else self.peer_mac)  # fmt: skip


@dataclass(eq=False)
class AddLinkFlow:
    """An ADD LINK flow under way (Linux ``smc_llc_srv_add_link`` /
    ``smc_llc_cli_add_link``): the link it talks over, the new link, the group type
    it will make, its step, and the rkey exchange's progress."""

    link: Link
    new: Link
    new_type: LgrType
    step: str  # "response" (server), "cont", "confirm"
    to_send: list[Connection]  # connections whose RMB's rkeys are still to send
    recv_left: int = 0  # rkeys the peer still has to send (its last count)
    deadline: float = 0.0  # the client's wait (the server's is its LocalFlow's)
    request: LlcMessage | None = None  # client: the server's ADD LINK (a reject echoes it)
    started: float = 0.0  # client: when it answered (its rkey exchange's waits are bounded)


@dataclass(eq=False)
class LocalFlow:
    """A local LLC request waiting for its response."""

    request: LlcMessage
    on_done: Callable[[bool, float], list[Action]]
    deadline: float = 0.0
    started: float | None = None
    """When the request went out (:meth:`~smcr.core.llc.LinkLayer.next_flow`); None for a
    flow whose steps set their own deadlines (ADD LINK)."""
    add_link: AddLinkFlow | None = None  # the steps after the request, for ADD LINK
    build: Callable[[Link], LlcMessage] | None = None
    """Builds the request for the link it goes over when the flow starts (CONFIRM RKEY
    names every link active then: a link added while it waited is included)."""
    start: Callable[[Link, float, list[Action]], LlcMessage | None] | None = None
    """Decides when the flow starts (the server's ADD LINK: which port, whether a link
    may be added at all); the request to send, or None when there is nothing to do."""
    adds_link: bool = False  # the server's ADD LINK flow (Linux SMC_LLC_FLOW_ADD_LINK)


@dataclass(eq=False)
class LinkGroup:
    """Linux ``struct smc_link_group`` (one link here)."""

    lgr_id: int
    role: Role
    peer_id: bytes
    lgr_type: LgrType = LgrType.NONE
    links: list[Link] = field(default_factory=list)
    conns: dict[int, Connection] = field(default_factory=dict)  # by our alert token
    flow: LocalFlow | None = None
    flow_queue: deque[LocalFlow] = field(default_factory=deque)
    peer_rtokens: list[Rtoken] = field(default_factory=list)  # confirmed peer RMBs
    rtoken_index: dict[tuple[Link, int], Rtoken] = field(default_factory=dict)
    """:attr:`peer_rtokens` by (link, rkey on it): a new connection's lookup (it misses: a
    new RMB) would otherwise walk all of them, up to 255, twice per handshake.  Kept by
    the methods below, the one way the rtokens change."""
    idle_rmbs: dict[int, Link] = field(default_factory=dict)
    """Our RMBs of released connections whose rkey the peer still holds, by rkey, with
    the link it holds it for (:meth:`Rkeys.release <smcr.core.rkeys.Rkeys.release>`):
    a connection of this group that gets one of them again needs no CONFIRM RKEY."""
    next_link_id: int = 0  # server: the last link id given (Linux lgr->next_link_id)
    remote_add: AddLinkFlow | None = None  # client: the server's ADD LINK flow being answered
    delayed: tuple[Link, LlcMessage] | None = None
    """An ADD/DELETE LINK request that came while a local flow ran (Linux
    ``lgr->delayed_event``), handled when it ends."""
    terminated: bool = False
    idle_since: float | None = None  # when the last connection left
    version: int = 1
    """SMC-R version of the group (Linux ``lgr->smc_version``): its LLC messages are
    v2 (byte 0 ``0x2X``, 16-bit length) in a v2 group."""
    terms: V2Terms | None = None  # v2: negotiated EID, release, max conns/links
    peer_hostname: bytes = b""  # v2: from the peer's first-contact extension
    add_asked: bool = False
    """Server: a client's ADD LINK invitation or REQUEST ADD LINK came while an ADD LINK
    flow ran (:meth:`AddLinkFlows.srv_add_link
    <smcr.core.addlink.AddLinkFlows.srv_add_link>`)."""
    pnet_id: str = ""
    """The PNET ID of the port the group started on (Linux ``lgr->pnet_id``): its further
    links go over ports of this one only (:meth:`AddLinkFlows._alt_port
    <smcr.core.addlink.AddLinkFlows._alt_port>`)."""
    peer_release: int = 0
    uses_gateway: bool = False
    """SMC-Rv2: the peer is behind an IP router (Linux ``lgr->uses_gateway``): links send
    with hop limit 64 to :attr:`nexthop_mac`, and CLC and ADD LINK say "not direct"."""
    nexthop_mac: bytes = bytes(6)
    """SMC-Rv2: the MAC of the next hop to the peer (Linux ``lgr->nexthop_mac``)."""

    @property
    def max_conns(self) -> int:
        """Connections this group may hold (v2.1 negotiates it; else Linux's 255)."""
        return self.terms.max_conns if self.terms is not None else 255

    @property
    def max_links(self) -> int:
        """Links this group may hold (Linux ``lgr->max_links``): v2.1 negotiates it, else
        ``SMC_LINKS_ADD_LNK_MAX`` (2)."""
        return self.terms.max_links if self.terms is not None else 2

    @property
    def active_link(self) -> Link | None:
        """The first active link (LLC flows go over it; new connections use it)."""
        for link in self.links:
            if link.state is LinkState.LINK_ACTIVE:
                return link
        return None

    def link_by_id(self, link_id: int) -> Link | None:
        """The link of that id, if the group has it."""
        for link in self.links:
            if link.link_id == link_id:
                return link
        return None

    def new_link_id(self) -> int:
        """``smcr_next_link_id``: the next id after the last given, never 0 nor in use."""
        while True:
            self.next_link_id = (self.next_link_id + 1) & 0xFF
            if self.next_link_id and self.link_by_id(self.next_link_id) is None:
                return self.next_link_id

    # -- peer RMBs (Linux smc_rtoken_add / smc_rtoken_delete / smc_rtoken_set) ----------

    def rtoken_find(self, link: Link, rkey: int) -> Rtoken | None:
        """The peer RMB known on ``link`` by ``rkey``."""
        return self.rtoken_index.get((link, rkey))

    def rtoken_add(self, link: Link, rkey: int, vaddr: int) -> Rtoken:
        """Add a peer RMB by its rkey on ``link`` (the one already there if known)."""
        rt = self.rtoken_find(link, rkey)
        if rt is None:
            rt = {link: (rkey, vaddr)}
            self.peer_rtokens.append(rt)
            self.rtoken_index[link, rkey] = rt
        return rt

    def rtoken_set(self, rt: Rtoken, link: Link, rkey: int, vaddr: int) -> None:
        """Peer RMB ``rt`` is known on ``link`` by ``rkey`` at ``vaddr`` (its other links'
        keys, ``smc_rtoken_set``, or a new key on the same link)."""
        self._unindex(rt, link)
        rt[link] = (rkey, vaddr)
        self.rtoken_index[link, rkey] = rt

    def rtoken_delete(self, link: Link, rkey: int) -> bool:
        """Forget a peer RMB named by its rkey on ``link``; False if unknown."""
        rt = self.rtoken_find(link, rkey)
        if rt is None:
            return False
        for x in list(rt):
            self._unindex(rt, x)
        self.peer_rtokens.remove(rt)
        return True

    def rtokens_forget_link(self, link: Link) -> None:
        """Every peer RMB's key on ``link``, which is gone."""
        for rt in self.peer_rtokens:
            self._unindex(rt, link)
            rt.pop(link, None)

    def _unindex(self, rt: Rtoken, link: Link) -> None:
        """``rt``'s key on ``link`` no longer finds it."""
        old = rt.get(link)
        if old is not None and self.rtoken_index.get((link, old[0])) is rt:
            del self.rtoken_index[link, old[0]]
