"""DELETE LINK of one link of several, and the failover it needs (Linux ``smc_core.c``
``smcr_link_down`` / ``smc_switch_conns``, ``smc_llc.c`` ``smc_llc_process_cli_delete_link``
/ ``smc_llc_process_srv_delete_link``).

A group with a second active link survives the loss of one: the connections
on the lost link move to a surviving one (``smc_switch_conns``: the
connection's link reference is switched, then
:meth:`~smcr.core.connection.Connection.switch_cursor` re-sends from the last
completed CDC after a failover-validation CDC), the peer is told by DELETE LINK
(reason lost path, orderly) and the link is cleared.

* Local failure (:meth:`FailoverLayer.link_failed`): as server, a DELETE LINK
  request over the surviving link as a local flow, answered by the client; as
  client, a DELETE LINK request to the server, which echoes it (the client
  answers the echo: link not found, it is gone already).
* The peer's DELETE LINK of one link: a client answers (reason 0, or "no such
  link") on the link it came on, switches and clears; a server echoes the
  request as a local flow and clears the link.

A group with one link keeps today's behaviour: its loss, or the peer's DELETE
LINK of it, ends the group.  A server whose group is down to one link offers a
link again at once (``smc_llc_process_srv_delete_link`` -> ``smc_llc_add_link_local``:
over another usable port, else an asymmetric one over the same), and once a
symmetric link is added it deletes the asymmetric one (``smc_llc_delete_asym_link``,
reason "asymmetric link no longer needed").

A local failure moves connections only to a link over another port: Linux's
``smcr_link_down`` calls ``smc_switch_conns`` as a device error, which skips links of
the same device and port, so an ``ASYMMETRIC_LOCAL`` group ends with its port.
"""

from __future__ import annotations

from smcr.core import llc_msgs
from smcr.core.addlink import AddLinkLayer
from smcr.core.events import Action, ConnectionReset, LinkRemoved
from smcr.core.linkgroup import LgrType, Link, LinkGroup, LinkState, LocalFlow, Role
from smcr.wire.decline import DeclineCode
from smcr.wire.llc import (
    LLC_FLAG_DEL_LINK_ORDERLY,
    DeleteLink,
    DeleteLinkReason,
    LlcMessage,
)


