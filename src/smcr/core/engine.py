"""The SMC-R protocol engine: sans-IO, one per process (STYLE §2).

Inputs (each takes ``now``, monotonic seconds; the engine never reads a clock):
``connect``/``accept``/``receive_clc`` (CLC over TCP), ``receive_wr`` (a SEND
that arrived on a link), ``send_completed`` and ``link_failed`` (verbs
completions), ``port_down``/``port_up`` (the host's RNIC ports), ``handle_timer``,
and the application's ``data_written``, ``data_consumed``, ``shutdown_write``,
``close``.  Each returns the actions the host must execute, in order; events are
pulled with :meth:`Engine.next_event`, the next deadline with
:meth:`Engine.get_timer`.

Why one engine per process and not per link group (as STYLE suggests): a
connection's handshake runs before anyone knows which link group it will use
(the server decides), and the per-process token counter, the QPN -> link map
and the pending completions are shared anyway.  The host serialises all calls
(one lock); the engine is single-threaded.

Resources: QPs and RMBs are made by the host.  The RMB comes in with
``connect``/``accept``; a QP is asked for through :class:`Provider` when the
server decides on first contact (or the client learns it), since only then is
it known that a QP is needed.  ``new_qp`` allocates and returns numbers only:
it does no I/O, the QP transitions are actions.

ADD LINK (:mod:`smcr.core.addlink`, SMC-Rv1 and v2): with :attr:`Config.add_links` a
server offers another link after first contact, after a DELETE LINK left one, and when
the host reports a port usable again (:meth:`port_up`); a client answers as Linux does
and asks for a link on :meth:`port_up`.  Without it (the runtime while it holds one
RNIC), as server we never offer ADD LINK; as client we reject one (``02 2C 01 C0``,
Linux ``smc_llc_cli_add_link_reject``) and do not wait 2 s for it after the first
CONFIRM LINK (Linux does when max links > 1).  A Linux *client* talking to this server
would wait those ~3 s (2 s for ADD LINK, then ~1 s for a Decline) unless the server sent
an ADD LINK it can reject; with ``add_links`` the server sends one (asymmetric, over the
same port, when it has no other).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import deque

from smcr.core import llc_msgs, negotiation
from smcr.core.close import SmcState
from smcr.core.config import Config, LocalIdentity
from smcr.core.connection import Connection, Rmb
from smcr.core.events import (
    Action,
    Event,
    FellBack,
    HandshakeCompleted,
    HandshakeFailed,
    Provider,
    QpToRtr,
    QpToRts,
    ReuseRmb,
    SendClc,
)
from smcr.core.handshake import (
    EXPECTED,
    Decline,
    Handshake,
    HsState,
    IpAddress,
)
from smcr.core.linkgroup import Link, LinkGroup, LinkState, Role, V2Terms
from smcr.core.ports import PortLayer
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
from smcr.wire.llc import LLC_FLAG_DEL_LINK_ALL, DeleteLinkReason, LlcMessage

DECLINE_WAIT_SHORT = 1.0  # CLC_WAIT_TIME_SHORT
PROPOSALS_KEPT = 64
IDLE_RMBS_MAX = 16
"""RMBs of released connections a link group keeps announced to the peer (no DELETE
RKEY) for its next connections (:meth:`Engine.release`)."""
UNCONFIRMED_RKEY = "the peer did not confirm the RMB's rkey (CONFIRM RKEY)"


class Engine(PortLayer):
    """SMC-R for one process: handshakes, link groups, connections (module docstring)."""

    def __init__(self, config: Config, identity: LocalIdentity, provider: Provider) -> None:
        self.config = config
        self.identity = identity
        self.provider = provider
        self.conns: dict[int, Connection] = {}
        self.handshakes: dict[int, Handshake] = {}
        self._held: dict[int, ClcProposal] = {}
        """Proposals that wait for a first contact with their peer to end (server)."""
        self.lgrs: dict[int, LinkGroup] = {}
        self.links: dict[int, Link] = {}
        self.late_links: dict[int, Link] = {}
        self._cdc_pending: dict[int, deque[tuple[int, Connection, int]]] = {}
        self._events: deque[Event] = deque()
        self._tokens = itertools.count(1)
        self._lgr_ids = itertools.count(1)
        self.dropped = 0
        self.touched: set[int] = set()
        """Connections whose cursors or state changed since the host last cleared it."""
        self._llc_handlers = self._llc_table()
        self._unconfirmed: set[int] = set()
        """Handshakes whose RMB's CONFIRM RKEY failed before they ended (:meth:`_confirm_rkey`)."""
        self._ending: set[int] = set()
        """Link groups :meth:`shutdown` sent DELETE LINK on, waiting for the peer's."""
        self.ports_down: set[int] = set()
        """Ports of :attr:`LocalIdentity.ports` the host reported unusable
        (:meth:`port_down`), until :meth:`port_up`: no new link goes over them."""
        self._proposals: dict[tuple[int, IpAddress, tuple[bytes, ...]], tuple[bytes, bool]] = {}
        """Encoded Proposals by (port, local address, UEIDs) (:meth:`_proposal`)."""
        self._proposals_of: tuple[LocalIdentity, Config] | None = None
        self.ueids: tuple[bytes, ...] = ()
        """The host's user EIDs (:mod:`smcr.ueid`), kept current by the host: a
        Proposal offers SMC-Rv2 only with one, a server chooses v2 only on a common one."""

    # ================================================================= output

    def next_event(self) -> Event | None:
        """Pop the oldest event, or None."""
        return self._events.popleft() if self._events else None

    def has_events(self) -> bool:
        """Whether :meth:`next_event` has something."""
        return bool(self._events)

    def get_timer(self) -> float | None:
        """The earliest deadline of any handshake, LLC flow or keepalive, or None."""
        deadlines = [hs.deadline for hs in self.handshakes.values() if hs.conn not in self._held]
        for lgr in self.lgrs.values():
            if lgr.flow is not None:
                deadlines.append(lgr.flow.deadline)
            if lgr.idle_since is not None:
                deadlines.append(lgr.idle_since + self._linger(lgr))
            if lgr.remote_add is not None:
                deadlines.append(lgr.remote_add.deadline)
            for link in lgr.links:
                if link.state is LinkState.LINK_ACTIVE and self.config.testlink_time > 0:
                    deadlines.append(
                        link.test_deadline
                        if link.test_deadline is not None
                        else link.last_rx + self.config.testlink_time
                    )
        return min(deadlines, default=None)

    # ============================================================ handshake

    def connect(self, conn: int, rmb: Rmb | None, local_ip: IpAddress, now: float,
                sndbuf_size: int = 0) -> list[Action]:  # fmt: skip
        """Client: send the Proposal (``smc_connect_clc``).

        :param sndbuf_size: the send buffer the host allocated (Linux sizes it from
            the socket's ``SO_SNDBUF``); 0 means :attr:`Config.sndbuf_size`.
        """
        hs = Handshake(conn, True, HsState.PROPOSAL_SENT, now + self.config.clc_wait, rmb,
                       local_ip, sndbuf_size=sndbuf_size)  # fmt: skip
        self.handshakes[conn] = hs
        hs.port = self._usable_port()  # the Proposal names it; a first contact uses it
        key = (hs.port, local_ip, self.ueids)
        if self._proposals_of != (self.identity, self.config):  # (replaced: not the same)
            self._proposals_of = (self.identity, self.config)
            self._proposals.clear()
        made = self._proposals.get(key)
        if made is None:
            made = self._proposals[key] = self._proposal(hs.port, local_ip)
        data, hs.offered_v2 = made
        hs.version = 1  # Linux: v1 Declines before an Accept, unless ISMv2-capable
        return [SendClc(conn, data)]

    def _proposal(self, port: int, local_ip: IpAddress) -> tuple[bytes, bool]:
        """Our Proposal from ``port`` for a TCP connection from ``local_ip``, encoded, and
        whether it offers SMC-Rv2.  The same for every connection from that address
        while the UEIDs, our identity and config stay: :meth:`connect` keeps them (a few,
        one per address in use: the table starts anew when it has :data:`PROPOSALS_KEPT`)."""
        if len(self._proposals) >= PROPOSALS_KEPT:
            self._proposals.clear()
        ident = self.identity
        if port:
            ident = dataclasses.replace(ident, gid=ident.ports[port].gid,
                                        mac=ident.ports[port].mac)  # fmt: skip
        proposal = negotiation.proposal(ident, local_ip, self.ueids, self.config)
        return proposal.encode(), proposal.v2_extension is not None

    def accept(self, conn: int, rmb: Rmb | None, local_ip: IpAddress, now: float,
               sndbuf_size: int = 0) -> list[Action]:  # fmt: skip
        """Server: a TCP connection whose first bytes are the CLC eyecatcher; wait for its
        Proposal (``smc_listen_work``).  ``sndbuf_size`` as for :meth:`connect`."""
        self.handshakes[conn] = Handshake(conn, False, HsState.PROPOSAL_WAIT,
                                          now + self.config.clc_wait, rmb, local_ip,
                                          sndbuf_size=sndbuf_size)  # fmt: skip
        return []

    def receive_clc(self, conn: int, data: bytes, now: float) -> list[Action]:
        """Bytes from the connection's TCP socket during the handshake."""
        out: list[Action] = []
        hs = self.handshakes.get(conn)
        if hs is None:
            return out
        hs.reader.feed(data)
        try:
            while conn in self.handshakes and hs.reader.buffered:
                if (
                    hs.client
                    and hs.state is HsState.PROPOSAL_SENT
                    and not EYECATCHER_SMCR.startswith(
                        hs.reader.trailing_data[: len(EYECATCHER_SMCR)]
                    )
                ):
                    # not an SMC peer at all: its bytes are the application's
                    self._fall_back(hs, int(DeclineCode.PEERNOSMC), 0, out)
                    break
                msg = hs.reader.next_message(EXPECTED.get(hs.state, ClcType.DECLINE))
                if msg is None:
                    break
                self._clc_message(hs, msg, now, out)
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
        hs = self.handshakes.get(conn)
        if hs is not None and hs.state is not HsState.CONFIRM_LINK_RESP_WAIT:
            self._fail(hs, "TCP connection closed during the CLC handshake", out)
        self._release_held(now, out)
        return out

    def _clc_message(self, hs: Handshake, msg: ClcMessage, now: float, out: list[Action]) -> None:
        if isinstance(msg, ClcDecline):
            lgr = hs.lgr
            if lgr is not None and (msg.out_of_sync or hs.first_contact):
                hs.lgr = None  # this one falls back below: no Decline back, no reset
                self._terminate(lgr, "peer declined out of sync", out)
            self._fall_back(hs, int(DeclineCode.PEERDECL), msg.peer_diagnosis, out)
        elif isinstance(msg, ClcAccept):
            self._client_accept(hs, msg, now, out)
        elif isinstance(msg, ClcProposal):
            self._server_proposal(hs, msg, now, out)
        elif isinstance(msg, ClcConfirm):
            self._server_confirm(hs, msg, now, out)

    def _new_conn(self, hs: Handshake, rmb: Rmb) -> Connection:
        conn = Connection(hs.conn, next(self._tokens) & 0xFFFFFFFF or 1, rmb,
                          hs.sndbuf_size or self.config.sndbuf_size)  # fmt: skip
        conn.autocork = min(self.config.autocork_size, conn.sndbuf_size // 2)
        self.conns[hs.conn] = conn
        hs.token = conn.token
        if hs.lgr is not None:
            # the RMB on every link of the group (smcr_buf_map_lgr, smcr_buf_reg_lgr)
            for link in hs.lgr.links:
                self._rmb_on(conn, link)
            hs.lgr.idle_since = None
            # registered at once, as smc_conn_create does: the client's first CDC may
            # overtake its CLC Confirm (QP vs TCP), and must find the connection
            hs.lgr.conns[conn.token] = conn
        return conn

    def _usable_port(self) -> int:
        """The port a new link group starts on: the first one not reported down (Linux
        ``smc_pnet_find_roce_resource`` takes an RNIC whose port is active), else 0."""
        return next((i for i in range(len(self.identity.ports)) if i not in self.ports_down), 0)

    def _new_lgr(self, role: Role, peer_id: bytes, terms: V2Terms | None = None,
                 port: int = 0) -> tuple[LinkGroup, Link]:  # fmt: skip
        lgr = LinkGroup(next(self._lgr_ids), role, peer_id)
        lgr.version, lgr.terms = (1, None) if terms is None else (2, terms)
        lgr.pnet_id = self.identity.ports[port].pnetid.strip()
        link = self._new_link(lgr, port, link_id=1)
        lgr.next_link_id = 1
        self.lgrs[lgr.lgr_id] = lgr
        return lgr, link

    def _new_link(self, lgr: LinkGroup, port: int, link_id: int) -> Link:
        """A link of ``lgr`` over our ``port``: its QP made (RESET), not yet up."""
        qpn, psn = self.provider.new_qp(port)
        link = Link(qpn, psn, lgr, link_id=link_id, port=port)
        lgr.links.append(link)
        self.links[qpn] = link
        self._cdc_pending[qpn] = deque()
        return link

    # -- client -----------------------------------------------------------

    def _client_accept(self, hs: Handshake, acc: ClcAccept, now: float, out: list[Action]) -> None:
        """``smc_connect_rdma``: first contact builds a link group, else find the named link."""
        hs.version = 1 if acc.version == 1 else 2
        hs.accept = acc
        hs.terms = negotiation.check_accept(acc, hs.offered_v2)
        hs.smc_version = 1 if hs.terms is None else 2
        if hs.rmb is None:
            raise Decline(DeclineCode.MEM, "no buffer for the connection")
        if acc.first_contact:
            lgr, link = self._new_lgr(Role.CLIENT, acc.peer_id, hs.terms, hs.port)
            if acc.fce is not None:  # smc_conn_save_peer_info_fce
                lgr.peer_hostname, lgr.peer_release = acc.fce.hostname, acc.fce.release
            link.peer_qpn, link.peer_psn, link.peer_gid, link.peer_mac = (
                acc.qpn, acc.psn, acc.gid, acc.mac)  # fmt: skip
            link.mtu = min(acc.qp_mtu, self.config.qp_mtu)
            hs.lgr, hs.link, hs.first_contact = lgr, link, True
            conn = self._new_conn(hs, hs.rmb)
            self._attach(conn, link, acc)
            out.append(QpToRtr(link.qpn, acc.gid, acc.qpn, acc.psn, link.mtu, **link.names))
            out.append(SendClc(hs.conn, self._confirm(hs, link).encode()))
            hs.state = HsState.CONFIRM_LINK_WAIT
            hs.deadline = now + self.config.llc_wait_first
            return
        found = self._find_client_link(acc, hs.smc_version)
        if found is None:
            raise Decline(DeclineCode.SYNCERR, "Accept names a link we do not have")
        hs.lgr, hs.link = found.lgr, found
        conn = self._new_conn(hs, hs.rmb)
        self._attach(conn, found, acc)
        out.append(SendClc(hs.conn, self._confirm(hs, found).encode()))
        if not self._peer_holds_rmb(found, conn, now, out):
            self._confirm_rkey(found.lgr, conn, hs.rmb, now, out)
        self._complete(hs, out)

    def _find_client_link(self, acc: ClcAccept, version: int) -> Link | None:
        """``smcr_lgr_match`` as client: same peer, the link the Accept names (its QPN
        and GID, and in v1 its MAC)."""
        for lgr in self.lgrs.values():
            if lgr.role is Role.CLIENT and lgr.peer_id == acc.peer_id and not lgr.terminated:
                for link in lgr.links:
                    if (link.state is LinkState.LINK_ACTIVE
                            and (link.peer_qpn, link.peer_gid) == (acc.qpn, acc.gid)
                            and (version >= 2 or link.peer_mac == acc.mac)):  # fmt: skip
                        return link
        return None

    def _confirm_rkey(self, lgr: LinkGroup, conn: Connection, rmb: Rmb, now: float,
                      out: list[Action]) -> None:  # fmt: skip
        """CONFIRM RKEY for a connection's RMB in a reused link group (``smcr_lgr_reg_rmbs``),
        not waited for.

        Linux sends its CLC Accept or Confirm only after the response; here the CLC
        message goes at once: on a link group of one link the peer writes with the
        rkey the CLC message itself carries, and the response adds nothing the
        connection needs (a Linux peer runs our rkey flow beside its own, as it
        lets CONFIRM RKEY flows of both sides run at once).  That saves an LLC
        round trip per side on every connection set-up.  A refusal (the peer's
        rkey table full, or no answer) kills the connection: an abort CDC, and
        ``ECONNRESET`` here; where Linux would decline ``ERR_RTOK`` or ``ERR_REGBUF``,
        the CLC message that makes a Decline impossible is out already.
        """
        send_link = lgr.active_link
        if send_link is None:  # the group's end declines or resets the connection itself
            return

        def build(link: Link) -> LlcMessage:  # the links active when the flow starts
            keys = {x: self._rmb_on(conn, x) for x in lgr.links
                    if x.state is LinkState.LINK_ACTIVE}  # fmt: skip
            return llc_msgs.confirm_rkey(link, keys)

        def done(ok: bool, t: float) -> list[Action]:
            actions: list[Action] = []
            if ok or lgr.terminated or self.conns.get(conn.id) is not conn:
                return actions  # (a group's end resets or declines its connections itself)
            if conn.id in self.handshakes:  # a server still waiting for the Confirm: the
                self._unconfirmed.add(conn.id)  # client is past Declines; abort when done
            else:
                self._abort(conn, UNCONFIRMED_RKEY, actions)
                self.touched.add(conn.id)
            return actions

        self._start_flow(lgr, build(send_link), done, now, out, build)

    def _peer_holds_rmb(self, link: Link, conn: Connection, now: float,
                        out: list[Action]) -> bool:  # fmt: skip
        """Whether the peer holds the rkey of ``conn``'s RMB already: an RMB of an
        earlier connection of this group, kept announced at its release
        (:meth:`release`), on the group's one link, ``link``, which ``conn`` uses.  Then no
        CONFIRM RKEY is due, as Linux skipped it for a reused RMB before its
        multi-link rework (``rmb_desc->reused``); the CLC message names the RMB
        anyway, and the peer finds its rkey in its table (``smc_rtoken_add``).

        Also keeps what the peers hold bounded: an idle RMB now used in another
        group is taken back from the peer that holds it (DELETE RKEY), and idle
        ones beyond the group's room for connections too, so that the peer's
        table (255 rkeys in Linux) holds no more than the connections it allows.
        """
        lgr, rkey = link.lgr, conn.rmb.rkey
        for other in self.lgrs.values():
            if other is not lgr and rkey in other.idle_rmbs:
                self._forget_idle_rmb(other, rkey, now, out)
        if lgr.idle_rmbs.pop(rkey, None) is link and lgr.links == [link]:
            return True
        while lgr.idle_rmbs and len(lgr.conns) + len(lgr.idle_rmbs) > lgr.max_conns:
            self._forget_idle_rmb(lgr, next(iter(lgr.idle_rmbs)), now, out)
        return False

    def _forget_idle_rmb(self, lgr: LinkGroup, rkey: int, now: float,
                         out: list[Action]) -> None:  # fmt: skip
        """Take a kept RMB's rkey back from the peer (DELETE RKEY, not waited for: no
        connection of the group uses the RMB, nothing of the peer's is to come)."""
        del lgr.idle_rmbs[rkey]
        if not lgr.terminated and lgr.active_link is not None:
            request = llc_msgs.delete_rkey(lgr, rkey)
            self._start_flow(lgr, request, lambda ok, t: [], now, out,
                             lambda link: llc_msgs.delete_rkey(lgr, rkey))  # fmt: skip

    def _confirm(self, hs: Handshake, link: Link) -> ClcConfirm:
        """Our Confirm (``smcr_clc_prep_confirm_accept``): v2 adds the EID and, on first
        contact, the first-contact extension and our GID list (``smc_fill_gid_list``).

        The RMB's rkey and address are those for ``link`` (Linux
        ``conn->rmb_desc->mr[link->link_idx]``): a connection on a link over another
        port than 0 is written through that port's RNIC, where the RMB's own (port 0)
        rkey is unknown."""
        assert hs.rmb is not None
        ident, terms = self.identity, hs.terms
        v2: dict[str, object] = {}
        if terms is not None:
            v2 = {"eid": terms.eid}
            if hs.first_contact:
                v2 |= {"fce": negotiation.first_contact_ext(terms, ident),
                       "gid_list": (ident.ports[link.port].gid,)}  # fmt: skip
        port = ident.ports[link.port]  # the link's port (Linux: conn->lnk's gid and mac)
        rkey, vaddr = self._rmb_on(self.conns[hs.conn], link)  # the RMB on the link's RNIC
        return ClcConfirm(
            version=hs.smc_version, first_contact=hs.first_contact, peer_id=ident.peer_id,
            gid=port.gid, mac=port.mac, qpn=link.qpn, rmb_rkey=rkey,
            rmbe_alert_token=hs.token, rmbe_size=compress_bufsize(hs.rmb.size),
            qp_mtu=link.mtu, rmb_vaddr=vaddr, psn=link.psn, **v2,  # type: ignore[arg-type]
        )  # fmt: skip

    # -- server -----------------------------------------------------------

    def _server_proposal(self, hs: Handshake, prop: ClcProposal, now: float,
                         out: list[Action]) -> None:  # fmt: skip
        """``smc_listen_work``: checks, then reuse a link group or make a first contact."""
        hs.version = 2 if prop.version >= 2 else 1
        choice = negotiation.choose(prop, hs.local_ip, self.ueids, self.identity, self.config)
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
            link.peer_gid, link.peer_mac = choice.peer_gid, choice.peer_mac
            hs.lgr, hs.link, hs.first_contact = lgr, link, True
            self._new_conn(hs, hs.rmb)
            self._send_accept(hs, now, out)
            return
        hs.lgr, hs.link = link.lgr, link
        conn = self._new_conn(hs, hs.rmb)
        self._send_accept(hs, now, out)
        if not self._peer_holds_rmb(link, conn, now, out):
            self._confirm_rkey(link.lgr, conn, hs.rmb, now, out)

    def _first_contact_running(self, peer_id: bytes) -> bool:
        """Whether a server first contact with this peer has not ended yet."""
        return any(not hs.client and hs.first_contact and hs.lgr is not None
                   and hs.lgr.peer_id == peer_id for hs in self.handshakes.values())  # fmt: skip

    def _release_held(self, now: float, out: list[Action]) -> None:
        """Go on with the held Proposals whose peer's first contact has ended (the
        group is there to join; or it failed, and one of them makes the next)."""
        for conn, prop in list(self._held.items()):
            hs = self.handshakes.get(conn)
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
        for lgr in self.lgrs.values():
            if (
                lgr.role is Role.SERVER
                and lgr.peer_id == peer_id
                and not lgr.terminated
                and len(lgr.conns) < min(self.config.max_conns, lgr.max_conns)
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
        if not usable:
            return None
        load = {id(x): 0 for x in usable}
        for c in lgr.conns.values():
            if c.link is not None and id(c.link) in load:
                load[id(c.link)] += 1
        linux = usable[1] if len(lgr.conns) % 2 and len(usable) > 1 else usable[0]
        return min(usable, key=lambda x: (load[id(x)], x is not linux))

    def _send_accept(self, hs: Handshake, now: float, out: list[Action]) -> None:
        assert hs.rmb is not None and hs.link is not None
        ident, link, terms = self.identity, hs.link, hs.terms
        v2: dict[str, object] = {}
        if terms is not None:
            v2 = {"eid": terms.eid}
            if hs.first_contact:
                v2["fce"] = negotiation.first_contact_ext(terms, ident)
        port = ident.ports[link.port]  # the link's port: the client finds the link by it
        rkey, vaddr = self._rmb_on(self.conns[hs.conn], link)  # the RMB on the link's RNIC
        acc = ClcAccept(
            version=hs.smc_version, first_contact=hs.first_contact, peer_id=ident.peer_id,
            gid=port.gid, mac=port.mac, qpn=link.qpn, rmb_rkey=rkey,
            rmbe_alert_token=hs.token, rmbe_size=compress_bufsize(hs.rmb.size),
            qp_mtu=self.config.qp_mtu, rmb_vaddr=vaddr, psn=link.psn,
            **v2,  # type: ignore[arg-type]
        )  # fmt: skip
        out.append(SendClc(hs.conn, acc.encode()))
        hs.state = HsState.CONFIRM_WAIT
        hs.deadline = now + self.config.clc_wait

    def _server_confirm(self, hs: Handshake, conf: ClcConfirm, now: float,
                        out: list[Action]) -> None:  # fmt: skip
        """First contact: QP up, CONFIRM LINK request; else the connection is ready."""
        assert hs.link is not None
        link = hs.link
        conn = self.conns[hs.conn]
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
        link.mtu = min(conf.qp_mtu, self.config.qp_mtu)
        out.append(QpToRtr(link.qpn, link.peer_gid, conf.qpn, conf.psn, link.mtu, **link.names))
        out.append(QpToRts(link.qpn, link.psn, **link.names))
        self._post_llc(link, llc_msgs.confirm_link(link, self.identity, self.config), out)
        hs.state = HsState.CONFIRM_LINK_RESP_WAIT
        hs.deadline = now + self.config.llc_wait

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
        self._use_link(conn, link)
        link.lgr.conns[conn.token] = conn
        link.lgr.idle_since = None

    def _complete(self, hs: Handshake, out: list[Action]) -> None:
        del self.handshakes[hs.conn]
        hs.state = HsState.DONE
        conn = self.conns[hs.conn]
        conn.state = SmcState.ACTIVE
        assert hs.lgr is not None
        self._events.append(HandshakeCompleted(conn=hs.conn, first_contact=hs.first_contact,
                                               lgr_id=hs.lgr.lgr_id,
                                               version=hs.lgr.version))  # fmt: skip
        if self._unconfirmed and hs.conn in self._unconfirmed:
            self._unconfirmed.discard(hs.conn)
            self._abort(conn, UNCONFIRMED_RKEY, out)
            self.touched.add(conn.id)
        elif conn.peer_wants_update:  # a CDC that overtook the CLC Confirm asked for an answer
            conn.send_cdc(out)

    def _decline(self, hs: Handshake, code: DeclineCode, out: list[Action]) -> None:
        """Send a Decline and fall back (``smc_connect_decline_fallback``,
        ``smc_listen_decline``)."""
        decline = ClcDecline.linux(code, self.identity.peer_id, version=hs.version)
        out.append(SendClc(hs.conn, decline.encode()))
        if hs.first_contact and hs.lgr is not None:
            # off the handshake first: _terminate declines the handshakes of the group,
            # and this one must not get a second Decline on its TCP connection
            lgr, hs.lgr = hs.lgr, None
            self._terminate(lgr, f"first contact failed: {code.name}", out)
        self._fall_back(hs, int(code), 0, out)

    def _fall_back(self, hs: Handshake, local: int, peer: int, out: list[Action]) -> None:
        self.handshakes.pop(hs.conn, None)
        hs.state = HsState.FALLBACK
        self._drop_conn(hs.conn)
        self._events.append(FellBack(conn=hs.conn, local_code=local, peer_code=peer))

    def _fail(self, hs: Handshake, reason: str, out: list[Action]) -> None:
        self.handshakes.pop(hs.conn, None)
        hs.state = HsState.FAILED
        if hs.first_contact and hs.lgr is not None:
            self._terminate(hs.lgr, reason, out)
        self._drop_conn(hs.conn)
        self._events.append(HandshakeFailed(conn=hs.conn, reason=reason))

    def _drop_conn(self, conn_id: int) -> None:
        self._unconfirmed.discard(conn_id)
        conn = self.conns.pop(conn_id, None)
        if conn is not None:
            for lgr in self.lgrs.values():
                lgr.conns.pop(conn.token, None)

    def handshake(self, conn: int) -> Handshake | None:
        """The running handshake of a connection (the host reads its trailing data)."""
        return self.handshakes.get(conn)

    def shutdown(self, now: float, final: bool = False) -> list[Action]:
        """This host's SMC-R goes away (the process ends, and its RNIC with it): every
        link group ends with DELETE LINK, as Linux ``smc_lgr_cleanup`` ends its groups
        when its SMC goes (module unload, reboot: DELETE LINK ALL, not orderly, reason
        program-initiated unless another is set).

        Why: a peer that is not told keeps its link up, and whatever it still sends
        (the last CDC of a close, a DELETE RKEY) is retried unanswered until its TEST
        LINK gives up: a Linux peer's ``close()`` then blocks for about 30 s.

        In two calls: the first sends the DELETE LINKs and keeps the links, so that
        the peer's own DELETE LINK ALL, which Linux sends back as it ends the group,
        is received and acknowledged (unacknowledged, its RNIC retries it at whoever
        uses our address next); a group ends when it comes (:meth:`ending` says
        whether any has not yet).  The call with ``final`` ends what is left.
        Connections still open are reset, as the group's end resets them.
        """
        out: list[Action] = []
        for lgr in list(self.lgrs.values()):
            if lgr.terminated:
                continue
            link = lgr.active_link
            if not final and lgr.lgr_id not in self._ending and link is not None:
                request = llc_msgs.delete_link(lgr, LLC_FLAG_DEL_LINK_ALL,
                                               DeleteLinkReason.PROG_INIT_TERM)  # fmt: skip
                self._post_llc(link, request, out)
                self._ending.add(lgr.lgr_id)
            elif final or link is None:
                self._terminate(lgr, "this host's SMC-R ends", out)
        return out

    def ending(self) -> bool:
        """Whether a link group :meth:`shutdown` asked to end still waits for the peer's
        DELETE LINK."""
        return any(lgr_id in self.lgrs and not self.lgrs[lgr_id].terminated
                   for lgr_id in self._ending)  # fmt: skip

    def closing(self) -> bool:
        """Whether a close is under way with a peer: a connection the application closed
        that waits for the peer's side of the close, or an LLC flow (DELETE RKEY of a
        released buffer) waiting for its answer.  The host lets these finish before
        :meth:`shutdown` (Linux keeps them going after the application has left)."""
        if any(c.state not in (SmcState.INIT, SmcState.ACTIVE, SmcState.CLOSED)
               for c in self.conns.values()):  # fmt: skip
            return True
        return any(lgr.flow is not None or lgr.flow_queue
                   for lgr in self.lgrs.values() if not lgr.terminated)  # fmt: skip

    # ================================================================ timers

    def handle_timer(self, now: float) -> list[Action]:
        """Handshake deadlines, LLC response waits, TEST LINK keepalive."""
        out: list[Action] = []
        self._release_held(now, out)  # (a first contact ended by a link failure)
        for hs in list(self.handshakes.values()):
            # (a held Proposal has come: its wait is the first contact's, bounded by
            # that one's own deadline, as Linux's listen worker waits on the mutex)
            if (now >= hs.deadline and self.handshakes.get(hs.conn) is hs
                    and hs.conn not in self._held):  # fmt: skip
                self._handshake_timeout(hs, now, out)
        self._release_held(now, out)
        for lgr in list(self.lgrs.values()):
            flow = lgr.flow
            if flow is not None and now >= flow.deadline:
                lgr.flow = None
                self._finish_flow(flow, False, now, out)
                self._next_flow(lgr, now, out)
            for link in list(lgr.links):
                self._keepalive(link, now, out)
            if lgr.remote_add is not None:
                self._cli_add_link_timeout(lgr, now, out)
            if (lgr.idle_since is not None and not lgr.conns and not lgr.terminated
                    and now >= lgr.idle_since + self._linger(lgr)):  # fmt: skip
                # smc_lgr_free_work: DELETE LINK ALL, orderly, program-initiated
                self._delete_all(lgr, DeleteLinkReason.PROG_INIT_TERM, "link group idle", out)
        return out

    def _linger(self, lgr: LinkGroup) -> float:
        cfg = self.config
        return cfg.lgr_linger_server if lgr.role is Role.SERVER else cfg.lgr_linger_client

    def _handshake_timeout(self, hs: Handshake, now: float, out: list[Action]) -> None:
        if hs.state is HsState.CONFIRM_LINK_WAIT:  # smcr_clnt_conf_first_link
            hs.state = HsState.DECLINE_WAIT
            hs.deadline = now + DECLINE_WAIT_SHORT
        elif hs.state in (HsState.DECLINE_WAIT, HsState.CONFIRM_LINK_RESP_WAIT):
            self._decline(hs, DeclineCode.TIMEOUT_CL, out)
        elif hs.state in (HsState.PROPOSAL_WAIT, HsState.PROPOSAL_SENT, HsState.CONFIRM_WAIT):
            self._fail(hs, f"CLC timeout in state {hs.state.name}", out)
        else:  # an LLC flow of this handshake stalled: its own timer declines
            hs.deadline = now + self.config.llc_wait

    # ============================================================ application

    def data_written(self, conn: int, n: int, now: float, urgent: bool = False) -> list[Action]:
        """The application copied ``n`` bytes into the connection's send buffer.

        (The inline alternative, :meth:`Connection.write_inline`, is called on the
        connection itself: the data path's one call per send.)
        """
        out: list[Action] = []
        self.conns[conn].written(n, out, urgent)
        return out

    def data_consumed(self, conn: int, n: int, now: float, force: bool = False) -> list[Action]:
        """The application read ``n`` bytes from the RMBE."""
        out: list[Action] = []
        c = self.conns.get(conn)
        if c is not None:
            c.consumed(n, out, force)
        return out

    def shutdown_write(self, conn: int, now: float) -> list[Action]:
        """``shutdown(SHUT_WR)``: done-writing CDC."""
        out: list[Action] = []
        self.conns[conn].app_shutdown_write(out)
        return out

    def close(self, conn: int, now: float) -> list[Action]:
        """The application closed the socket (after the host waited for the send buffer)."""
        out: list[Action] = []
        c = self.conns.get(conn)
        if c is not None:
            c.app_close(out)
        return out

    def abort(self, conn: int, now: float) -> list[Action]:
        """The application closed abortively (:meth:`Connection.app_abort`); a connection
        already released or CLOSED gets an ordinary close instead."""
        out: list[Action] = []
        c = self.conns.get(conn)
        if c is not None and not c.app_abort(out):
            c.app_close(out)
        return out

    def release(self, conn: int, now: float) -> list[Action]:
        """Forget a CLOSED, released connection; keep its RMB announced to the peer for
        the group's next connection, or announce its end (DELETE RKEY).

        Kept (:meth:`_keep_rmb`) when the peer has ended its stream in order: its last
        write came before that CDC on the group's one link (RC ordering), so nothing of
        it can land in the RMB any more, which is reusable at once (:class:`ReuseRmb`)
        and needs no CONFIRM RKEY when the group's next connection gets it again
        (:meth:`_peer_holds_rmb`).  That saves two LLC round trips per connection.
        Otherwise DELETE RKEY: :class:`ReuseRmb` follows when the peer has answered
        (or the flow ended otherwise: no answer, the link gone), at once if there is no
        link to ask.
        """
        out: list[Action] = []
        c = self.conns.pop(conn, None)
        if c is None:
            return out
        reuse: list[Action] = [ReuseRmb(conn)]
        for lgr in list(self.lgrs.values()):
            if lgr.conns.get(c.token) is c:
                del lgr.conns[c.token]
                if not lgr.conns:
                    lgr.idle_since = now
                if self._keep_rmb(lgr, c):
                    assert c.link is not None
                    lgr.idle_rmbs[c.rmb.rkey] = c.link
                    break
                if not lgr.terminated and lgr.active_link is not None:
                    def build(link: Link, lgr: LinkGroup = lgr) -> LlcMessage:
                        # the RMB's rkey on the link the request goes over, as Linux
                        # smc_llc_send_delete_rkey (the peer looks it up on that link)
                        rkey = c.rmb_keys.get(link, (c.rmb.rkey, 0))[0]
                        return llc_msgs.delete_rkey(lgr, rkey)

                    request = build(lgr.active_link)
                    self._start_flow(lgr, request, lambda ok, t: reuse, now, out, build)
                    return out
        out += reuse
        return out

    @staticmethod
    def _keep_rmb(lgr: LinkGroup, c: Connection) -> bool:
        """Whether a released connection's RMB stays announced to the peer (:meth:`release`):
        the peer ended in order (done writing or closed, no abort, no reset), the group
        has one link, the connection's, over port 0 (the RMB's own rkey, not one the
        host registered for another port and drops with the buffers), and the group
        keeps fewer than :data:`IDLE_RMBS_MAX` and within its room for connections."""
        link = c.link
        return (not lgr.terminated and link is not None and lgr.links == [link]
                and link.state is LinkState.LINK_ACTIVE and link.port == 0
                and c.peer_finished and not c.aborted
                and c.rmb_keys.get(link) == (c.rmb.rkey, c.rmb.vaddr)
                and len(lgr.idle_rmbs) < IDLE_RMBS_MAX
                and len(lgr.conns) + len(lgr.idle_rmbs) < lgr.max_conns)  # fmt: skip

