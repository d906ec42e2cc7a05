"""The link layer of the engine: LLC flows, CDC demultiplexing, link failure.

Split from :mod:`smcr.core.engine` the way Linux splits ``smc_llc.c`` and
``smc_cdc.c`` from ``af_smc.c``: this class handles what arrives on a link
(``smc_wr_rx_demultiplex``: byte 0 0xFE is a CDC, anything else LLC), the
LLC requests and responses as Linux answers them, the local LLC flows (one at
a time per link group, ``smc_llc_flow_start``), the TEST LINK keepalive, and
the end of a link group.  :class:`~smcr.core.engine.Engine` inherits it and
adds the CLC handshake and the application's calls.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from smcr.core import llc_msgs
from smcr.core.close import SmcState
from smcr.core.config import Config, LocalIdentity
from smcr.core.connection import CDC, Connection, PeerFaultError
from smcr.core.events import (
    Action,
    ConnectionReset,
    DestroyQp,
    Event,
    LinkGroupTerminated,
    LlcDropped,
    PostSend,
    Provider,
    QpToRts,
)
from smcr.core.handshake import Handshake, HsState
from smcr.core.linkgroup import LgrType, Link, LinkGroup, LinkState, LocalFlow, Role
from smcr.wire.cdc import CDC_MSG_TYPE, ConnectionStateFlags, ProducerFlags
from smcr.wire.decline import DeclineCode
from smcr.wire.errors import WireError
from smcr.wire.llc import (
    LLC_FLAG_DEL_LINK_ALL,
    LLC_FLAG_DEL_LINK_ORDERLY,
    LLC_FLAG_NO_RMBE_EYEC,
    LLC_FLAG_RKEY_NEG,
    AddLink,
    AddLinkV2,
    ConfirmLink,
    ConfirmRkey,
    DeleteLink,
    DeleteLinkReason,
    DeleteRkey,
    DeleteRkeyV2,
    LlcMessage,
    LlcType,
    RequestAddLinkV2,
    TestLink,
    decode_llc,
)

_CDC_SIZE, _CDC_UNPACK = CDC.size, CDC.unpack_from
# producer flags that ask for something (all but write-blocked): such a CDC is never coalesced
_CDC_EVENT_PFLAGS = 0xF8 & ~int(ProducerFlags.WRITE_BLOCKED)


CLC_WAIT_TIME_SHORT = 1.0
"""How long a first-contact client whose link died waits for the server's Decline (Linux's
name; the engine's ``DECLINE_WAIT_SHORT`` after an unanswered CONFIRM LINK)."""


class LlcViolationError(Exception):
    """The peer broke the LLC protocol: terminate the link group (reason 0x00040000)."""


LlcHandler = Callable[[Link, LlcMessage, float, list[Action]], None]


