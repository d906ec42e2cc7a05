"""DELETE LINK, and the failover of one link of several (Linux ``smc_core.c``
``smcr_link_down`` / ``smc_switch_conns``, ``smc_llc.c`` ``smc_llc_process_cli_delete_link``
/ ``smc_llc_process_srv_delete_link``).

A group with a second active link survives the loss of one: the connections
on the lost link move to a surviving one (``smc_switch_conns``: the
connection's link reference is switched, then
:meth:`~smcr.core.connection.Connection.switch_cursor` re-sends from the last
completed CDC after a failover-validation CDC), the peer is told by DELETE LINK
(reason lost path, orderly) and the link is cleared.

* Local failure (:meth:`Failover.link_failed`): as server, a DELETE LINK
  request over the surviving link as a local flow, answered by the client; as
  client, a DELETE LINK request to the server, which echoes it (the client
  answers the echo: link not found, it is gone already).  The connections move
  only once the peer has heard (:meth:`Failover.move_off`: the server's flow
  ended, the client got the echo, or :attr:`~smcr.core.config.Config.llc_wait`
  passed); Linux moves them first and then sends the DELETE LINK.  Why: a CDC
  of ours over the new link makes a Linux peer that has not switched yet
  answer over the failed link, where the answer is lost, and its own switch
  later re-sends nothing when it has no data of its own to send
  (``smc_tx_sndbuf_nonempty`` returns early in the 6.12 kernel of the interop
  guests): a consumer cursor lost that way is never sent again, and a sender
  that had filled the peer's RMBE waits for ever (seen live).  Until they move,
  what the connections send goes to the failed link and is lost, as what went
  before the failure was seen, and
  :meth:`~smcr.core.connection.Connection.switch_cursor` sends it again.
* The peer's DELETE LINK of one link: a client answers (reason 0, or "no such
  link") on the link it came on, switches and clears; a server echoes the
  request as a local flow and clears the link.

A group with one link ends with its loss, or with the peer's DELETE LINK of it, and
with DELETE LINK ALL.  A server whose group is down to one link offers a link again
at once (``smc_llc_process_srv_delete_link`` -> ``smc_llc_add_link_local``: over
another usable port, else an asymmetric one over the same); once a symmetric link
is added it deletes the asymmetric one (:mod:`smcr.core.addlink`).

A local failure moves connections only to a link over another port: Linux's
``smcr_link_down`` calls ``smc_switch_conns`` as a device error, which skips links of
the same device and port, so an ``ASYMMETRIC_LOCAL`` group ends with its port.
"""

from __future__ import annotations

from smcr.core import llc_msgs
from smcr.core.addlink import AddLinkFlows
from smcr.core.events import Action
from smcr.core.linkgroup import LgrType, Link, LinkGroup, LinkState, LocalFlow, Role
from smcr.core.llc import LinkLayer
from smcr.core.state import EngineState
from smcr.wire.decline import DeclineCode
from smcr.wire.llc import (
    LLC_FLAG_DEL_LINK_ALL,
    LLC_FLAG_DEL_LINK_ORDERLY,
    DeleteLink,
    DeleteLinkReason,
    LlcMessage,
)


