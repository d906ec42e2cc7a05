"""What the engine asks its host to do (actions) and what it reports (events).

Actions are imperative (``PostSend``, ``RdmaWrite``), events past tense
(``HandshakeCompleted``).  Order is a contract: the host executes actions in
list order, so an ``RdmaWrite`` precedes the CDC ``PostSend`` that announces
its bytes on the same QP (RC ordering, spec §8).  Payload never appears here:
actions name offsets in the connection's send buffer, events carry no bytes
(the inline data path, :meth:`smcr.core.connection.Connection.write_inline`,
hands the application's buffer back to its caller, not through an action).
What the engine asks of its host synchronously (a QP, an RMB registration) is
:class:`Provider`.

The two actions of the data path, ``PostSend`` and ``RdmaWrite``, are plain
(not frozen) slotted dataclasses: a frozen one costs about 1.3-2 µs to build in
CPython 3.11 (every field goes through ``object.__setattr__``), a plain one
0.25 µs, and one of each is built per message sent.  So are the ones every
connection builds (``SendClc``, ``ShutdownTcp``, ``ReleaseConnection``,
``ReuseRmb``, ``HandshakeCompleted``): mypyc compiles a dataclass but not the
``__init__`` the dataclasses module writes for it.  Treat them as immutable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from smcr.wire.decline import DeclineCode

# ---------------------------------------------------------------- actions


@dataclass(slots=True, init=False)
class SendClc:
    """Write ``data`` (one encoded CLC message) to the connection's TCP socket.  Made per
    connection, as are the other records whose ``__init__`` is written out here: the
    compiled build then makes them without the interpreter (:mod:`smcr.rdma.verbs`)."""

    conn: int
    data: bytes

    def __init__(self, conn: int, data: bytes) -> None:
        self.conn = conn
        self.data = data


@dataclass(frozen=True, slots=True)
class QpToRtr:
    """Bring the link's QP RESET->INIT->RTR towards the peer and post its receives.

    ``lgr_id``/``link_id`` name the link, ``port`` the RNIC port its QP was made on
    (an index into :attr:`~smcr.core.config.LocalIdentity.ports`); ``qpn`` is that
    QP's number, unique among the process's QPs over all its ports (the
    :class:`Provider` contract).  A client's first link has
    ``link_id`` 0 here: the server names it later, in CONFIRM LINK.  ``hop_limit``
    and ``dmac`` are the address vector's (Linux ``smc_ib_modify_qp_rtr``): 1 and the
    peer's MAC, or in an SMC-Rv2 group whose peer is behind a router 64 and the next
    hop's MAC (:meth:`~smcr.core.linkgroup.Link.qp_to_rtr`).
    """

    qpn: int
    peer_gid: bytes
    peer_qpn: int
    peer_psn: int
    mtu: int
    lgr_id: int = 0
    link_id: int = 0
    port: int = 0
    hop_limit: int = 1
    dmac: bytes = bytes(6)


@dataclass(frozen=True, slots=True)
class QpToRts:
    """Bring the link's QP RTR->RTS with our initial send PSN (link named as in
    :class:`QpToRtr`)."""

    qpn: int
    psn: int
    lgr_id: int = 0
    link_id: int = 0
    port: int = 0


@dataclass(slots=True, init=False)
class PostSend:
    """SEND one LLC or CDC message on the link's QP (signaled unless said otherwise).  Made
    per message: its ``__init__`` is written out so that the compiled build makes it
    without the interpreter (:mod:`smcr.rdma.verbs` says why)."""

    qpn: int
    data: bytes
    wr_id: int
    signaled: bool = True

    def __init__(self, qpn: int, data: bytes, wr_id: int, signaled: bool = True) -> None:
        self.qpn = qpn
        self.data = data
        self.wr_id = wr_id
        self.signaled = signaled


@dataclass(slots=True, init=False)
class RdmaWrite:
    """RDMA WRITE ``length`` bytes at ``src_offset`` of the send buffer to the peer (made per
    write: ``__init__`` written out, as :class:`PostSend`'s)."""

    qpn: int
    conn: int
    src_offset: int
    length: int
    remote_addr: int
    rkey: int

    def __init__(self, qpn: int, conn: int, src_offset: int, length: int, remote_addr: int,
                 rkey: int) -> None:  # fmt: skip
        self.qpn = qpn
        self.conn = conn
        self.src_offset = src_offset
        self.length = length
        self.remote_addr = remote_addr
        self.rkey = rkey


@dataclass(frozen=True, slots=True)
class DestroyQp:
    """Destroy the link's QP (link group gone, or the link deleted or never confirmed);
    link named as in :class:`QpToRtr`."""

    qpn: int
    lgr_id: int = 0
    link_id: int = 0
    port: int = 0


@dataclass(slots=True, init=False)
class ShutdownTcp:
    """Shut the connection's TCP socket down (``SHUT_WR`` or ``SHUT_RDWR``), as Linux does."""

    conn: int
    how: int

    def __init__(self, conn: int, how: int) -> None:
        self.conn = conn
        self.how = how


@dataclass(slots=True, init=False)
class ReleaseConnection:
    """The connection reached CLOSED: its RMB and send buffer may go back to the pool."""

    conn: int

    def __init__(self, conn: int) -> None:
        self.conn = conn


@dataclass(slots=True, init=False)
class ReuseRmb:
    """A released connection's RMB is no longer the peer's to write: its DELETE RKEY was
    answered (or its link is gone), so the RMB may serve another connection (Linux
    ``smcr_buf_unuse``).  Until then a write the peer had posted may still arrive."""

    conn: int

    def __init__(self, conn: int) -> None:
        self.conn = conn


Action = SendClc | QpToRtr | QpToRts | PostSend | RdmaWrite | DestroyQp | ShutdownTcp | (
    ReleaseConnection | ReuseRmb
)

# ----------------------------------------------------------------- events


@dataclass(slots=True, kw_only=True, init=False)
class HandshakeCompleted:
    """The connection runs over SMC-R."""

    conn: int
    first_contact: bool
    lgr_id: int
    version: int = 1  # the SMC-R version agreed (the link group's)

    def __init__(self, *, conn: int, first_contact: bool, lgr_id: int, version: int = 1) -> None:
        self.conn = conn
        self.first_contact = first_contact
        self.lgr_id = lgr_id
        self.version = version


@dataclass(frozen=True, slots=True, kw_only=True, init=False)
class FellBack:
    """The connection falls back to TCP: local and peer reason codes (0 when none).  Frozen,
    and its ``__init__`` written out all the same: ``object.__setattr__`` on a field is a
    plain store in the compiled build."""

    conn: int
    local_code: int
    peer_code: int

    def __init__(self, *, conn: int, local_code: int, peer_code: int) -> None:
        object.__setattr__(self, "conn", conn)
        object.__setattr__(self, "local_code", local_code)
        object.__setattr__(self, "peer_code", peer_code)


@dataclass(frozen=True, slots=True, kw_only=True, init=False)
class HandshakeFailed:
    """The handshake broke in a way that allows no fallback (Linux ``-EPROTO``)."""

    conn: int
    reason: str
    peer_gone: bool = False
    """The TCP connection ended under the handshake (the peer closed or reset it): a
    server still hands it to ``accept`` as TCP's listener does, whose reads then tell
    what the peer did; other failures reset a TCP connection that is still up."""
    timed_out: bool = False
    """A client waited for the server's Accept in vain: its ``connect`` fails with
    ``ETIMEDOUT``, as Linux's (``__smc_connect`` turns the CLC wait's ``-EAGAIN`` into it,
    "see tcp_recvmsg()"); other failures are ``ECONNRESET``."""

    def __init__(self, *, conn: int, reason: str, peer_gone: bool = False,
                 timed_out: bool = False) -> None:  # fmt: skip
        object.__setattr__(self, "conn", conn)
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "peer_gone", peer_gone)
        object.__setattr__(self, "timed_out", timed_out)


