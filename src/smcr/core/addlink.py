"""ADD LINK, SMC-Rv1 and SMC-Rv2: another link in a link group, both roles (Linux
``smc_llc.c``).

The server drives it, as a local LLC flow of the group over a link it has:
right after first contact (Linux ``smcr_serv_conf_first_link`` calls
``smc_llc_srv_add_link``), after a DELETE LINK left the group with one link
(``smc_llc_process_srv_delete_link`` -> ``smc_llc_add_link_local``), when a
port is usable again (``smcr_port_add``, :meth:`~smcr.core.ports.Ports.port_up`)
and when the client asks (its ADD LINK invitation, v1, or REQUEST ADD LINK, v2):

1. S->C ADD LINK request: the new QP (made on another of our ports, or on the
   same one when no other is usable: ``ASYMMETRIC_LOCAL``), its id, MTU and
   PSN; in v2 also every RMB's rkey for the new link (``smc_llc_fill_ext_v2``).
2. The client decides as ``smc_llc_cli_add_link``: it rejects when the offer
   comes from the port it already talks to and it has no other port itself;
   else it makes its QP (on another port, or on its only one:
   ``ASYMMETRIC_LOCAL``), brings it to RTR and answers ADD LINK with its QP
   (v2: and its rkeys, ``smc_llc_save_add_link_rkeys`` on both sides).
3. The server brings its QP to RTR and RTS; if the answer names the port the
   first link already reaches, the group is ``ASYMMETRIC_PEER`` to it.
4. v1 only: ADD LINK CONTINUATION ping-pong on the old link, server first,
   until both have sent the rkeys of all their RMBs for the new link
   (``smc_llc_srv_rkey_exchange`` / ``smc_llc_cli_rkey_exchange``); each pair
   names the RMB by its rkey on the old link.
5. S->C CONFIRM LINK on the *new* link; the client's QP goes to RTS and it
   answers on the new link.  Both sides' new link is active, the group
   ``SYMMETRIC`` or asymmetric.

A server whose flow fails (reject, no answer, an unexpected message) clears the
new link (its QP destroyed); after a CONFIRM LINK unanswered it also sends
DELETE LINK for it (``SMC_LLC_DEL_LOST_PATH``), as ``smc_llc_srv_conf_link``.
A client whose flow fails after it answered clears its new link and still
sends the reject (``out_clear_lnk`` falls through to ``out_reject``); when the
CONFIRM LINK never came it sends DELETE LINK for the new link first
(``smc_llc_cli_conf_link``).

Which of our ports a new link uses: the first usable one other than the old
link's with the same PNET ID (:attr:`Port.pnetid <smcr.core.config.Port.pnetid>`);
the peer decides its own side the same way.
"""

from __future__ import annotations

from smcr.core import llc_msgs
from smcr.core.connection import Connection
from smcr.core.events import Action, LinkAdded, QpToRts
from smcr.core.linkgroup import (
    AddLinkFlow,
    LgrType,
    Link,
    LinkGroup,
    LinkState,
    LocalFlow,
    Role,
)
from smcr.core.llc import LinkLayer, LlcViolationError
from smcr.core.state import EngineState
from smcr.wire.llc import (
    LLC_FLAG_DEL_LINK_ORDERLY,
    LLC_FLAG_NO_RMBE_EYEC,
    AddLink,
    AddLinkCont,
    AddLinkV2,
    ConfirmLink,
    DeleteLinkReason,
    LlcMessage,
    RequestAddLinkV2,
    RkeyPair,
)

_ASYMMETRIC = (LgrType.ASYMMETRIC_LOCAL, LgrType.ASYMMETRIC_PEER)

LINKS_PER_LGR_MAX = 3
"""``SMC_LINKS_PER_LGR_MAX``: link slots of a group (two plus an asymmetric one while
it is being replaced, ``smc_llc_delete_asym_link``)."""