class Failover:
    """DELETE LINK and failover (module docstring): a part of the engine, over its
    shared state, link layer and ADD LINK part (whose flows a DELETE LINK ends)."""

    def __init__(self, state: EngineState, llc: LinkLayer, addlink: AddLinkFlows) -> None:
        self.state = state
        self.llc = llc
        self.addlink = addlink

    def _delete_link_flow(self, lgr: LinkGroup, request: DeleteLink, now: float,
                          out: list[Action], failed: Link | None = None) -> None:  # fmt: skip
        """A server's DELETE LINK request to the client, waited for as a local flow; a
        group left with one link then offers a link again (``smc_llc_add_link_local``
        at the end of ``smc_llc_process_srv_delete_link``).  ``failed``: our link that
        failed, whose connections move once the flow ends (:meth:`move_off`)."""

        def done(ok: bool, t: float) -> list[Action]:
            actions: list[Action] = []
            if failed is not None:
                self.move_off(failed, t, actions)
            if not lgr.terminated and lgr.lgr_type is LgrType.SINGLE:
                self.addlink.srv_add_link(lgr, t, actions)
            return actions

        # (a failed link's before any other queued: its connections wait for it)
        self.llc.start_flow(lgr, request, done, now, out, first=failed is not None)

    # -- local failure ------------------------------------------------------------

    def link_failed(self, qpn: int, reason: str, now: float,
                    decline: DeclineCode = DeclineCode.NOACTLINK,
                    peer_gone: bool = False) -> list[Action]:  # fmt: skip
        """A link's QP went to ERR (peer gone, flush): with another active link in its
        group, its connections move there and the peer is told (``smcr_link_down``);
        else the group ends.

        :param decline: the code of the Declines its unfinished handshakes get:
            ``ERR_RDYLNK`` when the host could not bring the QP up (Linux
            ``smc_ib_ready_link`` failing), else ``NOACTLINK``.
        :param peer_gone: the RNIC saw the peer's process end, having delivered all
            it posted (:attr:`smcr.rdma.base.QueuePair.peer_gone`); see
            :meth:`Connection.link_down <smcr.core.connection.Connection.link_down>`.
        """
        link = self.state.links.get(qpn)
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
        if link is None or link.lgr.terminated:
            return out
        to = self.llc.other_active(link, True)
        if link.state is not LinkState.LINK_ACTIVE or to is None:
            # no other active link (over another port) to move to: the group ends
            self.llc.terminate(link.lgr, f"link down: {reason}", out, decline, now, peer_gone)
            return out
        lgr = link.lgr
        link.state = LinkState.LINK_INACTIVE
        # the connections stay on the failed link (what they send there is lost, as what
        # went before the failure was seen) until the peer has heard (module docstring)
        link.switch_deadline = now + self.state.config.llc_wait
        link.down_reason = reason
        request = llc_msgs.delete_link(lgr, LLC_FLAG_DEL_LINK_ORDERLY,
                                       DeleteLinkReason.LOST_PATH, link.link_id)  # fmt: skip
        if lgr.role is Role.SERVER:  # smc_llc_srv_delete_link_local
            self._delete_link_flow(lgr, request, now, out, failed=link)
        elif lgr.flow is None and lgr.remote_add is None:
            self.llc.post_llc(to, request, out)
        else:  # smcr_link_down: a client's DELETE LINK waits for its running flow to end

            def start(via: Link, t: float, actions: list[Action]) -> None:
                self.llc.post_llc(via, request, actions)  # not waited for: the server echoes it

            lgr.flow_queue.appendleft(LocalFlow(request, lambda ok, t: [], start=start))
        return out

    def move_off(self, link: Link, now: float, out: list[Action]) -> None:
        """The connections of a failed link that waited for the peer to hear of its loss
        (:meth:`link_failed`) move to another link now (``smc_switch_conns``), and the
        link goes; with no other link left the group ends.  Nothing for any other link."""
        if link.switch_deadline is None:
            return
        link.switch_deadline = None
        lgr = link.lgr
        if lgr.terminated or link not in lgr.links:
            return
        if self.llc.switch_conns(link, out, dev_err=True) is None:
            self.llc.terminate(lgr, f"link down: {link.down_reason}", out,
                               DeclineCode.NOACTLINK, now)  # fmt: skip
            return
        self.llc.link_gone(link, out, link.down_reason)

    def _add_link_failed(self, new: Link, now: float, out: list[Action]) -> None:
        """The new link of a running ADD LINK flow failed: the flow fails."""
        lgr = new.lgr
        addlink = self.addlink
        flow = addlink.srv_flow(lgr)
        if flow is not None and flow.new is new:
            addlink.srv_end_flow(lgr, False, now, out)
        elif lgr.remote_add is not None and lgr.remote_add.new is new:
            addlink.cli_fail(lgr, now, out, delete_link=lgr.remote_add.step == "confirm")

    # -- the peer's DELETE LINK -----------------------------------------------------

    def _delete_during_add(self, link: Link, msg: DeleteLink, now: float,
                           out: list[Action]) -> bool:  # fmt: skip
        """A DELETE LINK request while our ADD LINK flow waits (Linux hands it to the
        waiting flow): the flow fails.  Whether the request is dealt with."""
        lgr = link.lgr
        addlink = self.addlink
        if lgr.role is Role.CLIENT and lgr.remote_add is not None:
            if lgr.remote_add.step == "confirm":  # smc_llc_cli_conf_link: echoed as answer
                self.llc.post_llc(link, msg.response(msg.reason), out)
            else:  # smc_llc_wait for a CONTINUATION drops it
                self.llc.drop(link.qpn, "DELETE LINK during the ADD LINK rkey exchange")
            addlink.cli_fail(lgr, now, out)
            return True
        flow = addlink.srv_flow(lgr) if lgr.role is Role.SERVER else None
        if flow is None:
            return False
        addlink.srv_end_flow(lgr, False, now, out)
        if flow.step == "response":  # delayed until the flow ended (smc_llc_wait), then
            return False  # handled as any other
        self.llc.drop(link.qpn, "DELETE LINK during the ADD LINK flow")
        return True

    def receive_delete_link_response(self, link: Link, msg: LlcMessage, now: float,
                                     out: list[Action]) -> None:  # fmt: skip
        """The answer to our DELETE LINK, if a flow of ours waits for it; else nothing (a
        client's answer to an echo, one to an unwaited request)."""
        assert isinstance(msg, DeleteLink)
        lgr = link.lgr
        flow = lgr.flow
        if flow is not None and flow.request.TYPE == msg.TYPE:
            self.llc.flow_response(lgr, msg, True, now, out)

    def receive_delete_link(self, link: Link, msg: LlcMessage, now: float,
                            out: list[Action]) -> None:  # fmt: skip
        """The peer's DELETE LINK: of one link of several (failover), of the only one or
        of all (the group ends)."""
        assert isinstance(msg, DeleteLink)
        lgr = link.lgr
        if not msg.is_all and (self._delete_during_add(link, msg, now, out)
                               or self.llc.delay(link, msg)):  # fmt: skip
            return
        if msg.is_all or len(lgr.links) < 2:
            self._delete_only_or_all(link, msg, out)
            return
        gone = lgr.link_by_id(msg.link_num)
        if lgr.role is Role.CLIENT:  # smc_llc_process_cli_delete_link
            # (the server's echo of our request names a link that is gone for Linux, and
            # for us once its connections move, which they do now: "no such link")
            ok = gone is not None and gone.switch_deadline is None
            self.llc.post_llc(link, msg.response(DeleteLinkReason.OK if ok else
                                                 DeleteLinkReason.NOLNK), out)  # fmt: skip
            if gone is not None:
                self._peer_deleted(gone, "peer deleted our last link", now, out)
            return
        # smc_llc_process_srv_delete_link: the client's request, sent back to it
        if gone is None:
            return  # already deleted
        if self._peer_deleted(gone, "client deleted our last link", now, out):
            self._delete_link_flow(lgr, msg, now, out)

    def _delete_only_or_all(self, link: Link, msg: DeleteLink, out: list[Action]) -> None:
        """The peer's DELETE LINK ALL, or of a group's only link: the group ends."""
        lgr = link.lgr
        if msg.is_all:
            # Linux answers with its own DELETE LINK ALL and the peer's reason: a server
            # orderly (smc_llc_process_srv_delete_link), a client from the group's end
            # (smc_lgr_cleanup); not when it is ending the group itself (ours is out)
            if lgr.lgr_id not in self.state.ending:
                flags = LLC_FLAG_DEL_LINK_ALL
                if lgr.role is Role.SERVER:
                    flags |= LLC_FLAG_DEL_LINK_ORDERLY
                self.llc.post_llc(link, llc_msgs.delete_link(lgr, flags, msg.reason), out)
            self.llc.terminate(lgr, f"peer deleted all links (reason 0x{msg.reason:08x})", out)
            return
        known = msg.link_num == link.link_id
        self.llc.post_llc(link, msg.response(DeleteLinkReason.OK if known else
                                             DeleteLinkReason.NOLNK), out)  # fmt: skip
        if known:  # our only link: nothing to fail over to
            self.llc.terminate(lgr, "peer deleted our only link", out)

    def _peer_deleted(self, gone: Link, last: str, now: float, out: list[Action]) -> bool:
        """The peer deleted ``gone``: an active link's connections move to another link,
        and the link goes; with no other link the group ends (``last``: why).  Whether
        the group lives on.  The connections of our own failed link move now: the peer
        has heard (:meth:`link_failed`)."""
        if gone.switch_deadline is not None:
            self.move_off(gone, now, out)
            return not gone.lgr.terminated
        if gone.state is LinkState.LINK_ACTIVE:
            gone.state = LinkState.LINK_INACTIVE
            if self.llc.switch_conns(gone, out) is None:
                self.llc.terminate(gone.lgr, last, out)
                return False
        self.llc.link_gone(gone, out, "the peer's DELETE LINK")
        return True
