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

Composition: the engine is a facade over parts, each with one concern, that share one
state object (:class:`~smcr.core.state.EngineState`: connections, link groups,
links, events, the host's config, identity and provider): the link layer and LLC
(:class:`~smcr.core.llc.LinkLayer`), ADD LINK (:class:`~smcr.core.addlink.AddLinkFlows`),
failover (:class:`~smcr.core.failover.Failover`), the host's ports
(:class:`~smcr.core.ports.Ports`), our RMBs' rkeys (:class:`~smcr.core.rkeys.Rkeys`)
and the CLC handshakes (:class:`~smcr.core.clc.ClcHandshakes`).  A part that needs
another is given it when it is made, lower parts first; the link layer needs none:
the handlers of the others reach it through the LLC table (:meth:`Engine._llc_table`).
The engine keeps the public API, the timers and the application's calls.

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

from collections.abc import Collection

from smcr.core import llc_msgs
from smcr.core.addlink import AddLinkFlows
from smcr.core.clc import NO_DEADLINE, ClcHandshakes, earliest_deadline
from smcr.core.close import SmcState
from smcr.core.config import Config, LocalIdentity
from smcr.core.connection import Connection, Rmb
from smcr.core.events import Action, Event, Provider
from smcr.core.failover import Failover
from smcr.core.handshake import Handshake, IpAddress
from smcr.core.linkgroup import Link, LinkGroup, LinkState, Role
from smcr.core.llc import ANY_LINK_STATE, LinkLayer, LlcHandler, LlcRoute
from smcr.core.ports import Ports
from smcr.core.rkeys import Rkeys
from smcr.core.state import EngineState
from smcr.wire.decline import DeclineCode
from smcr.wire.llc import LLC_FLAG_DEL_LINK_ALL, DeleteLinkReason, LlcType


class Engine:
    """SMC-R for one process: handshakes, link groups, connections (module docstring)."""

    def __init__(self, config: Config, identity: LocalIdentity, provider: Provider) -> None:
        self.state = EngineState(config, identity, provider)
        self.llc = LinkLayer(self.state)
        self.addlink = AddLinkFlows(self.state, self.llc)
        self.failover = Failover(self.state, self.llc, self.addlink)
        self.ports = Ports(self.state, self.addlink, self.failover)
        self.rkeys = Rkeys(self.state, self.llc)
        self.clc = ClcHandshakes(self.state, self.llc, self.addlink, self.rkeys)
        self.llc.table = self._llc_table()

    def _llc_table(self) -> dict[tuple[int, bool], LlcRoute]:
        """``(msg_type, response) -> (handler, allowed link states)``: the handlers of the
        parts (Linux ``smc_llc_rx_handlers``, ``smc_llc_rx_response`` and
        ``smc_llc_event_handler``), for the link layer's dispatch
        (:meth:`LinkLayer._dispatch <smcr.core.llc.LinkLayer._dispatch>`).

        A message on a link in a state its handler does not take is dropped and counted.
        The states are those in which the handler does more than that: a CONFIRM LINK
        response belongs to a link being confirmed, an ADD LINK response to the active
        link the server's flow runs over, a CONTINUATION to that flow's link (a client's
        may have come on a link still activating), while the rest are taken on any link
        the engine knows: a request is answered, or its flow's handling decides, on
        whatever link it came (a CONFIRM LINK request out of place breaks the protocol).
        """
        llc, addlink, failover, clc = self.llc, self.addlink, self.failover, self.clc
        any_state = ANY_LINK_STATE
        activating = frozenset({LinkState.LINK_ACTIVATING})
        active = frozenset({LinkState.LINK_ACTIVE})
        up = activating | active
        rows: list[tuple[int, bool, LlcHandler, frozenset[LinkState]]] = [
            # type, response, handler, the link states it is handled in
            (LlcType.CONFIRM_LINK, False, clc.receive_confirm_link, any_state),
            (LlcType.CONFIRM_LINK, True, clc.receive_confirm_link_response, activating),
            (LlcType.ADD_LINK, False, addlink.receive_add_link, any_state),
            (LlcType.ADD_LINK, True, addlink.receive_add_link_response, active),
            (LlcType.ADD_LINK_CONT, False, addlink.receive_add_link_cont, up),
            (LlcType.ADD_LINK_CONT, True, addlink.receive_add_link_cont, up),
            (LlcType.DELETE_LINK, False, failover.receive_delete_link, any_state),
            (LlcType.DELETE_LINK, True, failover.receive_delete_link_response, any_state),
            (LlcType.REQ_ADD_LINK_V2, False, addlink.receive_req_add_link, any_state),
            (LlcType.REQ_ADD_LINK_V2, True, addlink.receive_req_add_link_response, any_state),
            (LlcType.CONFIRM_RKEY, False, llc.receive_confirm_rkey, any_state),
            (LlcType.CONFIRM_RKEY, True, llc.receive_confirm_rkey_response, any_state),
            (LlcType.TEST_LINK, False, llc.receive_test_link, any_state),
            (LlcType.TEST_LINK, True, llc.ignore, any_state),
            (LlcType.CONFIRM_RKEY_CONT, False, llc.ignore, any_state),
            (LlcType.CONFIRM_RKEY_CONT, True, llc.ignore, any_state),
            (LlcType.DELETE_RKEY, False, llc.receive_delete_rkey, any_state),
            (LlcType.DELETE_RKEY, True, llc.receive_delete_rkey_response, any_state),
        ]
        table = {(msg_type, response): (handler, states)
                 for msg_type, response, handler, states in rows}  # fmt: skip
        # v2 variants share the v1 handlers, as Linux takes the type's low nibble
        for v2 in (LlcType.CONFIRM_LINK_V2, LlcType.ADD_LINK_V2, LlcType.DELETE_LINK_V2,
                   LlcType.CONFIRM_RKEY_V2, LlcType.TEST_LINK_V2, LlcType.DELETE_RKEY_V2):
            for response in (False, True):
                table[(v2, response)] = table[(v2 & 0x0F, response)]
        return table

    # ============================================================ the state

    @property
    def config(self) -> Config:
        """The engine's configuration (the host may replace it)."""
        return self.state.config

    @config.setter
    def config(self, config: Config) -> None:
        self.state.config = config

    @property
    def identity(self) -> LocalIdentity:
        """Who we are to peers: IDs, ports (the host may replace it)."""
        return self.state.identity

    @identity.setter
    def identity(self, identity: LocalIdentity) -> None:
        self.state.identity = identity

    @property
    def provider(self) -> Provider:
        """The host's synchronous interface (QPs, RMB registrations)."""
        return self.state.provider

    @property
    def ueids(self) -> tuple[bytes, ...]:
        """The host's user EIDs (:attr:`EngineState.ueids`), kept current by the host."""
        return self.state.ueids

    @ueids.setter
    def ueids(self, ueids: tuple[bytes, ...]) -> None:
        self.state.ueids = ueids

    @property
    def touched(self) -> set[int]:
        """Connections whose cursors or state changed since the host last cleared it."""
        return self.state.touched

    @touched.setter
    def touched(self, touched: set[int]) -> None:
        self.state.touched = touched

    @property
    def conns(self) -> dict[int, Connection]:
        """The connections by the host's id, from the handshake's decision on."""
        return self.state.conns

    @property
    def handshakes(self) -> dict[int, Handshake]:
        """The running CLC handshakes by connection id."""
        return self.state.handshakes

    @property
    def lgrs(self) -> dict[int, LinkGroup]:
        """The link groups by id."""
        return self.state.lgrs

    @property
    def links(self) -> dict[int, Link]:
        """Every link by its QP number."""
        return self.state.links

    @property
    def late_links(self) -> dict[int, Link]:
        """Cleared links whose late CDCs still count (:attr:`EngineState.late_links`)."""
        return self.state.late_links

    @property
    def ports_down(self) -> set[int]:
        """Our ports the host reported unusable (:meth:`port_down`)."""
        return self.state.ports_down

    @property
    def dropped(self) -> int:
        """LLC and CDC messages dropped so far."""
        return self.state.dropped

    # ================================================================= output

    def next_event(self) -> Event | None:
        """Pop the oldest event, or None."""
        events = self.state.events
        return events.popleft() if events else None

    def has_events(self) -> bool:
        """Whether :meth:`next_event` has something."""
        return bool(self.state.events)

    def get_timer(self) -> float | None:
        """The earliest deadline of any handshake, LLC flow or keepalive, or None.

        (Every poller's sleep asks: the minimum kept as it goes, in native floats where
        compiled, instead of a list of boxed ones and ``min``.)"""
        earliest = earliest_deadline(self.clc)
        testlink_time = self.state.config.testlink_time
        for lgr in self.state.lgrs.values():
            flow = lgr.flow
            if flow is not None and flow.deadline < earliest:
                earliest = flow.deadline
            if lgr.idle_since is not None:
                earliest = min(earliest, lgr.idle_since + self._linger(lgr))
            remote_add = lgr.remote_add
            if remote_add is not None and remote_add.deadline < earliest:
                earliest = remote_add.deadline
            for link in lgr.links:
                switch = link.switch_deadline
                if switch is not None and switch < earliest:
                    earliest = switch
                if link.state is LinkState.LINK_ACTIVE and testlink_time > 0:
                    test = link.test_deadline
                    due = test if test is not None else link.last_rx + testlink_time
                    earliest = min(earliest, due)
        return earliest if earliest < NO_DEADLINE else None

    # ============================================================ handshake

    def connect(self, conn: int, rmb: Rmb | None, local_ip: IpAddress, now: float,
                sndbuf_size: int = 0,
                sent: tuple[int, bool] | None = None) -> list[Action]:  # fmt: skip
        """Client: send the Proposal (:meth:`ClcHandshakes.connect
        <smcr.core.clc.ClcHandshakes.connect>`)."""
        return self.clc.connect(conn, rmb, local_ip, now, sndbuf_size, sent)

    def proposal(self, local_ip: IpAddress) -> tuple[bytes, int, bool]:
        """The Proposal a client sends now (:meth:`ClcHandshakes.proposal
        <smcr.core.clc.ClcHandshakes.proposal>`)."""
        return self.clc.proposal(local_ip)

    def accept(self, conn: int, rmb: Rmb | None, local_ip: IpAddress, now: float,
               sndbuf_size: int = 0) -> list[Action]:  # fmt: skip
        """Server: wait for the Proposal (:meth:`ClcHandshakes.accept
        <smcr.core.clc.ClcHandshakes.accept>`)."""
        return self.clc.accept(conn, rmb, local_ip, now, sndbuf_size)

    def receive_clc(self, conn: int, data: bytes, now: float) -> list[Action]:
        """Bytes from the connection's TCP socket during the handshake."""
        return self.clc.receive_clc(conn, data, now)

    def tcp_closed(self, conn: int, now: float) -> list[Action]:
        """The TCP connection ended during the handshake (:meth:`ClcHandshakes.tcp_closed
        <smcr.core.clc.ClcHandshakes.tcp_closed>`)."""
        return self.clc.tcp_closed(conn, now)

    def handshake(self, conn: int) -> Handshake | None:
        """The running handshake of a connection (the host reads its trailing data)."""
        return self.state.handshakes.get(conn)

    # ================================================================ links

    def receive_wr(self, qpn: int, data: memoryview, now: float) -> list[Action]:
        """A SEND arrived on a link: a CDC (byte 0 0xFE) or an LLC message."""
        return self.llc.receive_wr(qpn, data, now)

    def receive_wrs(self, qpn: int, datas: list[memoryview], now: float) -> list[Action]:
        """SENDs that arrived on a link together, in order, CDCs coalesced
        (:meth:`LinkLayer.receive_wrs <smcr.core.llc.LinkLayer.receive_wrs>`)."""
        return self.llc.receive_wrs(qpn, datas, now)

    def take_cdc(self, qpn: int, area: memoryview, off: int, n: int, now: float,
                 out: list[Action]) -> bool:  # fmt: skip
        """A SEND read in place, taken if it is a CDC the data path knows
        (:meth:`LinkLayer.take_cdc <smcr.core.llc.LinkLayer.take_cdc>`); its actions go to
        ``out``."""
        return self.llc.take_cdc(qpn, area, off, n, now, out)

    def send_completed(self, qpn: int, wr_id: int, ok: bool, now: float) -> list[Action]:
        """A signaled send completed; CDCs free send-buffer space (``smc_cdc_tx_handler``),
        an error fails the link."""
        if not ok:
            return self.failover.link_failed(qpn, "send completed with an error", now)
        self.llc.send_completed(qpn, wr_id, now)
        return []

    def link_delivered(self, qpn: int, at: float) -> None:
        """The host saw the link's transport deliver (its QP's PSNs moved, RoCE): an LLC
        wait that ran out waits on (:meth:`LinkLayer.wait_on
        <smcr.core.llc.LinkLayer.wait_on>`).

        :param at: when it delivered, or a time before (the host's previous look).
        """
        link = self.state.links.get(qpn)
        if link is not None and at > link.last_delivered:
            link.last_delivered = at

    def link_failed(self, qpn: int, reason: str, now: float,
                    decline: DeclineCode = DeclineCode.NOACTLINK,
                    peer_gone: bool = False) -> list[Action]:  # fmt: skip
        """The link's QP went to ERR: failover, or the group's end
        (:meth:`Failover.link_failed <smcr.core.failover.Failover.link_failed>`)."""
        return self.failover.link_failed(qpn, reason, now, decline, peer_gone)

    def probe_link(self, conn_id: int, now: float) -> list[Action]:
        """Test a connection's link at once (:meth:`LinkLayer.probe_link
        <smcr.core.llc.LinkLayer.probe_link>`)."""
        return self.llc.probe_link(conn_id, now)

    def port_down(self, port: int, reason: str, now: float) -> list[Action]:
        """Our ``port`` is unusable (:meth:`Ports.port_down <smcr.core.ports.Ports.port_down>`)."""
        return self.ports.port_down(port, reason, now)

    def port_up(self, port: int, now: float) -> list[Action]:
        """Our ``port`` is usable again (:meth:`Ports.port_up <smcr.core.ports.Ports.port_up>`)."""
        return self.ports.port_up(port, now)

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
        for lgr in list(self.state.lgrs.values()):
            if lgr.terminated:
                continue
            link = lgr.active_link
            if not final and lgr.lgr_id not in self.state.ending and link is not None:
                request = llc_msgs.delete_link(lgr, LLC_FLAG_DEL_LINK_ALL,
                                               DeleteLinkReason.PROG_INIT_TERM)  # fmt: skip
                self.llc.post_llc(link, request, out)
                self.state.ending.add(lgr.lgr_id)
            elif final or link is None:
                self.llc.terminate(lgr, "this host's SMC-R ends", out)
        return out

    def ending(self) -> bool:
        """Whether a link group :meth:`shutdown` asked to end still waits for the peer's
        DELETE LINK."""
        return any(lgr_id in self.state.lgrs and not self.state.lgrs[lgr_id].terminated
                   for lgr_id in self.state.ending)  # fmt: skip

    def links_peers_may_use(self) -> set[int]:
        """The QPs of the link groups whose peer may still send after :meth:`shutdown`:
        a group that has a connection not yet closed by both ends, or that has not yet
        answered our DELETE LINK.

        Why: a Linux peer ends such a group by killing each of its connections, and each
        kill sends an abort CDC over the link (``smc_conn_kill``) and waits for its
        completion (``smc_cdc_wait_pend_tx_wr``); a QP of ours gone by then leaves the
        peer's RC retrying it without end and its workers and application blocked.  The
        host keeps these QPs until they are quiet (:class:`~smcr.stack.closing.Closing`)."""
        return {link.qpn for lgr in self.state.lgrs.values() if not lgr.terminated
                and (lgr.lgr_id in self.state.ending
                     or any(c.state is not SmcState.CLOSED for c in lgr.conns.values()))
                for link in lgr.links}  # fmt: skip

    def closing(self, unwaited: Collection[int] = ()) -> bool:
        """Whether a close is under way with a peer: a connection the application closed
        that waits for the peer's side of the close, or an LLC flow (DELETE RKEY of a
        released buffer) waiting for its answer.  The host lets these finish before
        :meth:`shutdown` (Linux keeps them going after the application has left).

        :param unwaited: connections whose peer's side is not waited for (those the host
            closed at exit for an application that left them open)."""
        if any(c.state not in (SmcState.INIT, SmcState.ACTIVE, SmcState.CLOSED)
               and c.id not in unwaited for c in self.state.conns.values()):  # fmt: skip
            return True
        return any(lgr.flow is not None or lgr.flow_queue
                   for lgr in self.state.lgrs.values() if not lgr.terminated)  # fmt: skip

    # ================================================================ timers

    def handle_timer(self, now: float) -> list[Action]:
        """Handshake deadlines, LLC response waits, TEST LINK keepalive, idle groups."""
        out: list[Action] = []
        self.clc.handle_timer(now, out)
        llc = self.llc
        for lgr in list(self.state.lgrs.values()):
            flow = lgr.flow
            if flow is not None and now >= flow.deadline and not llc.wait_on(lgr, flow, now):
                lgr.flow = None
                llc.finish_flow(flow, False, now, out)
                llc.next_flow(lgr, now, out)
            for link in list(lgr.links):
                if link.switch_deadline is not None and now >= link.switch_deadline:
                    self.failover.move_off(link, now, out)  # the peer never answered
                if llc.keepalive(link, now, out):
                    out.extend(self.failover.link_failed(link.qpn, "TEST LINK not answered", now))
            if lgr.remote_add is not None:
                self.addlink.cli_add_link_timeout(lgr, now, out)
            if (lgr.idle_since is not None and not lgr.conns and not lgr.terminated
                    and now >= lgr.idle_since + self._linger(lgr)):  # fmt: skip
                # smc_lgr_free_work: DELETE LINK ALL, orderly, program-initiated
                llc.delete_all(lgr, DeleteLinkReason.PROG_INIT_TERM, "link group idle", out)
        return out

    def _linger(self, lgr: LinkGroup) -> float:
        cfg = self.state.config
        return cfg.lgr_linger_server if lgr.role is Role.SERVER else cfg.lgr_linger_client

    # ============================================================ application

    def data_written(self, conn: int, n: int, now: float, urgent: bool = False) -> list[Action]:
        """The application copied ``n`` bytes into the connection's send buffer.

        (The inline alternative, :meth:`Connection.write_inline`, is called on the
        connection itself: the data path's one call per send.)
        """
        out: list[Action] = []
        self.state.conns[conn].written(n, out, urgent)
        return out

    def data_consumed(self, conn: int, n: int, now: float, force: bool = False) -> list[Action]:
        """The application read ``n`` bytes from the RMBE."""
        out: list[Action] = []
        c = self.state.conns.get(conn)
        if c is not None:
            c.consumed(n, out, force)
        return out

    def shutdown_write(self, conn: int, now: float) -> list[Action]:
        """``shutdown(SHUT_WR)``: done-writing CDC."""
        out: list[Action] = []
        self.state.conns[conn].app_shutdown_write(out)
        return out

    def close(self, conn: int, now: float) -> list[Action]:
        """The application closed the socket (after the host waited for the send buffer)."""
        out: list[Action] = []
        c = self.state.conns.get(conn)
        if c is not None:
            c.app_close(out)
        return out

    def abort(self, conn: int, now: float) -> list[Action]:
        """The application closed abortively (:meth:`Connection.app_abort`); a connection
        already released or CLOSED gets an ordinary close instead."""
        out: list[Action] = []
        c = self.state.conns.get(conn)
        if c is not None and not c.app_abort(out):
            c.app_close(out)
        return out

    def release(self, conn: int, now: float) -> list[Action]:
        """Forget a CLOSED, released connection: its RMB kept announced to the peer, or
        taken back (:meth:`Rkeys.release <smcr.core.rkeys.Rkeys.release>`)."""
        return self.rkeys.release(conn, now)
