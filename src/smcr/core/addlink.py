"""ADD LINK, SMC-Rv1: a second link in a link group, both roles (Linux ``smc_llc.c``).

The server drives it right after first contact (Linux ``smcr_serv_conf_first_link``
calls ``smc_llc_srv_add_link``), as a local LLC flow of the group, over the
link it has:

1. S->C ADD LINK request: the new QP (made on another of our ports, or on the
   same one when we have one: ``ASYMMETRIC_LOCAL``), its id, MTU and PSN.
2. The client decides as ``smc_llc_cli_add_link``: it rejects when the offer
   comes from the port it already talks to and it has no other port itself;
   else it makes its QP (on another port, or on its only one:
   ``ASYMMETRIC_LOCAL``), brings it to RTR and answers ADD LINK with its QP.
3. The server brings its QP to RTR and RTS; if the answer names the port the
   first link already reaches, the group is ``ASYMMETRIC_PEER`` to it.
4. ADD LINK CONTINUATION ping-pong on the old link, server first, until both
   have sent the rkeys of all their RMBs for the new link
   (``smc_llc_srv_rkey_exchange`` / ``smc_llc_cli_rkey_exchange``); each pair
   names the RMB by its rkey on the old link.
5. S->C CONFIRM LINK on the *new* link; the client's QP goes to RTS and it
   answers on the new link.  Both sides' new link is active, the group
   ``SYMMETRIC`` or asymmetric.

A server whose flow fails (reject, no answer in ``llc_wait``) clears the new
link (its QP destroyed); after a CONFIRM LINK unanswered it also sends DELETE
LINK for it (``SMC_LLC_DEL_LOST_PATH``), as ``smc_llc_srv_conf_link``.  A
client whose flow stalls clears its new link at its own deadline.

Which of our ports pairs with the peer's (Linux: PNET ID, else subnet) is not
decided here yet: the alternate port is the first one other than the old
link's.  SMC-Rv2 groups (ADD LINK v2, rkeys in the message) keep today's
single link: no offer, every offer rejected.
"""

from __future__ import annotations

from smcr.core import llc_msgs
from smcr.core.events import Action, DestroyQp, QpToRtr, QpToRts
from smcr.core.linkgroup import (
    AddLinkFlow,
    LgrType,
    Link,
    LinkGroup,
    LinkState,
    LocalFlow,
    Role,
)
from smcr.core.llc import LinkLayer, LlcHandler, LlcViolationError
from smcr.wire.llc import (
    LLC_FLAG_NO_RMBE_EYEC,
    AddLink,
    AddLinkCont,
    AddLinkV2,
    ConfirmLink,
    DeleteLinkReason,
    LlcMessage,
    LlcType,
)

_ASYMMETRIC = (LgrType.ASYMMETRIC_LOCAL, LgrType.ASYMMETRIC_PEER)


LATE_LINKS = 64
"""Cleared links remembered for their late CDCs (:meth:`LinkLayer._receive_late`)."""


