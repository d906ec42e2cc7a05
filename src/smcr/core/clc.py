"""The CLC handshakes of the engine, both roles (Linux ``af_smc.c``: ``smc_connect_clc``,
``smc_connect_rdma``, ``smc_listen_work``, ``smcr_serv_conf_first_link``,
``smcr_clnt_conf_first_link``).

A client sends its Proposal (:meth:`ClcHandshakes.connect`) and waits for the
server's Accept; a server waits for the Proposal (:meth:`ClcHandshakes.accept`),
answers with an Accept and waits for the Confirm.  The server decides: a link group
it has with the peer takes the connection (its RMB announced by CONFIRM RKEY,
:mod:`smcr.core.rkeys`), else a first contact makes one, whose first link is
confirmed by CONFIRM LINK over it before the handshake ends; a server that may add
links then offers one (ADD LINK, :mod:`smcr.core.addlink`).  Whatever goes wrong ends
in a Decline and a fallback to TCP, or, where no fallback is possible, a failure.

One first contact at a time per peer, as Linux ``smc_server_lgr_pending``: a
Proposal that comes while one runs is held until it ends
(:meth:`ClcHandshakes._release_held`).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable

from smcr.core import llc_msgs, negotiation
from smcr.core.addlink import AddLinkFlows
from smcr.core.close import SmcState
from smcr.core.config import Config, LocalIdentity
from smcr.core.connection import Connection, Rmb
from smcr.core.events import (
    Action,
    HandshakeCompleted,
    HandshakeFailed,
    NextHop,
    QpToRts,
    SendClc,
)
from smcr.core.handshake import Decline, Handshake, HsState, IpAddress, decline_clc
from smcr.core.linkgroup import LgrType, Link, LinkGroup, LinkState, Role, V2Terms
from smcr.core.llc import LinkLayer, LlcViolationError
from smcr.core.rkeys import UNCONFIRMED_RKEY, Rkeys
from smcr.core.state import EngineState
from smcr.wire.clc import (
    ClcAccept,
    ClcConfirm,
    ClcDecline,
    ClcMessage,
    ClcProposal,
    ClcType,
    compress_bufsize,
)
from smcr.wire.clc_header import EYECATCHER_SMCR
from smcr.wire.decline import DeclineCode
from smcr.wire.errors import WireError
from smcr.wire.llc import LLC_FLAG_NO_RMBE_EYEC, ConfirmLink, LlcMessage

DECLINE_WAIT_SHORT = 1.0  # CLC_WAIT_TIME_SHORT
NO_DEADLINE = float("inf")
"""What :func:`earliest_deadline` says without one (later than any)."""
PROPOSALS_KEPT = 64
_NO_EID = bytes(32)
"""An Accept or Confirm's EID without SMC-Rv2 (v1)."""

ClcHandler = Callable[[Handshake, ClcMessage, float, list[Action]], None]
CLC_TYPES: dict[type, ClcType] = {ClcProposal: ClcType.PROPOSAL, ClcAccept: ClcType.ACCEPT,
                                  ClcConfirm: ClcType.CONFIRM, ClcDecline: ClcType.DECLINE}
"""The CLC type of each message class (byte 4 of its header)."""