class FailoverLayer(AddLinkLayer):
    """:class:`AddLinkLayer` with DELETE LINK of one link and failover (module docstring)."""

    def _other_active(self, link: Link, dev_err: bool = False) -> Link | None:
        """Another active link of the group; with ``dev_err`` not one over the same port
        (``smc_switch_conns``' ``is_dev_err``)."""
        for other in link.lgr.links:
            if (other is not link and other.state is LinkState.LINK_ACTIVE
                    and not (dev_err and other.port == link.port)):  # fmt: skip
                return other
        return None

    def _switch_conns(self, from_link: Link, out: list[Action],
                      dev_err: bool = False) -> Link | None:  # fmt: skip
        """``smc_switch_conns``: move every connection of ``from_link`` to another active
        link of its group; that link, or None if there is none."""
        to = self._other_active(from_link, dev_err)
        if to is None:
            return None
        old = self._cdc_pending.get(from_link.qpn, ())
        for conn in list(from_link.lgr.conns.values()):
            if conn.link is not from_link:
                continue
            # CDCs complete in order and each one sent counted one sequence number: the
            # last completed one is the current one less those still pending
            unfinished = sum(1 for entry in old if entry[1] is conn)
            seq_fin = (conn.seq - unfinished) & 0xFFFF
            self.touched.add(conn.id)
            if to not in conn.peer_rtoken:  # the peer never gave this RMB's rkey for it
                reason = "failover: no rkey of the peer's RMB on the other link"
                conn.link_down(reason, out)
                self._events.append(ConnectionReset(conn=conn.id, reason=reason))
                continue
            self._use_link(conn, to)
            conn.switch_cursor(seq_fin, out)
        return to

    def _link_gone(self, link: Link, out: list[Action], reason: str = "") -> None:
        """``smcr_link_clear`` of a link that was up, and the group's new type."""
        lgr = link.lgr
        self._clear_link(link, out)
        if sum(1 for x in lgr.links if x.state is LinkState.LINK_ACTIVE) == 1:
            lgr.lgr_type = LgrType.SINGLE
        self._events.append(LinkRemoved(lgr_id=lgr.lgr_id, link_id=link.link_id,
                                        port=link.port, reason=reason))  # fmt: skip

    def _delete_link_flow(self, lgr: LinkGroup, request: DeleteLink, now: float,
                          out: list[Action]) -> None:  # fmt: skip
        """A server's DELETE LINK request to the client, waited for as a local flow; a
        group left with one link then offers a link again (``smc_llc_add_link_local``
        at the end of ``smc_llc_process_srv_delete_link``)."""

        def done(ok: bool, t: float) -> list[Action]:
            actions: list[Action] = []
            if not lgr.terminated and lgr.lgr_type is LgrType.SINGLE:
                self._srv_add_link(lgr, t, actions)
            return actions

        self._start_flow(lgr, request, done, now, out)

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

    def _after_add(self, lgr: LinkGroup, now: float, out: list[Action]) -> None:
        """``smc_llc_delete_asym_link``: once symmetric, the asymmetric link goes: its
        connections move, DELETE LINK (orderly, "no longer needed") is asked of the
        client next, and the link is cleared when it answers (or does not).

        An asymmetric link of ours (``ASYMMETRIC_LOCAL``) added while another port of
        ours came back: that port's offer (:meth:`port_up`) was dropped, one ADD LINK
        flow at a time, as Linux drops it; the symmetric link is offered now instead of
        never (Linux has that race; over RoCE a veth up again mid-flow met it)."""
        if lgr.lgr_type is LgrType.ASYMMETRIC_LOCAL:
            link = lgr.active_link
            if link is not None and self._alt_port(link) is not None:
                self._srv_add_link(lgr, now, out)
            return
        if lgr.lgr_type is not LgrType.SYMMETRIC:
            return
        asym = self._find_asym_link(lgr)
        if asym is None or asym.state is not LinkState.LINK_ACTIVE:
            return
        asym.state = LinkState.LINK_INACTIVE
        if self._switch_conns(asym, out) is None:
            return
        request = llc_msgs.delete_link(lgr, LLC_FLAG_DEL_LINK_ORDERLY,
                                       DeleteLinkReason.NO_ASYM_NEEDED, asym.link_id)  # fmt: skip

        def done(ok: bool, t: float) -> list[Action]:
            actions: list[Action] = []
            if not lgr.terminated:
                self._link_gone(asym, actions, "asymmetric link no longer needed")
            return actions

        lgr.flow_queue.appendleft(LocalFlow(request, done))  # the next flow, as Linux's
        self._next_flow(lgr, now, out)  # ADD LINK flow turns into this DELETE LINK

    # -- local failure ------------------------------------------------------------

    def link_failed(self, qpn: int, reason: str, now: float,
                    decline: DeclineCode = DeclineCode.NOACTLINK,
                    peer_gone: bool = False) -> list[Action]:  # fmt: skip
        """A link's QP went to ERR: with another active link in its group, its connections
        move there and the peer is told (``smcr_link_down``); else the group ends
        (``peer_gone``: as :meth:`LinkLayer.link_failed`)."""
        link = self.links.get(qpn)
        out: list[Action] = []
        if (link is not None and link.state is LinkState.LINK_ACTIVATING
                and not link.lgr.terminated and link.lgr.active_link is not None):  # fmt: skip
            # the new link of an ADD LINK flow: that flow fails, the group goes on (Linux
            # downs only active links; the flow's wait fails and clears it)
            self._add_link_failed(link, now, out)
            return out
        if (link is not None and link.state is LinkState.LINK_INACTIVE
                and not link.lgr.terminated and link.lgr.active_link is not None):  # fmt: skip
            # a link being deleted (the asymmetric one, its connections moved, our DELETE
            # LINK out): the client may answer and destroy its QP before we read the
            # answer, and our QP sees the peer go.  Linux's smcr_link_down_cond downs only
            # an active link; the DELETE LINK flow's end clears it
            return out
        if (link is None or link.lgr.terminated or link.state is not LinkState.LINK_ACTIVE
                or self._other_active(link, dev_err=True) is None):  # fmt: skip
            return super().link_failed(qpn, reason, now, decline, peer_gone)
        lgr = link.lgr
        link.state = LinkState.LINK_INACTIVE
        to = self._switch_conns(link, out, dev_err=True)
        assert to is not None
        self._link_gone(link, out, reason)
        request = llc_msgs.delete_link(lgr, LLC_FLAG_DEL_LINK_ORDERLY,
                                       DeleteLinkReason.LOST_PATH, link.link_id)  # fmt: skip
        if lgr.role is Role.SERVER:  # smc_llc_srv_delete_link_local
            self._delete_link_flow(lgr, request, now, out)
        elif lgr.flow is None and lgr.remote_add is None:
            self._post_llc(to, request, out)
        else:  # smcr_link_down: a client's DELETE LINK waits for its running flow to end

            def start(via: Link, t: float, actions: list[Action]) -> None:
                self._post_llc(via, request, actions)  # not waited for: the server echoes it

            lgr.flow_queue.appendleft(LocalFlow(request, lambda ok, t: [], start=start))
        return out

    def _add_link_failed(self, new: Link, now: float, out: list[Action]) -> None:
        """The new link of a running ADD LINK flow failed: the flow fails."""
        lgr = new.lgr
        flow = self._srv_flow(lgr)
        if flow is not None and flow.new is new:
            self._srv_end_flow(lgr, False, now, out)
        elif lgr.remote_add is not None and lgr.remote_add.new is new:
            self._cli_fail(lgr, now, out, delete_link=lgr.remote_add.step == "confirm")

    # -- the peer's DELETE LINK -----------------------------------------------------

    def _delete_during_add(self, link: Link, msg: DeleteLink, now: float,
                           out: list[Action]) -> bool:  # fmt: skip
        """A DELETE LINK request while our ADD LINK flow waits (Linux hands it to the
        waiting flow): the flow fails.  Whether the request is dealt with."""
        lgr = link.lgr
        if lgr.role is Role.CLIENT and lgr.remote_add is not None:
            if lgr.remote_add.step == "confirm":  # smc_llc_cli_conf_link: echoed as answer
                self._post_llc(link, msg.response(msg.reason), out)
            else:  # smc_llc_wait for a CONTINUATION drops it
                self._drop(link.qpn, "DELETE LINK during the ADD LINK rkey exchange")
            self._cli_fail(lgr, now, out)
            return True
        flow = self._srv_flow(lgr) if lgr.role is Role.SERVER else None
        if flow is None:
            return False
        self._srv_end_flow(lgr, False, now, out)
        if flow.step == "response":  # delayed until the flow ended (smc_llc_wait), then
            return False  # handled as any other
        self._drop(link.qpn, "DELETE LINK during the ADD LINK flow")
        return True

    def _llc_delete_link(self, link: Link, msg: LlcMessage, now: float,
                         out: list[Action]) -> None:  # fmt: skip
        assert isinstance(msg, DeleteLink)
        lgr = link.lgr
        if msg.is_response:
            flow = lgr.flow
            if flow is not None and flow.request.TYPE == msg.TYPE:
                self._flow_response(lgr, msg, True, now, out)
            return
        if not msg.is_all and (self._delete_during_add(link, msg, now, out)
                               or self._delay(link, msg)):  # fmt: skip
            return
        if msg.is_all or len(lgr.links) < 2:
            super()._llc_delete_link(link, msg, now, out)  # one link: the group ends
            return
        gone = lgr.link_by_id(msg.link_num)
        if lgr.role is Role.CLIENT:  # smc_llc_process_cli_delete_link
            ok = gone is not None
            self._post_llc(link, msg.response(DeleteLinkReason.OK if ok else
                                              DeleteLinkReason.NOLNK), out)  # fmt: skip
            if gone is not None:
                self._peer_deleted(gone, "peer deleted our last link", out)
            return
        # smc_llc_process_srv_delete_link: the client's request, sent back to it
        if gone is None:
            return  # already deleted
        if self._peer_deleted(gone, "client deleted our last link", out):
            self._delete_link_flow(lgr, msg, now, out)

    def _peer_deleted(self, gone: Link, last: str, out: list[Action]) -> bool:
        """The peer deleted ``gone``: an active link's connections move to another link,
        and the link goes; with no other link the group ends (``last``: why).  Whether
        the group lives on."""
        if gone.state is LinkState.LINK_ACTIVE:
            gone.state = LinkState.LINK_INACTIVE
            if self._switch_conns(gone, out) is None:
                self._terminate(gone.lgr, last, out)
                return False
        self._link_gone(gone, out, "the peer's DELETE LINK")
        return True