class AddLinkLayer(LinkLayer):
    """:class:`LinkLayer` with the ADD LINK flows (module docstring)."""

    ports_down: set[int]

    def _llc_table(self) -> dict[int, LlcHandler]:
        table = super()._llc_table()
        table[LlcType.ADD_LINK_CONT] = self._llc_add_link_cont
        return table

    def _new_link(self, lgr: LinkGroup, port: int, link_id: int) -> Link:
        raise NotImplementedError  # the engine's: a QP from the provider

    # -- helpers ---------------------------------------------------------------

    def _alt_port(self, link: Link) -> int | None:
        """Another of our ports than ``link``'s (Linux ``smc_pnet_find_alt_roce``)."""
        for i in range(len(self.identity.ports)):
            if i != link.port and i not in self.ports_down:
                return i
        return None

    def port_state(self, port: int, up: bool, now: float) -> list[Action]:
        """The host's news that one of its ports (RNICs) went down or came back (Linux
        ``smcr_port_err`` / ``smcr_port_add``).  Down: no new link is made over it
        (the host fails its links, :meth:`link_failed`).  Up: each group down to one
        link gets a link again: a server offers it (``smc_llc_srv_add_link``), a client
        invites its server to (``smc_llc_add_link_local``: an ADD LINK request with
        only the port's MAC and GID)."""
        out: list[Action] = []
        if not up:
            self.ports_down.add(port)
            return out
        self.ports_down.discard(port)
        for lgr in list(self.lgrs.values()):
            link = lgr.active_link
            if lgr.terminated or lgr.lgr_type is not LgrType.SINGLE or link is None:
                continue
            if lgr.role is Role.SERVER:
                self._srv_add_link(lgr, now, out)
            elif self.config.add_links and lgr.version < 2 and port != link.port:
                self._post_llc(link, llc_msgs.add_link_invitation(self.identity.ports[port]),
                               out)  # fmt: skip
        return out

    def _may_add(self, lgr: LinkGroup, new_type: LgrType) -> bool:
        """``smc_llc_alloc_alt_link``: a symmetric group is full, an asymmetric one takes
        no second asymmetric link; never more links than we advertise."""
        if lgr.lgr_type is LgrType.SYMMETRIC:
            return False
        if lgr.lgr_type is not LgrType.SINGLE and new_type in _ASYMMETRIC:
            return False
        usable = [x for x in lgr.links if x.state is not LinkState.LINK_INACTIVE]
        return len(usable) < self.config.max_links

    def _clear_link(self, new: Link, out: list[Action]) -> None:
        """Forget a link that never became active (``smcr_link_clear``): its QP destroyed,
        its rkeys dropped from the connections and the peer RMBs."""
        lgr = new.lgr
        new.state = LinkState.LINK_INACTIVE
        if new in lgr.links:
            lgr.links.remove(new)
        if self.links.pop(new.qpn, None) is not None and not lgr.terminated:
            self.late_links[new.qpn] = new
            while len(self.late_links) > LATE_LINKS:
                del self.late_links[next(iter(self.late_links))]
        self._cdc_pending.pop(new.qpn, None)
        for conn in lgr.conns.values():
            conn.rmb_keys.pop(new, None)
        for rt in lgr.peer_rtokens:
            rt.pop(new, None)
        out.append(DestroyQp(new.qpn, **new.names))

    def _new_link_up(self, flow: AddLinkFlow, now: float) -> None:
        """``smc_llc_link_active`` and ``smcr_lgr_set_type[_asym]``."""
        flow.new.state = LinkState.LINK_ACTIVE
        flow.new.last_rx = now
        flow.link.lgr.lgr_type = flow.new_type

    def _rkeys_received(self, flow: AddLinkFlow, msg: AddLinkCont) -> None:
        """``smc_rtoken_set``: each pair's RMB, known by its rkey on the old link, gets
        its rkey and vaddr on the new one."""
        lgr = flow.link.lgr
        for pair in msg.rkeys:
            rt = lgr.rtoken_find(flow.link, pair.rmb_key)
            if rt is not None:
                rt[flow.new] = (pair.rmb_key_new, pair.rmb_vaddr_new)
        flow.recv_left = msg.num_rkeys - len(msg.rkeys)

    # -- server ------------------------------------------------------------------

    def _srv_add_link(self, lgr: LinkGroup, now: float, out: list[Action]) -> None:
        """Offer a second link after first contact (``smc_llc_srv_add_link``)."""
        link = lgr.active_link
        if not self.config.add_links or lgr.version >= 2 or link is None:
            return
        port = self._alt_port(link)
        new_type = LgrType.SYMMETRIC
        if port is None:
            port, new_type = link.port, LgrType.ASYMMETRIC_LOCAL
        if not self._may_add(lgr, new_type):
            return
        new = self._new_link(lgr, port, lgr.new_link_id())
        new.mtu = self.config.qp_mtu
        for conn in lgr.conns.values():  # smcr_buf_map_lgr
            self._rmb_on(conn, new)
        flow = AddLinkFlow(link, new, new_type, "response", [])

        def done(ok: bool, t: float) -> list[Action]:
            actions: list[Action] = []
            if not ok and new.state is not LinkState.LINK_ACTIVE and not lgr.terminated:
                if flow.step == "confirm":  # smc_llc_srv_conf_link: DELETE LINK, lost path
                    request = llc_msgs.delete_link(lgr, 0, DeleteLinkReason.LOST_PATH,
                                                   new.link_id)  # fmt: skip
                    self._post_llc(link, request, actions)
                self._clear_link(new, actions)
            return actions

        request = llc_msgs.add_link(new, self.identity)
        lgr.flow_queue.append(LocalFlow(request, done, add_link=flow))
        self._next_flow(lgr, now, out)

    def _srv_flow(self, lgr: LinkGroup, step: str) -> AddLinkFlow | None:
        running = lgr.flow
        if running is None or running.add_link is None or running.add_link.step != step:
            return None
        return running.add_link

    def _srv_end_flow(self, lgr: LinkGroup, ok: bool, now: float, out: list[Action]) -> None:
        flow = lgr.flow
        assert flow is not None
        lgr.flow = None
        self._finish_flow(flow, ok, now, out)
        self._next_flow(lgr, now, out)

    def _srv_add_link_response(self, link: Link, msg: AddLink, now: float,
                               out: list[Action]) -> None:  # fmt: skip
        lgr = link.lgr
        flow = self._srv_flow(lgr, "response")
        if flow is None or link is not flow.link:
            self._drop(link.qpn, "ADD LINK response without a request")
            return
        if msg.is_rejected:
            self._srv_end_flow(lgr, False, now, out)
            return
        if (lgr.lgr_type is LgrType.SINGLE and msg.sender_gid == link.peer_gid
                and msg.sender_mac == link.peer_mac):  # fmt: skip
            flow.new_type = LgrType.ASYMMETRIC_PEER
        new = flow.new
        # smc_llc_save_add_link_info, smc_ib_ready_link (the server's QP goes to RTS)
        new.peer_qpn, new.peer_psn = msg.sender_qp_num, msg.initial_psn
        new.peer_gid, new.peer_mac = msg.sender_gid, msg.sender_mac
        new.mtu = min(new.mtu, msg.qp_mtu)
        out.append(QpToRtr(new.qpn, new.peer_gid, new.peer_qpn, new.peer_psn, new.mtu,
                           **new.names))  # fmt: skip
        out.append(QpToRts(new.qpn, new.psn, **new.names))
        flow.to_send = list(lgr.conns.values())
        flow.step = "cont"
        self._post_llc(link, llc_msgs.add_link_cont(link, new, flow.to_send, False), out)
        assert lgr.flow is not None
        lgr.flow.deadline = now + self.config.llc_wait

    def _srv_add_link_cont(self, link: Link, msg: AddLinkCont, now: float,
                           out: list[Action]) -> None:  # fmt: skip
        lgr = link.lgr
        flow = self._srv_flow(lgr, "cont")
        if flow is None or link is not flow.link or msg.link_num != flow.new.link_id:
            self._drop(link.qpn, "ADD LINK CONTINUATION fits no ADD LINK flow")
            return
        self._rkeys_received(flow, msg)
        assert lgr.flow is not None
        lgr.flow.deadline = now + self.config.llc_wait
        if flow.to_send or flow.recv_left > 0:
            self._post_llc(link, llc_msgs.add_link_cont(link, flow.new, flow.to_send, False),
                           out)  # fmt: skip
            return
        flow.step = "confirm"  # smc_llc_srv_conf_link: CONFIRM LINK over the new link
        self._post_llc(flow.new, llc_msgs.confirm_link(flow.new, self.identity, self.config),
                       out)  # fmt: skip

    def _srv_confirm_link_response(self, link: Link, msg: ConfirmLink, now: float,
                                   out: list[Action]) -> bool:  # fmt: skip
        """The CONFIRM LINK response of an ADD LINK flow; False if it is not one."""
        flow = self._srv_flow(link.lgr, "confirm")
        if flow is None or link is not flow.new:
            return False
        self._new_link_up(flow, now)
        self._srv_end_flow(link.lgr, True, now, out)
        return True

    # -- client ------------------------------------------------------------------

    def _cli_add_link(self, link: Link, msg: AddLink | AddLinkV2, now: float,
                      out: list[Action]) -> None:  # fmt: skip
        """``smc_llc_cli_add_link``: accept the server's offer or reject it."""
        lgr = link.lgr
        if isinstance(msg, AddLinkV2) or lgr.version >= 2:
            # a v2 reject is the request's first 44 bytes, the header rewritten
            self._post_llc(link, msg.reject(), out)
            return
        if not self.config.add_links or lgr.remote_add is not None or not msg.qp_mtu:
            self._post_llc(link, msg.reject(), out)  # no second RNIC: 02 2C 01 C0
            return
        port = self._alt_port(link)
        new_type = LgrType.SYMMETRIC
        if msg.sender_gid == link.peer_gid and msg.sender_mac == link.peer_mac:
            if port is None:  # the same path twice: no alternate path
                self._post_llc(link, msg.reject(), out)
                return
            new_type = LgrType.ASYMMETRIC_PEER
        if port is None:
            if any(i != link.port for i in self.ports_down):
                # our other port is down (the same cut, seen here later): no asymmetric
                # link now; our invitation, once that port is back, brings a symmetric one
                self._post_llc(link, msg.reject(), out)
                return
            port, new_type = link.port, LgrType.ASYMMETRIC_LOCAL
        if not self._may_add(lgr, new_type) or lgr.link_by_id(msg.link_num) is not None:
            self._post_llc(link, msg.reject(), out)
            return
        new = self._new_link(lgr, port, msg.link_num)  # the server names the link
        new.peer_qpn, new.peer_psn = msg.sender_qp_num, msg.initial_psn
        new.peer_gid, new.peer_mac = msg.sender_gid, msg.sender_mac
        new.mtu = min(self.config.qp_mtu, msg.qp_mtu)
        out.append(QpToRtr(new.qpn, new.peer_gid, new.peer_qpn, new.peer_psn, new.mtu,
                           **new.names))  # fmt: skip
        for conn in lgr.conns.values():  # smcr_buf_map_lgr
            self._rmb_on(conn, new)
        self._post_llc(link, llc_msgs.add_link(new, self.identity, response=True), out)
        lgr.remote_add = AddLinkFlow(link, new, new_type, "cont", list(lgr.conns.values()),
                                     deadline=now + self.config.llc_wait)  # fmt: skip

    def _cli_add_link_cont(self, link: Link, msg: AddLinkCont, now: float,
                           out: list[Action]) -> None:  # fmt: skip
        flow = link.lgr.remote_add
        if (flow is None or flow.step != "cont" or link is not flow.link
                or msg.link_num != flow.new.link_id):  # fmt: skip
            self._drop(link.qpn, "ADD LINK CONTINUATION fits no ADD LINK flow")
            return
        self._rkeys_received(flow, msg)
        self._post_llc(link, llc_msgs.add_link_cont(link, flow.new, flow.to_send, True), out)
        flow.deadline = now + self.config.llc_wait
        if not flow.to_send and flow.recv_left <= 0:
            flow.step = "confirm"

    def _cli_confirm_link(self, link: Link, msg: ConfirmLink, now: float,
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
        self._post_llc(link, llc_msgs.confirm_link(link, self.identity, self.config,
                                                   response=True), out)  # fmt: skip
        self._new_link_up(flow, now)
        self._next_flow(link.lgr, now, out)  # our own flows waited for this one
        return True

    def _cli_add_link_timeout(self, lgr: LinkGroup, now: float, out: list[Action]) -> None:
        """The server's flow stalled: the new link is cleared (``out_clear_lnk``)."""
        flow = lgr.remote_add
        if flow is not None and now >= flow.deadline:
            lgr.remote_add = None
            if not lgr.terminated:
                self._clear_link(flow.new, out)
                self._next_flow(lgr, now, out)

    # -- handlers ------------------------------------------------------------------

    def _llc_add_link(self, link: Link, msg: LlcMessage, now: float, out: list[Action]) -> None:
        assert isinstance(msg, AddLink | AddLinkV2)
        if msg.is_response:
            if isinstance(msg, AddLinkV2) or link.lgr.role is not Role.SERVER:
                self._drop(link.qpn, "ADD LINK response without a request")
            else:
                self._srv_add_link_response(link, msg, now, out)
        elif link.lgr.role is Role.CLIENT:
            self._cli_add_link(link, msg, now, out)
        elif (link.lgr.lgr_type is LgrType.SINGLE and not link.lgr.terminated
              and not any(i != link.port for i in self.ports_down)):  # fmt: skip
            # a client's invitation (it has an RNIC back): the server's ADD LINK flow; not
            # while another port of ours is down (the same cut, seen here later): an offer
            # now would be asymmetric, the one when that port is back is symmetric
            self._srv_add_link(link.lgr, now, out)

    def _llc_add_link_cont(self, link: Link, msg: LlcMessage, now: float,
                           out: list[Action]) -> None:  # fmt: skip
        assert isinstance(msg, AddLinkCont)
        if link.lgr.role is Role.SERVER:
            self._srv_add_link_cont(link, msg, now, out)
        else:
            self._cli_add_link_cont(link, msg, now, out)

    def _llc_confirm_link(self, link: Link, msg: LlcMessage, now: float,
                          out: list[Action]) -> None:  # fmt: skip
        assert isinstance(msg, ConfirmLink)
        lgr = link.lgr
        if msg.is_response and lgr.role is Role.SERVER:
            if self._srv_confirm_link_response(link, msg, now, out):
                return
            first = self._handshake_on(link)
            super()._llc_confirm_link(link, msg, now, out)
            if first is not None and link.state is LinkState.LINK_ACTIVE:
                self._srv_add_link(lgr, now, out)  # smcr_serv_conf_first_link
            return
        if (not msg.is_response and lgr.role is Role.CLIENT
                and self._cli_confirm_link(link, msg, now, out)):  # fmt: skip
            return
        super()._llc_confirm_link(link, msg, now, out)