@dataclass(frozen=True, slots=True, kw_only=True, init=False)
class ConnectionReset:
    """The connection was aborted (peer abort, link group gone)."""

    conn: int
    reason: str

    def __init__(self, *, conn: int, reason: str) -> None:
        object.__setattr__(self, "conn", conn)
        object.__setattr__(self, "reason", reason)


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkGroupTerminated:
    """A link group is gone (DELETE LINK ALL, link failure, protocol violation)."""

    lgr_id: int
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkAdded:
    """A link joined a link group by ADD LINK (not the group's first link): what the
    group's type is now (Linux logs "link added" and the state change)."""

    lgr_id: int
    link_id: int
    port: int
    lgr_type: str


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkRemoved:
    """A link of a group that lives on went (its failure, or DELETE LINK): its
    connections moved to another link first (Linux logs "link removed")."""

    lgr_id: int
    link_id: int
    port: int
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class LlcDropped:
    """An LLC/CDC message was dropped (counted and traced, STYLE §4)."""

    qpn: int
    reason: str


Event = HandshakeCompleted | FellBack | HandshakeFailed | ConnectionReset | (
    LinkGroupTerminated | LinkAdded | LinkRemoved | LlcDropped
)

# ------------------------------------------------------------------ host


@dataclass(frozen=True, slots=True, init=False)
class NextHop:
    """How a port reaches a peer (Linux ``smc_init_info_smcrv2``'s ``uses_gateway`` and
    ``nexthop_mac``): through an IP gateway or not, and the MAC of the next hop."""

    uses_gateway: bool = False
    mac: bytes = bytes(6)

    def __init__(self, uses_gateway: bool = False, mac: bytes = bytes(6)) -> None:
        object.__setattr__(self, "uses_gateway", uses_gateway)
        object.__setattr__(self, "mac", mac)