class ClcHandshakes:
    """Every connection's CLC handshake (module docstring): a part of the engine, over
    its shared state, link layer, ADD LINK part (a first contact's server offers a
    link after it) and rkeys part (a connection in a group that exists announces its
    RMB)."""

    def __init__(self, state: EngineState, llc: LinkLayer, addlink: AddLinkFlows,
                 rkeys: Rkeys) -> None:  # fmt: skip
        self.state = state
        self.llc = llc
        self.addlink = addlink
        self.rkeys = rkeys
        self._tokens = itertools.count(1)
        self._lgr_ids = itertools.count(1)
        self._held: dict[int, ClcProposal] = {}
        """Proposals that wait for a first contact with their peer to end (server)."""
        self._proposals: dict[tuple[int, IpAddress, tuple[bytes, ...]], tuple[bytes, bool]] = {}
        """Encoded Proposals by (port, local address, UEIDs) (:meth:`_proposal`)."""
        self._proposals_of: tuple[LocalIdentity, Config] | None = None
        self.table = self._clc_table()
        self.expected = {(role, hs_state): msg_type for role, hs_state, msg_type in self.table
                         if msg_type is not ClcType.DECLINE}  # fmt: skip
        """The type besides Decline each waiting state takes: the reader refuses any other
        from its header (Linux ``smc_clc_wait_msg``)."""

    def connect(self, conn: int, rmb: Rmb | None, local_ip: IpAddress, now: float,
                sndbuf_size: int = 0,
                sent: tuple[int, bool] | None = None) -> list[Action]:  # fmt: skip
        """Client: send the Proposal (``smc_connect_clc``).

        :param rmb: the connection's RMB (None: no buffer; the handshake declines ``MEM``),
            or the size asked for where the host places it (``Provider.place_rmb``).
        :param sndbuf_size: the send buffer the host allocated (Linux sizes it from
            the socket's ``SO_SNDBUF``); 0 means :attr:`Config.sndbuf_size`.
        :param sent: the host sent the Proposal of :meth:`proposal` itself already (the
            port it names, whether it offers SMC-Rv2): no :class:`SendClc` then.
        """
        state = self.state
        hs = Handshake(conn, True, HsState.PROPOSAL_SENT, now + state.config.clc_wait, rmb,
                       local_ip, sndbuf_size=sndbuf_size)  # fmt: skip
        state.handshakes[conn] = hs
        hs.version = 1  # Linux: v1 Declines before an Accept, unless ISMv2-capable
        if sent is not None:
            hs.port, hs.offered_v2 = sent
            return []
        data, hs.port, hs.offered_v2 = self.proposal(local_ip)
        return [SendClc(conn, data)]

    def proposal(self, local_ip: IpAddress) -> tuple[bytes, int, bool]:
        """The Proposal a connection from ``local_ip`` sends now: encoded, the port it names
        (a first contact's link uses it) and whether it offers SMC-Rv2.  Kept per (port,
        address, UEIDs) while our identity and config stay (:meth:`_proposal`)."""
        state = self.state
        port = self._usable_port()
        key = (port, local_ip, state.ueids)
        if self._proposals_of != (state.identity, state.config):  # (replaced: not the same)
            self._proposals_of = (state.identity, state.config)
            self._proposals.clear()
        made = self._proposals.get(key)
        if made is None:
            made = self._proposals[key] = self._proposal(port, local_ip)
        return made[0], port, made[1]

    def _proposal(self, port: int, local_ip: IpAddress) -> tuple[bytes, bool]:
        """Our Proposal from ``port`` for a TCP connection from ``local_ip``, encoded, and
        whether it offers SMC-Rv2.  The same for every connection from that address
        while the UEIDs, our identity and config stay: :meth:`connect` keeps them (a few,
        one per address in use: the table starts anew when it has :data:`PROPOSALS_KEPT`)."""
        if len(self._proposals) >= PROPOSALS_KEPT:
            self._proposals.clear()
        ident = self.state.identity
        if port:
            ident = dataclasses.replace(ident, gid=ident.ports[port].gid,
                                        mac=ident.ports[port].mac)  # fmt: skip
        proposal = negotiation.proposal(ident, local_ip, self.state.ueids, self.state.config)
        return proposal.encode(), proposal.v2_extension is not None

    def accept(self, conn: int, rmb: Rmb | None, local_ip: IpAddress, now: float,
               sndbuf_size: int = 0) -> list[Action]:  # fmt: skip
        """Server: a TCP connection whose first bytes are the CLC eyecatcher; wait for its
        Proposal (``smc_listen_work``).  ``sndbuf_size`` as for :meth:`connect`."""
        self.state.handshakes[conn] = Handshake(conn, False, HsState.PROPOSAL_WAIT,
                                                now + self.state.config.clc_wait, rmb, local_ip,
                                                sndbuf_size=sndbuf_size)  # fmt: skip
        return []

    def receive_clc(self, conn: int, data: bytes, now: float) -> list[Action]:
        """Bytes from the connection's TCP socket during the handshake."""
        out: list[Action] = []
        hs = self.state.handshakes.get(conn)
        if hs is None:
            return out
        hs.reader.feed(data)
        try:
            while conn in self.state.handshakes and hs.reader.buffered:
                if (
                    hs.client
                    and hs.state is HsState.PROPOSAL_SENT
                    and not EYECATCHER_SMCR.startswith(
                        hs.reader.trailing_data[: len(EYECATCHER_SMCR)]
                    )
                ):
                    # not an SMC peer at all: its bytes are the application's
                    self.state.fall_back(hs, int(DeclineCode.PEERNOSMC), 0)
                    break
                role = Role.CLIENT if hs.client else Role.SERVER
                msg = hs.reader.next_message(self.expected.get((role, hs.state), ClcType.DECLINE))
                if msg is None:
                    break
                self._dispatch(hs, role, msg, now, out)
        except Decline as exc:
            self._decline(hs, exc.code, out)
        except WireError as err:  # (not `exc` again: mypyc gives a name one type per function)
            if err.code is not None:
                self._decline(hs, err.code, out)
            else:
                self._fail(hs, f"malformed CLC message: {err}", out)
        self._release_held(now, out)
        return out

    def tcp_closed(self, conn: int, now: float) -> list[Action]:
        """The TCP connection ended (EOF or error) during the handshake.

        A server waiting for the CONFIRM LINK response carries on: the client has
        finished its handshake once it sent that response and may already have
        shut its TCP down (``shutdown`` shuts the CLC socket too, as Linux
        ``smc_shutdown`` does), while the response is still on its way over the
        link.  No CLC message is due then; the LLC wait bounds it.
        """
        out: list[Action] = []
        hs = self.state.handshakes.get(conn)
        if hs is not None and hs.state is not HsState.CONFIRM_LINK_RESP_WAIT:
            self._fail(hs, "TCP connection closed during the CLC handshake", out, peer_gone=True)
        self._release_held(now, out)
        return out

    def _clc_table(self) -> dict[tuple[Role, HsState, ClcType], ClcHandler]:
        """``(role, handshake state, message type) -> handler``: what each waiting state
        takes (Linux ``smc_clc_wait_msg``'s expected type in ``smc_connect_clc``,
        ``smc_connect_rdma``, ``smc_listen_work``), a Decline in every one."""
        declined = self._peer_declined
        return {
            # client: the Proposal is out
            (Role.CLIENT, HsState.PROPOSAL_SENT, ClcType.ACCEPT): self._client_accept,
            (Role.CLIENT, HsState.PROPOSAL_SENT, ClcType.DECLINE): declined,
            (Role.CLIENT, HsState.CONFIRM_LINK_WAIT, ClcType.DECLINE): declined,
            (Role.CLIENT, HsState.DECLINE_WAIT, ClcType.DECLINE): declined,
            # server: waiting for the Proposal, then the Confirm, then CONFIRM LINK's answer
            (Role.SERVER, HsState.PROPOSAL_WAIT, ClcType.PROPOSAL): self._server_proposal,
            (Role.SERVER, HsState.PROPOSAL_WAIT, ClcType.DECLINE): declined,
            (Role.SERVER, HsState.CONFIRM_WAIT, ClcType.CONFIRM): self._server_confirm,
            (Role.SERVER, HsState.CONFIRM_WAIT, ClcType.DECLINE): declined,
            (Role.SERVER, HsState.CONFIRM_LINK_RESP_WAIT, ClcType.DECLINE): declined,
        }

    def _dispatch(self, hs: Handshake, role: Role, msg: ClcMessage, now: float,
                  out: list[Action]) -> None:  # fmt: skip
        """Hand a CLC message to the table's handler.  The reader let through only the
        type the state waits for, or a Decline; anything else (a state that takes
        nothing) fails the handshake as the reader fails an unexpected type."""
        msg_type = CLC_TYPES[type(msg)]
        handler = self.table.get((role, hs.state, msg_type))
        if handler is None:
            self._fail(hs, f"malformed CLC message: CLC {msg_type.name} received in state "
                           f"{hs.state.name}", out)  # fmt: skip
            return
        handler(hs, msg, now, out)

    def _peer_declined(self, hs: Handshake, msg: ClcMessage, now: float,
                       out: list[Action]) -> None:  # fmt: skip
        """The peer's Decline: fall back (``smc_connect_decline_fallback``); out of sync,
        or during our first contact, the group shared with the peer ends first."""
        assert isinstance(msg, ClcDecline)
        lgr = hs.lgr
        if lgr is not None and (msg.out_of_sync or hs.first_contact):
            hs.lgr = None  # this one falls back below: no Decline back, no reset
            self.llc.terminate(lgr, "peer declined out of sync", out)
        self.state.fall_back(hs, int(DeclineCode.PEERDECL), msg.peer_diagnosis)

    def _place_rmb(self, hs: Handshake) -> Rmb:
        """The connection's RMB, now that its link group is chosen.  A host that keeps
        RMBs per link group (``Provider.place_rmb``; Linux ``smc_buf_create`` runs after
        ``smc_conn_create``) places one there of the size the handshake asked for.

        :raises Decline: ``MEM``, the host has no buffer for it."""
        assert hs.rmb is not None and hs.lgr is not None
        place = getattr(self.state.provider, "place_rmb", None)
        if place is not None:
            rmb = place(hs.conn, hs.lgr.lgr_id, hs.rmb.size)
            if rmb is None:
                raise Decline(DeclineCode.MEM, "no buffer for the connection")
            hs.rmb = rmb
        return hs.rmb

    def _new_conn(self, hs: Handshake) -> Connection:
        rmb = self._place_rmb(hs)
        conn = Connection(hs.conn, next(self._tokens) & 0xFFFFFFFF or 1, rmb,
                          hs.sndbuf_size or self.state.config.sndbuf_size)  # fmt: skip
        conn.autocork = min(self.state.config.autocork_size, conn.sndbuf_size // 2)
        self.state.conns[hs.conn] = conn
        hs.token = conn.token
        if hs.lgr is not None:
            # the RMB on every link of the group (smcr_buf_map_lgr, smcr_buf_reg_lgr)
            for link in hs.lgr.links:
                self.llc.rmb_on(conn, link)
            hs.lgr.idle_since = None
            # registered at once, as smc_conn_create does: the client's first CDC may
            # overtake its CLC Confirm (QP vs TCP), and must find the connection
            hs.lgr.conns[conn.token] = conn
        return conn

    def _route(self, port: int, gid: bytes) -> NextHop | None:
        """How our ``port`` reaches a peer's GID, as the host says (``Provider.find_route``;
        a host that does not say: on-link).  Linux ``smc_ib_find_route``."""
        find = getattr(self.state.provider, "find_route", None)
        return NextHop() if find is None else find(port, gid)

    def _usable_port(self) -> int:
        """The port a new link group starts on: the first one not reported down (Linux
        ``smc_pnet_find_roce_resource`` takes an RNIC whose port is active), else 0."""
        down = self.state.ports_down
        return next((i for i in range(len(self.state.identity.ports)) if i not in down), 0)

    def _new_lgr(self, role: Role, peer_id: bytes, terms: V2Terms | None = None,
                 port: int = 0) -> tuple[LinkGroup, Link]:  # fmt: skip
        lgr = LinkGroup(next(self._lgr_ids), role, peer_id)
        lgr.version, lgr.terms = (1, None) if terms is None else (2, terms)
        lgr.pnet_id = self.state.identity.ports[port].pnetid.strip()
        link = self.llc.new_link(lgr, port, link_id=1)
        lgr.next_link_id = 1
        self.state.lgrs[lgr.lgr_id] = lgr
        return lgr, link

    # -- client -----------------------------------------------------------

    def _client_accept(self, hs: Handshake, acc: ClcMessage, now: float,
                       out: list[Action]) -> None:  # fmt: skip
        """``smc_connect_rdma``: first contact builds a link group, else find the named link."""
        assert isinstance(acc, ClcAccept)
        hs.version = 1 if acc.version == 1 else 2
        hs.accept = acc
        hs.terms = negotiation.check_accept(acc, hs.offered_v2)
        hs.smc_version = 1 if hs.terms is None else 2
        if hs.rmb is None:
            raise Decline(DeclineCode.MEM, "no buffer for the connection")
        if acc.first_contact:
            port = hs.port
            hop = (negotiation.client_next_hop(acc, lambda gid: self._route(port, gid))
                   if hs.terms is not None else NextHop())  # fmt: skip
            lgr, link = self._new_lgr(Role.CLIENT, acc.peer_id, hs.terms, hs.port)
            lgr.uses_gateway, lgr.nexthop_mac = hop.uses_gateway, hop.mac
            if acc.fce is not None:  # smc_conn_save_peer_info_fce
                lgr.peer_hostname, lgr.peer_release = acc.fce.hostname, acc.fce.release
            link.peer_qpn, link.peer_psn, link.peer_gid, link.peer_mac = (
                acc.qpn, acc.psn, acc.gid, acc.mac)  # fmt: skip
            link.mtu = min(acc.qp_mtu, self.state.config.qp_mtu)
            hs.lgr, hs.link, hs.first_contact = lgr, link, True
            conn = self._new_conn(hs)
            self._attach(conn, link, acc)
            out.append(link.qp_to_rtr())
            out.append(SendClc(hs.conn, self._confirm(hs, link).encode()))
            hs.state = HsState.CONFIRM_LINK_WAIT
            hs.deadline = now + self.state.config.llc_wait_first
            return
        found = self._find_client_link(acc, hs.smc_version)
        if found is None:
            raise Decline(DeclineCode.SYNCERR, "Accept names a link we do not have")
        hs.lgr, hs.link = found.lgr, found
        conn = self._new_conn(hs)
        self._attach(conn, found, acc)
        out.append(SendClc(hs.conn, self._confirm(hs, found).encode()))
        if not self.rkeys.peer_holds_rmb(found, conn, now, out):
            self.rkeys.confirm_rkey(found.lgr, conn, hs.rmb, now, out)
        self._complete(hs, out)

    def _find_client_link(self, acc: ClcAccept, version: int) -> Link | None:
        """``smcr_lgr_match`` as client: same peer, the link the Accept names (its QPN
        and GID, and in v1 its MAC)."""
        for lgr in self.state.lgrs.values():
            if lgr.role is Role.CLIENT and lgr.peer_id == acc.peer_id and not lgr.terminated:
                for link in lgr.links:
                    if (link.state is LinkState.LINK_ACTIVE
                            and (link.peer_qpn, link.peer_gid) == (acc.qpn, acc.gid)
                            and (version >= 2 or link.peer_mac == acc.mac)):  # fmt: skip
                        return link
        return None

    def _confirm(self, hs: Handshake, link: Link) -> ClcConfirm:
        """Our Confirm (``smcr_clc_prep_confirm_accept``): v2 adds the EID and, on first
        contact, the first-contact extension and our GID list (``smc_fill_gid_list``).

        The RMB's rkey and address are those for ``link`` (Linux
        ``conn->rmb_desc->mr[link->link_idx]``): a connection on a link over another
        port than 0 is written through that port's RNIC, where the RMB's own (port 0)
        rkey is unknown."""
        assert hs.rmb is not None
        ident, terms = self.state.identity, hs.terms
        eid, fce = _NO_EID, None  # (each named below: a ** dict is a generic call)
        gids: tuple[bytes, ...] = ()
        if terms is not None:
            eid = terms.eid
            if hs.first_contact:
                fce = negotiation.first_contact_ext(terms, ident, not link.lgr.uses_gateway)
                gids = (ident.ports[link.port].gid,)
        port = ident.ports[link.port]  # the link's port (Linux: conn->lnk's gid and mac)
        rkey, vaddr = self.llc.rmb_on(self.state.conns[hs.conn], link)  # on the link's RNIC
        return ClcConfirm(
            version=hs.smc_version, first_contact=hs.first_contact, peer_id=ident.peer_id,
            gid=port.gid, mac=port.mac, qpn=link.qpn, rmb_rkey=rkey,
            rmbe_alert_token=hs.token, rmbe_size=compress_bufsize(hs.rmb.size),
            qp_mtu=link.mtu, rmb_vaddr=vaddr, psn=link.psn, eid=eid, fce=fce, gid_list=gids,
        )  # fmt: skip

    # -- server -----------------------------------------------------------

    def _server_proposal(self, hs: Handshake, prop: ClcMessage, now: float,
                         out: list[Action]) -> None:  # fmt: skip
        """``smc_listen_work``: checks, then reuse a link group or make a first contact."""
        assert isinstance(prop, ClcProposal)
        hs.version = 2 if prop.version >= 2 else 1
        state = self.state
        port = self._usable_port()
        choice = negotiation.choose(prop, hs.local_ip, state.ueids, state.identity, state.config,
                                    lambda gid: self._route(port, gid))  # fmt: skip
        hs.smc_version, hs.terms = choice.version, choice.terms
        if hs.rmb is None:
            raise Decline(DeclineCode.MEM, "no buffer for the connection")
        if self._first_contact_running(prop.peer_id):
            # Linux smc_server_lgr_pending: one first contact at a time.  A client's
            # connect returns once it answered CONFIRM LINK; its next Proposal (TCP)
            # may come before that answer (over the link) and would make a second
            # group; it waits, then joins the group (_release_held)
            self._held[hs.conn] = prop
            return
        link = self._find_server_link(prop.peer_id, choice)
        if link is None:
            lgr, link = self._new_lgr(Role.SERVER, prop.peer_id, choice.terms,
                                      self._usable_port())  # fmt: skip
            lgr.uses_gateway, lgr.nexthop_mac = choice.next_hop.uses_gateway, choice.next_hop.mac
            link.peer_gid, link.peer_mac = choice.peer_gid, choice.peer_mac
            hs.lgr, hs.link, hs.first_contact = lgr, link, True
            self._new_conn(hs)
            self._send_accept(hs, now, out)
            return
        hs.lgr, hs.link = link.lgr, link
        conn = self._new_conn(hs)
        self._send_accept(hs, now, out)
        if not self.rkeys.peer_holds_rmb(link, conn, now, out):
            self.rkeys.confirm_rkey(link.lgr, conn, hs.rmb, now, out)

    def _first_contact_running(self, peer_id: bytes) -> bool:
        """Whether a server first contact with this peer has not ended yet."""
        return any(not hs.client and hs.first_contact and hs.lgr is not None
                   and hs.lgr.peer_id == peer_id
                   for hs in self.state.handshakes.values())  # fmt: skip

    def _release_held(self, now: float, out: list[Action]) -> None:
        """Go on with the held Proposals whose peer's first contact has ended (the
        group is there to join; or it failed, and one of them makes the next)."""
        for conn, prop in list(self._held.items()):
            hs = self.state.handshakes.get(conn)
            if hs is None:  # its handshake ended meanwhile (TCP closed, timeout)
                del self._held[conn]
            elif not self._first_contact_running(prop.peer_id):
                del self._held[conn]
                try:
                    self._server_proposal(hs, prop, now, out)
                except Decline as exc:
                    self._decline(hs, exc.code, out)

    def _find_server_link(self, peer_id: bytes,
                          choice: negotiation.ServerChoice) -> Link | None:  # fmt: skip
        """``smcr_lgr_match`` as server: same peer ID, an active link to the same GID
        (and in v1 MAC), room for a connection.  As in Linux the group's own version
        is not compared: its LLC keeps the version it was made with."""
        for lgr in self.state.lgrs.values():
            if (
                lgr.role is Role.SERVER
                and lgr.peer_id == peer_id
                and not lgr.terminated
                and len(lgr.conns) < min(self.state.config.max_conns, lgr.max_conns)
            ):
                for link in lgr.links:
                    same_mac = choice.version >= 2 or link.peer_mac == choice.peer_mac
                    if (link.state is LinkState.LINK_ACTIVE and link.peer_gid == choice.peer_gid
                            and same_mac):  # fmt: skip
                        return self._assign_link(lgr)
        return None

    def _assign_link(self, lgr: LinkGroup) -> Link | None:
        """The link a new connection of the server's group uses: of the active links that
        are not the asymmetric one (Linux ``smcr_lgr_conn_assign_link`` skips it too),
        the one that carries the fewest connections.  Linux alternates by the parity
        of the group's connection count, which balances only while connections end
        in the order they came; counting keeps the links even whatever ends first.
        On a tie, Linux's choice.  The client follows whatever the Accept names, so
        the choice is the server's alone (a Linux client follows it too)."""
        usable = [x for x in lgr.links if x.state is LinkState.LINK_ACTIVE and not x.is_asym]
        if len(usable) < 2:  # (no choice: the count below walks every connection)
            return usable[0] if usable else None
        load = {id(x): 0 for x in usable}
        for c in lgr.conns.values():
            if c.link is not None and id(c.link) in load:
                load[id(c.link)] += 1
        linux = usable[1] if len(lgr.conns) % 2 and len(usable) > 1 else usable[0]
        return min(usable, key=lambda x: (load[id(x)], x is not linux))

    def _send_accept(self, hs: Handshake, now: float, out: list[Action]) -> None:
        assert hs.rmb is not None and hs.link is not None
        ident, link, terms = self.state.identity, hs.link, hs.terms
        eid, fce = _NO_EID, None  # (named below: a ** dict is a generic call)
        if terms is not None:
            eid = terms.eid
            if hs.first_contact:
                fce = negotiation.first_contact_ext(terms, ident, not link.lgr.uses_gateway)
        port = ident.ports[link.port]  # the link's port: the client finds the link by it
        rkey, vaddr = self.llc.rmb_on(self.state.conns[hs.conn], link)  # on the link's RNIC
        acc = ClcAccept(
            version=hs.smc_version, first_contact=hs.first_contact, peer_id=ident.peer_id,
            gid=port.gid, mac=port.mac, qpn=link.qpn, rmb_rkey=rkey,
            rmbe_alert_token=hs.token, rmbe_size=compress_bufsize(hs.rmb.size),
            qp_mtu=self.state.config.qp_mtu, rmb_vaddr=vaddr, psn=link.psn, eid=eid, fce=fce,
        )  # fmt: skip
        out.append(SendClc(hs.conn, acc.encode()))
        hs.state = HsState.CONFIRM_WAIT
        hs.deadline = now + self.state.config.clc_wait

    def _server_confirm(self, hs: Handshake, conf: ClcMessage, now: float,
                        out: list[Action]) -> None:  # fmt: skip
        """First contact: QP up, CONFIRM LINK request; else the connection is ready."""
        assert isinstance(conf, ClcConfirm)
        assert hs.link is not None
        link = hs.link
        conn = self.state.conns[hs.conn]
        if conf.first_contact != hs.first_contact:
            raise Decline(DeclineCode.SYNCERR, "Confirm's first-contact bit differs")
        if hs.first_contact and hs.terms is not None:
            hs.terms = link.lgr.terms = negotiation.check_confirm(conf, hs.terms)
            if conf.fce is not None:  # smc_conn_save_peer_info_fce
                link.lgr.peer_hostname, link.lgr.peer_release = conf.fce.hostname, conf.fce.release
        self._attach(conn, link, conf)
        if not hs.first_contact:
            self._complete(hs, out)
            return
        link.peer_qpn, link.peer_psn = conf.qpn, conf.psn
        link.mtu = min(conf.qp_mtu, self.state.config.qp_mtu)
        out.append(link.qp_to_rtr())
        out.append(QpToRts(link.qpn, link.psn, **link.names))
        request = llc_msgs.confirm_link(link, self.state.identity, self.state.config)
        self.llc.post_llc(link, request, out)
        hs.state = HsState.CONFIRM_LINK_RESP_WAIT
        hs.deadline = now + self.state.config.llc_wait

    # -- both ---------------------------------------------------------------

    def _attach(self, conn: Connection, link: Link, peer: ClcAccept | ClcConfirm) -> None:
        """Learn the peer's RMBE (``smcr_conn_save_peer_info``) and bind the conn to a link.

        The peer's rkey in the CLC message is for ``link``; a CONFIRM RKEY of the
        peer may have brought it (and those for other links) already.
        """
        conn.peer_token = peer.rmbe_alert_token
        conn.peer_rmbe_offset = (peer.rmbe_idx - 1) * peer.rmbe_size_bytes
        conn.peer_rmb_size = peer.rmbe_size_bytes
        conn.peer_rtoken = link.lgr.rtoken_add(link, peer.rmb_rkey, peer.rmb_vaddr)
        self.llc.use_link(conn, link)
        link.lgr.conns[conn.token] = conn
        link.lgr.idle_since = None

    def _complete(self, hs: Handshake, out: list[Action]) -> None:
        del self.state.handshakes[hs.conn]
        hs.state = HsState.DONE
        conn = self.state.conns[hs.conn]
        conn.state = SmcState.ACTIVE
        assert hs.lgr is not None
        self.state.events.append(HandshakeCompleted(conn=hs.conn, first_contact=hs.first_contact,
                                                    lgr_id=hs.lgr.lgr_id,
                                                    version=hs.lgr.version))  # fmt: skip
        if self.state.unconfirmed and hs.conn in self.state.unconfirmed:
            self.state.unconfirmed.discard(hs.conn)
            self.llc.abort(conn, UNCONFIRMED_RKEY, out)
            self.state.touched.add(conn.id)
        elif conn.peer_wants_update:  # a CDC that overtook the CLC Confirm asked for an answer
            conn.send_cdc(out)

    def _decline(self, hs: Handshake, code: DeclineCode, out: list[Action]) -> None:
        """Send a Decline and fall back (``smc_connect_decline_fallback``,
        ``smc_listen_decline``)."""
        out.append(decline_clc(hs, code, self.state.identity.peer_id))
        if hs.first_contact and hs.lgr is not None:
            # off the handshake first: terminate declines the handshakes of the group,
            # and this one must not get a second Decline on its TCP connection
            lgr, hs.lgr = hs.lgr, None
            self.llc.terminate(lgr, f"first contact failed: {code.name}", out)
        self.state.fall_back(hs, int(code), 0)

    def _fail(self, hs: Handshake, reason: str, out: list[Action], *,
              peer_gone: bool = False, timed_out: bool = False) -> None:
        self.state.handshakes.pop(hs.conn, None)
        hs.state = HsState.FAILED
        if hs.first_contact and hs.lgr is not None:
            self.llc.terminate(hs.lgr, reason, out)
        self.state.forget_conn(hs.conn)
        self.state.events.append(HandshakeFailed(conn=hs.conn, reason=reason, peer_gone=peer_gone,
                                                 timed_out=timed_out))  # fmt: skip

    def handshake(self, conn: int) -> Handshake | None:
        """The running handshake of a connection (the host reads its trailing data)."""
        return self.state.handshakes.get(conn)

    # -- timers -------------------------------------------------------------

    def handle_timer(self, now: float, out: list[Action]) -> None:
        """The handshakes whose deadline passed."""
        handshakes = self.state.handshakes
        self._release_held(now, out)  # (a first contact ended by a link failure)
        for hs in list(handshakes.values()):
            # (a held Proposal has come: its wait is the first contact's, bounded by
            # that one's own deadline, as Linux's listen worker waits on the mutex)
            if now >= hs.deadline and handshakes.get(hs.conn) is hs and hs.conn not in self._held:
                self._handshake_timeout(hs, now, out)
        self._release_held(now, out)

    def _handshake_timeout(self, hs: Handshake, now: float, out: list[Action]) -> None:
        if hs.state is HsState.CONFIRM_LINK_WAIT:  # smcr_clnt_conf_first_link
            hs.state = HsState.DECLINE_WAIT
            hs.deadline = now + DECLINE_WAIT_SHORT
        elif hs.state in (HsState.DECLINE_WAIT, HsState.CONFIRM_LINK_RESP_WAIT):
            self._decline(hs, DeclineCode.TIMEOUT_CL, out)
        elif hs.state in (HsState.PROPOSAL_WAIT, HsState.PROPOSAL_SENT, HsState.CONFIRM_WAIT):
            self._fail(hs, f"CLC timeout in state {hs.state.name}", out,
                       timed_out=hs.client)  # fmt: skip
        else:  # an LLC flow of this handshake stalled: its own timer declines
            hs.deadline = now + self.state.config.llc_wait

    # -- CONFIRM LINK of a first contact --------------------------------------------

    def receive_confirm_link(self, link: Link, msg: LlcMessage, now: float,
                             out: list[Action]) -> None:  # fmt: skip
        """The server's CONFIRM LINK: of an ADD LINK flow (:class:`AddLinkFlows
        <smcr.core.addlink.AddLinkFlows>`), or of the client's first contact, whose
        handshake it ends (``smcr_clnt_conf_first_link``); any other breaks the protocol."""
        assert isinstance(msg, ConfirmLink)
        if link.lgr.role is Role.CLIENT and self.addlink.cli_confirm_link(link, msg, now, out):
            return
        hs = self._handshake_on(link)
        if hs is None or not hs.client or hs.state is not HsState.CONFIRM_LINK_WAIT:
            raise LlcViolationError("CONFIRM LINK request outside first contact")
        if not msg.flags & LLC_FLAG_NO_RMBE_EYEC:
            self._decline(hs, DeclineCode.RMBE_EC, out)
            return
        link.link_id = msg.link_num
        out.append(QpToRts(link.qpn, link.psn, **link.names))
        response = llc_msgs.confirm_link(link, self.state.identity, self.state.config,
                                         response=True)  # fmt: skip
        self.llc.post_llc(link, response, out)
        self._link_up(link, now)
        self._complete(hs, out)

    def receive_confirm_link_response(self, link: Link, msg: LlcMessage, now: float,
                                      out: list[Action]) -> None:  # fmt: skip
        """The client's answer to the server's CONFIRM LINK: of an ADD LINK flow, or of the
        first contact, whose handshake it ends (``smcr_serv_conf_first_link``); a server
        that may add links then offers one."""
        assert isinstance(msg, ConfirmLink)
        lgr = link.lgr
        addlink = self.addlink
        if lgr.role is Role.SERVER and addlink.srv_confirm_link_response(link, msg, now, out):
            return
        hs = self._handshake_on(link)
        if hs is None or hs.client or hs.state is not HsState.CONFIRM_LINK_RESP_WAIT:
            self.llc.drop(link.qpn, "unexpected CONFIRM LINK response")
            return
        if not msg.flags & LLC_FLAG_NO_RMBE_EYEC:
            self._decline(hs, DeclineCode.RMBE_EC, out)
            return
        self._link_up(link, now)
        self._complete(hs, out)
        self._release_held(now, out)
        if link.state is LinkState.LINK_ACTIVE and lgr.max_links > 1:
            addlink.srv_add_link(lgr, now, out)  # smcr_serv_conf_first_link

    def _handshake_on(self, link: Link) -> Handshake | None:
        """The first-contact handshake whose link ``link`` is."""
        for hs in self.state.handshakes.values():
            if hs.link is link and hs.first_contact:
                return hs
        return None

    @staticmethod
    def _link_up(link: Link, now: float) -> None:
        link.state = LinkState.LINK_ACTIVE
        link.last_rx = now
        link.lgr.lgr_type = LgrType.SINGLE


def earliest_deadline(clc: ClcHandshakes) -> float:
    """The earliest deadline of ``clc``'s handshakes (a held Proposal's wait is its first
    contact's), :data:`NO_DEADLINE` without one."""
    earliest = NO_DEADLINE
    held = clc._held
    for hs in clc.state.handshakes.values():
        if hs.deadline < earliest and hs.conn not in held:
            earliest = hs.deadline
    return earliest