class AddLinkFlows:
    """The ADD LINK flows of both roles (module docstring): a part of the engine, over
    its shared state and link layer."""

    def __init__(self, state: EngineState, llc: LinkLayer) -> None:
        self.state = state
        self.llc = llc

    # -- helpers ---------------------------------------------------------------

    def _alt_port(self, link: Link, *peer_gids: bytes) -> int | None:
        """A usable port of ours other than ``link``'s, of the group's PNET ID (Linux
        ``smc_pnet_find_alt_roce``: another device, its port active, ``smc_pnet_match``
        with ``lgr->pnet_id``) and, when the peer's GIDs are known, one that reaches
        one of them (:meth:`_reaches`)."""
        ports, down = self.state.identity.ports, self.state.ports_down
        pnetid = link.lgr.pnet_id
        for i, port in enumerate(ports):
            if (i != link.port and i not in down and port.pnetid.strip() == pnetid
                    and (not peer_gids or any(self._reaches(i, g) for g in peer_gids))):
                return i
        return None

    def _reaches(self, port: int, peer_gid: bytes) -> bool:
        """Whether our ``port`` has a path to the peer's GID, as the host says
        (``Provider.reaches``; a host that does not say: every port does).  Linux asks
        the route to the GID's address (``smc_ib_determine_gid`` with ``smcrv2``,
        ``smc_ib_find_route``); the engine leaves the routing to its host."""
        reaches = getattr(self.state.provider, "reaches", None)
        return True if reaches is None else bool(reaches(port, peer_gid))

    def _may_add(self, lgr: LinkGroup, new_type: LgrType) -> bool:
        """``smc_llc_alloc_alt_link``: a symmetric group is full, an asymmetric one takes
        no second asymmetric link, and there are three link slots."""
        if lgr.lgr_type is LgrType.SYMMETRIC:
            return False
        if lgr.lgr_type is not LgrType.SINGLE and new_type in _ASYMMETRIC:
            return False
        usable = [x for x in lgr.links if x.state is not LinkState.LINK_INACTIVE]
        return len(usable) < LINKS_PER_LGR_MAX

    def _new_link_up(self, flow: AddLinkFlow, now: float) -> None:
        """``smc_llc_link_active`` and ``smcr_lgr_set_type[_asym]``: an asymmetric type
        tags the new link as the asymmetric one, any type clears the others' tags."""
        flow.new.state = LinkState.LINK_ACTIVE
        flow.new.last_rx = now
        lgr = flow.link.lgr
        lgr.lgr_type = flow.new_type
        for x in lgr.links:
            x.is_asym = False
        flow.new.is_asym = flow.new_type in _ASYMMETRIC
        self.state.events.append(LinkAdded(lgr_id=lgr.lgr_id, link_id=flow.new.link_id,
                                           port=flow.new.port,
                                           lgr_type=lgr.lgr_type.value))  # fmt: skip

    def _save_rkeys(self, flow: AddLinkFlow, pairs: tuple[RkeyPair, ...]) -> None:
        """``smc_rtoken_set``: each pair's RMB, known by its rkey on the old link, gets
        its rkey and vaddr on the new one."""
        lgr = flow.link.lgr
        for pair in pairs:
            rt = lgr.rtoken_find(flow.link, pair.rmb_key)
            if rt is not None:
                lgr.rtoken_set(rt, flow.new, pair.rmb_key_new, pair.rmb_vaddr_new)

    def _rkeys_received(self, flow: AddLinkFlow, msg: AddLinkCont) -> None:
        self._save_rkeys(flow, msg.rkeys)
        flow.recv_left = msg.num_rkeys - len(msg.rkeys)

    def _same_path(self, link: Link, msg: AddLink | AddLinkV2) -> bool:
        """Whether an ADD LINK names the peer port ``link`` already reaches (GID, and in
        v1 MAC too)."""
        return msg.sender_gid == link.peer_gid and (
            isinstance(msg, AddLinkV2) or msg.sender_mac == link.peer_mac)  # fmt: skip

    def _map_rmbs(self, lgr: LinkGroup, new: Link) -> list[Connection]:
        """``smcr_buf_map_lgr``: every RMB of the group registered for the new link."""
        conns = list(lgr.conns.values())
        for conn in conns:
            self.llc.rmb_on(conn, new)
        return conns

    # -- server ------------------------------------------------------------------

    def srv_add_link(self, lgr: LinkGroup, now: float, out: list[Action],
                     invite: LlcMessage | None = None,
                     invite_link: Link | None = None) -> None:  # fmt: skip
        """Queue the server's ADD LINK flow (``smc_llc_add_link_local`` /
        ``smc_llc_srv_add_link``); what it offers is decided when its turn comes.

        :param invite: the client's ADD LINK invitation or REQUEST ADD LINK that asked
            for it (Linux ignores its content); a REQUEST ADD LINK is answered when
            no link is offered (``smc_llc_send_req_add_link_response``).
        """
        if lgr.terminated:
            return
        if not self.state.config.add_links:
            if isinstance(invite, RequestAddLinkV2) and invite_link is not None:
                self.llc.post_llc(invite_link, invite.response(), out)
            return
        if any(f is not None and f.adds_link for f in (lgr.flow, *lgr.flow_queue)):
            # one at a time: Linux drops a parallel ADD LINK request.  A request dropped
            # (the client's, or our own port back) is remembered: if the running offer
            # fails (the client rejected it, its port for it was still down then, or
            # ours was when it was made) or leaves the group ASYMMETRIC_PEER, it is
            # taken up after it (Linux would add no link until the next port event)
            lgr.add_asked = True
            return

        def start(link: Link, t: float, actions: list[Action]) -> LlcMessage | None:
            # a REQUEST ADD LINK names the client's GIDs, the one of its link first
            # (smc_fill_gid_list): a port that reaches one of its others.  (Linux routes
            # to the first, smc_llc_srv_add_link, and wants every RNIC on the subnet of
            # the TCP source, smc_ib_determine_gid; smcr allows a subnet per RNIC pair)
            gids = invite.gids[1:] if isinstance(invite, RequestAddLinkV2) else ()
            port = self._alt_port(link, *gids)
            new_type = LgrType.SYMMETRIC
            if port is None:
                port, new_type = link.port, LgrType.ASYMMETRIC_LOCAL
            if not self._may_add(lgr, new_type):
                if isinstance(invite, RequestAddLinkV2) and invite_link in lgr.links:
                    self.llc.post_llc(invite_link, invite.response(), actions)
                return None
            new = self.llc.new_link(lgr, port, lgr.new_link_id())
            new.mtu = self.state.config.qp_mtu
            conns = self._map_rmbs(lgr, new)
            local.add_link = AddLinkFlow(link, new, new_type, "response", [])
            return llc_msgs.add_link(new, self.state.identity, via=link, conns=conns)

        def done(ok: bool, t: float) -> list[Action]:
            actions: list[Action] = []
            flow = local.add_link
            if flow is None or lgr.terminated:
                return actions
            new = flow.new
            if ok:
                self._delete_asym_link(lgr, t, actions)
            elif new.state is not LinkState.LINK_ACTIVE:
                # smc_llc_srv_conf_link: DELETE LINK, lost path.  Also when the flow fails
                # during the rkey exchange (our new QP failed: no path to the client's
                # port): the client answered and waits with its new link; told, it ends
                # its flow at once (not after its wait) and takes our next offer
                if flow.step in ("cont", "confirm"):
                    request = llc_msgs.delete_link(lgr, 0, DeleteLinkReason.LOST_PATH,
                                                   new.link_id)  # fmt: skip
                    if flow.link in lgr.links:
                        self.llc.post_llc(flow.link, request, actions)
                self.llc.clear_link(new, actions)
            if lgr.add_asked:
                lgr.add_asked = False
                # ASYMMETRIC_PEER: the client asked, for a port of its own back, while
                # the offer to its other port ran (its invitation, on the old link, can
                # overtake its CONFIRM LINK answer on the new one)
                if not ok or lgr.lgr_type is LgrType.ASYMMETRIC_PEER:
                    self.srv_add_link(lgr, t, actions)
            return actions

        local = LocalFlow(llc_msgs.add_link_local(lgr), done, start=start, adds_link=True)
        lgr.flow_queue.append(local)
        self.llc.next_flow(lgr, now, out)

    def srv_flow(self, lgr: LinkGroup, step: str | None = None) -> AddLinkFlow | None:
        """The server's running ADD LINK flow (at ``step``, if given)."""
        running = lgr.flow
        if running is None or running.add_link is None:
            return None
        if step is not None and running.add_link.step != step:
            return None
        return running.add_link

    def srv_end_flow(self, lgr: LinkGroup, ok: bool, now: float, out: list[Action]) -> None:
        flow = lgr.flow
        assert flow is not None
        lgr.flow = None
        self.llc.finish_flow(flow, ok, now, out)
        self.llc.next_flow(lgr, now, out)

    def _srv_add_link_response(self, link: Link, msg: AddLink | AddLinkV2, now: float,
                               out: list[Action]) -> None:  # fmt: skip
        lgr = link.lgr
        flow = self.srv_flow(lgr)
        if flow is None or link is not flow.link:
            self.llc.drop(link.qpn, "ADD LINK response without a request")
            return
        if msg.link_num != flow.new.link_id:
            # the reject of an offer of ours that failed already (a client's reject echoes
            # the request: its link number), come after our next offer
            self.llc.drop(link.qpn, "ADD LINK response for another link")
            return
        if flow.step != "response" or msg.is_rejected:
            # a reject, or an ADD LINK where the flow waits for something else: Linux's
            # smc_llc_wait drops the unexpected message and the flow fails
            self.srv_end_flow(lgr, False, now, out)
            return
        new = flow.new
        if not self._reaches(new.port, msg.sender_gid):
            # the client's port is beyond our new link's reach: the path would be lost at
            # CONFIRM LINK (smc_llc_srv_conf_link); say so now, with DELETE LINK
            flow.step = "confirm"
            self.srv_end_flow(lgr, False, now, out)
            return
        if lgr.lgr_type is LgrType.SINGLE and self._same_path(link, msg):
            flow.new_type = LgrType.ASYMMETRIC_PEER
        # smc_llc_save_add_link_info, smc_ib_ready_link (the server's QP goes to RTS)
        new.peer_qpn, new.peer_psn = msg.sender_qp_num, msg.initial_psn
        new.peer_gid, new.peer_mac = msg.sender_gid, msg.sender_mac
        new.mtu = min(new.mtu, msg.qp_mtu)
        out.append(new.qp_to_rtr())
        out.append(QpToRts(new.qpn, new.psn, **new.names))
        assert lgr.flow is not None
        if isinstance(msg, AddLinkV2):  # smc_llc_save_add_link_rkeys: no CONT exchange
            self._save_rkeys(flow, msg.ext.rkeys if msg.ext is not None else ())
            self._srv_conf_link(flow, now, out)
            return
        flow.to_send = list(lgr.conns.values())
        flow.step = "cont"
        self.llc.post_llc(link, llc_msgs.add_link_cont(link, new, flow.to_send, False), out)
        lgr.flow.deadline = now + self.state.config.llc_wait

    def _srv_conf_link(self, flow: AddLinkFlow, now: float, out: list[Action]) -> None:
        """``smc_llc_srv_conf_link``: CONFIRM LINK over the new link, its answer awaited."""
        lgr = flow.link.lgr
        flow.step = "confirm"
        request = llc_msgs.confirm_link(flow.new, self.state.identity, self.state.config)
        self.llc.post_llc(flow.new, request, out)
        assert lgr.flow is not None
        lgr.flow.deadline = now + self.state.config.llc_wait_confirm

    def _srv_add_link_cont(self, link: Link, msg: AddLinkCont, now: float,
                           out: list[Action]) -> None:  # fmt: skip
        lgr = link.lgr
        flow = self.srv_flow(lgr, "cont")
        if flow is None or link is not flow.link or msg.link_num != flow.new.link_id:
            self.llc.drop(link.qpn, "ADD LINK CONTINUATION fits no ADD LINK flow")
            return
        self._rkeys_received(flow, msg)
        assert lgr.flow is not None
        lgr.flow.deadline = now + self.state.config.llc_wait
        if flow.to_send or flow.recv_left > 0:
            cont = llc_msgs.add_link_cont(link, flow.new, flow.to_send, False)
            self.llc.post_llc(link, cont, out)
            return
        self._srv_conf_link(flow, now, out)

    def srv_confirm_link_response(self, link: Link, msg: ConfirmLink, now: float,
                                  out: list[Action]) -> bool:  # fmt: skip
        """The CONFIRM LINK response of an ADD LINK flow; False if it is not one."""
        flow = self.srv_flow(link.lgr, "confirm")
        if flow is None or link is not flow.new:
            return False
        self._new_link_up(flow, now)
        self.srv_end_flow(link.lgr, True, now, out)
        return True

    # -- client ------------------------------------------------------------------

    def _cli_add_link(self, link: Link, msg: AddLink | AddLinkV2, now: float,
                      out: list[Action]) -> None:  # fmt: skip
        """``smc_llc_cli_add_link``: accept the server's offer or reject it."""
        lgr = link.lgr
        v2 = lgr.version >= 2
        running = lgr.flow
        if running is not None and isinstance(running.request, RequestAddLinkV2):
            # the server started add_link processing: our REQUEST ADD LINK flow is over
            lgr.flow = None
            self.llc.finish_flow(running, True, now, out)
        elif self.llc.delay(link, msg):  # our CONFIRM / DELETE RKEY flow ends first
            return
        if (not self.state.config.add_links or isinstance(msg, AddLinkV2) != v2
                or lgr.remote_add is not None or not msg.qp_mtu):  # fmt: skip
            self.llc.post_llc(link, msg.reject(), out)  # v1 02 2C 01 C0, v2 22 2C 00 C0
            return
        port = self._alt_port(link, msg.sender_gid)
        new_type = LgrType.SYMMETRIC
        if self._same_path(link, msg):
            if port is None:  # the same path twice: no alternate path
                self.llc.post_llc(link, msg.reject(), out)
                return
            new_type = LgrType.ASYMMETRIC_PEER
        if port is None:
            port, new_type = link.port, LgrType.ASYMMETRIC_LOCAL
            if not self._reaches(port, msg.sender_gid):
                # no port of ours reaches the offered one: no alternate path
                # (SMC_LLC_REJ_RSN_NO_ALT_PATH, the reject's reason)
                self.llc.post_llc(link, msg.reject(), out)
                return
        if not self._may_add(lgr, new_type) or lgr.link_by_id(msg.link_num) is not None:
            self.llc.post_llc(link, msg.reject(), out)
            return
        new = self.llc.new_link(lgr, port, msg.link_num)  # the server names the link
        new.peer_qpn, new.peer_psn = msg.sender_qp_num, msg.initial_psn
        new.peer_gid, new.peer_mac = msg.sender_gid, msg.sender_mac
        new.mtu = min(self.state.config.qp_mtu, msg.qp_mtu)
        out.append(new.qp_to_rtr())
        conns = self._map_rmbs(lgr, new)
        answer = llc_msgs.add_link(new, self.state.identity, response=True, via=link, conns=conns)
        self.llc.post_llc(link, answer, out)
        flow = AddLinkFlow(link, new, new_type, "cont", conns,
                           deadline=now + self.state.config.llc_wait, request=msg,
                           started=now)  # fmt: skip
        if isinstance(msg, AddLinkV2):  # smc_llc_save_add_link_rkeys, then CONFIRM LINK
            self._save_rkeys(flow, msg.ext.rkeys if msg.ext is not None else ())
            flow.step, flow.to_send = "confirm", []
            flow.deadline = now + self.state.config.llc_wait_confirm
        lgr.remote_add = flow

    def cli_fail(self, lgr: LinkGroup, now: float, out: list[Action],
                 delete_link: bool = False) -> None:  # fmt: skip
        """The client's ADD LINK flow failed after its answer (``out_clear_lnk``, then
        ``out_reject``): the new link cleared, the server's request rejected after all;
        ``delete_link``: the CONFIRM LINK never came, DELETE LINK for the new link first
        (``smc_llc_cli_conf_link``)."""
        flow = lgr.remote_add
        lgr.remote_add = None
        if flow is None or lgr.terminated:
            return
        usable = flow.link in lgr.links
        if delete_link and usable:
            request = llc_msgs.delete_link(lgr, 0, DeleteLinkReason.LOST_PATH, flow.new.link_id)
            self.llc.post_llc(flow.link, request, out)
        self.llc.clear_link(flow.new, out)
        if usable and isinstance(flow.request, AddLink | AddLinkV2):
            self.llc.post_llc(flow.link, flow.request.reject(), out)
        self.llc.next_flow(lgr, now, out)

    def _cli_add_link_cont(self, link: Link, msg: AddLinkCont, now: float,
                           out: list[Action]) -> None:  # fmt: skip
        flow = link.lgr.remote_add
        if (flow is None or flow.step != "cont" or link is not flow.link
                or msg.link_num != flow.new.link_id):  # fmt: skip
            self.llc.drop(link.qpn, "ADD LINK CONTINUATION fits no ADD LINK flow")
            return
        self._rkeys_received(flow, msg)
        self.llc.post_llc(link, llc_msgs.add_link_cont(link, flow.new, flow.to_send, True), out)
        flow.deadline = now + self.state.config.llc_wait
        if not flow.to_send and flow.recv_left <= 0:
            flow.step = "confirm"
            flow.deadline = now + self.state.config.llc_wait_confirm

    def cli_confirm_link(self, link: Link, msg: ConfirmLink, now: float,
                         out: list[Action]) -> bool:  # fmt: skip
        """``smc_llc_cli_conf_link``: the server's CONFIRM LINK on the new link; False if
        it is not for an ADD LINK flow."""
        flow = link.lgr.remote_add
        if flow is None or link is not flow.new:
            return False
        if flow.step != "confirm" or not msg.flags & LLC_FLAG_NO_RMBE_EYEC:
            raise LlcViolationError("CONFIRM LINK out of the ADD LINK flow")
        link.lgr.remote_add = None
        out.append(QpToRts(link.qpn, link.psn, **link.names))
        response = llc_msgs.confirm_link(link, self.state.identity, self.state.config,
                                         response=True)  # fmt: skip
        self.llc.post_llc(link, response, out)
        self._new_link_up(flow, now)
        self.llc.next_flow(link.lgr, now, out)  # our own flows waited for this one
        return True

    def cli_add_link_timeout(self, lgr: LinkGroup, now: float, out: list[Action]) -> None:
        """The server's flow stalled: the new link is cleared and the offer rejected; a
        missing CONFIRM LINK is reported with DELETE LINK first.  In the rkey exchange the
        server's next message comes over the old link, behind its data: the wait goes on
        while that link delivers (:meth:`LinkLayer.wait_more`, as the server's own,
        :meth:`LinkLayer.wait_on`)."""
        flow = lgr.remote_add
        if flow is None or now < flow.deadline:
            return
        if flow.step == "cont" and flow.link.state is LinkState.LINK_ACTIVE:
            deadline = self.llc.wait_more(flow.started, [flow.link], now)
            if deadline is not None:
                flow.deadline = deadline
                return
        self.cli_fail(lgr, now, out, delete_link=flow.step == "confirm")

    def cli_invite(self, lgr: LinkGroup, now: float, out: list[Action]) -> None:
        """Ask the server for a link over a port usable again, as a local flow
        (``smc_llc_cli_add_link_invite``): v1 an ADD LINK request naming only the
        port's MAC and GID, not waited for; v2 REQUEST ADD LINK with our GIDs
        (``smc_llc_send_request_add_link``), waited for until the server answers it
        or starts its ADD LINK."""

        def start(link: Link, t: float, actions: list[Action]) -> LlcMessage | None:
            port = self._alt_port(link)
            if port is None or lgr.lgr_type in (LgrType.SYMMETRIC, LgrType.ASYMMETRIC_PEER):
                return None
            ports = self.state.identity.ports
            if lgr.version >= 2:
                return RequestAddLinkV2(gids=(ports[link.port].gid, ports[port].gid))
            invitation = AddLink(sender_mac=ports[port].mac, sender_gid=ports[port].gid)
            self.llc.post_llc(link, invitation, actions)
            return None

        stub = llc_msgs.add_link_local(lgr)
        lgr.flow_queue.append(LocalFlow(stub, lambda ok, t: [], start=start))
        self.llc.next_flow(lgr, now, out)

    # -- the asymmetric link, replaced --------------------------------------------

    def _find_asym_link(self, lgr: LinkGroup) -> Link | None:
        """``smc_llc_find_asym_link``: of two links over the same port of ours, the one
        whose peer port another link reaches too."""
        usable = [x for x in lgr.links if x.state is not LinkState.LINK_INACTIVE]
        for n, a in enumerate(usable):
            for b in usable[n + 1:]:
                if a.port != b.port:
                    continue
                for k in usable:
                    if k is not a and k.peer_gid == a.peer_gid:
                        return a
                    if k is not b and k.peer_gid == b.peer_gid:
                        return b
                return None
        return None

    def _delete_asym_link(self, lgr: LinkGroup, now: float, out: list[Action]) -> None:
        """A link was added as server: ``smc_llc_delete_asym_link``, once symmetric the
        asymmetric link goes: its connections move, DELETE LINK (orderly, "no longer
        needed") is asked of the client next, and the link is cleared when it answers
        (or does not).

        An asymmetric link of ours (``ASYMMETRIC_LOCAL``) added while another port of
        ours came back: that port's offer (:meth:`Ports.port_up
        <smcr.core.ports.Ports.port_up>`) was dropped, one ADD LINK flow at a time, as
        Linux drops it; the symmetric link is offered now instead of never (Linux has
        that race; over RoCE a veth up again mid-flow met it)."""
        if lgr.lgr_type is LgrType.ASYMMETRIC_LOCAL:
            link = lgr.active_link
            if link is not None and self._alt_port(link) is not None:
                self.srv_add_link(lgr, now, out)
            return
        if lgr.lgr_type is not LgrType.SYMMETRIC:
            return
        asym = self._find_asym_link(lgr)
        if asym is None or asym.state is not LinkState.LINK_ACTIVE:
            return
        asym.state = LinkState.LINK_INACTIVE
        if self.llc.switch_conns(asym, out) is None:
            return
        request = llc_msgs.delete_link(lgr, LLC_FLAG_DEL_LINK_ORDERLY,
                                       DeleteLinkReason.NO_ASYM_NEEDED, asym.link_id)  # fmt: skip

        def done(ok: bool, t: float) -> list[Action]:
            actions: list[Action] = []
            if not lgr.terminated:
                self.llc.link_gone(asym, actions, "asymmetric link no longer needed")
            return actions

        lgr.flow_queue.appendleft(LocalFlow(request, done))  # the next flow, as Linux's
        self.llc.next_flow(lgr, now, out)  # ADD LINK flow turns into this DELETE LINK

    # -- handlers ------------------------------------------------------------------

    def receive_add_link(self, link: Link, msg: LlcMessage, now: float,
                         out: list[Action]) -> None:  # fmt: skip
        """An ADD LINK request: the server's offer (client), the client's invitation
        (server: it starts its own flow)."""
        assert isinstance(msg, AddLink | AddLinkV2)
        lgr = link.lgr
        if lgr.role is Role.CLIENT:
            self._cli_add_link(link, msg, now, out)
        else:
            self.srv_add_link(lgr, now, out, msg, link)

    def receive_add_link_response(self, link: Link, msg: LlcMessage, now: float,
                                  out: list[Action]) -> None:  # fmt: skip
        """The client's answer to the server's ADD LINK."""
        assert isinstance(msg, AddLink | AddLinkV2)
        if link.lgr.role is Role.SERVER:
            self._srv_add_link_response(link, msg, now, out)
        else:
            self.llc.drop(link.qpn, "ADD LINK response without a request")

    def receive_req_add_link(self, link: Link, msg: LlcMessage, now: float,
                             out: list[Action]) -> None:  # fmt: skip
        """REQUEST ADD LINK v2: a server starts its ADD LINK flow (answering the request
        only if it adds no link)."""
        assert isinstance(msg, RequestAddLinkV2)
        lgr = link.lgr
        if lgr.role is not Role.SERVER:
            self.llc.drop(link.qpn, "REQUEST ADD LINK not for us")
        elif lgr.flow is not None:  # smc_llc_flow_parallel drops it, unanswered
            if lgr.flow.adds_link:  # but it is remembered, as an invitation would be
                lgr.add_asked = True
            self.llc.drop(link.qpn, "REQUEST ADD LINK parallel to a running flow of ours")
        else:
            self.srv_add_link(lgr, now, out, msg, link)

    def receive_req_add_link_response(self, link: Link, msg: LlcMessage, now: float,
                                      out: list[Action]) -> None:  # fmt: skip
        """The server's answer to a client's REQUEST ADD LINK: its flow ends."""
        assert isinstance(msg, RequestAddLinkV2)
        lgr = link.lgr
        if (lgr.role is Role.CLIENT and lgr.flow is not None
                and isinstance(lgr.flow.request, RequestAddLinkV2)):  # fmt: skip
            self.llc.flow_response(lgr, msg, True, now, out)
        else:
            self.llc.drop(link.qpn, "REQUEST ADD LINK not for us")

    def receive_add_link_cont(self, link: Link, msg: LlcMessage, now: float,
                              out: list[Action]) -> None:  # fmt: skip
        """ADD LINK CONTINUATION (v1): the rkey exchange of a running ADD LINK flow."""
        assert isinstance(msg, AddLinkCont)
        if link.lgr.role is Role.SERVER:
            self._srv_add_link_cont(link, msg, now, out)
        else:
            self._cli_add_link_cont(link, msg, now, out)