class Provider(Protocol):
    """What the engine asks of its host synchronously (no I/O).

    A host may also answer ``reaches(port, gid) -> bool``: whether our ``port`` has a path
    to a peer port's GID (the RoCE runtime asks the kernel's routing); the engine then
    adds links only over ports that reach the peer (:meth:`AddLinkFlows._reaches
    <smcr.core.addlink.AddLinkFlows._reaches>`).  A host without it: every port reaches
    every peer.

    And ``place_rmb(conn, lgr_id, size) -> Rmb | None``: where a host keeps RMBs per link
    group (the shm RNIC's segments, :mod:`smcr.rdma.shm.segment`), the connection's RMB
    placed in the group it joins, ``size`` bytes (None: no buffer, the handshake declines
    ``MEM``); the RMB given to ``connect``/``accept`` then only says the size asked for.
    A host without it: that RMB is the connection's.

    And ``find_route(port, gid) -> NextHop | None``: how our ``port`` reaches a peer's
    GID (Linux ``smc_ib_find_route``: on-link or through a gateway, and the next hop's
    MAC), None when there is no route.  SMC-Rv2 asks it as Linux does
    (:mod:`smcr.core.negotiation`); a host without it: every peer is on-link.  (Here,
    not beside the engine: every part of the engine uses its provider, and this module
    imports none of them.)
    """

    def new_qp(self, port: int = 0) -> tuple[int, int]:
        """Create an RC QP in RESET on ``port`` (an index into
        :attr:`LocalIdentity.ports`); return its QP number and initial send PSN.
        QP numbers must be unique among the process's QPs over all its ports: the
        engine finds a link by the QP number a SEND or completion came in on."""

    def register_rmb(self, conn: int, port: int) -> tuple[int, int]:
        """Register the connection's RMB on ``port`` too (a link over that port joined
        its group, or it joins a group of several links); return its (rkey, vaddr)
        there.  Only called with :attr:`Config.add_links`."""


__all__ = [
    "Action",
    "ConnectionReset",
    "DeclineCode",
    "DestroyQp",
    "Event",
    "FellBack",
    "HandshakeCompleted",
    "HandshakeFailed",
    "LinkAdded",
    "LinkGroupTerminated",
    "LinkRemoved",
    "LlcDropped",
    "NextHop",
    "PostSend",
    "Provider",
    "QpToRtr",
    "QpToRts",
    "RdmaWrite",
    "ReleaseConnection",
    "SendClc",
    "ShutdownTcp",
]