class LinkLayer:
    """What happens on links (module docstring); state lives in the engine."""

    config: Config
    identity: LocalIdentity
    provider: Provider
    _llc_handlers: dict[int, LlcHandler]
    handshakes: dict[int, Handshake]
    conns: dict[int, Connection]
    lgrs: dict[int, LinkGroup]
    links: dict[int, Link]
    late_links: dict[int, Link]
    """Links cleared while their group lives, by QPN: CDCs they delivered may still be in the
    host's CQ (:meth:`_receive_late`)."""
    touched: set[int]
    dropped: int
    _ending: set[int]
    ports_down: set[int]
    _cdc_pending: dict[int, deque[tuple[int, Connection, int]]]
    _events: deque[Event]

    def _llc_table(self) -> dict[int, LlcHandler]:
        """``msg_type -> handler`` (Linux ``smc_llc_rx_handlers`` / ``smc_llc_event_handler``)."""
        return {
            LlcType.CONFIRM_LINK: self._llc_confirm_link,
            LlcType.ADD_LINK: self._llc_add_link,
            LlcType.DELETE_LINK: self._llc_delete_link,
            LlcType.CONFIRM_RKEY: self._llc_confirm_rkey,
            LlcType.DELETE_RKEY: self._llc_delete_rkey,
            LlcType.TEST_LINK: self._llc_test_link,
            LlcType.CONFIRM_RKEY_CONT: self._llc_ignore,
            # v2 variants share the v1 handlers, as Linux takes the type's low nibble
            LlcType.CONFIRM_LINK_V2: self._llc_confirm_link,
            LlcType.ADD_LINK_V2: self._llc_add_link,
            LlcType.DELETE_LINK_V2: self._llc_delete_link,
            LlcType.REQ_ADD_LINK_V2: self._llc_req_add_link,
            LlcType.CONFIRM_RKEY_V2: self._llc_confirm_rkey,
            LlcType.DELETE_RKEY_V2: self._llc_delete_rkey,
            LlcType.TEST_LINK_V2: self._llc_test_link,
        }

    # the engine's handshake steps that LLC events finish or abort
    def _decline(self, hs: Handshake, code: DeclineCode, out: list[Action]) -> None:
        raise NotImplementedError

    def _complete(self, hs: Handshake, out: list[Action]) -> None:
        raise NotImplementedError

    def _release_held(self, now: float, out: list[Action]) -> None:
        raise NotImplementedError

    # ================================================================ links

    def receive_wr(self, qpn: int, data: memoryview, now: float) -> list[Action]:
        """A SEND arrived on a link: a CDC (byte 0 0xFE) or an LLC message."""
        out: list[Action] = []
        link = self._heard(qpn, now)
        if link is not None:
            self._receive_one(link, data, now, out)
        elif qpn in self.late_links:
            self._receive_late(qpn, [data], out)
        return out

    def _receive_late(self, qpn: int, datas: list[memoryview], out: list[Action]) -> None:
        """SENDs that were delivered on a link before it was cleared, taken from the CQ after
        (Linux drains a link's CQ before it clears it, ``smc_wr_drain_cq``): its CDCs still
        count, found by token in the group (``smc_cdc_rx_handler``), as the peer saw them
        complete; its LLC messages are dropped with the link."""
        link = self.late_links[qpn]
        if link.lgr.terminated:
            del self.late_links[qpn]
            return
        for data in datas:
            if data and data[0] == CDC_MSG_TYPE:
                self._receive_cdc(link, data, out)

    def _heard(self, qpn: int, now: float) -> Link | None:
        """The link a message came in on, marked alive (no TEST LINK due); None if unknown."""
        link = self.links.get(qpn)
        if link is not None:
            link.last_rx = now
            link.test_deadline = None
        return link

    def receive_wrs(self, qpn: int, datas: list[memoryview], now: float) -> list[Action]:
        """SENDs that arrived on a link together, in order: :meth:`receive_wr` for each,
        except that CDCs are coalesced.

        Of the CDCs of one connection that carry nothing but cursors (no flag
        but write-blocked), only the last before the next other message is
        applied: every CDC carries both cursors, cursors only move forward and
        RC delivers in order, so the last says all that the earlier ones said.
        Linux applies each; the outcome is the same, the work per CDC much less
        when a busy receiver finds many waiting.  Skipped CDCs are still checked
        (length, token, cursors inside the rings): a malformed one is handled
        at its place, as :meth:`receive_wr` would.
        """
        if len(datas) == 1:
            return self.receive_wr(qpn, datas[0], now)
        out: list[Action] = []
        link = self._heard(qpn, now)
        if link is None:
            if qpn in self.late_links:
                self._receive_late(qpn, datas, out)
            return out
        conns = link.lgr.conns
        deferred: dict[int, memoryview] = {}  # token -> its latest cursor-only CDC
        for data in datas:
            if len(data) == _CDC_SIZE and data[0] == CDC_MSG_TYPE and data[1] == _CDC_SIZE:
                f = _CDC_UNPACK(data)
                conn = conns.get(f[3])
                if (conn is not None and not f[8] & _CDC_EVENT_PFLAGS and not f[9] & 0xE0
                        and f[5] < conn.rmb.size and f[7] < (conn.peer_rmb_size or 1)):  # fmt: skip
                    deferred[f[3]] = data
                    continue
            for earlier in deferred.values():
                self._receive_cdc(link, earlier, out)
            deferred.clear()
            self._receive_one(link, data, now, out)
        for earlier in deferred.values():
            self._receive_cdc(link, earlier, out)
        return out

    def _receive_one(self, link: Link, data: memoryview, now: float, out: list[Action]) -> None:
        if data and data[0] == CDC_MSG_TYPE:
            self._receive_cdc(link, data, out)
            return
        qpn = link.qpn
        try:
            msg = decode_llc(data)
        except WireError as exc:
            self._drop(qpn, f"undecodable LLC message: {exc}")
            return
        self._dispatch(link, msg, now, out)

    def _dispatch(self, link: Link, msg: LlcMessage, now: float, out: list[Action]) -> None:
        handler = self._llc_handlers.get(msg.TYPE)
        try:
            if handler is None:
                raise LlcViolationError(f"LLC type 0x{msg.TYPE:02x} not handled")
            handler(link, msg, now, out)
        except LlcViolationError as exc:
            self._delete_all(link.lgr, DeleteLinkReason.PROT_VIOL, str(exc), out)

    def _delay(self, link: Link, msg: LlcMessage) -> bool:
        """An ADD LINK or DELETE LINK request while a local flow runs (Linux
        ``smc_llc_flow_start`` -> ``smc_llc_flow_parallel``): one of another kind waits
        for the flow's end (one such request; more are dropped), one of the same kind is
        dropped.  Whether it was held back."""
        lgr = link.lgr
        flow = lgr.flow
        if flow is None:
            return False
        if (flow.request.TYPE & 0x0F) != (msg.TYPE & 0x0F) and lgr.delayed is None:
            lgr.delayed = (link, msg)
        else:
            self._drop(link.qpn, "LLC request parallel to a running flow of ours")
        return True

    def _receive_cdc(self, link: Link, data: memoryview, out: list[Action]) -> None:
        if len(data) != _CDC_SIZE or data[1] != _CDC_SIZE:  # smc_cdc_rx_handler drops it
            self._drop(link.qpn, f"bad CDC: {len(data)} bytes, length byte {data[1:2].hex()}")
            return
        _, _, seq, token, pwrap, pcount, cwrap, ccount, pflags, sflags = _CDC_UNPACK(data)
        conn = link.lgr.conns.get(token)
        if conn is None:
            self._drop(link.qpn, f"CDC for unknown token {token}")
            return
        self.touched.add(conn.id)
        try:
            conn.receive_cdc_fields(seq, pwrap, pcount, cwrap, ccount, pflags & 0xF8,
                                    sflags & 0xE0, out)  # fmt: skip
        except PeerFaultError as exc:
            self._abort(conn, f"peer fault: {exc}", out)

    def _rmb_on(self, conn: Connection, link: Link) -> tuple[int, int]:
        """Our RMB's (rkey, vaddr) for ``link``: the host's registration on the link's
        port (:meth:`Provider.register_rmb`), the RMB's own on port 0."""
        keys = conn.rmb_keys.get(link)
        if keys is None:
            keys = conn.port_keys.get(link.port)
            if keys is None:
                keys = ((conn.rmb.rkey, conn.rmb.vaddr) if link.port == 0
                        else self.provider.register_rmb(conn.id, link.port))  # fmt: skip
                conn.port_keys[link.port] = keys
            conn.rmb_keys[link] = keys
        return keys

    def _use_link(self, conn: Connection, link: Link) -> None:
        """Make ``link`` the connection's (Linux ``conn->lnk = link``): its QP, WR ids,
        CDC completion queue and the peer RMB's rkey on it, read by the data path."""
        conn.link = link
        conn.qpn = link.qpn
        conn.wr_ids = link.wr_ids
        conn.cdc_pending = self._cdc_pending[link.qpn]
        rkey, vaddr = conn.peer_rtoken[link]
        conn.peer_rkey, conn.peer_vaddr = rkey, vaddr + conn.peer_rmbe_offset
        self._rmb_on(conn, link)

    def _abort(self, conn: Connection, reason: str, out: list[Action]) -> None:
        """Abort one connection: abort CDC, then CLOSED (``smc_conn_kill``)."""
        if conn.state is not SmcState.CLOSED:
            conn.tx_flags |= int(ConnectionStateFlags.PEER_CONNECTION_ABORT)
            conn.flush(out, force_cdc=True)
            conn.link_down(reason, out)
        self._events.append(ConnectionReset(conn=conn.id, reason=reason))

    def _drop(self, qpn: int, reason: str) -> None:
        self.dropped += 1
        self._events.append(LlcDropped(qpn=qpn, reason=reason))

    def _post_llc(self, link: Link, msg: LlcMessage, out: list[Action]) -> None:
        out.append(PostSend(link.qpn, msg.encode(), link.next_wr_id()))

    # -- LLC handlers (``smc_llc_event_handler``, ``smc_llc_rx_response``) ------

    def _llc_confirm_link(self, link: Link, msg: LlcMessage, now: float,
                          out: list[Action]) -> None:  # fmt: skip
        assert isinstance(msg, ConfirmLink)
        hs = self._handshake_on(link)
        if msg.is_response:
            if hs is None or hs.client or hs.state is not HsState.CONFIRM_LINK_RESP_WAIT:
                self._drop(link.qpn, "unexpected CONFIRM LINK response")
                return
            if not msg.flags & LLC_FLAG_NO_RMBE_EYEC:
                self._decline(hs, DeclineCode.RMBE_EC, out)
                return
            self._link_up(link, now)
            self._complete(hs, out)
            self._release_held(now, out)
            return
        if hs is None or not hs.client or hs.state is not HsState.CONFIRM_LINK_WAIT:
            raise LlcViolationError("CONFIRM LINK request outside first contact")
        if not msg.flags & LLC_FLAG_NO_RMBE_EYEC:
            self._decline(hs, DeclineCode.RMBE_EC, out)
            return
        link.link_id = msg.link_num
        out.append(QpToRts(link.qpn, link.psn, **link.names))
        response = llc_msgs.confirm_link(link, self.identity, self.config, response=True)
        self._post_llc(link, response, out)
        self._link_up(link, now)
        self._complete(hs, out)

    def _handshake_on(self, link: Link) -> Handshake | None:
        for hs in self.handshakes.values():
            if hs.link is link and hs.first_contact:
                return hs
        return None

    def _link_up(self, link: Link, now: float) -> None:
        link.state = LinkState.LINK_ACTIVE
        link.last_rx = now
        link.lgr.lgr_type = LgrType.SINGLE

    def _llc_add_link(self, link: Link, msg: LlcMessage, now: float, out: list[Action]) -> None:
        assert isinstance(msg, AddLink | AddLinkV2)
        if msg.is_response:
            self._drop(link.qpn, "ADD LINK response without a request")
        elif link.lgr.role is Role.CLIENT:
            # no second RNIC (smc_llc_cli_add_link -> smc_llc_cli_add_link_reject); a v2
            # reject is the request's first 44 bytes, the header rewritten
            self._post_llc(link, msg.reject(), out)
        # as server: a client's invitation; we have no second path to offer

    def _llc_req_add_link(self, link: Link, msg: LlcMessage, now: float,
                          out: list[Action]) -> None:  # fmt: skip
        """REQUEST ADD LINK v2 (client -> server): Linux ``smc_llc_srv_add_link`` adds
        no link without a second path and always answers with the zeroed response
        (``smc_llc_send_req_add_link_response``)."""
        assert isinstance(msg, RequestAddLinkV2)
        if msg.is_response or link.lgr.role is Role.CLIENT:
            self._drop(link.qpn, "REQUEST ADD LINK not for us")
            return
        self._post_llc(link, msg.response(), out)

    def _llc_delete_link(self, link: Link, msg: LlcMessage, now: float,
                         out: list[Action]) -> None:  # fmt: skip
        assert isinstance(msg, DeleteLink)
        lgr = link.lgr
        if msg.is_response:
            return
        if msg.is_all:
            # Linux answers with its own DELETE LINK ALL and the peer's reason: a server
            # orderly (smc_llc_process_srv_delete_link), a client from the group's end
            # (smc_lgr_cleanup); not when it is ending the group itself (ours is out)
            if lgr.lgr_id not in self._ending:
                flags = LLC_FLAG_DEL_LINK_ALL
                if lgr.role is Role.SERVER:
                    flags |= LLC_FLAG_DEL_LINK_ORDERLY
                self._post_llc(link, llc_msgs.delete_link(lgr, flags, msg.reason), out)
            self._terminate(lgr, f"peer deleted all links (reason 0x{msg.reason:08x})", out)
            return
        known = msg.link_num == link.link_id
        self._post_llc(link, msg.response(DeleteLinkReason.OK if known else
                                          DeleteLinkReason.NOLNK), out)  # fmt: skip
        if known:  # our only link: nothing to fail over to
            self._terminate(lgr, "peer deleted our only link", out)

    def _llc_confirm_rkey(self, link: Link, msg: LlcMessage, now: float,
                          out: list[Action]) -> None:  # fmt: skip
        assert isinstance(msg, ConfirmRkey)
        if msg.is_response:
            self._flow_response(link.lgr, msg, not msg.flags & LLC_FLAG_RKEY_NEG, now, out)
            return
        # smc_llc_rmt_conf_rkey: the first rtoken is for the link it came on
        lgr = link.lgr
        named = [(x, other) for other in msg.other_rtokens
                 if (x := lgr.link_by_id(other.link_id)) is not None]  # fmt: skip
        rt = lgr.rtoken_find(link, msg.rmb_key)
        for x, other in named if rt is None else ():
            # a peer of ours sends its CLC message without waiting for this flow's end
            # (Engine._confirm_rkey): for a connection on another link than the one
            # this came on, the CLC message may have brought the RMB first, by its rkey
            # on that link; Linux's peer never does (its CLC message comes after)
            rt = lgr.rtoken_find(x, other.rmb_key)
            if rt is not None:
                break
        if rt is None:
            rt = lgr.rtoken_add(link, msg.rmb_key, msg.rmb_vaddr)
        rt[link] = (msg.rmb_key, msg.rmb_vaddr)
        for x, other in named:
            rt[x] = (other.rmb_key, other.rmb_vaddr)
        self._post_llc(link, msg.response(), out)

    def _llc_delete_rkey(self, link: Link, msg: LlcMessage, now: float,
                         out: list[Action]) -> None:  # fmt: skip
        assert isinstance(msg, DeleteRkey | DeleteRkeyV2)
        if msg.is_response:
            self._flow_response(link.lgr, msg, True, now, out)
            return
        mask = invalid = 0
        for i, rkey in enumerate(msg.rkeys):
            if not link.lgr.rtoken_delete(link, rkey):
                mask |= 0x80 >> i
                invalid += 1
        # v1: a mask of the unknown ones; v2: their number, the list zeroed
        # (smc_llc_rmt_delete_rkey)
        response = msg.response(invalid) if isinstance(msg, DeleteRkeyV2) else msg.response(mask)
        self._post_llc(link, response, out)

    def _llc_test_link(self, link: Link, msg: LlcMessage, now: float, out: list[Action]) -> None:
        assert isinstance(msg, TestLink)
        if not msg.is_response:
            self._post_llc(link, msg.response(), out)

    def _llc_ignore(self, link: Link, msg: LlcMessage, now: float, out: list[Action]) -> None:
        """CONFIRM RKEY CONTINUATION: Linux never sends it and ignores it."""

    # -- local flows ------------------------------------------------------------

    def _start_flow(self, lgr: LinkGroup, request: LlcMessage,
                    on_done: Callable[[bool, float], list[Action]], now: float,
                    out: list[Action],
                    build: Callable[[Link], LlcMessage] | None = None) -> None:  # fmt: skip
        """Queue a local LLC flow; it starts when the group's previous flow ended (and, as
        Linux ``smc_llc_flow_start``, not while the peer's ADD LINK is being answered)."""
        lgr.flow_queue.append(LocalFlow(request, on_done, build=build))
        self._next_flow(lgr, now, out)

    def _next_flow(self, lgr: LinkGroup, now: float, out: list[Action]) -> None:
        """Start the next local flow, if none runs; a request held back while one ran
        (:meth:`_delay`) is handled first, as Linux's ``smc_llc_flow_stop`` hands the
        delayed event to the event worker before waking waiting flows."""
        while True:
            if (lgr.delayed is not None and lgr.flow is None and lgr.remote_add is None
                    and not lgr.terminated):  # fmt: skip
                held, msg = lgr.delayed
                lgr.delayed = None
                if held in lgr.links and held.state is LinkState.LINK_ACTIVE:
                    self._dispatch(held, msg, now, out)
                continue
            link = lgr.active_link
            if (lgr.flow is not None or not lgr.flow_queue or link is None
                    or lgr.remote_add is not None or lgr.terminated):  # fmt: skip
                return
            flow = lgr.flow = lgr.flow_queue.popleft()
            if flow.start is not None:
                request = flow.start(link, now, out)
                if request is None:  # nothing to do once its turn came
                    lgr.flow = None
                    continue
                flow.request = request
            if flow.build is not None:
                flow.request = flow.build(link)
            flow.deadline = now + self.config.llc_wait
            self._post_llc(link, flow.request, out)
            return

    def _flow_response(self, lgr: LinkGroup, msg: LlcMessage, ok: bool, now: float,
                       out: list[Action]) -> None:  # fmt: skip
        flow = lgr.flow
        if flow is None or flow.request.TYPE != msg.TYPE:
            self._drop(lgr.links[0].qpn if lgr.links else 0, "LLC response fits no flow")
            return
        lgr.flow = None
        self._finish_flow(flow, ok, now, out)
        self._next_flow(lgr, now, out)

    def _finish_flow(self, flow: LocalFlow, ok: bool, now: float, out: list[Action]) -> None:
        out.extend(flow.on_done(ok, now))

    # ================================================================ verbs

    def send_completed(self, qpn: int, wr_id: int, ok: bool, now: float) -> list[Action]:
        """A signaled send completed; CDCs free send-buffer space (``smc_cdc_tx_handler``)."""
        out: list[Action] = []
        if not ok:
            return self.link_failed(qpn, "send completed with an error", now)
        pending = self._cdc_pending.get(qpn)
        while pending and pending[0][0] <= wr_id:
            _, conn, tx_sent = pending.popleft()
            conn.cdc_completed(tx_sent)
            self.touched.add(conn.id)
        return out

    def link_failed(self, qpn: int, reason: str, now: float,
                    decline: DeclineCode = DeclineCode.NOACTLINK,
                    peer_gone: bool = False) -> list[Action]:  # fmt: skip
        """The link's QP went to ERR (peer gone, flush): with one link, the group ends.

        :param decline: the code of the Declines its unfinished handshakes get:
            ``ERR_RDYLNK`` when the host could not bring the QP up (Linux
            ``smc_ib_ready_link`` failing), else ``NOACTLINK``.
        :param peer_gone: the RNIC saw the peer's process end, having delivered all
            it posted (:attr:`smcr.rdma.base.QueuePair.peer_gone`); see
            :meth:`Connection.link_down`.
        """
        out: list[Action] = []
        link = self.links.get(qpn)
        if link is not None and not link.lgr.terminated:
            self._terminate(link.lgr, f"link down: {reason}", out, decline, now, peer_gone)
        return out

    def probe_link(self, conn_id: int, now: float) -> list[Action]:
        """Test a connection's link at once (TEST LINK), not after the idle time.

        The host calls it when the connection's TCP socket ends while SMC-R runs:
        over a user-space RNIC a killed peer process leaves nothing but its
        kernel's TCP FIN or RST, and its link would look alive until the
        keepalive (30 s).  An answer changes nothing (a peer's orderly close also
        ends its TCP); silence for ``llc_wait``, or the QP's retry exceeded, ends
        the link group as for any dead link.
        """
        out: list[Action] = []
        conn = self.conns.get(conn_id)
        link = self.links.get(conn.qpn) if conn is not None else None
        if link is None or link.state is not LinkState.LINK_ACTIVE or link.lgr.terminated:
            return out
        if link.test_deadline is None:
            self._post_llc(link, llc_msgs.test_link(link.lgr), out)
            link.test_deadline = now + self.config.llc_wait
        return out

    def _delete_all(self, lgr: LinkGroup, reason: int, text: str, out: list[Action]) -> None:
        link = lgr.active_link
        if link is not None:
            flags = LLC_FLAG_DEL_LINK_ALL | LLC_FLAG_DEL_LINK_ORDERLY
            self._post_llc(link, llc_msgs.delete_link(lgr, flags, reason), out)
        self._terminate(lgr, text, out)

    def _terminate(self, lgr: LinkGroup, reason: str, out: list[Action],
                   decline: DeclineCode = DeclineCode.NOACTLINK,
                   now: float | None = None, peer_gone: bool = False) -> None:  # fmt: skip
        """End a link group: every connection is reset, every QP destroyed
        (``smc_lgr_terminate``); handshakes under way on it decline with ``decline``.

        Except a first-contact client waiting for CONFIRM LINK whose link went down
        (``now`` given): as Linux ``smcr_clnt_conf_first_link`` it waits
        ``CLC_WAIT_TIME_SHORT`` for the server's Decline first (the server's failure
        is the likely cause of the link's end; a Decline of ours crossing it would
        reach the fallen-back server's application as data), then declines
        ``TIMEOUT_CL`` (``DECLINE_WAIT``).
        """
        if lgr.terminated:
            return
        lgr.terminated = True
        lgr.remote_add = None
        for conn in list(lgr.conns.values()):
            hs = self.handshakes.get(conn.id)
            if hs is not None and hs.state not in (HsState.DONE, HsState.FALLBACK):
                continue  # declined below: its TCP carries on as the fallback, not reset
            self.touched.add(conn.id)
            if conn.state is not SmcState.CLOSED:
                conn.link_down(reason, out, peer_gone)
                self._events.append(ConnectionReset(conn=conn.id, reason=reason))
        for hs in list(self.handshakes.values()):
            if hs.lgr is lgr and hs.state not in (HsState.DONE, HsState.FALLBACK):
                if hs.first_contact:
                    hs.lgr = None  # do not recurse
                if (now is not None and decline is DeclineCode.NOACTLINK and hs.client
                        and hs.state is HsState.CONFIRM_LINK_WAIT):  # fmt: skip
                    hs.state = HsState.DECLINE_WAIT
                    hs.deadline = now + CLC_WAIT_TIME_SHORT
                    continue
                self._decline(hs, decline, out)
        if lgr.flow is not None:
            self._finish_flow(lgr.flow, False, 0.0, out)
            lgr.flow = None
        while lgr.flow_queue:
            self._finish_flow(lgr.flow_queue.popleft(), False, 0.0, out)
        for link in lgr.links:
            link.state = LinkState.LINK_INACTIVE
            self.links.pop(link.qpn, None)
            self._cdc_pending.pop(link.qpn, None)
            out.append(DestroyQp(link.qpn, **link.names))
        self.lgrs.pop(lgr.lgr_id, None)
        self._events.append(LinkGroupTerminated(lgr_id=lgr.lgr_id, reason=reason))

    def _keepalive(self, link: Link, now: float, out: list[Action]) -> None:
        """``smc_llc_testlink_work``: TEST LINK after idle time, link down if unanswered."""
        period = self.config.testlink_time
        if period <= 0 or link.state is not LinkState.LINK_ACTIVE:
            return
        if link.test_deadline is not None:
            if now >= link.test_deadline:  # smcr_link_down_cond_sched: the link is down
                out.extend(self.link_failed(link.qpn, "TEST LINK not answered", now))
        elif now >= link.last_rx + period:
            self._post_llc(link, llc_msgs.test_link(link.lgr), out)
            link.test_deadline = now + self.config.llc_wait

